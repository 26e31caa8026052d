//! Retention of finished jobs: a pass deletes finished jobs (SUCCEEDED, FAILED, STOPPED) last
//! updated before a cutoff, with their events, runtime jobs and objects (everything under
//! `storage::keys::job_objects`). Run in the background by `serve` and `gateway` when
//! `--retain-finished-days` is set, and once by `gantry admin gc`.
//!
//! A pass walks the expired jobs oldest first in small batches, pausing between them, so the API
//! is never kept waiting (SQLite has one writer). For each batch it deletes the objects first,
//! then the rows in one transaction that also adjusts the kept counts (`db::retention`): a pass
//! cut short leaves at worst rows whose objects are gone, which the next pass deletes, never
//! objects that no row leads to. A job whose objects could not be deleted keeps its row.

use std::fmt;
use std::time::{Duration, Instant};

use crate::db::retention::{Cursor, ExpiredJobRow};
use crate::db::{self, Db};
use crate::storage::{self, Storage, keys};

/// Jobs per batch: one transaction, and as many object folders deleted before it.
pub const BATCH_SIZE: usize = 200;
/// The shortest pause between two batches, for the API's writers to go first; a batch that took
/// longer is followed by a pause as long as it took, so a pass holds the database's writes
/// (SQLite's one writer) at most half of the time.
pub const PAUSE: Duration = Duration::from_millis(20);
/// Time between two background passes.
pub const PASS_EVERY: Duration = Duration::from_secs(3600);
/// Jobs whose objects are listed or deleted at once.
const OBJECT_CONCURRENCY: usize = 8;
/// Time between two progress lines of a long pass.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// How long finished jobs are kept, shared by `serve` and `gateway`.
#[derive(Debug, Clone, clap::Args)]
pub struct RetentionArgs {
    /// Delete finished jobs (SUCCEEDED, FAILED, STOPPED) last updated more than this many days
    /// ago (fractions allowed), with their events, runtime jobs, arguments, results and logs; an
    /// hourly background pass. Default: keep every job.
    #[arg(long, env = "GANTRY_RETAIN_FINISHED_DAYS", value_parser = parse_retention_days)]
    pub retain_finished_days: Option<Duration>,
    /// Delete the usage records of jobs that ended more than this many days ago, with those
    /// days' totals (whole days, UTC); an hourly background pass. Records outlive their jobs:
    /// they are what is billed.
    #[arg(long, env = "GANTRY_RETAIN_USAGE_DAYS", default_value = "400", value_parser = parse_retention_days)]
    pub retain_usage_days: Duration,
}

impl RetentionArgs {
    /// The policy, when retention is on.
    pub fn policy(&self) -> Option<Policy> {
        self.retain_finished_days.map(Policy::new)
    }

    /// Starts the background passes when retention is on, and says what it does. The queue's
    /// spent hours (`db::queue::prune_spent_blocks`) are pruned in any case.
    pub fn start(&self, db: &Db, storage: &Storage) -> String {
        tokio::spawn(prune_queue_periodically(db.clone(), PRUNE_QUEUE_EVERY));
        tokio::spawn(prune_usage_periodically(db.clone(), self.retain_usage_days, PASS_EVERY));
        let usage = format!(
            "; usage records kept {} after their job ended (GANTRY_RETAIN_USAGE_DAYS)",
            describe_age(self.retain_usage_days)
        );
        let jobs = match self.policy() {
            Some(policy) => {
                let description = format!(
                    "finished jobs deleted {} after their last update (GANTRY_RETAIN_FINISHED_DAYS)",
                    describe_age(policy.older_than)
                );
                tokio::spawn(run_periodically(db.clone(), storage.clone(), policy, PASS_EVERY));
                description
            }
            None => "finished jobs kept forever (GANTRY_RETAIN_FINISHED_DAYS not set)".to_string(),
        };
        jobs + &usage
    }
}

/// The first day (since the epoch) whose usage is kept at `now` when records are kept for
/// `keep`.
pub fn usage_kept_from(keep: Duration, now: i64) -> i64 {
    let keep = i64::try_from(keep.as_micros()).unwrap_or(i64::MAX);
    db::counts::day_of(now.saturating_sub(keep))
}

