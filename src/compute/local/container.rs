//! Container-image functions on this machine: each job of a provider's image is one container,
//! started by a container engine (podman) the way a job pod runs it on a cluster. The provider's
//! image runs the function from its code folder (`CUSTOM_IMAGE_PACKAGE_PATH`) through the
//! launcher, this machine's `gantry` mounted read-only; the container gets the job's work folder,
//! the job's environment (its own token and nothing of the server's), a non-root user, the size's
//! CPU and memory as its limits, GPUs through CDI when the job asks for them, and a deterministic
//! name, so a restarted server finds it again.
//!
//! With local storage the launcher inside archives into a private folder of the job's work
//! folder, which the runner moves into the storage once the container has ended, reading it
//! without following links (`shared::open_beneath`); with S3 it gets presigned URLs of the job's
//! own objects, as a pod does. `DATA_PATH` is mirrored through the gateway's files API with the
//! job's token. The pure part (`run_arguments`) is tested by table; `tests/image_jobs.sh` runs
//! real containers with the real client.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::domain::lifecycle::container_start_failure;
use crate::domain::sizes::Resources;
use crate::storage::{Storage, keys};

/// Where a job's work folder is mounted in its container (`GANTRY_WORK_DIR`, `HOME`).
pub const WORK_MOUNT: &str = "/gantry/work";
/// Where the launcher (this machine's `gantry`) is mounted, read-only.
pub const LAUNCHER_MOUNT: &str = "/gantry/bin/gantry";
/// The job's private object folder in its work folder (local storage): what the launcher
/// archives, moved into the storage once the container has ended.
pub const OBJECTS_FOLDER: &str = "objects";
/// The label every job container carries (its value is the job id).
pub const JOB_LABEL: &str = "gantry.job-id";
/// The name of the job's container in the reasons a job ends with (as a pod's is `job`).
const CONTAINER: &str = "job";
/// Longest an engine command other than `wait` may take.
const ENGINE_TIMEOUT: Duration = Duration::from_secs(120);

/// The name of a job's container: also how a restarted server finds it again.
pub fn container_name(job_id: &str) -> String {
    format!("gantry-job-{job_id}")
}

/// Which images a job container may pull.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PullPolicy {
    /// Local images only.
    Never,
    /// Pull an image that is not on this machine.
    Missing,
    /// Pull before every job.
    Always,
}

impl PullPolicy {
    fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Never => "never",
            PullPolicy::Missing => "missing",
            PullPolicy::Always => "always",
        }
    }
}

/// How `gantry serve` runs container-image functions.
#[derive(Debug, Clone, clap::Args)]
pub struct ContainerArgs {
    /// Container engine for container-image functions: a command and its global flags,
    /// space-separated. Where podman's defaults fail (crun without the machine's cgroups):
    /// `podman --runtime runc --cgroup-manager cgroupfs`.
    #[arg(long = "container-engine", env = "GANTRY_CONTAINER_ENGINE", default_value = "podman")]
    pub container_engine: String,
    /// A containers.conf for the engine (given to it as CONTAINERS_CONF).
    #[arg(long = "containers-conf", env = "GANTRY_CONTAINERS_CONF")]
    pub containers_conf: Option<PathBuf>,
    /// Which images jobs may pull: `never` (local images only), `missing` or `always`.
    #[arg(long = "image-pull", env = "GANTRY_IMAGE_PULL", value_enum, default_value = "never")]
    pub image_pull: PullPolicy,
    /// Network of job containers; `host` lets them call the gateway back at its address.
    #[arg(long = "container-network", env = "GANTRY_CONTAINER_NETWORK", default_value = "host")]
    pub container_network: String,
    /// Numeric `user:group` job containers run as (never root).
    #[arg(long = "container-user", env = "GANTRY_CONTAINER_USER", default_value = "65532:65532")]
    pub container_user: String,
    /// Where a provider's image holds the function's code.
    #[arg(long = "image-code-dir", env = "CUSTOM_IMAGE_PACKAGE_PATH", default_value = "/runner")]
    pub image_code_dir: String,
    /// Python inside provider images.
    #[arg(long = "image-python", env = "GANTRY_JOB_PYTHON", default_value = "python3")]
    pub image_python: String,
    /// CPUs of an image job whose size names no compute profile.
    #[arg(long = "cpu-per-job", env = "LIMITS_CPU_PER_TASK", default_value = "4")]
    pub cpu_per_job: String,
    /// Memory in GiB of a job whose size names no compute profile (an image job's container,
    /// a process job's cgroup or rlimit).
    #[arg(long = "memory-gib-per-job", env = "LIMITS_MEMORY_PER_TASK", default_value_t = 8)]
    pub memory_gib_per_job: u32,
    /// CDI device that gives a job container the machine's GPUs.
    #[arg(long = "gpu-device", env = "GANTRY_GPU_DEVICE", default_value = "nvidia.com/gpu=all")]
    pub gpu_device: String,
    /// Limits of job containers (`name=soft:hard`, comma-separated).
    #[arg(
        long = "container-ulimits",
        env = "GANTRY_CONTAINER_ULIMITS",
        default_value = "nofile=1024:1024,nproc=4096:4096",
        value_delimiter = ','
    )]
    pub container_ulimits: Vec<String>,
}

