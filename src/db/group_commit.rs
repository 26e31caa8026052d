//! Group commit on SQLite: SQLite has one writer, so writes queue for this process's write lock;
//! whoever takes the lock writes every write then waiting in one transaction and one commit,
//! and answers each of them once that commit is done. Each request's effects are still all or
//! nothing and durable as documented (its answer follows the commit that holds them): if any
//! write of a batch fails, or the commit does, the batch is rolled back and each write runs
//! again alone, in its own transaction, and gets its own outcome. A batch shares the commit's
//! cost (the transaction's two round trips, the write-ahead log's pages that several writes
//! change, such as the indexes' last pages) and the lock's hand-over, and adds to each kept
//! count's row once (`counts::Changes`): every statement is a hand-over to the connection's own thread,
//! which is the one thread all writes go through. Used by `run` (`jobs::create`), the write
//! many clients make at once.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::future::BoxFuture;
use sqlx::{SqliteConnection, SqlitePool};
use tokio::sync::oneshot;

use super::counts::{self, Changes};
use super::params::bind_params;

/// At most this many writes share one transaction: a bound on how long the writes at the
/// batch's end wait for those at its start, and on the transaction's size.
const MAX_BATCH: usize = 64;

/// One request's write, queued for the group commit.
pub(crate) trait Batched: Send {
    /// Writes this request's statements on `connection`, inside a transaction opened and
    /// committed by the group commit, and adds what it adds to kept counts to `counts`, which
    /// the batch writes once per row before it commits. Called again, in a transaction of its
    /// own, when the batch it was part of failed: it must write from scratch each time.
    fn write<'c>(
        &'c mut self,
        connection: &'c mut SqliteConnection,
        counts: &'c mut Changes,
    ) -> BoxFuture<'c, Result<(), sqlx::Error>>;
    /// Hands the outcome to the request that queued this write, once it is committed, or once
    /// writing it alone failed.
    fn answer(self: Box<Self>, outcome: Result<(), sqlx::Error>);
}

/// Writes the kept counts' changes of a batch, one upsert a table.
async fn write_counts(changes: &Changes, connection: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    for (sql, params) in changes.statements(counts::shard(), false) {
        bind_params!(sqlx::query(&sql), &params).execute(&mut *connection).await?;
    }
    Ok(())
}

/// SQLite's single writer in this process: the lock every write transaction takes (waiting here
/// in order is fairer and quicker than SQLite's sleeping busy handler) and the writes waiting
/// to be committed together.
#[derive(Default)]
pub struct SqliteWriter {
    lock: Arc<tokio::sync::Mutex<()>>,
    /// Each write with the time it was queued.
    waiting: Mutex<Vec<(Instant, Box<dyn Batched>)>>,
}

impl std::fmt::Debug for SqliteWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteWriter").finish_non_exhaustive()
    }
}

impl SqliteWriter {
    /// Takes the write lock, for a write transaction outside the group commit; the wait is
    /// counted in `telemetry::db_waits`.
    pub(crate) async fn lock(&self) -> tokio::sync::OwnedMutexGuard<()> {
        let began = Instant::now();
        let guard = Arc::clone(&self.lock).lock_owned().await;
        crate::telemetry::db_waits::WAITS.write_lock.observe(began.elapsed().as_secs_f64());
        guard
    }

