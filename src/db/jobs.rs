//! Jobs, their events and runtime jobs. Every status move is one transaction that writes the job
//! and its `STATUS_CHANGE` event together, conditioned on the status it moves from; every job
//! event takes the job's next sequence number and, with outbound sinks, its outbox row in the
//! same transaction.

use std::collections::HashSet;

use super::counts::{self, Changes, Counted};
pub(crate) use super::counts::{DAY_MICROS, day_of};
use super::outbox::Outbox;
use super::params::bind_params;
use super::queue::QUEUE_BLOCK_MICROS;
use super::usage::{self, ENDED_COLUMNS, UsageRecord};
use super::{BeginWrite, Db, Error, new_id, now_micros, on_db, query_error};
use crate::domain::event_data::UsageEvent;
use crate::domain::lifecycle::{JobStatus, Move};
use crate::domain::usage::Allocation;

/// A job's columns with the names of its function, provider and author, each looked up by its
/// primary key for each job listed. Not joins: for a page of 1,000 jobs over 100,000 users the
/// planner chose to hash every user and every function (a sequential scan of each, 74 ms at
/// 10 million jobs); a lookup per row costs the same for 10 rows and for 1,000 whatever the
/// tables hold.
macro_rules! job_columns {
    () => {
        "SELECT j.id, j.program_id, (SELECT p.title FROM programs p WHERE p.id = j.program_id) AS program_title, \
         (SELECT pr.name FROM providers pr WHERE pr.id = j.provider_id) AS provider_name, j.provider_id, \
         j.author_id, COALESCE((SELECT u.username FROM users u WHERE u.id = j.author_id), '') AS author_name, \
         j.status, j.sub_status, j.gpu, j.function_size, j.runner, \
         j.created, j.updated, j.last_activity, j.backend_ref, j.stop_requested, j.result, j.status_reason, \
         j.tenant, j.backfill "
    };
}

/// What follows `FROM jobs j` in a job query: nothing since the names are looked up per row
/// (see `job_columns`); kept so the queries read as before.
macro_rules! job_joins {
    () => {
        " "
    };
}

