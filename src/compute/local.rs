//! The local compute backend of `gantry serve`: admits queued jobs (the pure `admission` rules),
//! starts `gantry launch` as a child process for each, watches it, and moves the job through its
//! lifecycle as its process starts and ends. It also enforces `PROGRAM_TIMEOUT` and, at start,
//! reconciles jobs left in flight by a previous run: a job whose process still runs is adopted,
//! one whose process is gone ends with an event that says why.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::Notify;

use super::{Compute, StopOutcome, admit_queued, count_in, move_job, move_job_now, stop_without_process};
use crate::db::{self, Db, jobs};
use crate::domain::admission::{Capacity, Limits};
use crate::domain::lifecycle::{JobStatus, Trigger};
use crate::domain::runtime_env::{JobEnvironmentInput, job_environment};
use crate::events::Publisher;
use crate::storage::access::JobAccess;
use crate::storage::{Storage, keys};

/// Settings of the local runner.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// The `gantry` executable that provides `gantry launch`.
    pub launcher: PathBuf,
    /// Interpreter for `python <entrypoint>`.
    pub python: String,
    /// Working folders of running jobs.
    pub work_root: PathBuf,
    /// Base URL jobs call back to.
    pub gateway_host: String,
    pub limits: Limits,
    /// `PROGRAM_TIMEOUT`.
    pub timeout: Duration,
    /// `FUNCTIONS_LOGS_SIZE_LIMIT`.
    pub logs_size_limit: u64,
    /// How often the runner looks at the queue without being woken.
    pub tick: Duration,
    /// `QISKIT_IBM_URL` for the job environment.
    pub qiskit_ibm_url: String,
    /// Flags and environment that let `gantry launch` open the same object storage (a local
    /// directory; with S3 the launcher gets presigned URLs instead, never credentials).
    pub storage_args: Vec<String>,
    pub storage_env: Vec<(String, String)>,
    /// Opens the caller's token sealed in the job row.
    pub tokens: crate::secrets::TokenCipher,
    /// Confine each job (`None`: jobs run unconfined, as the server's user).
    pub isolation: Option<crate::launcher::isolation::JobIsolation>,
}

/// The local runner. Cheap to share; `run` drives it.
pub struct LocalRunner {
    db: Db,
    storage: Storage,
    config: RunnerConfig,
    publisher: Arc<dyn Publisher>,
    /// Launcher process ids by job id, for jobs this process is watching.
    processes: Mutex<HashMap<String, u32>>,
    /// Jobs stopped by the timeout, so their end is recorded as such.
    timed_out: Mutex<HashSet<String>>,
    wake: Notify,
}

/// Longest validity of a presigned URL (S3's limit).
const MAX_ACCESS: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long a launcher told to stop may take before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(15);

/// Variables passed through from the gateway's own environment to jobs; everything else is
/// cleared so no server secret reaches user code.
const PASSED_THROUGH: [&str; 8] =
    ["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"];

impl LocalRunner {
    pub fn new(db: Db, storage: Storage, config: RunnerConfig, publisher: Arc<dyn Publisher>) -> Arc<LocalRunner> {
        Arc::new(LocalRunner {
            db,
            storage,
            config,
            publisher,
            processes: Mutex::new(HashMap::new()),
            timed_out: Mutex::new(HashSet::new()),
            wake: Notify::new(),
        })
    }

    /// The live log file of a running job.
    fn live_log_path(&self, job_id: &str, provider: bool) -> PathBuf {
        let name = if provider { crate::launcher::LIVE_PROVIDER_LOG } else { crate::launcher::LIVE_USER_LOG };
        self.config.work_root.join(job_id).join(name)
    }

    /// Reconciles what a previous run left, then schedules until the process ends.
    pub async fn run(self: Arc<Self>) {
        if let Err(error) = self.adopt_or_finish_in_flight().await {
            tracing::error!(error = &error as &dyn std::error::Error, "failed to reconcile jobs left in flight");
        }
        loop {
            if let Err(error) = self.tick().await {
                tracing::error!(error = &error as &dyn std::error::Error, "scheduling pass failed");
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(self.config.tick) => {}
            }
        }
    }

