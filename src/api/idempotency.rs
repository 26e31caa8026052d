//! `Idempotency-Key` on `programs/run/` and `programs/upload/`: a client that times out and
//! retries with the same key gets the first answer instead of a second job or function version.
//!
//! A keyed request first reserves its (user, key) with the hash of the request (`db::idempotency`,
//! a unique row); the one request that gets the reservation runs the handler's work on a task of
//! its own, so a client that goes away cannot leave the work half done without its answer, then
//! records the answer (status and JSON body) or releases the key. Every other request with the
//! key: a different request hash answers 422 at once; the same hash waits (polling, at most
//! `WAIT_FOR_ANSWER`) for the recorded answer and replays it. Which answers are kept is
//! `keeps_answer`; what a row means to a request is `judge`. Keys are scoped per user and expire
//! after `KEEP_FOR`: a row older than that counts as absent, and `expire` deletes such rows in
//! batches (a background pass started by `serve` and `gateway`).

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{FromRequestParts, OriginalUri};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::FutureExt;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::error::ApiError;
use super::fields::RequestFields;
use crate::db::idempotency::{self as keys, IdempotencyKeyRow};
use crate::db::{self, Db};
use crate::shared::hex;

/// The request header naming a retryable request.
pub const HEADER: &str = "idempotency-key";
/// Set to `true` on an answer replayed from an earlier request with the same key.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
/// Longest key accepted, in characters.
pub const MAX_KEY_CHARS: usize = 255;
/// How long a key is kept: a retry within this time gets the first answer.
pub const KEEP_FOR: Duration = Duration::from_secs(24 * 3600);
/// A reservation without an answer this old belongs to a request that crashed midway (the work
/// runs on its own task, so only a crash of the process leaves one): the next retry takes it over.
pub const ABANDONED_AFTER: Duration = Duration::from_secs(60);
/// Longest a request waits for the answer of the same request in progress before a 409.
pub const WAIT_FOR_ANSWER: Duration = Duration::from_secs(30);
/// Time between two looks at a reservation in progress.
const POLL_EVERY: Duration = Duration::from_millis(50);
/// Largest answer body recorded (answers here are one job or function record).
const MAX_ANSWER_BYTES: usize = 1024 * 1024;
/// Keys deleted per statement by the expiry pass.
pub const EXPIRY_BATCH: i64 = 500;
/// Pause between two expiry batches, for the API's writers to go first.
const EXPIRY_PAUSE: Duration = Duration::from_millis(100);
/// Time between two background expiry passes.
pub const EXPIRE_EVERY: Duration = Duration::from_secs(3600);

fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

/// The request's `Idempotency-Key` (validated; `None` without the header) and the request line
/// its hash covers. Rejects an invalid key with a 400 naming the header.
pub struct IdempotencyKey {
    key: Option<String>,
    method: String,
    path: String,
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let mut values = parts.headers.get_all(HEADER).iter();
        let key = match (values.next(), values.next()) {
            (None, _) => None,
            (Some(value), None) => Some(parse_key(value.as_bytes()).map_err(ApiError::BadRequest)?),
            (Some(_), Some(_)) => {
                return Err(ApiError::BadRequest("Send one Idempotency-Key header, not several.".into()));
            }
        };
        let path = match parts.extensions.get::<OriginalUri>() {
            Some(OriginalUri(uri)) => uri.path().to_string(),
            None => parts.uri.path().to_string(),
        };
        Ok(IdempotencyKey { key, method: parts.method.to_string(), path })
    }
}

/// The `Idempotency-Key` header as the OpenAPI document states it (`IdempotencyKey` reads it).
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
pub struct IdempotencyKeyHeader {
    /// 1 to 255 visible ASCII characters: a retry with the same key within 24 h gets the first
    /// answer (status and body) and creates nothing; the same key with a different request
    /// answers 422.
    #[param(rename = "Idempotency-Key", nullable = false, pattern = "^[!-~]{1,255}$", example = "retry-7f3c2a")]
    pub key: Option<String>,
}

/// A valid key: 1 to `MAX_KEY_CHARS` visible ASCII characters (`!` to `~`, so no spaces).
pub fn parse_key(value: &[u8]) -> Result<String, String> {
    if value.is_empty() {
        return Err("Idempotency-Key may not be blank.".into());
    }
    if !value.iter().all(|byte| (b'!'..=b'~').contains(byte)) {
        return Err(
            "Idempotency-Key may contain only visible ASCII characters (no spaces or control characters).".into()
        );
    }
    if value.len() > MAX_KEY_CHARS {
        return Err(format!("Idempotency-Key is {} characters long and the maximum is {MAX_KEY_CHARS}.", value.len()));
    }
    Ok(String::from_utf8_lossy(value).into_owned())
}

