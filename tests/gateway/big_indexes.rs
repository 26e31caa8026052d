//! The indexes migrations add to big tables (`db::indexes`): on PostgreSQL `migrate` builds a
//! missing one concurrently before the migration that names it runs, and builds again one an
//! interrupted concurrent build left invalid; on SQLite the migration builds it.

use gantry::db::Db;
use gantry::db::indexes::BIG_INDEXES;

use crate::harness::{Backend, Gateway};

async fn validity(db: &Db, name: &str) -> Option<bool> {
    match db {
        Db::Postgres(pool) => sqlx::query_scalar(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = $1",
        )
        .bind(name)
        .fetch_optional(pool)
        .await
        .unwrap(),
        Db::Sqlite(pool, _) => {
            let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = $1")
                .bind(name)
                .fetch_one(pool)
                .await
                .unwrap();
            (n == 1).then_some(true)
        }
    }
}

async fn execute(db: &Db, sql: &str) {
    match db {
        Db::Postgres(pool) => sqlx::query(sql).execute(pool).await.map(|_| ()),
        Db::Sqlite(pool, _) => sqlx::query(sql).execute(pool).await.map(|_| ()),
    }
    .unwrap_or_else(|error| panic!("{sql}: {error}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_builds_the_big_indexes_in_their_migrations() {
    let gateway = Gateway::start(Backend::SqliteLocal).await;
    for index in BIG_INDEXES.iter().filter(|index| index.name != DROPPED) {
        assert_eq!(validity(&gateway.state.db, index.name).await, Some(true), "{}", index.name);
    }
    // 0019 and 0020 replaced 0001's indexes of the unfinished jobs by author and by status;
    // 0022 put back 0003's index of the functions' counts in place of 0018's.
    assert_eq!(validity(&gateway.state.db, DROPPED).await, None);
    assert_eq!(validity(&gateway.state.db, "jobs_active_author_idx").await, None);
    assert_eq!(validity(&gateway.state.db, "jobs_active_status_created_idx").await, None);
}

/// The index migration 0018 added and 0022 drops again (`BIG_INDEXES[1]`).
const DROPPED: &str = "job_counts_program_n_idx";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_builds_a_missing_or_invalid_big_index_concurrently_before_its_migration() {
    let gateway = Gateway::start(Backend::PostgresS3).await;
    let db = &gateway.state.db;
    let index = BIG_INDEXES.iter().find(|index| index.migration == 22).expect("0022's index");
    let by_day = BIG_INDEXES[0];
    assert_eq!(validity(db, index.name).await, Some(true));
    assert_eq!(validity(db, DROPPED).await, None);
    // Migrating again builds nothing back: 0014's index stays, 0018's stays dropped (its
    // migration is applied: a missing index is one a later migration dropped).
    db.migrate().await.unwrap();
    assert_eq!(validity(db, by_day.name).await, Some(true));
    assert_eq!(validity(db, DROPPED).await, None);
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    let run = serde_json::json!({"title": "fn", "arguments": "{}"});
    assert_eq!(gateway.post_json("/api/v1/programs/run/", "alice", run.clone()).await.status, 200);

    // A database whose migration 22 is pending (0018's index still there), its table holding
    // rows: migrate builds the index first (concurrently), then the migration finds it, drops
    // the one it replaces and is recorded.
    execute(db, &format!("DROP INDEX {}", index.name)).await;
    execute(db, &format!("CREATE INDEX {DROPPED} ON job_counts (program_id, status, n)")).await;
    execute(db, "DELETE FROM _sqlx_migrations WHERE version = 22").await;
    assert_eq!(validity(db, index.name).await, None);
    db.migrate().await.unwrap();
    assert_eq!(validity(db, index.name).await, Some(true));
    assert_eq!(validity(db, DROPPED).await, None);
    let Db::Postgres(pool) = db else { unreachable!() };
    // The gateway's sessions run without JIT compilation (short statements; see `db`).
    let jit: String = sqlx::query_scalar("SELECT current_setting('jit')").fetch_one(pool).await.unwrap();
    assert_eq!(jit, "off");
    let applied: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations WHERE version = 22").fetch_one(pool).await.unwrap();
    assert_eq!(applied, 1);

    // An interrupted concurrent build leaves the index invalid: the next start builds it again.
    execute(
        db,
        &format!(
            "UPDATE pg_index SET indisvalid = FALSE WHERE indexrelid = (SELECT oid FROM pg_class WHERE relname = '{}')",
            index.name
        ),
    )
    .await;
    assert_eq!(validity(db, index.name).await, Some(false));
    db.migrate().await.unwrap();
    assert_eq!(validity(db, index.name).await, Some(true));
    // The listing its counts serve still answers.
    let reply = gateway.get("/api/v1/jobs/?created_after=2000-01-01&status=QUEUED", "alice").await;
    assert_eq!((reply.status.as_u16(), reply.json["count"].as_i64()), (200, Some(1)), "{}", reply.json);
}
