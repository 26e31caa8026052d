//! Usage events (issue 47 item 4): a job's usage leaves through the outbox as its own stream of
//! CloudEvents — started, a licence for a provider's function, in progress every period while it
//! runs, completed with its usage record — once each, in order, with a gapless sequence, through
//! a receiver that is down for a while; a job that never ran has only its completed event, and no
//! "in progress" event ever follows the end.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gantry::db::outbox::Outbox;
use gantry::domain::lifecycle::{JobStatus, Trigger, decide};
use gantry::domain::usage::Allocation;
use serde_json::{Value, json};

use crate::both_backends;
use crate::eventually::until;
use crate::harness::{Backend, Gateway};

both_backends!(
    usage_events_leave_once_each_in_order_through_an_outage,
    progress_events_are_due_by_period_and_never_follow_the_end,
    the_local_runner_records_what_a_job_used,
    a_write_that_reads_first_holds_while_another_connection_writes,
);

/// A webhook receiver on loopback: answers 503 while `down` (as a broker that is out), else 200
/// and keeps the event. The soak uses it too.
pub struct Receiver {
    pub url: String,
    pub down: Arc<AtomicBool>,
    /// (accepted, the event) of every request, in arrival order.
    pub requests: Arc<Mutex<Vec<(bool, Value)>>>,
}

