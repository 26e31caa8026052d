//! Fair shares between tenants (issue 48) on both runners: quotas declared and changed live
//! with `gantry admin set-quota`, a tenant taking its guarantee back from backfill (the youngest
//! backfill job stopped after the grace, with a reason naming the tenant; a job that is not
//! backfill never stopped), admissions with their reason, and what `jobs/queue/` says holds a
//! job (`tenant_quota`, `borrowing_cap`) with the tenant's figures.

use std::time::Duration;

use gantry::admin::AdminCommand;
use gantry::compute::quotas::Cap;
use gantry::domain::admission::FairShare;
use serde_json::{Value, json};

use crate::both_backends;
use crate::controller::Cluster;
use crate::eventually::eventually;
use crate::harness::{Backend, Gateway, tar_of};

both_backends!(
    a_tenant_takes_its_guarantee_back_from_backfill_on_the_local_runner,
    a_reclaimed_backfill_job_whose_function_allows_retries_is_queued_again_on_the_local_runner,
    a_users_stop_wins_over_a_reclaim,
);

/// Sleeps `sleep` seconds (its arguments), then ends well.
const SLEEPER: &str = "import json, os, time\nwith open(os.environ['ARGUMENTS_PATH']) as f:\n    time.sleep(json.load(f).get('sleep', 0))\n";

/// `set-quota` for the provider `acme`.
fn quota(cpu: Option<i64>, cpu_borrow_cap: Option<Cap>, remove: bool) -> AdminCommand {
    AdminCommand::SetQuota {
        provider: Some("acme".into()),
        group: None,
        instance: None,
        cpu,
        gpu: None,
        cpu_borrow_cap,
        gpu_borrow_cap: None,
        gpu_model: None,
        weight: None,
        remove,
    }
}

async fn upload(gateway: &Gateway, user: &str, fields: &[(&str, &str)]) {
    let artifact = tar_of(&[("main.py", SLEEPER.as_bytes())]);
    let mut all = vec![("entrypoint", "main.py")];
    all.extend_from_slice(fields);
    let reply =
        gateway.post_multipart("/api/v1/programs/upload/", user, &all, &[("artifact", "a.tar", &artifact)]).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
}

async fn run(gateway: &Gateway, user: &str, body: Value) -> String {
    let reply = gateway.post_json("/api/v1/programs/run/", user, body).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    reply.json["id"].as_str().unwrap().to_string()
}

async fn status(gateway: &Gateway, user: &str, id: &str) -> Value {
    gateway.get(&format!("/api/v1/jobs/{id}/"), user).await.json
}

/// The reason of the job's move into PENDING (its admission).
async fn admission_reason(gateway: &Gateway, user: &str, id: &str) -> Option<String> {
    let events = gateway.get(&format!("/api/v1/jobs/{id}/events/"), user).await.json;
    events.as_array()?.iter().find(|e| e["data"]["status"] == "PENDING")?["data"]["reason"].as_str().map(str::to_string)
}

/// Waits until `user`'s queue page shows `id` held for `reason`; answers the page.
async fn held_for(gateway: &Gateway, user: &str, id: &str, reason: &str) -> Value {
    eventually(&format!("job {id} held for {reason}"), Duration::from_secs(30), || async {
        let page = gateway.get("/api/v1/jobs/queue/", user).await.json;
        let job = page["jobs"].as_array().and_then(|jobs| jobs.iter().find(|j| j["id"] == id).cloned());
        match job {
            Some(job) if job["waiting_for"] == reason => Ok(page),
            _ => Err(page),
        }
    })
    .await
}

