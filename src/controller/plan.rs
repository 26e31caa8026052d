//! What to do about one `FunctionJob`, decided from what was observed (pure). `reconcile`
//! observes (the resource, its job row, its pod, the log's archive), calls [`plan`], and carries
//! out the steps in order. A plan assumes each step does what it is meant to; when one turns out
//! otherwise (another mover won the job's compare-and-set, the pod existed already, the pod's
//! log could not be read) or the plan needs to look further (the archive, once the job is
//! finished), the shell notes what it saw in the [`Observed`] value and plans again.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::retry::{self, CodeStarted, Stage, Verdict};
use super::status::{Known, LOST_LOG, LogState, condition_is, log_source, pod_trigger, resource_status};
use crate::crd::{FunctionJob, FunctionJobStatus, Retry, pod_name};
use crate::domain::lifecycle::{JobStatus, Trigger, decide};

/// The job's row in the database, as far as the controller reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub status: JobStatus,
    pub sub_status: Option<String>,
    pub stop_requested: bool,
    /// A provider's function: its log is split in two.
    pub provider_function: bool,
    /// Times the job was started again after the cluster ended its pod (the database's count).
    pub retries: u32,
    /// Why the job ended, once it has (the job's `status_reason`).
    pub status_reason: Option<String>,
    /// What ends the job (or queues it again) once its stop request is carried out: the user's
    /// stop, or a tenant's reclaim of backfill (`lifecycle::stop_trigger`).
    pub stop_trigger: Trigger,
}

/// What object storage holds of a finished job's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Archive {
    /// Not looked at (a plan that needs it asks for it).
    Unknown,
    /// Neither the launcher's exit record nor a stored log.
    Empty,
    /// Settled: shipped by the launcher (its exit record), or stored before (an archive, or the
    /// note put in the log's place).
    Holds(LogState),
}

/// Everything a plan is made from.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    /// The resource as the controller's cache has it (its status is the one written last).
    pub job: &'a FunctionJob,
    /// The resource is being deleted (the finalizer's cleanup).
    pub deleting: bool,
    /// The job's row; `None` when the job is gone from the database.
    pub row: Option<Row>,
    /// The job's pod, as the pod watch (or the API server) shows it.
    pub pod: Option<Pod>,
    /// With no pod: whether the job's last pod, seen going, had started its code (`None`: its
    /// going was not seen).
    pub gone_pod_started: Option<CodeStarted>,
    /// That pod's uid, when known. A pod of an attempt the status records as ended is never
    /// reported here: with no pod, `gone_pod_started` is about the current attempt's.
    pub gone_pod_uid: Option<String>,
    pub archive: Archive,
    /// Why reading the pod's log failed in this reconcile, if it did.
    pub log_read_error: Option<String>,
    /// The trigger of a move this reconcile made already: its words go in the status.
    pub moved: Option<Trigger>,
    pub now: Timestamp,
}

/// The controller's time windows and deadlines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    /// How long a pod may stay unschedulable before its job fails.
    pub pending_deadline: Duration,
    /// How long a finished job's pod is kept before it is deleted.
    pub keep_finished_pods: Duration,
    /// How long a finished job's resource is kept before it is deleted.
    pub keep_finished_jobs: Duration,
    /// How long reading a pod's log for archiving is retried before the log is given up.
    pub archive_give_up: Duration,
    /// How many times a job whose pod the cluster ended is started again.
    pub infrastructure_retries: u32,
    /// The wait before the first retry (doubling for each next one).
    pub retry_backoff: Duration,
}

/// A Kubernetes Event about the resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    pub reason: String,
    pub message: Option<String>,
}

