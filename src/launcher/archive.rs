//! After the function: the user's files synced back, the result and the logs shipped, the exit
//! record written last.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use tracing::Instrument;

use super::data_area::Mirror;
use super::isolation;
use super::objects::JobObjects;
use super::prepare::step;
use super::process::{Ending, write_atomically};
use super::{EXIT_NOT_STARTED, Error, LIVE_PROVIDER_LOG, LIVE_USER_LOG, Launch, RESULT_COPY, environment_path};
use crate::domain::lifecycle::no_space_reason;
use crate::domain::logs::{TailBuffer, missing_client_hint};
use crate::shared::describe;
use crate::storage::keys;

/// Copies the job's result file to the launcher's own folder without following links (the job
/// could have made it a link to a file of the server's); `None` when there is no result file.
pub(super) async fn copy_result(
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
    let copy = launch.job.work_dir.join(RESULT_COPY);
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

/// Ships the user's files (when the area lives in storage), the result and the logs, then the
/// exit record; returns the launcher's exit code.
pub(super) async fn archive(
    launch: &Launch,
    storage: &dyn JobObjects,
    environment: &[(OsString, OsString)],
    data: Option<&Mirror>,
    ending: Ending,
) -> i32 {
    let Ending { status, mut router, last_line } = ending;
    let failed = !matches!(&status, Ok(status) if status.success());
    let limit = if failed { launch.limits.reached(&last_line) } else { None };
    let exception = if failed { router.last_exception().map(str::to_string) } else { None };
    if let (Some(line), Some(path)) = (&exception, &launch.job.termination_log) {
        // Best effort: a missing file only loses the line from the cluster's record.
        let _ = tokio::fs::write(path, line.as_bytes()).await;
    }
    if failed && router.missing_client() {
        let hint = format!("gantry launch: hint: {}", missing_client_hint(&launch.job.python));
        say!("{hint}");
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
        let shipping = async {
            match copy_result(launch, environment, &results).await {
                Ok(Some(copy)) => {
                    let key = keys::job_result(&launch.job.job_id);
                    storage.store_file(&key, &copy).await.err().map(|source| Error::Upload { key, source })
                }
                Ok(None) => None,
                Err(error) => Some(error),
            }
        };
        problems.extend(shipping.instrument(step("gantry.launch.result", launch)).await);
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
        say!("gantry launch: {}", describe(problem));
    }
    let error = error.or_else(|| problems.first().map(|problem| describe(problem)));
    let used = children_usage();
    write_exit_record(launch, storage, ExitRecord { exit_code, signal, error, limit, exception, used }).await;
    code
}

/// What the processes this launcher waited for (the function's, with the descendants each
/// waited for) used: CPU milliseconds (user and system) and the largest resident set of one of
/// them, in bytes.
fn children_usage() -> Option<Used> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage(2) writes into the struct it is given and nothing else.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, usage.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: filled by the successful call above (and zeroed before it).
    let usage = unsafe { usage.assume_init() };
    let millis = |time: libc::timeval| time.tv_sec * 1000 + time.tv_usec / 1000;
    Some(Used {
        cpu_ms: millis(usage.ru_utime) + millis(usage.ru_stime),
        memory_peak_bytes: usage.ru_maxrss.saturating_mul(1024),
    })
}

/// What a job's processes used, as its exit record says it (`cpu_used_ms`, `memory_peak_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Used {
    pub(super) cpu_ms: i64,
    pub(super) memory_peak_bytes: i64,
}

