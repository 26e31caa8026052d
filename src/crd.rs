//! The `FunctionJob` custom resource (`functionjobs.gantry.dev/v1alpha1`): the contract between
//! the gateway, which creates one per job, and the controller, which turns it into a pod and
//! reports back in its status. `gantry crd` prints the CustomResourceDefinition derived from
//! these types; `crds/functionjobs.gantry.dev.yaml` is that output (a test keeps them equal).
//!
//! The schema rejects what it can (enums, ranges, patterns, CEL rules), so a malformed resource
//! never reaches the controller. Nothing secret is ever in a resource: the caller's token is in
//! the job's Secret, named by `spec.secretName`.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::domain::lifecycle::JobStatus;

/// What the controller keeps of each `FunctionJob` between reconciles: its metadata only (a
/// metadata watch). A reconcile reads the whole resource when it runs; keeping every whole
/// resource, six status conditions each, was most of the controller's memory at 100,000 jobs.
pub type FunctionJobMeta = kube::core::PartialObjectMeta<FunctionJob>;

/// API group of Gantry's resources.
pub const GROUP: &str = "gantry.dev";
/// Field manager of every server-side apply Gantry makes.
pub const FIELD_MANAGER: &str = "gantry";
/// Finalizer that holds a `FunctionJob` until its logs are archived and its job row settled.
pub const FINALIZER: &str = "gantry.dev/archive";
/// Annotation holding the job's trace (a W3C `traceparent`): the reconciles and the pod join it.
pub const ANNOTATION_TRACEPARENT: &str = "gantry.dev/traceparent";
/// Label with the job id, on the resource, its pod and its Secret.
pub const LABEL_JOB_ID: &str = "gantry.dev/job-id";
/// Label with the function's title.
pub const LABEL_FUNCTION: &str = "gantry.dev/function";
/// Label with the job's user.
pub const LABEL_USER: &str = "gantry.dev/user";
/// Name of the container that runs the job in its pod (the other is the launcher's init copy).
pub const JOB_CONTAINER: &str = "job";
/// Key in the job's Secret holding the caller's token.
pub const SECRET_TOKEN_KEY: &str = "token";
/// Prefix of the keys in the job's Secret holding the function's environment variables.
pub const SECRET_ENV_PREFIX: &str = "env.";
/// Key in the job's Secret holding the job's scoped storage access (presigned URLs).
pub const SECRET_ACCESS_KEY: &str = "access";
/// Key of the job's Secret holding the caller's channel (`Service-Channel`), when not `local`.
pub const SECRET_CHANNEL_KEY: &str = "channel";
/// Key of the job's Secret holding the caller's instance (`Service-CRN`), when sent.
pub const SECRET_INSTANCE_KEY: &str = "instance";
/// Key of the job's Secret saying whether the job is a trial (`True`/`False`).
pub const SECRET_TRIAL_KEY: &str = "trial";

/// Name of a job's pod.
pub fn pod_name(job_id: &str) -> String {
    format!("gantry-job-{job_id}")
}

/// Name of a job's Secret.
pub fn secret_name(job_id: &str) -> String {
    format!("gantry-job-{job_id}")
}

/// A label value from free text: at most 63 characters of `[A-Za-z0-9_.-]`, starting and ending
/// alphanumeric (others replaced by `_`, then trimmed).
pub fn label_value(text: &str) -> String {
    let replaced: String = text
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' })
        .take(63)
        .collect();
    replaced.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_string()
}

