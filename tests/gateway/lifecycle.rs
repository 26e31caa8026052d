//! Jobs executed for real: the local runner admits them and starts `gantry launch`, which runs
//! `python3 main.py` from the unpacked artifact. Statuses, events, results, logs, stop, timeout
//! and restart reconciliation, on both backends.

use serde_json::{Value, json};

use crate::both_backends;
use crate::eventually::{eventually, eventually_blocking, eventually_every, until_blocking};
use crate::harness::{Backend, Gateway, tar_of};

both_backends!(
    a_job_runs_to_success_with_result_logs_and_events,
    a_failing_job_ends_failed_with_its_traceback,
    provider_function_logs_are_split,
    a_running_job_is_stopped_with_its_process_group,
    a_job_past_the_timeout_is_stopped,
    jobs_left_running_by_a_dead_process_are_reconciled,
    admission_caps_running_jobs_per_user,
    an_admission_batch_moves_only_the_jobs_still_queued,
    a_failing_publisher_never_blocks_a_move,
    a_job_reads_what_a_job_of_another_function_wrote,
    image_functions_the_machine_cannot_run_are_refused_with_the_fix,
);

/// Writes `DATA_PATH/out.txt` (producer) or returns its content as the result (consumer).
const DATA_MAIN: &str = r#"
import json, os
with open(os.environ["ARGUMENTS_PATH"]) as handle:
    arguments = json.load(handle)
path = os.path.join(os.environ["DATA_PATH"], "out.txt")
if arguments["role"] == "producer":
    with open(path, "w") as handle:
        handle.write(arguments["text"])
    result = {"wrote": arguments["text"]}
else:
    with open(path) as handle:
        result = {"read": handle.read()}
os.makedirs(os.path.dirname(os.environ["RESULTS_PATH"]), exist_ok=True)
with open(os.environ["RESULTS_PATH"], "w") as handle:
    json.dump(result, handle)
"#;

async fn a_job_reads_what_a_job_of_another_function_wrote(backend: Backend) {
    let gateway = Gateway::start(backend).await.with_runner(|_| {}).await;
    let artifact = tar_of(&[("main.py", DATA_MAIN.as_bytes())]);
    for title in ["producer", "consumer"] {
        let reply = gateway
            .post_multipart(
                "/api/v1/programs/upload/",
                "alice",
                &[("title", title), ("entrypoint", "main.py")],
                &[("artifact", "artifact.tar", &artifact)],
            )
            .await;
        assert_eq!(reply.status, 200, "{}", reply.json);
    }
    let arguments = json!({"role": "producer", "text": "made by the producer"}).to_string();
    let produced = run(&gateway, "alice", json!({"title": "producer", "arguments": arguments})).await;
    let job = gateway.wait_for_job("alice", &produced, 60, terminal).await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    assert_eq!(
        gateway.get("/api/v1/files/?function=consumer", "alice").await.json,
        json!({"results": ["out.txt"]}),
        "the consumer's listing shows the producer's file"
    );
    let consumed = run(&gateway, "alice", json!({"title": "consumer", "arguments": "{\"role\": \"consumer\"}"})).await;
    let job = gateway.wait_for_job("alice", &consumed, 60, terminal).await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    let result = gateway.get(&format!("/api/v1/jobs/{consumed}/result/"), "alice").await.json;
    let result: Value = serde_json::from_str(result["result"].as_str().unwrap()).unwrap();
    assert_eq!(result, json!({"read": "made by the producer"}));
}

struct BrokenPublisher(std::sync::atomic::AtomicUsize);

impl gantry::events::Publisher for BrokenPublisher {
    fn publish(&self, _event: &gantry::events::StatusEvent) -> Result<(), String> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Err("the event stream is down".into())
    }
}

