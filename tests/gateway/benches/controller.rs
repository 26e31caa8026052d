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
    use gantry::crd::FunctionJob;
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
                    ids.push(queue_job(&db, &resources, &program_id, (&author_id, "alice"), None, false).await);
                }
                ids
            }
        };
        queue(jobs_count).await;
        // The controller is its own process (this build's `gantry controller`), against the
        // double served on loopback, so its memory is its own.
        let (folder, args, env) = controller_role(&gateway, &api, UNBOUNDED).await;
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
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => created = api.count(Kind::POD, NAMESPACE),
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
        let memory = |field: &str| memory_mib(pid, field);
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

/// Queues a job of `author` (its id and name) as the gateway does: its row (of `provider`'s
/// function, its id and name, when given; backfill when asked), then its FunctionJob with the
/// controller's finalizer. Answers its id.
async fn queue_job(
    db: &gantry::db::Db,
    resources: &kube::Api<gantry::crd::FunctionJob>,
    program_id: &str,
    (author_id, user): (&str, &str),
    provider: Option<(&str, &str)>,
    backfill: bool,
) -> String {
    use gantry::crd::{FunctionJob, FunctionJobSpec, FunctionRef, JobResources};
    let id = gantry::db::new_id();
    let job = gantry::db::jobs::NewJob {
        provider_id: provider.map(|(id, _)| id.to_string()),
        runner: "kubernetes".into(),
        backfill,
        ..crate::jobs::queued_job(program_id, author_id, id.clone())
    };
    gantry::db::jobs::insert_with_limit(db, &job, i64::MAX, false).await.unwrap().unwrap();
    let spec = FunctionJobSpec {
        job_id: id.clone(),
        function: FunctionRef {
            title: "fn".into(),
            provider: provider.map(|(_, name)| name.to_string()),
            version: None,
        },
        image: None,
        artifact: Some("artifacts/x.tar".into()),
        entrypoint: Some("main.py".into()),
        size: None,
        resources: JobResources::default(),
        gpus: 0,
        gpu_model: None,
        compute_profile: None,
        timeout_seconds: 3600,
        user: user.into(),
        function_env: Vec::new(),
        stop_requested: false,
        retry_after_start: false,
        secret_name: gantry::crd::secret_name(&id),
    };
    let mut resource = FunctionJob::new(&id, spec);
    resource.metadata.finalizers = Some(vec![gantry::crd::FINALIZER.to_string()]);
    resources.create(&Default::default(), &resource).await.unwrap();
    id
}

/// Slots and jobs per user that never bind.
const UNBOUNDED: u64 = 1_000_000_000;

/// The arguments and environment of `gantry controller` (its own process) against `api` served
/// on loopback (a kubeconfig in the answered folder), without leader election, with `slots` CPU
/// and GPU slots and no bound per user.
async fn controller_role(
    gateway: &Gateway,
    api: &ApiServer,
    slots: u64,
) -> (tempfile::TempDir, Vec<String>, Vec<(&'static str, String)>) {
    let folder = tempfile::tempdir().unwrap();
    let address = api.serve().await;
    let kubeconfig = folder.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig(address)).unwrap();
    let (mut args, mut env) = crate::e2e_kubernetes::role_settings(gateway, folder.path(), &kubeconfig);
    args.insert(0, "controller".into());
    args.extend(["--leader-election", "false", "--admin-listen", "127.0.0.1:0"].map(str::to_string));
    env.push(("LIMITS_JOBS_PER_USER", UNBOUNDED.to_string()));
    for limit in ["LIMITS_MAX_CLUSTERS", "LIMITS_MAX_GPU_CLUSTERS"] {
        env.push((limit, slots.to_string()));
    }
    (folder, args, env)
}

/// A `/proc/<pid>/status` figure in MiB (`VmHWM`: peak resident memory, `VmRSS`: now).
fn memory_mib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|line| line.starts_with(field))
        .map(|line| line.split_whitespace().nth(1).unwrap_or("0").parse::<u64>().unwrap_or(0) / 1024)
        .unwrap_or(0)
}

