//! Every way a job's pod can end, driven through the API server and kubelet doubles with the
//! real controller: the job's final status with a reason a user can act on (in the API, the
//! FunctionJob's status and a Kubernetes Event), the log archived or an explicit `no log: <why>`,
//! the pod and the Secret gone, and not one more API call about the job once it settled. Then
//! the finalizer holding a resource whose log cannot be archived, and the collection of finished
//! resources.

use std::time::Duration;

use gantry::crd::{pod_name, secret_name};
use serde_json::{Value, json};

use crate::controller::{Cluster, MAIN, NAMESPACE};
use crate::doubles::kube_double::{ApiServer, Kind};
use crate::doubles::kubelet_double::Fault;
use crate::eventually::{eventually, until};
use crate::harness::{Backend, Gateway};

/// Prints a line, then sleeps until something ends it.
const SLEEPER: &str = "import time\nprint('[PUBLIC] started', flush=True)\ntime.sleep(300)\n";

/// What the test does to the job while it lives.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Act {
    Nothing,
    /// `POST jobs/{id}/stop/` as soon as its pod exists, still pending.
    StopWhilePending,
    /// `kubectl delete pod` (a graceful delete) once the job has written its first line.
    DeletePodWhileRunning,
    /// `kubectl delete fj` once the job has written its first line.
    DeleteResourceWhileRunning,
    /// `POST jobs/{id}/stop/` once the job has written its first line.
    StopWhileRunning,
}

/// Prints a line, works a little, then ends well: a rerun shows whether the log is the last
/// attempt's alone.
const SHORT: &str =
    "import time\nprint('[PUBLIC] started', flush=True)\ntime.sleep(1)\nprint('[PUBLIC] finished', flush=True)\n";

struct Ending {
    /// The function's title (the kubelet double's faults go by it).
    function: &'static str,
    main: &'static str,
    arguments: &'static str,
    fault: Option<Fault>,
    act: Act,
    /// The function's upload opts in to reruns after its code started (`retry_after_start`).
    retry_after_start: bool,
    /// The fault hits only the first this many pods of the job (`None`: every pod).
    faulted_pods: Option<usize>,
    /// The column "retried or final": how many times the job was started again on a new pod
    /// (each with the reason in the FunctionJob's `status.retries`, a `RETRY` job event and a
    /// `Retrying` Kubernetes Event); 0 for an ending that is final at once.
    retried: usize,
    status: &'static str,
    /// Part of the reason shown in the FunctionJob's status and its Events (and in the API's
    /// status event, but for a user's own stop).
    reason: &'static str,
    /// Part of what `logs/` answers.
    log: &'static str,
}

