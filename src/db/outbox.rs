//! The event outbox: every job event, recorded in the event's own transaction (see
//! `jobs::apply_move`, `jobs::set_sub_status`), waiting for the outbound sinks. The publisher
//! (`events::Drainer`) reads the undelivered rows, records each delivery attempt, and prunes the
//! oldest delivered rows.

use super::{Db, Error, on_db, query_error};

/// What a status move records in the outbox for the outbound sinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Outbox {
    /// Nothing: no outbound sink.
    #[default]
    Off,
    /// The job's events.
    Jobs,
    /// The job's events and its usage events (`UsageEvent`).
    JobsAndUsage,
}

impl Outbox {
    pub fn jobs(self) -> bool {
        self != Outbox::Off
    }

    pub fn usage(self) -> bool {
        self == Outbox::JobsAndUsage
    }
}

/// `true`: the job's events; `false`: nothing.
impl From<bool> for Outbox {
    fn from(jobs: bool) -> Outbox {
        if jobs { Outbox::Jobs } else { Outbox::Off }
    }
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxRow {
    pub id: String,
    pub job_id: String,
    /// `job` (the job's events) or `usage` (its usage events): each leaves in its own order.
    pub stream: String,
    pub seq: i64,
    pub created: i64,
    /// The CloudEvents `type`.
    pub event_type: String,
    pub data: String,
    pub delivered_to: String,
    pub attempts: i64,
    pub next_attempt: i64,
}

/// The oldest undelivered rows (including those waiting for a retry: they hold back the later
/// events of their job).
pub async fn pending(db: &Db, limit: i64) -> Result<Vec<OutboxRow>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, OutboxRow>(
        "SELECT id, job_id, stream, seq, created, event_type, data, delivered_to, attempts, next_attempt FROM event_outbox \
         WHERE delivered IS NULL AND failed IS NULL ORDER BY created, job_id, seq LIMIT $1")
        .bind(limit)
        .fetch_all(pool)
        .await)
    .map_err(query_error("read the event outbox"))
}

/// What became of one delivery attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// Every sink has the event.
    Delivered,
    /// Some sink failed; tried again at `next_attempt` (microseconds).
    Retry { error: String, next_attempt: i64 },
    /// Given up: the row is kept with its error.
    Failed { error: String },
}

/// Records an attempt on row `id`; `delivered_to` lists the sinks that have the event so far.
pub async fn record(db: &Db, id: &str, delivered_to: &str, attempt: &Attempt, now: i64) -> Result<(), Error> {
    let (delivered, failed, error, next_attempt) = match attempt {
        Attempt::Delivered => (Some(now), None, None, 0),
        Attempt::Retry { error, next_attempt } => (None, None, Some(error.as_str()), *next_attempt),
        Attempt::Failed { error } => (None, Some(now), Some(error.as_str()), 0),
    };
    on_db!(db, pool => sqlx::query(
        "UPDATE event_outbox SET delivered_to = $2, delivered = $3, failed = $4, last_error = $5, \
         next_attempt = $6, attempts = attempts + 1 WHERE id = $1")
        .bind(id)
        .bind(delivered_to)
        .bind(delivered)
        .bind(failed)
        .bind(error)
        .bind(next_attempt)
        .execute(pool)
        .await
        .map(|_| ()))
    .map_err(query_error("record an event delivery"))
}

/// Deletes delivered rows beyond the newest `keep` (the boundary is a delivery time: rows
/// delivered in the same microsecond go together). Undelivered and failed rows stay.
pub async fn prune(db: &Db, keep: i64) -> Result<u64, Error> {
    on_db!(db, pool => sqlx::query(
        "DELETE FROM event_outbox WHERE delivered IS NOT NULL AND delivered <= \
         (SELECT delivered FROM event_outbox WHERE delivered IS NOT NULL ORDER BY delivered DESC LIMIT 1 OFFSET $1)")
        .bind(keep.max(0))
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))
    .map_err(query_error("prune the event outbox"))
}

/// Rows by state: (waiting, delivered, failed).
pub async fn counts(db: &Db) -> Result<(i64, i64, i64), Error> {
    on_db!(db, pool => sqlx::query_as::<_, (i64, i64, i64)>(
        "SELECT COALESCE(SUM(CASE WHEN delivered IS NULL AND failed IS NULL THEN 1 ELSE 0 END), 0), \
         COALESCE(SUM(CASE WHEN delivered IS NOT NULL THEN 1 ELSE 0 END), 0), \
         COALESCE(SUM(CASE WHEN failed IS NOT NULL THEN 1 ELSE 0 END), 0) FROM event_outbox")
        .fetch_one(pool)
        .await)
    .map_err(query_error("count the event outbox"))
}

/// Undeliverable rows (event id, job id, error), newest first.
pub async fn failures(db: &Db, limit: i64) -> Result<Vec<(String, String, String)>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, (String, String, String)>(
        "SELECT id, job_id, COALESCE(last_error, '') FROM event_outbox WHERE failed IS NOT NULL \
         ORDER BY failed DESC LIMIT $1")
        .bind(limit)
        .fetch_all(pool)
        .await)
    .map_err(query_error("read the event outbox"))
}

/// Puts every undeliverable row back in the queue, to be tried at once; returns how many.
pub async fn requeue_failed(db: &Db) -> Result<u64, Error> {
    on_db!(db, pool => sqlx::query(
        "UPDATE event_outbox SET failed = NULL, attempts = 0, next_attempt = 0 WHERE failed IS NOT NULL")
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))
    .map_err(query_error("requeue undeliverable events"))
}

/// Only one process drains the outbox at a time, so each job's events leave in order. On
/// PostgreSQL that is whoever holds a session advisory lock (the connection is kept while held);
/// SQLite is one process's own database.
pub struct DrainLock {
    held: Option<sqlx::pool::PoolConnection<sqlx::Postgres>>,
}

/// The advisory lock's key ("gantryob").
const DRAIN_LOCK_KEY: i64 = 0x6761_6e74_7279_6f62;

impl DrainLock {
    pub fn new() -> DrainLock {
        DrainLock { held: None }
    }

    /// Whether this process may drain now: takes the lock if it is free.
    pub async fn acquire(&mut self, db: &Db) -> bool {
        let Db::Postgres(pool) = db else { return true };
        if let Some(conn) = self.held.as_mut() {
            // Still our session? A dropped connection released the lock.
            if sqlx::query("SELECT 1").execute(&mut **conn).await.is_ok() {
                return true;
            }
            self.held = None;
        }
        let Ok(mut conn) = pool.acquire().await else { return false };
        let taken: Result<bool, _> =
            sqlx::query_scalar("SELECT pg_try_advisory_lock($1)").bind(DRAIN_LOCK_KEY).fetch_one(&mut *conn).await;
        if taken.unwrap_or(false) {
            self.held = Some(conn);
            true
        } else {
            false
        }
    }
}

impl Default for DrainLock {
    fn default() -> Self {
        Self::new()
    }
}
