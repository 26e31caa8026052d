//! The database failing under a running gateway: requests answer 503 with `Retry-After` and a
//! message naming the database (never "Internal server error"), readiness turns not-ready while
//! PostgreSQL is away and ready again after, and everything works again once it is back.

use std::time::Duration;

use serde_json::json;

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
