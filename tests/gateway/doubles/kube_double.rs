//! An in-process, stateful stand-in for the Kubernetes API server (kube-apiserver + etcd).
//!
//! No API server binary can be installed on the project's machines, so controller and gateway
//! tests talk to this double instead: an [`axum::Router`] that [`ApiServer::client`] wraps into a
//! real [`kube::Client`] without a socket, and that [`ApiServer::serve`] exposes on loopback for
//! the `gantry` binary and for `kubectl` (see `docs/testing.md`).
//!
//! It reproduces the behaviours kube-client and kube-runtime 5 rely on:
//! - resources: core `pods` (+ `pods/status`, `pods/log`, refused with 400 for a pod not bound
//!   to a node or a container that never ran, as the kubelet refuses it), `secrets`, `configmaps`, `events`,
//!   `namespaces`; `events.k8s.io/v1` `events` (what kube-runtime's `Recorder` posts);
//!   `coordination.k8s.io/v1` `leases`; `apiextensions.k8s.io/v1` `customresourcedefinitions`,
//!   and every resource a CRD written to the double declares (scope, short names, printer
//!   columns, status subresource);
//! - object bookkeeping: namespace from the URL, `uid`, `creationTimestamp`, `generation` (1 on
//!   create, bumped when anything outside `metadata` and `status` changes, and when deletion
//!   starts), one global increasing `resourceVersion`; writes that change nothing are no-ops (no
//!   new version, no watch event), which keeps server-side-applying controllers from looping;
//! - GET, LIST (label and field selectors, `limit`/`continue`), WATCH (replay after a
//!   `resourceVersion`, 410 `Expired` ERROR event when it is older than the kept history,
//!   `timeoutSeconds`, a closing BOOKMARK, `sendInitialEvents` streaming lists; objects moving in
//!   or out of a selector are reported as ADDED/DELETED), POST, PUT (optimistic concurrency),
//!   PATCH (merge, strategic-as-merge, RFC 6902 JSON patch, server-side apply), DELETE (with
//!   finalizers: `deletionTimestamp` first, removal when the last finalizer goes);
//! - status subresource semantics, `Status` error bodies, `PartialObjectMetadata` and `Table`
//!   responses, and legacy discovery (`/api`, `/apis`, `/api/v1`, `/apis/{group}/{version}`).
//!
//! Deviations a test should know about: no admission, schema or CEL validation; strategic merge
//! patch is a plain merge patch (lists are replaced, never merged by key); server-side apply
//! keeps field ownership as `kube_double::fields` describes it, simplified (lists are atomic,
//! creation by POST records no owner); pods are deleted gracefully only once bound to a node (`spec.nodeName`,
//! which the kubelet double sets): marked with `deletionTimestamp` and
//! `deletionGracePeriodSeconds` until the node removes them, as the real server does; an unbound
//! pod, or a delete with `gracePeriodSeconds=0`, removes it at once; namespaces need not exist; `dryRun` is refused; owner-reference
//! garbage collection happens only when a test calls [`ApiServer::collect_garbage`] (in a real
//! cluster the controller manager does it, not the API server).

mod fields;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use tokio::sync::{broadcast, watch};
use tower::ServiceExt;

/// Watch events kept for replay; a watch resuming from before them gets 410 Expired.
const HISTORY_LIMIT: usize = 10_000;
/// Server-side watch duration when the request names none.
const DEFAULT_WATCH_TIMEOUT_SECONDS: u64 = 290;
/// Largest request body the double reads.
const MAX_BODY_BYTES: usize = 64 << 20;
/// Annotation of the BOOKMARK that ends the initial events of a streaming list.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// Names a resource type for the direct-access methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
}

impl Kind {
    pub const POD: Kind = Kind { group: "", version: "v1", plural: "pods" };
    pub const SECRET: Kind = Kind { group: "", version: "v1", plural: "secrets" };
    pub const CONFIG_MAP: Kind = Kind { group: "", version: "v1", plural: "configmaps" };
    pub const NAMESPACE: Kind = Kind { group: "", version: "v1", plural: "namespaces" };
    /// The legacy core `v1` Event.
    pub const CORE_EVENT: Kind = Kind { group: "", version: "v1", plural: "events" };
    /// The `events.k8s.io/v1` Event, which kube-runtime's `Recorder` creates.
    pub const EVENT: Kind = Kind { group: "events.k8s.io", version: "v1", plural: "events" };
    pub const LEASE: Kind = Kind { group: "coordination.k8s.io", version: "v1", plural: "leases" };
    pub const CRD: Kind = Kind { group: "apiextensions.k8s.io", version: "v1", plural: "customresourcedefinitions" };
    /// Gantry's `FunctionJob` (registered once its CRD is installed).
    pub const FUNCTION_JOB: Kind = Kind { group: "gantry.dev", version: "v1alpha1", plural: "functionjobs" };
}

/// What happened to an object, as a watch reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One write, as kept in the watch history and sent to [`ApiServer::subscribe`]rs.
#[derive(Debug, Clone)]
pub struct Change {
    pub revision: u64,
    pub group: String,
    pub plural: String,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    pub event_type: EventType,
    /// The object after the write (for a deletion, its last state). Shared, not copied, by the
    /// history and every receiver: copies per watch were most of the double's time with
    /// 100,000 objects (`bench/controller.sh tenants`).
    pub object: Arc<Value>,
    /// The object before the write (none for a creation).
    pub previous: Option<Arc<Value>>,
}

impl Change {
    pub fn is(&self, kind: Kind) -> bool {
        self.group == kind.group && self.plural == kind.plural
    }
}

/// The API server double. Clones share one state.
#[derive(Clone)]
pub struct ApiServer {
    store: Arc<Mutex<Store>>,
    /// Bumped by [`ApiServer::drop_watches`]; every open watch ends when it changes.
    watch_epoch: Arc<watch::Sender<u64>>,
}

impl Default for ApiServer {
    fn default() -> Self {
        Self::new()
    }
}

impl ApiServer {
    /// A server with the built-in resources and no objects.
    pub fn new() -> Self {
        let (changes, _) = broadcast::channel(4096);
        let store = Store {
            resources: builtin_resources(),
            objects: BTreeMap::new(),
            revision: 1,
            history: VecDeque::new(),
            compacted_through: 0,
            changes,
            faults: Vec::new(),
            fault_hits: BTreeMap::new(),
            requests: Vec::new(),
            recording: true,
            pod_logs: HashMap::new(),
        };
        ApiServer { store: Arc::new(Mutex::new(store)), watch_epoch: Arc::new(watch::channel(0).0) }
    }

    /// The HTTP API of every registered resource, plus discovery.
    pub fn router(&self) -> Router {
        Router::new().fallback(handle).with_state(self.clone())
    }

