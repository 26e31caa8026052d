//! The compute interface between the API and the backends that run jobs, and the status moves
//! every backend makes the same way. The handlers hold an `Arc<dyn Compute>` and never know
//! which backend runs: the local runner (`local`, processes on this machine), the queue alone
//! (`Queue`, jobs wait for another process), or Kubernetes (`kube`; the role that turns
//! FunctionJobs into pods is `crate::controller`, beside the other roles). Every backend starts the `launcher` inside each job. The rules stay in `domain::lifecycle`
//! and `domain::admission`, shared by all.

pub mod admission_pass;
pub mod job_times;
pub mod kube;
pub mod local;
pub mod quotas;
pub mod rbac;

pub use admission_pass::{ADMISSION_WINDOW, Capacity, Memory, Passed, admit_queued};

use std::sync::Arc;

use crate::db::{self, Db, jobs};
use crate::domain::admission::{FairShare, Limits};
use crate::domain::lifecycle::{self, JobStatus, Trigger};
use crate::domain::sizes::Resources;
use crate::events::{self, Publisher, StatusEvent};
use crate::telemetry::{self, context};
use tracing::Instrument;

/// The admission limits, shared by `serve` (local processes) and `controller` (pods).
#[derive(Debug, Clone, clap::Args)]
pub struct LimitsArgs {
    /// Pending+running jobs one user may have at once (admission).
    #[arg(long, env = "LIMITS_JOBS_PER_USER", default_value_t = 2)]
    pub jobs_per_user: usize,
    /// CPU jobs running at once (on this machine, or across the cluster).
    #[arg(long, env = "LIMITS_MAX_CLUSTERS", default_value_t = 6)]
    pub max_cpu_jobs: usize,
    /// GPU jobs running at once. Default: on `serve`, the GPUs it finds (each job also waits
    /// for as many free GPUs as it asks for); on a cluster, 1.
    #[arg(long, env = "LIMITS_MAX_GPU_CLUSTERS")]
    pub max_gpu_jobs: Option<usize>,
    /// Fair share within a tenant: a user's past use counts half as much after this long
    /// (docs/scheduling.md; never zero).
    #[arg(long, env = "GANTRY_FAIR_SHARE_HALF_LIFE", default_value = "1h", value_parser = parse_half_life)]
    pub fair_share_half_life: std::time::Duration,
    /// How long a tenant's oldest job waits for its guarantee before backfill jobs on it are
    /// stopped (0 for at once).
    #[arg(long, env = "GANTRY_BACKFILL_GRACE", default_value = "2m", value_parser = parse_grace)]
    pub backfill_grace: std::time::Duration,
    /// Backfill jobs stopped at most per admission pass.
    #[arg(long, env = "GANTRY_MAX_PREEMPTIONS", default_value_t = 10)]
    pub max_preemptions: usize,
    /// Tenants to declare (or whose quotas to set) at start: a JSON list of objects with one of
    /// `provider`, `group`, `instance` and any of `cpu`, `gpu`, `gpuModel`, `cpuBorrowCap`,
    /// `gpuBorrowCap` (a number, or null for no cap), `weight` (the chart's `tenants`).
    #[arg(long, env = "GANTRY_TENANTS")]
    pub tenants: Option<String>,
}

/// A half-life: a duration as `--timeout` takes it, never zero.
fn parse_half_life(text: &str) -> Result<std::time::Duration, String> {
    crate::shared::parse_timeout(text)
        .map_err(|_| format!("invalid half-life '{text}': a duration longer than zero, such as 1h, 30m or 90s"))
}

/// A grace: `0` or a duration as `--timeout` takes it.
fn parse_grace(text: &str) -> Result<std::time::Duration, String> {
    match text.trim() {
        "0" => Ok(std::time::Duration::ZERO),
        _ => crate::shared::parse_timeout(text),
    }
}

impl LimitsArgs {
    /// The limits, with `default_gpu_slots` GPU slots unless `--max-gpu-jobs` sets them.
    pub fn limits(&self, default_gpu_slots: usize) -> Limits {
        Limits {
            jobs_per_user: self.jobs_per_user,
            cpu_slots: self.max_cpu_jobs,
            gpu_slots: self.max_gpu_jobs.unwrap_or(default_gpu_slots),
        }
    }

