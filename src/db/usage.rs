//! The usage ledger's records (`job_usage`, migration 0024): one per ended job, written by its
//! terminal move (`jobs::apply_moves`) in the same transaction, with the kept totals per day
//! (`counts::Changes::used`). This module builds the records' statement and reads them back.

use super::params::{Param, placeholders};
use super::{BeginWrite, Db, Error, on_db, query_error};
use crate::domain::event_data::{LICENCE_METRIC, UsageData, UsageEvent, business_model_of, metric_type};
use crate::domain::usage::{DAY_MICROS, Ending, Figures, day_of, month_of, whole_months};

/// A job's usage record.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct UsageRecord {
    pub job_id: String,
    pub author_id: String,
    /// Its function's id, `""` for none.
    pub program_id: String,
    pub provider_id: Option<String>,
    pub trial: bool,
    /// TRIAL, SUBSIDIZED or CONSUMPTION.
    pub business_model: String,
    /// The instance it ran for (its run's `Service-CRN`), under `runtime_platform`.
    pub instance: Option<String>,
    pub function_size: Option<String>,
    pub compute_profile: Option<String>,
    /// How it ended.
    pub status: String,
    pub created: i64,
    pub ended: i64,
    pub wait_ms: i64,
    pub run_ms: i64,
    /// 1 + its infrastructure retries.
    pub attempts: i64,
    pub cpu_millis: Option<i64>,
    pub memory_mib: Option<i64>,
    pub gpus: Option<i64>,
    pub gpu_model: Option<String>,
    pub cpu_core_ms: i64,
    pub gib_ms: i64,
    pub gpu_ms: i64,
    /// Measured by its runner, where it can.
    pub cpu_used_ms: Option<i64>,
    pub memory_peak_bytes: Option<i64>,
}

impl UsageRecord {
    /// The figures this record sums into the totals.
    pub fn figures(&self) -> Figures {
        Figures {
            wait_ms: self.wait_ms,
            run_ms: self.run_ms,
            cpu_core_ms: self.cpu_core_ms,
            gib_ms: self.gib_ms,
            gpu_ms: self.gpu_ms,
        }
    }
}

/// A job as its terminal move returns it: what its record is made of.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct Ended {
    pub id: String,
    pub author_id: String,
    pub program_id: String,
    pub provider_id: Option<String>,
    pub trial: bool,
    pub business_model: Option<String>,
    pub instance: Option<String>,
    pub function_size: Option<String>,
    pub compute_profile: Option<String>,
    pub created: i64,
    pub running_since: Option<i64>,
    pub allocated_cpu_millis: Option<i64>,
    pub allocated_memory_mib: Option<i64>,
    pub allocated_gpus: Option<i64>,
    pub allocated_gpu_model: Option<String>,
    pub infrastructure_retries: i64,
    pub cpu_used_ms: Option<i64>,
    pub memory_peak_bytes: Option<i64>,
}

impl Ended {
    /// Its record, for an ending into `status` at `ended`.
    pub(crate) fn record(&self, status: &str, ended: i64) -> UsageRecord {
        let figures = Figures::of(&Ending {
            created: self.created,
            running_since: self.running_since,
            ended,
            cpu_millis: self.allocated_cpu_millis,
            memory_mib: self.allocated_memory_mib,
            gpus: self.allocated_gpus,
        });
        UsageRecord {
            job_id: self.id.clone(),
            author_id: self.author_id.clone(),
            program_id: self.program_id.clone(),
            provider_id: self.provider_id.clone(),
            trial: self.trial,
            business_model: business_model_of(self.business_model.as_deref(), self.trial),
            instance: self.instance.clone(),
            function_size: self.function_size.clone(),
            compute_profile: self.compute_profile.clone(),
            status: status.to_string(),
            created: self.created,
            ended,
            wait_ms: figures.wait_ms,
            run_ms: figures.run_ms,
            attempts: self.infrastructure_retries.saturating_add(1),
            cpu_millis: self.allocated_cpu_millis,
            memory_mib: self.allocated_memory_mib,
            gpus: self.allocated_gpus,
            gpu_model: self.allocated_gpu_model.clone(),
            cpu_core_ms: figures.cpu_core_ms,
            gib_ms: figures.gib_ms,
            gpu_ms: figures.gpu_ms,
            cpu_used_ms: self.cpu_used_ms,
            memory_peak_bytes: self.memory_peak_bytes,
        }
    }
}

