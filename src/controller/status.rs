//! What a job's pod says about the job (pure): the lifecycle trigger it amounts to, and the
//! resource status shown by `kubectl get fj`. Pods that never start (an image that cannot be
//! pulled, no node to schedule on past a deadline) and pods that vanish (deleted, evicted, node
//! lost) end the job FAILED with the cause in words; a job is never left PENDING or RUNNING
//! forever.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::crd::FunctionJobStatus;
use crate::domain::lifecycle::{JobStatus, LimitHit, Trigger, container_start_failure, exit_reason, limit_reason};

/// Waiting reasons of a container that will not start without a change to the job.
const FATAL_WAITING: [&str; 4] = ["ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerError"];

fn all_statuses(pod: &Pod) -> impl Iterator<Item = &ContainerStatus> {
    let status = pod.status.as_ref();
    let init = status.and_then(|s| s.init_container_statuses.as_deref()).unwrap_or_default();
    let main = status.and_then(|s| s.container_statuses.as_deref()).unwrap_or_default();
    init.iter().chain(main)
}

/// The reason a pending pod cannot start, if it cannot: a container stuck on a fatal waiting
/// reason (at once), or, for longer than `pending_deadline`, a container whose configuration
/// cannot be made (a missing Secret) or no node to schedule on.
fn start_failure(pod: &Pod, now: Timestamp, pending_deadline: Duration) -> Option<String> {
    let waited = pod.metadata.creation_timestamp.as_ref().map(|t| now.duration_since(t.0).as_secs()).unwrap_or(0);
    let overdue = waited >= pending_deadline.as_secs() as i64;
    for container in all_statuses(pod) {
        let Some(waiting) = container.state.as_ref().and_then(|s| s.waiting.as_ref()) else { continue };
        let Some(reason) = waiting.reason.as_deref() else { continue };
        if FATAL_WAITING.contains(&reason) || (reason == "CreateContainerConfigError" && overdue) {
            let image = &container.image;
            let detail = waiting.message.as_deref().unwrap_or("no detail");
            return Some(container_start_failure(&container.name, reason, image, detail));
        }
    }
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    let unschedulable = conditions
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))?;
    overdue.then(|| {
        format!(
            "the pod could not be scheduled for {waited} s: {}",
            unschedulable.message.as_deref().unwrap_or("no node fits it")
        )
    })
}

/// The trigger the pod's state amounts to for a job in `current` status, `None` when nothing
/// changed. `pod` is `None` when the job has no pod (not created yet, or gone).
pub fn pod_trigger(
    current: JobStatus,
    stop_requested: bool,
    pod: Option<&Pod>,
    now: Timestamp,
    pending_deadline: Duration,
) -> Option<Trigger> {
    if current.is_terminal() {
        return None;
    }
    let Some(pod) = pod else {
        if stop_requested {
            return Some(Trigger::StopRequested);
        }
        return matches!(current, JobStatus::Pending | JobStatus::Running)
            .then(|| Trigger::Lost { reason: "the job's pod disappeared (deleted, or its node was lost)".into() });
    };
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let reason = status.and_then(|s| s.reason.as_deref()).unwrap_or_default();
    let message = status.and_then(|s| s.message.as_deref()).unwrap_or("no detail");
    match phase {
        "Pending" if pod.metadata.deletion_timestamp.is_some() && stop_requested => Some(Trigger::StopRequested),
        "Pending" if pod.metadata.deletion_timestamp.is_some() => {
            Some(Trigger::Lost { reason: "the job's pod was deleted before it started".into() })
        }
        "Pending" => start_failure(pod, now, pending_deadline).map(|reason| Trigger::LaunchFailed { reason }),
        "Running" if pod.metadata.deletion_timestamp.is_some() && !stop_requested => {
            Some(Trigger::Lost { reason: "the job's pod was deleted while it ran".into() })
        }
        "Running" => (current == JobStatus::Pending).then_some(Trigger::Started),
        "Succeeded" => Some(Trigger::Exited { success: true }),
        "Failed" if reason == "DeadlineExceeded" => Some(Trigger::TimedOut {
            limit_secs: pod
                .spec
                .as_ref()
                .and_then(|s| s.active_deadline_seconds)
                .and_then(|s| u64::try_from(s).ok())
                .unwrap_or_default(),
        }),
        "Failed" if stop_requested => Some(Trigger::StopRequested),
        "Failed" if reason == "Evicted" || reason == "Preempting" || reason == "Shutdown" => {
            Some(Trigger::Lost { reason: format!("the job's pod was ended by the cluster ({reason}): {message}") })
        }
        "Failed" => Some(match failure_reason(pod) {
            Some(reason) => Trigger::Crashed { reason },
            None if !reason.is_empty() => {
                Trigger::Crashed { reason: format!("the job's pod failed ({reason}): {message}") }
            }
            None => Trigger::Exited { success: false },
        }),
        _ => None,
    }
}