    /// Queues `write` and waits until it is committed (or has failed), writing the waiting
    /// batch itself when it takes the lock first. `answer` is the receiving end of what
    /// `write.answer` sends.
    pub(crate) async fn submit<T>(
        &self,
        pool: &SqlitePool,
        write: Box<dyn Batched>,
        mut answer: oneshot::Receiver<Result<T, sqlx::Error>>,
    ) -> Result<T, sqlx::Error> {
        self.waiting.lock().expect("the waiting writes' lock is never poisoned").push((Instant::now(), write));
        loop {
            tokio::select! {
                biased;
                answered = &mut answer => {
                    // A dropped sender means the task writing its batch panicked.
                    return answered.unwrap_or(Err(sqlx::Error::WorkerCrashed));
                }
                guard = Arc::clone(&self.lock).lock_owned() => {
                    let batch: Vec<Box<dyn Batched>> = {
                        let mut waiting = self.waiting.lock().expect("the waiting writes' lock is never poisoned");
                        let taken = waiting.len().min(MAX_BATCH);
                        let waits = &crate::telemetry::db_waits::WAITS;
                        waiting
                            .drain(..taken)
                            .map(|(queued, write)| {
                                waits.write_lock.observe(queued.elapsed().as_secs_f64());
                                write
                            })
                            .collect()
                    };
                    if !batch.is_empty() {
                        crate::telemetry::db_waits::WAITS.batch_size.observe(batch.len() as f64);
                        write_batch(pool, batch).await;
                    }
                    drop(guard);
                    // This write was in the batch just written (its answer is ready), in one
                    // written before, or is still waiting behind a full batch: look again.
                }
            }
        }
    }
}

/// Writes `batch` in one transaction; if anything fails, rolls it back and writes each alone.
async fn write_batch(pool: &SqlitePool, mut batch: Vec<Box<dyn Batched>>) {
    let together = async {
        // `BEGIN IMMEDIATE` takes SQLite's write lock up front, so every read in the batch
        // (the active-job limit's count) sees the state it then writes on.
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
        let mut counts = Changes::default();
        for write in batch.iter_mut() {
            write.write(&mut tx, &mut counts).await?;
        }
        write_counts(&counts, &mut tx).await?;
        tx.commit().await
    }
    .await;
    match together {
        Ok(()) => batch.into_iter().for_each(|write| write.answer(Ok(()))),
        Err(error) if batch.len() == 1 => {
            if let Some(write) = batch.pop() {
                write.answer(Err(error));
            }
        }
        Err(error) => {
            tracing::debug!(error = %error, writes = batch.len(), "a batched write failed; writing each alone");
            for mut write in batch {
                let outcome = alone(pool, write.as_mut()).await;
                write.answer(outcome);
            }
        }
    }
}

