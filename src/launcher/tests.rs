//! The launcher run for real: artifacts unpacked, functions run, stopped and archived.

use super::*;
use crate::domain::logs::missing_client_hint;
use crate::storage::{Storage, keys};
use bytes::Bytes;
use std::time::Instant;

const JOB_ID: &str = "job-1";
const ARTIFACT_KEY: &str = "artifacts/fn/upload.tar";

/// A temporary root holding the storage, the job's work dir and its data folder.
struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    storage: Storage,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let storage = Storage::local(root.join("objects"));
        Self { _dir: dir, root, storage }
    }

    async fn put_artifact(&self, tar: Vec<u8>) {
        self.storage.put_bytes(ARTIFACT_KEY, Bytes::from(tar)).await.unwrap();
    }

    fn arguments_path(&self) -> PathBuf {
        self.root.join("data/arguments").join(format!("{JOB_ID}.json"))
    }

    fn results_path(&self) -> PathBuf {
        self.root.join("data/results").join(format!("{JOB_ID}.json"))
    }

    fn work_dir(&self) -> PathBuf {
        self.root.join("jobs/work")
    }

    fn launch(&self, provider_function: bool) -> Launch {
        let arguments_file = self.root.join("arguments.txt");
        std::fs::write(&arguments_file, r#"{"a": 40}"#).unwrap();
        let variable = |name: &str, value: &OsStr| (OsString::from(name), value.to_owned());
        Launch {
            job: JobSettings {
                job_id: JOB_ID.into(),
                work_dir: self.work_dir(),
                artifact_key: Some(ARTIFACT_KEY.into()),
                code_dir: None,
                entrypoint: "main.py".into(),
                python: "python3".into(),
                arguments_file: Some(arguments_file),
                provider_function,
                logs_size_limit: 4096,
                max_unpacked_mib: crate::artifact::DEFAULT_MAX_UNPACKED_MIB,
                data_key: None,
                termination_log: None,
                data_function: None,
                data_provider: None,
            },
            isolation: None,
            limits: Default::default(),
            environment: vec![
                variable("PATH", &std::env::var_os("PATH").unwrap_or_default()),
                variable("ARGUMENTS_PATH", self.arguments_path().as_os_str()),
                variable("RESULTS_PATH", self.results_path().as_os_str()),
                variable("ENV_JOB_ID_GATEWAY", OsStr::new(JOB_ID)),
                variable("GANTRY_STORAGE", OsStr::new("/somewhere")),
                variable("AWS_SECRET_ACCESS_KEY", OsStr::new("hunter2")),
                variable("FUNCTIONS_LOGS_SIZE_LIMIT", OsStr::new("10")),
            ],
        }
    }

    async fn object(&self, key: &str) -> Option<String> {
        self.storage.read_to_bytes(key).await.unwrap().map(|bytes| String::from_utf8(bytes.to_vec()).unwrap())
    }

    /// The exit record without what the function's processes used (this test process's
    /// children so far: `the_exit_record_says_what_the_function_used`).
    async fn exit_record(&self) -> serde_json::Value {
        let mut record = self.full_exit_record().await;
        for measured in ["cpu_used_ms", "memory_peak_bytes"] {
            record.as_object_mut().unwrap().remove(measured);
        }
        record
    }

    async fn full_exit_record(&self) -> serde_json::Value {
        let text = self.object(&keys::job_exit(JOB_ID)).await.unwrap();
        serde_json::from_str(&text).unwrap()
    }
}

fn tar_of(files: &[(&str, &str)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, contents) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(contents.len() as u64);
        header.set_mode(0o644);
        builder.append_data(&mut header, path, contents.as_bytes()).unwrap();
    }
    builder.into_inner().unwrap()
}

/// A tar whose only member is named `name`, written byte by byte (the tar crate refuses
/// unsafe names).
fn raw_tar(name: &[u8], entry_type: tar::EntryType, link: &[u8]) -> Vec<u8> {
    let mut header = tar::Header::new_old();
    header.as_old_mut().name[..name.len()].copy_from_slice(name);
    header.as_old_mut().linkname[..link.len()].copy_from_slice(link);
    header.set_size(0);
    header.set_mode(0o644);
    header.set_entry_type(entry_type);
    header.set_cksum();
    let mut bytes = header.as_bytes().to_vec();
    bytes.extend_from_slice(&[0u8; 1024]);
    bytes
}

