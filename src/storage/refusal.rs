//! When storage refuses an operation because of the storage itself, not a bug: a data folder
//! that is full or cannot be written, an object store that is full, refuses or cannot be
//! reached. The API answers such failures 507 or 503 naming the storage (see
//! `api::error::ApiError::Storage`), as `db::Error::unavailable` does for the database.

use std::io;

use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};

use super::{Error, Storage};

/// What kind of refusal, which decides the answer's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// No room left: a full disk or quota, or an object store that says it is full (507).
    Full,
    /// A data folder that cannot be written: read-only, not permitted, a file too large for it (507).
    Unwritable,
    /// A data folder that cannot be read (503).
    Unreadable,
    /// An object store that refuses or cannot be reached: a retry later may succeed (503).
    Unavailable,
}

/// Why storage refused, in words for the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub kind: RefusalKind,
    /// The storage, as the caller may name it: `data folder /var/lib/gantry/objects`,
    /// `object store s3://bucket/prefix`.
    pub storage: String,
    /// The cause: `no space left on device`, `cannot reach it: connection refused`.
    pub reason: String,
}

/// What an object store's failure said, kept with the error when it is made (the SDK's error
/// types are per operation, so they cannot be inspected once boxed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum S3Failure {
    /// No answer: the connection failed or timed out.
    Unreachable(String),
    /// An answer with an error status, and the code and message the store gave.
    Answered { status: u16, code: Option<String>, message: Option<String> },
}

impl S3Failure {
    /// What an SDK error says about the store, when it says anything (a request that could not
    /// be built says nothing).
    pub(super) fn of<E: ProvideErrorMetadata>(error: &SdkError<E, HttpResponse>) -> Option<S3Failure> {
        match error {
            SdkError::DispatchFailure(failure) => {
                let why = match failure.as_connector_error() {
                    Some(connector) if connector.is_timeout() => "timed out".to_string(),
                    Some(connector) => crate::shared::describe(connector),
                    None => "the request could not be sent".to_string(),
                };
                Some(S3Failure::Unreachable(why))
            }
            SdkError::TimeoutError(_) => Some(S3Failure::Unreachable("timed out".into())),
            SdkError::ResponseError(response) => Some(S3Failure::Answered {
                status: response.raw().status().as_u16(),
                code: None,
                message: Some("its answer could not be read".into()),
            }),
            SdkError::ServiceError(service) => Some(S3Failure::Answered {
                status: service.raw().status().as_u16(),
                code: error.code().map(str::to_string),
                message: error.message().map(str::to_string),
            }),
            _ => None,
        }
    }
}

/// `Error::S3` from an SDK error, with what the store said.
pub(super) fn s3_sdk_error<E>(
    operation: &'static str,
    bucket: &str,
    key: &str,
    error: SdkError<E, HttpResponse>,
) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let failure = S3Failure::of(&error).map(Box::new);
    Error::S3 { operation, bucket: bucket.into(), key: key.into(), failure, source: Box::new(error) }
}

/// Object-store error codes that say the store is full (MinIO's, and the generic ones).
const FULL_CODES: [&str; 4] = ["XMinioStorageFull", "StorageFull", "QuotaExceeded", "XMinioAdminBucketQuotaExceeded"];

/// The refusal an object store's failure is, if any: full when it says so (507 or a code
/// above), unavailable when it cannot be reached, fails itself (5xx), throttles (429) or
/// refuses the server's credentials or bucket (401, 403, 404 for the bucket). Other answers
/// (400s about the request) are bugs, not refusals.
pub fn s3_refusal(failure: &S3Failure) -> Option<(RefusalKind, String)> {
    match failure {
        S3Failure::Unreachable(why) => Some((RefusalKind::Unavailable, format!("cannot reach it: {why}"))),
        S3Failure::Answered { status, code, message } => {
            let said = match (code, message) {
                (Some(code), Some(message)) => format!("{status} {code}: {message}"),
                (Some(code), None) => format!("{status} {code}"),
                (None, Some(message)) => format!("{status}: {message}"),
                (None, None) => format!("{status}"),
            };
            let full = *status == 507 || code.as_deref().is_some_and(|code| FULL_CODES.contains(&code));
            let refuses =
                *status >= 500 || matches!(status, 401 | 403 | 429) || code.as_deref() == Some("NoSuchBucket");
            if full {
                Some((RefusalKind::Full, format!("it answered {said}")))
            } else if refuses {
                Some((RefusalKind::Unavailable, format!("it answered {said}")))
            } else {
                None
            }
        }
    }
}