    /// A real kube client whose requests go straight to [`ApiServer::router`], with no socket.
    /// Must be called inside a Tokio runtime.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.router(), "default")
    }

    /// Serves the router on `127.0.0.1` on a free port, in a background task.
    pub async fn serve(&self) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a loopback port is free");
        let address = listener.local_addr().expect("a bound listener has an address");
        let router = self.router();
        tokio::spawn(async move { axum::serve(listener, router).await });
        address
    }

    /// A kubeconfig for the served double: plain HTTP, namespace `default`, no credentials.
    pub fn kubeconfig(&self, address: SocketAddr) -> String {
        self.kubeconfig_with_token(address, None)
    }

    /// A kubeconfig for the served double whose user sends `token` as a bearer token (the
    /// double accepts any; [`ApiServer::requests_by_token`] tells the clients apart).
    pub fn kubeconfig_with_token(&self, address: SocketAddr, token: Option<&str>) -> String {
        let user = token.map(|token| format!("\n    token: {token}")).unwrap_or_else(|| " {}".into());
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: double\n  cluster:\n    server: http://{address}\n\
             contexts:\n- name: double\n  context:\n    cluster: double\n    namespace: default\n    user: double\n\
             current-context: double\nusers:\n- name: double\n  user:{user}\n"
        )
    }

    /// Installs a CustomResourceDefinition (YAML or JSON) by server-side applying it through the
    /// HTTP surface, which registers its resource. Panics when the server refuses it.
    pub async fn install_crd(&self, yaml: &str) {
        let crd: Value = serde_yaml::from_str(yaml).expect("the CRD is YAML");
        let name = crd["metadata"]["name"].as_str().expect("a CRD has a name");
        let request = Request::patch(format!(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}?fieldManager=kube-double&force=true"
        ))
        .header(header::CONTENT_TYPE, "application/apply-patch+yaml")
        .body(Body::from(crd.to_string()))
        .expect("a valid request");
        let response = self.router().oneshot(request).await.expect("the router is infallible");
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), MAX_BODY_BYTES).await.unwrap_or_default();
        assert!(status.is_success(), "installing the CRD {name} failed: {}", String::from_utf8_lossy(&body));
    }

    /// Answers the next `times` requests whose method is `method` and whose path and query
    /// contain `path_contains` with a `Status` error of code `status` instead of handling them.
    pub fn fail_next(&self, method: &str, path_contains: &str, status: u16, times: usize) {
        if times == 0 {
            return;
        }
        self.lock().faults.push(Fault {
            method: method.to_ascii_uppercase(),
            path_contains: path_contains.into(),
            status,
            remaining: times,
        });
    }

    /// Whether an injected fault matching exactly this method and path is still waiting for
    /// its request.
    pub fn fault_armed(&self, method: &str, path_contains: &str) -> bool {
        let method = method.to_ascii_uppercase();
        self.lock().faults.iter().any(|f| f.method == method && f.path_contains == path_contains)
    }

    /// Never answers the next `times` requests matching as in [`ApiServer::fail_next`]: each
    /// waits until its client gives up (a connection that went quiet, a stuck API server).
    pub fn hang_next(&self, method: &str, path_contains: &str, times: usize) {
        self.fail_next(method, path_contains, HANG, times);
    }

    /// How many requests each injected fault answered so far, by `METHOD path_contains status`.
    pub fn fault_hits(&self) -> BTreeMap<String, usize> {
        self.lock().fault_hits.clone()
    }

    /// Stops keeping the log of requests ([`ApiServer::requests`] answers what came before): a
    /// long run (the soak) would otherwise keep every request it ever received.
    pub fn stop_recording_requests(&self) {
        let mut store = self.lock();
        store.recording = false;
        store.requests = Vec::new();
    }

    /// Removes the Events (both views) created more than `max_age` ago, as the API server's
    /// event TTL does (`--event-ttl`, one hour by default). Returns how many went.
    pub fn expire_events(&self, max_age: std::time::Duration) -> usize {
        let cutoff = chrono::Utc::now() - chrono::Duration::from_std(max_age).unwrap_or_default();
        let mut store = self.lock();
        let old: Vec<ObjectKey> = store
            .objects
            .iter()
            .filter(|(key, _)| key.plural == "events")
            .filter(|(_, event)| {
                event["metadata"]["creationTimestamp"]
                    .as_str()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                    .is_some_and(|created| created < cutoff)
            })
            .map(|(key, _)| key.clone())
            .collect();
        let mut removed = 0;
        for key in old {
            if let Some(resource) = store.resource_of(&key)
                && store.remove(&resource, &key).is_some()
            {
                removed += 1;
            }
        }
        removed
    }

    /// Ends every open watch stream now (clients re-watch from their last resourceVersion).
    pub fn drop_watches(&self) {
        self.watch_epoch.send_modify(|epoch| *epoch += 1);
    }

    /// Forgets the watch history, as an etcd compaction does: a watch resuming from a version
    /// older than the current one gets a 410 Expired ERROR event and the client must relist.
    pub fn expire_history(&self) {
        let mut store = self.lock();
        store.history.clear();
        store.compacted_through = store.revision;
    }

    /// Every request received so far, as (method, path and query).
    pub fn requests(&self) -> Vec<(String, String)> {
        self.lock().requests.iter().map(|(method, path, _)| (method.clone(), path.clone())).collect()
    }

    /// Every request made with a bearer token, as (token, method, path and query): who asked
    /// what, for checking each client's requests against its RBAC rules.
    pub fn requests_by_token(&self) -> Vec<(String, String, String)> {
        self.lock()
            .requests
            .iter()
            .filter_map(|(method, path, token)| Some((token.clone()?, method.clone(), path.clone())))
            .collect()
    }

    /// The stored object, if any (`namespace` is empty for cluster-scoped kinds).
    pub fn get(&self, kind: Kind, namespace: &str, name: &str) -> Option<Value> {
        self.lock().objects.get(&ObjectKey::of(kind, namespace, name)).cloned()
    }

    /// The stored objects of `kind` in `namespace`, or in every namespace when it is empty.
    pub fn list(&self, kind: Kind, namespace: &str) -> Vec<Value> {
        let store = self.lock();
        let Some(resource) = store.resource(kind.group, kind.version, kind.plural) else { return Vec::new() };
        store.select(&resource, Some(namespace).filter(|ns| !ns.is_empty()), &Selector::default())
    }

    /// How many objects of `kind` the namespace holds (`""`: all), without copying them.
    pub fn count(&self, kind: Kind, namespace: &str) -> usize {
        let store = self.lock();
        let Some(resource) = store.resource(kind.group, kind.version, kind.plural) else { return 0 };
        store.matching(&resource, Some(namespace).filter(|ns| !ns.is_empty()), &Selector::default()).count()
    }

    /// Replaces the object's `.status` as a write to its `/status` would (MODIFIED event).
    /// Returns the updated object, or `None` when there is no such object.
    pub fn update_status(&self, kind: Kind, namespace: &str, name: &str, status: Value) -> Option<Value> {
        let mut store = self.lock();
        let resource = store.resource(kind.group, kind.version, kind.plural)?;
        store
            .update(&resource, namespace, name, Target::Status, |mut object| {
                object["status"] = status;
                Ok(object)
            })
            .ok()
    }

    /// Removes the object at once, finalizers or not (DELETED event), as a pod vanishing with
    /// its node. Returns its last state.
    /// Binds a pod to `node` (what the scheduler does): from then on it is deleted gracefully.
    pub fn bind(&self, namespace: &str, name: &str, node: &str) -> Option<Value> {
        let mut store = self.lock();
        let resource = store.resource(Kind::POD.group, Kind::POD.version, Kind::POD.plural)?;
        store
            .update(&resource, namespace, name, Target::Main, |mut pod| {
                pod["spec"]["nodeName"] = json!(node);
                Ok(pod)
            })
            .ok()
    }

    pub fn delete_now(&self, kind: Kind, namespace: &str, name: &str) -> Option<Value> {
        let mut store = self.lock();
        let resource = store.resource(kind.group, kind.version, kind.plural)?;
        store.remove(&resource, &ObjectKey::of(kind, namespace, name))
    }

    /// Plays the garbage collector once: deletes (respecting finalizers) every object that has
    /// owner references none of which names an existing object's uid, until none is left.
    /// Returns how many deletions it started.
    pub fn collect_garbage(&self) -> usize {
        let mut store = self.lock();
        let mut collected = 0;
        loop {
            let orphans: Vec<_> =
                store.orphans().into_iter().filter_map(|key| Some((store.resource_of(&key)?, key))).collect();
            if orphans.is_empty() {
                return collected;
            }
            for (resource, key) in orphans {
                // Deleting removes the object or marks it deleting; either way it is no orphan next round.
                let _ = store.delete(&resource, &key.namespace, &key.name, None);
                collected += 1;
            }
        }
    }

    /// Sets the text `pods/{name}/log` serves.
    pub fn set_pod_log(&self, namespace: &str, name: &str, text: &str) {
        self.lock().pod_logs.insert((namespace.into(), name.into()), text.into());
    }

    /// Every write from now on, of every kind (for a kubelet double, say).
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.lock().changes.subscribe()
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().expect("the API server double's state is not poisoned")
    }
}

// ---------------------------------------------------------------------------------------------
// Resource types
// ---------------------------------------------------------------------------------------------

/// A registered resource type (one version of it).
#[derive(Debug, Clone)]
struct ResourceDef {
    group: String,
    version: String,
    plural: String,
    singular: String,
    kind: String,
    namespaced: bool,
    short_names: Vec<String>,
    categories: Vec<String>,
    /// `status` and/or `log`.
    subresources: Vec<String>,
    printer_columns: Vec<PrinterColumn>,
}

/// A column of `kubectl get`, from a CRD's `additionalPrinterColumns`.
#[derive(Debug, Clone)]
struct PrinterColumn {
    name: String,
    type_: String,
    json_path: String,
    description: String,
    priority: i64,
}

impl ResourceDef {
    fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }

    /// `plural.group`, as error messages name a resource.
    fn qualified(&self) -> String {
        if self.group.is_empty() { self.plural.clone() } else { format!("{}.{}", self.plural, self.group) }
    }

    fn is_crd(&self) -> bool {
        self.group == Kind::CRD.group && self.plural == Kind::CRD.plural
    }

    fn is_pod(&self) -> bool {
        self.group.is_empty() && self.plural == "pods"
    }

    fn has_subresource(&self, sub: &str) -> bool {
        self.subresources.iter().any(|declared| declared == sub)
    }

    /// The APIResource entries of this resource and its subresources.
    fn discovery_entries(&self) -> Vec<Value> {
        let verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];
        let mut entries = vec![json!({
            "name": self.plural, "singularName": self.singular, "namespaced": self.namespaced,
            "kind": self.kind, "verbs": verbs, "shortNames": self.short_names, "categories": self.categories,
        })];
        let sub = |name: &str, verbs: &[&str]| {
            json!({"name": format!("{}/{name}", self.plural), "singularName": "",
                   "namespaced": self.namespaced, "kind": self.kind, "verbs": verbs})
        };
        for name in &self.subresources {
            entries.push(match name.as_str() {
                "log" => sub(name, &["get"]),
                _ => sub(name, &["get", "patch", "update"]),
            });
        }
        entries
    }
}

/// A built-in resource: group, version, plural, kind, namespaced, short names, subresources.
type Builtin =
    (&'static str, &'static str, &'static str, &'static str, bool, &'static [&'static str], &'static [&'static str]);

#[rustfmt::skip]
const BUILTIN_RESOURCES: &[Builtin] = &[
    ("", "v1", "pods", "Pod", true, &["po"], &["status", "log"]),
    ("", "v1", "secrets", "Secret", true, &[], &[]),
    ("", "v1", "configmaps", "ConfigMap", true, &["cm"], &[]),
    ("", "v1", "events", "Event", true, &["ev"], &[]),
    ("", "v1", "namespaces", "Namespace", false, &["ns"], &["status"]),
    ("events.k8s.io", "v1", "events", "Event", true, &[], &[]),
    ("coordination.k8s.io", "v1", "leases", "Lease", true, &[], &[]),
    ("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", false, &["crd", "crds"], &["status"]),
];

fn builtin_resources() -> Vec<ResourceDef> {
    let strings = |items: &[&str]| items.iter().map(|item| item.to_string()).collect();
    BUILTIN_RESOURCES
        .iter()
        .map(|&(group, version, plural, kind, namespaced, short_names, subresources)| ResourceDef {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            kind: kind.into(),
            namespaced,
            short_names: strings(short_names),
            categories: Vec::new(),
            subresources: strings(subresources),
            printer_columns: Vec::new(),
        })
        .collect()
}

