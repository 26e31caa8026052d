//! Why a job ended, in the job's answer: `status_reason` carries the reason of the terminal
//! status move (absent for a success and while the job runs), in `jobs/{id}/` and the listings,
//! written by both ways a move is stored (one job on PostgreSQL without outbox is one statement;
//! batches and SQLite take the other). Then the local runner's table of endings, each with its
//! reason (the cluster's: `pod_endings.rs`; the limits': `job_limits.rs`).

use gantry::domain::lifecycle::{JobStatus, Trigger, decide};
use serde_json::{Value, json};

use crate::both_backends;
use crate::eventually::until;
use crate::harness::{Backend, Gateway};

both_backends!(an_ended_job_says_why_in_its_answer_and_the_listing,);

async fn run(gateway: &Gateway) -> String {
    let reply = gateway.post_json("/api/v1/programs/run/", "alice", json!({"title": "fn", "arguments": "{}"})).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    reply.json["id"].as_str().unwrap().to_string()
}

async fn an_ended_job_says_why_in_its_answer_and_the_listing(backend: Backend) {
    // No runner: the moves are made here, as a runner makes them.
    let gateway = Gateway::start(backend).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    let db = &gateway.state.db;
    let step = |from: JobStatus, trigger: Trigger| decide(from, &trigger).unwrap();
    let admitted = step(JobStatus::Queued, Trigger::Admitted);
    let started = step(JobStatus::Pending, Trigger::Started);
    let (crashed, ok, timed_out) = (run(&gateway).await, run(&gateway).await, run(&gateway).await);
    // A batch move (the other statement) for the admission, one-job moves for the rest.
    let all = [crashed.clone(), ok.clone(), timed_out.clone()];
    assert_eq!(gantry::db::jobs::apply_moves(db, &all, &admitted, false).await.unwrap().len(), 3);
    for id in &all {
        assert!(gantry::db::jobs::apply_move(db, id, &started, false).await.unwrap().is_some());
    }
    let running = gateway.get(&format!("/api/v1/jobs/{crashed}/"), "alice").await.json;
    assert_eq!(running.get("status_reason"), None, "a running job has no reason: {running}");
    let why = "exit code 1: ZeroDivisionError: division by zero";
    let failed = step(JobStatus::Running, Trigger::Crashed { reason: why.into() });
    assert!(gantry::db::jobs::apply_move(db, &crashed, &failed, false).await.unwrap().is_some());
    let succeeded = step(JobStatus::Running, Trigger::Exited { success: true });
    assert!(gantry::db::jobs::apply_move(db, &ok, &succeeded, false).await.unwrap().is_some());
    let stopped = step(JobStatus::Running, Trigger::TimedOut { limit_secs: 60 });
    assert_eq!(
        gantry::db::jobs::apply_moves(db, std::slice::from_ref(&timed_out), &stopped, false).await.unwrap().len(),
        1
    );

    let answer = gateway.get(&format!("/api/v1/jobs/{crashed}/"), "alice").await.json;
    assert_eq!((answer["status"].as_str(), answer["status_reason"].as_str()), (Some("FAILED"), Some(why)), "{answer}");
    let answer = gateway.get(&format!("/api/v1/jobs/{ok}/"), "alice").await.json;
    assert_eq!(answer["status"], "SUCCEEDED");
    assert_eq!(answer.get("status_reason"), None, "a success has no reason: {answer}");
    let answer = gateway.get(&format!("/api/v1/jobs/{timed_out}/"), "alice").await.json;
    assert!(answer["status_reason"].as_str().unwrap().contains("PROGRAM_TIMEOUT"), "{answer}");
    // The same in the listing; and the reason is the status event's.
    let page = gateway.get("/api/v1/jobs/?limit=10", "alice").await.json;
    let listed: Vec<(&str, Option<&str>)> = page["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|job| (job["id"].as_str().unwrap(), job.get("status_reason").and_then(Value::as_str)))
        .collect();
    assert!(listed.contains(&(crashed.as_str(), Some(why))), "{page}");
    assert!(listed.contains(&(ok.as_str(), None)), "{page}");
    let events = gateway.get(&format!("/api/v1/jobs/{crashed}/events/"), "alice").await.json;
    // Events come newest first.
    let last = events.as_array().unwrap().iter().find(|e| e["event_type"] == "STATUS_CHANGE").unwrap().clone();
    assert_eq!(last["data"]["reason"], why, "{events}");
}

/// Sleeps until it is stopped, after a first line.
const SLEEPER: &str = "import time\nprint('sleeping', flush=True)\ntime.sleep(300)\n";

/// One ending of the local runner's table: the function, the status and the reason it ends with.
struct Ending {
    title: &'static str,
    files: &'static [(&'static str, &'static str)],
    status: &'static str,
    reason: &'static str,
}

const LOCAL_ENDINGS: &[Ending] = &[
    // A Python failure in a module of the function: the code and the exception line.
    Ending {
        title: "divide",
        files: &[
            ("main.py", "print('dividing', flush=True)\nimport helper\nhelper.divide()\n"),
            ("helper.py", "def divide():\n    return 1 / 0\n"),
        ],
        status: "FAILED",
        reason: "exit code 1: ZeroDivisionError: division by zero",
    },
    // An exception class of the function's own, and a plain exit code without a traceback.
    Ending {
        title: "own",
        files: &[("main.py", "class Boom(Exception):\n    pass\nraise Boom('it broke')\n")],
        status: "FAILED",
        reason: "exit code 1: Boom: it broke",
    },
    Ending {
        title: "exit",
        files: &[("main.py", "import sys\nprint('ValueError: handled', flush=True)\nprint('bye')\nsys.exit(3)\n")],
        status: "FAILED",
        reason: "exit code 3: ValueError: handled",
    },
    Ending {
        title: "quiet",
        files: &[("main.py", "import sys\nsys.exit(4)\n")],
        status: "FAILED",
        reason: "exit code 4",
    },
    Ending { title: "stop", files: &[("main.py", SLEEPER)], status: "STOPPED", reason: "stopped by the user" },
    Ending { title: "fine", files: &[("main.py", "print('ok')\n")], status: "SUCCEEDED", reason: "" },
];

async fn upload_files(gateway: &Gateway, title: &str, files: &[(&str, &str)]) {
    let files: Vec<(&str, &[u8])> = files.iter().map(|(name, text)| (*name, text.as_bytes())).collect();
    let artifact = crate::harness::tar_of(&files);
    let fields = [("title", title), ("entrypoint", "main.py")];
    let reply =
        gateway.post_multipart("/api/v1/programs/upload/", "alice", &fields, &[("artifact", "a.tar", &artifact)]).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
}

fn terminal(job: &Value) -> bool {
    matches!(job["status"].as_str(), Some("SUCCEEDED" | "FAILED" | "STOPPED"))
}

/// Checks a settled job's reason where a user reads it: the answer's `status_reason` (absent for
/// a success) and the `reason` of its last status event.
async fn check_reason(gateway: &Gateway, id: &str, status: &str, reason: &str) -> Value {
    let job = gateway.wait_for_job("alice", id, 90, terminal).await;
    assert_eq!(job["status"], status, "{job}");
    let events = gateway.get(&format!("/api/v1/jobs/{id}/events/"), "alice").await.json;
    let last = events.as_array().unwrap().iter().find(|e| e["event_type"] == "STATUS_CHANGE").unwrap().clone();
    if reason.is_empty() {
        assert_eq!(job.get("status_reason"), None, "{job}");
        assert_eq!(last["data"].get("reason"), None, "{last}");
    } else {
        assert_eq!(job["status_reason"], reason, "{job}");
        assert_eq!(last["data"]["reason"], reason, "{last}");
    }
    job
}

/// The local runner's table: each ending with its reason, and logs whose paths are the
/// function's folder's, never the server's. (Its limits' endings: `job_limits.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_local_ending_says_why() {
    let gateway = Gateway::start(Backend::SqliteLocal)
        .await
        .with_runner(|config| {
            config.limits = gantry::domain::admission::Limits { jobs_per_user: 8, cpu_slots: 8, gpu_slots: 1 }
        })
        .await;
    let mut ids = Vec::new();
    for ending in LOCAL_ENDINGS {
        upload_files(&gateway, ending.title, ending.files).await;
        ids.push(run_title(&gateway, ending.title).await);
    }
    let stop = &ids[LOCAL_ENDINGS.iter().position(|e| e.title == "stop").unwrap()];
    until("the sleeper started", std::time::Duration::from_secs(60), || async {
        gateway.get(&format!("/api/v1/jobs/{stop}/logs/"), "alice").await.json.to_string().contains("sleeping")
    })
    .await;
    let reply = gateway.post_json(&format!("/api/v1/jobs/{stop}/stop/"), "alice", json!({})).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    for (ending, id) in LOCAL_ENDINGS.iter().zip(&ids) {
        check_reason(&gateway, id, ending.status, ending.reason).await;
        // Metered from its start to its end, with what the runner gave it.
        let record = crate::usage::check_record(&gateway, id, ending.status, 1).await;
        assert!(record.run_ms > 0 && record.cpu_millis.is_some_and(|c| c > 0), "{record:?}");
    }
    // The traceback names the function's files by their path in its folder.
    let logs = gateway.get(&format!("/api/v1/jobs/{}/logs/", ids[0]), "alice").await.json;
    let text = logs["logs"].as_str().unwrap();
    assert!(text.contains("File \"main.py\", line 3, in <module>"), "{text}");
    assert!(text.contains("File \"helper.py\", line 2, in divide"), "{text}");
    let data_dir = gateway.data_dir().display().to_string();
    assert!(!text.contains(&data_dir) && !text.contains("/code/"), "a server path in the log: {text}");
}

async fn run_title(gateway: &Gateway, title: &str) -> String {
    let reply = gateway.post_json("/api/v1/programs/run/", "alice", json!({"title": title, "arguments": "{}"})).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    reply.json["id"].as_str().unwrap().to_string()
}

/// A job past `PROGRAM_TIMEOUT` on the local runner: stopped, with the limit in its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_job_past_its_timeout_says_so() {
    let gateway = Gateway::start(Backend::SqliteLocal)
        .await
        .with_runner(|config| config.timeout = std::time::Duration::from_secs(2))
        .await;
    upload_files(&gateway, "sleeper", &[("main.py", SLEEPER)]).await;
    let id = run_title(&gateway, "sleeper").await;
    check_reason(&gateway, &id, "STOPPED", "timed out after 2 s (the limit, PROGRAM_TIMEOUT)").await;
    let record = crate::usage::check_record(&gateway, &id, "STOPPED", 1).await;
    assert!(record.run_ms >= 1_000, "{record:?}");
}
