//! Servers keep the users of known tokens in memory (one round trip per request), yet what
//! `gantry admin` changes takes effect on every server at once: two real `gantry serve`
//! processes on one PostgreSQL database, changed by the real `gantry admin` command, and the
//! same on SQLite with a server and the command sharing the file. Also the fault paths: the
//! servers' connections that follow changes are killed, and a change made before they are back
//! still takes effect.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::eventually::{eventually, eventually_every};
use crate::harness::{Backend, Gateway};

/// A running `gantry serve`, killed on drop.
struct Server {
    _child: tokio::process::Child,
    base: String,
}

async fn serve(data_dir: &std::path::Path, database_url: Option<&str>) -> Server {
    use tokio::io::AsyncBufReadExt;
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_gantry"));
    command.args(["serve", "--listen", "127.0.0.1:0", "--runner", "none", "--data-dir"]).arg(data_dir);
    if let Some(url) = database_url {
        command.args(["--database-url", url]);
    }
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start gantry serve");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let base = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.strip_prefix("gantry listening on ") {
                return rest.split_whitespace().next().unwrap().to_string();
            }
        }
        panic!("gantry serve ended before listening");
    })
    .await
    .expect("gantry serve listens within 60 s");
    // Keep reading its output so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Server { _child: child, base }
}

/// `gantry admin <words>` on that database.
async fn admin(database: &[&str], words: &[&str]) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_gantry"))
        .arg("admin")
        .args(database)
        .args(words)
        .output()
        .await
        .expect("run gantry admin");
    assert!(output.status.success(), "gantry admin {words:?}: {}", String::from_utf8_lossy(&output.stderr));
}

async fn get(server: &Server, path: &str, token: &str) -> (u16, Value) {
    call(server, path, token, None).await
}

