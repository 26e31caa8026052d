//! What requests carry: the bodies (`RunRequest`, `UploadRequest`, …) as the handlers parse them
//! from `RequestFields`, and the query parameters (`JobsQuery`, …) as axum reads them. The same
//! types describe the requests in the OpenAPI document (`ToSchema`, `IntoParams`), with every
//! constraint the parsing enforces: required fields and parameters, enums, formats, minimums,
//! lengths, file parts.
//!
//! Parsing keeps the reference's messages and order of checks: a body's own fields are checked
//! here; what needs the database (the function, its sizes, its schema) is the service's.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{AllOfBuilder, AnyOfBuilder, ObjectBuilder, Schema};
use utoipa::{IntoParams, PartialSchema, ToSchema};

use super::error::ApiError;
use super::fields::RequestFields;
use crate::auth::runtime_service::{ServiceField, parse_service};
use crate::domain::names;

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::BadRequest(message.into())
}

/// A size label of a function (any letter case when sent; stored uppercase).
#[derive(Debug, Clone, Copy, ToSchema)]
#[schema(rename_all = "UPPERCASE")]
pub enum Size {
    S,
    M,
    L,
    Xl,
}

/// What a running job says it is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ToSchema)]
#[schema(rename_all = "SCREAMING_SNAKE_CASE", example = "MAPPING")]
pub enum SubStatus {
    Mapping,
    OptimizingHardware,
    WaitingQpu,
    ExecutingQpu,
    PostProcessing,
}

