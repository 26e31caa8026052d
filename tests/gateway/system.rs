//! Probes, version, authentication, error shapes, limits and the published interface.

use axum::body::Body;
use axum::http::{Request, header};
use serde_json::json;

use crate::both_backends;
use crate::harness::{Backend, Gateway};

both_backends!(
    probes_and_version_need_no_token,
    every_endpoint_but_probes_needs_a_token,
    bodies_above_the_limit_get_413_without_being_read,
    malformed_requests_get_clear_4xx,
    readiness_reports_an_unreachable_database,
    readiness_reports_unreachable_storage,
    swagger_describes_every_route,
);

async fn probes_and_version_need_no_token(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    for path in ["/liveness/", "/liveness", "/api/v1/liveness/", "/readiness/", "/readiness", "/api/v1/readiness"] {
        let reply = gateway.call("GET", path, None, None, Body::empty()).await;
        assert_eq!(reply.status, 200, "{path}");
    }
    assert_eq!(gateway.call("GET", "/readiness/", None, None, Body::empty()).await.json, json!({"status": "ready"}));
    for path in ["/version/", "/version", "/api/v1/version/"] {
        let reply = gateway.call("GET", path, None, None, Body::empty()).await;
        assert_eq!(reply.json, json!({"version": "9.9.9"}), "{path}");
    }
    let dependencies = gateway.get("/api/v1/dependencies-versions/", "alice").await;
    assert_eq!(dependencies.json.as_array().unwrap().len(), 10);
    assert_eq!(dependencies.json[1], "mergedeep==1.3.4");
}

async fn every_endpoint_but_probes_needs_a_token(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    let endpoints = [
        ("GET", "/api/v1/programs/"),
        ("GET", "/api/v1/programs"),
        ("GET", "/api/v1/programs/get_by_title/fn/"),
        ("POST", "/api/v1/programs/upload/"),
        ("POST", "/api/v1/programs/validate_arguments/"),
        ("GET", "/api/v1/files/?function=fn"),
        ("GET", "/api/v1/files/list/?function=fn"),
        ("POST", "/api/v1/files/upload/?function=fn"),
        ("GET", "/api/v1/files/download/?function=fn&file=a"),
        ("DELETE", "/api/v1/files/delete/?function=fn&file=a"),
        ("GET", "/api/v1/files/provider/?function=fn&provider=p"),
        ("POST", "/api/v1/files/provider/upload/?function=fn&provider=p"),
        ("GET", "/api/v1/files/provider/download/?function=fn&provider=p&file=a"),
        ("DELETE", "/api/v1/files/provider/delete/?function=fn&provider=p&file=a"),
        ("GET", "/api/v1/dependencies-versions/"),
        ("POST", "/api/v1/programs/run/"),
        ("GET", "/api/v1/programs/00000000-0000-0000-0000-000000000000/get_jobs/"),
        ("GET", "/api/v1/jobs/"),
        ("GET", "/api/v1/jobs/provider/?provider=p"),
        ("GET", "/api/v1/jobs/queue/"),
        ("GET", "/api/v1/jobs/00000000-0000-0000-0000-000000000000/"),
        ("GET", "/api/v1/jobs/00000000-0000-0000-0000-000000000000/result/"),
        ("POST", "/api/v1/jobs/00000000-0000-0000-0000-000000000000/result/"),
        ("GET", "/api/v1/jobs/00000000-0000-0000-0000-000000000000/logs/"),
        ("GET", "/api/v1/jobs/00000000-0000-0000-0000-000000000000/provider-logs/"),
        ("POST", "/api/v1/jobs/00000000-0000-0000-0000-000000000000/stop/"),
        ("PATCH", "/api/v1/jobs/00000000-0000-0000-0000-000000000000/sub_status/"),
        ("POST", "/api/v1/jobs/00000000-0000-0000-0000-000000000000/event/"),
        ("GET", "/api/v1/jobs/00000000-0000-0000-0000-000000000000/events/"),
        ("GET", "/api/v1/jobs/00000000-0000-0000-0000-000000000000/runtime_jobs/"),
        ("POST", "/api/v1/jobs/00000000-0000-0000-0000-000000000000/runtime_jobs/"),
    ];
    for (method, path) in endpoints {
        let reply = gateway.call(method, path, None, None, Body::empty()).await;
        assert_eq!(reply.status, 401, "{method} {path}");
        assert_eq!(reply.json, json!({"detail": "Authorization token was not provided."}), "{method} {path}");
        assert_eq!(reply.headers[header::WWW_AUTHENTICATE], "Bearer");
    }
    let bad_token = gateway.call("GET", "/api/v1/programs/", Some("../../etc"), None, Body::empty()).await;
    assert_eq!(bad_token.status, 401);
    assert!(bad_token.json["detail"].as_str().unwrap().starts_with("Authorization token is not valid"));
}

