//! The job pods the leader's pod watch has seen, kept small: only what the reconcile reads
//! (creation and deletion times, the status), so tens of thousands of pods cost a few MB and no
//! reconcile has to ask the API server for its pod. A relisted watch replaces the whole set at
//! once, so a pod deleted while the watch was down does not linger.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::runtime::watcher::Event;

use super::retry::{CodeStarted, container_started};

/// What is kept of one pod.
#[derive(Debug, Clone, PartialEq)]
struct SeenPod {
    /// Tells a retried job's new pod from the ended attempt's (they share the name).
    uid: Option<String>,
    created: Option<Time>,
    deleting: Option<Time>,
    /// Its status as JSON, read back when a reconcile looks: `{"phase":"Pending"}` is 19 bytes,
    /// where the struct alone is about 400 (with 100,000 pods, tens of MB).
    status: Option<Box<str>>,
}

impl SeenPod {
    fn of(pod: &Pod) -> SeenPod {
        let status = pod.status.as_ref().map(|status| {
            let mut status = status.clone();
            // What the reconcile never reads, and the bulk of a running pod's status.
            for containers in [&mut status.container_statuses, &mut status.init_container_statuses] {
                for container in containers.iter_mut().flatten() {
                    container.allocated_resources = None;
                    container.resources = None;
                    container.volume_mounts = None;
                    container.image_id = String::new();
                    container.last_state = None;
                }
            }
            status.ephemeral_container_statuses = None;
            status.host_ips = None;
            status.pod_ips = None;
            status.resource_claim_statuses = None;
            serde_json::to_string(&status).expect("a pod status serializes").into_boxed_str()
        });
        SeenPod {
            uid: pod.metadata.uid.clone(),
            created: pod.metadata.creation_timestamp.clone(),
            deleting: pod.metadata.deletion_timestamp.clone(),
            status,
        }
    }

    fn to_pod(&self, name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                uid: self.uid.clone(),
                creation_timestamp: self.created.clone(),
                deletion_timestamp: self.deleting.clone(),
                ..Default::default()
            },
            spec: None,
            // Read back what `of` wrote; should that ever fail, the pod is looked at as having no
            // status (its next event brings one) rather than a reconcile panicking.
            status: self.status.as_deref().and_then(|json| {
                serde_json::from_str(json)
                    .inspect_err(|error| tracing::warn!(pod = name, %error, "a kept pod status did not read back"))
                    .ok()
            }),
        }
    }
}

/// The pods seen, by name, and the set a relist is building.
#[derive(Debug, Default)]
pub struct PodsSeen {
    pods: Mutex<HashMap<String, Arc<SeenPod>>>,
    relisting: Mutex<Option<HashMap<String, Arc<SeenPod>>>>,
    /// Pods this controller made and its watch has not shown since, by name: the version its
    /// create returned and the pod's uid.
    made: Mutex<Recent<(String, String)>>,
    /// Pods seen going (deleted, or missing from a relist), by name: their uid and whether their
    /// code had started.
    gone: Mutex<Recent<(Option<String>, CodeStarted)>>,
}

/// The most pods remembered as made-and-unseen, and as gone; the oldest are forgotten first. A
/// reconcile reads a note within moments (the going, or its own status write, wakes it), so
/// this only bounds memory (a few MB).
const KEPT: usize = 50_000;

/// Values by name, at most [`KEPT`] of them, the oldest forgotten first.
#[derive(Debug)]
struct Recent<V> {
    values: HashMap<String, (u64, V)>,
    /// Names in the order noted, each with the number of its note (a name noted again, or
    /// taken, leaves a stale entry here, which the number tells from the current one).
    order: VecDeque<(u64, String)>,
    noted: u64,
}

impl<V> Default for Recent<V> {
    fn default() -> Self {
        Recent { values: HashMap::new(), order: VecDeque::new(), noted: 0 }
    }
}

impl<V> Recent<V> {
    fn note(&mut self, name: &str, value: V) {
        self.noted += 1;
        self.values.insert(name.to_string(), (self.noted, value));
        self.order.push_back((self.noted, name.to_string()));
        while self.order.len() > KEPT {
            if let Some((number, oldest)) = self.order.pop_front()
                && self.values.get(&oldest).is_some_and(|(noted, _)| *noted == number)
            {
                self.values.remove(&oldest);
            }
        }
    }

