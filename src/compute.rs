//! The compute interface between the API and the backends that run jobs, and the status moves
//! every backend makes the same way. The handlers hold an `Arc<dyn Compute>` and never know
//! which backend runs: the local runner (`local`, processes on this machine), the queue alone
//! (`Queue`, jobs wait for another process), or Kubernetes (`kube`; the role that turns
//! FunctionJobs into pods is `crate::controller`, beside the other roles). Every backend starts the `launcher` inside each job. The rules stay in `domain::lifecycle`
//! and `domain::admission`, shared by all.

pub mod job_times;
pub mod kube;
pub mod local;
pub mod rbac;

use std::sync::Arc;

use crate::db::{self, Db, jobs};
use crate::domain::admission::{self, Capacity, Limits};
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
    job_times::observe(db, job_id, mv.to, moved.created).await;
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

/// A stop for a job no process of ours runs: marks the request, and stops a queued job at once.
pub async fn stop_without_process(
    db: &Db,
    publisher: &Arc<dyn Publisher>,
    job_id: &str,
) -> Result<StopOutcome, db::Error> {
    if !jobs::mark_stop_requested(db, job_id).await? {
        let status = jobs::find(db, job_id).await?.map(|j| j.status).unwrap_or_default();
        return Ok(StopOutcome::AlreadyFinished(status));
    }
    move_job(db, publisher, job_id, JobStatus::Queued, &Trigger::StopRequested).await?;
    Ok(StopOutcome::Requested)
}

/// Adds a pending or running job to the load admission works against.
pub fn count_in(capacity: &mut Capacity, job: &jobs::JobRow) {
    *capacity.running_per_user.entry(job.author_id.clone()).or_default() += 1;
    if job.gpu {
        capacity.running_gpu += 1;
    } else {
        capacity.running_cpu += 1;
    }
}

/// Status moves an admission pass writes in one transaction: the first jobs of a long queue
/// start while the next are being written.
const ADMISSION_BATCH: usize = 100;

/// The oldest queued jobs an admission pass considers.
pub const ADMISSION_WINDOW: usize = 1000;

/// One admission pass, shared by the backends: the oldest queued jobs that fit `capacity` and
/// `limits` move to `PENDING`, each batch in one transaction, and `admitted` gets each job that
/// moved (another mover may have taken some) as soon as its batch is committed, in the pass
/// (so what it takes is taken before the next pass looks). Returns how many moved.
pub async fn admit_queued(
    db: &Db,
    publisher: &Arc<dyn Publisher>,
    capacity: &Capacity,
    limits: Limits,
    mut admitted: impl FnMut(&admission::QueuedJob),
) -> Result<usize, db::Error> {
    let queue = jobs::queued(db, ADMISSION_WINDOW as i64).await?;
    let Some(mv) = lifecycle::decide(JobStatus::Queued, &Trigger::Admitted) else { return Ok(0) };
    let by_id: std::collections::HashMap<&str, &admission::QueuedJob> =
        queue.iter().map(|job| (job.id.as_str(), job)).collect();
    let mut count = 0;
    for batch in admission::admit(&queue, capacity, limits).chunks(ADMISSION_BATCH) {
        for job_id in jobs::apply_moves(db, batch, &mv, publisher.moves_outbox()).await? {
            let span = job_step(db, "gantry.job.admit", &job_id).await;
            span.record("gantry.job.previous_status", JobStatus::Queued.as_str());
            span.record("gantry.job.status", mv.to.as_str());
            publish_move(publisher, &job_id, &mv);
            if let Some(job) = by_id.get(job_id.as_str()) {
                admitted(job);
            }
            count += 1;
        }
    }
    Ok(count)
}
