//! The request body reader shared by every endpoint that takes a body (`RequestFields`: JSON,
//! form-urlencoded or multipart, files spooled to disk), and streamed bodies from storage.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequest, Multipart, Request};
use axum::http::{StatusCode, header};
use bytes::Bytes;
use serde_json::{Map, Value};

use super::error::ApiError;
use super::state::AppState;

/// A file part of a multipart body, spooled to disk (never held in memory).
pub struct UploadedFile {
    pub file_name: Option<String>,
    pub path: tempfile::TempPath,
    pub size: u64,
    /// The first bytes, for content sniffing.
    pub head: Vec<u8>,
    /// The spool file's lock (`flock`), held while this upload lives: a sweep removes only spool
    /// files nobody holds.
    _lock: Option<std::fs::File>,
}

/// The fields of a request body, whatever its encoding: JSON object values, or strings from a
/// form; file parts separately.
#[derive(Default)]
pub struct RequestFields {
    pub values: Map<String, Value>,
    pub files: HashMap<String, UploadedFile>,
}

impl RequestFields {
    /// A field as text, with surrounding whitespace removed as the reference's serializers
    /// remove it (a job's `send_error` message built from a traceback ends with a newline that
    /// must not be stored); other JSON values serialized; `None` when absent or null.
    pub fn text(&self, name: &str) -> Option<String> {
        match self.values.get(name)? {
            Value::Null => None,
            Value::String(text) => Some(text.trim().to_string()),
            other => Some(other.to_string()),
        }
    }

    /// A required text field: `This field is required.` when absent or null, `This field may
    /// not be blank.` when only whitespace (the reference's serializer messages, naming the field
    /// after them).
    pub fn required_text(&self, name: &str) -> Result<String, ApiError> {
        match self.text(name) {
            None => Err(ApiError::BadRequest(format!("This field is required. ('{name}')"))),
            Some(text) if text.is_empty() => {
                Err(ApiError::BadRequest(format!("This field may not be blank. ('{name}')")))
            }
            Some(text) => Ok(text),
        }
    }

    pub fn value(&self, name: &str) -> Option<&Value> {
        self.values.get(name).filter(|v| !v.is_null())
    }

    pub fn has(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }

    pub fn take_file(&mut self, name: &str) -> Option<UploadedFile> {
        self.files.remove(name)
    }
}

/// Bytes kept from the start of each uploaded file for sniffing.
const HEAD_BYTES: usize = 2048;

impl FromRequest<AppState> for RequestFields {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let content_type = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_ascii_lowercase();
        let limit = usize::try_from(state.config.max_body_bytes).unwrap_or(usize::MAX);
        if content_type.starts_with("multipart/form-data") {
            return read_multipart(request, state).await;
        }
        let bytes = axum::body::to_bytes(request.into_body(), limit)
            .await
            .map_err(|_| ApiError::PayloadTooLarge { limit_mb: state.config.max_body_mb() })?;
        let mut fields = RequestFields::default();
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(fields);
        }
        if content_type.starts_with("application/json") || content_type.is_empty() {
            let value: Value = serde_json::from_slice(&bytes)
                .map_err(|e| ApiError::BadRequest(format!("Request body is not valid JSON: {e}")))?;
            match value {
                Value::Object(object) => fields.values = object,
                _ => {
                    return Err(ApiError::BadRequest("Request body must be a JSON object.".into()));
                }
            }
        } else if content_type.starts_with("application/x-www-form-urlencoded") {
            let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(&bytes)
                .map_err(|e| ApiError::BadRequest(format!("Request body is not a valid form: {e}")))?;
            fields.values = pairs.into_iter().map(|(k, v)| (k, Value::String(v))).collect();
        } else {
            return Err(ApiError::UnsupportedMediaType(format!(
                "Unsupported content type '{content_type}': send application/json, application/x-www-form-urlencoded or multipart/form-data."
            )));
        }
        Ok(fields)
    }
}

