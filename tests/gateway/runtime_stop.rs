//! `stop` cancels the job's quantum work, against a fake IBM Quantum runtime service on loopback
//! (IAM's token exchange, job lookup, job cancel, session close, and its errors): each runtime
//! job cancelled once, each session closed once, the message naming each, the credentials kept
//! nowhere, and a slow service never holding the stop longer than the upstream timeout. The real
//! client's `job.stop(service=...)` against `gantry serve` is the ignored test at the end.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{delete, get, post};
use serde_json::{Value, json};

use crate::both_backends;
use crate::harness::{Backend, Gateway};
use gantry::auth::runtime_service::{NO_RUNTIME_JOBS, RuntimeService, SERVICE_NOT_FOUND, SERVICE_UNREADABLE};

both_backends!(stop_cancels_each_runtime_job_and_closes_each_session_once, a_slow_runtime_service_never_holds_the_stop);

const KEY: &str = "runtime-key-7f3a";
const ACCESS_TOKEN: &str = "iam-access-token-91c2";
const CRN: &str = "crn:v1:bluemix:public:quantum-computing:us-east:a/acct-1:instance-1::";

/// The fake IAM and runtime API: every call recorded as `METHOD path`.
#[derive(Clone)]
struct FakeRuntime {
    base: String,
    calls: Arc<Mutex<Vec<String>>>,
    /// Seconds every runtime API call waits before answering.
    delay: u64,
}