/// The columns a terminal move returns for `Ended` (the move's `UPDATE … RETURNING`).
pub(crate) const ENDED_COLUMNS: &str = "id, author_id, COALESCE(program_id, '') AS program_id, provider_id, trial, \
     business_model, instance, function_size, compute_profile, created, running_since, allocated_cpu_millis, \
     allocated_memory_mib, allocated_gpus, allocated_gpu_model, infrastructure_retries, cpu_used_ms, memory_peak_bytes";

pub(crate) const RECORD_COLUMNS: &str = "job_id, author_id, program_id, provider_id, trial, business_model, instance, \
     function_size, compute_profile, status, created, ended, wait_ms, run_ms, attempts, cpu_millis, memory_mib, gpus, gpu_model, \
     cpu_core_ms, gib_ms, gpu_ms, cpu_used_ms, memory_peak_bytes";

/// A terminal move's records in SQL, for the one-statement move on PostgreSQL: the columns of
/// `RECORD_COLUMNS` from the jobs `moved` returns (`ENDED_COLUMNS`) ended in `$1` at `$3`, with
/// `Ended::record`'s arithmetic (whole milliseconds truncated, no time when the clock went back,
/// products in numeric capped at the largest bigint).
pub(crate) const POSTGRES_RECORDS: &str = "(SELECT m.id, m.author_id, m.program_id, m.provider_id, m.trial, \
     COALESCE(m.business_model, CASE WHEN m.trial THEN 'TRIAL' ELSE 'SUBSIDIZED' END), m.instance, m.function_size, \
     m.compute_profile, CAST($1 AS TEXT), m.created, CAST($3 AS BIGINT), w.wait_ms, w.run_ms, \
     m.infrastructure_retries + 1, m.allocated_cpu_millis, m.allocated_memory_mib, m.allocated_gpus, \
     m.allocated_gpu_model, \
     CAST(LEAST(div(CAST(w.run_ms AS NUMERIC) * GREATEST(COALESCE(m.allocated_cpu_millis, 0), 0), 1000), 9223372036854775807) AS BIGINT), \
     CAST(LEAST(div(CAST(w.run_ms AS NUMERIC) * GREATEST(COALESCE(m.allocated_memory_mib, 0), 0), 1024), 9223372036854775807) AS BIGINT), \
     CAST(LEAST(CAST(w.run_ms AS NUMERIC) * GREATEST(COALESCE(m.allocated_gpus, 0), 0), 9223372036854775807) AS BIGINT), \
     m.cpu_used_ms, m.memory_peak_bytes \
   FROM moved m CROSS JOIN LATERAL (SELECT \
     GREATEST((COALESCE(m.running_since, CAST($3 AS BIGINT)) - m.created) / 1000, 0) AS wait_ms, \
     CASE WHEN m.running_since IS NULL THEN 0 ELSE GREATEST((CAST($3 AS BIGINT) - m.running_since) / 1000, 0) END AS run_ms) w \
   WHERE $4)";

/// Values a row of `RECORD_COLUMNS` binds.
const RECORD_WIDTH: usize = 24;

/// `RECORD_COLUMNS` as read: records from before business models were kept read as TRIAL for a
/// trial, else SUBSIDIZED (as `business_model_of` decides).
static SELECTED_COLUMNS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    RECORD_COLUMNS.replacen(
        "business_model,",
        "COALESCE(business_model, CASE WHEN trial THEN 'TRIAL' ELSE 'SUBSIDIZED' END) AS business_model,",
        1,
    )
});

/// At most this many records in one statement.
const RECORDS_PER_STATEMENT: usize = 1_000;

