//! Operations endpoints of the cluster roles, on an admin port apart from the API (so the API
//! keeps authenticating every route but its probes): `/metrics` in the Prometheus text format,
//! `/healthz` (the process answers) and `/readyz` (the database answers); and serving the API
//! under the connection limits (`connections`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, bail};
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::api::{self, AppState};
use crate::db::{DatabaseArgs, Db, jobs};
use crate::domain::lifecycle::JobStatus;
use crate::storage::Storage;

mod connections;

pub use connections::{BodyStalled, ConnectionArgs, ConnectionLimits, body_deadline, cap_below};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

/// What failed (`kube`, `database`, `storage`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub kind: &'static str,
}

/// Which of the controller's watches (`functionjobs`, `pods`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchLabels {
    pub watch: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    pub status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    pub code: u16,
}

fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.5, 12))
}

/// Every metric either role exports; each role registers the ones it moves.
pub struct Metrics {
    registry: Registry,
    /// Reconciles by outcome (`ok`, `error`).
    pub reconciles: Family<OutcomeLabels, Counter>,
    pub reconcile_seconds: Histogram,
    /// Failed reconciles by the kind of error.
    pub reconcile_failures: Family<ErrorLabels, Counter>,
    /// Queued jobs moved to PENDING by admission passes.
    pub admitted: Counter,
    /// Backfill jobs stopped for a tenant reclaiming its guarantee.
    pub preempted: Counter,
    /// Bytes of job logs the controller archived from pod logs (the launcher could not ship them).
    pub archived_bytes: Counter,
    /// Logs given up as lost (the pod's log could not be read within the give-up time).
    pub logs_lost: Counter,
    /// Finished FunctionJobs deleted after their keep window.
    pub collected: Counter,
    /// Jobs started again on a new pod after the cluster ended their pod.
    pub retries: Counter,
    /// 1 while this replica holds the leader Lease (or runs without election).
    pub leader: Gauge,
    /// Reconciles running now (at most `--reconcile-concurrency`): all of them held with none
    /// finishing is a stall.
    pub reconciling: Gauge,
    /// Errors of the controller's watches (each is opened again after its backoff).
    pub watch_errors: Family<WatchLabels, Counter>,
    /// Reconciles asked for (by admission, a timer or a pod) of a resource the controller's
    /// store did not hold then (dropped by kube-runtime); the resync reconciles what is held.
    pub not_in_store: Counter,
    /// API requests by method and answer code.
    pub http_requests: Family<HttpLabels, Counter>,
    pub http_seconds: Histogram,
    /// Time to answer `programs/run/` (admission included).
    pub run_seconds: Histogram,
    /// Jobs by status and the queue depth, read from the database at each scrape.
    jobs: Family<StatusLabels, Gauge>,
    queue_depth: Gauge,
    /// Outbound job events by state (`waiting`, `delivered`, `failed`) and the age of the
    /// oldest waiting one (the outbox's lag), read at each scrape.
    outbox: Family<OutboxLabels, Gauge>,
    outbox_lag: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Each tenant's slots (guaranteed, used, firm, borrowed, lent, waiting) per kind, from
    /// its quotas and what the last admission pass saw, read at each scrape.
    tenants: Family<TenantLabels, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    pub tenant: String,
    /// `cpu` or `gpu`.
    pub slots: &'static str,
    /// `guaranteed`, `used`, `firm` (used, not backfill), `borrowed` (used beyond the
    /// guarantee), `lent` (guaranteed, not used by it), `waiting`.
    pub figure: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutboxLabels {
    pub state: &'static str,
}

impl Metrics {
    fn unregistered() -> Metrics {
        Metrics {
            registry: Registry::with_prefix("gantry"),
            reconciles: Family::default(),
            reconcile_seconds: seconds_histogram(),
            reconcile_failures: Family::default(),
            admitted: Counter::default(),
            preempted: Counter::default(),
            archived_bytes: Counter::default(),
            logs_lost: Counter::default(),
            collected: Counter::default(),
            retries: Counter::default(),
            leader: Gauge::default(),
            reconciling: Gauge::default(),
            watch_errors: Family::default(),
            not_in_store: Counter::default(),
            http_requests: Family::default(),
            http_seconds: seconds_histogram(),
            run_seconds: seconds_histogram(),
            jobs: Family::default(),
            queue_depth: Gauge::default(),
            outbox: Family::default(),
            outbox_lag: Gauge::default(),
            tenants: Family::default(),
        }
    }