async fn a_failing_publisher_never_blocks_a_move(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    upload(&gateway, "alice", "fn").await;
    let id = run(&gateway, "alice", json!({"title": "fn", "arguments": "{\"n\": 1}"})).await;
    let broken = std::sync::Arc::new(BrokenPublisher(Default::default()));
    let publisher: std::sync::Arc<dyn gantry::events::Publisher> = broken.clone();
    for trigger in [
        gantry::domain::lifecycle::Trigger::Admitted,
        gantry::domain::lifecycle::Trigger::Started,
        gantry::domain::lifecycle::Trigger::Exited { success: true },
    ] {
        let moved = gantry::compute::move_job_now(&gateway.state.db, &publisher, &id, &trigger).await.unwrap();
        assert!(moved.is_some(), "{trigger:?} was not applied");
    }
    assert_eq!(broken.0.load(std::sync::atomic::Ordering::SeqCst), 3, "every move was offered to the sink");
    assert_eq!(gateway.get(&format!("/api/v1/jobs/{id}/"), "alice").await.json["status"], "SUCCEEDED");
    assert_eq!(statuses(&gateway, "alice", &id).await.len(), 4);
}

const MAIN: &str = r#"
import json, os, sys
from pkg.helper import double
with open(os.environ["ARGUMENTS_PATH"]) as handle:
    arguments = json.load(handle)
print("stdout line", double(arguments["n"]))
print("[PUBLIC] public line", file=sys.stderr)
print("[private] private line", file=sys.stderr)
os.makedirs(os.path.dirname(os.environ["RESULTS_PATH"]), exist_ok=True)
with open(os.environ["RESULTS_PATH"], "w") as handle:
    json.dump({"doubled": double(arguments["n"]), "job": os.environ["ENV_JOB_ID_GATEWAY"], "id": os.environ["FUNCTIONS_IDENTIFIER"], "token": os.environ["ENV_JOB_GATEWAY_TOKEN"]}, handle)
mode = arguments.get("mode")
if mode == "fail":
    raise RuntimeError("this function failed on purpose")
if mode == "nap":
    time_module = __import__("time")
    time_module.sleep(arguments.get("seconds", 3))
if mode == "sleep":
    print("going to sleep", flush=True)
    import time
    time.sleep(120)
"#;

async fn upload(gateway: &Gateway, token: &str, title: &str) {
    let artifact = tar_of(&[
        ("main.py", MAIN.as_bytes()),
        ("pkg/__init__.py", b""),
        ("pkg/helper.py", b"def double(n):\n    return 2 * n\n"),
    ]);
    let reply = gateway
        .post_multipart(
            "/api/v1/programs/upload/",
            token,
            &[("title", title), ("entrypoint", "main.py")],
            &[("artifact", "artifact.tar", &artifact)],
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.json);
}

async fn run(gateway: &Gateway, token: &str, body: Value) -> String {
    let reply = gateway.post_json("/api/v1/programs/run/", token, body).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    reply.json["id"].as_str().unwrap().to_string()
}

fn terminal(job: &Value) -> bool {
    matches!(job["status"].as_str(), Some("SUCCEEDED" | "FAILED" | "STOPPED"))
}

async fn statuses(gateway: &Gateway, token: &str, job_id: &str) -> Vec<(String, String)> {
    let events = gateway.get(&format!("/api/v1/jobs/{job_id}/events/"), token).await.json;
    let mut moves: Vec<(String, String)> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event_type"] == "STATUS_CHANGE")
        .map(|e| (e["data"]["status"].as_str().unwrap().to_string(), e["origin"].as_str().unwrap().to_string()))
        .collect();
    moves.reverse();
    moves
}

async fn a_job_runs_to_success_with_result_logs_and_events(backend: Backend) {
    let gateway = Gateway::start(backend).await.with_runner(|_| {}).await;
    upload(&gateway, "alice", "fn").await;
    let id = run(&gateway, "alice", json!({"title": "fn", "arguments": "{\"n\": 21}"})).await;
    let job = gateway.wait_for_job("alice", &id, 60, terminal).await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    let result = gateway.get(&format!("/api/v1/jobs/{id}/result/"), "alice").await.json;
    let result: Value = serde_json::from_str(result["result"].as_str().unwrap()).unwrap();
    assert_eq!(
        result,
        json!({"doubled": 42, "job": id, "id": id, "token": "alice"}),
        "the job acts with its caller's token"
    );
    let logs =
        gateway.get(&format!("/api/v1/jobs/{id}/logs/"), "alice").await.json["logs"].as_str().unwrap().to_string();
    for line in ["stdout line 42\n", "public line\n", "private line\n"] {
        assert!(logs.contains(line), "{line:?} missing from {logs:?}");
    }
    assert!(!logs.contains("[PUBLIC]"), "prefixes are stripped: {logs:?}");
    assert_eq!(
        statuses(&gateway, "alice", &id).await,
        [("QUEUED", "API"), ("PENDING", "SCHEDULER"), ("RUNNING", "SCHEDULER"), ("SUCCEEDED", "SCHEDULER")]
            .map(|(s, o)| (s.to_string(), o.to_string()))
    );
}