impl Receiver {
    /// A receiver that is down until told otherwise.
    pub async fn start() -> Receiver {
        let down = Arc::new(AtomicBool::new(true));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (is_down, seen) = (Arc::clone(&down), Arc::clone(&requests));
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |body: axum::body::Bytes| {
                let (is_down, seen) = (Arc::clone(&is_down), Arc::clone(&seen));
                async move {
                    let accepted = !is_down.load(Ordering::SeqCst);
                    seen.lock().unwrap().push((accepted, serde_json::from_slice::<Value>(&body).unwrap()));
                    if accepted { axum::http::StatusCode::OK } else { axum::http::StatusCode::SERVICE_UNAVAILABLE }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Receiver { url, down, requests }
    }

    /// The usage events accepted, by job, in arrival order.
    pub fn accepted_usage(&self) -> BTreeMap<String, Vec<Value>> {
        let mut by_job: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for (_, event) in self.requests.lock().unwrap().iter().filter(|(accepted, event)| *accepted && is_usage(event))
        {
            by_job.entry(event["subject"].as_str().unwrap().to_string()).or_default().push(event.clone());
        }
        by_job
    }
}

fn is_usage(event: &Value) -> bool {
    event["type"].as_str().is_some_and(|kind| kind.starts_with("dev.gantry.usage."))
}

/// A usage event's kind: `started`, `licence`, `in_progress` or `completed`.
pub fn kind(event: &Value) -> &str {
    event["type"].as_str().unwrap().trim_start_matches("dev.gantry.usage.")
}

async fn with_usage_events(backend: Backend, url: &str, progress: &str) -> Gateway {
    Gateway::start(backend)
        .await
        .with_events(|events| {
            events.events_webhook_url = vec![url.to_string()];
            events.events_webhook_secret = Some(gantry::secrets::Secret::new("hook-key".into()));
            events.events_usage = true;
            events.events_usage_progress = gantry::events::parse_every(progress).unwrap();
        })
        .await
}

/// Runs `title` as `user` and moves it into RUNNING as a runner would (with usage events).
async fn run_and_start(gateway: &Gateway, user: &str, body: Value) -> String {
    let reply = gateway.post_json("/api/v1/programs/run/", user, body).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    let id = reply.json["id"].as_str().unwrap().to_string();
    let db = &gateway.state.db;
    let allocation = Allocation {
        compute_profile: Some("cx-2x8".into()),
        cpu_millis: 2000,
        memory_mib: 8192,
        ..Allocation::default()
    };
    gantry::db::jobs::record_allocation(db, &id, &allocation).await.unwrap();
    for (from, trigger) in [(JobStatus::Queued, Trigger::Admitted), (JobStatus::Pending, Trigger::Started)] {
        let mv = decide(from, &trigger).unwrap();
        assert!(gantry::db::jobs::apply_move(db, &id, &mv, Outbox::JobsAndUsage).await.unwrap().is_some());
    }
    id
}

async fn end(gateway: &Gateway, id: &str, trigger: Trigger) {
    let mv = decide(JobStatus::Running, &trigger).unwrap();
    assert!(gantry::db::jobs::apply_move(&gateway.state.db, id, &mv, Outbox::JobsAndUsage).await.unwrap().is_some());
}

async fn usage_events_leave_once_each_in_order_through_an_outage(backend: Backend) {
    // The receiver is down from the start: every event waits in the outbox, retried.
    let receiver = Receiver::start().await;
    let gateway = with_usage_events(backend, &receiver.url, "1s").await;
    gateway.provider("acme", None, "erin").await;
    gateway.upload_function("erin", &[("title", "acme/solver"), ("entrypoint", "main.py")]).await;
    gateway.upload_function("alice", &[("title", "mine"), ("entrypoint", "main.py")]).await;
    let solver =
        run_and_start(&gateway, "erin", json!({"title": "solver", "provider": "acme", "arguments": "{}"})).await;
    let mine = run_and_start(&gateway, "alice", json!({"title": "mine", "arguments": "{}"})).await;
    let reply = gateway.post_json("/api/v1/programs/run/", "alice", json!({"title": "mine", "arguments": "{}"})).await;
    let never_ran = reply.json["id"].as_str().unwrap().to_string();
    let stopped = gateway.post_json(&format!("/api/v1/jobs/{never_ran}/stop/"), "alice", json!({})).await;
    assert_eq!(stopped.status, 200, "{}", stopped.json);
    end(&gateway, &mine, Trigger::Crashed { reason: "exit code 1".into() }).await;
    // The solver runs through at least two progress periods while the receiver is down.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    end(&gateway, &solver, Trigger::Exited { success: true }).await;
    let refused = receiver.requests.lock().unwrap().len();
    assert!(refused > 0, "the events were tried while the receiver was down");
    receiver.down.store(false, Ordering::SeqCst);

    let db = &gateway.state.db;
    until("every event is delivered once the receiver is back", Duration::from_secs(90), || async move {
        let (waiting, _, failed) = gantry::db::outbox::counts(db).await.unwrap();
        waiting == 0 && failed == 0
    })
    .await;
    let by_job = receiver.accepted_usage();
    let kinds = |id: &str| by_job[id].iter().map(|event| kind(event).to_string()).collect::<Vec<_>>();
    let solver_kinds = kinds(&solver);
    let progress = solver_kinds.iter().filter(|k| *k == "in_progress").count();
    assert!(progress >= 2, "{solver_kinds:?}");
    let mut expected = vec!["started".to_string(), "licence".to_string()];
    expected.extend(std::iter::repeat_n("in_progress".to_string(), progress));
    expected.push("completed".into());
    assert_eq!(solver_kinds, expected, "in order, each once");
    // A user's own function has no licence; the one stopped while queued only its end.
    let mine_kinds = kinds(&mine);
    assert_eq!(
        (mine_kinds.first().map(String::as_str), mine_kinds.last().map(String::as_str)),
        (Some("started"), Some("completed")),
        "{mine_kinds:?}"
    );
    assert!(!mine_kinds.contains(&"licence".to_string()), "{mine_kinds:?}");
    assert_eq!(kinds(&never_ran), ["completed"]);
    for (job, events) in &by_job {
        let sequences: Vec<i64> = events.iter().map(|e| e["sequence"].as_str().unwrap().parse().unwrap()).collect();
        assert_eq!(sequences, (1..=events.len() as i64).collect::<Vec<_>>(), "{job}: a gapless sequence");
        let ids: HashSet<&str> = events.iter().map(|e| e["id"].as_str().unwrap()).collect();
        assert_eq!(ids.len(), events.len(), "{job}: none twice");
    }
    // Every refused event was delivered later, with the same id (none lost).
    let requests = receiver.requests.lock().unwrap().clone();
    let accepted: HashSet<&str> =
        requests.iter().filter(|(ok, _)| *ok).map(|(_, e)| e["id"].as_str().unwrap()).collect();
    assert!(requests.iter().all(|(_, event)| accepted.contains(event["id"].as_str().unwrap())));

    // The completed event is the usage record, in the existing gateway's billing fields too.
    for (job, status) in [(&solver, "SUCCEEDED"), (&mine, "FAILED"), (&never_ran, "STOPPED")] {
        let record = gantry::db::usage::record(db, job).await.unwrap().unwrap();
        let completed = by_job[job.as_str()].last().unwrap();
        let data = &completed["data"];
        assert_eq!(completed["subject"], job.as_str());
        assert_eq!(data["event"], "function_job_completed");
        assert_eq!((data["status"].as_str(), record.status.as_str()), (Some(status), status));
        assert_eq!(data["metric_value"], record.run_ms, "{data}");
        assert_eq!(data["run_ms"], record.run_ms);
        assert_eq!(data["wait_ms"], record.wait_ms);
        assert_eq!(data["cpu_core_ms"], record.cpu_core_ms);
        assert_eq!(data["resource_id"], job.as_str());
        assert_eq!(data["business_model"], "SUBSIDIZED");
        assert_eq!(data["job_completed"], gantry::db::format_timestamp(record.ended));
    }
    let solver_done = &by_job[&solver].last().unwrap()["data"];
    assert_eq!(
        (solver_done["metric_type"].as_str(), solver_done["provider"].as_str()),
        (Some("classical_cx-2x8"), Some("acme"))
    );
    assert!(solver_done["job_started"].is_string() && solver_done["metric_value"].as_i64().unwrap() >= 3000);
    let never = &by_job[&never_ran][0]["data"];
    assert_eq!((never["metric_value"].as_i64(), never["job_started"].is_null()), (Some(0), true), "{never}");
    let licence = &by_job[&solver][1]["data"];
    assert_eq!((licence["metric_type"].as_str(), licence["metric_value"].as_i64()), (Some("licence"), Some(1)));
    assert_eq!((licence["function"].as_str(), licence["user"].as_str()), (Some("solver"), Some("erin")));
    // In progress: what it used so far, growing.
    let so_far: Vec<i64> = by_job[&solver]
        .iter()
        .filter(|event| kind(event) == "in_progress")
        .map(|event| event["data"]["metric_value"].as_i64().unwrap())
        .collect();
    assert!(so_far.windows(2).all(|pair| pair[0] < pair[1]) && so_far[0] >= 1000, "{so_far:?}");

    // Nothing follows the end.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(receiver.accepted_usage(), by_job);
}

async fn progress_events_are_due_by_period_and_never_follow_the_end(backend: Backend) {
    // No publisher loop here: the progress statement itself, with a period of one hour.
    let receiver = Receiver::start().await;
    let gateway = with_usage_events(backend, &receiver.url, "off").await;
    gateway.upload_function("alice", &[("title", "mine"), ("entrypoint", "main.py")]).await;
    let running = run_and_start(&gateway, "alice", json!({"title": "mine", "arguments": "{}"})).await;
    let db = &gateway.state.db;
    let hour = 3_600_000_000;
    let now = gantry::db::now_micros();
    assert_eq!(gantry::db::jobs::record_progress(db, hour, now).await.unwrap(), 0, "not due within the hour");
    assert_eq!(gantry::db::jobs::record_progress(db, hour, now + hour).await.unwrap(), 1, "due after it");
    assert_eq!(gantry::db::jobs::record_progress(db, hour, now + hour).await.unwrap(), 0, "once a period");
    assert_eq!(gantry::db::jobs::record_progress(db, hour, now + 2 * hour + 1).await.unwrap(), 1);
    end(&gateway, &running, Trigger::Exited { success: true }).await;
    assert_eq!(gantry::db::jobs::record_progress(db, hour, now + 5 * hour).await.unwrap(), 0, "ended: none");

    receiver.down.store(false, Ordering::SeqCst);
    let (seen, job) = (&receiver, &running);
    until("the four usage events arrive", Duration::from_secs(30), || async move {
        seen.accepted_usage().get(job).map_or(0, Vec::len) == 4
    })
    .await;
    let kinds: Vec<String> = receiver.accepted_usage()[&running].iter().map(|e| kind(e).to_string()).collect();
    assert_eq!(kinds, ["started", "in_progress", "in_progress", "completed"]);
    // `--events-usage false` (the job events' own tests run so): moves record job events only.
    assert_eq!(gateway.state.publisher.moves_outbox(), Outbox::JobsAndUsage);
    let off = Gateway::start(backend)
        .await
        .with_events(|events| {
            events.events_webhook_url = vec![receiver.url.clone()];
            events.events_webhook_secret = Some(gantry::secrets::Secret::new("hook-key".into()));
        })
        .await;
    assert_eq!(off.state.publisher.moves_outbox(), Outbox::Jobs);
}

/// A transaction that reads before it writes (the progress statement reads the running jobs, then
/// numbers their events) holds while another connection commits meanwhile: on SQLite a deferred
/// transaction fails at once there ("database is locked", SQLITE_BUSY_SNAPSHOT) whatever the busy
/// timeout, so write transactions take the write lock when they begin (CI caught this once).
async fn a_write_that_reads_first_holds_while_another_connection_writes(backend: Backend) {
    let receiver = Receiver::start().await;
    let gateway = with_usage_events(backend, &receiver.url, "off").await;
    gateway.upload_function("alice", &[("title", "mine"), ("entrypoint", "main.py")]).await;
    let running = run_and_start(&gateway, "alice", json!({"title": "mine", "arguments": "{}"})).await;
    let other = run_and_start(&gateway, "alice", json!({"title": "mine", "arguments": "{}"})).await;
    let db = gateway.state.db.clone();
    let stop = Arc::new(AtomicBool::new(false));
    // Another writer that, like a single-statement write, does not take this process's lock.
    let writer = tokio::spawn({
        let (db, stop) = (db.clone(), stop.clone());
        async move {
            let mut writes = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let statement = "UPDATE jobs SET last_activity = last_activity + 1 WHERE id = $1";
                match &db {
                    gantry::db::Db::Sqlite(pool, _) => {
                        sqlx::query(statement).bind(&other).execute(pool).await.map(drop)
                    }
                    gantry::db::Db::Postgres(pool) => sqlx::query(statement).bind(&other).execute(pool).await.map(drop),
                }
                .unwrap();
                writes += 1;
            }
            writes
        }
    });
    let hour = 3_600_000_000;
    let now = gantry::db::now_micros();
    for period in 1..=200 {
        let recorded = gantry::db::jobs::record_progress(&db, hour, now + period * hour).await;
        assert_eq!(recorded.unwrap(), 2, "period {period}");
    }
    stop.store(true, Ordering::SeqCst);
    assert!(writer.await.unwrap() > 0);
    let _ = running;
}

/// The local runner keeps what a job's processes used (its cgroup's counters where it has one,
/// else what its launcher's waited-for processes used) in the job's record.
async fn the_local_runner_records_what_a_job_used(backend: Backend) {
    let gateway = Gateway::start(backend).await.with_runner(|_| {}).await;
    let main = "block = bytearray(96 << 20)\nfor i in range(0, len(block), 4096): block[i] = 1\n\
                import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\n";
    let artifact = crate::harness::tar_of(&[("main.py", main.as_bytes())]);
    let reply = gateway
        .post_multipart(
            "/api/v1/programs/upload/",
            "alice",
            &[("title", "busy"), ("entrypoint", "main.py")],
            &[("artifact", "artifact.tar", &artifact)],
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    let reply = gateway.post_json("/api/v1/programs/run/", "alice", json!({"title": "busy", "arguments": "{}"})).await;
    let id = reply.json["id"].as_str().unwrap().to_string();
    let job = gateway
        .wait_for_job("alice", &id, 120, |job| {
            matches!(job["status"].as_str(), Some("SUCCEEDED" | "FAILED" | "STOPPED"))
        })
        .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    let record = gantry::db::usage::record(&gateway.state.db, &id).await.unwrap().unwrap();
    let cpu = record.cpu_used_ms.expect("CPU time measured");
    assert!((450..60_000).contains(&cpu), "{record:?}");
    assert!(record.memory_peak_bytes.expect("peak memory measured") >= 96 << 20, "{record:?}");
    assert!(cpu <= record.run_ms * 2 + 1000, "at most what the run time allows on two cores: {record:?}");
    // The job's usage answer shows them too.
    let usage = gateway.get(&format!("/api/v1/jobs/{id}/usage/"), "alice").await.json;
    assert_eq!(usage["cpu_used_seconds"].as_f64(), Some(cpu as f64 / 1000.0), "{usage}");
    assert_eq!(usage["memory_peak_bytes"].as_i64(), record.memory_peak_bytes, "{usage}");
}