/// The statements inserting `records` (a job that has one already keeps it: each returns the
/// ids it wrote, the records to add to the totals).
pub(crate) fn insert_statements(records: &[UsageRecord]) -> Vec<(String, Vec<Param>)> {
    let text = |value: &str| Param::Text(value.to_string());
    let optional_text = |value: &Option<String>| Param::OptText(value.clone());
    let optional_int = Param::OptInt;
    records
        .chunks(RECORDS_PER_STATEMENT)
        .map(|chunk| {
            let mut values = Vec::new();
            let mut params = Vec::new();
            for (i, r) in chunk.iter().enumerate() {
                values.push(format!("({})", placeholders(1 + i * RECORD_WIDTH, RECORD_WIDTH)));
                params.extend([
                    text(&r.job_id),
                    text(&r.author_id),
                    text(&r.program_id),
                    optional_text(&r.provider_id),
                    Param::Bool(r.trial),
                    text(&r.business_model),
                    optional_text(&r.instance),
                    optional_text(&r.function_size),
                    optional_text(&r.compute_profile),
                    text(&r.status),
                    Param::Int(r.created),
                    Param::Int(r.ended),
                    Param::Int(r.wait_ms),
                    Param::Int(r.run_ms),
                    Param::Int(r.attempts),
                    optional_int(r.cpu_millis),
                    optional_int(r.memory_mib),
                    optional_int(r.gpus),
                    optional_text(&r.gpu_model),
                    Param::Int(r.cpu_core_ms),
                    Param::Int(r.gib_ms),
                    Param::Int(r.gpu_ms),
                    optional_int(r.cpu_used_ms),
                    optional_int(r.memory_peak_bytes),
                ]);
            }
            let sql = format!(
                "INSERT INTO job_usage ({RECORD_COLUMNS}) VALUES {} ON CONFLICT (job_id) DO NOTHING RETURNING job_id",
                values.join(", ")
            );
            (sql, params)
        })
        .collect()
}

/// The usage record of `job_id`, once it ended.
pub async fn record(db: &Db, job_id: &str) -> Result<Option<UsageRecord>, Error> {
    let sql = format!("SELECT {} FROM job_usage WHERE job_id = $1", *SELECTED_COLUMNS);
    on_db!(db, pool => sqlx::query_as::<_, UsageRecord>(&sql).bind(job_id).fetch_optional(pool).await)
        .map_err(query_error("read a job's usage"))
}

/// The usage of job `job_id`: its record once it ended; while it runs (or waits), the record
/// it would have if it ended at `now` (status its current one); `None` for no such job.
pub async fn of_job(db: &Db, job_id: &str, now: i64) -> Result<Option<UsageRecord>, Error> {
    if let Some(record) = record(db, job_id).await? {
        return Ok(Some(record));
    }
    let sql = format!("SELECT {ENDED_COLUMNS}, status FROM jobs WHERE id = $1");
    #[derive(sqlx::FromRow)]
    struct Live {
        #[sqlx(flatten)]
        job: Ended,
        status: String,
    }
    let live = on_db!(db, pool => sqlx::query_as::<_, Live>(&sql).bind(job_id).fetch_optional(pool).await)
        .map_err(query_error("read a job's usage so far"))?;
    Ok(live.map(|live| live.job.record(&live.status, now)))
}

/// What a usage event names of its job.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct EventNames {
    pub user: String,
    pub function: Option<String>,
    pub provider: Option<String>,
}

/// The names of job `$1`, for its usage events.
pub(crate) const EVENT_NAMES: &str = "SELECT u.username AS user, p.title AS function, pr.name AS provider \
     FROM jobs j JOIN users u ON u.id = j.author_id \
     LEFT JOIN programs p ON p.id = j.program_id LEFT JOIN providers pr ON pr.id = j.provider_id WHERE j.id = $1";

