//! The job launcher (`gantry launch`), the process that runs inside every job: as a child of the
//! local runner or as the pod's command. It fetches the function's artifact and unpacks it
//! member by member (`unpack`), places the arguments and the user's files (`prepare`,
//! `data_area`), runs `python <entrypoint>` in its own process group with stdout and stderr on
//! one pipe (so lines keep the order they were written in), passing the output through to its own
//! stdout while routing it into the user and provider logs (`process`), confined when asked
//! (`isolation`), and at the end ships the result, the logs and an exit record to object storage
//! through the job's objects (`objects`, `archive`). The exit record is written last, so its
//! presence means everything else of the job is archived.
//!
//! Below it: storage, the domain's log routing and the artifact checks. Nothing here knows the
//! API, the database or the compute backends that start it.

/// Writes a line to the launcher's stderr, ignoring failures (`eprintln!` panics on them): a
/// full disk or a reader that went away must not end the launcher before it records how the
/// job ended.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod archive;
pub mod bounds;
pub mod data_area;
pub mod isolation;
mod objects;
mod prepare;
mod process;
mod unpack;

use std::ffi::{OsStr, OsString};
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

pub use self::archive::EXIT_RECORD_LINE;
use self::archive::{archive, record_failure};
use self::bounds::ProcessLimits;
use self::isolation::JobIsolation;
pub use self::objects::JobObjects;
use self::prepare::prepare;
use self::process::{spawn, supervise};
use crate::secrets::Secret;
use crate::shared::BoxError;
use crate::storage::StorageArgs;
use crate::storage::access::JobAccess;
use crate::telemetry::{self, context};
use tracing::Instrument;

/// Exit code of the launcher when the function could not be started.
pub const EXIT_NOT_STARTED: i32 = 2;
/// Name of the live user log in the work directory, refreshed while the job runs.
pub const LIVE_USER_LOG: &str = "user.log";
/// Name of the live provider log in the work directory (provider functions only).
pub const LIVE_PROVIDER_LOG: &str = "provider.log";
/// How often the live logs are refreshed.
const LIVE_LOG_INTERVAL: Duration = Duration::from_millis(500);
/// Time a stopped job gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// Time processes left behind by the job may keep the output pipes open after python exited,
/// before the process group is killed.
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// Launcher settings kept from the job, besides every `GANTRY_*` variable.
const LAUNCHER_VARIABLES: [&str; 4] =
    ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "FUNCTIONS_LOGS_SIZE_LIMIT"];
/// The job's private temporary folder (`TMPDIR`, `HOME`) in its work folder, when isolated.
pub const PRIVATE_TMP: &str = "tmp";
/// Name of the copy of the result the launcher ships (taken without following links).
const RESULT_COPY: &str = "result.json";
/// Folder of the copies of the files the launcher copies back to the user's area.
const OUTBOX: &str = "outbox";
/// Bytes kept from the start of an over-long line, enough for a `[PRIVATE]` tag and the
/// character after it.
const LINE_HEAD_BYTES: usize = 16;
/// Size of one read from an output pipe.
const READ_CHUNK_BYTES: usize = 8 * 1024;

/// Runs one job's function and archives what it leaves. The job's own environment is the
/// launcher's environment minus the launcher's settings (`GANTRY_*`, the storage credentials,
/// `FUNCTIONS_LOGS_SIZE_LIMIT`).
#[derive(Debug, clap::Args)]
pub struct LaunchArgs {
    #[command(flatten)]
    pub job: JobSettings,
    /// The job's scoped storage access (JSON of presigned URLs, from the job's Secret in a pod):
    /// used instead of the storage settings, so the pod holds no storage credentials.
    #[arg(long, env = "GANTRY_JOB_ACCESS")]
    pub access: Option<Secret>,
    /// Confine the job (local runner): Landlock lets it write only its code folder, a private
    /// temporary folder (`TMPDIR`, `HOME`) and `DATA_PATH`, read those and what Python needs,
    /// and signal or trace no process outside its own.
    #[arg(long, env = "GANTRY_ISOLATE")]
    pub isolate: bool,
    /// With `--isolate`, when the launcher runs as root: the user id the job runs as.
    #[arg(long, env = "GANTRY_JOB_UID", requires = "job_gid")]
    pub job_uid: Option<u32>,
    /// With `--isolate`, when the launcher runs as root: the group id the job runs as.
    #[arg(long, env = "GANTRY_JOB_GID", requires = "job_uid")]
    pub job_gid: Option<u32>,
    /// With `--isolate`: a folder the job may also read (repeatable; `:`-separated in the
    /// environment). The interpreter's installation is found from `--python`.
    #[arg(long = "read-path", env = "GANTRY_READ_PATHS", value_delimiter = ':')]
    pub read_paths: Vec<PathBuf>,
    /// With `--isolate`: a device file the job may open read-write, such as a GPU it holds
    /// (repeatable; `:`-separated in the environment).
    #[arg(long = "device-path", env = "GANTRY_DEVICE_PATHS", value_delimiter = ':')]
    pub device_paths: Vec<PathBuf>,
    #[command(flatten)]
    pub limits: ProcessLimits,
    #[command(flatten)]
    pub storage: StorageArgs,
}

