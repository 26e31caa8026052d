//! Retention of finished jobs (`--retain-finished-days`, `gantry admin gc`): old finished jobs go
//! with their events, runtime jobs and objects, in batches; recent and active jobs stay whole;
//! the kept counts stay exact; a dry run deletes nothing.

use std::time::Duration;

use gantry::admin::AdminCommand;
use gantry::db::Db;
use gantry::domain::lifecycle::{JobStatus, Trigger, decide};
use gantry::retention::{Policy, Report};
use gantry::storage::keys;
use serde_json::json;

use crate::both_backends;
use crate::harness::{Backend, Gateway};

both_backends!(
    old_finished_jobs_go_with_everything_that_belongs_to_them,
    a_dry_run_reports_and_deletes_nothing,
    batches_walk_past_one_batch_and_finish_interrupted_passes,
    a_long_pass_reports_its_progress_and_keeps_counts_exact,
);

const DAY_MICROS: i64 = 86_400_000_000;
const RETENTION: Duration = Duration::from_secs(30 * 86_400);

/// A job ending in `ending` (or left active with `None`), with a runtime job, an error event,
/// every kind of job object plus one nested under its folder, last updated `days_ago`.
async fn job(gateway: &Gateway, user: &str, ending: Option<JobStatus>, days_ago: i64) -> String {
    let reply =
        gateway.post_json("/api/v1/programs/run/", user, json!({"title": "fn", "arguments": "{\"n\": 1}"})).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    let id = reply.json["id"].as_str().unwrap().to_string();
    let added = gateway
        .post_json(&format!("/api/v1/jobs/{id}/runtime_jobs/"), user, json!({"runtime_job": format!("rt-{id}")}))
        .await;
    assert_eq!(added.status, 200, "{}", added.json);
    let sent = gateway
        .post_json(
            &format!("/api/v1/jobs/{id}/event/"),
            user,
            json!({"type": "ERROR", "code": "1", "message": "boom", "exception": "ValueError"}),
        )
        .await;
    assert_eq!(sent.status, 200, "{}", sent.json);
    let triggers = match ending {
        None => vec![Trigger::Admitted, Trigger::Started],
        Some(JobStatus::Succeeded) => vec![Trigger::Admitted, Trigger::Started, Trigger::Exited { success: true }],
        Some(JobStatus::Failed) => vec![Trigger::Admitted, Trigger::Crashed { reason: "out of memory".into() }],
        Some(JobStatus::Stopped) => vec![Trigger::StopRequested],
        Some(other) => panic!("{other} is not an ending"),
    };
    let mut status = JobStatus::Queued;
    for trigger in triggers {
        let mv = decide(status, &trigger).unwrap();
        // The outbox records the moves: retention must leave those rows alone.
        assert!(gantry::db::jobs::apply_move(&gateway.state.db, &id, &mv, true).await.unwrap().is_some());
        status = mv.to;
    }
    for key in object_keys(&id) {
        gateway.state.storage.put_bytes(&key, format!("{key} of {user}").into()).await.unwrap();
    }
    set_updated(gateway, &id, gantry::db::now_micros() - days_ago * DAY_MICROS).await;
    id
}

fn object_keys(id: &str) -> Vec<String> {
    vec![
        keys::job_arguments(id),
        keys::job_result(id),
        keys::job_user_log(id),
        keys::job_provider_log(id),
        keys::job_exit(id),
        format!("{}later/nested.bin", keys::job_objects(id)),
    ]
}

async fn set_updated(gateway: &Gateway, id: &str, updated: i64) {
    let sql = "UPDATE jobs SET updated = $1 WHERE id = $2";
    let changed = match &gateway.state.db {
        Db::Sqlite(pool, _) => sqlx::query(sql).bind(updated).bind(id).execute(pool).await.unwrap().rows_affected(),
        Db::Postgres(pool) => sqlx::query(sql).bind(updated).bind(id).execute(pool).await.unwrap().rows_affected(),
    };
    assert_eq!(changed, 1);
}

async fn count(gateway: &Gateway, sql: &str, id: &str) -> i64 {
    match &gateway.state.db {
        Db::Sqlite(pool, _) => sqlx::query_scalar(sql).bind(id).fetch_one(pool).await.unwrap(),
        Db::Postgres(pool) => sqlx::query_scalar(sql).bind(id).fetch_one(pool).await.unwrap(),
    }
}

type CountRows = Vec<(String, String, String, i64, i64)>;