/// The resource types a CustomResourceDefinition object declares, one per served version.
fn resources_of_crd(crd: &Value) -> Vec<ResourceDef> {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let text = |value: &Value| value.as_str().unwrap_or_default().to_string();
    let strings = |value: &Value| value.as_array().into_iter().flatten().map(text).collect::<Vec<_>>();
    let served = spec["versions"].as_array().into_iter().flatten().filter(|v| v["served"] != false);
    served
        .map(|version| ResourceDef {
            group: text(&spec["group"]),
            version: text(&version["name"]),
            plural: text(&names["plural"]),
            singular: names["singular"].as_str().map_or_else(|| text(&names["kind"]).to_lowercase(), str::to_string),
            kind: text(&names["kind"]),
            namespaced: spec["scope"] != "Cluster",
            short_names: strings(&names["shortNames"]),
            categories: strings(&names["categories"]),
            subresources: if version["subresources"]["status"].is_object() { vec!["status".into()] } else { vec![] },
            printer_columns: version["additionalPrinterColumns"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|column| PrinterColumn {
                    name: text(&column["name"]),
                    type_: text(&column["type"]),
                    json_path: text(&column["jsonPath"]),
                    description: text(&column["description"]),
                    priority: column["priority"].as_i64().unwrap_or(0),
                })
                .collect(),
        })
        .collect()
}

/// What the API server writes into a CRD's status: accepted names and the Established condition.
fn crd_status(crd: &Value) -> Value {
    let now = now();
    let condition = |type_: &str, reason: &str| json!({"type": type_, "status": "True", "reason": reason, "message": "", "lastTransitionTime": now});
    let stored: Vec<&Value> = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["storage"] == true)
        .map(|v| &v["name"])
        .collect();
    json!({
        "acceptedNames": crd["spec"]["names"],
        "conditions": [condition("NamesAccepted", "NoConflicts"), condition("Established", "InitialNamesAccepted")],
        "storedVersions": stored,
    })
}

// ---------------------------------------------------------------------------------------------
// The store: objects, versions, history
// ---------------------------------------------------------------------------------------------

/// Where an object lives. The version is not part of it: all versions share the objects.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct ObjectKey {
    group: String,
    plural: String,
    namespace: String,
    name: String,
}