/// The `data` of usage event `kind` of a job whose record (up to `at`, or its final one) is
/// `record`, first RUNNING at `running_since`.
pub(crate) fn event_data(
    kind: UsageEvent,
    record: &UsageRecord,
    names: &EventNames,
    running_since: Option<i64>,
    at: i64,
) -> UsageData {
    let (metric_type, metric_value) = match kind {
        UsageEvent::Licence => (LICENCE_METRIC.to_string(), 1),
        _ => (metric_type(record.compute_profile.as_deref(), record.function_size.as_deref()), record.run_ms),
    };
    UsageData {
        event: kind.billing_name().to_string(),
        job_id: record.job_id.clone(),
        function: names.function.clone(),
        provider: names.provider.clone(),
        user: names.user.clone(),
        instance_crn: record.instance.clone(),
        trial: record.trial,
        business_model: record.business_model.clone(),
        size: record.function_size.clone(),
        compute_profile: record.compute_profile.clone(),
        status: record.status.clone(),
        metric_type,
        metric_value,
        resource_id: record.job_id.clone(),
        job_started: running_since.map(super::format_timestamp),
        job_completed: (kind == UsageEvent::Completed).then(|| super::format_timestamp(record.ended)),
        time: super::format_timestamp(at),
        wait_ms: record.wait_ms,
        run_ms: record.run_ms,
        attempts: record.attempts,
        cpu_millis: record.cpu_millis,
        memory_mib: record.memory_mib,
        gpus: record.gpus,
        gpu_model: record.gpu_model.clone(),
        cpu_core_ms: record.cpu_core_ms,
        gib_ms: record.gib_ms,
        gpu_ms: record.gpu_ms,
        cpu_used_ms: record.cpu_used_ms,
        memory_peak_bytes: record.memory_peak_bytes,
    }
}

/// Each user's run time (milliseconds) of the jobs that ended since `since` (microseconds),
/// summed per `bucket` (microseconds) of their end: (user, bucket number, run_ms). What fair
/// sharing decays (`compute::recent_usage`); rows grow with users × buckets, not with jobs.
pub async fn recent_run_by_user(db: &Db, since: i64, bucket: i64) -> Result<Vec<(String, i64, i64)>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, (String, i64, i64)>(
        "SELECT author_id, ended / CAST($2 AS BIGINT), CAST(SUM(run_ms) AS BIGINT) FROM job_usage \
         WHERE ended >= $1 GROUP BY author_id, ended / CAST($2 AS BIGINT)")
        .bind(since)
        .bind(bucket.max(1))
        .fetch_all(pool)
        .await)
    .map_err(query_error("read recent usage"))
}

/// Records deleted per statement by `prune`: each statement holds its rows' locks briefly.
const PRUNE_BATCH: i64 = 10_000;

/// Deletes the usage records of jobs that ended before day `before_day` (days since the epoch)
/// and the kept totals of those days, in batches; answers the records deleted. Whole days, so
/// the totals left are those of the records left.
pub async fn prune(db: &Db, before_day: i64) -> Result<u64, Error> {
    let before = before_day.saturating_mul(DAY_MICROS);
    let mut deleted = 0;
    loop {
        let _writer = db.write_lock().await;
        let done = on_db!(db, pool => sqlx::query(
            "DELETE FROM job_usage WHERE job_id IN (SELECT job_id FROM job_usage WHERE ended < $1 LIMIT $2)")
            .bind(before)
            .bind(PRUNE_BATCH)
            .execute(pool)
            .await
            .map(|done| done.rows_affected()))
        .map_err(query_error("delete old usage records"))?;
        deleted += done;
        if done < PRUNE_BATCH as u64 {
            break;
        }
    }
    let _writer = db.write_lock().await;
    on_db!(db, pool => sqlx::query("DELETE FROM usage_by_day WHERE day < $1").bind(before_day).execute(pool).await.map(|_| ()))
        .map_err(query_error("delete old usage totals"))?;
    // Months wholly before that day; a month it cuts keeps its sum.
    on_db!(db, pool => sqlx::query("DELETE FROM usage_by_month WHERE month < $1")
        .bind(month_of(before_day).0)
        .execute(pool)
        .await
        .map(|_| ()))
    .map_err(query_error("delete old usage totals of months"))?;
    Ok(deleted)
}

/// The day before which ended months are summed at `now` (microseconds): a day after their
/// end, so that a terminal move on a server whose clock is behind still adds to a month not
/// summed yet.
pub fn months_summed_before(now: i64) -> i64 {
    day_of(now) - 1
}