/// Terminated reasons of a container that never ran its command (its log is empty or absent).
const NEVER_RAN: [&str; 2] = ["ContainerCannotRun", "StartError"];

/// Why a failed pod failed, in words a user can act on: an init container that failed, the job's
/// container killed for memory or ended with an error code. `None` when no container says.
pub fn failure_reason(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    for init in status.init_container_statuses.iter().flatten() {
        let Some(ended) = init.state.as_ref().and_then(|s| s.terminated.as_ref()) else { continue };
        if ended.exit_code != 0 {
            return Some(format!(
                "the init container {} failed with exit code {} ({}): {}; the job's container never started",
                init.name,
                ended.exit_code,
                ended.reason.as_deref().unwrap_or("Error"),
                ended.message.as_deref().unwrap_or("no detail")
            ));
        }
    }
    for container in status.container_statuses.iter().flatten() {
        let Some(ended) = container.state.as_ref().and_then(|s| s.terminated.as_ref()) else { continue };
        let reason = ended.reason.as_deref().unwrap_or("Error");
        if reason == "OOMKilled" {
            let killed =
                format!("its container {} was killed (OOMKilled, exit code {})", container.name, ended.exit_code);
            return Some(match memory_limit(pod, &container.name) {
                Some(limit_bytes) => format!("{}; {killed}", limit_reason(LimitHit::Memory { limit_bytes })),
                None => format!("out of memory: {killed} at its memory limit; run it with a larger function size"),
            });
        }
        if NEVER_RAN.contains(&reason) {
            return Some(format!(
                "the job's container {} could not run ({reason}): {}",
                container.name,
                ended.message.as_deref().unwrap_or("no detail")
            ));
        }
        if ended.exit_code != 0 && container.name == crate::crd::JOB_CONTAINER {
            // The launcher's termination message: the last exception line of the user log.
            return Some(exit_reason(i64::from(ended.exit_code), ended.message.as_deref()));
        }
        if ended.exit_code != 0 {
            return Some(format!(
                "the job's container {} exited with code {} ({reason})",
                container.name, ended.exit_code
            ));
        }
    }
    None
}

/// The memory limit in bytes of the pod's container `name`, when the pod has its spec (the pods
/// the controller keeps from its watch do not).
fn memory_limit(pod: &Pod, name: &str) -> Option<u64> {
    let container = pod.spec.as_ref()?.containers.iter().find(|c| c.name == name)?;
    let quantity = container.resources.as_ref()?.limits.as_ref()?.get("memory")?;
    crate::domain::sizes::memory_bytes(&quantity.0)
}

