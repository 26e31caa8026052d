//! The typed answers of the API: what each endpoint returns on success, serialized as JSON and
//! described in the OpenAPI document (`ToSchema`) from the same types.
//!
//! The fields of every answer are declared in alphabetical order: the order the answers had when
//! they were built as JSON maps (sorted by key), so the bytes clients see did not change when
//! they became types. A field that may be null is still always present (`required`).

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

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
            updated: db::format_timestamp(job.updated),
        }
    }

    /// The record with `result` (null when `result` is `None`).
    pub fn with_result(mut self, result: Option<String>) -> JobRecord {
        self.result = Some(result);
        self
    }
}

/// The answer of `programs/run/`: the queued job.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RunAnswer {
    #[schema(format = DateTime)]
    pub created: String,
    #[schema(format = Uuid)]
    pub id: String,
    /// The function's id.
    pub program: String,
    /// Always null: the job has just been queued.
    #[schema(required = true, value_type = Option<String>)]
    pub result: Option<String>,
    /// `QUEUED`.
    pub status: String,
}

/// A page of jobs, with `next`/`previous` links: `limit` and `offset`, or with `cursor`, `limit`,
/// the next or previous cursor and the filters.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JobPage {
    pub count: i64,
    #[schema(required = true)]
    pub next: Option<String>,
    #[schema(required = true)]
    pub previous: Option<String>,
    pub results: Vec<JobRecord>,
}

/// The answer of `sub_status/`: the job after the change.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JobAnswer {
    pub job: JobRecord,
}

/// The answer of `arguments/`: the JSON text the job was run with.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ArgumentsAnswer {
    pub arguments: String,
}

/// The answer of `trace/`: the job's trace id and, with `--trace-link`, its address.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TraceAnswer {
    #[schema(example = "4bf92f3577b34da6a3ce929d0e0e4736")]
    pub trace_id: String,
    pub link: Option<String>,
}

/// The answer of `result/`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResultAnswer {
    pub result: String,
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

/// One runtime job a job reported.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RuntimeJob {
    pub runtime_job: String,
    #[schema(required = true)]
    pub runtime_session: Option<String>,
}

/// The answer of `runtime_jobs/`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RuntimeJobs {
    pub runtime_jobs: Vec<RuntimeJob>,
}

/// The answer of `logs/` and `provider-logs/` (an archived log is streamed into this shape).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Logs {
    pub logs: String,
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

/// The answer of `validate_arguments/`: the arguments fit the schema (else a 400 says where not).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Valid {
    pub valid: bool,
}

/// The file names of an area (`files/`, `files/provider/`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FileList {
    pub results: Vec<String>,
}

/// The file names of an area in the spec's shape (`files/list/`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SpecFileList {
    pub files: Vec<String>,
}

/// `GET version/`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Version {
    pub version: String,
}

/// `GET liveness/` and `readiness/`: `alive`, `ready`, `database_unavailable` or
/// `storage_unavailable`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Probe {
    pub status: &'static str,
}

/// The caller's queue: active slots used and allowed, and each unfinished job's place.
#[derive(Debug, Serialize, ToSchema)]
pub struct QueueAnswer {
    /// The most QUEUED+PENDING+RUNNING jobs the caller may have at once (`run` answers 429
    /// beyond it).
    pub active_limit: i64,
    /// The caller's QUEUED+PENDING+RUNNING jobs, all of them (not only those listed).
    pub active: i64,
    /// Of those, QUEUED.
    pub queued: i64,
    /// Of those, PENDING or RUNNING.
    pub running: i64,
    /// The most PENDING+RUNNING jobs the caller may have at once (`LIMITS_JOBS_PER_USER`): more
    /// wait QUEUED. Null where this server does not admit jobs itself and was not told the limit.
    #[schema(required = true)]
    pub running_limit: Option<i64>,
    /// The slots CPU jobs of every user share (`LIMITS_MAX_CLUSTERS`), as `running_limit`.
    #[schema(required = true)]
    pub cpu_slots: Option<SlotUse>,
    /// The slots GPU jobs of every user share (`LIMITS_MAX_GPU_CLUSTERS`).
    #[schema(required = true)]
    pub gpu_slots: Option<SlotUse>,
    /// The oldest of them, at most `limit` (default and most: 500).
    pub jobs: Vec<QueuedPlace>,
}

/// Slots in use (pending and running jobs of every user) of those there are.
#[derive(Debug, Serialize, ToSchema)]
pub struct SlotUse {
    pub used: i64,
    pub limit: i64,
}

/// What keeps a queued job waiting, as things stand now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WaitingFor {
    /// The caller already has `running_limit` jobs pending or running (or ahead of this one).
    RunningLimit,
    /// Every CPU slot is taken.
    CpuSlots,
    /// Every GPU slot is taken.
    GpuSlots,
    /// Nothing: admission starts it at its next pass.
    NextAdmission,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct QueuedPlace {
    pub id: String,
    /// QUEUED, PENDING or RUNNING.
    pub status: String,
    #[schema(format = DateTime)]
    pub created: String,
    /// For a QUEUED job, how many queued jobs of any user came before it; null otherwise.
    #[schema(required = true)]
    pub ahead: Option<i64>,
    /// For a QUEUED job, its place in the queue of every user (`ahead` + 1); null otherwise.
    #[schema(required = true)]
    pub position: Option<i64>,
    /// For a QUEUED job, which limit holds it back; null otherwise (or when the limits are not
    /// known here).
    #[schema(required = true)]
    pub waiting_for: Option<WaitingFor>,
    pub gpu: bool,
    /// Its function.
    pub program: ProgramSummary,
}
