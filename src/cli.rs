//! Command line: one `Args` per subcommand. Every flag also reads an environment variable; the
//! spec's names (`MAX_REQUEST_BODY_SIZE_MB`, `SETTINGS_AUTH_MECHANISM`, ...) are kept, Gantry's
//! own use the `GANTRY_` prefix.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};

use crate::api::{self, AppState, GatewayConfig};
use crate::auth::AuthMechanism;
use crate::db::{self, Db};
use crate::domain::admission::Limits;
use crate::runner::{LocalRunner, RunnerConfig};
use crate::storage::{S3Settings, Storage};

/// MIME types accepted by file uploads unless configured otherwise (the spec's list).
pub const DEFAULT_UPLOAD_MIME_TYPES: &str =
    "application/x-tar,application/gzip,application/json,application/octet-stream,application/zip,text/plain,text/csv";

#[derive(Debug, Parser)]
#[command(name = "gantry", version, about = "Job gateway for user-uploaded functions")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway with its embedded defaults (SQLite and a local directory under --data-dir).
    Serve(ServeArgs),
    /// Apply database migrations and exit.
    Migrate(DatabaseArgs),
    /// Manage users, groups, providers and grants without SQL.
    Admin(AdminArgs),
    /// Run one job: unpack its artifact, run `python <entrypoint>`, ship result and logs. Started
    /// by the runner for each job, never by hand.
    Launch(crate::launch::LaunchArgs),
}

/// Where the database is.
#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// Folder for the embedded database, local object storage and upload spooling.
    #[arg(long, env = "GANTRY_DATA_DIR", default_value = ".gantry")]
    pub data_dir: PathBuf,
    /// Database URL: sqlite://PATH or postgres://USER@HOST/DB. Default: SQLite in --data-dir.
    #[arg(long, env = "GANTRY_DATABASE_URL")]
    pub database_url: Option<String>,
}

impl DatabaseArgs {
    pub fn url(&self) -> String {
        self.database_url.clone().unwrap_or_else(|| format!("sqlite://{}", self.data_dir.join("gantry.db").display()))
    }

    /// Connects and migrates.
    pub async fn open(&self) -> anyhow::Result<Db> {
        std::fs::create_dir_all(&self.data_dir)
            .with_context(|| format!("failed to create the data directory {}", self.data_dir.display()))?;
        let db = Db::connect(&self.url()).await?;
        db.migrate().await?;
        Ok(db)
    }
}

/// Where objects are stored.
#[derive(Debug, Clone, Args)]
pub struct StorageArgs {
    /// Object storage: a directory, or s3://BUCKET[/PREFIX]. Default: DATA_DIR/objects.
    #[arg(long, env = "GANTRY_STORAGE")]
    pub storage: Option<String>,
    /// S3 endpoint URL (MinIO, Ceph, ...); default: AWS for the region.
    #[arg(long, env = "GANTRY_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// S3 region.
    #[arg(long, env = "GANTRY_S3_REGION", default_value = "us-east-1")]
    pub s3_region: String,
    /// S3 access key id.
    #[arg(long, env = "AWS_ACCESS_KEY_ID", hide_env_values = true)]
    pub s3_access_key_id: Option<String>,
    /// S3 secret access key.
    #[arg(long, env = "AWS_SECRET_ACCESS_KEY", hide_env_values = true)]
    pub s3_secret_access_key: Option<String>,
    /// Address buckets by path (`endpoint/bucket/key`) instead of virtual host; MinIO needs it.
    #[arg(long, env = "GANTRY_S3_PATH_STYLE")]
    pub s3_path_style: bool,
}

