//! The database failing under a running gateway, one row of the fault table per fault and
//! database: requests answer 503 with `Retry-After` and a message naming the database (never
//! "Internal server error"), readiness turns not-ready while PostgreSQL is away and ready again
//! after, and everything works again once the fault is lifted. Storage faults are in
//! `storage_faults`.

use std::time::Duration;

use serde_json::json;

use crate::eventually::eventually;
use crate::fault_guards::{Immutable, PrivateCluster, can_inject, root_missing};
use crate::harness::{Backend, Gateway, Reply};

fn assert_unavailable(reply: &Reply, why: &str) {
    assert_eq!(reply.status, 503, "{}", reply.json);
    assert_eq!(reply.headers.get("retry-after").and_then(|v| v.to_str().ok()), Some("5"));
    let message = reply.message();
    assert!(
        message.starts_with("The database is unavailable (") && message.ends_with("); retry in a few seconds."),
        "{message}"
    );
    assert!(message.contains(why), "{message}");
}

/// PostgreSQL: the gateway's database has its connections terminated and is renamed away (as
/// a restart or a failover leaves it for a while), then comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_away_answers_503_and_readiness_follows() {
    let gateway = Gateway::start(Backend::PostgresS3).await;
    assert_eq!(gateway.get("/api/v1/jobs/", "alice").await.status, 200);
    let url = gateway.database_url().unwrap();
    let (base, name) = url.rsplit_once('/').unwrap();
    let admin = sqlx::PgPool::connect(&format!("{base}/postgres")).await.unwrap();
    let away = format!("{name}_away");
    let mut renamed = false;
    for _ in 0..50 {
        sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
            .bind(name)
            .execute(&admin)
            .await
            .unwrap();
        if sqlx::query(&format!("ALTER DATABASE {name} RENAME TO {away}")).execute(&admin).await.is_ok() {
            renamed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(renamed, "the test database could not be renamed away");

    let reply = gateway.get("/api/v1/jobs/", "alice").await;
    assert_unavailable(&reply, "");
    // Connections the pool still held answer that they were terminated; new ones that the
    // database does not exist.
    let mut gone = None;
    for _ in 0..20 {
        let reply = gateway.get("/api/v1/programs/", "bob").await;
        assert_unavailable(&reply, "");
        if reply.message().contains("the database does not exist") {
            gone = Some(reply);
            break;
        }
    }
    assert!(gone.is_some(), "no request said the database does not exist");
    let ready = gateway.get("/readiness/", "").await;
    assert_eq!((ready.status.as_u16(), ready.json), (503, json!({"status": "database_unavailable"})));

    sqlx::query(&format!("ALTER DATABASE {away} RENAME TO {name}")).execute(&admin).await.unwrap();
    let ready = gateway.get("/readiness/", "").await;
    assert_eq!((ready.status.as_u16(), ready.json), (200, json!({"status": "ready"})));
    assert_eq!(gateway.get("/api/v1/jobs/", "alice").await.status, 200);
    assert_eq!(gateway.get("/api/v1/programs/", "bob").await.status, 200);
}

/// SQLite: another process holds the file's write lock past the busy timeout: a request that
/// must write (a new user) answers 503 naming the lock; reads and readiness go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_locked_answers_503_naming_the_lock() {
    let gateway = Gateway::start(Backend::SqliteLocal).await;
    assert_eq!(gateway.get("/api/v1/jobs/", "alice").await.status, 200);
    let file = gateway.data_dir().join("gantry.db");
    let other = sqlx::SqlitePool::connect(&format!("sqlite://{}", file.display())).await.unwrap();
    let mut holder = other.acquire().await.unwrap();
    sqlx::query("BEGIN IMMEDIATE").execute(&mut *holder).await.unwrap();

    let reply = gateway.get("/api/v1/jobs/", "newcomer").await;
    assert_unavailable(&reply, "the database is locked");
    assert_eq!(gateway.get("/api/v1/jobs/", "alice").await.status, 200, "reads go on");
    assert_eq!(gateway.get("/readiness/", "").await.status, 200);

    sqlx::query("ROLLBACK").execute(&mut *holder).await.unwrap();
    assert_eq!(gateway.get("/api/v1/jobs/", "newcomer").await.status, 200);
}

