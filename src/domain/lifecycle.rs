//! The job state machine. Every status change goes through `decide`, which says whether a move
//! is allowed and which event records it; the database then applies it with a compare-and-set
//! on the current status, so concurrent movers cannot both win.

use std::fmt;
use std::str::FromStr;

use crate::domain::logs::EXCEPTION_LINE_CHARS;

/// The six job statuses; the same words in the API, the database and a `FunctionJob`'s
/// `status.phase`, and the API's document (`ToSchema`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
    utoipa::ToSchema,
)]
#[serde(rename_all = "UPPERCASE")]
pub enum JobStatus {
    Queued,
    Pending,
    Running,
    Succeeded,
    Failed,
    Stopped,
}

impl JobStatus {
    pub const ACTIVE: [JobStatus; 3] = [JobStatus::Queued, JobStatus::Pending, JobStatus::Running];
    pub const ALL: [JobStatus; 6] = [
        JobStatus::Queued,
        JobStatus::Pending,
        JobStatus::Running,
        JobStatus::Succeeded,
        JobStatus::Failed,
        JobStatus::Stopped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "QUEUED",
            JobStatus::Pending => "PENDING",
            JobStatus::Running => "RUNNING",
            JobStatus::Succeeded => "SUCCEEDED",
            JobStatus::Failed => "FAILED",
            JobStatus::Stopped => "STOPPED",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, JobStatus::Succeeded | JobStatus::Failed | JobStatus::Stopped)
    }

    /// Counts towards `LIMITS_ACTIVE_JOBS_PER_USER`; allows sub-status and error events.
    pub fn is_active(self) -> bool {
        !self.is_terminal()
    }

    /// Holds one of admission's slots (CPU or GPU): admitted and not yet ended.
    pub fn holds_slot(self) -> bool {
        matches!(self, JobStatus::Pending | JobStatus::Running)
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobStatus {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        Ok(match value {
            "QUEUED" => JobStatus::Queued,
            "PENDING" => JobStatus::Pending,
            "RUNNING" => JobStatus::Running,
            "SUCCEEDED" => JobStatus::Succeeded,
            "FAILED" => JobStatus::Failed,
            "STOPPED" => JobStatus::Stopped,
            other => return Err(format!("unknown job status '{other}'")),
        })
    }
}

/// Why a job's container never started, in the same words on a cluster (a pod's waiting
/// container) and on this machine (the container engine's refusal): the container's name, the
/// reason (`ErrImagePull`, `CreateContainerError`, ...), the image and the engine's own detail.
pub fn container_start_failure(container: &str, reason: &str, image: &str, detail: &str) -> String {
    format!("the container {container} could not start ({reason}, image {image}): {detail}")
}

/// A bound of a job that the job reached: the words of its ending say which, with the figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitHit {
    /// Killed (or refused memory) at its memory limit, in bytes.
    Memory { limit_bytes: u64 },
    /// Refused a new process at its process limit.
    Processes { limit: u64 },
    /// Refused to grow a file past the largest size a job may write, in bytes.
    FileSize { limit_bytes: u64 },
}

/// The words naming a kind of limit in the launcher's exit record (`"limit"`).
pub mod limit_kind {
    pub const MEMORY: &str = "memory";
    pub const PROCESSES: &str = "processes";
    pub const FILE_SIZE: &str = "file_size";
}

impl LimitHit {
    /// The limit of kind `kind` (a `limit_kind`) with its figure; `None` for an unknown kind.
    pub fn of_kind(kind: &str, memory_bytes: u64, processes: u64, file_bytes: u64) -> Option<LimitHit> {
        match kind {
            limit_kind::MEMORY => Some(LimitHit::Memory { limit_bytes: memory_bytes }),
            limit_kind::PROCESSES => Some(LimitHit::Processes { limit: processes }),
            limit_kind::FILE_SIZE => Some(LimitHit::FileSize { limit_bytes: file_bytes }),
            _ => None,
        }
    }
}

