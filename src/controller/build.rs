//! The pod of a `FunctionJob`, built whole from the resource and the controller's settings (pure:
//! the same inputs always give the same pod, so the reconcile can apply it any number of times).
//!
//! One pod per job: an init container copies the `gantry` binary from the launcher image into a
//! shared volume, and the job's container (the provider's image, or the runner image for code)
//! runs `gantry launch` with the job environment the client expects. Secrets (the caller's
//! token, the function's variables, the job's storage access) come from the job's Secret by
//! reference; the pod spec holds none.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, LocalObjectReference, Pod, PodSecurityContext,
    PodSpec, ResourceRequirements, SeccompProfile, SecretKeySelector, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};
use serde_json::Map;

use crate::crd::{
    FunctionJob, LABEL_FUNCTION, LABEL_JOB_ID, LABEL_USER, SECRET_ACCESS_KEY, SECRET_ENV_PREFIX, SECRET_TOKEN_KEY,
    label_value, pod_name,
};
use crate::domain::runtime_env::{JobEnvironmentInput, job_environment};

/// Where jobs of one kind (GPU or CPU) are placed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Placement {
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    pub priority_class: Option<String>,
}

/// Which nodes hold a GPU model: the node label naming a node's GPU product, and its value per
/// profile model (`a100p`); a model not listed selects `NVIDIA-<MODEL>` (`l40s`: `NVIDIA-L40S`).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuModelLabels {
    pub label: String,
    pub values: BTreeMap<String, String>,
}

impl Default for GpuModelLabels {
    fn default() -> Self {
        GpuModelLabels { label: "nvidia.com/gpu.product".into(), values: BTreeMap::new() }
    }
}

impl GpuModelLabels {
    /// The label's value for a profile's model.
    pub fn value(&self, model: &str) -> String {
        self.values.get(model).cloned().unwrap_or_else(|| format!("NVIDIA-{}", model.to_ascii_uppercase()))
    }
}

/// The controller's settings for job pods. The paths inside images are settings too, so a test
/// kubelet can run the same pod on a machine by pointing them at local files.
#[derive(Debug, Clone)]
pub struct PodSettings {
    /// Image for functions uploaded as code: Python with `qiskit-serverless`.
    pub runner_image: String,
    /// Image holding the `gantry` binary, copied into every job by the init container.
    pub launcher_image: String,
    /// Path of the `gantry` binary inside `launcher_image`.
    pub launcher_source: String,
    /// Folder (a shared volume) where the job's container finds the launcher.
    pub launcher_dir: String,
    /// Python inside the job's image.
    pub python: String,
    /// Where a provider's image holds the function's code (the reference's
    /// `CUSTOM_IMAGE_PACKAGE_PATH`).
    pub image_code_dir: String,
    /// The job's private folder (a volume): unpacked code, live logs.
    pub work_dir: String,
    /// `DATA_PATH`: the user's file area, filled by the launcher at start.
    pub data_dir: String,
    /// Base URL jobs call the gateway back at (`ENV_JOB_GATEWAY_HOST`).
    pub gateway_url: String,
    pub qiskit_ibm_url: String,
    /// Extended resource name of GPUs.
    pub gpu_resource: String,
    pub gpu_placement: Placement,
    /// The nodes of a profile's GPU model.
    pub gpu_models: GpuModelLabels,
    pub cpu_placement: Placement,
    pub image_pull_secrets: Vec<String>,
    /// Non-root user and group of the job's processes.
    pub run_as_user: i64,
    /// `FUNCTIONS_LOGS_SIZE_LIMIT`.
    pub logs_size_limit: u64,
    /// `--max-unpacked-mib`: what a job's artifact may unpack to.
    pub max_unpacked_mib: u64,
    /// The controller's `OTEL_*` variables (`telemetry::forwarded`): where the launcher and the
    /// function send their spans.
    pub telemetry: Vec<(String, String)>,
}

fn secret_env(name: &str, secret: &str, key: &str, optional: bool) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                optional: optional.then_some(true),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Where the job's container writes its termination message (Kubernetes' default path).
pub const TERMINATION_LOG: &str = "/dev/termination-log";

fn plain_env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), ..Default::default() }
}

