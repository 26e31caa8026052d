//! What several endpoints share, so that each endpoint's file holds only its own: the records
//! their answers carry (`Message`, `JobRecord` with its `ProgramSummary`, `EventRecord`,
//! `FunctionRecord`) and the pieces more than one request reads (`Size`, the `arguments` field,
//! the `title`/`provider` rule of the function bodies' schemas).
//!
//! The fields of every answer are declared in alphabetical order: the order the answers had when
//! they were built as JSON maps (sorted by key), so the bytes clients see did not change when
//! they became types. A field that may be null is still always present (`required`).

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{AllOfBuilder, AnyOfBuilder, ObjectBuilder, Schema};

use super::error::ApiError;
use super::fields::RequestFields;
use crate::db::jobs::{EventRow, JobRow};
use crate::db::programs::ProgramRow;
use crate::db::{self};

/// `{"message": …}`: what a stop, a delete, an upload of a file or a runtime job report says.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Message {
    pub message: String,
}

impl Message {
    pub fn new(message: impl Into<String>) -> Message {
        Message { message: message.into() }
    }
}

/// The function a job ran, as a job record names it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ProgramSummary {
    #[schema(required = true)]
    pub id: Option<String>,
    #[schema(required = true)]
    pub provider: Option<String>,
    #[schema(required = true)]
    pub title: Option<String>,
}

/// A job in listings and retrieval; `result` only where the endpoint includes it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JobRecord {
    #[schema(format = DateTime)]
    pub created: String,
    #[schema(required = true)]
    pub function_size: Option<String>,
    pub gpu: bool,
    #[schema(format = Uuid)]
    pub id: String,
    pub program: ProgramSummary,
    /// The job's result text (null when none yet); absent where the endpoint leaves it out.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub result: Option<Option<String>>,
    #[schema(value_type = crate::domain::lifecycle::JobStatus, inline)]
    pub status: String,
    #[schema(required = true)]
    pub sub_status: Option<String>,
    /// Why the job ended, for a job that ended other than by success (its terminal status
    /// event's `reason`): `exit code 1: ZeroDivisionError: division by zero`, `out of memory
    /// (limit N MiB): ...`, `timed out after N s ...`, `stopped by the user`, ...; absent
    /// otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_reason: Option<String>,
    /// The tenant the job counts against (docs/scheduling.md); absent when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// True when the job runs as backfill (it may be stopped for a tenant that reclaims its
    /// guarantee); absent otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    #[schema(required = false)]
    pub backfill: bool,
    #[schema(format = DateTime)]
    pub updated: String,
}

impl JobRecord {
    /// The record without `result`.
    pub fn of(job: &JobRow) -> JobRecord {
        JobRecord {
            created: db::format_timestamp(job.created),
            function_size: job.function_size.clone(),
            gpu: job.gpu,
            id: job.id.clone(),
            program: ProgramSummary {
                id: job.program_id.clone(),
                provider: job.provider_name.clone(),
                title: job.program_title.clone(),
            },
            result: None,
            status: job.status.clone(),
            sub_status: job.sub_status.clone(),
            status_reason: job.status_reason.clone(),
            tenant: job.tenant.clone(),
            backfill: job.backfill,
            updated: db::format_timestamp(job.updated),
        }
    }

    /// `of`, taking the row (a listing's rows are not needed after): nothing is copied.
    pub fn from_row(job: JobRow) -> JobRecord {
        JobRecord {
            created: db::format_timestamp(job.created),
            function_size: job.function_size,
            gpu: job.gpu,
            id: job.id,
            program: ProgramSummary { id: job.program_id, provider: job.provider_name, title: job.program_title },
            result: None,
            status: job.status,
            sub_status: job.sub_status,
            status_reason: job.status_reason,
            tenant: job.tenant,
            backfill: job.backfill,
            updated: db::format_timestamp(job.updated),
        }
    }

    /// The record with `result` (null when `result` is `None`).
    pub fn with_result(mut self, result: Option<String>) -> JobRecord {
        self.result = Some(result);
        self
    }
}