const WORKING_SCRIPT: &str = r#"
import json, os, sys
import pkg.mod
assert "GANTRY_STORAGE" not in os.environ
assert "AWS_SECRET_ACCESS_KEY" not in os.environ
assert "FUNCTIONS_LOGS_SIZE_LIMIT" not in os.environ
assert os.environ["ENV_JOB_ID_GATEWAY"] == "job-1"
print("hello from stdout")
print("[PUBLIC] hi", file=sys.stderr)
print("[PRIVATE] secret", file=sys.stderr)
with open(os.environ["ARGUMENTS_PATH"]) as f:
    arguments = json.load(f)
with open(os.environ["RESULTS_PATH"], "w") as f:
    json.dump({"sum": arguments["a"] + pkg.mod.VALUE}, f)
sys.stdout.write("no newline at the end")
"#;

fn working_artifact() -> Vec<u8> {
    tar_of(&[("main.py", WORKING_SCRIPT), ("pkg/__init__.py", ""), ("pkg/mod.py", "VALUE = 2\n")])
}

fn sorted_lines(text: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    lines
}

async fn wait_for_pid(log: &Path) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = tokio::fs::read_to_string(log).await.unwrap_or_default();
        if let Some(pid) = text.lines().find_map(|line| line.strip_prefix("pid ")).and_then(|pid| pid.parse().ok()) {
            return pid;
        }
        assert!(Instant::now() < deadline, "the job never reported its pid");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether the process group disappears within a few seconds (its killed members are
/// reaped by init, asynchronously).
async fn group_disappears(group: i32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // SAFETY: signal 0 only checks that the group exists.
        let result = unsafe { libc::kill(-group, 0) };
        if result == -1 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_user_function_runs_and_ships_result_logs_and_exit_record() {
    let fixture = Fixture::new();
    fixture.put_artifact(working_artifact()).await;
    std::fs::create_dir_all(fixture.results_path().parent().unwrap()).unwrap();
    std::fs::write(fixture.results_path(), "stale").unwrap();

    let code = run_job(&fixture.launch(false), &fixture.storage, std::future::pending()).await;

    assert_eq!(code, 0);
    assert_eq!(std::fs::read_to_string(fixture.arguments_path()).unwrap(), r#"{"a": 40}"#);
    assert_eq!(fixture.object(&keys::job_result(JOB_ID)).await.unwrap(), r#"{"sum": 42}"#);
    let user_log = fixture.object(&keys::job_user_log(JOB_ID)).await.unwrap();
    assert_eq!(sorted_lines(&user_log), ["hello from stdout", "hi", "no newline at the end", "secret"]);
    assert!(user_log.ends_with('\n'));
    assert_eq!(std::fs::read_to_string(fixture.work_dir().join(LIVE_USER_LOG)).unwrap(), user_log);
    assert_eq!(fixture.object(&keys::job_provider_log(JOB_ID)).await, None);
    assert_eq!(
        fixture.exit_record().await,
        serde_json::json!({"exit_code": 0, "signal": null, "error": null, "limit": null, "exception": null})
    );
}

/// The exit record says what the function's processes used once it ran: CPU time and the
/// largest resident set (the launcher's waited-for children; in this test process they add up
/// over the tests, so only what this function used is a lower bound).
#[tokio::test]
async fn the_exit_record_says_what_the_function_used() {
    let fixture = Fixture::new();
    let script = "import time\nblock = bytearray(64 << 20)\nfor i in range(0, len(block), 4096): block[i] = 1\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n";
    fixture.put_artifact(tar_of(&[("main.py", script)])).await;

    assert_eq!(run_job(&fixture.launch(false), &fixture.storage, std::future::pending()).await, 0);

    let record = fixture.full_exit_record().await;
    assert!(record["cpu_used_ms"].as_i64().unwrap() >= 300, "{record}");
    assert!(record["memory_peak_bytes"].as_i64().unwrap() >= 64 << 20, "{record}");
}

/// Landlock alone (the tests may run as root, which no file permission stops): the job
/// reads its own code but not a file beside its work folder, nor the launcher's live log.
#[tokio::test]
async fn an_isolated_job_reaches_only_its_own_folders() {
    let fixture = Fixture::new();
    std::fs::write(fixture.root.join("secret.txt"), "server secret").unwrap();
    let script = format!(
        "import os\n\
         def attempt(action):\n\
         \x20   try:\n\
         \x20       action()\n\
         \x20       return 'allowed'\n\
         \x20   except Exception as error:\n\
         \x20       return type(error).__name__\n\
         print('own code', attempt(lambda: open('main.py').read()))\n\
         print('secret', attempt(lambda: open({secret:?}).read()))\n\
         print('launcher log', attempt(lambda: open({log:?}).read()))\n\
         print('work folder', attempt(lambda: os.listdir({work:?})))\n\
         print('tmp', attempt(lambda: open(os.path.join(os.environ['TMPDIR'], 'x'), 'w').write('x')))\n",
        secret = fixture.root.join("secret.txt").display().to_string(),
        log = fixture.work_dir().join(LIVE_USER_LOG).display().to_string(),
        work = fixture.work_dir().display().to_string(),
    );
    fixture.put_artifact(tar_of(&[("main.py", &script)])).await;
    let mut launch = fixture.launch(false);
    launch.job.python = std::env::var("GANTRY_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    launch.isolation = Some(JobIsolation { user: None, readable: Vec::new(), devices: Vec::new() });
    launch.environment.retain(|(name, _)| name != "ARGUMENTS_PATH" && name != "RESULTS_PATH");

    let code = run_job(&launch, &fixture.storage, std::future::pending()).await;

    let log = fixture.object(&keys::job_user_log(JOB_ID)).await.unwrap();
    assert_eq!(code, 0, "{log}");
    assert_eq!(
        sorted_lines(&log),
        [
            "launcher log PermissionError",
            "own code allowed",
            "secret PermissionError",
            "tmp allowed",
            "work folder PermissionError"
        ],
        "{log}"
    );
}

#[tokio::test]
async fn a_provider_function_splits_its_logs() {
    let fixture = Fixture::new();
    fixture.put_artifact(working_artifact()).await;

    let code = run_job(&fixture.launch(true), &fixture.storage, std::future::pending()).await;

    assert_eq!(code, 0);
    assert_eq!(fixture.object(&keys::job_user_log(JOB_ID)).await.unwrap(), "hi\n");
    let provider_log = fixture.object(&keys::job_provider_log(JOB_ID)).await.unwrap();
    assert_eq!(sorted_lines(&provider_log), ["hello from stdout", "no newline at the end", "secret"]);
    assert_eq!(std::fs::read_to_string(fixture.work_dir().join(LIVE_PROVIDER_LOG)).unwrap(), provider_log);
    assert_eq!(fixture.object(&keys::job_result(JOB_ID)).await.unwrap(), r#"{"sum": 42}"#);
}

#[tokio::test]
async fn a_failing_function_records_its_exit_code_and_no_stale_result() {
    let fixture = Fixture::new();
    let script = "import sys\nprint('[PUBLIC] giving up', file=sys.stderr)\nsys.exit(3)\n";
    fixture.put_artifact(tar_of(&[("main.py", script)])).await;
    std::fs::create_dir_all(fixture.results_path().parent().unwrap()).unwrap();
    std::fs::write(fixture.results_path(), "stale").unwrap();

    let code = run_job(&fixture.launch(false), &fixture.storage, std::future::pending()).await;

    assert_eq!(code, 3);
    assert_eq!(
        fixture.exit_record().await,
        serde_json::json!({"exit_code": 3, "signal": null, "error": null, "limit": null, "exception": null})
    );
    assert_eq!(fixture.object(&keys::job_user_log(JOB_ID)).await.unwrap(), "giving up\n");
    assert_eq!(fixture.object(&keys::job_result(JOB_ID)).await, None);
}

#[tokio::test]
async fn a_python_failure_records_its_exception_line_and_logs_relative_paths() {
    let fixture = Fixture::new();
    let helper = "def divide():\n    return 1 / 0\n";
    let script = "print('dividing', flush=True)\nimport helper\nhelper.divide()\n";
    fixture.put_artifact(tar_of(&[("main.py", script), ("helper.py", helper)])).await;
    let termination_log = fixture.root.join("termination-log");
    let mut launch = fixture.launch(false);
    launch.job.termination_log = Some(termination_log.clone());

    assert_eq!(run_job(&launch, &fixture.storage, std::future::pending()).await, 1);

    let exception = "ZeroDivisionError: division by zero";
    assert_eq!(
        fixture.exit_record().await,
        serde_json::json!({"exit_code": 1, "signal": null, "error": null, "limit": null, "exception": exception})
    );
    assert_eq!(std::fs::read_to_string(&termination_log).unwrap(), exception);
    let log = fixture.object(&keys::job_user_log(JOB_ID)).await.unwrap();
    assert!(log.contains("File \"main.py\", line 3, in <module>"), "{log}");
    assert!(log.contains("File \"helper.py\", line 2, in divide"), "{log}");
    assert!(!log.contains(&*fixture.work_dir().to_string_lossy()), "a server path in the log: {log}");
}

#[test]
fn the_launcher_places_a_copy_of_itself() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let destination = dir.path().join("gantry");
    place_launcher(&destination).unwrap();
    let placed = std::fs::metadata(&destination).unwrap();
    let running = std::fs::metadata(std::env::current_exe().unwrap()).unwrap();
    assert_eq!(placed.len(), running.len());
    assert_eq!(placed.permissions().mode() & 0o777, 0o755);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no staging file left");
}

#[tokio::test]
async fn a_job_failing_on_a_missing_client_gets_the_hint_in_its_log() {
    let fixture = Fixture::new();
    let script = "raise ModuleNotFoundError(\"No module named 'qiskit_serverless'\")\n";
    fixture.put_artifact(tar_of(&[("main.py", script)])).await;

    let code = run_job(&fixture.launch(true), &fixture.storage, std::future::pending()).await;

    assert_eq!(code, 1);
    let user_log = fixture.object(&keys::job_user_log(JOB_ID)).await.unwrap();
    let hint = format!("gantry launch: hint: {}\n", missing_client_hint("python3"));
    assert!(user_log.ends_with(&hint), "{user_log}");
    let provider_log = fixture.object(&keys::job_provider_log(JOB_ID)).await.unwrap();
    assert!(provider_log.contains("ModuleNotFoundError") && provider_log.ends_with(&hint), "{provider_log}");
}

#[tokio::test]
async fn symlinks_inside_the_artifact_are_created() {
    let fixture = Fixture::new();
    let mut builder = tar::Builder::new(Vec::new());
    for (path, contents) in [
        ("main.py", "import pkg.alias\nprint(pkg.alias.VALUE)\n"),
        ("pkg/__init__.py", ""),
        ("pkg/mod.py", "VALUE = 7\n"),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_size(contents.len() as u64);
        header.set_mode(0o644);
        builder.append_data(&mut header, path, contents.as_bytes()).unwrap();
    }
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Symlink);
    header.set_size(0);
    builder.append_link(&mut header, "pkg/alias.py", "mod.py").unwrap();
    fixture.put_artifact(builder.into_inner().unwrap()).await;

    let code = run_job(&fixture.launch(false), &fixture.storage, std::future::pending()).await;

    assert_eq!(code, 0);
    assert_eq!(fixture.object(&keys::job_user_log(JOB_ID)).await.unwrap(), "7\n");
}

async fn assert_not_started(fixture: &Fixture, launch: &Launch, reason: &str) {
    let code = run_job(launch, &fixture.storage, std::future::pending()).await;
    assert_eq!(code, EXIT_NOT_STARTED);
    let record = fixture.exit_record().await;
    assert_eq!(record["exit_code"], serde_json::Value::Null);
    assert_eq!(record["signal"], serde_json::Value::Null);
    let error = record["error"].as_str().unwrap();
    assert!(error.contains(reason), "{error}");
    let user_log = fixture.object(&keys::job_user_log(JOB_ID)).await.unwrap();
    assert_eq!(user_log, format!("gantry launch: {error}\n"));
    assert_eq!(fixture.object(&keys::job_result(JOB_ID)).await, None);
}

#[tokio::test]
async fn an_escaping_member_is_refused_and_nothing_lands_outside() {
    let fixture = Fixture::new();
    fixture.put_artifact(raw_tar(b"../evil", tar::EntryType::Regular, b"")).await;

    assert_not_started(&fixture, &fixture.launch(false), "escaping path").await;

    assert!(!fixture.root.join("jobs/evil").exists());
    assert!(!fixture.root.join("evil").exists());
    assert!(!fixture.arguments_path().exists());
}

#[tokio::test]
async fn links_leaving_the_artifact_and_device_files_are_refused() {
    for (tar, reason) in [
        (raw_tar(b"link", tar::EntryType::Symlink, b"../../etc"), "links outside"),
        (raw_tar(b"link", tar::EntryType::Link, b"../secret"), "links outside"),
        (raw_tar(b"dev", tar::EntryType::Char, b""), "special file"),
    ] {
        let fixture = Fixture::new();
        fixture.put_artifact(tar).await;
        assert_not_started(&fixture, &fixture.launch(false), reason).await;
        assert!(!fixture.work_dir().join("code/link").exists());
    }
}

/// An artifact stored before the limit: a sparse member declaring 2 GiB fails the job naming
/// the limit, and is never written; under a larger limit the same artifact unpacks.
#[tokio::test]
async fn a_member_past_the_unpacked_limit_fails_the_job_before_it_is_written() {
    let fixture = Fixture::new();
    fixture.put_artifact(crate::artifact::tests::sparse_tar(2 * 1024 * 1024 * 1024)).await;
    let mut launch = fixture.launch(false);
    launch.job.max_unpacked_mib = 512;
    assert_not_started(&fixture, &launch, "more than the limit of 512 MiB (--max-unpacked-mib)").await;
    assert!(fixture.work_dir().join("code/main.py").exists(), "members before it were unpacked");
    assert!(!fixture.work_dir().join("code/holes.bin").exists());
}

#[tokio::test]
async fn no_member_is_written_through_a_link() {
    let fixture = Fixture::new();
    let mut tar = raw_tar(b"pkg", tar::EntryType::Symlink, b"sub");
    tar.truncate(512);
    tar.extend(raw_tar(b"pkg/x.py", tar::EntryType::Regular, b""));
    fixture.put_artifact(tar).await;

    assert_not_started(&fixture, &fixture.launch(false), "folder").await;
    assert!(!fixture.work_dir().join("code/sub/x.py").exists());
}

#[tokio::test]
async fn a_missing_artifact_entrypoint_or_interpreter_is_recorded() {
    let fixture = Fixture::new();
    assert_not_started(&fixture, &fixture.launch(true), "failed to find the artifact").await;
    assert_eq!(
        fixture.object(&keys::job_provider_log(JOB_ID)).await.unwrap(),
        fixture.object(&keys::job_user_log(JOB_ID)).await.unwrap()
    );

    fixture.put_artifact(working_artifact()).await;
    let mut launch = fixture.launch(false);
    launch.job.entrypoint = "../main.py".into();
    assert_not_started(&fixture, &launch, "failed to find the entrypoint").await;
    launch.job.entrypoint = "pkg".into();
    assert_not_started(&fixture, &launch, "failed to find the entrypoint").await;

    let mut launch = fixture.launch(false);
    launch.job.python = "/nonexistent/python".into();
    assert_not_started(&fixture, &launch, "failed to start /nonexistent/python").await;
}

#[tokio::test]
async fn a_stop_kills_the_process_group_and_archives_the_logs() {
    let fixture = Fixture::new();
    let script = "import os, subprocess, time\n\
                  subprocess.Popen(['sleep', '60'])\n\
                  print(f'pid {os.getpid()}')\n\
                  time.sleep(60)\n";
    fixture.put_artifact(tar_of(&[("main.py", script)])).await;
    let (stop_sender, stop_receiver) = tokio::sync::oneshot::channel::<()>();
    let live_log = fixture.work_dir().join(LIVE_USER_LOG);
    let started = Instant::now();

    let stopper = async move {
        let pid = wait_for_pid(&live_log).await;
        stop_sender.send(()).unwrap();
        pid
    };
    let stop = async move {
        let _ = stop_receiver.await;
    };
    let launch = fixture.launch(false);
    let (code, pid) = tokio::join!(run_job(&launch, &fixture.storage, stop), stopper);

    assert_eq!(code, 128 + libc::SIGTERM);
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(group_disappears(pid).await);
    assert_eq!(
        fixture.exit_record().await,
        serde_json::json!({"exit_code": null, "signal": libc::SIGTERM, "error": null, "limit": null, "exception": null})
    );
    assert_eq!(fixture.object(&keys::job_user_log(JOB_ID)).await.unwrap(), format!("pid {pid}\n"));
}

#[tokio::test]
async fn a_job_ignoring_the_stop_is_killed_after_the_grace() {
    let fixture = Fixture::new();
    let script = "import os, signal, time\n\
                  signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
                  print(f'pid {os.getpid()}')\n\
                  time.sleep(60)\n";
    fixture.put_artifact(tar_of(&[("main.py", script)])).await;
    let (stop_sender, stop_receiver) = tokio::sync::oneshot::channel::<()>();
    let live_log = fixture.work_dir().join(LIVE_USER_LOG);

    let stopper = async move {
        let pid = wait_for_pid(&live_log).await;
        stop_sender.send(()).unwrap();
        pid
    };
    let stop = async move {
        let _ = stop_receiver.await;
    };
    let launch = fixture.launch(false);
    let (code, pid) = tokio::join!(run_job(&launch, &fixture.storage, stop), stopper);

    assert_eq!(code, 128 + libc::SIGKILL);
    assert!(group_disappears(pid).await);
    assert_eq!(fixture.exit_record().await["signal"], libc::SIGKILL);
}

#[tokio::test]
async fn processes_left_behind_do_not_hold_the_launch_open() {
    let fixture = Fixture::new();
    let script = "import os, subprocess\n\
                  subprocess.Popen(['sleep', '60'])\n\
                  print(f'pid {os.getpid()}')\n";
    fixture.put_artifact(tar_of(&[("main.py", script)])).await;
    let started = Instant::now();

    let code = run_job(&fixture.launch(false), &fixture.storage, std::future::pending()).await;

    assert_eq!(code, 0);
    assert!(started.elapsed() < Duration::from_secs(15));
    let user_log = fixture.object(&keys::job_user_log(JOB_ID)).await.unwrap();
    let pid = user_log.trim().strip_prefix("pid ").unwrap().parse().unwrap();
    assert!(group_disappears(pid).await);
}

#[tokio::test]
async fn a_stop_before_the_start_is_recorded() {
    let fixture = Fixture::new();
    fixture.put_artifact(working_artifact()).await;
    let code = run_job(&fixture.launch(false), &fixture.storage, async {}).await;
    assert_eq!(code, EXIT_NOT_STARTED);
    assert!(fixture.exit_record().await["error"].as_str().unwrap().contains("stopped"));
}

#[test]
fn the_launcher_settings_are_kept_from_the_job() {
    let environment = child_environment([
        ("GANTRY_STORAGE".into(), "s3://bucket".into()),
        ("AWS_ACCESS_KEY_ID".into(), "key".into()),
        ("AWS_SECRET_ACCESS_KEY".into(), "secret".into()),
        ("AWS_SESSION_TOKEN".into(), "token".into()),
        ("FUNCTIONS_LOGS_SIZE_LIMIT".into(), "10".into()),
        ("ENV_JOB_GATEWAY_TOKEN".into(), "caller".into()),
        ("MY_GANTRY_VAR".into(), "kept".into()),
    ]);
    assert_eq!(
        environment,
        [
            ("ENV_JOB_GATEWAY_TOKEN".into(), "caller".into()),
            ("MY_GANTRY_VAR".into(), "kept".into()),
            ("PYTHONUNBUFFERED".into(), "1".into()),
        ]
    );
    let environment = child_environment([("PYTHONUNBUFFERED".into(), "".into())]);
    assert_eq!(environment, [("PYTHONUNBUFFERED".into(), "".into())]);
}

#[test]
fn the_command_line_reads_the_environment_names_of_the_contract() {
    use clap::{CommandFactory, FromArgMatches};
    #[derive(Debug, clap::Parser)]
    struct Wrapper {
        #[command(flatten)]
        launch: LaunchArgs,
    }
    Wrapper::command().debug_assert();
    let matches = Wrapper::command()
        .try_get_matches_from([
            "launch",
            "--job-id",
            "j",
            "--work-dir",
            "/w",
            "--artifact-key",
            "a.tar",
            "--entrypoint",
            "main.py",
            "--arguments-file",
            "/w/arguments",
            "--provider-function",
            "--storage",
            "/objects",
        ])
        .unwrap();
    let args = Wrapper::from_arg_matches(&matches).unwrap().launch;
    assert!(args.job.provider_function);
    assert_eq!(args.job.python, "python3");
    assert_eq!(args.job.logs_size_limit, 52_428_800);
}
