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