const ENDINGS: &[Ending] = &[
    Ending {
        function: "pull",
        main: MAIN,
        arguments: r#"{"n": 1}"#,
        fault: Some(Fault::PullFails),
        act: Act::Nothing,
        retry_after_start: false,
        faulted_pods: None,
        retried: 0,
        status: "FAILED",
        reason: "ErrImagePull",
        log: "no log: the job's container never started (ErrImagePull",
    },
    Ending {
        function: "init",
        main: MAIN,
        arguments: r#"{"n": 1}"#,
        fault: Some(Fault::InitFails),
        act: Act::Nothing,
        retry_after_start: false,
        faulted_pods: None,
        retried: 0,
        status: "FAILED",
        reason: "the init container place-launcher failed with exit code 1",
        log: "no log: the init container place-launcher failed",
    },
    Ending {
        function: "exit",
        main: MAIN,
        arguments: r#"{"n": -1}"#,
        fault: None,
        act: Act::Nothing,
        retry_after_start: false,
        faulted_pods: None,
        retried: 0,
        status: "FAILED",
        reason: "exit code 3",
        log: "doubling -1",
    },
    Ending {
        function: "oom",
        main: SLEEPER,
        arguments: "{}",
        fault: Some(Fault::OutOfMemory),
        act: Act::Nothing,
        retry_after_start: false,
        faulted_pods: None,
        retried: 0,
        status: "FAILED",
        // The controller keeps no pod spec (`seen`), so the limit's figure is not named here.
        reason: "out of memory: its container job was killed (OOMKilled",
        // The launcher was killed with the function: archived from the pod's log.
        log: "started",
    },
    Ending {
        function: "evicted",
        main: SLEEPER,
        arguments: "{}",
        fault: Some(Fault::Evicted),
        act: Act::Nothing,
        retry_after_start: false,
        faulted_pods: None,
        retried: 0,
        status: "FAILED",
        reason: "Evicted",
        log: "started",
    },
    Ending {
        function: "lost",
        main: SLEEPER,
        arguments: "{}",
        fault: Some(Fault::LostWhileRunning),
        act: Act::Nothing,
        retry_after_start: false,
        faulted_pods: None,
        retried: 0,
        status: "FAILED",
        reason: "disappeared",
        log: "no log: the job's pod is gone",
    },
    Ending {
        function: "unschedulable",
        main: MAIN,
        arguments: r#"{"n": 1}"#,
        fault: Some(Fault::NeverSchedule),
        act: Act::Nothing,
        retry_after_start: false,
        faulted_pods: None,
        retried: 0,
        status: "FAILED",
        reason: "could not be scheduled",
        log: "no log: the job's pod was never scheduled",
    },
    Ending {
        function: "deleted",
        main: SLEEPER,
        arguments: "{}",
        fault: None,
        act: Act::DeletePodWhileRunning,
        retry_after_start: false,
        faulted_pods: None,
        retried: 0,
        status: "FAILED",
        reason: "deleted while it ran",
        log: "started",
    },
    Ending {
        function: "nosecret",
        main: MAIN,
        arguments: r#"{"n": 1}"#,
        fault: Some(Fault::SecretMissing),
        act: Act::Nothing,
        retry_after_start: false,
        faulted_pods: None,
        retried: 0,
        status: "FAILED",
        reason: "CreateContainerConfigError",
        log: "no log: the job's container never started (CreateContainerConfigError",
    },
    Ending {
        function: "resource",
        main: SLEEPER,
        arguments: "{}",
        fault: None,
        act: Act::DeleteResourceWhileRunning,
        retry_after_start: false,
        faulted_pods: None,
        retried: 0,
        status: "STOPPED",
        reason: "stopped: the FunctionJob was deleted",
        log: "started",
    },
    Ending {
        function: "stopped",
        main: MAIN,
        arguments: r#"{"n": 1}"#,
        fault: Some(Fault::NeverSchedule),
        act: Act::StopWhilePending,
        retry_after_start: false,
        faulted_pods: None,
        retried: 0,
        status: "STOPPED",
        reason: "stopped by the user",
        log: "no log: ",
    },
    // Retried: the cluster ended the pod before the function's code started.
    Ending {
        function: "evicted-early",
        main: MAIN,
        arguments: r#"{"n": 2}"#,
        fault: Some(Fault::EvictedBeforeStart),
        act: Act::Nothing,
        retry_after_start: false,
        faulted_pods: Some(1),
        retried: 1,
        status: "SUCCEEDED",
        reason: "Evicted",
        log: "doubling 2",
    },
    Ending {
        function: "preempted-early",
        main: MAIN,
        arguments: r#"{"n": 2}"#,
        fault: Some(Fault::PreemptedBeforeStart),
        act: Act::Nothing,
        retry_after_start: false,
        faulted_pods: Some(1),
        retried: 1,
        status: "SUCCEEDED",
        reason: "PreemptionByScheduler",
        log: "doubling 2",
    },
    Ending {
        function: "nodelost-early",
        main: MAIN,
        arguments: r#"{"n": 2}"#,
        fault: Some(Fault::NodeLostBeforeStart),
        act: Act::Nothing,
        retry_after_start: false,
        faulted_pods: Some(1),
        retried: 1,
        status: "SUCCEEDED",
        reason: "NodeLost",
        log: "doubling 2",
    },
    Ending {
        function: "deleted-early",
        main: MAIN,
        arguments: r#"{"n": 2}"#,
        fault: Some(Fault::DeletedBeforeStart),
        act: Act::Nothing,
        retry_after_start: false,
        faulted_pods: Some(2),
        retried: 2,
        status: "SUCCEEDED",
        reason: "DeletionByTaintManager",
        log: "doubling 2",
    }, // Retried after the code started only with the function's opt-in.
    Ending {
        function: "evicted-opted-in",
        main: SHORT,
        arguments: "{}",
        fault: Some(Fault::Evicted),
        act: Act::Nothing,
        retry_after_start: true,
        faulted_pods: Some(1),
        retried: 1,
        status: "SUCCEEDED",
        reason: "Evicted",
        log: "started\nfinished\n",
    },
    Ending {
        function: "lost-opted-in",
        main: SHORT,
        arguments: "{}",
        fault: Some(Fault::LostWhileRunning),
        act: Act::Nothing,
        retry_after_start: true,
        faulted_pods: Some(1),
        retried: 1,
        status: "SUCCEEDED",
        reason: "disappeared",
        log: "started\nfinished\n",
    },
    // Retries exhausted: final, with the last attempt's reason and the count.
    Ending {
        function: "evicted-always",
        main: MAIN,
        arguments: r#"{"n": 1}"#,
        fault: Some(Fault::EvictedBeforeStart),
        act: Act::Nothing,
        retry_after_start: false,
        faulted_pods: None,
        retried: 2,
        status: "FAILED",
        reason: "Evicted): The node was low on resource: ephemeral-storage. Threshold quantity: 1Gi, available: 512Mi. after 3 attempts",
        log: "no log: the job's container never started (ContainerCreating",
    },
    // The job's own endings and stops are final, opt-in or not.
    // A Python failure: the exit code and the exception line; the log's paths are the code
    // folder's.
    Ending {
        function: "exit-opted-in",
        main: "print('started', flush=True)\nprint(1 / 0)\n",
        arguments: "{}",
        fault: None,
        act: Act::Nothing,
        retry_after_start: true,
        faulted_pods: None,
        retried: 0,
        status: "FAILED",
        reason: "exit code 1: ZeroDivisionError: division by zero",
        log: "File \"main.py\", line 2, in <module>",
    },
    Ending {
        function: "oom-opted-in",
        main: SLEEPER,
        arguments: "{}",
        fault: Some(Fault::OutOfMemory),
        act: Act::Nothing,
        retry_after_start: true,
        faulted_pods: None,
        retried: 0,
        status: "FAILED",
        reason: "out of memory: its container job was killed (OOMKilled",
        log: "started",
    },
    Ending {
        function: "stopped-opted-in",
        main: SLEEPER,
        arguments: "{}",
        fault: None,
        act: Act::StopWhileRunning,
        retry_after_start: true,
        faulted_pods: None,
        retried: 0,
        status: "STOPPED",
        reason: "stopped by the user",
        log: "started",
    },
];

