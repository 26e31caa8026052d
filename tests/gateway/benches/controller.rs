//! The controller benchmark (run by `bench/controller.sh`): pods created per second by
//! `gantry controller` (its own process) against the Kubernetes API server double served on
//! loopback and a real PostgreSQL, with queued jobs and a history of finished ones.

use std::time::Duration;

use gantry::crd::{pod_name, secret_name};
use serde_json::json;

use super::cpu_seconds;
use crate::controller::NAMESPACE;
use crate::doubles::kube_double::{ApiServer, Kind};
use crate::harness::{Backend, Gateway};

/// Benchmark, not a test (run by `bench/controller.sh`): pods created per second by the
/// controller (`gantry controller`, its own process) with 1,000 and 10,000 queued jobs (each
/// with its FunctionJob) against the API server double served on loopback and a real
/// PostgreSQL, the run-to-pod latency of one job on an idle controller, and the controller
/// process's peak and current memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run bench/controller.sh"]
async fn bench_pods_created_per_second() {
    use gantry::crd::{FunctionJob, FunctionJobSpec, FunctionRef, JobResources};
    // `queued[:history[:stale]]`: finished jobs already in the database, and how many of the
    // newest of them still have a FunctionJob and a Secret to collect.
    let runs: Vec<(usize, usize, usize)> = std::env::var("GANTRY_BENCH_JOBS")
        .unwrap_or_else(|_| "1000,10000,1000:100000,1000:100000:1000".into())
        .split(',')
        .map(|run| {
            let numbers: Vec<usize> = run
                .trim()
                .split(':')
                .map(|n| n.parse().expect("GANTRY_BENCH_JOBS: queued[:history[:stale]],..."))
                .collect();
            (numbers[0], numbers.get(1).copied().unwrap_or(0), numbers.get(2).copied().unwrap_or(0))
        })
        .collect();
    for (jobs_count, history, stale) in runs {
        let gateway = Gateway::start(Backend::PostgresS3).await;
        gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
        let program_id =
            gateway.get("/api/v1/programs/get_by_title/fn/", "alice").await.json["id"].as_str().unwrap().to_string();
        let author = gantry::db::users::ensure(&gateway.state.db, "alice").await.unwrap();
        let api = ApiServer::new();
        api.install_crd(&gantry::crd::crd_yaml()).await;
        let resources: kube::Api<FunctionJob> = kube::Api::namespaced(api.client(), NAMESPACE);
        // History: finished jobs with their events, of which the newest `stale` still have a
        // FunctionJob and a Secret from before a restart, finished past the keep window.
        if history > 0 {
            seed_history(&gateway, &api, &program_id, &author.id, history, stale).await;
        }
        let queue = |count: usize| {
            let (db, resources, program_id, author_id) =
                (gateway.state.db.clone(), resources.clone(), program_id.clone(), author.id.clone());
            async move {
                let mut ids = Vec::new();
                for _ in 0..count {
                    let id = gantry::db::new_id();
                    let job = gantry::db::jobs::NewJob {
                        id: id.clone(),
                        program_id: program_id.clone(),
                        provider_id: None,
                        author_id: author_id.clone(),
                        arguments: "{}".into(),
                        config: "{}".into(),
                        env_vars: "{}".into(),
                        runner: "kubernetes".into(),
                        gpu: false,
                        function_size: None,
                        trial: false,
                        business_model: "SUBSIDIZED".into(),
                        traceparent: None,
                        instance: None,
                        backfill: false,
                        gpu_model: None,
                    };
                    gantry::db::jobs::insert_with_limit(&db, &job, i64::MAX, false).await.unwrap().unwrap();
                    let spec = FunctionJobSpec {
                        job_id: id.clone(),
                        function: FunctionRef { title: "fn".into(), provider: None, version: None },
                        image: None,
                        artifact: Some("artifacts/x.tar".into()),
                        entrypoint: Some("main.py".into()),
                        size: None,
                        resources: JobResources::default(),
                        gpus: 0,
                        gpu_model: None,
                        compute_profile: None,
                        timeout_seconds: 3600,
                        user: "alice".into(),
                        function_env: Vec::new(),
                        stop_requested: false,
                        retry_after_start: false,
                        secret_name: gantry::crd::secret_name(&id),
                    };
                    // As the gateway creates it: with the controller's finalizer.
                    let mut resource = FunctionJob::new(&id, spec);
                    resource.metadata.finalizers = Some(vec![gantry::crd::FINALIZER.to_string()]);
                    resources.create(&Default::default(), &resource).await.unwrap();
                    ids.push(id);
                }
                ids
            }
        };
        queue(jobs_count).await;
        // The controller is its own process (this build's `gantry controller`), against the
        // double served on loopback, so its memory is its own.
        let folder = tempfile::tempdir().unwrap();
        let address = api.serve().await;
        let kubeconfig = folder.path().join("kubeconfig");
        std::fs::write(&kubeconfig, api.kubeconfig(address)).unwrap();
        let (mut args, mut env) = crate::e2e_kubernetes::role_settings(&gateway, folder.path(), &kubeconfig);
        args.insert(0, "controller".into());
        args.extend(["--leader-election", "false", "--admin-listen", "127.0.0.1:0"].map(str::to_string));
        for limit in ["LIMITS_JOBS_PER_USER", "LIMITS_MAX_CLUSTERS", "LIMITS_MAX_GPU_CLUSTERS"] {
            env.push((limit, "1000000000".into()));
        }
        // Pods are counted as the API server creates them (polling lists would load the process).
        let mut changes = api.subscribe();
        let cpu_before = (cpu_seconds("self"), postgres_cpu_seconds());
        let started = std::time::Instant::now();
        let log = folder.path().join("controller.log");
        let mut controller = crate::e2e_kubernetes::spawn_role(&args, &env, &log);
        let pid = controller.id().expect("the controller runs");
        let mut created = 0;
        let mut first_pod = None;
        while created < jobs_count {
            if created > 0 && first_pod.is_none() {
                first_pod = Some(started.elapsed());
            }
            let change = tokio::time::timeout(Duration::from_secs(120), changes.recv()).await;
            let change =
                change.unwrap_or_else(|_| panic!("pods stopped being created:\n{}", crate::e2e_kubernetes::tail(&log)));
            match change {
                Ok(change) => {
                    if change.plural == "pods" && change.event_type == crate::doubles::kube_double::EventType::Added {
                        created += 1;
                    }
                }
                // Fell behind the feed: count what is there.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    created = api.list(Kind::POD, NAMESPACE).len()
                }
                Err(closed) => panic!("the change feed ended: {closed}"),
            }
        }
        let elapsed = started.elapsed();
        let controller_cpu = cpu_seconds(&pid.to_string());
        let (double_cpu, postgres_cpu) = (cpu_seconds("self") - cpu_before.0, postgres_cpu_seconds() - cpu_before.1);
        // One more job on the now idle controller: from its commit to its pod.
        let before = std::time::Instant::now();
        let id = queue(1).await.remove(0);
        while api.get(Kind::POD, NAMESPACE, &pod_name(&id)).is_none() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let latency = before.elapsed();
        let memory = |field: &str| {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .unwrap_or_default()
                .lines()
                .find(|line| line.starts_with(field))
                .map(|line| line.split_whitespace().nth(1).unwrap_or("0").parse::<u64>().unwrap_or(0) / 1024)
                .unwrap_or(0)
        };
        let run = match (history, stale) {
            (0, _) => format!("queued={jobs_count}"),
            (_, 0) => format!("queued={jobs_count} history={history}"),
            _ => format!("queued={jobs_count} history={history} stale={stale}"),
        };
        println!(
            "BENCH {run} pods_per_second={:.0} all_pods_seconds={:.2} first_pod_ms={} run_to_pod_ms={} controller_peak_mib={} controller_now_mib={}",
            jobs_count as f64 / elapsed.as_secs_f64(),
            elapsed.as_secs_f64(),
            first_pod.unwrap_or(elapsed).as_millis(),
            latency.as_millis(),
            memory("VmHWM"),
            memory("VmRSS"),
        );
        // Where the two cores went while the pods were made (CPU milliseconds per pod).
        let per_pod = |seconds: f64| seconds * 1000.0 / jobs_count as f64;
        println!(
            "BENCH {run} cpu_ms_per_pod: controller={:.2} api_double_and_bench={:.2} postgres={:.2}",
            per_pod(controller_cpu),
            per_pod(double_cpu),
            per_pod(postgres_cpu),
        );
        // What the controller asked of the API server, per job (the queueing's creates excluded).
        let mut calls: std::collections::BTreeMap<String, usize> = Default::default();
        for (method, path) in api.requests() {
            let path = path.split('?').next().unwrap_or_default();
            let segments: Vec<&str> = path.split('/').collect();
            let kind = match segments.iter().position(|s| *s == "namespaces") {
                Some(i) => segments[i + 2..]
                    .iter()
                    .take(3)
                    .enumerate()
                    .filter(|(n, _)| *n != 1)
                    .map(|(_, s)| *s)
                    .collect::<Vec<_>>()
                    .join("/"),
                None => segments.last().copied().unwrap_or_default().to_string(),
            };
            *calls.entry(format!("{method} {kind}")).or_default() += 1;
        }
        let per_job: Vec<String> = calls
            .iter()
            .filter(|(_, count)| **count > jobs_count / 2)
            .map(|(call, count)| format!("{call}={:.2}", *count as f64 / (jobs_count + 1) as f64))
            .collect();
        println!("BENCH {run} api_calls_per_job: {}", per_job.join(" "));
        if history > 0 {
            // What the cluster holds once the controller caught up: the jobs in flight (no kubelet
            // runs them here) plus finished ones within the keep window (none).
            let in_flight = jobs_count + 1;
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            while api.list(Kind::FUNCTION_JOB, NAMESPACE).len() > in_flight && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let count = |kind| api.list(kind, NAMESPACE).len();
            let (resources, secrets, pods) = (count(Kind::FUNCTION_JOB), count(Kind::SECRET), count(Kind::POD));
            println!(
                "BENCH {run} cluster_objects={} (functionjobs={resources} secrets={secrets} pods={pods}) in_flight={in_flight} controller_peak_mib={}",
                resources + secrets + pods,
                memory("VmHWM"),
            );
        }
        let _ = controller.kill().await;
    }
}