/// Records a launch that failed before python ran: the reason goes to stderr, to the logs and
/// to the exit record.
pub(super) async fn record_failure(launch: &Launch, storage: &dyn JobObjects, error: &Error) -> i32 {
    let reason = if no_space(error) { no_space_reason(&describe(error)) } else { describe(error) };
    say!("gantry launch: {reason}");
    let mut log = TailBuffer::new(launch.job.logs_size_limit);
    log.push(&format!("gantry launch: {reason}"));
    let text = log.render();
    let _ = write_atomically(&launch.job.work_dir.join(LIVE_USER_LOG), text.as_bytes()).await;
    let provider = launch.job.provider_function.then(|| text.clone());
    if let Some(provider) = &provider {
        let path = launch.job.work_dir.join(LIVE_PROVIDER_LOG);
        let _ = write_atomically(&path, provider.as_bytes()).await;
    }
    for problem in upload_logs(launch, storage, text, provider).await {
        say!("gantry launch: {}", describe(&problem));
    }
    let record =
        ExitRecord { exit_code: None, signal: None, error: Some(reason), limit: None, exception: None, used: None };
    write_exit_record(launch, storage, record).await;
    EXIT_NOT_STARTED
}

pub(super) async fn upload_logs(
    launch: &Launch,
    storage: &dyn JobObjects,
    user: String,
    provider: Option<String>,
) -> Vec<Error> {
    let mut logs = vec![(keys::job_user_log(&launch.job.job_id), user)];
    if let Some(provider) = provider {
        logs.push((keys::job_provider_log(&launch.job.job_id), provider));
    }
    let shipping = async {
        let mut problems = Vec::new();
        for (key, text) in logs {
            if let Err(source) = storage.store_bytes(&key, Bytes::from(text)).await {
                problems.push(Error::Upload { key, source });
            }
        }
        problems
    };
    shipping.instrument(step("gantry.launch.logs", launch)).await
}

/// How the job ended, as the exit record says it.
pub(super) struct ExitRecord {
    pub(super) exit_code: Option<i32>,
    pub(super) signal: Option<i32>,
    pub(super) error: Option<String>,
    /// The limit (a `limit_kind`) a failed function reached, when the launcher can tell.
    pub(super) limit: Option<&'static str>,
    /// The last exception line of a failed function's user log (`ExceptionSpotter`).
    pub(super) exception: Option<String>,
    /// What its processes used, when the function ran.
    pub(super) used: Option<Used>,
}

/// The prefix of the exit record's line on stderr, written when storage refused it (a full
/// disk): the local runner reads how the job ended from there.
pub const EXIT_RECORD_LINE: &str = "gantry launch: exit record: ";

/// Writes `keys::job_exit`: `{"exit_code", "signal", "error", "limit", "exception"}`, each
/// possibly null, and `cpu_used_ms` and `memory_peak_bytes` once the function ran. When
/// storage refuses it, the record goes to stderr as one line after `EXIT_RECORD_LINE`.
pub(super) async fn write_exit_record(launch: &Launch, storage: &dyn JobObjects, record: ExitRecord) {
    let ExitRecord { exit_code, signal, error, limit, exception, used } = record;
    let mut record = serde_json::json!({
        "exit_code": exit_code,
        "signal": signal,
        "error": error,
        "limit": limit,
        "exception": exception,
    });
    if let Some(used) = used {
        record["cpu_used_ms"] = used.cpu_ms.into();
        record["memory_peak_bytes"] = used.memory_peak_bytes.into();
    }
    let key = keys::job_exit(&launch.job.job_id);
    if let Err(source) = storage.store_bytes(&key, Bytes::from(record.to_string())).await {
        say!("gantry launch: {}", describe(&Error::Upload { key, source }));
        say!("{EXIT_RECORD_LINE}{record}");
    }
}

/// Whether `error` comes of a full disk (or a full quota); some steps (unpacking) carry their
/// cause as text only.
fn no_space(error: &(dyn std::error::Error + 'static)) -> bool {
    let full = io::Error::from_raw_os_error(libc::ENOSPC).to_string();
    if describe(error).contains(&full) {
        return true;
    }
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(io) = error.downcast_ref::<io::Error>()
            && (io.kind() == io::ErrorKind::StorageFull || io.raw_os_error() == Some(libc::EDQUOT))
        {
            return true;
        }
        current = error.source();
    }
    false
}