/// API calls about one job: requests naming it (its resource, pod, Secret, pod log) and the
/// Kubernetes Events about it.
fn calls_about(api: &ApiServer, id: &str) -> usize {
    let requests = api.requests().iter().filter(|(_, path)| path.contains(id)).count();
    let events = api.list(Kind::EVENT, NAMESPACE).iter().filter(|e| e["regarding"]["name"] == id).count();
    requests + events
}

/// The Kubernetes Events about the resource of `id`: (type, reason, note).
fn events_about(api: &ApiServer, id: &str) -> Vec<(String, String, String)> {
    api.list(Kind::EVENT, NAMESPACE)
        .iter()
        .filter(|e| e["regarding"]["name"] == id)
        .map(|e| {
            let text = |field: &str| e[field].as_str().unwrap_or_default().to_string();
            (text("type"), text("reason"), text("note"))
        })
        .collect()
}

fn condition(resource: &Value, kind: &str) -> Value {
    resource["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind)
        .cloned()
        .unwrap_or_default()
}

/// Waits until the job of `id` is settled: finished, its log settled, its pod and Secret gone,
/// and (unless `collected`) its resource saying so. Returns the resource, if kept.
async fn settled(cluster: &Cluster, id: &str, collected: bool) -> Option<Value> {
    eventually(&format!("job {id} settled"), Duration::from_secs(60), || async {
        let resource = cluster.api.get(Kind::FUNCTION_JOB, NAMESPACE, id);
        let pod = cluster.api.get(Kind::POD, NAMESPACE, &pod_name(id));
        let secret = cluster.api.get(Kind::SECRET, NAMESPACE, &secret_name(id));
        let resource_done = match &resource {
            None => collected,
            Some(r) => {
                !collected
                    && ["LogsArchived", "SecretDeleted", "PodDeleted"]
                        .iter()
                        .all(|kind| condition(r, kind)["status"] == "True")
            }
        };
        if resource_done && pod.is_none() && secret.is_none() {
            return Ok(resource);
        }
        Err(format!("\nresource {resource:?}\npod {pod:?}\nsecret present: {}", secret.is_some()))
    })
    .await
}

async fn act(cluster: &Cluster, id: &str, act: Act) {
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(cluster.api.client(), NAMESPACE);
    let resources: kube::Api<gantry::crd::FunctionJob> = kube::Api::namespaced(cluster.api.client(), NAMESPACE);
    match act {
        Act::Nothing => {}
        Act::StopWhilePending => {
            until(&format!("a pod for {id}"), Duration::from_secs(30), || async {
                cluster.api.get(Kind::POD, NAMESPACE, &pod_name(id)).is_some()
            })
            .await;
            let stop = cluster.gateway.post_json(&format!("/api/v1/jobs/{id}/stop/"), "alice", json!({})).await;
            assert_eq!(stop.status, 200, "{}", stop.json);
        }
        Act::DeletePodWhileRunning | Act::DeleteResourceWhileRunning | Act::StopWhileRunning => {
            eventually(&format!("{id} started"), Duration::from_secs(60), || async {
                let logs = cluster.gateway.get(&format!("/api/v1/jobs/{id}/logs/"), "alice").await.json;
                if logs["logs"].as_str().unwrap_or_default().contains("started") {
                    Ok(())
                } else {
                    Err(logs.to_string())
                }
            })
            .await;
            match act {
                Act::DeletePodWhileRunning => {
                    pods.delete(&pod_name(id), &Default::default()).await.unwrap();
                }
                Act::StopWhileRunning => {
                    let path = format!("/api/v1/jobs/{id}/stop/");
                    let stop = cluster.gateway.post_json(&path, "alice", json!({})).await;
                    assert_eq!(stop.status, 200, "{}", stop.json);
                }
                _ => {
                    resources.delete(id, &Default::default()).await.unwrap();
                }
            }
        }
    }
}

/// Checks everything a user and an operator see of a settled job.
async fn check_ending(cluster: &Cluster, ending: &Ending, id: &str) {
    let name = ending.function;
    let job = cluster.finished(id).await;
    assert_eq!(job["status"], ending.status, "{name}: {job}");
    let collected = ending.act == Act::DeleteResourceWhileRunning;
    let resource = settled(cluster, id, collected).await;
    let events = cluster.gateway.get(&format!("/api/v1/jobs/{id}/events/"), "alice").await.json;
    assert!(events.to_string().contains(ending.reason), "{name}: the API's events say why: {events}");
    // The job's answer and the FunctionJob's `status.reason` say why it ended (a success: nothing).
    let ended = ending.status != "SUCCEEDED";
    let why = job.get("status_reason").and_then(Value::as_str);
    assert!(if ended { why.is_some_and(|w| w.contains(ending.reason)) } else { why.is_none() }, "{name}: {job}");
    if let Some(resource) = &resource {
        let why = resource["status"].get("reason").and_then(Value::as_str);
        assert!(
            if ended { why.is_some_and(|w| w.contains(ending.reason)) } else { why.is_none() },
            "{name}: {resource}"
        );
        let message = resource["status"]["message"].as_str().unwrap_or_default();
        // A job that succeeded on a later attempt says why in its retries alone.
        if ending.retried == 0 || ending.status != "SUCCEEDED" {
            assert!(message.contains(ending.reason), "{name}: the resource says why: {resource}");
        }
        assert_eq!(resource["status"]["phase"], ending.status, "{name}: {resource}");
        let logs = condition(resource, "LogsArchived");
        let no_log = ending.log.starts_with("no log: ");
        assert_eq!(logs["reason"], if no_log { "NoLog" } else { "Archived" }, "{name}: {logs}");
    }
    let events = events_about(&cluster.api, id);
    assert!(
        events.iter().any(|(_, _, note)| note.contains(ending.reason)),
        "{name}: a Kubernetes Event says why: {events:?}"
    );
    let logs = cluster.gateway.get(&format!("/api/v1/jobs/{id}/logs/"), "alice").await.json;
    let text = logs["logs"].as_str().unwrap_or_default();
    assert!(text.contains(ending.log), "{name}: the log: {logs}");
    check_retries(cluster, ending, id, resource.as_ref()).await;
    crate::usage::check_record(&cluster.gateway, id, ending.status, 1 + ending.retried as i64).await;
}

/// The column "retried or final": each retry recorded once with its reason on the FunctionJob,
/// as a job event and as a Kubernetes Event; a retried job's log is its last attempt's alone.
async fn check_retries(cluster: &Cluster, ending: &Ending, id: &str, resource: Option<&Value>) {
    let name = ending.function;
    if let Some(resource) = resource {
        let retries = resource["status"]["retries"].as_array().cloned().unwrap_or_default();
        assert_eq!(retries.len(), ending.retried, "{name}: the FunctionJob's retries: {resource}");
        for (number, retry) in retries.iter().enumerate() {
            assert_eq!(retry["attempt"], number + 1, "{name}: {retry}");
            assert!(
                retry["reason"].as_str().unwrap().contains(ending.reason.split(" after ").next().unwrap()),
                "{name}: {retry}"
            );
            assert_eq!(retry["codeStarted"], ending.retry_after_start, "{name}: {retry}");
        }
    }
    let events = cluster.gateway.get(&format!("/api/v1/jobs/{id}/events/"), "alice").await.json;
    let retry_events: Vec<&Value> = events.as_array().unwrap().iter().filter(|e| e["event_type"] == "RETRY").collect();
    assert_eq!(retry_events.len(), ending.retried, "{name}: RETRY job events: {events}");
    for event in &retry_events {
        assert!(event["data"]["reason"].as_str().unwrap_or_default().len() > 10, "{name}: {event}");
    }
    let retrying = events_about(&cluster.api, id)
        .into_iter()
        .filter(|(kind, reason, _)| kind == "Warning" && reason == "Retrying");
    assert_eq!(retrying.count(), ending.retried, "{name}: Retrying Events: {:?}", events_about(&cluster.api, id));
    let statuses = cluster.statuses(id).await;
    assert_eq!(statuses.last().map(String::as_str), Some(ending.status), "{name}: {statuses:?}");
    let finals = statuses.iter().filter(|s| matches!(s.as_str(), "SUCCEEDED" | "FAILED" | "STOPPED")).count();
    assert_eq!(finals, 1, "{name}: one final move: {statuses:?}");
    if ending.retried > 0 && ending.status == "SUCCEEDED" {
        let logs = cluster.gateway.get(&format!("/api/v1/jobs/{id}/logs/"), "alice").await.json;
        let text = logs["logs"].as_str().unwrap_or_default();
        let first_line = ending.log.lines().next().unwrap();
        assert_eq!(text.matches(first_line).count(), 1, "{name}: the last attempt's log alone: {logs}");
    }
}

/// Uploads `main` as `title`, opting in to reruns after the code started when asked.
async fn upload(cluster: &Cluster, title: &str, main: &str, retry_after_start: bool) {
    let artifact = crate::harness::tar_of(&[("main.py", main.as_bytes())]);
    let opt_in = if retry_after_start { "true" } else { "false" };
    let fields = [("title", title), ("entrypoint", "main.py"), ("retry_after_start", opt_in)];
    let reply = cluster
        .gateway
        .post_multipart("/api/v1/programs/upload/", "alice", &fields, &[("artifact", "a.tar", &artifact)])
        .await;
    assert_eq!(reply.status, 200, "{}", reply.json);
}

/// The table: every ending at once on one cluster (a 4 s pending deadline, two infrastructure
/// retries 0.5 s then 1 s apart), then the quiet after: nothing more is asked about any settled
/// job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_way_a_pod_ends_is_settled_and_leaves_nothing_behind() {
    let gateway = Gateway::start(Backend::PostgresS3).await;
    let cluster = Cluster::start_tuned(gateway, Duration::from_secs(4), Duration::from_secs(3600), |settings| {
        settings.limits.jobs_per_user = 32;
        settings.limits.cpu_slots = 32;
        settings.infrastructure_retries = 2;
    })
    .await;
    let mut ids = Vec::new();
    for ending in ENDINGS {
        upload(&cluster, ending.function, ending.main, ending.retry_after_start).await;
        match (&ending.fault, ending.faulted_pods) {
            (Some(fault), Some(pods)) => cluster.kubelet.inject_times(ending.function, fault.clone(), pods),
            (Some(fault), None) => cluster.kubelet.inject(ending.function, fault.clone()),
            (None, _) => {}
        }
    }
    for ending in ENDINGS {
        let id = cluster.run(ending.function, ending.arguments).await;
        if ending.act == Act::StopWhilePending {
            // At once: within the pending deadline of its pod, however long the other runs take.
            act(&cluster, &id, ending.act).await;
        }
        ids.push(id);
    }
    let acts = ENDINGS
        .iter()
        .zip(&ids)
        .filter(|(ending, _)| ending.act != Act::StopWhilePending)
        .map(|(ending, id)| act(&cluster, id, ending.act));
    futures::future::join_all(acts).await;
    for (ending, id) in ENDINGS.iter().zip(&ids) {
        check_ending(&cluster, ending, id).await;
    }
    // Settled means quiet: no request and no Event about any of them any more.
    let before: Vec<usize> = ids.iter().map(|id| calls_about(&cluster.api, id)).collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after: Vec<usize> = ids.iter().map(|id| calls_about(&cluster.api, id)).collect();
    for ((ending, before), after) in ENDINGS.iter().zip(&before).zip(&after) {
        assert_eq!(before, after, "{}: API calls after it settled", ending.function);
    }
}

