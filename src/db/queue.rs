//! Where a user's jobs stand in the queue: their unfinished jobs and, for each queued one, how
//! many queued jobs (of every user) came before it. One statement, on the partial indexes of
//! unfinished jobs (`jobs_active_author_idx`, `jobs_active_status_created_idx`).

use super::{Db, Error, on_db, query_error};

/// One of the caller's unfinished jobs.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct QueuePlace {
    pub id: String,
    pub status: String,
    pub created: i64,
    /// Queued jobs of any user created before this one; meaningful for QUEUED jobs only.
    pub ahead: i64,
}

/// The author's QUEUED, PENDING and RUNNING jobs, oldest first (at most `limit`).
pub async fn places(db: &Db, author_id: &str, limit: i64) -> Result<Vec<QueuePlace>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, QueuePlace>(
        "SELECT j.id, j.status, j.created, \
           CASE WHEN j.status = 'QUEUED' THEN \
             (SELECT COUNT(*) FROM jobs q WHERE q.status = 'QUEUED' \
                AND (q.created < j.created OR (q.created = j.created AND q.id < j.id))) \
           ELSE 0 END AS ahead \
         FROM jobs j WHERE j.author_id = $1 AND j.status IN ('QUEUED','PENDING','RUNNING') \
         ORDER BY j.created, j.id LIMIT $2")
        .bind(author_id)
        .bind(limit)
        .fetch_all(pool)
        .await)
    .map_err(query_error("read the caller's queue places"))
}

/// The author's QUEUED, PENDING and RUNNING jobs by status, from the kept counts (exact
/// however many there are).
pub async fn active_counts(db: &Db, author_id: &str) -> Result<Vec<(String, i64)>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, (String, i64)>(
        "SELECT status, CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM job_counts \
         WHERE author_id = $1 AND status IN ('QUEUED','PENDING','RUNNING') GROUP BY status")
        .bind(author_id)
        .fetch_all(pool)
        .await)
    .map_err(query_error("count the caller's active jobs"))
}
