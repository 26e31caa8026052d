//! How long requests wait for the database before their statements run: for a pooled connection
//! (every statement; what sqlx's pool measures of each acquisition, read from its own trace
//! event by the layer `init` installs) and, on SQLite, for the process's single write lock
//! (`db::group_commit`), with the size of the batches written under it. The admin port (`ops`)
//! exports them. A pool too small for the load shows as acquisition time that grows with the
//! clients; a write path that serializes, as write-lock time.

use std::sync::LazyLock;

use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::Context;

/// sqlx's trace event for each pool acquisition (`PoolOptions::acquire_time_level`), and the
/// one it logs instead when an acquisition was slow.
pub const ACQUIRE_TARGET: &str = "sqlx::pool::acquire";
/// The event's field with the seconds the acquisition took (sqlx's spelling).
const ACQUIRED_AFTER: &str = "aquired_after_secs";

pub struct DbWaits {
    /// Seconds to get a pooled connection, one observation per acquisition.
    pub pool_acquire: Histogram,
    /// Seconds to get SQLite's write lock (for a batched write: until its batch began).
    pub write_lock: Histogram,
    /// Writes committed together by one group commit.
    pub batch_size: Histogram,
}

/// 1 µs to about 16 s: an idle pool answers in microseconds, a saturated one in milliseconds.
fn wait_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_001, 4.0, 13))
}

pub static WAITS: LazyLock<DbWaits> = LazyLock::new(|| DbWaits {
    pool_acquire: wait_histogram(),
    write_lock: wait_histogram(),
    batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 8)),
});

/// Observes sqlx's acquisition events into `WAITS.pool_acquire`; filtered to `ACQUIRE_TARGET`
/// where it is installed, so no other event reaches it.
pub struct AcquireLayer;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for AcquireLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _context: Context<'_, S>) {
        let mut seconds = AcquiredAfter(None);
        event.record(&mut seconds);
        if let Some(seconds) = seconds.0 {
            WAITS.pool_acquire.observe(seconds);
        }
    }
}

struct AcquiredAfter(Option<f64>);

impl Visit for AcquiredAfter {
    fn record_f64(&mut self, field: &Field, value: f64) {
        if field.name() == ACQUIRED_AFTER {
            self.0 = Some(value);
        }
    }

    fn record_debug(&mut self, _field: &Field, _value: &dyn std::fmt::Debug) {}
}
