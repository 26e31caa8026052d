//! The controller's I/O shell: observe a `FunctionJob` (its job row, its pod, the log's
//! archive), decide with the pure `plan` (which uses `build`, `status` and the shared
//! lifecycle), then carry the plan out (pod, job row and event in one transaction, Kubernetes
//! Event, resource status by server-side apply). It decides from observed state only, so a
//! controller restarted at any point resumes without a second pod or a repeated event: the pod
//! has a deterministic name and every status move is a compare-and-set.
//! The leader runs it (and the admission pass) in `lead`.

use std::sync::Arc;
use std::time::Duration;

use futures::{AsyncBufReadExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, LogParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::Instrument;

use super::build::{PodSettings, build_pod};
use super::leader::LeaseSettings;
use super::plan::{Archive, Next, Observed, Plan, Row, Step, Windows, ask_for_pod, plan};
use super::retry::{error_backoff, gone_of_current_attempt};
use super::seen::PodsSeen;
use super::status::{LogState, NO_LOG};
use crate::compute::move_job;
use crate::crd::{
    ANNOTATION_TRACEPARENT, FIELD_MANAGER, FINALIZER, FunctionJob, FunctionJobMeta, FunctionJobStatus, pod_name,
    secret_name,
};
use crate::db::{self, Db, jobs};
use crate::domain::admission::Limits;
use crate::domain::lifecycle::{JobStatus, Trigger, decide};
use crate::domain::logs::LogRouter;
use crate::events::Publisher;
use crate::ops::{ErrorLabels, Metrics, OutcomeLabels};
use crate::storage::{self, Storage, keys};

/// Settings of `gantry controller`.
#[derive(Debug, Clone)]
pub struct ControllerSettings {
    pub namespace: String,
    pub pods: PodSettings,
    /// How long a pod may stay unschedulable before its job fails.
    pub pending_deadline: Duration,
    /// How long a finished job's pod is kept (for `kubectl logs`) before it is deleted.
    pub keep_finished_pods: Duration,
    /// How long a finished job's `FunctionJob` is kept before it is deleted (0: at once).
    pub keep_finished_jobs: Duration,
    /// How long archiving a log is retried (with backoff) before the log is given up as lost.
    pub archive_give_up: Duration,
    /// How many times a job whose pod the cluster ended is started again on a new pod.
    pub infrastructure_retries: u32,
    /// The wait before the first of those retries (doubling for each next one, at most 5 minutes).
    pub retry_backoff: Duration,
    pub limits: Limits,
    /// Fair sharing's settings (docs/scheduling.md).
    pub fair_share: crate::domain::admission::FairShare,
    /// How often queued jobs are considered for admission.
    pub admission_every: Duration,
    /// Reconciles running at once (bounds memory and API load with many jobs).
    pub concurrency: u16,
    /// Longest one reconcile may take: one that waits longer on the API server, the database or
    /// storage is cut there (as a crash at that point would) and retried, so it never holds one
    /// of the `concurrency` slots for good.
    pub reconcile_timeout: Duration,
    /// Every resource held is reconciled this often, whatever woke it or not (a lost wake).
    pub resync_every: Duration,
    /// `FUNCTIONS_LOGS_SIZE_LIMIT`, for logs archived from the pod.
    pub logs_size_limit: usize,
    /// Who this replica is (its pod name): the Lease holder and the Events' reporting instance.
    pub identity: String,
    /// Leader election; `None` acts at once (a single replica known to be alone).
    pub leader: Option<LeaseSettings>,
}

impl ControllerSettings {
    /// The time windows plans are made with.
    pub fn windows(&self) -> Windows {
        Windows {
            pending_deadline: self.pending_deadline,
            keep_finished_pods: self.keep_finished_pods,
            keep_finished_jobs: self.keep_finished_jobs,
            archive_give_up: self.archive_give_up,
            infrastructure_retries: self.infrastructure_retries,
            retry_backoff: self.retry_backoff,
        }
    }
}

/// What every reconcile may use.
pub struct Context {
    pub client: kube::Client,
    pub db: Db,
    pub storage: Storage,
    pub publisher: Arc<dyn Publisher>,
    pub settings: ControllerSettings,
    pub metrics: Arc<Metrics>,
    /// Failed reconciles in a row, by resource name: how long the next retry waits.
    failures: std::sync::Mutex<std::collections::HashMap<String, u32>>,
    /// The job pods the leader's watch has seen (without their spec): read instead of asking
    /// the API server on every reconcile.
    pub(super) pods_seen: std::sync::Mutex<Option<Arc<PodsSeen>>>,
    /// Asks for an admission pass now (a queued job was seen) rather than at the next tick.
    pub(super) admission_wanted: tokio::sync::Notify,
    /// What admission passes keep between them.
    pub(super) admission: crate::compute::Memory,
    /// The wake-ups the reconciles' plans asked for.
    pub(super) timers: Arc<super::timers::Timers>,
    /// Admitted jobs whose reconcile has not run yet.
    pub(super) handed: super::triggers::Handed,
}

impl Context {
    pub fn new(
        client: kube::Client,
        db: Db,
        storage: Storage,
        publisher: Arc<dyn Publisher>,
        settings: ControllerSettings,
    ) -> Context {
        let metrics = Arc::new(Metrics::controller());
        Context {
            client,
            db,
            storage,
            publisher,
            metrics,
            failures: Default::default(),
            pods_seen: Default::default(),
            admission_wanted: Default::default(),
            admission: crate::compute::Memory::new(settings.fair_share),
            timers: Default::default(),
            handed: Default::default(),
            settings,
        }
    }

    pub(super) fn jobs(&self) -> Api<FunctionJob> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    pub(super) fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    /// The job's pod as last seen by the pod watch; when the watch has not seen it and `ask`,
    /// as the API server has it (the watch may lag behind a pod just made).
    async fn observe_pod(&self, job_id: &str, ask: bool) -> Result<Option<Pod>, Error> {
        let name = pod_name(job_id);
        match self.pods_seen().and_then(|pods| pods.get(&name)) {
            Some(pod) => Ok(Some(pod)),
            None if ask => self.pods().get_opt(&name).await.map_err(kube_error("read the pod", job_id)),
            None => Ok(None),
        }
    }

    /// The leader's view of job pods (none before it leads).
    fn pods_seen(&self) -> Option<Arc<PodsSeen>> {
        self.pods_seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Deletes the job's pod; one already gone is fine (the watch may not have shown that yet).
    async fn delete_pod(&self, job_id: &str, params: &DeleteParams, operation: &'static str) -> Result<(), Error> {
        match self.pods().delete(&pod_name(job_id), params).await {
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
            outcome => outcome.map(|_| ()).map_err(kube_error(operation, job_id)),
        }
    }

    /// Deletes the job's Secret (the caller's token): its pod is done with it. Gone already is fine.
    async fn delete_secret(&self, job_id: &str) -> Result<(), Error> {
        let secrets: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(self.client.clone(), &self.settings.namespace);
        match secrets.delete(&secret_name(job_id), &DeleteParams::default()).await {
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
            outcome => outcome.map(|_| ()).map_err(kube_error("delete the job's Secret", job_id)),
        }
    }

    /// Creates the job's pod, or finds the one an earlier reconcile made (whose status write
    /// did not happen): the name is the job's, so there is never a second pod. True when made now.
    async fn create_pod(&self, job: &FunctionJob) -> Result<(Option<Pod>, bool), Error> {
        let job_id = job.spec.job_id.as_str();
        let desired = build_pod(job, &self.settings.pods);
        let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        match self.pods().create(&params, &desired).await {
            Ok(created) => {
                if let Some(seen) = self.pods_seen() {
                    seen.made(&created);
                }
                Ok((Some(created), true))
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok((self.observe_pod(job_id, true).await?, false)),
            Err(error) => Err(kube_error("create the pod", job_id)(error)),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to {operation} for job {job_id}")]
    Kube { operation: &'static str, job_id: String, source: kube::Error },
    #[error("failed to read or record job {job_id}")]
    Database { job_id: String, source: db::Error },
    #[error("failed to archive the logs of job {job_id}")]
    Archive { job_id: String, source: storage::Error },
    #[error("failed to read the log of the pod of job {job_id}")]
    PodLog { job_id: String, source: std::io::Error },
    #[error("the log of job {job_id} is not archived yet ({reason}); retrying in {} s", retry_after.as_secs())]
    ArchivePending { job_id: String, reason: String, retry_after: Duration },
    #[error("finalizer of job {job_id} failed")]
    Finalizer { job_id: String, source: Box<kube::runtime::finalizer::Error<Error>> },
    #[error("the reconcile of job {job_id} did not finish within {} s; cut and retried", after.as_secs())]
    TimedOut { job_id: String, after: Duration },
}

impl Error {
    /// What failed, in one word: the `kind` label of the failure metric.
    pub fn kind(&self) -> &'static str {
        use kube::runtime::finalizer::Error as FinalizerError;
        match self {
            Error::Kube { .. } => "kube",
            Error::Database { .. } => "database",
            Error::Archive { .. } => "storage",
            Error::PodLog { .. } => "pod_log",
            Error::ArchivePending { .. } => "archive_pending",
            Error::TimedOut { .. } => "timeout",
            Error::Finalizer { source, .. } => match source.as_ref() {
                FinalizerError::ApplyFailed(error) | FinalizerError::CleanupFailed(error) => error.kind(),
                FinalizerError::AddFinalizer(_) | FinalizerError::RemoveFinalizer(_) => "kube",
                FinalizerError::UnnamedObject | FinalizerError::InvalidFinalizer => "finalizer",
            },
        }
    }
}

fn kube_error<'a>(operation: &'static str, job_id: &'a str) -> impl FnOnce(kube::Error) -> Error + 'a {
    move |source| Error::Kube { operation, job_id: job_id.to_string(), source }
}

pub(super) fn database_error(job_id: &str) -> impl FnOnce(db::Error) -> Error + '_ {
    move |source| Error::Database { job_id: job_id.to_string(), source }
}

/// Drives one `FunctionJob` towards its spec, in a span of its trace (its annotation); idempotent.
/// The store holds the resource's metadata only: the whole resource is read first, as it is now
/// (a resource gone since has nothing left to do).
pub async fn reconcile(held: Arc<FunctionJobMeta>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = held.name_any();
    ctx.handed.reconciled(&name);
    let after = ctx.settings.reconcile_timeout;
    let read = match tokio::time::timeout(after, ctx.jobs().get_opt(&name)).await {
        Ok(read) => read.map_err(kube_error("read the resource", &name))?,
        Err(_) => return Err(Error::TimedOut { job_id: name, after }),
    };
    let Some(job) = read else {
        ctx.timers.forget(&name);
        return Ok(Action::await_change());
    };
    let job = Arc::new(job);
    let parent = job.annotations().get(ANNOTATION_TRACEPARENT).cloned();
    let span = crate::telemetry::context::job_span("gantry.reconcile", &job.spec.job_id, parent.as_deref());
    let outcome = reconcile_job(job, ctx).instrument(span.clone()).await;
    span.record("gantry.reconcile.outcome", outcome.as_ref().map_or_else(Error::kind, |_| "ok"));
    if outcome.is_err() {
        span.record("otel.status_code", "ERROR");
    }
    outcome
}

#[tracing::instrument(skip_all, fields(job.id = %job.spec.job_id))]
async fn reconcile_job(job: Arc<FunctionJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    let job_id = job.spec.job_id.clone();
    let name = job.name_any();
    let started = std::time::Instant::now();
    ctx.metrics.reconciling.inc();
    let _running = DecOnDrop(&ctx.metrics.reconciling);
    let jobs = ctx.jobs();
    let work = finalizer(&jobs, FINALIZER, job, |event| async {
        match event {
            Finalizer::Apply(job) => drive(&job, &ctx, false).await,
            Finalizer::Cleanup(job) => drive(&job, &ctx, true).await,
        }
    });
    let after = ctx.settings.reconcile_timeout;
    let outcome = match tokio::time::timeout(after, work).await {
        Ok(outcome) => outcome.map_err(|source| Error::Finalizer { job_id, source: Box::new(source) }),
        Err(_) => Err(Error::TimedOut { job_id, after }),
    };
    if outcome.is_ok() {
        ctx.failures.lock().unwrap_or_else(|p| p.into_inner()).remove(&name);
    }
    ctx.metrics.reconcile_seconds.observe(started.elapsed().as_secs_f64());
    let label = OutcomeLabels { outcome: if outcome.is_ok() { "ok" } else { "error" } };
    ctx.metrics.reconciles.get_or_create(&label).inc();
    outcome
}

/// Failures are counted by kind and retried with a backoff per resource (1 s, doubling, at most
/// 5 minutes; a success starts it over); the resource is reconciled again anyway on every
/// change. A log still to archive before the resource may go retries on its own backoff.
pub fn error_policy(job: Arc<FunctionJobMeta>, error: &Error, ctx: Arc<Context>) -> Action {
    use kube::runtime::finalizer::Error as FinalizerError;
    ctx.metrics.reconcile_failures.get_or_create(&ErrorLabels { kind: error.kind() }).inc();
    if let Error::Finalizer { source, .. } = error
        && let FinalizerError::CleanupFailed(Error::ArchivePending { retry_after, .. }) = source.as_ref()
    {
        tracing::info!(error = error as &dyn std::error::Error, "the resource waits for its log");
        return Action::requeue(*retry_after);
    }
    let failures = {
        let mut failures = ctx.failures.lock().unwrap_or_else(|p| p.into_inner());
        let count = failures.entry(job.name_any()).or_default();
        *count = count.saturating_add(1);
        *count
    };
    let retry_after = error_backoff(failures);
    tracing::warn!(
        error = error as &dyn std::error::Error,
        retry_in = retry_after.as_secs(),
        "reconcile failed; retrying"
    );
    Action::requeue(retry_after)
}

/// Records a Kubernetes Event about the resource (what `kubectl describe fj` shows). Each is
/// its own object: a job's moves happen once each, so there is nothing to aggregate, and no
/// cache of past events is kept (kube's `Recorder` scans and locks one on every publish).
async fn record(ctx: &Context, job: &FunctionJob, warning: bool, reason: &str, note: Option<String>) {
    use k8s_openapi::api::events::v1::Event;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    let event = Event {
        metadata: ObjectMeta {
            name: Some(format!("{}.{}", job.name_any(), &uuid::Uuid::new_v4().simple().to_string()[..16])),
            namespace: Some(ctx.settings.namespace.clone()),
            ..Default::default()
        },
        event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        type_: Some(if warning { "Warning" } else { "Normal" }.into()),
        reason: Some(reason.into()),
        note: note.map(|note| note.chars().take(1024).collect()),
        action: Some("Reconcile".into()),
        regarding: Some(job.object_ref(&())),
        reporting_controller: Some("gantry-controller".into()),
        reporting_instance: Some(ctx.settings.identity.clone()),
        ..Default::default()
    };
    let events: Api<Event> = Api::namespaced(ctx.client.clone(), &ctx.settings.namespace);
    if let Err(error) = events.create(&PostParams::default(), &event).await {
        tracing::warn!(error = &error as &dyn std::error::Error, "failed to publish a Kubernetes event");
    }
}

/// Observes the job, plans, and carries the plan out; plans again when a step turned out
/// otherwise than planned or the plan needs to look further. Never more than a few times: a job
/// that keeps changing under the reconcile is reconciled again soon.
async fn drive(job: &FunctionJob, ctx: &Context, deleting: bool) -> Result<Action, Error> {
    let mut observed = observe(ctx, job, deleting).await?;
    let windows = ctx.settings.windows();
    for _ in 0..MAX_PLANS {
        let plan = plan(&observed, &windows);
        if let Some(action) = carry_out(ctx, job, &mut observed, plan).await? {
            return Ok(action);
        }
    }
    tracing::warn!("the job kept changing under its reconcile; reconciling it again soon");
    Ok(Action::requeue(Duration::from_secs(1)))
}

/// Plans made in one reconcile at most.
const MAX_PLANS: usize = 6;

/// What a reconcile starts from: the job's row, its pod (from the pod watch, or the API server
/// when the watch may lag), the clock. The archive is looked at only when a plan asks.
async fn observe<'a>(ctx: &Context, job: &'a FunctionJob, deleting: bool) -> Result<Observed<'a>, Error> {
    let job_id = job.spec.job_id.as_str();
    let row = read_row(ctx, job_id).await?;
    let ask = ask_for_pod(job.status.as_ref(), row.as_ref(), deleting);
    let name = pod_name(job_id);
    let seen = ctx.pods_seen();
    // A pod this controller made that its watch has not shown yet is looked for at the API
    // server: found, the watch lags; gone, it came and went unseen (its code may have run), and
    // making another would run the function twice.
    let made_unseen = seen.as_ref().and_then(|seen| seen.made_unseen(&name));
    let mut pod = None;
    if row.is_some() || deleting {
        pod = ctx.observe_pod(job_id, ask || made_unseen.is_some()).await?;
        if let (None, Some(seen), Some(uid)) = (&pod, &seen, &made_unseen) {
            seen.went_unseen(&name, uid);
        }
    }
    let gone = match (&pod, seen) {
        (None, Some(seen)) => gone_of_current_attempt(job.status.as_ref(), seen.gone(&name)),
        _ => None,
    };
    let (gone_pod_uid, gone_pod_started) = gone.map_or((None, None), |(uid, started)| (uid, Some(started)));
    Ok(Observed {
        job,
        deleting,
        row,
        pod,
        gone_pod_started,
        gone_pod_uid,
        archive: Archive::Unknown,
        log_read_error: None,
        moved: None,
        now: k8s_openapi::jiff::Timestamp::now(),
    })
}

async fn read_row(ctx: &Context, job_id: &str) -> Result<Option<Row>, Error> {
    let state = jobs::state(&ctx.db, job_id).await.map_err(database_error(job_id))?;
    Ok(state.map(|state| Row {
        stop_trigger: state.stop_trigger(),
        status: state.status(),
        sub_status: state.sub_status,
        stop_requested: state.stop_requested,
        provider_function: state.provider_function,
        retries: u32::try_from(state.infrastructure_retries).unwrap_or(0),
        status_reason: state.status_reason,
    }))
}

/// What storage holds of a finished job's log: the launcher's exit record (it ships the log
/// first), or a log stored by an earlier reconcile whose status write was lost (a crash), read
/// back so the log is not read, nor its loss announced, twice.
async fn look_at_archive(ctx: &Context, job_id: &str) -> Result<Archive, Error> {
    let archive_error = |source| Error::Archive { job_id: job_id.to_string(), source };
    if ctx.storage.read_to_bytes(&keys::job_exit(job_id)).await.map_err(archive_error)?.is_some() {
        return Ok(Archive::Holds(LogState::Archived));
    }
    Ok(match ctx.storage.read_to_bytes(&keys::job_user_log(job_id)).await.map_err(archive_error)? {
        Some(stored) => Archive::Holds(LogState::of_stored(&String::from_utf8_lossy(&stored))),
        None => Archive::Empty,
    })
}

/// Carries out a plan's steps in order: `Some(action)` once done; `None` when a step turned out
/// otherwise than planned, or the plan needs the archive, with `observed` saying what was seen,
/// to plan again.
async fn carry_out(
    ctx: &Context,
    job: &FunctionJob,
    observed: &mut Observed<'_>,
    plan: Plan,
) -> Result<Option<Action>, Error> {
    let job_id = job.spec.job_id.as_str();
    for step in plan.steps {
        match step {
            Step::DeleteResource => {
                tracing::warn!("FunctionJob without a job row; deleting it");
                ctx.jobs()
                    .delete(&job.name_any(), &DeleteParams::default())
                    .await
                    .map_err(kube_error("delete", job_id))?;
            }
            Step::Move { from, to: _, trigger, note } => {
                match move_job(&ctx.db, &ctx.publisher, job_id, from, &trigger).await.map_err(database_error(job_id))? {
                    Some(moved) => {
                        record(ctx, job, note.warning, &note.reason, note.message).await;
                        if let Some(row) = observed.row.as_mut() {
                            // A move back to QUEUED (a reclaimed backfill job) clears the stop request.
                            row.stop_requested &= moved != JobStatus::Queued;
                            row.status = moved;
                            row.status_reason = decide(from, &trigger).and_then(|m| m.reason().map(str::to_string));
                        }
                        observed.moved = Some(trigger);
                    }
                    // Another mover got there first: plan from where the job is now.
                    None => {
                        observed.row = read_row(ctx, job_id).await?;
                        return Ok(None);
                    }
                }
            }
            Step::CreatePod => {
                let (pod, created) = ctx.create_pod(job).await?;
                observed.pod = pod;
                if !created {
                    // Made before a crash (or gone again): plan with the pod as it is.
                    return Ok(None);
                }
                record(ctx, job, false, "PodCreated", Some(format!("pod {} created", pod_name(job_id)))).await;
                if !job.status.as_ref().is_none_or(|status| status.retries.is_empty()) {
                    // A retry's pod: its uid goes in the status before anything else is planned,
                    // so it is never taken for the ended attempt's.
                    return Ok(None);
                }
            }
            Step::RecordRetry { from, made, retry, note } => {
                if !record_retry(ctx, job_id, from, made, &retry).await? {
                    // Moved or recorded by another reconcile (or before a crash): plan again.
                    observed.row = read_row(ctx, job_id).await?;
                    return Ok(None);
                }
                record(ctx, job, note.warning, &note.reason, note.message).await;
            }
            Step::DeleteEndedPod => {
                let params = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
                ctx.delete_pod(job_id, &params, "delete the ended attempt's pod").await?;
                if let Some(pod) = observed.pod.as_mut() {
                    pod.metadata.deletion_timestamp = Some(Time(observed.now));
                }
            }
            Step::ClearAttempt => clear_attempt(ctx, job_id).await?,
            Step::StopPod => {
                let params = DeleteParams { grace_period_seconds: Some(10), ..Default::default() };
                ctx.delete_pod(job_id, &params, "stop the pod").await?;
                if let Some(pod) = observed.pod.as_mut() {
                    pod.metadata.deletion_timestamp = Some(Time(observed.now));
                }
            }
            Step::ArchivePodLog { provider_function } => match read_pod_log(ctx, job_id, provider_function).await {
                Ok((user, provider)) => {
                    store_log(ctx, job_id, user, provider).await?;
                    record(ctx, job, false, "LogsArchived", Some("archived from the pod's log".into())).await;
                    observed.archive = Archive::Holds(LogState::Archived);
                }
                Err(error) => {
                    tracing::warn!(job.id = %job_id, %error, "the pod's log could not be read for archiving");
                    observed.log_read_error = Some(error);
                    return Ok(None);
                }
            },
            Step::SettleWithoutLog { state, provider_function } => {
                settle_without_log(ctx, job, provider_function, &state).await?;
                observed.archive = Archive::Holds(state);
            }
            Step::DeleteSecret => ctx.delete_secret(job_id).await?,
            Step::DeletePod => ctx.delete_pod(job_id, &DeleteParams::default(), "delete the pod").await?,
            Step::WriteStatus(status) => write_status(ctx, job, &status).await?,
            Step::Collect => {
                match ctx.jobs().delete(&job.name_any(), &DeleteParams::default()).await {
                    Err(kube::Error::Api(status)) if status.is_not_found() => {}
                    outcome => {
                        outcome.map_err(kube_error("collect the finished FunctionJob", job_id))?;
                    }
                }
                ctx.metrics.collected.inc();
            }
            Step::WakeAdmission => ctx.admission_wanted.notify_one(),
        }
    }
    // The plan's wake-up replaces any asked for before (`timers`), and none is kept when it
    // waits for a change.
    match plan.next {
        Next::Requeue(after) => {
            ctx.timers.wake_in(&job.name_any(), after);
            Ok(Some(Action::await_change()))
        }
        Next::AwaitChange => {
            ctx.timers.forget(&job.name_any());
            Ok(Some(Action::await_change()))
        }
        Next::LookAtArchive => {
            observed.archive = look_at_archive(ctx, job_id).await?;
            Ok(None)
        }
        Next::HoldFinalizer(retry_after) => Err(Error::ArchivePending {
            job_id: job_id.to_string(),
            reason: "the pod's log could not be read".into(),
            retry_after,
        }),
    }
}

/// Records a retry in the database: a RUNNING job moves back to PENDING (a compare-and-set,
/// with its status event), then the count of retries is raised from `made` with a `RETRY` job
/// event. False when another mover got there first (or a crash came after): plan again.
async fn record_retry(
    ctx: &Context,
    job_id: &str,
    from: JobStatus,
    made: u32,
    retry: &crate::crd::Retry,
) -> Result<bool, Error> {
    if from == JobStatus::Running {
        let trigger = Trigger::Retrying { reason: retry.reason.clone() };
        if move_job(&ctx.db, &ctx.publisher, job_id, from, &trigger).await.map_err(database_error(job_id))?.is_none() {
            return Ok(false);
        }
    }
    let data = json!({
        "attempt": retry.attempt,
        "reason": retry.reason,
        "code_started": retry.code_started,
        "next_attempt": retry.attempt + 1,
        "next_attempt_at": retry.next_attempt_at.0.to_string(),
    });
    let recorded = jobs::record_retry(&ctx.db, job_id, made, &data).await.map_err(database_error(job_id))?;
    if recorded {
        ctx.metrics.retries.inc();
        ctx.publisher.recorded();
    }
    Ok(recorded)
}

/// Removes what an ended attempt's launcher shipped (on SIGTERM it ships the log and an exit
/// record), so the next attempt's archive is its own: its pod is gone, so nothing writes them
/// again.
async fn clear_attempt(ctx: &Context, job_id: &str) -> Result<(), Error> {
    let archive_error = |source| Error::Archive { job_id: job_id.to_string(), source };
    for key in keys::job_attempt(job_id) {
        ctx.storage.delete(&key).await.map_err(archive_error)?;
    }
    Ok(())
}

/// Writes the resource's whole status by server-side apply under Gantry's field manager
/// (forced: the status is the controller's own). The plan asks for it only when it differs from
/// the status observed.
async fn write_status(ctx: &Context, job: &FunctionJob, status: &FunctionJobStatus) -> Result<(), Error> {
    let patch = json!({
        "apiVersion": FunctionJob::api_version(&()),
        "kind": FunctionJob::kind(&()),
        "status": status,
    });
    ctx.jobs()
        .patch_status(&job.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
        .await
        .map_err(kube_error("write the status", &job.spec.job_id))?;
    Ok(())
}

/// The pod's log, split by prefix as the launcher splits it: (user log, provider log).
async fn read_pod_log(ctx: &Context, job_id: &str, provider: bool) -> Result<(String, Option<String>), String> {
    let params = LogParams { container: Some(crate::crd::JOB_CONTAINER.into()), ..Default::default() };
    let stream = ctx.pods().log_stream(&pod_name(job_id), &params).await.map_err(|error| error.to_string())?;
    let mut router = LogRouter::new(provider, ctx.settings.logs_size_limit);
    let mut lines = stream.lines();
    while let Some(line) = lines.try_next().await.map_err(|error| error.to_string())? {
        router.push_line(&line);
    }
    let provider_log = router.provider_function().then(|| router.provider.render());
    Ok((router.user.render(), provider_log))
}

async fn store_log(ctx: &Context, job_id: &str, user: String, provider: Option<String>) -> Result<(), Error> {
    let archive_error = |source| Error::Archive { job_id: job_id.to_string(), source };
    ctx.metrics.archived_bytes.inc_by(user.len() as u64);
    ctx.storage.put_bytes(&keys::job_user_log(job_id), user.into()).await.map_err(archive_error)?;
    if let Some(provider) = provider {
        ctx.metrics.archived_bytes.inc_by(provider.len() as u64);
        ctx.storage.put_bytes(&keys::job_provider_log(job_id), provider.into()).await.map_err(archive_error)?;
    }
    Ok(())
}

/// Puts `no log: <why>` where the log would be, and says so: a Kubernetes Event (a Warning when
/// a log was lost) and, for a lost log, a job event (`LOG_LOST`) the API lists.
async fn settle_without_log(
    ctx: &Context,
    job: &FunctionJob,
    provider_function: bool,
    state: &LogState,
) -> Result<(), Error> {
    let job_id = job.spec.job_id.as_str();
    let (lost, why) = match state {
        LogState::Lost(why) => (true, why.clone()),
        LogState::NoLog(why) => (false, why.clone()),
        _ => return Ok(()),
    };
    // Said first, stored last: the stored note is what marks the log settled (`of_stored`), so a
    // crash in between says it again rather than never.
    let note = format!("{NO_LOG}{why}\n");
    if lost {
        ctx.metrics.logs_lost.inc();
        let data = json!({"message": format!("the job's log was lost: {why}")});
        jobs::insert_finished_event(&ctx.db, job_id, "LOG_LOST", "ARCHIVE_LOGS", &data)
            .await
            .map_err(database_error(job_id))?;
        // Published now, not at the publisher's next poll.
        ctx.publisher.recorded();
        record(ctx, job, true, "LogLost", Some(why)).await;
    } else {
        record(ctx, job, false, "NoLog", Some(why)).await;
    }
    store_log(ctx, job_id, note.clone(), provider_function.then(|| note.clone())).await
}

/// Lowers a gauge however the work it counts ends (cut by the timeout included).
struct DecOnDrop<'a>(&'a prometheus_client::metrics::gauge::Gauge);

impl Drop for DecOnDrop<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_their_kind_through_the_finalizer() {
        use kube::runtime::finalizer::Error as FinalizerError;
        let pending = || Error::ArchivePending { job_id: "j".into(), reason: "r".into(), retry_after: Duration::ZERO };
        let wrapped = |source| Error::Finalizer { job_id: "j".into(), source: Box::new(source) };
        assert_eq!(pending().kind(), "archive_pending");
        assert_eq!(wrapped(FinalizerError::CleanupFailed(pending())).kind(), "archive_pending");
        let database = Error::Database { job_id: "j".into(), source: db::Error::UnsupportedUrl { url: "x".into() } };
        assert_eq!(wrapped(FinalizerError::ApplyFailed(database)).kind(), "database");
        assert_eq!(wrapped(FinalizerError::UnnamedObject).kind(), "finalizer");
        assert_eq!(Error::TimedOut { job_id: "j".into(), after: Duration::from_secs(1) }.kind(), "timeout");
    }
}