/// A pod past `activeDeadlineSeconds` (PROGRAM_TIMEOUT): STOPPED with the reason, the log the
/// launcher shipped on SIGTERM, and nothing left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_past_its_deadline_is_settled_and_leaves_nothing_behind() {
    let gateway = Gateway::start(Backend::PostgresS3).await;
    let cluster = Cluster::start_tuned(gateway, Duration::from_secs(600), Duration::from_secs(2), |_| {}).await;
    let ending = Ending {
        function: "sleeper",
        main: SLEEPER,
        arguments: "{}",
        fault: None,
        act: Act::Nothing,
        // Opted in to reruns: a timeout is the job's own ending all the same.
        retry_after_start: true,
        faulted_pods: None,
        retried: 0,
        status: "STOPPED",
        reason: "timed out after 2 s (the limit, PROGRAM_TIMEOUT)",
        log: "started",
    };
    upload(&cluster, ending.function, ending.main, ending.retry_after_start).await;
    let id = cluster.run(ending.function, ending.arguments).await;
    check_ending(&cluster, &ending, &id).await;
    let before = calls_about(&cluster.api, &id);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(calls_about(&cluster.api, &id), before, "API calls after it settled");
}

/// A log that cannot be read holds the resource being deleted (finalizer kept, pod kept to read
/// it from) and is retried; after the give-up time the log is recorded lost with a Warning and a
/// job event, and the resource goes. A log refused only for a while is archived on a retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finalizer_holds_until_the_log_is_settled_and_then_lets_go_with_a_warning() {
    let gateway = Gateway::start(Backend::PostgresS3).await;
    let cluster = Cluster::start_tuned(gateway, Duration::from_secs(600), Duration::from_secs(3600), |settings| {
        settings.archive_give_up = Duration::from_secs(4);
    })
    .await;
    // The launcher can ship nothing: the log must come from the pod.
    cluster.kubelet.refuse_writes("fn");
    let main = "import time\nprint('[PUBLIC] working', flush=True)\ntime.sleep(1)\nprint('[PUBLIC] done')\n";
    cluster.upload("fn", main).await;

    let refused = cluster.run("fn", "{}").await;
    cluster.api.fail_next("GET", &format!("{}/log", pod_name(&refused)), 400, 1_000_000);
    cluster.finished(&refused).await;
    let resources: kube::Api<gantry::crd::FunctionJob> = kube::Api::namespaced(cluster.api.client(), NAMESPACE);
    resources.delete(&refused, &Default::default()).await.unwrap();
    let deleted_at = std::time::Instant::now();
    // Held: still there, marked for deletion, its pod kept, no log yet.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let held = cluster.api.get(Kind::FUNCTION_JOB, NAMESPACE, &refused).expect("the finalizer holds the resource");
    assert!(!held["metadata"]["deletionTimestamp"].is_null(), "{held}");
    assert!(cluster.api.get(Kind::POD, NAMESPACE, &pod_name(&refused)).is_some(), "the pod is kept to read its log");
    let tries =
        cluster.api.requests().iter().filter(|(_, p)| p.contains(&format!("{}/log", pod_name(&refused)))).count();
    assert!((2..=12).contains(&tries), "retried with backoff, not in a loop: {tries} log reads");
    // Then released, saying so.
    settled(&cluster, &refused, true).await;
    assert!(deleted_at.elapsed() >= Duration::from_secs(3), "released only after the give-up time");
    let warnings: Vec<_> = events_about(&cluster.api, &refused)
        .into_iter()
        .filter(|(kind, reason, _)| kind == "Warning" && reason == "LogLost")
        .collect();
    assert_eq!(warnings.len(), 1, "{:?}", events_about(&cluster.api, &refused));
    assert!(warnings[0].2.contains("could not be read"), "{warnings:?}");
    let events = cluster.gateway.get(&format!("/api/v1/jobs/{refused}/events/"), "alice").await.json;
    let lost: Vec<&Value> = events.as_array().unwrap().iter().filter(|e| e["event_type"] == "LOG_LOST").collect();
    assert_eq!(lost.len(), 1, "{events}");
    assert!(lost[0]["data"]["message"].as_str().unwrap().contains("the job's log was lost"), "{events}");
    let logs = cluster.gateway.get(&format!("/api/v1/jobs/{refused}/logs/"), "alice").await.json;
    assert!(logs["logs"].as_str().unwrap().starts_with("no log: the pod's log could not be read"), "{logs}");

    // Refused twice, then served: archived, no warning.
    let flaky = cluster.run("fn", "{}").await;
    cluster.api.fail_next("GET", &format!("{}/log", pod_name(&flaky)), 400, 2);
    cluster.finished(&flaky).await;
    let resource = settled(&cluster, &flaky, false).await.unwrap();
    assert_eq!(condition(&resource, "LogsArchived")["reason"], "Archived", "{resource}");
    let logs = cluster.gateway.get(&format!("/api/v1/jobs/{flaky}/logs/"), "alice").await.json;
    assert!(logs["logs"].as_str().unwrap().starts_with("working\ndone\n"), "{logs}");
    assert!(events_about(&cluster.api, &flaky).iter().all(|(kind, _, _)| kind != "Warning"));
}

