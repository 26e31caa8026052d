//! When a job was created and when it started running: what the job-time histograms observe.

use crate::db::{Db, Error, on_db, query_error};

/// The job's creation time and the time of its first move into RUNNING (microseconds), when
/// the job exists.
pub async fn times(db: &Db, job_id: &str) -> Result<Option<(i64, Option<i64>)>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, (i64, Option<i64>)>(
        "SELECT j.created, (SELECT MIN(e.created) FROM job_events e WHERE e.job_id = j.id \
           AND e.event_type = 'STATUS_CHANGE' AND e.data LIKE '%\"status\":\"RUNNING\"%') \
         FROM jobs j WHERE j.id = $1")
        .bind(job_id)
        .fetch_optional(pool)
        .await)
    .map_err(query_error("load job times"))
}
