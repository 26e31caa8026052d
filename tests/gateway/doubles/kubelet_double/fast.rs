//! The kubelet double's fast path: a node that runs no process for most pods. It learns of pods
//! from the API server double's change feed (not by listing: a soak has tens of thousands), and
//! plays each one's life by its function's [`Run`]: the statuses a kubelet reports (bound,
//! `Running` with a log, then `Succeeded` or the failure asked for), stopping it when it is
//! deleted and confirming the deletion once its "containers" stopped, as a node does. Pods of the
//! functions marked [`Run::Process`] are handed to the process kubelet double (the launcher and
//! the function run for real). A fault is played on a job's first pod only: a pod made again for
//! the same job (an infrastructure retry) runs as [`Run::Succeed`].

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use super::{Kubelet, now};
use crate::doubles::kube_double::{ApiServer, EventType, Kind};

/// How a pod of a function lives on the fast path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Run {
    /// Runs a moment, writes two lines, exits 0.
    Succeed,
    /// Runs a moment, writes two lines, exits with this code.
    Exit(i32),
    /// The image cannot be pulled (`ErrImagePull`).
    PullFails,
    /// The init container fails (exit 1): the job's container never starts.
    InitFails,
    /// Killed at its memory limit once it wrote a line (`OOMKilled`, 137).
    OutOfMemory,
    /// Ended past `activeDeadlineSeconds` (`Failed`/`DeadlineExceeded`) once it wrote a line.
    DeadlineExceeded,
    /// Runs (one line written) until deleted; the owner is told when it runs.
    UntilDeleted,
    /// Bound, its container still being created, until deleted; the owner is told.
    PendingUntilDeleted,
    /// No node fits: `Pending`, `PodScheduled=False/Unschedulable`, unbound.
    NeverSchedule,
    /// Its Secret cannot be found (`CreateContainerConfigError`).
    SecretMissing,
    /// Evicted by its node before its container started.
    EvictedBeforeStart,
    /// Preempted (a higher-priority pod took its place) before its container started.
    PreemptedBeforeStart,
    /// Its node was lost before its container started: the pod vanishes.
    LostBeforeStart,
    /// Evicted by its node once its container wrote a line.
    EvictedWhileRunning,
    /// Its node was lost once its container wrote a line: the pod vanishes.
    LostWhileRunning,
    /// Run as local processes by the process kubelet double.
    Process,
}

/// The fast node. Clones share one state.
#[derive(Clone)]
pub struct FastKubelet {
    api: ApiServer,
    namespace: String,
    runs: Arc<Mutex<HashMap<String, Run>>>,
    processes: Kubelet,
    /// Pods whose life is being played (their "containers" run).
    active: Arc<Mutex<HashSet<String>>>,
    /// The uids of the pods whose life was played, per job id, in order (a second is a retry;
    /// a uid twice is one pod's life played twice).
    attempts: Arc<Mutex<HashMap<String, Vec<String>>>>,
    /// (function, job id, user label) of pods that reached the point their owner acts at.
    reached: mpsc::UnboundedSender<(String, String, String)>,
    created: Arc<AtomicUsize>,
}

fn jitter(from_ms: u64, to_ms: u64) -> Duration {
    let random = uuid::Uuid::new_v4().as_u64_pair().0;
    Duration::from_millis(from_ms + random % (to_ms - from_ms).max(1))
}

fn label<'a>(pod: &'a Value, label: &str) -> &'a str {
    pod["metadata"]["labels"][label].as_str().unwrap_or_default()
}

impl FastKubelet {
    /// Starts following `namespace`'s pods. Returns the node and where it says which pods of
    /// [`Run::UntilDeleted`] and [`Run::PendingUntilDeleted`] reached their point.
    pub fn start(api: ApiServer, namespace: &str) -> (FastKubelet, mpsc::UnboundedReceiver<(String, String, String)>) {
        let (reached, receiver) = mpsc::unbounded_channel();
        let node = FastKubelet {
            processes: Kubelet::idle(api.clone(), namespace),
            api,
            namespace: namespace.into(),
            runs: Arc::default(),
            active: Arc::default(),
            attempts: Arc::default(),
            reached,
            created: Arc::default(),
        };
        // Subscribed before the task starts: no pod made from now on is missed.
        let changes = node.api.subscribe();
        let following = node.clone();
        tokio::spawn(async move { following.follow(changes).await });
        (node, receiver)
    }

    /// From now on, pods of `function` live as `run` (others as [`Run::Succeed`]).
    pub fn set(&self, function: &str, run: Run) {
        self.runs.lock().expect("lock").insert(function.into(), run);
    }

    /// Pods this node was given so far.
    pub fn pods_seen(&self) -> usize {
        self.created.load(Ordering::Relaxed)
    }