impl ObjectKey {
    fn new(resource: &ResourceDef, namespace: &str, name: &str) -> Self {
        let namespace = if resource.namespaced { namespace } else { "" };
        ObjectKey {
            group: resource.group.clone(),
            plural: resource.plural.clone(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    fn of(kind: Kind, namespace: &str, name: &str) -> Self {
        ObjectKey {
            group: kind.group.into(),
            plural: kind.plural.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// The fault status of a request never answered ([`ApiServer::hang_next`]).
const HANG: u16 = 0;

/// A request to fail instead of being handled (see [`ApiServer::fail_next`]).
struct Fault {
    method: String,
    path_contains: String,
    status: u16,
    remaining: usize,
}

/// Which part of an object a write may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// The main resource: everything but `.status` when the resource has a status subresource.
    Main,
    /// The `/status` subresource: only `.status`.
    Status,
}

struct Store {
    resources: Vec<ResourceDef>,
    objects: BTreeMap<ObjectKey, Value>,
    /// The resourceVersion of the last write, shared by every resource as etcd's revision is.
    revision: u64,
    history: VecDeque<Change>,
    /// Watches must resume from this revision or a later one.
    compacted_through: u64,
    changes: broadcast::Sender<Change>,
    faults: Vec<Fault>,
    /// Requests answered by each injected fault.
    fault_hits: BTreeMap<String, usize>,
    /// (method, path and query, bearer token if any) of every request, while `recording`.
    requests: Vec<(String, String, Option<String>)>,
    recording: bool,
    pod_logs: HashMap<(String, String), String>,
}

impl Store {
    fn resource(&self, group: &str, version: &str, plural: &str) -> Option<ResourceDef> {
        self.resources.iter().find(|r| r.group == group && r.version == version && r.plural == plural).cloned()
    }

    fn resource_of(&self, key: &ObjectKey) -> Option<ResourceDef> {
        self.resources.iter().find(|r| r.group == key.group && r.plural == key.plural).cloned()
    }

    fn take_fault(&mut self, method: &str, path: &str) -> Option<u16> {
        let index = self.faults.iter().position(|f| f.method == method && path.contains(&f.path_contains))?;
        let fault = &mut self.faults[index];
        fault.remaining -= 1;
        let status = fault.status;
        let name = format!("{} {} {status}", fault.method, fault.path_contains);
        *self.fault_hits.entry(name).or_default() += 1;
        if fault.remaining == 0 {
            self.faults.remove(index);
        }
        Some(status)
    }

    /// The objects of `resource` in `namespace` (every namespace when `None`) that match.
    fn select(&self, resource: &ResourceDef, namespace: Option<&str>, selector: &Selector) -> Vec<Value> {
        self.matching(resource, namespace, selector).map(|(_, object)| object.clone()).collect()
    }

    /// The objects `selector` picks, in key order (namespace, then name).
    fn matching<'a>(
        &'a self,
        resource: &'a ResourceDef,
        namespace: Option<&'a str>,
        selector: &'a Selector,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Value)> + 'a {
        self.objects
            .iter()
            .filter(|(key, _)| key.group == resource.group && key.plural == resource.plural)
            .filter(move |(key, _)| namespace.is_none_or(|ns| key.namespace == ns))
            .filter(|(_, object)| selector.matches(object))
    }

    fn next_revision(&mut self) -> u64 {
        self.revision += 1;
        self.revision
    }

    /// Keeps the write for replay and tells the live watches.
    fn record(&mut self, resource: &ResourceDef, event_type: EventType, object: &Value, previous: Option<Value>) {
        let change = Change {
            revision: self.revision,
            group: resource.group.clone(),
            plural: resource.plural.clone(),
            namespace: object["metadata"]["namespace"].as_str().unwrap_or_default().into(),
            event_type,
            object: Arc::new(object.clone()),
            previous: previous.map(Arc::new),
        };
        self.history.push_back(change.clone());
        while self.history.len() > HISTORY_LIMIT {
            if let Some(dropped) = self.history.pop_front() {
                self.compacted_through = dropped.revision;
            }
        }
        // Nobody listening is fine.
        let _ = self.changes.send(change);
    }

    fn create(&mut self, resource: &ResourceDef, namespace: &str, object: Value) -> Result<Value, ApiError> {
        self.create_owned(resource, namespace, object, None)
    }

    /// Creates the object; `owners` are its `managedFields` (an apply's), none when `None`.
    fn create_owned(
        &mut self,
        resource: &ResourceDef,
        namespace: &str,
        object: Value,
        owners: Option<Value>,
    ) -> Result<Value, ApiError> {
        let mut object = object;
        if !object.is_object() {
            return Err(ApiError::bad_request("the body is not a JSON object"));
        }
        let name = assign_name(&mut object)?;
        place_in_namespace(resource, namespace, &mut object)?;
        let key = ObjectKey::new(resource, namespace, &name);
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(resource, &name));
        }
        object["apiVersion"] = json!(resource.api_version());
        object["kind"] = json!(resource.kind);
        if resource.has_subresource("status") {
            remove_field(&mut object, "status");
        }
        let revision = self.next_revision();
        let meta = metadata_mut(&mut object);
        meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        meta.insert("creationTimestamp".into(), json!(now()));
        meta.insert("generation".into(), json!(1));
        meta.insert("resourceVersion".into(), json!(revision.to_string()));
        for server_owned in ["deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"] {
            meta.remove(server_owned);
        }
        if let Some(owners) = owners.filter(|o| !o.is_null()) {
            meta.insert("managedFields".into(), owners);
        }
        fill_server_status(resource, &mut object, true);
        self.objects.insert(key, object.clone());
        self.record(resource, EventType::Added, &object, None);
        self.after_write(resource, &object);
        Ok(object)
    }

    /// Changes an existing object: `edit` turns the stored object into the requested one, then
    /// the server's rules decide what of it is kept. Returns the object as stored (or as it was
    /// when the write removed its last finalizer and so deleted it).
    fn update(
        &mut self,
        resource: &ResourceDef,
        namespace: &str,
        name: &str,
        target: Target,
        edit: impl FnOnce(Value) -> Result<Value, ApiError>,
    ) -> Result<Value, ApiError> {
        let key = ObjectKey::new(resource, namespace, name);
        let old = self.objects.get(&key).cloned().ok_or_else(|| ApiError::not_found(resource, name))?;
        let requested = edit(old.clone())?;
        if !requested.is_object() {
            return Err(ApiError::bad_request("the result is not a JSON object"));
        }
        check_identity(resource, name, &old, &requested)?;
        let mut new = match target {
            Target::Status => with_status_of(&old, &requested),
            Target::Main => with_server_fields(resource, &old, requested),
        };
        if content_changed(&old, &new) {
            fill_server_status(resource, &mut new, false);
            bump_generation(&mut new);
        }
        if new == old {
            return Ok(old);
        }
        let revision = self.next_revision();
        metadata_mut(&mut new).insert("resourceVersion".into(), json!(revision.to_string()));
        if is_deleting(&new) && finalizers(&new).is_empty() {
            self.objects.remove(&key);
            self.record(resource, EventType::Deleted, &new, Some(old));
            self.after_remove(resource, &new);
        } else {
            self.objects.insert(key, new.clone());
            self.record(resource, EventType::Modified, &new, Some(old));
            self.after_write(resource, &new);
        }
        Ok(new)
    }

    /// Deletes the object, or only marks it when finalizers hold it. Returns its state and
    /// whether it is gone.
    fn delete(
        &mut self,
        resource: &ResourceDef,
        namespace: &str,
        name: &str,
        grace: Option<i64>,
    ) -> Result<(Value, bool), ApiError> {
        let key = ObjectKey::new(resource, namespace, name);
        let old = self.objects.get(&key).cloned().ok_or_else(|| ApiError::not_found(resource, name))?;
        // A pod on a node ends gracefully: the node removes it once its containers stopped.
        let bound = resource.is_pod() && old["spec"]["nodeName"].as_str().is_some_and(|n| !n.is_empty());
        let grace = match grace {
            Some(seconds) => seconds,
            None if bound => old["spec"]["terminationGracePeriodSeconds"].as_i64().unwrap_or(30),
            None => 0,
        };
        let graceful = bound && grace > 0;
        if finalizers(&old).is_empty() && !graceful {
            let gone = self.remove(resource, &key).expect("the object was just read");
            return Ok((gone, true));
        }
        if is_deleting(&old) {
            return Ok((old, false));
        }
        let mut marked = old.clone();
        bump_generation(&mut marked);
        let revision = self.next_revision();
        let meta = metadata_mut(&mut marked);
        meta.insert("deletionTimestamp".into(), json!(now()));
        meta.insert("deletionGracePeriodSeconds".into(), json!(if graceful { grace } else { 0 }));
        meta.insert("resourceVersion".into(), json!(revision.to_string()));
        self.objects.insert(key, marked.clone());
        self.record(resource, EventType::Modified, &marked, Some(old));
        Ok((marked, false))
    }

    /// Removes the object whatever its finalizers. Returns its last state.
    fn remove(&mut self, resource: &ResourceDef, key: &ObjectKey) -> Option<Value> {
        let old = self.objects.remove(key)?;
        let mut gone = old.clone();
        let revision = self.next_revision();
        metadata_mut(&mut gone).insert("resourceVersion".into(), json!(revision.to_string()));
        self.record(resource, EventType::Deleted, &gone, Some(old));
        self.after_remove(resource, &gone);
        Some(gone)
    }

    /// A written CRD (re)registers the resource types it declares; a written `events.k8s.io`
    /// Event shows in the core `v1` Event view too (one storage, two APIs, as on a real
    /// server), where `kubectl describe` finds it.
    fn after_write(&mut self, resource: &ResourceDef, object: &Value) {
        if resource.group == "events.k8s.io" && resource.plural == "events" {
            if let Some(core) = self.resource("", "v1", "events") {
                let view = core_event(object);
                let key = ObjectKey::new(
                    &core,
                    object["metadata"]["namespace"].as_str().unwrap_or_default(),
                    &field_text(object, "metadata.name"),
                );
                let previous = self.objects.insert(key, view.clone());
                let event_type = if previous.is_some() { EventType::Modified } else { EventType::Added };
                self.record(&core, event_type, &view, previous);
            }
            return;
        }
        if !resource.is_crd() {
            return;
        }
        let declared = resources_of_crd(object);
        if let Some(first) = declared.first() {
            self.resources.retain(|r| !(r.group == first.group && r.plural == first.plural));
            self.resources.extend(declared);
        }
    }

    /// A deleted CRD takes its resource type and all its objects with it.
    fn after_remove(&mut self, resource: &ResourceDef, object: &Value) {
        if resource.is_pod() {
            // The log lives on the node with the pod's containers: a later pod of the same name
            // (a retried job's) starts with none.
            let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
            self.pod_logs.remove(&(namespace, field_text(object, "metadata.name")));
            return;
        }
        if resource.group == "events.k8s.io" && resource.plural == "events" {
            if let Some(core) = self.resource("", "v1", "events") {
                let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
                if let Some(old) =
                    self.objects.remove(&ObjectKey::new(&core, namespace, &field_text(object, "metadata.name")))
                {
                    self.record(&core, EventType::Deleted, &core_event(object), Some(old));
                }
            }
            return;
        }
        if !resource.is_crd() {
            return;
        }
        let Some(declared) = resources_of_crd(object).into_iter().next() else { return };
        let keys: Vec<ObjectKey> = self
            .objects
            .keys()
            .filter(|key| key.group == declared.group && key.plural == declared.plural)
            .cloned()
            .collect();
        for key in keys {
            self.remove(&declared, &key);
        }
        self.resources.retain(|r| !(r.group == declared.group && r.plural == declared.plural));
    }

    /// Objects whose owners are all gone, and which are not already being deleted.
    fn orphans(&self) -> Vec<ObjectKey> {
        let uids: HashSet<&str> = self.objects.values().filter_map(|o| o["metadata"]["uid"].as_str()).collect();
        self.objects
            .iter()
            .filter(|(_, object)| !is_deleting(object))
            .filter(|(_, object)| {
                let owners = object["metadata"]["ownerReferences"].as_array().cloned().unwrap_or_default();
                !owners.is_empty() && owners.iter().all(|o| !uids.contains(o["uid"].as_str().unwrap_or_default()))
            })
            .map(|(key, _)| key.clone())
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Object rules (pure functions)
// ---------------------------------------------------------------------------------------------

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The object's `metadata`, created when missing. Callers have checked it is an object.
fn metadata_mut(object: &mut Value) -> &mut Map<String, Value> {
    let meta = object
        .as_object_mut()
        .expect("objects are checked to be JSON objects before their metadata is touched")
        .entry("metadata")
        .or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    meta.as_object_mut().expect("metadata was just made an object")
}

fn remove_field(object: &mut Value, field: &str) {
    if let Some(map) = object.as_object_mut() {
        map.remove(field);
    }
}

fn finalizers(object: &Value) -> Vec<Value> {
    object["metadata"]["finalizers"].as_array().cloned().unwrap_or_default()
}

fn is_deleting(object: &Value) -> bool {
    !object["metadata"]["deletionTimestamp"].is_null()
}

fn bump_generation(object: &mut Value) {
    let generation = object["metadata"]["generation"].as_i64().unwrap_or(0);
    metadata_mut(object).insert("generation".into(), json!(generation + 1));
}

/// Whether anything outside `metadata` and `status` (the spec, for most kinds) changed.
fn content_changed(old: &Value, new: &Value) -> bool {
    fn content(object: &Value) -> BTreeMap<&String, &Value> {
        let fields = object.as_object().into_iter().flatten();
        fields.filter(|(field, _)| !matches!(field.as_str(), "metadata" | "status")).collect()
    }
    content(old) != content(new)
}

/// Gives the object its name, generating one from `metadata.generateName` when needed.
fn assign_name(object: &mut Value) -> Result<String, ApiError> {
    if let Some(name) = object["metadata"]["name"].as_str().filter(|n| !n.is_empty()) {
        return Ok(name.to_string());
    }
    let Some(prefix) = object["metadata"]["generateName"].as_str().map(str::to_string) else {
        return Err(ApiError::invalid("metadata.name: Required value: name or generateName is required"));
    };
    let name = format!("{prefix}{}", &uuid::Uuid::new_v4().simple().to_string()[..5]);
    metadata_mut(object).insert("name".into(), json!(name));
    Ok(name)
}

/// Sets `metadata.namespace` from the URL (or clears it for cluster-scoped kinds).
fn place_in_namespace(resource: &ResourceDef, namespace: &str, object: &mut Value) -> Result<(), ApiError> {
    if !resource.namespaced {
        metadata_mut(object).remove("namespace");
        return Ok(());
    }
    match object["metadata"]["namespace"].as_str() {
        Some(given) if !given.is_empty() && given != namespace => Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        _ => {
            metadata_mut(object).insert("namespace".into(), json!(namespace));
            Ok(())
        }
    }
}

/// Refuses a write naming another object, or carrying a stale resourceVersion.
fn check_identity(resource: &ResourceDef, name: &str, old: &Value, requested: &Value) -> Result<(), ApiError> {
    if let Some(given) = requested["metadata"]["name"].as_str().filter(|given| *given != name) {
        return Err(ApiError::bad_request(&format!(
            "the name of the object ({given}) does not match the name on the URL ({name})"
        )));
    }
    match requested["metadata"]["resourceVersion"].as_str() {
        Some(version) if !version.is_empty() && Some(version) != old["metadata"]["resourceVersion"].as_str() => {
            Err(ApiError::conflict(resource, name))
        }
        _ => Ok(()),
    }
}

/// The core `v1` view of an `events.k8s.io/v1` Event (the field mapping of the real server).
fn core_event(event: &Value) -> Value {
    let series = &event["series"];
    let last = if series.is_object() { series["lastObservedTime"].clone() } else { event["eventTime"].clone() };
    let to_seconds = |time: &Value| {
        time.as_str()
            .map(|t| json!(format!("{}Z", t.split('.').next().unwrap_or(t).trim_end_matches('Z'))))
            .unwrap_or(Value::Null)
    };
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": event["metadata"],
        "involvedObject": event["regarding"],
        "related": event["related"],
        "reason": event["reason"],
        "message": event["note"],
        "type": event["type"],
        "action": event["action"],
        "eventTime": event["eventTime"],
        "firstTimestamp": to_seconds(&event["eventTime"]),
        "lastTimestamp": to_seconds(&last),
        "count": series["count"].as_i64().unwrap_or(1),
        "source": {"component": event["reportingController"]},
        "reportingComponent": event["reportingController"],
        "reportingInstance": event["reportingInstance"],
    })
}

/// A write to `/status`: the stored object with only its status (and the fields' owners, which
/// the write kept) replaced.
fn with_status_of(old: &Value, requested: &Value) -> Value {
    let mut new = old.clone();
    match requested.get("status") {
        Some(status) => new["status"] = status.clone(),
        None => remove_field(&mut new, "status"),
    }
    match requested["metadata"].get("managedFields") {
        Some(owners) => metadata_mut(&mut new).insert("managedFields".into(), owners.clone()),
        None => metadata_mut(&mut new).remove("managedFields"),
    };
    new
}

/// A write to the main resource: the requested object, with the fields only the server sets
/// kept from the stored one (and the stored status when there is a status subresource). The
/// fields' owners are the write's (see `fields`).
fn with_server_fields(resource: &ResourceDef, old: &Value, requested: Value) -> Value {
    let mut new = requested;
    new["apiVersion"] = old["apiVersion"].clone();
    new["kind"] = old["kind"].clone();
    let server_owned = [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "generation",
        "resourceVersion",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ];
    let meta = metadata_mut(&mut new);
    for field in server_owned {
        match old["metadata"].get(field) {
            Some(value) => meta.insert(field.into(), value.clone()),
            None => meta.remove(field),
        };
    }
    if resource.has_subresource("status") {
        match old.get("status") {
            Some(status) => new["status"] = status.clone(),
            None => remove_field(&mut new, "status"),
        }
    }
    new
}

/// The status the server itself writes: a CRD's acceptance, a new pod's `Pending` phase.
fn fill_server_status(resource: &ResourceDef, object: &mut Value, creating: bool) {
    if resource.is_crd() {
        object["status"] = crd_status(object);
    } else if resource.is_pod() && creating {
        object["status"] = json!({"phase": "Pending"});
    }
}

/// The value at a simple JSONPath (`.a.b.c`) or dotted field path (`a.b.c`).
fn lookup<'a>(object: &'a Value, path: &str) -> Option<&'a Value> {
    path.trim_start_matches('.').split('.').try_fold(object, |value, key| value.get(key))
}

/// A field's value as a field selector compares it (missing fields are empty).
fn field_text(object: &Value, path: &str) -> String {
    match lookup(object, path) {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Patches
// ---------------------------------------------------------------------------------------------

/// A PATCH body, by its content type.
enum PatchBody {
    /// `merge-patch+json`, and `strategic-merge-patch+json` treated the same way.
    Merge(Value),
    /// RFC 6902 `json-patch+json`.
    Json(Value),
    /// Server-side apply (`apply-patch+yaml`), merged into the object.
    Apply(Value),
}

impl PatchBody {
    fn parse(content_type: &str, body: &[u8]) -> Result<Self, ApiError> {
        match content_type.split(';').next().unwrap_or_default().trim() {
            "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
                Ok(PatchBody::Merge(parse_json(body)?))
            }
            "application/json-patch+json" => Ok(PatchBody::Json(parse_json(body)?)),
            // Clients send JSON, which is YAML too: read it as JSON first (much cheaper).
            "application/apply-patch+yaml" => serde_json::from_slice(body)
                .or_else(|_| serde_yaml::from_slice(body))
                .map(PatchBody::Apply)
                .map_err(|e| ApiError::bad_request(&format!("the apply body is not YAML: {e}"))),
            other => {
                Err(ApiError::new(415, "UnsupportedMediaType", &format!("the patch type {other:?} is not supported")))
            }
        }
    }

    fn apply_to(&self, mut object: Value) -> Result<Value, ApiError> {
        match self {
            PatchBody::Merge(patch) | PatchBody::Apply(patch) => merge_patch(&mut object, patch),
            PatchBody::Json(operations) => json_patch(&mut object, operations)?,
        }
        Ok(object)
    }
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(&format!("the body is not JSON: {e}")))
}

/// RFC 7386 JSON merge patch.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let target = target.as_object_mut().expect("target was just made an object");
    for (key, value) in fields {
        if value.is_null() {
            target.remove(key);
        } else {
            merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// RFC 6902 JSON patch, as the API server applies it: a `test` of a missing path against `null`
/// passes (kube-runtime's `finalizer()` relies on it to add the first finalizer).
fn json_patch(document: &mut Value, operations: &Value) -> Result<(), ApiError> {
    let operations = operations.as_array().ok_or_else(|| ApiError::bad_request("a JSON patch is an array"))?;
    for operation in operations {
        let path = pointer(&operation["path"])?;
        let value = || operation.get("value").cloned().ok_or_else(|| ApiError::invalid("the operation needs a value"));
        match operation["op"].as_str().unwrap_or_default() {
            "add" => pointer_add(document, &path, value()?)?,
            "remove" => {
                pointer_remove(document, &path)?;
            }
            "replace" => {
                pointer_remove(document, &path)?;
                pointer_add(document, &path, value()?)?;
            }
            "move" => {
                let moved = pointer_remove(document, &pointer(&operation["from"])?)?;
                pointer_add(document, &path, moved)?;
            }
            "copy" => {
                let from = pointer(&operation["from"])?;
                let copied = pointer_get(document, &from).cloned().ok_or_else(|| missing(&from))?;
                pointer_add(document, &path, copied)?;
            }
            "test" => {
                let actual = pointer_get(document, &path).unwrap_or(&Value::Null);
                if *actual != value()? {
                    return Err(ApiError::invalid(&format!("the test of /{} failed", path.join("/"))));
                }
            }
            other => return Err(ApiError::bad_request(&format!("unknown JSON patch operation {other:?}"))),
        }
    }
    Ok(())
}

/// The unescaped tokens of a JSON pointer (`""` is the whole document).
fn pointer(path: &Value) -> Result<Vec<String>, ApiError> {
    let path = path.as_str().ok_or_else(|| ApiError::bad_request("a JSON patch operation needs a path"))?;
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let rest = path.strip_prefix('/').ok_or_else(|| ApiError::bad_request("a JSON pointer starts with /"))?;
    Ok(rest.split('/').map(|token| token.replace("~1", "/").replace("~0", "~")).collect())
}

fn missing(path: &[String]) -> ApiError {
    ApiError::invalid(&format!("the path /{} does not exist", path.join("/")))
}

fn pointer_get<'a>(document: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(document, |value, token| match value {
        Value::Object(map) => map.get(token),
        Value::Array(items) => token.parse::<usize>().ok().and_then(|i| items.get(i)),
        _ => None,
    })
}