impl SubStatus {
    pub const ALL: [SubStatus; 5] = [
        SubStatus::Mapping,
        SubStatus::OptimizingHardware,
        SubStatus::WaitingQpu,
        SubStatus::ExecutingQpu,
        SubStatus::PostProcessing,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SubStatus::Mapping => "MAPPING",
            SubStatus::OptimizingHardware => "OPTIMIZING_HARDWARE",
            SubStatus::WaitingQpu => "WAITING_QPU",
            SubStatus::ExecutingQpu => "EXECUTING_QPU",
            SubStatus::PostProcessing => "POST_PROCESSING",
        }
    }

    pub fn parse(text: &str) -> Option<SubStatus> {
        SubStatus::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// The one event type a job may record (any letter case when sent).
#[derive(Debug, Clone, Copy, ToSchema)]
#[schema(rename_all = "UPPERCASE", example = "ERROR")]
pub enum EventType {
    Error,
}

/// The kind of a function.
#[derive(Debug, Clone, Copy, ToSchema)]
#[schema(rename_all = "UPPERCASE")]
pub enum ProgramType {
    Generic,
    Application,
    Circuit,
}

/// Which jobs a listing keeps: those of provider functions or of the caller's own.
#[derive(Debug, Clone, Copy, ToSchema)]
#[schema(rename_all = "lowercase")]
pub enum JobsFilter {
    Catalog,
    Serverless,
}

/// How a followed log is sent.
#[derive(Debug, Clone, Copy, ToSchema)]
#[schema(rename_all = "lowercase")]
pub enum LogFormat {
    Sse,
    Text,
}

/// The `arguments` field as text: the client sends a JSON string; a JSON body may also carry an
/// object directly.
pub fn arguments_text(fields: &RequestFields) -> Result<String, ApiError> {
    match fields.value("arguments") {
        Some(value) if !value.is_string() => Ok(value.to_string()),
        _ => fields.required_text("arguments"),
    }
}

/// `config` of a run (accepted, kept with the job).
#[derive(Debug, Clone, ToSchema)]
pub struct RunConfig {
    pub workers: Option<i64>,
    #[schema(required = false)]
    pub auto_scaling: bool,
}

/// `POST programs/run/`.
#[derive(Debug, Clone, ToSchema)]
pub struct RunRequest {
    /// The function's title (sanitized to letters, digits, _ and -).
    #[schema(min_length = 1, example = "example-fn")]
    pub title: String,
    /// The provider of a provider function.
    #[schema(nullable = false)]
    pub provider: Option<String>,
    /// The arguments as encoded JSON text (the client sends a string; a JSON object is accepted
    /// too), validated against the function's schema.
    #[schema(min_length = 1, example = "{}")]
    pub arguments: String,
    // One of the function's sizes (checked once the function is found).
    #[schema(value_type = Option<Size>, inline, nullable = false)]
    pub function_size: Option<String>,
    #[schema(value_type = Option<RunConfig>, inline, nullable = false)]
    pub config: Value,
}

impl RunRequest {
    pub fn parse(fields: &RequestFields) -> Result<RunRequest, ApiError> {
        if fields.value("compute_profile").is_some() {
            return Err(bad(
                "'compute_profile' was removed: use 'function_size' with one of the function's sizes (S, M, L, XL).",
            ));
        }
        let raw_title = fields.required_text("title")?;
        let provider = fields.text("provider").map(|p| names::sanitize_title(&p, false)).filter(|p| !p.is_empty());
        let title = names::sanitize_title(&raw_title, false);
        let arguments = arguments_text(fields)?;
        let config = match fields.value("config") {
            None => Value::Object(Default::default()),
            Some(Value::String(text)) => {
                serde_json::from_str::<Value>(text).map_err(|e| bad(format!("'config' is not valid JSON: {e}")))?
            }
            Some(other) => other.clone(),
        };
        if !config.is_object() {
            return Err(bad("'config' must be a JSON object."));
        }
        let function_size = fields.text("function_size").filter(|s| !s.trim().is_empty());
        Ok(RunRequest { title, provider, arguments, function_size, config })
    }
}

/// The headers of a run that the job keeps: `Service-CRN` (the instance) and `Service-Channel`.
#[derive(Debug, Clone, Default)]
pub struct RunHeaders {
    pub instance: Option<String>,
    pub channel: Option<String>,
    /// The caller's W3C trace context: kept with the job when spans are off.
    pub traceparent: Option<String>,
}

impl RunHeaders {
    pub fn of(headers: &axum::http::HeaderMap) -> RunHeaders {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        RunHeaders { instance: text("service-crn"), channel: text("service-channel"), traceparent: text("traceparent") }
    }
}

/// `POST programs/validate_arguments/`.
#[derive(Debug, Clone, ToSchema)]
pub struct ValidateRequest {
    /// The function's title; `provider/title` names a provider function.
    #[schema(min_length = 1, pattern = "^[^/]*[A-Za-z0-9_-][^/]*(/[^/]*[A-Za-z0-9_-][^/]*)?$", example = "example-fn")]
    pub title: String,
    #[schema(nullable = false)]
    pub provider: Option<String>,
    /// The arguments as encoded JSON text (the client sends a string; a JSON object is accepted
    /// too), validated against the function's schema.
    #[schema(min_length = 1, example = "{}")]
    pub arguments: String,
}

impl ValidateRequest {
    pub fn parse(fields: &RequestFields) -> Result<ValidateRequest, ApiError> {
        let raw_title = fields.required_text("title")?;
        let (provider, title) = names::split_title(&raw_title, fields.text("provider").as_deref()).map_err(bad)?;
        let arguments = arguments_text(fields)?;
        Ok(ValidateRequest { title, provider, arguments })
    }
}

/// `POST programs/upload/`: create or update a function (upsert). The fields of an update are
/// those sent; the service applies them (`service::programs::upload`). This type describes the
/// body; it is read from the `RequestFields` as they come.
#[derive(Debug, Clone, ToSchema)]
#[allow(dead_code)]
pub struct UploadRequest {
    /// Sanitized to letters, digits, _ and -; `provider/title` names a provider function.
    #[schema(
        min_length = 1,
        max_length = 255,
        pattern = "^[^/]*[A-Za-z0-9_-][^/]*(/[^/]*[A-Za-z0-9_-][^/]*)?$",
        example = "example-fn"
    )]
    title: String,
    /// The provider of a provider function (or `provider/title` as `title`); required with
    /// `image`.
    #[schema(nullable = false, example = "example-provider")]
    provider: Option<String>,
    /// Relative path of a .py file inside the artifact, no `..`.
    #[schema(nullable = false, pattern = r"^[A-Za-z0-9_./-]+\.py$", example = "main.py")]
    entrypoint: Option<String>,
    /// Uncompressed .tar holding the entrypoint.
    #[schema(value_type = Option<String>, nullable = false, format = Binary,
        content_media_type = "application/x-tar", example = "artifact.tar")]
    artifact: Option<String>,
    /// Container image (provider functions only; must be in the provider's registry).
    #[schema(nullable = false, example = "registry.example/example-provider/example-fn:1.0")]
    image: Option<String>,
    /// JSON array of pinned requirements from dependencies-versions/.
    #[schema(nullable = false)]
    dependencies: Option<String>,
    /// JSON object of strings.
    #[schema(nullable = false)]
    env_vars: Option<String>,
    #[schema(nullable = false)]
    description: Option<String>,
    /// A PEP 440 version such as 1.2.3.
    #[schema(nullable = false)]
    version: Option<String>,
    #[schema(rename = "type", value_type = Option<ProgramType>, inline, nullable = false)]
    program_type: Option<String>,
    /// JSON Schema (object or boolean); {} removes it.
    #[schema(nullable = false, max_length = 65536)]
    arguments_schema: Option<String>,
    /// JSON object {label: compute profile}, labels S, M, L, XL.
    #[schema(nullable = false)]
    sizes: Option<String>,
    #[schema(value_type = Option<Size>, inline, nullable = false)]
    default_size: Option<String>,
    #[schema(value_type = Option<Size>, inline, nullable = false)]
    function_size: Option<String>,
    /// Provider functions only.
    #[schema(nullable = false)]
    gpu: Option<bool>,
    /// On Kubernetes: start a job again on a new pod when the cluster ends its pod (evicted,
    /// preempted, node lost) after the function's code started. Off by default, since a rerun
    /// may repeat work (and paid quantum work) done before; a job ended before its code started
    /// is started again either way.
    #[schema(nullable = false)]
    retry_after_start: Option<bool>,
}