async fn a_failing_job_ends_failed_with_its_traceback(backend: Backend) {
    let gateway = Gateway::start(backend).await.with_runner(|_| {}).await;
    upload(&gateway, "alice", "fn").await;
    let id = run(&gateway, "alice", json!({"title": "fn", "arguments": "{\"n\": 1, \"mode\": \"fail\"}"})).await;
    let job = gateway.wait_for_job("alice", &id, 60, terminal).await;
    assert_eq!(job["status"], "FAILED");
    let logs =
        gateway.get(&format!("/api/v1/jobs/{id}/logs/"), "alice").await.json["logs"].as_str().unwrap().to_string();
    assert!(logs.contains("RuntimeError: this function failed on purpose"), "{logs}");
}

async fn provider_function_logs_are_split(backend: Backend) {
    let gateway = Gateway::start(backend).await.with_runner(|_| {}).await;
    gateway.provider("acme", None, "erin").await;
    upload(&gateway, "erin", "acme/tool").await;
    gateway.admin(gantry::admin::AdminCommand::AddMember { group: "users".into(), user: "alice".into() }).await;
    gateway
        .admin(gantry::admin::AdminCommand::Grant {
            provider: "acme".into(),
            function: "tool".into(),
            group: "users".into(),
            view: true,
            run: true,
        })
        .await;
    let id = run(&gateway, "alice", json!({"title": "tool", "provider": "acme", "arguments": "{\"n\": 2}"})).await;
    assert_eq!(gateway.wait_for_job("alice", &id, 60, terminal).await["status"], "SUCCEEDED");
    let user =
        gateway.get(&format!("/api/v1/jobs/{id}/logs/"), "alice").await.json["logs"].as_str().unwrap().to_string();
    assert_eq!(user, "public line\n");
    let provider = gateway.get(&format!("/api/v1/jobs/{id}/provider-logs/"), "erin").await.json["logs"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(provider.contains("stdout line 4\n") && provider.contains("private line\n"), "{provider}");
    assert!(!provider.contains("public line"), "{provider}");
}

fn process_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat.rsplit(')').next().unwrap_or_default().trim_start().starts_with('Z'))
        .unwrap_or(false)
}

async fn launcher_pid(gateway: &Gateway, id: &str) -> i32 {
    let job = gantry::db::jobs::find(&gateway.state.db, id).await.unwrap().unwrap();
    job.backend_ref.unwrap().strip_prefix("pid:").unwrap().parse().unwrap()
}

