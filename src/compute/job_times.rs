//! How long jobs wait and run, observed by whichever process moves them (the local runner, the
//! controller, or the gateway stopping a job): histograms of the wait from QUEUED to RUNNING and
//! of the run from RUNNING to the end by final status. Labels stay bounded (never a job or a
//! user). They live here, beside the moves, and the admin port (`ops`) exports them.

use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use crate::db::{self, jobs::Moved};
use crate::domain::lifecycle::JobStatus;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FinalStatusLabels {
    pub status: &'static str,
}

/// 0.1 s to about 11 days: a job waits or runs for seconds to days.
fn job_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.1, 2.0, 24))
}

pub struct JobTimes {
    /// Seconds from QUEUED to RUNNING.
    pub queue_wait: Histogram,
    /// Seconds from RUNNING to the end, by final status.
    pub run_time: Family<FinalStatusLabels, Histogram, fn() -> Histogram>,
}

/// The process's job-time histograms.
pub static JOB_TIMES: LazyLock<JobTimes> = LazyLock::new(|| JobTimes {
    queue_wait: job_histogram(),
    run_time: Family::new_with_constructor(job_histogram as fn() -> Histogram),
});

/// Observes a move just written (`moved`, as the move returned it): the queue wait when the job
/// starts running, the run time when it ends (a job that never ran has none). Nothing is read:
/// the move returns when the job was created and since when it has run.
pub fn observe(to: JobStatus, moved: &Moved) {
    let seconds = |since: i64| (db::now_micros() - since).max(0) as f64 / 1e6;
    if to == JobStatus::Running {
        JOB_TIMES.queue_wait.observe(seconds(moved.created));
        return;
    }
    if !to.is_terminal() {
        return;
    }
    if let Some(started) = moved.running_since {
        JOB_TIMES.run_time.get_or_create(&FinalStatusLabels { status: to.as_str() }).observe(seconds(started));
    }
}