    fn get(&self, name: &str) -> Option<&V> {
        self.values.get(name).map(|(_, value)| value)
    }

    fn take(&mut self, name: &str) -> Option<V> {
        self.values.remove(name).map(|(_, value)| value)
    }
}

impl PodsSeen {
    /// Notes a pod this controller just made: the watch's news of that very version is no news
    /// to the reconcile that made it.
    pub fn made(&self, pod: &Pod) {
        let metadata = &pod.metadata;
        if let (Some(name), Some(version), Some(uid)) = (&metadata.name, &metadata.resource_version, &metadata.uid) {
            self.lock_made().note(name, (version.clone(), uid.clone()));
        }
    }

    /// Whether a pod from the watch tells the reconcile something new: false only for the
    /// version of a pod this controller made, as its create returned it.
    pub fn is_news(&self, pod: &Pod) -> bool {
        let Some(name) = &pod.metadata.name else { return true };
        let made = self.lock_made().take(name);
        made.is_none_or(|(version, _)| Some(version) != pod.metadata.resource_version)
    }

    /// The uid of the pod `name` when this controller made it and its watch has shown nothing
    /// of it since (the watch lags, or was away while the pod came and went).
    pub fn made_unseen(&self, name: &str) -> Option<String> {
        self.lock_made().get(name).map(|(_, uid)| uid.clone())
    }

    /// The pod `name` of uid `uid`, made by this controller, is found gone before its watch
    /// showed it: noted gone (unless its going was seen meanwhile), its code may have started.
    pub fn went_unseen(&self, name: &str, uid: &str) {
        self.lock_made().take(name);
        let mut gone = self.lock_gone();
        if gone.get(name).is_none_or(|(seen, _)| seen.as_deref() != Some(uid)) {
            gone.note(name, (Some(uid.to_string()), CodeStarted::NotKnown));
        }
    }

    /// Takes in one watch event.
    pub fn observe(&self, event: &Event<Pod>) {
        let entry = |pod: &Pod| pod.metadata.name.clone().map(|name| (name, Arc::new(SeenPod::of(pod))));
        match event {
            Event::Apply(pod) => {
                if let Some((name, seen)) = entry(pod) {
                    self.lock_pods().insert(name, seen);
                }
            }
            Event::Delete(pod) => {
                if let Some(name) = &pod.metadata.name {
                    let mut pods = self.lock_pods();
                    // Not a retried job's next pod of the same name.
                    if pods.get(name).is_none_or(|seen| seen.uid.is_none() || seen.uid == pod.metadata.uid) {
                        // Its last state as the deletion reports it, or as seen before.
                        let before = pods.remove(name).map(|seen| seen.to_pod(name));
                        let started = container_started(pod) || before.as_ref().is_some_and(container_started);
                        self.lock_gone().note(name, (pod.metadata.uid.clone(), started.into()));
                    }
                }
            }
            Event::Init => *self.lock_relisting() = Some(HashMap::new()),
            Event::InitApply(pod) => {
                if let (Some(relisting), Some((name, seen))) = (self.lock_relisting().as_mut(), entry(pod)) {
                    relisting.insert(name, seen);
                }
            }
            Event::InitDone => {
                if let Some(listed) = self.lock_relisting().take() {
                    let before = std::mem::replace(&mut *self.lock_pods(), listed);
                    let pods = self.lock_pods();
                    let mut gone = self.lock_gone();
                    for (name, seen) in before {
                        if pods.get(&name).is_none_or(|now| now.uid != seen.uid) {
                            // It went while the watch was away: seen running, it started; last
                            // seen before that, it may have started unseen in the gap.
                            let started = if container_started(&seen.to_pod(&name)) {
                                CodeStarted::Yes
                            } else {
                                CodeStarted::NotKnown
                            };
                            gone.note(&name, (seen.uid.clone(), started));
                        }
                    }
                }
            }
        }
    }

    /// The pod named `name` as last seen (with only the fields the reconcile reads).
    pub fn get(&self, name: &str) -> Option<Pod> {
        let seen = self.lock_pods().get(name).cloned();
        seen.map(|seen| seen.to_pod(name))
    }

