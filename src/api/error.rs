//! `ApiError`: every error a request can answer, rendered in the contract's shapes.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::storage::Storage;
use crate::storage::refusal::{Refusal, RefusalKind};

/// The body of every error answer but 401: `message`, plus `path` for a schema failure.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub message: String,
    /// Where the arguments break the function's schema.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Vec<Object>, required = false, nullable = false)]
    pub path: Option<Vec<Value>>,
}

impl ErrorBody {
    fn new(message: impl Into<String>) -> ErrorBody {
        ErrorBody { message: message.into(), path: None }
    }
}

/// The body of a 401.
#[derive(Debug, Serialize, ToSchema)]
pub struct DetailBody {
    pub detail: String,
}

/// Every error an endpoint can answer, in the contract's shapes.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{message}")]
    InvalidArguments { message: String, path: Vec<Value> },
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    Conflict(String),
    #[error("request body is larger than the limit of {limit_mb} MB")]
    PayloadTooLarge { limit_mb: u64 },
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    TooManyRequests(String),
    #[error("{0}")]
    UnprocessableEntity(String),
    #[error("{0}")]
    Locked(String),
    /// The database cannot be used right now (`db::Error::unavailable`): 503 with
    /// `Retry-After`, since a retry in a few seconds may succeed.
    #[error("The database is unavailable ({0}); retry in a few seconds.")]
    DatabaseUnavailable(String),
    /// Storage refused what the request needed (`Storage::refusal`): 507 when it is full or
    /// cannot be written, 503 when it cannot be read or (an object store, with `Retry-After`)
    /// refuses or cannot be reached. `consequence` says what did not happen.
    #[error("{}", storage_message(refusal, consequence.as_deref()))]
    Storage { refusal: Refusal, consequence: Option<String> },
    #[error("internal error")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl ApiError {
    pub fn function_not_found(provider: Option<&str>, title: &str) -> ApiError {
        match provider {
            Some(provider) => ApiError::NotFound(format!("Qiskit Function {provider}/{title} doesn't exist.")),
            None => ApiError::NotFound(format!("Qiskit Function {title} doesn't exist.")),
        }
    }

    pub fn provider_not_found(provider: &str) -> ApiError {
        ApiError::NotFound(format!("Provider {provider} doesn't exist."))
    }

    pub fn file_not_found() -> ApiError {
        ApiError::NotFound("Requested file was not found.".into())
    }

    pub fn internal(error: impl std::error::Error + Send + Sync + 'static) -> ApiError {
        ApiError::Internal(Box::new(error))
    }

    /// A failure of `storage`: a refusal (full, unwritable, unreachable) answered as such, naming
    /// the storage and what did not happen (`consequence`, e.g. "the file x was not stored");
    /// anything else is internal.
    pub fn storage(storage: &Storage, error: crate::storage::Error, consequence: Option<String>) -> ApiError {
        match storage.refusal(&error) {
            Some(refusal) => {
                tracing::warn!(error = &error as &dyn std::error::Error, storage = %refusal.storage, "storage refused");
                ApiError::Storage { refusal, consequence }
            }
            None => ApiError::internal(error),
        }
    }

    /// A failure writing an upload to the spool folder `folder`, as `storage` answers it.
    pub fn spool(folder: &std::path::Path, error: std::io::Error, file_name: &str) -> ApiError {
        match crate::storage::refusal::local_refusal(&error, true) {
            Some((kind, reason)) => {
                tracing::warn!(error = &error as &dyn std::error::Error, folder = %folder.display(), "upload spool refused");
                ApiError::Storage {
                    refusal: Refusal { kind, storage: format!("upload folder {}", folder.display()), reason },
                    consequence: Some(format!("the file {file_name} was not stored")),
                }
            }
            None => ApiError::internal(error),
        }
    }
}

