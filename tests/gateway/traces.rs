//! One trace per job (issue 31), seen by an OTLP/HTTP collector in the test: `gantry serve` as a
//! process exports its spans and its launchers' spans to it, and the spans are decoded with
//! `opentelemetry-proto`. A job's spans form one tree from the `run` request to the launcher's
//! last span (every parent present), carry no secret, and a dead or silent collector changes
//! no answer.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;
use serde_json::{Value, json};

use crate::both_backends;
use crate::eventually::{eventually, until};
use crate::harness::{Backend, Gateway, tar_of};

/// One span as the collector received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub service: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent: String,
    pub attributes: BTreeMap<String, String>,
}

/// An OTLP/HTTP (protobuf) collector on loopback, keeping every span it is sent.
pub struct Collector {
    pub endpoint: String,
    spans: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn text(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(text)) => text.clone(),
        Some(AnyValue::IntValue(n)) => n.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

async fn receive(State(spans): State<Arc<Mutex<Vec<Received>>>>, body: Bytes) -> impl axum::response::IntoResponse {
    let request = ExportTraceServiceRequest::decode(body).expect("the exporter sends OTLP protobuf");
    let mut received = Vec::new();
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .iter()
            .flat_map(|resource| &resource.attributes)
            .find(|attribute| attribute.key == "service.name")
            .map(|attribute| text(attribute.value.as_ref()))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                received.push(Received {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent: hex(&span.parent_span_id),
                    attributes: span.attributes.iter().map(|a| (a.key.clone(), text(a.value.as_ref()))).collect(),
                });
            }
        }
    }
    spans.lock().unwrap().extend(received);
    ([("content-type", "application/x-protobuf")], ExportTraceServiceResponse::default().encode_to_vec())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Collector {
    pub async fn start() -> Collector {
        let spans = Arc::new(Mutex::new(Vec::new()));
        // `/hook` stands for a webhook sink of job events, so deliveries have spans too.
        let router = axum::Router::new()
            .route("/v1/traces", axum::routing::post(receive))
            .route("/hook", axum::routing::post(|| async { "ok" }))
            .with_state(spans.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        });
        Collector { endpoint, spans, task }
    }

    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits (at most `seconds`) until `done` holds for the spans received.
    pub async fn wait_for(&self, seconds: u64, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        eventually("the spans arrived", Duration::from_secs(seconds), || async {
            let spans = self.spans();
            if done(&spans) { Ok(spans) } else { Err(format!("received: {spans:#?}")) }
        })
        .await
    }
}