async fn a_tenant_takes_its_guarantee_back_from_backfill_on_the_local_runner(backend: Backend) {
    let limits = gantry::domain::admission::Limits { jobs_per_user: 5, cpu_slots: 2, gpu_slots: 1 };
    let gateway = Gateway::start_with(backend, |config| config.admission = Some(limits))
        .await
        .with_runner(|config| {
            config.limits.cpu_slots = 2;
            config.limits.jobs_per_user = 5;
            config.fair_share = FairShare { grace: Duration::from_secs(2), max_preemptions: 5, ..FairShare::default() };
        })
        .await;
    gateway.provider("acme", None, "erin").await;
    upload(&gateway, "erin", &[("title", "work"), ("provider", "acme")]).await;
    upload(&gateway, "bob", &[("title", "filler"), ("backfill", "true")]).await;
    upload(&gateway, "bob", &[("title", "plain")]).await;

    // A run's config must say backfill plainly.
    let bad = gateway
        .post_json(
            "/api/v1/programs/run/",
            "bob",
            json!({"title": "plain", "arguments": "{}", "config": {"backfill": "yes"}}),
        )
        .await;
    assert_eq!(bad.status, 400, "{}", bad.json);
    assert!(bad.message().contains("'config.backfill' must be true or false"), "{}", bad.message());

    // No tenant yet: bob's backfill job and his plain one take both slots.
    let sleep = |seconds: u64| json!({"sleep": seconds}).to_string();
    let backfill = run(&gateway, "bob", json!({"title": "filler", "arguments": sleep(300)})).await;
    let firm = run(&gateway, "bob", json!({"title": "plain", "arguments": sleep(8)})).await;
    for id in [&backfill, &firm] {
        gateway.wait_for_job("bob", id, 60, |job| job["status"] == "RUNNING").await;
    }
    assert_eq!(admission_reason(&gateway, "bob", &backfill).await, None, "no tenant declared: no reason");

    // acme is guaranteed a CPU slot, live.
    let said = gateway.admin(quota(Some(1), None, false)).await;
    assert!(said.contains("tenant provider:acme: CPU 1 guaranteed (no cap)"), "{said}");
    assert!(said.contains("new"), "{said}");
    let work = run(&gateway, "erin", json!({"title": "work", "provider": "acme", "arguments": sleep(0)})).await;
    // Its guarantee is lent out: it waits for it (until the grace, then backfill is stopped).
    let page = held_for(&gateway, "erin", &work, "tenant_quota").await;
    let tenant = &page["tenants"][0];
    assert_eq!(tenant["name"], "provider:acme", "{page}");
    assert_eq!((tenant["cpu"]["guaranteed"].as_i64(), tenant["cpu"]["lent"].as_i64()), (Some(1), Some(1)), "{page}");
    assert_eq!(page["jobs"][0]["tenant"], "provider:acme", "{page}");

    // After the grace: the backfill job is stopped, naming the tenant; the plain one runs on.
    let stopped = gateway.wait_for_job("bob", &backfill, 60, |job| job["status"] == "STOPPED").await;
    assert_eq!((stopped["tenant"].as_str(), stopped["backfill"].as_bool()), (None, Some(true)), "{stopped}");
    let reason = stopped["status_reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("Preempted: tenant provider:acme reclaimed its guaranteed capacity"), "{stopped}");
    let done = gateway.wait_for_job("erin", &work, 60, |job| job["status"] == "SUCCEEDED").await;
    assert_eq!(done["status"], "SUCCEEDED", "{done}");
    assert_eq!((done["tenant"].as_str(), done.get("backfill")), (Some("provider:acme"), None), "{done}");
    assert_eq!(
        admission_reason(&gateway, "erin", &work).await.as_deref(),
        Some("admitted within the guarantee of tenant provider:acme")
    );
    assert_eq!(
        status(&gateway, "bob", &firm).await["status"],
        "RUNNING",
        "a job that is not backfill is never stopped"
    );

    // Its quotas changed live: no guarantee and nothing to borrow holds its next job.
    gateway.admin(quota(Some(0), Some(Cap(Some(0))), false)).await;
    let capped = run(&gateway, "erin", json!({"title": "work", "provider": "acme", "arguments": sleep(0)})).await;
    held_for(&gateway, "erin", &capped, "borrowing_cap").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(status(&gateway, "erin", &capped).await["status"], "QUEUED", "held at its cap");
    let listed = gateway.admin(AdminCommand::Quotas).await;
    assert!(listed.contains("provider:acme (weight 1): CPU guaranteed 0, borrowing cap 0"), "{listed}");
    // No cap: it borrows the free slot.
    gateway.admin(quota(None, Some(Cap(None)), false)).await;
    let done = gateway.wait_for_job("erin", &capped, 60, |job| job["status"] == "SUCCEEDED").await;
    assert_eq!(done["status"], "SUCCEEDED", "{done}");
    assert_eq!(
        admission_reason(&gateway, "erin", &capped).await.as_deref(),
        Some("admitted on capacity lent to tenant provider:acme")
    );

    // Removed: its jobs count against no tenant again.
    let removed = gateway.admin(quota(None, None, true)).await;
    assert!(removed.contains("tenant provider:acme removed"), "{removed}");
    let free = run(&gateway, "erin", json!({"title": "work", "provider": "acme", "arguments": sleep(0)})).await;
    gateway.wait_for_job("erin", &free, 60, |job| job["status"] == "SUCCEEDED").await;
    let page = gateway.get("/api/v1/jobs/queue/", "erin").await.json;
    assert_eq!(page["tenants"], json!([]), "{page}");
}

/// The statuses a job moved through, oldest first, with each move's reason and time (microseconds).
async fn moves(gateway: &Gateway, user: &str, id: &str) -> Vec<(String, Option<String>, i64)> {
    let events = gateway.get(&format!("/api/v1/jobs/{id}/events/"), user).await.json;
    let time = |e: &Value| {
        let text = e["created"].as_str().unwrap_or_default();
        chrono::DateTime::parse_from_rfc3339(text).map_or(0, |t| t.timestamp_micros())
    };
    let mut moves: Vec<_> = events
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["event_type"] == "STATUS_CHANGE")
        .map(|e| {
            let status = e["data"]["status"].as_str().unwrap_or_default().to_string();
            (status, e["data"]["reason"].as_str().map(str::to_string), time(e))
        })
        .collect();
    moves.sort_by_key(|(.., at)| *at);
    moves
}

