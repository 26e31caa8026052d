//! The web console's files (served without a token, under a strict policy) and `jobs/queue/`,
//! the API addition its queue panel reads. The console itself is tested in a real browser by
//! tests/console/run.sh.

use axum::body::Body;
use axum::http::{Request, header};
use serde_json::{Value, json};

use crate::both_backends;
use crate::harness::{Backend, Gateway};

both_backends!(
    the_console_is_served_under_a_strict_policy,
    the_queue_says_where_my_jobs_stand,
    the_queue_says_which_limit_holds_each_queued_job,
    the_slots_in_use_are_kept_with_every_move,
);

/// A GET without a token: status, headers and body.
async fn anonymous(gateway: &Gateway, uri: &str, headers: &[(&str, &str)]) -> (u16, axum::http::HeaderMap, Vec<u8>) {
    let mut request = Request::builder().method("GET").uri(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let reply = gateway.send(request.body(Body::empty()).unwrap()).await;
    (reply.status.as_u16(), reply.headers, reply.bytes)
}

fn assert_strict_headers(headers: &axum::http::HeaderMap, what: &str) {
    let policy = headers.get(header::CONTENT_SECURITY_POLICY).and_then(|v| v.to_str().ok()).unwrap_or_default();
    for part in
        ["default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"]
    {
        assert!(policy.contains(part), "{what}: the policy has {part}: {policy}");
    }
    assert!(!policy.contains("unsafe"), "{what}: no unsafe source: {policy}");
    assert_eq!(headers.get(header::X_FRAME_OPTIONS).unwrap(), "DENY", "{what}");
    assert_eq!(headers.get(header::X_CONTENT_TYPE_OPTIONS).unwrap(), "nosniff", "{what}");
}

async fn the_console_is_served_under_a_strict_policy(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    let index = anonymous(&gateway, "/console/", &[]).await;
    assert_eq!(index.0, 200);
    assert!(index.1.get(header::CONTENT_TYPE).unwrap().to_str().unwrap().starts_with("text/html"));
    assert_strict_headers(&index.1, "index");
    let html = String::from_utf8(index.2).unwrap();
    assert!(!html.contains("<script>") && !html.contains(" style="), "no inline script or style");
    // Every file the page names is served, with its type; together under the first-load budget.
    let mut total = html.len();
    for name in gantry::api::console::ASSETS.iter().map(|(name, _)| *name).filter(|n| *n != "index.html") {
        let (status, headers, body) = anonymous(&gateway, &format!("/console/{name}"), &[]).await;
        assert_eq!(status, 200, "{name}");
        assert_strict_headers(&headers, name);
        let kind = headers.get(header::CONTENT_TYPE).unwrap().to_str().unwrap();
        if name.ends_with(".js") {
            assert!(kind.starts_with("text/javascript"), "{name}: {kind}");
        }
        if name.ends_with(".css") {
            assert!(kind.starts_with("text/css"), "{name}: {kind}");
        }
        total += body.len();
    }
    assert!(total < 150 * 1024, "the console's files total {total} bytes, over the 150 KB budget");
    // Nothing outside the console's own files: not by `..`, not encoded, not hidden files.
    for path in ["/console/..%2FCargo.toml", "/console/%2E%2E/Cargo.toml", "/console/.gitignore", "/console/missing.js"]
    {
        let (status, headers, _) = anonymous(&gateway, path, &[]).await;
        assert_eq!(status, 404, "{path}");
        assert_strict_headers(&headers, path);
    }
    // `/` sends a browser to the console; an API client still gets the API's 404.
    let (status, headers, _) = anonymous(&gateway, "/", &[("accept", "text/html,application/xhtml+xml")]).await;
    assert_eq!(status, 303);
    assert_eq!(headers.get(header::LOCATION).unwrap(), "/console/");
    let (status, _, body) = anonymous(&gateway, "/", &[("accept", "application/json")]).await;
    assert_eq!(status, 404);
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), json!({"message": "Not found: /"}));
}

async fn run(gateway: &Gateway, token: &str) -> String {
    let reply = gateway.post_json("/api/v1/programs/run/", token, json!({"title": "fn", "arguments": "{}"})).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    reply.json["id"].as_str().unwrap().to_string()
}