fn pointer_get_mut<'a>(document: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(document, |value, token| match value {
        Value::Object(map) => map.get_mut(token),
        Value::Array(items) => token.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
        _ => None,
    })
}

fn pointer_add(document: &mut Value, path: &[String], value: Value) -> Result<(), ApiError> {
    let Some((last, parent_path)) = path.split_last() else {
        *document = value;
        return Ok(());
    };
    match pointer_get_mut(document, parent_path) {
        Some(Value::Object(map)) => {
            map.insert(last.clone(), value);
            Ok(())
        }
        Some(Value::Array(items)) if last == "-" => {
            items.push(value);
            Ok(())
        }
        Some(Value::Array(items)) => match last.parse::<usize>() {
            Ok(index) if index <= items.len() => {
                items.insert(index, value);
                Ok(())
            }
            _ => Err(missing(path)),
        },
        _ => Err(missing(path)),
    }
}

fn pointer_remove(document: &mut Value, path: &[String]) -> Result<Value, ApiError> {
    let (last, parent_path) = path.split_last().ok_or_else(|| ApiError::invalid("cannot remove the document"))?;
    let removed = match pointer_get_mut(document, parent_path) {
        Some(Value::Object(map)) => map.remove(last),
        Some(Value::Array(items)) => {
            last.parse::<usize>().ok().filter(|i| *i < items.len()).map(|index| items.remove(index))
        }
        _ => None,
    };
    removed.ok_or_else(|| missing(path))
}

// ---------------------------------------------------------------------------------------------
// Selectors
// ---------------------------------------------------------------------------------------------

/// A `labelSelector` and a `fieldSelector`, both optional.
#[derive(Debug, Default, Clone)]
struct Selector {
    labels: Vec<LabelRequirement>,
    fields: Vec<(String, String, bool)>,
}

#[derive(Debug, Clone)]
enum LabelRequirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    Absent(String),
}

impl Selector {
    fn parse(labels: Option<&str>, fields: Option<&str>) -> Result<Self, ApiError> {
        let labels = labels.map(split_terms).unwrap_or_default();
        let fields = fields.map(split_terms).unwrap_or_default();
        Ok(Selector {
            labels: labels.into_iter().map(parse_label_term).collect::<Result<_, _>>()?,
            fields: fields.into_iter().map(parse_field_term).collect::<Result<_, _>>()?,
        })
    }

    fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        let label = |key: &str| labels.get(key).and_then(Value::as_str);
        let labels_match = self.labels.iter().all(|requirement| match requirement {
            LabelRequirement::Equals(key, value) => label(key) == Some(value),
            LabelRequirement::NotEquals(key, value) => label(key) != Some(value),
            LabelRequirement::In(key, values) => label(key).is_some_and(|v| values.iter().any(|w| w == v)),
            LabelRequirement::NotIn(key, values) => label(key).is_none_or(|v| values.iter().all(|w| w != v)),
            LabelRequirement::Exists(key) => label(key).is_some(),
            LabelRequirement::Absent(key) => label(key).is_none(),
        });
        labels_match && self.fields.iter().all(|(path, value, equal)| (field_text(object, path) == *value) == *equal)
    }
}