async fn a_reclaimed_backfill_job_whose_function_allows_retries_is_queued_again_on_the_local_runner(backend: Backend) {
    let gateway = Gateway::start(backend)
        .await
        .with_runner(|config| {
            config.limits.cpu_slots = 1;
            config.fair_share = FairShare { grace: Duration::from_secs(1), max_preemptions: 5, ..FairShare::default() };
        })
        .await;
    gateway.provider("acme", None, "erin").await;
    upload(&gateway, "erin", &[("title", "work"), ("provider", "acme")]).await;
    upload(&gateway, "bob", &[("title", "filler"), ("backfill", "true"), ("retry_after_start", "true")]).await;
    let sleep = |seconds: u64| json!({"sleep": seconds}).to_string();
    let backfill = run(&gateway, "bob", json!({"title": "filler", "arguments": sleep(4)})).await;
    gateway.wait_for_job("bob", &backfill, 60, |job| job["status"] == "RUNNING").await;

    gateway.admin(quota(Some(1), None, false)).await;
    let work = run(&gateway, "erin", json!({"title": "work", "provider": "acme", "arguments": sleep(2)})).await;
    // Reclaimed after the grace, queued again (not STOPPED), it runs again once acme's job ends.
    gateway.wait_for_job("erin", &work, 60, |job| job["status"] == "SUCCEEDED").await;
    let done = gateway.wait_for_job("bob", &backfill, 60, |job| job["status"] == "SUCCEEDED").await;
    assert_eq!(done["status"], "SUCCEEDED", "{done}");
    let moves = moves(&gateway, "bob", &backfill).await;
    let statuses: Vec<&str> = moves.iter().map(|(status, ..)| status.as_str()).collect();
    assert_eq!(statuses, ["QUEUED", "PENDING", "RUNNING", "QUEUED", "PENDING", "RUNNING", "SUCCEEDED"], "{moves:?}");
    let requeued = moves[3].1.as_deref().unwrap_or_default();
    assert!(requeued.starts_with("Preempted: tenant provider:acme reclaimed its guaranteed capacity"), "{requeued}");
    assert!(requeued.contains("queued again"), "{requeued}");

    // Its one usage record meters both runs, not the wait between them.
    let record = gantry::db::usage::record(&gateway.state.db, &backfill).await.unwrap().expect("a record");
    let runs = (moves[3].2 - moves[2].2) + (moves[6].2 - moves[5].2);
    let waits = (moves[2].2 - moves[0].2) + (moves[5].2 - moves[3].2);
    assert!((record.run_ms - runs / 1000).abs() <= 50, "run {} ms, the runs {} ms", record.run_ms, runs / 1000);
    assert!((record.wait_ms - waits / 1000).abs() <= 50, "wait {} ms, the waits {} ms", record.wait_ms, waits / 1000);
    assert!(record.run_ms >= 4000, "{record:?}");
}

