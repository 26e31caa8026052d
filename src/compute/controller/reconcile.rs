//! The controller's I/O shell: observe a `FunctionJob` (its job row, its pod), decide with the
//! pure `build` and `status` functions and the shared lifecycle, then apply (pod, job row and
//! event in one transaction, Kubernetes Event, resource status). It decides from observed state
//! only, so a controller restarted at any point resumes without a second pod or a repeated
//! event: the pod has a deterministic name and every status move is a compare-and-set.
//! A separate admission pass moves queued jobs to PENDING under the shared limits.

use std::sync::Arc;
use std::time::Duration;

use futures::{AsyncBufReadExt, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, LogParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::{WatchStreamExt, predicates};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::build::secret_name;
use super::build::{PodSettings, build_pod, pod_name};
use super::leader::{Elector, LeaseSettings};
use super::seen::PodsSeen;
use super::status::{LOST_LOG, LogState, NO_LOG, Observed, condition_is, log_source, pod_trigger, resource_status};
use crate::compute::{ADMISSION_WINDOW, admit_queued, move_job};
use crate::crd::{FIELD_MANAGER, FINALIZER, FunctionJob, FunctionJobStatus};
use crate::db::{self, Db, jobs};
use crate::domain::admission::{Capacity, Limits};
use crate::domain::lifecycle::{JobStatus, Trigger};
use crate::domain::logs::LogRouter;
use crate::events::Publisher;
use crate::ops::{Metrics, OutcomeLabels};
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
    pub limits: Limits,
    /// How often queued jobs are considered for admission.
    pub admission_every: Duration,
    /// Reconciles running at once (bounds memory and API load with many jobs).
    pub concurrency: u16,
    /// `FUNCTIONS_LOGS_SIZE_LIMIT`, for logs archived from the pod.
    pub logs_size_limit: usize,
    /// Who this replica is (its pod name): the Lease holder and the Events' reporting instance.
    pub identity: String,
    /// Leader election; `None` acts at once (a single replica known to be alone).
    pub leader: Option<LeaseSettings>,
}

/// What every reconcile may use.
pub struct Context {
    pub client: kube::Client,
    pub db: Db,
    pub storage: Storage,
    pub publisher: Arc<dyn Publisher>,
    pub settings: ControllerSettings,
    pub metrics: Arc<Metrics>,
    /// A hash of the status this process last wrote to each resource: the resource in the
    /// controller's cache may not show that write yet, and writing it again is a wasted call.
    written: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    /// The job pods the leader's watch has seen (without their spec): read instead of asking
    /// the API server on every reconcile.
    pods_seen: std::sync::Mutex<Option<Arc<PodsSeen>>>,
    /// Asks for an admission pass now (a queued job was seen) rather than at the next tick.
    admission_wanted: tokio::sync::Notify,
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
            settings,
            metrics,
            written: Default::default(),
            pods_seen: Default::default(),
            admission_wanted: Default::default(),
        }
    }

    fn jobs(&self) -> Api<FunctionJob> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    fn pods(&self) -> Api<Pod> {
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
}

fn kube_error<'a>(operation: &'static str, job_id: &'a str) -> impl FnOnce(kube::Error) -> Error + 'a {
    move |source| Error::Kube { operation, job_id: job_id.to_string(), source }
}

fn database_error(job_id: &str) -> impl FnOnce(db::Error) -> Error + '_ {
    move |source| Error::Database { job_id: job_id.to_string(), source }
}

/// Drives one `FunctionJob` towards its spec. Safe to call any number of times.
#[tracing::instrument(skip_all, fields(job.id = %job.spec.job_id))]
pub async fn reconcile(job: Arc<FunctionJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    let job_id = job.spec.job_id.clone();
    let started = std::time::Instant::now();
    let outcome = finalizer(&ctx.jobs(), FINALIZER, job, |event| async {
        match event {
            Finalizer::Apply(job) => apply(&job, &ctx).await,
            Finalizer::Cleanup(job) => cleanup(&job, &ctx).await,
        }
    })
    .await
    .map_err(|source| Error::Finalizer { job_id, source: Box::new(source) });
    ctx.metrics.reconcile_seconds.observe(started.elapsed().as_secs_f64());
    let label = OutcomeLabels { outcome: if outcome.is_ok() { "ok" } else { "error" } };
    ctx.metrics.reconciles.get_or_create(&label).inc();
    outcome
}

