//! The job launcher (`gantry launch`), the process that runs inside every job: as a child of the
//! local runner or as the pod's command. It fetches the function's artifact and unpacks it
//! member by member, places the arguments file, runs `python <entrypoint>` in its own process
//! group with stdout and stderr on one pipe (so lines keep the order they were written in), passes
//! the output through to its own stdout while routing it into the user and
//! provider logs (`domain::logs`), keeps live copies of both logs in the work directory, and at
//! the end ships the result, the logs and an exit record to object storage. The exit record is
//! written last, so its presence means everything else of the job is archived.

use std::ffi::{OsStr, OsString};
use std::future::Future;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::process::{Child, Command};

use super::data_area::{self, Area, GatewayArea, Mirror, StorageArea};
use super::isolation::{self, JobIsolation, Sandbox};
use crate::artifact::{MemberKind, check_member};
use crate::domain::logs::{LogRouter, TailBuffer, missing_client_hint};
use crate::secrets::Secret;
use crate::storage::access::JobAccess;
use crate::storage::{Storage, StorageArgs, keys};

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
    /// Largest size in bytes of each log; the oldest lines are dropped first.
    #[arg(long, env = "FUNCTIONS_LOGS_SIZE_LIMIT", default_value_t = 52_428_800)]
    pub logs_size_limit: usize,
    /// Folder of object keys (ending with `/`) holding the user's file area, when `DATA_PATH`
    /// is not that area itself (S3 storage): its files are copied into `DATA_PATH` before the
    /// function runs, and files the function added, changed or removed there are copied back
    /// at the end. Only files directly in the folder, as the files API lists them.
    #[arg(long, env = "GANTRY_DATA_KEY")]
    pub data_key: Option<String>,
    /// In a pod: the function whose file area `DATA_PATH` mirrors through the gateway's files
    /// API, with the job's token (`ENV_JOB_GATEWAY_HOST`, `ENV_JOB_GATEWAY_TOKEN`).
    #[arg(long, env = "GANTRY_DATA_FUNCTION")]
    pub data_function: Option<String>,
    /// The provider of that function, for a provider function.
    #[arg(long, env = "GANTRY_DATA_PROVIDER")]
    pub data_provider: Option<String>,
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
    #[command(flatten)]
    pub storage: StorageArgs,
}