/// Splits a selector at the commas outside parentheses.
fn split_terms(selector: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (index, character) in selector.char_indices() {
        match character {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&selector[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    terms.push(&selector[start..]);
    terms.into_iter().map(str::trim).filter(|term| !term.is_empty()).collect()
}

fn parse_label_term(term: &str) -> Result<LabelRequirement, ApiError> {
    let owned = |text: &str| text.trim().to_string();
    let set = |values: &str| -> Result<Vec<String>, ApiError> {
        let inner = values.trim().strip_prefix('(').and_then(|v| v.strip_suffix(')'));
        let inner = inner.ok_or_else(|| ApiError::bad_request(&format!("invalid label selector {term:?}")))?;
        Ok(inner.split(',').map(owned).collect())
    };
    if let Some(key) = term.strip_prefix('!') {
        return Ok(LabelRequirement::Absent(owned(key)));
    }
    if let Some((key, values)) = term.split_once(" notin ") {
        return Ok(LabelRequirement::NotIn(owned(key), set(values)?));
    }
    if let Some((key, values)) = term.split_once(" in ") {
        return Ok(LabelRequirement::In(owned(key), set(values)?));
    }
    if let Some((key, value)) = term.split_once("!=") {
        return Ok(LabelRequirement::NotEquals(owned(key), owned(value)));
    }
    if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(LabelRequirement::Equals(owned(key), owned(value)));
    }
    if term.contains(|c: char| c.is_whitespace() || "()<>".contains(c)) {
        return Err(ApiError::bad_request(&format!("invalid label selector {term:?}")));
    }
    Ok(LabelRequirement::Exists(owned(term)))
}

fn parse_field_term(term: &str) -> Result<(String, String, bool), ApiError> {
    if let Some((path, value)) = term.split_once("!=") {
        return Ok((path.trim().into(), value.trim().into(), false));
    }
    match term.split_once("==").or_else(|| term.split_once('=')) {
        Some((path, value)) => Ok((path.trim().into(), value.trim().into(), true)),
        None => Err(ApiError::bad_request(&format!("invalid field selector {term:?}"))),
    }
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// An error answered as a `Status` object, as the API server does.
#[derive(Debug)]
struct ApiError {
    code: u16,
    reason: &'static str,
    message: String,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: &str) -> Self {
        ApiError { code, reason, message: message.into() }
    }

    /// The error a fault injection answers.
    fn injected(code: u16) -> Self {
        let reason = match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            405 => "MethodNotAllowed",
            409 => "Conflict",
            410 => "Expired",
            422 => "Invalid",
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "Unknown",
        };
        ApiError::new(code, reason, &format!("injected failure ({code} {reason})"))
    }

    fn not_found(resource: &ResourceDef, name: &str) -> Self {
        ApiError::new(404, "NotFound", &format!("{} \"{name}\" not found", resource.qualified()))
    }

    fn no_route() -> Self {
        ApiError::new(404, "NotFound", "the server could not find the requested resource")
    }

    fn already_exists(resource: &ResourceDef, name: &str) -> Self {
        ApiError::new(409, "AlreadyExists", &format!("{} \"{name}\" already exists", resource.qualified()))
    }

    fn conflict(resource: &ResourceDef, name: &str) -> Self {
        let message = format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
            resource.qualified()
        );
        ApiError::new(409, "Conflict", &message)
    }

    fn bad_request(message: &str) -> Self {
        ApiError::new(400, "BadRequest", message)
    }

    fn invalid(message: &str) -> Self {
        ApiError::new(422, "Invalid", message)
    }

    fn expired(message: &str) -> Self {
        ApiError::new(410, "Expired", message)
    }

    fn status(&self) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": self.message, "reason": self.reason, "code": self.code})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        json_response(code, &self.status())
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP surface
// ---------------------------------------------------------------------------------------------

fn json_response(code: StatusCode, body: &Value) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// What a request asked for, read once from its parts.
struct ApiRequest {
    method: Method,
    query: HashMap<String, String>,
    accept: String,
    content_type: String,
    user_agent: String,
    body: Bytes,
}

impl ApiRequest {
    fn param(&self, key: &str) -> Option<&str> {
        self.query.get(key).map(String::as_str)
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.param(key), Some("true" | "1"))
    }

    fn view(&self) -> View {
        if self.accept.contains("as=Table") {
            View::Table
        } else if self.accept.contains("as=PartialObjectMetadata") {
            View::Metadata
        } else {
            View::Full
        }
    }

    fn selector(&self) -> Result<Selector, ApiError> {
        Selector::parse(self.param("labelSelector"), self.param("fieldSelector"))
    }

    /// Who writes: `fieldManager`, else the client's name from its user agent, as the API server
    /// names the managers of updates.
    fn writer(&self, resource: &ResourceDef, target: Target) -> fields::Writer {
        let agent = self.user_agent.split('/').next().filter(|name| !name.is_empty()).unwrap_or("unknown");
        fields::Writer {
            manager: self.param("fieldManager").filter(|m| !m.is_empty()).unwrap_or(agent).to_string(),
            target,
            status_subresource: resource.has_subresource("status"),
        }
    }

    fn refuse_dry_run(&self) -> Result<(), ApiError> {
        match self.param("dryRun") {
            Some(_) => Err(ApiError::bad_request("the API server double does not support dryRun")),
            None => Ok(()),
        }
    }
}

/// The representation the client accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum View {
    Full,
    /// `PartialObjectMetadata` (kube's metadata watchers, e.g. `Controller::owns`).
    Metadata,
    /// `meta.k8s.io/v1` `Table` (kubectl get).
    Table,
}

impl View {
    fn render(self, object: &Value) -> std::borrow::Cow<'_, Value> {
        match self {
            View::Metadata => std::borrow::Cow::Owned(partial_object_metadata(object)),
            View::Full | View::Table => std::borrow::Cow::Borrowed(object),
        }
    }
}

fn partial_object_metadata(object: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": object["metadata"]})
}

/// What a URL path names.
enum Route {
    Version,
    CoreVersions,
    Groups,
    Group(String),
    Discovery(String, String),
    Resource(Box<ResourcePath>),
}

struct ResourcePath {
    resource: ResourceDef,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

impl ResourcePath {
    fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or_default()
    }
}

impl Store {
    fn route(&self, path: &str) -> Option<Route> {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        match segments.as_slice() {
            ["version"] => Some(Route::Version),
            ["api"] => Some(Route::CoreVersions),
            ["apis"] => Some(Route::Groups),
            ["api", version] => Some(Route::Discovery(String::new(), version.to_string())),
            ["apis", group] => Some(Route::Group(group.to_string())),
            ["apis", group, version] => Some(Route::Discovery(group.to_string(), version.to_string())),
            ["api", version, rest @ ..] => self.resource_route("", version, rest),
            ["apis", group, version, rest @ ..] => self.resource_route(group, version, rest),
            _ => None,
        }
    }

    /// `namespaces/{ns}/{plural}[/{name}[/{sub}]]` or `{plural}[/{name}[/{sub}]]`.
    fn resource_route(&self, group: &str, version: &str, rest: &[&str]) -> Option<Route> {
        let namespaced = match rest {
            ["namespaces", namespace, plural, tail @ ..] => self
                .resource(group, version, plural)
                .filter(|r| r.namespaced)
                .map(|resource| (resource, Some(namespace.to_string()), tail)),
            _ => None,
        };
        let (resource, namespace, tail) = match namespaced {
            Some(found) => found,
            None => {
                let (plural, tail) = rest.split_first()?;
                (self.resource(group, version, plural)?, None, tail)
            }
        };
        let (name, sub) = match tail {
            [] => (None, None),
            [name] => (Some(name.to_string()), None),
            [name, sub] if resource.has_subresource(sub) => (Some(name.to_string()), Some(sub.to_string())),
            _ => return None,
        };
        if resource.namespaced && namespace.is_none() && name.is_some() {
            return None;
        }
        Some(Route::Resource(Box::new(ResourcePath { resource, namespace, name, sub })))
    }

    fn group_list(&self) -> Value {
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for resource in self.resources.iter().filter(|r| !r.group.is_empty()) {
            match groups.iter_mut().find(|(group, _)| *group == resource.group) {
                Some((_, versions)) if !versions.contains(&resource.version) => versions.push(resource.version.clone()),
                Some(_) => {}
                None => groups.push((resource.group.clone(), vec![resource.version.clone()])),
            }
        }
        let groups: Vec<Value> = groups.iter().map(|(group, versions)| api_group(group, versions)).collect();
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }

    fn resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let resources: Vec<Value> = self
            .resources
            .iter()
            .filter(|r| r.group == group && r.version == version)
            .flat_map(ResourceDef::discovery_entries)
            .collect();
        let group_version = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
        (!resources.is_empty()).then(|| {
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
        })
    }
}

/// What `/version` answers (kube's `apiserver_version()` needs every field).
fn version_info() -> Value {
    json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-gantry-double", "gitCommit": "",
           "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24",
           "compiler": "gc", "platform": "linux/amd64"})
}

fn api_group(group: &str, versions: &[String]) -> Value {
    let versions: Vec<Value> =
        versions.iter().map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v})).collect();
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": versions, "preferredVersion": versions[0]})
}

/// The one handler: logs the request, applies injected faults, then dispatches.
async fn handle(State(server): State<ApiServer>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let path_and_query = parts.uri.path_and_query().map(|pq| pq.as_str().to_string()).unwrap_or_default();
    let fault = {
        let mut store = server.lock();
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(str::to_string);
        if store.recording {
            store.requests.push((parts.method.to_string(), path_and_query.clone(), token));
        }
        store.take_fault(parts.method.as_str(), &path_and_query)
    };
    if fault == Some(HANG) {
        return std::future::pending().await;
    }
    if let Some(code) = fault {
        return ApiError::injected(code).into_response();
    }
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
        return ApiError::new(413, "RequestEntityTooLarge", "the request body is too large").into_response();
    };
    let header_text = |name: header::HeaderName| {
        parts.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string()
    };
    let request = ApiRequest {
        method: parts.method.clone(),
        query: serde_urlencoded::from_str(parts.uri.query().unwrap_or_default()).unwrap_or_default(),
        accept: header_text(header::ACCEPT),
        content_type: header_text(header::CONTENT_TYPE),
        user_agent: header_text(header::USER_AGENT),
        body,
    };
    server.dispatch(parts.uri.path(), &request).unwrap_or_else(IntoResponse::into_response)
}

impl ApiServer {
    fn dispatch(&self, path: &str, request: &ApiRequest) -> Result<Response, ApiError> {
        let route = self.lock().route(path).ok_or_else(ApiError::no_route)?;
        let ok = |body: Value| Ok(json_response(StatusCode::OK, &body));
        match route {
            Route::Version => ok(version_info()),
            Route::CoreVersions => ok(json!({"kind": "APIVersions", "versions": ["v1"],
                                              "serverAddressByClientCIDRs": []})),
            Route::Groups => ok(self.lock().group_list()),
            Route::Group(group) => {
                let group_list = self.lock().group_list();
                let found = group_list["groups"].as_array().into_iter().flatten().find(|g| g["name"] == group);
                found.cloned().map_or_else(|| Err(ApiError::no_route()), ok)
            }
            Route::Discovery(group, version) => {
                self.lock().resource_list(&group, &version).map_or_else(|| Err(ApiError::no_route()), ok)
            }
            Route::Resource(target) => self.resource_request(&target, request),
        }
    }