macro_rules! job_select {
    () => {
        concat!(job_columns!(), "FROM jobs j", job_joins!())
    };
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct JobRow {
    pub id: String,
    pub program_id: Option<String>,
    pub program_title: Option<String>,
    pub provider_name: Option<String>,
    pub provider_id: Option<String>,
    pub author_id: String,
    pub author_name: String,
    pub status: String,
    pub sub_status: Option<String>,
    pub gpu: bool,
    pub function_size: Option<String>,
    pub runner: String,
    pub created: i64,
    pub updated: i64,
    pub last_activity: i64,
    pub backend_ref: Option<String>,
    pub stop_requested: bool,
    pub result: Option<String>,
    /// Why it ended, when it ended other than by success (the terminal move's reason).
    pub status_reason: Option<String>,
    /// The tenant it counts against (docs/scheduling.md), and whether it runs as backfill.
    pub tenant: Option<String>,
    pub backfill: bool,
}

impl JobRow {
    pub fn status(&self) -> JobStatus {
        status_of(&self.status)
    }
}

/// A stored status; an unknown one (never written by this code) reads as FAILED.
fn status_of(stored: &str) -> JobStatus {
    stored.parse().unwrap_or(JobStatus::Failed)
}

/// Inserts a job event with its per-job sequence number `$seq` inside the transaction `$tx`
/// (either backend). The caller has just taken the number from `jobs.event_seq`.
macro_rules! insert_event {
    ($tx:ident, $job_id:expr, $seq:expr, $created:expr, $event_type:expr, $origin:expr, $context:expr, $data:expr) => {
        sqlx::query(
            "INSERT INTO job_events (id, job_id, seq, created, event_type, origin, context, data) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(crate::db::new_id())
        .bind($job_id)
        .bind($seq)
        .bind($created)
        .bind($event_type)
        .bind($origin)
        .bind($context)
        .bind($data)
        .execute(&mut *$tx)
        .await?
    };
}

/// Records job event `$seq` in the outbox inside the transaction `$tx`, with CloudEvents type
/// `$event_type` and the `data` that `$data` builds from the job's names and state
/// (`$names: OutboxNames`), and marks the job as one whose events are published (see
/// `insert_finished_event`).
macro_rules! insert_outbox {
    ($tx:ident, $job_id:expr, $seq:expr, $created:expr, $event_type:expr, |$names:ident| $data:expr) => {{
        let $names: OutboxNames = sqlx::query_as(
            "SELECT u.username AS author_name, p.title AS program_title, pr.name AS provider_name, j.status, j.sub_status \
             FROM jobs j JOIN users u ON u.id = j.author_id \
             LEFT JOIN programs p ON p.id = j.program_id LEFT JOIN providers pr ON pr.id = j.provider_id \
             WHERE j.id = $1",
        )
        .bind($job_id)
        .fetch_one(&mut *$tx)
        .await?;
        let data = serde_json::to_string(&$data).unwrap_or_default();
        sqlx::query(
            "INSERT INTO event_outbox (id, job_id, seq, created, event_type, data) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(crate::db::new_id())
        .bind($job_id)
        .bind($seq)
        .bind($created)
        .bind($event_type)
        .bind(data)
        .execute(&mut *$tx)
        .await?;
        sqlx::query("UPDATE jobs SET outbox = TRUE WHERE id = $1 AND NOT outbox").bind($job_id).execute(&mut *$tx).await?
    }};
}

/// Records a status move in the outbox inside the transaction `$tx` (see `events::MoveData`).
macro_rules! insert_move_outbox {
    ($tx:ident, $job_id:expr, $seq:expr, $created:expr, $from:expr, $to:expr, $origin:expr, $context:expr) => {
        insert_outbox!($tx, $job_id, $seq, $created, crate::domain::event_data::STATUS_EVENT_TYPE, |names| {
            crate::domain::event_data::MoveData {
                job_id: $job_id.to_string(),
                function: names.program_title,
                provider: names.provider_name,
                user: names.author_name,
                old_status: $from.map(str::to_string),
                new_status: $to.to_string(),
                sub_status: names.sub_status,
                origin: $origin.to_string(),
                context: $context.to_string(),
                time: crate::db::format_timestamp($created),
            }
        })
    };
}

/// Records a job event other than a status move in the outbox inside the transaction `$tx`: job
/// event type `$event_type`, its stored `data` text `$data` (see `events::EventData`).
macro_rules! insert_event_outbox {
    ($tx:ident, $job_id:expr, $seq:expr, $created:expr, $event_type:expr, $origin:expr, $context:expr, $data:expr) => {
        insert_outbox!(
            $tx,
            $job_id,
            $seq,
            $created,
            crate::domain::event_data::cloud_event_type($event_type),
            |names| {
                crate::domain::event_data::EventData {
                    job_id: $job_id.to_string(),
                    function: names.program_title,
                    provider: names.provider_name,
                    user: names.author_name,
                    status: names.status,
                    sub_status: names.sub_status,
                    origin: $origin.to_string(),
                    context: $context.to_string(),
                    time: crate::db::format_timestamp($created),
                    fields: Default::default(),
                }
                .with_fields($data)
            }
        )
    };
}

/// Records usage events `$kinds` (`&[UsageEvent]`) of the job whose record up to now (or final
/// one) is `$record` in the outbox inside the transaction `$tx`, numbered after the job's
/// earlier usage events. With `$only_running`, only while the job is still RUNNING (an "in
/// progress" event never follows its end). Evaluates to whether they were recorded.
macro_rules! insert_usage_outbox {
    ($tx:ident, $record:expr, $running_since:expr, $kinds:expr, $now:expr, $only_running:expr) => {{
        let record: &UsageRecord = $record;
        let kinds: &[UsageEvent] = $kinds;
        let numbered: Option<i64> = sqlx::query_scalar(
            "UPDATE jobs SET usage_seq = usage_seq + $2, usage_reported = $3 \
             WHERE id = $1 AND (NOT $4 OR status = 'RUNNING') RETURNING usage_seq",
        )
        .bind(&record.job_id)
        .bind(kinds.len() as i64)
        .bind($now)
        .bind($only_running)
        .fetch_optional(&mut *$tx)
        .await?;
        if let Some(last) = numbered {
            let names: usage::EventNames =
                sqlx::query_as(usage::EVENT_NAMES).bind(&record.job_id).fetch_one(&mut *$tx).await?;
            let first = last - kinds.len() as i64 + 1;
            for (seq, kind) in (first..).zip(kinds.iter().copied()) {
                let data = usage::event_data(kind, record, &names, $running_since, $now);
                sqlx::query(
                    "INSERT INTO event_outbox (id, job_id, seq, created, event_type, data, stream) \
                     VALUES ($1, $2, $3, $4, $5, $6, 'usage')",
                )
                .bind(crate::db::new_id())
                .bind(&record.job_id)
                .bind(seq)
                .bind($now)
                .bind(kind.cloud_type())
                .bind(serde_json::to_string(&data).unwrap_or_default())
                .execute(&mut *$tx)
                .await?;
            }
        }
        numbered.is_some()
    }};
}

/// What a published event says of its job.
#[derive(sqlx::FromRow)]
struct OutboxNames {
    author_name: String,
    program_title: Option<String>,
    provider_name: Option<String>,
    status: String,
    sub_status: Option<String>,
}

/// What the controller reads of a job on every reconcile: its state, without its arguments,
/// result or names.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct JobState {
    pub status: String,
    pub sub_status: Option<String>,
    pub stop_requested: bool,
    /// A provider's function (its log is split in two).
    pub provider_function: bool,
    /// Times the job was started again after the cluster ended its pod.
    pub infrastructure_retries: i64,
    /// Why the job ended, once it has (the terminal move's reason).
    pub status_reason: Option<String>,
    /// The tenant that reclaimed its slot, when its stop request is a reclaim of backfill.
    pub preempted_by: Option<String>,
    /// Its function allows retries after start (then a reclaim queues it again).
    pub retry_after_start: bool,
    /// Times it was queued again after a reclaim.
    pub requeues: i64,
}

impl JobState {
    /// What ends (or queues again) the job now that its stop request was carried out: the
    /// user's stop, or a tenant reclaiming its guarantee (`lifecycle::stop_trigger`).
    pub fn stop_trigger(&self) -> crate::domain::lifecycle::Trigger {
        crate::domain::lifecycle::stop_trigger(self.preempted_by.as_deref(), self.retry_after_start, self.requeues)
    }
    pub fn status(&self) -> JobStatus {
        status_of(&self.status)
    }
}

pub async fn state(db: &Db, id: &str) -> Result<Option<JobState>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, JobState>(
        "SELECT status, sub_status, stop_requested, provider_id IS NOT NULL AS provider_function, \
         infrastructure_retries, status_reason, preempted_by, requeues, \
         COALESCE((SELECT p.retry_after_start FROM programs p WHERE p.id = jobs.program_id), FALSE) AS retry_after_start \
         FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await)
    .map_err(query_error("find job"))
}

pub async fn find(db: &Db, id: &str) -> Result<Option<JobRow>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, JobRow>(concat!(job_select!(), "WHERE j.id = $1"))
        .bind(id)
        .fetch_optional(pool)
        .await)
    .map_err(query_error("find job"))
}

