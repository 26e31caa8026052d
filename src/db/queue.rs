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

/// The author's unfinished jobs by status, from the kept counts (exact however many there
/// are), and, when asked, the slots in use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueCounts {
    pub queued: i64,
    pub pending: i64,
    pub running: i64,
    /// Pending+running jobs of every user: (CPU jobs, GPU jobs), the slots admission fills.
    pub slots: Option<(i64, i64)>,
}

/// The author's counts and the slots in use, one row; `asked` only gives `$2` a place, so both
/// statements of `read` take the same three parameters.
macro_rules! queue_counts {
    () => {
        "SELECT \
             (SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM job_counts WHERE author_id = $1 AND status = 'QUEUED') AS queued_n, \
             (SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM job_counts WHERE author_id = $1 AND status = 'PENDING') AS pending_n, \
             (SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM job_counts WHERE author_id = $1 AND status = 'RUNNING') AS running_n, \
             CASE WHEN $3 THEN (SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM job_slot_counts WHERE NOT gpu) END AS cpu_n, \
             CASE WHEN $3 THEN (SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM job_slot_counts WHERE gpu) END AS gpu_n, \
             CAST($2 AS BIGINT) AS asked"
    };
}

/// Where the author's jobs stand, in one statement (one transaction): the counts of the
/// author's unfinished jobs (their kept counts), the slots in use when `slots` (kept with every
/// move, migration 0016: a few rows whatever the history), and the author's QUEUED, PENDING and
/// RUNNING jobs, oldest first (at most `limit`; none for 0), from `jobs_active_author_created_idx`,
/// each queued one with the number of every user's queued jobs ahead of it. As in the job
/// listings, the counts are joined to the page, so they come back when no job is listed (a row
/// of NULL job columns).
///
/// Each place is a count over the queued jobs' index up to that job: listing k queued jobs
/// costs the sum of their positions. With a long queue that is the cost that grows (see
/// docs/benchmarks.md: at 2 million queued jobs PostgreSQL's estimate for such a range sends it
/// to a scan of the table).
pub async fn read(db: &Db, author_id: &str, limit: i64, slots: bool) -> Result<(QueueCounts, Vec<QueuePlace>), Error> {
    // Without places, the counts alone (a prepared statement). With them, the counts joined to
    // the page, planned for this caller's values each time: the generic plan of a prepared
    // statement cannot know how many jobs the caller has nor `limit`, and read every unfinished
    // job (1.7 M of the 10 M scale seed) instead of the caller's first ones.
    let (sql, persistent) = match limit > 0 {
        false => (queue_counts!(), true),
        true => (
            concat!(
                "SELECT c.*, page.* FROM (",
                queue_counts!(),
                ") c \
         LEFT JOIN ( \
           SELECT j.id, j.program_id, j.status, j.created, \
             CASE WHEN j.status = 'QUEUED' THEN \
               (SELECT COUNT(*) FROM jobs q WHERE q.status = 'QUEUED' AND q.created <= j.created \
                  AND (q.created < j.created OR q.id < j.id)) \
             ELSE 0 END AS ahead, \
             j.gpu, p.title AS program_title, pr.name AS provider_name \
           FROM (SELECT * FROM jobs j WHERE j.author_id = $1 AND j.status IN ('QUEUED','PENDING','RUNNING') \
                 ORDER BY j.created, j.id LIMIT $2) j \
             LEFT JOIN programs p ON p.id = j.program_id LEFT JOIN providers pr ON pr.id = j.provider_id) page ON 1 = 1 \
         ORDER BY page.created, page.id"
            ),
            false,
        ),
    };
    on_db!(db, pool => async {
        let query = sqlx::query(sql).persistent(persistent).bind(author_id).bind(limit.max(0)).bind(slots);
        let rows = query.fetch_all(pool).await?;
        let mut counts = QueueCounts::default();
        let mut places = Vec::with_capacity(rows.len());
        for row in &rows {
            use sqlx::Row as _;
            counts = QueueCounts {
                queued: row.try_get("queued_n")?,
                pending: row.try_get("pending_n")?,
                running: row.try_get("running_n")?,
                slots: match (row.try_get::<Option<i64>, _>("cpu_n")?, row.try_get::<Option<i64>, _>("gpu_n")?) {
                    (Some(cpu), Some(gpu)) => Some((cpu, gpu)),
                    _ => None,
                },
            };
            if limit > 0 && row.try_get::<Option<String>, _>("id")?.is_some() {
                places.push(<QueuePlace as sqlx::FromRow<_>>::from_row(row)?);
            }
        }
        Ok::<_, sqlx::Error>((counts, places))
    }.await)
    .map_err(query_error("read the caller's queue"))
}
