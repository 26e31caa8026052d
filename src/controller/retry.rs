//! Retries of what the infrastructure broke (pure), and the backoff of failed reconciles. A job's pod that the cluster ended (evicted,
//! preempted, its node lost or shut down, deleted by someone other than Gantry) is a fault of the
//! infrastructure, not of the job: before the function's code started, the job is started again
//! on a new pod, at most `--infrastructure-retries` times with a doubling backoff; after its code
//! started, only when the function opted in (`spec.retryAfterStart`), since a rerun may repeat
//! paid quantum work. A non-zero exit, an OOM kill, a timeout or a stop is the job's own ending
//! and is never retried. Each retry is recorded on the FunctionJob's status (`status.retries`)
//! and in the database (the job's `infrastructure_retries` and a `RETRY` job event), so a
//! restarted controller continues where the last one was.
//!
//! "The code started" is read from what the cluster reports of the job's container: the
//! launcher is the container's command and starts the function's code as soon as its artifact
//! and arguments are in place, so a container that ran (or a job that was seen RUNNING) counts as
//! started. That errs on the side of not rerunning.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use crate::crd::{FunctionJobStatus, JOB_CONTAINER, Retry};
use crate::domain::lifecycle::JobStatus;

/// Pod reasons of a pod the kubelet or the cluster ended (`status.reason` of a failed pod).
const ENDED_BY_CLUSTER: [&str; 5] = ["Evicted", "Preempting", "Shutdown", "NodeShutdown", "Terminated"];

/// An ending of a job's pod caused by the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// What happened, in words.
    pub reason: String,
    /// The function's code may have run.
    pub code_started: bool,
}

/// What was seen of a job's pod going: whether its code had started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeStarted {
    Yes,
    No,
    /// The pod went while the watch was away (missing from a relist): the last sight of it may
    /// predate its start.
    NotKnown,
}

impl From<bool> for CodeStarted {
    fn from(started: bool) -> CodeStarted {
        if started { CodeStarted::Yes } else { CodeStarted::No }
    }
}

/// Whether the job's container ran (or runs): its code may have started.
pub fn container_started(pod: &Pod) -> bool {
    let container = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|containers| containers.iter().find(|c| c.name == JOB_CONTAINER));
    let state = container.and_then(|c| c.state.as_ref());
    state.is_some_and(|state| {
        state.running.is_some()
            || state.terminated.as_ref().is_some_and(|ended| {
                !matches!(ended.reason.as_deref(), Some("ContainerCannotRun" | "StartError"))
                    && ended.started_at.is_some()
            })
    })
}

/// The `DisruptionTarget` condition the cluster puts on a pod it is about to end (preemption,
/// a tainted or lost node, the eviction API, the kubelet's shutdown): its reason and message.
fn disruption(pod: &Pod) -> Option<(String, String)> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    let found = conditions.iter().find(|c| c.type_ == "DisruptionTarget" && c.status == "True")?;
    Some((
        found.reason.clone().unwrap_or_else(|| "DisruptionTarget".into()),
        found.message.clone().unwrap_or_else(|| "no detail".into()),
    ))
}

/// The fault of the cluster that ended (or is ending) the job's current attempt, if that is
/// what happened. `pod` is `None` when the pod is gone; `current` is the job's status;
/// `gone_started` whether a pod seen going had started its code (`None`: its going was not
/// seen; then, as with [`CodeStarted::NotKnown`], it counts as started).
pub fn infrastructure_fault(
    current: JobStatus,
    stop_requested: bool,
    pod: Option<&Pod>,
    gone_started: Option<CodeStarted>,
) -> Option<Fault> {
    if stop_requested || !matches!(current, JobStatus::Pending | JobStatus::Running) {
        return None;
    }
    let ran = current == JobStatus::Running;
    let Some(pod) = pod else {
        let reason = "the job's pod disappeared (deleted, or its node was lost)";
        return Some(match gone_started {
            Some(CodeStarted::No) => Fault { reason: reason.into(), code_started: ran },
            Some(CodeStarted::Yes) => Fault { reason: reason.into(), code_started: true },
            Some(CodeStarted::NotKnown) | None => {
                Fault { reason: format!("{reason}; whether its code had started is not known"), code_started: true }
            }
        });
    };
    let code_started = ran || container_started(pod);
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let reason = status.and_then(|s| s.reason.as_deref()).unwrap_or_default();
    let message = status.and_then(|s| s.message.as_deref()).unwrap_or("no detail");
    let disrupted = disruption(pod);
    let reason = match (phase, &disrupted) {
        ("Failed", _) if ENDED_BY_CLUSTER.contains(&reason) => {
            format!("the job's pod was ended by the cluster ({reason}): {message}")
        }
        ("Failed", Some((why, detail))) => format!("the job's pod was ended by the cluster ({why}): {detail}"),
        ("Unknown", _) => {
            let why = if reason.is_empty() { "NodeLost" } else { reason };
            format!("the job's pod was lost with its node ({why}): {message}")
        }
        ("Pending" | "Running", _) if pod.metadata.deletion_timestamp.is_some() => match &disrupted {
            Some((why, detail)) => format!("the job's pod was deleted by the cluster ({why}): {detail}"),
            None if code_started => "the job's pod was deleted while it ran".into(),
            None => "the job's pod was deleted before it started".into(),
        },
        _ => return None,
    };
    Some(Fault { reason, code_started })
}