/// Why a job that reached one of its limits failed, in the same words on every backend (a
/// local job's cgroup or rlimits, a pod killed `OOMKilled`): the limit, its figure, and what to do.
pub fn limit_reason(hit: LimitHit) -> String {
    const MIB: u64 = 1 << 20;
    let mib = |bytes: u64| bytes.div_ceil(MIB);
    match hit {
        LimitHit::Memory { limit_bytes } => {
            format!("out of memory (limit {} MiB): run it with a larger function size", mib(limit_bytes))
        }
        LimitHit::Processes { limit } => format!(
            "process limit reached (limit {limit} processes): the job could not start another process or thread"
        ),
        LimitHit::FileSize { limit_bytes } => format!(
            "file size limit reached (limit {} MiB): the job tried to write a file larger than a job may write",
            mib(limit_bytes)
        ),
    }
}

/// Why a job could not start because its working folder (or what it is prepared from) could not
/// be written: the disk is full. `detail` says what was being written.
pub fn no_space_reason(detail: &str) -> String {
    format!("no space left on device while preparing the job ({detail})")
}

/// Why a function's process that ended with a non-zero `code` failed: the code, and the last
/// exception line of its log when it printed one (`exit code 1: ZeroDivisionError: division by
/// zero`), in the same words on every backend.
pub fn exit_reason(code: i64, exception: Option<&str>) -> String {
    match exception.map(str::trim).filter(|line| !line.is_empty()) {
        Some(line) => format!("exit code {code}: {}", crate::domain::logs::bounded(line, EXCEPTION_LINE_CHARS)),
        None => format!("exit code {code}"),
    }
}

/// Why a function's process that a signal ended failed (a kill from outside the job).
pub fn signal_reason(signal: i64, exception: Option<&str>) -> String {
    let base = format!("ended by signal {signal}");
    match exception.map(str::trim).filter(|line| !line.is_empty()) {
        Some(line) => format!("{base}: {}", crate::domain::logs::bounded(line, EXCEPTION_LINE_CHARS)),
        None => base,
    }
}

/// The reason of a stop a user asked for (through the API, or the console).
pub const STOPPED_BY_USER: &str = "stopped by the user";
/// The reason of a job stopped because its `FunctionJob` was deleted.
pub const STOPPED_BY_DELETION: &str = "stopped: the FunctionJob was deleted";

/// Why a job that ran past its time limit was stopped.
pub fn timeout_reason(limit_secs: u64) -> String {
    format!("timed out after {limit_secs} s (the limit, PROGRAM_TIMEOUT)")
}

/// What happened to a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// Admission chose it; it is handed to the compute backend.
    Admitted,
    /// The backend could not start it.
    LaunchFailed { reason: String },
    /// Its process is executing.
    Started,
    /// Its process ended by itself.
    Exited { success: bool },
    /// It failed for a reason the backend can name (a non-zero exit, out of memory, a failed
    /// init step).
    Crashed { reason: String },
    /// A user asked to stop it and the backend accepted.
    StopRequested,
    /// A backfill job stopped because `tenant` reclaims its guarantee: queued again when
    /// `requeue` (its function allows retries after start and it was queued again fewer than
    /// `MAX_REQUEUES` times), else STOPPED.
    Preempted { tenant: String, requeue: bool },
    /// It ran longer than `PROGRAM_TIMEOUT`, `limit_secs`.
    TimedOut { limit_secs: u64 },
    /// Its `FunctionJob` was deleted (by hand, or with its namespace) before it ended.
    Deleted,
    /// Its process is gone and nobody saw it end (for example across a restart).
    Lost { reason: String },
    /// The cluster ended its pod after its code started and the function opted in to be
    /// started again: it waits for its next pod.
    Retrying { reason: String },
}

/// Who moved the job; stored as the event's `origin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Api,
    Scheduler,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Api => "API",
            Origin::Scheduler => "SCHEDULER",
        }
    }
}

/// An allowed move with the `STATUS_CHANGE` event that records it.
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    pub from: JobStatus,
    pub to: JobStatus,
    pub origin: Origin,
    pub context: &'static str,
    pub data: serde_json::Value,
}

impl Move {
    /// Why the job moved, when the move says (`data.reason`).
    pub fn reason(&self) -> Option<&str> {
        self.data.get("reason").and_then(serde_json::Value::as_str)
    }

