//! The real `qiskit-serverless` client's checks (`tests/e2e/client_foundation.py` and
//! `client_jobs.py`, the same as against `gantry serve`) against the
//! real `gantry gateway` and `gantry controller` processes, on a real PostgreSQL and the S3
//! server, with the Kubernetes API server double served on loopback (reached through a
//! kubeconfig, as on a cluster) and the kubelet double running each pod's containers.
//! `tests/run.sh` runs it (`--ignored`): it needs `GANTRY_TEST_PYTHON`, a Python with the client.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine;

use crate::doubles::kube_double::ApiServer;
use crate::doubles::kubelet_double::Kubelet;
use crate::eventually::eventually;
use crate::harness::{Backend, Gateway, S3_KEY, S3_SECRET};

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A `gantry` role as a child process, its output in `log`.
/// The controller's flags for pods that run this build's launcher and `python` through the
/// kubelet double's volumes, calling the gateway back at `url`.
pub(crate) fn pod_runner_args(url: &str, python: &str) -> Vec<String> {
    [
        "--public-url",
        url,
        "--launcher-source",
        env!("CARGO_BIN_EXE_gantry"),
        "--job-python",
        python,
        "--scheduler-tick-ms",
        "100",
        "--launcher-dir",
        "/pod-volume/launcher",
        "--job-work-dir",
        "/pod-volume/work",
        "--job-data-dir",
        "/pod-volume/data",
    ]
    .map(str::to_string)
    .to_vec()
}

/// Starts a role (`gantry <args>`) with `env` and, for profiling a benchmark's roles alone,
/// `GANTRY_BENCH_ROLE_ENV`'s `KEY=value` pairs (space-separated; `{n}` in a value is the
/// number of the role started, from 1; e.g. `LD_PRELOAD=/usr/lib/heaptrack/libheaptrack_preload.so
/// DUMP_HEAPTRACK_OUTPUT=/tmp/role{n}.raw`, then `heaptrack_interpret < /tmp/role1.raw`).
pub fn spawn_role(args: &[String], env: &[(&str, String)], log: &Path) -> tokio::process::Child {
    static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let output = std::fs::File::create(log).unwrap();
    let n = (STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1).to_string();
    let profiling = std::env::var("GANTRY_BENCH_ROLE_ENV").unwrap_or_default().replace("{n}", &n);
    let profiling = profiling.split_whitespace().filter_map(|pair| pair.split_once('='));
    tokio::process::Command::new(env!("CARGO_BIN_EXE_gantry"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .envs(profiling)
        .env("RUST_LOG", "info")
        .stdout(output.try_clone().unwrap())
        .stderr(output)
        .kill_on_drop(true)
        .spawn()
        .expect("gantry starts")
}

pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(80)..].join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by tests/run.sh: needs GANTRY_TEST_PYTHON and the built client"]
async fn the_real_client_runs_jobs_through_gateway_and_controller() {
    let python = std::env::var("GANTRY_TEST_PYTHON").expect("GANTRY_TEST_PYTHON: a Python with qiskit-serverless");
    let resources = Gateway::start(Backend::PostgresS3).await;
    let database_url = resources.database_url().unwrap();
    let folder = tempfile::tempdir().unwrap();

    let api = ApiServer::new();
    api.install_crd(&gantry::crd::crd_yaml()).await;
    let address = api.serve().await;
    // Each role has its own credentials, so its requests can be checked against its RBAC rules.
    let kubeconfig = |role: &str| {
        let path = folder.path().join(format!("kubeconfig-{role}"));
        std::fs::write(&path, api.kubeconfig_with_token(address, Some(role))).unwrap();
        path
    };
    let (gateway_kubeconfig, controller_kubeconfig) = (kubeconfig("gateway"), kubeconfig("controller"));
    let _kubelet = Kubelet::start(api.clone(), "default");

    let admin = |words: &[&str]| {
        let status = std::process::Command::new(env!("CARGO_BIN_EXE_gantry"))
            .args(["admin", "--database-url", &database_url])
            .args(words)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "gantry admin {words:?}");
    };
    admin(&["create-provider", "e2e"]);
    admin(&["add-admin", "--provider", "e2e", "--user", "e2e-erin"]);

    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let key = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
    let (shared, env) = role_settings(&resources, folder.path(), &gateway_kubeconfig);
    let gateway_log = folder.path().join("gateway.log");
    let mut gateway_args = vec!["gateway".to_string()];
    gateway_args.extend(shared.iter().cloned());
    gateway_args.extend(
        [
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--admin-listen",
            "127.0.0.1:0",
            "--token-key",
            &key,
            "--sweep-seconds",
            "2",
        ]
        .map(str::to_string),
    );
    let mut gateway = spawn_role(&gateway_args, &env, &gateway_log);
    // The pod's paths are its volumes' mount paths: the kubelet double gives each pod its own
    // folders for them (paths no file of this machine starts with, as a mount would shadow
    // them). Only the launcher's source and the job's Python are this machine's.
    let controller_log = folder.path().join("controller.log");
    let mut controller_args = vec!["controller".to_string()];
    controller_args.extend(shared.iter().cloned());
    controller_args.extend(["--admin-listen", "127.0.0.1:0"].map(str::to_string));
    controller_args.extend(pod_runner_args(&url, &python));
    let (_, controller_env) = role_settings(&resources, folder.path(), &controller_kubeconfig);
    let mut controller = spawn_role(&controller_args, &controller_env, &controller_log);

    wait_until_ready(&url, &mut [(&mut gateway, &gateway_log), (&mut controller, &controller_log)]).await;
    for script in ["tests/e2e/client_foundation.py", "tests/e2e/client_jobs.py"] {
        run_client_checks(&python, &[script, &url], &[("gateway", &gateway_log), ("controller", &controller_log)])
            .await;
    }
    // Every job was a FunctionJob with its pod, and every pod is gone once its job finished.
    let resources = api.list(crate::doubles::kube_double::Kind::FUNCTION_JOB, "default");
    assert!(resources.len() >= 5, "{resources:?}");
    for resource in &resources {
        assert!(resource["status"]["podName"].is_string(), "{resource}");
    }
    // Each role asked only what its exported rules (`gantry rbac`, the chart's Roles) grant.
    let mut asked = std::collections::BTreeSet::new();
    for (token, method, path) in api.requests_by_token() {
        let rules = match token.as_str() {
            "gateway" => gantry::compute::rbac::GATEWAY,
            "controller" => gantry::compute::rbac::CONTROLLER,
            other => panic!("a request with an unknown token {other}: {method} {path}"),
        };
        if let Some((group, resource, verb)) = crate::doubles::kube_double::rbac_attributes(&method, &path) {
            assert!(
                gantry::compute::rbac::allows(rules, &group, &resource, verb),
                "the {token} asked {verb} on {group}/{resource} ({method} {path}), which its RBAC rules do not grant"
            );
            asked.insert((token, group, resource, verb));
        }
    }
    for (role, resource, verb) in [("gateway", "functionjobs", "patch"), ("controller", "pods", "watch")] {
        assert!(asked.iter().any(|(t, _, r, v)| t == role && r == resource && *v == verb), "{asked:?}");
    }
    let _ = gateway.kill().await;
    let _ = controller.kill().await;
}

