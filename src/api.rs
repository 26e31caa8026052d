//! The REST gateway: the route table (`router`) and the layers around it. Below it, one module
//! per concern: `state` (what handlers may use), `error` (`ApiError`, rendered in the
//! contract's shapes), `extract` (the `Caller` of a request), `fields` (request bodies), then
//! the handlers by resource. Handlers import those modules, never this one.

pub mod console;
pub mod error;
pub mod extract;
pub mod fields;
pub mod files;
pub mod idempotency;
pub mod jobs;
pub mod openapi;
pub mod programs;
pub mod queue;
pub mod state;
pub mod streams;
pub mod system;

use std::path::PathBuf;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{Method, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, patch, post};

pub use error::ApiError;
pub use fields::{RequestFields, UploadedFile};
pub use state::{AppState, DEFAULT_UPLOAD_MIME_TYPES, GatewayConfig};

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
        .route("/jobs/{job_id}/logs/", get(streams::get_job_logs))
        .route("/jobs/{job_id}/logs/stream/", get(streams::stream_job_logs))
        .route("/jobs/{job_id}/provider-logs/", get(streams::get_job_provider_logs))
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
