//! What every request handler may use (`AppState`) and the gateway's settings.

use std::path::PathBuf;
use std::sync::Arc;

use crate::compute::Compute;
use crate::db::Db;
use crate::db::programs::ProgramRow;
use crate::db::watched::Watched;
use crate::secrets::TokenCipher;
use crate::storage::Storage;

/// MIME types accepted by file uploads unless configured otherwise (the spec's list).
pub const DEFAULT_UPLOAD_MIME_TYPES: &str =
    "application/x-tar,application/gzip,application/json,application/octet-stream,application/zip,text/plain,text/csv";

/// Settings of the gateway role.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Largest accepted request body (`MAX_REQUEST_BODY_SIZE_MB`).
    pub max_body_bytes: u64,
    /// Largest `arguments` text validated against a schema (`MAX_ARGUMENTS_LENGTH_MB`).
    pub max_arguments_bytes: usize,
    /// Where uploads are spooled before they are checked and stored.
    pub spool_dir: PathBuf,
    /// Reported by `GET version/`.
    pub version: String,
    /// MIME types accepted by file uploads.
    pub allowed_mime_types: Vec<String>,
    /// `LIMITS_ACTIVE_JOBS_PER_USER`: queued+pending+running jobs one user may have.
    pub active_jobs_per_user: i64,
    /// Admission's limits (pending+running jobs per user, CPU and GPU slots), shown by
    /// `jobs/queue/`; None where they are not known.
    pub admission: Option<crate::domain::admission::Limits>,
    /// `--max-unpacked-mib`: what an uploaded artifact may unpack to, sparse members counted
    /// at their full size.
    pub max_unpacked_mib: u64,
    /// `--trace-link`: a job's trace in a tracing UI, `{trace_id}` standing for its id.
    pub trace_link: Option<String>,
}

impl GatewayConfig {
    pub fn max_body_mb(&self) -> u64 {
        self.max_body_bytes / (1024 * 1024)
    }
}

/// Everything a handler may use.
#[derive(Clone)]
pub struct AppState {
    pub db: Db,
    pub storage: Storage,
    pub config: Arc<GatewayConfig>,
    /// The backend that runs jobs.
    pub compute: Arc<dyn Compute>,
    /// Seals the caller's token kept with a job.
    pub tokens: TokenCipher,
    /// Where job status moves are published.
    pub publisher: Arc<dyn crate::events::Publisher>,
    /// Who callers are (`SETTINGS_AUTH_MECHANISM`).
    pub auth: Arc<crate::auth::Authenticator>,
    /// The caller's runtime service, as `stop` cancels a job's runtime jobs with it.
    pub runtime: Arc<crate::auth::runtime_service::RuntimeService>,
    /// The live followers of jobs' events and logs (`…/stream/` endpoints).
    pub follows: Arc<crate::follow::Follows>,
    /// Functions as `run` resolved them, by caller, provider and title (`follow_changes`).
    pub functions: Arc<FunctionCache>,
    /// The budgets a run counts against, by caller and function (`follow_changes`): a run
    /// reads none while nothing changed.
    pub budgets: Arc<BudgetCache>,
}

/// Functions with the caller's relation to them, by (user id, provider, title).
pub type FunctionCache = Watched<(String, Option<String>, String), ProgramRow>;

/// The budgets a run of a function counts against, by (user id, function id).
pub type BudgetCache = Watched<(String, String), Vec<crate::db::budgets::Budget>>;

/// Keeps the users and functions held in memory true to changes made anywhere, for as long as
/// the returned task runs (without it, nothing is held: every request reads the database).
/// SQLite's stamp is read every 100 ms.
pub fn follow_changes(
    db: &Db,
    auth: &Arc<crate::auth::Authenticator>,
    functions: &Arc<FunctionCache>,
    budgets: &Arc<BudgetCache>,
) -> tokio::task::JoinHandle<()> {
    let (db, auth, functions, budgets) = (db.clone(), Arc::clone(auth), Arc::clone(functions), Arc::clone(budgets));
    tokio::spawn(async move {
        crate::db::watched::watch_auth_changes(&db, std::time::Duration::from_millis(100), |event| {
            auth.observe(event);
            functions.observe(event);
            budgets.observe(event);
        })
        .await
    })
}