impl StorageArgs {
    pub fn open(&self, data_dir: &std::path::Path) -> anyhow::Result<Storage> {
        match self.storage.as_deref() {
            Some(location) if location.starts_with("s3://") => {
                let (bucket, prefix) = Storage::parse_s3_location(location)?;
                let (Some(access_key_id), Some(secret_access_key)) =
                    (&self.s3_access_key_id, &self.s3_secret_access_key)
                else {
                    bail!(
                        "S3 storage needs credentials: set --s3-access-key-id/AWS_ACCESS_KEY_ID and --s3-secret-access-key/AWS_SECRET_ACCESS_KEY"
                    );
                };
                Ok(Storage::s3(&S3Settings {
                    bucket,
                    prefix,
                    endpoint: self.s3_endpoint.clone(),
                    region: self.s3_region.clone(),
                    access_key_id: access_key_id.clone(),
                    secret_access_key: secret_access_key.clone(),
                    path_style: self.s3_path_style,
                }))
            }
            Some(directory) => Ok(Storage::local(directory)),
            None => Ok(Storage::local(data_dir.join("objects"))),
        }
    }
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "GANTRY_LISTEN", default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    pub storage: StorageArgs,
    /// How bearer tokens are checked.
    #[arg(long, env = "SETTINGS_AUTH_MECHANISM", value_enum, default_value = "mock_token")]
    pub auth_mechanism: AuthMechanism,
    /// Largest request body in MB; larger bodies get a 413.
    #[arg(long, env = "MAX_REQUEST_BODY_SIZE_MB", default_value_t = 50)]
    pub max_request_body_size_mb: u64,
    /// Largest `arguments` text in MB validated against a function's schema.
    #[arg(long, env = "MAX_ARGUMENTS_LENGTH_MB", default_value_t = 32)]
    pub max_arguments_length_mb: u64,
    /// MIME types accepted by file uploads, comma-separated.
    #[arg(long, env = "GANTRY_UPLOAD_MIME_TYPES", default_value = DEFAULT_UPLOAD_MIME_TYPES)]
    pub upload_mime_types: String,
    /// Version reported by `GET version/`.
    #[arg(long, env = "GANTRY_REPORTED_VERSION", default_value = env!("CARGO_PKG_VERSION"))]
    pub reported_version: String,
    #[command(flatten)]
    pub jobs: JobArgs,
}

