//! The REST gateway: the route table (`router`, whose documented part `documented_routes` also
//! yields the OpenAPI document) and the layers around it. Below it, one module per concern:
//! `state` (what handlers may use), `error` (`ApiError`, rendered in the contract's shapes),
//! `extract` (the `Caller` of a request), `fields` (request bodies), `access` (the lookups that
//! answer 404 or 403), `shared` (the types several endpoints share), then the endpoints by
//! resource: `jobs/`, `programs/`, `files`, `streams`, `system`. Each endpoint's file holds its
//! handlers, which parse, call the flow beside them and answer, that flow (the whole action:
//! its permission checks and the compensation of a step that fails after another succeeded) and
//! its request and answer types, which the document describes. Endpoint modules import the
//! concerns and each other without a circle, never this one.
//!
//! Parsing keeps the reference's messages and order of checks: a body's own fields are checked
//! by its request type; what needs the database (the function, its sizes, its schema) by the
//! flow. The fields of every answer are declared in alphabetical order (see `shared`).

pub mod access;
pub mod console;
pub mod error;
pub mod extract;
pub mod fields;
pub mod files;
pub mod idempotency;
pub mod jobs;
pub mod openapi;
pub mod programs;
pub mod request_span;
pub mod shared;
pub mod state;
pub mod streams;
pub mod system;
pub mod usage;

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{Method, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

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
    /// Largest size in MiB an artifact may unpack to, each member counted at its full declared
    /// size (a sparse member's holes included): larger artifacts are refused at upload (400),
    /// and a job whose stored artifact is larger fails before writing past it.
    #[arg(long, env = "GANTRY_MAX_UNPACKED_MIB", default_value_t = crate::artifact::DEFAULT_MAX_UNPACKED_MIB)]
    pub max_unpacked_mib: u64,
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
    /// Address of a job's trace in a tracing UI (Jaeger, Tempo, ...), `{trace_id}` standing for
    /// the trace's id, e.g. `http://jaeger:16686/trace/{trace_id}`: `jobs/{id}/trace/` answers
    /// it and the console links each job to its trace.
    #[arg(long, env = "GANTRY_TRACE_LINK", value_parser = parse_trace_link)]
    pub trace_link: Option<String>,
}

/// A trace link template: an http(s) address holding `{trace_id}`.
fn parse_trace_link(text: &str) -> Result<String, String> {
    if !(text.starts_with("http://") || text.starts_with("https://")) || !text.contains("{trace_id}") {
        return Err("expected an http(s) address holding {trace_id}, e.g. http://jaeger:16686/trace/{trace_id}".into());
    }
    Ok(text.to_string())
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
            admission: None,
            max_unpacked_mib: self.max_unpacked_mib,
            trace_link: self.trace_link.clone(),
        }
    }
}

/// The documented routes, grouped by resource: each handler's `#[utoipa::path]` gives its method
/// and path, so the router and the OpenAPI document come from this one list. Paths carry their
/// trailing slash; `app` adds the slash to requests that lack one before routing, so both forms
/// are served without a redirect.
pub fn documented_routes() -> OpenApiRouter<AppState> {
    let probes = || {
        OpenApiRouter::new()
            .routes(routes!(system::version))
            .routes(routes!(system::readiness))
            .routes(routes!(system::liveness))
    };
    let api = OpenApiRouter::new()
        .routes(routes!(programs::read::list_programs))
        .routes(routes!(programs::read::get_program_by_title))
        .routes(routes!(programs::upload::upload_program))
        .routes(routes!(programs::validate::validate_arguments))
        .routes(routes!(jobs::run::run_program))
        .routes(routes!(jobs::list::get_program_jobs))
        .routes(routes!(jobs::list::list_jobs))
        .routes(routes!(jobs::list::list_provider_jobs))
        .routes(routes!(jobs::queue::my_queue))
        .routes(routes!(usage::get_usage))
        .routes(routes!(usage::get_job_usage))
        .routes(routes!(jobs::read::get_job))
        .routes(routes!(jobs::read::get_job_arguments))
        .routes(routes!(jobs::read::get_job_trace))
        .routes(routes!(jobs::result::get_job_result, jobs::result::save_job_result))
        .routes(routes!(streams::get_job_logs))
        .routes(routes!(streams::stream_job_logs))
        .routes(routes!(streams::get_job_provider_logs))
        .routes(routes!(streams::stream_job_provider_logs))
        .routes(routes!(jobs::stop::stop_job))
        .routes(routes!(jobs::sub_status::set_sub_status))
        .routes(routes!(jobs::events::create_job_event))
        .routes(routes!(jobs::events::list_job_events))
        .routes(routes!(streams::stream_job_events))
        .routes(routes!(jobs::runtime_jobs::list_runtime_jobs, jobs::runtime_jobs::add_runtime_job))
        .routes(routes!(files::list_user_files))
        .routes(routes!(files::list_user_files_spec))
        .routes(routes!(files::upload_user_file))
        .routes(routes!(files::download_user_file))
        .routes(routes!(files::delete_user_file))
        .routes(routes!(files::list_provider_files))
        .routes(routes!(files::upload_provider_file))
        .routes(routes!(files::download_provider_file))
        .routes(routes!(files::delete_provider_file))
        .routes(routes!(system::dependencies_versions))
        .merge(probes());
    OpenApiRouter::with_openapi(openapi::base()).nest("/api/v1", api).merge(probes())
}

/// The OpenAPI document of `documented_routes`, as `/swagger.json` serves it.
pub fn document() -> utoipa::openapi::OpenApi {
    openapi::finish(documented_routes().into_openapi())
}

/// The gateway's route table: the documented routes, the document itself with its page, and
/// the console.
pub fn router(state: AppState) -> Router {
    let max_body = state.config.max_body_bytes;
    let (documented, document) = documented_routes().split_for_parts();
    let document = Arc::new(serde_json::to_value(openapi::finish(document)).expect("the document serializes"));
    let json = {
        let document = document.clone();
        move || openapi::swagger_json(document.clone())
    };
    documented
        .route("/swagger/", get(move || openapi::swagger_ui(document.clone())))
        .route("/swagger.json", get(json.clone()))
        .route("/openapi.json", get(json))
        .route("/", get(console::root))
        .route("/console/", get(console::index))
        .route("/console/{*path}", get(console::file))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(usize::try_from(max_body).unwrap_or(usize::MAX)))
        .layer(middleware::from_fn_with_state(state.clone(), reject_large_bodies))
        .layer(
            tower_http::trace::TraceLayer::new_for_http()
                .make_span_with(request_span::make_span::<axum::body::Body>)
                .on_response(request_span::record_answer::<axum::body::Body>),
        )
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
