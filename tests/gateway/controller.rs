//! The Kubernetes backend end to end, with the real kube-runtime `Controller`, a real
//! PostgreSQL and the in-process S3: the gateway turns runs into FunctionJobs, the controller
//! admits them and creates pods, the kubelet double runs those pods as local processes with the
//! real launcher (scoped storage access only), and the controller records every move.

use std::sync::Arc;
use std::time::Duration;

use gantry::compute::kube::{KubeBackend, KubeSettings};
use gantry::controller::build::{Placement, PodSettings};
use gantry::controller::leader::LeaseSettings;
use gantry::controller::reconcile::{Context, ControllerSettings};
use gantry::crd::pod_name;
use gantry::domain::admission::Limits;
use gantry::domain::sizes::Resources;
use serde_json::{Value, json};

use crate::doubles::kube_double::{ApiServer, Kind};
use crate::doubles::kubelet_double::{Fault, Kubelet};
use crate::eventually::{eventually, until};
use crate::harness::{Backend, Gateway, tar_of};

pub(crate) const NAMESPACE: &str = "default";

pub(crate) struct Cluster {
    pub(crate) gateway: Gateway,
    pub(crate) api: ApiServer,
    pub(crate) kubelet: Kubelet,
    pub(crate) settings: ControllerSettings,
    pub(crate) controller: std::sync::Mutex<tokio::task::JoinHandle<()>>,
    folders: tempfile::TempDir,
}

fn pod_settings(root: &std::path::Path, gateway_url: &str) -> PodSettings {
    PodSettings {
        runner_image: "runner:test".into(),
        launcher_image: "gantry:test".into(),
        launcher_source: env!("CARGO_BIN_EXE_gantry").into(),
        launcher_dir: root.join("launcher").display().to_string(),
        python: std::env::var("GANTRY_TEST_PYTHON").unwrap_or_else(|_| "python3".into()),
        // What a provider's image holds: the kubelet double runs pods on this machine.
        image_code_dir: root.join("image/runner").display().to_string(),
        work_dir: root.join("work").display().to_string(),
        data_dir: root.join("data").display().to_string(),
        gateway_url: gateway_url.into(),
        qiskit_ibm_url: "https://cloud.ibm.com".into(),
        gpu_resource: "nvidia.com/gpu".into(),
        gpu_placement: Placement::default(),
        gpu_models: Default::default(),
        cpu_placement: Placement::default(),
        image_pull_secrets: Vec::new(),
        run_as_user: 65532,
        logs_size_limit: 1024 * 1024,
        max_unpacked_mib: gantry::artifact::DEFAULT_MAX_UNPACKED_MIB,
        telemetry: Vec::new(),
    }
}

fn start_controller(gateway: &Gateway, api: &ApiServer, settings: &ControllerSettings) -> tokio::task::JoinHandle<()> {
    let context = Arc::new(Context::new(
        api.client(),
        gateway.state.db.clone(),
        gateway.state.storage.clone(),
        gateway.state.publisher.clone(),
        settings.clone(),
    ));
    tokio::spawn(gantry::controller::lead::run(context))
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.controller.lock().unwrap().abort();
    }
}

impl Cluster {
    pub(crate) async fn start(pending_deadline: Duration) -> Cluster {
        Self::start_with(pending_deadline, Duration::from_secs(3600)).await
    }

    async fn start_with(pending_deadline: Duration, timeout: Duration) -> Cluster {
        Self::start_on(Gateway::start(Backend::PostgresS3).await, pending_deadline, timeout).await
    }

    /// A cluster whose gateway and controller share `gateway`'s database, storage and publisher.
    async fn start_on(gateway: Gateway, pending_deadline: Duration, timeout: Duration) -> Cluster {
        Self::start_tuned(gateway, pending_deadline, timeout, |_| {}).await
    }

