//! Jobs of the local runner are confined (issue 11): a spy function run by bob, while alice has
//! a file, a running job and an active token, tries to reach alice's data, the server's files
//! and processes, and alice's job. Each attempt must be refused by the system (a
//! `PermissionError`, not a missing path: the test checks first that every target exists), while
//! the spy can still use its own folders.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::both_backends;
use crate::eventually::eventually;
use crate::harness::{Backend, Gateway, S3_SECRET, tar_of};

both_backends!(a_job_cannot_reach_other_users_the_database_or_the_server);

const VICTIM: &str = r#"
import os, time
print(f"pid {os.getpid()}", flush=True)
time.sleep(120)
"#;

/// Tries every attempt named in its arguments and reports, for each, the exception that stopped
/// it or what it could read.
const SPY: &str = r#"
import json, os, signal
with open(os.environ["ARGUMENTS_PATH"]) as handle:
    arguments = json.load(handle)
data = os.environ["DATA_PATH"]

def attempt(action):
    try:
        value = action()
        return "allowed: " + repr(value)[:80]
    except Exception as error:
        return type(error).__name__

def read(path):
    with open(path, "rb") as handle:
        return handle.read(64)

outcome = {}
for name, path in arguments["read"].items():
    outcome[name] = attempt(lambda: read(path))
outcome["other_user_file_through_data_path"] = attempt(lambda: read(os.path.join(data, arguments["relative"])))
for name, path in arguments["list"].items():
    outcome[name] = attempt(lambda: os.listdir(path))
outcome["launcher_environ"] = attempt(lambda: read(f"/proc/{os.getppid()}/environ"))
outcome["signal_other_job"] = attempt(lambda: os.kill(arguments["victim_pid"], signal.SIGTERM))
outcome["signal_launcher"] = attempt(lambda: os.kill(os.getppid(), signal.SIGTERM))

def own_folders():
    with open(os.path.join(data, "mine.txt"), "w") as handle:
        handle.write("mine")
    with open(os.path.join(os.environ["TMPDIR"], "scratch"), "w") as handle:
        handle.write("scratch")
    return read(os.path.join(data, "mine.txt")).decode()
outcome["own_folders"] = attempt(own_folders)
outcome["uid"] = os.getuid()
os.makedirs(os.path.dirname(os.environ["RESULTS_PATH"]), exist_ok=True)
with open(os.environ["RESULTS_PATH"], "w") as handle:
    json.dump(outcome, handle)
"#;

async fn upload(gateway: &Gateway, user: &str, title: &str, main: &str) {
    let artifact = tar_of(&[("main.py", main.as_bytes())]);
    let reply = gateway
        .post_multipart(
            "/api/v1/programs/upload/",
            user,
            &[("title", title), ("entrypoint", "main.py")],
            &[("artifact", "artifact.tar", &artifact)],
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.json);
}

async fn run(gateway: &Gateway, user: &str, title: &str, arguments: Value) -> String {
    let reply = gateway
        .post_json("/api/v1/programs/run/", user, json!({"title": title, "arguments": arguments.to_string()}))
        .await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    reply.json["id"].as_str().unwrap().to_string()
}

fn terminal(job: &Value) -> bool {
    matches!(job["status"].as_str(), Some("SUCCEEDED" | "FAILED" | "STOPPED"))
}