/// Deletes usage records past `keep` now and then every `every`, for as long as the process
/// runs, and sums the months that ended since into their totals (`db::usage::sum_months`);
/// failures are logged and the next pass tries again.
pub async fn prune_usage_periodically(db: Db, keep: Duration, every: Duration) {
    loop {
        let now = db::now_micros();
        match db::usage::prune(&db, usage_kept_from(keep, now)).await {
            Ok(0) => tracing::debug!("usage retention: nothing to delete"),
            Ok(records) => tracing::info!(records, "usage retention: old usage records deleted"),
            Err(error) => tracing::warn!(
                error = &error as &dyn std::error::Error,
                "deleting old usage records failed; the next pass tries again"
            ),
        }
        match db::usage::sum_months(&db, db::usage::months_summed_before(now)).await {
            Ok(0) => {}
            Ok(months) => tracing::info!(months, "usage totals: ended months summed"),
            Err(error) => tracing::warn!(
                error = &error as &dyn std::error::Error,
                "summing the usage of ended months failed; the next pass tries again"
            ),
        }
        tokio::time::sleep(every).await;
    }
}

/// `--older-than` of `gantry admin gc`: a number of days, 0 or more (fractions allowed).
pub fn parse_days(text: &str) -> Result<Duration, String> {
    let days: f64 =
        text.trim().parse().map_err(|_| format!("invalid number of days '{text}': use a number such as 30 or 0.5"))?;
    if !days.is_finite() || days < 0.0 {
        return Err(format!("invalid number of days '{text}': it must be 0 or more"));
    }
    Duration::try_from_secs_f64(days * 86_400.0).map_err(|_| format!("invalid number of days '{text}': too large"))
}

/// `--retain-finished-days`: as `parse_days`, but more than 0, so that a job's result and logs
/// can still be read once it has finished (`gantry admin gc --older-than 0` empties the history
/// once, on purpose).
pub fn parse_retention_days(text: &str) -> Result<Duration, String> {
    let age = parse_days(text)?;
    if age.is_zero() {
        return Err(format!(
            "invalid retention '{text}': it must be more than 0 days (leave it unset to keep every job)"
        ));
    }
    Ok(age)
}

/// "30 days", "12 hours", …: an age in the unit it was most likely given in.
fn describe_age(age: Duration) -> String {
    let seconds = age.as_secs_f64();
    if seconds >= 86_400.0 {
        format!("{} days", trim_number(seconds / 86_400.0))
    } else {
        format!("{} hours", trim_number(seconds / 3600.0))
    }
}

fn trim_number(value: f64) -> String {
    let text = format!("{value:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Which finished jobs go, and how a pass goes about it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// A finished job goes once its last update is older than this.
    pub older_than: Duration,
    /// Jobs per batch.
    pub batch_size: usize,
    /// Pause between batches.
    pub pause: Duration,
}

impl Policy {
    pub fn new(older_than: Duration) -> Policy {
        Policy { older_than, batch_size: BATCH_SIZE, pause: PAUSE }
    }

    /// The last update (microseconds since the Unix epoch) before which a finished job goes,
    /// for a pass starting at `now`.
    pub fn cutoff(&self, now: i64) -> i64 {
        let age = (self.older_than.as_secs_f64() * 1_000_000.0).min(i64::MAX as f64) as i64;
        now.saturating_sub(age)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to list the expired jobs")]
    ListJobs { source: db::Error },
    #[error("failed to count the expired jobs")]
    CountJobs { source: db::Error },
    #[error("failed to count what belongs to the expired jobs")]
    CountDependents { source: db::Error },
    #[error("failed to list the objects of job {job_id}")]
    ListObjects { job_id: String, source: storage::Error },
    #[error("failed to delete the objects of job {job_id}, and of every other job of its batch")]
    DeleteObjects { job_id: String, source: storage::Error },
    #[error("failed to delete expired jobs")]
    DeleteJobs { source: db::Error },
}

/// A job at one end of a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobMark {
    pub id: String,
    /// Its last update (microseconds since the Unix epoch).
    pub updated: i64,
}

impl From<&ExpiredJobRow> for JobMark {
    fn from(job: &ExpiredJobRow) -> JobMark {
        JobMark { id: job.id.clone(), updated: job.updated }
    }
}

/// What a pass deleted, or would delete (a dry run).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub dry_run: bool,
    /// Jobs last updated before this went (microseconds since the Unix epoch).
    pub cutoff: i64,
    pub jobs: u64,
    pub events: u64,
    pub runtime_jobs: u64,
    pub objects: u64,
    /// Jobs kept because their objects could not be deleted (each logged with its error).
    pub kept: u64,
    /// The job last updated longest ago, and the one most recently.
    pub oldest: Option<JobMark>,
    pub newest: Option<JobMark>,
}

