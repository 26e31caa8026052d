//! The leader's work: the kube-runtime controller over `FunctionJob`s and their pods (with the
//! pod watch kept in [`PodsSeen`] for the reconciles), and the admission pass that moves queued
//! jobs to PENDING and hands them to it. With leader election, only while this replica holds the
//! lease.

use std::sync::Arc;

use futures::{Stream, StreamExt, TryStreamExt};
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::{WatchStreamExt, predicates};

use super::leader::Elector;
use super::reconcile::{Context, Error, database_error, error_policy, reconcile};
use super::{seen::PodsSeen, triggers};
use crate::compute::{Capacity, Passed, admit_queued};
use crate::crd::FunctionJobMeta;
use crate::db::jobs;
use crate::ops::Metrics;

/// One admission pass: queued jobs that fit the limits across the cluster move to PENDING, and
/// each is handed to the controller's queue (`admitted`), whose reconcile starts its pod.
pub async fn admit(ctx: &Context, admitted: &Admitted) -> Result<Passed, Error> {
    let capacity = Capacity { free_gpus: None };
    let reconcile = |id: &str| {
        // A job whose resource does not exist yet starts when the gateway's sweep creates it.
        let _ = admitted.unbounded_send(ObjectRef::new(id).within(&ctx.settings.namespace));
    };
    admit_queued(
        &ctx.db,
        &ctx.publisher,
        &capacity,
        ctx.settings.limits,
        &ctx.admission,
        |job| {
            ctx.handed.handed(&job.id);
            reconcile(&job.id);
            ctx.metrics.admitted.inc();
        },
        // Its reconcile sees the stop request and deletes its pod.
        |id| {
            reconcile(id);
            ctx.metrics.preempted.inc();
        },
    )
    .await
    .map_err(database_error(""))
}

/// Where admission passes hand admitted jobs to the controller.
pub type Admitted = futures::channel::mpsc::UnboundedSender<ObjectRef<FunctionJobMeta>>;

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
            Passed::default()
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
            // Admission waits while its last admissions wait for their reconciles (`Handed`).
            if admission.handed.full() {
                full = false;
                continue;
            }
            full = admission_pass(Arc::clone(&admission), admitted.clone()).await.more;
        }
    });
    // Aborted with the leader's work however that ends (a lost lease drops this future).
    let _admitting = AbortOnDrop(admitting);
    // Only changes of a resource's generation (spec, deletion) start a reconcile, not the
    // controller's own status writes; pods, admissions and timers start the rest.
    let (reader, writer) = reflector::store();
    // Watches are asked to end after WATCH_SECONDS, so a watch that goes silent without ending
    // (a half-open connection) is given up and opened again within a minute, not kube's 295 s.
    // The store holds each resource's metadata only (a metadata watch); a reconcile reads the
    // whole resource.
    let metadata: kube::Api<FunctionJobMeta> = kube::Api::namespaced(ctx.client.clone(), &ctx.settings.namespace);
    let resources = watcher(metadata, watcher::Config::default().timeout(WATCH_SECONDS))
        .default_backoff()
        // Field ownership is most of a resource's metadata on a real API server, and never read;
        // nor are its labels and annotations here (the reconcile reads them from the resource).
        .modify(|job: &mut FunctionJobMeta| {
            let metadata = &mut job.metadata;
            job.types = None;
            metadata.managed_fields = None;
            metadata.labels = None;
            metadata.annotations = None;
            // Nor its finalizers, owners or version (the watch keeps its own); its name,
            // namespace, uid (a resource made again under the same name is new), generation
            // (what starts a reconcile) and deletion are what is read here.
            metadata.finalizers = None;
            metadata.owner_references = None;
            metadata.resource_version = None;
            metadata.generate_name = None;
        })
        .reflect(writer)
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default());
    let resources = triggers::events_only(resources, "functionjobs", Arc::clone(&ctx.metrics));
    // Job pods, kept (without their spec, which nothing here reads) for the reconciles to look
    // at; their changes, deletions included, wake their FunctionJob.
    let seen = Arc::new(PodsSeen::default());
    *ctx.pods_seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&seen));
    let news = Arc::clone(&seen);
    let pods = watcher(ctx.pods(), watcher::Config::default().labels(crate::crd::LABEL_JOB_ID).timeout(WATCH_SECONDS))
        .default_backoff()
        .inspect_ok(move |event| seen.observe(event))
        .touched_objects()
        // The pod a reconcile just made, as it made it, needs no second look.
        .try_filter(move |pod| std::future::ready(news.is_news(pod)));
    let pods = triggers::events_only(pods, "pods", Arc::clone(&ctx.metrics));
    let resyncs = resync(Arc::clone(&ctx), reader.clone());
    let namespace = ctx.settings.namespace.clone();
    let wake_ups = Arc::clone(&ctx.timers).due().map(move |name| ObjectRef::new(&name).within(&namespace));
    Controller::for_stream(resources, reader)
        .owns_stream(pods)
        .reconcile_on(to_reconcile)
        .reconcile_on(resyncs)
        .reconcile_on(wake_ups)
        .with_config(controller::Config::default().concurrency(ctx.settings.concurrency))
        .shutdown_on_signal()
        .run(reconcile, error_policy, Arc::clone(&ctx))
        .for_each(|outcome| triggers::note_outcome(outcome.err(), &ctx.metrics))
        .await;
}

/// The resync: every `--resync-seconds`, a reconcile of each resource the store holds but those
/// whose rows wait in the queue (`triggers::to_resync`), so a wake that was lost costs one
/// period at most without every queued job's reconcile standing in front of the admitted ones.
fn resync(
    ctx: Arc<Context>,
    store: reflector::Store<FunctionJobMeta>,
) -> impl Stream<Item = ObjectRef<FunctionJobMeta>> {
    triggers::every(ctx.settings.resync_every)
        .then(move |()| {
            let (ctx, store) = (Arc::clone(&ctx), store.clone());
            async move {
                let held = store.state();
                let waiting = triggers::not_deleting(&held);
                let queued = match jobs::still_queued(&ctx.db, &waiting).await {
                    Ok(queued) => Some(queued),
                    Err(error) => {
                        tracing::warn!(
                            error = &error as &dyn std::error::Error,
                            "the resync could not read which jobs are queued: it reconciles every resource held"
                        );
                        None
                    }
                };
                triggers::to_resync(&held, queued.as_ref())
            }
        })
        .flat_map(futures::stream::iter)
}

/// Seconds each watch is asked to last (`timeoutSeconds`); one silent for 5 s longer is dropped.
const WATCH_SECONDS: u32 = 60;

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