    fn resource_request(&self, path: &ResourcePath, request: &ApiRequest) -> Result<Response, ApiError> {
        let needs_namespace = path.resource.namespaced && path.namespace.is_none();
        match (&request.method, path.name.as_deref(), path.sub.as_deref()) {
            (&Method::GET, None, _) if request.flag("watch") => self.watch(path, request),
            (&Method::GET, None, _) => self.list_objects(path, request),
            (&Method::POST, None, _) if !needs_namespace => self.create_object(path, request),
            (&Method::DELETE, None, _) if !needs_namespace => self.delete_collection(path, request),
            (&Method::GET, Some(name), Some("log")) => self.pod_log(path, name, request),
            (&Method::GET, Some(name), _) => self.read_object(path, name, request),
            (&Method::PUT, Some(name), None | Some("status")) => {
                self.replace_object(path, name, Target::of(path.sub.as_deref()), request)
            }
            (&Method::PATCH, Some(name), None | Some("status")) => {
                self.patch_object(path, name, Target::of(path.sub.as_deref()), request)
            }
            (&Method::DELETE, Some(name), None) => self.delete_object(path, name, request),
            _ => Err(ApiError::new(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )),
        }
    }

    fn read_object(&self, path: &ResourcePath, name: &str, request: &ApiRequest) -> Result<Response, ApiError> {
        let store = self.lock();
        let object = store.objects.get(&ObjectKey::new(&path.resource, path.namespace(), name));
        let object = object.ok_or_else(|| ApiError::not_found(&path.resource, name))?;
        Ok(object_response(StatusCode::OK, object, request))
    }

    fn list_objects(&self, path: &ResourcePath, request: &ApiRequest) -> Result<Response, ApiError> {
        let selector = request.selector()?;
        let continued = request.param("continue").map(Continue::parse).transpose()?;
        let limit = request.param("limit").and_then(|l| l.parse().ok()).filter(|l| *l > 0).unwrap_or(usize::MAX);
        // Only the page is copied, as an API server serves pages from its cache. The pages of one
        // list share its first page's resourceVersion, and each goes on after the last object the
        // previous one served, so objects going between pages shift nothing.
        let (page, last, revision) = {
            let store = self.lock();
            let revision = match &continued {
                Some(token) if token.revision < store.compacted_through => {
                    return Err(ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. \
                         You can start a new list without the continue parameter.",
                    ));
                }
                Some(token) => token.revision,
                None => store.revision,
            };
            let mut matching = store
                .matching(&path.resource, path.namespace.as_deref(), &selector)
                .filter(|(key, _)| continued.as_ref().is_none_or(|token| token.is_before(key)));
            let page: Vec<(&ObjectKey, Value)> =
                matching.by_ref().take(limit).map(|(key, object)| (key, object.clone())).collect();
            let last = match (matching.next(), page.last()) {
                (Some(_), Some((key, _))) => Some(Continue::token(revision, key)),
                _ => None,
            };
            (page.into_iter().map(|(_, object)| object).collect::<Vec<_>>(), last, revision)
        };
        let mut metadata = json!({"resourceVersion": revision.to_string()});
        if let Some(token) = last {
            metadata["continue"] = json!(token);
        }
        let view = request.view();
        let body = match view {
            View::Table => table(&path.resource, &page, metadata, request.param("includeObject")),
            View::Metadata => json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
                                     "metadata": metadata, "items": page.iter().map(partial_object_metadata).collect::<Vec<_>>()}),
            View::Full => {
                json!({"apiVersion": path.resource.api_version(), "kind": format!("{}List", path.resource.kind),
                                 "metadata": metadata, "items": page})
            }
        };
        Ok(json_response(StatusCode::OK, &body))
    }

    fn create_object(&self, path: &ResourcePath, request: &ApiRequest) -> Result<Response, ApiError> {
        request.refuse_dry_run()?;
        let object = parse_json(&request.body)?;
        let created = self.lock().create(&path.resource, path.namespace(), object)?;
        Ok(object_response(StatusCode::CREATED, &created, request))
    }

    fn replace_object(
        &self,
        path: &ResourcePath,
        name: &str,
        target: Target,
        request: &ApiRequest,
    ) -> Result<Response, ApiError> {
        request.refuse_dry_run()?;
        let object = parse_json(&request.body)?;
        let writer = request.writer(&path.resource, target);
        let replaced = self
            .lock()
            .update(&path.resource, path.namespace(), name, target, |old| Ok(fields::update(&old, object, &writer)))?;
        Ok(object_response(StatusCode::OK, &replaced, request))
    }

    fn patch_object(
        &self,
        path: &ResourcePath,
        name: &str,
        target: Target,
        request: &ApiRequest,
    ) -> Result<Response, ApiError> {
        request.refuse_dry_run()?;
        let patch = PatchBody::parse(&request.content_type, &request.body)?;
        let mut store = self.lock();
        if let PatchBody::Apply(applied) = &patch {
            if request.param("fieldManager").is_none_or(str::is_empty) {
                return Err(ApiError::bad_request("fieldManager: Required value: is required for apply patch"));
            }
            let writer = request.writer(&path.resource, target);
            let exists = store.objects.contains_key(&ObjectKey::new(&path.resource, path.namespace(), name));
            if !exists && target == Target::Main {
                let mut object = applied.clone();
                check_identity(&path.resource, name, &json!({}), &object)?;
                if object.is_object() {
                    metadata_mut(&mut object).insert("name".into(), json!(name));
                }
                let owned = fields::apply(json!({"metadata": {}}), &object, &writer, true)?;
                let owners = owned["metadata"].get("managedFields").cloned();
                let created = store.create_owned(&path.resource, path.namespace(), object, owners)?;
                return Ok(object_response(StatusCode::CREATED, &created, request));
            }
            let force = request.flag("force");
            let patched = store.update(&path.resource, path.namespace(), name, target, |object| {
                fields::apply(object, applied, &writer, force)
            })?;
            return Ok(object_response(StatusCode::OK, &patched, request));
        }
        let writer = request.writer(&path.resource, target);
        let patched = store.update(&path.resource, path.namespace(), name, target, |object| {
            let patched = patch.apply_to(object.clone())?;
            Ok(fields::update(&object, patched, &writer))
        })?;
        Ok(object_response(StatusCode::OK, &patched, request))
    }

    fn delete_object(&self, path: &ResourcePath, name: &str, request: &ApiRequest) -> Result<Response, ApiError> {
        request.refuse_dry_run()?;
        // `gracePeriodSeconds` as a parameter or in the DeleteOptions body.
        let options: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let grace = request
            .param("gracePeriodSeconds")
            .and_then(|seconds| seconds.parse().ok())
            .or_else(|| options["gracePeriodSeconds"].as_i64());
        let (object, _gone) = self.lock().delete(&path.resource, path.namespace(), name, grace)?;
        Ok(object_response(StatusCode::OK, &object, request))
    }

    fn delete_collection(&self, path: &ResourcePath, request: &ApiRequest) -> Result<Response, ApiError> {
        request.refuse_dry_run()?;
        let selector = request.selector()?;
        let mut store = self.lock();
        let mut deleted = Vec::new();
        for object in store.select(&path.resource, path.namespace.as_deref(), &selector) {
            let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            deleted.push(store.delete(&path.resource, namespace, name, None)?.0);
        }
        let body = json!({"apiVersion": path.resource.api_version(), "kind": format!("{}List", path.resource.kind),
                          "metadata": {"resourceVersion": store.revision.to_string()}, "items": deleted});
        Ok(json_response(StatusCode::OK, &body))
    }

    /// `pods/{name}/log`: the text set by [`ApiServer::set_pod_log`]. `follow` answers the text
    /// so far and ends; `tailLines` and `limitBytes` are honoured. As the real server: a pod not
    /// bound to a node, or a container that never ran (no `running` or `terminated` state), has
    /// no log: 400 with the kubelet's words.
    fn pod_log(&self, path: &ResourcePath, name: &str, request: &ApiRequest) -> Result<Response, ApiError> {
        let store = self.lock();
        let Some(pod) = store.objects.get(&ObjectKey::new(&path.resource, path.namespace(), name)) else {
            return Err(ApiError::not_found(&path.resource, name));
        };
        if pod["spec"]["nodeName"].as_str().unwrap_or_default().is_empty() {
            return Err(ApiError::bad_request(&format!("pod {name} does not have a host assigned")));
        }
        let container = request
            .param("container")
            .map(str::to_string)
            .or_else(|| pod["spec"]["containers"][0]["name"].as_str().map(str::to_string))
            .unwrap_or_default();
        let statuses = pod["status"]["containerStatuses"].as_array().cloned().unwrap_or_default();
        let state = statuses.iter().find(|c| c["name"] == container.as_str()).map(|c| c["state"].clone());
        let ran = state.as_ref().is_some_and(|s| !s["running"].is_null() || !s["terminated"].is_null());
        if !ran {
            let reason = state
                .as_ref()
                .and_then(|s| s["waiting"]["reason"].as_str().map(str::to_string))
                .unwrap_or_else(|| "ContainerCreating".into());
            return Err(ApiError::bad_request(&format!(
                "container \"{container}\" in pod \"{name}\" is waiting to start: {reason}"
            )));
        }
        let text = store.pod_logs.get(&(path.namespace().to_string(), name.to_string())).cloned().unwrap_or_default();
        let mut text = match request.param("tailLines").and_then(|n| n.parse::<usize>().ok()) {
            Some(count) => {
                let lines: Vec<&str> = text.split_inclusive('\n').collect();
                lines[lines.len().saturating_sub(count)..].concat()
            }
            None => text,
        };
        if let Some(limit) = request.param("limitBytes").and_then(|n| n.parse::<usize>().ok()) {
            text = String::from_utf8_lossy(&text.as_bytes()[..limit.min(text.len())]).into_owned();
        }
        Ok(([(header::CONTENT_TYPE, "text/plain")], text).into_response())
    }

    /// Opens a watch: the backlog (current objects, or the changes after the requested version,
    /// or a 410 ERROR) is computed under the lock while subscribing, so nothing falls between.
    fn watch(&self, path: &ResourcePath, request: &ApiRequest) -> Result<Response, ApiError> {
        let filter = WatchFilter {
            group: path.resource.group.clone(),
            plural: path.resource.plural.clone(),
            namespace: path.namespace.clone(),
            selector: request.selector()?,
            view: request.view(),
            bookmark_type: json!({"apiVersion": path.resource.api_version(), "kind": path.resource.kind}),
        };
        let timeout =
            request.param("timeoutSeconds").and_then(|t| t.parse().ok()).unwrap_or(DEFAULT_WATCH_TIMEOUT_SECONDS);
        let from = request.param("resourceVersion").unwrap_or_default();
        let initial_events = request.flag("sendInitialEvents");
        let store = self.lock();
        let mut backlog = VecDeque::new();
        let mut expired = false;
        if from.is_empty() || from == "0" || initial_events {
            for object in store.select(&path.resource, path.namespace.as_deref(), &filter.selector) {
                backlog.push_back(watch_line("ADDED", &filter.view.render(&object)));
            }
            if initial_events {
                backlog.push_back(filter.bookmark(store.revision, true));
            }
        } else {
            let from: u64 = from.parse().map_err(|_| ApiError::bad_request("invalid resourceVersion"))?;
            if from < store.compacted_through {
                let error =
                    ApiError::expired(&format!("too old resource version: {from} ({})", store.compacted_through));
                backlog.push_back(watch_line("ERROR", &error.status()));
                expired = true;
            } else {
                backlog.extend(store.history.iter().filter(|c| c.revision > from).filter_map(|c| filter.project(c)));
            }
        }
        let feed = WatchFeed {
            backlog,
            live: store.changes.subscribe(),
            stop: self.watch_epoch.subscribe(),
            deadline: tokio::time::Instant::now() + std::time::Duration::from_secs(timeout),
            last_revision: store.revision,
            bookmarks: request.flag("allowWatchBookmarks"),
            finished: expired,
            filter,
        };
        drop(store);
        let lines = futures::stream::unfold(feed, |mut feed| async move {
            feed.next_line().await.map(|line| (Ok::<_, Infallible>(line), feed))
        });
        Ok(Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from_stream(lines))
            .expect("a response with a valid header"))
    }
}