/// GET `path`, or POST `body` as JSON to it.
async fn call(server: &Server, path: &str, token: &str, body: Option<&Value>) -> (u16, Value) {
    use http_body_util::BodyExt;
    let client = gantry::http::http_client().unwrap();
    let request = hyper::Request::builder()
        .uri(format!("{}{path}", server.base))
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json");
    let request = match body {
        None => request.method("GET").body(gantry::http::empty()),
        Some(body) => request.method("POST").body(
            http_body_util::Full::new(bytes::Bytes::from(body.to_string())).map_err(|never| match never {}).boxed(),
        ),
    }
    .unwrap();
    let response = client.request(request).await.expect("request");
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn titles(functions: &Value) -> Vec<String> {
    functions.as_array().unwrap().iter().map(|f| f["title"].as_str().unwrap().to_string()).collect()
}

/// Asks until `server` answers `path` with `status`, for at most two seconds; answers how long
/// the change took to show.
async fn shows(server: &Server, path: &str, token: &str, status: u16) -> (Duration, Value) {
    shows_with(server, path, token, None, status).await
}

async fn shows_with(server: &Server, path: &str, token: &str, body: Option<&Value>, status: u16) -> (Duration, Value) {
    // Asked every 5 ms: how soon it showed is what some tests measure.
    let started = Instant::now();
    let what = format!("{} {path} answered {status}", server.base);
    let body = eventually_every(&what, Duration::from_secs(2), Duration::from_millis(5), || async {
        let (answered, body) = call(server, path, token, body).await;
        if answered == status { Ok(body) } else { Err(format!("still {answered} {body}")) }
    })
    .await;
    (started.elapsed(), body)
}

const DEACTIVATED: &str = "Your user was deactivated. Please contact IBM support for reactivation.";

#[tokio::test]
async fn admin_changes_reach_every_server_at_once_on_postgres() {
    let gateway = Gateway::start(Backend::PostgresS3).await;
    let url = gateway.database_url().unwrap();
    let database = ["--database-url", url.as_str()];
    gateway.provider("acme", None, "erin").await;
    let upload = gateway.upload_function("erin", &[("title", "acme/tool"), ("entrypoint", "main.py")]).await;
    assert_eq!(upload.status, 200, "{}", upload.json);
    let dirs = tempfile::tempdir().unwrap();
    let servers = [serve(&dirs.path().join("a"), Some(&url)).await, serve(&dirs.path().join("b"), Some(&url)).await];

    // bob is known to both servers (twice: the second answer comes from memory).
    for server in &servers {
        for _ in 0..2 {
            let (status, body) = get(server, "/api/v1/programs/", "bob").await;
            assert_eq!((status, titles(&body)), (200, vec![]), "{}", server.base);
        }
    }

    // Groups and grants: read with the data, so the very next request shows them.
    admin(&database, &["add-member", "--group", "readers", "--user", "bob"]).await;
    admin(&database, &["grant", "--provider", "acme", "--function", "tool", "--group", "readers", "--view"]).await;
    for server in &servers {
        let (status, body) = get(server, "/api/v1/programs/", "bob").await;
        assert_eq!((status, titles(&body)), (200, vec!["tool".to_string()]), "{}", server.base);
    }
    admin(&database, &["grant", "--provider", "acme", "--function", "tool", "--group", "readers"]).await;
    for server in &servers {
        let (status, body) = get(server, "/api/v1/programs/", "bob").await;
        assert_eq!((status, titles(&body)), (200, vec![]), "{}", server.base);
    }

    // Run rights: `run` keeps the function it resolved in memory, yet a revoked grant stops the
    // next run on both servers.
    admin(&database, &["grant", "--provider", "acme", "--function", "tool", "--group", "readers", "--run"]).await;
    let run = serde_json::json!({"title": "tool", "provider": "acme", "arguments": "{}", "config": {}});
    for server in &servers {
        for _ in 0..2 {
            let (status, body) = call(server, "/api/v1/programs/run/", "bob", Some(&run)).await;
            assert_eq!(status, 200, "{} {body}", server.base);
        }
    }
    admin(&database, &["grant", "--provider", "acme", "--function", "tool", "--group", "readers"]).await;
    for server in &servers {
        let (took, body) = shows_with(server, "/api/v1/programs/run/", "bob", Some(&run), 404).await;
        assert_eq!(body["message"], "Qiskit Function acme/tool doesn't exist.");
        eprintln!("revoked run right shown by {} after {took:?}", server.base);
    }

    // What `run` keeps of a function follows the function itself too: disabled (423), enabled,
    // and a new version uploaded through a third replica (the in-process gateway) whose schema
    // the arguments break (400), each on both servers.
    admin(&database, &["grant", "--provider", "acme", "--function", "tool", "--group", "readers", "--run"]).await;
    for server in &servers {
        shows_with(server, "/api/v1/programs/run/", "bob", Some(&run), 200).await;
    }
    admin(&database, &["disable-function", "--provider", "acme", "--function", "tool", "--message", "Back soon."])
        .await;
    for server in &servers {
        let (_, body) = shows_with(server, "/api/v1/programs/run/", "bob", Some(&run), 423).await;
        assert_eq!(body["message"], "Back soon.");
    }
    admin(&database, &["enable-function", "--provider", "acme", "--function", "tool"]).await;
    for server in &servers {
        shows_with(server, "/api/v1/programs/run/", "bob", Some(&run), 200).await;
    }
    let schema = r#"{"type": "object", "required": ["n"]}"#;
    let upload = gateway
        .upload_function("erin", &[("title", "acme/tool"), ("entrypoint", "main.py"), ("arguments_schema", schema)])
        .await;
    assert_eq!(upload.status, 200, "{}", upload.json);
    for server in &servers {
        let (_, body) = shows_with(server, "/api/v1/programs/run/", "bob", Some(&run), 400).await;
        assert!(body["message"].as_str().unwrap().starts_with("'required' validation failed"), "{body}");
    }
    admin(&database, &["grant", "--provider", "acme", "--function", "tool", "--group", "readers"]).await;

    // Deactivation: both servers forget bob when PostgreSQL tells them.
    admin(&database, &["deactivate-user", "bob"]).await;
    for server in &servers {
        let (took, body) = shows(server, "/api/v1/programs/", "bob", 401).await;
        assert_eq!(body["detail"], DEACTIVATED);
        eprintln!("deactivation shown by {} after {took:?}", server.base);
    }
    admin(&database, &["activate-user", "bob"]).await;
    for server in &servers {
        shows(server, "/api/v1/programs/", "bob", 200).await;
    }

    // The connections that follow the changes are killed; a change made before they are back
    // (notifications sent meanwhile are lost) must still take effect.
    let gantry::db::Db::Postgres(pool) = &gateway.state.db else { unreachable!("a PostgreSQL gateway") };
    let listeners = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%'";
    let killed: Vec<i32> =
        sqlx::query_scalar(&format!("SELECT pid FROM ({listeners}) l WHERE pg_terminate_backend(pid)"))
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(killed.len(), 2, "one connection following changes per server");
    admin(&database, &["deactivate-user", "bob"]).await;
    for server in &servers {
        let (_, body) = shows(server, "/api/v1/programs/", "bob", 401).await;
        assert_eq!(body["detail"], DEACTIVATED);
    }
    // Both follow again, on new connections, and a change is again seen by both.
    eventually("the servers followed changes again", Duration::from_secs(20), || async {
        let now: Vec<i32> = sqlx::query_scalar(listeners).fetch_all(pool).await.unwrap();
        if now.len() == 2 && now.iter().all(|pid| !killed.contains(pid)) { Ok(()) } else { Err(format!("{now:?}")) }
    })
    .await;
    admin(&database, &["activate-user", "bob"]).await;
    for server in &servers {
        shows(server, "/api/v1/programs/", "bob", 200).await;
        shows(server, "/api/v1/programs/", "bob", 200).await;
    }
    admin(&database, &["deactivate-user", "bob"]).await;
    for server in &servers {
        shows(server, "/api/v1/programs/", "bob", 401).await;
    }
}

#[tokio::test]
async fn admin_changes_reach_a_server_on_the_same_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = serve(&data, None).await;
    let database = ["--data-dir", data.to_str().unwrap()];
    for _ in 0..2 {
        assert_eq!(get(&server, "/api/v1/programs/", "bob").await.0, 200);
    }
    admin(&database, &["deactivate-user", "bob"]).await;
    let (took, body) = shows(&server, "/api/v1/programs/", "bob", 401).await;
    assert_eq!(body["detail"], DEACTIVATED);
    eprintln!("deactivation shown after {took:?} (the stamp is read every 100 ms)");
    admin(&database, &["activate-user", "bob"]).await;
    shows(&server, "/api/v1/programs/", "bob", 200).await;
}