/// Waits until the API server double has created `count` more pods (counted from its change
/// feed); answers how often the feed was left behind and the changes it skipped then. panics naming the controller's log when pods stop coming for two minutes.
async fn pods_created(
    api: &ApiServer,
    changes: &mut tokio::sync::broadcast::Receiver<crate::doubles::kube_double::Change>,
    count: usize,
    log: &std::path::Path,
) -> (u64, u64) {
    // Only when the feed is left behind: the pods there are, beyond those there were (counted,
    // not listed: a list copies every pod under the double's lock, which slowed the controller
    // it measures once 100,000 pods were there).
    let before = api.count(Kind::POD, NAMESPACE);
    let (mut created, mut lagged, mut skipped) = (0, 0, 0);
    while created < count {
        let change = tokio::time::timeout(Duration::from_secs(120), changes.recv()).await;
        match change.unwrap_or_else(|_| panic!("pods stopped being created:\n{}", crate::e2e_kubernetes::tail(log))) {
            Ok(change)
                if change.plural == "pods" && change.event_type == crate::doubles::kube_double::EventType::Added =>
            {
                created += 1
            }
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::RecvError::Lagged(lost)) => {
                lagged += 1;
                skipped += lost;
                created = api.count(Kind::POD, NAMESPACE).saturating_sub(before)
            }
            Err(closed) => panic!("the change feed ended: {closed}"),
        }
    }
    (lagged, skipped)
}