/// How jobs run.
#[derive(Debug, Clone, Args)]
pub struct JobArgs {
    /// Where jobs run: `local` processes, or `none` (the gateway only queues them; for a
    /// separate runner, or to measure the API alone).
    #[arg(long, env = "GANTRY_RUNNER", value_enum, default_value = "local")]
    pub runner: RunnerKind,
    /// Python interpreter that runs functions (`python <entrypoint>`); give a venv's python to
    /// make `qiskit_serverless` importable by jobs.
    #[arg(long, env = "GANTRY_PYTHON", default_value = "python3")]
    pub python: String,
    /// Base URL jobs use to call the gateway back. Default: http://LISTEN.
    #[arg(long, env = "GANTRY_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// Queued+pending+running jobs one user may have; `run` answers 429 beyond.
    #[arg(long, env = "LIMITS_ACTIVE_JOBS_PER_USER", default_value_t = 50)]
    pub active_jobs_per_user: i64,
    /// Pending+running jobs one user may have at once (admission).
    #[arg(long, env = "LIMITS_JOBS_PER_USER", default_value_t = 2)]
    pub jobs_per_user: usize,
    /// CPU jobs running at once on this machine.
    #[arg(long, env = "LIMITS_MAX_CLUSTERS", default_value_t = 6)]
    pub max_cpu_jobs: usize,
    /// GPU jobs running at once.
    #[arg(long, env = "LIMITS_MAX_GPU_CLUSTERS", default_value_t = 1)]
    pub max_gpu_jobs: usize,
    /// Longest a job may go without activity before it is stopped: hours as a plain number
    /// (`24`), or with a unit (`90s`, `15m`, `2h`).
    #[arg(long, env = "PROGRAM_TIMEOUT", default_value = "24", value_parser = parse_timeout)]
    pub program_timeout: std::time::Duration,
    /// Bytes kept of each of a job's logs (the newest).
    #[arg(long, env = "FUNCTIONS_LOGS_SIZE_LIMIT", default_value_t = 52_428_800)]
    pub logs_size_limit: u64,
    /// `QISKIT_IBM_URL` given to jobs.
    #[arg(long, env = "QISKIT_IBM_URL", default_value = "https://cloud.ibm.com")]
    pub qiskit_ibm_url: String,
    /// How often the scheduler looks at the queue when nothing wakes it, in milliseconds.
    #[arg(long, env = "GANTRY_SCHEDULER_TICK_MS", default_value_t = 500)]
    pub scheduler_tick_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RunnerKind {
    Local,
    None,
}

/// `PROGRAM_TIMEOUT`: a number of hours, or a number with `s`, `m` or `h`.
pub fn parse_timeout(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let (number, unit_seconds) = match text.char_indices().last() {
        Some((index, 's')) => (&text[..index], 1.0),
        Some((index, 'm')) => (&text[..index], 60.0),
        Some((index, 'h')) => (&text[..index], 3600.0),
        _ => (text, 3600.0),
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("invalid timeout '{text}': use hours (24) or a number with s, m or h"))?;
    if !(value.is_finite() && value > 0.0) {
        return Err(format!("invalid timeout '{text}': it must be positive"));
    }
    Ok(std::time::Duration::from_secs_f64(value * unit_seconds))
}

impl ServeArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        let Self {
            listen,
            database,
            storage,
            auth_mechanism,
            max_request_body_size_mb,
            max_arguments_length_mb,
            upload_mime_types,
            reported_version,
            jobs,
        } = self;
        if auth_mechanism != AuthMechanism::MockToken {
            bail!(
                "SETTINGS_AUTH_MECHANISM={} is not built yet; this version of Gantry supports mock_token only",
                clap::ValueEnum::to_possible_value(&auth_mechanism)
                    .map(|v| v.get_name().to_string())
                    .unwrap_or_default()
            );
        }
        let db = database.open().await?;
        let storage_settings = storage;
        let storage = storage_settings.open(&database.data_dir)?;
        storage.check().await.context("object storage is not reachable")?;
        migrate_storage(&db, &storage).await?;
        let config = GatewayConfig {
            max_body_bytes: max_request_body_size_mb * 1024 * 1024,
            max_arguments_bytes: usize::try_from(max_arguments_length_mb * 1024 * 1024).unwrap_or(usize::MAX),
            spool_dir: database.data_dir.join("spool"),
            version: reported_version,
            allowed_mime_types: upload_mime_types
                .split(',')
                .map(|m| m.trim().to_string())
                .filter(|m| !m.is_empty())
                .collect(),
            active_jobs_per_user: jobs.active_jobs_per_user,
        };
        let listener =
            tokio::net::TcpListener::bind(listen).await.with_context(|| format!("failed to listen on {listen}"))?;
        let address = listener.local_addr()?;
        println!(
            "gantry listening on http://{address} (database: {} {}, storage: {}, auth: mock_token)",
            db.backend_name(),
            db::redact(&database.url()),
            storage.backend_name()
        );
        let publisher: Arc<dyn crate::events::Publisher> = Arc::new(crate::events::LogPublisher);
        let work_root = absolute(&database.data_dir.join("jobs"))?;
        let (storage_args, storage_env) = launcher_storage(&storage_settings, &database.data_dir)?;
        let runner_config = RunnerConfig {
            launcher: std::env::current_exe().context("failed to find the gantry executable")?,
            python: jobs.python,
            work_root,
            gateway_host: jobs.public_url.unwrap_or_else(|| format!("http://{address}")),
            limits: Limits {
                jobs_per_user: jobs.jobs_per_user,
                cpu_slots: jobs.max_cpu_jobs,
                gpu_slots: jobs.max_gpu_jobs,
            },
            timeout: jobs.program_timeout,
            logs_size_limit: jobs.logs_size_limit,
            tick: std::time::Duration::from_millis(jobs.scheduler_tick_ms.max(10)),
            qiskit_ibm_url: jobs.qiskit_ibm_url,
            storage_args,
            storage_env,
        };
        let runner = match jobs.runner {
            RunnerKind::Local => {
                println!(
                    "jobs run as local processes with {} (work folders in {})",
                    runner_config.python,
                    runner_config.work_root.display()
                );
                tokio::spawn(warn_if_client_missing(runner_config.python.clone()));
                let runner = LocalRunner::new(db.clone(), storage.clone(), runner_config, publisher.clone());
                tokio::spawn(Arc::clone(&runner).run());
                Some(runner)
            }
            RunnerKind::None => {
                println!("no runner: jobs stay queued (GANTRY_RUNNER=none)");
                None
            }
        };
        let state = AppState { db, storage, config: Arc::new(config), runner, publisher };
        let app = api::app(state);
        axum::serve(listener, tower::make::Shared::new(app))
            .with_graceful_shutdown(shutdown_signal())
            .await
            .context("server failed")?;
        Ok(())
    }
}

/// Runs the one-time storage steps that have not completed yet (see `storage::migrate`). The
/// merge of per-function user files is recorded as done only when no job was in flight: a job
/// started by an earlier version writes to its old folder until it ends, and the next start
/// moves what it wrote.
pub async fn migrate_storage(db: &Db, storage: &Storage) -> anyhow::Result<()> {
    use crate::storage::migrate;
    if db::storage_steps::is_done(db, migrate::USER_AREA_MERGE).await? {
        return Ok(());
    }
    let in_flight = db::jobs::in_flight(db).await?.len();
    let report = migrate::merge_custom_user_areas(storage)
        .await
        .context("failed to move custom functions' files into their users' areas")?;
    if report != migrate::MergeReport::default() {
        println!(
            "moved {} file(s) of custom functions into their users' shared areas ({} older duplicate(s) removed)",
            report.moved, report.dropped
        );
    }
    if in_flight == 0 {
        db::storage_steps::mark_done(db, migrate::USER_AREA_MERGE).await?;
    }
    Ok(())
}

