//! `gantry gateway`: the REST API with the Kubernetes backend. Stateless, so several replicas
//! may run behind a Service; jobs become `FunctionJob` resources that `gantry controller` runs.
//! On a cluster the database is PostgreSQL and the storage S3.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;

use crate::api::ApiArgs;
use crate::api::AppState;
use crate::compute::kube::{ClusterArgs, KubeBackend, KubeSettings};
use crate::db::{self, DatabaseArgs};
use crate::domain::sizes::Resources;
use crate::ops::{require_shared_backends, serve_http};
use crate::retention::RetentionArgs;
use crate::secrets::TokenCipher;
use crate::shared::parse_timeout;
use crate::storage::StorageArgs;

#[derive(Debug, Args)]
pub struct GatewayArgs {
    /// Address to listen on.
    #[arg(long, env = "GANTRY_LISTEN", default_value = "0.0.0.0:8000")]
    pub listen: SocketAddr,
    /// Admin port: `/metrics`, `/healthz`, `/readyz` (unauthenticated: keep it inside the cluster).
    #[arg(long, env = "GANTRY_ADMIN_LISTEN", default_value = "0.0.0.0:9090")]
    pub admin_listen: SocketAddr,
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    pub retention: RetentionArgs,
    #[command(flatten)]
    pub storage: StorageArgs,
    #[command(flatten)]
    pub api: ApiArgs,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Queued+pending+running jobs one user may have; `run` answers 429 beyond.
    #[arg(long, env = "LIMITS_ACTIVE_JOBS_PER_USER", default_value_t = 50)]
    pub active_jobs_per_user: i64,
    /// Job timeout: hours, or a number with s, m or h.
    #[arg(long, env = "PROGRAM_TIMEOUT", default_value = "24", value_parser = parse_timeout)]
    pub program_timeout: Duration,
    /// CPU of jobs whose size names no compute profile (`LIMITS_CPU_PER_TASK`).
    #[arg(long, env = "LIMITS_CPU_PER_TASK", default_value = "4")]
    pub cpu_per_job: String,
    /// Memory in GiB of jobs whose size names no compute profile (`LIMITS_MEMORY_PER_TASK`).
    #[arg(long, env = "LIMITS_MEMORY_PER_TASK", default_value_t = 8)]
    pub memory_gib_per_job: u32,
    /// Largest size in bytes of each log read live from a pod.
    #[arg(long, env = "FUNCTIONS_LOGS_SIZE_LIMIT", default_value_t = 52_428_800)]
    pub logs_size_limit: usize,
    /// Seconds between drift sweeps (jobs without resources, resources without jobs).
    #[arg(long, env = "GANTRY_SWEEP_SECONDS", default_value_t = 30)]
    pub sweep_seconds: u64,
    #[command(flatten)]
    pub events: crate::events::EventArgs,
    #[command(flatten)]
    pub connections: crate::ops::ConnectionArgs,
    /// Admission's limits, as the controller has them (the chart gives both the same): shown
    /// by `jobs/queue/`, which says what holds each queued job back.
    #[command(flatten)]
    pub limits: crate::compute::LimitsArgs,
}

impl GatewayArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        let Self {
            listen,
            admin_listen,
            database,
            retention,
            storage,
            api,
            cluster,
            active_jobs_per_user,
            program_timeout,
            cpu_per_job,
            memory_gib_per_job,
            logs_size_limit,
            sweep_seconds,
            limits,
            events,
            connections,
        } = self;
        let auth = Arc::new(api.auth.authenticator()?);
        let runtime = Arc::new(api.auth.runtime_service()?);
        let storage = storage.open(&database.data_dir)?;
        require_shared_backends("gateway", &database, &storage)?;
        let Some(token_key) = &api.token_key else {
            bail!(
                "gantry gateway needs --token-key (GANTRY_TOKEN_KEY), the same for every replica: 32 bytes in base64"
            );
        };
        let tokens = TokenCipher::from_key_text(token_key.expose())?;
        let db = database.open().await?;
        let functions = Arc::new(crate::api::state::FunctionCache::default());
        let budgets = Arc::new(crate::api::state::BudgetCache::default());
        crate::api::state::follow_changes(&db, &auth, &functions, &budgets);
        storage.check().await.context("object storage is not reachable")?;
        let (client, namespace) = cluster.connect().await?;
        let publisher = events.start(&db).await?;
        println!("job history: {}", retention.start(&db, &storage));
        crate::api::idempotency::start_expiry(&db);
        let backend = Arc::new(KubeBackend {
            client,
            db: db.clone(),
            storage: storage.clone(),
            publisher: publisher.clone(),
            tokens: tokens.clone(),
            settings: KubeSettings {
                namespace: namespace.clone(),
                timeout: program_timeout,
                default_resources: Resources {
                    cpu: cpu_per_job,
                    memory: format!("{memory_gib_per_job}Gi"),
                    gpus: 0,
                    gpu_model: None,
                },
                logs_size_limit,
                sweep_every: Duration::from_secs(sweep_seconds.max(1)),
            },
        });
        tokio::spawn(Arc::clone(&backend).run_sweeps());
        let listener =
            tokio::net::TcpListener::bind(listen).await.with_context(|| format!("failed to listen on {listen}"))?;
        println!(
            "gantry gateway listening on http://{} (database: {}, storage: {}, jobs: FunctionJobs in namespace {namespace})",
            listener.local_addr()?,
            db::redact(&database.url()),
            storage.backend_name()
        );
        let mut config = api.config(std::env::temp_dir().join("gantry-spool"), active_jobs_per_user);
        config.admission = Some(limits.limits(crate::compute::CLUSTER_GPU_SLOTS));
        crate::ops::keep_spool_clean(&config.spool_dir, crate::ops::SPOOL_SWEEP_PERIOD);
        let metrics = Arc::new(crate::ops::Metrics::gateway());
        let admin = tokio::spawn(crate::ops::serve(admin_listen, Arc::clone(&metrics), db.clone()));
        let follows = Arc::new(crate::follow::Follows::default());
        let state = AppState {
            db,
            storage,
            config: Arc::new(config),
            compute: backend,
            publisher,
            tokens,
            auth,
            runtime,
            follows,
            functions,
            budgets,
        };
        tokio::select! {
            served = serve_http(listener, state, Some(metrics), connections.limits(), crate::shared::shutdown_signal()) => served,
            admin = admin => admin.context("admin server stopped")?,
        }
    }
}
