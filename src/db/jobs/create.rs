//! Creating a job: the `run` transaction, the active-job limit checked in it.

use super::{OutboxNames, day_of};
use crate::db::BeginWrite;
use crate::db::counts::{self, Changes, Counted};
use crate::db::group_commit::Batched;
use crate::db::queue::block_of;
use crate::db::{Db, Error, new_id, now_micros, query_error};
use crate::domain::lifecycle::JobStatus;

/// A job to create.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub id: String,
    pub program_id: String,
    pub provider_id: Option<String>,
    pub author_id: String,
    pub arguments: String,
    pub config: String,
    pub env_vars: String,
    pub runner: String,
    pub gpu: bool,
    pub function_size: Option<String>,
    /// The run is a trial (`visibility::is_trial`).
    pub trial: bool,
    /// TRIAL, SUBSIDIZED or CONSUMPTION (`visibility::business_model`).
    pub business_model: String,
    /// The `run` request's trace (`telemetry::context`).
    pub traceparent: Option<String>,
    /// The instance the job runs for (its run's `Service-CRN`), kept for its usage record.
    pub instance: Option<String>,
    /// It runs as backfill (its function's mark or its run's `config.backfill`).
    pub backfill: bool,
    /// The GPU model a GPU job asks for (its size's profile; `None`: any, or a CPU job).
    pub gpu_model: Option<String>,
}

/// The first event's data.
const QUEUED_EVENT: &str = r#"{"status":"QUEUED"}"#;

/// The job's row, written only while its author has fewer than `$13` active jobs, with the
/// tenant it counts against (`tenants::tenant_of!`); with `bind_new_job!` binding `$1`…`$18`.
/// Both backends' `run` use it.
macro_rules! insert_job {
    () => {
        concat!(
            "INSERT INTO jobs (id, program_id, provider_id, author_id, status, arguments, config, env_vars, runner, gpu, \
             function_size, trial, created, updated, last_activity, event_seq, traceparent, instance, business_model, \
             backfill, gpu_model, tenant) \
             SELECT $1, $2, $3, $4, 'QUEUED', $5, $6, $7, $8, $9, $10, $12, $11, $11, $11, 1, $14, $15, $16, $17, $18, ",
            crate::db::tenants::tenant_of!("$15", "$3", "$4"),
            " WHERE (SELECT COALESCE(SUM(n), 0) FROM job_counts \
                WHERE author_id = $4 AND status IN ('QUEUED', 'PENDING', 'RUNNING')) < $13"
        )
    };
}

macro_rules! bind_new_job {
    ($query:expr, $job:expr, $now:expr, $limit:expr) => {
        $query
            .bind(&$job.id)
            .bind(&$job.program_id)
            .bind(&$job.provider_id)
            .bind(&$job.author_id)
            .bind(&$job.arguments)
            .bind(&$job.config)
            .bind(&$job.env_vars)
            .bind(&$job.runner)
            .bind($job.gpu)
            .bind(&$job.function_size)
            .bind($now)
            .bind($job.trial)
            .bind($limit)
            .bind(&$job.traceparent)
            .bind(&$job.instance)
            .bind(&$job.business_model)
            .bind($job.backfill)
            .bind(&$job.gpu_model)
    };
}

/// Creates a `QUEUED` job and its first event in one transaction, unless the author already has
/// `active_limit` active jobs (then nothing is written and `None` is returned). Returns the
/// creation time. With `outbox`, the move into `QUEUED` is also recorded for the outbound
/// sinks. On PostgreSQL the
/// author's row is locked first so concurrent runs of one user serialize; SQLite serializes all
/// writers, commits the runs that wait together (`group_commit`), and the conditional insert is
/// one statement.
pub async fn insert_with_limit(db: &Db, job: &NewJob, active_limit: i64, outbox: bool) -> Result<Option<i64>, Error> {
    let (db, job) = (db.clone(), job.clone());
    crate::db::detached(async move { insert_with_limit_attached(&db, &job, active_limit, outbox).await }).await
}

async fn insert_with_limit_attached(
    db: &Db,
    job: &NewJob,
    active_limit: i64,
    outbox: bool,
) -> Result<Option<i64>, Error> {
    match db {
        Db::Postgres(pool) => insert_with_limit_postgres(pool, job, active_limit, outbox).await,
        Db::Sqlite(pool, writer) => {
            let (answer, answered) = tokio::sync::oneshot::channel();
            let run = QueuedRun { job: job.clone(), active_limit, outbox, created: None, answer };
            writer.submit(pool, Box::new(run), answered).await
        }
    }
    .map_err(query_error("create job"))
}

/// A `run` on SQLite, written by the group commit (`db::group_commit`) with the runs queued
/// beside it.
struct QueuedRun {
    job: NewJob,
    active_limit: i64,
    outbox: bool,
    /// The creation time once written, `None` when the active-job limit refused it.
    created: Option<i64>,
    answer: tokio::sync::oneshot::Sender<Result<Option<i64>, sqlx::Error>>,
}

