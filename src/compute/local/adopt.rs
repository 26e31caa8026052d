//! What a restart of `gantry serve` finds, and what lets it find it: jobs left in flight by an
//! earlier process are adopted when their launcher or container still runs (with the GPUs they
//! held, recorded beside their work folders), finished otherwise; job containers of jobs no
//! longer in flight are removed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{CONTAINER_REF, LocalRunner, Running, container, gpus, preparing};
use crate::db::{self, jobs};

impl LocalRunner {
    /// The file naming the GPUs a job holds, readable by the server only: a server started
    /// again takes them again for the job it adopts.
    pub(super) fn gpus_file(&self, job_id: &str) -> PathBuf {
        self.config.work_root.join(format!(".{job_id}.gpus"))
    }

    pub(super) async fn record_gpus(&self, job_id: &str, held: &gpus::Held) -> Result<(), String> {
        let minors: Vec<String> = held.gpus.iter().map(|gpu| gpu.minor.to_string()).collect();
        let text = minors.join(",");
        crate::shared::replace_file(
            &self.gpus_file(job_id),
            crate::shared::Contents::Bytes(text.as_bytes()),
            Some(0o600),
        )
        .await
        .map_err(|e| preparing("failed to record the job's GPUs".into(), &e))
    }

    /// Takes again the GPUs a job left in flight by an earlier server held.
    async fn retake_gpus(&self, job_id: &str) {
        let Ok(text) = tokio::fs::read_to_string(self.gpus_file(job_id)).await else { return };
        let minors: Vec<u32> = text.split(',').filter_map(|m| m.trim().parse().ok()).collect();
        if self.config.gpus.retake(job_id, &minors).is_none() {
            tracing::warn!(job.id = %job_id, gpus = %text, "a job left in flight holds GPUs this server does not lend");
        }
    }

    /// Jobs left PENDING or RUNNING by a previous run: adopt live launchers and containers,
    /// finish the rest; remove job containers whose job is no longer in flight.
    pub(super) async fn adopt_or_finish_in_flight(self: &Arc<Self>) -> Result<(), db::Error> {
        let in_flight = jobs::in_flight(&self.db).await?;
        self.remove_stray_containers(&in_flight).await;
        for job in in_flight {
            if self.processes.lock().expect("lock").contains_key(&job.id) {
                continue;
            }
            self.retake_gpus(&job.id).await;
            if let Some(name) = job.backend_ref.as_deref().and_then(|r| r.strip_prefix(CONTAINER_REF)) {
                self.adopt_container(job.id.clone(), name.to_string()).await;
                continue;
            }
            let pid =
                job.backend_ref.as_deref().and_then(|r| r.strip_prefix("pid:")).and_then(|p| p.parse::<u32>().ok());
            match pid.filter(|pid| launcher_alive(*pid, &job.id)) {
                Some(pid) => {
                    tracing::info!(job.id = %job.id, pid, "adopting a job still running from a previous run");
                    self.processes.lock().expect("lock").insert(job.id.clone(), Running::Process(pid));
                    let runner = Arc::clone(self);
                    tokio::spawn(async move {
                        while launcher_alive(pid, &job.id) {
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                        runner.processes.lock().expect("lock").remove(&job.id);
                        runner.finish(&job.id, None, None, &[]).await;
                    });
                }
                None => {
                    tracing::warn!(job.id = %job.id, "job was left in flight and its process is gone");
                    self.finish(&job.id, None, None, &[]).await;
                }
            }
        }
        Ok(())
    }

    /// A job left in flight in a container: watched again while it runs, else finished.
    async fn adopt_container(self: &Arc<Self>, job_id: String, name: String) {
        match self.config.containers.state(&name).await {
            Ok(Some(container::State::Running)) => {
                tracing::info!(job.id = %job_id, container = %name, "adopting a job container still running from a previous run");
                self.processes.lock().expect("lock").insert(job_id.clone(), Running::Container(name.clone()));
                let runner = Arc::clone(self);
                tokio::spawn(async move { runner.watch_container(job_id, name).await });
            }
            Ok(Some(container::State::Exited(code))) => self.finish(&job_id, Some(code), Some(&name), &[]).await,
            Ok(None) => {
                tracing::warn!(job.id = %job_id, container = %name, "job was left in flight and its container is gone");
                self.finish(&job_id, None, Some(&name), &[]).await;
            }
            Err(why) => {
                tracing::warn!(job.id = %job_id, container = %name, why, "cannot look at a job's container");
                self.finish(&job_id, None, Some(&name), &[]).await;
            }
        }
    }

    /// Removes job containers of this machine whose job is not in flight (a server that ended
    /// between a job's end and its container's removal).
    async fn remove_stray_containers(&self, in_flight: &[jobs::JobRow]) {
        if !self.config.containers.is_available() {
            return;
        }
        let containers = match self.config.containers.job_containers().await {
            Ok(containers) => containers,
            Err(why) => return tracing::warn!(why, "cannot list job containers"),
        };
        for (name, job_id) in containers {
            if !in_flight.iter().any(|job| job.id == job_id) {
                tracing::info!(container = %name, job.id = %job_id, "removing the container of a job that ended");
                self.config.containers.remove(&name).await;
            }
        }
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
