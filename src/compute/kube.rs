//! The Kubernetes backend of the gateway (`gantry gateway`): every committed job becomes a
//! `FunctionJob` named after its id, with a Secret owned by it carrying what the pod needs (the
//! caller's token, the function's variables). `gantry controller` does the rest. A stop sets
//! the resource's stop request; live logs come from the pod's log. A periodic sweep repairs
//! drift both ways, so a failed create never strands a job and a resource without its job row
//! does not linger.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, LogParams, Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::{Map, Value, json};

use super::{Compute, StopOutcome, stop_without_process};
use crate::crd::{
    FIELD_MANAGER, FunctionJob, FunctionJobSpec, FunctionRef, FunctionSize, JobResources, LABEL_FUNCTION, LABEL_JOB_ID,
    LABEL_USER, SECRET_ACCESS_KEY, SECRET_ENV_PREFIX, SECRET_TOKEN_KEY, label_value, pod_name, secret_name,
};
use crate::db::{self, Db, jobs};
use crate::domain::logs::LogRouter;
use crate::domain::sizes::{self, Resources};
use crate::domain::usage::Allocation;
use crate::events::Publisher;
use crate::secrets::TokenCipher;
use crate::storage::access::JobAccess;
use crate::storage::{Storage, keys};
use crate::telemetry::context;
use tracing::Instrument;

/// Where the cluster is and which namespace jobs live in; shared by gateway and controller.
#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// Namespace of the FunctionJobs, their pods and Secrets. Default: the namespace of the
    /// kubeconfig's context, or of the pod Gantry runs in.
    #[arg(long, env = "GANTRY_NAMESPACE")]
    pub namespace: Option<String>,
}

impl ClusterArgs {
    /// A client found the standard way (in-cluster service account, else `KUBECONFIG` /
    /// `~/.kube/config`) and the namespace to use.
    pub async fn connect(&self) -> anyhow::Result<(kube::Client, String)> {
        let client = kube::Client::try_default().await.context(
            "failed to reach a Kubernetes cluster (in-cluster service account, KUBECONFIG or ~/.kube/config)",
        )?;
        let namespace = self.namespace.clone().unwrap_or_else(|| client.default_namespace().to_string());
        Ok((client, namespace))
    }
}

/// Longest validity of a presigned URL (S3's limit).
const MAX_ACCESS: Duration = Duration::from_secs(7 * 24 * 3600);

/// Settings of the Kubernetes backend.
#[derive(Debug, Clone)]
pub struct KubeSettings {
    pub namespace: String,
    /// `PROGRAM_TIMEOUT`, the pods' deadline.
    pub timeout: Duration,
    /// Resources of jobs whose size names no compute profile.
    pub default_resources: Resources,
    /// `FUNCTIONS_LOGS_SIZE_LIMIT`, for live logs read from pods.
    pub logs_size_limit: usize,
    /// How often the drift sweep runs.
    pub sweep_every: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to read job {job_id}")]
    Database { job_id: String, source: db::Error },
    #[error("job {job_id} is gone")]
    JobGone { job_id: String },
    #[error("failed to open the token of job {job_id}")]
    Token { job_id: String, source: crate::secrets::Error },
    #[error("failed to {operation} for job {job_id}")]
    Kube { operation: &'static str, job_id: String, source: kube::Error },
    #[error("failed to prepare the storage access of job {job_id}")]
    Storage { job_id: String, source: crate::storage::Error },
}

/// The gateway's side of the cluster.
pub struct KubeBackend {
    pub client: kube::Client,
    pub db: Db,
    pub storage: Storage,
    pub publisher: Arc<dyn Publisher>,
    pub tokens: TokenCipher,
    pub settings: KubeSettings,
}

/// The `FunctionJob` spec of a job (pure).
pub fn function_job_spec(
    job: &jobs::JobRow,
    launch: &jobs::LaunchRow,
    default_resources: &Resources,
    timeout: Duration,
) -> FunctionJobSpec {
    let catalog: Map<String, Value> =
        launch.function_sizes.as_deref().and_then(|s| serde_json::from_str(s).ok()).unwrap_or_default();
    let resources = sizes::job_resources(&catalog, job.function_size.as_deref(), job.gpu, default_resources);
    let function_env: Map<String, Value> =
        launch.function_env_vars.as_deref().and_then(|s| serde_json::from_str(s).ok()).unwrap_or_default();
    FunctionJobSpec {
        job_id: job.id.clone(),
        function: FunctionRef {
            title: job.program_title.clone().unwrap_or_default(),
            provider: job.provider_name.clone(),
            version: launch.function_version.clone(),
        },
        image: launch.image.clone(),
        artifact: launch.artifact_key.clone().filter(|_| launch.image.is_none()),
        entrypoint: launch.entrypoint.clone(),
        size: job.function_size.as_deref().and_then(|label| serde_json::from_value::<FunctionSize>(json!(label)).ok()),
        resources: JobResources { cpu: Some(Quantity(resources.cpu)), memory: Some(Quantity(resources.memory)) },
        gpus: resources.gpus,
        gpu_model: resources.gpu_model.clone(),
        compute_profile: sizes::job_profile(&catalog, job.function_size.as_deref()).map(str::to_string),
        timeout_seconds: timeout.as_secs().max(1),
        user: job.author_name.clone(),
        function_env: function_env.keys().filter(|name| is_env_name(name)).cloned().collect(),
        stop_requested: job.stop_requested,
        retry_after_start: launch.retry_after_start.unwrap_or(false),
        secret_name: secret_name(&job.id),
    }
}

fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// What a FunctionJob's pod is given, as the usage ledger records it.
fn allocation_of(spec: &FunctionJobSpec) -> Allocation {
    let quantity = |q: &Option<Quantity>| q.as_ref().map(|q| q.0.clone()).unwrap_or_default();
    let resources = Resources {
        cpu: quantity(&spec.resources.cpu),
        memory: quantity(&spec.resources.memory),
        gpus: spec.gpus,
        gpu_model: spec.gpu_model.clone(),
    };
    Allocation::of(&resources, spec.compute_profile.as_deref())
}

fn labels(spec: &FunctionJobSpec) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_JOB_ID.to_string(), label_value(&spec.job_id)),
        (LABEL_FUNCTION.to_string(), label_value(&spec.function.title)),
        (LABEL_USER.to_string(), label_value(&spec.user)),
    ])
}