    fn register_jobs(&mut self) {
        self.registry.register("jobs", "Jobs by status", self.jobs.clone());
        self.registry.register("queue_depth", "Jobs waiting for admission (QUEUED)", self.queue_depth.clone());
        self.registry.register("outbox_events", "Outbound job events by state", self.outbox.clone());
        self.registry.register(
            "outbox_lag_seconds",
            "Age of the oldest outbound job event still waiting for delivery (0 when none waits)",
            self.outbox_lag.clone(),
        );
        self.registry.register(
            "tenant_slots",
            "Each tenant's slots by kind (cpu, gpu) and figure (guaranteed, used, firm, borrowed, lent, waiting), as the last admission pass saw them",
            self.tenants.clone(),
        );
        let waits = &crate::telemetry::db_waits::WAITS;
        self.registry.register(
            "db_pool_acquire_seconds",
            "Time each statement or transaction waited for a pooled database connection",
            waits.pool_acquire.clone(),
        );
        self.registry.register(
            "db_write_lock_seconds",
            "Time each SQLite write waited for the process's single write lock (none on PostgreSQL)",
            waits.write_lock.clone(),
        );
        self.registry.register(
            "db_write_batch_size",
            "Writes committed together by one SQLite group commit (none on PostgreSQL)",
            waits.batch_size.clone(),
        );
        let times = &crate::compute::job_times::JOB_TIMES;
        self.registry.register(
            "job_queue_wait_seconds",
            "Time jobs this process started waited from QUEUED to RUNNING",
            times.queue_wait.clone(),
        );
        self.registry.register(
            "job_run_seconds",
            "Time jobs this process ended ran from RUNNING to their end, by final status",
            times.run_time.clone(),
        );
    }

    /// The controller's metrics.
    pub fn controller() -> Metrics {
        let mut metrics = Metrics::unregistered();
        let registry = &mut metrics.registry;
        registry.register("controller_reconciles", "FunctionJob reconciles by outcome", metrics.reconciles.clone());
        registry.register(
            "controller_reconcile_duration_seconds",
            "Time spent in one reconcile",
            metrics.reconcile_seconds.clone(),
        );
        registry.register(
            "controller_reconcile_failures",
            "Failed FunctionJob reconciles by the kind of error",
            metrics.reconcile_failures.clone(),
        );
        registry.register("controller_admitted", "Queued jobs admitted to PENDING", metrics.admitted.clone());
        registry.register(
            "controller_preempted",
            "Backfill jobs stopped for a tenant reclaiming its guarantee",
            metrics.preempted.clone(),
        );
        registry.register(
            "controller_archived_log_bytes",
            "Bytes of job logs archived from pod logs",
            metrics.archived_bytes.clone(),
        );
        registry.register("controller_logs_lost", "Job logs given up as lost", metrics.logs_lost.clone());
        registry.register(
            "controller_collected",
            "Finished FunctionJobs deleted after their keep window",
            metrics.collected.clone(),
        );
        registry.register(
            "controller_infrastructure_retries",
            "Jobs started again on a new pod after the cluster ended their pod",
            metrics.retries.clone(),
        );
        registry.register("controller_leader", "1 while this replica is the acting leader", metrics.leader.clone());
        registry.register("controller_reconciling", "Reconciles running now", metrics.reconciling.clone());
        registry.register(
            "controller_watch_errors",
            "Errors of the controller's watches by watch (each opened again after its backoff)",
            metrics.watch_errors.clone(),
        );
        registry.register(
            "controller_reconciles_not_in_store",
            "Reconciles asked for a FunctionJob the controller's store did not hold then (dropped; the resync reconciles what is held)",
            metrics.not_in_store.clone(),
        );
        metrics.register_jobs();
        metrics
    }

