//! The database: SQLite (embedded default) or PostgreSQL (production), behind one `Db` value.
//! Queries are written once in the portable subset both dialects share (`$N` placeholders, text
//! ids, integer timestamps) and run on either pool through `on_db!`; each table's queries live in
//! `db/<table>.rs` with their row types. One set of migrations (`migrations/`) serves both.

pub mod budgets;
pub mod counts;
pub(crate) mod group_commit;
pub mod idempotency;
pub mod indexes;
pub mod jobs;
pub mod outbox;
pub mod params;
pub mod programs;
pub mod providers;
pub mod queue;
pub mod retention;
pub mod storage_steps;
pub mod tenants;
pub mod usage;
pub mod users;
pub mod watched;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};

/// Runs `$body` with `$pool` bound to the backend's pool; the body is type-checked per backend.
macro_rules! on_db {
    ($db:expr, $pool:ident => $body:expr) => {
        match $db {
            $crate::db::Db::Sqlite($pool, _) => $body,
            $crate::db::Db::Postgres($pool) => $body,
        }
    };
}
pub(crate) use on_db;

/// How a write transaction begins. On SQLite it takes the write lock at `BEGIN IMMEDIATE` (waiting
/// for it within the busy timeout): a deferred transaction that reads before it writes fails at its
/// first write, whatever the timeout, when another connection committed after its read
/// (`SQLITE_BUSY_SNAPSHOT`, "database is locked"). Every transaction that writes begins so.
pub(crate) trait BeginWrite {
    type Database: sqlx::Database;
    fn begin_write(
        &self,
    ) -> impl std::future::Future<Output = Result<sqlx::Transaction<'static, Self::Database>, sqlx::Error>> + Send;
}

impl BeginWrite for SqlitePool {
    type Database = sqlx::Sqlite;
    fn begin_write(
        &self,
    ) -> impl std::future::Future<Output = Result<sqlx::Transaction<'static, sqlx::Sqlite>, sqlx::Error>> + Send {
        self.begin_with("BEGIN IMMEDIATE")
    }
}

impl BeginWrite for PgPool {
    type Database = sqlx::Postgres;
    fn begin_write(
        &self,
    ) -> impl std::future::Future<Output = Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error>> + Send {
        self.begin()
    }
}

/// Runs `$body` (statements on the transaction `$tx`) in a transaction that also raises the auth
/// stamp and, on PostgreSQL, notifies `watched::AUTH_CHANNEL` when it commits: every server then
/// forgets the users and functions it keeps in memory (`watched`). For every write that changes
/// who a user is or what they may reach. Answers `$body`'s value as `Result<_, sqlx::Error>`.
macro_rules! announced {
    ($db:expr, $tx:ident => $body:expr) => {{
        let db: &$crate::db::Db = $db;
        let _writer = db.write_lock().await;
        let notify = matches!(db, $crate::db::Db::Postgres(_));
        $crate::db::on_db!(db, pool => async {
            let mut $tx = $crate::db::BeginWrite::begin_write(pool).await?;
            let answer = $body;
            sqlx::query("UPDATE auth_stamp SET n = n + 1 WHERE id = 1").execute(&mut *$tx).await?;
            if notify {
                sqlx::query("SELECT pg_notify($1, '')")
                    .bind($crate::db::watched::AUTH_CHANNEL)
                    .execute(&mut *$tx)
                    .await?;
            }
            $tx.commit().await?;
            Ok::<_, sqlx::Error>(answer)
        }.await)
    }};
}
pub(crate) use announced;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to connect to the database at {url}")]
    Connect { url: String, source: sqlx::Error },
    #[error("failed to apply database migrations")]
    Migrate { source: sqlx::migrate::MigrateError },
    #[error("failed to build the migrations' big indexes concurrently")]
    BuildIndexes { source: sqlx::Error },
    #[error("unsupported database url {url}: use sqlite://PATH or postgres://...")]
    UnsupportedUrl { url: String },
    #[error("database query failed: {operation}")]
    Query { operation: &'static str, source: sqlx::Error },
}

impl Error {
    /// Name of the violated unique constraint, when the failure is one.
    pub fn unique_violation(&self) -> Option<String> {
        match self {
            Error::Query { source: sqlx::Error::Database(error), .. } if error.is_unique_violation() => {
                Some(error.constraint().map(str::to_string).unwrap_or_else(|| error.message().to_string()))
            }
            _ => None,
        }
    }
}