async fn read_multipart(request: Request, state: &AppState) -> Result<RequestFields, ApiError> {
    let too_large = || ApiError::PayloadTooLarge { limit_mb: state.config.max_body_mb() };
    let multipart_error = |error: axum::extract::multipart::MultipartError| {
        if error.status() == StatusCode::PAYLOAD_TOO_LARGE {
            too_large()
        } else {
            ApiError::BadRequest(format!("Malformed multipart body: {}", error.body_text()))
        }
    };
    let mut multipart = Multipart::from_request(request, state)
        .await
        .map_err(|e| ApiError::BadRequest(format!("Malformed multipart body: {}", e.body_text())))?;
    let mut fields = RequestFields::default();
    while let Some(mut field) = multipart.next_field().await.map_err(multipart_error)? {
        let Some(name) = field.name().map(str::to_string) else {
            continue;
        };
        match field.file_name().map(str::to_string) {
            None => {
                let text = field.text().await.map_err(multipart_error)?;
                fields.values.insert(name, Value::String(text));
            }
            Some(file_name) => {
                let spool_dir = &state.config.spool_dir;
                let refused = |error| ApiError::spool(spool_dir, error, &file_name);
                tokio::fs::create_dir_all(spool_dir).await.map_err(refused)?;
                let spool = tempfile::NamedTempFile::new_in(spool_dir).map_err(refused)?;
                let (file, path) = spool.into_parts();
                let lock = lock_spool_file(&file);
                let mut writer = SpoolWriter::new(file);
                let mut size = 0u64;
                let mut head = Vec::new();
                while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
                    if head.len() < HEAD_BYTES {
                        let take = (HEAD_BYTES - head.len()).min(chunk.len());
                        head.extend_from_slice(&chunk[..take]);
                    }
                    size += chunk.len() as u64;
                    writer.write(chunk).await.map_err(refused)?;
                }
                writer.finish().await.map_err(refused)?;
                let upload = UploadedFile { file_name: Some(file_name), path, size, head, _lock: lock };
                fields.files.insert(name, upload);
            }
        }
    }
    Ok(fields)
}

/// Bytes gathered before one write to a spool file: an upload costs few hand-overs to the
/// blocking pool, and holds two such buffers.
const SPOOL_BATCH_BYTES: usize = 1024 * 1024;

/// Age past which a gathered batch is written whatever its size, so a slow upload's spool file
/// still changes whenever bytes arrive.
const SPOOL_BATCH_AGE: std::time::Duration = std::time::Duration::from_secs(1);

/// Writes an upload's chunks to its spool file on the blocking pool, a batch at a time, the next
/// batch gathered from the socket while the previous one is written. Chunks are copied into two
/// buffers used in turn rather than kept: the request body's own buffers are then reused at once
/// (keeping the chunks made the body reader allocate fresh memory for every read, and the page
/// faults cost a fifth of an upload's CPU).
struct SpoolWriter {
    file: Arc<std::fs::File>,
    batch: Vec<u8>,
    since: std::time::Instant,
    /// The batch being written; it hands its buffer back for the next one.
    writing: Option<tokio::task::JoinHandle<std::io::Result<Vec<u8>>>>,
}

impl SpoolWriter {
    fn new(file: std::fs::File) -> SpoolWriter {
        SpoolWriter {
            file: Arc::new(file),
            batch: Vec::with_capacity(SPOOL_BATCH_BYTES),
            since: std::time::Instant::now(),
            writing: None,
        }
    }

    async fn write(&mut self, chunk: Bytes) -> std::io::Result<()> {
        if self.batch.is_empty() {
            self.since = std::time::Instant::now();
        }
        let mut rest = &chunk[..];
        while !rest.is_empty() {
            let take = (SPOOL_BATCH_BYTES - self.batch.len()).min(rest.len());
            self.batch.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.batch.len() == SPOOL_BATCH_BYTES {
                self.send().await?;
            }
        }
        if !self.batch.is_empty() && self.since.elapsed() >= SPOOL_BATCH_AGE {
            self.send().await?;
        }
        Ok(())
    }

    /// Waits for the batch being written, then hands the gathered one to the blocking pool.
    async fn send(&mut self) -> std::io::Result<()> {
        let buffer = self.wait().await?.unwrap_or_else(|| Vec::with_capacity(SPOOL_BATCH_BYTES));
        let mut batch = std::mem::replace(&mut self.batch, buffer);
        let file = Arc::clone(&self.file);
        self.writing = Some(tokio::task::spawn_blocking(move || {
            (&*file).write_all(&batch)?;
            batch.clear();
            Ok(batch)
        }));
        Ok(())
    }

    /// Waits for the batch being written; its buffer, if there was one.
    async fn wait(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        match self.writing.take() {
            Some(writing) => writing.await.map_err(std::io::Error::other)?.map(Some),
            None => Ok(None),
        }
    }