/// One thing to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// The job is gone from the database: delete its resource (the gateway's sweep would too).
    DeleteResource,
    /// Move the job from `from` by `trigger` (a compare-and-set) and, when it moved, say so.
    Move { from: JobStatus, to: JobStatus, trigger: Trigger, note: Note },
    /// Create the job's pod (an existing one, made before a crash, is adopted instead).
    CreatePod,
    /// Record that the cluster ended the job's attempt and it starts again: in the database (the
    /// count of retries as a compare-and-set from `made`, a `RETRY` job event, and the move back
    /// to PENDING of a RUNNING job) and as a Kubernetes Event.
    RecordRetry { from: JobStatus, made: u32, retry: Retry, note: Note },
    /// Delete the ended attempt's pod at once (nothing of it runs any more).
    DeleteEndedPod,
    /// Remove what the ended attempt's launcher shipped (its exit record, logs, result), so the
    /// next attempt's are never confused with them.
    ClearAttempt,
    /// Stop the running pod (a stop was requested): delete it with a short grace period.
    StopPod,
    /// Archive the pod's log into storage, split as the launcher splits it.
    ArchivePodLog { provider_function: bool },
    /// Put `no log: <why>` in the log's place and say so (a lost log also as a job event).
    SettleWithoutLog { state: LogState, provider_function: bool },
    /// Delete the job's Secret (the caller's token).
    DeleteSecret,
    /// Delete the job's pod.
    DeletePod,
    /// Write the resource's whole status (server-side apply).
    WriteStatus(Box<FunctionJobStatus>),
    /// Delete the finished, settled resource after its keep window.
    Collect,
    /// Ask for an admission pass now.
    WakeAdmission,
}

/// What follows the steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Reconcile again after this long (or on a change, whichever comes first).
    Requeue(Duration),
    AwaitChange,
    /// Look at the log's archive, then plan again.
    LookAtArchive,
    /// Keep the finalizer: the log of the deleted resource is not archived yet; retry after.
    HoldFinalizer(Duration),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub next: Next,
}

impl Plan {
    fn then(steps: Vec<Step>, next: Next) -> Plan {
        Plan { steps, next }
    }
}

/// A trigger's words for the resource's status and its Kubernetes Event.
pub fn describe(trigger: &Trigger) -> Option<String> {
    match trigger {
        Trigger::LaunchFailed { reason } | Trigger::Lost { reason } | Trigger::Crashed { reason } => {
            Some(reason.clone())
        }
        Trigger::TimedOut { .. } | Trigger::StopRequested | Trigger::Deleted | Trigger::Preempted { .. } => {
            decide(JobStatus::Running, trigger).and_then(|m| m.reason().map(str::to_string))
        }
        _ => None,
    }
}

/// Why a job without a pod has no log: it ended before its pod was made, or the pod went
/// without the launcher shipping one.
pub fn why_no_pod_log(status: JobStatus, message: Option<&str>, pod_made: bool) -> String {
    let detail = message.map(|m| format!(": {m}")).unwrap_or_default();
    if pod_made {
        format!("the job's pod is gone and left no log{detail}")
    } else {
        format!("the job ended {} before its pod was made{detail}", status.as_str())
    }
}