impl LaunchArgs {
    /// Runs the job to its end, stopping it on SIGTERM or SIGINT, and returns the exit code for
    /// the launcher's process: python's own code, 128 + the signal that ended it, or
    /// `EXIT_NOT_STARTED`. Fails only when the storage settings are unusable, since nothing
    /// can be recorded then.
    pub async fn run(self) -> anyhow::Result<i32> {
        let Self {
            job_id,
            work_dir,
            artifact_key,
            code_dir,
            entrypoint,
            python,
            arguments_file,
            provider_function,
            logs_size_limit,
            data_key,
            data_function,
            data_provider,
            access,
            isolate,
            job_uid,
            job_gid,
            read_paths,
            storage,
        } = self;
        // The job runs beside this process: keep its memory and environment out of reach.
        isolation::forbid_dumping().context("failed to make the launcher non-dumpable")?;
        let isolation = isolate.then(|| JobIsolation { user: job_uid.zip(job_gid), readable: read_paths });
        let objects: Box<dyn JobObjects> = match access.filter(|a| !a.expose().trim().is_empty()) {
            Some(access) => Box::new(
                serde_json::from_str::<JobAccess>(access.expose())
                    .context("GANTRY_JOB_ACCESS is not valid job access")?,
            ),
            None => Box::new(storage.open(&work_dir)?),
        };
        let stop = stop_signal().context("failed to install the signal handlers")?;
        let launch = Launch {
            job_id,
            work_dir,
            artifact_key,
            code_dir,
            entrypoint,
            python,
            arguments_file,
            provider_function,
            logs_size_limit,
            data_key,
            data_function,
            data_provider,
            isolation,
            environment: std::env::vars_os().collect(),
        };
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
    pub job_id: String,
    pub work_dir: PathBuf,
    pub artifact_key: Option<String>,
    /// The function's code folder in the image, when there is no artifact.
    pub code_dir: Option<PathBuf>,
    pub entrypoint: String,
    pub python: String,
    pub arguments_file: Option<PathBuf>,
    pub provider_function: bool,
    pub logs_size_limit: usize,
    /// The user's file area in storage, mirrored into `DATA_PATH` (see `LaunchArgs::data_key`).
    pub data_key: Option<String>,
    /// The function whose area `DATA_PATH` mirrors through the gateway (see
    /// `LaunchArgs::data_function`), and its provider.
    pub data_function: Option<String>,
    pub data_provider: Option<String>,
    /// Confine the job's process (see `LaunchArgs::isolate`).
    pub isolation: Option<JobIsolation>,
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

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where a job's objects are: the shared storage (local runner), or the job's scoped access
/// (a pod, which holds no storage credentials).
#[async_trait::async_trait]
pub trait JobObjects: Send + Sync {
    /// Streams the object `key` into `destination`; false when there is no such object.
    async fn fetch(&self, key: &str, destination: &Path) -> Result<bool, BoxError>;
    async fn store_file(&self, key: &str, path: &Path) -> Result<(), BoxError>;
    async fn store_bytes(&self, key: &str, bytes: Bytes) -> Result<(), BoxError>;
    /// The shared storage, when the launcher has it (to mirror the user's file area).
    fn shared(&self) -> Option<&Storage>;
}

#[async_trait::async_trait]
impl JobObjects for Storage {
    async fn fetch(&self, key: &str, destination: &Path) -> Result<bool, BoxError> {
        let Some(object) = self.get(key).await? else { return Ok(false) };
        let mut file = tokio::fs::File::create(destination).await?;
        let mut body = object.body;
        while let Some(chunk) = body.next().await {
            file.write_all(&chunk?).await?;
        }
        file.flush().await?;
        Ok(true)
    }

    async fn store_file(&self, key: &str, path: &Path) -> Result<(), BoxError> {
        Ok(self.put_file(key, path).await?)
    }

    async fn store_bytes(&self, key: &str, bytes: Bytes) -> Result<(), BoxError> {
        Ok(self.put_bytes(key, bytes).await?)
    }

    fn shared(&self) -> Option<&Storage> {
        Some(self)
    }
}

#[async_trait::async_trait]
impl JobObjects for JobAccess {
    async fn fetch(&self, key: &str, destination: &Path) -> Result<bool, BoxError> {
        Ok(self.download(key, destination).await?)
    }

    async fn store_file(&self, key: &str, path: &Path) -> Result<(), BoxError> {
        Ok(self.put_file(key, path).await?)
    }

    async fn store_bytes(&self, key: &str, bytes: Bytes) -> Result<(), BoxError> {
        Ok(self.put_bytes(key, bytes).await?)
    }

    fn shared(&self) -> Option<&Storage> {
        None
    }
}

/// Runs the whole launch: prepare, run until python exits (or `stop` completes and the process
/// group is killed), archive. Never fails: every failure ends up in the exit record and the
/// returned exit code (see `LaunchArgs::run`).
pub async fn run_job(launch: &Launch, storage: &dyn JobObjects, stop: impl Future<Output = ()>) -> i32 {
    let mut stop = std::pin::pin!(stop);
    let mut environment = child_environment(launch.environment.iter().cloned());
    if launch.isolation.is_some() {
        // A private temporary folder: the job may not use the machine's shared /tmp.
        let private = launch.work_dir.join(PRIVATE_TMP);
        environment.retain(|(name, _)| name != "TMPDIR" && name != "HOME");
        environment.push(("TMPDIR".into(), private.clone().into()));
        environment.push(("HOME".into(), private.into()));
    }
    let prepared = tokio::select! {
        prepared = prepare(launch, storage, &environment) => prepared,
        () = stop.as_mut() => Err(Error::StoppedBeforeStart),
    };
    let started = prepared.and_then(|(script, data)| Ok((spawn(launch, &environment, &script)?, data)));
    let (child, data) = match started {
        Ok(started) => started,
        Err(error) => return record_failure(launch, storage, &error).await,
    };
    let ending = match &data {
        Some(mirror) => tokio::select! {
            ending = supervise(launch, child, stop) => ending,
            () = mirror.keep_syncing() => unreachable!("syncing never ends"),
        },
        None => supervise(launch, child, stop).await,
    };
    archive(launch, storage, &environment, data.as_ref(), ending).await
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
    launch.code_dir.clone().unwrap_or_else(|| launch.work_dir.join("code"))
}

/// Downloads and unpacks the artifact, copies the user's file area into `DATA_PATH` when it
/// lives in storage, places the arguments and clears a stale result; returns the script
/// argument for python and what the copied area held.
async fn prepare(
    launch: &Launch,
    storage: &dyn JobObjects,
    environment: &[(OsString, OsString)],
) -> Result<(String, Option<Mirror>), Error> {
    tokio::fs::create_dir_all(&launch.work_dir)
        .await
        .map_err(|source| Error::WorkDir { path: launch.work_dir.clone(), source })?;
    let code = code_dir(launch);
    if let Some(artifact_key) = &launch.artifact_key {
        let archive = launch.work_dir.join("artifact.tar");
        if !download(storage, artifact_key, &archive).await? {
            return Err(Error::ArtifactMissing { key: artifact_key.clone() });
        }
        let unpack_into = code.clone();
        tokio::task::spawn_blocking(move || unpack(&archive, &unpack_into))
            .await
            .map_err(|e| Error::Unpack { reason: e.to_string() })?
            .map_err(|reason| Error::Unpack { reason })?;
    }

    let entrypoint_missing = || Error::Entrypoint { entrypoint: launch.entrypoint.clone() };
    let entrypoint = check_member(&launch.entrypoint, MemberKind::File, None).map_err(|_| entrypoint_missing())?;
    let is_file = tokio::fs::metadata(code.join(&entrypoint)).await.is_ok_and(|metadata| metadata.is_file());
    if entrypoint.is_empty() || !is_file {
        return Err(entrypoint_missing());
    }

    let area: Option<Box<dyn Area>> = match (&launch.data_key, storage.shared(), &launch.data_function) {
        (Some(key), Some(shared), _) => Some(Box::new(StorageArea { storage: shared.clone(), key: key.clone() })),
        (_, None, Some(function)) => {
            GatewayArea::from_environment(environment, function, launch.data_provider.as_deref())
                .map(|area| Box::new(area) as Box<dyn Area>)
        }
        _ => None,
    };
    let data = match (area, environment_path(environment, "DATA_PATH")) {
        (Some(area), Some(folder)) => {
            let mirror = Mirror::pull(area, &folder).await?;
            // An isolated job may swap its files for links to the server's: copy them out first.
            Some(if launch.isolation.is_some() { mirror.stage_through(launch.work_dir.join(OUTBOX)) } else { mirror })
        }
        _ => None,
    };
    if let Some(destination) = environment_path(environment, "ARGUMENTS_PATH") {
        let arguments_error = |source| Error::Arguments { to: destination.clone(), source };
        if let Some(parent) = destination.parent() {
            tokio::fs::create_dir_all(parent).await.map_err(arguments_error)?;
        }
        match &launch.arguments_file {
            Some(file) => {
                tokio::fs::copy(file, &destination).await.map_err(arguments_error)?;
            }
            None => {
                if !download(storage, &keys::job_arguments(&launch.job_id), &destination).await? {
                    return Err(Error::ArgumentsMissing);
                }
            }
        }
    }
    if let Some(results) = environment_path(environment, "RESULTS_PATH") {
        match tokio::fs::remove_file(&results).await {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(Error::StaleResult { path: results, source: e });
            }
            _ => {}
        }
        if let Some(parent) = results.parent() {
            // The job's helper creates the folder too; failing here is not fatal.
            let _ = tokio::fs::create_dir_all(parent).await;
        }
    }
    if let Some(isolation) = &launch.isolation {
        hand_over_folders(launch, isolation, environment).await?;
    }
    // A script named like an option would be taken for one by python.
    let script = if entrypoint.starts_with('-') { format!("./{entrypoint}") } else { entrypoint };
    Ok((script, data))
}

/// The folders an isolated job owns: its code (its working folder), its private temporary
/// folder and `DATA_PATH`.
fn job_folders(launch: &Launch, environment: &[(OsString, OsString)]) -> Vec<PathBuf> {
    let mut folders = vec![code_dir(launch), launch.work_dir.join(PRIVATE_TMP)];
    folders.extend(environment_path(environment, "DATA_PATH"));
    folders
}

/// Makes the work folder passable but not readable for the job (its logs and the launcher's
/// files stay the launcher's), creates the job's private temporary folder and, when the job
/// runs as another user, gives it its folders.
async fn hand_over_folders(
    launch: &Launch,
    isolation: &JobIsolation,
    environment: &[(OsString, OsString)],
) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    let folder_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::IsolationFolder { path, source }
    };
    tokio::fs::set_permissions(&launch.work_dir, std::fs::Permissions::from_mode(0o711))
        .await
        .map_err(folder_error(&launch.work_dir))?;
    let private = launch.work_dir.join(PRIVATE_TMP);
    tokio::fs::create_dir_all(&private).await.map_err(folder_error(&private))?;
    tokio::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700))
        .await
        .map_err(folder_error(&private))?;
    if let Some((uid, gid)) = isolation.user {
        let folders = job_folders(launch, environment);
        tokio::task::spawn_blocking(move || {
            folders
                .iter()
                .filter(|folder| folder.exists())
                .try_for_each(|folder| isolation::hand_over(folder, uid, gid))
        })
        .await
        .map_err(|e| Error::IsolationFolder { path: launch.work_dir.clone(), source: io::Error::other(e) })??;
    }
    Ok(())
}

