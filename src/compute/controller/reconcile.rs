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

use super::build::{PodSettings, build_pod, pod_name};
use super::leader::{Elector, LeaseSettings};
use super::seen::PodsSeen;
use super::status::{Observed, pod_trigger, resource_status};
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

/// Transient failures retry soon; the resource is reconciled again anyway on every change.
pub fn error_policy(_job: Arc<FunctionJob>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = error as &dyn std::error::Error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
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
        Trigger::LaunchFailed { reason } | Trigger::Lost { reason } => Some(reason.clone()),
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
    let ask =
        previous.pod_name.is_some() || row.stop_requested || !matches!(status, JobStatus::Queued | JobStatus::Pending);
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

    let mut logs_archived = previous.logs_archived;
    if status.is_terminal() && !logs_archived {
        logs_archived = archive(ctx, job, &row, pod.as_ref()).await?;
    }
    let completed = match (status.is_terminal(), &previous.completion_time) {
        (true, Some(time)) => Some(time.0),
        (true, None) => Some(k8s_openapi::jiff::Timestamp::now()),
        (false, _) => None,
    };
    let keep = ctx.settings.keep_finished_pods;
    let finished_long_enough = completed
        .is_some_and(|at| k8s_openapi::jiff::Timestamp::now().duration_since(at).as_secs() >= keep.as_secs() as i64);
    if status.is_terminal() && logs_archived && pod.is_some() && finished_long_enough {
        ctx.delete_pod(job_id, &DeleteParams::default(), "delete the pod").await?;
    }

    let observed = Observed {
        status,
        sub_status: row.sub_status.as_deref(),
        pod: pod.as_ref(),
        logs_archived,
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
    if status.is_terminal() && logs_archived && pod.is_none() {
        // Nothing will change any more.
        ctx.forget(job);
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
        _ if pod.is_some() => Action::requeue(keep.max(Duration::from_secs(1))),
        _ => Action::await_change(),
    })
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

/// Makes sure the finished job's logs are in storage: the launcher ships them (its exit record
/// comes last); if it could not, the pod's log is streamed through the prefix router, capped,
/// and stored. True when the logs are archived (or there is nothing left to archive).
async fn archive(ctx: &Context, job: &FunctionJob, row: &jobs::JobState, pod: Option<&Pod>) -> Result<bool, Error> {
    let job_id = job.spec.job_id.as_str();
    let archive_error = |source| Error::Archive { job_id: job_id.to_string(), source };
    if ctx.storage.read_to_bytes(&keys::job_exit(job_id)).await.map_err(archive_error)?.is_some() {
        return Ok(true);
    }
    let Some(pod) = pod else { return Ok(true) };
    let started = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref()).is_some_and(|c| !c.is_empty());
    if !started {
        return Ok(true);
    }
    let params = LogParams { container: Some("job".into()), ..Default::default() };
    let stream = match ctx.pods().log_stream(&pod_name(job_id), &params).await {
        Ok(stream) => stream,
        // The kubelet may not serve it (yet): try again on the next reconcile.
        Err(error) => {
            tracing::warn!(error = &error as &dyn std::error::Error, "failed to read the pod log for archiving");
            return Ok(false);
        }
    };
    let mut router = LogRouter::new(row.provider_function, ctx.settings.logs_size_limit);
    let mut lines = stream.lines();
    while let Some(line) =
        lines.try_next().await.map_err(|source| Error::PodLog { job_id: job_id.to_string(), source })?
    {
        router.push_line(&line);
    }
    let user_log = router.user.render();
    ctx.metrics.archived_bytes.inc_by(user_log.len() as u64);
    ctx.storage.put_bytes(&keys::job_user_log(job_id), user_log.into()).await.map_err(archive_error)?;
    if router.provider_function() {
        let provider_log = router.provider.render();
        ctx.metrics.archived_bytes.inc_by(provider_log.len() as u64);
        ctx.storage.put_bytes(&keys::job_provider_log(job_id), provider_log.into()).await.map_err(archive_error)?;
    }
    record(ctx, job, false, "LogsArchived", Some("archived from the pod's log".into())).await;
    Ok(true)
}

/// The resource is being deleted: settle the job row and the archive, then let it go.
async fn cleanup(job: &FunctionJob, ctx: &Context) -> Result<Action, Error> {
    let job_id = job.spec.job_id.as_str();
    let pod = ctx.observe_pod(job_id, true).await?;
    if let Some(row) = jobs::state(&ctx.db, job_id).await.map_err(database_error(job_id))? {
        if !row.status().is_terminal() {
            let trigger = match row.status() {
                JobStatus::Queued => Trigger::StopRequested,
                _ => Trigger::Lost { reason: "the job's FunctionJob was deleted".into() },
            };
            move_job(&ctx.db, &ctx.publisher, job_id, row.status(), &trigger).await.map_err(database_error(job_id))?;
        }
        if !job.status.as_ref().is_some_and(|s| s.logs_archived) && !archive(ctx, job, &row, pod.as_ref()).await? {
            return Ok(Action::requeue(Duration::from_secs(5)));
        }
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
            () = crate::serve::shutdown_signal() => return,
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