/// Moves jobs to `$1` (at `$3`, terminal when `$4`) with their next event number: terminal
/// moves clear the sub-status and the stored environment and keep the move's reason (the
/// parameter named by the macro's argument); the first move into RUNNING keeps its time (what
/// the usage ledger meters the run from). A move back to QUEUED (a preempted backfill job queued
/// again) clears its stop request and keeps its run time so far (`carried_run_us`, migration
/// 0028; `running_since` counts from the first run, moved up by the earlier runs): its next move
/// into RUNNING, or its ending while queued, starts the clock that much earlier, so its current
/// run started at `running_since + carried_run_us`. The caller adds which jobs.
macro_rules! move_job {
    ($reason:literal) => {
        concat!(
            "UPDATE jobs SET status = $1, updated = $3, last_activity = $3, event_seq = event_seq + 1, \
             status_reason = CASE WHEN $4 THEN ",
            $reason,
            " ELSE NULL END, \
             sub_status = CASE WHEN $4 THEN NULL ELSE sub_status END, \
             env_vars = CASE WHEN $4 THEN '{}' ELSE env_vars END, \
             running_since = CASE WHEN $1 = 'QUEUED' THEN NULL \
               WHEN $1 = 'RUNNING' OR ($4 AND carried_run_us <> 0) THEN COALESCE(running_since, $3 - carried_run_us) \
               ELSE running_since END, \
             carried_run_us = CASE WHEN $1 = 'QUEUED' THEN COALESCE($3 - running_since, carried_run_us) ELSE carried_run_us END, \
             requeues = requeues + CASE WHEN $1 = 'QUEUED' THEN 1 ELSE 0 END, \
             stop_requested = CASE WHEN $1 = 'QUEUED' THEN FALSE ELSE stop_requested END, \
             preempted_by = CASE WHEN $1 = 'QUEUED' THEN NULL ELSE preempted_by END"
        )
    };
}

/// A job as a move returns it.
#[derive(sqlx::FromRow)]
struct MovedRow {
    #[sqlx(flatten)]
    job: usage::Ended,
    event_seq: i64,
    gpu: bool,
}

/// A move written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    /// When the job was created (its row's, returned by the move: no read after it).
    pub created: i64,
    /// Since when the job has run, after the move (µs; a retried or requeued job's earlier
    /// attempts' run time carried in, as its usage record counts it): none if it never ran.
    pub running_since: Option<i64>,
}

/// Applies a move decided by the state machine, if the job is still in `mv.from`. Returns
/// what was moved, if it was. Terminal moves clear `sub_status` and the stored environment
/// (which holds the caller's token). With `outbox`, the move (and, with usage, the job's usage
/// events) is also recorded for the outbound sinks.
pub async fn apply_move(db: &Db, job_id: &str, mv: &Move, outbox: impl Into<Outbox>) -> Result<Option<Moved>, Error> {
    let (db, job_ids, mv, outbox) = (db.clone(), vec![job_id.to_string()], mv.clone(), outbox.into());
    let moved = super::detached(async move { apply_moves_attached(&db, &job_ids, &mv, outbox).await }).await?;
    Ok(moved.into_iter().next().map(|(_, moved)| moved))
}