/// The sandbox of an isolated job: its folders, its interpreter's installation, the extra
/// readable folders and its user.
fn sandbox(launch: &Launch, isolation: &JobIsolation, environment: &[(OsString, OsString)]) -> Sandbox {
    let path = environment.iter().find(|(name, _)| name == "PATH").map(|(_, value)| value.as_os_str());
    let mut readable = isolation::interpreter_paths(&launch.python, path);
    readable.extend(isolation.readable.iter().cloned());
    Sandbox { writable: job_folders(launch, environment), readable, user: isolation.user }
}

/// Copies the job's result file to the launcher's own folder without following links (the job
/// could have made it a link to a file of the server's); `None` when there is no result file.
async fn copy_result(
    launch: &Launch,
    environment: &[(OsString, OsString)],
    results: &Path,
) -> Result<Option<PathBuf>, Error> {
    let data = environment_path(environment, "DATA_PATH");
    let (root, relative) = match data.as_deref().and_then(|data| Some((data, results.strip_prefix(data).ok()?))) {
        Some((root, relative)) => (root.to_path_buf(), relative.to_path_buf()),
        None => match (results.parent(), results.file_name()) {
            (Some(parent), Some(name)) => (parent.to_path_buf(), PathBuf::from(name)),
            _ => return Ok(None),
        },
    };
    let copy = launch.work_dir.join(RESULT_COPY);
    let destination = copy.clone();
    let copied = tokio::task::spawn_blocking(move || -> io::Result<bool> {
        let mut source = match isolation::open_beneath(&root, &relative) {
            Ok(file) => file,
            Err(error) if matches!(error.kind(), io::ErrorKind::NotFound | io::ErrorKind::InvalidInput) => {
                return Ok(false);
            }
            Err(error) => return Err(error),
        };
        let mut file = std::fs::File::create(&destination)?;
        io::copy(&mut source, &mut file)?;
        Ok(true)
    })
    .await
    .map_err(io::Error::other)
    .and_then(|copied| copied)
    .map_err(|source| Error::Result { path: results.to_path_buf(), source })?;
    Ok(copied.then_some(copy))
}

