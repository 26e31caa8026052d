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

use crate::crd::FunctionJob;
use crate::domain::lifecycle::JobStatus;
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

/// Whether a resource, by what it says itself, waits in the queue: queued, no stop asked for,
/// not being deleted. Its reconcile reads its job's row and, that row queued too, does nothing:
/// admission wakes each job it moves.
pub fn waits_in_queue(job: &FunctionJob) -> bool {
    job.metadata.deletion_timestamp.is_none()
        && !job.spec.stop_requested
        && job.status.as_ref().and_then(|status| status.phase) == Some(JobStatus::Queued)
}

/// What one resync reconciles of the resources held: every one but those waiting in the queue
/// whose job rows are queued too (`queued`, job ids; `None` when they could not be read: then
/// every one). A resource the row says left the queue (an admission whose wake was lost) is
/// reconciled. Reconciling all of them put one reconcile per queued job, each a read of its row,
/// in front of the admitted jobs' every period: tens of seconds at 100,000 queued jobs.
pub fn to_resync(held: &[Arc<FunctionJob>], queued: Option<&HashSet<&str>>) -> Vec<ObjectRef<FunctionJob>> {
    held.iter()
        .filter(|job| !(waits_in_queue(job) && queued.is_some_and(|ids| ids.contains(job.spec.job_id.as_str()))))
        .map(|job| ObjectRef::from_obj(job.as_ref()))
        .collect()
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
        let object = kube::runtime::reflector::ObjectRef::<crate::crd::FunctionJob>::new("j").within("jobs").erase();
        note_outcome::<std::io::Error>(Some(controller::Error::ObjectNotFound(Box::new(object))), &metrics).await;
        note_outcome::<std::io::Error>(
            Some(controller::Error::QueueError(watcher::Error::NoResourceVersion)),
            &metrics,
        )
        .await;
        note_outcome::<std::io::Error>(None, &metrics).await;
        assert_eq!(metrics.not_in_store.get(), 1);
    }

    /// A resource named `id` with the status phase `phase` (none: never reconciled yet).
    fn held(id: &str, phase: Option<&str>, stop: bool, deleting: bool) -> Arc<FunctionJob> {
        let mut metadata = serde_json::json!({"name": id, "namespace": "jobs", "generation": 1});
        if deleting {
            metadata["deletionTimestamp"] = serde_json::json!("2026-01-01T00:00:00Z");
        }
        let status = phase.map_or(serde_json::Value::Null, |phase| serde_json::json!({"phase": phase}));
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "gantry.dev/v1alpha1", "kind": "FunctionJob", "metadata": metadata,
                "spec": {"jobId": id, "function": {"title": "fn"}, "artifact": "a.tar", "entrypoint": "main.py",
                         "timeoutSeconds": 60, "user": "alice", "secretName": format!("gantry-job-{id}"),
                         "stopRequested": stop},
                "status": status,
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_resync_leaves_alone_only_what_waits_in_the_queue_on_both_sides() {
        let held = [
            held("queued", Some("QUEUED"), false, false),
            held("admitted-unwoken", Some("QUEUED"), false, false),
            held("never-reconciled", None, false, false),
            held("stop-asked", Some("QUEUED"), true, false),
            held("deleting", Some("QUEUED"), false, true),
            held("running", Some("RUNNING"), false, false),
        ];
        let names = |refs: Vec<ObjectRef<FunctionJob>>| refs.into_iter().map(|r| r.name).collect::<Vec<_>>();
        // The rows of all but "admitted-unwoken" are queued (it was admitted, its wake lost).
        let queued: HashSet<&str> = ["queued", "never-reconciled", "stop-asked", "deleting", "running"].into();
        assert_eq!(
            names(to_resync(&held, Some(&queued))),
            ["admitted-unwoken", "never-reconciled", "stop-asked", "deleting", "running"]
        );
        // The rows unread: every resource held.
        assert_eq!(names(to_resync(&held, None)).len(), held.len());
    }

    #[tokio::test]
    async fn the_resync_ticks_once_a_period() {
        let started = std::time::Instant::now();
        let ticks = every(Duration::from_millis(50)).take(3).count().await;
        assert_eq!(ticks, 3);
        assert!(started.elapsed() >= Duration::from_millis(150));
    }
}