    /// Applies `--tenants`, if given, and logs each tenant it set.
    pub async fn seed_tenants(&self, db: &Db) -> anyhow::Result<()> {
        let Some(json) = self.tenants.as_deref().filter(|json| !json.trim().is_empty()) else { return Ok(()) };
        for line in quotas::seed(db, json).await? {
            tracing::info!("{line}");
        }
        Ok(())
    }

    /// The fair-share settings.
    pub fn fair_share(&self) -> FairShare {
        FairShare {
            half_life: self.fair_share_half_life,
            grace: self.backfill_grace,
            max_preemptions: self.max_preemptions,
        }
    }
}

/// GPU slots of a cluster when `--max-gpu-jobs` is not given.
pub const CLUSTER_GPU_SLOTS: usize = 1;

/// What the API asks of the backend that runs jobs.
#[async_trait::async_trait]
pub trait Compute: Send + Sync {
    /// Whether a job of this kind (a container image or not, asking for `resources.gpus` GPUs
    /// of `resources.gpu_model` or none) can run here; Err says why not, and `run` refuses it
    /// with that reason.
    fn can_run(&self, image: bool, resources: &Resources) -> Result<(), String>;

    /// The job was committed `QUEUED`: take it up. Failures are the backend's to repair (the
    /// job row is the record), so nothing is returned.
    async fn submit(self: Arc<Self>, job_id: &str);

    /// A user asked to stop the job: a queued job stops at once, a running one is told to stop
    /// and its end is recorded when it has stopped.
    async fn stop(self: Arc<Self>, job_id: &str) -> Result<StopOutcome, db::Error>;

    /// The log so far of a running job (user log, or provider log with `provider`), when the
    /// backend can read it.
    async fn live_log(self: Arc<Self>, job_id: &str, provider: bool) -> Option<String>;

    /// The live log of a running job from byte `offset` on, at most `limit` bytes (empty when
    /// nothing is past `offset`). Backends that can read from an offset override this.
    async fn live_log_since(
        self: Arc<Self>,
        job_id: &str,
        provider: bool,
        offset: u64,
        limit: usize,
    ) -> Option<bytes::Bytes> {
        let text = bytes::Bytes::from(self.live_log(job_id, provider).await?);
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(text.len());
        Some(text.slice(start..text.len().min(start.saturating_add(limit))))
    }

    /// Brings jobs left in flight by an earlier process in line with what still runs.
    async fn reconcile(self: Arc<Self>) -> Result<(), db::Error>;
}

/// No backend in this process: jobs stay queued for another one (`GANTRY_RUNNER=none`).
pub struct Queue {
    pub db: Db,
    pub publisher: Arc<dyn Publisher>,
}

#[async_trait::async_trait]
impl Compute for Queue {
    fn can_run(&self, _image: bool, _resources: &Resources) -> Result<(), String> {
        Ok(())
    }

    async fn submit(self: Arc<Self>, _job_id: &str) {}

    async fn stop(self: Arc<Self>, job_id: &str) -> Result<StopOutcome, db::Error> {
        stop_without_process(&self.db, &self.publisher, job_id).await
    }

    async fn live_log(self: Arc<Self>, _job_id: &str, _provider: bool) -> Option<String> {
        None
    }

    async fn reconcile(self: Arc<Self>) -> Result<(), db::Error> {
        Ok(())
    }
}