impl Default for ContainerArgs {
    /// The flags' defaults (and their variables, where set).
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Defaults {
            #[command(flatten)]
            containers: ContainerArgs,
        }
        <Defaults as clap::Parser>::parse_from(["gantry"]).containers
    }
}

/// The engine as found at start, with its settings.
#[derive(Debug, Clone)]
pub struct Engine {
    settings: ContainerArgs,
    /// The engine's command and global flags.
    command: Vec<String>,
    /// The engine's version line, or why container-image functions cannot run here.
    available: Result<String, String>,
}

/// What a job's container is when looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Created or running: its launcher is (about to be) at work.
    Running,
    /// Ended with this exit code.
    Exited(i32),
}

/// One job's container, as the runner asks for it.
pub struct ContainerJob<'a> {
    pub job_id: &'a str,
    pub image: &'a str,
    /// The job's work folder on this machine (mounted at `WORK_MOUNT`).
    pub work_dir: &'a Path,
    /// This machine's `gantry` (mounted at `LAUNCHER_MOUNT`).
    pub launcher: &'a Path,
    /// File of the job's environment (`--env-file`; the launcher's settings and the job's own).
    pub env_file: &'a Path,
    pub resources: &'a Resources,
    /// The machine's GPUs the job holds (device numbers), each given as its own CDI device.
    pub gpus: &'a [u32],
}

impl ContainerArgs {
    /// Looks for the engine (one `--version`) and keeps the answer.
    pub async fn engine(&self) -> Engine {
        let command: Vec<String> = self.container_engine.split_whitespace().map(str::to_string).collect();
        let mut engine = Engine { settings: self.clone(), command, available: Err(String::new()) };
        engine.available = match engine.output(&["--version"], ENGINE_TIMEOUT).await {
            Ok(version) => Ok(version.trim().to_string()),
            Err(why) => Err(format!(
                "the container engine `{}` cannot be used ({why}): install podman and runc (Debian: apt-get install podman runc) \
                 or name another engine with --container-engine",
                self.container_engine
            )),
        };
        engine
    }
}

impl Engine {
    /// One line for the start-up report: what runs image functions, or why nothing does.
    pub fn describe(&self) -> String {
        match &self.available {
            Ok(version) => format!(
                "container-image functions run with {version} (`{}`, images {})",
                self.settings.container_engine,
                match self.settings.image_pull {
                    PullPolicy::Never => "on this machine only",
                    PullPolicy::Missing => "pulled when missing",
                    PullPolicy::Always => "pulled for every job",
                }
            ),
            Err(why) => format!("container-image functions cannot run: {why}"),
        }
    }

    pub fn is_available(&self) -> bool {
        self.available.is_ok()
    }

    /// Whether a job of an image function can run here: the engine is there and, for a job
    /// that asks for GPUs, the machine has them as a CDI device.
    pub fn check(&self, gpu: bool) -> Result<(), String> {
        self.available.as_ref().map_err(Clone::clone)?;
        if gpu && !cdi_device_known(&self.settings.gpu_device, &CDI_FOLDERS) {
            return Err(format!(
                "it asks for a GPU and this machine has none: no CDI device {} is described in {} \
                 (install the NVIDIA Container Toolkit and run `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`)",
                self.settings.gpu_device,
                CDI_FOLDERS.join(" or ")
            ));
        }
        Ok(())
    }

    pub fn python(&self) -> &str {
        &self.settings.image_python
    }