/// The refusal a local file-system error is, if any: full (no space, quota), or a folder that
/// cannot be written (read-only, not permitted, a file too large) or, when only reading, read.
pub fn local_refusal(error: &io::Error, writing: bool) -> Option<(RefusalKind, String)> {
    let code = error.raw_os_error()?;
    let (kind, reason) = match code {
        libc::ENOSPC => (RefusalKind::Full, "no space left on device"),
        libc::EDQUOT => (RefusalKind::Full, "disk quota exceeded"),
        libc::EFBIG => (RefusalKind::Unwritable, "file too large"),
        libc::EROFS => (RefusalKind::Unwritable, "read-only file system"),
        libc::EACCES => (RefusalKind::Unwritable, "permission denied"),
        libc::EPERM => (RefusalKind::Unwritable, "operation not permitted"),
        libc::EIO => (RefusalKind::Unwritable, "input/output error"),
        _ => return None,
    };
    let kind = if kind == RefusalKind::Unwritable && !writing { RefusalKind::Unreadable } else { kind };
    Some((kind, reason.to_string()))
}

/// Operations of `Error::Local` that write.
const LOCAL_WRITES: [&str; 5] = ["store", "create folder for", "delete", "move", "prune"];

impl Storage {
    /// How the caller may name this storage (after "the").
    pub fn caller_name(&self) -> String {
        match self {
            Storage::Local { root } => format!("data folder {}", root.display()),
            Storage::S3 { bucket, prefix, .. } => {
                format!("object store s3://{bucket}/{}", prefix.trim_end_matches('/'))
            }
        }
    }

    /// Why this storage refused the operation that failed with `error`, when the cause is the
    /// storage itself (see `Refusal`); `None` for anything else.
    pub fn refusal(&self, error: &Error) -> Option<Refusal> {
        let (kind, reason) = match error {
            Error::Local { operation, source, .. } => local_refusal(source, LOCAL_WRITES.contains(operation))?,
            Error::S3 { failure: Some(failure), .. } => s3_refusal(failure)?,
            Error::S3 { failure: None, .. } | Error::UnsafeKey { .. } | Error::Location { .. } => return None,
        };
        Some(Refusal { kind, storage: self.caller_name(), reason })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_or_unwritable_folder_is_a_refusal_and_other_errors_are_not() {
        let os = io::Error::from_raw_os_error;
        assert_eq!(local_refusal(&os(libc::ENOSPC), true), Some((RefusalKind::Full, "no space left on device".into())));
        assert_eq!(local_refusal(&os(libc::EDQUOT), true).unwrap().0, RefusalKind::Full);
        for code in [libc::EROFS, libc::EACCES, libc::EPERM, libc::EFBIG] {
            assert_eq!(local_refusal(&os(code), true).unwrap().0, RefusalKind::Unwritable, "{code}");
        }
        assert_eq!(local_refusal(&os(libc::EACCES), false).unwrap().0, RefusalKind::Unreadable);
        assert_eq!(local_refusal(&os(libc::ENOENT), true), None);
        assert_eq!(local_refusal(&io::Error::other("no code"), true), None);
    }

    #[test]
    fn an_object_store_is_full_when_it_says_so_and_unavailable_when_it_fails_or_refuses() {
        let answered = |status, code: Option<&str>| S3Failure::Answered {
            status,
            code: code.map(str::to_string),
            message: Some("said".into()),
        };
        let kind = |failure: &S3Failure| s3_refusal(failure).map(|(kind, _)| kind);
        assert_eq!(kind(&answered(507, Some("XMinioStorageFull"))), Some(RefusalKind::Full));
        assert_eq!(kind(&answered(403, Some("QuotaExceeded"))), Some(RefusalKind::Full));
        assert_eq!(kind(&answered(503, Some("SlowDown"))), Some(RefusalKind::Unavailable));
        assert_eq!(kind(&answered(500, Some("InternalError"))), Some(RefusalKind::Unavailable));
        assert_eq!(kind(&answered(403, Some("InvalidAccessKeyId"))), Some(RefusalKind::Unavailable));
        assert_eq!(kind(&answered(404, Some("NoSuchBucket"))), Some(RefusalKind::Unavailable));
        assert_eq!(kind(&answered(400, Some("InvalidArgument"))), None);
        assert_eq!(
            s3_refusal(&S3Failure::Unreachable("connection refused".into())),
            Some((RefusalKind::Unavailable, "cannot reach it: connection refused".into()))
        );
        assert_eq!(s3_refusal(&answered(503, Some("SlowDown"))).unwrap().1, "it answered 503 SlowDown: said");
    }

    #[test]
    fn storage_is_named_as_the_caller_knows_it() {
        assert_eq!(Storage::local("/var/lib/gantry/objects").caller_name(), "data folder /var/lib/gantry/objects");
    }
}