/// What one job is: the part of the launcher's settings a launch keeps (`Launch::job`).
#[derive(Debug, Clone, clap::Args)]
pub struct JobSettings {
    /// Id of the job; names the objects written at the end.
    #[arg(long, env = "GANTRY_JOB_ID")]
    pub job_id: String,
    /// Private folder of this job: the artifact is unpacked into `code/`, and the live logs
    /// `user.log` and `provider.log` are kept here.
    #[arg(long, env = "GANTRY_WORK_DIR")]
    pub work_dir: PathBuf,
    /// Object key of the function's artifact (an uncompressed tar).
    #[arg(long, env = "GANTRY_ARTIFACT_KEY", required_unless_present = "code_dir")]
    pub artifact_key: Option<String>,
    /// Folder holding the function's code already (a provider's container image), used
    /// instead of an artifact.
    #[arg(long, env = "GANTRY_CODE_DIR")]
    pub code_dir: Option<PathBuf>,
    /// Python file to run, relative to the root of the artifact (or of the code folder).
    #[arg(long, env = "GANTRY_ENTRYPOINT")]
    pub entrypoint: String,
    /// Python interpreter running the function; it must be able to import `qiskit_serverless`.
    #[arg(long, env = "GANTRY_PYTHON", default_value = "python3")]
    pub python: String,
    /// File holding the job's arguments text, copied verbatim to `ARGUMENTS_PATH`. Without it
    /// the arguments are read from storage (`jobs/<id>/arguments.json`).
    #[arg(long, env = "GANTRY_ARGUMENTS_FILE")]
    pub arguments_file: Option<PathBuf>,
    /// The function belongs to a provider: split its output into user (`[PUBLIC]`) and
    /// provider (`[PRIVATE]` and untagged) logs instead of sending everything to the user log.
    #[arg(long, env = "GANTRY_PROVIDER_FUNCTION")]
    pub provider_function: bool,
    /// Largest size in MiB the artifact may unpack to, each member counted at its full declared
    /// size (the server's `--max-unpacked-mib`): the job fails, naming the limit, before
    /// anything is written past it.
    #[arg(long, env = "GANTRY_MAX_UNPACKED_MIB", default_value_t = crate::artifact::DEFAULT_MAX_UNPACKED_MIB)]
    pub max_unpacked_mib: u64,
    /// Largest size in bytes of each log; the oldest lines are dropped first.
    #[arg(long, env = "FUNCTIONS_LOGS_SIZE_LIMIT", default_value_t = 52_428_800)]
    pub logs_size_limit: usize,
    /// Folder of object keys (ending with `/`) holding the user's file area, when `DATA_PATH`
    /// is not that area itself (S3 storage): its files are copied into `DATA_PATH` before the
    /// function runs, and files the function added, changed or removed there are copied back
    /// at the end. Only files directly in the folder, as the files API lists them.
    #[arg(long, env = "GANTRY_DATA_KEY")]
    pub data_key: Option<String>,
    /// A file the failed function's last exception line is written to (a pod's
    /// `/dev/termination-log`), so the cluster's record of the ended container carries it.
    #[arg(long, env = "GANTRY_TERMINATION_LOG")]
    pub termination_log: Option<PathBuf>,
    /// In a pod: the function whose file area `DATA_PATH` mirrors through the gateway's files
    /// API, with the job's token (`ENV_JOB_GATEWAY_HOST`, `ENV_JOB_GATEWAY_TOKEN`).
    #[arg(long, env = "GANTRY_DATA_FUNCTION")]
    pub data_function: Option<String>,
    /// The provider of that function, for a provider function.
    #[arg(long, env = "GANTRY_DATA_PROVIDER")]
    pub data_provider: Option<String>,
}