impl KubeBackend {
    fn jobs_api(&self) -> Api<FunctionJob> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    /// Creates (or re-applies) the job's `FunctionJob` and its Secret. Idempotent.
    pub async fn ensure_resources(&self, job_id: &str) -> Result<(), Error> {
        let span = super::job_step(&self.db, "gantry.functionjob.apply", job_id).await;
        self.ensure_resources_traced(job_id).instrument(span).await
    }

    async fn ensure_resources_traced(&self, job_id: &str) -> Result<(), Error> {
        let database = |source| Error::Database { job_id: job_id.to_string(), source };
        let kube = |operation| move |source| Error::Kube { operation, job_id: job_id.to_string(), source };
        let jobs::Launch { job, info: launch } =
            jobs::launch(&self.db, job_id).await.map_err(database)?.ok_or(Error::JobGone { job_id: job_id.into() })?;
        if job.status().is_terminal() {
            // Finished (stopped while queued, or collected after its keep window): never made again.
            return Ok(());
        }
        let spec = function_job_spec(&job, &launch, &self.settings.default_resources, self.settings.timeout);
        // What its pod gets: what the usage ledger meters its run with.
        jobs::record_allocation(&self.db, job_id, &allocation_of(&spec)).await.map_err(database)?;
        let mut resource = FunctionJob::new(job_id, spec.clone());
        resource.metadata.labels = Some(labels(&spec));
        // Born with the controller's finalizer: the controller need not add it (one write and
        // one reconcile less per job), and the archive is settled before the resource goes.
        resource.metadata.finalizers = Some(vec![crate::crd::FINALIZER.to_string()]);
        // The job's trace, continued by the controller's reconciles and the pod.
        if let Some(traceparent) = context::current().or(launch.traceparent.clone()) {
            resource.metadata.annotations =
                Some(BTreeMap::from([(crate::crd::ANNOTATION_TRACEPARENT.to_string(), traceparent)]));
        }
        // The Secret first, so no pod of this job ever starts without it.
        let request_env: Map<String, Value> = serde_json::from_str(&launch.env_vars).unwrap_or_default();
        let token = match request_env.get("token").and_then(Value::as_str) {
            Some(sealed) => {
                self.tokens.open(sealed).map_err(|source| Error::Token { job_id: job_id.into(), source })?
            }
            None => String::new(),
        };
        // The pod's only way to its objects: the arguments, stored for it, and presigned URLs.
        let storage_error = |source| Error::Storage { job_id: job_id.to_string(), source };
        self.storage
            .put_bytes(&keys::job_arguments(job_id), launch.arguments.clone().into())
            .await
            .map_err(storage_error)?;
        let valid_for = (self.settings.timeout + Duration::from_secs(3600)).min(MAX_ACCESS);
        let access = JobAccess::presign(&self.storage, job_id, spec.artifact.as_deref(), valid_for)
            .await
            .map_err(storage_error)?;
        let access = serde_json::to_vec(&access).expect("job access serializes");
        let mut data = BTreeMap::from([
            (SECRET_TOKEN_KEY.to_string(), ByteString(token.into_bytes())),
            (SECRET_ACCESS_KEY.to_string(), ByteString(access)),
        ]);
        // The job calls back on the caller's channel and instance (runtime_platform checks them).
        for (key, field) in [(crate::crd::SECRET_CHANNEL_KEY, "channel"), (crate::crd::SECRET_INSTANCE_KEY, "instance")]
        {
            if let Some(text) = request_env.get(field).and_then(Value::as_str) {
                data.insert(key.to_string(), ByteString(text.as_bytes().to_vec()));
            }
        }
        data.insert(
            crate::crd::SECRET_TRIAL_KEY.to_string(),
            ByteString(if launch.trial { "True" } else { "False" }.as_bytes().to_vec()),
        );
        let function_env: Map<String, Value> =
            launch.function_env_vars.as_deref().and_then(|s| serde_json::from_str(s).ok()).unwrap_or_default();
        for (name, value) in function_env.iter().filter(|(name, _)| is_env_name(name)) {
            let text = value.as_str().map(str::to_string).unwrap_or_else(|| value.to_string());
            data.insert(format!("{SECRET_ENV_PREFIX}{name}"), ByteString(text.into_bytes()));
        }
        let mut secret = Secret {
            metadata: ObjectMeta {
                name: Some(spec.secret_name.clone()),
                namespace: Some(self.settings.namespace.clone()),
                labels: Some(labels(&spec)),
                ..Default::default()
            },
            data: Some(data),
            type_: Some("Opaque".into()),
            ..Default::default()
        };
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.settings.namespace);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        secrets
            .patch(&spec.secret_name, &params, &Patch::Apply(&secret))
            .await
            .map_err(kube("apply the job's Secret"))?;
        let applied = self
            .jobs_api()
            .patch(job_id, &params, &Patch::Apply(&resource))
            .await
            .map_err(kube("apply the FunctionJob"))?;
        if applied.metadata.deletion_timestamp.is_some() {
            // A late repeat for a job whose resource is already going: its Secret must not
            // outlive it (the controller may have deleted it already).
            return match secrets.delete(&spec.secret_name, &DeleteParams::default()).await {
                Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
                outcome => outcome.map(|_| ()).map_err(kube("delete the job's Secret")),
            };
        }
        // Owned by the resource, so it goes with it (the whole object again: an apply owns
        // exactly the fields it sends).
        secret.metadata.owner_references = applied.controller_owner_ref(&()).map(|owner| vec![owner]);
        secrets
            .patch(&spec.secret_name, &params, &Patch::Apply(&secret))
            .await
            .map_err(kube("own the job's Secret"))?;
        Ok(())
    }

    /// One drift sweep: non-terminal jobs without a resource get one; resources whose job row
    /// is gone are deleted (see `drift`).
    ///
    /// The jobs are read before the resources are listed, and only those older than one sweep
    /// interval count: a job whose run is still making its resources, or that was given them
    /// after the jobs were read, is never made a second time (a second making could bring back
    /// the Secret of a job that just ended, after the controller deleted it).
    pub async fn sweep(&self) -> Result<(), Error> {
        let database = |source| Error::Database { job_id: String::new(), source };
        let grace = i64::try_from(self.settings.sweep_every.as_micros()).unwrap_or(i64::MAX);
        let cutoff = crate::db::now_micros().saturating_sub(grace);
        let active: HashSet<String> = jobs::active_ids(&self.db, cutoff).await.map_err(database)?.into_iter().collect();
        let listed = self.jobs_api().list(&ListParams::default()).await.map_err(|source| Error::Kube {
            operation: "list FunctionJobs",
            job_id: String::new(),
            source,
        })?;
        let resources: Vec<(String, String)> =
            listed.items.iter().map(|r| (r.name_any(), r.spec.job_id.clone())).collect();
        // Only resources of jobs that are not active can have lost their row.
        let unsure: Vec<String> =
            resources.iter().map(|(_, id)| id.clone()).filter(|id| !active.contains(id)).collect();
        let existing = jobs::existing_ids(&self.db, &unsure).await.map_err(database)?;
        let repairs = drift(&active, &resources, &existing);
        for job_id in &repairs.create {
            tracing::warn!(job.id = %job_id, "job has no FunctionJob; creating it");
            if let Err(error) = self.ensure_resources(job_id).await {
                tracing::error!(error = &error as &dyn std::error::Error, "failed to repair a job's FunctionJob");
            }
        }
        for name in &repairs.delete {
            tracing::warn!(resource = %name, "FunctionJob without a job row; deleting it");
            let _ = self.jobs_api().delete(name, &DeleteParams::default()).await;
        }
        Ok(())
    }

    /// Runs the drift sweep until the process ends.
    pub async fn run_sweeps(self: Arc<Self>) {
        loop {
            if let Err(error) = self.sweep().await {
                tracing::error!(error = &error as &dyn std::error::Error, "drift sweep failed");
            }
            tokio::time::sleep(self.settings.sweep_every).await;
        }
    }
}

