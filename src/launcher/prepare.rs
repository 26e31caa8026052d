//! Before the function runs: the artifact unpacked, the entry point checked, the user's file area
//! copied into `DATA_PATH`, the arguments placed, a stale result cleared and, for an isolated job,
//! its folders handed over.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use super::data_area::{Area, GatewayArea, Mirror, StorageArea};
use super::isolation::{self, JobIsolation, Sandbox};
use super::objects::{JobObjects, download};
use super::unpack::unpack;
use super::{Error, Launch, OUTBOX, PRIVATE_TMP, code_dir, environment_path};
use crate::artifact::{MemberKind, check_member};
use crate::storage::keys;
use crate::telemetry::context::job_span as step_span;
use tracing::Instrument;

/// A span of one step of the launch, a child of the launch's.
pub(super) fn step(name: &'static str, launch: &Launch) -> tracing::Span {
    step_span(name, &launch.job.job_id, None)
}

/// Downloads and unpacks the artifact, copies the user's file area into `DATA_PATH` when it
/// lives in storage, places the arguments and clears a stale result; returns the script
/// argument for python and what the copied area held.
pub(super) async fn prepare(
    launch: &Launch,
    storage: &dyn JobObjects,
    environment: &[(OsString, OsString)],
) -> Result<(String, Option<Mirror>), Error> {
    tokio::fs::create_dir_all(&launch.job.work_dir)
        .await
        .map_err(|source| Error::WorkDir { path: launch.job.work_dir.clone(), source })?;
    let code = code_dir(launch);
    if let Some(artifact_key) = &launch.job.artifact_key {
        let archive = launch.job.work_dir.join("artifact.tar");
        let fetched = download(storage, artifact_key, &archive).instrument(step("gantry.launch.fetch", launch)).await?;
        if !fetched {
            return Err(Error::ArtifactMissing { key: artifact_key.clone() });
        }
        let (unpack_into, limit_mib) = (code.clone(), launch.job.max_unpacked_mib);
        tokio::task::spawn_blocking(move || unpack(&archive, &unpack_into, limit_mib))
            .instrument(step("gantry.launch.unpack", launch))
            .await
            .map_err(|e| Error::Unpack { reason: e.to_string() })?
            .map_err(|reason| Error::Unpack { reason })?;
    }

    let entrypoint_missing = || Error::Entrypoint { entrypoint: launch.job.entrypoint.clone() };
    let entrypoint = check_member(&launch.job.entrypoint, MemberKind::File, None).map_err(|_| entrypoint_missing())?;
    let is_file = tokio::fs::metadata(code.join(&entrypoint)).await.is_ok_and(|metadata| metadata.is_file());
    if entrypoint.is_empty() || !is_file {
        return Err(entrypoint_missing());
    }

    let area: Option<Box<dyn Area>> = match (&launch.job.data_key, storage.shared(), &launch.job.data_function) {
        (Some(key), Some(shared), _) => Some(Box::new(StorageArea { storage: shared.clone(), key: key.clone() })),
        // A pod, or a job container on this machine: through the gateway, with the job's token
        // (the storage the launcher has is the job's own objects only).
        (None, _, Some(function)) | (_, None, Some(function)) => {
            GatewayArea::from_environment(environment, function, launch.job.data_provider.as_deref())
                .map(|area| Box::new(area) as Box<dyn Area>)
        }
        _ => None,
    };
    let data = match (area, environment_path(environment, "DATA_PATH")) {
        (Some(area), Some(folder)) => {
            let mirror = Mirror::pull(area, &folder).await?;
            // An isolated job may swap its files for links to the server's: copy them out first.
            Some(if launch.isolation.is_some() {
                mirror.stage_through(launch.job.work_dir.join(OUTBOX))
            } else {
                mirror
            })
        }
        _ => None,
    };
    if let Some(destination) = environment_path(environment, "ARGUMENTS_PATH") {
        let arguments_error = |source| Error::Arguments { to: destination.clone(), source };
        if let Some(parent) = destination.parent() {
            tokio::fs::create_dir_all(parent).await.map_err(arguments_error)?;
        }
        match &launch.job.arguments_file {
            Some(file) => {
                tokio::fs::copy(file, &destination).await.map_err(arguments_error)?;
            }
            None => {
                if !download(storage, &keys::job_arguments(&launch.job.job_id), &destination).await? {
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
pub(super) fn job_folders(launch: &Launch, environment: &[(OsString, OsString)]) -> Vec<PathBuf> {
    let mut folders = vec![code_dir(launch), launch.job.work_dir.join(PRIVATE_TMP)];
    folders.extend(environment_path(environment, "DATA_PATH"));
    folders
}

/// Makes the work folder passable but not readable for the job (its logs and the launcher's
/// files stay the launcher's), creates the job's private temporary folder and, when the job
/// runs as another user, gives it its folders.
pub(super) async fn hand_over_folders(
    launch: &Launch,
    isolation: &JobIsolation,
    environment: &[(OsString, OsString)],
) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    let folder_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::IsolationFolder { path, source }
    };
    tokio::fs::set_permissions(&launch.job.work_dir, std::fs::Permissions::from_mode(0o711))
        .await
        .map_err(folder_error(&launch.job.work_dir))?;
    let private = launch.job.work_dir.join(PRIVATE_TMP);
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
        .map_err(|e| Error::IsolationFolder { path: launch.job.work_dir.clone(), source: io::Error::other(e) })??;
    }
    Ok(())
}

/// The sandbox of an isolated job: its folders, its interpreter's installation, the extra
/// readable folders and its user.
pub(super) fn sandbox(launch: &Launch, isolation: &JobIsolation, environment: &[(OsString, OsString)]) -> Sandbox {
    let path = environment.iter().find(|(name, _)| name == "PATH").map(|(_, value)| value.as_os_str());
    let mut readable = isolation::interpreter_paths(&launch.job.python, path);
    readable.extend(isolation.readable.iter().cloned());
    Sandbox {
        writable: job_folders(launch, environment),
        readable,
        devices: isolation.devices.clone(),
        user: isolation.user,
    }
}