/// The database, storage and cluster flags and environment both roles take, for `resources`'
/// database and S3 server and the cluster behind `kubeconfig`.
pub fn role_settings(
    resources: &Gateway,
    folder: &Path,
    kubeconfig: &Path,
) -> (Vec<String>, Vec<(&'static str, String)>) {
    let args = [
        "--data-dir",
        &folder.join("data").display().to_string(),
        "--database-url",
        &resources.database_url().unwrap(),
        "--storage",
        "s3://gantry/test",
        "--s3-endpoint",
        &resources.s3_endpoint().unwrap(),
        "--s3-region",
        "us-east-1",
        "--s3-path-style",
        "--namespace",
        "default",
    ]
    .map(str::to_string)
    .to_vec();
    let env = vec![
        ("KUBECONFIG", kubeconfig.display().to_string()),
        ("AWS_ACCESS_KEY_ID", S3_KEY.to_string()),
        ("AWS_SECRET_ACCESS_KEY", S3_SECRET.to_string()),
    ];
    (args, env)
}

/// Waits until the API at `url` is ready, failing with the logs when any of `roles` (a child and
/// its log) exits or a minute passes.
pub async fn wait_until_ready(url: &str, roles: &mut [(&mut tokio::process::Child, &Path)]) {
    let ready = reqwest_free_get(url);
    eventually(&format!("{url} ready"), Duration::from_secs(60), || {
        for (child, log) in roles.iter_mut() {
            assert!(child.try_wait().unwrap().is_none(), "a gantry role exited:\n{}", tail(log));
        }
        // What the failure shows: the first role's log.
        let log = roles.first().map(|(_, log)| log.to_path_buf());
        let ready = ready();
        async move {
            if ready.await {
                return Ok(());
            }
            Err(format!("\n{}", log.map(|log| tail(&log)).unwrap_or_default()))
        }
    })
    .await;
}

/// Runs a client check script (`python args...`), printing its lines; on failure, panics with
/// its output and the tail of each role's log.
pub async fn run_client_checks(python: &str, args: &[&str], logs: &[(&str, &Path)]) {
    let checks = tokio::process::Command::new(python).args(args).output().await.expect("the client checks start");
    println!("{}:\n{}", args[0], String::from_utf8_lossy(&checks.stdout));
    let tails: String = logs.iter().map(|(role, log)| format!("\n--- {role} ---\n{}", tail(log))).collect();
    assert!(
        checks.status.success(),
        "{}:\n{}{}{tails}",
        args[0],
        String::from_utf8_lossy(&checks.stdout),
        String::from_utf8_lossy(&checks.stderr)
    );
}

/// A readiness probe of the gateway at `url`, without an HTTP client crate.
fn reqwest_free_get(url: &str) -> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>> {
    let address = url.trim_start_matches("http://").to_string();
    move || {
        let address = address.clone();
        Box::pin(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let Ok(mut stream) = tokio::net::TcpStream::connect(&address).await else { return false };
            let request = format!("GET /readiness/ HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
            if stream.write_all(request.as_bytes()).await.is_err() {
                return false;
            }
            let mut answer = String::new();
            let _ = stream.read_to_string(&mut answer).await;
            answer.starts_with("HTTP/1.1 200")
        })
    }
}