/// What a drift sweep repairs.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Repairs {
    /// Active jobs without a resource: create theirs.
    pub create: Vec<String>,
    /// Resources (by name) whose job row is gone: delete them.
    pub delete: Vec<String>,
}

/// The drift decision, pure: `active` are the non-terminal jobs, `resources` the listed
/// `(name, job id)` pairs, `existing` the job ids among them known to have a row (besides the
/// active ones). A finished job's resource is left to the controller, which collects it after its
/// keep window; it is never made again. Nothing else is touched.
pub fn drift(active: &HashSet<String>, resources: &[(String, String)], existing: &HashSet<String>) -> Repairs {
    let present: HashSet<&str> = resources.iter().map(|(_, id)| id.as_str()).collect();
    let mut create: Vec<String> = active.iter().filter(|id| !present.contains(id.as_str())).cloned().collect();
    create.sort();
    let delete = resources
        .iter()
        .filter(|(_, id)| !active.contains(id) && !existing.contains(id))
        .map(|(name, _)| name.clone())
        .collect();
    Repairs { create, delete }
}

#[async_trait::async_trait]
impl Compute for KubeBackend {
    /// The cluster decides: a pod that cannot start ends its job with the reason.
    fn can_run(&self, _image: bool, _resources: &Resources) -> Result<(), String> {
        Ok(())
    }

