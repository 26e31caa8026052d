//! What the controller's watches hand to kube-runtime's `Controller`: their events, never their
//! errors. A watch error (410 Expired after a compaction, a dropped or refused watch request) is
//! logged and counted here (`gantry_controller_watch_errors_total{watch}`), and the watch's own
//! backoff paces its reopening. Passed on, one error would pause every trigger at once: the
//! `Controller` backs off its whole trigger stream (up to 30 s) after any error, so one watch's
//! 410 would hold back new FunctionJobs, pod changes and admissions alike, and each error would
//! take the applier's split error path, where an error read by the wrong side waits for some
//! other wake to be handed on.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{controller, watcher};

use crate::crd::FunctionJobMeta;
use crate::ops::{Metrics, WatchLabels};

/// `stream` without its errors, each logged and counted under `watch`.
pub fn events_only<T>(
    stream: impl Stream<Item = Result<T, watcher::Error>>,
    watch: &'static str,
    metrics: Arc<Metrics>,
) -> impl Stream<Item = Result<T, watcher::Error>> {
    stream.filter_map(move |item| {
        let event = match item {
            Ok(event) => Some(Ok(event)),
            Err(error) => {
                metrics.watch_errors.get_or_create(&WatchLabels { watch }).inc();
                tracing::warn!(
                    watch,
                    error = &error as &dyn std::error::Error,
                    "watch failed: it is opened again after its backoff"
                );
                None
            }
        };
        std::future::ready(event)
    })
}

/// A tick every `period`, the first one period from now: the resync that reconciles every
/// resource held, so a wake lost while the store lacked its resource costs one period at most.
pub fn every(period: Duration) -> impl Stream<Item = ()> + Send {
    futures::stream::unfold((), move |()| async move {
        tokio::time::sleep(period).await;
        Some(((), ()))
    })
}

/// What one resync reconciles of the resources held: every one but those not being deleted
/// whose job rows wait in the queue (`queued`: names, which are job ids, of rows queued with no
/// stop asked for; `None` when they could not be read: then every one). Such a job has nothing
/// to do until admission moves it, and admission wakes each job it moves; one whose row left the
/// queue without its wake (lost) is reconciled. Reconciling all of them put one reconcile per
/// queued job, each a read of its resource and its row, in front of the admitted jobs' every
/// period: tens of seconds at 100,000 queued jobs.
pub fn to_resync(held: &[Arc<FunctionJobMeta>], queued: Option<&HashSet<&str>>) -> Vec<ObjectRef<FunctionJobMeta>> {
    held.iter()
        .filter(|job| {
            let waits = job.metadata.deletion_timestamp.is_none()
                && queued.is_some_and(|ids| job.metadata.name.as_deref().is_some_and(|name| ids.contains(name)));
            !waits
        })
        .map(|job| ObjectRef::from_obj(job.as_ref()))
        .collect()
}

/// The names of the resources held that are not being deleted: those the resync asks the
/// database about.
pub fn not_deleting(held: &[Arc<FunctionJobMeta>]) -> HashSet<&str> {
    held.iter()
        .filter(|job| job.metadata.deletion_timestamp.is_none())
        .filter_map(|job| job.metadata.name.as_deref())
        .collect()
}

/// Admitted jobs handed to the controller's queue whose reconcile has not run yet, by name, each
/// forgotten once it runs or [`HANDED_FOR`] after it was handed (its wake dropped: the store
/// lacked the resource). The admission pass waits while [`HANDED_AT_MOST`] of them wait: admitting
/// faster than pods are made only fills kube-runtime's queue, some 800 bytes a job (tens of MB
/// at 100,000 jobs admitted within a minute and a half, `bench/controller.sh tenants`), and the
/// jobs it moves to PENDING early wait there all the same.
#[derive(Debug, Default)]
pub struct Handed {
    waiting: std::sync::Mutex<std::collections::HashMap<Box<str>, std::time::Instant>>,
}

/// How long a handed job counts as waiting at most.
pub const HANDED_FOR: Duration = Duration::from_secs(30);
/// How many handed jobs may wait before admission waits too (two windows of a pass).
pub const HANDED_AT_MOST: usize = 2_000;

impl Handed {
    pub fn handed(&self, name: &str) {
        self.lock().insert(name.into(), std::time::Instant::now());
    }

    pub fn reconciled(&self, name: &str) {
        self.lock().remove(name);
    }