async fn bodies_above_the_limit_get_413_without_being_read(backend: Backend) {
    let gateway = Gateway::start_with(backend, |config| config.max_body_bytes = 1024 * 1024).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    // Declared too large: refused before any byte is read (the body here is never produced).
    let never_read = Body::from_stream(futures::stream::once(async {
        panic!("the body of an oversized request must not be read");
        #[allow(unreachable_code)]
        Ok::<_, std::io::Error>(bytes::Bytes::new())
    }));
    let request = Request::builder()
        .method("POST")
        .uri("/api/v1/files/upload/?function=fn")
        .header(header::AUTHORIZATION, "Bearer alice")
        .header(header::CONTENT_TYPE, "multipart/form-data; boundary=x")
        .header(header::CONTENT_LENGTH, 60 * 1024 * 1024)
        .body(never_read)
        .unwrap();
    let reply = gateway.send(request).await;
    assert_eq!(reply.status, 413);
    assert_eq!(reply.message(), "Request body is larger than the limit of 1 MB (MAX_REQUEST_BODY_SIZE_MB).");

    // Streamed without a length: cut off at the limit, nothing stored.
    let (content_type, body) = crate::harness::multipart(&[], &[("file", "big.txt", &vec![b'a'; 2 * 1024 * 1024])]);
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> =
        body.chunks(64 * 1024).map(|c| Ok(bytes::Bytes::copy_from_slice(c))).collect();
    let request = Request::builder()
        .method("POST")
        .uri("/api/v1/files/upload/?function=fn")
        .header(header::AUTHORIZATION, "Bearer alice")
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from_stream(futures::stream::iter(chunks)))
        .unwrap();
    let reply = gateway.send(request).await;
    assert_eq!(reply.status, 413, "{}", reply.json);
    assert!(reply.message().contains("1 MB"));
    assert_eq!(gateway.get("/api/v1/files?function=fn", "alice").await.json, json!({"results": []}));

    // The same for a JSON body.
    let big_json = json!({"title": "fn", "arguments": "x".repeat(2 * 1024 * 1024)}).to_string();
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> =
        big_json.as_bytes().chunks(64 * 1024).map(|c| Ok(bytes::Bytes::copy_from_slice(c))).collect();
    let request = Request::builder()
        .method("POST")
        .uri("/api/v1/programs/validate_arguments/")
        .header(header::AUTHORIZATION, "Bearer alice")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(futures::stream::iter(chunks)))
        .unwrap();
    assert_eq!(gateway.send(request).await.status, 413);
}