/// `curl`, awaited (the collector on this runtime keeps answering meanwhile).
pub async fn curl(args: Vec<String>) -> String {
    let output = tokio::process::Command::new("curl").arg("-sS").args(args).output().await.expect("curl runs");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A `gantry serve` process with `variables` in its environment.
pub struct Serve {
    pub base: String,
    child: tokio::process::Child,
}

impl Serve {
    pub async fn start(data: &Path, python: &str, variables: &[(&str, &str)], arguments: &[&str]) -> Serve {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_gantry"));
        command
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--scheduler-tick-ms", "50", "--python", python])
            .args(arguments)
            .arg("--data-dir")
            .arg(data)
            .envs(variables.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("gantry serve starts");
        let base = format!("http://127.0.0.1:{port}");
        until("gantry serve became ready", Duration::from_secs(60), || {
            // Ended instead: its stderr says why.
            let ended = child.try_wait().unwrap().map(|status| (status, child.stderr.take()));
            let readiness = curl(vec![format!("{base}/readiness/")]);
            async move {
                if let Some((status, stderr)) = ended {
                    let mut said = String::new();
                    let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr.unwrap(), &mut said).await;
                    panic!("gantry serve ended ({status}):\n{said}");
                }
                readiness.await.contains("ready")
            }
        })
        .await;
        Serve { base, child }
    }

    /// Ends the process (SIGTERM: it sends its last spans) and returns its stderr.
    pub async fn stop(self) -> String {
        let pid = self.child.id().expect("the process runs");
        // SAFETY: a signal to the child this test started.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let output = tokio::time::timeout(Duration::from_secs(30), self.child.wait_with_output())
            .await
            .expect("gantry serve ends on SIGTERM")
            .unwrap();
        String::from_utf8_lossy(&output.stderr).into_owned()
    }
}

/// What one job's run answered.
#[derive(Debug, PartialEq)]
pub struct Answers {
    pub upload: bool,
    pub run_status: Value,
    pub final_status: Value,
    pub logs: Value,
}

/// Uploads `main.py` as function `fn` and runs it as `user` with `arguments`, sending
/// `traceparent` with the run; waits for the job's end.
pub async fn run_job(
    base: &str,
    dir: &Path,
    user: &str,
    main: &str,
    arguments: Value,
    traceparent: &str,
) -> (String, Answers) {
    let artifact = dir.join("fn.tar");
    std::fs::write(&artifact, tar_of(&[("main.py", main.as_bytes())])).unwrap();
    let auth = format!("Authorization: Bearer {user}");
    let uploaded = curl(
        ["-H", &auth, "-F", "title=fn", "-F", "entrypoint=main.py", "-F", &format!("artifact=@{}", artifact.display())]
            .iter()
            .map(|s| s.to_string())
            .chain([format!("{base}/api/v1/programs/upload/")])
            .collect(),
    )
    .await;
    let body = json!({"title": "fn", "arguments": arguments.to_string()}).to_string();
    let run: Value = serde_json::from_str(
        &curl(vec![
            "-H".into(),
            auth.clone(),
            "-H".into(),
            "Content-Type: application/json".into(),
            "-H".into(),
            format!("traceparent: {traceparent}"),
            "-d".into(),
            body,
            format!("{base}/api/v1/programs/run/"),
        ])
        .await,
    )
    .unwrap();
    let id = run["id"].as_str().unwrap_or_else(|| panic!("run answered {run}")).to_string();
    let job = eventually("the job ended", Duration::from_secs(90), || async {
        let job: Value =
            serde_json::from_str(&curl(vec!["-H".into(), auth.clone(), format!("{base}/api/v1/jobs/{id}/")]).await)
                .unwrap();
        if ["SUCCEEDED", "FAILED", "STOPPED"].contains(&job["status"].as_str().unwrap_or_default()) {
            Ok(job)
        } else {
            Err(job)
        }
    })
    .await;
    let logs: Value =
        serde_json::from_str(&curl(vec!["-H".into(), auth, format!("{base}/api/v1/jobs/{id}/logs/")]).await).unwrap();
    let answers = Answers {
        upload: uploaded.contains("\"title\":\"fn\""),
        run_status: run["status"].clone(),
        final_status: job["status"].clone(),
        logs: logs["logs"].clone(),
    };
    (id, answers)
}

/// The caller's trace and its span: the `run` request's span must be its child.
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
/// Values that must never become attributes: the caller's token (mock_token: the user name),
/// an argument's value, and a line the function logs.
const TOKEN: &str = "tracer-token-9d2e";
const ARGUMENT: &str = "argument-value-5b1c";
const LOG_LINE: &str = "log-line-7e4a";
const WEBHOOK_SECRET: &str = "webhook-secret-3c9f";

const PLAIN_FUNCTION: &str = "print('log-line-7e4a')\n";

/// A function using the OpenTelemetry SDK: it continues the job's trace from `traceparent`.
const TRACED_FUNCTION: &str = r#"
import os
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
parent = TraceContextTextMapPropagator().extract({"traceparent": os.environ["traceparent"]})
with provider.get_tracer("function").start_as_current_span("function.work", context=parent):
    print("log-line-7e4a")
provider.shutdown()
"#;

/// Runs one job on a traced `gantry serve` and checks its trace; returns the job's spans.
async fn one_traced_job(python: &str, main: &str, expected: &[&str]) -> Vec<Received> {
    let collector = Collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let hook = format!("{}/hook", collector.endpoint);
    let variables = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("RUST_LOG", "info,tower_http=debug"),
        ("GANTRY_EVENTS_WEBHOOK_URL", hook.as_str()),
        ("GANTRY_EVENTS_WEBHOOK_SECRET", WEBHOOK_SECRET),
        ("GANTRY_EVENTS_POLL_MS", "100"),
    ];
    let arguments = ["--log-format", "json", "--trace-link", "http://jaeger.example:16686/trace/{trace_id}"];
    let serve = Serve::start(&dir.path().join("data"), python, &variables, &arguments).await;
    let traceparent = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let (id, answers) = run_job(&serve.base, dir.path(), TOKEN, main, json!({"secret": ARGUMENT}), &traceparent).await;
    assert_eq!(answers.final_status, "SUCCEEDED", "{answers:?}");
    let trace = curl(vec![
        "-H".into(),
        format!("Authorization: Bearer {TOKEN}"),
        format!("{}/api/v1/jobs/{id}/trace/", serve.base),
    ]);
    let trace: Value = serde_json::from_str(&trace.await).unwrap();
    let link = format!("http://jaeger.example:16686/trace/{CALLER_TRACE}");
    assert_eq!(trace, json!({"trace_id": CALLER_TRACE, "link": link}));
    let in_trace = |spans: &[Received]| -> Vec<Received> {
        spans.iter().filter(|span| span.trace_id == CALLER_TRACE).cloned().collect()
    };
    let spans = collector
        .wait_for(30, |spans| {
            let names: BTreeSet<String> = in_trace(spans).into_iter().map(|span| span.name).collect();
            expected.iter().all(|name| names.contains(*name))
                && in_trace(spans)
                    .iter()
                    .any(|s| s.attributes.get("gantry.job.status").is_some_and(|s| s == "SUCCEEDED"))
        })
        .await;
    // Stopped, it has sent all it had (the reads' spans too).
    let stderr = serve.stop().await;
    drop(spans);
    let spans = collector.spans();
    let trace = in_trace(&spans);

    check_trace(&spans, &id, "gantry");
    // JSON logs: every line parses; the run request's lines carry its trace id.
    let lines: Vec<Value> = stderr
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}")))
        .collect();
    assert!(
        lines.iter().any(|line| line["trace_id"] == CALLER_TRACE && line["span"] == "request"),
        "no log line of the run request carries its trace: {stderr}"
    );
    trace
}

