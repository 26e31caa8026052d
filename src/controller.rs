//! The Kubernetes controller (`gantry controller`): drives each `FunctionJob` towards its spec.
//! What to build, what was observed and what to do about it are pure functions (`build`,
//! `status`, `plan`); `reconcile` is the I/O shell around them. This module holds the role's
//! settings.

pub mod build;
pub mod lead;
pub mod leader;
pub mod plan;
pub mod reconcile;
pub mod retry;
pub mod seen;
pub mod status;
pub mod timers;
pub mod triggers;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use crate::compute::kube::ClusterArgs;
use crate::db::DatabaseArgs;
use crate::ops::require_shared_backends;
use crate::storage::StorageArgs;
use build::{Placement, PodSettings};
use leader::LeaseSettings;
use reconcile::{Context, ControllerSettings};

/// `key=value,key=value` into a map (node selectors).
fn parse_map(text: &str) -> Result<BTreeMap<String, String>, String> {
    text.split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| format!("'{pair}' is not key=value"))
        })
        .collect()
}

/// Tolerations given as one JSON list (`[{"key": ..., "operator": ..., "effect": ...}]`).
#[derive(Debug, Clone, Default)]
pub struct Tolerations(pub Vec<k8s_openapi::api::core::v1::Toleration>);

fn parse_tolerations(text: &str) -> Result<Tolerations, String> {
    if text.trim().is_empty() {
        return Ok(Tolerations::default());
    }
    serde_json::from_str(text).map(Tolerations).map_err(|error| format!("not a JSON list of tolerations: {error}"))
}