/// Whether the pod's log can be read: its job container ran (or runs). Otherwise, why there is
/// no log (a log request would be refused, now and on every retry).
pub fn log_source(pod: &Pod) -> Result<(), String> {
    let status = pod.status.as_ref();
    let job = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|containers| containers.iter().find(|c| c.name == crate::crd::JOB_CONTAINER));
    let state = job.and_then(|c| c.state.as_ref());
    if let Some(state) = state {
        let ended = state.terminated.as_ref();
        if state.running.is_some()
            || ended.is_some_and(|e| !NEVER_RAN.contains(&e.reason.as_deref().unwrap_or_default()))
        {
            return Ok(());
        }
    }
    if let Some(reason) = failure_reason(pod) {
        return Err(reason);
    }
    if let Some(waiting) = state.and_then(|s| s.waiting.as_ref()) {
        return Err(format!(
            "the job's container never started ({}: {})",
            waiting.reason.as_deref().unwrap_or("waiting"),
            waiting.message.as_deref().unwrap_or("no detail")
        ));
    }
    let scheduled = status
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .all(|c| c.type_ != "PodScheduled" || c.status == "True");
    Err(if scheduled {
        "the job's container never started".into()
    } else {
        "the job's pod was never scheduled on a node".into()
    })
}

/// Where a finished job's log stands; the `LogsArchived` condition of the resource keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogState {
    /// Not settled: the job runs, or archiving is still being tried.
    Unsettled,
    /// In storage: shipped by the launcher or archived from the pod's log.
    Archived,
    /// There never was one, for this reason (the job's container never ran).
    NoLog(String),
    /// There was one, but it could not be archived in time, for this reason.
    Lost(String),
}

/// What stands in a job's user log when it has none.
pub const NO_LOG: &str = "no log: ";
/// How the reason of a log given up as lost begins.
pub const LOST_LOG: &str = "the pod's log could not be read for";

impl LogState {
    /// The state a stored user log stands for: an archive, or the note put in its place.
    pub fn of_stored(text: &str) -> LogState {
        match text.strip_prefix(NO_LOG).map(str::trim_end) {
            Some(why) if why.starts_with(LOST_LOG) => LogState::Lost(why.to_string()),
            Some(why) => LogState::NoLog(why.to_string()),
            None => LogState::Archived,
        }
    }

    pub fn settled(&self) -> bool {
        *self != LogState::Unsettled
    }

    /// The state the resource's status records.
    pub fn of(status: &FunctionJobStatus) -> LogState {
        if !status.logs_archived {
            return LogState::Unsettled;
        }
        let condition = status.conditions.iter().find(|c| c.type_ == "LogsArchived");
        let message = condition.map(|c| c.message.clone()).unwrap_or_default();
        match condition.map(|c| c.reason.as_str()) {
            Some("NoLog") => LogState::NoLog(message),
            Some("LogLost") => LogState::Lost(message),
            _ => LogState::Archived,
        }
    }

    /// The condition's reason and message.
    fn condition(&self) -> (&'static str, &str) {
        match self {
            LogState::Unsettled => ("NotYet", ""),
            LogState::Archived => ("Archived", ""),
            LogState::NoLog(why) => ("NoLog", why),
            LogState::Lost(why) => ("LogLost", why),
        }
    }
}

/// Whether the condition `kind` of a status is true.
pub fn condition_is(status: &FunctionJobStatus, kind: &str) -> bool {
    status.conditions.iter().any(|c| c.type_ == kind && c.status == "True")
}

/// What the controller knows of a job when it writes the resource's status.
#[derive(Debug, Clone)]
pub struct Known<'a> {
    pub status: JobStatus,
    pub sub_status: Option<&'a str>,
    pub pod: Option<&'a Pod>,
    pub logs: &'a LogState,
    /// The job's Secret was deleted (its pod is done with the token).
    pub secret_deleted: bool,
    /// The job's pod is gone for good (deleted after the keep window, or never made).
    pub pod_deleted: bool,
    pub message: Option<&'a str>,
    /// Why the job ended (its `status_reason`), once it has.
    pub reason: Option<&'a str>,
    pub generation: Option<i64>,
    /// When the job reached a terminal status, if it did.
    pub completed: Option<Timestamp>,
    /// The status written before, so conditions keep their transition times.
    pub previous: Option<&'a FunctionJobStatus>,
    pub now: Timestamp,
    /// The uid of the current attempt's pod.
    pub pod_uid: Option<&'a str>,
    /// The attempts the cluster ended and that were started again.
    pub retries: &'a [crate::crd::Retry],
}