impl Error {
    /// Why the database cannot be used right now, when the failure is that and not a bug: it is
    /// unreachable or restarting (PostgreSQL), locked, read-only or failing its disk (SQLite).
    /// Such a request may succeed when retried a few seconds later.
    pub fn unavailable(&self) -> Option<String> {
        let source = match self {
            Error::Connect { source, .. } | Error::Query { source, .. } => source,
            Error::Migrate { .. } | Error::BuildIndexes { .. } | Error::UnsupportedUrl { .. } => return None,
        };
        match source {
            sqlx::Error::Io(error) => Some(format!("cannot reach it: {error}")),
            sqlx::Error::PoolTimedOut => Some("no connection could be had in time".into()),
            sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => Some("its connections are closed".into()),
            sqlx::Error::Tls(error) => Some(format!("cannot reach it: {error}")),
            sqlx::Error::Database(error) => unavailable_code(error.code().as_deref().unwrap_or_default())
                .map(|why| format!("{why}: {}", error.message())),
            _ => None,
        }
    }
}

/// What a database error code means when it says the database cannot be used right now:
/// PostgreSQL's SQLSTATEs (connection exceptions, shutting down or starting, too many
/// connections, the database gone) and SQLite's result codes (primary or extended).
pub fn unavailable_code(code: &str) -> Option<&'static str> {
    // A SQLSTATE is always five characters; SQLite's codes (extended ones too) are below 10,000.
    if code.len() < 5
        && let Ok(number) = code.parse::<i64>()
    {
        // SQLite: the primary result code is the low byte of an extended one.
        return match number & 0xff {
            5 | 6 => Some("the database is locked"),
            8 => Some("the database is read-only"),
            10 => Some("disk I/O error"),
            13 => Some("the disk is full"),
            14 => Some("the database file cannot be opened"),
            _ => None,
        };
    }
    match code {
        "57P01" | "57P02" => Some("the server is shutting down"),
        "57P03" => Some("the server is starting"),
        "53300" => Some("too many connections"),
        "3D000" => Some("the database does not exist"),
        _ if code.starts_with("08") => Some("the connection failed"),
        _ => None,
    }
}

/// Wraps a sqlx error with the operation that failed.
pub(crate) fn query_error(operation: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |source| Error::Query { operation, source }
}

/// A pooled PostgreSQL connection idle longer than this is pinged before it is used again.
const IDLE_BEFORE_PING: Duration = Duration::from_secs(2);

#[derive(Clone, Debug)]
pub enum Db {
    /// The pool, and this process's single writer: SQLite allows one (`group_commit`).
    Sqlite(SqlitePool, Arc<group_commit::SqliteWriter>),
    Postgres(PgPool),
}

/// The connection options of a PostgreSQL URL, with JIT compilation off for the gateway's
/// sessions: its statements are short, and PostgreSQL compiles any whose estimated cost passes
/// `jit_above_cost`, which a generic plan's guess reaches easily: the queue page's one
/// statement ran in 2 ms and spent 10-50 ms more compiling itself (10 M jobs, 682,000 queued).
fn postgres_options(url: &str) -> Result<sqlx::postgres::PgConnectOptions, sqlx::Error> {
    use std::str::FromStr as _;
    Ok(sqlx::postgres::PgConnectOptions::from_str(url)?.options([("jit", "off")]))
}