impl Batched for QueuedRun {
    fn write<'c>(
        &'c mut self,
        connection: &'c mut sqlx::SqliteConnection,
        counts: &'c mut Changes,
    ) -> futures::future::BoxFuture<'c, Result<(), sqlx::Error>> {
        Box::pin(async move {
            self.created = insert_sqlite(connection, counts, &self.job, self.active_limit, self.outbox).await?;
            Ok(())
        })
    }

    fn answer(self: Box<Self>, outcome: Result<(), sqlx::Error>) {
        // The request may have gone (its client disconnected): the job stands either way.
        let _ = self.answer.send(outcome.map(|()| self.created));
    }
}

/// The job and its first event on `tx`, its kept counts added to `counts` (written once per row
/// when the batch ends), inside a transaction begun with SQLite's write lock taken (`BEGIN
/// IMMEDIATE`), so the count and the insert see one state; nothing is written when the author
/// already has `active_limit` active jobs, counting those the batch queued before this one.
async fn insert_sqlite(
    tx: &mut sqlx::SqliteConnection,
    counts: &mut Changes,
    job: &NewJob,
    active_limit: i64,
    outbox: bool,
) -> Result<Option<i64>, sqlx::Error> {
    let now = now_micros();
    let queued_in_batch = counts.active_of(&job.author_id);
    let inserted = bind_new_job!(sqlx::query(insert_job!()), job, now, active_limit - queued_in_batch)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if inserted == 0 {
        return Ok(None);
    }
    let counted = Counted {
        author_id: &job.author_id,
        program_id: &job.program_id,
        created: now,
        gpu: job.gpu,
        provider_id: job.provider_id.as_deref(),
    };
    counts.add(&counted, JobStatus::Queued, 1);
    insert_event!(tx, &job.id, 1i64, now, "STATUS_CHANGE", "API", "RUN_PROGRAM", QUEUED_EVENT);
    if outbox {
        insert_move_outbox!(tx, &job.id, 1i64, now, None::<&str>, "QUEUED", "API", "RUN_PROGRAM");
    }
    Ok(Some(now))
}

/// `insert_with_limit` on PostgreSQL in three round trips: `BEGIN` with the lock on the author's
/// row (concurrent runs of one user wait there), then the limit check, the job, its kept counts
/// (`counts::postgres_ctes`, their rows locked in every writer's order) and its first event in
/// one statement (which, started after the lock was granted, counts the jobs that the runs it
/// waited for committed), then `COMMIT`.
async fn insert_with_limit_postgres(
    pool: &sqlx::PgPool,
    job: &NewJob,
    active_limit: i64,
    outbox: bool,
) -> Result<Option<i64>, sqlx::Error> {
    let now = now_micros();
    // The simple protocol takes no parameters: the id goes in as a literal, which is safe only
    // because it is one of our ids (letters, digits and '-'); anything else takes a round trip
    // more.
    let mut tx = if job.author_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        pool.begin_with(format!("BEGIN; SELECT id FROM users WHERE id = '{}' FOR UPDATE", job.author_id)).await?
    } else {
        let mut tx = pool.begin_write().await?;
        sqlx::query("SELECT id FROM users WHERE id = $1 FOR UPDATE").bind(&job.author_id).execute(&mut *tx).await?;
        tx
    };
    static STATEMENT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "WITH job AS ({} RETURNING id, author_id, COALESCE(program_id, '') AS program_id, CAST($19 AS BIGINT) AS day, \
               CAST($22 AS BIGINT) AS block, gpu, provider_id){}, \
             event AS ( \
               INSERT INTO job_events (id, job_id, seq, created, event_type, origin, context, data) \
               SELECT $20, id, 1, $11, 'STATUS_CHANGE', 'API', 'RUN_PROGRAM', $21 FROM job) \
             SELECT COUNT(*) FROM job",
            insert_job!(),
            counts::postgres_ctes("job", "('QUEUED', CAST(1 AS BIGINT))", "$23", None, "1")
        )
    });
    let inserted: i64 = bind_new_job!(sqlx::query_scalar(STATEMENT.as_str()), job, now, active_limit)
        .bind(day_of(now))
        .bind(new_id())
        .bind(QUEUED_EVENT)
        .bind(block_of(now))
        .bind(counts::shard())
        .fetch_one(&mut *tx)
        .await?;
    if inserted == 0 {
        tx.rollback().await?;
        return Ok(None);
    }
    if outbox {
        insert_move_outbox!(tx, &job.id, 1i64, now, None::<&str>, "QUEUED", "API", "RUN_PROGRAM");
    }
    tx.commit().await?;
    Ok(Some(now))
}

/// The job's trace (`telemetry::context`): what its later steps make their spans children of.
pub async fn traceparent(db: &Db, job_id: &str) -> Result<Option<String>, Error> {
    crate::db::on_db!(db, pool => sqlx::query_scalar::<_, Option<String>>("SELECT traceparent FROM jobs WHERE id = $1")
        .bind(job_id)
        .fetch_optional(pool)
        .await)
    .map(Option::flatten)
    .map_err(query_error("load job trace"))
}