async fn download(storage: &dyn JobObjects, key: &str, destination: &Path) -> Result<bool, Error> {
    storage.fetch(key, destination).await.map_err(|source| Error::Download { key: key.to_string(), source })
}

/// Unpacks the tar `archive` into a fresh directory `root`, member by member. Every member is
/// checked with `artifact::check_member`; folders and files are created by hand below `root`,
/// never through a link, and symbolic links are created only after every file, so no member
/// is ever written through one. Anything that is not a folder, file or link is refused.
fn unpack(archive: &Path, root: &Path) -> Result<(), String> {
    if std::fs::symlink_metadata(root).is_ok() {
        std::fs::remove_dir_all(root).map_err(|e| format!("failed to clear {}: {e}", root.display()))?;
    }
    std::fs::create_dir_all(root).map_err(|e| format!("failed to create {}: {e}", root.display()))?;
    let file = std::fs::File::open(archive).map_err(|e| format!("failed to open the artifact: {e}"))?;
    let invalid = |e: io::Error| format!("the artifact is not a valid tar archive: {e}");
    let mut tar = tar::Archive::new(file);
    let mut symlinks = Vec::new();
    for entry in tar.entries().map_err(invalid)? {
        let mut entry = entry.map_err(invalid)?;
        let entry_type = entry.header().entry_type();
        let path = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let link = entry.link_name_bytes().map(|target| String::from_utf8_lossy(&target).into_owned());
        match entry_type {
            tar::EntryType::XGlobalHeader
            | tar::EntryType::XHeader
            | tar::EntryType::GNULongName
            | tar::EntryType::GNULongLink => {}
            tar::EntryType::Directory => {
                let relative = check_member(&path, MemberKind::Directory, None)?;
                create_folders(root, &relative, true)?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                let relative = check_member(&path, MemberKind::File, None)?;
                let destination = clear_destination(root, &relative)?;
                let executable = entry.header().mode().is_ok_and(|mode| mode & 0o111 != 0);
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(if executable { 0o755 } else { 0o644 })
                    .open(&destination)
                    .map_err(|e| format!("failed to create member '{relative}': {e}"))?;
                io::copy(&mut entry, &mut file).map_err(|e| format!("failed to write member '{relative}': {e}"))?;
            }
            tar::EntryType::Symlink => {
                let target = link.unwrap_or_default();
                let relative = check_member(&path, MemberKind::Link, Some(&target))?;
                symlinks.push((relative, target));
            }
            tar::EntryType::Link => {
                // Hard link targets are relative to the archive root, not to the member's folder.
                let target = link.unwrap_or_default();
                let depth = Path::new(&path).components().count().saturating_sub(1);
                let from_member = format!("{}{target}", "../".repeat(depth));
                let relative = check_member(&path, MemberKind::Link, Some(&from_member))?;
                let source = check_member(&target, MemberKind::File, None)?;
                let source_path = existing_file(root, &source)
                    .ok_or_else(|| format!("member '{path}' links to '{target}', which is not an earlier file"))?;
                let destination = clear_destination(root, &relative)?;
                std::fs::hard_link(&source_path, &destination)
                    .map_err(|e| format!("failed to create member '{relative}': {e}"))?;
            }
            _ => {
                check_member(&path, MemberKind::Other, None)?;
            }
        }
    }
    for (relative, target) in symlinks {
        let destination = clear_destination(root, &relative)?;
        std::os::unix::fs::symlink(&target, &destination)
            .map_err(|e| format!("failed to create member '{relative}': {e}"))?;
    }
    Ok(())
}