/// Benchmark, not a test (`bench/controller.sh tenants`): admission between tenants on the
/// controller (its own process) against the API server double and a real PostgreSQL. First
/// 100,000 queued jobs (`GANTRY_BENCH_TENANT_JOBS`) from 1,000 users of 100 provider tenants
/// (50 CPU slots guaranteed each, weights 1, 2, 3 in turn, one job in 200 backfill) with slots
/// for all: pods per second and the controller's peak memory. Then a 536-deep queue of one
/// tenant behind 600 slots all taken by another's jobs, which end at once: admissions per second
/// from their end to the 536th pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run bench/controller.sh tenants"]
async fn bench_admission_between_tenants() {
    use gantry::db::tenants::{Kind as TenantKind, Quotas};
    use gantry::domain::lifecycle::{JobStatus, Trigger, decide};
    let jobs_count: usize =
        std::env::var("GANTRY_BENCH_TENANT_JOBS").ok().and_then(|n| n.parse().ok()).unwrap_or(100_000);
    let (users_count, tenants_count) = (1_000, 100);
    let start = |slots: u64| async move {
        let gateway = Gateway::start(Backend::PostgresS3).await;
        gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
        let program_id =
            gateway.get("/api/v1/programs/get_by_title/fn/", "alice").await.json["id"].as_str().unwrap().to_string();
        let mut providers = Vec::new();
        for t in 0..tenants_count {
            let name = format!("p{t}");
            gateway.provider(&name, None, "alice").await;
            let quotas = Quotas {
                cpu_guaranteed: 50,
                cpu_borrow_cap: None,
                gpu_guaranteed: 0,
                gpu_borrow_cap: None,
                gpu_model: None,
                weight: 1 + (t as i64 % 3),
            };
            gantry::db::tenants::set(&gateway.state.db, TenantKind::Provider, &name, quotas).await.unwrap();
            let gantry::db::Db::Postgres(pool) = &gateway.state.db else { panic!("the benchmark runs on PostgreSQL") };
            let id: String = sqlx::query_scalar("SELECT id FROM providers WHERE name = $1")
                .bind(&name)
                .fetch_one(pool)
                .await
                .unwrap();
            providers.push((id, name));
        }
        let mut users = Vec::new();
        for u in 0..users_count {
            let name = format!("u{u}");
            users.push((gantry::db::users::ensure(&gateway.state.db, &name).await.unwrap().id, name));
        }
        let api = ApiServer::new();
        // Nothing here reads them: a million requests' paths held for nothing.
        api.stop_recording_requests();
        api.install_crd(&gantry::crd::crd_yaml()).await;
        let (folder, args, env) = controller_role(&gateway, &api, slots).await;
        (gateway, program_id, providers, users, api, folder, args, env)
    };

    // Throughput: every queued job admitted into its pod.
    let (gateway, program_id, providers, users, api, folder, args, env) = start(UNBOUNDED).await;
    let resources: kube::Api<gantry::crd::FunctionJob> = kube::Api::namespaced(api.client(), NAMESPACE);
    let queue_started = std::time::Instant::now();
    for k in 0..jobs_count {
        let (author_id, user) = &users[k % users_count];
        let (provider_id, provider) = &providers[(k % users_count) % tenants_count];
        let provider = Some((provider_id.as_str(), provider.as_str()));
        queue_job(&gateway.state.db, &resources, &program_id, (author_id, user), provider, k % 200 == 0).await;
    }
    let queue_seconds = queue_started.elapsed().as_secs_f64();
    let mut changes = api.subscribe();
    let log = folder.path().join("controller.log");
    let started = std::time::Instant::now();
    let mut controller = crate::e2e_kubernetes::spawn_role(&args, &env, &log);
    let pid = controller.id().expect("the controller runs");
    let (lagged, skipped) = pods_created(&api, &mut changes, jobs_count, &log).await;
    let elapsed = started.elapsed().as_secs_f64();
    let gantry::db::Db::Postgres(pool) = &gateway.state.db else { unreachable!() };
    let (moves, tenants_seen): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT COUNT(DISTINCT created) FROM job_events WHERE data LIKE '%PENDING%'), \
                (SELECT COUNT(DISTINCT tenant) FROM jobs WHERE tenant IS NOT NULL)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    println!(
        "BENCH tenants queued={jobs_count} users={users_count} tenants={tenants_seen} pods_per_second={:.0} all_pods_seconds={elapsed:.2} \
         admission_transactions={moves} controller_peak_mib={} controller_now_mib={} (queued in {queue_seconds:.0} s; \
         the bench's change feed left behind {lagged} times, {skipped} changes)",
        jobs_count as f64 / elapsed,
        memory_mib(pid, "VmHWM"),
        memory_mib(pid, "VmRSS"),
    );
    let _ = controller.kill().await;
    drop((gateway, api, folder));

    // Drain: 536 jobs of tenant p0 wait behind 600 slots held by p1's jobs, which end at once.
    let (held, deep) = (600, 536);
    let (gateway, program_id, providers, users, api, folder, args, env) = start(held as u64).await;
    let resources: kube::Api<gantry::crd::FunctionJob> = kube::Api::namespaced(api.client(), NAMESPACE);
    let holder = Some((providers[1].0.as_str(), providers[1].1.as_str()));
    let mut holding = Vec::new();
    for k in 0..held {
        let (author_id, user) = &users[k % users_count];
        holding.push(queue_job(&gateway.state.db, &resources, &program_id, (author_id, user), holder, false).await);
    }
    let mut changes = api.subscribe();
    let log = folder.path().join("controller.log");
    let mut controller = crate::e2e_kubernetes::spawn_role(&args, &env, &log);
    pods_created(&api, &mut changes, held, &log).await;
    let waiting = Some((providers[0].0.as_str(), providers[0].1.as_str()));
    for k in 0..deep {
        let (author_id, user) = &users[k % users_count];
        queue_job(&gateway.state.db, &resources, &program_id, (author_id, user), waiting, false).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(api.list(Kind::POD, NAMESPACE).len(), held, "the slots are all taken");
    let ended = decide(JobStatus::Pending, &Trigger::Exited { success: true }).unwrap();
    let freed = std::time::Instant::now();
    let moved = gantry::db::jobs::apply_moves(&gateway.state.db, &holding, &ended, false).await.unwrap();
    assert_eq!(moved.len(), held);
    pods_created(&api, &mut changes, deep, &log).await;
    let drained = freed.elapsed().as_secs_f64();
    println!(
        "BENCH tenants drain deep={deep} slots_freed={held} admissions_per_second={:.0} all_admitted_seconds={drained:.2}",
        deep as f64 / drained
    );
    let _ = controller.kill().await;
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