async fn the_queue_says_where_my_jobs_stand(backend: Backend) {
    // No runner: every job stays QUEUED until stopped.
    let gateway = Gateway::start_with(backend, |config| config.active_jobs_per_user = 4).await;
    for user in ["alice", "bob"] {
        gateway.upload_function(user, &[("title", "fn"), ("entrypoint", "main.py")]).await;
    }
    let empty = gateway.get("/api/v1/jobs/queue/", "alice").await;
    assert_eq!(empty.status, 200);
    assert_eq!(
        empty.json,
        json!({"active_limit": 4, "active": 0, "queued": 0, "running": 0, "running_limit": null,
               "cpu_slots": null, "gpu_slots": null, "jobs": [], "tenants": [], "budgets": []})
    );
    let a1 = run(&gateway, "alice").await;
    let _b1 = run(&gateway, "bob").await;
    let a2 = run(&gateway, "alice").await;
    let _b2 = run(&gateway, "bob").await;
    let a3 = run(&gateway, "alice").await;
    let queue = gateway.get("/api/v1/jobs/queue/", "alice").await.json;
    assert_eq!((queue["active_limit"].as_i64(), queue["active"].as_i64()), (Some(4), Some(3)), "{queue}");
    assert_eq!((queue["queued"].as_i64(), queue["running"].as_i64()), (Some(3), Some(0)), "{queue}");
    let places: Vec<(String, i64)> = queue["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|job| (job["id"].as_str().unwrap().to_string(), job["ahead"].as_i64().unwrap()))
        .collect();
    assert_eq!(places, vec![(a1.clone(), 0), (a2.clone(), 2), (a3.clone(), 4)], "{queue}");
    assert!(queue["jobs"][0]["created"].as_str().unwrap().ends_with('Z'), "{queue}");
    // The counts are the caller's whole queue, however few of its jobs are listed.
    let one = gateway.get("/api/v1/jobs/queue/?limit=1", "alice").await.json;
    assert_eq!((one["active"].as_i64(), one["queued"].as_i64()), (Some(3), Some(3)), "{one}");
    assert_eq!(one["jobs"].as_array().unwrap().len(), 1, "{one}");
    for bad in ["-1", "501", "x"] {
        let refused = gateway.get(&format!("/api/v1/jobs/queue/?limit={bad}"), "alice").await;
        assert_eq!(refused.status, 400, "{bad}: {}", refused.json);
        assert!(refused.message().contains("'limit'"), "{}", refused.json);
    }
    // A stopped job leaves the queue, and those behind it move up.
    let stopped = gateway.post_json(&format!("/api/v1/jobs/{a1}/stop/"), "alice", json!({})).await;
    assert_eq!(stopped.status, 200, "{}", stopped.json);
    let queue = gateway.get("/api/v1/jobs/queue/", "alice").await.json;
    assert_eq!(queue["active"], 2, "{queue}");
    assert_eq!(queue["jobs"][0]["id"], a2.as_str());
    assert_eq!(queue["jobs"][0]["ahead"], 1, "{queue}");
    assert_eq!(queue["jobs"][1]["ahead"], 3, "{queue}");
    // Bob sees only his own jobs; without a token there is no answer.
    let bob = gateway.get("/api/v1/jobs/queue/", "bob").await.json;
    assert_eq!(bob["active"], 2);
    let anonymous = anonymous(&gateway, "/api/v1/jobs/queue/", &[]).await;
    assert_eq!(anonymous.0, 401);
}

/// The caller's own limit of running jobs and the global slots, which of them holds each queued
/// job back, its position, and its function.
async fn the_queue_says_which_limit_holds_each_queued_job(backend: Backend) {
    use gantry::domain::admission::Limits;
    use gantry::domain::lifecycle::{JobStatus, Trigger, decide};
    // No runner: admission is done here by hand, as a runner would.
    let gateway = Gateway::start_with(backend, |config| {
        config.admission = Some(Limits { jobs_per_user: 2, cpu_slots: 3, gpu_slots: 1 });
    })
    .await;
    for user in ["alice", "bob"] {
        gateway.upload_function(user, &[("title", "fn"), ("entrypoint", "main.py")]).await;
    }
    let admitted = decide(JobStatus::Queued, &Trigger::Admitted).unwrap();
    let start = |id: String| {
        let (db, admitted) = (gateway.state.db.clone(), admitted.clone());
        async move { assert!(gantry::db::jobs::apply_move(&db, &id, &admitted, false).await.unwrap().is_some()) }
    };
    // Bob holds two CPU slots; Alice one, under her limit of two.
    for _ in 0..2 {
        start(run(&gateway, "bob").await).await;
    }
    let a1 = run(&gateway, "alice").await;
    start(a1.clone()).await;
    let a2 = run(&gateway, "alice").await;
    let a3 = run(&gateway, "alice").await;
    let queue = gateway.get("/api/v1/jobs/queue/", "alice").await.json;
    assert_eq!(queue["running_limit"], 2, "{queue}");
    assert_eq!(queue["cpu_slots"], json!({"used": 3, "limit": 3}), "{queue}");
    assert_eq!(queue["gpu_slots"], json!({"used": 0, "limit": 1}), "{queue}");
    assert_eq!((queue["running"].as_i64(), queue["queued"].as_i64()), (Some(1), Some(2)), "{queue}");
    let jobs = queue["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 3, "{queue}");
    assert_eq!((jobs[0]["id"].as_str(), jobs[0]["waiting_for"].clone()), (Some(a1.as_str()), Value::Null), "{queue}");
    assert_eq!(jobs[0]["position"], Value::Null, "a running job has no place in the queue: {queue}");
    // Alice may run one more, but every CPU slot is taken; the job after it waits for her limit.
    assert_eq!(
        (jobs[1]["id"].as_str(), jobs[1]["waiting_for"].as_str()),
        (Some(a2.as_str()), Some("cpu_slots")),
        "{queue}"
    );
    assert_eq!(
        (jobs[2]["id"].as_str(), jobs[2]["waiting_for"].as_str()),
        (Some(a3.as_str()), Some("cpu_slots")),
        "{queue}"
    );
    assert_eq!((jobs[1]["position"].as_i64(), jobs[2]["position"].as_i64()), (Some(1), Some(2)), "{queue}");
    assert_eq!(jobs[1]["program"]["title"], "fn", "{queue}");
    assert_eq!(jobs[1]["gpu"], false, "{queue}");
    // A slot frees up (Bob's job ends): the oldest waits for the next admission, the other for
    // Alice's own limit.
    let bob_running = gateway.get("/api/v1/jobs/queue/", "bob").await.json;
    let bobs = bob_running["jobs"][0]["id"].as_str().unwrap().to_string();
    let running = decide(JobStatus::Pending, &Trigger::Started).unwrap();
    assert!(gantry::db::jobs::apply_move(&gateway.state.db, &bobs, &running, false).await.unwrap().is_some());
    let ended = decide(JobStatus::Running, &Trigger::Exited { success: true }).unwrap();
    assert!(gantry::db::jobs::apply_move(&gateway.state.db, &bobs, &ended, false).await.unwrap().is_some());
    let queue = gateway.get("/api/v1/jobs/queue/", "alice").await.json;
    assert_eq!(queue["cpu_slots"]["used"], 2, "{queue}");
    let waits: Vec<&str> =
        queue["jobs"].as_array().unwrap()[1..].iter().map(|j| j["waiting_for"].as_str().unwrap()).collect();
    assert_eq!(waits, ["next_admission", "running_limit"], "{queue}");
}

/// The slots in use (migration 0016) are kept with every move, on each path a move takes: one
/// job alone (PostgreSQL's one-statement move) or with outbound events, an admission pass of
/// several, CPU and GPU jobs, a retry, a stop; they always equal a count of the pending and
/// running jobs.
async fn the_slots_in_use_are_kept_with_every_move(backend: Backend) {
    use gantry::db::{Db, jobs, queue};
    use gantry::domain::lifecycle::{JobStatus, Trigger, decide};
    let gateway = Gateway::start(backend).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(run(&gateway, "alice").await);
    }
    let db = &gateway.state.db;
    // The last two are GPU jobs: a move reads the kind from the job's row.
    let gpu = "UPDATE jobs SET gpu = TRUE WHERE id IN ($1, $2)";
    match db {
        Db::Postgres(pool) => sqlx::query(gpu).bind(&ids[4]).bind(&ids[5]).execute(pool).await.map(|_| ()),
        Db::Sqlite(pool, _) => sqlx::query(gpu).bind(&ids[4]).bind(&ids[5]).execute(pool).await.map(|_| ()),
    }
    .unwrap();
    let author = "SELECT author_id FROM jobs WHERE id = $1";
    let alice: &str = &match db {
        Db::Postgres(pool) => sqlx::query_scalar::<_, String>(author).bind(&ids[0]).fetch_one(pool).await,
        Db::Sqlite(pool, _) => sqlx::query_scalar::<_, String>(author).bind(&ids[0]).fetch_one(pool).await,
    }
    .unwrap();
    let check = |step: &'static str, expected: (i64, i64)| async move {
        let count = "SELECT gpu, COUNT(*) FROM jobs WHERE status IN ('PENDING', 'RUNNING') GROUP BY gpu";
        let rows: Vec<(bool, i64)> = match db {
            Db::Postgres(pool) => sqlx::query_as(count).fetch_all(pool).await,
            Db::Sqlite(pool, _) => sqlx::query_as(count).fetch_all(pool).await,
        }
        .unwrap();
        let of = |kind: bool| rows.iter().filter(|(g, _)| *g == kind).map(|(_, n)| n).sum::<i64>();
        assert_eq!((of(false), of(true)), expected, "{step}: the jobs themselves");
        // One statement reads the author's kept counts and the slots (all six jobs are alice's).
        let (counts, places) = queue::read(db, alice, 0, true).await.unwrap();
        assert_eq!(counts.slots, Some(expected), "{step}: the kept slots");
        assert_eq!(counts.pending + counts.running, expected.0 + expected.1, "{step}: alice's counts");
        assert!(places.is_empty(), "{step}: limit 0 lists no job");
        let (unasked, listed) = queue::read(db, alice, 10, false).await.unwrap();
        assert_eq!((unasked.slots, unasked.running, unasked.pending), (None, counts.running, counts.pending), "{step}");
        assert_eq!(listed.len() as i64, counts.queued + counts.pending + counts.running, "{step}: alice's jobs listed");
    };
    let mv = |from: JobStatus, trigger: Trigger| decide(from, &trigger).unwrap();
    let admit = mv(JobStatus::Queued, Trigger::Admitted);
    check("nothing admitted", (0, 0)).await;
    let pass = [ids[0].clone(), ids[1].clone(), ids[4].clone()];
    assert_eq!(jobs::apply_moves(db, &pass, &admit, true).await.unwrap().len(), 3);
    check("an admission pass of two CPU jobs and a GPU job", (2, 1)).await;
    assert!(jobs::apply_move(db, &ids[2], &admit, false).await.unwrap().is_some());
    assert!(jobs::apply_move(db, &ids[5], &admit, true).await.unwrap().is_some());
    check("one at a time, without and with outbound events", (3, 2)).await;
    assert!(jobs::apply_move(db, &ids[2], &admit, false).await.unwrap().is_none());
    assert!(jobs::apply_moves(db, &pass, &admit, false).await.unwrap().is_empty());
    check("moves that no longer apply change nothing", (3, 2)).await;
    assert!(jobs::apply_move(db, &ids[0], &mv(JobStatus::Pending, Trigger::Started), false).await.unwrap().is_some());
    assert!(jobs::apply_move(db, &ids[4], &mv(JobStatus::Pending, Trigger::Started), true).await.unwrap().is_some());
    let retry = mv(JobStatus::Running, Trigger::Retrying { reason: "evicted".into() });
    assert!(jobs::apply_move(db, &ids[0], &retry, false).await.unwrap().is_some());
    check("started and retried jobs keep their slot", (3, 2)).await;
    assert!(
        jobs::apply_move(db, &ids[1], &mv(JobStatus::Pending, Trigger::StopRequested), false).await.unwrap().is_some()
    );
    assert!(
        jobs::apply_move(db, &ids[3], &mv(JobStatus::Queued, Trigger::StopRequested), false).await.unwrap().is_some()
    );
    let exit = mv(JobStatus::Running, Trigger::Exited { success: false });
    assert!(jobs::apply_move(db, &ids[4], &exit, true).await.unwrap().is_some());
    check("a stopped pending job and a failed GPU job free theirs, a stopped queued one none", (2, 1)).await;
    let done = [ids[0].clone(), ids[2].clone(), ids[5].clone()];
    let stop = mv(JobStatus::Pending, Trigger::StopRequested);
    assert_eq!(jobs::apply_moves(db, &done, &stop, false).await.unwrap().len(), 3);
    check("every job ended", (0, 0)).await;
}
