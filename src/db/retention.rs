//! Finished jobs past their retention (see `crate::retention`, which also deletes their objects):
//! which jobs have expired, what belongs to them, and their deletion with the kept counts
//! (`job_counts`, `job_counts_by_day`) adjusted in the same transaction. Only finished jobs
//! (SUCCEEDED, FAILED, STOPPED) are ever selected or deleted; a finished job never moves again.
//! `event_outbox` rows are left alone: the publisher prunes them, and they have no foreign key.

use std::collections::BTreeMap;

use super::jobs::{Param, bind_params, day_of};
use super::{Db, Error, on_db, query_error};

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

/// `$first, $first+1, …` for `n` values.
fn placeholders(first: usize, n: usize) -> String {
    (first..first + n).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
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

/// The kept counts to take off for deleted jobs given as (author, program or '', status,
/// created): per (status, author, program, creation day) for `job_counts_by_day`, and per
/// (status, author, program) for `job_counts` (day 0), each sorted in that order, which is the
/// order status moves lock the counter rows in (see `jobs::apply_moves`), so the two never
/// deadlock on PostgreSQL. One entry per counter row, so one statement can take them all off.
type Decrements = Vec<((String, String, String, i64), i64)>;

fn count_decrements(deleted: &[(String, String, String, i64)]) -> (Decrements, Decrements) {
    let mut by_day: BTreeMap<(String, String, String, i64), i64> = BTreeMap::new();
    let mut total: BTreeMap<(String, String, String, i64), i64> = BTreeMap::new();
    for (author_id, program_id, status, created) in deleted {
        *by_day.entry((status.clone(), author_id.clone(), program_id.clone(), day_of(*created))).or_default() += 1;
        *total.entry((status.clone(), author_id.clone(), program_id.clone(), 0)).or_default() += 1;
    }
    (total.into_iter().collect(), by_day.into_iter().collect())
}

/// The statements taking `decrements` off one counter table and deleting its rows that reach
/// zero, with their parameters: a multi-row upsert and a delete of those rows (each one
/// statement whatever the batch, so the transaction holds the counter rows for as long as two
/// statements take, not two per row).
fn decrement_statements(by_day: bool, decrements: &Decrements) -> [(String, Vec<Param>); 2] {
    let (table, key) = match by_day {
        true => ("job_counts_by_day", "author_id, program_id, status, day"),
        false => ("job_counts", "author_id, program_id, status"),
    };
    let width = if by_day { 5 } else { 4 };
    let (mut upsert_values, mut upsert_params) = (Vec::new(), Vec::new());
    let (mut key_values, mut key_params) = (Vec::new(), Vec::new());
    for (i, ((status, author_id, program_id, day), n)) in decrements.iter().enumerate() {
        upsert_values.push(format!("({})", placeholders(1 + i * width, width)));
        key_values.push(format!("({})", placeholders(1 + i * (width - 1), width - 1)));
        let mut row =
            vec![Param::Text(author_id.clone()), Param::Text(program_id.clone()), Param::Text(status.clone())];
        if by_day {
            row.push(Param::Int(*day));
        }
        key_params.extend(row.iter().cloned());
        upsert_params.extend(row);
        upsert_params.push(Param::Int(-n));
    }
    let upsert = format!(
        "INSERT INTO {table} ({key}, n) VALUES {} ON CONFLICT ({key}) DO UPDATE SET n = {table}.n + excluded.n",
        upsert_values.join(", ")
    );
    let delete = format!("DELETE FROM {table} WHERE n = 0 AND ({key}) IN (VALUES {})", key_values.join(", "));
    [(upsert, upsert_params), (delete, key_params)]
}

/// The statement taking deleted jobs off the providers' counts (`(status, provider)` to the
/// number deleted), in row `shard` of each, with its parameters.
fn provider_decrements(providers: &BTreeMap<(String, String), i64>, shard: i64) -> (String, Vec<Param>) {
    let mut values = Vec::new();
    let mut params = Vec::new();
    for (i, ((status, provider_id), n)) in providers.iter().enumerate() {
        values.push(format!("({})", placeholders(1 + i * 4, 4)));
        params.extend([
            Param::Text(provider_id.clone()),
            Param::Text(status.clone()),
            Param::Int(shard),
            Param::Int(-n),
        ]);
    }
    let sql = format!(
        "INSERT INTO job_provider_counts (provider_id, status, shard, n) VALUES {} \
         ON CONFLICT (provider_id, status, shard) DO UPDATE SET n = job_provider_counts.n + excluded.n",
        values.join(", ")
    );
    (sql, params)
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
        let mut providers: BTreeMap<(String, String), i64> = BTreeMap::new();
        let mut rows = Vec::with_capacity(returned.len());
        for (author_id, program_id, status, created, provider_id) in returned {
            if let Some(provider_id) = provider_id {
                *providers.entry((status.clone(), provider_id)).or_default() += 1;
            }
            rows.push((author_id, program_id, status, created));
        }
        let (total, by_day) = count_decrements(&rows);
        for (by_day, decrements) in [(false, &total), (true, &by_day)] {
            if decrements.is_empty() {
                continue;
            }
            for (sql, params) in decrement_statements(by_day, decrements) {
                bind_params!(sqlx::query(&sql), &params).execute(&mut *tx).await?;
            }
        }
        // The providers' counts after them, in (status, provider) order, one upsert (a few rows
        // per provider whatever its history: rows at zero stay).
        if !providers.is_empty() {
            let (sql, params) = provider_decrements(&providers, super::counts::slot_shard());
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

    const DAY: i64 = 86_400_000_000;

    #[test]
    fn placeholders_number_from_the_first() {
        assert_eq!(placeholders(2, 3), "$2, $3, $4");
        assert_eq!(placeholders(1, 1), "$1");
    }

    #[test]
    fn decrements_group_by_status_author_program_and_day_in_lock_order() {
        let row = |author: &str, program: &str, status: &str, created: i64| {
            (author.to_string(), program.to_string(), status.to_string(), created)
        };
        let deleted = [
            row("bob", "p1", "SUCCEEDED", 3 * DAY + 5),
            row("alice", "p1", "SUCCEEDED", 3 * DAY),
            row("alice", "p1", "SUCCEEDED", 4 * DAY - 1),
            row("alice", "", "FAILED", 10 * DAY),
            row("alice", "p1", "SUCCEEDED", 4 * DAY),
        ];
        let key = |status: &str, author: &str, program: &str, day: i64| {
            (status.to_string(), author.to_string(), program.to_string(), day)
        };
        let (total, by_day) = count_decrements(&deleted);
        assert_eq!(
            by_day,
            vec![
                (key("FAILED", "alice", "", 10), 1),
                (key("SUCCEEDED", "alice", "p1", 3), 2),
                (key("SUCCEEDED", "alice", "p1", 4), 1),
                (key("SUCCEEDED", "bob", "p1", 3), 1),
            ]
        );
        assert_eq!(
            total,
            vec![
                (key("FAILED", "alice", "", 0), 1),
                (key("SUCCEEDED", "alice", "p1", 0), 3),
                (key("SUCCEEDED", "bob", "p1", 0), 1),
            ]
        );
    }

    #[test]
    fn decrements_are_one_upsert_and_one_delete_per_table() {
        let key = |status: &str, author: &str, day: i64| (status.to_string(), author.to_string(), "p".to_string(), day);
        let decrements = vec![(key("FAILED", "a", 3), 2), (key("SUCCEEDED", "b", 4), 1)];
        let [(upsert, upsert_params), (delete, delete_params)] = decrement_statements(true, &decrements);
        assert_eq!(
            upsert,
            "INSERT INTO job_counts_by_day (author_id, program_id, status, day, n) VALUES ($1, $2, $3, $4, $5), \
             ($6, $7, $8, $9, $10) ON CONFLICT (author_id, program_id, status, day) DO UPDATE SET n = job_counts_by_day.n + excluded.n"
        );
        assert_eq!(upsert_params.len(), 10);
        assert!(matches!(upsert_params[4], Param::Int(-2)) && matches!(upsert_params[9], Param::Int(-1)));
        assert_eq!(
            delete,
            "DELETE FROM job_counts_by_day WHERE n = 0 AND (author_id, program_id, status, day) IN (VALUES ($1, $2, $3, $4), ($5, $6, $7, $8))"
        );
        assert_eq!(delete_params.len(), 8);
        let [(upsert, params), _] = decrement_statements(false, &decrements);
        assert!(
            upsert
                .starts_with("INSERT INTO job_counts (author_id, program_id, status, n) VALUES ($1, $2, $3, $4), ($5")
        );
        assert_eq!(params.len(), 8);
    }

    #[test]
    fn a_cursor_resumes_after_its_job() {
        let job = ExpiredJobRow { id: "j".into(), updated: 7 };
        assert_eq!(Cursor::after(&job), Cursor { updated: 7, id: "j".into() });
        assert!(Cursor::start().updated < 0 && Cursor::start().id.is_empty());
    }
}