/// Names (titles, providers) are sanitized to their letters, digits, `_` and `-`, of which they
/// must hold one: the parameters say so with the searched (not anchored) pattern
/// `[A-Za-z0-9_-]`, titles that may be `provider/title` with at most one slash and a name on
/// each side.
fn pattern_property(name: &str, pattern: &str) -> Schema {
    let property = ObjectBuilder::new().schema_type(utoipa::openapi::Type::String).pattern(Some(pattern)).build();
    Schema::Object(ObjectBuilder::new().property(name, property).build())
}

/// `schema` with the rule the server keeps between `title` and `provider`: a `provider/title`
/// title goes without a `provider` (one that sanitizes to nothing counts as none).
fn one_provider(schema: RefOr<Schema>) -> RefOr<Schema> {
    let branches = AnyOfBuilder::new()
        .item(pattern_property("title", "^[^/]*$"))
        .item(pattern_property("provider", "^[^A-Za-z0-9_-]*$"))
        .build();
    RefOr::T(Schema::AllOf(AllOfBuilder::new().item(schema).item(Schema::AnyOf(branches)).build()))
}

/// The upload body as multipart, the only encoding that carries the artifact. Only `title` is
/// required: an update names the stored function and carries the fields that change. Whether a
/// request creates or updates depends on what is stored, so what a creation needs besides
/// (`entrypoint` and `artifact`, or a provider's `image`) is stated in the operation's text,
/// not as a schema a client would apply to updates too.
pub struct UploadMultipart;

impl PartialSchema for UploadMultipart {
    fn schema() -> RefOr<Schema> {
        one_provider(UploadRequest::schema())
    }
}

impl ToSchema for UploadMultipart {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("UploadMultipart")
    }
}

/// The upload body as JSON or a form, which cannot carry the artifact: an update with only
/// `title` and the fields that change, or the creation of a provider's image function (`image`
/// and `provider`, stated in the operation's text as for multipart).
pub struct UploadFields;

impl PartialSchema for UploadFields {
    fn schema() -> RefOr<Schema> {
        let mut schema = UploadRequest::schema();
        if let RefOr::T(Schema::Object(object)) = &mut schema {
            object.properties.retain(|name, _| name != "artifact");
        }
        one_provider(schema)
    }
}

/// The validation body: `ValidateRequest` with the `title`/`provider` rule of uploads.
pub struct ValidateBody;

impl PartialSchema for ValidateBody {
    fn schema() -> RefOr<Schema> {
        one_provider(ValidateRequest::schema())
    }
}

impl ToSchema for ValidateBody {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("ValidateBody")
    }
}

impl ToSchema for UploadFields {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("UploadFields")
    }
}

/// `POST jobs/{job_id}/result/` (older in-job clients).
#[derive(Debug, Clone, ToSchema)]
pub struct SaveResultRequest {
    #[schema(min_length = 1, example = "{}")]
    pub result: String,
}

impl SaveResultRequest {
    pub fn parse(fields: &RequestFields) -> Result<SaveResultRequest, ApiError> {
        Ok(SaveResultRequest { result: fields.required_text("result")? })
    }
}

