//! Jobs at their limits on `gantry serve`'s local runner: a memory hog, a (bounded) fork bomb, a
//! file past the largest size, a job printing far more than the kept log, and a job whose folder
//! is on a full disk. Each ends with its status and a reason naming the limit, leaves no cgroup,
//! process or work folder behind, and the runner goes on running other jobs. Once with the
//! cgroups this machine allows (as `gantry serve` picks them) and once with rlimits only.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gantry::compute::local::container::ContainerArgs;
use gantry::compute::local::limits::{Cgroups, JobLimits};
use serde_json::{Value, json};

use crate::eventually::{eventually, until};
use crate::harness::{Backend, Gateway, tar_of};

/// Small limits, so no case can take the machine: 1 GiB of memory (the smallest function size),
/// 64 processes, 4 MiB a file, 1 MiB of log.
const PROCESSES: u64 = 64;
const FILE_BYTES: u64 = 4 << 20;
const LOG_BYTES: u64 = 1 << 20;

const MEMORY_HOG: &str = "print('allocating', flush=True)\nhog = b'x' * (3 << 29)\nprint('survived', len(hog))\n";

/// Forks until refused, at most 1,000 times whatever happens; the children sleep.
const FORK_BOMB: &str = r#"
import os, time
children = 0
while True:
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    children += 1
    if children >= 1000:
        raise SystemExit("nothing stopped the fork bomb")
"#;

const BIG_FILE: &str = "with open('big.bin', 'wb') as f:\n    f.write(b'x' * (8 << 20))\n";

/// Prints 64 MiB (64 times the log limit), says so in a file, then waits to be looked at.
const CHATTY: &str = r#"
import os, sys, time
line = "y" * 1023 + "\n"
for _ in range(64 * 1024):
    sys.stdout.write(line)
sys.stdout.flush()
open(os.path.join(os.environ["DATA_PATH"], "printed"), "w").close()
time.sleep(3)
"#;

const HELLO: &str = "print('hello')\n";

async fn upload(gateway: &Gateway, user: &str, title: &str, main: &str, extra: &[(&str, &[u8])]) {
    let mut files: Vec<(&str, &[u8])> = vec![("main.py", main.as_bytes())];
    files.extend_from_slice(extra);
    let reply = gateway
        .post_multipart(
            "/api/v1/programs/upload/",
            user,
            &[("title", title), ("entrypoint", "main.py")],
            &[("artifact", "artifact.tar", &tar_of(&files))],
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.json);
}

async fn run(gateway: &Gateway, user: &str, title: &str) -> String {
    let reply = gateway.post_json("/api/v1/programs/run/", user, json!({"title": title, "arguments": "{}"})).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    reply.json["id"].as_str().unwrap().to_string()
}

fn terminal(job: &Value) -> bool {
    matches!(job["status"].as_str(), Some("SUCCEEDED" | "FAILED" | "STOPPED"))
}

/// The job's final status and the reason its last move gave.
async fn ending(gateway: &Gateway, user: &str, id: &str) -> (String, String) {
    let job = gateway.wait_for_job(user, id, 120, terminal).await;
    let events = gateway.get(&format!("/api/v1/jobs/{id}/events/"), user).await.json;
    let reason = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event_type"] == "STATUS_CHANGE" && e["data"]["status"] == job["status"])
        .find_map(|e| e["data"]["reason"].as_str())
        .unwrap_or_default()
        .to_string();
    // The job's answer says the same (`status_reason`, absent for a success).
    assert_eq!(job.get("status_reason").and_then(Value::as_str).unwrap_or_default(), reason, "{job}");
    (job["status"].as_str().unwrap().to_string(), reason)
}

/// Processes whose working folder or command line is in `folder`.
fn processes_in(folder: &Path) -> Vec<String> {
    let folder = folder.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let cwd = std::fs::read_link(entry.path().join("cwd")).map(|p| p.to_string_lossy().into_owned());
        let cmdline = std::fs::read(entry.path().join("cmdline")).map(|b| String::from_utf8_lossy(&b).into_owned());
        if cwd.is_ok_and(|cwd| cwd.starts_with(&folder)) || cmdline.is_ok_and(|line| line.contains(&folder)) {
            found.push(name);
        }
    }
    found
}