    /// One pass: time out, then admit and launch.
    pub async fn tick(self: &Arc<Self>) -> Result<(), db::Error> {
        let in_flight = jobs::in_flight(&self.db).await?;
        let now = db::now_micros();
        let timeout_micros = i64::try_from(self.config.timeout.as_micros()).unwrap_or(i64::MAX);
        let mut capacity = Capacity::default();
        for job in &in_flight {
            if now.saturating_sub(job.last_activity) > timeout_micros {
                // Once per job: its launcher may take a moment to end.
                if !self.timed_out.lock().expect("lock").insert(job.id.clone()) {
                    continue;
                }
                tracing::warn!(job.id = %job.id, timeout_seconds = self.config.timeout.as_secs(), "job exceeded PROGRAM_TIMEOUT; stopping it");
                if !self.terminate(&job.id) {
                    // Nothing of ours runs it: record the timeout directly.
                    self.timed_out.lock().expect("lock").remove(&job.id);
                    move_job(&self.db, &self.publisher, &job.id, job.status(), &Trigger::TimedOut).await?;
                }
                continue;
            }
            count_in(&mut capacity, job);
        }
        admit_queued(&self.db, &self.publisher, &capacity, self.config.limits, |job_id| {
            let runner = Arc::clone(self);
            tokio::spawn(async move { runner.launch(job_id).await });
        })
        .await?;
        Ok(())
    }

    async fn fail_launch(&self, job_id: &str, reason: String) {
        tracing::warn!(job.id = %job_id, reason = %reason, "job could not be started");
        if let Err(error) = move_job_now(&self.db, &self.publisher, job_id, &Trigger::LaunchFailed { reason }).await {
            tracing::error!(error = &error as &dyn std::error::Error, "failed to record a launch failure");
        }
    }

    /// Starts `gantry launch` for an admitted (PENDING) job and watches it.
    async fn launch(self: Arc<Self>, job_id: String) {
        let child = match self.spawn_launcher(&job_id).await {
            Ok(child) => child,
            Err(reason) => return self.fail_launch(&job_id, reason).await,
        };
        let pid = child.id().unwrap_or_default();
        self.processes.lock().expect("lock").insert(job_id.clone(), pid);
        if let Err(error) = jobs::set_backend_ref(&self.db, &job_id, Some(&format!("pid:{pid}"))).await {
            tracing::warn!(error = &error as &dyn std::error::Error, "failed to record the launcher pid");
        }
        match move_job(&self.db, &self.publisher, &job_id, JobStatus::Pending, &Trigger::Started).await {
            Ok(_) => {}
            Err(error) => tracing::error!(error = &error as &dyn std::error::Error, "failed to record a job start"),
        }
        // A stop that arrived while the process was being started.
        if matches!(jobs::find(&self.db, &job_id).await, Ok(Some(job)) if job.stop_requested) {
            self.terminate(&job_id);
        }
        self.watch(job_id, child).await;
    }