/// A user's stop of a backfill job a tenant reclaimed: it ends as the user's stop, never queued
/// again, even when its function allows retries after start.
async fn a_users_stop_wins_over_a_reclaim(backend: Backend) {
    use gantry::domain::lifecycle::{JobStatus, Trigger, decide};
    let gateway = Gateway::start(backend).await;
    upload(&gateway, "bob", &[("title", "filler"), ("backfill", "true"), ("retry_after_start", "true")]).await;
    let id = run(&gateway, "bob", json!({"title": "filler", "arguments": "{}"})).await;
    let db = &gateway.state.db;
    let admitted = decide(JobStatus::Queued, &Trigger::Admitted).unwrap();
    assert!(gantry::db::jobs::apply_move(db, &id, &admitted, false).await.unwrap().is_some());
    assert!(gantry::db::jobs::mark_preempted(db, &id, "provider:acme").await.unwrap());
    let reclaimed = gantry::db::jobs::state(db, &id).await.unwrap().unwrap();
    assert_eq!(reclaimed.stop_trigger(), Trigger::Preempted { tenant: "provider:acme".into(), requeue: true });
    assert!(gantry::db::jobs::mark_stop_requested(db, &id).await.unwrap());
    let stopped = gantry::db::jobs::state(db, &id).await.unwrap().unwrap();
    assert_eq!(stopped.stop_trigger(), Trigger::StopRequested);
}

/// The same reclaim on the Kubernetes doubles: the youngest backfill pod is deleted after the
/// grace, its job STOPPED naming the tenant, the other backfill job runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_takes_its_guarantee_back_from_backfill_pods() {
    let gateway = Gateway::start(Backend::PostgresS3).await;
    let cluster = Cluster::start_tuned(gateway, Duration::from_secs(600), Duration::from_secs(3600), |settings| {
        settings.limits.cpu_slots = 2;
        settings.limits.jobs_per_user = 5;
        settings.fair_share = FairShare { grace: Duration::from_secs(1), max_preemptions: 1, ..FairShare::default() };
    })
    .await;
    let gateway = &cluster.gateway;
    gateway.provider("acme", None, "erin").await;
    upload(gateway, "erin", &[("title", "work"), ("provider", "acme")]).await;
    upload(gateway, "alice", &[("title", "filler")]).await;
    let sleep = |seconds: u64| json!({"sleep": seconds}).to_string();
    let backfill_run = json!({"title": "filler", "arguments": sleep(300), "config": {"backfill": true}});
    let older = run(gateway, "alice", backfill_run.clone()).await;
    gateway.wait_for_job("alice", &older, 60, |job| job["status"] == "RUNNING").await;
    let younger = run(gateway, "alice", backfill_run).await;
    gateway.wait_for_job("alice", &younger, 60, |job| job["status"] == "RUNNING").await;

    let said = gateway.admin(quota(Some(1), None, false)).await;
    assert!(said.contains("new"), "{said}");
    let work = run(gateway, "erin", json!({"title": "work", "provider": "acme", "arguments": sleep(0)})).await;
    let stopped = gateway.wait_for_job("alice", &younger, 60, |job| job["status"] == "STOPPED").await;
    let reason = stopped["status_reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("Preempted: tenant provider:acme reclaimed its guaranteed capacity"), "{stopped}");
    let done = gateway.wait_for_job("erin", &work, 60, |job| job["status"] == "SUCCEEDED").await;
    assert_eq!(done["status"], "SUCCEEDED", "{done}");
    assert_eq!(status(gateway, "alice", &older).await["status"], "RUNNING", "one reclaimed slot, one job stopped");
    cluster.resource_until(&younger, |r| r["status"]["phase"] == "STOPPED").await;
}