    async fn finish(mut self) -> std::io::Result<()> {
        self.send().await?;
        self.wait().await.map(drop)
    }
}

/// A streamed body from storage.
pub fn stream_body(object: crate::storage::Object) -> Body {
    Body::from_stream(object.body)
}

/// Takes the exclusive lock (`flock`) of a new spool file, held by the returned descriptor (a
/// duplicate of `file`'s) until it is dropped; `None` where the file system has no locks.
fn lock_spool_file(file: &std::fs::File) -> Option<std::fs::File> {
    use std::os::fd::AsRawFd;
    let lock = file.try_clone().ok()?;
    // SAFETY: flock on a descriptor this function owns.
    (unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0).then_some(lock)
}

/// Whether a process holds the lock of the spool file at `path` (an upload in progress, here or
/// in another server sharing the folder); `None` when the file system cannot say (no `flock`:
/// uploads there hold no lock either).
fn spool_file_in_use(path: &std::path::Path) -> Option<bool> {
    use std::os::fd::AsRawFd;
    let Ok(file) = std::fs::File::open(path) else { return Some(false) };
    // SAFETY: flock on a descriptor this function owns; the lock goes with it.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Some(false);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EWOULDBLOCK) => Some(true),
        _ => None,
    }
}

/// Age under which an unlocked spool file is left alone: the moment between its creation and
/// its lock.
const SPOOL_UNLOCKED_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Where locks cannot be had, the age past which a spool file is what an upload cut by a crash
/// left: a live upload writes its file at least every second while bytes arrive, and a body
/// that stops arriving is cut after `--body-timeout-seconds`.
const SPOOL_UNLOCKABLE_AGE: std::time::Duration = std::time::Duration::from_secs(600);

/// Removes the spool files no upload holds (see `lock_spool_file`): what uploads cut by a crash
/// (SIGKILL, a lost node) or a failure left, whatever their age, while the live uploads of this
/// and other servers sharing the folder keep theirs. Returns how many were removed.
pub fn clean_spool(dir: &std::path::Path) -> std::io::Result<usize> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(error) => return Err(error),
    };
    let now = std::time::SystemTime::now();
    let mut removed = 0;
    for entry in entries {
        let entry = entry?;
        let Ok(metadata) = entry.metadata() else { continue };
        let age = metadata.modified().ok().and_then(|m| now.duration_since(m).ok()).unwrap_or_default();
        let abandoned = metadata.is_file()
            && age >= SPOOL_UNLOCKED_GRACE
            && match spool_file_in_use(&entry.path()) {
                Some(in_use) => !in_use,
                None => age >= SPOOL_UNLOCKABLE_AGE,
            };
        if abandoned {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => removed += 1,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(error),
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    /// Issue 49: a killed server's partial spool file stayed until a start found it ten minutes
    /// old. Every file no upload holds goes now, whatever its age; a held one stays.
    #[test]
    fn spool_files_nobody_holds_are_removed_and_held_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let set_age = |path: &std::path::Path, seconds: u64| {
            let then = std::time::SystemTime::now() - std::time::Duration::from_secs(seconds);
            std::fs::File::options().write(true).open(path).unwrap().set_modified(then).unwrap();
        };
        let cut = dir.path().join(".tmpCUT");
        std::fs::write(&cut, vec![0u8; 1024]).unwrap();
        set_age(&cut, 5);
        let live = dir.path().join(".tmpLIVE");
        let file = std::fs::File::create(&live).unwrap();
        let lock = super::lock_spool_file(&file).expect("a lock");
        drop(file);
        set_age(&live, 3600);
        let fresh = dir.path().join(".tmpNEW");
        std::fs::write(&fresh, b"just made").unwrap();
        std::fs::create_dir(dir.path().join("folder")).unwrap();
        assert_eq!(super::clean_spool(dir.path()).unwrap(), 1);
        assert!(!cut.exists(), "a cut upload's file goes at once");
        assert!(live.exists(), "a held file stays, however old");
        assert!(fresh.exists() && dir.path().join("folder").exists());
        drop(lock);
        assert_eq!(super::clean_spool(dir.path()).unwrap(), 1, "released, it goes");
        assert_eq!(super::clean_spool(&dir.path().join("missing")).unwrap(), 0);
    }
}