async fn rows(gateway: &Gateway, sql: &str) -> CountRows {
    match &gateway.state.db {
        Db::Sqlite(pool, _) => sqlx::query_as(sql).fetch_all(pool).await.unwrap(),
        Db::Postgres(pool) => sqlx::query_as(sql).fetch_all(pool).await.unwrap(),
    }
}

/// The kept counts, total and per creation day, equal the jobs counted one by one.
async fn assert_counts_exact(gateway: &Gateway) {
    let kept = rows(
        gateway,
        "SELECT author_id, program_id, status, CAST(0 AS BIGINT), n FROM job_counts WHERE n <> 0 ORDER BY 1, 2, 3",
    )
    .await;
    let real = rows(
        gateway,
        "SELECT author_id, COALESCE(program_id, ''), status, CAST(0 AS BIGINT), COUNT(*) FROM jobs \
         GROUP BY author_id, COALESCE(program_id, ''), status ORDER BY 1, 2, 3",
    )
    .await;
    assert_eq!(kept, real, "job_counts");
    let kept = rows(
        gateway,
        "SELECT author_id, program_id, status, day, n FROM job_counts_by_day WHERE n <> 0 ORDER BY 1, 2, 3, 4",
    )
    .await;
    let real = rows(
        gateway,
        "SELECT author_id, COALESCE(program_id, ''), status, created / 86400000000, COUNT(*) FROM jobs \
         GROUP BY author_id, COALESCE(program_id, ''), status, created / 86400000000 ORDER BY 1, 2, 3, 4",
    )
    .await;
    assert_eq!(kept, real, "job_counts_by_day");
    let kept = rows(
        gateway,
        "SELECT provider_id, '', status, CAST(0 AS BIGINT), CAST(SUM(n) AS BIGINT) FROM job_provider_counts \
         GROUP BY provider_id, status HAVING SUM(n) <> 0 ORDER BY 1, 3",
    )
    .await;
    let real = rows(
        gateway,
        "SELECT provider_id, '', status, CAST(0 AS BIGINT), COUNT(*) FROM jobs WHERE provider_id IS NOT NULL \
         GROUP BY provider_id, status ORDER BY 1, 3",
    )
    .await;
    assert_eq!(kept, real, "job_provider_counts");
    // Deleting never leaves a count below zero, nor a zero it made.
    let left = rows(
        gateway,
        "SELECT author_id, program_id, status, CAST(0 AS BIGINT), n FROM job_counts WHERE n < 0 OR (n = 0 AND status IN ('SUCCEEDED', 'FAILED', 'STOPPED'))",
    )
    .await;
    assert_eq!(left, Vec::new());
}

async fn outbox_rows(gateway: &Gateway) -> i64 {
    let sql = "SELECT COUNT(*) FROM event_outbox";
    match &gateway.state.db {
        Db::Sqlite(pool, _) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
        Db::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
    }
}

async fn listing_count(gateway: &Gateway, user: &str, query: &str) -> i64 {
    let reply = gateway.get(&format!("/api/v1/jobs/?limit=1{query}"), user).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    reply.json["count"].as_i64().unwrap()
}

/// The job answers, and every object of it is there.
async fn assert_whole(gateway: &Gateway, user: &str, id: &str) {
    let reply = gateway.get(&format!("/api/v1/jobs/{id}/"), user).await;
    assert_eq!(reply.status, 200, "{id}: {}", reply.json);
    let stored: Vec<String> =
        gateway.state.storage.list_tree(&keys::job_objects(id)).await.unwrap().into_iter().map(|o| o.key).collect();
    let mut expected = object_keys(id);
    expected.sort();
    assert_eq!(stored, expected);
    assert!(count(gateway, "SELECT COUNT(*) FROM job_events WHERE job_id = $1", id).await >= 3);
    assert_eq!(count(gateway, "SELECT COUNT(*) FROM runtime_jobs WHERE job_id = $1", id).await, 1);
}

/// The job is gone: 404, no rows, no object under its folder.
async fn assert_gone(gateway: &Gateway, user: &str, id: &str) {
    let reply = gateway.get(&format!("/api/v1/jobs/{id}/"), user).await;
    assert_eq!(reply.status, 404, "{id}: {}", reply.json);
    assert_eq!(gateway.get(&format!("/api/v1/jobs/{id}/events/"), user).await.status, 404);
    assert_eq!(count(gateway, "SELECT COUNT(*) FROM job_events WHERE job_id = $1", id).await, 0);
    assert_eq!(count(gateway, "SELECT COUNT(*) FROM runtime_jobs WHERE job_id = $1", id).await, 0);
    assert_eq!(gateway.state.storage.list_tree(&keys::job_objects(id)).await.unwrap(), Vec::new());
    for key in object_keys(id) {
        assert!(gateway.state.storage.read_to_bytes(&key).await.unwrap().is_none(), "{key}");
    }
    if let gantry::storage::Storage::Local { root } = &gateway.state.storage {
        assert!(!root.join("jobs").join(id).exists(), "the job's folder is left");
    }
}