    /// The gateway's metrics.
    pub fn gateway() -> Metrics {
        let mut metrics = Metrics::unregistered();
        let registry = &mut metrics.registry;
        registry.register("http_requests", "API requests by method and answer code", metrics.http_requests.clone());
        registry.register(
            "http_request_duration_seconds",
            "Time to answer an API request",
            metrics.http_seconds.clone(),
        );
        registry.register("run_request_duration_seconds", "Time to answer programs/run/", metrics.run_seconds.clone());
        metrics.register_jobs();
        metrics
    }

    /// Reads the job counts, then renders everything in the Prometheus text format.
    pub async fn render(&self, db: &Db) -> Result<String, crate::db::Error> {
        let counts = jobs::count_by_status(db).await?;
        for status in JobStatus::ALL {
            let count = counts.iter().find(|(s, _)| s == status.as_str()).map_or(0, |(_, n)| *n);
            self.jobs.get_or_create(&StatusLabels { status: status.as_str() }).set(count);
            if status == JobStatus::Queued {
                self.queue_depth.set(count);
            }
        }
        let (waiting, delivered, failed) = crate::db::outbox::counts(db).await?;
        for (state, count) in [("waiting", waiting), ("delivered", delivered), ("failed", failed)] {
            self.outbox.get_or_create(&OutboxLabels { state }).set(count);
        }
        let oldest = crate::db::outbox::pending(db, 1).await?.first().map(|row| row.created);
        let lag = oldest.map_or(0.0, |created| (crate::db::now_micros() - created).max(0) as f64 / 1e6);
        self.outbox_lag.set(lag);
        self.tenants.clear();
        let shares = crate::db::tenants::shares(db).await?;
        for tenant in crate::db::tenants::list(db).await? {
            for (slots, gpu) in [("cpu", false), ("gpu", true)] {
                let share = shares.iter().find(|s| s.tenant == tenant.name && s.gpu == gpu);
                let guaranteed = if gpu { tenant.gpu_guaranteed } else { tenant.cpu_guaranteed };
                let (used, firm, waiting) = share.map_or((0, 0, 0), |s| (s.used, s.firm, s.waiting));
                for (figure, value) in [
                    ("guaranteed", guaranteed),
                    ("used", used),
                    ("firm", firm),
                    ("borrowed", (used - guaranteed).max(0)),
                    ("lent", (guaranteed - firm).max(0)),
                    ("waiting", waiting),
                ] {
                    self.tenants.get_or_create(&TenantLabels { tenant: tenant.name.clone(), slots, figure }).set(value);
                }
            }
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).expect("writing to a String");
        Ok(text)
    }
}

#[derive(Clone)]
struct Ops {
    metrics: Arc<Metrics>,
    db: Db,
}

async fn metrics(State(ops): State<Ops>) -> Response {
    match ops.metrics.render(&ops.db).await {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response(),
        Err(error) => {
            tracing::warn!(error = &error as &dyn std::error::Error, "metrics: database unavailable");
            (StatusCode::SERVICE_UNAVAILABLE, "the database is unavailable\n").into_response()
        }
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(ops): State<Ops>) -> Response {
    match ops.db.ping().await {
        Ok(()) => "ok\n".into_response(),
        Err(error) => {
            tracing::warn!(error = &error as &dyn std::error::Error, "readyz: database unavailable");
            (StatusCode::SERVICE_UNAVAILABLE, "the database is unavailable\n").into_response()
        }
    }
}

/// The admin port's routes.
pub fn router(metrics: Arc<Metrics>, db: Db) -> Router {
    Router::new()
        .route("/metrics", get(self::metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(Ops { metrics, db })
}

/// Serves the admin port until the process ends.
pub async fn serve(listen: SocketAddr, metrics: Arc<Metrics>, db: Db) -> anyhow::Result<()> {
    serve_on(bind_admin(listen).await?, metrics, db).await
}

/// Binds the admin port, so that a role can fail its start when the port is taken.
pub async fn bind_admin(listen: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(listen).await.with_context(|| format!("failed to listen on {listen} (admin port)"))
}

/// Serves the admin port on a bound `listener` until the process ends.
pub async fn serve_on(listener: tokio::net::TcpListener, metrics: Arc<Metrics>, db: Db) -> anyhow::Result<()> {
    tracing::info!(address = %listener.local_addr()?, "admin port: /metrics, /healthz, /readyz");
    axum::serve(listener, router(metrics, db)).await.context("admin server failed")
}

/// Counts and times every API request (a layer around the gateway's routes).
pub async fn record_http(State(metrics): State<Arc<Metrics>>, request: Request, next: Next) -> Response {
    let method = request.method().to_string();
    let run = request.uri().path().trim_end_matches('/') == "/api/v1/programs/run";
    let started = Instant::now();
    let response = next.run(request).await;
    let seconds = started.elapsed().as_secs_f64();
    metrics.http_seconds.observe(seconds);
    if run {
        metrics.run_seconds.observe(seconds);
    }
    metrics.http_requests.get_or_create(&HttpLabels { method, code: response.status().as_u16() }).inc();
    response
}

/// Refuses the embedded backends where replicas and pods must share state.
pub fn require_shared_backends(role: &str, database: &DatabaseArgs, storage: &Storage) -> anyhow::Result<()> {
    if !database.url().starts_with("postgres") {
        bail!(
            "gantry {role} needs PostgreSQL (--database-url postgres://...): SQLite cannot be shared by several processes on a cluster"
        );
    }
    if !matches!(storage, Storage::S3 { .. }) {
        bail!(
            "gantry {role} needs S3 storage (--storage s3://bucket[/prefix]): a local directory cannot be shared with job pods"
        );
    }
    Ok(())
}

/// Serves the API until `shutdown` resolves (then for at most the shutdown grace), under the
/// connection limits; with `metrics`, every request is counted and timed.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    state: AppState,
    metrics: Option<Arc<Metrics>>,
    limits: ConnectionLimits,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    // A shutdown first ends the live streams (each with a `restarting` event), so the grace is
    // spent on requests that finish, not on streams that would only be cut.
    let follows = Arc::clone(&state.follows);
    let shutdown = async move {
        shutdown.await;
        follows.drain();
    };
    let app = api::app(state);
    match metrics {
        Some(metrics) => {
            let layer = axum::middleware::from_fn_with_state(metrics, record_http);
            connections::serve(listener, tower::Layer::layer(&layer, app), limits, shutdown).await
        }
        None => connections::serve(listener, app, limits, shutdown).await,
    }
    .context("server failed")
}

/// How often a running server removes the spool files no upload holds.
pub const SPOOL_SWEEP_PERIOD: std::time::Duration = std::time::Duration::from_secs(60);

/// Removes what uploads cut by a crash left in the spool (at start), saying so when there was
/// any, then sweeps it every `period` while the server runs (a failed or killed upload of any
/// server sharing the folder never leaves disk behind for longer).
pub fn keep_spool_clean(spool: &std::path::Path, period: std::time::Duration) -> tokio::task::JoinHandle<()> {
    match crate::api::fields::clean_spool(spool) {
        Ok(0) => {}
        Ok(removed) => println!("removed {removed} file(s) left in {} by uploads cut short", spool.display()),
        Err(error) => crate::telemetry::operator_warning(&format!(
            "warning: failed to clean the upload spool {}: {error}",
            spool.display()
        )),
    }
    let spool = spool.to_path_buf();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(period).await;
            let folder = spool.clone();
            match tokio::task::spawn_blocking(move || crate::api::fields::clean_spool(&folder)).await {
                Ok(Ok(0)) => {}
                Ok(Ok(removed)) => {
                    tracing::info!(removed, spool = %spool.display(), "removed spool files no upload holds")
                }
                Ok(Err(error)) => tracing::warn!(%error, spool = %spool.display(), "failed to sweep the upload spool"),
                Err(_) => {}
            }
        }
    })
}