/// A job event as `events/` lists it and `events/stream/` sends it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EventRecord {
    pub context: String,
    #[schema(format = DateTime)]
    pub created: String,
    #[schema(value_type = Object)]
    pub data: Value,
    pub event_type: String,
    pub id: String,
    pub job: String,
    pub origin: String,
}

impl EventRecord {
    pub fn of(job_id: &str, event: &EventRow) -> EventRecord {
        EventRecord {
            context: event.context.clone(),
            created: db::format_timestamp(event.created),
            data: serde_json::from_str::<Value>(&event.data).unwrap_or(Value::Null),
            event_type: event.event_type.clone(),
            id: event.id.clone(),
            job: job_id.to_string(),
            origin: event.origin.clone(),
        }
    }
}

/// A function in every answer that returns one.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FunctionRecord {
    #[schema(required = true, value_type = Option<Object>)]
    pub arguments_schema: Option<Value>,
    /// `artifact.tar` when the function has code, else null.
    #[schema(required = true)]
    pub artifact: Option<String>,
    #[schema(format = DateTime)]
    pub created: String,
    #[schema(required = true)]
    pub default_size: Option<String>,
    #[schema(value_type = Vec<String>)]
    pub dependencies: Value,
    #[schema(required = true)]
    pub description: Option<String>,
    pub disabled: bool,
    #[schema(required = true)]
    pub documentation_url: Option<String>,
    #[schema(required = true)]
    pub entrypoint: Option<String>,
    /// The default size, under the name older clients read.
    #[schema(required = true)]
    pub function_size: Option<String>,
    pub gpu: bool,
    #[schema(format = Uuid)]
    pub id: String,
    #[schema(required = true)]
    pub image: Option<String>,
    #[schema(required = true)]
    pub provider: Option<String>,
    pub runner: String,
    /// `{label: compute profile}`, labels S, M, L, XL.
    #[schema(value_type = Object)]
    pub sizes: Value,
    pub title: String,
    #[serde(rename = "type")]
    pub program_type: String,
    #[schema(format = DateTime)]
    pub updated: String,
    #[schema(required = true)]
    pub version: Option<String>,
}

impl FunctionRecord {
    pub fn of(row: &ProgramRow) -> FunctionRecord {
        let parse = |text: &str, fallback: Value| serde_json::from_str::<Value>(text).unwrap_or(fallback);
        FunctionRecord {
            arguments_schema: row.arguments_schema.as_deref().map(|s| parse(s, Value::Null)),
            artifact: row.artifact_key.as_ref().map(|_| "artifact.tar".to_string()),
            created: db::format_timestamp(row.created),
            default_size: row.default_size.clone(),
            dependencies: parse(&row.dependencies, Value::Array(Vec::new())),
            description: row.description.clone(),
            disabled: row.disabled,
            documentation_url: row.documentation_url.clone(),
            entrypoint: row.entrypoint.clone(),
            function_size: row.default_size.clone(),
            gpu: row.gpu,
            id: row.id.clone(),
            image: row.image.clone(),
            provider: row.provider_name.clone(),
            runner: row.runner.clone(),
            sizes: parse(&row.sizes, Value::Object(Default::default())),
            title: row.title.clone(),
            program_type: row.program_type.clone(),
            updated: db::format_timestamp(row.updated),
            version: row.version.clone(),
        }
    }
}

/// A 400 answer saying `message`: what a request that fails a check gets.
pub fn bad(message: impl Into<String>) -> ApiError {
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

/// The `arguments` field as text: the client sends a JSON string; a JSON body may also carry an
/// object directly.
pub fn arguments_text(fields: &RequestFields) -> Result<String, ApiError> {
    match fields.value("arguments") {
        Some(value) if !value.is_string() => Ok(value.to_string()),
        _ => fields.required_text("arguments"),
    }
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
pub fn one_provider(schema: RefOr<Schema>) -> RefOr<Schema> {
    let branches = AnyOfBuilder::new()
        .item(pattern_property("title", "^[^/]*$"))
        .item(pattern_property("provider", "^[^A-Za-z0-9_-]*$"))
        .build();
    RefOr::T(Schema::AllOf(AllOfBuilder::new().item(schema).item(Schema::AnyOf(branches)).build()))
}
