//! A kubelet double: runs each pod that appears in the API server double as local processes,
//! as a node would. The init containers run first, then the main container's command with the
//! pod's environment (plain values, and `secretKeyRef` resolved from the double's Secrets). It
//! reports the pod's phase, start time and container states as the kubelet does, serves the
//! container's output as `pods/{name}/log`, and kills the processes when the pod is deleted.
//! Told to, it fails an image pull, never schedules a pod, or loses one (as a dead node would),
//! and it ends pods the way the cluster does before their containers start (eviction, the
//! scheduler's preemption, a lost node, deletion by the taint manager), for the first pods of a
//! function or all of them. Pods are told apart by their uid: a retried job's next pod has the
//! same name as the one that ended.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use crate::doubles::kube_double::{ApiServer, Kind};

pub mod fast;

/// What the node does with the pods of one function (by the pod's function label).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The image cannot be pulled (`ErrImagePull`).
    PullFails,
    /// No node fits: the pod stays `Pending` with `PodScheduled=False/Unschedulable`.
    NeverSchedule,
    /// The pod disappears once its container has written a line, or ended (a node lost with it).
    LostWhileRunning,
    /// The init container (the launcher's copy) fails: the job's container never starts.
    InitFails,
    /// The container is killed by the kernel at its memory limit once it has written a line
    /// (`OOMKilled`, exit 137): every process of the container dies at once, nothing is shipped.
    OutOfMemory,
    /// The node evicts the pod once its container has written a line (the kubelet stops the
    /// container as for a deletion, then reports `Failed`/`Evicted`).
    Evicted,
    /// The job's Secret is deleted before the container starts (`CreateContainerConfigError`).
    SecretMissing,
    /// The kubelet evicts the pod (node pressure) before its containers start: phase `Failed`,
    /// reason `Evicted`, a `DisruptionTarget` condition (`TerminationByKubelet`).
    EvictedBeforeStart,
    /// The scheduler preempts the pod before its containers start: a `DisruptionTarget`
    /// condition (`PreemptionByScheduler`), then a graceful delete the node confirms.
    PreemptedBeforeStart,
    /// The node stops answering before the containers start: the node controller sets the
    /// pod's phase `Unknown` with reason `NodeLost`, and nothing ever runs or removes it.
    NodeLostBeforeStart,
    /// The cluster deletes the pod before its containers start (the taint manager evicting it
    /// from a tainted node): `DisruptionTarget` (`DeletionByTaintManager`), then a delete.
    DeletedBeforeStart,
}

impl Fault {
    /// The cluster ends the pod before any container of it starts.
    fn before_start(&self) -> bool {
        matches!(
            self,
            Fault::EvictedBeforeStart
                | Fault::PreemptedBeforeStart
                | Fault::NodeLostBeforeStart
                | Fault::DeletedBeforeStart
        )
    }
}

/// Kills `pid` and every process descended from it with SIGKILL (what the kernel's OOM killer does
/// to a container's cgroup).
fn kill_tree(pid: u32) {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        let parent = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if let Some(parent) = parent {
            children.entry(parent).or_default().push(child);
        }
    }
    let mut pending = vec![pid];
    while let Some(next) = pending.pop() {
        unsafe { libc::kill(next as i32, libc::SIGKILL) };
        pending.extend(children.get(&next).into_iter().flatten());
    }
}

/// Faults by function, with how many more pods meet each (`None`: every pod).
type Faults = HashMap<String, (Fault, Option<usize>)>;

#[derive(Clone)]
pub struct Kubelet {
    api: ApiServer,
    namespace: String,
    /// Faults by function, with how many more pods meet them (`None`: every pod).
    faults: Arc<Mutex<Faults>>,
    /// Functions whose pods find storage refusing their writes.
    refusing: Arc<Mutex<HashSet<String>>>,
    /// Pods (by uid) whose containers this node is starting or running.
    active: Arc<Mutex<HashSet<String>>>,
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

impl Kubelet {
    /// Starts watching `namespace` for new pods.
    pub fn start(api: ApiServer, namespace: &str) -> Kubelet {
        let kubelet = Kubelet::idle(api, namespace);
        let running = kubelet.clone();
        tokio::spawn(async move { running.run().await });
        kubelet
    }

    /// A node that watches nothing: it runs the pods it is handed ([`Kubelet::run_pod`]), as the
    /// fast path ([`fast::FastKubelet`]) hands it its sample of real processes.
    pub fn idle(api: ApiServer, namespace: &str) -> Kubelet {
        Kubelet {
            api,
            namespace: namespace.into(),
            faults: Arc::default(),
            refusing: Arc::default(),
            active: Arc::default(),
        }
    }

