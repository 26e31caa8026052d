//! Retries of what the infrastructure broke: the count of a job's retries, raised once per
//! retry by a compare-and-set, with the `RETRY` job event in the same transaction.

use super::OutboxNames;
use crate::db::{BeginWrite, Db, Error, now_micros, on_db, query_error};

/// Records that the job's attempt `made + 1` was ended by the cluster and the job starts again:
/// raises `infrastructure_retries` from `made` and records a `RETRY` event with `data` (and in
/// the outbox when the job's events go there). False when the job is not active or the retry
/// was recorded already (a controller that crashed before writing the FunctionJob's status).
pub async fn record_retry(db: &Db, job_id: &str, made: u32, data: &serde_json::Value) -> Result<bool, Error> {
    let (db, job_id, data) = (db.clone(), job_id.to_string(), data.to_string());
    crate::db::detached(async move {
        let now = now_micros();
        let _writer = db.write_lock().await;
        on_db!(db, pool => async {
            let mut tx = pool.begin_write().await?;
            let numbered: Option<(i64, bool)> = sqlx::query_as(
                "UPDATE jobs SET infrastructure_retries = infrastructure_retries + 1, event_seq = event_seq + 1, \
                 last_activity = $3 \
                 WHERE id = $1 AND infrastructure_retries = $2 AND status IN ('PENDING', 'RUNNING') \
                 RETURNING event_seq, outbox")
                .bind(&job_id)
                .bind(i64::from(made))
                .bind(now)
                .fetch_optional(&mut *tx)
                .await?;
            let Some((seq, outbox)) = numbered else {
                tx.rollback().await?;
                return Ok(false);
            };
            insert_event!(tx, &job_id, seq, now, "RETRY", "SCHEDULER", "RECONCILE", &data);
            if outbox {
                insert_event_outbox!(tx, &job_id, seq, now, "RETRY", "SCHEDULER", "RECONCILE", &data);
            }
            tx.commit().await?;
            Ok(true)
        }.await)
        .map_err(query_error("record job retry"))
    })
    .await
}
