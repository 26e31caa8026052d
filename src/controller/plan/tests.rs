//! One table of the ways a job can be found, with the plan each gets.

use super::*;
use JobStatus::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

const JOB_ID: &str = "0f2c0000-0000-4000-8000-000000000001";

const WINDOWS: Windows = Windows {
    pending_deadline: Duration::from_secs(600),
    keep_finished_pods: Duration::from_secs(60),
    keep_finished_jobs: Duration::from_secs(3600),
    archive_give_up: Duration::from_secs(600),
    infrastructure_retries: 2,
    retry_backoff: Duration::from_secs(5),
};

fn now() -> Timestamp {
    "2026-01-01T01:00:00Z".parse().unwrap()
}

/// `seconds` before now, as the API writes times.
fn ago(seconds: i64) -> String {
    (now() - k8s_openapi::jiff::SignedDuration::from_secs(seconds)).to_string()
}

/// A resource with the given status (`Value::Null`: none yet); deleted `deleting` s ago.
fn resource(status: Value, stop: bool, deleting: Option<i64>) -> FunctionJob {
    let mut metadata = json!({"name": JOB_ID, "namespace": "default", "generation": 1});
    if let Some(seconds) = deleting {
        metadata["deletionTimestamp"] = json!(ago(seconds));
    }
    serde_json::from_value(json!({
        "apiVersion": "gantry.dev/v1alpha1", "kind": "FunctionJob", "metadata": metadata,
        "spec": {"jobId": JOB_ID, "function": {"title": "fn"}, "artifact": "a.tar", "entrypoint": "main.py",
                 "timeoutSeconds": 3600, "user": "alice", "secretName": format!("gantry-job-{JOB_ID}"),
                 "stopRequested": stop},
        "status": status,
    }))
    .unwrap()
}

/// A status as a controller wrote it: the phase, whether a pod was made, when the job ended,
/// and the conditions that are true (type, reason).
fn written(phase: &str, pod: bool, ended: Option<i64>, conditions: &[(&str, &str)]) -> Value {
    let mut status = json!({"phase": phase, "observedGeneration": 1, "logsArchived": false, "conditions": []});
    if pod {
        status["podName"] = json!(format!("gantry-job-{JOB_ID}"));
    }
    if let Some(seconds) = ended {
        status["completionTime"] = json!(ago(seconds));
    }
    for (kind, reason) in conditions {
        if *kind == "LogsArchived" {
            status["logsArchived"] = json!(true);
        }
        status["conditions"].as_array_mut().unwrap().push(json!({"type": kind, "status": "True", "reason": reason,
            "message": "", "lastTransitionTime": ago(3600)}));
    }
    status
}

/// A pod made 10 minutes ago with this status (`deleting`: its deletion began).
fn pod(status: Value, deleting: bool) -> Pod {
    let mut metadata = json!({"name": format!("gantry-job-{JOB_ID}"), "creationTimestamp": ago(600)});
    if deleting {
        metadata["deletionTimestamp"] = json!(ago(1));
    }
    serde_json::from_value(json!({"metadata": metadata, "status": status})).unwrap()
}

fn job_container(state: Value) -> Value {
    json!([{"name": "job", "image": "runner:1", "imageID": "", "ready": false, "restartCount": 0, "state": state}])
}

fn running() -> Pod {
    pod(
        json!({"phase": "Running", "startTime": ago(300), "containerStatuses": job_container(json!({"running": {}}))}),
        false,
    )
}

fn ended(phase: &str, reason: Option<&str>, exit_code: i32, why: &str) -> Pod {
    let terminated = json!({"terminated": {"exitCode": exit_code, "reason": why}});
    let mut status = json!({"phase": phase, "startTime": ago(300), "containerStatuses": job_container(terminated)});
    if let Some(reason) = reason {
        status["reason"] = json!(reason);
    }
    pod(status, false)
}

fn succeeded() -> Pod {
    ended("Succeeded", None, 0, "Completed")
}

fn row(status: JobStatus, stop_requested: bool) -> Option<Row> {
    Some(Row {
        status,
        sub_status: None,
        stop_requested,
        provider_function: false,
        retries: 0,
        status_reason: None,
        stop_trigger: Trigger::StopRequested,
    })
}