impl Report {
    fn new(dry_run: bool, cutoff: i64) -> Report {
        Report { dry_run, cutoff, jobs: 0, events: 0, runtime_jobs: 0, objects: 0, kept: 0, oldest: None, newest: None }
    }

    /// Adds the jobs of one batch (oldest first).
    fn add_jobs(&mut self, jobs: &[&ExpiredJobRow]) {
        if let (Some(first), Some(last)) = (jobs.first(), jobs.last()) {
            self.oldest.get_or_insert_with(|| JobMark::from(*first));
            self.newest = Some(JobMark::from(*last));
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cutoff = db::format_timestamp(self.cutoff);
        if self.jobs == 0 && self.kept == 0 {
            return write!(f, "no finished job was last updated before {cutoff}: nothing to delete");
        }
        let verb = if self.dry_run { "would delete" } else { "deleted" };
        write!(
            f,
            "{verb} {} finished job(s) last updated before {cutoff}, with {} event(s), {} runtime job(s) and {} object(s)",
            self.jobs, self.events, self.runtime_jobs, self.objects
        )?;
        for (label, mark) in [("oldest", &self.oldest), ("newest", &self.newest)] {
            if let Some(mark) = mark {
                write!(f, "\n{label}: job {}, last updated {}", mark.id, db::format_timestamp(mark.updated))?;
            }
        }
        if self.kept > 0 {
            write!(
                f,
                "\nkept {} job(s) whose objects could not be deleted (see the log); the next pass tries again",
                self.kept
            )?;
        }
        Ok(())
    }
}

/// Where a pass stands: what it has done so far against what it found to do when it started.
#[derive(Debug, Clone, Copy)]
pub struct Progress<'a> {
    pub report: &'a Report,
    /// The expired jobs when the pass started (jobs that expire during the pass may add a few).
    pub expected: u64,
    /// Batches done.
    pub batches: u64,
    pub elapsed: Duration,
}

impl fmt::Display for Progress<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let done = self.report.jobs + self.report.kept;
        let verb = if self.report.dry_run { "surveyed" } else { "deleted" };
        let seconds = self.elapsed.as_secs_f64();
        let rate = if seconds > 0.0 { done as f64 / seconds } else { 0.0 };
        let percent = if self.expected > 0 { (done as f64 * 100.0 / self.expected as f64).min(100.0) } else { 100.0 };
        write!(
            f,
            "{verb} {done} of {} finished job(s) ({percent:.0} %) in {} batch(es), {} event(s) and {} object(s), \
             {rate:.0} job(s)/s",
            self.expected, self.batches, self.report.events, self.report.objects
        )?;
        if rate > 0.0 && self.expected > done {
            write!(f, ", about {:.0} s left", (self.expected - done) as f64 / rate)?;
        }
        Ok(())
    }
}

/// Deletes the finished jobs last updated before `policy.cutoff(now)`, batch by batch, logging
/// its progress every `PROGRESS_EVERY`.
pub async fn collect(db: &Db, storage: &Storage, policy: &Policy, now: i64) -> Result<Report, Error> {
    collect_with(db, storage, policy, now, PROGRESS_EVERY, &mut log_progress).await
}

/// Says what `collect` would delete, deleting nothing.
pub async fn survey(db: &Db, storage: &Storage, policy: &Policy, now: i64) -> Result<Report, Error> {
    pass(db, storage, policy, now, true, PROGRESS_EVERY, &mut log_progress).await
}

