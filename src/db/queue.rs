//! Where a user's jobs stand in the queue: their unfinished jobs and, for each queued one, how
//! many queued jobs (of every user) came before it. One statement, on the partial indexes of
//! unfinished jobs (`jobs_active_author_idx`, `jobs_active_status_created_idx`).

use super::{Db, Error, on_db, query_error};

/// One of the caller's unfinished jobs.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct QueuePlace {
    pub id: String,
    pub program_id: Option<String>,
    pub status: String,
    pub created: i64,
    /// Queued jobs of any user created before this one; meaningful for QUEUED jobs only.
    pub ahead: i64,
    /// Whether it takes a GPU slot.
    pub gpu: bool,
    /// Its function's title and provider (None once the function is deleted).
    pub program_title: Option<String>,
    pub provider_name: Option<String>,
}

/// The author's QUEUED, PENDING and RUNNING jobs, oldest first (at most `limit`).
pub async fn places(db: &Db, author_id: &str, limit: i64) -> Result<Vec<QueuePlace>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, QueuePlace>(
        "SELECT j.id, j.program_id, j.status, j.created, \
           CASE WHEN j.status = 'QUEUED' THEN \
             (SELECT COUNT(*) FROM jobs q WHERE q.status = 'QUEUED' \
                AND (q.created < j.created OR (q.created = j.created AND q.id < j.id))) \
           ELSE 0 END AS ahead, j.gpu, p.title AS program_title, pr.name AS provider_name \
         FROM jobs j LEFT JOIN programs p ON p.id = j.program_id LEFT JOIN providers pr ON pr.id = j.provider_id \
         WHERE j.author_id = $1 AND j.status IN ('QUEUED','PENDING','RUNNING') \
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

/// Pending+running jobs of every user: (CPU jobs, GPU jobs), the slots admission fills; from
/// the slots in use kept with every move (migration 0016), a few rows whatever the history.
pub async fn slots_in_use(db: &Db) -> Result<(i64, i64), Error> {
    let rows = on_db!(db, pool => sqlx::query_as::<_, (bool, i64)>(
        "SELECT gpu, CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM job_slot_counts GROUP BY gpu")
        .fetch_all(pool)
        .await)
    .map_err(query_error("read the slots in use"))?;
    let of = |gpu: bool| rows.iter().filter(|(g, _)| *g == gpu).map(|(_, n)| n).sum::<i64>();
    Ok((of(false), of(true)))
}
