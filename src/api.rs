//! The REST gateway: one route table (`router`), the error type every handler returns
//! (`ApiError`, rendered in the contract's shapes), and the request-body reader shared by every
//! endpoint that takes a body (`RequestFields`: JSON, form-urlencoded or multipart).

pub mod console;
pub mod files;
pub mod idempotency;
pub mod jobs;
pub mod openapi;
pub mod programs;
pub mod queue;
pub mod streams;
pub mod system;

use std::collections::HashMap;
use std::io::Write;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, FromRequest, Multipart, Request};
use axum::http::{Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, patch, post};
use serde_json::{Map, Value};

pub use crate::error::ApiError;
pub use crate::state::{AppState, DEFAULT_UPLOAD_MIME_TYPES, GatewayConfig};

use std::path::PathBuf;

use crate::secrets::Secret;

/// The API's settings, shared by `gantry serve` and `gantry gateway`.
#[derive(Debug, Clone, clap::Args)]
pub struct ApiArgs {
    #[command(flatten)]
    pub auth: crate::auth::AuthArgs,
    /// Largest request body in MB; larger bodies get a 413.
    #[arg(long, env = "MAX_REQUEST_BODY_SIZE_MB", default_value_t = 50)]
    pub max_request_body_size_mb: u64,
    /// Largest `arguments` text in MB validated against a function's schema.
    #[arg(long, env = "MAX_ARGUMENTS_LENGTH_MB", default_value_t = 32)]
    pub max_arguments_length_mb: u64,
    /// MIME types accepted by file uploads, comma-separated.
    #[arg(long, env = "GANTRY_UPLOAD_MIME_TYPES", default_value = DEFAULT_UPLOAD_MIME_TYPES)]
    pub upload_mime_types: String,
    /// Version reported by `GET version/`.
    #[arg(long, env = "GANTRY_REPORTED_VERSION", default_value = env!("CARGO_PKG_VERSION"))]
    pub reported_version: String,
    /// Key sealing the callers' tokens kept with their jobs: 32 bytes in base64. Default: a key
    /// generated on first start into `<data-dir>/token.key` (mode 0600).
    #[arg(long, env = "GANTRY_TOKEN_KEY")]
    pub token_key: Option<Secret>,
}

impl ApiArgs {
    pub fn config(&self, spool_dir: PathBuf, active_jobs_per_user: i64) -> GatewayConfig {
        GatewayConfig {
            max_body_bytes: self.max_request_body_size_mb * 1024 * 1024,
            max_arguments_bytes: usize::try_from(self.max_arguments_length_mb * 1024 * 1024).unwrap_or(usize::MAX),
            spool_dir,
            version: self.reported_version.clone(),
            allowed_mime_types: self
                .upload_mime_types
                .split(',')
                .map(|m| m.trim().to_string())
                .filter(|m| !m.is_empty())
                .collect(),
            active_jobs_per_user,
        }
    }
}

/// The gateway's route table. Paths are registered with their trailing slash; `app` adds the
/// slash to requests that lack one before routing, so both forms are served without a redirect.
pub fn router(state: AppState) -> Router {
    let max_body = state.config.max_body_bytes;
    let api = Router::new()
        .route("/programs/", get(programs::list_programs))
        .route("/programs/get_by_title/{title}/", get(programs::get_program_by_title))
        .route("/programs/upload/", post(programs::upload_program))
        .route("/programs/validate_arguments/", post(programs::validate_arguments))
        .route("/programs/run/", post(jobs::run_program))
        .route("/programs/{program_id}/get_jobs/", get(jobs::get_program_jobs))
        .route("/jobs/", get(jobs::list_jobs))
        .route("/jobs/provider/", get(jobs::list_provider_jobs))
        .route("/jobs/queue/", get(queue::my_queue))
        .route("/jobs/{job_id}/", get(jobs::get_job))
        .route("/jobs/{job_id}/result/", get(jobs::get_job_result).post(jobs::save_job_result))
        .route("/jobs/{job_id}/logs/", get(jobs::get_job_logs))
        .route("/jobs/{job_id}/logs/stream/", get(streams::stream_job_logs))
        .route("/jobs/{job_id}/provider-logs/", get(jobs::get_job_provider_logs))
        .route("/jobs/{job_id}/provider-logs/stream/", get(streams::stream_job_provider_logs))
        .route("/jobs/{job_id}/stop/", post(jobs::stop_job))
        .route("/jobs/{job_id}/sub_status/", patch(jobs::set_sub_status))
        .route("/jobs/{job_id}/event/", post(jobs::create_job_event))
        .route("/jobs/{job_id}/events/", get(jobs::list_job_events))
        .route("/jobs/{job_id}/events/stream/", get(streams::stream_job_events))
        .route("/jobs/{job_id}/runtime_jobs/", get(jobs::list_runtime_jobs).post(jobs::add_runtime_job))
        .route("/files/", get(files::list_user_files))
        .route("/files/list/", get(files::list_user_files_spec))
        .route("/files/upload/", post(files::upload_user_file))
        .route("/files/download/", get(files::download_user_file))
        .route("/files/delete/", delete(files::delete_user_file))
        .route("/files/provider/", get(files::list_provider_files))
        .route("/files/provider/upload/", post(files::upload_provider_file))
        .route("/files/provider/download/", get(files::download_provider_file))
        .route("/files/provider/delete/", delete(files::delete_provider_file))
        .route("/dependencies-versions/", get(system::dependencies_versions))
        .route("/version/", get(system::version))
        .route("/readiness/", get(system::readiness))
        .route("/liveness/", get(system::liveness))
        .method_not_allowed_fallback(method_not_allowed);
    Router::new()
        .nest("/api/v1", api)
        .route("/version/", get(system::version))
        .route("/readiness/", get(system::readiness))
        .route("/liveness/", get(system::liveness))
        .route("/swagger/", get(openapi::swagger_ui))
        .route("/swagger.json", get(openapi::swagger_json))
        .route("/openapi.json", get(openapi::swagger_json))
        .route("/", get(console::root))
        .route("/console/", get(console::index))
        .route("/console/{*path}", get(console::file))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(usize::try_from(max_body).unwrap_or(usize::MAX)))
        .layer(middleware::from_fn_with_state(state.clone(), reject_large_bodies))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}