/// The variables that carry the caller's token: taken from the Secret, never written here.
const TOKEN_VARIABLES: [&str; 2] = ["ENV_JOB_GATEWAY_TOKEN", "QISKIT_IBM_TOKEN"];

/// The job's container environment: the launcher's settings, the client's job environment with
/// the token by reference, the function's variables by reference.
fn environment(job: &FunctionJob, settings: &PodSettings) -> Vec<EnvVar> {
    let spec = &job.spec;
    let secret = &spec.secret_name;
    let mut env = vec![
        plain_env("GANTRY_JOB_ID", &spec.job_id),
        plain_env("GANTRY_WORK_DIR", &settings.work_dir),
        plain_env("GANTRY_PYTHON", &settings.python),
        plain_env("FUNCTIONS_LOGS_SIZE_LIMIT", settings.logs_size_limit.to_string()),
        plain_env("GANTRY_MAX_UNPACKED_MIB", settings.max_unpacked_mib.to_string()),
        plain_env("HOME", &settings.work_dir),
        // The failed function's last exception line, in the ended container's status.
        plain_env("GANTRY_TERMINATION_LOG", TERMINATION_LOG),
        secret_env("GANTRY_JOB_ACCESS", secret, SECRET_ACCESS_KEY, true),
    ];
    if let Some(artifact) = &spec.artifact {
        env.push(plain_env("GANTRY_ARTIFACT_KEY", artifact));
    }
    if spec.image.is_some() {
        env.push(plain_env("GANTRY_CODE_DIR", &settings.image_code_dir));
    }
    let default_entrypoint = spec.image.is_some().then_some("main.py");
    if let Some(entrypoint) = spec.entrypoint.as_deref().or(default_entrypoint) {
        env.push(plain_env("GANTRY_ENTRYPOINT", entrypoint));
    }
    if spec.function.provider.is_some() {
        env.push(plain_env("GANTRY_PROVIDER_FUNCTION", "true"));
    }
    // `DATA_PATH` mirrors the caller's file area of this function through the gateway.
    env.push(plain_env("GANTRY_DATA_FUNCTION", &spec.function.title));
    if let Some(provider) = &spec.function.provider {
        env.push(plain_env("GANTRY_DATA_PROVIDER", provider));
    }
    let size = spec.size.map(|size| format!("{size:?}"));
    let no_function_env = Map::new();
    // The caller's instance (CRN), when it sent one: the Secret has it then.
    for name in ["QISKIT_IBM_INSTANCE", "ENV_JOB_GATEWAY_INSTANCE"] {
        env.push(secret_env(name, secret, crate::crd::SECRET_INSTANCE_KEY, true));
    }
    let job_env = job_environment(&JobEnvironmentInput {
        job_id: &spec.job_id,
        gateway_host: &settings.gateway_url,
        token: "",
        channel: "local",
        instance: None,
        trial: false,
        data_path: &settings.data_dir,
        function_size: size.as_deref(),
        compute_profile: spec.compute_profile.as_deref(),
        qiskit_ibm_url: &settings.qiskit_ibm_url,
        function_env: &no_function_env,
        // The job's trace, as the gateway annotated it: the same on every build of the pod.
        traceparent: job.annotations().get(crate::crd::ANNOTATION_TRACEPARENT).map(String::as_str),
        telemetry: &settings.telemetry,
    });
    for (name, value) in job_env {
        env.push(match name.as_str() {
            name if TOKEN_VARIABLES.contains(&name) => secret_env(name, secret, SECRET_TOKEN_KEY, false),
            // The caller's channel, from the Secret (absent from Secrets of an older gateway).
            "QISKIT_IBM_CHANNEL" => secret_env(name.as_str(), secret, crate::crd::SECRET_CHANNEL_KEY, true),
            // Whether the job is a trial, from the Secret (`True`/`False`).
            "ENV_ACCESS_TRIAL" => secret_env(name.as_str(), secret, crate::crd::SECRET_TRIAL_KEY, true),
            _ => plain_env(&name, value),
        });
    }
    // The function's own variables last: they may override the ones above.
    for name in &spec.function_env {
        env.retain(|existing| &existing.name != name);
        env.push(secret_env(name, secret, &format!("{SECRET_ENV_PREFIX}{name}"), false));
    }
    env
}