/// Process ids of the whole process group led by the job's python (the launcher's child).
fn python_children(launcher: i32) -> Vec<i32> {
    let children = std::fs::read_to_string(format!("/proc/{launcher}/task/{launcher}/children")).unwrap_or_default();
    children.split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

async fn a_running_job_is_stopped_with_its_process_group(backend: Backend) {
    let gateway = Gateway::start(backend).await.with_runner(|_| {}).await;
    upload(&gateway, "alice", "fn").await;
    let id = run(&gateway, "alice", json!({"title": "fn", "arguments": "{\"n\": 1, \"mode\": \"sleep\"}"})).await;
    gateway.wait_for_job("alice", &id, 60, |job| job["status"] == "RUNNING").await;
    // Wait until python has printed, so the live log and the process are there.
    eventually("the live log", std::time::Duration::from_secs(30), || async {
        let logs = gateway.get(&format!("/api/v1/jobs/{id}/logs/"), "alice").await.json["logs"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if logs.contains("going to sleep") { Ok(()) } else { Err(format!("{logs:?}")) }
    })
    .await;
    let launcher = launcher_pid(&gateway, &id).await;
    let pythons = python_children(launcher);
    assert!(!pythons.is_empty(), "python should run under the launcher");
    let stop = gateway.post_json(&format!("/api/v1/jobs/{id}/stop/"), "alice", json!({"service": "null"})).await;
    assert!(stop.message().contains("Stop requested"), "{}", stop.message());
    let job = gateway.wait_for_job("alice", &id, 30, terminal).await;
    assert_eq!(job["status"], "STOPPED");
    assert!(!process_alive(launcher), "the launcher is gone");
    for python in pythons {
        assert!(!process_alive(python), "python {python} is gone");
    }
    let logs =
        gateway.get(&format!("/api/v1/jobs/{id}/logs/"), "alice").await.json["logs"].as_str().unwrap().to_string();
    assert!(logs.contains("going to sleep"), "a stopped job's logs are archived: {logs:?}");
    let last = statuses(&gateway, "alice", &id).await.pop().unwrap();
    assert_eq!(last, ("STOPPED".to_string(), "API".to_string()));
}

async fn a_job_past_the_timeout_is_stopped(backend: Backend) {
    let gateway =
        Gateway::start(backend).await.with_runner(|config| config.timeout = std::time::Duration::from_secs(2)).await;
    upload(&gateway, "alice", "fn").await;
    let id = run(&gateway, "alice", json!({"title": "fn", "arguments": "{\"n\": 1, \"mode\": \"sleep\"}"})).await;
    let job = gateway.wait_for_job("alice", &id, 60, terminal).await;
    assert_eq!(job["status"], "STOPPED");
    let events = gateway.get(&format!("/api/v1/jobs/{id}/events/"), "alice").await.json;
    assert_eq!(events[0]["origin"], "SCHEDULER");
    assert!(events[0]["data"]["reason"].as_str().unwrap().contains("PROGRAM_TIMEOUT"), "{}", events[0]);
}

async fn jobs_left_running_by_a_dead_process_are_reconciled(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    upload(&gateway, "alice", "fn").await;
    let id = run(&gateway, "alice", json!({"title": "fn", "arguments": "{\"n\": 1}"})).await;
    // As a crashed gateway would leave it: RUNNING, with a launcher that no longer exists.
    let publisher = gateway.state.publisher.clone();
    for trigger in [gantry::domain::lifecycle::Trigger::Admitted, gantry::domain::lifecycle::Trigger::Started] {
        gantry::compute::move_job_now(&gateway.state.db, &publisher, &id, &trigger).await.unwrap();
    }
    gantry::db::jobs::set_backend_ref(&gateway.state.db, &id, Some("pid:999999999")).await.unwrap();
    assert_eq!(gateway.get(&format!("/api/v1/jobs/{id}/"), "alice").await.json["status"], "RUNNING");
    let gateway = gateway.with_runner(|_| {}).await;
    let job = gateway.wait_for_job("alice", &id, 30, terminal).await;
    assert_eq!(job["status"], "FAILED");
    let events = gateway.get(&format!("/api/v1/jobs/{id}/events/"), "alice").await.json;
    assert_eq!(events[0]["context"], "RECONCILE");
    assert!(events[0]["data"]["reason"].as_str().unwrap().contains("gone"), "{}", events[0]);
}

/// An admission pass moves its jobs in one transaction: only those still queued move (in the
/// order given, unknown ids ignored), each with its own event, and the kept counts stay equal
/// to the rows for every status, across users and functions.
async fn an_admission_batch_moves_only_the_jobs_still_queued(backend: Backend) {
    use gantry::domain::lifecycle::{JobStatus, Trigger, decide};
    let gateway = Gateway::start(backend).await;
    for (user, title) in [("alice", "fn"), ("alice", "other"), ("bob", "fn")] {
        upload(&gateway, user, title).await;
    }
    let runs = [("alice", "fn"), ("bob", "fn"), ("alice", "other"), ("alice", "fn"), ("bob", "fn")];
    let mut ids = Vec::new();
    for (user, title) in runs {
        ids.push(run(&gateway, user, json!({"title": title, "arguments": "{}"})).await);
    }
    // No runner: stopping a queued job stops it at once.
    let stop = gateway.post_json(&format!("/api/v1/jobs/{}/stop/", ids[3]), "alice", json!({})).await;
    assert_eq!(stop.status, 200, "{}", stop.json);
    let mut batch = ids.clone();
    batch.insert(2, "no-such-job".into());
    let admitted = decide(JobStatus::Queued, &Trigger::Admitted).unwrap();
    let moved = gantry::db::jobs::apply_moves(&gateway.state.db, &batch, &admitted, false).await.unwrap();
    assert_eq!(moved, [ids[0].as_str(), &ids[1], &ids[2], &ids[4]], "the queued ones, in order");
    let again = gantry::db::jobs::apply_moves(&gateway.state.db, &batch, &admitted, false).await.unwrap();
    assert!(again.is_empty(), "a job moves once: {again:?}");
    for (n, id) in ids.iter().enumerate() {
        let user = runs[n].0;
        let expected: &[(&str, &str)] = if n == 3 {
            &[("QUEUED", "API"), ("STOPPED", "API")]
        } else {
            &[("QUEUED", "API"), ("PENDING", "SCHEDULER")]
        };
        let expected: Vec<(String, String)> = expected.iter().map(|(s, o)| (s.to_string(), o.to_string())).collect();
        assert_eq!(statuses(&gateway, user, id).await, expected, "job {n}");
    }
    for status in ["QUEUED", "PENDING", "STOPPED"] {
        let filter = gantry::db::jobs::JobFilter { status: Some(status.into()), ..Default::default() };
        let (count, rows) = gantry::db::jobs::list(&gateway.state.db, &filter, None, 0).await.unwrap();
        assert_eq!(count, rows.len() as i64, "kept count of {status}");
        assert_eq!(rows.len(), [0, 4, 1][["QUEUED", "PENDING", "STOPPED"].iter().position(|s| *s == status).unwrap()]);
    }
}

async fn admission_caps_running_jobs_per_user(backend: Backend) {
    let gateway = Gateway::start(backend).await.with_runner(|config| config.limits.jobs_per_user = 1).await;
    upload(&gateway, "alice", "fn").await;
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(run(&gateway, "alice", json!({"title": "fn", "arguments": format!("{{\"n\": {n}}}")})).await);
    }
    // Every 20 ms: at each look, at most one of them runs.
    let (within, every) = (std::time::Duration::from_secs(90), std::time::Duration::from_millis(20));
    eventually_every("jobs all finished", within, every, || async {
        let (_, rows) = gantry::db::jobs::list(&gateway.state.db, &Default::default(), None, 0).await.unwrap();
        let in_flight = rows.iter().filter(|j| matches!(j.status.as_str(), "PENDING" | "RUNNING")).count();
        assert!(in_flight <= 1, "at most one job of the user runs at a time");
        if rows.iter().all(|j| j.status == "SUCCEEDED") { Ok(()) } else { Err("") }
    })
    .await;
    // The kept counts followed every move.
    for (status, expected) in [("SUCCEEDED", 3), ("QUEUED", 0), ("PENDING", 0), ("RUNNING", 0)] {
        let listed = gateway.get(&format!("/api/v1/jobs/?status={status}"), "alice").await.json;
        assert_eq!(listed["count"], expected, "{status}");
        let scanned =
            gateway.get(&format!("/api/v1/jobs/?status={status}&created_after=2000-01-01"), "alice").await.json;
        assert_eq!(scanned["count"], expected, "{status} by scan");
    }
    // Oldest first.
    let mut started = Vec::new();
    for id in &ids {
        let events = gateway.get(&format!("/api/v1/jobs/{id}/events/"), "alice").await.json;
        let pending =
            events.as_array().unwrap().iter().find(|e| e["data"]["status"] == "PENDING").unwrap()["created"].clone();
        started.push(pending.as_str().unwrap().to_string());
    }
    let mut sorted = started.clone();
    sorted.sort();
    assert_eq!(started, sorted);
}

/// `curl` against a gateway process; returns the body.
pub(crate) fn curl(args: &[&str]) -> String {
    let output = std::process::Command::new("curl").arg("-sS").args(args).output().expect("curl runs");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn serve(dir: &std::path::Path) -> (std::process::Child, String) {
    serve_with(dir, &[])
}

/// A real `gantry serve` on `dir` with `extra` flags, ready; its child and base URL.
pub(crate) fn serve_with(dir: &std::path::Path, extra: &[&str]) -> (std::process::Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_gantry"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--scheduler-tick-ms", "50"])
        .arg("--data-dir")
        .arg(dir)
        .args(extra)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("gantry serve starts");
    let base = format!("http://127.0.0.1:{port}");
    until_blocking("gantry serve became ready", std::time::Duration::from_secs(30), || {
        curl(&[&format!("{base}/readiness/")]).contains("ready")
    });
    (child, base)
}