/// The router behind path normalization: what `gantry serve` and the tests run.
pub fn app(state: AppState) -> tower::util::MapRequest<Router, fn(Request) -> Request> {
    tower::ServiceExt::map_request(router(state), add_trailing_slash as fn(Request) -> Request)
}

/// Appends `/` to paths that lack it (except files like `/swagger.json`), before routing.
fn add_trailing_slash(mut request: Request) -> Request {
    let path = request.uri().path();
    let last = path.rsplit('/').next().unwrap_or_default();
    if !path.ends_with('/') && !last.contains('.') {
        let new_path = format!("{path}/");
        let path_and_query = match request.uri().query() {
            Some(query) => format!("{new_path}?{query}"),
            None => new_path,
        };
        let mut parts = request.uri().clone().into_parts();
        if let Ok(value) = path_and_query.parse() {
            parts.path_and_query = Some(value);
            if let Ok(uri) = Uri::from_parts(parts) {
                *request.uri_mut() = uri;
            }
        }
    }
    request
}

/// Refuses a declared body above the limit before reading any of it.
async fn reject_large_bodies(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let declared =
        request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > state.config.max_body_bytes) {
        return ApiError::PayloadTooLarge { limit_mb: state.config.max_body_mb() }.into_response();
    }
    next.run(request).await
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(format!("Not found: {}", uri.path()))
}

async fn method_not_allowed(method: Method, axum::extract::OriginalUri(uri): axum::extract::OriginalUri) -> ApiError {
    ApiError::MethodNotAllowed(format!("Method {method} is not allowed on {}.", uri.path()))
}

/// A file part of a multipart body, spooled to disk (never held in memory).
pub struct UploadedFile {
    pub file_name: Option<String>,
    pub path: tempfile::TempPath,
    pub size: u64,
    /// The first bytes, for content sniffing.
    pub head: Vec<u8>,
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
                tokio::fs::create_dir_all(&state.config.spool_dir).await.map_err(ApiError::internal)?;
                let spool = tempfile::NamedTempFile::new_in(&state.config.spool_dir).map_err(ApiError::internal)?;
                let (file, path) = spool.into_parts();
                let mut writer = tokio::fs::File::from_std(file);
                let mut size = 0u64;
                let mut head = Vec::new();
                while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
                    if head.len() < HEAD_BYTES {
                        let take = (HEAD_BYTES - head.len()).min(chunk.len());
                        head.extend_from_slice(&chunk[..take]);
                    }
                    size += chunk.len() as u64;
                    tokio::io::AsyncWriteExt::write_all(&mut writer, &chunk).await.map_err(ApiError::internal)?;
                }
                tokio::io::AsyncWriteExt::flush(&mut writer).await.map_err(ApiError::internal)?;
                let mut file = writer.into_std().await;
                file.flush().map_err(ApiError::internal)?;
                fields.files.insert(name, UploadedFile { file_name: Some(file_name), path, size, head });
            }
        }
    }
    Ok(fields)
}

/// A streamed body from storage.
pub fn stream_body(object: crate::storage::Object) -> Body {
    Body::from_stream(object.body)
}