    async fn spawn_launcher(&self, job_id: &str) -> Result<tokio::process::Child, String> {
        let job = jobs::find(&self.db, job_id)
            .await
            .map_err(|e| format!("failed to load the job: {e}"))?
            .ok_or("the job disappeared")?;
        let info = jobs::launch_info(&self.db, job_id)
            .await
            .map_err(|e| format!("failed to load the job: {e}"))?
            .ok_or("the job disappeared")?;
        let (Some(artifact_key), Some(entrypoint)) = (info.artifact_key.clone(), info.entrypoint.clone()) else {
            return Err(
                "the function has no artifact to run (container-image functions need the Kubernetes backend)".into()
            );
        };
        let work_dir = self.config.work_root.join(job_id);
        tokio::fs::create_dir_all(&work_dir)
            .await
            .map_err(|e| format!("failed to create {}: {e}", work_dir.display()))?;
        let arguments_file = work_dir.join("arguments.json");
        tokio::fs::write(&arguments_file, &info.arguments)
            .await
            .map_err(|e| format!("failed to write the arguments: {e}"))?;
        let title = job.program_title.clone().unwrap_or_default();
        let data_key = keys::user_files(&job.author_name, job.provider_name.as_deref().map(|p| (p, title.as_str())));
        // The launcher mirrors the area into the job's own folder (`--data-key`): the job never
        // reaches the storage itself.
        let data_path = work_dir.join("data");
        tokio::fs::create_dir_all(&data_path)
            .await
            .map_err(|e| format!("failed to create {}: {e}", data_path.display()))?;
        let request_env: Map<String, Value> = serde_json::from_str(&info.env_vars).unwrap_or_default();
        let function_env: Map<String, Value> =
            info.function_env_vars.as_deref().and_then(|t| serde_json::from_str(t).ok()).unwrap_or_default();
        let text = |key: &str| request_env.get(key).and_then(Value::as_str).map(str::to_string);
        let token = match text("token") {
            Some(sealed) => self.config.tokens.open(&sealed).map_err(|e| e.to_string())?,
            None => String::new(),
        };
        let channel = text("channel").unwrap_or_else(|| "local".into());
        let instance = text("instance");
        let data_path_text = data_path.to_string_lossy().into_owned();
        let environment = job_environment(&JobEnvironmentInput {
            job_id,
            gateway_host: &self.config.gateway_host,
            token: &token,
            channel: &channel,
            instance: instance.as_deref(),
            trial: info.trial,
            data_path: &data_path_text,
            function_size: job.function_size.as_deref(),
            qiskit_ibm_url: &self.config.qiskit_ibm_url,
            function_env: &function_env,
        });
        let log = std::fs::File::create(work_dir.join("launcher.log"))
            .map_err(|e| format!("failed to create the launcher log: {e}"))?;
        let log_err = log.try_clone().map_err(|e| format!("failed to create the launcher log: {e}"))?;
        let mut command = tokio::process::Command::new(&self.config.launcher);
        command
            .arg("launch")
            .arg("--job-id")
            .arg(job_id)
            .arg("--work-dir")
            .arg(&work_dir)
            .arg("--artifact-key")
            .arg(&artifact_key)
            .arg("--entrypoint")
            .arg(&entrypoint)
            .arg("--python")
            .arg(&self.config.python)
            .arg("--arguments-file")
            .arg(&arguments_file)
            .arg("--logs-size-limit")
            .arg(self.config.logs_size_limit.to_string())
            .args(&self.config.storage_args)
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .kill_on_drop(false);
        if job.provider_id.is_some() {
            command.arg("--provider-function");
        }
        match &self.storage {
            Storage::Local { .. } => {
                command.arg("--data-key").arg(&data_key);
            }
            Storage::S3 { .. } => {
                // As a pod: presigned URLs of the job's own objects and the gateway's files API
                // with the job's token; the launcher holds no storage credentials.
                let valid_for = (self.config.timeout + Duration::from_secs(3600)).min(MAX_ACCESS);
                let access = JobAccess::presign(&self.storage, job_id, Some(&artifact_key), valid_for)
                    .await
                    .map_err(|e| format!("failed to prepare the job's storage access: {e}"))?;
                command.env("GANTRY_JOB_ACCESS", serde_json::to_string(&access).expect("job access serializes"));
                command.arg("--data-function").arg(&title);
                if let Some(provider) = &job.provider_name {
                    command.arg("--data-provider").arg(provider);
                }
            }
        }
        if let Some(isolation) = &self.config.isolation {
            command.args(isolation.launcher_args());
        }
        for key in PASSED_THROUGH {
            if let Ok(value) = std::env::var(key) {
                command.env(key, value);
            }
        }
        command.envs(self.config.storage_env.iter().map(|(k, v)| (k, v)));
        command.envs(environment);
        command.spawn().map_err(|e| format!("failed to start {}: {e}", self.config.launcher.display()))
    }

    async fn watch(&self, job_id: String, mut child: tokio::process::Child) {
        let status = child.wait().await;
        let code = status.ok().and_then(|s| s.code());
        self.processes.lock().expect("lock").remove(&job_id);
        self.finish(&job_id, code).await;
    }

    /// Records the end of a job's process from the launcher's exit record.
    async fn finish(&self, job_id: &str, launcher_code: Option<i32>) {
        let timed_out = self.timed_out.lock().expect("lock").remove(job_id);
        let record = match self.storage.read_to_bytes(&keys::job_exit(job_id)).await {
            Ok(bytes) => bytes.and_then(|b| serde_json::from_slice::<Value>(&b).ok()),
            Err(error) => {
                tracing::warn!(error = &error as &dyn std::error::Error, "failed to read a job's exit record");
                None
            }
        };
        let stop_requested = matches!(jobs::find(&self.db, job_id).await, Ok(Some(job)) if job.stop_requested);
        let trigger = if stop_requested {
            Trigger::StopRequested
        } else if timed_out {
            Trigger::TimedOut
        } else {
            match &record {
                Some(record) => {
                    Trigger::Exited { success: record["exit_code"].as_i64() == Some(0) && record["error"].is_null() }
                }
                None => Trigger::Lost {
                    reason: match launcher_code {
                        Some(code) => {
                            format!("the launcher exited with code {code} without reporting how the job ended")
                        }
                        None => "the job's process was gone and had not reported how the job ended".into(),
                    },
                },
            }
        };
        if let Err(error) = move_job_now(&self.db, &self.publisher, job_id, &trigger).await {
            tracing::error!(error = &error as &dyn std::error::Error, "failed to record the end of a job");
        }
        let work_dir = self.config.work_root.join(job_id);
        if let Err(error) = tokio::fs::remove_dir_all(&work_dir).await {
            tracing::debug!(error = &error as &dyn std::error::Error, "could not remove a job's work folder");
        }
    }