async fn malformed_requests_get_clear_4xx(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    let malformed = gateway
        .call("POST", "/api/v1/programs/upload/", Some("alice"), Some("application/json"), Body::from("{title"))
        .await;
    assert_eq!(malformed.status, 400);
    assert!(malformed.message().starts_with("Request body is not valid JSON"));
    let not_object = gateway
        .call("POST", "/api/v1/programs/upload/", Some("alice"), Some("application/json"), Body::from("[1]"))
        .await;
    assert_eq!((not_object.status.as_u16(), not_object.message()), (400, "Request body must be a JSON object.".into()));
    let wrong_type =
        gateway.call("POST", "/api/v1/programs/upload/", Some("alice"), Some("text/xml"), Body::from("<a/>")).await;
    assert_eq!(wrong_type.status, 415);
    assert!(wrong_type.message().contains("text/xml"));
    let broken_multipart = gateway
        .call("POST", "/api/v1/programs/upload/", Some("alice"), Some("multipart/form-data"), Body::from("--x"))
        .await;
    assert_eq!(broken_multipart.status, 400);
    let method = gateway.call("PUT", "/api/v1/programs/", Some("alice"), None, Body::empty()).await;
    assert_eq!(method.status, 405);
    assert_eq!(method.message(), "Method PUT is not allowed on /api/v1/programs/.");
    let unknown = gateway.call("GET", "/api/v1/nothing-here/", Some("alice"), None, Body::empty()).await;
    assert_eq!(unknown.status, 404);
    assert!(unknown.json.is_object());
    let bad_query = gateway.get("/api/v1/programs/?filter=catalog&provider=%ZZ", "alice").await;
    // Undecodable escapes are kept literally (and so name no provider), never a 500.
    assert_eq!(bad_query.status, 200);
    assert_eq!(bad_query.json, json!([]));
}

async fn readiness_reports_an_unreachable_database(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    match &gateway.state.db {
        gantry::db::Db::Sqlite(pool, _) => pool.close().await,
        gantry::db::Db::Postgres(pool) => pool.close().await,
    }
    let reply = gateway.call("GET", "/readiness/", None, None, Body::empty()).await;
    assert_eq!(reply.status, 503);
    assert_eq!(reply.json, json!({"status": "database_unavailable"}));
    // Liveness does not depend on it.
    assert_eq!(gateway.call("GET", "/liveness/", None, None, Body::empty()).await.status, 200);
}

async fn swagger_describes_every_route(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    let document = gateway.call("GET", "/swagger.json", None, None, Body::empty()).await.json;
    let paths = document["paths"].as_object().expect("paths");
    for path in [
        "/api/v1/programs/",
        "/api/v1/programs/get_by_title/{title}/",
        "/api/v1/programs/upload/",
        "/api/v1/programs/validate_arguments/",
        "/api/v1/files/",
        "/api/v1/files/list/",
        "/api/v1/files/upload/",
        "/api/v1/files/download/",
        "/api/v1/files/delete/",
        "/api/v1/files/provider/",
        "/api/v1/files/provider/upload/",
        "/api/v1/files/provider/download/",
        "/api/v1/files/provider/delete/",
        "/api/v1/dependencies-versions/",
        "/api/v1/programs/run/",
        "/api/v1/programs/{program_id}/get_jobs/",
        "/api/v1/jobs/",
        "/api/v1/jobs/provider/",
        "/api/v1/jobs/queue/",
        "/api/v1/jobs/{job_id}/",
        "/api/v1/jobs/{job_id}/result/",
        "/api/v1/jobs/{job_id}/logs/",
        "/api/v1/jobs/{job_id}/provider-logs/",
        "/api/v1/jobs/{job_id}/stop/",
        "/api/v1/jobs/{job_id}/sub_status/",
        "/api/v1/jobs/{job_id}/event/",
        "/api/v1/jobs/{job_id}/events/",
        "/api/v1/jobs/{job_id}/runtime_jobs/",
        "/version/",
        "/readiness/",
        "/liveness/",
    ] {
        assert!(paths.contains_key(path), "{path} is not documented");
    }
    assert!(!document.to_string().contains("compute_profile"));
    let page = gateway.call("GET", "/swagger/", None, None, Body::empty()).await;
    assert_eq!(page.status, 200);
    assert!(String::from_utf8_lossy(&page.bytes).contains("/api/v1/programs/upload/"));
}