/// Applies the same move to several jobs in one transaction (an admission pass): each job
/// still in `mv.from` moves with its own event; the status counters are updated once per
/// function. Returns the ids that moved, in the given order.
pub async fn apply_moves(
    db: &Db,
    job_ids: &[String],
    mv: &Move,
    outbox: impl Into<Outbox>,
) -> Result<Vec<String>, Error> {
    let (db, job_ids, mv, outbox) = (db.clone(), job_ids.to_vec(), mv.clone(), outbox.into());
    let moved = super::detached(async move { apply_moves_attached(&db, &job_ids, &mv, outbox).await }).await?;
    Ok(moved.into_iter().map(|(id, _)| id).collect())
}

/// The moves of `apply_moves`: each job moved with what the move returned, in the given order.
async fn apply_moves_attached(
    db: &Db,
    job_ids: &[String],
    mv: &Move,
    outbox: Outbox,
) -> Result<Vec<(String, Moved)>, Error> {
    if job_ids.is_empty() {
        return Ok(Vec::new());
    }
    if let (Db::Postgres(pool), [job_id], false) = (db, job_ids, outbox.jobs()) {
        return apply_move_postgres(pool, job_id, mv).await.map_err(query_error("move job status"));
    }
    let now = now_micros();
    let terminal = mv.to.is_terminal();
    let data = mv.data.to_string();
    // One statement moves them all (`$5` is the reason, `$6...` the ids), one more records
    // their events.
    let ids = (0..job_ids.len()).map(|i| format!("${}", i + 6)).collect::<Vec<_>>().join(", ");
    let update =
        format!("{} WHERE status = $2 AND id IN ({ids}) RETURNING {ENDED_COLUMNS}, event_seq, gpu", move_job!("$5"));
    let _writer = db.write_lock().await;
    on_db!(db, pool => async {
        let mut tx = pool.begin_write().await?;
        let mut query = sqlx::query_as::<_, MovedRow>(&update)
            .bind(mv.to.as_str())
            .bind(mv.from.as_str())
            .bind(now)
            .bind(terminal)
            .bind(mv.reason());
        for job_id in job_ids {
            query = query.bind(job_id);
        }
        let updated = query.fetch_all(&mut *tx).await?;
        let mut changes = Changes::default();
        let mut seqs = std::collections::HashMap::new();
        for MovedRow { job, event_seq, gpu } in &updated {
            let counted = Counted {
                author_id: &job.author_id,
                program_id: &job.program_id,
                created: job.created,
                gpu: *gpu,
                provider_id: job.provider_id.as_deref(),
            };
            changes.moved(&counted, mv.from, mv.to);
            seqs.insert(job.id.clone(), (*event_seq, job.created, job.running_since));
        }
        let moved: Vec<(String, Moved)> = job_ids
            .iter()
            .filter_map(|id| {
                let (_, created, running_since) = seqs.get(id)?;
                Some((id.clone(), Moved { created: *created, running_since: *running_since }))
            })
            .collect();
        if !moved.is_empty() {
            let rows = (0..moved.len())
                .map(|i| format!("(${}, ${}, ${}, $1, 'STATUS_CHANGE', $2, $3, $4)", 5 + 3 * i, 6 + 3 * i, 7 + 3 * i))
                .collect::<Vec<_>>()
                .join(", ");
            let insert = format!(
                "INSERT INTO job_events (id, job_id, seq, created, event_type, origin, context, data) VALUES {rows}"
            );
            let mut query = sqlx::query(&insert).bind(now).bind(mv.origin.as_str()).bind(mv.context).bind(&data);
            for (job_id, _) in &moved {
                query = query.bind(new_id()).bind(job_id).bind(seqs[job_id].0);
            }
            query.execute(&mut *tx).await?;
        }
        if outbox.jobs() {
            for (job_id, _) in &moved {
                insert_move_outbox!(tx, job_id, seqs[job_id].0, now, Some(mv.from.as_str()), mv.to.as_str(), mv.origin.as_str(), mv.context);
            }
        }
        if moved.is_empty() {
            tx.rollback().await?;
            return Ok(moved);
        }
        if outbox.usage() && mv.to == JobStatus::Running {
            // A job's first move into RUNNING starts its usage: `started`, and a licence for a
            // provider's function.
            for MovedRow { job, .. } in updated.iter().filter(|row| row.job.running_since == Some(now)) {
                let kinds: &[UsageEvent] = if job.provider_id.is_some() {
                    &[UsageEvent::Started, UsageEvent::Licence]
                } else {
                    &[UsageEvent::Started]
                };
                let _ = insert_usage_outbox!(tx, &job.record(mv.to.as_str(), now), job.running_since, kinds, now, false);
            }
        }
        if terminal {
            // One usage record a job (a job that has one keeps it, and it is counted once); with
            // outbound sinks it leaves as the job's `completed` usage event.
            let records: Vec<UsageRecord> = updated.iter().map(|row| row.job.record(mv.to.as_str(), now)).collect();
            let mut written = HashSet::new();
            for (sql, params) in usage::insert_statements(&records) {
                let ids: Vec<String> = bind_params!(sqlx::query_scalar::<_, String>(&sql), &params).fetch_all(&mut *tx).await?;
                written.extend(ids);
            }
            for (record, MovedRow { job, .. }) in records.iter().zip(&updated).filter(|(record, _)| written.contains(&record.job_id)) {
                changes.used(record);
                if outbox.usage() {
                    let _ = insert_usage_outbox!(tx, record, job.running_since, &[UsageEvent::Completed], now, false);
                }
            }
        }
        // The kept counts come last, so their busiest rows are held the shortest.
        for (sql, params) in changes.statements(counts::shard(), false) {
            bind_params!(sqlx::query(&sql), &params).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(moved)
    }.await)
    .map_err(query_error("move job status"))
}

/// One job's move on PostgreSQL without outbound sinks: the move, its event, its kept counts
/// (`counts::postgres_ctes`, their rows locked as every other writer locks them) and, for a
/// terminal move, its usage record and its day's totals (`counts::postgres_usage_ctes`, the
/// record made in SQL as `usage::Ended::record` makes it) in one statement, one round trip.
async fn apply_move_postgres(
    pool: &sqlx::PgPool,
    job_id: &str,
    mv: &Move,
) -> Result<Vec<(String, Moved)>, sqlx::Error> {
    static STATEMENT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "WITH moved AS ({} WHERE status = $2 AND id = $5 \
               RETURNING {ENDED_COLUMNS}, created / $10 AS day, created / $15 AS block, event_seq, gpu), \
             event AS ( \
               INSERT INTO job_events (id, job_id, seq, created, event_type, origin, context, data) \
               SELECT $6, id, event_seq, $3, 'STATUS_CHANGE', $7, $8, $9 FROM moved){}{} \
             SELECT created, running_since FROM moved",
            move_job!("$11"),
            counts::postgres_ctes(
                "moved",
                "($2, CAST(-1 AS BIGINT)), ($1, CAST(1 AS BIGINT))",
                "$12",
                Some("$13"),
                "$14"
            ),
            counts::postgres_usage_ctes(usage::POSTGRES_RECORDS, "$10")
        )
    });
    let moved: Option<(i64, Option<i64>)> = sqlx::query_as(STATEMENT.as_str())
        .bind(mv.to.as_str())
        .bind(mv.from.as_str())
        .bind(now_micros())
        .bind(mv.to.is_terminal())
        .bind(job_id)
        .bind(new_id())
        .bind(mv.origin.as_str())
        .bind(mv.context)
        .bind(mv.data.to_string())
        .bind(DAY_MICROS)
        .bind(mv.reason())
        .bind(counts::shard())
        .bind(mv.slot_change())
        .bind(mv.queue_change())
        .bind(QUEUE_BLOCK_MICROS)
        .fetch_optional(pool)
        .await?;
    Ok(moved
        .map(|(created, running_since)| vec![(job_id.to_string(), Moved { created, running_since })])
        .unwrap_or_default())
}