    /// Sends a signal to the launcher of a job watched here or adopted; false when none runs.
    fn signal(&self, job_id: &str, signal: i32) -> bool {
        let Some(pid) = self.processes.lock().expect("lock").get(job_id).copied() else {
            return false;
        };
        let Ok(pid) = i32::try_from(pid) else { return false };
        // SAFETY: kill(2) with a pid we started; no memory is involved.
        unsafe { libc::kill(pid, signal) == 0 }
    }

    /// Delivers a stop: a queued job stops at once; a running one has its launcher told to stop
    /// (it kills the job's process group and archives the logs), and its end is recorded as
    /// STOPPED by the watcher.
    async fn request_stop(self: &Arc<Self>, job_id: &str) -> Result<StopOutcome, db::Error> {
        let outcome = stop_without_process(&self.db, &self.publisher, job_id).await?;
        if outcome == StopOutcome::Requested {
            self.terminate(job_id);
        }
        Ok(outcome)
    }

    /// Asks a job's launcher to stop (it kills the job's process group and archives the logs),
    /// and kills the launcher if it is still there after its grace period. False when no
    /// launcher of ours runs the job.
    fn terminate(self: &Arc<Self>, job_id: &str) -> bool {
        let Some(pid) = self.processes.lock().expect("lock").get(job_id).copied() else {
            return false;
        };
        if !self.signal(job_id, libc::SIGTERM) {
            return false;
        }
        let runner = Arc::clone(self);
        let job_id = job_id.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(STOP_GRACE).await;
            // Only the same launcher: its pid may have been reused once it ended.
            if runner.processes.lock().expect("lock").get(&job_id) == Some(&pid) {
                runner.signal(&job_id, libc::SIGKILL);
            }
        });
        true
    }

    /// Jobs left PENDING or RUNNING by a previous run: adopt live launchers, finish the rest.
    async fn adopt_or_finish_in_flight(self: &Arc<Self>) -> Result<(), db::Error> {
        for job in jobs::in_flight(&self.db).await? {
            if self.processes.lock().expect("lock").contains_key(&job.id) {
                continue;
            }
            let pid =
                job.backend_ref.as_deref().and_then(|r| r.strip_prefix("pid:")).and_then(|p| p.parse::<u32>().ok());
            match pid.filter(|pid| launcher_alive(*pid, &job.id)) {
                Some(pid) => {
                    tracing::info!(job.id = %job.id, pid, "adopting a job still running from a previous run");
                    self.processes.lock().expect("lock").insert(job.id.clone(), pid);
                    let runner = Arc::clone(self);
                    tokio::spawn(async move {
                        while launcher_alive(pid, &job.id) {
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                        runner.processes.lock().expect("lock").remove(&job.id);
                        runner.finish(&job.id, None).await;
                    });
                }
                None => {
                    tracing::warn!(job.id = %job.id, "job was left in flight and its process is gone");
                    self.finish(&job.id, None).await;
                }
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Compute for LocalRunner {
    /// Local processes run artifacts; images need a container runtime.
    fn runs_images(&self) -> bool {
        false
    }

    /// Asks for a scheduling pass now.
    async fn submit(self: Arc<Self>, _job_id: &str) {
        self.wake.notify_one();
    }

    async fn stop(self: Arc<Self>, job_id: &str) -> Result<StopOutcome, db::Error> {
        self.request_stop(job_id).await
    }

    /// The launcher's live copy of the log in the job's work folder.
    async fn live_log(self: Arc<Self>, job_id: &str, provider: bool) -> Option<String> {
        tokio::fs::read_to_string(self.live_log_path(job_id, provider)).await.ok()
    }

    async fn live_log_since(
        self: Arc<Self>,
        job_id: &str,
        provider: bool,
        offset: u64,
        limit: usize,
    ) -> Option<bytes::Bytes> {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        let mut file = tokio::fs::File::open(self.live_log_path(job_id, provider)).await.ok()?;
        file.seek(std::io::SeekFrom::Start(offset)).await.ok()?;
        let mut bytes = Vec::new();
        file.take(limit as u64).read_to_end(&mut bytes).await.ok()?;
        Some(bytes.into())
    }

    async fn reconcile(self: Arc<Self>) -> Result<(), db::Error> {
        self.adopt_or_finish_in_flight().await
    }
}

/// Whether `pid` is a live `gantry launch` of this job (its command line names the job).
fn launcher_alive(pid: u32, job_id: &str) -> bool {
    let cmdline = Path::new("/proc").join(pid.to_string()).join("cmdline");
    match std::fs::read(cmdline) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            text.contains("launch") && text.contains(job_id) && !is_zombie(pid)
        }
        Err(_) => false,
    }
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit(')').next().map(|rest| rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}