/// A finished job's Secret goes when its pod is done; its FunctionJob after the keep window; the
/// API answers for the job exactly as before, and the gateway's sweep never makes it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_resources_are_collected_and_the_api_answers_as_before() {
    let gateway = Gateway::start(Backend::PostgresS3).await;
    let cluster = Cluster::start_tuned(gateway, Duration::from_secs(600), Duration::from_secs(3600), |settings| {
        settings.keep_finished_pods = Duration::from_secs(5);
        settings.keep_finished_jobs = Duration::from_secs(7);
    })
    .await;
    cluster.upload("fn", MAIN).await;
    let id = cluster.run("fn", r#"{"n": 4}"#).await;
    let job = cluster.finished(&id).await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    // The Secret (the caller's token) goes as soon as the pod is done with it; the pod stays for
    // its keep window (`kubectl logs`), the resource for its own.
    until("the finished job's Secret deleted", Duration::from_secs(30), || async {
        cluster.api.get(Kind::SECRET, NAMESPACE, &secret_name(&id)).is_none()
    })
    .await;
    assert!(cluster.api.get(Kind::POD, NAMESPACE, &pod_name(&id)).is_some(), "the pod is kept for its window");
    let kept = settled(&cluster, &id, false).await.expect("kept within its window");
    assert_eq!(kept["status"]["phase"], "SUCCEEDED");
    let answers = |id: String| {
        let gateway = &cluster.gateway;
        async move {
            let mut seen = Vec::new();
            for path in ["", "result/", "logs/", "events/"] {
                seen.push(gateway.get(&format!("/api/v1/jobs/{id}/{path}"), "alice").await.json);
            }
            seen.push(gateway.get("/api/v1/jobs/", "alice").await.json);
            seen
        }
    };
    let before = answers(id.clone()).await;
    settled(&cluster, &id, true).await;
    assert_eq!(answers(id.clone()).await, before, "the API answers as before the collection");
    // Several sweeps later it is still gone, and nothing tried to make it again.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(cluster.api.get(Kind::FUNCTION_JOB, NAMESPACE, &id).is_none());
    let after_collection = cluster.api.requests().len();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let late: Vec<(String, String)> =
        cluster.api.requests()[after_collection..].iter().filter(|(_, path)| path.contains(&id)).cloned().collect();
    assert!(late.is_empty(), "nothing about the collected job: {late:?}");
}