/// The pool's size unless `--db-connections` sets it: twice the cores this process may use
/// (`available_parallelism`, which follows CPU affinity and a cgroup's quota), at least 8 on
/// SQLite (each connection is a thread of its own, waiting on the disk or on a statement's
/// hand-over as often as it computes) and at least 16 on PostgreSQL (the server runs the
/// statements; a connection mostly waits for the network).
pub fn default_connections(url: &str, cores: usize) -> u32 {
    let floor = if url.starts_with("sqlite:") { 8 } else { 16 };
    u32::try_from(cores.saturating_mul(2)).unwrap_or(u32::MAX).max(floor)
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

impl Db {
    /// Connects to `url` (`sqlite://path` creates the file; `postgres://…`) with the default
    /// pool size (`default_connections`).
    pub async fn connect(url: &str) -> Result<Db, Error> {
        Db::connect_with(url, default_connections(url, cores())).await
    }

    /// Connects to `url` with a pool of at most `connections` connections. Every acquisition's
    /// wait is traced for `telemetry::db_waits`.
    pub async fn connect_with(url: &str, connections: u32) -> Result<Db, Error> {
        let connections = connections.max(1);
        let connect_error = |source| Error::Connect { url: redact(url), source };
        if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)
                .map_err(connect_error)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .foreign_keys(true)
                .busy_timeout(Duration::from_secs(10));
            // No ping before handing out a connection (`test_before_acquire`): on SQLite it is a
            // trip to the connection's worker thread and back for nothing; a failed statement
            // reports the failure anyway.
            let pool = SqlitePoolOptions::new()
                .max_connections(connections)
                .acquire_time_level(log::LevelFilter::Trace)
                .test_before_acquire(false)
                .connect_with(options)
                .await
                .map_err(connect_error)?;
            Ok(Db::Sqlite(pool, Arc::new(group_commit::SqliteWriter::default())))
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            // No ping before every query (`test_before_acquire`): it is a round trip to the
            // server, as costly as the query itself. A connection is pinged only when it sat
            // idle for a while, when the server may have dropped it (a restart, a proxy's
            // timeout), and connections are renewed before such timeouts.
            let pool = PgPoolOptions::new()
                .max_connections(connections)
                .acquire_time_level(log::LevelFilter::Trace)
                .test_before_acquire(false)
                .before_acquire(|connection, meta| {
                    Box::pin(async move {
                        if meta.idle_for > IDLE_BEFORE_PING {
                            sqlx::Connection::ping(connection).await?;
                        }
                        Ok(true)
                    })
                })
                .idle_timeout(Duration::from_secs(300))
                .max_lifetime(Duration::from_secs(1800))
                .acquire_timeout(Duration::from_secs(10))
                .connect_with(postgres_options(url).map_err(connect_error)?)
                .await
                .map_err(connect_error)?;
            Ok(Db::Postgres(pool))
        } else {
            Err(Error::UnsupportedUrl { url: redact(url) })
        }
    }

    /// Applies the pending migrations; on PostgreSQL first builds the indexes they add to big
    /// tables without blocking writes (see `indexes`).
    pub async fn migrate(&self) -> Result<(), Error> {
        // One set of migrations: the schema uses only what both dialects share.
        let result = match self {
            Db::Sqlite(pool, _) => sqlx::migrate!("./migrations").run(pool).await,
            Db::Postgres(pool) => {
                indexes::build_concurrently(pool, false).await.map_err(|source| Error::BuildIndexes { source })?;
                sqlx::migrate!("./migrations").run(pool).await
            }
        };
        result.map_err(|source| Error::Migrate { source })?;
        match self {
            Db::Sqlite(pool, _) => indexes::build_after_migrations_sqlite(pool).await,
            Db::Postgres(pool) => indexes::build_concurrently(pool, true).await.map(drop),
        }
        .map_err(|source| Error::BuildIndexes { source })
    }

    /// `SELECT 1`, for readiness.
    pub async fn ping(&self) -> Result<(), Error> {
        on_db!(self, pool => sqlx::query("SELECT 1").execute(pool).await.map(|_| ())).map_err(query_error("ping"))
    }

    /// Taken around multi-statement write transactions; a no-op on PostgreSQL, whose row locks
    /// do the work.
    pub async fn write_lock(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        match self {
            Db::Sqlite(_, writer) => Some(writer.lock().await),
            Db::Postgres(_) => None,
        }
    }

    pub fn backend_name(&self) -> &'static str {
        match self {
            Db::Sqlite(..) => "sqlite",
            Db::Postgres(_) => "postgres",
        }
    }
}

/// A database URL without its password, for messages and logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let credentials = &url[scheme_end + 3..at];
            match credentials.find(':') {
                Some(colon) => format!("{}{}:***{}", &url[..scheme_end + 3], &credentials[..colon], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// Runs a transaction to its end on its own task, so a request that goes away mid-way (a client
/// disconnect cancels the handler) cannot leave a transaction open on a pooled connection, holding
/// SQLite's write lock or PostgreSQL row locks until that connection is next used.
pub(crate) async fn detached<T: Send + 'static>(
    transaction: impl std::future::Future<Output = Result<T, Error>> + Send + 'static,
) -> Result<T, Error> {
    tokio::spawn(transaction)
        .await
        .map_err(|e| Error::Query { operation: "run a transaction", source: sqlx::Error::Protocol(e.to_string()) })?
}

/// Microseconds since the Unix epoch, the stored form of every timestamp.
pub fn now_micros() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// The API form of a stored timestamp: ISO 8601 UTC with microseconds and `Z`.
pub fn format_timestamp(micros: i64) -> String {
    use chrono::{Datelike, Timelike};
    // Written field by field: `format()` parses its pattern on every call, a visible share of
    // a job listing's CPU.
    let at = chrono::DateTime::from_timestamp_micros(micros).unwrap_or_default().naive_utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        at.year(),
        at.month(),
        at.day(),
        at.hour(),
        at.minute(),
        at.second(),
        at.nanosecond() / 1000
    )
}

