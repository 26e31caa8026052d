//! The kept counts: every job's count per user, function and status (`job_counts`), per creation
//! day (`job_counts_by_day`), per provider and status (`job_provider_counts`), the slots in use
//! (`job_slot_counts`) and the queued jobs per hour (`job_queue_counts`). This module is their
//! one writer: a write says which jobs enter or leave which status (`Changes`), and the rows
//! follow, in the order every writer locks them, in the write's own transaction (or, for the
//! one-statement writes on PostgreSQL, `postgres_ctes` in the write's statement). A new kept
//! count is a new part of `Changes`, of `postgres_ctes` and of the recount, here and nowhere
//! else. The recount repairs them where something else changed `jobs` (a seed loaded by COPY, a
//! restore, an older version still writing during a rolling upgrade).

use std::collections::BTreeMap;

use super::params::{Param, placeholders};
use super::queue::block_of;
use super::usage::UsageRecord;
use super::{BeginWrite, Db, Error, on_db, query_error};
use crate::domain::lifecycle::JobStatus;
use crate::domain::usage::Figures;

/// Days: the counts are kept per creation day.
pub(crate) use crate::domain::usage::{DAY_MICROS, day_of};

/// Rows per key of the provider, slot and queue counts: writes take them in turn, so
/// concurrent writes of one process never wait for each other's row.
const SHARDS: u64 = 16;

/// The row the next write of this process changes, of a sharded count.
pub(crate) fn shard() -> i64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let next = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % SHARDS;
    i64::try_from(next).unwrap_or(0)
}

/// A job as the kept counts key it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Counted<'a> {
    pub author_id: &'a str,
    /// Its function's id, `""` for none (the counts' key).
    pub program_id: &'a str,
    pub created: i64,
    pub gpu: bool,
    pub provider_id: Option<&'a str>,
}