/// A database URL naming PostgreSQL's Unix socket folder (`host=/var/run/postgresql`) connects
/// over the socket, with no TCP.
#[tokio::test]
async fn postgres_over_its_unix_socket() {
    let tcp_url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let gantry::db::Db::Postgres(tcp) = gantry::db::Db::connect(&tcp_url).await.expect("PostgreSQL at DATABASE_URL")
    else {
        panic!("DATABASE_URL must be a postgres:// URL")
    };
    let (folders, port, user, database): (String, String, String, String) = sqlx::query_as(
        "SELECT current_setting('unix_socket_directories'), current_setting('port'), current_user, current_database()",
    )
    .fetch_one(&tcp)
    .await
    .unwrap();
    let folder = folders.split(',').next().unwrap().trim().to_string();
    assert!(folder.starts_with('/'), "PostgreSQL listens on no Unix socket: {folders}");
    for url in [
        format!("postgresql:///{database}?host={folder}&port={port}&user={user}"),
        format!("postgres://{user}@{}:{port}/{database}", folder.replace('/', "%2F")),
    ] {
        let db = gantry::db::Db::connect(&url).await.unwrap_or_else(|e| panic!("{url}: {e:?}"));
        db.ping().await.unwrap();
        let gantry::db::Db::Postgres(pool) = &db else { panic!("{url} is not PostgreSQL") };
        let address: Option<String> =
            sqlx::query_scalar("SELECT host(inet_server_addr())").fetch_one(pool).await.unwrap();
        assert_eq!(address, None, "{url} went over TCP");
    }
}