/// The wait before attempt `retry + 1`, after the `retry`th retry (1-based): `first`, doubling,
/// at most 5 minutes.
pub fn backoff(first: Duration, retry: u32) -> Duration {
    let doubled = first.saturating_mul(1 << retry.saturating_sub(1).min(16));
    doubled.min(Duration::from_secs(300))
}

/// What to do about a fault of the cluster.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Start the job again: this record goes on the status.
    Retry(Retry),
    /// The job ends FAILED with these words.
    Final(String),
}

/// Retry or end, given the fault, the retries made so far (`made`), the number of the attempt
/// that ended (`attempt`: `made + 1`, more when the job was queued again after a reclaim of
/// backfill), the bound, the function's opt-in, the pod that ended (its uid) and the clock.
#[allow(clippy::too_many_arguments)]
pub fn verdict(
    fault: &Fault,
    made: u32,
    attempt: u32,
    bound: u32,
    retry_after_start: bool,
    pod_uid: Option<String>,
    first_backoff: Duration,
    now: Timestamp,
) -> Verdict {
    if fault.code_started && !retry_after_start {
        return Verdict::Final(match attempt {
            1 => fault.reason.clone(),
            _ => format!("{} (attempt {attempt})", fault.reason),
        });
    }
    if made >= bound {
        let attempts = if attempt == 1 { "1 attempt".to_string() } else { format!("{attempt} attempts") };
        return Verdict::Final(format!("{} after {attempts}", fault.reason));
    }
    let wait = backoff(first_backoff, made + 1);
    let next = now.checked_add(k8s_openapi::jiff::SignedDuration::try_from(wait).unwrap_or_default()).unwrap_or(now);
    Verdict::Retry(Retry {
        attempt,
        reason: fault.reason.clone(),
        code_started: fault.code_started,
        pod_uid,
        ended_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
        next_attempt_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(next),
        requeued: false,
    })
}

/// Where the job's attempts stand, from the status written last and the pod seen now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stage {
    /// No retry under way: the pod (if any) is the current attempt's.
    Current,
    /// The last attempt ended and was recorded; its pod is still there (to be deleted).
    OldPodPresent { deleting: bool },
    /// The last attempt's pod is gone; the next attempt's pod is made at this time.
    AwaitingNextPod { at: Timestamp },
}

/// The stage of a job whose status is `previous`, with `pod` (its uid) seen now; `next_went`
/// when no pod is seen but one made after the ended attempt's was seen going (made, then gone
/// before the status named it).
pub fn stage(previous: &FunctionJobStatus, pod: Option<&Pod>, next_went: bool) -> Stage {
    let Some(last) = previous.retries.last() else { return Stage::Current };
    let recorded = last.pod_uid.as_deref();
    match pod {
        Some(pod) if recorded.is_some() && pod.metadata.uid.as_deref() == recorded => {
            Stage::OldPodPresent { deleting: pod.metadata.deletion_timestamp.is_some() }
        }
        Some(_) => Stage::Current,
        // Gone: the next pod is not made yet while the status still names the ended one's uid
        // (the next pod's uid is written with the status that follows its creation).
        None if previous.pod_uid.as_deref() == recorded && !next_went => {
            Stage::AwaitingNextPod { at: last.next_attempt_at.0 }
        }
        None => Stage::Current,
    }
}