/// `POST jobs/{job_id}/stop/`.
#[derive(Debug, ToSchema)]
pub struct StopRequest {
    /// The serialized runtime service (`QiskitRuntimeService`: channel, token, instance) whose
    /// runtime jobs the job reported are cancelled; `"null"` or absent: none. Used for this
    /// request only: never logged or stored.
    #[schema(value_type = Option<String>, nullable = false)]
    pub service: ServiceField,
}

impl StopRequest {
    /// Checks the body and reads the `service` (a serialized runtime service with credentials).
    pub fn parse(fields: &RequestFields) -> Result<StopRequest, ApiError> {
        if fields.values.get("service").is_some_and(Value::is_null) {
            return Err(bad("This field may not be null. ('service')"));
        }
        Ok(StopRequest { service: parse_service(fields.text("service").as_deref()) })
    }
}

/// `PATCH jobs/{job_id}/sub_status/`.
#[derive(Debug, Clone, ToSchema)]
pub struct SubStatusRequest {
    #[schema(inline)]
    pub sub_status: SubStatus,
}

impl SubStatusRequest {
    pub fn parse(fields: &RequestFields) -> Result<SubStatusRequest, ApiError> {
        if fields.values.get("sub_status").is_some_and(Value::is_null) {
            return Err(bad("'sub_status' cannot be null"));
        }
        let sub_status = fields
            .text("sub_status")
            .and_then(|v| SubStatus::parse(&v))
            .ok_or_else(|| bad("'sub_status' not provided or is not valid"))?;
        Ok(SubStatusRequest { sub_status })
    }
}

/// The event type of `event/` and `events/?type=`: `ERROR` in any letter case.
pub fn event_type(raw: Option<String>) -> Result<Option<String>, ApiError> {
    match raw.map(|t| t.trim().to_ascii_uppercase()) {
        None => Ok(None),
        Some(t) if t == "ERROR" => Ok(Some(t)),
        Some(_) => Err(bad("Type is not valid. Valid types: ['ERROR']")),
    }
}

/// `POST jobs/{job_id}/event/`: an ERROR event of an active job.
#[derive(Debug, Clone, ToSchema)]
pub struct EventRequest {
    #[schema(rename = "type", value_type = EventType, inline)]
    pub event_type: String,
    #[schema(min_length = 1, example = "E1")]
    pub code: String,
    #[schema(min_length = 1, example = "failed")]
    pub message: String,
    #[schema(min_length = 1, example = "ValueError")]
    pub exception: String,
    /// Any JSON value, or JSON text.
    #[schema(value_type = Value, required = false)]
    pub args: Value,
}

impl EventRequest {
    pub fn parse(fields: &RequestFields) -> Result<EventRequest, ApiError> {
        let event_type =
            event_type(fields.text("type"))?.ok_or_else(|| bad("Type is not valid. Valid types: ['ERROR']"))?;
        Ok(EventRequest {
            event_type,
            code: fields.required_text("code")?,
            message: fields.required_text("message")?,
            exception: fields.required_text("exception")?,
            args: match fields.value("args") {
                Some(Value::String(text)) => serde_json::from_str(text).unwrap_or(Value::String(text.clone())),
                Some(other) => other.clone(),
                None => Value::Null,
            },
        })
    }
}

/// `POST jobs/{job_id}/runtime_jobs/`.
#[derive(Debug, Clone, ToSchema)]
pub struct RuntimeJobRequest {
    #[schema(min_length = 1, max_length = 100, example = "runtime-job-1")]
    pub runtime_job: String,
    pub runtime_session: Option<String>,
}

impl RuntimeJobRequest {
    pub fn parse(fields: &RequestFields) -> Result<RuntimeJobRequest, ApiError> {
        let runtime_job = fields.required_text("runtime_job")?;
        if runtime_job.len() > 100 {
            return Err(bad("'runtime_job' must be at most 100 characters."));
        }
        let runtime_session = fields.text("runtime_session").filter(|s| !s.is_empty());
        Ok(RuntimeJobRequest { runtime_job, runtime_session })
    }
}

/// A file upload (multipart only).
#[derive(Debug, Clone, ToSchema)]
#[allow(dead_code)]
pub struct FileUpload {
    /// The file; its content must sniff as one of the accepted MIME types.
    #[schema(value_type = String, format = Binary, content_media_type = "text/plain", example = "notes.txt")]
    file: String,
}