#[derive(Debug, Args)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    pub events: crate::events::EventArgs,
    #[command(flatten)]
    pub storage: StorageArgs,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Image running functions uploaded as code: Python with qiskit-serverless.
    #[arg(long, env = "GANTRY_RUNNER_IMAGE", default_value = "ghcr.io/gantry-dev/gantry-runner:latest")]
    pub runner_image: String,
    /// Image holding the gantry binary; its init container copies the launcher into each job.
    #[arg(long, env = "GANTRY_LAUNCHER_IMAGE", default_value = "ghcr.io/gantry-dev/gantry:latest")]
    pub launcher_image: String,
    /// Path of the gantry binary inside the launcher image.
    #[arg(long, env = "GANTRY_LAUNCHER_SOURCE", default_value = "/usr/local/bin/gantry")]
    pub launcher_source: String,
    /// Folder where a job's container finds the launcher.
    #[arg(long, env = "GANTRY_LAUNCHER_DIR", default_value = "/gantry")]
    pub launcher_dir: String,
    /// Python inside job images.
    #[arg(long, env = "GANTRY_JOB_PYTHON", default_value = "python3")]
    pub job_python: String,
    /// Where a provider's container image holds the function's code.
    #[arg(long, env = "CUSTOM_IMAGE_PACKAGE_PATH", default_value = "/runner")]
    pub image_code_dir: String,
    /// A job's private folder inside its pod.
    #[arg(long, env = "GANTRY_JOB_WORK_DIR", default_value = "/work")]
    pub job_work_dir: String,
    /// `DATA_PATH` inside job pods.
    #[arg(long, env = "GANTRY_JOB_DATA_DIR", default_value = "/data")]
    pub job_data_dir: String,
    /// Base URL job pods call the gateway at (`ENV_JOB_GATEWAY_HOST`), e.g. the gateway's Service.
    #[arg(long, env = "GANTRY_PUBLIC_URL", default_value = "http://gantry:8000")]
    pub public_url: String,
    /// Given to jobs as `QISKIT_IBM_URL`.
    #[arg(long, env = "QISKIT_IBM_URL", default_value = "https://cloud.ibm.com")]
    pub qiskit_ibm_url: String,
    /// Extended resource name of GPUs.
    #[arg(long, env = "GANTRY_GPU_RESOURCE", default_value = "nvidia.com/gpu")]
    pub gpu_resource: String,
    /// Node selector of GPU jobs (`key=value,...`).
    #[arg(long, env = "GANTRY_GPU_NODE_SELECTOR", default_value = "", value_parser = parse_map)]
    pub gpu_node_selector: BTreeMap<String, String>,
    /// Node label naming a node's GPU product (NVIDIA's GPU feature discovery sets it): a job
    /// whose compute profile names a GPU model goes to nodes whose label has that model's value.
    #[arg(long, env = "GANTRY_GPU_MODEL_LABEL", default_value = "nvidia.com/gpu.product")]
    pub gpu_model_label: String,
    /// That label's value per profile model (`a100p=NVIDIA-A100-PCIE-40GB,l40s=NVIDIA-L40S`);
    /// a model not listed selects `NVIDIA-<MODEL>`.
    #[arg(long, env = "GANTRY_GPU_MODELS", default_value = "", value_parser = parse_map)]
    pub gpu_models: BTreeMap<String, String>,
    /// Node selector of CPU jobs (`key=value,...`).
    #[arg(long, env = "GANTRY_CPU_NODE_SELECTOR", default_value = "", value_parser = parse_map)]
    pub cpu_node_selector: BTreeMap<String, String>,
    /// Tolerations of GPU jobs' pods: a JSON list, e.g.
    /// `[{"key":"nvidia.com/gpu","operator":"Exists","effect":"NoSchedule"}]`.
    #[arg(long, env = "GANTRY_GPU_TOLERATIONS", default_value = "", value_parser = parse_tolerations)]
    pub gpu_tolerations: Tolerations,
    /// Tolerations of CPU jobs' pods: a JSON list.
    #[arg(long, env = "GANTRY_CPU_TOLERATIONS", default_value = "", value_parser = parse_tolerations)]
    pub cpu_tolerations: Tolerations,
    /// Priority class of GPU jobs.
    #[arg(long, env = "GANTRY_GPU_PRIORITY_CLASS")]
    pub gpu_priority_class: Option<String>,
    /// Priority class of CPU jobs.
    #[arg(long, env = "GANTRY_CPU_PRIORITY_CLASS")]
    pub cpu_priority_class: Option<String>,
    /// Image pull secrets of job pods (comma-separated names).
    #[arg(long, env = "GANTRY_IMAGE_PULL_SECRETS", value_delimiter = ',')]
    pub image_pull_secrets: Vec<String>,
    /// Non-root user (and group) of job processes.
    #[arg(long, env = "GANTRY_JOB_USER", default_value_t = 65532)]
    pub job_user: i64,
    #[command(flatten)]
    pub limits: crate::compute::LimitsArgs,
    /// Seconds a pod may stay unschedulable before its job fails.
    #[arg(long, env = "GANTRY_PENDING_DEADLINE_SECONDS", default_value_t = 600)]
    pub pending_deadline_seconds: u64,
    /// Seconds a finished job's pod is kept (for `kubectl logs`) before it is deleted.
    #[arg(long, env = "GANTRY_KEEP_FINISHED_PODS_SECONDS", default_value_t = 0)]
    pub keep_finished_pods_seconds: u64,
    /// Seconds a finished job's FunctionJob is kept (`kubectl get fj` shows the recent past)
    /// before it is deleted; 0 deletes it as soon as its log, pod and Secret are settled. The job
    /// stays in the database and its objects in storage either way.
    #[arg(long, env = "GANTRY_KEEP_FINISHED_JOBS_SECONDS", default_value_t = 3600)]
    pub keep_finished_jobs_seconds: u64,
    /// Seconds reading a finished pod's log for archiving is retried (with backoff, also while
    /// its FunctionJob is being deleted) before the log is given up as lost, with a Warning.
    #[arg(long, env = "GANTRY_ARCHIVE_GIVE_UP_SECONDS", default_value_t = 600)]
    pub archive_give_up_seconds: u64,
    /// Times a job whose pod the cluster ended (evicted, preempted, node lost, pod deleted by
    /// the cluster) is started again on a new pod: always before the function's code started,
    /// after it only when the function opted in (`retry_after_start`).
    #[arg(long, env = "GANTRY_INFRASTRUCTURE_RETRIES", default_value_t = 2)]
    pub infrastructure_retries: u32,
    /// Seconds before the first of those retries; each next one waits twice as long (at most 5
    /// minutes).
    #[arg(long, env = "GANTRY_INFRASTRUCTURE_RETRY_BACKOFF_SECONDS", default_value_t = 5)]
    pub infrastructure_retry_backoff_seconds: u64,
    /// Milliseconds between admission passes when no queued job wakes one.
    #[arg(long, env = "GANTRY_SCHEDULER_TICK_MS", default_value_t = 500)]
    pub scheduler_tick_ms: u64,
    /// Reconciles running at once (bounds memory and API load with many jobs).
    #[arg(long, env = "GANTRY_RECONCILE_CONCURRENCY", default_value_t = 64)]
    pub reconcile_concurrency: u16,
    /// Seconds one reconcile may take before it is cut (as a crash at that point would) and
    /// retried: a request that never answers cannot hold a reconcile slot for good.
    #[arg(long, env = "GANTRY_RECONCILE_TIMEOUT_SECONDS", default_value_t = 120)]
    pub reconcile_timeout_seconds: u64,
    /// Seconds between reconciles of every FunctionJob the controller holds, whatever woke it
    /// or not, but those its resource and its job row both say are queued: a wake lost (a
    /// resource missing from the controller's store while its watch was relisting) costs at
    /// most this long.
    #[arg(long, env = "GANTRY_RESYNC_SECONDS", default_value_t = 120)]
    pub resync_seconds: u64,
    /// Largest size in bytes of each log archived from a pod.
    #[arg(long, env = "FUNCTIONS_LOGS_SIZE_LIMIT", default_value_t = 52_428_800)]
    pub logs_size_limit: usize,
    /// Largest size in MiB a job's artifact may unpack to (as the gateway's
    /// `--max-unpacked-mib`); the job fails, naming it, before its launcher writes past it.
    #[arg(long, env = "GANTRY_MAX_UNPACKED_MIB", default_value_t = crate::artifact::DEFAULT_MAX_UNPACKED_MIB)]
    pub max_unpacked_mib: u64,
    /// Elect one acting replica on a Lease (`false` only for a single replica known to be alone).
    #[arg(long, env = "GANTRY_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    /// Name of the Lease the replicas elect their leader on.
    #[arg(long, env = "GANTRY_LEASE_NAME", default_value = "gantry-controller")]
    pub lease_name: String,
    /// Seconds a silent leader keeps the lease before another replica takes it.
    #[arg(long, env = "GANTRY_LEASE_DURATION_SECONDS", default_value_t = 15)]
    pub lease_duration_seconds: u64,
    /// Seconds the leader keeps acting without renewing (shorter than the duration).
    #[arg(long, env = "GANTRY_LEASE_RENEW_DEADLINE_SECONDS", default_value_t = 10)]
    pub lease_renew_deadline_seconds: u64,
    /// Admin port: `/metrics`, `/healthz`, `/readyz`.
    #[arg(long, env = "GANTRY_ADMIN_LISTEN", default_value = "0.0.0.0:9090")]
    pub admin_listen: std::net::SocketAddr,
    /// This replica's identity on the Lease and on its Events (default: the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
}

