//! GPUs on `gantry serve`'s local runner (issue 45), without a GPU: the runner's device and
//! driver folders point at stand-in files (regular files anyone may open read-write, so only
//! the job's confinement can refuse one). Two GPU jobs held at once each open their own GPU's
//! device file and the driver's shared ones read-write, never the other's, and see their GPU in
//! `CUDA_VISIBLE_DEVICES`; a job of a function without GPU opens none; a size whose profile
//! names two GPUs gets two and `ENV_JOB_COMPUTE_PROFILE`; a GPU run the machine cannot serve
//! (too many GPUs, a model it lacks, no GPU at all) is refused with a 400 that says so.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::both_backends;
use crate::eventually::{eventually_blocking, until_blocking};
use crate::harness::{Backend, Gateway, tar_of};

both_backends!(gpu_jobs_open_their_own_gpus_only);

/// Tries to open each device file read-write, reports which it could, what it was told.
const PROBE: &str = r#"
import json, os, time
with open(os.environ["ARGUMENTS_PATH"]) as handle:
    arguments = json.load(handle)
opened = []
for path in arguments["devices"]:
    try:
        os.close(os.open(path, os.O_RDWR)); opened.append(os.path.basename(path))
    except OSError as error:
        if not isinstance(error, PermissionError):
            raise
driver = []
for path in arguments["driver"]:
    try:
        open(path).read(); driver.append("read")
    except PermissionError:
        driver.append("refused")
time.sleep(arguments.get("hold", 0))
outcome = {"opened": opened, "driver": driver, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
           "profile": os.environ.get("ENV_JOB_COMPUTE_PROFILE"), "size": os.environ.get("ENV_JOB_FUNCTION_SIZE")}
os.makedirs(os.path.dirname(os.environ["RESULTS_PATH"]), exist_ok=True)
with open(os.environ["RESULTS_PATH"], "w") as handle:
    json.dump(outcome, handle)
"#;

/// Stand-in device files and driver information of `models` (GPU i is `nvidia<i>`, UUID
/// `GPU-iii`), in a folder every user may pass through.
fn stand_in(dir: &Path, models: &[&str]) {
    let open = |path: &Path, mode| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    open(dir, 0o755);
    let dev = dir.join("dev");
    std::fs::create_dir_all(&dev).unwrap();
    open(&dev, 0o755);
    let mut names: Vec<String> =
        ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"].map(String::from).into();
    names.extend((0..models.len()).map(|i| format!("nvidia{i}")));
    for name in names {
        std::fs::write(dev.join(&name), "").unwrap();
        open(&dev.join(name), 0o666);
    }
    for (i, model) in models.iter().enumerate() {
        let bus = dir.join(format!("driver/gpus/0000:0{i}:00.0"));
        std::fs::create_dir_all(&bus).unwrap();
        std::fs::write(
            bus.join("information"),
            format!("Model: {model}\nGPU UUID: GPU-{i}{i}{i}\nDevice Minor: {i}\n"),
        )
        .unwrap();
    }
    for folder in ["driver", "driver/gpus"] {
        open(&dir.join(folder), 0o755);
    }
    for (i, _) in models.iter().enumerate() {
        open(&dir.join(format!("driver/gpus/0000:0{i}:00.0")), 0o755);
        open(&dir.join(format!("driver/gpus/0000:0{i}:00.0/information")), 0o644);
    }
}

async fn upload(gateway: &Gateway, fields: &[(&str, &str)]) {
    let artifact = tar_of(&[("main.py", PROBE.as_bytes())]);
    let mut all = vec![("entrypoint", "main.py")];
    all.extend_from_slice(fields);
    let reply = gateway
        .post_multipart("/api/v1/programs/upload/", "erin", &all, &[("artifact", "artifact.tar", &artifact)])
        .await;
    assert_eq!(reply.status, 200, "{}", reply.json);
}

async fn run(gateway: &Gateway, body: Value) -> crate::harness::Reply {
    gateway.post_json("/api/v1/programs/run/", "erin", body).await
}

async fn outcome(gateway: &Gateway, id: &str) -> Value {
    let job = gateway
        .wait_for_job("erin", id, 90, |job| matches!(job["status"].as_str(), Some("SUCCEEDED" | "FAILED" | "STOPPED")))
        .await;
    let logs = gateway.get(&format!("/api/v1/jobs/{id}/provider-logs/"), "erin").await.json;
    assert_eq!(job["status"], "SUCCEEDED", "{job} {logs}");
    let result = gateway.get(&format!("/api/v1/jobs/{id}/result/"), "erin").await.json;
    serde_json::from_str(result["result"].as_str().expect("a result")).expect("JSON result")
}