/// A keyed request: what `answer_once` needs.
pub struct KeyedRequest {
    pub key: String,
    /// `request_hash` of the request.
    pub hash: String,
}

impl IdempotencyKey {
    /// The key with the hash of the request (reading each uploaded file once); `None` without a
    /// key, and then nothing is read.
    pub async fn with_request(self, fields: &RequestFields) -> Result<Option<KeyedRequest>, ApiError> {
        let Some(key) = self.key else { return Ok(None) };
        let mut files = Vec::with_capacity(fields.files.len());
        for (field, file) in &fields.files {
            let path = file.path.to_path_buf();
            let sha256 = tokio::task::spawn_blocking(move || file_sha256(&path))
                .await
                .map_err(ApiError::internal)?
                .map_err(ApiError::internal)?;
            files.push(FileDigest { field: field.clone(), file_name: file.file_name.clone(), size: file.size, sha256 });
        }
        let hash = request_hash(&self.method, &self.path, &fields.values, &files);
        Ok(Some(KeyedRequest { key, hash }))
    }
}

/// An uploaded file as the request hash covers it.
#[derive(Debug, Clone)]
pub struct FileDigest {
    pub field: String,
    pub file_name: Option<String>,
    pub size: u64,
    /// Hex SHA-256 of its bytes.
    pub sha256: String,
}

fn file_sha256(path: &std::path::Path) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    std::io::copy(&mut std::fs::File::open(path)?, &mut hasher)?;
    Ok(hex(&hasher.finalize()))
}

/// Hex SHA-256 of a request as parsed: method, path, the body's fields and each file's name and
/// bytes. Two requests that carry the same fields hash the same whatever their transport details
/// (field order, JSON spacing, multipart boundary); a JSON body and a form carrying a value as
/// text differ. Headers are not covered.
pub fn request_hash(method: &str, path: &str, values: &Map<String, Value>, files: &[FileDigest]) -> String {
    let files: Map<String, Value> = files
        .iter()
        .map(|file| {
            (file.field.clone(), json!({"file_name": file.file_name, "size": file.size, "sha256": file.sha256}))
        })
        .collect();
    let request = json!({"method": method, "path": path, "fields": values, "files": files});
    hex(&Sha256::digest(canonical(&request).to_string().as_bytes()))
}