/// Outcome of a sub-status update.
#[derive(Debug, PartialEq, Eq)]
pub enum SubStatusOutcome {
    Updated,
    Unchanged,
    NotActive(String),
    Missing,
}

/// Sets the sub-status of an active job, with a `SUB_STATUS_CHANGE` event when it changes. With
/// `outbox`, the event is also recorded for the outbound sinks.
pub async fn set_sub_status(db: &Db, job_id: &str, value: &str, outbox: bool) -> Result<SubStatusOutcome, Error> {
    let (db, job_id, value) = (db.clone(), job_id.to_string(), value.to_string());
    super::detached(async move { set_sub_status_attached(&db, &job_id, &value, outbox).await }).await
}

async fn set_sub_status_attached(db: &Db, job_id: &str, value: &str, outbox: bool) -> Result<SubStatusOutcome, Error> {
    let now = now_micros();
    let _writer = db.write_lock().await;
    on_db!(db, pool => async {
        let mut tx = pool.begin_write().await?;
        let changed: Option<i64> = sqlx::query_scalar(
            "UPDATE jobs SET sub_status = $2, updated = $3, last_activity = $3, event_seq = event_seq + 1 \
             WHERE id = $1 AND status IN ('QUEUED', 'PENDING', 'RUNNING') AND (sub_status IS NULL OR sub_status <> $2) \
             RETURNING event_seq")
            .bind(job_id)
            .bind(value)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(seq) = changed else {
            tx.rollback().await?;
            let status: Option<String> = sqlx::query_scalar("SELECT status FROM jobs WHERE id = $1")
                .bind(job_id)
                .fetch_optional(pool)
                .await?;
            return Ok(match status {
                None => SubStatusOutcome::Missing,
                Some(status) if ["QUEUED", "PENDING", "RUNNING"].contains(&status.as_str()) => SubStatusOutcome::Unchanged,
                Some(status) => SubStatusOutcome::NotActive(status),
            });
        };
        let data = serde_json::json!({ "sub_status": value }).to_string();
        insert_event!(tx, job_id, seq, now, "SUB_STATUS_CHANGE", "API", "SET_SUB_STATUS", &data);
        if outbox {
            insert_event_outbox!(tx, job_id, seq, now, "SUB_STATUS_CHANGE", "API", "SET_SUB_STATUS", &data);
        }
        tx.commit().await?;
        Ok(SubStatusOutcome::Updated)
    }.await)
    .map_err(query_error("set job sub-status"))
}

