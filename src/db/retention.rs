//! Finished jobs past their retention (see `crate::retention`, which also deletes their objects):
//! which jobs have expired, what belongs to them, and their deletion with the kept counts
//! (`db::counts`) taken off in the same transaction. Only finished jobs
//! (SUCCEEDED, FAILED, STOPPED) are ever selected or deleted; a finished job never moves again.
//! `event_outbox` rows are left alone: the publisher prunes them, and they have no foreign key.

use super::counts::{self, Changes, Counted};
use super::params::{bind_params, placeholders};
use super::{Db, Error, on_db, query_error};
use crate::domain::lifecycle::JobStatus;

/// The status filter of every query here, word for word the predicate of the partial index
/// `jobs_finished_updated_idx` (SQLite uses a partial index only when the texts match).
macro_rules! finished {
    () => {
        "status IN ('SUCCEEDED', 'FAILED', 'STOPPED')"
    };
}

/// A finished job whose last update is older than the cutoff.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ExpiredJobRow {
    pub id: String,
    /// Its last update (microseconds since the Unix epoch).
    pub updated: i64,
}

/// Where a walk through the expired jobs resumes: after this (updated, id), in that order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub updated: i64,
    pub id: String,
}

impl Cursor {
    /// Before every job.
    pub fn start() -> Cursor {
        Cursor { updated: i64::MIN, id: String::new() }
    }

    /// Just after `job`.
    pub fn after(job: &ExpiredJobRow) -> Cursor {
        Cursor { updated: job.updated, id: job.id.clone() }
    }
}

/// Up to `limit` finished jobs last updated before `cutoff`, after `cursor`, oldest first.
pub async fn expired(db: &Db, cutoff: i64, cursor: &Cursor, limit: i64) -> Result<Vec<ExpiredJobRow>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, ExpiredJobRow>(concat!(
        "SELECT id, updated FROM jobs WHERE ", finished!(), " AND updated < $1 \
         AND updated >= $2 AND (updated > $2 OR id > $3) ORDER BY updated, id LIMIT $4"))
        .bind(cutoff)
        .bind(cursor.updated)
        .bind(&cursor.id)
        .bind(limit)
        .fetch_all(pool)
        .await)
    .map_err(query_error("list expired jobs"))
}

/// How many finished jobs were last updated before `cutoff` (read from the partial index
/// `jobs_finished_updated_idx` alone): what a pass has before it.
pub async fn count_expired(db: &Db, cutoff: i64) -> Result<u64, Error> {
    let n: i64 = on_db!(db, pool => sqlx::query_scalar(concat!(
        "SELECT COUNT(*) FROM jobs WHERE ", finished!(), " AND updated < $1"))
        .bind(cutoff)
        .fetch_one(pool)
        .await)
    .map_err(query_error("count expired jobs"))?;
    Ok(n.max(0) as u64)
}

/// Rows that go with a set of jobs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Dependents {
    pub events: u64,
    pub runtime_jobs: u64,
}

/// How many events and runtime jobs belong to `ids` (what a deletion would take with them).
pub async fn dependents(db: &Db, ids: &[String]) -> Result<Dependents, Error> {
    if ids.is_empty() {
        return Ok(Dependents::default());
    }
    let list = placeholders(1, ids.len());
    let sql = format!(
        "SELECT (SELECT COUNT(*) FROM job_events WHERE job_id IN ({list})), \
         (SELECT COUNT(*) FROM runtime_jobs WHERE job_id IN ({list}))"
    );
    let (events, runtime_jobs) = on_db!(db, pool => {
        let mut query = sqlx::query_as::<_, (i64, i64)>(&sql);
        for id in ids {
            query = query.bind(id);
        }
        query.fetch_one(pool).await
    })
    .map_err(query_error("count expired jobs' events"))?;
    Ok(Dependents { events: events.max(0) as u64, runtime_jobs: runtime_jobs.max(0) as u64 })
}

/// The PostgreSQL advisory lock key of deletions ("gantryrt").
const DELETE_LOCK_KEY: i64 = 0x6761_6e74_7279_7274;