    /// The pod named `name` seen going, if its going was seen (this controller may have started
    /// after it): its uid and whether its code had started.
    pub fn gone(&self, name: &str) -> Option<(Option<String>, CodeStarted)> {
        self.lock_gone().get(name).cloned()
    }

    fn lock_gone(&self) -> std::sync::MutexGuard<'_, Recent<(Option<String>, CodeStarted)>> {
        self.gone.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_made(&self) -> std::sync::MutexGuard<'_, Recent<(String, String)>> {
        self.made.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn len(&self) -> usize {
        self.lock_pods().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock_pods(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<SeenPod>>> {
        self.pods.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_relisting(&self) -> std::sync::MutexGuard<'_, Option<HashMap<String, Arc<SeenPod>>>> {
        self.relisting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::status::pod_trigger;
    use crate::domain::lifecycle::JobStatus;
    use serde_json::json;
    use std::time::Duration;

    fn pod(name: &str, status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": name, "namespace": "jobs", "uid": "u-1", "resourceVersion": "7",
                "creationTimestamp": "2026-01-01T00:50:00Z",
                "labels": {"gantry.dev/job-id": "x"},
                "ownerReferences": [{"apiVersion": "gantry.dev/v1alpha1", "kind": "FunctionJob", "name": "x", "uid": "u-0", "controller": true}]
            },
            "spec": {"containers": [{"name": "job", "image": "runner:1"}]},
            "status": status
        }))
        .unwrap()
    }

    #[test]
    fn a_seen_pod_decides_as_the_full_pod_does() {
        let now: k8s_openapi::jiff::Timestamp = "2026-01-01T01:00:00Z".parse().unwrap();
        let statuses = [
            json!({"phase": "Pending", "containerStatuses": [{"name": "job", "image": "bad:1", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}]}),
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}]}),
            json!({"phase": "Running", "startTime": "2026-01-01T00:51:00Z"}),
            json!({"phase": "Succeeded"}),
            json!({"phase": "Failed", "reason": "DeadlineExceeded", "message": "too long"}),
        ];
        let seen = PodsSeen::default();
        for status in statuses {
            let full = pod("gantry-job-x", status);
            seen.observe(&Event::Apply(full.clone()));
            let kept = seen.get("gantry-job-x").unwrap();
            assert!(kept.spec.is_none() && kept.metadata.labels.is_none(), "only what is read is kept");
            assert_eq!(kept.metadata.creation_timestamp, full.metadata.creation_timestamp);
            assert_eq!(kept.metadata.uid.as_deref(), Some("u-1"), "the attempt's pod is told by its uid");
            for current in [JobStatus::Pending, JobStatus::Running] {
                for stop in [false, true] {
                    assert_eq!(
                        pod_trigger(current, stop, Some(&kept), now, Duration::from_secs(60)),
                        pod_trigger(current, stop, Some(&full), now, Duration::from_secs(60)),
                        "{:?}",
                        full.status
                    );
                }
            }
        }
    }

    #[test]
    fn only_the_version_a_create_returned_is_no_news() {
        let seen = PodsSeen::default();
        let phase = |phase: &str| json!({"phase": phase});
        let made = pod("a", phase("Pending"));
        seen.made(&made);
        assert!(seen.pod_is_news("b", "7"), "another pod");
        assert!(!seen.is_news(&made), "the pod as made");
        assert!(seen.is_news(&made), "once only");
        seen.made(&made);
        let mut changed = pod("a", phase("Running"));
        changed.metadata.resource_version = Some("8".into());
        assert!(seen.is_news(&changed), "a later version");
        assert!(seen.is_news(&made), "the note is gone after any news of the pod");
    }

    impl PodsSeen {
        fn pod_is_news(&self, name: &str, version: &str) -> bool {
            let mut other = pod(name, json!({}));
            other.metadata.resource_version = Some(version.into());
            self.is_news(&other)
        }
    }

    #[test]
    fn pods_seen_going_say_whether_their_code_started() {
        let seen = PodsSeen::default();
        let waiting = json!({"phase": "Pending"});
        let running = json!({"phase": "Running", "containerStatuses": [{"name": "job", "image": "runner:1",
            "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {"startedAt": "2026-01-01T00:51:00Z"}}}]});
        // Deleted while pending: its code never started.
        seen.observe(&Event::Apply(pod("a", waiting.clone())));
        seen.observe(&Event::Delete(pod("a", waiting.clone())));
        assert_eq!(seen.gone("a"), Some((Some("u-1".into()), CodeStarted::No)));
        // Seen running, then deleted with a copy that no longer says so: it started.
        seen.observe(&Event::Apply(pod("b", running.clone())));
        seen.observe(&Event::Delete(pod("b", json!({}))));
        assert_eq!(seen.gone("b").map(|(_, started)| started), Some(CodeStarted::Yes));
        // Gone from a relist while running: it started.
        seen.observe(&Event::Apply(pod("c", running)));
        // Gone from a relist, last seen pending: its Running may have come and gone in the gap,
        // so whether it started is not known (and it is not run again unasked).
        seen.observe(&Event::Apply(pod("e", waiting)));
        seen.observe(&Event::Init);
        seen.observe(&Event::InitDone);
        assert_eq!(seen.gone("c"), Some((Some("u-1".into()), CodeStarted::Yes)));
        assert_eq!(seen.gone("e").map(|(_, started)| started), Some(CodeStarted::NotKnown));
        assert_eq!(seen.gone("d"), None, "never seen going");
    }

    #[test]
    fn a_pod_made_and_gone_before_the_watch_showed_it_may_have_run() {
        let seen = PodsSeen::default();
        let made = pod("a", json!({"phase": "Pending"}));
        seen.made(&made);
        assert_eq!(seen.made_unseen("a").as_deref(), Some("u-1"), "made, not shown by the watch yet");
        // The reconcile asked the API server and found no pod: it may have run in between.
        seen.went_unseen("a", "u-1");
        assert_eq!(seen.made_unseen("a"), None);
        assert_eq!(seen.gone("a"), Some((Some("u-1".into()), CodeStarted::NotKnown)));
        // A going the watch did see is never overwritten by the guess.
        seen.made(&made);
        seen.observe(&Event::Apply(made.clone()));
        assert!(!seen.is_news(&made), "the pod as made");
        assert_eq!(seen.made_unseen("a"), None, "shown by the watch");
        seen.observe(&Event::Delete(made.clone()));
        seen.went_unseen("a", "u-1");
        assert_eq!(seen.gone("a"), Some((Some("u-1".into()), CodeStarted::No)));
    }

    #[test]
    fn what_is_remembered_is_bounded_oldest_first() {
        let mut recent = Recent::default();
        for n in 0..KEPT + 10 {
            recent.note(&format!("p{n}"), n);
            // Taken at once (the usual life of a pod's made note), or noted twice.
            if n % 2 == 0 {
                recent.take(&format!("p{n}"));
            } else {
                recent.note(&format!("p{n}"), n);
            }
        }
        assert!(recent.order.len() <= KEPT && recent.values.len() <= KEPT);
        assert_eq!(recent.get(&format!("p{}", KEPT + 9)), Some(&(KEPT + 9)), "the newest stays");
        assert_eq!(recent.get("p1"), None, "the oldest went");
    }

    #[test]
    fn deletions_and_relists_leave_only_the_pods_that_exist() {
        let seen = PodsSeen::default();
        let phase = |phase: &str| json!({"phase": phase});
        seen.observe(&Event::Apply(pod("a", phase("Pending"))));
        seen.observe(&Event::Apply(pod("b", phase("Pending"))));
        seen.observe(&Event::Apply(pod("a", phase("Running"))));
        assert_eq!(seen.get("a").unwrap().status.unwrap().phase.as_deref(), Some("Running"));
        seen.observe(&Event::Delete(pod("b", phase("Pending"))));
        assert!(seen.get("b").is_none());
        // The watch restarts: `a` went away meanwhile, `c` appeared. Until the list is done,
        // the old set stands.
        seen.observe(&Event::Init);
        seen.observe(&Event::InitApply(pod("c", phase("Pending"))));
        assert!(seen.get("a").is_some() && seen.get("c").is_none());
        seen.observe(&Event::InitDone);
        assert!(seen.get("a").is_none());
        assert_eq!(seen.get("c").unwrap().metadata.name.as_deref(), Some("c"));
        assert_eq!(seen.len(), 1);
    }
}