/// One way a job can be found.
struct Case {
    name: &'static str,
    job: FunctionJob,
    row: Option<Row>,
    pod: Option<Pod>,
    /// With no pod: whether the pod watch saw it go before its code started (`Some(false)`,
    /// the default when the status names a pod), after (`Some(true)`), or never saw it go
    /// (`None`, the default when it names none).
    gone_started: Option<CodeStarted>,
    /// The uid of the pod seen going, when the case names it.
    gone_uid: Option<&'static str>,
    archive: Archive,
    log_read_error: bool,
    steps: &'static [&'static str],
    next: &'static str,
}

fn case(name: &'static str, job: FunctionJob, row: Option<Row>, pod: Option<Pod>) -> Case {
    // A pod the status names was seen going before its code started; one it does not name was
    // never seen; an ended attempt's is not reported (the reconcile leaves it out).
    let status = job.status.as_ref().filter(|status| status.pod_name.is_some());
    let went = status.map(|status| (status.pod_uid.clone(), CodeStarted::No));
    let gone_started = retry::gone_of_current_attempt(status, went).map(|(_, started)| started);
    Case {
        name,
        job,
        row,
        pod,
        gone_started,
        gone_uid: None,
        archive: Archive::Unknown,
        log_read_error: false,
        steps: &[],
        next: "",
    }
}

impl Case {
    fn gone(self, gone_started: Option<CodeStarted>) -> Case {
        Case { gone_started, ..self }
    }

    /// Made, then gone before the watch or the status named it: seen gone by the reconcile.
    fn went_unseen(self, uid: &'static str) -> Case {
        Case { gone_started: Some(CodeStarted::NotKnown), gone_uid: Some(uid), ..self }
    }

    fn archive(self, archive: Archive) -> Case {
        Case { archive, ..self }
    }

    fn read_fails(self) -> Case {
        Case { log_read_error: true, ..self }
    }

    fn gives(self, steps: &'static [&'static str], next: &'static str) -> Case {
        Case { steps, next, ..self }
    }

    fn observed(&self) -> Observed<'_> {
        Observed {
            job: &self.job,
            deleting: self.job.metadata.deletion_timestamp.is_some(),
            row: self.row.clone(),
            pod: self.pod.clone(),
            gone_pod_started: self.gone_started,
            gone_pod_uid: self.gone_uid.map(str::to_string),
            archive: self.archive.clone(),
            log_read_error: self.log_read_error.then(|| "the log request was refused".into()),
            moved: None,
            now: now(),
        }
    }
}

fn step_words(step: &Step) -> String {
    match step {
        Step::DeleteResource => "delete resource".into(),
        Step::Move { from, to, note, .. } => {
            format!("move {from}→{to}{}", if note.warning { " (warning)" } else { "" })
        }
        Step::CreatePod => "create pod".into(),
        Step::StopPod => "stop pod".into(),
        Step::ArchivePodLog { .. } => "archive pod log".into(),
        Step::SettleWithoutLog { state: LogState::Lost(_), .. } => "lost log".into(),
        Step::SettleWithoutLog { .. } => "no log".into(),
        Step::DeleteSecret => "delete secret".into(),
        Step::DeletePod => "delete pod".into(),
        Step::WriteStatus(status) => format!("write {}", status.phase.map(JobStatus::as_str).unwrap_or("-")),
        Step::Collect => "collect".into(),
        Step::WakeAdmission => "wake admission".into(),
        Step::RecordRetry { from, retry, .. } => format!("record retry {} from {from}", retry.attempt),
        Step::DeleteEndedPod => "delete ended pod".into(),
        Step::ClearAttempt => "clear attempt".into(),
    }
}

fn next_words(next: Next) -> String {
    match next {
        Next::Requeue(after) => format!("requeue {} s", after.as_secs()),
        Next::AwaitChange => "await change".into(),
        Next::LookAtArchive => "look at archive".into(),
        Next::HoldFinalizer(after) => format!("hold {} s", after.as_secs()),
    }
}