/// What the job runs (the function, as code or image), with which resources and limits, for
/// whom, and whether a stop was requested. Written by the gateway; identity fields are immutable.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "gantry.dev",
    version = "v1alpha1",
    kind = "FunctionJob",
    namespaced,
    shortname = "fj",
    category = "gantry",
    status = "FunctionJobStatus",
    doc = "A job of a user-uploaded function, run as one pod. Created by `gantry gateway` for every run, named after the job id; driven by `gantry controller`",
    printcolumn = r#"{"name": "Status", "type": "string", "description": "job status", "jsonPath": ".status.phase"}"#,
    printcolumn = r#"{"name": "Function", "type": "string", "description": "function title", "jsonPath": ".spec.function.title"}"#,
    printcolumn = r#"{"name": "User", "type": "string", "description": "who ran it", "jsonPath": ".spec.user"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#,
    selectable = ".spec.user"
)]
#[x_kube(validation = Rule::new("self.jobId == oldSelf.jobId && self.user == oldSelf.user && self.function == oldSelf.function && self.secretName == oldSelf.secretName").message("jobId, user, function and secretName are immutable"))]
#[x_kube(validation = Rule::new("!oldSelf.stopRequested || self.stopRequested").message("a stop request cannot be withdrawn"))]
#[x_kube(validation = Rule::new("has(self.image) || (has(self.artifact) && has(self.entrypoint))").message("a job runs an image, or an artifact with its entrypoint"))]
#[serde(rename_all = "camelCase")]
pub struct FunctionJobSpec {
    /// The job's id in Gantry's database (a lower-case UUID); the resource is named after it.
    #[schemars(regex(pattern = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"))]
    pub job_id: String,
    /// The function the job runs.
    pub function: FunctionRef,
    /// The provider's container image; without it the job runs in the default runner image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,
    /// Object key of the function's artifact (a tar), for functions uploaded as code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub artifact: Option<String>,
    /// Python file to run, relative to the root of the artifact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[A-Za-z0-9_./-]+\.py$"))]
    pub entrypoint: Option<String>,
    /// Function size label the resources come from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<FunctionSize>,
    /// CPU and memory of the job's container.
    #[serde(default)]
    pub resources: JobResources,
    /// GPUs for the job (provider functions flagged `gpu`); 0 for CPU jobs.
    #[serde(default)]
    #[schemars(range(min = 0, max = 16))]
    pub gpus: u32,
    /// The GPU model the size's compute profile names (`a100p`, `l40s`): the pod goes to nodes
    /// of that model (the controller's `--gpu-model-label`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z][a-z0-9]{0,31}$"))]
    pub gpu_model: Option<String>,
    /// The compute profile of the job's size (`gx3d-24x120x1a100p`), given to the job as
    /// `ENV_JOB_COMPUTE_PROFILE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub compute_profile: Option<String>,
    /// Seconds the job may run before it is stopped (`PROGRAM_TIMEOUT`).
    #[schemars(range(min = 1, max = 31_536_000))]
    pub timeout_seconds: u64,
    /// The user who ran the job.
    #[schemars(length(min = 1, max = 150))]
    pub user: String,
    /// Names of the function's own environment variables; their values are in the job's Secret
    /// under `env.<NAME>` (they may hold the function's secrets).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]*$")))]
    pub function_env: Vec<String>,
    /// Set when the user asked to stop the job; the controller stops its pod. Cannot be unset.
    #[serde(default)]
    pub stop_requested: bool,
    /// The function opted in (its upload's `retry_after_start`) to be started again on a new pod
    /// when the cluster ends its pod after its code started (an eviction, a lost node, a
    /// preemption), knowing a rerun may repeat work (and paid quantum work) done before. Without
    /// it, only an attempt ended before the code started is retried.
    #[serde(default)]
    pub retry_after_start: bool,
    /// Name of the Secret (owned by this resource) holding what the pod needs: the caller's
    /// token under `token`. Never the token itself.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
}

/// Which function a job runs.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FunctionRef {
    /// The function's title.
    #[schemars(length(min = 1, max = 255))]
    pub title: String,
    /// The provider owning the function; absent for a user's own (custom) function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The function's version when the job was run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// The size labels of the function catalog.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FunctionSize {
    S,
    M,
    L,
    XL,
}

/// CPU and memory of a job's container (requests and limits alike).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JobResources {
    /// CPU, as a Kubernetes quantity (`2`, `500m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
    /// Memory, as a Kubernetes quantity (`8Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
}

/// What the controller observed, computed in one piece from the pod and the archive.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FunctionJobStatus {
    /// The job's status, as the API reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<JobStatus>,
    /// What a running job reported it is doing (`MAPPING`, `EXECUTING_QPU`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_status: Option<String>,
    /// The job's pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// When the pod started running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the job reached its final status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Standard conditions (`Admitted`, `Running`, `Finished`, `LogsArchived`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Whether the job's result and logs are in object storage.
    #[serde(default)]
    pub logs_archived: bool,
    /// Why the job ended, once it has: the job's `status_reason` (an exit code and the last
    /// exception line, out of memory with the limit, timed out, stopped by whom, lost with why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Why the job is where it is, in words (a pull error, a vanished pod, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The uid of the current attempt's pod (every attempt's pod has the job's pod name), so an
    /// ended attempt's pod is never taken for the next one's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// Attempts the cluster ended (evicted, preempted, node lost, pod deleted) and that were
    /// started again on a new pod, at most `--infrastructure-retries`, and attempts of a backfill
    /// job stopped for a tenant and queued again (`requeued`, at most five), oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retries: Vec<Retry>,
}

