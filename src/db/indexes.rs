//! Indexes that migrations add to tables which may already hold millions of rows. A plain
//! `CREATE INDEX` (what a migration runs, inside its transaction) blocks every write to its table
//! until the index is built: tens of seconds to minutes at 10 million jobs, during which `run`
//! and every status move would wait. On PostgreSQL, `Db::migrate` therefore builds each index
//! listed here first, with `CREATE INDEX CONCURRENTLY` (writes go on while it builds; it cannot
//! run inside a transaction, hence not in the migration file, which sqlx runs in one), and the
//! migration's own `CREATE INDEX IF NOT EXISTS` then finds it built. SQLite builds it in the
//! migration: one writer at a time is SQLite's way anyway, and its databases are small.
//!
//! A concurrent build that was interrupted leaves an invalid index behind; it is dropped and
//! built again at the next start. Gateway replicas starting together build one after the other
//! (a session advisory lock), so the second finds the first's index valid.

use sqlx::postgres::PgPool;

/// An index a migration adds, built concurrently on PostgreSQL before the migrations run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BigIndex {
    pub name: &'static str,
    pub table: &'static str,
    /// What follows `ON <table>`, word for word as in the migration.
    pub columns: &'static str,
    /// The version of the migration that adds it.
    pub migration: i64,
}

impl BigIndex {
    /// Whether `build_concurrently` builds this index when it is missing, given the versions of
    /// the migrations applied: only while the migration that adds it is pending (once applied,
    /// a missing index is one a later migration dropped). An index a pending later migration
    /// drops is still built concurrently first: its own migration would otherwise build it
    /// while holding writes.
    pub fn wanted(&self, applied: &[i64]) -> bool {
        !applied.contains(&self.migration)
    }
}

/// Every such index, in the order of the migrations that add them.
pub const BIG_INDEXES: &[BigIndex] = &[
    // 0014: a user's counts by status and day (`created_after` listings' counts).
    BigIndex {
        name: "job_counts_by_day_author_status_idx",
        table: "job_counts_by_day",
        columns: "(author_id, status, day)",
        migration: 14,
    },
    // 0018: functions' counts with `n`, so a provider's count reads the index alone (0022
    // drops it again).
    BigIndex {
        name: "job_counts_program_n_idx",
        table: "job_counts",
        columns: "(program_id, status, n)",
        migration: 18,
    },
    // 0019: a user's unfinished jobs in creation order (`jobs/queue/`).
    BigIndex {
        name: "jobs_active_author_created_idx",
        table: "jobs",
        columns: "(author_id, created, id) WHERE status IN ('QUEUED','PENDING','RUNNING')",
        migration: 19,
    },
    // 0020: unfinished jobs by status with the id (an hour's queued jobs before one, counted
    // from the index: `jobs/queue/`'s places).
    BigIndex {
        name: "jobs_active_status_created_id_idx",
        table: "jobs",
        columns: "(status, created, id) WHERE status IN ('QUEUED','PENDING','RUNNING')",
        migration: 20,
    },
    // 0022: functions' counts without `n` again (counter updates HOT; 0021 reads providers'
    // counts from their own rows).
    BigIndex { name: "job_counts_program_idx", table: "job_counts", columns: "(program_id, status)", migration: 22 },
];

/// Indexes on columns a migration adds (so not buildable before it runs): made once the
/// migrations are applied, with `CREATE INDEX IF NOT EXISTS` (on PostgreSQL concurrently, so
/// writes go on), at every start. `migration` is the version that adds their columns.
pub const AFTER_MIGRATIONS: &[BigIndex] = &[
    // 0027: each tenant's oldest queued jobs (admission's window per tenant).
    BigIndex {
        name: "jobs_queued_tenant_idx",
        table: "jobs",
        columns: "(tenant, created, id) WHERE status = 'QUEUED'",
        migration: 27,
    },
    // 0027: the backfill jobs holding slots (what a reclaim may stop).
    BigIndex {
        name: "jobs_backfill_in_flight_idx",
        table: "jobs",
        columns: "(created) WHERE backfill AND status IN ('PENDING', 'RUNNING')",
        migration: 27,
    },
];