async fn gpu_jobs_open_their_own_gpus_only(backend: Backend) {
    let machine = tempfile::tempdir().unwrap();
    stand_in(machine.path(), &["NVIDIA H200", "NVIDIA H200"]);
    let args = gantry::compute::local::gpus::GpuArgs {
        device_dir: machine.path().join("dev"),
        driver_dir: machine.path().join("driver"),
        gpus: "all".into(),
    };
    let gateway = Gateway::start(backend)
        .await
        .with_runner(|config| {
            config.gpus = Arc::new(args.pool().expect("the stand-in GPUs"));
            config.limits.gpu_slots = 2;
            config.limits.jobs_per_user = 4;
        })
        .await;
    gateway.provider("acme", None, "erin").await;
    let gpu_fields =
        [("title", "probe"), ("provider", "acme"), ("gpu", "true"), ("sizes", r#"{"S": null, "L": "8x4x2h200"}"#)];
    upload(&gateway, &gpu_fields).await;
    upload(&gateway, &[("title", "cpu-probe")]).await;

    let dev = |name: &str| machine.path().join("dev").join(name).display().to_string();
    let devices: Vec<String> =
        ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "nvidia0", "nvidia1"].map(dev).into();
    let driver = vec![machine.path().join("driver/gpus/0000:00:00.0/information").display().to_string()];
    let arguments = |hold: f64| json!({"devices": devices, "driver": driver, "hold": hold}).to_string();

    // Two GPU jobs at once: each holds one GPU, never the same.
    let mut ids = Vec::new();
    for _ in 0..2 {
        let reply = run(&gateway, json!({"title": "probe", "provider": "acme", "arguments": arguments(2.0)})).await;
        assert_eq!(reply.status, 200, "{}", reply.json);
        ids.push(reply.json["id"].as_str().unwrap().to_string());
    }
    let mut own = Vec::new();
    for id in &ids {
        let seen = outcome(&gateway, id).await;
        let opened: Vec<&str> = seen["opened"].as_array().unwrap().iter().map(|d| d.as_str().unwrap()).collect();
        assert_eq!(opened[..3], ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"], "{seen}");
        assert_eq!(opened.len(), 4, "the shared device files and one GPU, nothing else: {seen}");
        assert_eq!(seen["driver"], json!(["read"]), "{seen}");
        let minor = opened[3].strip_prefix("nvidia").unwrap().to_string();
        assert_eq!(seen["visible"], format!("GPU-{minor}{minor}{minor}"), "{seen}");
        assert_eq!((seen["profile"].as_str(), seen["size"].as_str()), (Some(""), Some("")), "{seen}");
        own.push(minor);
    }
    own.sort();
    assert_eq!(own, ["0", "1"], "two jobs at once hold the two GPUs, one each");

    // A size whose profile names two GPUs of the machine's model: both, and its profile.
    let reply =
        run(&gateway, json!({"title": "probe", "provider": "acme", "arguments": arguments(0.0), "function_size": "L"}))
            .await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    let seen = outcome(&gateway, reply.json["id"].as_str().unwrap()).await;
    assert_eq!(seen["opened"].as_array().unwrap().len(), 5, "both GPUs: {seen}");
    assert_eq!((seen["profile"].as_str(), seen["size"].as_str()), (Some("8x4x2h200"), Some("L")), "{seen}");
    assert_eq!(seen["visible"], "GPU-000,GPU-111", "{seen}");

    // A function without GPU: none of them, and nothing of the driver.
    let reply = run(&gateway, json!({"title": "cpu-probe", "arguments": arguments(0.0)})).await;
    let id = reply.json["id"].as_str().unwrap().to_string();
    let job = gateway
        .wait_for_job("erin", &id, 90, |job| matches!(job["status"].as_str(), Some("SUCCEEDED" | "FAILED")))
        .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    let result = gateway.get(&format!("/api/v1/jobs/{id}/result/"), "erin").await.json;
    let seen: Value = serde_json::from_str(result["result"].as_str().unwrap()).unwrap();
    assert_eq!(seen["opened"], json!([]), "a CPU job opens no GPU device file: {seen}");
    assert_eq!(seen["driver"], json!(["refused"]), "{seen}");
    assert_eq!(seen["visible"], Value::Null, "{seen}");

    // What this machine cannot serve is refused when run, never a job that fails later.
    upload(&gateway, &[("title", "l40s"), ("provider", "acme"), ("gpu", "true"), ("sizes", r#"{"M": "4x8x1l40s"}"#)])
        .await;
    upload(&gateway, &[("title", "three"), ("provider", "acme"), ("gpu", "true"), ("sizes", r#"{"M": "4x8x3"}"#)])
        .await;
    for (title, expected) in
        [("l40s", "model 'l40s' and this machine has 2 (NVIDIA H200, NVIDIA H200)"), ("three", "3 GPU(s)")]
    {
        let reply =
            run(&gateway, json!({"title": title, "provider": "acme", "arguments": "{}", "function_size": "M"})).await;
        assert_eq!(reply.status, 400, "{title}: {}", reply.json);
        assert!(reply.message().contains(expected), "{title}: {}", reply.message());
    }
}

/// Without GPUs (the harness's default runner), a GPU function's run is refused at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_run_on_a_machine_without_gpus_is_refused() {
    let gateway = Gateway::start(Backend::SqliteLocal).await.with_runner(|_| {}).await;
    gateway.provider("acme", None, "erin").await;
    upload(&gateway, &[("title", "probe"), ("provider", "acme"), ("gpu", "true")]).await;
    let reply = run(&gateway, json!({"title": "probe", "provider": "acme", "arguments": "{}"})).await;
    assert_eq!(reply.status, 400, "{}", reply.json);
    assert!(reply.message().contains("this machine has no GPU"), "{}", reply.message());
}

/// What a GPU job holds survives a restart of `gantry serve`: the restarted server adopts the
/// running job with its GPU (recorded beside the work folders), so a GPU job run right after
/// the restart waits for it instead of being given the same GPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_serve_keeps_a_running_jobs_gpu_held() {
    use crate::lifecycle::{curl, serve_with};
    let machine = tempfile::tempdir().unwrap();
    stand_in(machine.path(), &["NVIDIA H200"]);
    let data = machine.path().join("data");
    let gantry = env!("CARGO_BIN_EXE_gantry");
    for arguments in [&["create-provider", "acme"][..], &["add-admin", "--provider", "acme", "--user", "erin"]] {
        let status =
            std::process::Command::new(gantry).args(["admin", "--data-dir"]).arg(&data).args(arguments).output();
        assert!(status.unwrap().status.success());
    }
    let (dev, driver) = (machine.path().join("dev"), machine.path().join("driver"));
    // Two GPU slots for one GPU: only the GPU's holder, not the slot count, keeps the next job out.
    let flags = [
        "--gpu-device-dir",
        dev.to_str().unwrap(),
        "--gpu-driver-dir",
        driver.to_str().unwrap(),
        "--max-gpu-jobs",
        "2",
    ];
    let (mut first, base) = serve_with(&data, &flags);
    let artifact = machine.path().join("probe.tar");
    std::fs::write(&artifact, tar_of(&[("main.py", PROBE.as_bytes())])).unwrap();
    let auth = "Authorization: Bearer erin";
    let uploaded = curl(&[
        "-H",
        auth,
        "-F",
        "title=probe",
        "-F",
        "provider=acme",
        "-F",
        "gpu=true",
        "-F",
        "entrypoint=main.py",
        "-F",
        &format!("artifact=@{}", artifact.display()),
        &format!("{base}/api/v1/programs/upload/"),
    ]);
    assert!(uploaded.contains("\"title\":\"probe\""), "{uploaded}");
    let devices = json!([dev.join("nvidia0")]);
    let run = |base: &str, hold: f64| -> String {
        let arguments = json!({"devices": devices, "driver": [], "hold": hold}).to_string();
        let body = json!({"title": "probe", "provider": "acme", "arguments": arguments}).to_string();
        let answer = curl(&[
            "-H",
            auth,
            "-H",
            "Content-Type: application/json",
            "-d",
            &body,
            &format!("{base}/api/v1/programs/run/"),
        ]);
        let answer: Value = serde_json::from_str(&answer).unwrap();
        answer["id"].as_str().unwrap_or_else(|| panic!("{answer}")).to_string()
    };
    let job = |base: &str, id: &str| -> Value {
        serde_json::from_str(&curl(&["-H", auth, &format!("{base}/api/v1/jobs/{id}/?with_result=false")])).unwrap()
    };
    let held = run(&base, 5.0);
    until_blocking("the GPU job ran", std::time::Duration::from_secs(60), || job(&base, &held)["status"] == "RUNNING");
    assert!(data.join(format!("jobs/.{held}.gpus")).exists(), "the job's GPUs are recorded");
    first.kill().unwrap();
    first.wait().unwrap();

    let (mut second, base) = serve_with(&data, &flags);
    let next = run(&base, 0.0);
    let ended = |id: &str| {
        eventually_blocking(&format!("job {id} ended"), std::time::Duration::from_secs(90), || {
            let seen = job(&base, id);
            if matches!(seen["status"].as_str(), Some("SUCCEEDED" | "FAILED" | "STOPPED")) {
                Ok(seen)
            } else {
                Err(seen)
            }
        })
    };
    let (held_job, next_job) = (ended(&held), ended(&next));
    let moved = |id: &str, status: &str| -> String {
        let events: Value =
            serde_json::from_str(&curl(&["-H", auth, &format!("{base}/api/v1/jobs/{id}/events/")])).unwrap();
        let event = events.as_array().unwrap().iter().find(|e| e["data"]["status"] == status).cloned();
        event.unwrap_or_else(|| panic!("no {status} event of {id}: {events}"))["created"].as_str().unwrap().to_string()
    };
    let (held_end, next_start) = (moved(&held, "SUCCEEDED"), moved(&next, "PENDING"));
    second.kill().unwrap();
    second.wait().unwrap();
    assert_eq!((held_job["status"].as_str(), next_job["status"].as_str()), (Some("SUCCEEDED"), Some("SUCCEEDED")));
    assert!(
        next_start >= held_end,
        "the next GPU job was admitted ({next_start}) before the held GPU was free ({held_end})"
    );
    assert!(!data.join(format!("jobs/.{held}.gpus")).exists(), "the record goes with the job");
}