/// One attempt of a job that the cluster ended (or a tenant reclaimed) and that was started again.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Retry {
    /// The attempt that ended (1 is the job's first pod).
    #[schemars(range(min = 1))]
    pub attempt: u32,
    /// Why it ended, in words (the eviction's or preemption's message, a lost node).
    pub reason: String,
    /// Whether the function's code had started (then retried only with `spec.retryAfterStart`).
    pub code_started: bool,
    /// The uid of the ended attempt's pod, when it was seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// When the controller saw it end.
    pub ended_at: Time,
    /// The next attempt's pod is not made before this time (the backoff).
    pub next_attempt_at: Time,
    /// The attempt was a backfill job's, stopped for a tenant reclaiming its guarantee; the job
    /// was queued again (its function allows retries after start) and its next pod is made once
    /// it is admitted again. Not an infrastructure retry: it does not count toward their bound.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub requeued: bool,
}

/// The CustomResourceDefinition as YAML, as `gantry crd` prints it.
pub fn crd_yaml() -> String {
    serde_yaml::to_string(&FunctionJob::crd()).expect("a CRD serializes to YAML")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_crd_is_the_generated_one() {
        let committed = include_str!("../crds/functionjobs.gantry.dev.yaml");
        assert!(
            committed == crd_yaml(),
            "crds/functionjobs.gantry.dev.yaml is stale: run `gantry crd > crds/functionjobs.gantry.dev.yaml`"
        );
    }

    #[test]
    fn the_schema_states_names_columns_and_rules() {
        let crd = serde_json::to_value(FunctionJob::crd()).unwrap();
        assert_eq!(crd["metadata"]["name"], "functionjobs.gantry.dev");
        assert_eq!(crd["spec"]["names"]["shortNames"], serde_json::json!(["fj"]));
        let version = &crd["spec"]["versions"][0];
        let columns: Vec<&str> = version["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(columns, ["Status", "Function", "User", "Age"]);
        let schema = &version["schema"]["openAPIV3Schema"]["properties"];
        let spec = &schema["spec"];
        assert_eq!(spec["properties"]["gpus"]["maximum"].as_f64(), Some(16.0));
        assert_eq!(spec["properties"]["size"]["enum"], serde_json::json!(["S", "M", "L", "XL", null]));
        assert_eq!(
            schema["status"]["properties"]["phase"]["enum"],
            serde_json::json!(["QUEUED", "PENDING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED", null])
        );
        let rules = spec["x-kubernetes-validations"].to_string();
        assert!(rules.contains("oldSelf.jobId") && rules.contains("stopRequested"), "{rules}");
        assert!(version["subresources"]["status"].is_object());
        assert!(spec["properties"]["jobId"]["description"].as_str().unwrap().contains("UUID"));
    }

    #[test]
    fn a_spec_round_trips_without_secrets() {
        let spec = FunctionJobSpec {
            job_id: "0f2c0000-0000-4000-8000-000000000001".into(),
            function: FunctionRef { title: "fn".into(), provider: None, version: None },
            image: None,
            artifact: Some("artifacts/p/u.tar".into()),
            entrypoint: Some("main.py".into()),
            size: Some(FunctionSize::M),
            resources: JobResources::default(),
            gpus: 0,
            gpu_model: None,
            compute_profile: None,
            timeout_seconds: 3600,
            user: "alice".into(),
            function_env: vec!["MY_SETTING".into()],
            stop_requested: false,
            retry_after_start: false,
            secret_name: "gantry-job-0f2c0000-0000-4000-8000-000000000001".into(),
        };
        let text = serde_json::to_string(&spec).unwrap();
        assert!(text.contains("\"jobId\"") && text.contains("\"timeoutSeconds\":3600"), "{text}");
        assert!(!text.to_lowercase().contains("token"), "{text}");
        assert_eq!(serde_json::from_str::<FunctionJobSpec>(&text).unwrap(), spec);
    }
}