/// Records an `ERROR` event of an active job (which also extends its timeout). False when the
/// job is not active. With `outbox`, the event is also recorded for the outbound sinks.
pub async fn insert_error_event(db: &Db, job_id: &str, data: &serde_json::Value, outbox: bool) -> Result<bool, Error> {
    let (db, job_id, data) = (db.clone(), job_id.to_string(), data.to_string());
    super::detached(async move { insert_error_event_attached(&db, &job_id, &data, outbox).await }).await
}

async fn insert_error_event_attached(db: &Db, job_id: &str, data: &str, outbox: bool) -> Result<bool, Error> {
    let now = now_micros();
    let _writer = db.write_lock().await;
    on_db!(db, pool => async {
        let mut tx = pool.begin_write().await?;
        let active: Option<i64> = sqlx::query_scalar(
            "UPDATE jobs SET last_activity = $2, event_seq = event_seq + 1 \
             WHERE id = $1 AND status IN ('QUEUED', 'PENDING', 'RUNNING') RETURNING event_seq")
            .bind(job_id)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(seq) = active else {
            tx.rollback().await?;
            return Ok(false);
        };
        insert_event!(tx, job_id, seq, now, "ERROR", "API", "SEND_ERROR", data);
        if outbox {
            insert_event_outbox!(tx, job_id, seq, now, "ERROR", "API", "SEND_ERROR", data);
        }
        tx.commit().await?;
        Ok(true)
    }.await)
    .map_err(query_error("record job event"))
}

/// Records an event about a job whatever its status (for example `LOG_LOST` on a finished job),
/// from the scheduler. False when the job does not exist. The event is recorded in the outbox
/// when the job's earlier events were (`jobs.outbox`), so the published sequence has no gap.
pub async fn insert_finished_event(
    db: &Db,
    job_id: &str,
    event_type: &str,
    context: &str,
    data: &serde_json::Value,
) -> Result<bool, Error> {
    let (db, job_id, event_type, context, data) =
        (db.clone(), job_id.to_string(), event_type.to_string(), context.to_string(), data.to_string());
    super::detached(async move {
        let now = now_micros();
        let _writer = db.write_lock().await;
        on_db!(db, pool => async {
            let mut tx = pool.begin_write().await?;
            let numbered: Option<(i64, bool)> =
                sqlx::query_as("UPDATE jobs SET event_seq = event_seq + 1 WHERE id = $1 RETURNING event_seq, outbox")
                    .bind(&job_id)
                    .fetch_optional(&mut *tx)
                    .await?;
            let Some((seq, outbox)) = numbered else {
                tx.rollback().await?;
                return Ok(false);
            };
            insert_event!(tx, &job_id, seq, now, &event_type, "SCHEDULER", &context, &data);
            if outbox {
                insert_event_outbox!(tx, &job_id, seq, now, &event_type, "SCHEDULER", &context, &data);
            }
            tx.commit().await?;
            Ok(true)
        }.await)
        .map_err(query_error("record job event"))
    })
    .await
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EventRow {
    pub id: String,
    pub seq: i64,
    pub created: i64,
    pub event_type: String,
    pub origin: String,
    pub context: String,
    pub data: String,
}

/// Events of a job, newest first, optionally of one type. The order is the per-job sequence
/// (the order they were recorded in): a writer takes its timestamp before it waits for the job
/// row, so two racing writers' timestamps may come out the other way round.
pub async fn list_events(db: &Db, job_id: &str, event_type: Option<&str>) -> Result<Vec<EventRow>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, EventRow>(
        "SELECT id, seq, created, event_type, origin, context, data FROM job_events \
         WHERE job_id = $1 AND ($2 IS NULL OR event_type = $2) ORDER BY seq DESC")
        .bind(job_id)
        .bind(event_type)
        .fetch_all(pool)
        .await)
    .map_err(query_error("list job events"))
}

