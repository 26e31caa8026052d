//! What the usage ledger keeps of a job while it runs: the "in progress" usage events of running
//! jobs (one a period, through the outbox), and what the runner measured of a job (its CPU time
//! and peak memory) before its terminal move copies it into the job's record.

use super::{MovedRow, UsageEvent, UsageRecord, usage};
use crate::db::{BeginWrite, Db, Error, on_db, query_error};

/// Jobs given their "in progress" event per statement (the next pass takes the rest).
const PROGRESS_BATCH: i64 = 500;

/// Records an "in progress" usage event for every RUNNING job whose last usage event (or start)
/// is at least `every` microseconds before `now`, up to `PROGRESS_BATCH` of them; answers how
/// many. Each is numbered after the job's earlier usage events, and never follows its end (the
/// numbering is conditioned on the job still running, in the transaction of the event).
pub async fn record_progress(db: &Db, every: i64, now: i64) -> Result<usize, Error> {
    let db = db.clone();
    crate::db::detached(async move {
        let due = format!(
            "SELECT {}, event_seq, gpu FROM jobs WHERE status = 'RUNNING' AND running_since IS NOT NULL \
             AND COALESCE(usage_reported, running_since) <= $1 ORDER BY created, id LIMIT $2",
            usage::ENDED_COLUMNS
        );
        let _writer = db.write_lock().await;
        on_db!(db, pool => async {
            let mut tx = pool.begin_write().await?;
            let running: Vec<MovedRow> =
                sqlx::query_as(&due).bind(now - every).bind(PROGRESS_BATCH).fetch_all(&mut *tx).await?;
            let mut recorded = 0;
            for MovedRow { job, .. } in &running {
                let record: UsageRecord = job.record("RUNNING", now);
                if insert_usage_outbox!(tx, &record, job.running_since, &[UsageEvent::InProgress], now, true) {
                    recorded += 1;
                }
            }
            tx.commit().await?;
            Ok(recorded)
        }.await)
        .map_err(query_error("record usage in progress"))
    })
    .await
}

/// Keeps what the runner measured of job `job_id` (CPU milliseconds it used, its peak memory in
/// bytes), for its usage record.
pub async fn record_measured(
    db: &Db,
    job_id: &str,
    cpu_used_ms: Option<i64>,
    memory_peak_bytes: Option<i64>,
) -> Result<(), Error> {
    let _writer = db.write_lock().await;
    on_db!(db, pool => sqlx::query("UPDATE jobs SET cpu_used_ms = $2, memory_peak_bytes = $3 WHERE id = $1")
        .bind(job_id)
        .bind(cpu_used_ms)
        .bind(memory_peak_bytes)
        .execute(pool)
        .await
        .map(|_| ()))
    .map_err(query_error("record what a job used"))
}