#[test]
fn every_way_a_job_can_be_found_has_its_plan() {
    let none = Value::Null;
    let pending = || written("PENDING", true, None, &[]);
    let running_status = || written("RUNNING", true, None, &[]);
    let settled = |ended: i64| {
        written("SUCCEEDED", true, Some(ended), &[("LogsArchived", "Archived"), ("SecretDeleted", "JobFinished")])
    };
    let archived = || Archive::Holds(LogState::Archived);
    let unschedulable = |created_ago: i64| {
        let mut pod = pod(
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                   "reason": "Unschedulable", "message": "0/3 nodes fit"}]}),
            false,
        );
        pod.metadata.creation_timestamp = Some(Time(now() - k8s_openapi::jiff::SignedDuration::from_secs(created_ago)));
        pod
    };
    let pull_fails = pod(
        json!({"phase": "Pending", "containerStatuses": job_container(json!({"waiting": {"reason": "ErrImagePull", "message": "denied"}}))}),
        false,
    );
    let cases = [
        // Before the pod.
        case("no job row", resource(none.clone(), false, None), None, None).gives(&["delete resource"], "await change"),
        case("queued", resource(none.clone(), false, None), row(Queued, false), None)
            .gives(&["write QUEUED", "wake admission"], "await change"),
        // The pending deadline (600 s) from the pod made now, and a second.
        case("admitted", resource(none.clone(), false, None), row(Pending, false), None)
            .gives(&["create pod", "write PENDING"], "requeue 601 s"),
        case("stopped while queued", resource(none.clone(), true, None), row(Queued, true), None)
            .gives(&["move QUEUED→STOPPED"], "look at archive"),
        case("stopped while queued, archive looked at", resource(none.clone(), true, None), row(Stopped, true), None)
            .archive(Archive::Empty)
            .gives(&["no log", "delete secret", "write STOPPED"], "requeue 3600 s"),
        case(
            "stopped before its pod was made",
            resource(written("PENDING", false, None, &[]), true, None),
            row(Pending, true),
            None,
        )
        .gives(&["move PENDING→STOPPED"], "look at archive"),
        // Each way a pod can be.
        case(
            "pod made, not started",
            resource(pending(), false, None),
            row(Pending, false),
            Some(pod(json!({"phase": "Pending"}), false)),
        )
        // Made 600 s ago: past the deadline, every change of the pod is judged when it comes.
        .gives(&["write PENDING"], "await change"),
        case("pod started", resource(pending(), false, None), row(Pending, false), Some(running()))
            .gives(&["move PENDING→RUNNING", "write RUNNING"], "requeue 60 s"),
        case("pod running, nothing new", resource(running_status(), false, None), row(Running, false), Some(running()))
            .gives(&["write RUNNING"], "requeue 60 s"),
        case("pod succeeded", resource(running_status(), false, None), row(Running, false), Some(succeeded()))
            .gives(&["move RUNNING→SUCCEEDED"], "look at archive"),
        case(
            "pod failed with an exit code",
            resource(running_status(), false, None),
            row(Running, false),
            Some(ended("Failed", None, 3, "Error")),
        )
        .gives(&["move RUNNING→FAILED (warning)"], "look at archive"),
        case(
            "pod out of memory",
            resource(running_status(), false, None),
            row(Running, false),
            Some(ended("Failed", None, 137, "OOMKilled")),
        )
        .gives(&["move RUNNING→FAILED (warning)"], "look at archive"),
        case(
            "pod past its deadline",
            resource(running_status(), false, None),
            row(Running, false),
            Some(ended("Failed", Some("DeadlineExceeded"), 137, "Error")),
        )
        .gives(&["move RUNNING→STOPPED"], "look at archive"),
        case(
            "pod evicted",
            resource(running_status(), false, None),
            row(Running, false),
            Some(ended("Failed", Some("Evicted"), 137, "Error")),
        )
        .gives(&["move RUNNING→FAILED (warning)"], "look at archive"),
        case("pod vanished", resource(running_status(), false, None), row(Running, false), None)
            .gives(&["move RUNNING→FAILED (warning)"], "look at archive"),
        case(
            "pod deleted while it ran",
            resource(running_status(), false, None),
            row(Running, false),
            Some(pod(json!({"phase": "Running"}), true)),
        )
        .gives(&["move RUNNING→FAILED (warning)"], "look at archive"),
        case("image cannot be pulled", resource(pending(), false, None), row(Pending, false), Some(pull_fails))
            .gives(&["move PENDING→FAILED (warning)"], "look at archive"),
        case(
            "unschedulable within the deadline",
            resource(pending(), false, None),
            row(Pending, false),
            Some(unschedulable(60)),
        )
        // Woken when the deadline is past.
        .gives(&["write PENDING"], "requeue 541 s"),
        case(
            "unschedulable past the deadline",
            resource(pending(), false, None),
            row(Pending, false),
            Some(unschedulable(700)),
        )
        .gives(&["move PENDING→FAILED (warning)"], "look at archive"),
        case(
            "stop requested while it runs",
            resource(running_status(), true, None),
            row(Running, true),
            Some(running()),
        )
        .gives(&["stop pod", "write RUNNING"], "requeue 60 s"),
        case(
            "stopped pod ended",
            resource(running_status(), true, None),
            row(Running, true),
            Some(ended("Failed", None, 143, "Error")),
        )
        .gives(&["stop pod", "move RUNNING→STOPPED"], "look at archive"),
        // Settling a finished job's log.
        case(
            "finished, log shipped",
            resource(running_status(), false, None),
            row(Succeeded, false),
            Some(succeeded()),
        )
        .archive(archived())
        .gives(&["delete secret", "write SUCCEEDED"], "requeue 60 s"),
        case(
            "finished, log to archive from the pod",
            resource(running_status(), false, None),
            row(Succeeded, false),
            Some(succeeded()),
        )
        .archive(Archive::Empty)
        .gives(&["archive pod log", "delete secret", "write SUCCEEDED"], "requeue 60 s"),
        case(
            "finished, pod log unreadable for now",
            resource(written("SUCCEEDED", true, Some(30), &[]), false, None),
            row(Succeeded, false),
            Some(succeeded()),
        )
        .archive(Archive::Empty)
        .read_fails()
        .gives(&["delete secret", "write SUCCEEDED"], "requeue 30 s"),
        case(
            "finished, pod log unreadable past the give-up",
            resource(written("SUCCEEDED", true, Some(700), &[("SecretDeleted", "JobFinished")]), false, None),
            row(Succeeded, false),
            Some(succeeded()),
        )
        .archive(Archive::Empty)
        .read_fails()
        .gives(&["lost log", "delete pod", "write SUCCEEDED"], "requeue 5 s"),
        case(
            "finished, container never ran",
            resource(pending(), false, None),
            row(Failed, false),
            Some(ended("Failed", None, 128, "StartError")),
        )
        .archive(Archive::Empty)
        .gives(&["no log", "delete secret", "write FAILED"], "requeue 60 s"),
        case("finished, note stored before a crash", resource(running_status(), false, None), row(Failed, false), None)
            .archive(Archive::Holds(LogState::NoLog("never started".into())))
            .gives(&["delete secret", "write FAILED"], "requeue 3600 s"),
        // Collection windows (the statuses written here lack conditions a controller writes).
        case(
            "settled, pod within its keep window",
            resource(settled(10), false, None),
            row(Succeeded, false),
            Some(succeeded()),
        )
        .gives(&["write SUCCEEDED"], "requeue 50 s"),
        case(
            "settled, pod past its keep window",
            resource(settled(90), false, None),
            row(Succeeded, false),
            Some(succeeded()),
        )
        .gives(&["delete pod", "write SUCCEEDED"], "requeue 5 s"),
        case(
            "settled, pod being deleted",
            resource(settled(90), false, None),
            row(Succeeded, false),
            Some(pod(json!({"phase": "Succeeded"}), true)),
        )
        .gives(&["write SUCCEEDED"], "requeue 5 s"),
        case(
            "settled, pod gone, resource within its keep window",
            resource(settled(90), false, None),
            row(Succeeded, false),
            None,
        )
        .gives(&["write SUCCEEDED"], "requeue 3510 s"),
        case(
            "settled, resource past its keep window",
            resource(settled(4000), false, None),
            row(Succeeded, false),
            None,
        )
        .gives(&["write SUCCEEDED", "collect"], "await change"),
        // Deletion (the finalizer's cleanup).
        case("deleted while queued", resource(none.clone(), false, Some(1)), row(Queued, false), None)
            .gives(&["move QUEUED→STOPPED"], "look at archive"),
        case("deleted while running, pod gone", resource(running_status(), false, Some(1)), row(Running, false), None)
            .archive(Archive::Empty)
            .gives(&["move RUNNING→STOPPED", "no log", "delete secret"], "await change"),
        case(
            "deleted, pod log unreadable for now",
            resource(written("SUCCEEDED", true, Some(30), &[]), false, Some(20)),
            row(Succeeded, false),
            Some(succeeded()),
        )
        .archive(Archive::Empty)
        .read_fails()
        .gives(&[], "hold 20 s"),
        case(
            "deleted, pod log unreadable past the give-up",
            resource(written("SUCCEEDED", true, Some(900), &[]), false, Some(700)),
            row(Succeeded, false),
            Some(succeeded()),
        )
        .archive(Archive::Empty)
        .read_fails()
        .gives(&["lost log", "delete secret", "delete pod"], "await change"),
        case("deleted when settled", resource(settled(90), false, Some(1)), row(Succeeded, false), Some(succeeded()))
            .gives(&["delete pod"], "await change"),
        case("deleted, job row gone", resource(settled(90), false, Some(1)), None, None).gives(&[], "await change"),
    ];
    assert!(cases.len() >= 20);
    let mut wrong = Vec::new();
    for case in &cases {
        let plan = plan(&case.observed(), &WINDOWS);
        let steps: Vec<String> = plan.steps.iter().map(step_words).collect();
        let next = next_words(plan.next);
        if steps != case.steps || next != case.next {
            wrong.push(format!("{}: {steps:?} then {next}, expected {:?} then {}", case.name, case.steps, case.next));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A status of a job with `retries` recorded (attempt, ended pod's uid, next attempt `next_in`
/// seconds from now), the current attempt's pod uid `pod_uid`.
fn retried(phase: &str, retries: &[(u32, &str)], next_in: i64, pod_uid: &str) -> Value {
    let mut status = written(phase, true, None, &[]);
    status["podUid"] = json!(pod_uid);
    let next = (now() + k8s_openapi::jiff::SignedDuration::from_secs(next_in)).to_string();
    status["retries"] = retries
        .iter()
        .map(|(attempt, uid)| {
            json!({"attempt": attempt, "reason": "the job's pod was ended by the cluster (Evicted): low", "codeStarted": false,
                   "podUid": uid, "endedAt": ago(1), "nextAttemptAt": next})
        })
        .collect();
    status
}

fn with_uid(mut pod: Pod, uid: &str) -> Pod {
    pod.metadata.uid = Some(uid.into());
    pod
}

fn opted_in(mut job: FunctionJob) -> FunctionJob {
    job.spec.retry_after_start = true;
    job
}

#[test]
fn what_the_cluster_ended_is_retried_within_the_bound() {
    let evicted_early = || {
        let waiting = job_container(json!({"waiting": {"reason": "ContainerCreating"}}));
        pod(json!({"phase": "Failed", "reason": "Evicted", "message": "low", "containerStatuses": waiting}), false)
    };
    let evicted_late = || ended("Failed", Some("Evicted"), 143, "Error");
    let pending = || written("PENDING", true, None, &[]);
    let running_status = || written("RUNNING", true, None, &[]);
    let mut recorded_before_crash = row(Pending, false).unwrap();
    recorded_before_crash.retries = 1;
    let cases = [
        case(
            "evicted before its code started",
            resource(pending(), false, None),
            row(Pending, false),
            Some(with_uid(evicted_early(), "u1")),
        )
        .gives(&["record retry 1 from PENDING", "delete ended pod", "write PENDING"], "requeue 5 s"),
        case(
            "evicted after its code started",
            resource(running_status(), false, None),
            row(Running, false),
            Some(evicted_late()),
        )
        .gives(&["move RUNNING→FAILED (warning)"], "look at archive"),
        case(
            "evicted after its code started, opted in",
            opted_in(resource(running_status(), false, None)),
            row(Running, false),
            Some(with_uid(evicted_late(), "u1")),
        )
        .gives(&["record retry 1 from RUNNING", "delete ended pod", "write PENDING"], "requeue 5 s"),
        case("vanished before its code started", resource(pending(), false, None), row(Pending, false), None)
            .gives(&["record retry 1 from PENDING", "write PENDING"], "requeue 5 s"),
        // Seen running by the watch as it went, before RUNNING was recorded: its code may have
        // run, so it is not run again unasked.
        case(
            "vanished after its code started, before RUNNING",
            resource(pending(), false, None),
            row(Pending, false),
            None,
        )
        .gone(Some(CodeStarted::Yes))
        .gives(&["move PENDING→FAILED (warning)"], "look at archive"),
        case(
            "vanished after its code started, opted in",
            opted_in(resource(pending(), false, None)),
            row(Pending, false),
            None,
        )
        .gone(Some(CodeStarted::Yes))
        .gives(&["record retry 1 from PENDING", "write PENDING"], "requeue 5 s"),
        // Made by a reconcile whose status write failed, then seen going: it was made.
        case(
            "made, unrecorded, vanished after its code started",
            resource(written("PENDING", false, None, &[]), false, None),
            row(Pending, false),
            None,
        )
        .gone(Some(CodeStarted::Yes))
        .gives(&["move PENDING→FAILED (warning)"], "look at archive"),
        case(
            "made, unrecorded, vanished before its code started",
            resource(written("PENDING", false, None, &[]), false, None),
            row(Pending, false),
            None,
        )
        .gone(Some(CodeStarted::No))
        .gives(&["record retry 1 from PENDING", "write PENDING"], "requeue 5 s"),
        case("vanished while no controller watched", resource(pending(), false, None), row(Pending, false), None)
            .gone(None)
            .gives(&["move PENDING→FAILED (warning)"], "look at archive"),
        // Missing from a relist, last seen pending: it may have started in the watch's gap.
        case("vanished while the watch was away", resource(pending(), false, None), row(Pending, false), None)
            .gone(Some(CodeStarted::NotKnown))
            .gives(&["move PENDING→FAILED (warning)"], "look at archive"),
        case(
            "recorded in the database before a crash",
            resource(pending(), false, None),
            Some(recorded_before_crash),
            Some(with_uid(evicted_early(), "u1")),
        )
        .gives(&["delete ended pod", "write PENDING"], "requeue 5 s"),
        case(
            "the ended pod is still there",
            resource(retried("PENDING", &[(1, "u1")], 5, "u1"), false, None),
            row(Pending, false),
            Some(with_uid(evicted_early(), "u1")),
        )
        .gives(&["delete ended pod", "write PENDING"], "requeue 1 s"),
        case(
            "the ended pod is going",
            resource(retried("PENDING", &[(1, "u1")], 5, "u1"), false, None),
            row(Pending, false),
            Some(with_uid(pod(json!({"phase": "Failed", "reason": "Evicted"}), true), "u1")),
        )
        .gives(&["write PENDING"], "requeue 1 s"),
        case(
            "the next attempt waits for its backoff",
            resource(retried("PENDING", &[(1, "u1")], 5, "u1"), false, None),
            row(Pending, false),
            None,
        )
        .gives(&["write PENDING"], "requeue 5 s"),
        case(
            "the next attempt is due",
            resource(retried("PENDING", &[(1, "u1")], -1, "u1"), false, None),
            row(Pending, false),
            None,
        )
        .gives(&["clear attempt", "create pod", "write PENDING"], "requeue 601 s"),
        case(
            "the next attempt's pod runs",
            resource(retried("PENDING", &[(1, "u1")], -1, "u1"), false, None),
            row(Pending, false),
            Some(with_uid(running(), "u2")),
        )
        .gives(&["move PENDING→RUNNING", "write RUNNING"], "requeue 60 s"),
        case(
            "the next attempt's pod vanished",
            resource(retried("PENDING", &[(1, "u1")], -1, "u2"), false, None),
            row(Pending, false),
            None,
        )
        .gives(&["record retry 2 from PENDING", "write PENDING"], "requeue 10 s"),
        case(
            "the next attempt's pod came and went before the status named it",
            resource(retried("PENDING", &[(1, "u1")], -1, "u1"), false, None),
            row(Pending, false),
            None,
        )
        .went_unseen("u2")
        .gives(&["move PENDING→FAILED (warning)"], "look at archive"),
        case(
            "the next attempt's pod came and went unseen, opted in",
            opted_in(resource(retried("PENDING", &[(1, "u1")], -1, "u1"), false, None)),
            row(Pending, false),
            None,
        )
        .went_unseen("u2")
        .gives(&["record retry 2 from PENDING", "write PENDING"], "requeue 10 s"),
        case(
            "the first pod came and went before the status named it",
            resource(written("PENDING", false, None, &[]), false, None),
            row(Pending, false),
            None,
        )
        .went_unseen("u1")
        .gives(&["move PENDING→FAILED (warning)"], "look at archive"),
        case(
            "retries exhausted",
            resource(retried("PENDING", &[(1, "u1"), (2, "u2")], -1, "u3"), false, None),
            Some(Row { retries: 2, ..row(Pending, false).unwrap() }),
            Some(with_uid(evicted_early(), "u3")),
        )
        .gives(&["move PENDING→FAILED (warning)"], "look at archive"),
        case(
            "stopped between attempts, settled without a next pod",
            resource(retried("STOPPED", &[(1, "u1")], -1, "u1"), true, None),
            row(Stopped, true),
            None,
        )
        .archive(Archive::Empty)
        .gives(&["no log", "delete secret", "write STOPPED"], "requeue 3600 s"),
        case(
            "stopped between attempts",
            resource(retried("PENDING", &[(1, "u1")], 5, "u1"), true, None),
            row(Pending, true),
            None,
        )
        .gives(&["move PENDING→STOPPED"], "look at archive"),
    ];
    let mut wrong = Vec::new();
    for case in &cases {
        let plan = plan(&case.observed(), &WINDOWS);
        let steps: Vec<String> = plan.steps.iter().map(step_words).collect();
        let next = next_words(plan.next);
        if steps != case.steps || next != case.next {
            wrong.push(format!("{}: {steps:?} then {next}, expected {:?} then {}", case.name, case.steps, case.next));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The exhausted job's words: the last attempt's reason and the count.
    let exhausted = cases.iter().find(|case| case.name == "retries exhausted").unwrap();
    let plan = plan(&exhausted.observed(), &WINDOWS);
    let Step::Move { note, .. } = &plan.steps[0] else { panic!("{plan:?}") };
    assert!(note.message.as_deref().unwrap().ends_with("(Evicted): low after 3 attempts"), "{note:?}");
    // A pod that went unseen is the attempt that ended: recorded by its uid, so the next
    // reconcile waits for attempt 3 instead of counting the same pod's going again.
    let unseen = cases.iter().find(|case| case.name.ends_with("came and went unseen, opted in")).unwrap();
    let unseen_plan = super::plan(&unseen.observed(), &WINDOWS);
    let Some(Step::WriteStatus(status)) = unseen_plan.steps.last() else { panic!("{unseen_plan:?}") };
    assert_eq!(status.pod_uid.as_deref(), Some("u2"));
    assert_eq!(status.retries.last().and_then(|retry| retry.pod_uid.as_deref()), Some("u2"));
    assert!(status.message.as_deref().unwrap().contains("whether its code had started is not known"), "{status:?}");
}

#[test]
fn a_status_already_written_is_not_written_again() {
    let first = case(
        "running",
        resource(written("PENDING", true, None, &[]), false, None),
        row(Pending, false),
        Some(running()),
    );
    let Some(Step::WriteStatus(status)) = plan(&first.observed(), &WINDOWS).steps.pop() else { panic!("no status") };
    assert_eq!(status.phase, Some(Running));
    assert_eq!(status.pod_name.as_deref(), Some(format!("gantry-job-{JOB_ID}").as_str()));
    let again = case(
        "again",
        resource(serde_json::to_value(&status).unwrap(), false, None),
        row(Running, false),
        Some(running()),
    );
    let plan = plan(&again.observed(), &WINDOWS);
    assert_eq!(plan.steps, [], "nothing changed, nothing written");
    assert_eq!(plan.next, Next::Requeue(Duration::from_secs(60)));
}

#[test]
fn a_move_made_earlier_in_the_reconcile_gives_the_status_its_words() {
    let crashed = case(
        "crashed",
        resource(written("RUNNING", true, None, &[]), false, None),
        row(Running, false),
        Some(ended("Failed", None, 137, "OOMKilled")),
    );
    let Step::Move { trigger, note, .. } = &plan(&crashed.observed(), &WINDOWS).steps[0] else { panic!("no move") };
    assert!(note.message.as_deref().is_some_and(|m| m.contains("out of memory")), "{note:?}");
    // Planned again after the move and a look at the archive: the status says why.
    let mut after = crashed.observed();
    after.row = row(Failed, false);
    after.moved = Some(trigger.clone());
    after.archive = Archive::Holds(LogState::Archived);
    let plan = plan(&after, &WINDOWS);
    let Some(Step::WriteStatus(status)) = plan.steps.iter().find(|s| matches!(s, Step::WriteStatus(_))) else {
        panic!("{plan:?}")
    };
    assert!(status.message.as_deref().is_some_and(|m| m.contains("out of memory")), "{status:?}");
    assert_eq!(status.completion_time.as_ref().map(|t| t.0), Some(now()));
}

#[test]
fn a_job_without_a_pod_says_why_it_has_no_log() {
    let stopped = case("stopped", resource(Value::Null, true, None), row(Stopped, true), None).archive(Archive::Empty);
    let steps = plan(&stopped.observed(), &WINDOWS).steps;
    let Step::SettleWithoutLog { state: LogState::NoLog(why), .. } = &steps[0] else { panic!("{steps:?}") };
    assert_eq!(why, "the job ended STOPPED before its pod was made");
    let lost = case(
        "lost",
        resource(written("SUCCEEDED", true, Some(700), &[]), false, None),
        row(Succeeded, false),
        Some(succeeded()),
    )
    .archive(Archive::Empty)
    .read_fails();
    let steps = plan(&lost.observed(), &WINDOWS).steps;
    let Step::SettleWithoutLog { state: LogState::Lost(why), .. } = &steps[0] else { panic!("{steps:?}") };
    assert!(why.starts_with(LOST_LOG) && why.contains("700 s") && why.contains("refused"), "{why}");
}

#[test]
fn the_pod_is_asked_for_only_when_the_watch_may_lag() {
    let recorded = serde_json::from_value(written("PENDING", true, None, &[])).unwrap();
    let gone = serde_json::from_value(written("SUCCEEDED", true, Some(9), &[("PodDeleted", "Gone")])).unwrap();
    assert!(!ask_for_pod(None, row(Queued, false).as_ref(), false), "queued jobs have no pod");
    assert!(!ask_for_pod(None, row(Pending, false).as_ref(), false), "about to get one");
    assert!(ask_for_pod(Some(&recorded), row(Pending, false).as_ref(), false));
    assert!(ask_for_pod(None, row(Pending, true).as_ref(), false), "a stop needs the pod");
    assert!(ask_for_pod(None, row(Running, false).as_ref(), false));
    assert!(!ask_for_pod(Some(&gone), row(Succeeded, false).as_ref(), false), "gone for good");
    assert!(!ask_for_pod(None, None, false), "no job, no pod");
    assert!(ask_for_pod(None, None, true), "a deleted resource's pod is deleted");
    assert!(!ask_for_pod(Some(&gone), None, true));
}

#[test]
fn retries_of_an_unreadable_log_double_up_to_a_minute() {
    assert_eq!(archive_backoff(Duration::ZERO), Duration::from_secs(1));
    assert_eq!(archive_backoff(Duration::from_secs(8)), Duration::from_secs(8));
    assert_eq!(archive_backoff(Duration::from_secs(900)), Duration::from_secs(60));
}

/// A backfill job reclaimed by a tenant, whose function allows retries after start: queued
/// again once its pod ended, the attempt kept as `requeued` (no infrastructure retry), its next
/// pod made only once it is admitted again.
#[test]
fn a_reclaimed_backfill_job_is_queued_again_and_gets_a_new_pod_once_admitted() {
    let planned = |found: &Case| {
        let made = plan(&found.observed(), &WINDOWS);
        let steps: Vec<String> = made.steps.iter().map(step_words).collect();
        (steps, next_words(made.next), made.steps)
    };
    let written_status = |steps: &[Step]| {
        steps.iter().rev().find_map(|step| match step {
            Step::WriteStatus(status) => Some(serde_json::to_value(status.as_ref()).unwrap()),
            _ => None,
        })
    };
    let opted_in_with = |status: Value, stop: bool| opted_in(resource(status, stop, None));
    let mut reclaimed = row(Running, true).unwrap();
    reclaimed.stop_trigger = Trigger::Preempted { tenant: "provider:acme".into(), requeue: true };
    let stopped_pod = with_uid(ended("Failed", None, 143, "Error"), "u1");
    let running = opted_in_with(written("RUNNING", true, None, &[]), true);
    let (steps, next, made) = planned(&case("its pod ended", running, Some(reclaimed), Some(stopped_pod)));
    assert_eq!(steps, ["stop pod", "move RUNNING→QUEUED", "write QUEUED", "wake admission"]);
    assert_eq!(next, "await change");
    let queued_status = written_status(&made).unwrap();
    let attempt = &queued_status["retries"][0];
    assert_eq!(
        (&attempt["attempt"], &attempt["requeued"], &attempt["podUid"]),
        (&json!(1), &json!(true), &json!("u1"))
    );
    assert!(attempt["reason"].as_str().unwrap().contains("queued again"), "{attempt}");

    // Queued, its pod gone: nothing is made before its admission.
    let queued = opted_in_with(queued_status, false);
    let (steps, next, _) = planned(&case("queued again", queued.clone(), row(Queued, false), None));
    assert_eq!((steps, next), (vec!["wake admission".to_string()], "await change".to_string()));
    // Admitted again: the last attempt's objects cleared, a new pod made.
    let (steps, _, made) = planned(&case("admitted again", queued, row(Pending, false), None));
    assert_eq!(steps, ["clear attempt", "create pod", "write PENDING"]);
    // Evicted on its new pod: infrastructure retry 1 of the job's attempt 2 (the reclaim is none).
    let mut second_status = written_status(&made).unwrap();
    second_status["podUid"] = json!("u2");
    let evicted = with_uid(ended("Failed", Some("Evicted"), 143, "Error"), "u2");
    let (_, _, made) =
        planned(&case("evicted", opted_in_with(second_status, false), row(Running, false), Some(evicted)));
    let retry = made.iter().find_map(|step| match step {
        Step::RecordRetry { made, retry, .. } => Some((*made, retry.attempt)),
        _ => None,
    });
    assert_eq!(retry, Some((0, 2)), "{made:?}");
}