/// Events of a job after sequence number `after`, oldest first (at most `limit`).
pub async fn events_after(db: &Db, job_id: &str, after: i64, limit: i64) -> Result<Vec<EventRow>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, EventRow>(
        "SELECT id, seq, created, event_type, origin, context, data FROM job_events \
         WHERE job_id = $1 AND seq > $2 ORDER BY seq, created, id LIMIT $3")
        .bind(job_id)
        .bind(after)
        .bind(limit)
        .fetch_all(pool)
        .await)
    .map_err(query_error("list job events"))
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RuntimeJobRow {
    pub runtime_job: String,
    pub runtime_session: Option<String>,
}

pub async fn list_runtime_jobs(db: &Db, job_id: &str) -> Result<Vec<RuntimeJobRow>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, RuntimeJobRow>(
        "SELECT runtime_job, runtime_session FROM runtime_jobs WHERE job_id = $1 ORDER BY created, runtime_job")
        .bind(job_id)
        .fetch_all(pool)
        .await)
    .map_err(query_error("list runtime jobs"))
}

pub async fn insert_runtime_job(db: &Db, job_id: &str, runtime_job: &str, session: Option<&str>) -> Result<(), Error> {
    on_db!(db, pool => sqlx::query("INSERT INTO runtime_jobs (runtime_job, job_id, runtime_session, created) VALUES ($1, $2, $3, $4)")
        .bind(runtime_job)
        .bind(job_id)
        .bind(session)
        .bind(now_micros())
        .execute(pool)
        .await
        .map(|r| r.rows_affected()))
    .map_err(query_error("record runtime job"))?;
    Ok(())
}

/// Ids of programs with that title (and provider, when given), for the `function` filter.
pub async fn program_ids_by_title(db: &Db, title: &str, provider_id: Option<&str>) -> Result<Vec<String>, Error> {
    on_db!(db, pool => sqlx::query_scalar::<_, String>(
        "SELECT id FROM programs WHERE title = $1 AND ($2 IS NULL OR provider_id = $2)")
        .bind(title)
        .bind(provider_id)
        .fetch_all(pool)
        .await)
    .map_err(query_error("find programs by title"))
}

/// Ids of the jobs not yet finished that were created before `created_before` (microseconds;
/// for the Kubernetes drift sweep).
pub async fn active_ids(db: &Db, created_before: i64) -> Result<Vec<String>, Error> {
    on_db!(db, pool => sqlx::query_scalar::<_, String>(
        "SELECT id FROM jobs WHERE status IN ('QUEUED', 'PENDING', 'RUNNING') AND created < $1")
        .bind(created_before)
        .fetch_all(pool)
        .await)
    .map_err(query_error("list active jobs"))
}

/// Which of `among` (job ids) are waiting in the queue with no stop requested, for the
/// controller's resync, which leaves those FunctionJobs alone. The queued ids are streamed and
/// only those of `among` kept: what this holds is bounded by `among`, however long the queue.
pub async fn still_queued<'a>(db: &Db, among: &HashSet<&'a str>) -> Result<HashSet<&'a str>, Error> {
    use futures::TryStreamExt as _;
    const QUEUED: &str = "SELECT id FROM jobs WHERE status = 'QUEUED' AND NOT stop_requested";
    let mut found = HashSet::new();
    on_db!(db, pool => {
        let mut ids = sqlx::query_scalar::<_, String>(QUEUED).fetch(pool);
        while let Some(id) = ids.try_next().await.map_err(query_error("list queued jobs"))? {
            if let Some(held) = among.get(id.as_str()) {
                found.insert(*held);
            }
        }
    });
    Ok(found)
}

/// Which of `ids` name a job row, asked in batches (the drift sweep's question about its
/// resources).
pub async fn existing_ids(db: &Db, ids: &[String]) -> Result<HashSet<String>, Error> {
    let mut found = HashSet::new();
    for batch in ids.chunks(500) {
        let rows: Vec<String> = on_db!(db, pool => {
            let mut query = sqlx::QueryBuilder::new("SELECT id FROM jobs WHERE id IN (");
            let mut separated = query.separated(", ");
            for id in batch {
                separated.push_bind(id);
            }
            separated.push_unseparated(")");
            query.build_query_scalar::<String>().fetch_all(pool).await
        })
        .map_err(query_error("find jobs by id"))?;
        found.extend(rows);
    }
    Ok(found)
}