/// Checks once, in the background, that the jobs' interpreter can import the client their code
/// imports, and warns with the fix when it cannot (a new user's first job would otherwise fail
/// with a bare `ModuleNotFoundError`).
async fn warn_if_client_missing(python: String) {
    let check = tokio::process::Command::new(&python)
        .args(["-c", "import qiskit_serverless"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .status();
    match tokio::time::timeout(std::time::Duration::from_secs(120), check).await {
        Ok(Ok(status)) if status.success() => {}
        Ok(Ok(_)) => eprintln!("warning: {}", crate::domain::logs::missing_client_hint(&python)),
        Ok(Err(error)) => eprintln!(
            "warning: failed to start {python} ({error}); jobs cannot run: start gantry with --python (GANTRY_PYTHON) naming a Python interpreter that has qiskit-serverless installed"
        ),
        Err(_) => eprintln!("warning: {python} took more than 120 s to import qiskit_serverless"),
    }
}

fn absolute(path: &std::path::Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(path).with_context(|| format!("failed to create {}", path.display()))?;
    path.canonicalize().with_context(|| format!("failed to resolve {}", path.display()))
}

/// Flags and environment variables for `gantry launch`.
type LauncherStorage = (Vec<String>, Vec<(String, String)>);

/// The flags and environment that make `gantry launch` open the same storage as the gateway.
fn launcher_storage(storage: &StorageArgs, data_dir: &std::path::Path) -> anyhow::Result<LauncherStorage> {
    let mut args = Vec::new();
    let mut env = Vec::new();
    match storage.storage.as_deref() {
        Some(location) if location.starts_with("s3://") => {
            args.extend([
                "--storage".to_string(),
                location.to_string(),
                "--s3-region".into(),
                storage.s3_region.clone(),
            ]);
            if let Some(endpoint) = &storage.s3_endpoint {
                args.extend(["--s3-endpoint".to_string(), endpoint.clone()]);
            }
            if storage.s3_path_style {
                args.push("--s3-path-style".into());
            }
            if let Some(key) = &storage.s3_access_key_id {
                env.push(("AWS_ACCESS_KEY_ID".to_string(), key.clone()));
            }
            if let Some(secret) = &storage.s3_secret_access_key {
                env.push(("AWS_SECRET_ACCESS_KEY".to_string(), secret.clone()));
            }
        }
        Some(directory) => {
            args.extend(["--storage".to_string(), absolute(std::path::Path::new(directory))?.display().to_string()])
        }
        None => args.extend(["--storage".to_string(), absolute(&data_dir.join("objects"))?.display().to_string()]),
    }
    Ok((args, env))
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {}
        _ = terminate => {}
    }
}

#[derive(Debug, Args)]
pub struct AdminArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(subcommand)]
    pub command: AdminCommand,
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Create a provider (or change its registry) and its admin group `<name>-admins`.
    CreateProvider {
        name: String,
        /// Custom images of this provider must equal this registry or start with it and `/`.
        #[arg(long)]
        registry: Option<String>,
    },
    /// Add a user to a provider's admin group (creates the user if needed).
    AddAdmin {
        #[arg(long)]
        provider: String,
        #[arg(long)]
        user: String,
    },
    /// Remove a user from a provider's admin group.
    RemoveAdmin {
        #[arg(long)]
        provider: String,
        #[arg(long)]
        user: String,
    },
    /// Add a user to a group (creates both if needed).
    AddMember {
        #[arg(long)]
        group: String,
        #[arg(long)]
        user: String,
    },
    /// Grant a group view and/or run on a provider function; with neither flag, revoke.
    Grant {
        #[arg(long)]
        provider: String,
        #[arg(long)]
        function: String,
        #[arg(long)]
        group: String,
        #[arg(long)]
        view: bool,
        #[arg(long)]
        run: bool,
    },
    /// Disable a provider function: runs answer 423 with the message (default: the reference's
    /// text) until it is enabled again.
    DisableFunction {
        #[arg(long)]
        provider: String,
        #[arg(long)]
        function: String,
        #[arg(long)]
        message: Option<String>,
    },
    /// Enable a disabled provider function again.
    EnableFunction {
        #[arg(long)]
        provider: String,
        #[arg(long)]
        function: String,
    },
    /// Refuse every request of a user (401) until reactivated.
    DeactivateUser { user: String },
    /// Allow a deactivated user again.
    ActivateUser { user: String },
}

impl AdminArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        let Self { database, command } = self;
        let db = database.open().await?;
        println!("{}", admin(&db, command).await?);
        Ok(())
    }
}