async fn readiness_reports_unreachable_storage(backend: Backend) {
    let mut gateway = Gateway::start(backend).await;
    // A local root that is a file, or a bucket that does not exist.
    let broken = match &gateway.state.storage {
        gantry::storage::Storage::Local { root } => {
            let file = root.with_extension("not-a-folder");
            std::fs::write(&file, b"x").unwrap();
            gantry::storage::Storage::local(file)
        }
        gantry::storage::Storage::S3 { client, prefix, part_bytes, .. } => gantry::storage::Storage::S3 {
            client: client.clone(),
            bucket: "missing-bucket".into(),
            prefix: prefix.clone(),
            part_bytes: *part_bytes,
        },
    };
    gateway.state.storage = broken;
    let reply = gateway.call("GET", "/readiness/", None, None, Body::empty()).await;
    assert_eq!(reply.status, 503);
    assert_eq!(reply.json, json!({"status": "storage_unavailable"}));
}

/// `gantry serve` with a Python that cannot import the client prints the fix once at start.
#[tokio::test]
async fn serve_warns_when_the_jobs_python_lacks_the_client() {
    use tokio::io::AsyncBufReadExt;
    let data = tempfile::tempdir().unwrap();
    let mut serve = tokio::process::Command::new(env!("CARGO_BIN_EXE_gantry"))
        .args(["serve", "--listen", "127.0.0.1:0", "--python", "false", "--data-dir"])
        .arg(data.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(serve.stderr.take().unwrap()).lines();
    let warning = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.starts_with("warning:") {
                return line;
            }
        }
        panic!("gantry serve ended without a warning");
    })
    .await
    .expect("a warning within 60 s");
    assert!(warning.contains("(false) cannot import qiskit_serverless"), "{warning}");
    assert!(warning.contains("--python"), "{warning}");
    serve.kill().await.unwrap();
}

/// `gantry serve` prints its listening line only once its start-up checks passed: settings that
/// fail one end it with the reason and no such line, and settings that pass print it.
#[tokio::test]
async fn serve_says_it_listens_only_after_its_start_up_checks() {
    use std::os::unix::fs::PermissionsExt;
    use tokio::io::AsyncBufReadExt;
    async fn serve(data: &std::path::Path, flags: &[&str]) -> tokio::process::Child {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_gantry"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data)
            .args(flags)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    }
    let folder = tempfile::tempdir().unwrap();
    let private = folder.path().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    // Checks that fail: a webhook without its signing key (for any user) and, run as root, a
    // data dir below a folder the jobs' user (nobody) cannot pass through.
    let mut refusals = vec![(
        vec!["--runner", "none", "--events-webhook-url", "http://127.0.0.1:9/events"],
        "webhook events need a signing key",
    )];
    if gantry::launcher::isolation::running_as_root() {
        refusals.push((vec![], "which cannot pass through"));
    }
    for (index, (flags, reason)) in refusals.into_iter().enumerate() {
        let child = serve(&private.join(format!("refused-{index}")), &flags).await;
        let output = tokio::time::timeout(std::time::Duration::from_secs(60), child.wait_with_output())
            .await
            .expect("gantry serve ends within 60 s")
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(!output.status.success(), "{flags:?}: {stdout}{stderr}");
        assert!(stderr.contains(reason), "{flags:?}: {stderr}");
        assert!(!stdout.contains("listening"), "{flags:?} printed a listening line, then refused:\n{stdout}");
    }

    // Settings that pass: the line comes.
    let mut child = serve(&folder.path().join("served"), &["--runner", "none"]).await;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let listening = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("listening") {
                return line;
            }
        }
        panic!("gantry serve ended without a listening line");
    })
    .await
    .expect("a listening line within 60 s");
    assert!(listening.starts_with("gantry listening on http://127.0.0.1:"), "{listening}");
    child.kill().await.unwrap();
}