    /// What the move changes in the slots in use of its job's kind: +1 into PENDING/RUNNING,
    /// -1 out of them, 0 otherwise.
    pub fn slot_change(&self) -> i64 {
        i64::from(self.to.holds_slot()) - i64::from(self.from.holds_slot())
    }

    /// What the move changes in the queued jobs: +1 into QUEUED, -1 out of it, 0 otherwise.
    pub fn queue_change(&self) -> i64 {
        i64::from(self.to == JobStatus::Queued) - i64::from(self.from == JobStatus::Queued)
    }
}

/// Decides the move for `trigger` from `current`, or `None` when the trigger does not apply
/// (a finished job stays finished; a queued job cannot exit).
pub fn decide(current: JobStatus, trigger: &Trigger) -> Option<Move> {
    use JobStatus::*;
    let (to, origin, context, reason) = match (current, trigger) {
        (Queued, Trigger::Admitted) => (Pending, Origin::Scheduler, "SCHEDULE_JOBS", None),
        (Queued | Pending, Trigger::LaunchFailed { reason }) => {
            (Failed, Origin::Scheduler, "SCHEDULE_JOBS", Some(reason.clone()))
        }
        (Pending, Trigger::Started) => (Running, Origin::Scheduler, "UPDATE_JOB_STATUS", None),
        (Pending | Running, Trigger::Exited { success }) => {
            (if *success { Succeeded } else { Failed }, Origin::Scheduler, "UPDATE_JOB_STATUS", None)
        }
        (Pending | Running, Trigger::Crashed { reason }) => {
            (Failed, Origin::Scheduler, "UPDATE_JOB_STATUS", Some(reason.clone()))
        }
        (Queued | Pending | Running, Trigger::StopRequested) => {
            (Stopped, Origin::Api, "STOP_JOB", Some(STOPPED_BY_USER.to_string()))
        }
        (Pending | Running, Trigger::Preempted { tenant, requeue: false }) => {
            (Stopped, Origin::Scheduler, "SCHEDULE_JOBS", Some(preempted_reason(tenant)))
        }
        (Pending | Running, Trigger::Preempted { tenant, requeue: true }) => {
            (Queued, Origin::Scheduler, "SCHEDULE_JOBS", Some(requeued_reason(tenant)))
        }
        (Pending | Running, Trigger::TimedOut { limit_secs }) => {
            (Stopped, Origin::Scheduler, "UPDATE_JOB_STATUS", Some(timeout_reason(*limit_secs)))
        }
        (Queued | Pending | Running, Trigger::Deleted) => {
            (Stopped, Origin::Scheduler, "RECONCILE", Some(STOPPED_BY_DELETION.to_string()))
        }
        (Pending | Running, Trigger::Lost { reason }) => (Failed, Origin::Scheduler, "RECONCILE", Some(reason.clone())),
        (Running, Trigger::Retrying { reason }) => (Pending, Origin::Scheduler, "RECONCILE", Some(reason.clone())),
        _ => return None,
    };
    let mut data = serde_json::json!({ "status": to.as_str() });
    if let Some(reason) = reason {
        data["reason"] = serde_json::Value::String(reason);
    }
    Some(Move { from: current, to, origin, context, data })
}

/// The reason of a backfill job stopped for a tenant reclaiming its guarantee.
pub fn preempted_reason(tenant: &str) -> String {
    format!("Preempted: tenant {tenant} reclaimed its guaranteed capacity (this job ran as backfill).")
}

/// Times a preempted backfill job is queued again at most; the next preemption stops it.
pub const MAX_REQUEUES: i64 = 5;

/// The reason of a preempted backfill job queued again (its function allows retries after start).
pub fn requeued_reason(tenant: &str) -> String {
    format!(
        "Preempted: tenant {tenant} reclaimed its guaranteed capacity (this job ran as backfill); \
         queued again, as its function allows retries after start."
    )
}