impl Target {
    fn of(sub: Option<&str>) -> Target {
        if sub == Some("status") { Target::Status } else { Target::Main }
    }
}

/// An object in the representation the request asked for.
fn object_response(code: StatusCode, object: &Value, request: &ApiRequest) -> Response {
    let view = if request.view() == View::Metadata { View::Metadata } else { View::Full };
    json_response(code, &view.render(object))
}

/// A list's continue token: the list's resourceVersion and the last object served (opaque to
/// clients, as the API server's).
struct Continue {
    revision: u64,
    after: (String, String),
}

impl Continue {
    fn token(revision: u64, last: &ObjectKey) -> String {
        format!("{revision}/{}/{}", last.namespace, last.name)
    }

    /// Whether `key` comes after the last object served.
    fn is_before(&self, key: &ObjectKey) -> bool {
        (self.after.0.as_str(), self.after.1.as_str()) < (key.namespace.as_str(), key.name.as_str())
    }

    fn parse(token: &str) -> Result<Continue, ApiError> {
        let mut parts = token.splitn(3, '/');
        let revision = parts.next().and_then(|r| r.parse().ok());
        match (revision, parts.next(), parts.next()) {
            (Some(revision), Some(namespace), Some(name)) => {
                Ok(Continue { revision, after: (namespace.to_string(), name.to_string()) })
            }
            _ => Err(ApiError::bad_request("continue key is not valid")),
        }
    }
}

/// One line of a watch stream.
fn watch_line(event_type: &str, object: &Value) -> Bytes {
    #[derive(serde::Serialize)]
    struct Line<'a> {
        r#type: &'a str,
        object: &'a Value,
    }
    let mut line = serde_json::to_vec(&Line { r#type: event_type, object }).expect("JSON serializes");
    line.push(b'\n');
    Bytes::from(line)
}

/// Which changes a watch reports, and how.
struct WatchFilter {
    group: String,
    plural: String,
    namespace: Option<String>,
    selector: Selector,
    view: View,
    /// `apiVersion` and `kind` of the watched resource, for bookmarks.
    bookmark_type: Value,
}

impl WatchFilter {
    /// The watch line for a change, if this watch sees it. An object entering the selector is
    /// ADDED and one leaving it DELETED, as the API server's watch cache reports them.
    fn project(&self, change: &Change) -> Option<Bytes> {
        if change.group != self.group || change.plural != self.plural {
            return None;
        }
        if self.namespace.as_ref().is_some_and(|ns| *ns != change.namespace) {
            return None;
        }
        let now = self.selector.matches(&change.object);
        let before = change.previous.as_ref().is_some_and(|p| self.selector.matches(p));
        let event_type = match (change.event_type, before, now) {
            (EventType::Added, _, true) | (EventType::Modified, false, true) => "ADDED",
            (EventType::Modified, true, true) => "MODIFIED",
            (EventType::Modified, true, false) | (EventType::Deleted, _, true) => "DELETED",
            _ => return None,
        };
        Some(watch_line(event_type, &self.view.render(&change.object)))
    }

    fn bookmark(&self, revision: u64, initial_events_end: bool) -> Bytes {
        let mut object = self.bookmark_type.clone();
        object["metadata"] = json!({"resourceVersion": revision.to_string()});
        if initial_events_end {
            object["metadata"]["annotations"] = json!({INITIAL_EVENTS_END: "true"});
        }
        watch_line("BOOKMARK", &object)
    }
}

/// The state of one open watch stream.
struct WatchFeed {
    backlog: VecDeque<Bytes>,
    live: broadcast::Receiver<Change>,
    stop: watch::Receiver<u64>,
    deadline: tokio::time::Instant,
    /// The revision of the last change seen (reported or not), for the closing bookmark.
    last_revision: u64,
    bookmarks: bool,
    finished: bool,
    filter: WatchFilter,
}

impl WatchFeed {
    /// The next line to send, or `None` when the stream ends: at its timeout (after a bookmark
    /// when allowed), on [`ApiServer::drop_watches`], or when it fell too far behind.
    async fn next_line(&mut self) -> Option<Bytes> {
        if let Some(line) = self.backlog.pop_front() {
            return Some(line);
        }
        while !self.finished {
            tokio::select! {
                _ = tokio::time::sleep_until(self.deadline) => {
                    self.finished = true;
                    return self.bookmarks.then(|| self.filter.bookmark(self.last_revision, false));
                }
                _ = self.stop.changed() => self.finished = true,
                change = self.live.recv() => match change {
                    Ok(change) => {
                        self.last_revision = change.revision;
                        if let Some(line) = self.filter.project(&change) {
                            return Some(line);
                        }
                    }
                    Err(_) => self.finished = true,
                },
            }
        }
        None
    }
}

/// A `meta.k8s.io/v1` Table of `items`: Name, then the printer columns (Age by default).
fn table(resource: &ResourceDef, items: &[Value], metadata: Value, include_object: Option<&str>) -> Value {
    let age = PrinterColumn {
        name: "Age".into(),
        type_: "date".into(),
        json_path: ".metadata.creationTimestamp".into(),
        description: "time since creation".into(),
        priority: 0,
    };
    let columns = if resource.printer_columns.is_empty() { vec![age] } else { resource.printer_columns.clone() };
    let mut definitions = vec![json!({"name": "Name", "type": "string", "format": "name", "priority": 0,
                                       "description": "Name must be unique within a namespace."})];
    definitions.extend(columns.iter().map(|c| {
        json!({"name": c.name, "type": c.type_, "format": "", "description": c.description, "priority": c.priority})
    }));
    let rows: Vec<Value> = items
        .iter()
        .map(|object| {
            let mut cells = vec![object["metadata"]["name"].clone()];
            cells.extend(columns.iter().map(|column| table_cell(column, object)));
            let mut row = json!({"cells": cells});
            match include_object {
                Some("None") => {}
                Some("Object") => row["object"] = object.clone(),
                _ => row["object"] = partial_object_metadata(object),
            }
            row
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata,
           "columnDefinitions": definitions, "rows": rows})
}

/// A cell: the value at the column's path; dates as an age (`42s`, `5m`, `3h`, `2d`).
fn table_cell(column: &PrinterColumn, object: &Value) -> Value {
    let value = lookup(object, &column.json_path).cloned().unwrap_or(Value::Null);
    if column.type_ != "date" {
        return value;
    }
    let Some(time) = value.as_str().and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()) else {
        return Value::Null;
    };
    let seconds = (chrono::Utc::now() - time.with_timezone(&chrono::Utc)).num_seconds().max(0);
    let age = match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 7_200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3_600),
        s => format!("{}d", s / 86_400),
    };
    json!(age)
}

/// What a request asks in RBAC's terms, as the real API server's authorizer sees it:
/// (API group, resource or `resource/subresource`, verb). `None` for discovery and other
/// non-resource paths, which every authenticated client may read.
pub fn rbac_attributes(method: &str, path_and_query: &str) -> Option<(String, String, &'static str)> {
    let (path, query) = path_and_query.split_once('?').unwrap_or((path_and_query, ""));
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let rest = match rest {
        ["namespaces", _namespace, rest @ ..] if !rest.is_empty() => rest,
        rest => rest,
    };
    let (resource, name, subresource) = match rest {
        [] => return None,
        [resource] => (*resource, None, None),
        [resource, name] => (*resource, Some(*name), None),
        [resource, name, subresource, ..] => (*resource, Some(*name), Some(*subresource)),
    };
    let watch = query.split('&').any(|pair| pair == "watch=true" || pair == "watch=1");
    let verb = match (method, name) {
        ("GET", _) if watch => "watch",
        ("GET", Some(_)) => "get",
        ("GET", None) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", Some(_)) => "delete",
        ("DELETE", None) => "deletecollection",
        _ => return None,
    };
    let resource = match subresource {
        Some(subresource) => format!("{resource}/{subresource}"),
        None => resource.to_string(),
    };
    Some((group.to_string(), resource, verb))
}
