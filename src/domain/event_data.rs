//! What a published job event says (pure data): the CloudEvents types of job events and the
//! `data` of each. The database layer builds these in the transaction that records the event;
//! the event stream (`crate::events`) delivers them.

use serde::{Deserialize, Serialize};

/// The CloudEvents `type` of a status move (job event `STATUS_CHANGE`).
pub const STATUS_EVENT_TYPE: &str = "dev.gantry.job.status";
/// The CloudEvents `type` of a sub-status change (job event `SUB_STATUS_CHANGE`).
pub const SUB_STATUS_EVENT_TYPE: &str = "dev.gantry.job.sub_status";
/// The CloudEvents `type` of an error the function sent (job event `ERROR`).
pub const ERROR_EVENT_TYPE: &str = "dev.gantry.job.error";
/// The CloudEvents `type` of a job whose log was lost (job event `LOG_LOST`).
pub const LOG_LOST_EVENT_TYPE: &str = "dev.gantry.job.log_lost";

/// The CloudEvents `type` of a job event of type `event_type` (as `events/` lists it): the types
/// above, and `dev.gantry.job.<type in lower case>` for any other.
pub fn cloud_event_type(event_type: &str) -> String {
    match event_type {
        "STATUS_CHANGE" => STATUS_EVENT_TYPE.to_string(),
        "SUB_STATUS_CHANGE" => SUB_STATUS_EVENT_TYPE.to_string(),
        other => format!("dev.gantry.job.{}", other.to_ascii_lowercase()),
    }
}

/// A job's usage events (issue 47): its own stream beside its job events, in this order for a
/// job that ran: started (its first move into RUNNING), a licence for a provider's function,
/// in progress every period while it runs, completed (its usage record, written with its
/// terminal move; a job that never ran has only this one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageEvent {
    Started,
    Licence,
    InProgress,
    Completed,
}

impl UsageEvent {
    /// The CloudEvents `type`.
    pub fn cloud_type(self) -> &'static str {
        match self {
            UsageEvent::Started => "dev.gantry.usage.started",
            UsageEvent::Licence => "dev.gantry.usage.licence",
            UsageEvent::InProgress => "dev.gantry.usage.in_progress",
            UsageEvent::Completed => "dev.gantry.usage.completed",
        }
    }

    /// The existing gateway's name of the event (`event` in the data).
    pub fn billing_name(self) -> &'static str {
        match self {
            UsageEvent::Started => "function_job_started",
            UsageEvent::Licence => "function_licence_fee",
            UsageEvent::InProgress => "function_job_in_progress",
            UsageEvent::Completed => "function_job_completed",
        }
    }
}

/// The `metric_type` of a job's run time: `classical_<profile>` with its compute profile, else
/// its size, else `default`.
pub fn metric_type(compute_profile: Option<&str>, size: Option<&str>) -> String {
    format!("classical_{}", compute_profile.or(size).filter(|p| !p.is_empty()).unwrap_or("default"))
}

/// The `metric_type` of a licence event.
pub const LICENCE_METRIC: &str = "licence";

/// The business model of a job from before it was kept (TRIAL for a trial, else SUBSIDIZED).
pub fn business_model_of(kept: Option<&str>, trial: bool) -> String {
    match kept {
        Some(model) if !model.is_empty() => model.to_string(),
        _ if trial => "TRIAL".to_string(),
        _ => "SUBSIDIZED".to_string(),
    }
}

/// The `data` of a usage event: the job, the existing gateway's billing fields and the job's
/// usage up to the event (its whole record for `completed`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageData {
    /// The existing gateway's event name (`UsageEvent::billing_name`).
    pub event: String,
    pub job_id: String,
    /// The function's title (null once the function is deleted).
    pub function: Option<String>,
    /// The provider's name; null for a user's own function.
    pub provider: Option<String>,
    /// The job's author.
    pub user: String,
    /// The instance the job ran for (its run's `Service-CRN`).
    pub instance_crn: Option<String>,
    pub trial: bool,
    /// TRIAL, SUBSIDIZED or CONSUMPTION.
    pub business_model: String,
    pub size: Option<String>,
    pub compute_profile: Option<String>,
    /// The job's status when the event was recorded (its ending for `completed`).
    pub status: String,
    /// `classical_<profile>` (run time), or `licence` (one run of a provider's function).
    pub metric_type: String,
    /// Milliseconds of run time up to the event (1 for a licence).
    pub metric_value: i64,
    /// What is metered: the job.
    pub resource_id: String,
    /// When it first ran (null for a job that never ran).
    pub job_started: Option<String>,
    /// When it ended (`completed` only).
    pub job_completed: Option<String>,
    pub time: String,
    pub wait_ms: i64,
    pub run_ms: i64,
    pub attempts: i64,
    pub cpu_millis: Option<i64>,
    pub memory_mib: Option<i64>,
    pub gpus: Option<i64>,
    pub gpu_model: Option<String>,
    pub cpu_core_ms: i64,
    pub gib_ms: i64,
    pub gpu_ms: i64,
    pub cpu_used_ms: Option<i64>,
    pub memory_peak_bytes: Option<i64>,
}

/// The `data` of a published status move.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoveData {
    pub job_id: String,
    /// The function's title (null once the function is deleted).
    pub function: Option<String>,
    /// The provider's name; null for a user's own function.
    pub provider: Option<String>,
    /// The job's author.
    pub user: String,
    /// Null for the job's creation.
    pub old_status: Option<String>,
    pub new_status: String,
    pub sub_status: Option<String>,
    pub origin: String,
    pub context: String,
    pub time: String,
}

/// The `data` of a published job event other than a status move: the job, its status and
/// sub-status when the event was recorded, and the event's own fields (its `data` as `events/`
/// lists it): `sub_status` of a sub-status change; `code`, `message`, `exception`, `args` of an
/// error; `message` of a lost log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventData {
    pub job_id: String,
    /// The function's title (null once the function is deleted).
    pub function: Option<String>,
    /// The provider's name; null for a user's own function.
    pub provider: Option<String>,
    /// The job's author.
    pub user: String,
    pub status: String,
    pub sub_status: Option<String>,
    pub origin: String,
    pub context: String,
    pub time: String,
    /// The event's own fields; none of them replaces one of the fields above.
    #[serde(flatten)]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

impl EventData {
    /// Adds the fields of the event's stored `data` (a JSON object; anything else is kept as
    /// `value`), leaving out those that would repeat a field of the job.
    pub fn with_fields(mut self, data: &str) -> EventData {
        const JOB_FIELDS: [&str; 9] =
            ["job_id", "function", "provider", "user", "status", "sub_status", "origin", "context", "time"];
        let fields = match serde_json::from_str::<serde_json::Value>(data) {
            Ok(serde_json::Value::Object(fields)) => fields,
            Ok(serde_json::Value::Null) | Err(_) => serde_json::Map::new(),
            Ok(other) => serde_json::Map::from_iter([("value".to_string(), other)]),
        };
        self.fields = fields.into_iter().filter(|(name, _)| !JOB_FIELDS.contains(&name.as_str())).collect();
        self
    }
}