/// How a stop request carried out ends a job: a user's stop, or a reclaim of backfill by
/// `preempted_by`, which queues the job again when its function allows retries after start
/// (`retry_after_start`) and it was queued again `requeues` < `MAX_REQUEUES` times.
pub fn stop_trigger(preempted_by: Option<&str>, retry_after_start: bool, requeues: i64) -> Trigger {
    match preempted_by {
        Some(tenant) => {
            Trigger::Preempted { tenant: tenant.to_string(), requeue: retry_after_start && requeues < MAX_REQUEUES }
        }
        None => Trigger::StopRequested,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use JobStatus::*;

    #[test]
    fn the_happy_path_goes_queued_pending_running_succeeded() {
        let admitted = decide(Queued, &Trigger::Admitted).unwrap();
        assert_eq!((admitted.to, admitted.origin, admitted.context), (Pending, Origin::Scheduler, "SCHEDULE_JOBS"));
        assert_eq!(decide(Pending, &Trigger::Started).unwrap().to, Running);
        let done = decide(Running, &Trigger::Exited { success: true }).unwrap();
        assert_eq!(done.to, Succeeded);
        assert_eq!(done.data, serde_json::json!({"status": "SUCCEEDED"}));
        assert_eq!(decide(Running, &Trigger::Exited { success: false }).unwrap().to, Failed);
    }

    #[test]
    fn terminal_jobs_never_move() {
        let triggers = [
            Trigger::Admitted,
            Trigger::Started,
            Trigger::Exited { success: true },
            Trigger::StopRequested,
            Trigger::TimedOut { limit_secs: 1 },
            Trigger::Deleted,
            Trigger::Lost { reason: "x".into() },
            Trigger::Retrying { reason: "x".into() },
            Trigger::LaunchFailed { reason: "x".into() },
            Trigger::Crashed { reason: "x".into() },
        ];
        for status in [Succeeded, Failed, Stopped] {
            for trigger in &triggers {
                assert_eq!(decide(status, trigger), None, "{status} {trigger:?}");
            }
        }
    }

    #[test]
    fn stops_timeouts_and_losses() {
        for status in [Queued, Pending, Running] {
            let stop = decide(status, &Trigger::StopRequested).unwrap();
            assert_eq!((stop.to, stop.origin, stop.context), (Stopped, Origin::Api, "STOP_JOB"));
            assert_eq!(stop.reason(), Some("stopped by the user"));
            let deleted = decide(status, &Trigger::Deleted).unwrap();
            assert_eq!((deleted.to, deleted.reason()), (Stopped, Some("stopped: the FunctionJob was deleted")));
        }
        assert_eq!(decide(Queued, &Trigger::TimedOut { limit_secs: 60 }), None);
        let timeout = decide(Running, &Trigger::TimedOut { limit_secs: 60 }).unwrap();
        assert_eq!(timeout.to, Stopped);
        assert_eq!(timeout.reason(), Some("timed out after 60 s (the limit, PROGRAM_TIMEOUT)"));
        let lost = decide(Running, &Trigger::Lost { reason: "process gone after restart".into() }).unwrap();
        assert_eq!((lost.to, lost.context), (Failed, "RECONCILE"));
        assert_eq!(lost.data["reason"], "process gone after restart");
        assert_eq!(decide(Queued, &Trigger::Exited { success: true }), None);
        let crashed = decide(Pending, &Trigger::Crashed { reason: "out of memory".into() }).unwrap();
        assert_eq!((crashed.to, crashed.data["reason"].as_str()), (Failed, Some("out of memory")));
        assert_eq!(decide(Running, &Trigger::Admitted), None);
    }

    #[test]
    fn limit_endings_name_their_limit_and_figure() {
        assert_eq!(
            limit_reason(LimitHit::Memory { limit_bytes: 8 << 30 }),
            "out of memory (limit 8192 MiB): run it with a larger function size"
        );
        assert!(limit_reason(LimitHit::Memory { limit_bytes: 1000 }).starts_with("out of memory (limit 1 MiB)"));
        assert!(
            limit_reason(LimitHit::Processes { limit: 64 }).starts_with("process limit reached (limit 64 processes)")
        );
        assert!(
            limit_reason(LimitHit::FileSize { limit_bytes: 16 << 20 })
                .starts_with("file size limit reached (limit 16 MiB)")
        );
        assert_eq!(
            no_space_reason("failed to save the artifact"),
            "no space left on device while preparing the job (failed to save the artifact)"
        );
        assert_eq!(LimitHit::of_kind("file_size", 1, 2, 3), Some(LimitHit::FileSize { limit_bytes: 3 }));
        assert_eq!(LimitHit::of_kind("processes", 1, 2, 3), Some(LimitHit::Processes { limit: 2 }));
        assert_eq!(LimitHit::of_kind("disk", 1, 2, 3), None);
    }

    #[test]
    fn exits_name_their_code_and_exception() {
        assert_eq!(
            exit_reason(1, Some("ZeroDivisionError: division by zero")),
            "exit code 1: ZeroDivisionError: division by zero"
        );
        assert_eq!(exit_reason(3, None), "exit code 3");
        assert_eq!(exit_reason(3, Some("  ")), "exit code 3");
        assert_eq!(signal_reason(9, None), "ended by signal 9");
        let long = exit_reason(1, Some(&"x".repeat(1000)));
        assert_eq!(long.chars().count(), "exit code 1: ".len() + EXCEPTION_LINE_CHARS + 1);
    }

    #[test]
    fn a_retried_running_job_goes_back_to_pending_and_only_a_running_one() {
        let retried = decide(Running, &Trigger::Retrying { reason: "evicted".into() }).unwrap();
        assert_eq!(
            (retried.to, retried.context, retried.data["reason"].as_str()),
            (Pending, "RECONCILE", Some("evicted"))
        );
        for status in [Queued, Pending] {
            assert_eq!(decide(status, &Trigger::Retrying { reason: "x".into() }), None, "{status}");
        }
    }

    #[test]
    fn statuses_round_trip_and_classify() {
        for status in [Queued, Pending, Running, Succeeded, Failed, Stopped] {
            assert_eq!(status.as_str().parse::<JobStatus>().unwrap(), status);
        }
        assert!("DONE".parse::<JobStatus>().is_err());
        assert_eq!(JobStatus::ACTIVE.iter().filter(|s| s.is_active()).count(), 3);
        assert!(Stopped.is_terminal() && !Running.is_terminal());
    }

    #[test]
    fn moves_into_and_out_of_pending_and_running_change_the_slots_in_use() {
        let change = |from: JobStatus, trigger: Trigger| decide(from, &trigger).unwrap().slot_change();
        assert_eq!(change(Queued, Trigger::Admitted), 1);
        assert_eq!(change(Pending, Trigger::Started), 0);
        assert_eq!(change(Running, Trigger::Retrying { reason: "evicted".into() }), 0);
        assert_eq!(change(Running, Trigger::Exited { success: true }), -1);
        assert_eq!(change(Pending, Trigger::StopRequested), -1);
        assert_eq!(change(Queued, Trigger::StopRequested), 0);
        let holding: Vec<JobStatus> = JobStatus::ALL.into_iter().filter(|s| s.holds_slot()).collect();
        assert_eq!(holding, [Pending, Running]);
    }

    #[test]
    fn a_preempted_backfill_job_is_queued_again_only_when_its_function_allows_retries_after_start() {
        let stopped = decide(Running, &stop_trigger(Some("provider:acme"), false, 0)).unwrap();
        assert_eq!((stopped.to, stopped.reason()), (Stopped, Some(preempted_reason("provider:acme").as_str())));
        let requeued = decide(Pending, &stop_trigger(Some("provider:acme"), true, MAX_REQUEUES - 1)).unwrap();
        assert_eq!((requeued.to, requeued.origin, requeued.context), (Queued, Origin::Scheduler, "SCHEDULE_JOBS"));
        assert!(requeued.reason().unwrap().starts_with("Preempted: tenant provider:acme reclaimed"));
        assert_eq!((requeued.slot_change(), requeued.queue_change()), (-1, 1));
        // Bounded: once queued again `MAX_REQUEUES` times, the next reclaim stops it.
        assert_eq!(decide(Running, &stop_trigger(Some("provider:acme"), true, MAX_REQUEUES)).unwrap().to, Stopped);
        assert_eq!(stop_trigger(None, true, 0), Trigger::StopRequested);
        assert_eq!(decide(Queued, &stop_trigger(Some("provider:acme"), true, 0)), None);
    }
}