/// Waits for the `pid N` line of a running job's live log.
async fn job_pid(gateway: &Gateway, user: &str, id: &str) -> i64 {
    eventually("the victim printed its pid", Duration::from_secs(60), || async {
        let logs = gateway.get(&format!("/api/v1/jobs/{id}/logs/"), user).await.json["logs"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        logs.lines().find_map(|line| line.strip_prefix("pid ")?.trim().parse().ok()).ok_or_else(|| format!("{logs:?}"))
    })
    .await
}

/// A file the test process itself can read: the spy's failure to read it is the isolation's.
fn assert_readable_here(path: &Path) {
    assert!(std::fs::read(path).is_ok(), "precondition: {} exists and the test can read it", path.display());
}

async fn a_job_cannot_reach_other_users_the_database_or_the_server(backend: Backend) {
    let gateway = Gateway::start(backend).await.with_runner(|_| {}).await;
    let data_dir = gateway.data_dir().to_path_buf();
    upload(&gateway, "alice", "victim", VICTIM).await;
    let reply = gateway
        .post_multipart(
            "/api/v1/files/upload/?function=victim",
            "alice",
            &[],
            &[("file", "secret.txt", b"alice's secret")],
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    let victim = run(&gateway, "alice", "victim", json!({})).await;
    let victim_pid = job_pid(&gateway, "alice", &victim).await;

    let objects = match backend {
        Backend::SqliteLocal => data_dir.join("objects"),
        Backend::PostgresS3 => data_dir.join("s3/gantry/test"),
    };
    let secret = objects.join("users/alice/data/secret.txt");
    assert_eq!(std::fs::read(&secret).expect("alice's file in the object folder"), b"alice's secret");
    let victim_code = data_dir.join("jobs").join(&victim).join("code/main.py");
    let server_environ = format!("/proc/{}/environ", std::process::id());
    let victim_environ = format!("/proc/{victim_pid}/environ");
    let mut reads = json!({
        "other_user_file": secret,
        "other_job_code": victim_code,
        "other_job_environ": victim_environ,
        "server_environ": server_environ,
    });
    if matches!(backend, Backend::SqliteLocal) {
        reads["database_file"] = json!(data_dir.join("gantry.db"));
    }
    for path in reads.as_object().unwrap().values() {
        assert_readable_here(Path::new(path.as_str().unwrap()));
    }
    // From DATA_PATH (`<data dir>/jobs/<job>/data`) up to the data dir, then down to alice's file.
    let relative = Path::new("../../..").join(secret.strip_prefix(&data_dir).unwrap());
    let lists = json!({
        "data_dir_listing": data_dir,
        "object_folder_listing": objects,
        "work_folders_listing": data_dir.join("jobs"),
    });

    upload(&gateway, "bob", "spy", SPY).await;
    let spy = run(
        &gateway,
        "bob",
        "spy",
        json!({"read": reads, "list": lists, "relative": relative, "victim_pid": victim_pid}),
    )
    .await;
    let job = gateway.wait_for_job("bob", &spy, 60, terminal).await;
    let logs = gateway.get(&format!("/api/v1/jobs/{spy}/logs/"), "bob").await.json;
    assert_eq!(job["status"], "SUCCEEDED", "{job} {logs}");
    let result = gateway.get(&format!("/api/v1/jobs/{spy}/result/"), "bob").await.json;
    let outcome: Value = serde_json::from_str(result["result"].as_str().expect("a result")).expect("JSON result");

    let refused = |name: &str| {
        assert_eq!(outcome[name], "PermissionError", "{name}: the spy must be refused: {outcome}");
    };
    refused("other_user_file");
    refused("other_user_file_through_data_path");
    refused("other_job_code");
    refused("other_job_environ");
    refused("server_environ");
    refused("launcher_environ");
    if matches!(backend, Backend::SqliteLocal) {
        refused("database_file");
    }
    refused("data_dir_listing");
    refused("object_folder_listing");
    refused("work_folders_listing");
    refused("signal_other_job");
    refused("signal_launcher");
    assert_eq!(outcome["own_folders"], "allowed: 'mine'", "the spy keeps its own folders: {outcome}");
    if gantry::launcher::isolation::running_as_root() {
        assert_eq!(outcome["uid"], 65534, "a root server runs jobs as nobody: {outcome}");
    }

    // The launcher beside alice's job holds no storage credentials at all (S3: presigned URLs,
    // which name the access key id, as every presigned URL does, but never carry the secret).
    let job = gantry::db::jobs::find(&gateway.state.db, &victim).await.unwrap().unwrap();
    let launcher = job.backend_ref.unwrap().strip_prefix("pid:").unwrap().to_string();
    for file in ["environ", "cmdline"] {
        let text = String::from_utf8_lossy(&std::fs::read(format!("/proc/{launcher}/{file}")).unwrap()).into_owned();
        assert!(text.contains(&victim), "precondition: {file} of the victim's launcher");
        assert!(
            !text.contains(S3_SECRET) && !text.contains("AWS_"),
            "the launcher's {file} holds no storage credentials: {text}"
        );
    }

    let still = gateway.get(&format!("/api/v1/jobs/{victim}/"), "alice").await.json;
    assert_eq!(still["status"], "RUNNING", "alice's job survived the spy: {still}");
    let stop = gateway.post_json(&format!("/api/v1/jobs/{victim}/stop/"), "alice", json!({"service": "null"})).await;
    assert_eq!(stop.status, 200, "{}", stop.json);
    gateway.wait_for_job("alice", &victim, 30, terminal).await;
}