    /// As `start_on`, with the controller's settings changed by `tune` first.
    pub(crate) async fn start_tuned(
        mut gateway: Gateway,
        pending_deadline: Duration,
        timeout: Duration,
        tune: impl FnOnce(&mut ControllerSettings),
    ) -> Cluster {
        let api = ApiServer::new();
        api.install_crd(&gantry::crd::crd_yaml()).await;
        let folders = tempfile::tempdir().unwrap();
        for folder in ["launcher", "work", "data", "image/runner"] {
            std::fs::create_dir_all(folders.path().join(folder)).unwrap();
        }
        let backend = Arc::new(KubeBackend {
            client: api.client(),
            db: gateway.state.db.clone(),
            storage: gateway.state.storage.clone(),
            publisher: gateway.state.publisher.clone(),
            tokens: gateway.state.tokens.clone(),
            settings: KubeSettings {
                namespace: NAMESPACE.into(),
                timeout,
                default_resources: Resources { cpu: "1".into(), memory: "1Gi".into(), gpus: 0, gpu_model: None },
                logs_size_limit: 1024 * 1024,
                sweep_every: Duration::from_millis(200),
            },
        });
        tokio::spawn(Arc::clone(&backend).run_sweeps());
        gateway.state.compute = backend;
        // Served on loopback too: pods reach the files API with the job's token.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gateway_url = format!("http://{}", listener.local_addr().unwrap());
        let app = gantry::api::app(gateway.state.clone());
        tokio::spawn(async move { axum::serve(listener, tower::make::Shared::new(app)).await });
        let mut settings = ControllerSettings {
            namespace: NAMESPACE.into(),
            pods: pod_settings(folders.path(), &gateway_url),
            pending_deadline,
            keep_finished_pods: Duration::ZERO,
            keep_finished_jobs: Duration::from_secs(3600),
            archive_give_up: Duration::from_secs(600),
            infrastructure_retries: 2,
            retry_backoff: Duration::from_millis(500),
            limits: Limits { jobs_per_user: 2, cpu_slots: 6, gpu_slots: 1 },
            fair_share: Default::default(),
            admission_every: Duration::from_millis(50),
            concurrency: 16,
            reconcile_timeout: Duration::from_secs(120),
            resync_every: Duration::from_secs(120),
            logs_size_limit: 1024 * 1024,
            identity: "controller-test".into(),
            leader: None,
        };
        tune(&mut settings);
        let controller = std::sync::Mutex::new(start_controller(&gateway, &api, &settings));
        let kubelet = Kubelet::start(api.clone(), NAMESPACE);
        Cluster { gateway, api, kubelet, settings, controller, folders }
    }

    /// Kills the controller wherever it is and starts a new one.
    pub(crate) fn restart_controller(&self) {
        let mut running = self.controller.lock().unwrap();
        running.abort();
        *running = start_controller(&self.gateway, &self.api, &self.settings);
    }

    pub(crate) async fn upload(&self, title: &str, main: &str) {
        let artifact = tar_of(&[("main.py", main.as_bytes())]);
        let reply = self
            .gateway
            .post_multipart(
                "/api/v1/programs/upload/",
                "alice",
                &[("title", title), ("entrypoint", "main.py")],
                &[("artifact", "a.tar", &artifact)],
            )
            .await;
        assert_eq!(reply.status, 200, "{}", reply.json);
    }

    pub(crate) async fn run(&self, title: &str, arguments: &str) -> String {
        let reply = self
            .gateway
            .post_json("/api/v1/programs/run/", "alice", json!({"title": title, "arguments": arguments}))
            .await;
        assert_eq!(reply.status, 200, "{}", reply.json);
        reply.json["id"].as_str().unwrap().to_string()
    }

    /// Uploads and runs a function that first notes its run in a file outside any pod (read
    /// back by `runs`), then runs `rest` (Python, `time` imported). Returns the job id.
    pub(crate) async fn run_counted(&self, rest: &str) -> String {
        let runs = self.folders.path().join("runs.txt");
        let main = format!(
            "import time\nwith open({:?}, 'a') as f:\n    f.write('ran\\n')\n{rest}",
            runs.display().to_string()
        );
        self.upload("fn", &main).await;
        self.run("fn", "{}").await
    }

    /// One `ran` line per run of the function of `run_counted`.
    pub(crate) fn runs(&self) -> String {
        std::fs::read_to_string(self.folders.path().join("runs.txt")).unwrap_or_default()
    }

    pub(crate) async fn finished(&self, id: &str) -> Value {
        self.gateway
            .wait_for_job("alice", id, 60, |job| {
                matches!(job["status"].as_str(), Some("SUCCEEDED" | "FAILED" | "STOPPED"))
            })
            .await
    }

    pub(crate) async fn statuses(&self, id: &str) -> Vec<String> {
        let events = self.gateway.get(&format!("/api/v1/jobs/{id}/events/"), "alice").await.json;
        let mut moves: Vec<String> = events
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["event_type"] == "STATUS_CHANGE")
            .map(|e| e["data"]["status"].as_str().unwrap().to_string())
            .collect();
        moves.reverse();
        moves
    }

    /// Waits for `check` on the FunctionJob of `id`.
    pub(crate) async fn resource_until(&self, id: &str, check: impl Fn(&Value) -> bool) -> Value {
        eventually(&format!("FunctionJob {id} as awaited"), Duration::from_secs(30), || async {
            match self.api.get(Kind::FUNCTION_JOB, NAMESPACE, id) {
                Some(resource) if check(&resource) => Ok(resource),
                other => Err(format!("{other:?}")),
            }
        })
        .await
    }
}