fn resources(job: &FunctionJob, settings: &PodSettings) -> ResourceRequirements {
    let mut amounts = BTreeMap::new();
    if let Some(cpu) = &job.spec.resources.cpu {
        amounts.insert("cpu".to_string(), cpu.clone());
    }
    if let Some(memory) = &job.spec.resources.memory {
        amounts.insert("memory".to_string(), memory.clone());
    }
    let mut limits = amounts.clone();
    if job.spec.gpus > 0 {
        limits.insert(settings.gpu_resource.clone(), Quantity(job.spec.gpus.to_string()));
    }
    ResourceRequirements {
        requests: (!amounts.is_empty()).then_some(amounts),
        limits: (!limits.is_empty()).then_some(limits),
        ..Default::default()
    }
}

/// The kind's node selector, and for a GPU job whose profile names a model, that model's label.
fn node_selector(
    spec: &crate::crd::FunctionJobSpec,
    placement: &Placement,
    models: &GpuModelLabels,
) -> Option<BTreeMap<String, String>> {
    let mut selector = placement.node_selector.clone();
    if let Some(model) = spec.gpu_model.as_deref().filter(|_| spec.gpus > 0) {
        selector.insert(models.label.clone(), models.value(model));
    }
    (!selector.is_empty()).then_some(selector)
}

fn restricted_container_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Default::default() }),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount { name: name.into(), mount_path: path.into(), ..Default::default() }
}

fn scratch(name: &str) -> Volume {
    Volume { name: name.into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Default::default() }
}