/// The most `--infrastructure-retries` allows (a larger value is lowered to it).
pub const MAX_INFRASTRUCTURE_RETRIES: u32 = 10;

/// The host name with a random suffix: unique per process.
fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = if host.trim().is_empty() { "gantry-controller" } else { host.trim() };
    format!("{host}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

impl ControllerArgs {
    pub fn settings(&self, namespace: String) -> ControllerSettings {
        ControllerSettings {
            namespace,
            pods: PodSettings {
                runner_image: self.runner_image.clone(),
                launcher_image: self.launcher_image.clone(),
                launcher_source: self.launcher_source.clone(),
                launcher_dir: self.launcher_dir.clone(),
                python: self.job_python.clone(),
                image_code_dir: self.image_code_dir.clone(),
                work_dir: self.job_work_dir.clone(),
                data_dir: self.job_data_dir.clone(),
                gateway_url: self.public_url.clone(),
                qiskit_ibm_url: self.qiskit_ibm_url.clone(),
                gpu_resource: self.gpu_resource.clone(),
                gpu_placement: Placement {
                    node_selector: self.gpu_node_selector.clone(),
                    tolerations: self.gpu_tolerations.0.clone(),
                    priority_class: self.gpu_priority_class.clone(),
                },
                gpu_models: build::GpuModelLabels {
                    label: self.gpu_model_label.clone(),
                    values: self.gpu_models.clone(),
                },
                cpu_placement: Placement {
                    node_selector: self.cpu_node_selector.clone(),
                    tolerations: self.cpu_tolerations.0.clone(),
                    priority_class: self.cpu_priority_class.clone(),
                },
                image_pull_secrets: self.image_pull_secrets.clone(),
                run_as_user: self.job_user,
                logs_size_limit: self.logs_size_limit as u64,
                max_unpacked_mib: self.max_unpacked_mib,
                telemetry: crate::telemetry::forwarded(std::env::vars()),
            },
            pending_deadline: Duration::from_secs(self.pending_deadline_seconds),
            keep_finished_pods: Duration::from_secs(self.keep_finished_pods_seconds),
            keep_finished_jobs: Duration::from_secs(self.keep_finished_jobs_seconds),
            archive_give_up: Duration::from_secs(self.archive_give_up_seconds),
            infrastructure_retries: self.infrastructure_retries.min(MAX_INFRASTRUCTURE_RETRIES),
            retry_backoff: Duration::from_secs(self.infrastructure_retry_backoff_seconds.min(300)),
            limits: self.limits.limits(crate::compute::CLUSTER_GPU_SLOTS),
            fair_share: self.limits.fair_share(),
            admission_every: Duration::from_millis(self.scheduler_tick_ms.max(10)),
            concurrency: self.reconcile_concurrency.max(1),
            reconcile_timeout: Duration::from_secs(self.reconcile_timeout_seconds.max(1)),
            resync_every: Duration::from_secs(self.resync_seconds.max(1)),
            logs_size_limit: self.logs_size_limit,
            identity: self.identity.clone().unwrap_or_else(default_identity),
            leader: self.leader_election.then(|| LeaseSettings {
                name: self.lease_name.clone(),
                duration: Duration::from_secs(self.lease_duration_seconds.max(2)),
                renew_deadline: Duration::from_secs(
                    self.lease_renew_deadline_seconds.clamp(1, self.lease_duration_seconds.max(2) - 1),
                ),
                retry_every: Duration::from_secs(2)
                    .min(Duration::from_secs(self.lease_renew_deadline_seconds.max(1)) / 2),
            }),
        }
    }

    pub async fn run(self) -> anyhow::Result<()> {
        let storage = self.storage.open(&self.database.data_dir)?;
        require_shared_backends("controller", &self.database, &storage)?;
        let db = self.database.open().await?;
        storage.check().await.context("object storage is not reachable")?;
        self.limits.seed_tenants(&db).await?;
        let (client, namespace) = self.cluster.connect().await?;
        let crds: kube::Api<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        > = kube::Api::all(client.clone());
        crds.get("functionjobs.gantry.dev").await.context(
            "the FunctionJob CRD is not installed: run `gantry crd | kubectl apply -f -` (or install the Helm chart)",
        )?;
        println!("gantry controller running FunctionJobs in namespace {namespace}");
        let publisher = self.events.start(&db).await?;
        let context = Arc::new(Context::new(client, db.clone(), storage, publisher, self.settings(namespace)));
        let admin = tokio::spawn(crate::ops::serve(self.admin_listen, Arc::clone(&context.metrics), db));
        tokio::select! {
            () = lead::run(context) => Ok(()),
            admin = admin => admin.context("admin server stopped")?,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerations_are_a_json_list_and_bad_ones_are_named() {
        let parsed = parse_tolerations(r#"[{"key":"nvidia.com/gpu","operator":"Exists","effect":"NoSchedule"}]"#);
        let parsed = parsed.unwrap().0;
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].key.as_deref(), Some("nvidia.com/gpu"));
        assert!(parse_tolerations("").unwrap().0.is_empty());
        let error = parse_tolerations("gpu=true").unwrap_err();
        assert!(error.starts_with("not a JSON list of tolerations"), "{error}");
    }
}
