//! The soak (run by `bench/soak.sh`; `tests/run.sh` runs 2,000 jobs): `SOAK_JOBS` jobs (default
//! 100,000) through `gantry gateway` and `gantry controller` (their own processes) on a real
//! PostgreSQL and the in-process S3, with the Kubernetes API server double served on loopback and
//! the kubelet double's fast path playing the pods (a small sample run as real processes). One
//! job in a hundred meets a fault of every kind of the pod-endings table, the API double answers
//! some requests with 409 and 500, ends every watch and compacts its history now and then, and the
//! controller is killed and started again twice. At the end it prints the jobs by final status
//! against what each fault should give, the objects left in the cluster, the logs lost, the status
//! moves recorded twice, the controller's memory and CPU per 1,000 jobs through the run, and
//! pods/s; it fails when any of the checks does not hold.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use futures::StreamExt;
use gantry::crd::pod_name;
use serde_json::{Value, json};

use super::cpu_seconds;
use crate::controller::NAMESPACE;
use crate::doubles::kube_double::{ApiServer, Kind};
use crate::doubles::kubelet_double::fast::{FastKubelet, Run};
use crate::harness::{Backend, Gateway, tar_of};

/// What the soak does to a job once its pod reached its point.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Act {
    Nothing,
    /// `POST jobs/{id}/stop/`.
    Stop,
    /// A graceful delete of its pod (`kubectl delete pod`, or the cluster's own).
    DeletePod,
    /// `kubectl delete fj`.
    DeleteResource,
}

/// What a job of a kind should end as.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    Status(&'static str),
    /// An infrastructure failure before the function's code ran: SUCCEEDED on a new pod where
    /// the controller retries such failures (`--infrastructure-retries`), FAILED where it cannot.
    Retried,
}

struct Sort {
    /// The function's title (the fast kubelet plays its pods by it).
    function: &'static str,
    run: Run,
    act: Act,
    expect: Expect,
}

const OK: Sort = Sort { function: "ok", run: Run::Succeed, act: Act::Nothing, expect: Expect::Status("SUCCEEDED") };
const REAL: Sort = Sort { function: "real", run: Run::Process, act: Act::Nothing, expect: Expect::Status("SUCCEEDED") };

/// The pod-endings table's faults (tests/gateway/pod_endings.rs), each with its outcome.
const FAULTS: &[Sort] = &[
    Sort { function: "pull", run: Run::PullFails, act: Act::Nothing, expect: Expect::Status("FAILED") },
    Sort { function: "init", run: Run::InitFails, act: Act::Nothing, expect: Expect::Status("FAILED") },
    Sort { function: "oom", run: Run::OutOfMemory, act: Act::Nothing, expect: Expect::Status("FAILED") },
    Sort { function: "exit", run: Run::Exit(3), act: Act::Nothing, expect: Expect::Status("FAILED") },
    Sort { function: "timeout", run: Run::DeadlineExceeded, act: Act::Nothing, expect: Expect::Status("STOPPED") },
    Sort { function: "stop_running", run: Run::UntilDeleted, act: Act::Stop, expect: Expect::Status("STOPPED") },
    Sort { function: "stop_pending", run: Run::PendingUntilDeleted, act: Act::Stop, expect: Expect::Status("STOPPED") },
    Sort {
        function: "pod_deleted_running",
        run: Run::UntilDeleted,
        act: Act::DeletePod,
        expect: Expect::Status("FAILED"),
    },
    Sort {
        function: "resource_deleted",
        run: Run::UntilDeleted,
        act: Act::DeleteResource,
        expect: Expect::Status("STOPPED"),
    },
    Sort { function: "unschedulable", run: Run::NeverSchedule, act: Act::Nothing, expect: Expect::Status("FAILED") },
    Sort { function: "secret_missing", run: Run::SecretMissing, act: Act::Nothing, expect: Expect::Status("FAILED") },
    Sort {
        function: "evicted_running",
        run: Run::EvictedWhileRunning,
        act: Act::Nothing,
        expect: Expect::Status("FAILED"),
    },
    Sort {
        function: "node_lost_running",
        run: Run::LostWhileRunning,
        act: Act::Nothing,
        expect: Expect::Status("FAILED"),
    },
    Sort { function: "evicted_early", run: Run::EvictedBeforeStart, act: Act::Nothing, expect: Expect::Retried },
    Sort { function: "preempted_early", run: Run::PreemptedBeforeStart, act: Act::Nothing, expect: Expect::Retried },
    Sort { function: "node_lost_early", run: Run::LostBeforeStart, act: Act::Nothing, expect: Expect::Retried },
    Sort { function: "pod_deleted_early", run: Run::PendingUntilDeleted, act: Act::DeletePod, expect: Expect::Retried },
];

/// API errors injected in turn, one a second: (method, path part, status).
const API_FAULTS: &[(&str, &str, u16)] = &[
    ("POST", "/pods", 500),
    ("PATCH", "/status", 409),
    ("POST", "/functionjobs", 500),
    ("DELETE", "/secrets/", 500),
    ("GET", "/log", 500),
    ("PATCH", "/status", 500),
    ("DELETE", "/pods/", 500),
    ("POST", "/events", 500),
];

/// The users running the jobs, each with the soak's functions.
const USERS: usize = 8;

/// Runs asked at once (clients of the gateway).
const RUNS_AT_ONCE: usize = 16;