impl LaunchArgs {
    /// Runs the job to its end, stopping it on SIGTERM or SIGINT, and returns the exit code for
    /// the launcher's process: python's own code, 128 + the signal that ended it, or
    /// `EXIT_NOT_STARTED`. Fails only when the storage settings are unusable, since nothing
    /// can be recorded then.
    pub async fn run(self) -> anyhow::Result<i32> {
        let Self { job, access, isolate, job_uid, job_gid, read_paths, device_paths, limits, storage } = self;
        // The job runs beside this process: keep its memory and environment out of reach.
        isolation::forbid_dumping().context("failed to make the launcher non-dumpable")?;
        let isolation =
            isolate.then(|| JobIsolation { user: job_uid.zip(job_gid), readable: read_paths, devices: device_paths });
        let objects: Box<dyn JobObjects> = match access.filter(|a| !a.expose().trim().is_empty()) {
            Some(access) => Box::new(
                serde_json::from_str::<JobAccess>(access.expose())
                    .context("GANTRY_JOB_ACCESS is not valid job access")?,
            ),
            None => Box::new(storage.open(&job.work_dir)?),
        };
        let stop = stop_signal().context("failed to install the signal handlers")?;
        let launch = Launch { job, isolation, limits, environment: std::env::vars_os().collect() };
        Ok(run_job(&launch, objects.as_ref(), stop).await)
    }
}

/// Copies the running executable to `destination` (mode 0755), whole or not at all: a job pod's
/// init container places the launcher this way, so job images need no copy of their own.
pub fn place_launcher(destination: &Path) -> anyhow::Result<()> {
    let source = std::env::current_exe().context("failed to find this executable")?;
    crate::shared::replace_file_blocking(destination, crate::shared::Contents::CopyOf(&source), Some(0o755))
        .with_context(|| format!("failed to place {} at {}", source.display(), destination.display()))
}

/// Completes when the launcher receives SIGTERM or SIGINT. Installing the handlers also keeps
/// those signals from ending the launcher before the job is archived.
fn stop_signal() -> io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}