/// A pod seen going (its uid, whether its code had started), as far as it tells about the
/// job's current attempt: the pod of an attempt the status records as ended is history.
pub fn gone_of_current_attempt(
    previous: Option<&FunctionJobStatus>,
    gone: Option<(Option<String>, CodeStarted)>,
) -> Option<(Option<String>, CodeStarted)> {
    let ended = |uid: &str| previous.is_some_and(|p| p.retries.iter().any(|r| r.pod_uid.as_deref() == Some(uid)));
    gone.filter(|(uid, _)| uid.as_deref().is_none_or(|uid| !ended(uid)))
}

/// The wait after the `failures`th failed reconcile of a resource in a row: 1 s, doubling, at
/// most 5 minutes.
pub fn error_backoff(failures: u32) -> Duration {
    let doubled = Duration::from_secs(1 << failures.saturating_sub(1).min(9));
    doubled.min(Duration::from_secs(300))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn failed_reconciles_back_off_doubling_to_five_minutes() {
        let waits: Vec<u64> = (1..=11).map(|failures| error_backoff(failures).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(error_backoff(u32::MAX), Duration::from_secs(300));
    }

    fn pod(metadata: serde_json::Value, status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": metadata, "status": status})).unwrap()
    }

    fn now() -> Timestamp {
        "2026-01-01T01:00:00Z".parse().unwrap()
    }

    fn waiting() -> serde_json::Value {
        json!([{"name": "job", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "PodInitializing"}}}])
    }

    fn ran() -> serde_json::Value {
        json!([{"name": "job", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 143, "reason": "Error", "startedAt": "2026-01-01T00:59:00Z"}}}])
    }

    #[test]
    fn cluster_endings_are_faults_that_say_whether_the_code_started() {
        use JobStatus::*;
        let evicted = pod(
            json!({}),
            json!({"phase": "Failed", "reason": "Evicted", "message": "low on memory", "containerStatuses": waiting()}),
        );
        let fault = infrastructure_fault(Pending, false, Some(&evicted), None).unwrap();
        assert!(fault.reason.contains("Evicted") && fault.reason.contains("low on memory"), "{fault:?}");
        assert!(!fault.code_started);
        let evicted_late = pod(json!({}), json!({"phase": "Failed", "reason": "Evicted", "containerStatuses": ran()}));
        assert!(
            infrastructure_fault(Pending, false, Some(&evicted_late), None).unwrap().code_started,
            "its container ran"
        );
        assert!(infrastructure_fault(Running, false, Some(&evicted), None).unwrap().code_started, "seen running");

        let preempted = pod(
            json!({"deletionTimestamp": "2026-01-01T00:59:00Z"}),
            json!({"phase": "Pending", "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler", "message": "preempted by a higher priority pod"}]}),
        );
        let fault = infrastructure_fault(Pending, false, Some(&preempted), None).unwrap();
        assert!(fault.reason.contains("PreemptionByScheduler") && !fault.code_started, "{fault:?}");

        let unknown = pod(
            json!({}),
            json!({"phase": "Unknown", "reason": "NodeLost", "message": "node n1 which was running pod is unresponsive"}),
        );
        let fault = infrastructure_fault(Pending, false, Some(&unknown), None).unwrap();
        assert!(fault.reason.contains("lost with its node (NodeLost)"), "{fault:?}");

        // A pod that vanished: whether its code started is what was seen of it going.
        let gone = infrastructure_fault(Pending, false, None, Some(CodeStarted::No)).unwrap();
        assert!(gone.reason.contains("disappeared") && !gone.code_started);
        assert!(
            infrastructure_fault(Pending, false, None, Some(CodeStarted::Yes)).unwrap().code_started,
            "seen running"
        );
        assert!(infrastructure_fault(Running, false, None, Some(CodeStarted::No)).unwrap().code_started);
        for unseen in [None, Some(CodeStarted::NotKnown)] {
            let unseen = infrastructure_fault(Pending, false, None, unseen).unwrap();
            assert!(unseen.code_started, "not known: counted as started, never run twice unasked");
            assert!(unseen.reason.ends_with("whether its code had started is not known"), "{unseen:?}");
        }

        let deleted = pod(json!({"deletionTimestamp": "2026-01-01T00:59:00Z"}), json!({"phase": "Pending"}));
        assert!(
            infrastructure_fault(Pending, false, Some(&deleted), None).unwrap().reason.contains("before it started")
        );
    }

    #[test]
    fn the_jobs_own_endings_and_stops_are_not_faults() {
        use JobStatus::*;
        let exit = pod(json!({}), json!({"phase": "Failed", "containerStatuses": ran()}));
        assert_eq!(infrastructure_fault(Running, false, Some(&exit), None), None, "a non-zero exit");
        let timeout = pod(json!({}), json!({"phase": "Failed", "reason": "DeadlineExceeded"}));
        assert_eq!(infrastructure_fault(Running, false, Some(&timeout), None), None);
        let evicted = pod(json!({}), json!({"phase": "Failed", "reason": "Evicted"}));
        assert_eq!(infrastructure_fault(Running, true, Some(&evicted), None), None, "stopped");
        assert_eq!(infrastructure_fault(Failed, false, None, None), None, "finished");
        assert_eq!(infrastructure_fault(Queued, false, None, None), None, "no pod yet");
        let running = pod(json!({}), json!({"phase": "Running"}));
        assert_eq!(infrastructure_fault(Running, false, Some(&running), None), None);
        let done = pod(json!({}), json!({"phase": "Succeeded"}));
        assert_eq!(infrastructure_fault(Running, false, Some(&done), None), None);
    }

    #[test]
    fn retries_are_bounded_back_off_and_need_the_opt_in_after_the_code_started() {
        let second = Duration::from_secs(1);
        let before = Fault { reason: "evicted".into(), code_started: false };
        let Verdict::Retry(first) = verdict(&before, 0, 1, 2, false, Some("u1".into()), second, now()) else {
            panic!()
        };
        assert_eq!((first.attempt, first.pod_uid.as_deref()), (1, Some("u1")));
        assert_eq!(first.next_attempt_at.0.duration_since(now()).as_secs(), 1);
        let Verdict::Retry(again) = verdict(&before, 1, 2, 2, false, None, second, now()) else { panic!() };
        assert_eq!((again.attempt, again.next_attempt_at.0.duration_since(now()).as_secs()), (2, 2));
        assert_eq!(
            verdict(&before, 2, 3, 2, false, None, second, now()),
            Verdict::Final("evicted after 3 attempts".into())
        );
        assert_eq!(
            verdict(&before, 0, 1, 0, false, None, second, now()),
            Verdict::Final("evicted after 1 attempt".into())
        );
        let after = Fault { reason: "evicted".into(), code_started: true };
        assert_eq!(verdict(&after, 0, 1, 2, false, None, second, now()), Verdict::Final("evicted".into()));
        assert_eq!(verdict(&after, 1, 2, 2, false, None, second, now()), Verdict::Final("evicted (attempt 2)".into()));
        assert!(matches!(verdict(&after, 0, 1, 2, true, None, second, now()), Verdict::Retry(r) if r.code_started));
        let waits: Vec<u64> = (1..=11).map(|retry| backoff(Duration::from_secs(5), retry).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300, 300, 300]);
    }

    #[test]
    fn the_stage_tells_the_ended_attempts_pod_from_the_next_one() {
        let retry = |uid: &str| Retry {
            attempt: 1,
            reason: "evicted".into(),
            code_started: false,
            pod_uid: Some(uid.into()),
            ended_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()),
            next_attempt_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()),
            requeued: false,
        };
        let mut status =
            FunctionJobStatus { pod_uid: Some("old".into()), retries: vec![retry("old")], ..Default::default() };
        let old = pod(json!({"uid": "old"}), json!({"phase": "Failed"}));
        let new = pod(json!({"uid": "new"}), json!({"phase": "Pending"}));
        assert_eq!(stage(&status, Some(&old), false), Stage::OldPodPresent { deleting: false });
        assert_eq!(stage(&status, None, false), Stage::AwaitingNextPod { at: now() });
        assert_eq!(stage(&status, Some(&new), false), Stage::Current);
        assert_eq!(
            stage(&status, None, true),
            Stage::Current,
            "the next pod was made and went before the status named it: a fault of its own"
        );
        status.pod_uid = Some("new".into());
        assert_eq!(
            stage(&status, None, false),
            Stage::Current,
            "the next pod was made and is gone: a fault of its own"
        );
        assert_eq!(stage(&FunctionJobStatus::default(), Some(&old), false), Stage::Current);
        // What went: the ended attempt's pod is history, the next one's (or one of no known uid)
        // is the current attempt's.
        let went = |uid: Option<&str>| Some((uid.map(str::to_string), CodeStarted::Yes));
        assert_eq!(gone_of_current_attempt(Some(&status), went(Some("old"))), None, "another attempt's pod");
        assert_eq!(gone_of_current_attempt(Some(&status), went(Some("new"))), went(Some("new")));
        assert_eq!(gone_of_current_attempt(Some(&status), went(None)), went(None));
        assert_eq!(gone_of_current_attempt(None, went(Some("old"))), went(Some("old")));
    }
}