    /// The uids of the pods whose life was played, per job id, in order.
    pub fn pods_played(&self) -> HashMap<String, Vec<String>> {
        self.attempts.lock().expect("lock").clone()
    }

    async fn follow(self, mut changes: broadcast::Receiver<crate::doubles::kube_double::Change>) {
        let mut seen = HashSet::new();
        self.catch_up(&mut seen);
        loop {
            match changes.recv().await {
                Ok(change) if change.is(Kind::POD) && change.namespace == self.namespace => {
                    let name = change.object["metadata"]["name"].as_str().unwrap_or_default().to_string();
                    if change.event_type == EventType::Deleted {
                        seen.remove(&name);
                    } else {
                        self.look_at(&name, &change.object, &mut seen);
                    }
                }
                Ok(_) => {}
                // Fell behind the feed: look at every pod there is.
                Err(broadcast::error::RecvError::Lagged(_)) => self.catch_up(&mut seen),
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    fn catch_up(&self, seen: &mut HashSet<String>) {
        let pods = self.api.list(Kind::POD, &self.namespace);
        let present: HashSet<String> =
            pods.iter().filter_map(|pod| pod["metadata"]["name"].as_str().map(str::to_string)).collect();
        seen.retain(|name| present.contains(name));
        for pod in pods {
            let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
            self.look_at(&name, &pod, seen);
        }
    }

    /// A new pod starts its life; a deleted one whose containers stopped is removed.
    fn look_at(&self, name: &str, pod: &Value, seen: &mut HashSet<String>) {
        if seen.insert(name.to_string()) {
            self.active.lock().expect("lock").insert(name.to_string());
            self.created.fetch_add(1, Ordering::Relaxed);
            let node = self.clone();
            let (name, pod) = (name.to_string(), pod.clone());
            tokio::spawn(async move {
                node.live(&name, pod).await;
                // Not active first, then the check: a deletion in between is confirmed by
                // `look_at` (or by both, which is harmless).
                node.active.lock().expect("lock").remove(&name);
                if node.api.get(Kind::POD, &node.namespace, &name).is_some_and(|p| deleting(&p)) {
                    node.api.delete_now(Kind::POD, &node.namespace, &name);
                }
            });
        } else if deleting(pod) && !self.active.lock().expect("lock").contains(name) {
            self.api.delete_now(Kind::POD, &self.namespace, name);
        }
    }

    /// Whether this pod (not a later one of the same name: every attempt of a job has the job's
    /// pod name) is there and not being deleted.
    fn present(&self, name: &str, uid: &str) -> bool {
        self.api.get(Kind::POD, &self.namespace, name).is_some_and(|pod| !deleting(&pod) && uid_of(&pod) == uid)
    }

    /// Reports the status of this pod, unless it is gone (or replaced by a later one).
    fn report(&self, name: &str, uid: &str, status: Value) {
        if self.api.get(Kind::POD, &self.namespace, name).is_some_and(|pod| uid_of(&pod) == uid) {
            self.api.update_status(Kind::POD, &self.namespace, name, status);
        }
    }

    /// Waits until the pod is deleted (or gone).
    async fn until_deleted(&self, name: &str, uid: &str) {
        while self.present(name, uid) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn live(&self, name: &str, pod: Value) {
        let uid = uid_of(&pod).to_string();
        let uid = uid.as_str();
        let function = label(&pod, gantry::crd::LABEL_FUNCTION).to_string();
        let job = label(&pod, gantry::crd::LABEL_JOB_ID).to_string();
        let user = label(&pod, gantry::crd::LABEL_USER).to_string();
        let attempt = {
            let mut attempts = self.attempts.lock().expect("lock");
            let played = attempts.entry(job.clone()).or_default();
            played.push(uid_of(&pod).to_string());
            played.len()
        };
        let run = match self.runs.lock().expect("lock").get(&function).copied().unwrap_or(Run::Succeed) {
            Run::Process => Run::Process,
            _ if attempt > 1 => Run::Succeed,
            run => run,
        };
        if run == Run::Process {
            return self.processes.run_pod(name, pod).await;
        }
        let image = pod["spec"]["containers"][0]["image"].as_str().unwrap_or_default().to_string();
        let container = |state: Value| {
            json!([{"name": gantry::crd::JOB_CONTAINER, "image": image, "imageID": "", "ready": false, "restartCount": 0,
                    "state": state}])
        };
        let waiting =
            |reason: &str, message: &str| container(json!({"waiting": {"reason": reason, "message": message}}));
        tokio::time::sleep(jitter(5, 30)).await;
        if run == Run::NeverSchedule {
            return self.report(
                name,
                uid,
                json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                       "reason": "Unschedulable", "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu"}]}),
            );
        }
        self.api.bind(&self.namespace, name, "node-fast");
        let creating = json!({"phase": "Pending", "containerStatuses": waiting("ContainerCreating", "")});
        match run {
            Run::PullFails => {
                return self.report(
                    name,
                    uid,
                    json!({"phase": "Pending", "containerStatuses": waiting("ErrImagePull", "pull access denied for the image")}),
                );
            }
            Run::SecretMissing => {
                let missing = format!("secret \"{}\" not found", gantry::crd::secret_name(&job));
                return self.report(
                    name,
                    uid,
                    json!({"phase": "Pending", "containerStatuses": waiting("CreateContainerConfigError", &missing)}),
                );
            }
            Run::InitFails => {
                let at = now();
                let init = pod["spec"]["initContainers"][0].clone();
                return self.report(
                    name,
                    uid,
                    json!({"phase": "Failed",
                           "initContainerStatuses": [{"name": init["name"], "image": init["image"], "imageID": "", "ready": false,
                               "restartCount": 0, "state": {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": at, "finishedAt": at}}}],
                           "containerStatuses": waiting("PodInitializing", "")}),
                );
            }
            Run::PendingUntilDeleted => {
                self.report(name, uid, creating);
                let _ = self.reached.send((function, job, user));
                return self.until_deleted(name, uid).await;
            }
            Run::EvictedBeforeStart | Run::PreemptedBeforeStart | Run::LostBeforeStart => {
                self.report(name, uid, creating);
                tokio::time::sleep(jitter(20, 100)).await;
                return match run {
                    Run::LostBeforeStart => {
                        self.api.delete_now(Kind::POD, &self.namespace, name);
                    }
                    Run::EvictedBeforeStart => self.report(
                        name,
                        uid,
                        json!({"phase": "Failed", "reason": "Evicted", "containerStatuses": waiting("ContainerCreating", ""),
                               "message": "The node was low on resource: ephemeral-storage. Threshold quantity: 1Gi, available: 512Mi."}),
                    ),
                    _ => self.report(
                        name,
                        uid,
                        json!({"phase": "Failed", "reason": "Preempting", "containerStatuses": waiting("ContainerCreating", ""),
                               "message": "Preempted in order to admit critical pod"}),
                    ),
                };
            }
            _ => {}
        }
        // The container runs and writes its first line.
        tokio::time::sleep(jitter(5, 40)).await;
        if !self.present(name, uid) {
            return;
        }
        let started = now();
        self.api.set_pod_log(&self.namespace, name, &format!("{name} started\n"));
        self.report(
            name,
            uid,
            json!({"phase": "Running", "startTime": started,
                   "containerStatuses": container(json!({"running": {"startedAt": started}}))}),
        );
        let ended = |code: i32, reason: &str| {
            container(
                json!({"terminated": {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": now()}}),
            )
        };
        if run == Run::UntilDeleted {
            let _ = self.reached.send((function, job, user));
            self.until_deleted(name, uid).await;
            // Stopped as the kubelet stops a deleted pod's containers (SIGTERM: 143).
            return self.report(
                name,
                uid,
                json!({"phase": "Failed", "startTime": started, "containerStatuses": ended(143, "Error")}),
            );
        }
        tokio::time::sleep(jitter(20, 200)).await;
        if !self.present(name, uid) {
            return self.report(
                name,
                uid,
                json!({"phase": "Failed", "startTime": started, "containerStatuses": ended(143, "Error")}),
            );
        }
        let status = match run {
            Run::Succeed | Run::Exit(_) => {
                let code = if let Run::Exit(code) = run { code } else { 0 };
                self.api.set_pod_log(&self.namespace, name, &format!("{name} started\n{name} ended with {code}\n"));
                let reason = if code == 0 { "Completed" } else { "Error" };
                json!({"phase": if code == 0 { "Succeeded" } else { "Failed" }, "startTime": started,
                       "containerStatuses": ended(code, reason)})
            }
            Run::OutOfMemory => {
                json!({"phase": "Failed", "startTime": started, "containerStatuses": ended(137, "OOMKilled")})
            }
            Run::DeadlineExceeded => json!({"phase": "Failed", "reason": "DeadlineExceeded", "startTime": started,
                "message": "Pod was active on the node longer than the specified deadline",
                "containerStatuses": ended(143, "Error")}),
            Run::EvictedWhileRunning => json!({"phase": "Failed", "reason": "Evicted", "startTime": started,
                "message": "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi.",
                "containerStatuses": ended(137, "Error")}),
            Run::LostWhileRunning => {
                self.api.delete_now(Kind::POD, &self.namespace, name);
                return;
            }
            other => unreachable!("{other:?} is played above"),
        };
        self.report(name, uid, status);
    }
}

fn uid_of(pod: &Value) -> &str {
    pod["metadata"]["uid"].as_str().unwrap_or_default()
}

fn deleting(pod: &Value) -> bool {
    !pod["metadata"]["deletionTimestamp"].is_null()
}
