//! `jobs/queue/`'s places read from the queued jobs kept per hour (migration 0020): over many
//! hours, after runs, single moves and admission batches out of the queue, with ties in
//! creation time, after a recount and after the spent hours are pruned, each place equals a
//! count of the queue itself, and the kept hours equal the queued jobs per hour.

use serde_json::json;

use crate::both_backends;
use crate::harness::{Backend, Gateway};
use gantry::db::Db;
use gantry::db::queue::QUEUE_BLOCK_MICROS;

both_backends!(places_across_hours_are_the_queue_counted, a_recount_repairs_the_kept_counts);

async fn run(gateway: &Gateway, user: &str) -> String {
    let reply = gateway.post_json("/api/v1/programs/run/", user, json!({"title": "fn", "arguments": "{}"})).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    reply.json["id"].as_str().unwrap().to_string()
}

async fn execute(db: &Db, sql: &str, id: &str, created: i64) {
    match db {
        Db::Postgres(pool) => sqlx::query(sql).bind(created).bind(id).execute(pool).await.map(|_| ()),
        Db::Sqlite(pool, _) => sqlx::query(sql).bind(created).bind(id).execute(pool).await.map(|_| ()),
    }
    .unwrap();
}

async fn pairs(db: &Db, sql: &str) -> Vec<(i64, i64)> {
    match db {
        Db::Postgres(pool) => sqlx::query_as(sql).fetch_all(pool).await,
        Db::Sqlite(pool, _) => sqlx::query_as(sql).fetch_all(pool).await,
    }
    .unwrap()
}

/// The queued jobs of every user created before (`created`, `id`), counted in `jobs`.
async fn counted_ahead(db: &Db, id: &str) -> i64 {
    let sql = "SELECT COUNT(*) FROM jobs q, jobs j WHERE j.id = $1 AND q.status = 'QUEUED' \
               AND (q.created < j.created OR (q.created = j.created AND q.id < j.id))";
    match db {
        Db::Postgres(pool) => sqlx::query_scalar(sql).bind(id).fetch_one(pool).await,
        Db::Sqlite(pool, _) => sqlx::query_scalar(sql).bind(id).fetch_one(pool).await,
    }
    .unwrap()
}

/// Every queued job's place as `jobs/queue/` gives it to its author, against the queue counted,
/// and the kept hours against the queued jobs per hour. Answers how many places were checked.
async fn assert_places(gateway: &Gateway, step: &str) -> usize {
    let mut checked = 0;
    for user in ["alice", "bob"] {
        let queue = gateway.get("/api/v1/jobs/queue/?limit=500", user).await;
        assert_eq!(queue.status, 200, "{step}: {}", queue.json);
        for job in queue.json["jobs"].as_array().unwrap() {
            if job["status"] != "QUEUED" {
                continue;
            }
            let id = job["id"].as_str().unwrap();
            let expected = counted_ahead(&gateway.state.db, id).await;
            assert_eq!(job["ahead"].as_i64(), Some(expected), "{step}: {user}'s {id}: {}", queue.json);
            assert_eq!(job["position"].as_i64(), Some(expected + 1), "{step}");
            checked += 1;
        }
    }
    let kept = pairs(
        &gateway.state.db,
        "SELECT block, CAST(SUM(n) AS BIGINT) FROM job_queue_counts GROUP BY block HAVING SUM(n) <> 0 ORDER BY block",
    )
    .await;
    let real = pairs(
        &gateway.state.db,
        "SELECT created / 3600000000, COUNT(*) FROM jobs WHERE status = 'QUEUED' GROUP BY created / 3600000000 ORDER BY 1",
    )
    .await;
    assert_eq!(kept, real, "{step}: the kept hours");
    checked
}