/// Sums into `usage_by_month`, from its days' kept rows, each whole month not summed yet that
/// ended before day `before_day`, oldest first, one month a transaction; answers the months
/// summed. A month's rows go in one insert ordered by provider and user, so that a provider's
/// rows of a month lie together on disk, and are never updated. The first time, months start
/// at the oldest day kept. Replicas may run it together: each month's transaction first locks
/// the one row saying how far the months are summed, so a month is summed once.
pub async fn sum_months(db: &Db, before_day: i64) -> Result<u32, Error> {
    const SUM: &str = "INSERT INTO usage_by_month (author_id, month, program_id, function_size, provider_id, \
           jobs, wait_ms, run_ms, cpu_core_ms, gib_ms, gpu_ms) \
         SELECT author_id, $1, program_id, function_size, MIN(provider_id), CAST(SUM(jobs) AS BIGINT), \
           CAST(SUM(wait_ms) AS BIGINT), CAST(SUM(run_ms) AS BIGINT), CAST(SUM(cpu_core_ms) AS BIGINT), \
           CAST(SUM(gib_ms) AS BIGINT), CAST(SUM(gpu_ms) AS BIGINT) \
         FROM usage_by_day WHERE day >= $1 AND day < $2 GROUP BY author_id, program_id, function_size \
         ORDER BY MIN(provider_id), author_id, program_id, function_size \
         ON CONFLICT (author_id, month, program_id, function_size) DO NOTHING";
    let mut summed = 0;
    loop {
        let _writer = db.write_lock().await;
        let done = on_db!(db, pool => async {
            let mut tx = pool.begin_write().await?;
            let through: i64 = sqlx::query_scalar("UPDATE usage_months SET through = through RETURNING through")
                .fetch_one(&mut *tx)
                .await?;
            let start = match through {
                0 => {
                    let oldest: Option<i64> =
                        sqlx::query_scalar("SELECT MIN(day) FROM usage_by_day").fetch_one(&mut *tx).await?;
                    month_of(oldest.unwrap_or(before_day)).0
                }
                through => through,
            };
            let next = month_of(start).1;
            if next > before_day {
                tx.commit().await?;
                return Ok::<_, sqlx::Error>(false);
            }
            sqlx::query(SUM).bind(start).bind(next).execute(&mut *tx).await?;
            sqlx::query("UPDATE usage_months SET through = $1").bind(next).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(true)
        }.await)
        .map_err(query_error("sum a month's usage"))?;
        if !done {
            return Ok(summed);
        }
        summed += 1;
    }
}