/// Makes `AFTER_MIGRATIONS`' indexes on SQLite (plainly: one writer at a time is its way).
pub(super) async fn build_after_migrations_sqlite(pool: &sqlx::SqlitePool) -> Result<(), sqlx::Error> {
    for index in AFTER_MIGRATIONS {
        sqlx::raw_sql(&format!("CREATE INDEX IF NOT EXISTS {} ON {} {}", index.name, index.table, index.columns))
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// The PostgreSQL advisory lock key of the builds ("gantryix").
const BUILD_LOCK_KEY: i64 = 0x6761_6e74_7279_6978;

/// The statement that builds `index` without blocking writes.
pub fn create_statement(index: &BigIndex) -> String {
    format!("CREATE INDEX CONCURRENTLY IF NOT EXISTS {} ON {} {}", index.name, index.table, index.columns)
}

/// Builds, concurrently, each index of `BIG_INDEXES` whose table exists and that is invalid, or
/// missing and `wanted` (before the migrations); or, `after`, each of `AFTER_MIGRATIONS` that is
/// invalid or missing. Answers the names of those it built.
pub(super) async fn build_concurrently(pool: &PgPool, after: bool) -> Result<Vec<&'static str>, sqlx::Error> {
    let mut connection = pool.acquire().await?;
    sqlx::query("SELECT pg_advisory_lock($1)").bind(BUILD_LOCK_KEY).execute(&mut *connection).await?;
    let built = async {
        let mut built = Vec::new();
        let recorded: Option<String> = sqlx::query_scalar("SELECT CAST(to_regclass('_sqlx_migrations') AS TEXT)")
            .fetch_one(&mut *connection)
            .await?;
        let applied: Vec<i64> = match recorded {
            Some(_) => {
                sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                    .fetch_all(&mut *connection)
                    .await?
            }
            None => Vec::new(),
        };
        for index in if after { AFTER_MIGRATIONS } else { BIG_INDEXES } {
            let table: Option<String> = sqlx::query_scalar("SELECT CAST(to_regclass($1) AS TEXT)")
                .bind(index.table)
                .fetch_one(&mut *connection)
                .await?;
            if table.is_none() {
                continue; // a fresh database: the migration creates the table and the index together
            }
            let valid: Option<bool> = sqlx::query_scalar(
                "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
                 WHERE c.relname = $1 AND pg_table_is_visible(c.oid)",
            )
            .bind(index.name)
            .fetch_optional(&mut *connection)
            .await?;
            match valid {
                Some(true) => continue,
                Some(false) => {
                    tracing::warn!(
                        index = index.name,
                        "an interrupted concurrent build left this index invalid; building it again"
                    );
                    sqlx::raw_sql(&format!("DROP INDEX CONCURRENTLY IF EXISTS {}", index.name))
                        .execute(&mut *connection)
                        .await?;
                }
                None if !after && !index.wanted(&applied) => continue,
                None => {}
            }
            tracing::info!(index = index.name, table = index.table, "building an index concurrently (writes go on)");
            sqlx::raw_sql(&create_statement(index)).execute(&mut *connection).await?;
            built.push(index.name);
        }
        Ok::<_, sqlx::Error>(built)
    }
    .await;
    let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)").bind(BUILD_LOCK_KEY).execute(&mut *connection).await;
    let built = built?;
    unlocked?;
    Ok(built)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each index is in its migration, word for word, as `CREATE INDEX IF NOT EXISTS`, and
    /// not built without `IF NOT EXISTS` by it or a later one (which would fail once the
    /// concurrent build made it). 0022's index is 0003's, which created it plainly with its
    /// table, before any concurrent build could have.
    #[test]
    fn every_big_index_is_created_if_missing_by_its_migration() {
        let migrations: Vec<(i64, String)> = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
            .unwrap()
            .map(|entry| {
                let path = entry.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().to_string();
                (name[..4].parse().unwrap(), std::fs::read_to_string(path).unwrap())
            })
            .collect();
        for index in BIG_INDEXES {
            let statement = format!("CREATE INDEX IF NOT EXISTS {} ON {} {};", index.name, index.table, index.columns);
            let found: Vec<i64> =
                migrations.iter().filter(|(_, text)| text.contains(&statement)).map(|(version, _)| *version).collect();
            assert_eq!(found, vec![index.migration], "{statement}");
            let plain = format!("CREATE INDEX {} ", index.name);
            assert!(
                migrations.iter().all(|(version, text)| *version < index.migration || !text.contains(&plain)),
                "{plain}"
            );
        }
        // An index is built while its migration is pending, not once it is applied.
        let [by_day, covering, ..] = BIG_INDEXES else { panic!("the big indexes of 0014 and 0018 first") };
        assert!(by_day.wanted(&[13]) && !by_day.wanted(&[13, 14, 18]));
        assert!(covering.wanted(&[14, 17]) && !covering.wanted(&[14, 17, 18]));
        assert_eq!(
            create_statement(&BIG_INDEXES[0]),
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS job_counts_by_day_author_status_idx ON job_counts_by_day (author_id, status, day)"
        );
    }
}