/// `value` with the keys of every object in sorted order, so its text is one per value.
fn canonical(value: &Value) -> Value {
    match value {
        Value::Object(object) => {
            let mut entries: Vec<(&String, &Value)> = object.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            Value::Object(entries.into_iter().map(|(key, value)| (key.clone(), canonical(value))).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// What a stored key means to a request with `request_hash` at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Expired, or reserved by a request that crashed midway: take it over and run.
    Replace,
    /// Used with another request: 422.
    Conflict,
    /// Answered: replay this.
    Replay { status: u16, body: String },
    /// The same request is in progress: wait for its answer.
    Wait,
}

pub fn judge(row: &IdempotencyKeyRow, request_hash: &str, now: i64) -> Verdict {
    let age = now.saturating_sub(row.created);
    if age >= micros(KEEP_FOR) {
        return Verdict::Replace;
    }
    if row.request_hash != request_hash {
        return Verdict::Conflict;
    }
    match row.status_code {
        Some(status) => {
            Verdict::Replay { status: u16::try_from(status).unwrap_or(500), body: row.body.clone().unwrap_or_default() }
        }
        None if age >= micros(ABANDONED_AFTER) => Verdict::Replace,
        None => Verdict::Wait,
    }
}

/// Whether an answer is recorded for retries. Successes and 4xx are (the same request would get
/// them again), except those that ask to try again later: 409 (a concurrent upload of the same
/// function), 423 (the function is disabled for now) and 429 (the active-job limit). Those and
/// 5xx release the key, so a retry runs the request again.
pub fn keeps_answer(status: StatusCode) -> bool {
    status.is_success()
        || (status.is_client_error()
            && !matches!(status, StatusCode::CONFLICT | StatusCode::LOCKED | StatusCode::TOO_MANY_REQUESTS))
}

/// Answers a request at most once per (user, key): runs `work` and records its answer when the
/// request holds a key nobody used, else answers as `judge` says. Without a key, just runs `work`.
pub async fn answer_once<W, R>(db: &Db, user_id: &str, request: Option<KeyedRequest>, work: W) -> Response
where
    W: Future<Output = R> + Send + 'static,
    R: IntoResponse + Send + 'static,
{
    let Some(request) = request else { return work.await.into_response() };
    let owner = match claim(db, user_id, &request).await {
        Ok(Claim::Owner(owner)) => owner,
        Ok(Claim::Answered { status, body }) => return replay(status, body),
        Err(error) => return error.into_response(),
    };
    let task = tokio::spawn(run_and_record(db.clone(), user_id.to_string(), request.key, owner, work));
    match task.await {
        Ok(response) => response,
        Err(error) => ApiError::internal(error).into_response(),
    }
}

enum Claim {
    /// This request holds the reservation (its owner id).
    Owner(String),
    Answered {
        status: u16,
        body: String,
    },
}

/// Reserves the key, takes it over, or waits for the answer of the same request in progress.
async fn claim(db: &Db, user_id: &str, request: &KeyedRequest) -> Result<Claim, ApiError> {
    let key = &request.key;
    let deadline = Instant::now() + WAIT_FOR_ANSWER;
    loop {
        let owner = db::new_id();
        if keys::reserve(db, user_id, key, &request.hash, &owner, db::now_micros()).await? {
            return Ok(Claim::Owner(owner));
        }
        // Released or expired since the reservation failed: reserve again.
        let Some(row) = keys::find(db, user_id, key).await? else { continue };
        match judge(&row, &request.hash, db::now_micros()) {
            Verdict::Replace => {
                if keys::take_over(db, user_id, key, &row.owner, &request.hash, &owner, db::now_micros()).await? {
                    return Ok(Claim::Owner(owner));
                }
            }
            Verdict::Conflict => {
                return Err(ApiError::UnprocessableEntity(format!(
                    "Idempotency-Key '{key}' was already used with a different request."
                )));
            }
            Verdict::Replay { status, body } => return Ok(Claim::Answered { status, body }),
            Verdict::Wait if Instant::now() >= deadline => {
                return Err(ApiError::Conflict(format!(
                    "The request with Idempotency-Key '{key}' is still in progress; retry later."
                )));
            }
            Verdict::Wait => tokio::time::sleep(POLL_EVERY).await,
        }
    }
}

/// Runs the work of the reservation's owner and records its answer, or releases the key (see
/// `keeps_answer`; also when the work panics).
async fn run_and_record<W, R>(db: Db, user_id: String, key: String, owner: String, work: W) -> Response
where
    W: Future<Output = R> + Send + 'static,
    R: IntoResponse + Send + 'static,
{
    let response = match AssertUnwindSafe(work).catch_unwind().await {
        Ok(answer) => answer.into_response(),
        Err(_) => ApiError::Internal("the request's work panicked".into()).into_response(),
    };
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_ANSWER_BYTES).await;
    let recorded = match &bytes {
        Ok(bytes) if keeps_answer(parts.status) => {
            let text = String::from_utf8_lossy(bytes);
            keys::record_answer(&db, &user_id, &key, &owner, i32::from(parts.status.as_u16()), &text).await.map(|_| ())
        }
        _ => keys::release(&db, &user_id, &key, &owner).await,
    };
    if let Err(error) = recorded {
        tracing::warn!(
            error = &error as &dyn std::error::Error,
            "failed to record the answer of an idempotency key; a retry after {} s runs the request again",
            ABANDONED_AFTER.as_secs()
        );
    }
    match bytes {
        Ok(bytes) => Response::from_parts(parts, Body::from(bytes)),
        Err(error) => ApiError::internal(error).into_response(),
    }
}

/// A recorded answer, as first given.
fn replay(status: u16, body: String) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    response
}

/// Deletes the keys older than `KEEP_FOR` at `now`, `EXPIRY_BATCH` per statement; returns how
/// many went.
pub async fn expire(db: &Db, now: i64) -> Result<u64, db::Error> {
    let cutoff = now.saturating_sub(micros(KEEP_FOR));
    let mut deleted = 0;
    loop {
        let batch = keys::delete_expired(db, cutoff, EXPIRY_BATCH).await?;
        deleted += batch;
        if batch < EXPIRY_BATCH as u64 {
            return Ok(deleted);
        }
        tokio::time::sleep(EXPIRY_PAUSE).await;
    }
}

/// Starts the background expiry passes (`serve`, `gateway`).
pub fn start_expiry(db: &Db) {
    tokio::spawn(expire_periodically(db.clone()));
}

async fn expire_periodically(db: Db) {
    loop {
        match expire(&db, db::now_micros()).await {
            Ok(0) => tracing::debug!("idempotency key expiry: nothing to delete"),
            Ok(deleted) => tracing::info!(idempotency_keys.deleted = deleted, "idempotency key expiry pass"),
            Err(error) => tracing::warn!(
                error = &error as &dyn std::error::Error,
                "idempotency key expiry pass failed; the next pass tries again"
            ),
        }
        tokio::time::sleep(EXPIRE_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: i64 = 1_000_000;

    fn row(hash: &str, status: Option<i32>, created: i64) -> IdempotencyKeyRow {
        IdempotencyKeyRow {
            request_hash: hash.into(),
            owner: "o".into(),
            status_code: status,
            body: status.map(|_| "{\"id\": 1}".into()),
            created,
        }
    }

    #[test]
    fn keys_are_1_to_255_visible_ascii_characters() {
        assert_eq!(parse_key(b"retry-7f3c/A.b_c~!").unwrap(), "retry-7f3c/A.b_c~!");
        assert_eq!(parse_key(&[b'k'; 255]).unwrap().len(), 255);
        for bad in [&b""[..], &[b'k'; 256], b"has space", b"tab\t", "caf\u{e9}".as_bytes(), b"nul\0"] {
            let message = parse_key(bad).unwrap_err();
            assert!(message.starts_with("Idempotency-Key "), "{message}");
        }
    }

    #[test]
    fn a_stored_key_means_replay_conflict_wait_or_replace() {
        let now = 1_000_000 * SECOND;
        assert_eq!(
            judge(&row("h", Some(200), now - SECOND), "h", now),
            Verdict::Replay { status: 200, body: "{\"id\": 1}".into() }
        );
        assert_eq!(judge(&row("h", Some(200), now - SECOND), "other", now), Verdict::Conflict);
        assert_eq!(judge(&row("h", None, now - SECOND), "other", now), Verdict::Conflict);
        assert_eq!(judge(&row("h", None, now - 59 * SECOND), "h", now), Verdict::Wait);
        assert_eq!(judge(&row("h", None, now - 60 * SECOND), "h", now), Verdict::Replace);
        // Expired keys count as absent, whatever request used them.
        let day = 24 * 3600 * SECOND;
        assert_eq!(judge(&row("h", Some(200), now - day), "other", now), Verdict::Replace);
        assert!(matches!(judge(&row("h", Some(200), now - day + SECOND), "h", now), Verdict::Replay { .. }));
    }

    #[test]
    fn successes_and_final_4xx_are_kept_retryable_answers_are_not() {
        for kept in [200, 201, 400, 403, 404, 413] {
            assert!(keeps_answer(StatusCode::from_u16(kept).unwrap()), "{kept}");
        }
        for released in [409, 423, 429, 500, 502, 503] {
            assert!(!keeps_answer(StatusCode::from_u16(released).unwrap()), "{released}");
        }
    }

    #[test]
    fn the_hash_covers_the_request_not_its_encoding() {
        let fields = |text: &str| serde_json::from_str::<Map<String, Value>>(text).unwrap();
        let file = |sha256: &str| FileDigest {
            field: "artifact".into(),
            file_name: Some("a.tar".into()),
            size: 3,
            sha256: sha256.into(),
        };
        let base = request_hash("POST", "/run/", &fields(r#"{"a": "1", "b": {"x": 1, "y": 2}}"#), &[file("f1")]);
        assert_eq!(base, request_hash("POST", "/run/", &fields(r#"{"b":{"y":2,"x":1},"a":"1"}"#), &[file("f1")]));
        assert_eq!(base.len(), 64);
        for other in [
            request_hash("PUT", "/run/", &fields(r#"{"a": "1", "b": {"x": 1, "y": 2}}"#), &[file("f1")]),
            request_hash("POST", "/upload/", &fields(r#"{"a": "1", "b": {"x": 1, "y": 2}}"#), &[file("f1")]),
            request_hash("POST", "/run/", &fields(r#"{"a": "2", "b": {"x": 1, "y": 2}}"#), &[file("f1")]),
            request_hash("POST", "/run/", &fields(r#"{"a": 1, "b": {"x": 1, "y": 2}}"#), &[file("f1")]),
            request_hash("POST", "/run/", &fields(r#"{"a": "1", "b": {"x": 1, "y": 2}}"#), &[file("f2")]),
            request_hash("POST", "/run/", &fields(r#"{"a": "1", "b": {"x": 1, "y": 2}}"#), &[]),
        ] {
            assert_ne!(base, other);
        }
    }
}