    pub fn code_dir(&self) -> &str {
        &self.settings.image_code_dir
    }

    /// Resources of a job whose size names no compute profile.
    pub fn default_resources(&self) -> Resources {
        Resources {
            cpu: self.settings.cpu_per_job.clone(),
            memory: format!("{}Gi", self.settings.memory_gib_per_job),
            gpus: 0,
            gpu_model: None,
        }
    }

    /// The numeric user and group of job containers, when given as numbers.
    pub fn user_ids(&self) -> Option<(u32, u32)> {
        let (user, group) = self.settings.container_user.split_once(':')?;
        Some((user.parse().ok()?, group.parse().ok()?))
    }

    /// Starts the job's container, detached. Err is the reason the job ends with, in the pod
    /// path's words (`ErrImagePull` for an image that is not there and may not be pulled).
    pub async fn start(&self, job: &ContainerJob<'_>) -> Result<(), String> {
        let arguments = run_arguments(&self.settings, job);
        let arguments: Vec<&str> = arguments.iter().map(String::as_str).collect();
        match self.output(&arguments, ENGINE_TIMEOUT).await {
            Ok(_) => Ok(()),
            Err(detail) => {
                let reason = if detail.contains("image not known")
                    || detail.contains("pull")
                    || detail.contains("manifest unknown")
                {
                    "ErrImagePull"
                } else {
                    "CreateContainerError"
                };
                let detail = if reason == "ErrImagePull" && self.settings.image_pull == PullPolicy::Never {
                    format!("{detail} (this server runs local images only: --image-pull never)")
                } else if detail.contains("OCI") && !self.settings.container_engine.contains("runc") {
                    // crun fails where cgroups are hybrid or rlimits may not be raised.
                    format!(
                        "{detail} (where podman's default runtime fails, start gantry serve with \
                         --container-engine 'podman --runtime runc --cgroup-manager cgroupfs')"
                    )
                } else {
                    detail
                };
                Err(container_start_failure(CONTAINER, reason, job.image, &detail))
            }
        }
    }

