//! `gantry serve`: the all-in-one embedded default. The gateway, the scheduler and the local
//! runner in one process, on SQLite and a local directory unless told otherwise.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use crate::api::{ApiArgs, AppState};
use crate::compute::local::limits::JobLimits;
use crate::compute::local::{LocalRunner, RunnerConfig};
use crate::compute::{Compute, LimitsArgs, Queue};
use crate::db::{self, DatabaseArgs, Db};
use crate::launcher::isolation;
use crate::ops::serve_http;
use crate::retention::RetentionArgs;
use crate::secrets::TokenCipher;
use crate::shared::parse_timeout;
use crate::storage::{Storage, StorageArgs};
use crate::telemetry::operator_warning;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "GANTRY_LISTEN", default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    pub storage: StorageArgs,
    #[command(flatten)]
    pub api: ApiArgs,
    #[command(flatten)]
    pub jobs: JobArgs,
    #[command(flatten)]
    pub retention: RetentionArgs,
    #[command(flatten)]
    pub events: crate::events::EventArgs,
    #[command(flatten)]
    pub connections: crate::ops::ConnectionArgs,
    /// Admin port (`/metrics`, `/healthz`, `/readyz`; unauthenticated: keep it on loopback),
    /// off unless given, e.g. 127.0.0.1:9090.
    #[arg(long, env = "GANTRY_ADMIN_LISTEN")]
    pub admin_listen: Option<SocketAddr>,
}