pub fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_follows_the_cores_above_a_floor_per_backend() {
        let sqlite = "sqlite://x/gantry.db";
        let postgres = "postgres://gantry@db/gantry";
        assert_eq!(default_connections(sqlite, 1), 8);
        assert_eq!(default_connections(sqlite, 2), 8);
        assert_eq!(default_connections(sqlite, 16), 32);
        assert_eq!(default_connections(postgres, 2), 16);
        assert_eq!(default_connections(postgres, 8), 16);
        assert_eq!(default_connections(postgres, 64), 128);
    }

    #[test]
    fn unavailability_is_told_from_bugs_by_its_code() {
        // PostgreSQL: restart, shutdown, too many connections, the database gone.
        for code in ["57P01", "57P02", "57P03", "53300", "3D000", "08006"] {
            assert!(unavailable_code(code).is_some(), "{code}");
        }
        // SQLite: locked (busy, and an extended busy code), read-only (extended), I/O, full.
        for code in ["5", "517", "6", "8", "1032", "10", "13", "14"] {
            assert!(unavailable_code(code).is_some(), "{code}");
        }
        // Bugs stay bugs: a syntax error, a unique violation, a constraint, SQLITE_ERROR.
        for code in ["42601", "23505", "23503", "1", "19", "2067", ""] {
            assert_eq!(unavailable_code(code), None, "{code}");
        }
        let io = Error::Query { operation: "x", source: sqlx::Error::Io(std::io::ErrorKind::ConnectionRefused.into()) };
        assert!(io.unavailable().unwrap().starts_with("cannot reach it"));
        assert!(Error::Query { operation: "x", source: sqlx::Error::PoolTimedOut }.unavailable().is_some());
        assert_eq!(Error::Query { operation: "x", source: sqlx::Error::RowNotFound }.unavailable(), None);
    }

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(redact("postgres://u:secret@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("sqlite://x.db"), "sqlite://x.db");
    }

    #[test]
    fn timestamps_render_like_the_reference() {
        assert_eq!(format_timestamp(1_675_351_843_281_796), "2023-02-02T15:30:43.281796Z");
        assert_eq!(format_timestamp(0), "1970-01-01T00:00:00.000000Z");
        // The same text as chrono's pattern over a spread of instants, leap days included.
        let mut micros: i64 = 1;
        while micros < 4_102_444_800_000_000 {
            let expected =
                chrono::DateTime::from_timestamp_micros(micros).unwrap().format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
            assert_eq!(format_timestamp(micros), expected);
            micros = micros * 3 + 7_919;
        }
        assert_eq!(format_timestamp(951_782_400_000_001), "2000-02-29T00:00:00.000001Z");
    }
}

/// Where the database is.
#[derive(Debug, Clone, clap::Args)]
pub struct DatabaseArgs {
    /// Folder for the embedded database, local object storage and upload spooling.
    #[arg(long, env = "GANTRY_DATA_DIR", default_value = ".gantry")]
    pub data_dir: std::path::PathBuf,
    /// Database URL: sqlite://PATH or postgres://USER@HOST/DB. Default: SQLite in --data-dir.
    #[arg(long, env = "GANTRY_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Most connections the database pool opens. Default: twice the cores this process may use,
    /// at least 8 on SQLite and 16 on PostgreSQL.
    #[arg(long, env = "GANTRY_DB_CONNECTIONS", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub db_connections: Option<u32>,
}

impl DatabaseArgs {
    pub fn url(&self) -> String {
        self.database_url.clone().unwrap_or_else(|| format!("sqlite://{}", self.data_dir.join("gantry.db").display()))
    }

    /// Connects and migrates.
    pub async fn open(&self) -> anyhow::Result<Db> {
        use anyhow::Context as _;
        std::fs::create_dir_all(&self.data_dir)
            .with_context(|| format!("failed to create the data directory {}", self.data_dir.display()))?;
        let url = self.url();
        let connections = self.db_connections.unwrap_or_else(|| default_connections(&url, cores()));
        let db = Db::connect_with(&url, connections).await?;
        tracing::info!(backend = db.backend_name(), connections, "database pool");
        db.migrate().await?;
        Ok(db)
    }
}