/// Uploads `artifact` as alice's function `fn` (entry point main.py) through `curl`.
fn upload_fn(base: &str, artifact: &std::path::Path) {
    let uploaded = curl(&[
        "-H",
        "Authorization: Bearer alice",
        "-F",
        "title=fn",
        "-F",
        "entrypoint=main.py",
        "-F",
        &format!("artifact=@{}", artifact.display()),
        &format!("{base}/api/v1/programs/upload/"),
    ]);
    assert!(uploaded.contains("\"title\":\"fn\""), "{uploaded}");
}

/// The threads of process `pid` named `name` (as `/proc` shortens it).
fn threads_named(pid: u32, name: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.unwrap().path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

/// `--db-connections` bounds the pool (each SQLite connection is a thread of its own), and
/// `--admin-listen` gives `serve` the admin port, whose metrics show the database's waits.
#[test]
fn serve_bounds_its_pool_and_shows_the_database_waits_on_its_admin_port() {
    let dir = tempfile::tempdir().unwrap();
    let admin = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let admin_flag = format!("127.0.0.1:{admin}");
    let (child, base) = serve_with(
        dir.path(),
        &["--runner", "none", "--active-jobs-per-user", "1000", "--db-connections", "3", "--admin-listen", &admin_flag],
    );
    // Killed however the test ends.
    let child = KilledOnDrop(child);
    let auth = "Authorization: Bearer alice";
    let artifact = dir.path().join("fn.tar");
    std::fs::write(&artifact, tar_of(&[("main.py", b"print('hi')\n")])).unwrap();
    upload_fn(&base, &artifact);
    // Sixteen clients at once, reading and running.
    let clients: Vec<_> = (0..16)
        .map(|i| {
            let base = base.clone();
            std::thread::spawn(move || {
                for _ in 0..10 {
                    if i % 2 == 0 {
                        curl(&["-H", auth, &format!("{base}/api/v1/jobs/?limit=10")]);
                    } else {
                        curl(&[
                            "-H",
                            auth,
                            "-H",
                            "Content-Type: application/json",
                            "-d",
                            r#"{"title": "fn", "arguments": "{}"}"#,
                            &format!("{base}/api/v1/programs/run/"),
                        ]);
                    }
                }
            })
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
    let connections = threads_named(child.0.id(), "sqlx-sqlite-wor");
    assert!((1..=3).contains(&connections), "{connections} SQLite connections with --db-connections 3");
    let metrics = curl(&[&format!("http://127.0.0.1:{admin}/metrics")]);
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.trim().parse().ok()))
            .unwrap_or_else(|| panic!("{name} missing from the admin port's metrics:\n{metrics}"))
    };
    assert!(value("gantry_db_pool_acquire_seconds_count") >= 80.0, "every read waited for a connection");
    assert!(value("gantry_db_write_lock_seconds_count") >= 80.0, "every run waited for the writer:\n{metrics}");
    assert!(value("gantry_db_write_batch_size_sum") >= 80.0, "every run was in a batch");
    assert!(value("gantry_db_write_batch_size_count") <= value("gantry_db_write_batch_size_sum"));
    let runs = curl(&["-H", auth, &format!("{base}/api/v1/jobs/?limit=1")]);
    assert!(runs.contains("\"count\":80"), "{runs}");
}

