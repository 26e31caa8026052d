//! Where a user's jobs stand in the queue: their unfinished jobs and, for each queued one, how
//! many queued jobs (of every user) came before it, on the partial indexes of unfinished jobs
//! (`jobs_active_author_created_idx`, `jobs_active_status_created_idx`); their counts and the slots in
//! use from the kept counts.

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

/// The author's QUEUED, PENDING and RUNNING jobs, oldest first (at most `limit`). The places
/// of the queued ones come from one numbered walk of the queue (every user's QUEUED jobs, by
/// the partial index, oldest first) up to the last of them listed: one pass over the jobs
/// ahead of it, not one count per listed job (100 jobs deep in a queue of 10,000 would read a
/// million index entries so).
pub async fn places(db: &Db, author_id: &str, limit: i64) -> Result<Vec<QueuePlace>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, QueuePlace>(
        "WITH mine AS ( \
           SELECT j.id, j.program_id, j.provider_id, j.status, j.created, j.gpu FROM jobs j \
           WHERE j.author_id = $1 AND j.status IN ('QUEUED','PENDING','RUNNING') \
           ORDER BY j.created, j.id LIMIT $2), \
         last AS (SELECT created, id FROM mine WHERE status = 'QUEUED' ORDER BY created DESC, id DESC LIMIT 1), \
         ranked AS ( \
           SELECT q.id, ROW_NUMBER() OVER (ORDER BY q.created, q.id) - 1 AS ahead FROM jobs q, last \
           WHERE q.status = 'QUEUED' AND q.created <= last.created \
             AND (q.created < last.created OR q.id <= last.id)) \
         SELECT m.id, m.program_id, m.status, m.created, \
           CASE WHEN m.status = 'QUEUED' THEN CAST(COALESCE(r.ahead, 0) AS BIGINT) ELSE 0 END AS ahead, \
           m.gpu, p.title AS program_title, pr.name AS provider_name \
         FROM mine m LEFT JOIN ranked r ON r.id = m.id \
           LEFT JOIN programs p ON p.id = m.program_id LEFT JOIN providers pr ON pr.id = m.provider_id \
         ORDER BY m.created, m.id")
        .bind(author_id)
        .bind(limit)
        .fetch_all(pool)
        .await)
    .map_err(query_error("read the caller's queue places"))
}

/// The author's QUEUED, PENDING and RUNNING jobs by status, from the kept counts (exact
/// however many there are), and, when asked, the slots in use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueCounts {
    /// (status, jobs) of the author's unfinished jobs.
    pub active: Vec<(String, i64)>,
    /// Pending+running jobs of every user: (CPU jobs, GPU jobs), the slots admission fills.
    pub slots: Option<(i64, i64)>,
}

impl QueueCounts {
    /// The author's jobs in `status`.
    pub fn of(&self, status: &str) -> i64 {
        self.active.iter().filter(|(s, _)| s == status).map(|(_, n)| n).sum()
    }
}

/// The rows naming the slots in the one statement of `counts` (no status is written so).
const CPU_SLOTS: &str = "#cpu";
const GPU_SLOTS: &str = "#gpu";

/// The author's active counts and (with `slots`) the slots in use, in one statement (one
/// transaction): the author's rows of the kept counts, and the slots kept with every move
/// (migration 0016), a few rows whatever the history.
pub async fn counts(db: &Db, author_id: &str, slots: bool) -> Result<QueueCounts, Error> {
    let rows = on_db!(db, pool => sqlx::query_as::<_, (String, i64)>(
        "SELECT status, CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM job_counts \
         WHERE author_id = $1 AND status IN ('QUEUED','PENDING','RUNNING') GROUP BY status \
         UNION ALL \
         SELECT CASE WHEN gpu THEN $2 ELSE $3 END, CAST(COALESCE(SUM(n), 0) AS BIGINT) \
         FROM job_slot_counts WHERE $4 GROUP BY gpu")
        .bind(author_id)
        .bind(GPU_SLOTS)
        .bind(CPU_SLOTS)
        .bind(slots)
        .fetch_all(pool)
        .await)
    .map_err(query_error("count the caller's active jobs and the slots in use"))?;
    let (named, active): (Vec<_>, Vec<_>) = rows.into_iter().partition(|(name, _)| name.starts_with('#'));
    let of = |which: &str| named.iter().filter(|(name, _)| name == which).map(|(_, n)| n).sum::<i64>();
    Ok(QueueCounts { slots: slots.then(|| (of(CPU_SLOTS), of(GPU_SLOTS))), active })
}
