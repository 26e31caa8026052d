//! What the controller's watches hand to kube-runtime's `Controller`: their events, never their
//! errors. A watch error (410 Expired after a compaction, a dropped or refused watch request) is
//! logged and counted here (`gantry_controller_watch_errors_total{watch}`), and the watch's own
//! backoff paces its reopening. Passed on, one error would pause every trigger at once: the
//! `Controller` backs off its whole trigger stream (up to 30 s) after any error, so one watch's
//! 410 would hold back new FunctionJobs, pod changes and admissions alike, and each error would
//! take the applier's split error path, where an error read by the wrong side waits for some
//! other wake to be handed on.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::runtime::watcher;

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
}