/// The whole pod of `job`. Needs the resource as read from the cluster (its uid, for the
/// owner reference).
pub fn build_pod(job: &FunctionJob, settings: &PodSettings) -> Pod {
    let spec = &job.spec;
    let labels = BTreeMap::from([
        (LABEL_JOB_ID.to_string(), label_value(&spec.job_id)),
        (LABEL_FUNCTION.to_string(), label_value(&spec.function.title)),
        (LABEL_USER.to_string(), label_value(&spec.user)),
    ]);
    let placement = if spec.gpus > 0 { &settings.gpu_placement } else { &settings.cpu_placement };
    let launcher = format!("{}/gantry", settings.launcher_dir.trim_end_matches('/'));
    let init = Container {
        name: "place-launcher".into(),
        image: Some(settings.launcher_image.clone()),
        command: Some(vec![settings.launcher_source.clone(), "place-launcher".into(), launcher.clone()]),
        volume_mounts: Some(vec![mount("launcher", &settings.launcher_dir)]),
        security_context: Some(restricted_container_context()),
        ..Default::default()
    };
    let main = Container {
        name: crate::crd::JOB_CONTAINER.into(),
        image: Some(spec.image.clone().unwrap_or_else(|| settings.runner_image.clone())),
        command: Some(vec![launcher, "launch".into()]),
        env: Some(environment(job, settings)),
        resources: Some(resources(job, settings)),
        volume_mounts: Some(vec![
            mount("launcher", &settings.launcher_dir),
            mount("work", &settings.work_dir),
            mount("data", &settings.data_dir),
        ]),
        security_context: Some(restricted_container_context()),
        termination_message_path: Some(TERMINATION_LOG.into()),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(&spec.job_id)),
            namespace: job.namespace(),
            labels: Some(labels),
            owner_references: job.controller_owner_ref(&()).map(|reference| vec![reference]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            active_deadline_seconds: Some(i64::try_from(spec.timeout_seconds).unwrap_or(i64::MAX)),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            init_containers: Some(vec![init]),
            containers: vec![main],
            volumes: Some(vec![scratch("launcher"), scratch("work"), scratch("data")]),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(settings.run_as_user),
                run_as_group: Some(settings.run_as_user),
                fs_group: Some(settings.run_as_user),
                seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), ..Default::default() }),
                ..Default::default()
            }),
            node_selector: node_selector(spec, placement, &settings.gpu_models),
            tolerations: (!placement.tolerations.is_empty()).then(|| placement.tolerations.clone()),
            priority_class_name: placement.priority_class.clone(),
            image_pull_secrets: (!settings.image_pull_secrets.is_empty()).then(|| {
                settings.image_pull_secrets.iter().map(|name| LocalObjectReference { name: name.clone() }).collect()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{FunctionJobSpec, FunctionRef, FunctionSize, JobResources, secret_name};
    use serde_json::json;

    const JOB_ID: &str = "0f2c0000-0000-4000-8000-000000000001";

    fn settings() -> PodSettings {
        PodSettings {
            runner_image: "ghcr.io/example/gantry-runner:1".into(),
            launcher_image: "ghcr.io/example/gantry:1".into(),
            launcher_source: "/usr/local/bin/gantry".into(),
            launcher_dir: "/gantry".into(),
            python: "python3".into(),
            image_code_dir: "/runner".into(),
            work_dir: "/work".into(),
            data_dir: "/data".into(),
            gateway_url: "http://gantry.gantry.svc:8000".into(),
            qiskit_ibm_url: "https://cloud.ibm.com".into(),
            gpu_resource: "nvidia.com/gpu".into(),
            gpu_placement: Placement {
                node_selector: BTreeMap::from([("gpu".into(), "a100".into())]),
                tolerations: vec![Toleration {
                    key: Some("nvidia.com/gpu".into()),
                    operator: Some("Exists".into()),
                    effect: Some("NoSchedule".into()),
                    ..Default::default()
                }],
                priority_class: Some("gpu-jobs".into()),
            },
            gpu_models: GpuModelLabels::default(),
            cpu_placement: Placement::default(),
            image_pull_secrets: vec!["registry".into()],
            run_as_user: 65532,
            logs_size_limit: 52_428_800,
            max_unpacked_mib: 512,
            telemetry: Vec::new(),
        }
    }

    fn job(gpus: u32, provider: Option<&str>, image: Option<&str>) -> FunctionJob {
        let mut job = FunctionJob::new(
            JOB_ID,
            FunctionJobSpec {
                job_id: JOB_ID.into(),
                function: FunctionRef { title: "my fn!".into(), provider: provider.map(str::to_string), version: None },
                image: image.map(str::to_string),
                artifact: image.is_none().then(|| "artifacts/p/u.tar".to_string()),
                entrypoint: image.is_none().then(|| "main.py".to_string()),
                size: Some(FunctionSize::M),
                resources: JobResources { cpu: Some(Quantity("4".into())), memory: Some(Quantity("16Gi".into())) },
                gpus,
                gpu_model: None,
                compute_profile: None,
                timeout_seconds: 3600,
                user: "alice@example.com".into(),
                function_env: vec!["MY_SETTING".into()],
                stop_requested: false,
                retry_after_start: false,
                secret_name: secret_name(JOB_ID),
            },
        );
        job.metadata.namespace = Some("jobs".into());
        job.metadata.uid = Some("uid-1".into());
        job
    }

    fn env_of(pod: &Pod) -> serde_json::Value {
        serde_json::to_value(&pod.spec.as_ref().unwrap().containers[0].env).unwrap()
    }

    /// The whole pod of a CPU job of a user's function: a snapshot, so any change is seen.
    #[test]
    fn a_cpu_job_pod() {
        let pod = build_pod(&job(0, None, None), &settings());
        let expected = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "gantry-job-0f2c0000-0000-4000-8000-000000000001",
                "namespace": "jobs",
                "labels": {"gantry.dev/function": "my_fn", "gantry.dev/job-id": JOB_ID, "gantry.dev/user": "alice_example.com"},
                "ownerReferences": [{"apiVersion": "gantry.dev/v1alpha1", "kind": "FunctionJob", "name": JOB_ID, "uid": "uid-1", "controller": true}]
            },
            "spec": {
                "restartPolicy": "Never",
                "activeDeadlineSeconds": 3600,
                "automountServiceAccountToken": false,
                "enableServiceLinks": false,
                "imagePullSecrets": [{"name": "registry"}],
                "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
                "volumes": [{"name": "launcher", "emptyDir": {}}, {"name": "work", "emptyDir": {}}, {"name": "data", "emptyDir": {}}],
                "initContainers": [{
                    "name": "place-launcher",
                    "image": "ghcr.io/example/gantry:1",
                    "command": ["/usr/local/bin/gantry", "place-launcher", "/gantry/gantry"],
                    "volumeMounts": [{"name": "launcher", "mountPath": "/gantry"}],
                    "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}}
                }],
                "containers": [{
                    "name": "job",
                    "image": "ghcr.io/example/gantry-runner:1",
                    "command": ["/gantry/gantry", "launch"],
                    "env": [
                        {"name": "GANTRY_JOB_ID", "value": JOB_ID},
                        {"name": "GANTRY_WORK_DIR", "value": "/work"},
                        {"name": "GANTRY_PYTHON", "value": "python3"},
                        {"name": "FUNCTIONS_LOGS_SIZE_LIMIT", "value": "52428800"},
                        {"name": "GANTRY_MAX_UNPACKED_MIB", "value": "512"},
                        {"name": "HOME", "value": "/work"},
                        {"name": "GANTRY_TERMINATION_LOG", "value": "/dev/termination-log"},
                        {"name": "GANTRY_JOB_ACCESS", "valueFrom": {"secretKeyRef": {"name": "gantry-job-0f2c0000-0000-4000-8000-000000000001", "key": "access", "optional": true}}},
                        {"name": "GANTRY_ARTIFACT_KEY", "value": "artifacts/p/u.tar"},
                        {"name": "GANTRY_ENTRYPOINT", "value": "main.py"},
                        {"name": "GANTRY_DATA_FUNCTION", "value": "my fn!"},
                        {"name": "QISKIT_IBM_INSTANCE", "valueFrom": {"secretKeyRef": {"name": "gantry-job-0f2c0000-0000-4000-8000-000000000001", "key": "instance", "optional": true}}},
                        {"name": "ENV_JOB_GATEWAY_INSTANCE", "valueFrom": {"secretKeyRef": {"name": "gantry-job-0f2c0000-0000-4000-8000-000000000001", "key": "instance", "optional": true}}},
                        {"name": "ENV_JOB_GATEWAY_HOST", "value": "http://gantry.gantry.svc:8000"},
                        {"name": "ENV_JOB_GATEWAY_TOKEN", "valueFrom": {"secretKeyRef": {"name": "gantry-job-0f2c0000-0000-4000-8000-000000000001", "key": "token"}}},
                        {"name": "ENV_JOB_ID_GATEWAY", "value": JOB_ID},
                        {"name": "FUNCTIONS_IDENTIFIER", "value": JOB_ID},
                        {"name": "ENV_JOB_ARGUMENTS", "value": "{}"},
                        {"name": "ENV_ACCESS_TRIAL", "valueFrom": {"secretKeyRef": {"name": "gantry-job-0f2c0000-0000-4000-8000-000000000001", "key": "trial", "optional": true}}},
                        {"name": "DATA_PATH", "value": "/data"},
                        {"name": "ARGUMENTS_PATH", "value": format!("/data/arguments/{JOB_ID}.json")},
                        {"name": "RESULTS_PATH", "value": format!("/data/results/{JOB_ID}.json")},
                        {"name": "QISKIT_IBM_TOKEN", "valueFrom": {"secretKeyRef": {"name": "gantry-job-0f2c0000-0000-4000-8000-000000000001", "key": "token"}}},
                        {"name": "QISKIT_IBM_CHANNEL", "valueFrom": {"secretKeyRef": {"name": "gantry-job-0f2c0000-0000-4000-8000-000000000001", "key": "channel", "optional": true}}},
                        {"name": "QISKIT_IBM_URL", "value": "https://cloud.ibm.com"},
                        {"name": "ENV_JOB_FUNCTION_SIZE", "value": "M"},
                        {"name": "ENV_JOB_COMPUTE_PROFILE", "value": ""},
                        {"name": "MY_SETTING", "valueFrom": {"secretKeyRef": {"name": "gantry-job-0f2c0000-0000-4000-8000-000000000001", "key": "env.MY_SETTING"}}}
                    ],
                    "resources": {"limits": {"cpu": "4", "memory": "16Gi"}, "requests": {"cpu": "4", "memory": "16Gi"}},
                    "volumeMounts": [{"name": "launcher", "mountPath": "/gantry"}, {"name": "work", "mountPath": "/work"}, {"name": "data", "mountPath": "/data"}],
                    "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}},
                    "terminationMessagePath": "/dev/termination-log"
                }]
            }
        });
        assert_eq!(serde_json::to_value(&pod).unwrap(), expected);
    }

    /// A GPU job of a provider's image: GPU limits and GPU placement, the image, provider logs.
    #[test]
    fn a_gpu_job_pod() {
        let pod = build_pod(&job(2, Some("acme"), Some("registry.example/acme/tool:2")), &settings());
        let spec = serde_json::to_value(pod.spec.as_ref().unwrap()).unwrap();
        assert_eq!(spec["containers"][0]["image"], "registry.example/acme/tool:2");
        assert_eq!(
            spec["containers"][0]["resources"],
            json!({"limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "2"}, "requests": {"cpu": "4", "memory": "16Gi"}})
        );
        assert_eq!(spec["nodeSelector"], json!({"gpu": "a100"}));
        assert_eq!(
            spec["tolerations"],
            json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
        );
        assert_eq!(spec["priorityClassName"], "gpu-jobs");
        let env = env_of(&pod);
        let names: Vec<&str> = env.as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
        assert!(names.contains(&"GANTRY_PROVIDER_FUNCTION"));
        assert!(!names.contains(&"GANTRY_ARTIFACT_KEY"));
        let value = |name: &str| env.as_array().unwrap().iter().find(|e| e["name"] == name).map(|e| e["value"].clone());
        assert_eq!(value("GANTRY_CODE_DIR"), Some(json!("/runner")), "the image's code folder");
        assert_eq!(value("GANTRY_ENTRYPOINT"), Some(json!("main.py")));
        // The CPU job has none of the GPU placement.
        let cpu = serde_json::to_value(build_pod(&job(0, None, None), &settings()).spec.unwrap()).unwrap();
        assert!(cpu["nodeSelector"].is_null() && cpu["tolerations"].is_null() && cpu["priorityClassName"].is_null());
    }

    /// A profile's GPU model selects nodes of that model through the model label, mapped by
    /// the setting or `NVIDIA-<MODEL>`; its profile reaches the job as ENV_JOB_COMPUTE_PROFILE.
    #[test]
    fn a_gpu_model_selects_its_nodes_and_the_profile_reaches_the_job() {
        let mut settings = settings();
        settings.gpu_models.values.insert("a100p".into(), "NVIDIA-A100-PCIE-40GB".into());
        let mut job = job(2, Some("acme"), None);
        job.spec.gpu_model = Some("a100p".into());
        job.spec.compute_profile = Some("gx3d-24x120x2a100p".into());
        let spec = serde_json::to_value(build_pod(&job, &settings).spec.unwrap()).unwrap();
        assert_eq!(spec["nodeSelector"], json!({"gpu": "a100", "nvidia.com/gpu.product": "NVIDIA-A100-PCIE-40GB"}));
        job.spec.gpu_model = Some("l40s".into());
        let pod = build_pod(&job, &settings);
        let spec = serde_json::to_value(pod.spec.as_ref().unwrap()).unwrap();
        assert_eq!(spec["nodeSelector"]["nvidia.com/gpu.product"], "NVIDIA-L40S");
        let env = env_of(&pod);
        let profile = env.as_array().unwrap().iter().find(|e| e["name"] == "ENV_JOB_COMPUTE_PROFILE").unwrap();
        assert_eq!(profile["value"], "gx3d-24x120x2a100p");
        job.spec.gpus = 0;
        let cpu = serde_json::to_value(build_pod(&job, &settings).spec.unwrap()).unwrap();
        assert!(cpu["nodeSelector"].is_null(), "no model without GPUs: {}", cpu["nodeSelector"]);
    }

    #[test]
    fn no_secret_is_in_the_pod_spec() {
        let pod = build_pod(&job(0, None, None), &settings());
        for variable in env_of(&pod).as_array().unwrap() {
            if variable["name"].as_str().unwrap().contains("TOKEN") {
                assert!(variable["value"].is_null(), "{variable}");
            }
        }
    }

    #[test]
    fn label_values_are_valid() {
        assert_eq!(label_value("alice@example.com"), "alice_example.com");
        assert_eq!(label_value("-x-"), "x");
        assert_eq!(label_value(&"a".repeat(100)).len(), 63);
        assert_eq!(label_value("émile"), "mile");
    }
}