/// Every usage record whose job ended in `[from, to)` (microseconds), oldest first: what the
/// soak and the CSV read.
pub async fn records(db: &Db, from: i64, to: i64) -> Result<Vec<UsageRecord>, Error> {
    let sql =
        format!("SELECT {} FROM job_usage WHERE ended >= $1 AND ended < $2 ORDER BY ended, job_id", *SELECTED_COLUMNS);
    on_db!(db, pool => sqlx::query_as::<_, UsageRecord>(&sql).bind(from).bind(to).fetch_all(pool).await)
        .map_err(query_error("read usage records"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended() -> Ended {
        Ended {
            id: "j".into(),
            author_id: "a".into(),
            program_id: "p".into(),
            provider_id: None,
            trial: false,
            instance: None,
            function_size: Some("small".into()),
            compute_profile: None,
            created: 0,
            running_since: Some(2_000_000),
            allocated_cpu_millis: Some(2000),
            allocated_memory_mib: Some(1024),
            allocated_gpus: None,
            allocated_gpu_model: None,
            infrastructure_retries: 1,
            business_model: None,
            cpu_used_ms: Some(7_500),
            memory_peak_bytes: None,
        }
    }

    #[test]
    fn a_record_holds_its_jobs_figures_and_attempts() {
        let record = ended().record("SUCCEEDED", 12_000_000);
        assert_eq!((record.wait_ms, record.run_ms, record.attempts), (2000, 10_000, 2));
        assert_eq!((record.cpu_core_ms, record.gib_ms, record.gpu_ms), (20_000, 10_000, 0));
        assert_eq!(record.status, "SUCCEEDED");
        assert_eq!((record.cpu_used_ms, record.memory_peak_bytes), (Some(7_500), None));
        assert_eq!(record.business_model, "SUBSIDIZED");
        let trial = Ended { trial: true, ..ended() }.record("SUCCEEDED", 12_000_000);
        assert_eq!(trial.business_model, "TRIAL");
        let kept = Ended { business_model: Some("CONSUMPTION".into()), ..ended() }.record("FAILED", 12_000_000);
        assert_eq!(kept.business_model, "CONSUMPTION");
    }

    fn names() -> EventNames {
        EventNames { user: "alice".into(), function: Some("solver".into()), provider: Some("acme".into()) }
    }

    #[test]
    fn usage_events_carry_the_billing_fields() {
        let job = Ended { compute_profile: Some("cx3d-4x16".into()), instance: Some("crn:i".into()), ..ended() };
        let completed = event_data(
            UsageEvent::Completed,
            &job.record("SUCCEEDED", 12_000_000),
            &names(),
            Some(2_000_000),
            12_000_000,
        );
        assert_eq!(completed.event, "function_job_completed");
        assert_eq!((completed.metric_type.as_str(), completed.metric_value), ("classical_cx3d-4x16", 10_000));
        assert_eq!(completed.resource_id, "j");
        assert_eq!(completed.instance_crn.as_deref(), Some("crn:i"));
        assert_eq!(completed.job_started.as_deref(), Some("1970-01-01T00:00:02.000000Z"));
        assert_eq!(completed.job_completed.as_deref(), Some("1970-01-01T00:00:12.000000Z"));
        let running = event_data(
            UsageEvent::InProgress,
            &ended().record("RUNNING", 5_000_000),
            &names(),
            Some(2_000_000),
            5_000_000,
        );
        assert_eq!((running.metric_type.as_str(), running.metric_value), ("classical_small", 3_000));
        assert_eq!(running.job_completed, None);
        let licence = event_data(
            UsageEvent::Licence,
            &ended().record("RUNNING", 2_000_000),
            &names(),
            Some(2_000_000),
            2_000_000,
        );
        assert_eq!((licence.metric_type.as_str(), licence.metric_value), ("licence", 1));
        assert_eq!((licence.provider.as_deref(), licence.business_model.as_str()), (Some("acme"), "SUBSIDIZED"));
        let never_ran = Ended { running_since: None, ..ended() };
        let stopped =
            event_data(UsageEvent::Completed, &never_ran.record("STOPPED", 4_000_000), &names(), None, 4_000_000);
        assert_eq!((stopped.metric_value, stopped.job_started.as_deref(), stopped.wait_ms), (0, None, 4_000));
    }

    #[test]
    fn records_are_inserted_in_statements_of_at_most_a_thousand_rows() {
        let records: Vec<UsageRecord> = (0..1001).map(|_| ended().record("FAILED", 3_000_000)).collect();
        let statements = insert_statements(&records);
        assert_eq!(statements.len(), 2);
        assert_eq!(statements[0].1.len(), 1000 * RECORD_WIDTH);
        assert_eq!(statements[1].1.len(), RECORD_WIDTH);
        assert_eq!(RECORD_COLUMNS.split(',').count(), RECORD_WIDTH);
        assert!(statements[1].0.ends_with("($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24) ON CONFLICT (job_id) DO NOTHING RETURNING job_id"));
    }
}

/// Whose usage totals cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// One user's jobs.
    User(&'a str),
    /// Every user's jobs of one provider's functions (the provider's id).
    Provider(&'a str),
    /// The jobs of a group's members (the group's id).
    Group(&'a str),
    /// Every user's jobs of one function (its id).
    Function(&'a str),
    /// Everyone's (an operator's `gantry admin usage`).
    Everyone,
}

/// What totals are grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupBy {
    Function,
    Size,
    Day,
    User,
    Provider,
    /// Per day and function: keys `<day> <function id>` (what a chart of days by function
    /// draws).
    DayFunction,
}

impl GroupBy {
    /// The group's key in `usage_by_day` and in `jobs` (text in both), and the SQL naming it.
    fn columns(self) -> (&'static str, &'static str, &'static str) {
        match self {
            GroupBy::Function => {
                ("program_id", "COALESCE(program_id, '')", "(SELECT p.title FROM programs p WHERE p.id = t.key)")
            }
            GroupBy::Size => ("function_size", "COALESCE(function_size, '')", "NULL"),
            // The running jobs' day is today's, bound as `$4`.
            GroupBy::Day => ("CAST(day AS TEXT)", "$4", "NULL"),
            GroupBy::User => ("author_id", "author_id", "(SELECT u.username FROM users u WHERE u.id = t.key)"),
            GroupBy::Provider => {
                ("provider_id", "COALESCE(provider_id, '')", "(SELECT pr.name FROM providers pr WHERE pr.id = t.key)")
            }
            // Day numbers have five digits from 1997 to 2243: the function's id starts at the
            // key's seventh character.
            GroupBy::DayFunction => (
                "CAST(day AS TEXT) || ' ' || program_id",
                "$4 || ' ' || COALESCE(program_id, '')",
                "(SELECT p.title FROM programs p WHERE p.id = substr(t.key, 7))",
            ),
        }
    }

    /// Whether the groups are days: then every figure comes from the day rows.
    fn by_day(self) -> bool {
        matches!(self, GroupBy::Day | GroupBy::DayFunction)
    }
}

/// One group's totals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Total {
    /// The group's key: a function's id, a size, a day number (days since the epoch), a user's
    /// or a provider's id; `""` for none.
    pub key: String,
    /// What the key names: the function's title, the user's name, the provider's name.
    pub name: Option<String>,
    /// Jobs ended in the period.
    pub jobs: i64,
    /// Jobs running now, counted up to now.
    pub running: i64,
    pub figures: Figures,
}

/// A row of the totals' statement: a group's kept sums (`kind` 0) or one running job (1).
#[derive(sqlx::FromRow)]
struct TotalRow {
    kind: i64,
    key: String,
    name: Option<String>,
    jobs: i64,
    wait_ms: i64,
    run_ms: i64,
    cpu_core_ms: i64,
    gib_ms: i64,
    gpu_ms: i64,
    created: Option<i64>,
    running_since: Option<i64>,
    cpu_millis: Option<i64>,
    memory_mib: Option<i64>,
    gpus: Option<i64>,
}

/// The totals of `scope` over the days `[from_day, to_day)` (days since the epoch, UTC) by
/// `group_by`, ordered by key: the kept sums of the jobs that ended on those days, and, when the
/// period holds `now`'s day, the jobs running now counted up to `now`. One statement (one
/// snapshot): the sums of the period's whole months already summed (`usage_by_month`, not for
/// groups of days), the kept rows of its other days (each an index on the scope and the month
/// or day) and the scope's running jobs.
pub async fn totals(
    db: &Db,
    scope: Scope<'_>,
    from_day: i64,
    to_day: i64,
    group_by: GroupBy,
    now: i64,
) -> Result<Vec<Total>, Error> {
    let (kept_key, job_key, name) = group_by.columns();
    // Days are not in the months' rows, whose part is empty then.
    let month_key = if group_by.by_day() { "''" } else { kept_key };
    const MEMBERS: &str = "author_id IN (SELECT m.user_id FROM group_members m WHERE m.group_id = $1)";
    let (kept_scope, job_scope) = match scope {
        Scope::User(_) => ("author_id = $1", "author_id = $1"),
        Scope::Provider(_) => ("provider_id = $1", "provider_id = $1"),
        Scope::Group(_) => (MEMBERS, MEMBERS),
        Scope::Function(_) => ("program_id = $1", "program_id = $1"),
        Scope::Everyone => ("$1 = $1", "$1 = $1"),
    };
    let scope_value = match scope {
        Scope::User(id) | Scope::Provider(id) | Scope::Group(id) | Scope::Function(id) => id,
        Scope::Everyone => "",
    };
    let today = day_of(now);
    // The whole months `[$6, $7)` come from `usage_by_month` up to where months are summed
    // (`summed`, a month's first day between the two), the period's days before `$6` and from
    // `summed` on from `usage_by_day`: each part one range of an index.
    let (first, end) = if group_by.by_day() { (to_day, to_day) } else { whole_months(from_day, to_day) };
    let summed = "(SELECT CASE WHEN through < $6 THEN $6 WHEN through > $7 THEN $7 ELSE through END FROM usage_months)";
    const FIGURES: &str = "jobs, wait_ms, run_ms, cpu_core_ms, gib_ms, gpu_ms";
    let sql = format!(
        "SELECT t.kind, t.key, {name} AS name, t.jobs, t.wait_ms, t.run_ms, t.cpu_core_ms, t.gib_ms, t.gpu_ms, \
           t.created, t.running_since, t.cpu_millis, t.memory_mib, t.gpus FROM ( \
           SELECT CAST(0 AS BIGINT) AS kind, k.key, CAST(SUM(jobs) AS BIGINT) AS jobs, \
             CAST(SUM(wait_ms) AS BIGINT) AS wait_ms, CAST(SUM(run_ms) AS BIGINT) AS run_ms, \
             CAST(SUM(cpu_core_ms) AS BIGINT) AS cpu_core_ms, CAST(SUM(gib_ms) AS BIGINT) AS gib_ms, \
             CAST(SUM(gpu_ms) AS BIGINT) AS gpu_ms, CAST(NULL AS BIGINT) AS created, \
             CAST(NULL AS BIGINT) AS running_since, CAST(NULL AS BIGINT) AS cpu_millis, \
             CAST(NULL AS BIGINT) AS memory_mib, CAST(NULL AS BIGINT) AS gpus FROM ( \
             SELECT {month_key} AS key, {FIGURES} FROM usage_by_month \
               WHERE {kept_scope} AND month >= $6 AND month < {summed} \
             UNION ALL \
             SELECT {kept_key} AS key, {FIGURES} FROM usage_by_day WHERE {kept_scope} AND day >= $2 AND day < $6 \
             UNION ALL \
             SELECT {kept_key} AS key, {FIGURES} FROM usage_by_day \
               WHERE {kept_scope} AND day >= {summed} AND day < $3 \
           ) k GROUP BY k.key \
           UNION ALL \
           SELECT 1, {job_key}, 0, 0, 0, 0, 0, 0, created, running_since, allocated_cpu_millis, \
             allocated_memory_mib, allocated_gpus \
           FROM jobs WHERE status IN ('QUEUED','PENDING','RUNNING') AND status = 'RUNNING' AND {job_scope} AND $5 \
         ) t ORDER BY t.key"
    );
    let in_period = (from_day..to_day).contains(&today);
    let rows: Vec<TotalRow> = on_db!(db, pool => sqlx::query_as::<_, TotalRow>(&sql)
        .bind(scope_value)
        .bind(from_day)
        .bind(to_day)
        .bind(today.to_string())
        .bind(in_period)
        .bind(first)
        .bind(end)
        .fetch_all(pool)
        .await)
    .map_err(query_error("read usage totals"))?;
    let mut totals: Vec<Total> = Vec::new();
    for row in rows {
        if totals.last().is_none_or(|last| last.key != row.key) {
            totals.push(Total { key: row.key.clone(), name: row.name.clone(), ..Total::default() });
        }
        let total = totals.last_mut().expect("pushed");
        if row.kind == 0 {
            total.jobs += row.jobs;
            total.figures = total.figures.plus(Figures {
                wait_ms: row.wait_ms,
                run_ms: row.run_ms,
                cpu_core_ms: row.cpu_core_ms,
                gib_ms: row.gib_ms,
                gpu_ms: row.gpu_ms,
            });
        } else {
            total.running += 1;
            total.figures = total.figures.plus(Figures::of(&Ending {
                created: row.created.unwrap_or(now),
                running_since: row.running_since,
                ended: now,
                cpu_millis: row.cpu_millis,
                memory_mib: row.memory_mib,
                gpus: row.gpus,
            }));
        }
    }
    Ok(totals)
}