/// Creates the folders of the normalized relative path `relative` below `root` (its last
/// component too when `whole`), refusing to pass through anything but a real folder.
fn create_folders(root: &Path, relative: &str, whole: bool) -> Result<PathBuf, String> {
    let components: Vec<&str> = relative.split('/').filter(|c| !c.is_empty()).collect();
    let folders = if whole { components.len() } else { components.len().saturating_sub(1) };
    let mut current = root.to_path_buf();
    for component in &components[..folders] {
        current.push(component);
        match std::fs::symlink_metadata(&current) {
            Ok(metadata) if metadata.is_dir() => {}
            Ok(_) => {
                return Err(format!("member '{relative}' passes through a file or link"));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir(&current).map_err(|e| format!("failed to create folder for '{relative}': {e}"))?
            }
            Err(e) => return Err(format!("failed to inspect '{relative}': {e}")),
        }
    }
    Ok(root.join(relative))
}

/// The path of a new file or link member below `root`, with its folders created and an
/// earlier file or link of the same name removed (a later member wins, as with `tar -x`).
fn clear_destination(root: &Path, relative: &str) -> Result<PathBuf, String> {
    if relative.is_empty() {
        return Err("a file member has an empty name".to_string());
    }
    let destination = create_folders(root, relative, false)?;
    match std::fs::symlink_metadata(&destination) {
        Ok(metadata) if metadata.is_dir() => {
            Err(format!("member '{relative}' conflicts with a folder of the same name"))
        }
        Ok(_) => std::fs::remove_file(&destination)
            .map(|()| destination)
            .map_err(|e| format!("failed to replace member '{relative}': {e}")),
        Err(_) => Ok(destination),
    }
}

/// The path of an already unpacked regular file, reached without passing through a link.
fn existing_file(root: &Path, relative: &str) -> Option<PathBuf> {
    let mut current = root.to_path_buf();
    let components: Vec<&str> = relative.split('/').collect();
    let (last, folders) = components.split_last()?;
    for folder in folders {
        current.push(folder);
        if !std::fs::symlink_metadata(&current).ok()?.is_dir() {
            return None;
        }
    }
    current.push(last);
    std::fs::symlink_metadata(&current).ok()?.is_file().then_some(current)
}

/// The function's process and the read end of its output: stdout and stderr are one pipe (as a
/// shell's `2>&1`), so the log keeps the order in which the process wrote its lines.
struct Started {
    child: Child,
    output: std::io::PipeReader,
}

fn spawn(launch: &Launch, environment: &[(OsString, OsString)], script: &str) -> Result<Started, Error> {
    let spawn_error = |source| Error::Spawn { python: launch.python.clone(), source };
    let (output, writer) = std::io::pipe().map_err(spawn_error)?;
    let error_writer = writer.try_clone().map_err(spawn_error)?;
    let mut command = Command::new(&launch.python);
    if let Some(isolation) = &launch.isolation {
        let prepared = sandbox(launch, isolation, environment).prepare()?;
        if !prepared.enforced() {
            eprintln!("gantry launch: warning: the kernel does not offer Landlock; the job is not confined");
        }
        prepared.apply_to(&mut command);
    }
    command
        .arg(script)
        .current_dir(code_dir(launch))
        .env_clear()
        .envs(environment.iter().map(|(name, value)| (name, value)))
        .stdin(Stdio::null())
        .stdout(Stdio::from(writer))
        .stderr(Stdio::from(error_writer))
        .process_group(0);
    let child = command.spawn().map_err(spawn_error)?;
    // The command holds this process's copies of the write end: dropped here, the pipe ends
    // when the last process of the job closes it.
    drop(command);
    Ok(Started { child, output })
}

/// The logs of the running job, shared by the two output readers and the live-log writer.
struct Live {
    router: LogRouter,
    /// Lines arrived since the live logs were last written.
    changed: bool,
}

fn lock(live: &Mutex<Live>) -> std::sync::MutexGuard<'_, Live> {
    live.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How the function's process ended, and its logs.