/// The wait before the next try to archive a log, `elapsed` after the first: doubling from 1 s,
/// at most a minute.
pub fn archive_backoff(elapsed: Duration) -> Duration {
    elapsed.clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// Whether a reconcile should ask the API server for the job's pod when the pod watch has not
/// shown it: not for a pod recorded gone for good, nor for a queued job (pods are made only once
/// admitted) or an admitted one without a recorded pod (about to get one: creating it finds a
/// pod made already).
pub fn ask_for_pod(previous: Option<&FunctionJobStatus>, row: Option<&Row>, deleting: bool) -> bool {
    let pod_gone = previous.is_some_and(|p| condition_is(p, "PodDeleted"));
    if pod_gone {
        return false;
    }
    if deleting {
        return true;
    }
    let recorded = previous.is_some_and(|p| p.pod_name.is_some());
    row.is_some_and(|row| {
        recorded || row.stop_requested || !matches!(row.status, JobStatus::Queued | JobStatus::Pending)
    })
}

/// How long until the job's pod (about to be made, when there is none) has been pending for
/// `deadline`, and a second more (its wait counts whole seconds); `None` once it has.
fn until_overdue(pod: Option<&Pod>, now: Timestamp, deadline: Duration) -> Option<Duration> {
    let created = pod.and_then(|pod| pod.metadata.creation_timestamp.as_ref()).map_or(now, |time| time.0);
    let left = deadline.checked_sub(between(created, now)).filter(|left| !left.is_zero())?;
    Some(left + Duration::from_secs(1))
}

/// Time from `from` to `to` (zero when `to` is earlier).
fn between(from: Timestamp, to: Timestamp) -> Duration {
    Duration::from_secs_f64(to.duration_since(from).as_secs_f64().max(0.0))
}

/// A move by `trigger` from `from`, if the lifecycle allows one, with its Event: the step, the
/// status it moves to and the words for the status (the trigger's, else `message`).
fn move_by(from: JobStatus, trigger: Trigger, message: Option<String>) -> Option<(Step, JobStatus, Option<String>)> {
    let to = decide(from, &trigger)?.to;
    let words = describe(&trigger).or(message);
    let note = Note { warning: to == JobStatus::Failed, reason: to.as_str().into(), message: words.clone() };
    Some((Step::Move { from, to, trigger, note }, to, words))
}

/// How a finished job's log gets settled, given what the archive holds.
enum LogPlan {
    Settled(LogState),
    Steps(Step, LogState),
    /// Reading the pod's log failed and may succeed later: retry after this long.
    Retry(Duration),
    LookAtArchive,
}

fn plan_log(observed: &Observed<'_>, row: &Row, why_none: String, trying_for: Duration, windows: &Windows) -> LogPlan {
    let provider_function = row.provider_function;
    let settle =
        |state: LogState| LogPlan::Steps(Step::SettleWithoutLog { state: state.clone(), provider_function }, state);
    match &observed.archive {
        Archive::Unknown => LogPlan::LookAtArchive,
        Archive::Holds(state) => LogPlan::Settled(state.clone()),
        Archive::Empty => match observed.pod.as_ref().map_or(Err(why_none), log_source) {
            Err(why) => settle(LogState::NoLog(why)),
            Ok(()) => match &observed.log_read_error {
                None => LogPlan::Steps(Step::ArchivePodLog { provider_function }, LogState::Archived),
                Some(_) if trying_for < windows.archive_give_up => LogPlan::Retry(archive_backoff(trying_for)),
                Some(error) => {
                    settle(LogState::Lost(format!("{LOST_LOG} {} s, giving up: {error}", trying_for.as_secs())))
                }
            },
        },
    }
}

/// What to do about the observed job.
pub fn plan(observed: &Observed<'_>, windows: &Windows) -> Plan {
    if observed.deleting {
        return plan_cleanup(observed, windows);
    }
    let Some(row) = &observed.row else {
        return Plan::then(vec![Step::DeleteResource], Next::AwaitChange);
    };
    let job = observed.job;
    let job_id = job.spec.job_id.as_str();
    let previous = job.status.clone().unwrap_or_default();
    let now = observed.now;
    let pod = observed.pod.as_ref();
    let mut steps = Vec::new();
    let mut status = row.status;
    let mut message = observed.moved.as_ref().and_then(describe).or(previous.message.clone());
    // A pod seen going was made, even when the status write that would name it failed.
    let pod_created = previous.pod_name.is_some() || pod.is_some() || observed.gone_pod_started.is_some();
    let mut pod_named = pod_created;
    // With no pod: the uid of the current attempt's, seen going, else as the status names it.
    let current_uid = observed.gone_pod_uid.clone().or(previous.pod_uid.clone());
    let mut retries = previous.retries.clone();
    // Set while an ended attempt's pod goes or the next attempt waits for its backoff.
    let mut retry_wake = None;
    // Only an active job has attempts to come (a finished one's last pod is simply its pod).
    let stage = if pod_created && status.is_active() {
        retry::stage(&previous, pod, observed.gone_pod_started.is_some())
    } else {
        Stage::Current
    };
    if !previous.retries.is_empty() && pod.is_some_and(|p| p.metadata.uid != previous.pod_uid) {
        // The next attempt's pod, seen for the first time: the words of the retry are history
        // (they stay in `retries`).
        message = observed.moved.as_ref().and_then(describe);
    }

    if !pod_created && row.stop_requested && status.is_active() {
        // Stopped before its pod existed: nothing to stop but the job itself.
        if let Some((step, to, words)) = move_by(status, row.stop_trigger.clone(), message.clone()) {
            steps.push(step);
            status = to;
            message = words;
        }
    } else if status == JobStatus::Pending && !pod_created {
        // The status written below names it.
        steps.push(Step::CreatePod);
        pod_named = true;
    } else if let (Stage::OldPodPresent { .. } | Stage::AwaitingNextPod { .. }, true) =
        (&stage, row.stop_requested && status.is_active())
    {
        // Stopped between two attempts.
        if let Some((step, to, words)) = move_by(status, row.stop_trigger.clone(), message.clone()) {
            steps.push(step);
            status = to;
            message = words;
        }
    } else if let Stage::OldPodPresent { deleting } = stage {
        if !deleting {
            steps.push(Step::DeleteEndedPod);
        }
        retry_wake = Some(Duration::from_secs(1));
    } else if let (Stage::AwaitingNextPod { .. }, JobStatus::Queued) = (&stage, status) {
        // Queued again after a reclaim of backfill: its next pod waits for its admission.
    } else if let Stage::AwaitingNextPod { at } = stage {
        if now >= at {
            steps.push(Step::ClearAttempt);
            steps.push(Step::CreatePod);
            message = None;
        } else {
            retry_wake = Some(between(now, at).max(Duration::from_millis(100)));
        }
    } else if pod_created {
        let ran_before = previous.phase == Some(JobStatus::Running);
        let fault =
            retry::infrastructure_fault(status, row.stop_requested, pod, observed.gone_pod_started).map(|mut fault| {
                fault.code_started |= ran_before;
                fault
            });
        // Infrastructure retries made; the attempts include those queued again after a reclaim.
        let made = retries.iter().filter(|r| !r.requeued).count() as u32;
        let attempt = retries.len() as u32 + 1;
        let ended_uid = pod.and_then(|p| p.metadata.uid.clone()).or(current_uid.clone());
        let verdict = fault.map(|fault| {
            let verdict = retry::verdict(
                &fault,
                made,
                attempt,
                windows.infrastructure_retries,
                job.spec.retry_after_start,
                ended_uid.clone(),
                windows.retry_backoff,
                now,
            );
            (fault, verdict)
        });
        if let Some((_, Verdict::Retry(record))) = &verdict {
            let words = format!(
                "attempt {} ended ({}); attempt {} starts in {} s (retry {} of {})",
                record.attempt,
                record.reason,
                record.attempt + 1,
                between(now, record.next_attempt_at.0).as_secs(),
                made + 1,
                windows.infrastructure_retries
            );
            // Recorded in the database already when a crash came before the status write.
            if row.retries <= made {
                let note = Note { warning: true, reason: "Retrying".into(), message: Some(words.clone()) };
                steps.push(Step::RecordRetry { from: status, made, retry: record.clone(), note });
            }
            if pod.is_some_and(|p| p.metadata.deletion_timestamp.is_none()) {
                steps.push(Step::DeleteEndedPod);
            }
            retry_wake = Some(between(now, record.next_attempt_at.0).max(Duration::from_millis(100)));
            retries.push(record.clone());
            status = JobStatus::Pending;
            message = Some(words);
        } else if let Some((_, Verdict::Final(words))) = verdict {
            if let Some((step, to, words)) = move_by(status, Trigger::Lost { reason: words }, message.clone()) {
                steps.push(step);
                status = to;
                message = words;
            }
        } else {
            if row.stop_requested
                && !status.is_terminal()
                && pod.is_some_and(|p| p.metadata.deletion_timestamp.is_none())
            {
                steps.push(Step::StopPod);
            }
            // A deadline's figure is the job's own limit (the pods watched keep no spec).
            let trigger =
                pod_trigger(status, row.stop_requested, pod, now, windows.pending_deadline).map(|t| match t {
                    Trigger::TimedOut { .. } => Trigger::TimedOut { limit_secs: job.spec.timeout_seconds },
                    Trigger::StopRequested => row.stop_trigger.clone(),
                    other => other,
                });
            if let Some(trigger) = trigger
                && let Some((step, to, words)) = move_by(status, trigger, message.clone())
            {
                if to == JobStatus::Queued {
                    // A reclaimed backfill job queued again: this attempt's pod is history, the
                    // next one is made once it is admitted again (`Stage::AwaitingNextPod`).
                    retries.push(Retry {
                        attempt,
                        reason: words.clone().unwrap_or_default(),
                        code_started: true,
                        pod_uid: ended_uid,
                        ended_at: Time(now),
                        next_attempt_at: Time(now),
                        requeued: true,
                    });
                }
                steps.push(step);
                status = to;
                message = words;
            }
        }
    }

    let completed = match (status.is_terminal(), &previous.completion_time) {
        (true, Some(time)) => Some(time.0),
        (true, None) => Some(now),
        (false, _) => None,
    };
    let since_end = completed.map(|end| between(end, now)).unwrap_or_default();

    // Once finished: the log settled, the token deleted, the pod deleted after its keep window,
    // then the resource itself after its own. Each step is recorded in the status, so none is
    // repeated and a settled job costs no API call until it is collected.
    let mut logs = LogState::of(&previous);
    let mut archive_retry = None;
    if status.is_terminal() && !logs.settled() {
        let why_none = why_no_pod_log(status, message.as_deref(), pod_created);
        match plan_log(observed, row, why_none, since_end, windows) {
            LogPlan::LookAtArchive => return Plan::then(steps, Next::LookAtArchive),
            LogPlan::Settled(state) => logs = state,
            LogPlan::Steps(step, state) => {
                steps.push(step);
                logs = state;
            }
            LogPlan::Retry(after) => archive_retry = Some(after),
        }
    }
    let mut secret_deleted = condition_is(&previous, "SecretDeleted");
    if status.is_terminal() && !secret_deleted {
        steps.push(Step::DeleteSecret);
        secret_deleted = true;
    }
    let mut pod_deleted = condition_is(&previous, "PodDeleted");
    if status.is_terminal() && logs.settled() && !pod_deleted {
        match pod {
            None => pod_deleted = true,
            Some(found) if since_end >= windows.keep_finished_pods && found.metadata.deletion_timestamp.is_none() => {
                steps.push(Step::DeletePod);
            }
            // Being deleted (its watch event wakes the reconcile), or within its keep window.
            Some(_) => {}
        }
    }

    // Why it ended: the move made here, else the one stored (by the API's stop, a runner).
    let planned = steps.iter().rev().find_map(|step| match step {
        Step::Move { from, trigger, .. } => decide(*from, trigger).and_then(|m| m.reason().map(str::to_string)),
        _ => None,
    });
    let reason = planned.or_else(|| row.status_reason.clone()).filter(|_| status.is_terminal());
    let mut desired = resource_status(&Known {
        reason: reason.as_deref(),
        status,
        sub_status: row.sub_status.as_deref(),
        pod,
        logs: &logs,
        secret_deleted,
        pod_deleted,
        message: message.as_deref(),
        generation: job.metadata.generation,
        completed,
        previous: job.status.as_ref(),
        now,
        pod_uid: match stage {
            Stage::Current => pod.and_then(|p| p.metadata.uid.as_deref()).or(current_uid.as_deref()),
            _ => previous.pod_uid.as_deref(),
        },
        retries: &retries,
    });
    if desired.pod_name.is_none() && pod_named {
        desired.pod_name = Some(pod_name(job_id));
    }
    if job.status.as_ref() != Some(&desired) {
        steps.push(Step::WriteStatus(Box::new(desired)));
    }
    let settled = status.is_terminal() && logs.settled() && secret_deleted && pod_deleted;
    if settled && since_end >= windows.keep_finished_jobs {
        // History lives in the database and the object storage; the cluster keeps work in
        // flight and the recent past. The finalizer's cleanup finds everything settled.
        steps.push(Step::Collect);
        return Plan::then(steps, Next::AwaitChange);
    }
    let next = match status {
        JobStatus::Pending | JobStatus::Running if retry_wake.is_some() => {
            Next::Requeue(retry_wake.unwrap_or(Duration::from_secs(1)))
        }
        JobStatus::Queued => {
            steps.push(Step::WakeAdmission);
            Next::AwaitChange
        }
        // Pod changes wake it; the timer only catches a pod pending past the deadline, so it
        // is set for then, not every minute (which made 1,667 reconciles a second of 100,000
        // pending jobs: bench/controller.sh tenants). Past it, every change is judged at once.
        JobStatus::Pending => match until_overdue(pod, now, windows.pending_deadline) {
            Some(after) => Next::Requeue(after),
            None => Next::AwaitChange,
        },
        JobStatus::Running => Next::Requeue(Duration::from_secs(60)),
        _ => Next::Requeue(match archive_retry {
            Some(retry_after) => retry_after,
            // The pod's deletion is under way (its watch event wakes this; the timer is a net)
            // or its keep window runs.
            None if !pod_deleted => windows.keep_finished_pods.saturating_sub(since_end).max(Duration::from_secs(5)),
            None => windows.keep_finished_jobs.saturating_sub(since_end).max(Duration::from_secs(1)),
        }),
    };
    Plan::then(steps, next)
}

/// The resource is being deleted: settle the job row, the log and the token, delete the pod,
/// then let it go. A log that cannot be archived yet holds the resource until `archive_give_up`
/// after the deletion began; then it is given up as lost.
fn plan_cleanup(observed: &Observed<'_>, windows: &Windows) -> Plan {
    let job = observed.job;
    let previous = job.status.clone().unwrap_or_default();
    let pod = observed.pod.as_ref();
    let mut steps = Vec::new();
    if let Some(row) = &observed.row {
        let mut message = observed.moved.as_ref().and_then(describe).or(previous.message.clone());
        let mut status = row.status;
        // A finished job stays as it ended (`decide` refuses the move).
        if let Some((step, to, words)) = move_by(status, Trigger::Deleted, message.clone()) {
            steps.push(step);
            status = to;
            message = words;
        }
        if !LogState::of(&previous).settled() {
            let since =
                job.metadata.deletion_timestamp.as_ref().map(|t| between(t.0, observed.now)).unwrap_or_default();
            let pod_made = previous.pod_name.is_some() || pod.is_some();
            let why_none = why_no_pod_log(status, message.as_deref(), pod_made);
            match plan_log(observed, row, why_none, since, windows) {
                LogPlan::LookAtArchive => return Plan::then(steps, Next::LookAtArchive),
                LogPlan::Settled(_) => {}
                LogPlan::Steps(step, _) => steps.push(step),
                LogPlan::Retry(after) => return Plan::then(steps, Next::HoldFinalizer(after)),
            }
        }
    }
    if !condition_is(&previous, "SecretDeleted") {
        steps.push(Step::DeleteSecret);
    }
    if pod.is_some() {
        steps.push(Step::DeletePod);
    }
    Plan::then(steps, Next::AwaitChange)
}

#[cfg(test)]
mod tests;