/// The checks every traced job passes: the run request is the caller's child and every other
/// span's parent is in the trace; the launcher's spans come from the launcher; the moves name
/// the statuses; a read has its own trace; no secret is an attribute.
fn check_trace(spans: &[Received], id: &str, gateway_service: &str) {
    let trace: Vec<&Received> = spans.iter().filter(|span| span.trace_id == CALLER_TRACE).collect();
    let id = id.to_string();
    let run = trace.iter().find(|span| span.name == "POST /api/v1/programs/run/").expect("the run's span");
    assert_eq!(run.parent, CALLER_SPAN);
    assert_eq!(run.service, gateway_service);
    assert_eq!(run.attributes.get("gantry.job.id"), Some(&id));
    assert_eq!(run.attributes.get("gantry.function").map(String::as_str), Some("fn"));
    assert_eq!(run.attributes.get("http.response.status_code").map(String::as_str), Some("200"));
    let ids: BTreeSet<&str> = trace.iter().map(|span| span.span_id.as_str()).collect();
    for span in &trace {
        if span.span_id != run.span_id {
            assert!(ids.contains(span.parent.as_str()), "{} has a parent outside the trace: {span:#?}", span.name);
        }
    }
    // The launcher's spans come from the launcher, every step of the job names the job.
    for name in ["gantry.launch", "gantry.launch.function", "gantry.launch.archive"] {
        let span = trace.iter().find(|span| span.name == name).unwrap();
        assert_eq!(span.service, "gantry-launcher");
        assert_eq!(span.attributes.get("gantry.job.id"), Some(&id));
    }
    let statuses: BTreeSet<&str> =
        trace.iter().filter_map(|span| span.attributes.get("gantry.job.status").map(String::as_str)).collect();
    assert!(["PENDING", "RUNNING", "SUCCEEDED"].iter().all(|status| statuses.contains(status)), "{statuses:?}");
    // A read makes its own trace, with the job's id.
    let read = spans.iter().find(|span| span.name == "GET /api/v1/jobs/{job_id}/").unwrap_or_else(|| {
        panic!("no read span: {:?}", spans.iter().map(|s| (&s.name, &s.trace_id)).collect::<Vec<_>>())
    });
    assert_ne!(read.trace_id, CALLER_TRACE);
    assert_eq!(read.attributes.get("gantry.job.id"), Some(&id));
    // No secret anywhere.
    for span in spans {
        for (key, value) in &span.attributes {
            for secret in [TOKEN, ARGUMENT, LOG_LINE, WEBHOOK_SECRET] {
                assert!(!value.contains(secret), "{}'s attribute {key} holds {secret}", span.name);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_job_is_one_trace_from_the_run_request_to_the_launchers_last_span() {
    let expected = [
        "POST /api/v1/programs/run/",
        "INSERT jobs",
        "gantry.job.admit",
        "gantry.job.start",
        "gantry.job.move",
        "gantry.launch",
        "gantry.launch.prepare",
        "gantry.launch.fetch",
        "gantry.launch.unpack",
        "gantry.launch.function",
        "gantry.launch.archive",
        "gantry.launch.result",
        "gantry.launch.logs",
        "gantry.event.deliver",
    ];
    one_traced_job("python3", PLAIN_FUNCTION, &expected).await;
}

/// The function's own span (the OpenTelemetry SDK in the job's Python) joins the trace under
/// the launcher's function span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by tests/run.sh: needs GANTRY_TEST_PYTHON (a Python with the OpenTelemetry SDK)"]
async fn the_functions_own_span_joins_the_jobs_trace() {
    let python = std::env::var("GANTRY_TEST_PYTHON").expect("GANTRY_TEST_PYTHON: a Python with the OpenTelemetry SDK");
    let trace = one_traced_job(&python, TRACED_FUNCTION, &["gantry.launch.function", "function.work"]).await;
    let function = trace.iter().find(|span| span.name == "gantry.launch.function").unwrap();
    let work = trace.iter().find(|span| span.name == "function.work").unwrap();
    assert_eq!(work.parent, function.span_id);
}

/// A collector that refuses connections, and one that accepts and never answers: the answers
/// are those of a gateway without tracing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_or_silent_collector_changes_no_answer() {
    let dir = tempfile::tempdir().unwrap();
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_endpoint = format!("http://{}", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((connection, _)) = silent.accept().await {
            open.push(connection);
        }
    });
    let traceparent = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let mut all = Vec::new();
    for (name, endpoint) in
        [("none", None), ("dead", Some(closed.as_str())), ("silent", Some(silent_endpoint.as_str()))]
    {
        let mut variables = vec![("OTEL_BSP_SCHEDULE_DELAY", "50"), ("OTEL_EXPORTER_OTLP_TIMEOUT", "500")];
        if let Some(endpoint) = endpoint {
            variables.push(("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint));
        }
        let data = dir.path().join(name);
        let serve = Serve::start(&data, "python3", &variables, &[]).await;
        let started = Instant::now();
        let (_, answers) = run_job(&serve.base, &data, TOKEN, PLAIN_FUNCTION, json!({"n": 1}), &traceparent).await;
        let took = started.elapsed();
        serve.stop().await;
        all.push((name, answers, took));
    }
    held.abort();
    let (_, without, _) = &all[0];
    assert_eq!(without.final_status, "SUCCEEDED");
    assert_eq!(without.logs, format!("{LOG_LINE}\n"));
    for (name, answers, took) in &all[1..] {
        assert_eq!(answers, without, "the {name} collector changed an answer");
        assert!(*took < Duration::from_secs(30), "the {name} collector slowed the job down: {took:?}");
    }
}

/// The same job through `gantry gateway` + `gantry controller` (processes) on the Kubernetes
/// API server double, the kubelet double running its pod: the FunctionJob's apply, each
/// reconcile and the pod's launcher join the run request's trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_through_gateway_and_controller_is_one_trace() {
    one_traced_cluster_job("python3", PLAIN_FUNCTION).await;
}

/// The function's own span (the OpenTelemetry SDK in the pod's Python) joins the trace under
/// the pod launcher's function span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by tests/run.sh: needs GANTRY_TEST_PYTHON (a Python with the OpenTelemetry SDK)"]
async fn the_functions_own_span_joins_the_trace_in_a_pod() {
    let python = std::env::var("GANTRY_TEST_PYTHON").expect("GANTRY_TEST_PYTHON: a Python with the OpenTelemetry SDK");
    let spans = one_traced_cluster_job(&python, TRACED_FUNCTION).await;
    let function = spans.iter().find(|span| span.name == "gantry.launch.function").unwrap();
    let work = spans.iter().find(|span| span.name == "function.work").expect("the function's own span");
    assert_eq!((work.trace_id.as_str(), work.parent.as_str()), (CALLER_TRACE, function.span_id.as_str()));
}

/// Runs `main` with `python` through gateway + controller processes on the doubles and checks
/// its trace; returns every span received.
async fn one_traced_cluster_job(python: &str, main: &str) -> Vec<Received> {
    use crate::e2e_kubernetes::{free_port, role_settings, spawn_role, tail, wait_until_ready};
    let collector = Collector::start().await;
    let resources = crate::harness::Gateway::start(crate::harness::Backend::PostgresS3).await;
    let folder = tempfile::tempdir().unwrap();
    let api = crate::doubles::kube_double::ApiServer::new();
    api.install_crd(&gantry::crd::crd_yaml()).await;
    let address = api.serve().await;
    let kubeconfig = folder.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig(address)).unwrap();
    let _kubelet = crate::doubles::kubelet_double::Kubelet::start(api.clone(), "default");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let (shared, mut env) = role_settings(&resources, folder.path(), &kubeconfig);
    env.push(("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.clone()));
    env.push(("OTEL_BSP_SCHEDULE_DELAY", "100".into()));
    let key = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [7u8; 32]);
    let mut gateway_args = vec!["gateway".to_string()];
    gateway_args.extend(shared.iter().cloned());
    gateway_args.extend(
        ["--listen", &format!("127.0.0.1:{port}"), "--admin-listen", "127.0.0.1:0", "--token-key", &key]
            .map(str::to_string),
    );
    let gateway_log = folder.path().join("gateway.log");
    let mut gateway = spawn_role(&gateway_args, &env, &gateway_log);
    let mut controller_args = vec!["controller".to_string()];
    controller_args.extend(shared.iter().cloned());
    controller_args.extend(["--admin-listen", "127.0.0.1:0"].map(str::to_string));
    controller_args.extend(crate::e2e_kubernetes::pod_runner_args(&url, python));
    let controller_log = folder.path().join("controller.log");
    let mut controller = spawn_role(&controller_args, &env, &controller_log);
    wait_until_ready(&url, &mut [(&mut gateway, &gateway_log), (&mut controller, &controller_log)]).await;

    let traceparent = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let (id, answers) = run_job(&url, folder.path(), TOKEN, main, json!({"secret": ARGUMENT}), &traceparent).await;
    assert_eq!(
        answers.final_status,
        "SUCCEEDED",
        "{answers:?}\n--- gateway ---\n{}\n--- controller ---\n{}",
        tail(&gateway_log),
        tail(&controller_log)
    );
    let expected =
        ["POST /api/v1/programs/run/", "gantry.functionjob.apply", "gantry.reconcile", "gantry.launch.archive"];
    collector
        .wait_for(30, |spans| {
            let names: BTreeSet<&str> =
                spans.iter().filter(|s| s.trace_id == CALLER_TRACE).map(|s| s.name.as_str()).collect();
            expected.iter().all(|name| names.contains(name))
                && spans.iter().any(|s| s.name == "GET /api/v1/jobs/{job_id}/")
                && spans.iter().any(|s| s.attributes.get("gantry.job.status").is_some_and(|s| s == "SUCCEEDED"))
        })
        .await;
    let _ = gateway.kill().await;
    let _ = controller.kill().await;
    let spans = collector.spans();
    check_trace(&spans, &id, "gantry-gateway");
    let in_trace = |name: &str| spans.iter().filter(|s| s.trace_id == CALLER_TRACE && s.name == name).count();
    assert!(in_trace("gantry.reconcile") >= 2, "a job takes reconciles to run and end");
    let apply = spans.iter().find(|s| s.name == "gantry.functionjob.apply").unwrap();
    assert_eq!(apply.service, "gantry-gateway");
    let reconcile = spans.iter().find(|s| s.name == "gantry.reconcile").unwrap();
    assert_eq!((reconcile.service.as_str(), reconcile.parent.as_str()), ("gantry-controller", apply.span_id.as_str()));
    let launch = spans.iter().find(|s| s.name == "gantry.launch").unwrap();
    assert_eq!(launch.parent, apply.span_id, "the pod's launcher continues the FunctionJob's trace");
    if main == TRACED_FUNCTION {
        collector.wait_for(30, |spans| spans.iter().any(|s| s.name == "function.work")).await;
    }
    collector.spans()
}

both_backends!(a_jobs_trace_is_its_run_requests_or_none);

/// With spans off, a job keeps the trace its caller sent (a valid `traceparent` only) and
/// `trace/` answers it, to those who may read the job; a job run without one has no trace.
async fn a_jobs_trace_is_its_run_requests_or_none(backend: Backend) {
    let gateway = Gateway::start_with(backend, |config| {
        config.trace_link = Some("https://tempo.example/explore?trace={trace_id}".into());
    })
    .await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    let run = |traceparent: Option<&'static str>| {
        let gateway = &gateway;
        async move {
            let mut request = axum::http::Request::post("/api/v1/programs/run/")
                .header("authorization", "Bearer alice")
                .header("content-type", "application/json");
            if let Some(traceparent) = traceparent {
                request = request.header("traceparent", traceparent);
            }
            let body = axum::body::Body::from(json!({"title": "fn", "arguments": "{}"}).to_string());
            let reply = gateway.send(request.body(body).unwrap()).await;
            assert_eq!(reply.status, 200, "{:?}", reply.json);
            reply.json["id"].as_str().unwrap().to_string()
        }
    };
    let traced = run(Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")).await;
    let answer = gateway.get(&format!("/api/v1/jobs/{traced}/trace/"), "alice").await;
    assert_eq!(answer.status, 200);
    let link = "https://tempo.example/explore?trace=4bf92f3577b34da6a3ce929d0e0e4736";
    assert_eq!(answer.json, json!({"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "link": link}));
    // Another user may not read it: the same 404 as for a job that does not exist.
    assert_eq!(gateway.get(&format!("/api/v1/jobs/{traced}/trace/"), "bob").await.status, 404);
    for traceparent in [None, Some("00-4bf92f35-00f0-01"), Some("not a trace")] {
        let untraced = run(traceparent).await;
        let answer = gateway.get(&format!("/api/v1/jobs/{untraced}/trace/"), "alice").await;
        assert_eq!(answer.status, 404, "{traceparent:?}");
        assert_eq!(answer.json["message"], format!("Job {untraced} has no trace."));
    }
}

/// A trace link that is not an address holding `{trace_id}` stops `gantry serve` at start with
/// the reason.
#[test]
fn a_trace_link_without_its_placeholder_is_refused() {
    for link in ["http://jaeger:16686/trace/", "jaeger/{trace_id}"] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_gantry"))
            .args(["serve", "--trace-link", link])
            .output()
            .unwrap();
        assert!(!output.status.success());
        let error = String::from_utf8_lossy(&output.stderr);
        assert!(error.contains("--trace-link") && error.contains("{trace_id}"), "{error}");
    }
}