/// A controller that died after putting a lost log's note in storage, before recording it in the
/// resource's status: the next one reads the note back (the log was given up as lost) and neither
/// reads the log again nor announces the loss a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_settled_before_a_crash_is_read_back_not_settled_again() {
    use gantry::controller::status::{LOST_LOG, NO_LOG};
    use gantry::domain::lifecycle::{JobStatus, Trigger, decide};
    let gateway = Gateway::start(Backend::PostgresS3).await;
    let cluster = Cluster::start_tuned(gateway, Duration::from_secs(600), Duration::from_secs(3600), |_| {}).await;
    cluster.controller.lock().unwrap().abort();
    cluster.upload("fn", MAIN).await;
    let id = cluster.run("fn", r#"{"n": 1}"#).await;
    // What the dead controller did: the job ended, its log was given up and the note stored.
    let db = &cluster.gateway.state.db;
    for (from, trigger) in [
        (JobStatus::Queued, Trigger::Admitted),
        (JobStatus::Pending, Trigger::Crashed { reason: "the job's container job exited with code 1 (Error)".into() }),
    ] {
        assert!(
            gantry::db::jobs::apply_move(db, &id, &decide(from, &trigger).unwrap(), false).await.unwrap().is_some()
        );
    }
    let note = format!("{NO_LOG}{LOST_LOG} 600 s, giving up: refused\n");
    let key = gantry::storage::keys::job_user_log(&id);
    cluster.gateway.state.storage.put_bytes(&key, note.clone().into()).await.unwrap();
    cluster.restart_controller();
    let resource = settled(&cluster, &id, false).await.unwrap();
    let logs = condition(&resource, "LogsArchived");
    assert_eq!(logs["reason"], "LogLost", "{resource}");
    assert!(logs["message"].as_str().unwrap().starts_with(LOST_LOG), "{resource}");
    let events = cluster.gateway.get(&format!("/api/v1/jobs/{id}/events/"), "alice").await.json;
    assert!(events.as_array().unwrap().iter().all(|e| e["event_type"] != "LOG_LOST"), "announced again: {events}");
    assert!(events_about(&cluster.api, &id).iter().all(|(_, reason, _)| reason != "LogLost"));
    let requests = cluster.api.requests();
    assert!(requests.iter().all(|(_, path)| !path.ends_with(&format!("{}/log", pod_name(&id)))), "the log read again");
    let logs = cluster.gateway.get(&format!("/api/v1/jobs/{id}/logs/"), "alice").await.json;
    assert_eq!(logs["logs"], note, "{logs}");
}