/// `schema`, or the empty text the listings read as no filter.
fn or_empty(schema: RefOr<Schema>) -> Schema {
    let empty = ObjectBuilder::new().schema_type(utoipa::openapi::Type::String).max_length(Some(0)).build();
    Schema::AnyOf(AnyOfBuilder::new().item(schema).item(empty).build())
}

/// `created_after`: a date-time, a date or empty (no bound), as the listings read it.
fn created_after_schema() -> Schema {
    use utoipa::openapi::schema::{KnownFormat, SchemaFormat, Type};
    let text = |format: KnownFormat| {
        ObjectBuilder::new().schema_type(Type::String).format(Some(SchemaFormat::KnownFormat(format))).build()
    };
    let dated = AnyOfBuilder::new().item(text(KnownFormat::DateTime)).item(text(KnownFormat::Date)).build();
    or_empty(RefOr::T(Schema::AnyOf(dated)))
}

fn filter_or_empty() -> Schema {
    or_empty(JobsFilter::schema())
}

/// `GET programs/`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ProgramsQuery {
    /// serverless (own functions) or catalog (provider functions the caller may run); other
    /// values list everything.
    pub filter: Option<String>,
    /// Only functions of this provider.
    pub provider: Option<String>,
}

/// `GET programs/get_by_title/{title}/`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ProviderQuery {
    /// Provider name.
    pub provider: Option<String>,
}

/// The filters and page of `jobs/`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct JobsQuery {
    /// Provider name.
    pub provider: Option<String>,
    /// Function title; 404 when no such function exists.
    pub function: Option<String>,
    /// Job status (QUEUED, PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED; any letter case);
    /// empty means any, a value no job has (CANCELLED) an empty page, as the reference.
    #[param(example = "SUCCEEDED")]
    pub status: Option<String>,
    /// catalog (provider functions) or serverless (own functions); empty means both.
    #[param(schema_with = filter_or_empty)]
    pub filter: Option<String>,
    /// ISO 8601 date or datetime (naive is UTC), inclusive; empty means no bound.
    #[param(schema_with = created_after_schema)]
    pub created_after: Option<String>,
    /// Page size, 0 for all.
    #[param(value_type = Option<i64>, minimum = 0, default = 10)]
    pub limit: Option<String>,
    /// Results skipped.
    #[param(value_type = Option<i64>, minimum = 0, default = 0)]
    pub offset: Option<String>,
    /// Keyset pagination instead of `offset`: empty for the first page, then the cursor of a
    /// page's `next` or `previous` link (whose links then carry cursors and the filters).
    pub cursor: Option<String>,
}

/// The filters and page of `jobs/provider/`: `provider` is required.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ProviderJobsQuery {
    /// Provider name.
    #[param(required = true, min_length = 1, pattern = "[A-Za-z0-9_-]", example = "example-provider")]
    pub provider: Option<String>,
    /// Function title; 404 when no such function exists.
    pub function: Option<String>,
    /// Job status (QUEUED, PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED; any letter case);
    /// empty means any, a value no job has (CANCELLED) an empty page, as the reference.
    #[param(example = "SUCCEEDED")]
    pub status: Option<String>,
    /// catalog (provider functions) or serverless (own functions); empty means both.
    #[param(schema_with = filter_or_empty)]
    pub filter: Option<String>,
    /// ISO 8601 date or datetime (naive is UTC), inclusive; empty means no bound.
    #[param(schema_with = created_after_schema)]
    pub created_after: Option<String>,
    /// Page size, 0 for all.
    #[param(value_type = Option<i64>, minimum = 0, default = 10)]
    pub limit: Option<String>,
    /// Results skipped.
    #[param(value_type = Option<i64>, minimum = 0, default = 0)]
    pub offset: Option<String>,
    /// Keyset pagination instead of `offset`: empty for the first page, then the cursor of a
    /// page's `next` or `previous` link (whose links then carry cursors and the filters).
    pub cursor: Option<String>,
}

impl From<ProviderJobsQuery> for JobsQuery {
    fn from(query: ProviderJobsQuery) -> JobsQuery {
        let ProviderJobsQuery { provider, function, status, filter, created_after, limit, offset, cursor } = query;
        JobsQuery { provider, function, status, filter, created_after, limit, offset, cursor }
    }
}

/// `GET jobs/{job_id}/`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RetrieveQuery {
    /// Include the result (author only).
    #[param(value_type = Option<bool>, default = true)]
    pub with_result: Option<String>,
}