async fn places_across_hours_are_the_queue_counted(backend: Backend) {
    use gantry::domain::lifecycle::{JobStatus, Trigger, decide};
    let gateway = Gateway::start_with(backend, |config| config.active_jobs_per_user = 100).await;
    for user in ["alice", "bob"] {
        gateway.upload_function(user, &[("title", "fn"), ("entrypoint", "main.py")]).await;
    }
    let db = &gateway.state.db;
    let mut ids = Vec::new();
    for i in 0..30usize {
        ids.push(run(&gateway, if i.is_multiple_of(3) { "bob" } else { "alice" }).await);
    }
    // The first 24 spread over the six hours that ended five hours ago, two at a time with the
    // same creation time (ties broken by id), as a long queue holds them.
    let now = gantry::db::now_micros();
    let first_hour = (now / QUEUE_BLOCK_MICROS - 11) * QUEUE_BLOCK_MICROS;
    for (i, id) in ids.iter().take(24).enumerate() {
        let created = first_hour + (i as i64 / 2) * 30 * 60_000_000 + 17;
        execute(db, "UPDATE jobs SET created = $1 WHERE id = $2", id, created).await;
    }
    let recounted = gantry::db::counts::recount(db).await.unwrap();
    assert_eq!(recounted.after.4, 30, "{recounted}");
    assert_eq!(assert_places(&gateway, "spread over hours").await, 30);

    // Out of the queue one at a time (a stop: one move, on PostgreSQL one statement)...
    let owner = |i: usize| if i.is_multiple_of(3) { "bob" } else { "alice" };
    for i in [0, 7, 25] {
        let stopped = gateway.post_json(&format!("/api/v1/jobs/{}/stop/", ids[i]), owner(i), json!({})).await;
        assert_eq!(stopped.status, 200, "{}", stopped.json);
    }
    assert_eq!(assert_places(&gateway, "after three stops").await, 27);
    // ... and as an admission batch over several hours (one transaction, the counts per hour).
    let admitted = decide(JobStatus::Queued, &Trigger::Admitted).unwrap();
    let batch: Vec<String> = [1, 2, 3, 12, 13, 28].iter().map(|&i| ids[i].clone()).collect();
    let moved = gantry::db::jobs::apply_moves(db, &batch, &admitted, false).await.unwrap();
    assert_eq!(moved.len(), 6);
    assert_eq!(assert_places(&gateway, "after an admission batch").await, 21);
    // A single admission (PostgreSQL: the move in one statement).
    assert!(gantry::db::jobs::apply_move(db, &ids[29], &admitted, false).await.unwrap().is_some());
    assert_eq!(assert_places(&gateway, "after one admission").await, 20);

    // The hours whose jobs all left leave rows behind; pruning deletes those and no other, and
    // the places stay.
    for i in [4, 5, 6] {
        assert!(gantry::db::jobs::apply_move(db, &ids[i], &admitted, false).await.unwrap().is_some());
    }
    let hours = "SELECT block, COUNT(*) FROM job_queue_counts GROUP BY block ORDER BY block";
    let spent = "SELECT block, COUNT(*) FROM job_queue_counts GROUP BY block HAVING SUM(n) = 0 ORDER BY block";
    let spent_before = pairs(db, spent).await;
    assert!(!spent_before.is_empty(), "the first hours are spent: {:?}", pairs(db, hours).await);
    let rows_before: i64 = pairs(db, hours).await.iter().map(|(_, rows)| rows).sum();
    let pruned = gantry::db::queue::prune_spent_blocks(db, now).await.unwrap();
    assert_eq!(pruned as i64, spent_before.iter().map(|(_, rows)| rows).sum::<i64>());
    assert!(pairs(db, spent).await.is_empty());
    let rows_after: i64 = pairs(db, hours).await.iter().map(|(_, rows)| rows).sum();
    assert_eq!(rows_after, rows_before - pruned as i64);
    assert_eq!(assert_places(&gateway, "after pruning").await, 17);
    // The last two hours are never pruned, even spent: a run may be adding to them.
    for i in [24, 26, 27] {
        assert!(gantry::db::jobs::apply_move(db, &ids[i], &admitted, false).await.unwrap().is_some());
    }
    let before = pairs(db, hours).await;
    let recent = now / QUEUE_BLOCK_MICROS - gantry::db::queue::QUIET_HOURS;
    assert!(pairs(db, spent).await.iter().any(|(block, _)| *block >= recent), "{before:?}");
    assert_eq!(gantry::db::queue::prune_spent_blocks(db, now).await.unwrap(), 0);
    assert_eq!(pairs(db, hours).await, before);
    assert_eq!(assert_places(&gateway, "the recent hours spent").await, 14);
    // Nothing drifted: a recount changes no sum.
    let recounted = gantry::db::counts::recount(db).await.unwrap();
    assert_eq!(recounted.before, recounted.after, "{recounted}");
}

async fn a_recount_repairs_the_kept_counts(backend: Backend) {
    use gantry::admin::{AdminCommand, admin};
    let gateway = Gateway::start(backend).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    for _ in 0..3 {
        run(&gateway, "alice").await;
    }
    let db = &gateway.state.db;
    let unchanged = admin(db, AdminCommand::Recount).await.unwrap();
    assert_eq!(
        unchanged,
        "recounted 3 jobs: by user and function 3 -> 3, by day 3 -> 3, by provider 0 -> 0, slots in use 0 -> 0, queued 3 -> 3, usage records 0 -> 0; usage totals of 0 ended months summed again"
    );
    // Counts lost (say, jobs loaded by COPY): the places and the listing's count come back.
    for table in ["job_counts", "job_counts_by_day", "job_queue_counts"] {
        match db {
            Db::Postgres(pool) => sqlx::query(&format!("DELETE FROM {table}")).execute(pool).await.map(|_| ()),
            Db::Sqlite(pool, _) => sqlx::query(&format!("DELETE FROM {table}")).execute(pool).await.map(|_| ()),
        }
        .unwrap();
    }
    let repaired = admin(db, AdminCommand::Recount).await.unwrap();
    assert_eq!(
        repaired,
        "recounted 3 jobs: by user and function 0 -> 3, by day 0 -> 3, by provider 0 -> 0, slots in use 0 -> 0, queued 0 -> 3, usage records 0 -> 0; usage totals of 0 ended months summed again"
    );
    let listing = gateway.get("/api/v1/jobs/", "alice").await.json;
    assert_eq!(listing["count"], 3, "{listing}");
    assert_eq!(assert_places(&gateway, "after the recount").await, 3);
}