    /// Creates the job's resources; a failure is logged and repaired by the sweep.
    async fn submit(self: Arc<Self>, job_id: &str) {
        if let Err(error) = self.ensure_resources(job_id).await {
            tracing::error!(job.id = %job_id, error = &error as &dyn std::error::Error, "failed to create the job's FunctionJob; the sweep will retry");
        }
    }

    /// Records the request (a queued job stops at once) and sets the resource's stop request;
    /// the controller stops the pod.
    async fn stop(self: Arc<Self>, job_id: &str) -> Result<StopOutcome, db::Error> {
        let outcome = stop_without_process(&self.db, &self.publisher, job_id).await?;
        if outcome == StopOutcome::Requested {
            let patch = json!({"spec": {"stopRequested": true}});
            if let Err(error) = self.jobs_api().patch(job_id, &PatchParams::default(), &Patch::Merge(&patch)).await {
                tracing::error!(job.id = %job_id, error = &error as &dyn std::error::Error, "failed to request the stop on the FunctionJob");
            }
        }
        Ok(outcome)
    }

    /// The pod's log so far, split by prefix as the launcher splits it.
    async fn live_log(self: Arc<Self>, job_id: &str, provider: bool) -> Option<String> {
        let job = jobs::find(&self.db, job_id).await.ok()??;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.settings.namespace);
        let params = LogParams { container: Some(crate::crd::JOB_CONTAINER.into()), ..Default::default() };
        let text = pods.logs(&pod_name(job_id), &params).await.ok()?;
        let mut router = LogRouter::new(job.provider_id.is_some(), self.settings.logs_size_limit);
        router.push_text(&text);
        Some(if provider { router.provider.render() } else { router.user.render() })
    }

    async fn reconcile(self: Arc<Self>) -> Result<(), db::Error> {
        if let Err(error) = self.sweep().await {
            tracing::error!(error = &error as &dyn std::error::Error, "drift sweep failed");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[&str]) -> HashSet<String> {
        ids.iter().map(|id| id.to_string()).collect()
    }

    fn listed(ids: &[&str]) -> Vec<(String, String)> {
        ids.iter().map(|id| (id.to_string(), id.to_string())).collect()
    }

    #[test]
    fn an_active_job_without_its_resource_gets_one() {
        let repairs = drift(&set(&["b", "a", "c"]), &listed(&["c"]), &set(&[]));
        assert_eq!(repairs, Repairs { create: vec!["a".into(), "b".into()], delete: vec![] });
    }

    #[test]
    fn a_resource_whose_job_row_is_gone_is_deleted_and_finished_jobs_keep_theirs() {
        let repairs = drift(&set(&["a"]), &listed(&["a", "finished", "gone"]), &set(&["finished"]));
        assert_eq!(repairs, Repairs { create: vec![], delete: vec!["gone".into()] });
    }

    #[test]
    fn nothing_to_repair_when_all_match() {
        assert_eq!(drift(&set(&["a"]), &listed(&["a"]), &set(&[])), Repairs::default());
    }
}