/// What a write changes in the kept counts: jobs entering a status (a positive number) or
/// leaving it (negative), summed per row, each part in the order its rows are locked.
#[derive(Debug, Default)]
pub(crate) struct Changes {
    /// (status, author, function) -> jobs.
    by_user: BTreeMap<(&'static str, String, String), i64>,
    /// (status, author, function, creation day) -> jobs.
    by_day: BTreeMap<(&'static str, String, String, i64), i64>,
    /// (status, provider) -> jobs.
    by_provider: BTreeMap<(&'static str, String), i64>,
    /// Slots in use: CPU, GPU.
    slots: [i64; 2],
    /// Queue block (hour of creation) -> queued jobs.
    queued: BTreeMap<i64, i64>,
    /// Usage records summed per (author, day of their end, function, size): the provider of
    /// the function (`""` for none), the records, their figures (`usage_by_day`).
    used: BTreeMap<UsageKey, (String, i64, Figures)>,
}

/// A row of `usage_by_day`: author, day, function, size.
type UsageKey = (String, i64, String, String);

/// At most this many rows in one multi-row upsert (five parameters a row at most, well under
/// both dialects' limits on parameters).
const ROWS_PER_STATEMENT: usize = 1_000;

impl Changes {
    /// `n` jobs like `job` enter `status` (a negative `n`: leave it).
    pub(crate) fn add(&mut self, job: &Counted<'_>, status: JobStatus, n: i64) {
        let name = status.as_str();
        let (author, program) = (job.author_id.to_string(), job.program_id.to_string());
        *self.by_user.entry((name, author.clone(), program.clone())).or_default() += n;
        *self.by_day.entry((name, author, program, day_of(job.created))).or_default() += n;
        if let Some(provider) = job.provider_id {
            *self.by_provider.entry((name, provider.to_string())).or_default() += n;
        }
        if status.holds_slot() {
            self.slots[usize::from(job.gpu)] += n;
        }
        if status == JobStatus::Queued {
            *self.queued.entry(block_of(job.created)).or_default() += n;
        }
    }

    /// `job` moves from `from` to `to`.
    pub(crate) fn moved(&mut self, job: &Counted<'_>, from: JobStatus, to: JobStatus) {
        self.add(job, from, -1);
        self.add(job, to, 1);
    }

    /// A job's usage record enters the totals of the day it ended.
    pub(crate) fn used(&mut self, record: &UsageRecord) {
        let key = (
            record.author_id.clone(),
            day_of(record.ended),
            record.program_id.clone(),
            record.function_size.clone().unwrap_or_default(),
        );
        let entry = self
            .used
            .entry(key)
            .or_insert_with(|| (record.provider_id.clone().unwrap_or_default(), 0, Figures::default()));
        entry.1 += 1;
        entry.2 = entry.2.plus(record.figures());
    }

    /// What these changes add to `author`'s active jobs (QUEUED, PENDING, RUNNING): not yet in
    /// the tables, so a read of them in the same transaction adds it.
    pub(crate) fn active_of(&self, author: &str) -> i64 {
        self.by_user
            .iter()
            .filter(|((status, of, _), _)| of == author && matches!(*status, "QUEUED" | "PENDING" | "RUNNING"))
            .map(|(_, n)| n)
            .sum()
    }

    /// The statements that write these changes, with their parameters, in the order every
    /// writer locks the kept rows (so concurrent writes on PostgreSQL cannot deadlock): the
    /// counts by user in (status, author, function) order, by day likewise, by provider in
    /// (status, provider) order, the slots (CPU before GPU), the queue's blocks in order. Each
    /// is one multi-row upsert a table (per `ROWS_PER_STATEMENT`); the sharded rows take row
    /// `shard`. With `drop_emptied`, the rows by user and by day that reach zero are deleted
    /// (a deletion of jobs: such a row would stay at zero for good).
    pub(crate) fn statements(&self, shard: i64, drop_emptied: bool) -> Vec<(String, Vec<Param>)> {
        let mut out = Vec::new();
        let nonzero = |n: &&i64| **n != 0;
        let user_rows: Vec<(Vec<Param>, i64)> = (self.by_user.iter().filter(|(_, n)| nonzero(n)))
            .map(|((status, author, program), n)| (vec![text(author), text(program), text(status)], *n))
            .collect();
        upserts(&mut out, "job_counts", "author_id, program_id, status", &user_rows, drop_emptied);
        let day_rows: Vec<(Vec<Param>, i64)> = (self.by_day.iter().filter(|(_, n)| nonzero(n)))
            .map(|((status, author, program, day), n)| {
                (vec![text(author), text(program), text(status), Param::Int(*day)], *n)
            })
            .collect();
        upserts(&mut out, "job_counts_by_day", "author_id, program_id, status, day", &day_rows, drop_emptied);
        let provider_rows: Vec<(Vec<Param>, i64)> = (self.by_provider.iter().filter(|(_, n)| nonzero(n)))
            .map(|((status, provider), n)| (vec![text(provider), text(status), Param::Int(shard)], *n))
            .collect();
        upserts(&mut out, "job_provider_counts", "provider_id, status, shard", &provider_rows, false);
        let slot_rows: Vec<(Vec<Param>, i64)> = (0..2)
            .filter(|&kind| self.slots[kind] != 0)
            .map(|kind| (vec![Param::Bool(kind == 1), Param::Int(shard)], self.slots[kind]))
            .collect();
        upserts(&mut out, "job_slot_counts", "gpu, shard", &slot_rows, false);
        let queue_rows: Vec<(Vec<Param>, i64)> = (self.queued.iter().filter(|(_, n)| nonzero(n)))
            .map(|(block, n)| (vec![Param::Int(*block), Param::Int(shard)], *n))
            .collect();
        upserts(&mut out, "job_queue_counts", "block, shard", &queue_rows, false);
        let used: Vec<_> = self.used.iter().collect();
        for chunk in used.chunks(ROWS_PER_STATEMENT) {
            let (mut values, mut params) = (Vec::new(), Vec::new());
            for (i, ((author, day, program, size), (provider, jobs, figures))) in chunk.iter().enumerate() {
                values.push(format!("({})", placeholders(1 + i * 11, 11)));
                params.extend([text(author), Param::Int(*day), text(program), text(size), text(provider)]);
                params.extend(
                    [*jobs, figures.wait_ms, figures.run_ms, figures.cpu_core_ms, figures.gib_ms, figures.gpu_ms]
                        .map(Param::Int),
                );
            }
            let sums = USAGE_SUMS.iter().map(|c| format!("{c} = usage_by_day.{c} + excluded.{c}")).collect::<Vec<_>>();
            out.push((
                format!(
                    "INSERT INTO usage_by_day (author_id, day, program_id, function_size, provider_id, {}) VALUES {} \
                     ON CONFLICT (author_id, day, program_id, function_size) DO UPDATE SET {}",
                    USAGE_SUMS.join(", "),
                    values.join(", "),
                    sums.join(", ")
                ),
                params,
            ));
        }
        out
    }
}

/// The summed columns of `usage_by_day`, in the order a row binds them.
const USAGE_SUMS: [&str; 6] = ["jobs", "wait_ms", "run_ms", "cpu_core_ms", "gib_ms", "gpu_ms"];

fn text(value: &str) -> Param {
    Param::Text(value.to_string())
}

/// Appends to `out` the upserts adding each row's number to its row of `table` (keyed by the
/// columns `key`, whose values each row gives in order), and with `drop_emptied` a delete of
/// those rows that reached zero after each upsert.
fn upserts(
    out: &mut Vec<(String, Vec<Param>)>,
    table: &str,
    key: &str,
    rows: &[(Vec<Param>, i64)],
    drop_emptied: bool,
) {
    for chunk in rows.chunks(ROWS_PER_STATEMENT) {
        let width = chunk[0].0.len();
        let (mut values, mut params) = (Vec::new(), Vec::new());
        let (mut keys, mut key_params) = (Vec::new(), Vec::new());
        for (i, (row, n)) in chunk.iter().enumerate() {
            values.push(format!("({})", placeholders(1 + i * (width + 1), width + 1)));
            keys.push(format!("({})", placeholders(1 + i * width, width)));
            params.extend(row.iter().cloned());
            params.push(Param::Int(*n));
            key_params.extend(row.iter().cloned());
        }
        out.push((
            format!(
                "INSERT INTO {table} ({key}, n) VALUES {} ON CONFLICT ({key}) DO UPDATE SET n = {table}.n + excluded.n",
                values.join(", ")
            ),
            params,
        ));
        if drop_emptied {
            out.push((
                format!("DELETE FROM {table} WHERE n = 0 AND ({key}) IN (VALUES {})", keys.join(", ")),
                key_params,
            ));
        }
    }
}

/// The kept counts' part of a write that is one statement on PostgreSQL (a `run`, a lone
/// move): the common table expressions that add the jobs of the expression `source` (columns
/// `author_id`, `program_id` (`''` for none), `day`, `block`, `gpu`, `provider_id`) to the
/// counts, each in `statuses` (SQL `VALUES` rows of (status, jobs), e.g. `('QUEUED', 1)`), the
/// slots (`slots`: the change in slots in use, SQL; none when a write never changes them) and
/// the queue (`queue`, likewise), the sharded rows in row `shard` (SQL). Each expression reads
/// the one before it, so their rows are locked in the order `Changes::statements` locks them:
/// sub-statements of one statement otherwise run in no promised order, and two orders could
/// deadlock. Starts with a comma: it follows the source's own expression.
pub(crate) fn postgres_ctes(source: &str, statuses: &str, shard: &str, slots: Option<&str>, queue: &str) -> String {
    let mut ctes = format!(
        ", counted AS ( \
           INSERT INTO job_counts (author_id, program_id, status, n) \
           SELECT m.author_id, m.program_id, c.status, c.n FROM {source} m \
           CROSS JOIN (VALUES {statuses}) AS c (status, n) ORDER BY c.status \
           ON CONFLICT (author_id, program_id, status) DO UPDATE SET n = job_counts.n + excluded.n RETURNING n), \
         counted_by_day AS ( \
           INSERT INTO job_counts_by_day (author_id, program_id, status, day, n) \
           SELECT m.author_id, m.program_id, c.status, m.day, c.n FROM {source} m \
           CROSS JOIN (VALUES {statuses}) AS c (status, n) WHERE (SELECT COUNT(*) FROM counted) >= 0 ORDER BY c.status \
           ON CONFLICT (author_id, program_id, status, day) DO UPDATE SET n = job_counts_by_day.n + excluded.n RETURNING n), \
         provided AS ( \
           INSERT INTO job_provider_counts (provider_id, status, shard, n) \
           SELECT m.provider_id, c.status, {shard}, c.n FROM {source} m \
           CROSS JOIN (VALUES {statuses}) AS c (status, n) \
           WHERE m.provider_id IS NOT NULL AND (SELECT COUNT(*) FROM counted_by_day) >= 0 ORDER BY c.status \
           ON CONFLICT (provider_id, status, shard) DO UPDATE SET n = job_provider_counts.n + excluded.n RETURNING n)"
    );
    let mut before = "provided";
    if let Some(slots) = slots {
        ctes.push_str(&format!(
            ", slots AS ( \
               INSERT INTO job_slot_counts (gpu, shard, n) SELECT gpu, {shard}, {slots} FROM {source} \
               WHERE {slots} <> 0 AND (SELECT COUNT(*) FROM provided) >= 0 \
               ON CONFLICT (gpu, shard) DO UPDATE SET n = job_slot_counts.n + excluded.n RETURNING n)"
        ));
        before = "slots";
    }
    ctes.push_str(&format!(
        ", queue AS ( \
           INSERT INTO job_queue_counts (block, shard, n) SELECT block, {shard}, {queue} FROM {source} \
           WHERE {queue} <> 0 AND (SELECT COUNT(*) FROM {before}) >= 0 \
           ON CONFLICT (block, shard) DO UPDATE SET n = job_queue_counts.n + excluded.n RETURNING n)"
    ));
    ctes
}

/// The usage ledger's part of a terminal move that is one statement on PostgreSQL, after
/// `postgres_ctes` (its rows last, as `Changes::statements` locks them): the records of the jobs
/// of `records` (an expression returning `usage::RECORD_COLUMNS`' columns but `business_model`
/// given as read) inserted where the job has none, and those inserted added to their day's
/// totals (`day` the SQL of the microseconds in a day). Starts with a comma.
pub(crate) fn postgres_usage_ctes(records: &str, day: &str) -> String {
    let sums = USAGE_SUMS.iter().map(|c| format!("{c} = usage_by_day.{c} + excluded.{c}")).collect::<Vec<_>>();
    format!(
        ", recorded AS ( \
           INSERT INTO job_usage ({columns}) SELECT * FROM {records} AS r WHERE (SELECT COUNT(*) FROM queue) >= 0 \
           ON CONFLICT (job_id) DO NOTHING \
           RETURNING author_id, ended / {day} AS day, program_id, COALESCE(function_size, '') AS function_size, \
             COALESCE(provider_id, '') AS provider_id, wait_ms, run_ms, cpu_core_ms, gib_ms, gpu_ms), \
         used AS ( \
           INSERT INTO usage_by_day (author_id, day, program_id, function_size, provider_id, {sums_columns}) \
           SELECT author_id, day, program_id, function_size, provider_id, 1, wait_ms, run_ms, cpu_core_ms, gib_ms, gpu_ms \
           FROM recorded \
           ON CONFLICT (author_id, day, program_id, function_size) DO UPDATE SET {sums})",
        columns = super::usage::RECORD_COLUMNS,
        sums_columns = USAGE_SUMS.join(", "),
        sums = sums.join(", ")
    )
}

/// The statements of a recount, in order: each kept table emptied, then filled from `jobs`.
/// Their numbers are those of the migrations that added the tables (days of 86,400,000,000
/// microseconds, hours of `queue::QUEUE_BLOCK_MICROS`).
const RECOUNT: [&str; 14] = [
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
    "DELETE FROM usage_by_day",
    "INSERT INTO usage_by_day (author_id, day, program_id, function_size, provider_id, jobs, wait_ms, run_ms, \
       cpu_core_ms, gib_ms, gpu_ms) \
     SELECT author_id, ended / 86400000000, program_id, COALESCE(function_size, ''), MIN(COALESCE(provider_id, '')), \
       COUNT(*), SUM(wait_ms), SUM(run_ms), SUM(cpu_core_ms), SUM(gib_ms), SUM(gpu_ms) FROM job_usage \
     GROUP BY author_id, ended / 86400000000, program_id, COALESCE(function_size, '')",
    // The months' sums are made again from those day rows (`usage::sum_months`, which a
    // recount's caller runs after it).
    "DELETE FROM usage_by_month",
    "UPDATE usage_months SET through = 0",
];

/// The kept tables' sums: jobs by user, function and status; by day; by provider; the slots in
/// use; the queued jobs by hour.
const TOTALS: &str = "SELECT \
     (SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM job_counts), \
     (SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM job_counts_by_day), \
     (SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM job_provider_counts), \
     (SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM job_slot_counts), \
     (SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM job_queue_counts), \
     (SELECT CAST(COALESCE(SUM(jobs), 0) AS BIGINT) FROM usage_by_day)";

/// The sums of the kept tables, in `TOTALS`' order.
pub type Totals = (i64, i64, i64, i64, i64, i64);

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
            "recounted {} jobs: by user and function {} -> {}, by day {} -> {}, by provider {} -> {}, slots in use {} -> {}, queued {} -> {}, usage records {} -> {}",
            a.0, b.0, a.0, b.1, a.1, b.2, a.2, b.3, a.3, b.4, a.4, b.5, a.5
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
        let mut tx = pool.begin_write().await?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use JobStatus::*;

    fn job<'a>(author_id: &'a str, program_id: &'a str, created: i64) -> Counted<'a> {
        Counted { author_id, program_id, created, gpu: false, provider_id: None }
    }

    #[test]
    fn a_move_takes_a_job_off_one_status_and_onto_the_other_in_every_count() {
        let mut changes = Changes::default();
        let gpu_job = Counted { gpu: true, provider_id: Some("acme"), ..job("alice", "p", 5) };
        changes.moved(&gpu_job, Queued, Pending);
        let statements = changes.statements(3, false);
        let tables: Vec<&str> = statements.iter().map(|(sql, _)| sql.split(' ').nth(2).unwrap()).collect();
        // Every writer's order: by user, by day, by provider, the slots, the queue.
        assert_eq!(
            tables,
            ["job_counts", "job_counts_by_day", "job_provider_counts", "job_slot_counts", "job_queue_counts"]
        );
        let text = |s: &str| Param::Text(s.into());
        // Rows in status order: PENDING before QUEUED.
        assert_eq!(
            statements[0].1,
            [
                text("alice"),
                text("p"),
                text("PENDING"),
                Param::Int(1),
                text("alice"),
                text("p"),
                text("QUEUED"),
                Param::Int(-1)
            ]
        );
        assert_eq!(
            statements[2].1,
            [
                text("acme"),
                text("PENDING"),
                Param::Int(3),
                Param::Int(1),
                text("acme"),
                text("QUEUED"),
                Param::Int(3),
                Param::Int(-1)
            ]
        );
        assert_eq!(statements[3].1, [Param::Bool(true), Param::Int(3), Param::Int(1)]);
        assert_eq!(statements[4].1, [Param::Int(0), Param::Int(3), Param::Int(-1)]);
    }

    #[test]
    fn rows_are_summed_and_those_left_unchanged_are_not_written() {
        let mut changes = Changes::default();
        for created in [0, 1, DAY_MICROS] {
            changes.add(&job("bob", "", created), Succeeded, -1);
        }
        // Finished jobs hold no slot and are not queued; no provider: two tables only.
        let statements = changes.statements(0, false);
        assert_eq!(statements.len(), 2);
        assert_eq!(statements[0].1[3], Param::Int(-3));
        assert_eq!(statements[1].0.matches("($").count(), 2, "one row per creation day: {}", statements[1].0);
        let mut none = Changes::default();
        none.moved(&job("bob", "p", 0), Running, Running);
        assert!(none.statements(0, false).is_empty());
    }

    #[test]
    fn a_deletion_drops_the_rows_by_user_and_by_day_that_reach_zero() {
        let mut changes = Changes::default();
        changes.add(&job("a", "p", 3 * DAY_MICROS), Failed, -2);
        changes.add(&job("b", "p", 4 * DAY_MICROS), Succeeded, -1);
        let statements = changes.statements(0, true);
        assert_eq!(
            statements[2].0,
            "INSERT INTO job_counts_by_day (author_id, program_id, status, day, n) VALUES ($1, $2, $3, $4, $5), \
             ($6, $7, $8, $9, $10) ON CONFLICT (author_id, program_id, status, day) DO UPDATE SET n = job_counts_by_day.n + excluded.n"
        );
        assert_eq!(
            statements[3].0,
            "DELETE FROM job_counts_by_day WHERE n = 0 AND (author_id, program_id, status, day) IN (VALUES ($1, $2, $3, $4), ($5, $6, $7, $8))"
        );
        assert_eq!(statements[3].1.len(), 8);
        assert!(statements[1].0.starts_with("DELETE FROM job_counts WHERE n = 0"));
    }

    #[test]
    fn many_rows_take_several_statements() {
        let mut changes = Changes::default();
        let authors: Vec<String> = (0..ROWS_PER_STATEMENT + 1).map(|i| format!("u{i:05}")).collect();
        for author in &authors {
            changes.add(&job(author, "p", 0), Stopped, -1);
        }
        let statements = changes.statements(0, false);
        assert_eq!(statements.len(), 4);
        assert_eq!(statements[0].1.len(), 4 * ROWS_PER_STATEMENT);
        assert_eq!(statements[1].1.len(), 4);
    }

    #[test]
    fn active_jobs_added_count_queued_pending_and_running_of_that_author() {
        let mut changes = Changes::default();
        changes.add(&job("a", "p", 0), Queued, 1);
        changes.add(&job("a", "q", 0), Queued, 1);
        changes.moved(&job("a", "p", 0), Running, Succeeded);
        changes.add(&job("b", "p", 0), Queued, 1);
        assert_eq!(changes.active_of("a"), 1);
        assert_eq!(changes.active_of("b"), 1);
        assert_eq!(changes.active_of("c"), 0);
    }

    #[test]
    fn each_one_statement_expression_reads_the_one_before() {
        let with_slots = postgres_ctes("moved", "($2, -1)", "$12", Some("$13"), "$14");
        let order = ["counted AS", "counted_by_day AS", "provided AS", "slots AS", "queue AS"];
        let at: Vec<usize> = order.iter().map(|name| with_slots.find(name).unwrap()).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{with_slots}");
        assert!(with_slots.contains("(SELECT COUNT(*) FROM slots)"));
        let without = postgres_ctes("job", "('QUEUED', 1)", "$19", None, "1");
        assert!(
            !without.contains("slots AS")
                && without.contains(
                    "(SELECT COUNT(*) FROM provided) >= 0 \
            ON CONFLICT (block"
                ),
            "{without}"
        );
    }
}
