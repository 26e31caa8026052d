//! The local compute backend of `gantry serve`: admits queued jobs (the pure `admission` rules),
//! starts `gantry launch` as a child process for each, watches it, and moves the job through its
//! lifecycle as its process starts and ends. It also enforces `PROGRAM_TIMEOUT` and, at start,
//! reconciles jobs left in flight by a previous run: a job whose process still runs is adopted,
//! one whose process is gone ends with an event that says why. Jobs of container-image functions
//! run the same launcher inside a container of the provider's image (`container`).

mod adopt;
pub mod container;
pub mod gpus;
pub mod limits;
mod output;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::Notify;

use self::container::{ContainerJob, Engine, OBJECTS_FOLDER, WORK_MOUNT, container_name};

use super::{Capacity, Compute, StopOutcome, admit_queued, move_job, move_job_from, stop_without_process};
use crate::db::jobs::{self, Launch};
use crate::db::{self, Db};
use crate::domain::admission::Limits;
use crate::domain::lifecycle::{JobStatus, Trigger, limit_reason, no_space_reason};
use crate::domain::runtime_env::{JobEnvironmentInput, job_environment};
use crate::domain::sizes::{self, Resources};
use crate::events::Publisher;
use crate::storage::access::JobAccess;
use crate::storage::{Storage, keys};
use crate::telemetry::{self, context};
use tracing::Instrument;

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
    /// Fair sharing's settings (docs/scheduling.md).
    pub fair_share: crate::domain::admission::FairShare,
    /// `PROGRAM_TIMEOUT`.
    pub timeout: Duration,
    /// `FUNCTIONS_LOGS_SIZE_LIMIT`.
    pub logs_size_limit: u64,
    /// `--max-unpacked-mib`: what a job's artifact may unpack to.
    pub max_unpacked_mib: u64,
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
    /// The container engine that runs jobs of container-image functions.
    pub containers: Engine,
    /// Memory, processes and file size of process jobs, and how they are bounded.
    pub job_limits: limits::JobLimits,
    /// The machine's GPUs lent to jobs, and which job holds which.
    pub gpus: Arc<gpus::GpuPool>,
}

/// What runs a job watched here: the launcher as a process, or the job's container.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Running {
    Process(u32),
    Container(String),
}

/// `backend_ref` of a job run by a container.
const CONTAINER_REF: &str = "container:";

/// The local runner. Cheap to share; `run` drives it.
pub struct LocalRunner {
    db: Db,
    storage: Storage,
    config: RunnerConfig,
    publisher: Arc<dyn Publisher>,
    /// What runs each job this process is watching, by job id.
    processes: Mutex<HashMap<String, Running>>,
    /// Jobs stopped by the timeout, so their end is recorded as such.
    timed_out: Mutex<HashSet<String>>,
    wake: Notify,
    /// What admission passes keep between them.
    admission: super::Memory,
}