/// Nothing of the job is left: its cgroup folders, its processes, its work folder.
async fn assert_nothing_left(limits: &JobLimits, work_root: &Path, id: &str) {
    let folder = work_root.join(id);
    eventually(&format!("nothing left of job {id}"), Duration::from_secs(20), || async {
        let cgroups: Vec<PathBuf> = limits
            .cgroup_of(id)
            .map(|cgroup| cgroup.folders().iter().filter(|f| f.exists()).cloned().collect())
            .unwrap_or_default();
        let processes = processes_in(&folder);
        if cgroups.is_empty() && processes.is_empty() && !folder.exists() {
            return Ok(());
        }
        Err(format!("cgroups {cgroups:?}, processes {processes:?}, its folder: {}", folder.exists()))
    })
    .await
}

/// No job cgroup at all is left in the runner's folders.
fn job_cgroups(limits: &JobLimits) -> Vec<PathBuf> {
    let parents = match &limits.cgroups {
        Some(Cgroups::V2 { parent }) => vec![parent.clone()],
        Some(Cgroups::V1 { memory, pids }) => vec![memory.clone(), pids.clone()],
        None => Vec::new(),
    };
    parents
        .iter()
        .flat_map(|parent| std::fs::read_dir(parent).into_iter().flatten().flatten())
        .map(|entry| entry.path())
        .filter(|path| path.file_name().is_some_and(|name| name.to_string_lossy().starts_with("job-")))
        .collect()
}

async fn gateway_with(limits: &JobLimits) -> Gateway {
    let containers = ContainerArgs { memory_gib_per_job: 1, ..ContainerArgs::default() }.engine().await;
    let limits = limits.clone();
    Gateway::start(Backend::SqliteLocal)
        .await
        .with_runner(move |config| {
            config.job_limits = limits;
            config.containers = containers;
            config.logs_size_limit = LOG_BYTES;
        })
        .await
}

/// The table: every case at once (one user each), then a plain job.
async fn limit_endings(limits: JobLimits, gateway: Gateway) {
    let work_root = gateway.data_dir().join("jobs");
    let cases: [(&str, &str, &str, &str); 4] = [
        ("hog", MEMORY_HOG, "FAILED", "out of memory (limit 1024 MiB): run it with a larger function size"),
        ("bomb", FORK_BOMB, "FAILED", "process limit reached (limit 64 processes)"),
        ("writer", BIG_FILE, "FAILED", "file size limit reached (limit 4 MiB)"),
        ("chatty", CHATTY, "SUCCEEDED", ""),
    ];
    let mut ids = Vec::new();
    for (title, main, _, _) in cases {
        upload(&gateway, title, title, main, &[]).await;
        ids.push(run(&gateway, title, title).await);
    }

    // While the chatty job runs: its launcher.log and live log stay within the log limit.
    let chatty = work_root.join(&ids[3]);
    until("the chatty job finished printing", Duration::from_secs(120), || async {
        chatty.join("data/printed").exists()
    })
    .await;
    let size = |name: &str| std::fs::metadata(chatty.join(name)).map(|m| m.len()).unwrap_or(0);
    eventually("launcher.log got the job's output", Duration::from_secs(30), || async {
        let bytes = size("launcher.log");
        if bytes >= LOG_BYTES { Ok(()) } else { Err(format!("{bytes} bytes")) }
    })
    .await;
    assert!(size("launcher.log") <= LOG_BYTES + 512, "launcher.log holds {} bytes", size("launcher.log"));
    let log = std::fs::read_to_string(chatty.join("launcher.log")).unwrap();
    assert!(log.contains("[gantry: launcher.log stops at its limit of 1048576 bytes"), "{}", &log[log.len() - 300..]);
    // The kept log's bound: its newest lines within the limit, and a line saying older ones went.
    assert!(size("user.log") <= LOG_BYTES + 512, "the live log holds {} bytes", size("user.log"));

    for ((title, _, status, reason), id) in cases.iter().zip(&ids) {
        let (got_status, got_reason) = ending(&gateway, title, id).await;
        assert_eq!(&got_status, status, "{title}: {got_reason}");
        assert!(got_reason.starts_with(reason), "{title}: {got_reason:?} should start with {reason:?}");
        assert_nothing_left(&limits, &work_root, id).await;
    }
    let logs = gateway.get(&format!("/api/v1/jobs/{}/logs/", ids[3]), "chatty").await.json;
    assert!(logs["logs"].as_str().unwrap().len() as u64 <= LOG_BYTES + 512, "the kept log is capped");
    assert!(job_cgroups(&limits).is_empty(), "{:?}", job_cgroups(&limits));

    // The runner goes on.
    upload(&gateway, "alice", "hello", HELLO, &[]).await;
    let id = run(&gateway, "alice", "hello").await;
    assert_eq!(ending(&gateway, "alice", &id).await.0, "SUCCEEDED");
    assert_nothing_left(&limits, &work_root, &id).await;
}