    /// From now on, pods of `function` meet `fault`.
    pub fn inject(&self, function: &str, fault: Fault) {
        self.faults.lock().expect("lock").insert(function.into(), (fault, None));
    }

    /// The next `pods` pods of `function` meet `fault`; the ones after run normally.
    pub fn inject_times(&self, function: &str, fault: Fault, pods: usize) {
        self.faults.lock().expect("lock").insert(function.into(), (fault, Some(pods)));
    }

    /// The fault the next pod of `function` meets, counting it.
    fn fault_for(&self, function: &str) -> Option<Fault> {
        let mut faults = self.faults.lock().expect("lock");
        let (fault, left) = faults.get_mut(function)?;
        match left {
            None => Some(fault.clone()),
            Some(0) => None,
            Some(count) => {
                *count -= 1;
                Some(fault.clone())
            }
        }
    }

    /// From now on, the object storage refuses the writes of pods of `function` (their
    /// presigned write URLs lead nowhere), so their launcher cannot ship anything.
    pub fn refuse_writes(&self, function: &str) {
        self.refusing.lock().expect("lock").insert(function.into());
    }

    async fn run(self) {
        let mut seen = HashSet::new();
        loop {
            for pod in self.api.list(Kind::POD, &self.namespace) {
                let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
                let uid = pod["metadata"]["uid"].as_str().unwrap_or_default().to_string();
                if pod["status"]["phase"] == "Unknown" {
                    // Its node is gone: nobody confirms its deletion (a force delete removes it).
                    continue;
                }
                if seen.insert(uid.clone()) {
                    self.active.lock().expect("lock").insert(uid.clone());
                    let node = self.clone();
                    tokio::spawn(async move {
                        node.handle(&name, pod).await;
                        node.active.lock().expect("lock").remove(&uid);
                    });
                } else if !pod["metadata"]["deletionTimestamp"].is_null()
                    && !self.active.lock().expect("lock").contains(&uid)
                {
                    // Deleted once its containers stopped: the node confirms with a final delete.
                    self.api.delete_now(Kind::POD, &self.namespace, &name);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn set_status(&self, name: &str, status: Value) {
        self.api.update_status(Kind::POD, &self.namespace, name, status);
    }

    /// The container's environment: values as given, secret references resolved; the missing
    /// reference when one cannot be (the real kubelet reports `CreateContainerConfigError` and
    /// retries).
    fn environment(&self, container: &Value) -> Result<Vec<(String, String)>, String> {
        let mut resolved = Vec::new();
        for variable in container["env"].as_array().into_iter().flatten() {
            let name = variable["name"].as_str().unwrap_or_default().to_string();
            if let Some(value) = variable["value"].as_str() {
                resolved.push((name, value.to_string()));
                continue;
            }
            let reference = &variable["valueFrom"]["secretKeyRef"];
            let secret = self.api.get(Kind::SECRET, &self.namespace, reference["name"].as_str().unwrap_or_default());
            let data = secret
                .as_ref()
                .and_then(|s| s["data"][reference["key"].as_str().unwrap_or_default()].as_str().map(str::to_string));
            match data.and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok()) {
                Some(bytes) => resolved.push((name, String::from_utf8_lossy(&bytes).into_owned())),
                None if reference["optional"] == true => {}
                None => return Err(format!("couldn't find key {} in Secret {}", reference["key"], reference["name"])),
            }
        }
        Ok(resolved)
    }

    fn command(&self, container: &Value, function: &str, volumes: &Volumes) -> tokio::process::Command {
        let mut environment = self.environment(container).unwrap_or_default();
        for (name, value) in environment.iter_mut() {
            *value = volumes.relocate(container, value);
            if name == "GANTRY_TERMINATION_LOG" {
                // As a container's `/dev/termination-log`: one file per pod.
                *value = volumes.termination_log().display().to_string();
            }
        }
        if self.refusing.lock().expect("lock").contains(function) {
            for (_, value) in environment.iter_mut().filter(|(name, _)| name == "GANTRY_JOB_ACCESS") {
                let mut access: Value = serde_json::from_str(value).expect("the access is JSON");
                for url in access["write"].as_object_mut().expect("write URLs").values_mut() {
                    *url = json!("http://127.0.0.1:9/refused");
                }
                *value = access.to_string();
            }
        }
        let words: Vec<String> = container["command"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|w| w.as_str().map(|w| volumes.relocate(container, w)))
            .collect();
        let mut command = tokio::process::Command::new(&words[0]);
        command
            .args(&words[1..])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(environment)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        command
    }

    fn present(&self, name: &str) -> bool {
        self.api.get(Kind::POD, &self.namespace, name).is_some_and(|pod| pod["metadata"]["deletionTimestamp"].is_null())
    }

    /// Runs the pod's containers as local processes until they end (or the pod is deleted),
    /// reporting its status as the kubelet does.
    pub async fn run_pod(&self, name: &str, pod: Value) {
        self.handle(name, pod).await
    }

    async fn handle(&self, name: &str, pod: Value) {
        let function = pod["metadata"]["labels"][gantry::crd::LABEL_FUNCTION].as_str().unwrap_or_default();
        let fault = self.fault_for(function);
        let main = pod["spec"]["containers"][0].clone();
        let image = main["image"].as_str().unwrap_or_default().to_string();
        match fault {
            Some(Fault::PullFails) => {
                self.api.bind(&self.namespace, name, "node-double");
                return self.set_status(
                    name,
                    json!({"phase": "Pending", "containerStatuses": [{
                    "name": "job", "image": image, "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"waiting": {"reason": "ErrImagePull", "message": "pull access denied for the image"}}}]}),
                );
            }
            Some(Fault::NeverSchedule) => {
                return self.set_status(
                    name,
                    json!({"phase": "Pending", "conditions": [{
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu"}]}),
                );
            }
            _ => {}
        }
        self.api.bind(&self.namespace, name, "node-double");
        if let Some(fault) = fault.as_ref().filter(|f| f.before_start()) {
            return self.end_before_start(name, &image, fault).await;
        }
        if fault == Some(Fault::SecretMissing) {
            // Gone, and kept gone (the gateway applies the Secret twice: a delete between the two
            // would otherwise be undone), until the pod is deleted.
            let secret = main["env"]
                .as_array()
                .into_iter()
                .flatten()
                .find_map(|v| v["valueFrom"]["secretKeyRef"]["name"].as_str().map(str::to_string))
                .unwrap_or_default();
            while self.present(name) {
                self.api.delete_now(Kind::SECRET, &self.namespace, &secret);
                let missing = format!("secret \"{secret}\" not found");
                self.set_status(
                    name,
                    json!({"phase": "Pending", "containerStatuses": [{
                    "name": "job", "image": image, "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"waiting": {"reason": "CreateContainerConfigError", "message": missing}}}]}),
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            return;
        }
        while let Err(missing) = self.environment(&main) {
            self.set_status(
                name,
                json!({"phase": "Pending", "containerStatuses": [{
                "name": "job", "image": image, "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "CreateContainerConfigError", "message": missing}}}]}),
            );
            if !self.present(name) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let volumes = Volumes::of(&pod);
        for init in pod["spec"]["initContainers"].as_array().into_iter().flatten() {
            let mut command = self.command(init, function, &volumes);
            if fault == Some(Fault::InitFails) {
                command = tokio::process::Command::new("sh");
                command.args(["-c", "echo 'cp: cannot create regular file: Read-only file system' >&2; exit 1"]);
            }
            let status = command.output().await;
            eprintln!("kubelet double: init {:?}", status);
            let code = status.as_ref().ok().and_then(|s| s.status.code()).unwrap_or(128);
            if code != 0 {
                // As the kubelet: the init container terminated with its code, the job's
                // container waits for it forever, and (restartPolicy Never) the pod fails.
                let finished = now();
                return self.set_status(
                    name,
                    json!({"phase": "Failed",
                        "initContainerStatuses": [{"name": init["name"], "image": init["image"], "imageID": "", "ready": false, "restartCount": 0,
                            "state": {"terminated": {"exitCode": code, "reason": "Error", "startedAt": finished, "finishedAt": finished}}}],
                        "containerStatuses": [{"name": "job", "image": image, "imageID": "", "ready": false, "restartCount": 0,
                            "state": {"waiting": {"reason": "PodInitializing"}}}]}),
                );
            }
        }
        let Ok(mut child) = self.command(&main, function, &volumes).spawn() else {
            return self.set_status(name, json!({"phase": "Failed", "message": "the command could not start"}));
        };
        let started = now();
        self.set_status(name, json!({"phase": "Running", "startTime": started, "containerStatuses": [{
            "name": "job", "image": image, "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {"startedAt": started}}}]}));
        let output = Arc::new(Mutex::new(Vec::<u8>::new()));
        let mut pipes = Vec::new();
        for pipe in [
            child.stdout.take().map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
            child.stderr.take().map(|p| Box::new(p) as _),
        ]
        .into_iter()
        .flatten()
        {
            let output = Arc::clone(&output);
            // As a container runtime logs: each stream line by line, so lines of stdout and
            // stderr interleave whole, never mid-line (a partial line waits for its end).
            pipes.push(tokio::spawn(async move {
                let mut pipe = pipe;
                let mut buffer = [0u8; 4096];
                let mut pending = Vec::new();
                while let Ok(read) = pipe.read(&mut buffer).await {
                    if read == 0 {
                        break;
                    }
                    pending.extend_from_slice(&buffer[..read]);
                    if let Some(end) = pending.iter().rposition(|byte| *byte == b'\n') {
                        output.lock().expect("lock").extend(pending.drain(..=end));
                    }
                }
                output.lock().expect("lock").extend(pending);
            }));
        }
        let deadline = pod["spec"]["activeDeadlineSeconds"]
            .as_u64()
            .map(|seconds| std::time::Instant::now() + Duration::from_secs(seconds));
        let mut deadline_exceeded = false;
        let mut out_of_memory = false;
        let mut evicted = false;
        let exit = loop {
            tokio::select! {
                status = child.wait() => break status.ok().and_then(|s| s.code()),
                _ = tokio::time::sleep(Duration::from_millis(100)) => {
                    let text = String::from_utf8_lossy(&output.lock().expect("lock")).into_owned();
                    self.api.set_pod_log(&self.namespace, name, &text);
                    deadline_exceeded = deadline.is_some_and(|at| std::time::Instant::now() >= at);
                    if fault == Some(Fault::LostWhileRunning) && !text.is_empty() {
                        if let Some(pid) = child.id() {
                            kill_tree(pid);
                        }
                        self.api.delete_now(Kind::POD, &self.namespace, name);
                        return;
                    }
                    if fault == Some(Fault::OutOfMemory) && !text.is_empty() {
                        out_of_memory = true;
                        if let Some(pid) = child.id() {
                            kill_tree(pid);
                        }
                        let _ = child.wait().await;
                        break Some(137);
                    }
                    evicted = fault == Some(Fault::Evicted) && !text.is_empty();
                    if !self.present(name) || deadline_exceeded || evicted {
                        // Deleted: stop the containers as the kubelet would (SIGTERM, then SIGKILL
                        // after the grace period).
                        let grace = self
                            .api
                            .get(Kind::POD, &self.namespace, name)
                            .and_then(|pod| pod["metadata"]["deletionGracePeriodSeconds"].as_u64())
                            .unwrap_or(10);
                        if let Some(pid) = child.id() {
                            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
                        }
                        let status = match tokio::time::timeout(Duration::from_secs(grace), child.wait()).await {
                            Ok(status) => status.ok(),
                            Err(_) => {
                                let _ = child.kill().await;
                                None
                            }
                        };
                        use std::os::unix::process::ExitStatusExt;
                        break Some(status.and_then(|s| s.code().or(s.signal().map(|n| 128 + n))).unwrap_or(137));
                    }
                }
            }
        };
        for pipe in pipes {
            let _ = pipe.await;
        }
        if fault == Some(Fault::LostWhileRunning) {
            // Ended before its first line was seen: lost all the same, never reported.
            self.api.delete_now(Kind::POD, &self.namespace, name);
            return;
        }
        let text = String::from_utf8_lossy(&output.lock().expect("lock")).into_owned();
        self.api.set_pod_log(&self.namespace, name, &text);
        let code = exit.unwrap_or(137);
        // As the kubelet: what the container wrote to its termination message path.
        let termination_message = std::fs::read_to_string(volumes.termination_log()).ok();
        eprintln!("kubelet double: {name} exited {code}: {text}");
        if self.api.get(Kind::POD, &self.namespace, name).is_none() {
            return;
        }
        let finished = now();
        if evicted {
            return self.set_status(
                name,
                json!({"phase": "Failed", "reason": "Evicted", "startTime": started,
                       "message": "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi.",
                       "containerStatuses": [{"name": "job", "image": image, "imageID": "", "ready": false, "restartCount": 0,
                           "state": {"terminated": {"exitCode": code, "startedAt": started, "finishedAt": finished, "reason": "Error"}}}]}),
            );
        }
        if deadline_exceeded {
            // As the kubelet: the pod fails with reason DeadlineExceeded.
            self.set_status(
                name,
                json!({"phase": "Failed", "reason": "DeadlineExceeded", "startTime": started,
                       "message": "Pod was active on the node longer than the specified deadline",
                       "containerStatuses": [{"name": "job", "image": image, "imageID": "", "ready": false, "restartCount": 0,
                           "state": {"terminated": {"exitCode": code, "startedAt": started, "finishedAt": finished, "reason": "Error"}}}]}),
            );
            return;
        }
        self.set_status(
            name,
            json!({
                "phase": if code == 0 { "Succeeded" } else { "Failed" },
                "startTime": started,
                "containerStatuses": [{"name": "job", "image": image, "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": code, "startedAt": started, "finishedAt": finished,
                                              "message": termination_message,
                                              "reason": if out_of_memory { "OOMKilled" } else if code == 0 { "Completed" } else { "Error" }}}}]
            }),
        );
        if !self.present(name) {
            // Being deleted and its containers stopped: the node removes it.
            self.api.delete_now(Kind::POD, &self.namespace, name);
        }
    }
}

impl Kubelet {
    /// Ends a bound pod the way the cluster does before any of its containers started.
    async fn end_before_start(&self, name: &str, image: &str, fault: &Fault) {
        let waiting = json!([{"name": "job", "image": image, "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ContainerCreating"}}}]);
        let disruption = |reason: &str, message: &str| {
            json!([{"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message,
                    "lastTransitionTime": now()}])
        };
        let (reason, message) = match fault {
            Fault::EvictedBeforeStart => {
                let message =
                    "The node was low on resource: ephemeral-storage. Threshold quantity: 1Gi, available: 512Mi.";
                self.set_status(
                    name,
                    json!({"phase": "Failed", "reason": "Evicted", "message": message,
                           "conditions": disruption("TerminationByKubelet", message), "containerStatuses": waiting}),
                );
                return;
            }
            Fault::NodeLostBeforeStart => {
                let message = format!("Node node-double which was running pod {name} is unresponsive");
                self.set_status(
                    name,
                    json!({"phase": "Unknown", "reason": "NodeLost", "message": message, "containerStatuses": waiting}),
                );
                return;
            }
            Fault::PreemptedBeforeStart => (
                "PreemptionByScheduler",
                "Kubernetes default scheduler: preempting to accommodate a higher priority pod",
            ),
            _ => ("DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint"),
        };
        self.set_status(
            name,
            json!({"phase": "Pending", "conditions": disruption(reason, message), "containerStatuses": waiting}),
        );
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(self.api.client(), &self.namespace);
        // Graceful: marked deleting, then removed by this node's loop once this handler ends
        // (nothing of it runs; a node takes a moment to tear down the pod's sandbox).
        let _ = pods.delete(name, &Default::default()).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A pod's `emptyDir` volumes: a fresh folder each, removed with the pod. The processes run in
/// this machine's file system, so a container's mount paths are rewritten to its pod's folders
/// wherever they start a value of its command or environment (what a mount namespace does on a
/// real node): two pods never share their work or data folders.
struct Volumes {
    root: tempfile::TempDir,
    names: Vec<String>,
}

impl Volumes {
    fn of(pod: &Value) -> Volumes {
        let root = tempfile::tempdir().expect("pod volumes folder");
        let names: Vec<String> = pod["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|volume| volume.get("emptyDir").is_some())
            .filter_map(|volume| volume["name"].as_str().map(str::to_string))
            .collect();
        for name in &names {
            std::fs::create_dir_all(root.path().join(name)).expect("pod volume folder");
        }
        Volumes { root, names }
    }

    /// The pod's termination message file (outside its volumes).
    fn termination_log(&self) -> std::path::PathBuf {
        self.root.path().join("termination-log")
    }

    /// `text` with a leading mount path of `container` replaced by its volume's folder.
    fn relocate(&self, container: &Value, text: &str) -> String {
        for mount in container["volumeMounts"].as_array().into_iter().flatten() {
            let (Some(name), Some(path)) = (mount["name"].as_str(), mount["mountPath"].as_str()) else { continue };
            if !self.names.iter().any(|known| known == name) {
                continue;
            }
            let path = path.trim_end_matches('/');
            if let Some(rest) = text.strip_prefix(path)
                && (rest.is_empty() || rest.starts_with('/'))
            {
                return format!("{}{rest}", self.root.path().join(name).display());
            }
        }
        text.to_string()
    }
}