/// How jobs run.
#[derive(Debug, Clone, Args)]
pub struct JobArgs {
    /// Where jobs run: `local` processes, or `none` (the gateway only queues them; for a
    /// separate runner, or to measure the API alone).
    #[arg(long, env = "GANTRY_RUNNER", value_enum, default_value = "local")]
    pub runner: RunnerKind,
    /// Python interpreter that runs functions (`python <entrypoint>`); give a venv's python to
    /// make `qiskit_serverless` importable by jobs.
    #[arg(long, env = "GANTRY_PYTHON", default_value = "python3")]
    pub python: String,
    /// Base URL jobs use to call the gateway back. Default: http://LISTEN.
    #[arg(long, env = "GANTRY_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// Queued+pending+running jobs one user may have; `run` answers 429 beyond.
    #[arg(long, env = "LIMITS_ACTIVE_JOBS_PER_USER", default_value_t = 50)]
    pub active_jobs_per_user: i64,
    #[command(flatten)]
    pub limits: LimitsArgs,
    /// Longest a job may go without activity before it is stopped: hours as a plain number
    /// (`24`), or with a unit (`90s`, `15m`, `2h`).
    #[arg(long, env = "PROGRAM_TIMEOUT", default_value = "24", value_parser = parse_timeout)]
    pub program_timeout: std::time::Duration,
    /// Bytes kept of each of a job's logs (the newest).
    #[arg(long, env = "FUNCTIONS_LOGS_SIZE_LIMIT", default_value_t = 52_428_800)]
    pub logs_size_limit: u64,
    /// `QISKIT_IBM_URL` given to jobs.
    #[arg(long, env = "QISKIT_IBM_URL", default_value = "https://cloud.ibm.com")]
    pub qiskit_ibm_url: String,
    /// How often the scheduler looks at the queue when nothing wakes it, in milliseconds.
    #[arg(long, env = "GANTRY_SCHEDULER_TICK_MS", default_value_t = 500)]
    pub scheduler_tick_ms: u64,
    /// When gantry runs as root: the user id local jobs run as (never 0). Default 65534
    /// (nobody). The jobs' Python must be readable by this user.
    #[arg(long, env = "GANTRY_JOB_UID")]
    pub job_uid: Option<u32>,
    /// When gantry runs as root: the group id local jobs run as (never 0). Default 65534.
    #[arg(long, env = "GANTRY_JOB_GID")]
    pub job_gid: Option<u32>,
    /// A folder local jobs may read besides the system's and their interpreter's installation
    /// (repeatable; `:`-separated in the environment).
    #[arg(long = "job-read-path", env = "GANTRY_JOB_READ_PATHS", value_delimiter = ':')]
    pub job_read_paths: Vec<PathBuf>,
    /// Processes (threads included) one local job may have at once: its cgroup's pids limit,
    /// or RLIMIT_NPROC where no cgroup can be made (then counted over every process of the
    /// jobs' user). A job's memory is its function size's (`--memory-gib-per-job` by default).
    #[arg(long, env = "GANTRY_JOB_MAX_PROCESSES", default_value_t = 4096)]
    pub job_max_processes: u64,
    /// Largest file a local job may write, in MiB (RLIMIT_FSIZE); a write past it fails.
    #[arg(long, env = "GANTRY_JOB_MAX_FILE_MIB", default_value_t = 10240)]
    pub job_max_file_mib: u64,
    #[command(flatten)]
    pub containers: crate::compute::local::container::ContainerArgs,
    #[command(flatten)]
    pub gpus: crate::compute::local::gpus::GpuArgs,
    /// Run jobs locally even where the kernel lacks Landlock, with an authentication mechanism
    /// other than mock_token: such jobs can read every user's files, the database and the
    /// server's files (see docs/security.md).
    #[arg(long, env = "GANTRY_ACCEPT_UNISOLATED_JOBS")]
    pub accept_unisolated_jobs: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RunnerKind {
    Local,
    None,
}

impl ServeArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        let Self { listen, database, storage, api, jobs, retention, events, connections, admin_listen } = self;
        // Jobs run on this machine: keep this process's memory and environment out of their reach.
        isolation::forbid_dumping().context("failed to make gantry non-dumpable")?;
        let auth = Arc::new(api.auth.authenticator()?);
        let runtime = Arc::new(api.auth.runtime_service()?);
        let db = database.open().await?;
        let functions = Arc::new(crate::api::state::FunctionCache::default());
        let budgets = Arc::new(crate::api::state::BudgetCache::default());
        crate::api::state::follow_changes(&db, &auth, &functions, &budgets);
        let storage_settings = storage;
        let storage = storage_settings.open(&database.data_dir)?;
        storage.check().await.context("object storage is not reachable")?;
        migrate_storage(&db, &storage).await?;
        jobs.limits.seed_tenants(&db).await?;
        let tokens = match &api.token_key {
            Some(key) => TokenCipher::from_key_text(key.expose())?,
            None => TokenCipher::load_or_create(&database.data_dir.join("token.key"))?,
        };
        let mut config = api.config(database.data_dir.join("spool"), jobs.active_jobs_per_user);
        // The GPUs jobs of this machine may hold; their number is the default of the GPU slots.
        let gpus = match jobs.runner {
            RunnerKind::Local => jobs.gpus.pool().map_err(anyhow::Error::msg)?,
            RunnerKind::None => crate::compute::local::gpus::GpuPool::empty(),
        };
        let limits = match jobs.runner {
            RunnerKind::Local => jobs.limits.limits(gpus.count()),
            RunnerKind::None => jobs.limits.limits(crate::compute::CLUSTER_GPU_SLOTS),
        };
        config.admission = Some(limits);
        crate::ops::keep_spool_clean(&config.spool_dir, crate::ops::SPOOL_SWEEP_PERIOD);
        let listener =
            tokio::net::TcpListener::bind(listen).await.with_context(|| format!("failed to listen on {listen}"))?;
        let address = listener.local_addr()?;
        let admin = match admin_listen {
            Some(admin_listen) => Some(crate::ops::bind_admin(admin_listen).await?),
            None => None,
        };
        // Printed last, once every start-up check passed: whoever waits for it gets a server.
        let listening = format!(
            "gantry listening on http://{address} (database: {} {}, storage: {}, auth: {})",
            db.backend_name(),
            db::redact(&database.url()),
            storage.backend_name(),
            api.auth.mechanism_name()
        );
        let work_root = absolute(&database.data_dir.join("jobs"))?;
        let (storage_args, storage_env) = launcher_storage(&storage_settings, &database.data_dir)?;
        let isolation = match jobs.runner {
            RunnerKind::Local => {
                Some(job_isolation(&jobs, &api.auth.mechanism_name(), &database.data_dir, &work_root)?)
            }
            RunnerKind::None => None,
        };
        let publisher = events.start(&db).await?;
        println!("job status events: {}", events.describe());
        println!("job history: {}", retention.start(&db, &storage));
        crate::api::idempotency::start_expiry(&db);
        let containers = jobs.containers.engine().await;
        let file_bytes = jobs.job_max_file_mib.saturating_mul(1 << 20);
        let job_limits = match jobs.runner {
            RunnerKind::Local => JobLimits::detect(&work_root, jobs.job_max_processes, file_bytes),
            RunnerKind::None => JobLimits::rlimits(jobs.job_max_processes, file_bytes),
        };
        let job_folders = job_limits.clone();
        let runner_config = RunnerConfig {
            launcher: std::env::current_exe().context("failed to find the gantry executable")?,
            python: jobs.python,
            work_root,
            gateway_host: jobs.public_url.unwrap_or_else(|| format!("http://{address}")),
            limits,
            fair_share: jobs.limits.fair_share(),
            timeout: jobs.program_timeout,
            logs_size_limit: jobs.logs_size_limit,
            max_unpacked_mib: api.max_unpacked_mib,
            tick: std::time::Duration::from_millis(jobs.scheduler_tick_ms.max(10)),
            qiskit_ibm_url: jobs.qiskit_ibm_url,
            storage_args,
            storage_env,
            tokens: tokens.clone(),
            isolation,
            containers,
            job_limits,
            gpus: Arc::new(gpus),
        };
        let compute: Arc<dyn Compute> = match jobs.runner {
            RunnerKind::Local => {
                println!(
                    "jobs run as local processes with {} (work folders in {})",
                    runner_config.python,
                    runner_config.work_root.display()
                );
                println!("{}", runner_config.job_limits.describe());
                println!("{}", runner_config.containers.describe());
                println!("{}", runner_config.gpus.describe());
                let user = runner_config.isolation.as_ref().and_then(|isolation| isolation.user);
                tokio::spawn(warn_if_client_missing(runner_config.python.clone(), user));
                let runner = LocalRunner::new(db.clone(), storage.clone(), runner_config, publisher.clone());
                tokio::spawn(Arc::clone(&runner).run());
                runner
            }
            RunnerKind::None => {
                println!("no runner: jobs stay queued (GANTRY_RUNNER=none)");
                Arc::new(Queue { db: db.clone(), publisher: publisher.clone() })
            }
        };
        let follows = Arc::new(crate::follow::Follows::default());
        let state = AppState {
            db,
            storage,
            config: Arc::new(config),
            compute,
            publisher,
            tokens,
            auth,
            runtime,
            follows,
            functions,
            budgets,
        };
        let metrics = admin.map(|admin| {
            let metrics = Arc::new(crate::ops::Metrics::gateway());
            let (metrics_served, db) = (Arc::clone(&metrics), state.db.clone());
            tokio::spawn(async move {
                if let Err(error) = crate::ops::serve_on(admin, metrics_served, db).await {
                    tracing::error!(error = format!("{error:#}"), "the admin port stopped");
                }
            });
            metrics
        });
        println!("{listening}");
        let served = serve_http(listener, state, metrics, connections.limits(), crate::shared::shutdown_signal()).await;
        // The folder of the job cgroups goes when no job's is left in it (running jobs keep it
        // for the next start, which adopts them).
        job_folders.remove_folders();
        served
    }
}