/// Limits with this machine's cgroups where it allows them, in a folder of this test's own.
fn machine_limits() -> JobLimits {
    let name = PathBuf::from(format!("/job-limits-test/{}", uuid::Uuid::new_v4()));
    JobLimits::detect(&name, PROCESSES, FILE_BYTES)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_endings_name_their_limit_with_the_machines_cgroups() {
    let limits = machine_limits();
    if gantry::launcher::isolation::running_as_root() {
        assert!(limits.cgroups.is_some(), "as root on this machine jobs get cgroups: {}", limits.describe());
    }
    let gateway = gateway_with(&limits).await;
    limit_endings(limits, gateway).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_endings_name_their_limit_under_rlimits() {
    let limits = JobLimits::rlimits(PROCESSES, FILE_BYTES);
    let gateway = gateway_with(&limits).await;
    limit_endings(limits, gateway).await;
}

/// A tmpfs mounted on a folder, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The jobs' folder on a 2 MiB disk that is full: a job that cannot be prepared ends FAILED
/// saying so, leaves nothing, and once there is room again jobs run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_on_a_full_disk_ends_saying_so() {
    if !gantry::launcher::isolation::running_as_root() {
        eprintln!("skipped: mounting a small tmpfs needs root");
        return;
    }
    let limits = machine_limits();
    let gateway = Gateway::start(Backend::SqliteLocal).await;
    let work_root = gateway.data_dir().join("jobs");
    std::fs::create_dir_all(&work_root).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m,mode=0711", "tmpfs"])
        .arg(&work_root)
        .status()
        .unwrap();
    assert!(mounted.success(), "mount a tmpfs on {}", work_root.display());
    let _tmpfs = Tmpfs(work_root.clone());
    let gateway = gateway
        .with_runner({
            let limits = limits.clone();
            move |config| config.job_limits = limits
        })
        .await;
    // The artifact (600 KiB) does not fit in what the filler leaves.
    let filler = work_root.join("filler");
    let fill = std::process::Command::new("dd")
        .args(["if=/dev/zero", "bs=64k", "count=28", "status=none"])
        .arg(format!("of={}", filler.display()))
        .status()
        .unwrap();
    assert!(fill.success());
    let ballast = vec![b'b'; 600 * 1024];
    upload(&gateway, "alice", "big", HELLO, &[("ballast.bin", &ballast)]).await;
    let id = run(&gateway, "alice", "big").await;
    let (status, reason) = ending(&gateway, "alice", &id).await;
    assert_eq!(status, "FAILED", "{reason}");
    assert!(reason.starts_with("no space left on device while preparing the job"), "{reason}");
    assert_nothing_left(&limits, &work_root, &id).await;

    std::fs::remove_file(&filler).unwrap();
    let id = run(&gateway, "alice", "big").await;
    let (status, reason) = ending(&gateway, "alice", &id).await;
    assert_eq!(status, "SUCCEEDED", "{reason}");
    assert_nothing_left(&limits, &work_root, &id).await;
}