/// Applies a lifecycle trigger to a job: decides the move from its current status, writes it
/// with its event, and publishes it. Returns the new status when a move happened.
pub async fn move_job(
    db: &Db,
    publisher: &Arc<dyn Publisher>,
    job_id: &str,
    current: JobStatus,
    trigger: &Trigger,
) -> Result<Option<JobStatus>, db::Error> {
    let Some(mv) = lifecycle::decide(current, trigger) else {
        return Ok(None);
    };
    let span = job_step(db, "gantry.job.move", job_id).await;
    span.record("gantry.job.previous_status", current.as_str());
    span.record("gantry.job.status", mv.to.as_str());
    span.record("gantry.job.origin", mv.origin.as_str());
    let Some(moved) = jobs::apply_move(db, job_id, &mv, publisher.moves_outbox()).instrument(span).await? else {
        return Ok(None);
    };
    job_times::observe(mv.to, &moved);
    publish_move(publisher, job_id, &mv);
    Ok(Some(mv.to))
}

/// A span for one step of a job, a child of the job's trace (read from its row); none while
/// spans are off, when nothing is read.
pub async fn job_step(db: &Db, step: &'static str, job_id: &str) -> tracing::Span {
    if !telemetry::enabled() {
        return tracing::Span::none();
    }
    let traceparent = jobs::traceparent(db, job_id).await.ok().flatten();
    context::job_span(step, job_id, traceparent.as_deref())
}

/// `job_step` for a job whose trace its caller already read (nothing is read).
pub fn job_step_of(step: &'static str, job_id: &str, traceparent: Option<&str>) -> tracing::Span {
    if !telemetry::enabled() {
        return tracing::Span::none();
    }
    context::job_span(step, job_id, traceparent)
}

/// Hands a written move to the publisher.
fn publish_move(publisher: &Arc<dyn Publisher>, job_id: &str, mv: &lifecycle::Move) {
    events::publish(
        publisher,
        StatusEvent {
            job_id: job_id.to_string(),
            status: mv.to.as_str().to_string(),
            origin: mv.origin.as_str().to_string(),
            context: mv.context.to_string(),
            created: db::format_timestamp(db::now_micros()),
        },
    );
}

/// Applies a trigger to a job its caller last saw in `seen` (read or written by it): one write
/// when the job is still there; when it moved meanwhile, its status is read again
/// (`move_job_now`).
pub async fn move_job_from(
    db: &Db,
    publisher: &Arc<dyn Publisher>,
    job_id: &str,
    seen: JobStatus,
    trigger: &Trigger,
) -> Result<Option<JobStatus>, db::Error> {
    if let Some(status) = move_job(db, publisher, job_id, seen, trigger).await? {
        return Ok(Some(status));
    }
    move_job_now(db, publisher, job_id, trigger).await
}

/// Applies a trigger to whatever status the job has now, retrying if another mover got there
/// first.
pub async fn move_job_now(
    db: &Db,
    publisher: &Arc<dyn Publisher>,
    job_id: &str,
    trigger: &Trigger,
) -> Result<Option<JobStatus>, db::Error> {
    for _ in 0..5 {
        let Some(job) = jobs::find(db, job_id).await? else { return Ok(None) };
        let current = job.status();
        if lifecycle::decide(current, trigger).is_none() {
            return Ok(None);
        }
        if let Some(status) = move_job(db, publisher, job_id, current, trigger).await? {
            return Ok(Some(status));
        }
    }
    Ok(None)
}

/// What a stop request came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopOutcome {
    Requested,
    AlreadyFinished(String),
}

/// A stop for a job no process of ours runs: a queued job stops at once (its move from QUEUED, a
/// compare-and-set, is the whole stop: one transaction); any other job in flight is marked, and
/// whatever runs it stops it. The move is tried first: a queued job's stop was two transactions
/// when the mark came first, and a running job's takes two either way (the mark and the move
/// that does not apply). A job admitted between the two is marked.
pub async fn stop_without_process(
    db: &Db,
    publisher: &Arc<dyn Publisher>,
    job_id: &str,
) -> Result<StopOutcome, db::Error> {
    if move_job(db, publisher, job_id, JobStatus::Queued, &Trigger::StopRequested).await?.is_some() {
        return Ok(StopOutcome::Requested);
    }
    if !jobs::mark_stop_requested(db, job_id).await? {
        let status = jobs::find(db, job_id).await?.map(|j| j.status).unwrap_or_default();
        return Ok(StopOutcome::AlreadyFinished(status));
    }
    Ok(StopOutcome::Requested)
}