impl FakeRuntime {
    async fn start(delay: u64) -> FakeRuntime {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let fake = FakeRuntime { base, calls: Arc::default(), delay };
        let app = Router::new()
            .route("/identity/token", post(token))
            .route("/api/v1/jobs/{id}", get(job))
            .route("/api/v1/jobs/{id}/cancel", post(cancel))
            .route("/api/v1/sessions/{id}/close", delete(close))
            .with_state(fake.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        fake
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn count(&self, call: &str) -> usize {
        self.calls().iter().filter(|c| *c == call).count()
    }

    /// Records `call`; refuses any runtime API call not made with IAM's token as the instance.
    async fn answer(&self, call: String, headers: &HeaderMap) -> Option<StatusCode> {
        self.calls.lock().unwrap().push(call);
        tokio::time::sleep(Duration::from_secs(self.delay)).await;
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        if header("authorization") != format!("Bearer {ACCESS_TOKEN}") || header("service-crn") != CRN {
            return Some(StatusCode::UNAUTHORIZED);
        }
        None
    }
}

async fn token(
    State(fake): State<FakeRuntime>,
    axum::Form(form): axum::Form<std::collections::HashMap<String, String>>,
) -> (StatusCode, axum::Json<Value>) {
    fake.calls.lock().unwrap().push("POST /identity/token".into());
    assert_eq!(form.get("grant_type").map(String::as_str), Some("urn:ibm:params:oauth:grant-type:apikey"));
    match form.get("apikey").map(String::as_str) {
        Some(KEY) => (StatusCode::OK, axum::Json(json!({"access_token": ACCESS_TOKEN, "token_type": "Bearer"}))),
        _ => (StatusCode::BAD_REQUEST, axum::Json(json!({"errorCode": "BXNIM0415E"}))),
    }
}

async fn job(State(fake): State<FakeRuntime>, Path(id): Path<String>, headers: HeaderMap) -> StatusCode {
    if let Some(refused) = fake.answer(format!("GET /api/v1/jobs/{id}"), &headers).await {
        return refused;
    }
    if id.starts_with("rj-gone") { StatusCode::NOT_FOUND } else { StatusCode::OK }
}

async fn cancel(State(fake): State<FakeRuntime>, Path(id): Path<String>, headers: HeaderMap) -> StatusCode {
    if let Some(refused) = fake.answer(format!("POST /api/v1/jobs/{id}/cancel"), &headers).await {
        return refused;
    }
    match id.as_str() {
        "rj-done" => StatusCode::CONFLICT,
        "rj-broken" => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::NO_CONTENT,
    }
}

async fn close(State(fake): State<FakeRuntime>, Path(id): Path<String>, headers: HeaderMap) -> StatusCode {
    if let Some(refused) = fake.answer(format!("DELETE /api/v1/sessions/{id}/close"), &headers).await {
        return refused;
    }
    if id == "s-broken" { StatusCode::INTERNAL_SERVER_ERROR } else { StatusCode::NO_CONTENT }
}

/// The `service` the real client sends: its account serialized, the API key included.
fn service(key: &str) -> String {
    json!({"__type__": "QiskitRuntimeService", "__value__": {
        "channel": "ibm_quantum_platform", "url": "https://unused.example", "token": key,
        "instance": CRN, "verify": true, "private_endpoint": false}})
    .to_string()
}

async fn gateway_against(backend: Backend, fake: &FakeRuntime, timeout: Duration) -> Gateway {
    let mut gateway = Gateway::start(backend).await;
    gateway.state.runtime = Arc::new(
        RuntimeService::new(Some(fake.base.clone()), Some(fake.base.clone()), "us-east".into(), timeout).unwrap(),
    );
    let reply = gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    gateway
}

/// A queued job of alice's with `runtime_jobs` (job, session) reported.
async fn job_with(gateway: &Gateway, runtime_jobs: &[(&str, Option<&str>)]) -> String {
    let run = gateway.post_json("/api/v1/programs/run/", "alice", json!({"title": "fn", "arguments": "{}"})).await;
    assert_eq!(run.status, 200, "{}", run.json);
    let id = run.json["id"].as_str().unwrap().to_string();
    for (job, session) in runtime_jobs {
        let body = json!({"runtime_job": job, "runtime_session": session});
        let reply = gateway.post_json(&format!("/api/v1/jobs/{id}/runtime_jobs/"), "alice", body).await;
        assert!(reply.message().starts_with("RuntimeJob object"), "{}", reply.json);
    }
    id
}

async fn stop(gateway: &Gateway, id: &str, service: Option<String>) -> String {
    let body = match service {
        Some(service) => json!({"service": service}),
        None => json!({}),
    };
    let reply = gateway.post_json(&format!("/api/v1/jobs/{id}/stop/"), "alice", body).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    reply.message()
}

fn requested(id: &str) -> String {
    format!("Stop requested for job {id}; its status will show STOPPED once it has stopped.")
}

async fn stop_cancels_each_runtime_job_and_closes_each_session_once(backend: Backend) {
    let fake = FakeRuntime::start(0).await;
    let gateway = gateway_against(backend, &fake, Duration::from_secs(5)).await;
    let id = job_with(
        &gateway,
        &[
            ("rj-1", Some("s-1")),
            ("rj-2", Some("s-1")),
            ("rj-3", None),
            ("rj-done", None),
            ("rj-broken", None),
            ("rj-4", Some("s-broken")),
            ("rj-gone", Some("s-2")),
            ("rj-5", Some("")),
        ],
    )
    .await;

    let message = stop(&gateway, &id, Some(service(KEY))).await;
    let expected = [
        requested(&id),
        "Canceled runtime session: s-1 and associated runtime jobs.".into(),
        "Canceled runtime job [rj-3].".into(),
        "Runtime job rj-done could not be canceled (invalid state).".into(),
        "Runtime job rj-broken could not be canceled. Exception: the runtime service answered 500 Internal Server Error"
            .into(),
        "Runtime session s-broken could not be canceled. Exception: the runtime service answered 500 Internal Server Error"
            .into(),
        "Runtime job rj-gone not found in runtime service. Check that credentials used to authenticate match.".into(),
        "Canceled runtime job [rj-5].".into(),
    ];
    assert_eq!(message, expected.join(" "));
    // One token exchange; each job looked up once; each session closed once, none for a job
    // the service does not know; a job without a session cancelled once.
    assert_eq!(fake.count("POST /identity/token"), 1, "{:?}", fake.calls());
    for job in ["rj-1", "rj-2", "rj-3", "rj-done", "rj-broken", "rj-4", "rj-gone", "rj-5"] {
        assert_eq!(fake.count(&format!("GET /api/v1/jobs/{job}")), 1, "{job}: {:?}", fake.calls());
    }
    assert_eq!(fake.count("DELETE /api/v1/sessions/s-1/close"), 1);
    assert_eq!(fake.count("DELETE /api/v1/sessions/s-broken/close"), 1);
    assert_eq!(fake.count("DELETE /api/v1/sessions/s-2/close"), 0);
    for job in ["rj-3", "rj-done", "rj-broken", "rj-5"] {
        assert_eq!(fake.count(&format!("POST /api/v1/jobs/{job}/cancel")), 1, "{job}");
    }
    assert_eq!(fake.calls().len(), 1 + 8 + 2 + 4, "{:?}", fake.calls());
    let job = gateway.get(&format!("/api/v1/jobs/{id}/"), "alice").await.json;
    assert_eq!(job["status"], "STOPPED");

    // The credentials and IAM's token are kept nowhere: not in the events, the answers, the
    // database or storage.
    let events = gateway.get(&format!("/api/v1/jobs/{id}/events/"), "alice").await.json.to_string();
    let runtime_jobs = gateway.get(&format!("/api/v1/jobs/{id}/runtime_jobs/"), "alice").await.json.to_string();
    for secret in [KEY, ACCESS_TOKEN] {
        assert!(!events.contains(secret) && !runtime_jobs.contains(secret) && !message.contains(secret));
        assert!(!gateway.keeps_anywhere(secret).await, "{secret} is kept");
    }
    assert!(gateway.keeps_anywhere("rj-broken").await, "the search finds what is kept");

    // A key IAM refuses: each runtime job says why, the job was stopped all the same.
    let calls = fake.calls().len();
    let refused = job_with(&gateway, &[("rj-6", Some("s-3")), ("rj-7", None)]).await;
    assert_eq!(
        stop(&gateway, &refused, Some(service("not-a-key"))).await,
        format!(
            "{} Runtime job rj-6 could not be canceled. Exception: IAM answered 400 Bad Request \
             Runtime job rj-7 could not be canceled. Exception: IAM answered 400 Bad Request",
            requested(&refused)
        )
    );
    assert_eq!(fake.calls().len(), calls + 1, "only the token exchange: {:?}", fake.calls());
    assert_eq!(gateway.get(&format!("/api/v1/jobs/{refused}/"), "alice").await.json["status"], "STOPPED");

    // No service (absent, "null"), an unreadable one, no runtime jobs: no call at all.
    let calls = fake.calls().len();
    let plain = job_with(&gateway, &[("rj-8", None)]).await;
    assert_eq!(stop(&gateway, &plain, None).await, format!("{} {SERVICE_NOT_FOUND}", requested(&plain)));
    let finished = format!("Job {plain} had already finished (STOPPED); nothing to stop.");
    assert_eq!(stop(&gateway, &plain, Some("null".into())).await, format!("{finished} {SERVICE_NOT_FOUND}"));
    assert_eq!(stop(&gateway, &plain, Some("{not json".into())).await, format!("{finished} {SERVICE_UNREADABLE}"));
    let bare = job_with(&gateway, &[]).await;
    assert_eq!(stop(&gateway, &bare, Some(service(KEY))).await, format!("{} {NO_RUNTIME_JOBS}", requested(&bare)));
    assert_eq!(fake.calls().len(), calls);
    // A finished job's runtime jobs are still cancelled, as the reference does.
    assert_eq!(stop(&gateway, &plain, Some(service(KEY))).await, format!("{finished} Canceled runtime job [rj-8]."));
}

/// A runtime service that never answers in time: the stop answers within the upstream timeout
/// (all calls share it), the job is stopped, and the message says which calls timed out.
async fn a_slow_runtime_service_never_holds_the_stop(backend: Backend) {
    let fake = FakeRuntime::start(30).await;
    let gateway = gateway_against(backend, &fake, Duration::from_secs(1)).await;
    let id = job_with(&gateway, &[("rj-1", Some("s-1")), ("rj-2", None), ("rj-3", None)]).await;
    let started = Instant::now();
    let message = stop(&gateway, &id, Some(service(KEY))).await;
    assert!(started.elapsed() < Duration::from_secs(3), "the stop took {:?}", started.elapsed());
    let late = "could not be canceled. Exception: the runtime service did not answer within 1 s";
    assert_eq!(
        message,
        format!("{} Runtime job rj-1 {late} Runtime job rj-2 {late} Runtime job rj-3 {late}", requested(&id))
    );
    assert_eq!(gateway.get(&format!("/api/v1/jobs/{id}/"), "alice").await.json["status"], "STOPPED");
}

/// The real client (`tests/e2e/client_stop.py`, `job.stop(service=...)` with a runtime
/// service serialized by the client itself) against a `gantry serve` process whose IAM and
/// runtime API are the fake: each runtime job cancelled once, each session closed once, the
/// key in none of the server's log and files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by tests/run.sh: needs GANTRY_TEST_PYTHON and the built client"]
async fn the_real_client_stops_the_jobs_runtime_work() {
    let python = std::env::var("GANTRY_TEST_PYTHON").expect("GANTRY_TEST_PYTHON: a Python with qiskit-serverless");
    let fake = FakeRuntime::start(0).await;
    let folder = tempfile::tempdir().unwrap();
    let port = crate::e2e_kubernetes::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let log = folder.path().join("serve.log");
    let data = folder.path().join("data");
    let args: Vec<String> = [
        "serve",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--data-dir",
        &data.display().to_string(),
        "--python",
        &python,
        "--iam-url",
        &fake.base,
        "--runtime-api-url",
        &fake.base,
    ]
    .into_iter()
    .map(str::to_string)
    .collect();
    let mut serve = crate::e2e_kubernetes::spawn_role(&args, &[], &log);
    crate::e2e_kubernetes::wait_until_ready(&url, &mut [(&mut serve, &log)]).await;
    crate::e2e_kubernetes::run_client_checks(
        &python,
        &["tests/e2e/client_stop.py", &url, KEY, CRN],
        &[("gantry serve", &log)],
    )
    .await;
    let _ = serve.kill().await;
    let _ = serve.wait().await;

    assert_eq!(fake.count("POST /identity/token"), 1, "{:?}", fake.calls());
    assert_eq!(fake.count("DELETE /api/v1/sessions/e2e-session/close"), 1, "{:?}", fake.calls());
    for job in ["e2e-rj-1", "e2e-rj-2"] {
        assert_eq!(fake.count(&format!("POST /api/v1/jobs/{job}/cancel")), 1, "{job}: {:?}", fake.calls());
    }
    assert_eq!(fake.count("POST /api/v1/jobs/e2e-rj-s/cancel"), 0, "its session was closed instead");
    let served_log = std::fs::read_to_string(&log).unwrap();
    assert!(served_log.contains("context=STOP_JOB"), "the log holds the stops:\n{served_log}");
    let mut folders = vec![folder.path().to_path_buf()];
    while let Some(current) = folders.pop() {
        for entry in std::fs::read_dir(&current).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                for secret in [KEY, ACCESS_TOKEN] {
                    let found = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
                    assert!(!found, "{secret} is in {}", path.display());
                }
            }
        }
    }
}