/// The arguments a job was run with (None: no such job).
pub async fn arguments(db: &Db, job_id: &str) -> Result<Option<String>, Error> {
    on_db!(db, pool => sqlx::query_scalar::<_, String>("SELECT arguments FROM jobs WHERE id = $1")
        .bind(job_id)
        .fetch_optional(pool)
        .await)
    .map_err(query_error("read the job's arguments"))
}

/// What the runner needs to start a job.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LaunchRow {
    pub arguments: String,
    pub env_vars: String,
    pub artifact_key: Option<String>,
    pub entrypoint: Option<String>,
    pub image: Option<String>,
    pub function_env_vars: Option<String>,
    pub function_version: Option<String>,
    /// The function's size catalog (JSON object label → compute profile).
    pub function_sizes: Option<String>,
    /// The job runs as a trial (`ENV_ACCESS_TRIAL`).
    pub trial: bool,
    /// The function opted in to be started again after its code started (see `programs`).
    pub retry_after_start: Option<bool>,
    /// The job's trace (`telemetry::context`), when its `run` request had one.
    pub traceparent: Option<String>,
}

/// A job with what a runner needs to start it: read once where its start begins.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Launch {
    #[sqlx(flatten)]
    pub job: JobRow,
    #[sqlx(flatten)]
    pub info: LaunchRow,
}

/// The job `job_id` and what starting it takes, in one read.
pub async fn launch(db: &Db, job_id: &str) -> Result<Option<Launch>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, Launch>(concat!(
        job_columns!(),
        ", j.arguments, j.env_vars, p.artifact_key, p.entrypoint, p.image, p.env_vars AS function_env_vars, \
         p.version AS function_version, p.sizes AS function_sizes, j.trial, p.retry_after_start, \
         j.traceparent FROM jobs j LEFT JOIN programs p ON p.id = j.program_id WHERE j.id = $1"))
        .bind(job_id)
        .fetch_optional(pool)
        .await)
    .map_err(query_error("load job launch data"))
}

pub async fn set_backend_ref(db: &Db, job_id: &str, backend_ref: Option<&str>) -> Result<(), Error> {
    on_db!(db, pool => sqlx::query("UPDATE jobs SET backend_ref = $2 WHERE id = $1")
        .bind(job_id)
        .bind(backend_ref)
        .execute(pool)
        .await
        .map(|r| r.rows_affected()))
    .map_err(query_error("record job backend"))?;
    Ok(())
}

/// Records what the job's runner gives it (the usage ledger meters its run with it), while it
/// is active.
pub async fn record_allocation(db: &Db, job_id: &str, allocation: &Allocation) -> Result<(), Error> {
    on_db!(db, pool => sqlx::query(
        "UPDATE jobs SET compute_profile = $2, allocated_cpu_millis = $3, allocated_memory_mib = $4, \
         allocated_gpus = $5, allocated_gpu_model = $6 WHERE id = $1 AND status IN ('QUEUED', 'PENDING', 'RUNNING')")
        .bind(job_id)
        .bind(&allocation.compute_profile)
        .bind(allocation.cpu_millis)
        .bind(allocation.memory_mib)
        .bind(allocation.gpus)
        .bind(&allocation.gpu_model)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))
    .map_err(query_error("record a job's allocation"))?;
    Ok(())
}

/// Marks a stop request on an active job (a user's: it ends STOPPED by the user even when a tenant
/// had reclaimed its slot, and is not queued again); false when the job is not active (or missing).
pub async fn mark_stop_requested(db: &Db, job_id: &str) -> Result<bool, Error> {
    let marked = on_db!(db, pool => sqlx::query(
        "UPDATE jobs SET stop_requested = TRUE, preempted_by = NULL WHERE id = $1 AND status IN ('QUEUED', 'PENDING', 'RUNNING')")
        .bind(job_id)
        .execute(pool)
        .await
        .map(|r| r.rows_affected()))
    .map_err(query_error("record stop request"))?;
    Ok(marked > 0)
}

/// The database copy of a job's logs (empty when none was kept).
pub async fn stored_logs(db: &Db, job_id: &str) -> Result<Option<String>, Error> {
    on_db!(db, pool => sqlx::query_scalar::<_, String>("SELECT logs FROM jobs WHERE id = $1")
        .bind(job_id)
        .fetch_optional(pool)
        .await)
    .map_err(query_error("read job logs"))
}

// The listings' filters and query, below the macros they use.
mod create;
mod in_flight;
mod listing;
mod of_function;
mod retries;
mod usage_events;
pub use create::{NewJob, insert_with_limit, traceparent};
pub use in_flight::{
    any_in_flight, backfill_in_flight, count_by_status, in_flight, in_flight_load, mark_preempted, preempted_by, queued,
};
pub use listing::{AdminOf, JobFilter, Window, list, page_if_admin};
pub use of_function::of_function;
pub use retries::record_retry;
pub use usage_events::{record_measured, record_progress};