/// Runs the one-time storage steps that have not completed yet (see `storage::migrate`). The
/// merge of per-function user files is recorded as done only when no job was in flight: a job
/// started by an earlier version writes to its old folder until it ends, and the next start
/// moves what it wrote.
pub async fn migrate_storage(db: &Db, storage: &Storage) -> anyhow::Result<()> {
    use crate::storage::migrate;
    if db::storage_steps::is_done(db, migrate::USER_AREA_MERGE).await? {
        return Ok(());
    }
    let in_flight = db::jobs::any_in_flight(db).await?;
    let report = migrate::merge_custom_user_areas(storage)
        .await
        .context("failed to move custom functions' files into their users' areas")?;
    if report != migrate::MergeReport::default() {
        println!(
            "moved {} file(s) of custom functions into their users' shared areas ({} older duplicate(s) removed)",
            report.moved, report.dropped
        );
    }
    if !in_flight {
        db::storage_steps::mark_done(db, migrate::USER_AREA_MERGE).await?;
    }
    Ok(())
}

/// Checks once, in the background, that the jobs' interpreter can import the client their code
/// imports, and warns with the fix when it cannot (a new user's first job would otherwise fail
/// with a bare `ModuleNotFoundError`).
async fn warn_if_client_missing(python: String, user: Option<(u32, u32)>) {
    let mut check = tokio::process::Command::new(&python);
    if let Some((uid, gid)) = user {
        // As the jobs' user: their Python must be readable by it.
        check.uid(uid).gid(gid).current_dir("/");
    }
    let check = check
        .args(["-c", "import qiskit_serverless"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .status();
    match tokio::time::timeout(std::time::Duration::from_secs(120), check).await {
        Ok(Ok(status)) if status.success() => {}
        Ok(Ok(_)) => operator_warning(&format!(
            "warning: {}{}",
            crate::domain::logs::missing_client_hint(&python),
            as_whom(user)
        )),
        Ok(Err(error)) => operator_warning(&format!(
            "warning: failed to start {python}{} ({error}); jobs cannot run: start gantry with --python (GANTRY_PYTHON) naming a Python interpreter that has qiskit-serverless installed",
            as_whom(user)
        )),
        Err(_) => operator_warning(&format!("warning: {python} took more than 120 s to import qiskit_serverless")),
    }
}

fn as_whom(user: Option<(u32, u32)>) -> String {
    match user {
        Some((uid, gid)) => format!(
            " (checked as the jobs' user {uid}:{gid}, which must be able to read the interpreter and its folders)"
        ),
        None => String::new(),
    }
}

/// How local jobs are confined, after checking what the kernel offers (see
/// `isolation::start_policy`); prepares the data dir for jobs running as another user.
fn job_isolation(
    jobs: &JobArgs,
    auth_mechanism: &str,
    data_dir: &std::path::Path,
    work_root: &std::path::Path,
) -> anyhow::Result<isolation::JobIsolation> {
    let abi = isolation::landlock_abi();
    let warnings = isolation::start_policy(abi, auth_mechanism, jobs.accept_unisolated_jobs)
        .map_err(|reason| anyhow::anyhow!(reason))?;
    for warning in warnings {
        operator_warning(&warning);
    }
    let as_root = isolation::running_as_root();
    let user = isolation::job_user(as_root, jobs.job_uid, jobs.job_gid).map_err(|reason| anyhow::anyhow!(reason))?;
    if let Some((uid, gid)) = user {
        isolation::restrict_data_dir(data_dir, work_root)
            .with_context(|| format!("failed to restrict access to {}", data_dir.display()))?;
        let closed = isolation::unreachable_folder(work_root, uid, gid)
            .with_context(|| format!("failed to inspect the folders on the way to {}", work_root.display()))?;
        if let Some(folder) = closed {
            anyhow::bail!(
                "jobs run as {uid}:{gid}, which cannot pass through {} to reach their work folders in {}: \
                 allow it to (chmod o+x {}) or choose a --data-dir it can reach",
                folder.display(),
                work_root.display(),
                folder.display()
            );
        }
    }
    println!(
        "local jobs are confined by {}{}",
        match abi {
            Some(abi) => format!("Landlock (ABI {abi})"),
            None => "nothing (no Landlock)".into(),
        },
        match user {
            Some((uid, gid)) => format!(", running as {uid}:{gid}"),
            None => String::new(),
        }
    );
    Ok(isolation::JobIsolation { user, readable: jobs.job_read_paths.clone(), devices: Vec::new() })
}

fn absolute(path: &std::path::Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(path).with_context(|| format!("failed to create {}", path.display()))?;
    path.canonicalize().with_context(|| format!("failed to resolve {}", path.display()))
}

/// Flags and environment variables for `gantry launch`.
type LauncherStorage = (Vec<String>, Vec<(String, String)>);

/// The flags that make `gantry launch` open the same storage as the gateway when it is a local
/// directory. With S3 there are none: the runner gives each launcher presigned URLs of its
/// job's objects and the gateway's files API, never the storage's credentials.
fn launcher_storage(storage: &StorageArgs, data_dir: &std::path::Path) -> anyhow::Result<LauncherStorage> {
    let args = match storage.storage.as_deref() {
        Some(location) if location.starts_with("s3://") => Vec::new(),
        Some(directory) => {
            vec!["--storage".to_string(), absolute(std::path::Path::new(directory))?.display().to_string()]
        }
        None => vec!["--storage".to_string(), absolute(&data_dir.join("objects"))?.display().to_string()],
    };
    Ok((args, Vec::new()))
}