/// The message of a storage refusal: what the storage is, why, and what did not happen.
fn storage_message(refusal: &Refusal, consequence: Option<&str>) -> String {
    let Refusal { kind, storage, reason } = refusal;
    let state = match kind {
        RefusalKind::Full => "is full",
        RefusalKind::Unwritable => "cannot be written",
        RefusalKind::Unreadable => "cannot be read",
        RefusalKind::Unavailable => "is unavailable",
    };
    let mut message = format!("The {storage} {state} ({reason})");
    if let Some(consequence) = consequence {
        message.push_str(": ");
        message.push_str(consequence);
    }
    if *kind == RefusalKind::Unavailable {
        message.push_str("; retry in a few seconds");
    }
    message.push('.');
    message
}
/// Seconds a client is told to wait before retrying a request the database could not serve.
pub const DATABASE_RETRY_AFTER_SECONDS: u64 = 5;
/// Seconds a client is told to wait before retrying a request an object store could not serve.
pub const STORAGE_RETRY_AFTER_SECONDS: u64 = 5;

impl From<crate::db::Error> for ApiError {
    fn from(error: crate::db::Error) -> Self {
        match error.unavailable() {
            Some(why) => {
                tracing::warn!(error = &error as &dyn std::error::Error, why, "database unavailable");
                ApiError::DatabaseUnavailable(why)
            }
            None => ApiError::internal(error),
        }
    }
}

impl From<crate::auth::AuthError> for ApiError {
    fn from(error: crate::auth::AuthError) -> Self {
        match error {
            crate::auth::AuthError::Denied(message) => ApiError::Unauthorized(message),
            crate::auth::AuthError::Database(error) => error.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let message = self.to_string();
        let (status, body) = match self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, ErrorBody::new(message)),
            ApiError::InvalidArguments { message, path } => {
                (StatusCode::BAD_REQUEST, ErrorBody { message, path: Some(path) })
            }
            ApiError::Unauthorized(detail) => {
                let mut response = (StatusCode::UNAUTHORIZED, Json(DetailBody { detail })).into_response();
                response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                return response;
            }
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, ErrorBody::new(message)),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, ErrorBody::new(message)),
            ApiError::MethodNotAllowed(_) => (StatusCode::METHOD_NOT_ALLOWED, ErrorBody::new(message)),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, ErrorBody::new(message)),
            ApiError::PayloadTooLarge { limit_mb } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorBody::new(format!(
                    "Request body is larger than the limit of {limit_mb} MB (MAX_REQUEST_BODY_SIZE_MB)."
                )),
            ),
            ApiError::UnsupportedMediaType(_) => (StatusCode::UNSUPPORTED_MEDIA_TYPE, ErrorBody::new(message)),
            ApiError::TooManyRequests(_) => (StatusCode::TOO_MANY_REQUESTS, ErrorBody::new(message)),
            ApiError::UnprocessableEntity(_) => (StatusCode::UNPROCESSABLE_ENTITY, ErrorBody::new(message)),
            ApiError::Locked(_) => (StatusCode::LOCKED, ErrorBody::new(message)),
            ApiError::DatabaseUnavailable(_) => {
                let mut response = (StatusCode::SERVICE_UNAVAILABLE, Json(ErrorBody::new(message))).into_response();
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(DATABASE_RETRY_AFTER_SECONDS));
                return response;
            }
            ApiError::Storage { refusal, .. } => {
                let status = match refusal.kind {
                    RefusalKind::Full | RefusalKind::Unwritable => StatusCode::INSUFFICIENT_STORAGE,
                    RefusalKind::Unreadable | RefusalKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
                };
                let mut response = (status, Json(ErrorBody::new(message))).into_response();
                if refusal.kind == RefusalKind::Unavailable {
                    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(STORAGE_RETRY_AFTER_SECONDS));
                }
                return response;
            }
            ApiError::Internal(source) => {
                tracing::error!(error = &*source as &dyn std::error::Error, "request failed");
                (StatusCode::INTERNAL_SERVER_ERROR, ErrorBody::new("Internal server error"))
            }
        };
        (status, Json(body)).into_response()
    }
}