/// Longest validity of a presigned URL (S3's limit).
const MAX_ACCESS: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long the launcher's output may stay open after it ended (a process it left holding it).
const OUTPUT_GRACE: Duration = Duration::from_secs(5);

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
            publisher,
            processes: Mutex::new(HashMap::new()),
            timed_out: Mutex::new(HashSet::new()),
            wake: Notify::new(),
            admission: super::Memory::new(config.fair_share),
            config,
        })
    }

    /// The live log file of a running job, opened without following links: a job in a
    /// container shares its folder with the launcher and could put a link in its place.
    async fn open_live_log(&self, job_id: &str, provider: bool) -> Option<tokio::fs::File> {
        let name = if provider { crate::launcher::LIVE_PROVIDER_LOG } else { crate::launcher::LIVE_USER_LOG };
        let folder = self.config.work_root.join(job_id);
        let file = tokio::task::spawn_blocking(move || crate::shared::open_beneath(&folder, Path::new(name)))
            .await
            .ok()?
            .ok()?;
        Some(tokio::fs::File::from_std(file))
    }

    /// Reconciles what a previous run left, then schedules until the process ends.
    pub async fn run(self: Arc<Self>) {
        if let Err(error) = self.adopt_or_finish_in_flight().await {
            tracing::error!(error = &error as &dyn std::error::Error, "failed to reconcile jobs left in flight");
        }
        self.remove_stale_cgroups().await;
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
                    let timed_out = Trigger::TimedOut { limit_secs: self.config.timeout.as_secs() };
                    move_job(&self.db, &self.publisher, &job.id, job.status(), &timed_out).await?;
                }
            }
        }
        let capacity = Capacity { free_gpus: Some(self.config.gpus.free_models()) };
        admit_queued(
            &self.db,
            &self.publisher,
            &capacity,
            self.config.limits,
            &self.admission,
            |job| {
                // Taken within the pass: the next pass sees them held.
                let held = match job.gpu {
                    true => self.config.gpus.take(&job.id, job.gpus.max(1), job.gpu_model.as_deref()),
                    false => None,
                };
                let runner = Arc::clone(self);
                let job_id = job.id.clone();
                tokio::spawn(async move { runner.launch(job_id, held).await });
            },
            // Stopped as a user's stop is; its end names the tenant (`JobState::stop_trigger`).
            |job_id| {
                self.terminate(job_id);
            },
        )
        .await?;
        Ok(())
    }

    /// Records that an admitted (PENDING) job could not be started.
    async fn fail_launch(&self, job_id: &str, reason: String) {
        tracing::warn!(job.id = %job_id, reason = %reason, "job could not be started");
        let failed = Trigger::LaunchFailed { reason };
        if let Err(error) = move_job_from(&self.db, &self.publisher, job_id, JobStatus::Pending, &failed).await {
            tracing::error!(error = &error as &dyn std::error::Error, "failed to record a launch failure");
        }
        self.release_slot(job_id).await;
    }

    /// Starts `gantry launch` for an admitted (PENDING) job, as a process or in the job's
    /// container, and watches it. The job is read once, here; after that only what can have
    /// changed is read again (a stop requested meanwhile, in `started` and `finish`).
    async fn launch(self: Arc<Self>, job_id: String, held: Option<gpus::Held>) {
        let loaded = match self.load(&job_id).await {
            Ok(loaded) => loaded,
            Err(reason) => return self.fail_launch(&job_id, reason).await,
        };
        // The start's span: the launcher's spans are its children (`TRACEPARENT`).
        let span = super::job_step_of("gantry.job.start", &job_id, loaded.info.traceparent.as_deref());
        if loaded.job.gpu && held.is_none() {
            let reason = "the GPUs it asks for were not free when it was admitted".to_string();
            return self.fail_launch(&job_id, reason).await;
        }
        if let Some(held) = &held
            && let Err(reason) = self.record_gpus(&job_id, held).await
        {
            return self.fail_launch(&job_id, reason).await;
        }
        // What the usage ledger meters its run with: not started without it.
        if let Err(error) = jobs::record_allocation(&self.db, &job_id, &self.allocation(&loaded)).await {
            return self.fail_launch(&job_id, format!("failed to record the job's allocation: {error}")).await;
        }
        let held = held.as_ref();
        let running = match loaded.info.image.clone() {
            Some(image) => match self.start_container(&loaded, &image, held).instrument(span).await {
                Ok(name) => Running::Container(name),
                Err(reason) => return self.fail_launch(&job_id, reason).await,
            },
            None => match self.spawn_launcher(&loaded, held).instrument(span).await {
                Ok((child, output)) => {
                    let pid = child.id().unwrap_or_default();
                    if let Err(error) = jobs::set_backend_ref(&self.db, &job_id, Some(&format!("pid:{pid}"))).await {
                        tracing::warn!(error = &error as &dyn std::error::Error, "failed to record the launcher pid");
                    }
                    self.processes.lock().expect("lock").insert(job_id.clone(), Running::Process(pid));
                    self.started(&job_id).await;
                    return self.watch(job_id, child, output).await;
                }
                Err(reason) => return self.fail_launch(&job_id, reason).await,
            },
        };
        self.processes.lock().expect("lock").insert(job_id.clone(), running.clone());
        self.started(&job_id).await;
        if let Running::Container(name) = running {
            self.watch_container(job_id, name).await;
        }
    }

    /// Records that the job's launcher runs, and delivers a stop that arrived meanwhile.
    async fn started(self: &Arc<Self>, job_id: &str) {
        match move_job(&self.db, &self.publisher, job_id, JobStatus::Pending, &Trigger::Started).await {
            Ok(_) => {}
            Err(error) => tracing::error!(error = &error as &dyn std::error::Error, "failed to record a job start"),
        }
        // A stop that arrived while the launcher was being started: read again, as it can have
        // been requested since the job was loaded.
        if matches!(jobs::find(&self.db, job_id).await, Ok(Some(job)) if job.stop_requested) {
            self.terminate(job_id);
        }
    }

    async fn load(&self, job_id: &str) -> Result<Launch, String> {
        let launch = jobs::launch(&self.db, job_id).await.map_err(|e| format!("failed to load the job: {e}"))?;
        Ok(launch.ok_or("the job disappeared")?)
    }

    /// The job's own environment (client-contract §5.1) with `DATA_PATH` at `data_path`.
    fn job_variables(&self, loaded: &Launch, data_path: &str) -> Result<Vec<(String, String)>, String> {
        let Launch { job, info } = loaded;
        let request_env: Map<String, Value> = serde_json::from_str(&info.env_vars).unwrap_or_default();
        let function_env: Map<String, Value> =
            info.function_env_vars.as_deref().and_then(|t| serde_json::from_str(t).ok()).unwrap_or_default();
        let text = |key: &str| request_env.get(key).and_then(Value::as_str).map(str::to_string);
        let token = match text("token") {
            Some(sealed) => self.config.tokens.open(&sealed).map_err(|e| e.to_string())?,
            None => String::new(),
        };
        let channel = text("channel").unwrap_or_else(|| "local".into());
        let catalog: Map<String, Value> =
            info.function_sizes.as_deref().and_then(|s| serde_json::from_str(s).ok()).unwrap_or_default();
        let instance = text("instance");
        Ok(job_environment(&JobEnvironmentInput {
            job_id: &job.id,
            gateway_host: &self.config.gateway_host,
            token: &token,
            channel: &channel,
            instance: instance.as_deref(),
            trial: info.trial,
            data_path,
            function_size: job.function_size.as_deref(),
            compute_profile: sizes::job_profile(&catalog, job.function_size.as_deref()),
            qiskit_ibm_url: &self.config.qiskit_ibm_url,
            function_env: &function_env,
            traceparent: context::current().or(info.traceparent.clone()).as_deref(),
            telemetry: &telemetry::forwarded(std::env::vars()),
        }))
    }

    /// The job's work folder with its arguments placed.
    async fn work_folder(&self, loaded: &Launch) -> Result<PathBuf, String> {
        let work_dir = self.config.work_root.join(&loaded.job.id);
        tokio::fs::create_dir_all(&work_dir)
            .await
            .map_err(|e| preparing(format!("failed to create {}", work_dir.display()), &e))?;
        tokio::fs::write(work_dir.join("arguments.json"), &loaded.info.arguments)
            .await
            .map_err(|e| preparing("failed to write the arguments".into(), &e))?;
        Ok(work_dir)
    }

    /// Presigned URLs of the job's own objects (S3), as a pod gets them: never credentials.
    async fn job_access(&self, job_id: &str, artifact_key: Option<&str>) -> Result<String, String> {
        let valid_for = (self.config.timeout + Duration::from_secs(3600)).min(MAX_ACCESS);
        let access = JobAccess::presign(&self.storage, job_id, artifact_key, valid_for)
            .await
            .map_err(|e| format!("failed to prepare the job's storage access: {e}"))?;
        Ok(serde_json::to_string(&access).expect("job access serializes"))
    }

    /// The file a job container's environment travels in, readable by the server only.
    fn env_file(&self, job_id: &str) -> PathBuf {
        self.config.work_root.join(format!(".{job_id}.env"))
    }

    /// Starts the job's container (see `container`) and returns its name.
    async fn start_container(&self, loaded: &Launch, image: &str, held: Option<&gpus::Held>) -> Result<String, String> {
        let Launch { job, info } = loaded;
        let engine = &self.config.containers;
        engine.check(job.gpu).map_err(|why| format!("the job's container could not be started: {why}"))?;
        let work_dir = self.work_folder(loaded).await?;
        let in_container = |name: &str| format!("{WORK_MOUNT}/{name}");
        let mut variables: std::collections::BTreeMap<String, String> =
            self.job_variables(loaded, &in_container("data"))?.into_iter().collect();
        let title = job.program_title.clone().unwrap_or_default();
        let mut launcher = vec![
            ("GANTRY_JOB_ID", job.id.clone()),
            ("GANTRY_WORK_DIR", WORK_MOUNT.to_string()),
            ("GANTRY_CODE_DIR", engine.code_dir().to_string()),
            ("GANTRY_ENTRYPOINT", info.entrypoint.clone().unwrap_or_else(|| "main.py".into())),
            ("GANTRY_PYTHON", engine.python().to_string()),
            ("GANTRY_ARGUMENTS_FILE", in_container("arguments.json")),
            ("FUNCTIONS_LOGS_SIZE_LIMIT", self.config.logs_size_limit.to_string()),
            // `DATA_PATH` mirrors the caller's file area through the gateway, with the job's token.
            ("GANTRY_DATA_FUNCTION", title),
            ("HOME", WORK_MOUNT.to_string()),
        ];
        if let Some(provider) = &job.provider_name {
            launcher.push(("GANTRY_DATA_PROVIDER", provider.clone()));
        }
        if job.provider_id.is_some() {
            launcher.push(("GANTRY_PROVIDER_FUNCTION", "true".into()));
        }
        match &self.storage {
            Storage::Local { .. } => {
                let objects = work_dir.join(OBJECTS_FOLDER);
                tokio::fs::create_dir_all(&objects)
                    .await
                    .map_err(|e| format!("failed to create {}: {e}", objects.display()))?;
                launcher.push(("GANTRY_STORAGE", in_container(OBJECTS_FOLDER)));
            }
            Storage::S3 { .. } => launcher.push(("GANTRY_JOB_ACCESS", self.job_access(&job.id, None).await?)),
        }
        variables.extend(launcher.into_iter().map(|(name, value)| (name.to_string(), value)));
        variables.extend(held.map(gpus::Held::environment).unwrap_or_default());
        if let Some((uid, gid)) = engine.user_ids().filter(|_| crate::launcher::isolation::running_as_root()) {
            // The container's user owns the job's folder, as a pod's volume is its.
            let folder = work_dir.clone();
            tokio::task::spawn_blocking(move || crate::launcher::isolation::hand_over(&folder, uid, gid))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("failed to hand the job's folder to its container's user: {e}"))?;
        }
        // The environment travels in a file only the server can read, removed once the engine
        // has read it: never on a command line.
        let env_file = self.env_file(&job.id);
        let text = container::env_file(&variables)?;
        crate::shared::replace_file(&env_file, crate::shared::Contents::Bytes(text.as_bytes()), Some(0o600))
            .await
            .map_err(|e| format!("failed to write the job's environment: {e}"))?;
        let catalog: Map<String, Value> =
            info.function_sizes.as_deref().and_then(|s| serde_json::from_str(s).ok()).unwrap_or_default();
        let resources =
            sizes::job_resources(&catalog, job.function_size.as_deref(), job.gpu, &engine.default_resources());
        let name = container_name(&job.id);
        // Recorded first: a server killed while the engine starts it finds the container by it.
        if let Err(error) = jobs::set_backend_ref(&self.db, &job.id, Some(&format!("{CONTAINER_REF}{name}"))).await {
            tracing::warn!(error = &error as &dyn std::error::Error, "failed to record the job's container");
        }
        let started = engine
            .start(&ContainerJob {
                job_id: &job.id,
                image,
                work_dir: &work_dir,
                launcher: &self.config.launcher,
                env_file: &env_file,
                resources: &resources,
                gpus: &held.map(|held| held.gpus.iter().map(|gpu| gpu.minor).collect::<Vec<_>>()).unwrap_or_default(),
            })
            .await;
        let _ = tokio::fs::remove_file(&env_file).await;
        if let Err(reason) = started {
            engine.remove(&name).await;
            let _ = tokio::fs::remove_dir_all(&work_dir).await;
            return Err(reason);
        }
        tracing::info!(job.id = %job.id, container = %name, image, "job container started");
        Ok(name)
    }

    /// Starts `gantry launch` for a process job, in a cgroup of its own when the machine allows
    /// (see `limits`), with its output read into a bounded `launcher.log`; the task answers the
    /// last lines of the launcher's stderr.
    async fn spawn_launcher(
        &self,
        loaded: &Launch,
        held: Option<&gpus::Held>,
    ) -> Result<(tokio::process::Child, tokio::task::JoinHandle<Vec<String>>), String> {
        let Launch { job, info } = loaded;
        let job_id = job.id.as_str();
        let (Some(artifact_key), Some(entrypoint)) = (info.artifact_key.clone(), info.entrypoint.clone()) else {
            return Err("the function has no artifact to run".into());
        };
        let work_dir = self.work_folder(loaded).await?;
        let arguments_file = work_dir.join("arguments.json");
        let title = job.program_title.clone().unwrap_or_default();
        let data_key = keys::user_files(&job.author_name, job.provider_name.as_deref().map(|p| (p, title.as_str())));
        // The launcher mirrors the area into the job's own folder (`--data-key`): the job never
        // reaches the storage itself.
        let data_path = work_dir.join("data");
        tokio::fs::create_dir_all(&data_path)
            .await
            .map_err(|e| preparing(format!("failed to create {}", data_path.display()), &e))?;
        let environment = self.job_variables(loaded, &data_path.to_string_lossy())?;
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
            .arg("--max-unpacked-mib")
            .arg(self.config.max_unpacked_mib.to_string())
            .args(&self.config.storage_args)
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
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
                command.env("GANTRY_JOB_ACCESS", self.job_access(job_id, Some(&artifact_key)).await?);
                command.arg("--data-function").arg(&title);
                if let Some(provider) = &job.provider_name {
                    command.arg("--data-provider").arg(provider);
                }
            }
        }
        if let Some(isolation) = &self.config.isolation {
            // A GPU job may also open its own GPUs' device files and read the driver's.
            let mut isolation = isolation.clone();
            if let Some(held) = held {
                isolation.devices.extend(held.devices.iter().cloned());
                isolation.readable.extend(held.readable.iter().cloned());
            }
            command.args(isolation.launcher_args());
        }
        for key in PASSED_THROUGH {
            if let Ok(value) = std::env::var(key) {
                command.env(key, value);
            }
        }
        command.envs(self.config.storage_env.iter().map(|(k, v)| (k, v)));
        command.envs(environment);
        command.envs(held.map(gpus::Held::environment).unwrap_or_default());
        let memory_bytes = self.memory_bytes(loaded);
        let cgroup = self.job_cgroup(job_id, memory_bytes).await;
        command.args(self.config.job_limits.launcher_args(memory_bytes, cgroup.is_some()));
        if let Some(cgroup) = &cgroup {
            let files = cgroup.procs_files();
            // SAFETY: `limits::join` only makes system calls on the prepared paths.
            unsafe {
                command.pre_exec(move || limits::join(&files));
            }
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(error) => {
                if let Some(cgroup) = cgroup {
                    let _ = tokio::task::spawn_blocking(move || cgroup.remove()).await;
                }
                return Err(format!("failed to start {}: {error}", self.config.launcher.display()));
            }
        };
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            unreachable!("the launcher's output is piped")
        };
        let output = output::collect(stdout, stderr, &work_dir.join("launcher.log"), self.config.logs_size_limit);
        Ok((child, output))
    }

    async fn watch(
        &self,
        job_id: String,
        mut child: tokio::process::Child,
        output: tokio::task::JoinHandle<Vec<String>>,
    ) {
        let status = child.wait().await;
        let code = status.ok().and_then(|s| s.code());
        // The pipes close with the launcher; a process it left holding them is not waited for.
        let said = tokio::time::timeout(OUTPUT_GRACE, output).await.ok().and_then(Result::ok).unwrap_or_default();
        self.processes.lock().expect("lock").remove(&job_id);
        self.finish(&job_id, code, None, &said).await;
    }

    /// Waits for a job's container to end, then records the end.
    async fn watch_container(&self, job_id: String, name: String) {
        let code = self.config.containers.wait(&name).await;
        self.processes.lock().expect("lock").remove(&job_id);
        self.finish(&job_id, code, Some(&name), &[]).await;
    }

    /// Records the end of a job's launcher from its exit record (from storage, else the one it
    /// wrote on stderr, `said`: its last lines) and the limit it reached. For a container: what
    /// it archived is moved into the storage first and the container removed.
    async fn finish(&self, job_id: &str, launcher_code: Option<i32>, container: Option<&str>, said: &[String]) {
        // Forgotten only once the end is recorded, so a scheduling pass meanwhile does not time
        // the job out a second time.
        let timed_out = self.timed_out.lock().expect("lock").contains(job_id);
        let work_dir = self.config.work_root.join(job_id);
        let mut import_failure = None;
        let archived_here = matches!(self.storage, Storage::Local { .. }) && work_dir.join(OBJECTS_FOLDER).is_dir();
        if container.is_some()
            && archived_here
            && let Err(why) = container::import_objects(&self.storage, &work_dir, job_id).await
        {
            tracing::warn!(job.id = %job_id, why, "failed to store what a job's container archived");
            import_failure = Some(why);
        }
        let stored = match self.storage.read_to_bytes(&keys::job_exit(job_id)).await {
            Ok(bytes) => bytes.and_then(|b| serde_json::from_slice::<Value>(&b).ok()),
            Err(error) => {
                tracing::warn!(error = &error as &dyn std::error::Error, "failed to read a job's exit record");
                None
            }
        };
        let record = stored.or_else(|| {
            said.iter()
                .rev()
                .find_map(|line| line.strip_prefix(crate::launcher::EXIT_RECORD_LINE))
                .and_then(|text| serde_json::from_str::<Value>(text).ok())
        });
        // What the launcher said last, when it could not report (a launcher that cannot run in
        // the image, say), then the container goes.
        let mut said = said.last().map(|line| format!(": {line}")).unwrap_or_default();
        if let Some(name) = container {
            if record.is_none() {
                said = self.config.containers.last_lines(name).await.map(|t| format!(": {t}")).unwrap_or_default();
            }
            self.config.containers.remove(name).await;
        }
        let succeeded = record.as_ref().is_some_and(|r| r["exit_code"].as_i64() == Some(0) && r["error"].is_null());
        let (limit, used) = match container {
            None => self.limit_reached(job_id, !succeeded, record.as_ref()).await,
            Some(_) => (None, limits::Used::default()),
        };
        if used != limits::Used::default()
            && let Err(error) = jobs::record_measured(&self.db, job_id, used.cpu_ms, used.memory_peak_bytes).await
        {
            // The record is written without them: they are what the runner could tell, not what is billed.
            tracing::warn!(error = &error as &dyn std::error::Error, "failed to keep what a job used");
        }
        // Read again: its status and a stop requested are what can have changed while it ran.
        let now = jobs::state(&self.db, job_id).await.ok().flatten();
        let stop = now.as_ref().filter(|job| job.stop_requested).map(jobs::JobState::stop_trigger);
        let what = if container.is_some() { "the job's container" } else { "the launcher" };
        let trigger = if let Some(stop) = stop {
            stop
        } else if timed_out {
            Trigger::TimedOut { limit_secs: self.config.timeout.as_secs() }
        } else if let Some(hit) = limit {
            Trigger::Crashed { reason: limit_reason(hit) }
        } else {
            match &record {
                Some(record) => output::ending_of(record),
                None => Trigger::Lost {
                    reason: match (import_failure, launcher_code) {
                        (Some(why), _) => why,
                        (None, Some(code)) => {
                            format!("{what} exited with code {code} without reporting how the job ended{said}")
                        }
                        (None, None) if container.is_some() => {
                            "the job's container was gone and had not reported how the job ended".into()
                        }
                        (None, None) => "the job's process was gone and had not reported how the job ended".into(),
                    },
                },
            }
        };
        // Gone before the move: a job queued again (a reclaimed backfill job) may be launched
        // again as soon as it is moved. A server killed between writing a container's
        // environment and starting it left the file (the job's token in it): gone with the job.
        let _ = tokio::fs::remove_file(self.env_file(job_id)).await;
        if let Err(error) = tokio::fs::remove_dir_all(&work_dir).await {
            tracing::debug!(error = &error as &dyn std::error::Error, "could not remove a job's work folder");
        }
        if matches!(trigger, Trigger::Preempted { requeue: true, .. }) {
            // Its next run's exit record, logs and result are its own.
            for key in keys::job_attempt(job_id) {
                if let Err(error) = self.storage.delete(&key).await {
                    tracing::warn!(
                        error = &error as &dyn std::error::Error,
                        "failed to clear a requeued job's last run"
                    );
                }
            }
        }
        let seen = now.map_or(JobStatus::Running, |job| job.status());
        if let Err(error) = move_job_from(&self.db, &self.publisher, job_id, seen, &trigger).await {
            tracing::error!(error = &error as &dyn std::error::Error, "failed to record the end of a job");
        }
        self.release_slot(job_id).await;
        self.timed_out.lock().expect("lock").remove(job_id);
    }

    /// Gives back what an ended (or never started) job held: its GPUs, and its slot, which the
    /// next admission pass may use at once.
    async fn release_slot(&self, job_id: &str) {
        self.config.gpus.release(job_id);
        let _ = tokio::fs::remove_file(self.gpus_file(job_id)).await;
        self.wake.notify_one();
    }

    /// Sends a signal to the launcher process of a job watched here or adopted; false when none
    /// runs (or the job runs in a container).
    fn signal(&self, job_id: &str, signal: i32) -> bool {
        let Some(Running::Process(pid)) = self.processes.lock().expect("lock").get(job_id).cloned() else {
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
    /// and kills the launcher (or its container) if it is still there after its grace period.
    /// False when nothing of ours runs the job.
    fn terminate(self: &Arc<Self>, job_id: &str) -> bool {
        let Some(running) = self.processes.lock().expect("lock").get(job_id).cloned() else {
            return false;
        };
        let runner = Arc::clone(self);
        let job_id = job_id.to_string();
        match running {
            Running::Container(name) => {
                tokio::spawn(async move { runner.config.containers.stop(&name, STOP_GRACE).await });
            }
            Running::Process(pid) => {
                if !self.signal(&job_id, libc::SIGTERM) {
                    return false;
                }
                tokio::spawn(async move {
                    tokio::time::sleep(STOP_GRACE).await;
                    // Only the same launcher: its pid may have been reused once it ended.
                    if runner.processes.lock().expect("lock").get(&job_id) == Some(&Running::Process(pid)) {
                        runner.signal(&job_id, libc::SIGKILL);
                    }
                });
            }
        }
        true
    }
}

#[async_trait::async_trait]
impl Compute for LocalRunner {
    /// Artifacts run as local processes; images in containers when the engine is there.
    fn can_run(&self, image: bool, resources: &Resources) -> Result<(), String> {
        if image {
            self.config.containers.check(resources.gpus > 0)?;
        }
        match resources.gpus {
            0 => Ok(()),
            count => self.config.gpus.check(count, resources.gpu_model.as_deref()),
        }
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
        use tokio::io::AsyncReadExt;
        let mut text = String::new();
        self.open_live_log(job_id, provider).await?.read_to_string(&mut text).await.ok()?;
        Some(text)
    }

    async fn live_log_since(
        self: Arc<Self>,
        job_id: &str,
        provider: bool,
        offset: u64,
        limit: usize,
    ) -> Option<bytes::Bytes> {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        let mut file = self.open_live_log(job_id, provider).await?;
        file.seek(std::io::SeekFrom::Start(offset)).await.ok()?;
        let mut bytes = Vec::new();
        file.take(limit as u64).read_to_end(&mut bytes).await.ok()?;
        Some(bytes.into())
    }

    async fn reconcile(self: Arc<Self>) -> Result<(), db::Error> {
        self.adopt_or_finish_in_flight().await
    }
}

/// A step of preparing a job's folder failed: a full disk says so in the words of every backend.
fn preparing(what: String, error: &std::io::Error) -> String {
    if error.kind() == std::io::ErrorKind::StorageFull || error.raw_os_error() == Some(libc::EDQUOT) {
        no_space_reason(&format!("{what}: {error}"))
    } else {
        format!("{what}: {error}")
    }
}