struct Ending {
    status: Result<ExitStatus, Error>,
    router: LogRouter,
}

/// Reads the output until python exits, keeping the live logs current; on `stop`, terminates
/// the process group, then kills it after `STOP_GRACE`.
async fn supervise<F: Future<Output = ()>>(launch: &Launch, started: Started, mut stop: Pin<&mut F>) -> Ending {
    let live = Arc::new(Mutex::new(Live {
        router: LogRouter::new(launch.provider_function, launch.logs_size_limit),
        changed: true,
    }));
    let Started { mut child, output } = started;
    let group = child.id();
    let mut readers = Vec::new();
    // One stream for both (the order the process wrote in), echoed to the launcher's stdout.
    match tokio::net::unix::pipe::Receiver::from_owned_fd(std::os::fd::OwnedFd::from(output)) {
        Ok(output) => {
            readers.push(tokio::spawn(pump(output, tokio::io::stdout(), live.clone(), launch.logs_size_limit)));
        }
        Err(error) => eprintln!("gantry launch: failed to read the job's output: {error}"),
    }

    let mut ticker = tokio::time::interval(LIVE_LOG_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stop_requested = false;
    let mut kill_at = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.map_err(|source| Error::Wait { source }),
            () = stop.as_mut(), if !stop_requested => {
                stop_requested = true;
                signal_group(group, libc::SIGTERM);
                kill_at = Some(tokio::time::Instant::now() + STOP_GRACE);
            }
            () = tokio::time::sleep_until(kill_at.unwrap_or_else(tokio::time::Instant::now)),
                if kill_at.is_some() => {
                signal_group(group, libc::SIGKILL);
                kill_at = None;
            }
            _ = ticker.tick() => {
                let _ = write_live_logs(&launch.work_dir, &live).await;
            }
        }
    };

    // The pipes close when the last process holding them ends. Whatever the job left running
    // gets a short grace, then the whole group is killed; readers still blocked after that
    // (a process that left the group) are abandoned.
    let aborts: Vec<_> = readers.iter().map(|r| r.abort_handle()).collect();
    let mut drained = std::pin::pin!(futures::future::join_all(readers));
    let _ = tokio::time::timeout(DRAIN_GRACE, drained.as_mut()).await;
    signal_group(group, libc::SIGKILL);
    if tokio::time::timeout(DRAIN_GRACE, drained.as_mut()).await.is_err() {
        aborts.iter().for_each(tokio::task::AbortHandle::abort);
        drained.await;
    }

    {
        lock(&live).changed = true;
    }
    if let Err(e) = write_live_logs(&launch.work_dir, &live).await {
        eprintln!("gantry launch: failed to write the live logs: {e}");
    }
    let router = std::mem::replace(&mut lock(&live).router, LogRouter::new(launch.provider_function, 0));
    Ending { status, router }
}

/// Sends `signal` to the process group led by the function's process (created with
/// `process_group(0)`, so its id is the group's).
fn signal_group(group: Option<u32>, signal: libc::c_int) {
    let Some(group) = group.and_then(|id| libc::pid_t::try_from(id).ok()) else {
        return;
    };
    if group > 1 {
        // SAFETY: `kill` has no memory-safety preconditions; a negative id names a group.
        unsafe {
            libc::kill(-group, signal);
        }
    }
}

/// Copies the job's output pipe to `echo` unchanged and routes its lines into the logs.
/// Write errors on `echo` (the launcher's own output closed) are ignored.
async fn pump(
    mut pipe: impl AsyncRead + Unpin,
    mut echo: impl AsyncWrite + Unpin,
    live: Arc<Mutex<Live>>,
    logs_size_limit: usize,
) {
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    let mut lines = LineSplitter::new(logs_size_limit);
    let mut echo_open = true;
    loop {
        let read = match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        let bytes = &chunk[..read];
        if echo_open {
            echo_open = echo.write_all(bytes).await.is_ok() && echo.flush().await.is_ok();
        }
        let mut live = lock(&live);
        lines.feed(bytes, |line| live.router.push_line(line));
        live.changed = true;
    }
    if let Some(line) = lines.finish() {
        let mut live = lock(&live);
        live.router.push_line(&line);
        live.changed = true;
    }
}

/// Splits a byte stream into lines (lossy UTF-8, without `\n` or `\r\n`) in bounded memory:
/// of a line longer than the log limit only its first bytes (for the tag) and its last
/// `max_line_bytes` (all a log could keep of it) are held.
struct LineSplitter {
    pending: Vec<u8>,
    max_line_bytes: usize,
}

impl LineSplitter {
    fn new(max_line_bytes: usize) -> Self {
        Self { pending: Vec::new(), max_line_bytes: max_line_bytes.max(1) }
    }