/// alice: three old finished jobs (one per ending), a recent finished one, an old running one
/// and an old queued one; bob: one old finished job and a recent one. Returns (old alice jobs,
/// old bob job, alice jobs kept, bob job kept).
async fn history(gateway: &Gateway) -> (Vec<String>, String, Vec<String>, String) {
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    gateway.upload_function("bob", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    let old = vec![
        job(gateway, "alice", Some(JobStatus::Succeeded), 40).await,
        job(gateway, "alice", Some(JobStatus::Failed), 39).await,
        job(gateway, "alice", Some(JobStatus::Stopped), 38).await,
    ];
    let bob_old = job(gateway, "bob", Some(JobStatus::Succeeded), 31).await;
    let kept =
        vec![job(gateway, "alice", Some(JobStatus::Succeeded), 29).await, job(gateway, "alice", None, 90).await, {
            // Queued long ago and never admitted.
            let reply =
                gateway.post_json("/api/v1/programs/run/", "alice", json!({"title": "fn", "arguments": "{}"})).await;
            let id = reply.json["id"].as_str().unwrap().to_string();
            set_updated(gateway, &id, gantry::db::now_micros() - 90 * DAY_MICROS).await;
            id
        }];
    let bob_kept = job(gateway, "bob", Some(JobStatus::Failed), 0).await;
    // Bob's jobs as a provider function's: retention takes them off their provider's counts too
    // (migration 0021); counted again after the change.
    gateway.provider("acme", None, "erin").await;
    let acme = gantry::db::providers::find_by_name(&gateway.state.db, "acme").await.unwrap().unwrap().id;
    for id in [&bob_old, &bob_kept] {
        let sql = "UPDATE jobs SET provider_id = $1 WHERE id = $2";
        match &gateway.state.db {
            Db::Sqlite(pool, _) => sqlx::query(sql).bind(&acme).bind(id).execute(pool).await.map(|_| ()),
            Db::Postgres(pool) => sqlx::query(sql).bind(&acme).bind(id).execute(pool).await.map(|_| ()),
        }
        .unwrap();
    }
    let recounted = gantry::db::counts::recount(&gateway.state.db).await.unwrap();
    assert_eq!(recounted.after.2, 2, "{recounted}");
    (old, bob_old, kept, bob_kept)
}

async fn old_finished_jobs_go_with_everything_that_belongs_to_them(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    let (old, bob_old, kept, bob_kept) = history(&gateway).await;
    assert_eq!(listing_count(&gateway, "alice", "").await, 6);
    assert_counts_exact(&gateway).await;
    let outbox = outbox_rows(&gateway).await;
    assert!(outbox > 0);

    let policy = Policy { older_than: RETENTION, batch_size: 200, pause: Duration::ZERO };
    let report =
        gantry::retention::collect(&gateway.state.db, &gateway.state.storage, &policy, gantry::db::now_micros())
            .await
            .unwrap();
    // Each old job had 6 objects, 1 runtime job, and its events: QUEUED, the error, and its moves.
    assert_eq!((report.jobs, report.objects, report.runtime_jobs, report.kept), (4, 24, 4, 0), "{report}");
    assert_eq!(report.events, (2 + 3) + (2 + 2) + (2 + 1) + (2 + 3), "{report}");
    assert_eq!(report.oldest.as_ref().map(|m| m.id.as_str()), Some(old[0].as_str()));
    assert_eq!(report.newest.as_ref().map(|m| m.id.as_str()), Some(bob_old.as_str()));

    for id in &old {
        assert_gone(&gateway, "alice", id).await;
    }
    assert_gone(&gateway, "bob", &bob_old).await;
    assert_whole(&gateway, "alice", &kept[0]).await;
    assert_whole(&gateway, "alice", &kept[1]).await;
    assert_eq!(gateway.get(&format!("/api/v1/jobs/{}/", kept[2]), "alice").await.json["status"], "QUEUED");
    assert_whole(&gateway, "bob", &bob_kept).await;

    assert_counts_exact(&gateway).await;
    assert_eq!(listing_count(&gateway, "alice", "").await, 3);
    assert_eq!(listing_count(&gateway, "alice", "&status=SUCCEEDED").await, 1);
    assert_eq!(listing_count(&gateway, "alice", "&status=FAILED").await, 0);
    assert_eq!(listing_count(&gateway, "alice", "&status=RUNNING").await, 1);
    let today = gantry::db::format_timestamp(gantry::db::now_micros() - DAY_MICROS);
    assert_eq!(listing_count(&gateway, "alice", &format!("&created_after={today}")).await, 3);
    assert_eq!(listing_count(&gateway, "bob", "").await, 1);
    assert_eq!(outbox_rows(&gateway).await, outbox, "the event outbox is pruned separately");

    // The next pass finds nothing more; new runs are counted as before.
    let again =
        gantry::retention::collect(&gateway.state.db, &gateway.state.storage, &policy, gantry::db::now_micros())
            .await
            .unwrap();
    assert_eq!(again.jobs, 0, "{again}");
    job(&gateway, "alice", Some(JobStatus::Succeeded), 0).await;
    assert_counts_exact(&gateway).await;
    assert_eq!(listing_count(&gateway, "alice", "").await, 4);
}

async fn a_dry_run_reports_and_deletes_nothing(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    let (old, bob_old, kept, bob_kept) = history(&gateway).await;
    let gc = |dry_run| AdminCommand::Gc { older_than: RETENTION, dry_run };

    let said = gantry::admin::admin_with(&gateway.state.db, Some(&gateway.state.storage), gc(true)).await.unwrap();
    let mut lines = said.lines();
    let first = lines.next().unwrap();
    assert!(first.starts_with("would delete 4 finished job(s) last updated before "), "{said}");
    assert!(first.ends_with(", with 17 event(s), 4 runtime job(s) and 24 object(s)"), "{said}");
    assert!(lines.next().unwrap().starts_with(&format!("oldest: job {}, last updated ", old[0])), "{said}");
    assert!(lines.next().unwrap().starts_with(&format!("newest: job {bob_old}, last updated ")), "{said}");
    for id in old.iter().chain(&kept[..2]) {
        assert_whole(&gateway, "alice", id).await;
    }
    assert_whole(&gateway, "bob", &bob_old).await;
    assert_eq!(listing_count(&gateway, "alice", "").await, 6);
    assert_counts_exact(&gateway).await;

    // gc needs the storage; then it deletes what the dry run named.
    let refused = gantry::admin::admin_with(&gateway.state.db, None, gc(false)).await.unwrap_err();
    assert!(refused.to_string().contains("needs the object storage"), "{refused}");
    let said = gantry::admin::admin_with(&gateway.state.db, Some(&gateway.state.storage), gc(false)).await.unwrap();
    assert!(said.starts_with("deleted 4 finished job(s)"), "{said}");
    assert!(said.contains(", with 17 event(s), 4 runtime job(s) and 24 object(s)"), "{said}");
    for id in &old {
        assert_gone(&gateway, "alice", id).await;
    }
    assert_whole(&gateway, "bob", &bob_kept).await;
    assert_counts_exact(&gateway).await;
    let said = gantry::admin::admin_with(&gateway.state.db, Some(&gateway.state.storage), gc(true)).await.unwrap();
    assert!(said.starts_with("no finished job was last updated before "), "{said}");
}

async fn batches_walk_past_one_batch_and_finish_interrupted_passes(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    // Five old jobs, all last updated in the same microsecond: the walk must order by id too.
    let when = gantry::db::now_micros() - 60 * DAY_MICROS;
    let mut old = Vec::new();
    for ending in [JobStatus::Succeeded, JobStatus::Failed, JobStatus::Stopped, JobStatus::Succeeded, JobStatus::Failed]
    {
        let id = job(&gateway, "alice", Some(ending), 0).await;
        set_updated(&gateway, &id, when).await;
        old.push(id);
    }
    let recent = job(&gateway, "alice", Some(JobStatus::Succeeded), 1).await;
    // A pass that stopped between the objects and the rows: the rows remain, the objects not.
    gateway.state.storage.delete_tree(&keys::job_objects(&old[2])).await.unwrap();

    let policy = Policy { older_than: RETENTION, batch_size: 2, pause: Duration::from_millis(1) };
    let (db, storage) = (&gateway.state.db, &gateway.state.storage);
    let survey: Report = gantry::retention::survey(db, storage, &policy, gantry::db::now_micros()).await.unwrap();
    assert_eq!((survey.jobs, survey.objects, survey.runtime_jobs), (5, 24, 5), "{survey}");
    let mut sorted = old.clone();
    sorted.sort();
    assert_eq!(survey.oldest.as_ref().unwrap().id, sorted[0]);
    assert_eq!(survey.newest.as_ref().unwrap().id, sorted[4]);
    assert_eq!(listing_count(&gateway, "alice", "").await, 6);

    // Two passes at once (two gateway replicas): each job is deleted and counted once.
    let now = gantry::db::now_micros();
    let (first, second) = tokio::join!(
        gantry::retention::collect(db, storage, &policy, now),
        gantry::retention::collect(db, storage, &policy, now)
    );
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(first.jobs + second.jobs, 5, "{first}\n{second}");
    assert_eq!(first.runtime_jobs + second.runtime_jobs, 5, "{first}\n{second}");
    assert_eq!(first.kept + second.kept, 0, "{first}\n{second}");
    for id in &old {
        assert_gone(&gateway, "alice", id).await;
    }
    assert_whole(&gateway, "alice", &recent).await;
    assert_counts_exact(&gateway).await;
    assert_eq!(listing_count(&gateway, "alice", "").await, 1);
}

async fn a_long_pass_reports_its_progress_and_keeps_counts_exact(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    gateway.upload_function("bob", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    // Seven old jobs of two users, every ending, created on different days (several counter
    // rows per batch), and one active job that stays.
    let endings = [JobStatus::Succeeded, JobStatus::Failed, JobStatus::Stopped, JobStatus::Succeeded];
    let mut old = Vec::new();
    for (i, user) in ["alice", "bob", "alice", "alice", "bob", "alice", "bob"].into_iter().enumerate() {
        let id = job(&gateway, user, Some(endings[i % endings.len()]), 40 + i as i64).await;
        set_created(&gateway, &id, gantry::db::now_micros() - (50 + i as i64) * DAY_MICROS).await;
        old.push((user, id));
    }
    let active = job(&gateway, "alice", None, 90).await;
    gantry::db::counts::recount(&gateway.state.db).await.unwrap();
    assert_counts_exact(&gateway).await;

    let policy = Policy { older_than: RETENTION, batch_size: 2, pause: Duration::ZERO };
    let mut seen = Vec::new();
    let report = gantry::retention::collect_with(
        &gateway.state.db,
        &gateway.state.storage,
        &policy,
        gantry::db::now_micros(),
        Duration::ZERO,
        &mut |progress| seen.push((progress.report.jobs, progress.expected, progress.batches, progress.to_string())),
    )
    .await
    .unwrap();
    assert_eq!((report.jobs, report.objects, report.kept), (7, 42, 0), "{report}");
    // After every full batch but the last: the jobs so far, of the seven found at the start.
    let counts: Vec<(u64, u64, u64)> =
        seen.iter().map(|(jobs, expected, batches, _)| (*jobs, *expected, *batches)).collect();
    assert_eq!(counts, vec![(2, 7, 1), (4, 7, 2), (6, 7, 3)], "{seen:?}");
    let line = &seen[1].3;
    assert!(line.starts_with("deleted 4 of 7 finished job(s) (57 %) in 2 batch(es), "), "{line}");
    assert!(line.contains(" event(s) and 24 object(s), ") && line.contains(" job(s)/s"), "{line}");
    for (user, id) in &old {
        assert_gone(&gateway, user, id).await;
    }
    assert_eq!(gateway.get(&format!("/api/v1/jobs/{active}/"), "alice").await.status, 200);
    assert_counts_exact(&gateway).await;
    assert_eq!(listing_count(&gateway, "alice", "").await, 1);
    assert_eq!(listing_count(&gateway, "bob", "").await, 0);
    assert_eq!(listing_count(&gateway, "bob", "&created_after=2000-01-01").await, 0);
}

async fn set_created(gateway: &Gateway, id: &str, created: i64) {
    let sql = "UPDATE jobs SET created = $1 WHERE id = $2";
    match &gateway.state.db {
        Db::Sqlite(pool, _) => sqlx::query(sql).bind(created).bind(id).execute(pool).await.unwrap().rows_affected(),
        Db::Postgres(pool) => sqlx::query(sql).bind(created).bind(id).execute(pool).await.unwrap().rows_affected(),
    };
}