/// What one deletion removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Deleted {
    pub jobs: u64,
    pub events: u64,
    pub runtime_jobs: u64,
}

/// Deletes the jobs of `ids` that are finished and were last updated before `cutoff`, with
/// their events and runtime jobs, and takes them off the kept counts (dropping count rows that
/// reach zero), all in one transaction. Jobs already gone are skipped, so two passes racing
/// over the same jobs count each deletion once.
pub async fn delete(db: &Db, ids: &[String], cutoff: i64) -> Result<Deleted, Error> {
    if ids.is_empty() {
        return Ok(Deleted::default());
    }
    let (db, ids) = (db.clone(), ids.to_vec());
    super::detached(async move { delete_attached(&db, &ids, cutoff).await }).await
}

async fn delete_attached(db: &Db, ids: &[String], cutoff: i64) -> Result<Deleted, Error> {
    // `$1` is the cutoff, `$2…` the ids.
    let list = placeholders(2, ids.len());
    let chosen = format!("SELECT id FROM jobs WHERE {} AND updated < $1 AND id IN ({list})", finished!());
    let delete_events = format!("DELETE FROM job_events WHERE job_id IN ({chosen})");
    let delete_runtime_jobs = format!("DELETE FROM runtime_jobs WHERE job_id IN ({chosen})");
    let delete_jobs = format!(
        "DELETE FROM jobs WHERE {} AND updated < $1 AND id IN ({list}) \
         RETURNING author_id, COALESCE(program_id, ''), status, created, provider_id",
        finished!()
    );
    // SQLite: take the write lock at once, so another process's writer cannot force this one to
    // give up half-way (the deletes read before they write). PostgreSQL: deletions of two passes
    // (two gateway replicas) go one after the other, so they cannot deadlock on the rows they
    // share; the second finds the first's jobs gone.
    let (begin, serialize) = match db {
        Db::Postgres(_) => ("BEGIN", "SELECT pg_advisory_xact_lock($1)"),
        Db::Sqlite(..) => ("BEGIN IMMEDIATE", "SELECT $1"),
    };
    let _writer = db.write_lock().await;
    on_db!(db, pool => async {
        let mut tx = pool.begin_with(begin).await?;
        sqlx::query(serialize).bind(DELETE_LOCK_KEY).execute(&mut *tx).await?;
        let mut deleted = Deleted::default();
        for (sql, counter) in [(&delete_events, &mut deleted.events), (&delete_runtime_jobs, &mut deleted.runtime_jobs)] {
            let mut query = sqlx::query(sql).bind(cutoff);
            for id in ids {
                query = query.bind(id);
            }
            *counter = query.execute(&mut *tx).await?.rows_affected();
        }
        let mut query = sqlx::query_as::<_, (String, String, String, i64, Option<String>)>(&delete_jobs).bind(cutoff);
        for id in ids {
            query = query.bind(id);
        }
        let returned = query.fetch_all(&mut *tx).await?;
        deleted.jobs = returned.len() as u64;
        // Their kept counts taken off; rows by user and by day that reach zero go with them.
        let mut changes = Changes::default();
        for (author_id, program_id, status, created, provider_id) in &returned {
            // Only finished jobs are deleted (the statement's own filter).
            let status: JobStatus = status.parse().unwrap_or(JobStatus::Failed);
            let job = Counted { author_id, program_id, created: *created, gpu: false, provider_id: provider_id.as_deref() };
            changes.add(&job, status, -1);
        }
        for (sql, params) in changes.statements(counts::shard(), true) {
            bind_params!(sqlx::query(&sql), &params).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(deleted)
    }.await)
    .map_err(query_error("delete expired jobs"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_resumes_after_its_job() {
        let job = ExpiredJobRow { id: "j".into(), updated: 7 };
        assert_eq!(Cursor::after(&job), Cursor { updated: 7, id: "j".into() });
        assert!(Cursor::start().updated < 0 && Cursor::start().id.is_empty());
    }
}