    /// Whether admission should wait: too many handed jobs wait for their reconcile.
    pub fn full(&self) -> bool {
        let mut waiting = self.lock();
        if waiting.len() < HANDED_AT_MOST {
            return false;
        }
        waiting.retain(|_, handed| handed.elapsed() < HANDED_FOR);
        waiting.len() >= HANDED_AT_MOST
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<Box<str>, std::time::Instant>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Takes in what kube-runtime's `Controller` hands back of one reconcile it was asked for. A
/// request for a resource its store did not hold (admission's wake before the watch brings a
/// new FunctionJob, a pod's event after its FunctionJob went) is dropped by kube-runtime: it is
/// counted here, and the resync reconciles whatever the store holds.
pub fn note_outcome<E: std::error::Error + 'static>(
    error: Option<controller::Error<E, watcher::Error>>,
    metrics: &Metrics,
) -> std::future::Ready<()> {
    match error {
        None => {}
        Some(controller::Error::ObjectNotFound(object)) => {
            metrics.not_in_store.inc();
            tracing::debug!(%object, "a reconcile was asked for a resource the store does not hold yet");
        }
        Some(error) => tracing::debug!(error = &error as &dyn std::error::Error, "reconcile outcome"),
    }
    std::future::ready(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn errors_are_counted_and_never_passed_on() {
        let metrics = Arc::new(Metrics::controller());
        let items = vec![Ok(1), Err(watcher::Error::NoResourceVersion), Ok(2), Err(watcher::Error::NoResourceVersion)];
        let passed: Vec<i32> = events_only(futures::stream::iter(items), "pods", Arc::clone(&metrics))
            .map(|item| item.unwrap())
            .collect()
            .await;
        assert_eq!(passed, [1, 2]);
        assert_eq!(metrics.watch_errors.get_or_create(&WatchLabels { watch: "pods" }).get(), 2);
        assert_eq!(metrics.watch_errors.get_or_create(&WatchLabels { watch: "functionjobs" }).get(), 0);
    }

    #[tokio::test]
    async fn a_reconcile_asked_for_a_resource_not_held_is_counted() {
        let metrics = Metrics::controller();
        let object = kube::runtime::reflector::ObjectRef::<FunctionJobMeta>::new("j").within("jobs").erase();
        note_outcome::<std::io::Error>(Some(controller::Error::ObjectNotFound(Box::new(object))), &metrics).await;
        note_outcome::<std::io::Error>(
            Some(controller::Error::QueueError(watcher::Error::NoResourceVersion)),
            &metrics,
        )
        .await;
        note_outcome::<std::io::Error>(None, &metrics).await;
        assert_eq!(metrics.not_in_store.get(), 1);
    }

    /// The metadata held of a resource named `id`.
    fn held(id: &str, deleting: bool) -> Arc<FunctionJobMeta> {
        let mut metadata = serde_json::json!({"name": id, "namespace": "jobs", "generation": 1});
        if deleting {
            metadata["deletionTimestamp"] = serde_json::json!("2026-01-01T00:00:00Z");
        }
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": metadata,
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_resync_leaves_alone_only_what_waits_in_the_queue() {
        let held = [
            held("queued", false),
            held("admitted-unwoken", false),
            held("deleting", true),
            held("stop-asked", false),
            held("running", false),
        ];
        assert_eq!(not_deleting(&held), ["queued", "admitted-unwoken", "stop-asked", "running"].into());
        let names = |refs: Vec<ObjectRef<FunctionJobMeta>>| refs.into_iter().map(|r| r.name).collect::<Vec<_>>();
        // Rows queued with no stop asked: "queued" only ("admitted-unwoken" was admitted and its
        // wake lost; "deleting" is asked about never, and reconciled whatever its row says).
        let queued: HashSet<&str> = ["queued", "deleting"].into();
        assert_eq!(names(to_resync(&held, Some(&queued))), ["admitted-unwoken", "deleting", "stop-asked", "running"]);
        // The rows unread: every resource held.
        assert_eq!(names(to_resync(&held, None)).len(), held.len());
    }

    #[test]
    fn admission_waits_while_too_many_handed_jobs_wait_for_their_reconcile() {
        let handed = Handed::default();
        for n in 0..HANDED_AT_MOST - 1 {
            handed.handed(&format!("job-{n}"));
        }
        assert!(!handed.full());
        handed.handed("one-more");
        assert!(handed.full());
        handed.reconciled("job-0");
        assert!(!handed.full(), "a reconcile that ran frees its place");
        handed.handed("job-0");
        // One handed long ago (its wake dropped) no longer counts.
        handed.lock().insert("dropped".into(), std::time::Instant::now() - HANDED_FOR);
        handed.reconciled("job-1");
        assert!(!handed.full());
        assert!(!handed.lock().contains_key("dropped"), "forgotten once it counted no more");
    }

    #[tokio::test]
    async fn the_resync_ticks_once_a_period() {
        let started = std::time::Instant::now();
        let ticks = every(Duration::from_millis(50)).take(3).count().await;
        assert_eq!(ticks, 3);
        assert!(started.elapsed() >= Duration::from_millis(150));
    }
}