fn condition(
    previous: Option<&FunctionJobStatus>,
    kind: &str,
    on: bool,
    reason: &str,
    message: &str,
    observed: &Known<'_>,
) -> Condition {
    let status = if on { "True" } else { "False" };
    // The transition time moves only when the condition's value does.
    let since = previous
        .and_then(|p| p.conditions.iter().find(|c| c.type_ == kind))
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(observed.now));
    Condition {
        type_: kind.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: since,
        observed_generation: observed.generation,
    }
}

/// The resource's whole status, computed in one piece (never patched field by field).
pub fn resource_status(observed: &Known<'_>) -> FunctionJobStatus {
    let status = observed.status;
    let pod_status = observed.pod.and_then(|p| p.status.as_ref());
    let previous = observed.previous;
    let admitted = status != JobStatus::Queued;
    let running = status == JobStatus::Running;
    let finished = status.is_terminal();
    let message = observed.message.unwrap_or_default();
    let (log_reason, log_message) = observed.logs.condition();
    FunctionJobStatus {
        phase: Some(status),
        sub_status: observed.sub_status.filter(|_| running).map(str::to_string),
        reason: observed.reason.filter(|_| finished).map(str::to_string),
        pod_name: observed.pod.and_then(|p| p.metadata.name.clone()),
        start_time: pod_status
            .and_then(|s| s.start_time.clone())
            .or_else(|| previous.and_then(|p| p.start_time.clone())),
        completion_time: observed.completed.map(Time),
        conditions: vec![
            condition(previous, "Admitted", admitted, if admitted { "PodCreated" } else { "Queued" }, "", observed),
            condition(previous, "Running", running, status.as_str(), "", observed),
            condition(previous, "Finished", finished, status.as_str(), message, observed),
            condition(previous, "LogsArchived", observed.logs.settled(), log_reason, log_message, observed),
            condition(
                previous,
                "SecretDeleted",
                observed.secret_deleted,
                if observed.secret_deleted { "JobFinished" } else { "InUse" },
                "",
                observed,
            ),
            condition(
                previous,
                "PodDeleted",
                observed.pod_deleted,
                if observed.pod_deleted { "Gone" } else { "Present" },
                "",
                observed,
            ),
        ],
        observed_generation: observed.generation,
        logs_archived: observed.logs.settled(),
        message: observed.message.map(str::to_string),
        pod_uid: observed.pod_uid.map(str::to_string),
        retries: observed.retries.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DEADLINE: Duration = Duration::from_secs(600);

    fn now() -> Timestamp {
        "2026-01-01T01:00:00Z".parse().unwrap()
    }

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "gantry-job-x", "creationTimestamp": "2026-01-01T00:50:00Z"},
            "status": status
        }))
        .unwrap()
    }

    fn trigger(current: JobStatus, status: serde_json::Value) -> Option<Trigger> {
        pod_trigger(current, false, Some(&pod(status)), now(), DEADLINE)
    }

    #[test]
    fn pod_phases_become_lifecycle_triggers() {
        use JobStatus::*;
        assert_eq!(trigger(Pending, json!({"phase": "Pending"})), None);
        assert_eq!(trigger(Pending, json!({"phase": "Running"})), Some(Trigger::Started));
        assert_eq!(trigger(Running, json!({"phase": "Running"})), None, "nothing new");
        assert_eq!(trigger(Running, json!({"phase": "Succeeded"})), Some(Trigger::Exited { success: true }));
        assert_eq!(trigger(Running, json!({"phase": "Failed"})), Some(Trigger::Exited { success: false }));
        assert_eq!(
            trigger(Running, json!({"phase": "Failed", "reason": "DeadlineExceeded"})),
            Some(Trigger::TimedOut { limit_secs: 0 })
        );
        assert_eq!(trigger(Succeeded, json!({"phase": "Failed"})), None, "a finished job stays finished");
        let stopped = pod_trigger(Running, true, Some(&pod(json!({"phase": "Failed"}))), now(), DEADLINE);
        assert_eq!(stopped, Some(Trigger::StopRequested));
    }

    #[test]
    fn pods_that_never_start_fail_the_job_with_the_cause() {
        let pull = trigger(
            JobStatus::Pending,
            json!({"phase": "Pending", "containerStatuses": [{"name": "job", "image": "registry/x:1", "imageID": "", "ready": false, "restartCount": 0,
                   "state": {"waiting": {"reason": "ImagePullBackOff", "message": "pull access denied"}}}]}),
        );
        let Some(Trigger::LaunchFailed { reason }) = pull else { panic!("{pull:?}") };
        assert!(
            reason.contains("ImagePullBackOff")
                && reason.contains("registry/x:1")
                && reason.contains("pull access denied"),
            "{reason}"
        );

        let unschedulable = json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes have nvidia.com/gpu"}]});
        let waited = pod_trigger(JobStatus::Pending, false, Some(&pod(unschedulable.clone())), now(), DEADLINE);
        let Some(Trigger::LaunchFailed { reason }) = waited else { panic!("{waited:?}") };
        assert!(reason.contains("600 s") && reason.contains("nvidia.com/gpu"), "{reason}");
        let early = pod_trigger(JobStatus::Pending, false, Some(&pod(unschedulable)), now(), Duration::from_secs(3600));
        assert_eq!(early, None, "still within the pending deadline");

        let config = json!({"phase": "Pending", "containerStatuses": [{"name": "job", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "CreateContainerConfigError", "message": "secret \"s\" not found"}}}]});
        let transient =
            pod_trigger(JobStatus::Pending, false, Some(&pod(config.clone())), now(), Duration::from_secs(3600));
        assert_eq!(transient, None, "a missing Secret may still appear");
        let lasting = pod_trigger(JobStatus::Pending, false, Some(&pod(config)), now(), DEADLINE);
        assert!(
            matches!(lasting, Some(Trigger::LaunchFailed { reason }) if reason.contains("CreateContainerConfigError"))
        );
    }

    #[test]
    fn pods_that_vanish_fail_the_job() {
        let gone = pod_trigger(JobStatus::Running, false, None, now(), DEADLINE);
        assert!(matches!(gone, Some(Trigger::Lost { reason }) if reason.contains("disappeared")));
        assert_eq!(pod_trigger(JobStatus::Queued, false, None, now(), DEADLINE), None, "not created yet");
        assert_eq!(pod_trigger(JobStatus::Running, true, None, now(), DEADLINE), Some(Trigger::StopRequested));
        let evicted =
            trigger(JobStatus::Running, json!({"phase": "Failed", "reason": "Evicted", "message": "low on memory"}));
        assert!(
            matches!(evicted, Some(Trigger::Lost { reason }) if reason.contains("Evicted") && reason.contains("low on memory"))
        );
        let mut deleted = pod(json!({"phase": "Running"}));
        deleted.metadata.deletion_timestamp = Some(Time(now()));
        let lost = pod_trigger(JobStatus::Running, false, Some(&deleted), now(), DEADLINE);
        assert!(matches!(lost, Some(Trigger::Lost { .. })), "{lost:?}");
        assert_eq!(pod_trigger(JobStatus::Running, true, Some(&deleted), now(), DEADLINE), None, "a stop deletes it");
    }

    #[test]
    fn the_status_is_computed_whole_and_keeps_transition_times() {
        let running_pod = pod(json!({"phase": "Running", "startTime": "2026-01-01T00:55:00Z"}));
        let first = resource_status(&Known {
            status: JobStatus::Running,
            sub_status: Some("MAPPING"),
            pod: Some(&running_pod),
            logs: &LogState::Unsettled,
            secret_deleted: false,
            pod_deleted: false,
            message: None,
            reason: None,
            generation: Some(1),
            completed: None,
            previous: None,
            now: now(),
            pod_uid: None,
            retries: &[],
        });
        assert_eq!(first.phase, Some(JobStatus::Running));
        assert_eq!(first.sub_status.as_deref(), Some("MAPPING"));
        assert_eq!(first.pod_name.as_deref(), Some("gantry-job-x"));
        assert_eq!(first.start_time.as_ref().unwrap().0.to_string(), "2026-01-01T00:55:00Z");
        let later: Timestamp = "2026-01-01T02:00:00Z".parse().unwrap();
        let done = resource_status(&Known {
            status: JobStatus::Succeeded,
            sub_status: Some("MAPPING"),
            pod: None,
            logs: &LogState::Archived,
            secret_deleted: true,
            pod_deleted: true,
            message: None,
            reason: None,
            generation: Some(1),
            completed: Some(later),
            previous: Some(&first),
            now: later,
            pod_uid: None,
            retries: &[],
        });
        let by_kind = |status: &FunctionJobStatus, kind: &str| {
            status.conditions.iter().find(|c| c.type_ == kind).cloned().unwrap()
        };
        assert_eq!(done.sub_status, None, "only a running job has a sub-status");
        assert_eq!(done.start_time, first.start_time, "kept from before");
        assert_eq!(by_kind(&done, "Admitted").last_transition_time, by_kind(&first, "Admitted").last_transition_time);
        assert_eq!(by_kind(&done, "Finished").status, "True");
        assert_eq!(by_kind(&done, "Finished").last_transition_time.0, later);
        assert!(done.logs_archived && by_kind(&done, "LogsArchived").status == "True");
    }

    fn terminated(name: &str, code: i32, reason: &str) -> serde_json::Value {
        json!({"name": name, "image": "x", "imageID": "", "ready": false, "restartCount": 0,
               "state": {"terminated": {"exitCode": code, "reason": reason}}})
    }

    #[test]
    fn failed_pods_say_why_in_words_a_user_can_act_on() {
        let oom = trigger(
            JobStatus::Running,
            json!({"phase": "Failed", "containerStatuses": [terminated("job", 137, "OOMKilled")]}),
        );
        assert!(
            matches!(&oom, Some(Trigger::Crashed { reason }) if reason.starts_with("out of memory: ") && reason.contains("larger function size")),
            "{oom:?}"
        );
        // With the container's memory limit: the words of every backend, naming it.
        let mut limited = pod(json!({"phase": "Failed", "containerStatuses": [terminated("job", 137, "OOMKilled")]}));
        limited.spec = Some(
            serde_json::from_value(
                json!({"containers": [{"name": "job", "resources": {"limits": {"memory": "2Gi"}}}]}),
            )
            .unwrap(),
        );
        let oom = pod_trigger(JobStatus::Running, false, Some(&limited), now(), DEADLINE);
        assert!(
            matches!(&oom, Some(Trigger::Crashed { reason })
                if reason.starts_with("out of memory (limit 2048 MiB): run it with a larger function size; its container job was killed (OOMKilled")),
            "{oom:?}"
        );
        let exit = trigger(
            JobStatus::Running,
            json!({"phase": "Failed", "containerStatuses": [terminated("job", 3, "Error")]}),
        );
        assert_eq!(exit, Some(Trigger::Crashed { reason: "exit code 3".into() }));
        // The launcher's termination message is the last exception line.
        let mut raised = terminated("job", 1, "Error");
        raised["state"]["terminated"]["message"] = json!("ZeroDivisionError: division by zero");
        let exit = trigger(JobStatus::Running, json!({"phase": "Failed", "containerStatuses": [raised]}));
        let why = "exit code 1: ZeroDivisionError: division by zero";
        assert_eq!(exit, Some(Trigger::Crashed { reason: why.into() }));
        let init = trigger(
            JobStatus::Pending,
            json!({"phase": "Failed", "initContainerStatuses": [terminated("place-launcher", 1, "Error")],
                   "containerStatuses": [{"name": "job", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                                          "state": {"waiting": {"reason": "PodInitializing"}}}]}),
        );
        assert!(
            matches!(&init, Some(Trigger::Crashed { reason }) if reason.contains("init container place-launcher failed")),
            "{init:?}"
        );
        let rejected =
            trigger(JobStatus::Pending, json!({"phase": "Failed", "reason": "OutOfcpu", "message": "node full"}));
        assert!(matches!(&rejected, Some(Trigger::Crashed { reason }) if reason.contains("OutOfcpu")), "{rejected:?}");
        // Stopped while its pod was still pending: a stop, not a loss.
        let mut pending = pod(json!({"phase": "Pending"}));
        pending.metadata.deletion_timestamp = Some(Time(now()));
        let stopped = pod_trigger(JobStatus::Pending, true, Some(&pending), now(), DEADLINE);
        assert_eq!(stopped, Some(Trigger::StopRequested));
    }

    #[test]
    fn a_log_is_read_only_from_a_container_that_ran() {
        let ran = pod(json!({"phase": "Failed", "containerStatuses": [terminated("job", 1, "Error")]}));
        assert_eq!(log_source(&ran), Ok(()));
        let running =
            pod(json!({"phase": "Running", "containerStatuses": [{"name": "job", "image": "x", "imageID": "",
            "ready": true, "restartCount": 0, "state": {"running": {}}}]}));
        assert_eq!(log_source(&running), Ok(()));
        let pulling = pod(
            json!({"phase": "Pending", "containerStatuses": [{"name": "job", "image": "x", "imageID": "",
            "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff", "message": "denied"}}}]}),
        );
        let why = log_source(&pulling).unwrap_err();
        assert!(why.contains("never started") && why.contains("ImagePullBackOff"), "{why}");
        let unscheduled = pod(
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}),
        );
        assert!(log_source(&unscheduled).unwrap_err().contains("never scheduled"));
        let init = pod(json!({"phase": "Failed", "initContainerStatuses": [terminated("place-launcher", 2, "Error")]}));
        assert!(log_source(&init).unwrap_err().contains("init container"));
        let cannot = pod(json!({"phase": "Failed", "containerStatuses": [terminated("job", 128, "StartError")]}));
        assert!(log_source(&cannot).unwrap_err().contains("could not run"));
    }

    #[test]
    fn a_stored_log_says_how_it_was_settled() {
        assert_eq!(LogState::of_stored("working\ndone\n"), LogState::Archived);
        assert_eq!(LogState::of_stored(""), LogState::Archived);
        assert_eq!(
            LogState::of_stored("no log: the job's pod was never scheduled on a node\n"),
            LogState::NoLog("the job's pod was never scheduled on a node".into())
        );
        let lost = format!("{NO_LOG}{LOST_LOG} 600 s, giving up: 400\n");
        assert_eq!(LogState::of_stored(&lost), LogState::Lost(format!("{LOST_LOG} 600 s, giving up: 400")));
    }

    #[test]
    fn the_log_state_survives_in_the_status() {
        for state in [
            LogState::Unsettled,
            LogState::Archived,
            LogState::NoLog("never started".into()),
            LogState::Lost("log read refused".into()),
        ] {
            let status = resource_status(&Known {
                status: JobStatus::Failed,
                sub_status: None,
                pod: None,
                logs: &state,
                secret_deleted: true,
                pod_deleted: false,
                message: Some("x"),
                reason: None,
                generation: Some(1),
                completed: Some(now()),
                previous: None,
                now: now(),
                pod_uid: None,
                retries: &[],
            });
            assert_eq!(LogState::of(&status), state);
            assert!(condition_is(&status, "SecretDeleted") && !condition_is(&status, "PodDeleted"));
        }
    }
}