async fn alone(pool: &SqlitePool, write: &mut dyn Batched) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    let mut counts = Changes::default();
    write.write(&mut tx, &mut counts).await?;
    write_counts(&counts, &mut tx).await?;
    tx.commit().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::counts::Counted;
    use crate::domain::lifecycle::JobStatus;

    /// Writes `value` into table `t`; with `fail`, a statement that cannot run.
    struct Insert {
        value: i64,
        fail: bool,
        answer: oneshot::Sender<Result<i64, sqlx::Error>>,
    }

    impl Batched for Insert {
        fn write<'c>(
            &'c mut self,
            connection: &'c mut SqliteConnection,
            counts: &'c mut Changes,
        ) -> BoxFuture<'c, Result<(), sqlx::Error>> {
            Box::pin(async move {
                sqlx::query("INSERT INTO t (value) VALUES (?)").bind(self.value).execute(&mut *connection).await?;
                let job = Counted { author_id: "all", program_id: "p", created: 0, gpu: false, provider_id: None };
                counts.add(&job, JobStatus::Queued, self.value);
                if self.fail {
                    sqlx::query("INSERT INTO missing_table VALUES (1)").execute(&mut *connection).await?;
                }
                Ok(())
            })
        }

        fn answer(self: Box<Self>, outcome: Result<(), sqlx::Error>) {
            let _ = self.answer.send(outcome.map(|()| self.value));
        }
    }

    /// A database file of its own (an in-memory one would be one database per connection).
    async fn pool() -> (tempfile::TempDir, SqlitePool) {
        let folder = tempfile::tempdir().unwrap();
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(folder.path().join("t.db"))
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal);
        let pool = SqlitePool::connect_with(options).await.unwrap();
        sqlx::query("CREATE TABLE t (value INTEGER NOT NULL)").execute(&pool).await.unwrap();
        // The kept counts a queued job of no provider changes (as the migrations make them).
        for table in [
            "job_counts (author_id TEXT, program_id TEXT, status TEXT, n INTEGER NOT NULL, PRIMARY KEY (author_id, program_id, status))",
            "job_counts_by_day (author_id TEXT, program_id TEXT, status TEXT, day INTEGER, n INTEGER NOT NULL, \
             PRIMARY KEY (author_id, program_id, status, day))",
            "job_queue_counts (block INTEGER, shard INTEGER, n INTEGER NOT NULL, PRIMARY KEY (block, shard))",
        ] {
            sqlx::query(&format!("CREATE TABLE {table}")).execute(&pool).await.unwrap();
        }
        (folder, pool)
    }

    /// Queues `values` while the write lock is held, so that they wait together, then lets them go.
    async fn queued_together(pool: &SqlitePool, values: &[(i64, bool)]) -> Vec<Result<i64, sqlx::Error>> {
        let writer = Arc::new(SqliteWriter::default());
        let held = writer.lock().await;
        let mut tasks = Vec::new();
        for &(value, fail) in values {
            let (writer, pool) = (Arc::clone(&writer), pool.clone());
            tasks.push(tokio::spawn(async move {
                let (answer, answered) = oneshot::channel();
                writer.submit(&pool, Box::new(Insert { value, fail, answer }), answered).await
            }));
        }
        while writer.waiting.lock().unwrap().len() < values.len() {
            tokio::task::yield_now().await;
        }
        drop(held);
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.unwrap());
        }
        outcomes
    }

    /// The values written, and the kept total of them (the sum the writes' counts added).
    async fn stored(pool: &SqlitePool) -> Vec<i64> {
        let values: Vec<i64> = sqlx::query_scalar("SELECT value FROM t ORDER BY value").fetch_all(pool).await.unwrap();
        let total: Option<i64> =
            sqlx::query_scalar("SELECT n FROM job_counts WHERE author_id = 'all'").fetch_optional(pool).await.unwrap();
        assert_eq!(total.unwrap_or(0), values.iter().sum::<i64>(), "the kept total matches the rows");
        values
    }

    #[tokio::test]
    async fn writes_waiting_together_are_all_committed_and_answered() {
        let (_folder, pool) = pool().await;
        let values: Vec<(i64, bool)> = (1..=100).map(|value| (value, false)).collect();
        let outcomes = queued_together(&pool, &values).await;
        assert_eq!(outcomes.into_iter().map(Result::unwrap).collect::<Vec<_>>(), (1..=100).collect::<Vec<_>>());
        // More than one batch (at most MAX_BATCH a transaction), every write once.
        assert_eq!(stored(&pool).await, (1..=100).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_failing_write_fails_alone_and_the_others_of_its_batch_stand() {
        let (_folder, pool) = pool().await;
        let outcomes = queued_together(&pool, &[(1, false), (2, false), (3, true), (4, false)]).await;
        let failed: Vec<bool> = outcomes.iter().map(Result::is_err).collect();
        assert_eq!(failed, [false, false, true, false]);
        let message = outcomes[2].as_ref().unwrap_err().to_string();
        assert!(message.contains("no such table: missing_table"), "{message}");
        // The failed write's first statement was rolled back with it; nothing written twice.
        assert_eq!(stored(&pool).await, vec![1, 2, 4]);
    }

    #[tokio::test]
    async fn a_write_alone_that_fails_gets_its_own_error() {
        let (_folder, pool) = pool().await;
        let outcomes = queued_together(&pool, &[(7, true)]).await;
        assert!(outcomes[0].as_ref().unwrap_err().to_string().contains("missing_table"));
        assert_eq!(stored(&pool).await, Vec::<i64>::new());
    }
}