/// A child process killed (and reaped) when dropped, also when a test fails first.
struct KilledOnDrop(std::process::Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A real restart: `gantry serve` is killed while a job runs; the next one adopts the job's
/// launcher and records how the job ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_serve_adopts_a_running_job() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = dir.path().join("fn.tar");
    std::fs::write(
        &artifact,
        tar_of(&[
            ("main.py", MAIN.as_bytes()),
            ("pkg/__init__.py", b""),
            ("pkg/helper.py", b"def double(n):\n    return 2 * n\n"),
        ]),
    )
    .unwrap();
    let data = dir.path().join("data");
    let (mut first, base) = serve(&data);
    let auth = "Authorization: Bearer alice";
    upload_fn(&base, &artifact);
    let body = json!({"title": "fn", "arguments": "{\"n\": 5, \"mode\": \"nap\", \"seconds\": 4}"}).to_string();
    let run: Value = serde_json::from_str(&curl(&[
        "-H",
        auth,
        "-H",
        "Content-Type: application/json",
        "-d",
        &body,
        &format!("{base}/api/v1/programs/run/"),
    ]))
    .unwrap();
    let id = run["id"].as_str().unwrap().to_string();
    let status = |base: &str| -> Value {
        serde_json::from_str(&curl(&["-H", auth, &format!("{base}/api/v1/jobs/{id}/?with_result=false")])).unwrap()
    };
    until_blocking("the job ran", std::time::Duration::from_secs(30), || status(&base)["status"] == "RUNNING");
    first.kill().unwrap();
    first.wait().unwrap();

    let (mut second, base) = serve(&data);
    let job = eventually_blocking("the adopted job ended", std::time::Duration::from_secs(60), || {
        let job = status(&base);
        if terminal(&job) { Ok(job) } else { Err(job) }
    });
    let result = curl(&["-H", auth, &format!("{base}/api/v1/jobs/{id}/result/")]);
    let events = curl(&["-H", auth, &format!("{base}/api/v1/jobs/{id}/events/")]);
    second.kill().unwrap();
    second.wait().unwrap();
    assert_eq!(job["status"], "SUCCEEDED", "{events}");
    assert!(result.contains("doubled") && result.contains("10"), "{result}");
    assert!(!events.contains("RECONCILE"), "{events}");
}