pub(crate) const MAIN: &str = "import json, os, sys\nwith open(os.environ['ARGUMENTS_PATH']) as f:\n    n = json.load(f)['n']\nprint('[PUBLIC] doubling', n)\nprint('internal detail', file=sys.stderr)\nos.makedirs(os.path.dirname(os.environ['RESULTS_PATH']), exist_ok=True)\nwith open(os.environ['RESULTS_PATH'], 'w') as f:\n    json.dump({'doubled': 2 * n, 'token': os.environ['ENV_JOB_GATEWAY_TOKEN'], 'id': os.environ['FUNCTIONS_IDENTIFIER']}, f)\nif n < 0:\n    sys.exit(3)\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_as_a_pod_from_run_to_result() {
    let cluster = Cluster::start(Duration::from_secs(600)).await;
    cluster.upload("fn", MAIN).await;
    let id = cluster.run("fn", r#"{"n": 21}"#).await;
    let job = cluster.finished(&id).await;
    let logs = cluster.gateway.get(&format!("/api/v1/jobs/{id}/logs/"), "alice").await.json;
    let events = cluster.gateway.get(&format!("/api/v1/jobs/{id}/events/"), "alice").await.json;
    assert_eq!(job["status"], "SUCCEEDED", "{job}\n{logs}\n{events}");
    assert_eq!(cluster.statuses(&id).await, ["QUEUED", "PENDING", "RUNNING", "SUCCEEDED"]);
    let result = cluster.gateway.get(&format!("/api/v1/jobs/{id}/result/"), "alice").await.json;
    let result: Value = serde_json::from_str(result["result"].as_str().unwrap()).unwrap();
    assert_eq!(result, json!({"doubled": 42, "token": "alice", "id": id}), "the pod ran with the caller's token");
    let logs = cluster.gateway.get(&format!("/api/v1/jobs/{id}/logs/"), "alice").await.json;
    assert!(logs["logs"].as_str().unwrap().contains("doubling 21"), "{logs}");
    // The resource tells the same story; nothing secret in it; the pod is gone.
    let resource = cluster
        .resource_until(&id, |r| r["status"]["phase"] == "SUCCEEDED" && r["status"]["logsArchived"] == true)
        .await;
    assert!(!resource.to_string().contains("\"alice\"") || resource["spec"]["user"] == "alice");
    assert!(!resource.to_string().to_lowercase().contains("token\":"), "{resource}");
    until("the finished pod deleted", Duration::from_secs(30), || async {
        cluster.api.get(Kind::POD, NAMESPACE, &pod_name(&id)).is_none()
    })
    .await;
    // Every move is also a Kubernetes Event on the resource (what `kubectl describe fj` shows).
    let reasons: Vec<String> = cluster
        .api
        .list(Kind::EVENT, NAMESPACE)
        .iter()
        .filter(|event| event["regarding"]["name"] == id.as_str())
        .map(|event| event["reason"].as_str().unwrap_or_default().to_string())
        .collect();
    for reason in ["PodCreated", "RUNNING", "SUCCEEDED"] {
        assert!(reasons.iter().any(|r| r == reason), "{reason} missing from {reasons:?}");
    }
}

/// Moves made by the controller reach NATS through the outbox like the gateway's, and a log
/// follower on the gateway reads a running pod's log live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controllers_moves_are_published_and_a_pods_log_is_followed_live() {
    let (stream, prefix) = crate::streams::nats_names();
    let client = async_nats::connect(crate::streams::nats_url()).await.expect("NATS answers");
    let mut subscription = client.subscribe(format!("{prefix}.>")).await.unwrap();
    let gateway = Gateway::start(Backend::PostgresS3)
        .await
        .with_events(|events| {
            events.events_nats_url = Some(crate::streams::nats_url());
            events.events_nats_subject = prefix.clone();
            events.events_nats_stream = stream.clone();
        })
        .await;
    let cluster = Cluster::start_on(gateway, Duration::from_secs(600), Duration::from_secs(3600)).await;
    cluster.upload("printer", crate::streams::PRINTER).await;
    let id = cluster.run("printer", r#"{"lines": 20, "pause": 0.1}"#).await;
    let uri = format!("/api/v1/jobs/{id}/logs/stream/?format=text");
    let followed = cluster.gateway.open(&uri, "alice", &[]).await;
    let followed = http_body_util::BodyExt::collect(followed.into_body()).await.unwrap().to_bytes();
    let job = cluster.finished(&id).await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    let expected: String = (0..20).map(|i| format!("line {i} ✓ of the printer\n")).collect();
    assert_eq!(String::from_utf8(followed.to_vec()).unwrap(), expected);

    let mut moves = Vec::new();
    while moves.len() < 4 {
        let message = tokio::time::timeout(Duration::from_secs(20), futures::StreamExt::next(&mut subscription))
            .await
            .expect("every move reaches NATS")
            .unwrap();
        let event: Value = serde_json::from_slice(&message.payload).unwrap();
        assert_eq!(event["subject"], id.as_str());
        moves.push((event["data"]["new_status"].clone(), event["data"]["origin"].clone()));
    }
    assert_eq!(
        moves,
        [
            (json!("QUEUED"), json!("API")),
            (json!("PENDING"), json!("SCHEDULER")),
            (json!("RUNNING"), json!("SCHEDULER")),
            (json!("SUCCEEDED"), json!("SCHEDULER"))
        ]
    );
    crate::streams::delete_stream(&stream).await;
}

