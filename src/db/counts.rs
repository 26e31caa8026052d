//! The kept counts, counted again from the jobs themselves: every job's count per user, function
//! and status (`job_counts`), per creation day (`job_counts_by_day`), per provider and status
//! (`job_provider_counts`), the slots in use (`job_slot_counts`) and the queued jobs per hour
//! (`job_queue_counts`). Every write keeps them in its own transaction through the statements
//! here (the adds, and the shard a move takes); a recount repairs them where something else
//! changed `jobs` (a seed loaded by COPY, a restore, an older version still writing during a
//! rolling upgrade).

use super::{Db, Error, on_db, query_error};

/// Adds `$5` to the counts of (author `$1`, program `$2`, status `$3`), in total and for the
/// creation day `$4`.
pub(crate) const COUNT_ADD: [&str; 2] = [
    "INSERT INTO job_counts (author_id, program_id, status, n) VALUES ($1, $2, $3, $5) \
     ON CONFLICT (author_id, program_id, status) DO UPDATE SET n = job_counts.n + excluded.n",
    "INSERT INTO job_counts_by_day (author_id, program_id, status, day, n) VALUES ($1, $2, $3, $4, $5) \
     ON CONFLICT (author_id, program_id, status, day) DO UPDATE SET n = job_counts_by_day.n + excluded.n",
];

/// Adds `$4` to the jobs of provider `$1` in status `$2`, in its row `$3` (migration 0021).
pub(crate) const PROVIDER_ADD: &str = "INSERT INTO job_provider_counts (provider_id, status, shard, n) VALUES ($1, $2, $3, $4) \
     ON CONFLICT (provider_id, status, shard) DO UPDATE SET n = job_provider_counts.n + excluded.n";

/// Adds `$3` to the slots in use of the kind `$1` (GPU or not) in its row `$2` (migration 0016).
pub(crate) const SLOT_ADD: &str = "INSERT INTO job_slot_counts (gpu, shard, n) VALUES ($1, $2, $3) \
     ON CONFLICT (gpu, shard) DO UPDATE SET n = job_slot_counts.n + excluded.n";

/// Rows per kind of the slots in use: moves take them in turn, so concurrent moves of one
/// process never wait for each other's row.
const SLOT_SHARDS: u64 = 16;

/// The slots-in-use (or queue block) row the next move of this process changes.
pub(crate) fn slot_shard() -> i64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let next = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % SLOT_SHARDS;
    i64::try_from(next).unwrap_or(0)
}

/// Adds `$3` to the queued jobs of block `$1` in its row `$2` (migration 0020).
pub(crate) const QUEUE_ADD: &str = "INSERT INTO job_queue_counts (block, shard, n) VALUES ($1, $2, $3) \
     ON CONFLICT (block, shard) DO UPDATE SET n = job_queue_counts.n + excluded.n";

/// The statements of a recount, in order: each kept table emptied, then filled from `jobs`.
/// Their numbers are those of the migrations that added the tables (days of 86,400,000,000
/// microseconds, hours of `queue::QUEUE_BLOCK_MICROS`).
const RECOUNT: [&str; 10] = [
    "DELETE FROM job_counts",
    "INSERT INTO job_counts (author_id, program_id, status, n) \
     SELECT author_id, COALESCE(program_id, ''), status, COUNT(*) FROM jobs GROUP BY author_id, COALESCE(program_id, ''), status",
    "DELETE FROM job_counts_by_day",
    "INSERT INTO job_counts_by_day (author_id, program_id, status, day, n) \
     SELECT author_id, COALESCE(program_id, ''), status, created / 86400000000, COUNT(*) FROM jobs \
     GROUP BY author_id, COALESCE(program_id, ''), status, created / 86400000000",
    "DELETE FROM job_provider_counts",
    "INSERT INTO job_provider_counts (provider_id, status, shard, n) \
     SELECT provider_id, status, 0, COUNT(*) FROM jobs WHERE provider_id IS NOT NULL GROUP BY provider_id, status",
    "DELETE FROM job_slot_counts",
    "INSERT INTO job_slot_counts (gpu, shard, n) \
     SELECT gpu, 0, COUNT(*) FROM jobs WHERE status IN ('PENDING', 'RUNNING') GROUP BY gpu",
    "DELETE FROM job_queue_counts",
    "INSERT INTO job_queue_counts (block, shard, n) \
     SELECT created / 3600000000, 0, COUNT(*) FROM jobs WHERE status = 'QUEUED' GROUP BY created / 3600000000",
];

/// The kept tables' sums: jobs by user, function and status; by day; by provider; the slots in
/// use; the queued jobs by hour.
const TOTALS: &str = "SELECT \
     (SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM job_counts), \
     (SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM job_counts_by_day), \
     (SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM job_provider_counts), \
     (SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM job_slot_counts), \
     (SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM job_queue_counts)";

/// The sums of the kept tables, in `TOTALS`' order.
pub type Totals = (i64, i64, i64, i64, i64);

/// What a recount changed: the kept tables' sums before and after (after: every job, every
/// job again by day, the jobs of provider functions, the pending and running jobs, the queued
/// jobs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recounted {
    pub before: Totals,
    pub after: Totals,
}

impl std::fmt::Display for Recounted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (b, a) = (self.before, self.after);
        write!(
            f,
            "recounted {} jobs: by user and function {} -> {}, by day {} -> {}, by provider {} -> {}, slots in use {} -> {}, queued {} -> {}",
            a.0, b.0, a.0, b.1, a.1, b.2, a.2, b.3, a.3, b.4, a.4
        )
    }
}

/// Counts every kept count again from `jobs`, in one transaction that holds writes to `jobs`
/// meanwhile (PostgreSQL: `SHARE` lock, reads go on; SQLite: its one writer), so the counts
/// match the jobs they are read from. At 10 million jobs this takes minutes.
pub async fn recount(db: &Db) -> Result<Recounted, Error> {
    let _writer = db.write_lock().await;
    let postgres = matches!(db, Db::Postgres(_));
    on_db!(db, pool => async {
        let mut tx = pool.begin().await?;
        if postgres {
            sqlx::query("LOCK TABLE jobs IN SHARE MODE").execute(&mut *tx).await?;
            // Room for the groupings in memory (10 M jobs group into ~1 M rows by day).
            sqlx::query("SET LOCAL work_mem = '256MB'").execute(&mut *tx).await?;
        }
        let before: Totals = sqlx::query_as(TOTALS).fetch_one(&mut *tx).await?;
        for statement in RECOUNT {
            sqlx::query(statement).execute(&mut *tx).await?;
        }
        let after: Totals = sqlx::query_as(TOTALS).fetch_one(&mut *tx).await?;
        tx.commit().await?;
        Ok::<_, sqlx::Error>(Recounted { before, after })
    }.await)
    .map_err(query_error("recount the kept counts"))
}

/// Whether a recount statement holds `text` (the units of days and hours, checked by tests).
#[cfg(test)]
pub(crate) fn recounts(text: &str) -> bool {
    RECOUNT.iter().any(|statement| statement.contains(text))
}