    /// Waits for the container to end and returns its exit code; `None` when it is gone or the
    /// engine cannot tell (after retrying for a minute while it still runs).
    pub async fn wait(&self, name: &str) -> Option<i32> {
        let mut failures = 0;
        loop {
            let waited = self.output(&["wait", name], Duration::MAX).await;
            if let Some(code) = waited.as_ref().ok().and_then(|out| out.trim().parse().ok()) {
                return Some(code);
            }
            match self.state(name).await {
                Ok(Some(State::Exited(code))) => return Some(code),
                Ok(None) => return None,
                Ok(Some(State::Running)) | Err(_) => {
                    failures += 1;
                    if failures >= 60 {
                        tracing::warn!(container = name, "the container engine cannot wait for a job's container");
                        return None;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// The container's state; `None` when there is no such container.
    pub async fn state(&self, name: &str) -> Result<Option<State>, String> {
        match self
            .output(
                &["container", "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name],
                ENGINE_TIMEOUT,
            )
            .await
        {
            Ok(out) => Ok(Some(parse_state(&out))),
            Err(why) if why.contains("no such") => Ok(None),
            Err(why) => Err(why),
        }
    }

    /// Asks the container to stop: SIGTERM to the launcher, SIGKILL after `grace`.
    pub async fn stop(&self, name: &str, grace: Duration) {
        let seconds = grace.as_secs().to_string();
        if let Err(why) = self.output(&["stop", "--time", &seconds, name], grace + ENGINE_TIMEOUT).await {
            tracing::warn!(container = name, why, "failed to stop a job's container");
        }
    }

    /// Removes the container (ended or not) and its anonymous volumes.
    pub async fn remove(&self, name: &str) {
        if let Err(why) = self.output(&["rm", "--force", "--volumes", name], ENGINE_TIMEOUT).await
            && !why.contains("no such")
        {
            tracing::warn!(container = name, why, "failed to remove a job's container");
        }
    }

    /// The last lines the container's launcher wrote (standard output and error), if any.
    pub async fn last_lines(&self, name: &str) -> Option<String> {
        let (stdout, stderr) = self.run(&["logs", "--tail", "3", name], ENGINE_TIMEOUT).await.ok()?;
        let lines: Vec<&str> =
            stdout.lines().chain(stderr.lines()).map(str::trim).filter(|line| !line.is_empty()).collect();
        (!lines.is_empty()).then(|| lines.join(" | "))
    }

    /// Names and job ids of every job container on this machine, running or not.
    pub async fn job_containers(&self) -> Result<Vec<(String, String)>, String> {
        let format = format!("{{{{.Names}}}} {{{{index .Labels \"{JOB_LABEL}\"}}}}");
        let filter = format!("label={JOB_LABEL}");
        let out = self.output(&["ps", "--all", "--filter", &filter, "--format", &format], ENGINE_TIMEOUT).await?;
        Ok(out
            .lines()
            .filter_map(|line| line.split_once(' '))
            .map(|(name, job)| (name.to_string(), job.trim().to_string()))
            .collect())
    }

    /// Runs the engine with `arguments` and returns its standard output, or its standard error
    /// (the last lines) when it fails.
    async fn output(&self, arguments: &[&str], timeout: Duration) -> Result<String, String> {
        self.run(arguments, timeout).await.map(|(stdout, _)| stdout)
    }

    /// Runs the engine with `arguments`: its standard output and error when it succeeds, else
    /// the last lines of its standard error.
    async fn run(&self, arguments: &[&str], timeout: Duration) -> Result<(String, String), String> {
        let Some((program, global)) = self.command.split_first() else {
            return Err("no container engine command".into());
        };
        let mut command = tokio::process::Command::new(program);
        command
            .args(global)
            .args(arguments)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(conf) = &self.settings.containers_conf {
            command.env("CONTAINERS_CONF", conf);
        }
        let run = command.output();
        let output = match tokio::time::timeout(timeout, run).await {
            Ok(Ok(output)) => output,
            Ok(Err(error)) => return Err(format!("failed to run {program}: {error}")),
            Err(_) => return Err(format!("{program} {} took longer than {} s", arguments[0], timeout.as_secs())),
        };
        if output.status.success() {
            let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
            return Ok((text(&output.stdout), text(&output.stderr)));
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last: Vec<&str> = stderr.lines().filter(|line| !line.trim().is_empty()).collect();
        let detail = last[last.len().saturating_sub(3)..].join(" ");
        Err(if detail.is_empty() { format!("{program} exited with {}", output.status) } else { detail })
    }
}

/// Where CDI device descriptions are kept.
const CDI_FOLDERS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// Whether a CDI description in `folders` names the kind of `device` (`nvidia.com/gpu` of
/// `nvidia.com/gpu=all`).
fn cdi_device_known(device: &str, folders: &[&str]) -> bool {
    let kind = device.split('=').next().unwrap_or(device);
    folders.iter().filter_map(|folder| std::fs::read_dir(folder).ok()).flatten().flatten().any(|entry| {
        std::fs::read_to_string(entry.path()).is_ok_and(|text| {
            text.lines().any(|line| {
                let line = line.trim().trim_start_matches('"');
                line.starts_with("kind") && line.contains(kind)
            })
        })
    })
}

fn parse_state(out: &str) -> State {
    let mut words = out.split_whitespace();
    let status = words.next().unwrap_or_default();
    let code = words.next().and_then(|code| code.parse().ok()).unwrap_or(-1);
    match status {
        "created" | "configured" | "initialized" | "running" | "paused" | "stopping" => State::Running,
        _ => State::Exited(code),
    }
}

/// The engine's `run` arguments for one job (pure).
pub fn run_arguments(settings: &ContainerArgs, job: &ContainerJob<'_>) -> Vec<String> {
    let mut arguments: Vec<String> = vec![
        "run".into(),
        "--detach".into(),
        format!("--name={}", container_name(job.job_id)),
        format!("--label={JOB_LABEL}={}", job.job_id),
        format!("--pull={}", settings.image_pull.as_str()),
        format!("--network={}", settings.container_network),
        format!("--user={}", settings.container_user),
        "--read-only".into(),
        "--cap-drop=all".into(),
        "--security-opt=no-new-privileges".into(),
        format!("--cpus={}", cpus(&job.resources.cpu)),
        format!("--memory={}", memory(&job.resources.memory)),
        // No swap beyond the memory limit: the size's memory is the job's.
        format!("--memory-swap={}", memory(&job.resources.memory)),
        // The engine's copy of the job's output is only for a launcher that could not report:
        // bounded (the job's logs are the launcher's, capped by FUNCTIONS_LOGS_SIZE_LIMIT).
        "--log-opt=max-size=1mb".into(),
    ];
    arguments.extend(settings.container_ulimits.iter().filter(|u| !u.is_empty()).map(|u| format!("--ulimit={u}")));
    if job.resources.gpus > 0 {
        // `nvidia.com/gpu=all` names every GPU: the job gets only those it holds.
        match settings.gpu_device.strip_suffix("=all") {
            Some(kind) if !job.gpus.is_empty() => {
                arguments.extend(job.gpus.iter().map(|minor| format!("--device={kind}={minor}")));
            }
            _ => arguments.push(format!("--device={}", settings.gpu_device)),
        }
    }
    arguments.extend([
        format!("--volume={}:{WORK_MOUNT}", job.work_dir.display()),
        format!("--volume={}:{LAUNCHER_MOUNT}:ro", job.launcher.display()),
        format!("--env-file={}", job.env_file.display()),
        format!("--entrypoint={LAUNCHER_MOUNT}"),
        job.image.to_string(),
        "launch".into(),
    ]);
    arguments
}

/// A Kubernetes CPU quantity (`4`, `500m`) as the engine's `--cpus`.
fn cpus(quantity: &str) -> String {
    match quantity.strip_suffix('m').and_then(|m| m.parse::<f64>().ok()) {
        Some(millis) => format!("{}", millis / 1000.0),
        None => quantity.to_string(),
    }
}

/// A Kubernetes memory quantity (`8Gi`, `512Mi`) as the engine's `--memory` (bytes).
fn memory(quantity: &str) -> String {
    crate::domain::sizes::memory_bytes(quantity).map_or_else(|| quantity.to_string(), |bytes| bytes.to_string())
}

/// The text of an env-file: one `NAME=value` a line. Err names a variable the format cannot
/// carry (a line break in its value, or a name that is not a variable's).
pub fn env_file(variables: &BTreeMap<String, String>) -> Result<String, String> {
    let mut text = String::new();
    for (name, value) in variables {
        if name.is_empty() || name.contains(['=', '\n', '\0']) {
            return Err(format!("'{name}' is not a valid environment variable name for a container"));
        }
        if value.contains(['\n', '\r', '\0']) {
            return Err(format!(
                "the environment variable {name} holds a line break, which a job container cannot be given"
            ));
        }
        text.push_str(name);
        text.push('=');
        text.push_str(value);
        text.push('\n');
    }
    Ok(text)
}

/// Moves what the launcher archived into the job's private object folder into the storage:
/// the result, the logs, and the exit record last (its presence means the rest is there). Each
/// file is opened without following links and without leaving the folder, since the job's own
/// processes could have replaced it.
pub async fn import_objects(storage: &Storage, work_dir: &Path, job_id: &str) -> Result<(), String> {
    let folder = work_dir.join(OBJECTS_FOLDER);
    let keys =
        [keys::job_result(job_id), keys::job_user_log(job_id), keys::job_provider_log(job_id), keys::job_exit(job_id)];
    for key in keys {
        let opened = {
            let folder = folder.clone();
            let name = PathBuf::from(&key);
            tokio::task::spawn_blocking(move || crate::shared::open_beneath(&folder, &name))
                .await
                .map_err(|e| e.to_string())?
        };
        let file = match opened {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => return Err(format!("failed to read {key} the job archived: {error}")),
        };
        // The descriptor's own path: the file opened above, whatever its name points at now.
        use std::os::fd::AsRawFd;
        let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        storage.put_file(&key, &path).await.map_err(|e| format!("failed to store {key}: {e}"))?;
        drop(file);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        containers: ContainerArgs,
    }

    fn settings(flags: &[&str]) -> ContainerArgs {
        Flags::parse_from(std::iter::once("serve").chain(flags.iter().copied())).containers
    }

    fn job<'a>(resources: &'a Resources) -> ContainerJob<'a> {
        ContainerJob {
            job_id: "j1",
            image: "localhost/fn:1",
            work_dir: Path::new("/data/jobs/j1"),
            launcher: Path::new("/usr/bin/gantry"),
            env_file: Path::new("/data/jobs/.j1.env"),
            resources,
            gpus: &[],
        }
    }

    #[test]
    fn a_job_container_is_the_pod_contract_on_this_machine() {
        let resources = Resources { cpu: "500m".into(), memory: "2Gi".into(), gpus: 0, gpu_model: None };
        let arguments = run_arguments(&settings(&[]), &job(&resources));
        let has = |flag: &str| arguments.iter().any(|a| a == flag);
        for flag in [
            "--detach",
            "--pull=never",
            "--network=host",
            "--user=65532:65532",
            "--read-only",
            "--cap-drop=all",
            "--security-opt=no-new-privileges",
            "--cpus=0.5",
            "--memory=2147483648",
            "--memory-swap=2147483648",
            "--ulimit=nofile=1024:1024",
            "--ulimit=nproc=4096:4096",
            "--volume=/data/jobs/j1:/gantry/work",
            "--volume=/usr/bin/gantry:/gantry/bin/gantry:ro",
            "--env-file=/data/jobs/.j1.env",
            "--entrypoint=/gantry/bin/gantry",
            "--label=gantry.job-id=j1",
        ] {
            assert!(has(flag), "{flag} missing from {arguments:?}");
        }
        assert_eq!(arguments[arguments.len() - 2..], ["localhost/fn:1".to_string(), "launch".to_string()]);
        assert!(has("--name=gantry-job-j1"));
        assert!(!arguments.iter().any(|a| a.starts_with("--device")), "no GPU asked for");
        assert!(!arguments.iter().any(|a| a.contains("TOKEN")), "secrets travel in the env-file only");

        let gpu = Resources { cpu: "24".into(), memory: "120Gi".into(), gpus: 1, gpu_model: None };
        let arguments = run_arguments(&settings(&["--image-pull", "missing", "--container-ulimits", ""]), &job(&gpu));
        assert!(arguments.contains(&"--device=nvidia.com/gpu=all".to_string()));
        assert!(arguments.contains(&"--pull=missing".to_string()));
        assert!(arguments.contains(&"--cpus=24".to_string()));
        assert!(!arguments.iter().any(|a| a.starts_with("--ulimit")));

        // The GPUs the job holds, each by its own CDI name: none of the others.
        let two = Resources { gpus: 2, ..gpu.clone() };
        let held = ContainerJob { gpus: &[1, 3], ..job(&two) };
        let devices: Vec<String> =
            run_arguments(&settings(&[]), &held).into_iter().filter(|a| a.starts_with("--device")).collect();
        assert_eq!(devices, ["--device=nvidia.com/gpu=1", "--device=nvidia.com/gpu=3"]);
    }

    #[test]
    fn quantities_become_engine_units() {
        assert_eq!(cpus("4"), "4");
        assert_eq!(cpus("1500m"), "1.5");
        assert_eq!(memory("8Gi"), (8u64 << 30).to_string());
        assert_eq!(memory("512Mi"), (512u64 << 20).to_string());
        assert_eq!(memory("1G"), "1000000000");
        assert_eq!(memory("123"), "123");
    }

    #[test]
    fn env_files_refuse_what_they_cannot_carry() {
        let variables = |name: &str, value: &str| BTreeMap::from([(name.to_string(), value.to_string())]);
        assert_eq!(env_file(&variables("A", "b c=d")).unwrap(), "A=b c=d\n");
        assert!(env_file(&variables("KEY", "line\nbreak")).unwrap_err().contains("KEY holds a line break"));
        assert!(env_file(&variables("A=B", "x")).is_err());
    }

    #[test]
    fn states_and_cdi_devices_are_read() {
        assert_eq!(parse_state("running 0\n"), State::Running);
        assert_eq!(parse_state("created 0"), State::Running);
        assert_eq!(parse_state("exited 3"), State::Exited(3));
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().to_str().unwrap();
        assert!(!cdi_device_known("nvidia.com/gpu=all", &[path, "/nonexistent"]));
        std::fs::write(folder.path().join("nvidia.yaml"), "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
            .unwrap();
        assert!(cdi_device_known("nvidia.com/gpu=all", &[path]));
        assert!(!cdi_device_known("amd.com/gpu=all", &[path]));
    }

    #[tokio::test]
    async fn a_missing_engine_is_named_with_what_to_install() {
        let engine = settings(&["--container-engine", "/nonexistent/podman --runtime runc"]).engine().await;
        assert!(!engine.is_available());
        let why = engine.check(false).unwrap_err();
        assert!(why.contains("apt-get install podman runc") && why.contains("/nonexistent/podman"), "{why}");
        assert!(engine.describe().starts_with("container-image functions cannot run"));
    }
}