/// `GET jobs/{job_id}/events/`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Only events of this type (any letter case).
    #[serde(rename = "type")]
    #[param(value_type = Option<EventType>, inline)]
    pub event_type: Option<String>,
}

/// `GET jobs/{job_id}/events/stream/`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventStreamQuery {
    /// Resume after this event (the Last-Event-ID header wins).
    #[param(value_type = Option<i64>, minimum = 0)]
    pub last_event_id: Option<String>,
}

/// The `Last-Event-ID` header a reconnecting EventSource sends.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Header)]
pub struct LastEventIdHeader {
    /// Resume after this event id.
    #[param(rename = "Last-Event-ID", value_type = Option<i64>, nullable = false, minimum = 0)]
    pub last_event_id: Option<String>,
}

/// `GET jobs/{job_id}/logs/stream/` and `provider-logs/stream/`: `offset` and `format` (`sse`
/// or `text`; by default SSE when `Accept` names `text/event-stream` or the request carries
/// `Last-Event-ID`, else chunked text).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LogStreamQuery {
    /// Byte offset to start from.
    #[param(value_type = Option<i64>, minimum = 0, default = 0)]
    pub offset: Option<String>,
    /// Default: SSE when Accept names text/event-stream or Last-Event-ID is sent, else text.
    #[param(value_type = Option<LogFormat>, inline)]
    pub format: Option<String>,
}

/// `GET jobs/queue/`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct QueueQuery {
    /// List at most this many jobs (the counts cover all).
    #[param(value_type = Option<i64>, minimum = 0, maximum = 500, default = 500, example = 10)]
    pub limit: Option<String>,
}

/// Where a files request points: the function, its provider, a file.
#[derive(Debug, Default)]
pub struct FileQuery {
    pub function: Option<String>,
    pub provider: Option<String>,
    pub file: Option<String>,
}

/// The caller's files of a function (`files/`, `files/list/`, `files/upload/`).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UserFilesQuery {
    /// Function title.
    #[param(required = true, min_length = 1, pattern = "[A-Za-z0-9_-]", example = "example-fn")]
    pub function: Option<String>,
    /// Provider name.
    pub provider: Option<String>,
}

/// One of the caller's files (`files/download/`, `files/delete/`).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UserFileQuery {
    /// Function title.
    #[param(required = true, min_length = 1, pattern = "[A-Za-z0-9_-]", example = "example-fn")]
    pub function: Option<String>,
    /// Provider name.
    pub provider: Option<String>,
    /// File name.
    #[param(required = true, min_length = 1, example = "notes.txt")]
    pub file: Option<String>,
}

/// A provider's files of one of its functions (`files/provider/`, `files/provider/upload/`).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ProviderFilesQuery {
    /// Function title.
    #[param(required = true, min_length = 1, pattern = "[A-Za-z0-9_-]", example = "example-fn")]
    pub function: Option<String>,
    /// Provider name.
    #[param(required = true, min_length = 1, pattern = "[A-Za-z0-9_-]", example = "example-provider")]
    pub provider: Option<String>,
}

/// One of a provider's files (`files/provider/download/`, `files/provider/delete/`).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ProviderFileQuery {
    /// Function title.
    #[param(required = true, min_length = 1, pattern = "[A-Za-z0-9_-]", example = "example-fn")]
    pub function: Option<String>,
    /// Provider name.
    #[param(required = true, min_length = 1, pattern = "[A-Za-z0-9_-]", example = "example-provider")]
    pub provider: Option<String>,
    /// File name.
    #[param(required = true, min_length = 1, example = "notes.txt")]
    pub file: Option<String>,
}

impl From<UserFilesQuery> for FileQuery {
    fn from(q: UserFilesQuery) -> FileQuery {
        FileQuery { function: q.function, provider: q.provider, file: None }
    }
}

impl From<UserFileQuery> for FileQuery {
    fn from(q: UserFileQuery) -> FileQuery {
        FileQuery { function: q.function, provider: q.provider, file: q.file }
    }
}

impl From<ProviderFilesQuery> for FileQuery {
    fn from(q: ProviderFilesQuery) -> FileQuery {
        FileQuery { function: q.function, provider: q.provider, file: None }
    }
}

impl From<ProviderFileQuery> for FileQuery {
    fn from(q: ProviderFileQuery) -> FileQuery {
        FileQuery { function: q.function, provider: q.provider, file: q.file }
    }
}