    fn feed(&mut self, mut bytes: &[u8], mut emit: impl FnMut(&str)) {
        while let Some(end) = bytes.iter().position(|b| *b == b'\n') {
            self.append(&bytes[..end]);
            emit(&self.take());
            bytes = &bytes[end + 1..];
        }
        self.append(bytes);
    }

    /// The last line when the stream did not end with a newline.
    fn finish(&mut self) -> Option<String> {
        (!self.pending.is_empty()).then(|| self.take())
    }

    fn append(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
        if self.pending.len() > LINE_HEAD_BYTES + 2 * self.max_line_bytes {
            let cut_end = self.pending.len() - self.max_line_bytes;
            self.pending.drain(LINE_HEAD_BYTES..cut_end);
        }
    }

    fn take(&mut self) -> String {
        if self.pending.last() == Some(&b'\r') {
            self.pending.pop();
        }
        let line = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        line
    }
}

/// Writes the renders of both logs to the work directory if lines arrived since last time.
async fn write_live_logs(work_dir: &Path, live: &Mutex<Live>) -> io::Result<()> {
    let (user, provider) = {
        let mut live = lock(live);
        if !live.changed {
            return Ok(());
        }
        live.changed = false;
        let router = &live.router;
        (router.user.render(), router.provider_function().then(|| router.provider.render()))
    };
    write_atomically(&work_dir.join(LIVE_USER_LOG), user.as_bytes()).await?;
    if let Some(provider) = provider {
        write_atomically(&work_dir.join(LIVE_PROVIDER_LOG), provider.as_bytes()).await?;
    }
    Ok(())
}

/// Replaces `path` whole, so a reader never sees a partial file.
async fn write_atomically(path: &Path, contents: &[u8]) -> io::Result<()> {
    crate::shared::replace_file(path, crate::shared::Contents::Bytes(contents), None).await
}

/// Ships the user's files (when the area lives in storage), the result and the logs, then the
/// exit record; returns the launcher's exit code.
async fn archive(
    launch: &Launch,
    storage: &dyn JobObjects,
    environment: &[(OsString, OsString)],
    data: Option<&Mirror>,
    ending: Ending,
) -> i32 {
    let Ending { status, mut router } = ending;
    let failed = !matches!(&status, Ok(status) if status.success());
    if failed && router.missing_client() {
        let hint = format!("gantry launch: hint: {}", missing_client_hint(&launch.python));
        eprintln!("{hint}");
        router.user.push(&hint);
        if router.provider_function() {
            router.provider.push(&hint);
        }
    }
    let mut problems = Vec::new();
    if let Some(mirror) = data {
        problems.extend(mirror.sync().await.into_iter().map(Error::Data));
    }
    if let Some(results) = environment_path(environment, "RESULTS_PATH") {
        match copy_result(launch, environment, &results).await {
            Ok(Some(copy)) => {
                let key = keys::job_result(&launch.job_id);
                if let Err(source) = storage.store_file(&key, &copy).await {
                    problems.push(Error::Upload { key, source });
                }
            }
            Ok(None) => {}
            Err(error) => problems.push(error),
        }
    }
    let provider = router.provider_function().then(|| router.provider.render());
    problems.extend(upload_logs(launch, storage, router.user.render(), provider).await);

    let (exit_code, signal, code, error) = match &status {
        Ok(status) => {
            let code = status.code().or_else(|| status.signal().map(|signal| 128 + signal)).unwrap_or(1);
            (status.code(), status.signal(), code, None)
        }
        Err(error) => (None, None, EXIT_NOT_STARTED, Some(describe(error))),
    };
    for problem in &problems {
        eprintln!("gantry launch: {}", describe(problem));
    }
    let error = error.or_else(|| problems.first().map(|problem| describe(problem)));
    write_exit_record(launch, storage, exit_code, signal, error).await;
    code
}

/// Records a launch that failed before python ran: the reason goes to stderr, to the logs and
/// to the exit record.
async fn record_failure(launch: &Launch, storage: &dyn JobObjects, error: &Error) -> i32 {
    let reason = describe(error);
    eprintln!("gantry launch: {reason}");
    let mut log = TailBuffer::new(launch.logs_size_limit);
    log.push(&format!("gantry launch: {reason}"));
    let text = log.render();
    let _ = write_atomically(&launch.work_dir.join(LIVE_USER_LOG), text.as_bytes()).await;
    let provider = launch.provider_function.then(|| text.clone());
    if let Some(provider) = &provider {
        let path = launch.work_dir.join(LIVE_PROVIDER_LOG);
        let _ = write_atomically(&path, provider.as_bytes()).await;
    }
    for problem in upload_logs(launch, storage, text, provider).await {
        eprintln!("gantry launch: {}", describe(&problem));
    }
    write_exit_record(launch, storage, None, None, Some(reason)).await;
    EXIT_NOT_STARTED
}