fn check_user_name(user: &str) -> anyhow::Result<()> {
    if !crate::domain::names::is_valid_user_name(user) {
        bail!("invalid user name '{user}': use 1-150 letters, digits, '_', '.', '@' or '-'");
    }
    Ok(())
}

async fn find_provider_function(db: &Db, provider: &str, function: &str) -> anyhow::Result<db::programs::ProgramRow> {
    let provider_row = find_provider(db, provider).await?;
    // Any user id works for the lookup: only the function itself is needed here.
    db::programs::find_provider_function(db, "", &provider_row.id, function)
        .await?
        .with_context(|| format!("function {provider}/{function} does not exist"))
}

async fn find_provider(db: &Db, name: &str) -> anyhow::Result<db::providers::ProviderRow> {
    db::providers::find_by_name(db, name).await?.with_context(|| {
        format!("provider {name} does not exist (create it with `gantry admin create-provider {name}`)")
    })
}

/// Carries out one admin command and says what it did.
pub async fn admin(db: &Db, command: AdminCommand) -> anyhow::Result<String> {
    use crate::db::{programs, providers, users};
    Ok(match command {
        AdminCommand::CreateProvider { name, registry } => {
            let clean = crate::domain::names::sanitize_title(&name, false);
            if clean != name || name.is_empty() {
                bail!("invalid provider name '{name}': use letters, digits, '_' and '-'");
            }
            providers::upsert(db, &name, registry.as_deref()).await?;
            format!("provider {name} ready (admin group {})", providers::admin_group_name(&name))
        }
        AdminCommand::AddAdmin { provider, user } => {
            check_user_name(&user)?;
            let provider = find_provider(db, &provider).await?;
            let group = users::ensure_group(db, &providers::admin_group_name(&provider.name)).await?;
            providers::add_admin_group(db, &provider.id, &group.id).await?;
            let user_row = users::ensure(db, &user).await?;
            users::add_member(db, &group.id, &user_row.id).await?;
            format!("{user} is now an admin of provider {}", provider.name)
        }
        AdminCommand::RemoveAdmin { provider, user } => {
            let provider = find_provider(db, &provider).await?;
            let group = users::find_group(db, &providers::admin_group_name(&provider.name)).await?;
            let user_row = users::find_by_username(db, &user).await?;
            let removed = match (group, user_row) {
                (Some(group), Some(user_row)) => users::remove_member(db, &group.id, &user_row.id).await?,
                _ => false,
            };
            if removed {
                format!("{user} is no longer an admin of provider {}", provider.name)
            } else {
                format!("{user} was not an admin of provider {}", provider.name)
            }
        }
        AdminCommand::AddMember { group, user } => {
            check_user_name(&user)?;
            let group_row = users::ensure_group(db, &group).await?;
            let user_row = users::ensure(db, &user).await?;
            users::add_member(db, &group_row.id, &user_row.id).await?;
            format!("{user} is now a member of group {group}")
        }
        AdminCommand::DisableFunction { provider, function, message } => {
            let program = find_provider_function(db, &provider, &function).await?;
            programs::set_disabled(db, &program.id, true, message.as_deref()).await?;
            format!("{provider}/{function} is disabled")
        }
        AdminCommand::EnableFunction { provider, function } => {
            let program = find_provider_function(db, &provider, &function).await?;
            programs::set_disabled(db, &program.id, false, None).await?;
            format!("{provider}/{function} is enabled")
        }
        AdminCommand::Grant { provider, function, group, view, run } => {
            let program = find_provider_function(db, &provider, &function).await?;
            let group_row = users::ensure_group(db, &group).await?;
            programs::grant(db, &program.id, &group_row.id, view, run).await?;
            format!("group {group} on {provider}/{function}: view={view} run={run}")
        }
        AdminCommand::DeactivateUser { user } => {
            check_user_name(&user)?;
            users::ensure(db, &user).await?;
            users::set_active(db, &user, false).await?;
            format!("user {user} deactivated")
        }
        AdminCommand::ActivateUser { user } => {
            if !users::set_active(db, &user, true).await? {
                bail!("user {user} does not exist");
            }
            format!("user {user} activated")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn timeouts_are_hours_or_carry_a_unit() {
        use std::time::Duration;
        assert_eq!(parse_timeout("24").unwrap(), Duration::from_secs(24 * 3600));
        assert_eq!(parse_timeout("0.5").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse_timeout("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_timeout("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_timeout("2h").unwrap(), Duration::from_secs(7200));
        assert!(parse_timeout("soon").is_err());
        assert!(parse_timeout("0").is_err());
    }
}