/// Puts `count` finished jobs of `author` in the database (with four events each, as a job's
/// life leaves), the way a long-running installation has them, and gives the newest `stale` a
/// FunctionJob and a Secret as a controller that stopped before collecting them left them:
/// settled, finished two hours ago.
async fn seed_history(
    gateway: &Gateway,
    api: &ApiServer,
    program_id: &str,
    author_id: &str,
    count: usize,
    stale: usize,
) {
    let gantry::db::Db::Postgres(pool) = &gateway.state.db else { panic!("the benchmark runs on PostgreSQL") };
    let now = chrono::Utc::now().timestamp_micros();
    sqlx::query(
        "INSERT INTO jobs (id, program_id, author_id, status, runner, created, updated, last_activity, event_seq) \
         SELECT gen_random_uuid()::text, $1, $2, (ARRAY['SUCCEEDED','FAILED','STOPPED'])[1 + g % 3], 'kubernetes', \
                $3 - g * 60000000, $3 - g * 60000000 + 7200000000, $3 - g * 60000000, 4 \
         FROM generate_series(1, $4) AS g",
    )
    .bind(program_id)
    .bind(author_id)
    .bind(now - 7_200_000_000)
    .bind(count as i64)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO job_events (id, job_id, seq, created, event_type, origin, context, data) \
         SELECT gen_random_uuid()::text, j.id, s, j.created + s, 'STATUS_CHANGE', 'SCHEDULER', 'UPDATE_JOB_STATUS', \
                '{\"status\": \"' || (ARRAY['QUEUED','PENDING','RUNNING',j.status])[s] || '\"}' \
         FROM jobs j, generate_series(1, 4) AS s WHERE j.status <> 'QUEUED'",
    )
    .execute(pool)
    .await
    .unwrap();
    gantry::db::counts::recount(&gateway.state.db).await.unwrap();
    sqlx::query("ANALYZE").execute(pool).await.unwrap();
    let newest: Vec<(String, String)> =
        sqlx::query_as("SELECT id, status FROM jobs WHERE status <> 'QUEUED' ORDER BY created DESC LIMIT $1")
            .bind(stale as i64)
            .fetch_all(pool)
            .await
            .unwrap();
    let finished = (chrono::Utc::now() - chrono::Duration::hours(2)).to_rfc3339();
    let resources: kube::Api<gantry::crd::FunctionJob> = kube::Api::namespaced(api.client(), NAMESPACE);
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> = kube::Api::namespaced(api.client(), NAMESPACE);
    for (id, status) in &newest {
        let resource: gantry::crd::FunctionJob = serde_json::from_value(json!({
            "apiVersion": "gantry.dev/v1alpha1", "kind": "FunctionJob",
            "metadata": {"name": id, "namespace": NAMESPACE, "finalizers": [gantry::crd::FINALIZER],
                         "labels": {gantry::crd::LABEL_JOB_ID: id}},
            "spec": {"jobId": id, "function": {"title": "fn"}, "artifact": "artifacts/x.tar", "entrypoint": "main.py",
                     "timeoutSeconds": 3600, "user": "alice", "secretName": secret_name(id)},
        }))
        .unwrap();
        resources.create(&Default::default(), &resource).await.unwrap();
        let status = json!({"phase": status, "podName": pod_name(id), "completionTime": finished, "logsArchived": true,
                            "conditions": [{"type": "LogsArchived", "status": "True", "reason": "Archived", "message": "",
                                            "lastTransitionTime": finished}]});
        api.update_status(Kind::FUNCTION_JOB, NAMESPACE, id, status);
        let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
            "metadata": {"name": secret_name(id), "namespace": NAMESPACE}, "data": {"token": "dG9rZW4="}}))
        .unwrap();
        secrets.create(&Default::default(), &secret).await.unwrap();
    }
}

/// CPU seconds used so far by this machine's PostgreSQL processes (0 when it runs elsewhere).
fn postgres_cpu_seconds() -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0.0 };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str().map(str::to_string))
        .filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "postgres"))
        .map(|pid| cpu_seconds(&pid))
        .sum()
}