/// A provider function flagged `gpu` gets a pod with a GPU limit of the configured resource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_function_gets_a_gpu_pod() {
    let cluster = Cluster::start(Duration::from_secs(600)).await;
    cluster.gateway.provider("acme", None, "erin").await;
    let artifact = tar_of(&[("main.py", MAIN.as_bytes())]);
    let upload = cluster
        .gateway
        .post_multipart(
            "/api/v1/programs/upload/",
            "erin",
            &[("title", "acme/gpufn"), ("entrypoint", "main.py"), ("gpu", "true")],
            &[("artifact", "a.tar", &artifact)],
        )
        .await;
    assert_eq!(upload.status, 200, "{}", upload.json);
    let run = cluster
        .gateway
        .post_json(
            "/api/v1/programs/run/",
            "erin",
            json!({"title": "gpufn", "provider": "acme", "arguments": "{\"n\": 1}"}),
        )
        .await;
    assert_eq!(run.status, 200, "{}", run.json);
    let id = run.json["id"].as_str().unwrap().to_string();
    let pod = eventually("a pod", Duration::from_secs(30), || async {
        cluster.api.get(Kind::POD, NAMESPACE, &pod_name(&id)).ok_or("")
    })
    .await;
    assert_eq!(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "1", "{pod}");
    let resource = cluster.api.get(Kind::FUNCTION_JOB, NAMESPACE, &id).unwrap();
    assert_eq!(resource["spec"]["gpus"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_pod_fails_its_job() {
    let cluster = Cluster::start(Duration::from_secs(600)).await;
    cluster.upload("fn", MAIN).await;
    let id = cluster.run("fn", r#"{"n": -1}"#).await;
    let job = cluster.finished(&id).await;
    assert_eq!(job["status"], "FAILED", "{job}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_that_never_start_or_vanish_fail_their_jobs_with_the_cause() {
    let cluster = Cluster::start(Duration::from_secs(1)).await;
    for (function, fault) in
        [("pulls", Fault::PullFails), ("unschedulable", Fault::NeverSchedule), ("lost", Fault::LostWhileRunning)]
    {
        cluster.upload(function, MAIN).await;
        cluster.kubelet.inject(function, fault);
    }
    let pulls = cluster.run("pulls", r#"{"n": 1}"#).await;
    let unschedulable = cluster.run("unschedulable", r#"{"n": 1}"#).await;
    for id in [&pulls, &unschedulable] {
        let job = cluster.finished(id).await;
        assert_eq!(job["status"], "FAILED", "{job}");
    }
    let reason = |resource: &Value| resource["status"]["message"].as_str().unwrap_or_default().to_string();
    let pulled = cluster.resource_until(&pulls, |r| r["status"]["phase"] == "FAILED").await;
    assert!(reason(&pulled).contains("ErrImagePull"), "{pulled}");
    let waited = cluster.resource_until(&unschedulable, |r| r["status"]["phase"] == "FAILED").await;
    assert!(reason(&waited).contains("could not be scheduled"), "{waited}");

    let lost = cluster.run("lost", r#"{"n": 1}"#).await;
    let job = cluster.finished(&lost).await;
    assert_eq!(job["status"], "FAILED", "{job}");
    let events = cluster.gateway.get(&format!("/api/v1/jobs/{lost}/events/"), "alice").await.json;
    assert!(events.to_string().contains("disappeared"), "{events}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_ends_the_pod_and_the_job_stopped() {
    let cluster = Cluster::start(Duration::from_secs(600)).await;
    cluster.upload("sleeper", "import time\nprint('[PUBLIC] sleeping', flush=True)\ntime.sleep(300)\n").await;
    let id = cluster.run("sleeper", "{}").await;
    cluster.gateway.wait_for_job("alice", &id, 60, |job| job["status"] == "RUNNING").await;
    // While it runs, its log is read live from the pod, split by prefix.
    eventually("the live log", Duration::from_secs(30), || async {
        let logs = cluster.gateway.get(&format!("/api/v1/jobs/{id}/logs/"), "alice").await.json;
        if logs["logs"] == "sleeping\n" { Ok(()) } else { Err(logs) }
    })
    .await;
    let stop = cluster.gateway.post_json(&format!("/api/v1/jobs/{id}/stop/"), "alice", json!({})).await;
    assert_eq!(stop.status, 200, "{}", stop.json);
    let job = cluster.finished(&id).await;
    assert_eq!(job["status"], "STOPPED", "{job}");
    cluster.resource_until(&id, |r| r["spec"]["stopRequested"] == true && r["status"]["phase"] == "STOPPED").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_its_timeout_is_stopped_by_its_pod_deadline() {
    let cluster = Cluster::start_with(Duration::from_secs(600), Duration::from_secs(2)).await;
    cluster.upload("sleeper", "import time\nprint('[PUBLIC] sleeping', flush=True)\ntime.sleep(300)\n").await;
    let id = cluster.run("sleeper", "{}").await;
    let job = cluster.finished(&id).await;
    assert_eq!(job["status"], "STOPPED", "{job}");
    let events = cluster.gateway.get(&format!("/api/v1/jobs/{id}/events/"), "alice").await.json;
    assert!(events.to_string().contains("PROGRAM_TIMEOUT"), "{events}");
    let resource = cluster.resource_until(&id, |r| r["status"]["phase"] == "STOPPED").await;
    assert_eq!(resource["spec"]["timeoutSeconds"], 2);
}

/// A launcher that could not ship its logs (storage refused it): the controller archives them
/// from the pod's log, split by prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_the_launcher_could_not_ship_are_archived_from_the_pod_log() {
    let cluster = Cluster::start(Duration::from_secs(600)).await;
    cluster.kubelet.refuse_writes("fn");
    cluster.upload("fn", MAIN).await;
    let id = cluster.run("fn", r#"{"n": 5}"#).await;
    cluster.finished(&id).await;
    cluster.resource_until(&id, |r| r["status"]["logsArchived"] == true).await;
    let logs = cluster.gateway.get(&format!("/api/v1/jobs/{id}/logs/"), "alice").await.json;
    let text = logs["logs"].as_str().unwrap();
    assert!(text.contains("doubling 5") && text.contains("internal detail"), "{text}");
    assert!(!text.contains("[PUBLIC]"), "prefixes stripped as the launcher strips them: {text}");
    assert!(text.contains("gantry launch: failed to upload"), "the archive is the pod's own log: {text}");
}

/// The controller killed and restarted again and again while a job goes through its life: one
/// pod, every status move recorded once, the job finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_killed_at_any_point_loses_nothing_and_repeats_nothing() {
    let cluster = Cluster::start(Duration::from_secs(600)).await;
    let id =
        cluster.run_counted("print('[PUBLIC] working', flush=True)\ntime.sleep(1.5)\nprint('[PUBLIC] done')\n").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut restarts = 0;
    loop {
        let job = cluster.gateway.get(&format!("/api/v1/jobs/{id}/?with_result=false"), "alice").await.json;
        let archived =
            cluster.api.get(Kind::FUNCTION_JOB, NAMESPACE, &id).is_some_and(|r| r["status"]["logsArchived"] == true);
        if job["status"] == "SUCCEEDED" && archived {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "job did not finish across restarts: {job}");
        cluster.restart_controller();
        restarts += 1;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(restarts > 5, "only {restarts} restarts");
    assert_eq!(cluster.statuses(&id).await, ["QUEUED", "PENDING", "RUNNING", "SUCCEEDED"], "each move once");
    assert_eq!(cluster.runs(), "ran\n", "the function ran in one pod, once");
    let logs = cluster.gateway.get(&format!("/api/v1/jobs/{id}/logs/"), "alice").await.json;
    assert_eq!(logs["logs"], "working\ndone\n");
}

/// A pod made by a controller that died before recording it (neither the resource's status
/// nor an Event names it) is adopted by the next controller: the function runs once, each move
/// is recorded once, and the second controller does not claim to have made the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_made_before_a_crash_is_adopted_not_made_again() {
    use gantry::domain::lifecycle::{JobStatus, Trigger, decide};
    use k8s_openapi::api::core::v1::Pod;
    let cluster = Cluster::start(Duration::from_secs(600)).await;
    cluster.controller.lock().unwrap().abort();
    let id = cluster.run_counted("print('[PUBLIC] done')\n").await;
    let resource = cluster.resource_until(&id, |_| true).await;
    // What the dead controller did: admit the job and make its pod.
    let admitted = decide(JobStatus::Queued, &Trigger::Admitted).unwrap();
    assert!(gantry::db::jobs::apply_move(&cluster.gateway.state.db, &id, &admitted, false).await.unwrap().is_some());
    let resource: gantry::crd::FunctionJob = serde_json::from_value(resource).unwrap();
    let pod = gantry::controller::build::build_pod(&resource, &cluster.settings.pods);
    let pods: kube::Api<Pod> = kube::Api::namespaced(cluster.api.client(), NAMESPACE);
    pods.create(&Default::default(), &pod).await.unwrap();
    cluster.restart_controller();
    let job = cluster.finished(&id).await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    assert_eq!(cluster.statuses(&id).await, ["QUEUED", "PENDING", "RUNNING", "SUCCEEDED"], "each move once");
    assert_eq!(cluster.runs(), "ran\n", "the function ran in one pod, once");
    let reasons: Vec<Value> = cluster
        .api
        .list(Kind::EVENT, NAMESPACE)
        .iter()
        .filter(|event| event["regarding"]["name"] == id.as_str())
        .map(|event| event["reason"].clone())
        .collect();
    assert!(!reasons.contains(&json!("PodCreated")), "{reasons:?}");
    assert!(reasons.contains(&json!("SUCCEEDED")), "{reasons:?}");
}

/// A provider's container-image function runs on this backend: its pod runs the provider's image,
/// whose code folder holds the function (here the image's files are a local folder).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_image_function_runs_in_its_image() {
    let cluster = Cluster::start(Duration::from_secs(600)).await;
    std::fs::write(cluster.folders.path().join("image/runner/main.py"), MAIN).unwrap();
    cluster.gateway.provider("acme", Some("registry.example/acme"), "erin").await;
    let upload = cluster
        .gateway
        .post_form(
            "/api/v1/programs/upload/",
            "erin",
            &[("title", "acme/imaged"), ("image", "registry.example/acme/imaged:1")],
        )
        .await;
    assert_eq!(upload.status, 200, "{}", upload.json);
    let run = cluster
        .gateway
        .post_json(
            "/api/v1/programs/run/",
            "erin",
            json!({"title": "imaged", "provider": "acme", "arguments": "{\"n\": 4}"}),
        )
        .await;
    assert_eq!(run.status, 200, "container images run on the Kubernetes backend: {}", run.json);
    let id = run.json["id"].as_str().unwrap().to_string();
    let job = cluster
        .gateway
        .wait_for_job("erin", &id, 60, |job| matches!(job["status"].as_str(), Some("SUCCEEDED" | "FAILED")))
        .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    let resource = cluster.api.get(Kind::FUNCTION_JOB, NAMESPACE, &id).unwrap();
    assert_eq!(resource["spec"]["image"], "registry.example/acme/imaged:1");
    let result = cluster.gateway.get(&format!("/api/v1/jobs/{id}/result/"), "erin").await.json;
    let result: Value = serde_json::from_str(result["result"].as_str().unwrap()).unwrap();
    assert_eq!(result["doubled"], 8);
}

/// A job admitted but whose pod could not be created yet (the API refuses it) still stops
/// when asked: it never stays PENDING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_before_the_pod_exists_stops_the_job() {
    let cluster = Cluster::start(Duration::from_secs(600)).await;
    cluster.api.fail_next("POST", "/pods", 500, 100_000);
    cluster.upload("fn", MAIN).await;
    let id = cluster.run("fn", r#"{"n": 1}"#).await;
    cluster.gateway.wait_for_job("alice", &id, 30, |job| job["status"] == "PENDING").await;
    let stop = cluster.gateway.post_json(&format!("/api/v1/jobs/{id}/stop/"), "alice", json!({})).await;
    assert_eq!(stop.status, 200, "{}", stop.json);
    let job = cluster.finished(&id).await;
    assert_eq!(job["status"], "STOPPED", "{job}");
    assert!(cluster.api.get(Kind::POD, NAMESPACE, &pod_name(&id)).is_none());
}

/// A request the API server never answers (kube's own read timeout is almost 5 minutes) cuts
/// its reconcile at the controller's reconcile timeout; the reconcile is retried and the job
/// runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_never_answered_cuts_its_reconcile_which_is_retried() {
    let gateway = Gateway::start(Backend::PostgresS3).await;
    let cluster = Cluster::start_tuned(gateway, Duration::from_secs(600), Duration::from_secs(3600), |settings| {
        settings.reconcile_timeout = Duration::from_secs(2);
    })
    .await;
    cluster.api.hang_next("POST", "/pods", 1);
    cluster.upload("fn", MAIN).await;
    let id = cluster.run("fn", r#"{"n": 1}"#).await;
    let job = cluster.finished(&id).await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    assert_eq!(cluster.api.fault_hits().get("POST /pods 0"), Some(&1), "the pod's first create was never answered");
}

/// The resync catches a wake that was lost: a job whose row left the queue with no wake (here
/// moved by hand, past an admission that admits nothing) gets its pod at the next resync,
/// though its resource still says QUEUED. (The resync leaves alone only resources whose rows wait
/// in the queue: `triggers::to_resync`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resync_reconciles_a_job_that_left_the_queue_unwoken() {
    use gantry::domain::lifecycle::{JobStatus, Trigger, decide};
    let gateway = Gateway::start(Backend::PostgresS3).await;
    let cluster = Cluster::start_tuned(gateway, Duration::from_secs(600), Duration::from_secs(3600), |settings| {
        settings.limits.cpu_slots = 0;
        settings.resync_every = Duration::from_secs(1);
    })
    .await;
    cluster.upload("fn", MAIN).await;
    let id = cluster.run("fn", r#"{"n": 1}"#).await;
    cluster.resource_until(&id, |resource| resource["status"]["phase"] == "QUEUED").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(cluster.api.get(Kind::POD, NAMESPACE, &pod_name(&id)).is_none(), "no slot: it waits in the queue");
    let admitted = decide(JobStatus::Queued, &Trigger::Admitted).unwrap();
    let moved = gantry::db::jobs::apply_moves(&cluster.gateway.state.db, std::slice::from_ref(&id), &admitted, false);
    assert_eq!(moved.await.unwrap().len(), 1);
    until("the pod made by a resync", Duration::from_secs(10), || async {
        cluster.api.get(Kind::POD, NAMESPACE, &pod_name(&id)).is_some()
    })
    .await;
    let job = cluster.finished(&id).await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
}

/// Who reported the Kubernetes Events about the FunctionJob of `id`.
fn reporters(api: &ApiServer, id: &str) -> std::collections::BTreeSet<String> {
    api.list(Kind::EVENT, NAMESPACE)
        .iter()
        .filter(|event| event["regarding"]["name"] == id)
        .map(|event| event["reportingInstance"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Two controller replicas with leader election: only the Lease holder acts (every Event comes
/// from it, every move happens once); when it dies without releasing the Lease, the other takes
/// over once the Lease expires and runs the next job; a clean release hands over at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_controllers_elect_one_leader_and_the_other_takes_over() {
    let cluster = Cluster::start(Duration::from_secs(600)).await;
    cluster.controller.lock().unwrap().abort();
    let lease = LeaseSettings {
        name: "gantry-controller".into(),
        duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_every: Duration::from_millis(200),
    };
    let replica = |identity: &str| ControllerSettings {
        identity: identity.into(),
        leader: Some(lease.clone()),
        ..cluster.settings.clone()
    };
    let holder = || cluster.api.get(Kind::LEASE, NAMESPACE, "gantry-controller").map(|lease| lease["spec"].clone());
    let a = start_controller(&cluster.gateway, &cluster.api, &replica("controller-a"));
    eventually("controller-a took the lease", Duration::from_secs(10), || async {
        match holder() {
            Some(spec) if spec["holderIdentity"] == "controller-a" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let b = start_controller(&cluster.gateway, &cluster.api, &replica("controller-b"));
    cluster.upload("fn", MAIN).await;

    let first = cluster.run("fn", r#"{"n": 1}"#).await;
    assert_eq!(cluster.finished(&first).await["status"], "SUCCEEDED");
    assert_eq!(cluster.statuses(&first).await, ["QUEUED", "PENDING", "RUNNING", "SUCCEEDED"]);
    assert_eq!(reporters(&cluster.api, &first), ["controller-a".to_string()].into(), "only the leader acted");
    assert_eq!(holder().unwrap()["holderIdentity"], "controller-a");

    // The leader dies without a word: the follower waits out the lease, then leads.
    a.abort();
    let second = cluster.run("fn", r#"{"n": 2}"#).await;
    assert_eq!(cluster.finished(&second).await["status"], "SUCCEEDED");
    assert_eq!(cluster.statuses(&second).await, ["QUEUED", "PENDING", "RUNNING", "SUCCEEDED"]);
    assert_eq!(reporters(&cluster.api, &second), ["controller-b".to_string()].into());
    let spec = holder().unwrap();
    assert_eq!(spec["holderIdentity"], "controller-b");
    assert_eq!(spec["leaseTransitions"], 1);
    b.abort();
}

async fn admin_get(router: &axum::Router, path: &str) -> (u16, String) {
    use tower::ServiceExt;
    let request = axum::http::Request::get(path).body(axum::body::Body::empty()).unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// The value of the sample `name` (with its labels) in a Prometheus text page.
fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The controller's admin port: metrics moved by real work (reconciles, admission, jobs by status,
/// the leader gauge) and its probes; the gateway counts its API requests the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_port_reports_metrics_and_probes() {
    let cluster = Cluster::start(Duration::from_secs(600)).await;
    cluster.controller.lock().unwrap().abort();
    let context = Arc::new(Context::new(
        cluster.api.client(),
        cluster.gateway.state.db.clone(),
        cluster.gateway.state.storage.clone(),
        cluster.gateway.state.publisher.clone(),
        cluster.settings.clone(),
    ));
    let admin = gantry::ops::router(Arc::clone(&context.metrics), cluster.gateway.state.db.clone());
    let (_, before) = admin_get(&admin, "/metrics").await;
    assert_eq!(sample(&before, "gantry_controller_leader"), Some(0.0), "{before}");
    // The job-time histograms are the process's (other tests' jobs count too): they grow.
    let waits_before = sample(&before, "gantry_job_queue_wait_seconds_count").expect("the queue-wait histogram");
    let runs_before = sample(&before, r#"gantry_job_run_seconds_count{status="SUCCEEDED"}"#).unwrap_or(0.0);
    *cluster.controller.lock().unwrap() = tokio::spawn(gantry::controller::lead::run(context));
    cluster.upload("fn", MAIN).await;
    let id = cluster.run("fn", r#"{"n": 2}"#).await;
    assert_eq!(cluster.finished(&id).await["status"], "SUCCEEDED");

    // The job-time histograms are observed just after the move is written (`compute::move_job`),
    // so a scrape right after the job reads as finished may come first: wait for them.
    let page = eventually("the job's run time observed", Duration::from_secs(5), || async {
        let (status, page) = admin_get(&admin, "/metrics").await;
        assert_eq!(status, 200);
        let runs = sample(&page, r#"gantry_job_run_seconds_count{status="SUCCEEDED"}"#).unwrap_or(0.0);
        if runs > runs_before { Ok(page) } else { Err(page) }
    })
    .await;
    assert_eq!(sample(&page, "gantry_controller_leader"), Some(1.0), "{page}");
    assert_eq!(sample(&page, "gantry_controller_admitted_total"), Some(1.0), "{page}");
    assert_eq!(sample(&page, r#"gantry_jobs{status="SUCCEEDED"}"#), Some(1.0), "{page}");
    assert_eq!(sample(&page, r#"gantry_jobs{status="QUEUED"}"#), Some(0.0), "{page}");
    assert_eq!(sample(&page, "gantry_queue_depth"), Some(0.0), "{page}");
    assert!(sample(&page, r#"gantry_controller_reconciles_total{outcome="ok"}"#).unwrap_or(0.0) >= 2.0, "{page}");
    assert!(page.contains("gantry_controller_reconcile_duration_seconds_bucket"), "{page}");
    assert!(sample(&page, "gantry_job_queue_wait_seconds_count").unwrap() > waits_before, "{page}");
    let runs = sample(&page, r#"gantry_job_run_seconds_count{status="SUCCEEDED"}"#).unwrap_or(0.0);
    assert!(runs > runs_before, "{page}");
    assert!(page.contains(r#"gantry_job_run_seconds_bucket{le="0.1",status="SUCCEEDED"}"#), "{page}");
    assert_eq!(sample(&page, r#"gantry_outbox_events{state="waiting"}"#), Some(0.0), "{page}");
    assert_eq!(sample(&page, "gantry_outbox_lag_seconds"), Some(0.0), "{page}");
    assert_eq!(admin_get(&admin, "/healthz").await.0, 200);
    assert_eq!(admin_get(&admin, "/readyz").await.0, 200);

    let metrics = Arc::new(gantry::ops::Metrics::gateway());
    let layer = axum::middleware::from_fn_with_state(Arc::clone(&metrics), gantry::ops::record_http);
    let api = tower::Layer::layer(&layer, gantry::api::app(cluster.gateway.state.clone()));
    for (method, path) in [("GET", "/liveness/"), ("GET", "/api/v1/jobs/"), ("POST", "/api/v1/programs/run/")] {
        use tower::ServiceExt;
        let request = axum::http::Request::builder().method(method).uri(path).body(axum::body::Body::empty());
        api.clone().oneshot(request.unwrap()).await.unwrap();
    }
    let (_, page) = admin_get(&gantry::ops::router(metrics, cluster.gateway.state.db.clone()), "/metrics").await;
    assert_eq!(sample(&page, r#"gantry_http_requests_total{method="GET",code="200"}"#), Some(1.0), "{page}");
    assert_eq!(sample(&page, r#"gantry_http_requests_total{method="GET",code="401"}"#), Some(1.0), "{page}");
    assert_eq!(sample(&page, "gantry_run_request_duration_seconds_count"), Some(1.0), "{page}");
    assert_eq!(sample(&page, r#"gantry_jobs{status="SUCCEEDED"}"#), Some(1.0), "{page}");
}

/// `DATA_PATH` in a pod is the caller's file area of the function, through the gateway's files
/// API with the job's token: it holds the user's files at start, files the job writes show in
/// `files()` while it still runs, and at its end the area matches the folder (a removed file
/// is gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_data_path_is_the_users_file_area() {
    let cluster = Cluster::start(Duration::from_secs(600)).await;
    let main = "import os, time\nd = os.environ['DATA_PATH']\ntext = open(os.path.join(d, 'input.txt')).read()\nopen(os.path.join(d, 'output.txt'), 'w').write(text.upper())\nos.remove(os.path.join(d, 'old.txt'))\nopen(os.path.join(d, 'progress.txt'), 'w').write('half way')\nprint('[PUBLIC] written', flush=True)\ntime.sleep(6)\n";
    cluster.upload("fn", main).await;
    for (name, content) in [("input.txt", "hello"), ("old.txt", "stale")] {
        let reply = cluster
            .gateway
            .post_multipart("/api/v1/files/upload/?function=fn", "alice", &[], &[("file", name, content.as_bytes())])
            .await;
        assert_eq!(reply.status, 200, "{}", reply.json);
    }
    let files = || async {
        let listing = cluster.gateway.get("/api/v1/files/?function=fn", "alice").await.json;
        let mut names: Vec<String> =
            listing["results"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_string()).collect();
        names.sort();
        names
    };
    let id = cluster.run("fn", "{}").await;
    eventually("progress.txt appeared", Duration::from_secs(30), || async {
        let names = files().await;
        if names.contains(&"progress.txt".to_string()) { Ok(()) } else { Err(format!("{names:?}")) }
    })
    .await;
    let job = cluster.gateway.get(&format!("/api/v1/jobs/{id}/?with_result=false"), "alice").await.json;
    assert_eq!(job["status"], "RUNNING", "the file showed while the job ran: {job}");
    let job = cluster.finished(&id).await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    assert_eq!(files().await, ["input.txt", "output.txt", "progress.txt"]);
    let output = cluster.gateway.get("/api/v1/files/download/?function=fn&file=output.txt", "alice").await;
    assert_eq!(String::from_utf8_lossy(&output.bytes), "HELLO");
}