/// Transient failures retry soon; the resource is reconciled again anyway on every change. A log
/// still to archive before the resource may go retries on its own backoff.
pub fn error_policy(_job: Arc<FunctionJob>, error: &Error, _ctx: Arc<Context>) -> Action {
    use kube::runtime::finalizer::Error as FinalizerError;
    if let Error::Finalizer { source, .. } = error
        && let FinalizerError::CleanupFailed(Error::ArchivePending { retry_after, .. }) = source.as_ref()
    {
        tracing::info!(error = error as &dyn std::error::Error, "the resource waits for its log");
        return Action::requeue(*retry_after);
    }
    tracing::warn!(error = error as &dyn std::error::Error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// The wait before the next try to archive a log, `elapsed` after the first: doubling from 1 s,
/// at most a minute.
pub fn archive_backoff(elapsed: Duration) -> Duration {
    elapsed.clamp(Duration::from_secs(1), Duration::from_secs(60))
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

/// A trigger's words for the resource's status and its Kubernetes Event.
fn describe(trigger: &Trigger) -> Option<String> {
    match trigger {
        Trigger::LaunchFailed { reason } | Trigger::Lost { reason } | Trigger::Crashed { reason } => {
            Some(reason.clone())
        }
        Trigger::TimedOut => Some("the job exceeded PROGRAM_TIMEOUT".into()),
        Trigger::StopRequested => Some("stopped at the user's request".into()),
        _ => None,
    }
}

async fn apply(job: &FunctionJob, ctx: &Context) -> Result<Action, Error> {
    let job_id = job.spec.job_id.as_str();
    let Some(row) = jobs::state(&ctx.db, job_id).await.map_err(database_error(job_id))? else {
        // The gateway's sweep deletes such resources too; nothing to run for a job that is gone.
        tracing::warn!("FunctionJob without a job row; deleting it");
        ctx.jobs().delete(&job.name_any(), &DeleteParams::default()).await.map_err(kube_error("delete", job_id))?;
        return Ok(Action::await_change());
    };
    let previous = job.status.clone().unwrap_or_default();
    let mut status = row.status();
    // Unless the watch shows the pod, ask the API server, except for a queued job (pods are
    // made only once admitted) and an admitted one without a recorded pod (about to get one:
    // the create below finds a pod made already).
    // A pod recorded gone for good is never looked for again.
    let pod_gone = condition_is(&previous, "PodDeleted");
    let ask = !pod_gone
        && (previous.pod_name.is_some()
            || row.stop_requested
            || !matches!(status, JobStatus::Queued | JobStatus::Pending));
    let mut pod = ctx.observe_pod(job_id, ask).await?;
    let mut message = previous.message.clone();
    let pod_created = previous.pod_name.is_some() || pod.is_some();

    if !pod_created && row.stop_requested && status.is_active() {
        // Stopped before its pod existed: nothing to stop but the job itself.
        if let Some(moved) = move_job(&ctx.db, &ctx.publisher, job_id, status, &Trigger::StopRequested)
            .await
            .map_err(database_error(job_id))?
        {
            status = moved;
            message = describe(&Trigger::StopRequested);
            record(ctx, job, false, moved.as_str(), message.clone()).await;
        }
    } else if status == JobStatus::Pending && !pod_created {
        let (found, created) = ctx.create_pod(job).await?;
        // The status written below already names it.
        pod = found;
        if created {
            record(ctx, job, false, "PodCreated", Some(format!("pod {} created", pod_name(job_id)))).await;
        }
    } else if pod_created {
        if row.stop_requested
            && !status.is_terminal()
            && pod.as_ref().is_some_and(|p| p.metadata.deletion_timestamp.is_none())
        {
            let params = DeleteParams { grace_period_seconds: Some(10), ..Default::default() };
            ctx.delete_pod(job_id, &params, "stop the pod").await?;
        }
        let now = k8s_openapi::jiff::Timestamp::now();
        if let Some(trigger) = pod_trigger(status, row.stop_requested, pod.as_ref(), now, ctx.settings.pending_deadline)
            && let Some(moved) =
                move_job(&ctx.db, &ctx.publisher, job_id, status, &trigger).await.map_err(database_error(job_id))?
        {
            status = moved;
            message = describe(&trigger).or(message);
            let warning = matches!(moved, JobStatus::Failed);
            record(ctx, job, warning, moved.as_str(), message.clone()).await;
        }
    }

    let completed = match (status.is_terminal(), &previous.completion_time) {
        (true, Some(time)) => Some(time.0),
        (true, None) => Some(k8s_openapi::jiff::Timestamp::now()),
        (false, _) => None,
    };
    let since_end = completed.map(elapsed_since).unwrap_or_default();

    // Once finished: the log settled, the token deleted, the pod deleted after its keep window,
    // then the resource itself after its own. Each step is recorded in the status, so none is
    // repeated and a settled job costs no API call until it is collected.
    let mut logs = LogState::of(&previous);
    let mut archive_retry = None;
    if status.is_terminal() && !logs.settled() {
        let why_none = why_no_pod_log(status, message.as_deref(), pod_created);
        match settle_log(ctx, job, &row, pod.as_ref(), &why_none, since_end).await? {
            Ok(settled) => logs = settled,
            Err(retry_after) => archive_retry = Some(retry_after),
        }
    }
    let mut secret_deleted = condition_is(&previous, "SecretDeleted");
    if status.is_terminal() && !secret_deleted {
        ctx.delete_secret(job_id).await?;
        secret_deleted = true;
    }
    let keep_pod = ctx.settings.keep_finished_pods;
    let mut pod_deleted = pod_gone;
    if status.is_terminal() && logs.settled() && !pod_deleted {
        match &pod {
            None => pod_deleted = true,
            Some(found) if since_end >= keep_pod && found.metadata.deletion_timestamp.is_none() => {
                ctx.delete_pod(job_id, &DeleteParams::default(), "delete the pod").await?;
            }
            // Being deleted (its watch event wakes this), or still within its keep window.
            Some(_) => {}
        }
    }

    let observed = Observed {
        status,
        sub_status: row.sub_status.as_deref(),
        pod: pod.as_ref(),
        logs: &logs,
        secret_deleted,
        pod_deleted,
        message: message.as_deref(),
        generation: job.metadata.generation,
        completed,
        previous: job.status.as_ref(),
        now: k8s_openapi::jiff::Timestamp::now(),
    };
    let mut desired = resource_status(&observed);
    if desired.pod_name.is_none() && pod_created {
        desired.pod_name = Some(pod_name(job_id));
    }
    if job.status.as_ref() != Some(&desired) {
        write_status(ctx, job, &desired).await?;
    }
    let settled = status.is_terminal() && logs.settled() && secret_deleted && pod_deleted;
    let keep_job = ctx.settings.keep_finished_jobs;
    if settled && since_end >= keep_job {
        // History lives in the database and the object storage; the cluster keeps work in
        // flight and the recent past. The finalizer's cleanup finds everything settled.
        match ctx.jobs().delete(&job.name_any(), &DeleteParams::default()).await {
            Err(kube::Error::Api(status)) if status.is_not_found() => {}
            outcome => {
                outcome.map_err(kube_error("collect the finished FunctionJob", job_id))?;
            }
        }
        ctx.metrics.collected.inc();
        ctx.forget(job);
        return Ok(Action::await_change());
    }
    Ok(match status {
        JobStatus::Queued => {
            ctx.admission_wanted.notify_one();
            Action::await_change()
        }
        // Pod changes wake it; the timer only catches a pod pending past the deadline.
        JobStatus::Pending => {
            Action::requeue((ctx.settings.pending_deadline / 4).clamp(Duration::from_secs(1), Duration::from_secs(60)))
        }
        JobStatus::Running => Action::requeue(Duration::from_secs(60)),
        _ => match archive_retry {
            Some(retry_after) => Action::requeue(retry_after),
            // The pod's deletion is under way (its watch event wakes this; the timer is a net)
            // or its keep window runs.
            None if !pod_deleted => Action::requeue(keep_pod.saturating_sub(since_end).max(Duration::from_secs(5))),
            None => Action::requeue(keep_job.saturating_sub(since_end).max(Duration::from_secs(1))),
        },
    })
}

/// Why a job without a pod has no log: it ended before its pod was made, or the pod went
/// without the launcher shipping one.
fn why_no_pod_log(status: JobStatus, message: Option<&str>, pod_made: bool) -> String {
    let detail = message.map(|m| format!(": {m}")).unwrap_or_default();
    if pod_made {
        format!("the job's pod is gone and left no log{detail}")
    } else {
        format!("the job ended {} before its pod was made{detail}", status.as_str())
    }
}

/// Time since `at` (zero for a time in the future).
fn elapsed_since(at: k8s_openapi::jiff::Timestamp) -> Duration {
    let seconds = k8s_openapi::jiff::Timestamp::now().duration_since(at).as_secs_f64();
    Duration::from_secs_f64(seconds.max(0.0))
}

/// Writes the resource's status, unless this process wrote exactly that last time.
async fn write_status(ctx: &Context, job: &FunctionJob, status: &FunctionJobStatus) -> Result<(), Error> {
    use std::hash::{Hash, Hasher};
    let patch = json!({"status": status});
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    patch.to_string().hash(&mut hasher);
    let hash = hasher.finish();
    // By uid: a resource deleted and made again is a new one.
    let key = job.uid().unwrap_or_default();
    if ctx.written.lock().unwrap_or_else(|p| p.into_inner()).get(&key) == Some(&hash) {
        return Ok(());
    }
    ctx.jobs()
        .patch_status(&job.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kube_error("write the status", &job.spec.job_id))?;
    ctx.written.lock().unwrap_or_else(|p| p.into_inner()).insert(key, hash);
    Ok(())
}

impl Context {
    fn forget(&self, job: &FunctionJob) {
        self.written.lock().unwrap_or_else(|p| p.into_inner()).remove(&job.uid().unwrap_or_default());
    }
}

/// Settles a finished job's log: in storage already (the launcher ships it, its exit record
/// last), archived now from the pod's log (through the prefix router, capped), or, when there is
/// none to read (the container never ran, the pod is gone), an explicit `no log: <why>` in its
/// place. A pod log that cannot be read is retried: `Err(wait)`; after `archive_give_up` it is
/// given up as lost, with a Warning and a job event saying why. Nothing goes silently.
async fn settle_log(
    ctx: &Context,
    job: &FunctionJob,
    row: &jobs::JobState,
    pod: Option<&Pod>,
    why_none: &str,
    trying_for: Duration,
) -> Result<Result<LogState, Duration>, Error> {
    let job_id = job.spec.job_id.as_str();
    let archive_error = |source| Error::Archive { job_id: job_id.to_string(), source };
    if ctx.storage.read_to_bytes(&keys::job_exit(job_id)).await.map_err(archive_error)?.is_some() {
        return Ok(Ok(LogState::Archived));
    }
    // Settled by an earlier reconcile whose status write was lost (a crash): read back, so the
    // log is not read, nor its loss announced, twice.
    if let Some(stored) = ctx.storage.read_to_bytes(&keys::job_user_log(job_id)).await.map_err(archive_error)? {
        return Ok(Ok(LogState::of_stored(&String::from_utf8_lossy(&stored))));
    }
    let readable = match pod {
        Some(pod) => log_source(pod),
        None => Err(why_none.to_string()),
    };
    let why = match readable {
        Ok(()) => match read_pod_log(ctx, job_id, row.provider_function).await {
            Ok((user, provider)) => {
                store_log(ctx, job_id, user, provider).await?;
                record(ctx, job, false, "LogsArchived", Some("archived from the pod's log".into())).await;
                return Ok(Ok(LogState::Archived));
            }
            Err(error) if trying_for < ctx.settings.archive_give_up => {
                let retry_after = archive_backoff(trying_for);
                tracing::warn!(job.id = %job_id, %error, retry_in = retry_after.as_secs(), "the pod's log could not be read for archiving");
                return Ok(Err(retry_after));
            }
            Err(error) => {
                let why = format!("{LOST_LOG} {} s, giving up: {error}", trying_for.as_secs());
                return settle_without_log(ctx, job, row, LogState::Lost(why)).await.map(Ok);
            }
        },
        Err(why) => why,
    };
    settle_without_log(ctx, job, row, LogState::NoLog(why)).await.map(Ok)
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
    row: &jobs::JobState,
    state: LogState,
) -> Result<LogState, Error> {
    let job_id = job.spec.job_id.as_str();
    let (lost, why) = match &state {
        LogState::Lost(why) => (true, why.clone()),
        LogState::NoLog(why) => (false, why.clone()),
        _ => return Ok(state),
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
    store_log(ctx, job_id, note.clone(), row.provider_function.then(|| note.clone())).await?;
    Ok(state)
}

/// The resource is being deleted: settle the job row, the log and the token, delete the pod,
/// then let it go. A log that cannot be archived yet holds the resource (an error keeps the
/// finalizer) until `archive_give_up` after the deletion began; then it is given up as lost.
async fn cleanup(job: &FunctionJob, ctx: &Context) -> Result<Action, Error> {
    let job_id = job.spec.job_id.as_str();
    let previous = job.status.clone().unwrap_or_default();
    let pod_gone = condition_is(&previous, "PodDeleted");
    let pod = ctx.observe_pod(job_id, !pod_gone).await?;
    if let Some(row) = jobs::state(&ctx.db, job_id).await.map_err(database_error(job_id))? {
        let mut message = previous.message.clone();
        let mut status = row.status();
        if !status.is_terminal() {
            let trigger = match row.status() {
                JobStatus::Queued => Trigger::StopRequested,
                _ => Trigger::Lost { reason: "the job's FunctionJob was deleted".into() },
            };
            if let Some(moved) = move_job(&ctx.db, &ctx.publisher, job_id, row.status(), &trigger)
                .await
                .map_err(database_error(job_id))?
            {
                status = moved;
                message = describe(&trigger);
                record(ctx, job, moved == JobStatus::Failed, moved.as_str(), message.clone()).await;
            }
        }
        if !LogState::of(&previous).settled() {
            let since = job.metadata.deletion_timestamp.as_ref().map(|t| elapsed_since(t.0)).unwrap_or_default();
            let pod_made = previous.pod_name.is_some() || pod.is_some();
            let why_none = why_no_pod_log(status, message.as_deref(), pod_made);
            if let Err(retry_after) = settle_log(ctx, job, &row, pod.as_ref(), &why_none, since).await? {
                return Err(Error::ArchivePending {
                    job_id: job_id.to_string(),
                    reason: "the pod's log could not be read".into(),
                    retry_after,
                });
            }
        }
    }
    if !condition_is(&previous, "SecretDeleted") {
        ctx.delete_secret(job_id).await?;
    }
    if pod.is_some() {
        ctx.delete_pod(job_id, &DeleteParams::default(), "delete the pod").await?;
    }
    ctx.forget(job);
    Ok(Action::await_change())
}

/// One admission pass: queued jobs that fit the limits across the cluster move to PENDING, and
/// each is handed to the controller's queue (`admitted`), whose reconcile starts its pod.
pub async fn admit(ctx: &Context, admitted: &Admitted) -> Result<usize, Error> {
    let mut capacity = Capacity::default();
    for (author, gpu, count) in jobs::in_flight_load(&ctx.db).await.map_err(database_error(""))? {
        let count = usize::try_from(count).unwrap_or(0);
        *capacity.running_per_user.entry(author).or_default() += count;
        if gpu {
            capacity.running_gpu += count;
        } else {
            capacity.running_cpu += count;
        }
    }
    let moved = admit_queued(&ctx.db, &ctx.publisher, &capacity, ctx.settings.limits, |job_id| {
        // A job whose resource does not exist yet starts when the gateway's sweep creates it.
        let _ = admitted.unbounded_send(ObjectRef::new(&job_id).within(&ctx.settings.namespace));
        ctx.metrics.admitted.inc();
    })
    .await
    .map_err(database_error(""))?;
    Ok(moved)
}

/// Where admission passes hand admitted jobs to the controller.
pub type Admitted = futures::channel::mpsc::UnboundedSender<ObjectRef<FunctionJob>>;

/// Runs the controller until a shutdown signal: with leader election, only while this replica
/// holds the lease (a lost lease stops everything it was doing, and it stands again).
pub async fn run(ctx: Arc<Context>) {
    let Some(lease) = ctx.settings.leader.clone() else {
        lead(ctx).await;
        return;
    };
    let elector = Elector::new(ctx.client.clone(), &ctx.settings.namespace, ctx.settings.identity.clone(), lease);
    loop {
        tokio::select! {
            () = elector.acquire() => {}
            () = crate::shared::shutdown_signal() => return,
        }
        tokio::select! {
            () = lead(Arc::clone(&ctx)) => {
                elector.release().await;
                return;
            }
            () = elector.hold() => tracing::warn!("no longer the leader; stopped acting and standing again"),
        }
    }
}

/// The leader's work: the kube-runtime controller and the admission pass, until a shutdown signal.
async fn lead(ctx: Arc<Context>) {
    ctx.metrics.leader.set(1);
    let _leading = Leading(Arc::clone(&ctx.metrics));
    let admission = Arc::clone(&ctx);
    let (admitted, to_reconcile) = futures::channel::mpsc::unbounded();
    let admission_pass = |admission: Arc<Context>, admitted: Admitted| async move {
        admit(&admission, &admitted).await.unwrap_or_else(|error| {
            tracing::error!(error = &error as &dyn std::error::Error, "admission pass failed");
            0
        })
    };
    // A first pass before any reconcile: the jobs it admits are reconciled once, as PENDING,
    // rather than first written QUEUED and then PENDING.
    admission_pass(Arc::clone(&admission), admitted.clone()).await;
    let admitting = tokio::spawn(async move {
        let mut full = false;
        loop {
            // After a pass that admitted a whole window, more may fit: go on at once.
            if !full {
                tokio::select! {
                    () = tokio::time::sleep(admission.settings.admission_every) => {}
                    () = admission.admission_wanted.notified() => {}
                }
            }
            full = admission_pass(Arc::clone(&admission), admitted.clone()).await >= ADMISSION_WINDOW;
        }
    });
    // Aborted with the leader's work however that ends (a lost lease drops this future).
    let _admitting = AbortOnDrop(admitting);
    // Only changes of a resource's generation (spec, deletion) start a reconcile, not the
    // controller's own status writes; pods, admissions and timers start the rest.
    let (reader, writer) = reflector::store();
    let resources = watcher(ctx.jobs(), watcher::Config::default())
        .default_backoff()
        // Field ownership is most of a resource's size on a real API server, and never read.
        .modify(|job: &mut FunctionJob| job.metadata.managed_fields = None)
        .reflect(writer)
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default());
    // Job pods, kept (without their spec, which nothing here reads) for the reconciles to look
    // at; their changes, deletions included, wake their FunctionJob.
    let seen = Arc::new(PodsSeen::default());
    *ctx.pods_seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&seen));
    let news = Arc::clone(&seen);
    let pods = watcher(ctx.pods(), watcher::Config::default().labels(crate::crd::LABEL_JOB_ID))
        .default_backoff()
        .inspect_ok(move |event| seen.observe(event))
        .touched_objects()
        // The pod a reconcile just made, as it made it, needs no second look.
        .try_filter(move |pod| std::future::ready(news.is_news(pod)));
    Controller::for_stream(resources, reader)
        .owns_stream(pods)
        .reconcile_on(to_reconcile)
        .with_config(controller::Config::default().concurrency(ctx.settings.concurrency))
        .shutdown_on_signal()
        .run(reconcile, error_policy, Arc::clone(&ctx))
        .for_each(|outcome| async move {
            if let Err(error) = outcome {
                tracing::debug!(error = &error as &dyn std::error::Error, "reconcile outcome");
            }
        })
        .await;
}

/// Clears the leader gauge however leading ends.
struct Leading(Arc<Metrics>);

impl Drop for Leading {
    fn drop(&mut self) {
        self.0.leader.set(0);
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