/// On the Kubernetes doubles: a reclaimed backfill job whose function allows retries after start
/// is queued again; its pod goes, and once admitted again a new pod runs it to its end. The
/// FunctionJob's status keeps the reclaimed attempt (`requeued`), which is no infrastructure retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaimed_backfill_pod_whose_function_allows_retries_runs_again_once_admitted() {
    let gateway = Gateway::start(Backend::PostgresS3).await;
    let cluster = Cluster::start_tuned(gateway, Duration::from_secs(600), Duration::from_secs(3600), |settings| {
        settings.limits.cpu_slots = 1;
        settings.fair_share = FairShare { grace: Duration::from_secs(1), max_preemptions: 1, ..FairShare::default() };
    })
    .await;
    let gateway = &cluster.gateway;
    gateway.provider("acme", None, "erin").await;
    upload(gateway, "erin", &[("title", "work"), ("provider", "acme")]).await;
    upload(gateway, "alice", &[("title", "filler"), ("retry_after_start", "true")]).await;
    let sleep = |seconds: u64| json!({"sleep": seconds}).to_string();
    let backfill =
        run(gateway, "alice", json!({"title": "filler", "arguments": sleep(3), "config": {"backfill": true}})).await;
    gateway.wait_for_job("alice", &backfill, 60, |job| job["status"] == "RUNNING").await;
    let first_pod =
        cluster.resource_until(&backfill, |r| r["status"]["podUid"].is_string()).await["status"]["podUid"].clone();

    gateway.admin(quota(Some(1), None, false)).await;
    let work = run(gateway, "erin", json!({"title": "work", "provider": "acme", "arguments": sleep(1)})).await;
    gateway.wait_for_job("erin", &work, 60, |job| job["status"] == "SUCCEEDED").await;
    let done = gateway.wait_for_job("alice", &backfill, 90, |job| job["status"] == "SUCCEEDED").await;
    assert_eq!(done["status"], "SUCCEEDED", "{done}");
    let moves = moves(gateway, "alice", &backfill).await;
    let statuses: Vec<&str> = moves.iter().map(|(status, ..)| status.as_str()).collect();
    assert_eq!(statuses, ["QUEUED", "PENDING", "RUNNING", "QUEUED", "PENDING", "RUNNING", "SUCCEEDED"], "{moves:?}");
    assert!(moves[3].1.as_deref().unwrap_or_default().contains("queued again"), "{moves:?}");

    let resource = cluster.resource_until(&backfill, |r| r["status"]["phase"] == "SUCCEEDED").await;
    let retries = &resource["status"]["retries"];
    assert_eq!(retries.as_array().map(Vec::len), Some(1), "{resource}");
    assert_eq!((retries[0]["requeued"].as_bool(), &retries[0]["podUid"]), (Some(true), &first_pod), "{resource}");
    assert_ne!(resource["status"]["podUid"], first_pod, "a new pod ran it: {resource}");
    let state = gantry::db::jobs::state(&gateway.state.db, &backfill).await.unwrap().unwrap();
    assert_eq!((state.infrastructure_retries, state.requeues), (0, 1));
}