async fn upload_logs(launch: &Launch, storage: &dyn JobObjects, user: String, provider: Option<String>) -> Vec<Error> {
    let mut logs = vec![(keys::job_user_log(&launch.job_id), user)];
    if let Some(provider) = provider {
        logs.push((keys::job_provider_log(&launch.job_id), provider));
    }
    let mut problems = Vec::new();
    for (key, text) in logs {
        if let Err(source) = storage.store_bytes(&key, Bytes::from(text)).await {
            problems.push(Error::Upload { key, source });
        }
    }
    problems
}

/// Writes `keys::job_exit`: `{"exit_code", "signal", "error"}`, each possibly null.
async fn write_exit_record(
    launch: &Launch,
    storage: &dyn JobObjects,
    exit_code: Option<i32>,
    signal: Option<i32>,
    error: Option<String>,
) {
    let record = serde_json::json!({
        "exit_code": exit_code,
        "signal": signal,
        "error": error,
    });
    let key = keys::job_exit(&launch.job_id);
    if let Err(source) = storage.store_bytes(&key, Bytes::from(record.to_string())).await {
        eprintln!("gantry launch: {}", describe(&Error::Upload { key, source }));
    }
}

/// An error with its chain of causes, for the logs and the exit record.
pub fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
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
                job_id: JOB_ID.into(),
                work_dir: self.work_dir(),
                artifact_key: Some(ARTIFACT_KEY.into()),
                code_dir: None,
                entrypoint: "main.py".into(),
                python: "python3".into(),
                arguments_file: Some(arguments_file),
                provider_function,
                logs_size_limit: 4096,
                data_key: None,
                data_function: None,
                data_provider: None,
                isolation: None,
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

        async fn exit_record(&self) -> serde_json::Value {
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
            if let Some(pid) = text.lines().find_map(|line| line.strip_prefix("pid ")).and_then(|pid| pid.parse().ok())
            {
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
        assert_eq!(fixture.exit_record().await, serde_json::json!({"exit_code": 0, "signal": null, "error": null}));
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
        launch.python = std::env::var("GANTRY_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
        launch.isolation = Some(JobIsolation { user: None, readable: Vec::new() });
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
        assert_eq!(fixture.exit_record().await, serde_json::json!({"exit_code": 3, "signal": null, "error": null}));
        assert_eq!(fixture.object(&keys::job_user_log(JOB_ID)).await.unwrap(), "giving up\n");
        assert_eq!(fixture.object(&keys::job_result(JOB_ID)).await, None);
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
        launch.entrypoint = "../main.py".into();
        assert_not_started(&fixture, &launch, "failed to find the entrypoint").await;
        launch.entrypoint = "pkg".into();
        assert_not_started(&fixture, &launch, "failed to find the entrypoint").await;

        let mut launch = fixture.launch(false);
        launch.python = "/nonexistent/python".into();
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
            serde_json::json!({"exit_code": null, "signal": libc::SIGTERM, "error": null})
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
    fn output_is_split_into_lines_across_reads() {
        let mut splitter = LineSplitter::new(100);
        let mut lines = Vec::new();
        splitter.feed(b"one\ntw", |line| lines.push(line.to_string()));
        splitter.feed(b"o\r\n\nthree", |line| lines.push(line.to_string()));
        lines.extend(splitter.finish());
        assert_eq!(lines, ["one", "two", "", "three"]);
        assert_eq!(splitter.finish(), None);

        let mut lines = Vec::new();
        splitter.feed(b"bad \xff byte\n", |line| lines.push(line.to_string()));
        assert_eq!(lines, ["bad \u{fffd} byte"]);
    }

    #[test]
    fn an_endless_line_is_held_in_bounded_memory_with_its_tag_and_end() {
        let mut splitter = LineSplitter::new(10);
        splitter.feed(b"[PRIVATE] ", |_| {});
        for _ in 0..1000 {
            splitter.feed(b"abcdefghij", |_| {});
            assert!(splitter.pending.len() <= LINE_HEAD_BYTES + 20);
        }
        splitter.feed(b"END", |_| {});
        let line = splitter.finish().unwrap();
        assert!(line.starts_with("[PRIVATE] "));
        assert!(line.ends_with("ghijEND"));
        let mut router = LogRouter::new(true, 11);
        router.push_line(&line);
        assert!(router.provider.render().ends_with("]\ndefghijEND\n"));
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
        assert!(args.provider_function);
        assert_eq!(args.python, "python3");
        assert_eq!(args.logs_size_limit, 52_428_800);
    }
}
