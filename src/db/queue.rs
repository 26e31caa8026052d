//! Where a user's jobs stand in the queue: their unfinished jobs and, for each queued one, how
//! many queued jobs (of every user) came before it, from the queued jobs kept per hour of
//! creation and the partial indexes of unfinished jobs (`jobs_active_author_created_idx`,
//! `jobs_active_status_created_id_idx`); their counts and the slots in use from the kept counts.

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
    /// The tenant it counts against (`None`: none), and whether it runs as backfill.
    pub tenant: Option<String>,
    pub backfill: bool,
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

/// Microseconds of creation time per queue block, as SQL text: the queued jobs are counted per
/// hour of their creation (`job_queue_counts`, migration 0020, which has the same number).
macro_rules! block_micros {
    () => {
        "3600000000"
    };
}

/// `block_micros!` as a number.
pub const QUEUE_BLOCK_MICROS: i64 = 3_600_000_000;

/// The queue block of a job created at `created`.
pub fn block_of(created: i64) -> i64 {
    created.div_euclid(QUEUE_BLOCK_MICROS)
}

/// Deletes the kept rows of the hours that hold no queued job any more, created before
/// `now`'s hour minus `QUIET_HOURS`: each hour leaves up to one row per shard behind when its
/// last job leaves the queue, and `read` sums every row up to the hours it lists. Only hours
/// whose count is zero and which no run can add to (a job is created in the hour of its run;
/// two hours spare a clock behind by that much) are deleted, so no concurrent move changes
/// them. Answers the rows deleted.
pub async fn prune_spent_blocks(db: &Db, now: i64) -> Result<u64, Error> {
    let before = block_of(now) - QUIET_HOURS;
    let _writer = db.write_lock().await;
    on_db!(db, pool => sqlx::query(
        "DELETE FROM job_queue_counts WHERE block < $1 AND block IN ( \
           SELECT block FROM job_queue_counts WHERE block < $1 GROUP BY block HAVING SUM(n) = 0)")
        .bind(before)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))
    .map_err(query_error("prune the queue's spent hours"))
}

/// Hours before the current one whose spent rows `prune_spent_blocks` leaves alone.
pub const QUIET_HOURS: i64 = 2;

/// Where the author's jobs stand, in one statement (one transaction): the counts of the
/// author's unfinished jobs (their kept counts), the slots in use when `slots` (kept with every
/// move, migration 0016: a few rows whatever the history), and the author's QUEUED, PENDING and
/// RUNNING jobs, oldest first (at most `limit`; none for 0), from `jobs_active_author_created_idx`,
/// each queued one with the number of every user's queued jobs ahead of it. As in the job
/// listings, the counts are joined to the page, so they come back when no job is listed (a row
/// of NULL job columns).
///
/// A place is never a count of the queue: it is the queued jobs of the hours before its job's
/// hour, summed from the kept counts per hour (`job_queue_counts`, one sum over the hours up to
/// the last listed job's, whatever the number of jobs in them), plus the queued jobs of its own
/// hour before it, counted in `jobs_active_status_created_id_idx` from the previous listed job
/// of that hour (or the hour's start). Listing k jobs reads at most the queue's hours and, per
/// hour holding a listed job, that hour's queued jobs up to the last listed one.
pub async fn read(db: &Db, author_id: &str, limit: i64, slots: bool) -> Result<(QueueCounts, Vec<QueuePlace>), Error> {
    // Both statements are prepared once and kept: the caller's jobs come from
    // `jobs_active_author_created_idx` in its order, which the generic plan walks for any caller
    // (before 0019 the index had the author alone, and the generic plan read every unfinished
    // job, 1.7 M of the 10 M scale seed, to sort them). The function's title and the provider's
    // name are looked up per job by key: joined, the planner hashed all 10,000 functions (3 ms).
    let sql = match limit > 0 {
        false => queue_counts!(),
        true => concat!(
            "WITH mine AS ( \
                   SELECT j.id, j.program_id, j.provider_id, j.status, j.created, j.gpu, j.tenant, j.backfill FROM jobs j \
                   WHERE j.author_id = $1 AND j.status IN ('QUEUED','PENDING','RUNNING') \
                   ORDER BY j.created, j.id LIMIT $2), \
                 queued AS ( \
                   SELECT id, created, created / ",
            block_micros!(),
            " AS block, \
                     LAG(created) OVER (PARTITION BY created / ",
            block_micros!(),
            " ORDER BY created, id) AS prev_created, \
                     LAG(id) OVER (PARTITION BY created / ",
            block_micros!(),
            " ORDER BY created, id) AS prev_id \
                   FROM mine WHERE status = 'QUEUED'), \
                 steps AS ( \
                   SELECT s.id, s.created, s.block, \
                     (SELECT COUNT(*) FROM jobs q WHERE q.status = 'QUEUED' \
                        AND (q.created, q.id) >= (COALESCE(s.prev_created, s.block * ",
            block_micros!(),
            "), COALESCE(s.prev_id, '')) \
                        AND (q.created, q.id) < (s.created, s.id)) AS step \
                   FROM queued s), \
                 blocks AS ( \
                   SELECT block, CAST(SUM(n) AS BIGINT) AS n FROM job_queue_counts \
                   WHERE block <= (SELECT MAX(block) FROM queued) GROUP BY block), \
                 before AS ( \
                   SELECT block, CAST(SUM(n) OVER (ORDER BY block ROWS UNBOUNDED PRECEDING) - n AS BIGINT) AS n FROM blocks), \
                 places AS ( \
                   SELECT s.id, CAST(COALESCE(b.n, 0) + SUM(s.step) OVER ( \
                       PARTITION BY s.block ORDER BY s.created, s.id ROWS UNBOUNDED PRECEDING) AS BIGINT) AS ahead \
                   FROM steps s LEFT JOIN before b ON b.block = s.block) \
                 SELECT c.*, page.* FROM (",
            queue_counts!(),
            ") c \
                 LEFT JOIN ( \
                   SELECT m.id, m.program_id, m.status, m.created, COALESCE(pl.ahead, 0) AS ahead, m.gpu, m.tenant, m.backfill, \
                     (SELECT p.title FROM programs p WHERE p.id = m.program_id) AS program_title, \
                     (SELECT pr.name FROM providers pr WHERE pr.id = m.provider_id) AS provider_name \
                   FROM mine m LEFT JOIN places pl ON pl.id = m.id) page ON 1 = 1 \
                 ORDER BY page.created, page.id"
        ),
    };
    on_db!(db, pool => async {
        let query = sqlx::query(sql).bind(author_id).bind(limit.max(0)).bind(slots);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hour_is_one_number_in_every_statement() {
        assert_eq!(block_micros!().parse::<i64>().unwrap(), QUEUE_BLOCK_MICROS);
        let migration = include_str!("../../migrations/0020_job_queue_counts.sql");
        assert!(migration.contains(&format!("created / {QUEUE_BLOCK_MICROS}")), "{migration}");
        assert!(crate::db::counts::recounts(&format!("created / {QUEUE_BLOCK_MICROS}")));
        assert_eq!(block_of(QUEUE_BLOCK_MICROS * 5 + 1), 5);
        assert_eq!(block_of(QUEUE_BLOCK_MICROS * 5 - 1), 4);
    }
}