/// `collect`, telling `on_progress` where it stands after a batch whenever `every` has passed
/// since it last did (after every batch with `Duration::ZERO`).
pub async fn collect_with(
    db: &Db,
    storage: &Storage,
    policy: &Policy,
    now: i64,
    every: Duration,
    on_progress: &mut (dyn FnMut(&Progress<'_>) + Send),
) -> Result<Report, Error> {
    pass(db, storage, policy, now, false, every, on_progress).await
}

fn log_progress(progress: &Progress<'_>) {
    tracing::info!(
        jobs.deleted = progress.report.jobs,
        jobs.expected = progress.expected,
        "retention pass: {progress}"
    );
}

async fn pass(
    db: &Db,
    storage: &Storage,
    policy: &Policy,
    now: i64,
    dry_run: bool,
    every: Duration,
    on_progress: &mut (dyn FnMut(&Progress<'_>) + Send),
) -> Result<Report, Error> {
    let cutoff = policy.cutoff(now);
    let limit = policy.batch_size.max(1);
    let mut report = Report::new(dry_run, cutoff);
    let expected = db::retention::count_expired(db, cutoff).await.map_err(|source| Error::CountJobs { source })?;
    let started = Instant::now();
    let mut told = started;
    let mut batches = 0;
    let mut cursor = Cursor::start();
    loop {
        let batch = db::retention::expired(db, cutoff, &cursor, limit as i64)
            .await
            .map_err(|source| Error::ListJobs { source })?;
        let Some(last) = batch.last() else { break };
        cursor = Cursor::after(last);
        let batch_started = Instant::now();
        if dry_run {
            survey_batch(db, storage, &batch, &mut report).await?;
        } else {
            delete_batch(db, storage, &batch, cutoff, &mut report).await?;
        }
        let took = batch_started.elapsed();
        batches += 1;
        if batch.len() < limit {
            break;
        }
        if told.elapsed() >= every {
            told = Instant::now();
            on_progress(&Progress { report: &report, expected, batches, elapsed: started.elapsed() });
        }
        tokio::time::sleep(pause_after(policy.pause, took)).await;
    }
    Ok(report)
}

async fn survey_batch(db: &Db, storage: &Storage, batch: &[ExpiredJobRow], report: &mut Report) -> Result<(), Error> {
    let ids: Vec<String> = batch.iter().map(|job| job.id.clone()).collect();
    let dependents = db::retention::dependents(db, &ids).await.map_err(|source| Error::CountDependents { source })?;
    let mut objects = 0;
    for chunk in batch.chunks(OBJECT_CONCURRENCY) {
        let listings = chunk.iter().map(|job| {
            let folder = keys::job_objects(&job.id);
            async move { storage.list_tree(&folder).await }
        });
        for (job, listing) in chunk.iter().zip(futures::future::join_all(listings).await) {
            let listing = listing.map_err(|source| Error::ListObjects { job_id: job.id.clone(), source })?;
            objects += listing.len() as u64;
        }
    }
    report.jobs += batch.len() as u64;
    report.events += dependents.events;
    report.runtime_jobs += dependents.runtime_jobs;
    report.objects += objects;
    report.add_jobs(&batch.iter().collect::<Vec<_>>());
    Ok(())
}

async fn delete_batch(
    db: &Db,
    storage: &Storage,
    batch: &[ExpiredJobRow],
    cutoff: i64,
    report: &mut Report,
) -> Result<(), Error> {
    let mut outcomes = Vec::with_capacity(batch.len());
    for chunk in batch.chunks(OBJECT_CONCURRENCY) {
        let deletions = chunk.iter().map(|job| {
            let folder = keys::job_objects(&job.id);
            async move { storage.delete_tree(&folder).await }
        });
        outcomes.extend(chunk.iter().zip(futures::future::join_all(deletions).await));
    }
    let mut cleared = Vec::new();
    let mut failure = None;
    for (job, outcome) in outcomes {
        match outcome {
            Ok(objects) => {
                report.objects += objects;
                cleared.push(job);
            }
            Err(error) => {
                tracing::warn!(
                    job.id = %job.id,
                    error = &error as &dyn std::error::Error,
                    "retention: failed to delete a finished job's objects; the job is kept until a later pass"
                );
                report.kept += 1;
                failure.get_or_insert((job.id.clone(), error));
            }
        }
    }
    if cleared.is_empty()
        && let Some((job_id, source)) = failure
    {
        // Nothing of the batch could go: the storage is most likely down, so stop the pass.
        return Err(Error::DeleteObjects { job_id, source });
    }
    let ids: Vec<String> = cleared.iter().map(|job| job.id.clone()).collect();
    let deleted = db::retention::delete(db, &ids, cutoff).await.map_err(|source| Error::DeleteJobs { source })?;
    report.jobs += deleted.jobs;
    report.events += deleted.events;
    report.runtime_jobs += deleted.runtime_jobs;
    report.add_jobs(&cleared);
    Ok(())
}

/// The pause after a batch that took `took`: at least `shortest`, and as long as the batch.
fn pause_after(shortest: Duration, took: Duration) -> Duration {
    shortest.max(took)
}

/// Time between two prunings of the queue's spent hours.
pub const PRUNE_QUEUE_EVERY: Duration = Duration::from_secs(600);

/// Prunes the queue's spent hours now and then every `every`, for as long as the process runs;
/// failures are logged and the next pass tries again.
pub async fn prune_queue_periodically(db: Db, every: Duration) {
    loop {
        match db::queue::prune_spent_blocks(&db, db::now_micros()).await {
            Ok(rows) => tracing::debug!(rows, "queue's spent hours pruned"),
            Err(error) => tracing::warn!(
                error = &error as &dyn std::error::Error,
                "pruning the queue's spent hours failed; the next pass tries again"
            ),
        }
        tokio::time::sleep(every).await;
    }
}

/// A pass now and then every `every`, for as long as the process runs; failures are logged and
/// the next pass tries again.
pub async fn run_periodically(db: Db, storage: Storage, policy: Policy, every: Duration) {
    loop {
        match collect(&db, &storage, &policy, db::now_micros()).await {
            Ok(report) if report.jobs > 0 || report.kept > 0 => tracing::info!(
                jobs.deleted = report.jobs,
                events.deleted = report.events,
                objects.deleted = report.objects,
                jobs.kept = report.kept,
                "retention pass: {report}"
            ),
            Ok(_) => tracing::debug!("retention pass: nothing to delete"),
            Err(error) => tracing::warn!(
                error = &error as &dyn std::error::Error,
                "retention pass failed; the next pass tries again"
            ),
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY_MICROS: i64 = 86_400_000_000;

    #[test]
    fn days_are_non_negative_numbers_and_retention_needs_more_than_zero() {
        assert_eq!(parse_days("30").unwrap(), Duration::from_secs(30 * 86_400));
        assert_eq!(parse_days("0.5").unwrap(), Duration::from_secs(43_200));
        assert_eq!(parse_days(" 0 ").unwrap(), Duration::ZERO);
        for bad in ["-1", "soon", "", "inf", "NaN", "1e300"] {
            assert!(parse_days(bad).is_err(), "{bad}");
        }
        assert!(parse_retention_days("0").is_err());
        assert_eq!(parse_retention_days("7").unwrap(), Duration::from_secs(7 * 86_400));
    }

    #[test]
    fn the_cutoff_is_that_many_days_before_now() {
        let policy = Policy::new(Duration::from_secs(2 * 86_400));
        assert_eq!(policy.cutoff(5 * DAY_MICROS), 3 * DAY_MICROS);
        assert_eq!(Policy::new(Duration::ZERO).cutoff(42), 42);
        assert_eq!(Policy::new(Duration::MAX).cutoff(0), -i64::MAX);
    }

    #[test]
    fn reports_say_what_went_and_from_when() {
        let mut report = Report::new(true, 0);
        assert_eq!(
            report.to_string(),
            "no finished job was last updated before 1970-01-01T00:00:00.000000Z: nothing to delete"
        );
        let old = ExpiredJobRow { id: "a".into(), updated: 1_000_000 };
        let newer = ExpiredJobRow { id: "b".into(), updated: 2_000_000 };
        let newest = ExpiredJobRow { id: "c".into(), updated: 3_000_000 };
        report.add_jobs(&[&old, &newer]);
        report.add_jobs(&[&newest]);
        (report.jobs, report.events, report.objects) = (3, 7, 5);
        assert_eq!(
            report.to_string(),
            "would delete 3 finished job(s) last updated before 1970-01-01T00:00:00.000000Z, with 7 event(s), \
             0 runtime job(s) and 5 object(s)\n\
             oldest: job a, last updated 1970-01-01T00:00:01.000000Z\n\
             newest: job c, last updated 1970-01-01T00:00:03.000000Z"
        );
        report.dry_run = false;
        report.kept = 1;
        let text = report.to_string();
        assert!(text.starts_with("deleted 3 finished job(s)"), "{text}");
        assert!(
            text.ends_with("kept 1 job(s) whose objects could not be deleted (see the log); the next pass tries again")
        );
    }

    #[test]
    fn a_pass_pauses_at_least_as_long_as_its_last_batch_took() {
        let ms = Duration::from_millis;
        assert_eq!(pause_after(ms(20), ms(5)), ms(20));
        assert_eq!(pause_after(ms(20), ms(70)), ms(70));
        assert_eq!(pause_after(Duration::ZERO, ms(3)), ms(3));
    }

    #[test]
    fn ages_read_in_days_or_hours() {
        assert_eq!(describe_age(Duration::from_secs(30 * 86_400)), "30 days");
        assert_eq!(describe_age(Duration::from_secs(36 * 3600)), "1.5 days");
        assert_eq!(describe_age(Duration::from_secs(12 * 3600)), "12 hours");
    }
}