/// One launch, resolved from the command line and the environment. (No `Debug`: the
/// environment holds secrets.)
#[derive(Clone)]
pub struct Launch {
    pub job: JobSettings,
    /// Confine the job's process (see `LaunchArgs::isolate`).
    pub isolation: Option<JobIsolation>,
    /// Rlimits of the function's processes (see `bounds`).
    pub limits: ProcessLimits,
    /// The launcher's environment; the job gets it through `child_environment`, and its
    /// `ARGUMENTS_PATH` and `RESULTS_PATH` say where the arguments go and the result is found.
    pub environment: Vec<(OsString, OsString)>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to create the work directory {path}")]
    WorkDir { path: PathBuf, source: io::Error },
    #[error("failed to find the artifact {key} in storage")]
    ArtifactMissing { key: String },
    #[error("failed to download {key}")]
    Download { key: String, source: BoxError },
    #[error("failed to read {key}")]
    ReadObject { key: String, source: io::Error },
    #[error("failed to save {path}")]
    SaveObject { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Data(#[from] data_area::Error),
    #[error("failed to unpack the artifact: {reason}")]
    Unpack { reason: String },
    #[error("failed to find the entrypoint {entrypoint} in the artifact")]
    Entrypoint { entrypoint: String },
    #[error("failed to place the arguments at {to}")]
    Arguments { to: PathBuf, source: io::Error },
    #[error("failed to find the job's arguments in storage")]
    ArgumentsMissing,
    #[error("failed to remove the stale result {path}")]
    StaleResult { path: PathBuf, source: io::Error },
    #[error("failed to stop before the function started: the job was stopped")]
    StoppedBeforeStart,
    #[error("failed to start {python}")]
    Spawn { python: String, source: io::Error },
    #[error("failed to isolate the job")]
    Isolation(#[from] isolation::Error),
    #[error("failed to prepare the job's folder {path} for isolation")]
    IsolationFolder { path: PathBuf, source: io::Error },
    #[error("failed to read the result {path}")]
    Result { path: PathBuf, source: io::Error },
    #[error("failed to wait for the function's process")]
    Wait { source: io::Error },
    #[error("failed to upload {key}")]
    Upload { key: String, source: BoxError },
}

/// Runs the whole launch: prepare, run until python exits (or `stop` completes and the process
/// group is killed), archive. Never fails: every failure ends up in the exit record and the
/// returned exit code (see `LaunchArgs::run`).
pub async fn run_job(launch: &Launch, storage: &dyn JobObjects, stop: impl Future<Output = ()>) -> i32 {
    // The launch's span, a child of the job's start (`TRACEPARENT`, set by the runner or the pod).
    let parent = context::ENVIRONMENT.iter().find_map(|name| environment_text(&launch.environment, name));
    let span = context::job_span("gantry.launch", &launch.job.job_id, parent.as_deref());
    run_job_traced(launch, storage, stop).instrument(span).await
}

async fn run_job_traced(launch: &Launch, storage: &dyn JobObjects, stop: impl Future<Output = ()>) -> i32 {
    let mut stop = std::pin::pin!(stop);
    let mut environment = child_environment(launch.environment.iter().cloned());
    // The collector's credentials stay with the launcher.
    environment.retain(|(name, _)| !telemetry::COLLECTOR_CREDENTIALS.iter().any(|secret| name == secret));
    if launch.isolation.is_some() {
        // A private temporary folder: the job may not use the machine's shared /tmp.
        let private = launch.job.work_dir.join(PRIVATE_TMP);
        environment.retain(|(name, _)| name != "TMPDIR" && name != "HOME");
        environment.push(("TMPDIR".into(), private.clone().into()));
        environment.push(("HOME".into(), private.into()));
    }
    // A stop already asked for wins: without `biased`, a preparation that never had to wait
    // (its blocking steps done before their first poll, on a busy machine) could start the job.
    let prepared = tokio::select! {
        biased;
        () = stop.as_mut() => Err(Error::StoppedBeforeStart),
        prepared = prepare(launch, storage, &environment).instrument(prepare::step("gantry.launch.prepare", launch)) => prepared,
    };
    // The function's own spans join the trace under this one.
    let function_span = prepare::step("gantry.launch.function", launch);
    if let Some(traceparent) = context::traceparent_of(&function_span) {
        environment.retain(|(name, _)| !context::ENVIRONMENT.iter().any(|variable| name == variable));
        environment.extend(context::ENVIRONMENT.iter().map(|name| (name.into(), traceparent.clone().into())));
    }
    let started = prepared
        .and_then(|(script, data)| Ok((function_span.in_scope(|| spawn(launch, &environment, &script))?, data)));
    let (child, data) = match started {
        Ok(started) => started,
        Err(error) => {
            function_span.record("otel.status_code", "ERROR");
            drop(function_span);
            let recording = prepare::step("gantry.launch.archive", launch);
            return record_failure(launch, storage, &error).instrument(recording).await;
        }
    };
    let supervised = async {
        match &data {
            Some(mirror) => tokio::select! {
                ending = supervise(launch, child, stop) => ending,
                () = mirror.keep_syncing() => unreachable!("syncing never ends"),
            },
            None => supervise(launch, child, stop).await,
        }
    };
    let ending = supervised.instrument(function_span).await;
    let archiving = prepare::step("gantry.launch.archive", launch);
    archive(launch, storage, &environment, data.as_ref(), ending).instrument(archiving).await
}

/// A variable of the launcher's environment, as text.
fn environment_text(environment: &[(OsString, OsString)], name: &str) -> Option<String> {
    environment.iter().find(|(key, _)| key == name).and_then(|(_, value)| value.to_str()).map(str::to_string)
}

/// The job's environment: the launcher's minus its own settings (every `GANTRY_*` variable, the
/// storage credentials, the log limit), with `PYTHONUNBUFFERED=1` unless the function sets it,
/// so the live logs follow the job.
pub fn child_environment(variables: impl IntoIterator<Item = (OsString, OsString)>) -> Vec<(OsString, OsString)> {
    let mut environment: Vec<_> = variables.into_iter().filter(|(name, _)| !is_launcher_setting(name)).collect();
    if !environment.iter().any(|(name, _)| name == "PYTHONUNBUFFERED") {
        environment.push(("PYTHONUNBUFFERED".into(), "1".into()));
    }
    environment
}

fn is_launcher_setting(name: &OsStr) -> bool {
    let name = name.as_encoded_bytes();
    name.starts_with(b"GANTRY_") || LAUNCHER_VARIABLES.iter().any(|variable| name == variable.as_bytes())
}

/// A non-empty path from the job's environment.
fn environment_path(environment: &[(OsString, OsString)], name: &str) -> Option<PathBuf> {
    environment.iter().find(|(key, value)| key == name && !value.is_empty()).map(|(_, value)| PathBuf::from(value))
}

fn code_dir(launch: &Launch) -> PathBuf {
    launch.job.code_dir.clone().unwrap_or_else(|| launch.job.work_dir.join("code"))
}

#[cfg(test)]
mod tests;