/// A controller restarted while a retry waits for its backoff goes on from the FunctionJob's
/// status and the database: one retry recorded once, one more pod, the job SUCCEEDED with the
/// second attempt's log, nothing left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_restarted_mid_retry_goes_on_where_the_last_one_was() {
    let gateway = Gateway::start(Backend::PostgresS3).await;
    let cluster = Cluster::start_tuned(gateway, Duration::from_secs(600), Duration::from_secs(3600), |settings| {
        settings.retry_backoff = Duration::from_secs(3);
    })
    .await;
    upload(&cluster, "fn", MAIN, false).await;
    cluster.kubelet.inject_times("fn", Fault::EvictedBeforeStart, 1);
    let id = cluster.run("fn", r#"{"n": 5}"#).await;
    let waiting = cluster
        .resource_until(&id, |r| r["status"]["retries"].as_array().is_some_and(|retries| retries.len() == 1))
        .await;
    assert_eq!(waiting["status"]["phase"], "PENDING", "{waiting}");
    cluster.restart_controller();
    let job = cluster.finished(&id).await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    let ending = Ending {
        function: "fn",
        main: MAIN,
        arguments: r#"{"n": 5}"#,
        fault: Some(Fault::EvictedBeforeStart),
        act: Act::Nothing,
        retry_after_start: false,
        faulted_pods: Some(1),
        retried: 1,
        status: "SUCCEEDED",
        reason: "Evicted",
        log: "doubling 5",
    };
    check_ending(&cluster, &ending, &id).await;
    let creates = cluster
        .api
        .requests()
        .iter()
        .filter(|(method, path)| method == "POST" && path.split('?').next().unwrap_or_default().ends_with("/pods"))
        .count();
    assert_eq!(creates, 2, "one pod per attempt");
}