/// The writes of a request to a user never seen before (its row is made), and a read.
async fn assert_answers_normally(gateway: &Gateway, newcomer: &str) {
    assert_eq!(gateway.get("/api/v1/jobs/", newcomer).await.status, 200, "a new user is written");
    assert_eq!(gateway.get("/api/v1/programs/", "alice").await.status, 200);
}

/// Waits until readiness answers `status` (the pool reconnects on its own time).
async fn wait_for_readiness(gateway: &Gateway, status: u16) {
    eventually(&format!("readiness answers {status}"), Duration::from_secs(30), || async {
        let ready = gateway.get("/readiness/", "").await;
        if ready.status.as_u16() == status { Ok(()) } else { Err(format!("{}: {}", ready.status, ready.json)) }
    })
    .await
}

/// PostgreSQL restarted (`fast`: connections terminated, a clean shutdown) and killed
/// (`immediate`: crash recovery at the next start), on a private cluster of the test's own:
/// while it is down every request answers 503 naming the database and readiness is not ready;
/// once it is back, readiness and every request recover with no restart of the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_or_killed_answers_503_and_recovers() {
    if !can_inject("PostgreSQL stopped", PrivateCluster::missing()) {
        return;
    }
    let cluster = PrivateCluster::start();
    let gateway = Gateway::start_at(Backend::PostgresS3, &cluster.admin_url(), |_| {}).await;
    assert_answers_normally(&gateway, "first").await;
    for (round, mode) in ["fast", "immediate"].into_iter().enumerate() {
        cluster.down(mode);
        for user in ["alice", &format!("away-{round}")] {
            let reply = gateway.get("/api/v1/jobs/", user).await;
            assert_unavailable(&reply, "");
            let message = reply.message();
            assert!(
                [
                    "cannot reach it",
                    "the server is shutting down",
                    "its connections are closed",
                    "the connection failed",
                    // The pool retries a refused connection until its acquire timeout.
                    "no connection could be had in time",
                ]
                .iter()
                .any(|why| message.contains(why)),
                "{mode}: {message}"
            );
        }
        let ready = gateway.get("/readiness/", "").await;
        assert_eq!((ready.status.as_u16(), ready.json), (503, json!({"status": "database_unavailable"})), "{mode}");
        cluster.up().expect("start the cluster again");
        wait_for_readiness(&gateway, 200).await;
        assert_answers_normally(&gateway, &format!("back-{round}")).await;
    }
}

/// SQLite: the database file and its write-ahead log made immutable (not even root may write
/// them): a request that writes answers 503 naming the failing disk; reads and readiness go
/// on; once the files are writable again, so is the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_file_unwritable_answers_503_and_recovers() {
    if !can_inject("SQLite file unwritable", root_missing()) {
        return;
    }
    let gateway = Gateway::start(Backend::SqliteLocal).await;
    assert_answers_normally(&gateway, "first").await;
    let file = gateway.data_dir().join("gantry.db");
    let files: Vec<_> = ["", "-wal", "-shm"]
        .iter()
        .map(|suffix| file.with_file_name(format!("gantry.db{suffix}")))
        .filter(|path| path.exists())
        .collect();
    let immutable = match Immutable::set(&files) {
        Ok(guard) => guard,
        Err(why) if !can_inject("SQLite file unwritable", Some(why.clone())) => return,
        Err(why) => panic!("{why}"),
    };
    let reply = gateway.get("/api/v1/jobs/", "newcomer").await;
    assert_unavailable(&reply, "");
    assert!(
        ["disk I/O error", "the database is read-only", "the database file cannot be opened"]
            .iter()
            .any(|why| reply.message().contains(why)),
        "{}",
        reply.message()
    );
    assert_eq!(gateway.get("/api/v1/jobs/", "first").await.status, 200, "reads go on");
    assert_eq!(gateway.get("/readiness/", "").await.status, 200);

    drop(immutable);
    assert_answers_normally(&gateway, "newcomer").await;
}