/// FunctionJobs of finished jobs are kept this long (`--keep-finished-jobs-seconds`).
const KEEP_SECONDS: u64 = 10;

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.replace('_', "").parse().ok()).unwrap_or(default)
}

/// Which sort job number `i` of `total` is: one in a hundred a fault (each kind in turn), a
/// sample of `real` spread through the run as real processes, the rest plain.
fn sort_of(i: usize, total: usize, real: usize) -> usize {
    if i % 100 == 50 {
        return 2 + (i / 100) % FAULTS.len();
    }
    if real > 0 && i % (total / real).max(1) == 7 {
        return 1;
    }
    0
}

fn sort(index: usize) -> &'static Sort {
    match index {
        0 => &OK,
        1 => &REAL,
        n => &FAULTS[n - 2],
    }
}

type Http = hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Body>;

/// The user of job number `i` (mock tokens name their user): runs of one user serialize on
/// their author's row, as they should; the soak's are spread over `USERS` users.
fn user(i: usize) -> String {
    format!("soak{}", i % USERS)
}

/// `POST url` as `user`, with `key` as its `Idempotency-Key`.
async fn post(http: &Http, url: &str, user: &str, body: Value, key: &str) -> Result<(u16, Value), String> {
    let request = axum::http::Request::post(url)
        .header("authorization", format!("Bearer {user}"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Body::from(body.to_string()))
        .expect("a valid request");
    let response = http.request(request).await.map_err(|e| format!("{e:?}"))?;
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(Body::new(response.into_body()), 1 << 20).await.map_err(|e| e.to_string())?;
    Ok((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
}

/// The same request until it is answered (a connection refused or reset is tried again; the
/// idempotency key makes a repeated run the same job).
async fn post_until_answered(http: &Http, url: &str, user: &str, body: Value) -> (u16, Value) {
    let key = uuid::Uuid::new_v4().to_string();
    let mut last = String::new();
    for _ in 0..20 {
        match post(http, url, user, body.clone(), &key).await {
            Ok(answer) => return answer,
            Err(error) => last = error,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{url} never answered: {last}");
}

/// Resident memory of a process, in MiB.
fn rss_mib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|line| line.starts_with("VmRSS"))
        .and_then(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0)
        / 1024
}

/// The controller's reconcile samples from its admin port's `/metrics`, on one line.
fn controller_metrics(port: u16) -> String {
    use std::io::{Read, Write};
    let read = || -> std::io::Result<String> {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n")?;
        let mut page = String::new();
        stream.read_to_string(&mut page)?;
        Ok(page)
    };
    match read() {
        Ok(page) => page
            .lines()
            .filter(|line| {
                (line.starts_with("gantry_controller_reconcil") || line.starts_with("gantry_controller_watch_errors"))
                    && !line.contains("_bucket")
            })
            .collect::<Vec<_>>()
            .join("; "),
        Err(error) => format!("the admin port did not answer: {error}"),
    }
}

/// Open file descriptors of a process (`self` for this one): connections and files it holds.
fn open_fds(pid: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |entries| entries.count())
}

/// A `gantry` role as a child process, appending to `log` (warnings and errors only: a soak's
/// info lines would fill a disk).
fn spawn(args: &[String], env: &[(&str, String)], log: &Path) -> tokio::process::Child {
    let output = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
    tokio::process::Command::new(env!("CARGO_BIN_EXE_gantry"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("RUST_LOG", "warn")
        .stdout(output.try_clone().unwrap())
        .stderr(output)
        .kill_on_drop(true)
        .spawn()
        .expect("gantry starts")
}

/// The controller, killed and started again during the run; its CPU time adds up across lives.
struct Controller {
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
    log: std::path::PathBuf,
    child: tokio::process::Child,
    pid: u32,
    /// CPU seconds of the controllers before this one.
    cpu_before: f64,
    lives: usize,
}

impl Controller {
    fn start(args: Vec<String>, env: Vec<(&'static str, String)>, log: std::path::PathBuf) -> Controller {
        let child = spawn(&args, &env, &log);
        let pid = child.id().expect("the controller runs");
        Controller { args, env, log, child, pid, cpu_before: 0.0, lives: 1 }
    }

    fn cpu(&self) -> f64 {
        self.cpu_before + cpu_seconds(&self.pid.to_string())
    }

    /// Ends it (SIGKILL, as a crash or an OOM kill; or SIGTERM, as a rolling update) and starts
    /// a new one.
    async fn restart(&mut self, kill: bool) {
        self.cpu_before = self.cpu();
        unsafe { libc::kill(self.pid as i32, if kill { libc::SIGKILL } else { libc::SIGTERM }) };
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await.is_err() {
            let _ = self.child.kill().await;
        }
        self.child = spawn(&self.args, &self.env, &self.log);
        self.pid = self.child.id().expect("the controller runs");
        self.lives += 1;
    }
}

/// A point of the run: jobs finished by then and what the processes had used.
struct Mark {
    done: usize,
    seconds: f64,
    pods: usize,
    controller_cpu: f64,
    controller_rss: u64,
    gateway_cpu: f64,
    gateway_rss: u64,
    /// This process: the API server double, the kubelet double, the S3 server, the soak.
    doubles_cpu: f64,
    /// Open file descriptors of the controller, the gateway and this process.
    fds: (usize, usize, usize),
    lives: usize,
}

/// Benchmark and check, not a unit test: see the module's documentation and `bench/soak.sh`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak: run bench/soak.sh (SOAK_JOBS=2000 in tests/run.sh)"]
async fn soak_jobs_through_gateway_and_controller_leave_nothing_behind() {
    let total = env_number("SOAK_JOBS", 100_000);
    let window = env_number("SOAK_WINDOW", 400);
    let named = std::env::var("GANTRY_TEST_PYTHON").ok();
    let python = named.clone().unwrap_or_else(|| "python3".into());
    let python_runs = std::process::Command::new(&python).arg("-c").arg("pass").status().is_ok_and(|s| s.success());
    // Without a Python every pod takes the fast path; a Python named, or CI, must run.
    assert!(
        python_runs || (named.is_none() && std::env::var("CI").as_deref() != Ok("true")),
        "{python} does not run: the soak's real pods need the Python of GANTRY_TEST_PYTHON"
    );
    let real = if python_runs { env_number("SOAK_REAL_PODS", (total / 1000).clamp(5, 100)) } else { 0 };
    let help =
        std::process::Command::new(env!("CARGO_BIN_EXE_gantry")).args(["controller", "--help"]).output().unwrap();
    let retries = String::from_utf8_lossy(&help.stdout).contains("--infrastructure-retries");
    // Without retries in the controller, a pod gone before it started ends its job FAILED, or
    // SUCCEEDED when the controller made the missing pod again before it saw the first one go
    // (a pending job without a pod looks like one whose pod was not made yet).
    let expected = |sort: &'static Sort| -> &'static [&'static str] {
        match &sort.expect {
            Expect::Status(status) => std::slice::from_ref(status),
            Expect::Retried if retries => &["SUCCEEDED"],
            Expect::Retried => &["FAILED", "SUCCEEDED"],
        }
    };

    // The database, storage and cluster; the functions uploaded before the gateway starts.
    let resources = Gateway::start(Backend::PostgresS3).await;
    let gantry::db::Db::Postgres(pool) = resources.state.db.clone() else { panic!("the soak runs on PostgreSQL") };
    let api = ApiServer::new();
    api.install_crd(&gantry::crd::crd_yaml()).await;
    api.stop_recording_requests();
    let (kubelet, mut reached) = FastKubelet::start(api.clone(), NAMESPACE);
    for index in 0..FAULTS.len() + 2 {
        let sort = sort(index);
        kubelet.set(sort.function, sort.run);
        let main = format!("print('[PUBLIC] {} ran', flush=True)\n", sort.function);
        let artifact = tar_of(&[("main.py", main.as_bytes())]);
        for i in 0..USERS {
            let reply = resources
                .post_multipart(
                    "/api/v1/programs/upload/",
                    &user(i),
                    &[("title", sort.function), ("entrypoint", "main.py")],
                    &[("artifact", "a.tar", &artifact)],
                )
                .await;
            assert_eq!(reply.status, 200, "{}", reply.json);
        }
    }

    // `gantry gateway` and `gantry controller`, as in tests/gateway/e2e_kubernetes.rs.
    let folder = tempfile::tempdir().unwrap();
    let address = api.serve().await;
    let kubeconfig = folder.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig(address)).unwrap();
    let (shared, mut env) = crate::e2e_kubernetes::role_settings(&resources, folder.path(), &kubeconfig);
    for limit in ["LIMITS_ACTIVE_JOBS_PER_USER", "LIMITS_JOBS_PER_USER", "LIMITS_MAX_CLUSTERS"] {
        env.push((limit, "1000000000".into()));
    }
    let port = crate::e2e_kubernetes::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let key = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [7u8; 32]);
    // Usage events go to a webhook that is down for a while in the middle of the run; both
    // processes move jobs, so both publish.
    let billing = crate::usage_events::Receiver::start().await;
    billing.down.store(false, Ordering::SeqCst);
    let billing_args = ["--events-webhook-url", &billing.url, "--events-usage-progress", "2s"].map(str::to_string);
    env.push(("GANTRY_EVENTS_WEBHOOK_SECRET", "soak-key".into()));
    let mut gateway_args = vec!["gateway".to_string()];
    gateway_args.extend(shared.iter().cloned());
    gateway_args.extend(billing_args.iter().cloned());
    gateway_args.extend(
        ["--listen", &format!("127.0.0.1:{port}"), "--admin-listen", "127.0.0.1:0", "--token-key", &key]
            .map(str::to_string),
    );
    gateway_args.extend(["--sweep-seconds", "2"].map(str::to_string));
    let gateway_log = folder.path().join("gateway.log");
    let mut gateway = spawn(&gateway_args, &env, &gateway_log);
    let gateway_pid = gateway.id().unwrap();
    let mut controller_args = vec!["controller".to_string()];
    controller_args.extend(shared.iter().cloned());
    controller_args.extend(billing_args.iter().cloned());
    let keep = KEEP_SECONDS.to_string();
    let admin_port = crate::e2e_kubernetes::free_port();
    let admin = format!("127.0.0.1:{admin_port}");
    controller_args.extend(
        [
            "--admin-listen",
            &admin,
            "--leader-election",
            "false",
            "--pending-deadline-seconds",
            "3",
            "--keep-finished-jobs-seconds",
            &keep,
        ]
        .map(str::to_string),
    );
    controller_args.extend(crate::e2e_kubernetes::pod_runner_args(&url, &python));
    let controller_log = folder.path().join("controller.log");
    let mut controller = Controller::start(controller_args, env.clone(), controller_log.clone());
    crate::e2e_kubernetes::wait_until_ready(
        &url,
        &mut [(&mut gateway, &gateway_log), (&mut controller.child, &controller_log)],
    )
    .await;

    println!(
        "SOAK jobs={total} window={window} faults=1% of jobs ({} kinds) real_process_pods={real}{} infrastructure_retries={}",
        FAULTS.len(),
        if python_runs { String::new() } else { format!(" ({python} cannot run here)") },
        if retries {
            "on (the controller takes --infrastructure-retries)"
        } else {
            "off (this build has no --infrastructure-retries)"
        },
    );
    let started = Instant::now();
    let http: Http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let done = Arc::new(AtomicUsize::new(0));
    let submitted = Arc::new(AtomicUsize::new(0));

    // What the soak does to the jobs whose pods reached their point (a request the API's
    // injected errors refuse is asked again, as kubectl's user would).
    let act_failures: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let acting = {
        let (client, http, url, failures) = (api.client(), http.clone(), url.clone(), act_failures.clone());
        tokio::spawn(async move {
            let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client.clone(), NAMESPACE);
            let jobs: kube::Api<gantry::crd::FunctionJob> = kube::Api::namespaced(client, NAMESPACE);
            let acts: HashMap<&str, Act> = FAULTS.iter().map(|s| (s.function, s.act)).collect();
            while let Some((function, job, user)) = reached.recv().await {
                let act = acts.get(function.as_str()).copied().unwrap_or(Act::Nothing);
                let mut outcome = Ok(());
                for _ in 0..20 {
                    outcome = match act {
                        Act::Nothing => Ok(()),
                        Act::Stop => {
                            let stop = format!("{url}/api/v1/jobs/{job}/stop/");
                            match post_until_answered(&http, &stop, &user, json!({})).await {
                                (200, _) => Ok(()),
                                (status, answer) => Err(format!("stop answered {status}: {answer}")),
                            }
                        }
                        Act::DeletePod => {
                            pods.delete(&pod_name(&job), &Default::default()).await.map(drop).map_err(|e| e.to_string())
                        }
                        Act::DeleteResource => {
                            jobs.delete(&job, &Default::default()).await.map(drop).map_err(|e| e.to_string())
                        }
                    };
                    if outcome.is_ok() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                if let Err(error) = outcome {
                    failures.lock().unwrap().push(format!("{function} {job}: {error}"));
                }
            }
        })
    };

    // The API's faults: an error answered every second, every watch ended every 10 s, the
    // history compacted every 30 s, Events older than a minute expired (a cluster's event TTL).
    let chaos = {
        let api = api.clone();
        tokio::spawn(async move {
            for tick in 0usize.. {
                tokio::time::sleep(Duration::from_secs(1)).await;
                // At most one of a kind waits for its request: a fault no request took yet
                // (none of its kind came, a controller restarting) is not piled up to hit one
                // resource's every retry later, as a real API server's errors never are.
                let (method, path, status) = API_FAULTS[tick % API_FAULTS.len()];
                if !api.fault_armed(method, path) {
                    api.fail_next(method, path, status, 1);
                }
                if tick % 10 == 9 {
                    api.drop_watches();
                }
                if tick % 30 == 29 {
                    api.expire_history();
                }
                if tick % 5 == 4 {
                    api.expire_events(Duration::from_secs(60));
                }
            }
        })
    };

    // The runs: at most `window` jobs unfinished at once.
    let jobs: Arc<std::sync::Mutex<Vec<(String, usize)>>> = Arc::default();
    let refused: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let latencies: Arc<std::sync::Mutex<Vec<Duration>>> = Arc::default();
    let feeding = {
        let (http, url, done, submitted, jobs, refused, latencies) = (
            http.clone(),
            url.clone(),
            done.clone(),
            submitted.clone(),
            jobs.clone(),
            refused.clone(),
            latencies.clone(),
        );
        tokio::spawn(async move {
            futures::stream::iter(0..total)
                .map(|i| {
                    let (http, url, done, submitted, jobs, refused, latencies) = (
                        http.clone(),
                        url.clone(),
                        done.clone(),
                        submitted.clone(),
                        jobs.clone(),
                        refused.clone(),
                        latencies.clone(),
                    );
                    async move {
                        while submitted.load(Ordering::SeqCst) >= done.load(Ordering::SeqCst) + window {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        submitted.fetch_add(1, Ordering::SeqCst);
                        let index = sort_of(i, total, real);
                        let body = json!({"title": sort(index).function, "arguments": "{}"});
                        let asked = Instant::now();
                        let run = format!("{url}/api/v1/programs/run/");
                        let (status, answer) = post_until_answered(&http, &run, &user(i), body).await;
                        latencies.lock().unwrap().push(asked.elapsed());
                        match answer["id"].as_str() {
                            Some(id) if status == 200 => jobs.lock().unwrap().push((id.to_string(), index)),
                            _ => refused.lock().unwrap().push(format!("{status} {answer}")),
                        }
                    }
                })
                .buffer_unordered(RUNS_AT_ONCE)
                .collect::<Vec<()>>()
                .await;
        })
    };

    // Progress: finished jobs counted in the database; a mark at each tenth of the run; the two
    // controller restarts at a third and two thirds.
    let terminal = "status IN ('SUCCEEDED', 'FAILED', 'STOPPED')";
    let count_done = || {
        let pool = pool.clone();
        async move {
            let (n,): (i64,) = sqlx::query_as(&format!("SELECT COUNT(*) FROM jobs WHERE {terminal}"))
                .fetch_one(&pool)
                .await
                .expect("counting finished jobs");
            n as usize
        }
    };
    let mark = |done: usize, controller: &Controller| Mark {
        done,
        seconds: started.elapsed().as_secs_f64(),
        pods: kubelet.pods_seen(),
        controller_cpu: controller.cpu(),
        controller_rss: rss_mib(controller.pid),
        gateway_cpu: cpu_seconds(&gateway_pid.to_string()),
        gateway_rss: rss_mib(gateway_pid),
        doubles_cpu: cpu_seconds("self"),
        fds: (open_fds(&controller.pid.to_string()), open_fds(&gateway_pid.to_string()), open_fds("self")),
        lives: controller.lives,
    };
    let mut marks = vec![mark(0, &controller)];
    let mut restarts = 0;
    let mut last_progress = (0, Instant::now());
    let mut last_print = Instant::now();
    let mut fed = false;
    let stuck = loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now_done = count_done().await;
        done.store(now_done, Ordering::SeqCst);
        if now_done >= marks.last().unwrap().done + total / 10 {
            marks.push(mark(now_done, &controller));
        }
        // The billing receiver is out from a quarter of the jobs to two fifths of them.
        billing.down.store((total / 4..total * 2 / 5).contains(&now_done), Ordering::SeqCst);
        if restarts < 2 && now_done >= total * (restarts + 1) / 3 {
            controller.restart(restarts == 0).await;
            restarts += 1;
            eprintln!(
                "SOAK controller {} at {now_done} jobs done",
                if restarts == 1 {
                    "killed (SIGKILL) and started again"
                } else {
                    "stopped (SIGTERM) and started again"
                }
            );
        }
        if last_print.elapsed() > Duration::from_secs(10) {
            eprintln!("SOAK {now_done}/{total} done after {:.0} s", started.elapsed().as_secs_f64());
            last_print = Instant::now();
        }
        if !fed && feeding.is_finished() {
            fed = true;
        }
        if fed && now_done >= jobs.lock().unwrap().len() {
            break false;
        }
        if now_done != last_progress.0 {
            last_progress = (now_done, Instant::now());
        } else if last_progress.1.elapsed() > Duration::from_secs(180) {
            break true;
        }
    };
    // The controller's own view of its reconciles (a stall: all slots held, none finishing).
    let reconciles = controller_metrics(admin_port);
    println!("SOAK controller reconciles at the end of the run: {reconciles}");
    if stuck {
        // Where each of the stalled controller's threads is (a thread blocked in a lock or a
        // write shows there; one parked in the runtime means no task was woken).
        let pid = controller.pid.to_string();
        match std::process::Command::new("gdb").args(["-p", &pid, "-batch", "-ex", "thread apply all bt 30"]).output() {
            Ok(out) => {
                for line in String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter(|l| l.starts_with('#') || l.starts_with("Thread"))
                {
                    println!("SOAK stack {line}");
                }
            }
            Err(error) => println!("SOAK stack: gdb could not be run ({error})"),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let final_done = done.load(Ordering::SeqCst);
    // The jobs after the last tenth, unless so few that their figures would be noise.
    if final_done >= marks.last().unwrap().done + (total / 20).max(1) {
        marks.push(mark(final_done, &controller));
    }
    let pods_created = kubelet.pods_seen();

    // What the cluster holds once the last job finished, then after the keep window.
    let objects = || {
        let resources = api.list(Kind::FUNCTION_JOB, NAMESPACE);
        let cutoff = chrono::Utc::now() - chrono::Duration::seconds(KEEP_SECONDS as i64 + 5);
        let kept = resources
            .iter()
            .filter(|r| {
                r["status"]["completionTime"]
                    .as_str()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                    .is_some_and(|at| at > cutoff)
            })
            .count();
        (api.list(Kind::POD, NAMESPACE).len(), api.list(Kind::SECRET, NAMESPACE).len(), resources.len(), kept)
    };
    // The API errors stop with the last job: what follows measures the cleanup.
    chaos.abort();
    let at_end = objects();
    let deadline = Instant::now() + Duration::from_secs(KEEP_SECONDS + 60);
    let mut after = objects();
    while (after.0, after.1, after.2) != (0, 0, 0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        after = objects();
    }
    acting.abort();
    let controller_rss_end = rss_mib(controller.pid);

    // Final statuses against the expectations.
    let jobs = jobs.lock().unwrap().clone();
    let rows: Vec<(String, String, String)> =
        sqlx::query_as("SELECT id, status, COALESCE(status_reason, '') FROM jobs").fetch_all(&pool).await.unwrap();
    let statuses: HashMap<String, (String, String)> =
        rows.into_iter().map(|(id, status, reason)| (id, (status, reason))).collect();
    let mut table: BTreeMap<(usize, String), usize> = BTreeMap::new();
    // Jobs of a kind expected to be retried that ended FAILED because their pod went while no
    // controller watched (a restart) or while the pod watch was away (a relist found them gone,
    // last seen pending): whether their code started is not known, so they are not
    // run again unasked, and their reason says so.
    let mut unseen: BTreeMap<usize, usize> = BTreeMap::new();
    let mut mismatched = Vec::new();
    for (id, index) in &jobs {
        let (status, reason) = statuses.get(id).cloned().unwrap_or_else(|| ("MISSING".into(), String::new()));
        let excused = sort(*index).expect == Expect::Retried
            && status == "FAILED"
            && reason.ends_with("whether its code had started is not known");
        if excused {
            *unseen.entry(*index).or_default() += 1;
        } else if !expected(sort(*index)).contains(&status.as_str()) {
            mismatched.push(format!("{id} ({}): {status} {reason}", sort(*index).function));
        }
        *table.entry((*index, status)).or_default() += 1;
    }
    let untracked = statuses.len() - jobs.len().min(statuses.len());
    println!("SOAK jobs by final status (expected per kind):");
    println!(
        "SOAK   {:<20} {:>9} {:>10} {:>8} {:>8} {:>8}  expected",
        "kind", "jobs", "SUCCEEDED", "FAILED", "STOPPED", "other"
    );
    for index in 0..FAULTS.len() + 2 {
        let sort = sort(index);
        let count = |status: &str| table.get(&(index, status.to_string())).copied().unwrap_or(0);
        let all: usize = table.iter().filter(|((i, _), _)| *i == index).map(|(_, n)| n).sum();
        let other = all - count("SUCCEEDED") - count("FAILED") - count("STOPPED");
        let expectation = expected(sort).join(" or ");
        let excused = unseen.get(&index).copied().unwrap_or(0);
        let wrong = all - excused - expected(sort).iter().map(|status| count(status)).sum::<usize>();
        let note = match sort.expect {
            Expect::Retried if excused > 0 => {
                format!(" (retried; {excused} FAILED: the pod went while no controller watched)")
            }
            Expect::Retried if retries => " (infrastructure failure before the code ran: retried)".into(),
            Expect::Retried => " (no infrastructure retries in this build)".into(),
            _ => String::new(),
        };
        println!(
            "SOAK   {:<20} {all:>9} {:>10} {:>8} {:>8} {other:>8}  {expectation}{note}{}",
            sort.function,
            count("SUCCEEDED"),
            count("FAILED"),
            count("STOPPED"),
            if wrong > 0 { format!("  MISMATCH: {wrong}") } else { String::new() }
        );
    }
    let act_failures = act_failures.lock().unwrap().clone();
    println!(
        "SOAK mismatches={} runs_refused={} acts_failed={} jobs_not_run_by_the_soak={untracked} stuck={stuck}",
        mismatched.len(),
        refused.lock().unwrap().len(),
        act_failures.len()
    );
    for line in mismatched.iter().take(20) {
        println!("SOAK   mismatch {line}");
    }

    // The usage ledger: every finished job has one record (the key makes it at most one), its
    // run time the RUNNING→end interval of its own status events, within a second.
    // (job, its recorded run time, its RUNNING and its terminal events' times)
    type Metered = (String, Option<i64>, Option<i64>, Option<i64>);
    let usage: Vec<Metered> = sqlx::query_as(
        "SELECT j.id, u.run_ms, \
           (SELECT MIN(e.created) FROM job_events e WHERE e.job_id = j.id AND e.event_type = 'STATUS_CHANGE' \
              AND e.data LIKE '%\"status\":\"RUNNING\"%'), \
           (SELECT MAX(e.created) FROM job_events e WHERE e.job_id = j.id AND e.event_type = 'STATUS_CHANGE' \
              AND (e.data LIKE '%\"status\":\"SUCCEEDED\"%' OR e.data LIKE '%\"status\":\"FAILED\"%' \
                   OR e.data LIKE '%\"status\":\"STOPPED\"%')) \
         FROM jobs j LEFT JOIN job_usage u ON u.job_id = j.id WHERE j.status IN ('SUCCEEDED', 'FAILED', 'STOPPED')",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let unrecorded: Vec<&String> =
        usage.iter().filter(|(_, run_ms, _, _)| run_ms.is_none()).map(|(id, ..)| id).collect();
    let off: Vec<String> = usage
        .iter()
        .filter_map(|(id, run_ms, running, ended)| {
            let expected = match (running, ended) {
                (Some(running), Some(ended)) => (ended - running) / 1000,
                _ => 0,
            };
            let run_ms = (*run_ms)?;
            ((run_ms - expected).abs() > 1000)
                .then(|| format!("{id}: {run_ms} ms recorded, {expected} ms between its events"))
        })
        .collect();
    println!(
        "SOAK usage: finished={} recorded={} unrecorded={} run_time_off_by_more_than_1s={}",
        usage.len(),
        usage.len() - unrecorded.len(),
        unrecorded.len(),
        off.len()
    );

    // Usage events: every record left as exactly one completed event (by event id), with its
    // run time, none for a job without a record; the outage delayed them and lost none.
    billing.down.store(false, Ordering::SeqCst);
    let outbox_db = resources.state.db.clone();
    let drained = tokio::time::timeout(Duration::from_secs(240), async {
        while gantry::db::outbox::counts(&outbox_db).await.unwrap().0 > 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await
    .is_ok();
    let (waiting, _, undeliverable) = gantry::db::outbox::counts(&outbox_db).await.unwrap();
    let records: HashMap<String, i64> = sqlx::query_as::<_, (String, i64)>("SELECT job_id, run_ms FROM job_usage")
        .fetch_all(&pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let refused_in_outage = billing.requests.lock().unwrap().iter().filter(|(accepted, _)| !accepted).count();
    let by_job = billing.accepted_usage();
    let mut sent: HashMap<&str, usize> = HashMap::new();
    let (mut events_lost, mut completed_twice, mut stray, mut value_off) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (job, events) in &by_job {
        for event in events {
            *sent.entry(crate::usage_events::kind(event)).or_default() += 1;
        }
        let completed: BTreeMap<&str, &Value> = events
            .iter()
            .filter(|event| crate::usage_events::kind(event) == "completed")
            .map(|event| (event["id"].as_str().unwrap(), event))
            .collect();
        match records.get(job) {
            None if !completed.is_empty() => stray.push(job.clone()),
            Some(run_ms) => {
                if completed.len() > 1 {
                    completed_twice.push(job.clone());
                }
                if completed.values().any(|event| event["data"]["metric_value"] != *run_ms) {
                    value_off.push(job.clone());
                }
            }
            None => {}
        }
    }
    for job in records.keys() {
        if !by_job.get(job).is_some_and(|events| events.iter().any(|e| crate::usage_events::kind(e) == "completed")) {
            events_lost.push(job.clone());
        }
    }
    println!(
        "SOAK usage events: records={} completed_sent={} lost={} twice={} stray={} metric_value_off={} started={} licence={} in_progress={} refused_during_outage={refused_in_outage} waiting={waiting} undeliverable={undeliverable}",
        records.len(),
        by_job
            .values()
            .flatten()
            .filter(|e| crate::usage_events::kind(e) == "completed")
            .map(|e| e["id"].as_str().unwrap())
            .collect::<std::collections::HashSet<_>>()
            .len(),
        events_lost.len(),
        completed_twice.len(),
        stray.len(),
        value_off.len(),
        sent.get("started").copied().unwrap_or(0),
        sent.get("licence").copied().unwrap_or(0),
        sent.get("in_progress").copied().unwrap_or(0),
    );

    // Objects left.
    println!(
        "SOAK objects when the last job finished: pods={} secrets={} functionjobs={} (of which {} finished within the {KEEP_SECONDS} s keep window)",
        at_end.0, at_end.1, at_end.2, at_end.3
    );
    println!("SOAK objects left after the keep window: pods={} secrets={} functionjobs={}", after.0, after.1, after.2);
    let jobs_by_id: HashMap<&str, usize> = jobs.iter().map(|(id, index)| (id.as_str(), *index)).collect();
    for kind in [Kind::POD, Kind::SECRET, Kind::FUNCTION_JOB] {
        for object in api.list(kind, NAMESPACE) {
            let job = &object["metadata"]["labels"][gantry::crd::LABEL_JOB_ID];
            let kind_of = jobs_by_id.get(job.as_str().unwrap_or_default()).map_or("?", |index| sort(*index).function);
            println!("SOAK   left {} of job {job} ({kind_of}): {}", object["kind"], object["metadata"]);
        }
    }

    // Logs: every job has its log, or an explicit reason it has none; a log given up is lost.
    let storage = resources.state.storage.clone();
    let logs: Vec<(String, Option<_>)> = futures::stream::iter(jobs.iter().map(|(id, _)| id.clone()))
        .map(|id| {
            let storage = storage.clone();
            async move {
                let log =
                    storage.read_to_bytes(&gantry::storage::keys::job_user_log(&id)).await.expect("storage reads");
                (id, log)
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let (mut archived, mut no_log, mut lost) = (0, 0, Vec::new());
    for (id, log) in &logs {
        let text = log.as_ref().map(|l| String::from_utf8_lossy(l).into_owned());
        match text {
            None => lost.push(format!("{id}: no log stored")),
            Some(text) if text.starts_with(gantry::controller::status::NO_LOG) => {
                if text.contains(gantry::controller::status::LOST_LOG) {
                    lost.push(format!("{id}: {}", text.trim()));
                } else {
                    no_log += 1;
                }
            }
            Some(_) => archived += 1,
        }
    }
    println!("SOAK logs: archived={archived} no_log_with_reason={no_log} lost={}", lost.len());
    for line in lost.iter().take(10) {
        println!("SOAK   lost {line}");
    }

    // Status moves recorded twice.
    let (twice,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM (SELECT job_id, data::jsonb->>'status' FROM job_events \
         WHERE event_type = 'STATUS_CHANGE' GROUP BY 1, 2 HAVING COUNT(*) > 1) AS doubled",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    println!("SOAK status_moves_recorded_twice={twice}");
    // Every pod after a job's first must be a retry the controller decided (a RETRY event):
    // any other is the job's function run again unasked.
    let played = kubelet.pods_played();
    let retries_of: HashMap<String, i64> =
        sqlx::query_as("SELECT job_id, COUNT(*) FROM job_events WHERE event_type = 'RETRY' GROUP BY 1")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    let retried_jobs = played.values().filter(|uids| uids.len() > 1).count();
    let extra_pods: usize = played.values().map(|uids| uids.len().saturating_sub(1)).sum();
    let retry_events: i64 = retries_of.values().sum();
    println!("SOAK jobs_given_a_new_pod={retried_jobs} extra_pods={extra_pods} retry_events={retry_events}");
    let mut undecided = Vec::new();
    for (id, uids) in &played {
        let decided = retries_of.get(id).copied().unwrap_or(0);
        if uids.len() as i64 > decided + 1 {
            let kind = jobs_by_id.get(id.as_str()).map_or("?", |index| sort(*index).function);
            let (status, reason) = statuses.get(id).cloned().unwrap_or_default();
            let events: Vec<(String, String)> = sqlx::query_as(
                "SELECT event_type, COALESCE(data::jsonb->>'status', '') FROM job_events WHERE job_id = $1 ORDER BY created, id",
            )
            .bind(id)
            .fetch_all(&pool)
            .await
            .unwrap_or_default();
            let events: Vec<String> = events.into_iter().map(|(kind, status)| format!("{kind} {status}")).collect();
            undecided.push(format!(
                "{id} ({kind}): pods {uids:?}, {decided} RETRY, ended {status} {reason}; events {events:?}"
            ));
        }
    }
    println!("SOAK pods_without_a_retry_decided={}", undecided.len());
    for line in undecided.iter().take(10) {
        println!("SOAK   undecided {line}");
    }
    let hits: Vec<String> = api.fault_hits().iter().map(|(fault, n)| format!("{fault}: {n}")).collect();
    println!("SOAK api_errors_answered: {}", hits.join(", "));
    println!("SOAK controller_lives={} (killed once with SIGKILL, once with SIGTERM)", controller.lives);

    // The controller's memory and CPU through the run, per tenth.
    println!("SOAK through the run (a line per tenth of the jobs):");
    println!(
        "SOAK   {:>9} {:>8} {:>7} {:>26} {:>18} {:>23} {:>15} {:>23} {:>14} {:>5}",
        "jobs done",
        "seconds",
        "pods/s",
        "controller CPU s/1,000 jobs",
        "controller RSS MiB",
        "gateway CPU s/1,000 jobs",
        "gateway RSS MiB",
        "doubles CPU s/1,000 jobs",
        "fds c/g/d",
        "life"
    );
    let per_thousand =
        |a: &Mark, b: &Mark| (b.controller_cpu - a.controller_cpu) * 1000.0 / (b.done - a.done).max(1) as f64;
    let thousands = |a: &Mark, b: &Mark| (b.done - a.done).max(1) as f64 / 1000.0;
    for pair in marks.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        println!(
            "SOAK   {:>9} {:>8.0} {:>7.0} {:>26.2} {:>18} {:>23.2} {:>15} {:>23.2} {:>14} {:>5}",
            b.done,
            b.seconds,
            (b.pods - a.pods) as f64 / (b.seconds - a.seconds).max(0.001),
            per_thousand(a, b),
            b.controller_rss,
            (b.gateway_cpu - a.gateway_cpu) / thousands(a, b),
            b.gateway_rss,
            (b.doubles_cpu - a.doubles_cpu) / thousands(a, b),
            format!("{}/{}/{}", b.fds.0, b.fds.1, b.fds.2),
            b.lives
        );
    }
    if marks.len() >= 3 {
        let (first, last) = (&marks[0..2], &marks[marks.len() - 2..]);
        println!(
            "SOAK controller per 1,000 jobs: start cpu={:.2} s rss={} MiB; end cpu={:.2} s rss={} MiB (after the keep window: {controller_rss_end} MiB)",
            per_thousand(&first[0], &first[1]),
            first[1].controller_rss,
            per_thousand(&last[0], &last[1]),
            last[1].controller_rss,
        );
    }
    let mut latencies = latencies.lock().unwrap().clone();
    latencies.sort();
    let percentile = |p: usize| latencies.get(latencies.len().saturating_sub(1) * p / 100).map_or(0, |d| d.as_millis());
    println!(
        "SOAK run_answer_ms: p50={} p99={} max={} ({RUNS_AT_ONCE} clients)",
        percentile(50),
        percentile(99),
        percentile(100)
    );
    println!(
        "SOAK pods_created={pods_created} seconds={elapsed:.0} pods_per_second={:.0} jobs_per_second={:.0}",
        pods_created as f64 / elapsed,
        final_done as f64 / elapsed
    );

    let _ = gateway.kill().await;
    let _ = controller.child.kill().await;
    let tails = format!(
        "\n--- gateway ---\n{}\n--- controller ---\n{}",
        crate::e2e_kubernetes::tail(&gateway_log),
        crate::e2e_kubernetes::tail(&controller_log)
    );
    assert!(!stuck, "no job finished for 3 minutes{tails}");
    assert!(refused.lock().unwrap().is_empty(), "runs refused: {:?}", &refused.lock().unwrap()[..]);
    assert!(act_failures.is_empty(), "stops and deletions that failed: {act_failures:?}");
    assert!(mismatched.is_empty(), "{} jobs ended otherwise than expected{tails}", mismatched.len());
    assert_eq!((after.0, after.1, after.2), (0, 0, 0), "objects left in the cluster after the keep window{tails}");
    assert!(lost.is_empty(), "logs lost: {lost:?}");
    assert_eq!(twice, 0, "status moves recorded twice");
    assert!(unrecorded.is_empty(), "finished jobs without a usage record: {unrecorded:?}");
    assert!(off.is_empty(), "usage records whose run time is not their RUNNING→end interval: {off:?}");
    assert!(
        drained && undeliverable == 0,
        "usage and job events left in the outbox: {waiting} waiting, {undeliverable} undeliverable"
    );
    assert!(events_lost.is_empty(), "usage records without a completed event: {events_lost:?}");
    assert!(
        completed_twice.is_empty() && stray.is_empty(),
        "completed events twice {completed_twice:?} or without a record {stray:?}"
    );
    assert!(value_off.is_empty(), "completed events whose metric_value is not the record's run time: {value_off:?}");
    assert!(undecided.is_empty(), "jobs given a pod no retry decided (their function run again): {undecided:?}");
}