/// Without a container engine, or asking for a GPU the machine does not have, an image
/// function's run answers 400 naming what to do, and no job is left behind.
async fn image_functions_the_machine_cannot_run_are_refused_with_the_fix(backend: Backend) {
    use gantry::compute::local::container::ContainerArgs;
    let missing =
        ContainerArgs { container_engine: "/nonexistent/podman --runtime runc".into(), ..ContainerArgs::default() };
    let missing = missing.engine().await;
    let gateway = Gateway::start(backend).await.with_runner(|config| config.containers = missing).await;
    gateway.provider("acme", None, "erin").await;
    let uploaded = gateway
        .post_json(
            "/api/v1/programs/upload/",
            "erin",
            json!({"title": "imagefn", "provider": "acme", "image": "localhost/fn:1"}),
        )
        .await;
    assert_eq!(uploaded.status.as_u16(), 200, "{:?}", uploaded.json);
    let refused = gateway
        .post_json("/api/v1/programs/run/", "erin", json!({"title": "imagefn", "provider": "acme", "arguments": "{}"}))
        .await;
    assert_eq!(refused.status.as_u16(), 400, "{:?}", refused.json);
    let message = refused.message();
    assert!(
        message.starts_with("Function imagefn cannot run here: the container engine `/nonexistent/podman"),
        "{message}"
    );
    assert!(message.contains("apt-get install podman runc"), "{message}");
    let jobs = gateway.get("/api/v1/jobs/", "erin").await;
    assert_eq!(jobs.json["count"], 0, "no job is created: {:?}", jobs.json);

    // An engine that is there (a stand-in command that answers --version), and a GPU function:
    // refused on a machine without a CDI description of its GPUs.
    let engine = ContainerArgs { container_engine: "/bin/echo podman version 4".into(), ..ContainerArgs::default() };
    let engine = engine.engine().await;
    assert!(engine.is_available());
    let gateway = Gateway::start(backend).await.with_runner(|config| config.containers = engine).await;
    gateway.provider("acme", None, "erin").await;
    let fields = json!({"title": "gpufn", "provider": "acme", "image": "localhost/fn:1", "gpu": true});
    assert_eq!(gateway.post_json("/api/v1/programs/upload/", "erin", fields).await.status.as_u16(), 200);
    let refused = gateway
        .post_json("/api/v1/programs/run/", "erin", json!({"title": "gpufn", "provider": "acme", "arguments": "{}"}))
        .await;
    if std::path::Path::new("/etc/cdi").exists() || std::path::Path::new("/var/run/cdi").exists() {
        return; // a machine with CDI descriptions may have GPUs: nothing to assert here
    }
    assert_eq!(refused.status.as_u16(), 400, "{:?}", refused.json);
    let message = refused.message();
    assert!(
        message.contains("asks for a GPU and this machine has none") && message.contains("nvidia.com/gpu=all"),
        "{message}"
    );
    assert_eq!(gateway.get("/api/v1/jobs/", "erin").await.json["count"], 0);
}
