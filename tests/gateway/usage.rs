//! The usage ledger (issue 47): every ending writes exactly one usage record in its terminal
//! move's transaction, with run time from the RUNNING move to the end (as the job's own status
//! events say), the wait before it, the attempts, and the allocation over the run; the kept
//! totals per day match the records. `check_record` is what the tables of endings elsewhere
//! (`reasons.rs` on the local runner, `pod_endings.rs` on the Kubernetes doubles) call for each
//! of theirs.

use axum::body::Body;
use axum::http::{Request, header};
use gantry::db::usage::UsageRecord;
use gantry::domain::lifecycle::{JobStatus, Trigger, decide};
use gantry::domain::usage::Allocation;
use serde_json::json;

use gantry::admin::AdminCommand;

use crate::both_backends;
use crate::harness::{Backend, Gateway};

both_backends!(
    every_ending_writes_one_record_with_its_figures,
    totals_are_read_by_those_they_belong_to,
    budgets_hold_back_new_runs_never_running_jobs_and_reset_with_the_month,
    ended_months_are_summed_once_and_read_as_their_days_were,
);

/// The times (microseconds) of a job's first move into RUNNING and of its terminal move, as its
/// STATUS_CHANGE events recorded them.
async fn status_times(db: &gantry::db::Db, id: &str) -> (Option<i64>, i64) {
    let events = gantry::db::jobs::list_events(db, id, Some("STATUS_CHANGE")).await.unwrap();
    let status =
        |data: &str| serde_json::from_str::<serde_json::Value>(data).unwrap()["status"].as_str().map(str::to_string);
    let running = events.iter().filter(|e| status(&e.data).as_deref() == Some("RUNNING")).map(|e| e.created).min();
    let ended = events
        .iter()
        .filter(|e| matches!(status(&e.data).as_deref(), Some("SUCCEEDED" | "FAILED" | "STOPPED")))
        .map(|e| e.created)
        .max()
        .expect("a terminal status event");
    (running, ended)
}

/// Checks job `id`'s usage record: exactly one, ended in `status` after `attempts` attempts, its
/// run time the RUNNING→end interval of its events (0 when it never ran) and its wait the time
/// before, its allocation's figures those of its run time.
pub async fn check_record(gateway: &Gateway, id: &str, status: &str, attempts: i64) -> UsageRecord {
    let db = &gateway.state.db;
    let record = gantry::db::usage::record(db, id).await.unwrap().unwrap_or_else(|| panic!("{id}: no usage record"));
    let (running, ended) = status_times(db, id).await;
    assert_eq!((record.status.as_str(), record.attempts), (status, attempts), "{record:?}");
    assert_eq!(record.ended, ended, "{record:?}");
    assert_eq!(record.run_ms, running.map_or(0, |since| (ended - since) / 1000), "{record:?}");
    assert_eq!(record.wait_ms, (running.unwrap_or(ended) - record.created) / 1000, "{record:?}");
    let per = |allocated: Option<i64>, divisor: i64| allocated.unwrap_or(0) * record.run_ms / divisor;
    assert_eq!(
        (record.cpu_core_ms, record.gib_ms, record.gpu_ms),
        (per(record.cpu_millis, 1000), per(record.memory_mib, 1024), per(record.gpus, 1)),
        "{record:?}"
    );
    record
}

/// Runs `fn` as alice, for the instance `crn` when given.
async fn run(gateway: &Gateway, crn: Option<&str>) -> String {
    let mut request = Request::builder()
        .method("POST")
        .uri("/api/v1/programs/run/")
        .header(header::AUTHORIZATION, "Bearer alice")
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(crn) = crn {
        request = request.header("Service-CRN", crn);
    }
    let body = Body::from(json!({"title": "fn", "arguments": "{}"}).to_string());
    let reply = gateway.send(request.body(body).unwrap()).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    reply.json["id"].as_str().unwrap().to_string()
}

async fn every_ending_writes_one_record_with_its_figures(backend: Backend) {
    // No runner: the moves are made here, as runners make them, through both ways a move is
    // written (a batch; one job, which on PostgreSQL without outbox is one statement when not
    // terminal).
    let gateway = Gateway::start(backend).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    let db = &gateway.state.db;
    let step = |from: JobStatus, trigger: Trigger| decide(from, &trigger).unwrap();
    let crn = "crn:v1:bluemix:public:quantum-computing:us-east:a/acct:inst::";
    let ids: Vec<String> = [
        run(&gateway, Some(crn)).await,
        run(&gateway, None).await,
        run(&gateway, None).await,
        run(&gateway, None).await,
        run(&gateway, None).await,
    ]
    .into();
    let [failed, succeeded, timed_out, retried, never_ran] = ids.as_slice() else { unreachable!() };
    let allocation = Allocation {
        compute_profile: Some("cpu-2x8".into()),
        cpu_millis: 2000,
        memory_mib: 8192,
        gpus: 0,
        gpu_model: None,
    };
    let started_ones = [failed.clone(), succeeded.clone(), timed_out.clone(), retried.clone()];
    assert_eq!(
        gantry::db::jobs::apply_moves(db, &started_ones, &step(JobStatus::Queued, Trigger::Admitted), false)
            .await
            .unwrap()
            .len(),
        4
    );
    for id in &started_ones {
        gantry::db::jobs::record_allocation(db, id, &allocation).await.unwrap();
        assert!(
            gantry::db::jobs::apply_move(db, id, &step(JobStatus::Pending, Trigger::Started), false)
                .await
                .unwrap()
                .is_some()
        );
    }
    // An infrastructure retry: a second attempt of the same job, in its one record.
    assert!(gantry::db::jobs::record_retry(db, retried, 0, &json!({"reason": "evicted"})).await.unwrap());
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;

    let crashed = step(JobStatus::Running, Trigger::Crashed { reason: "exit code 1".into() });
    assert!(gantry::db::jobs::apply_move(db, failed, &crashed, false).await.unwrap().is_some());
    let exited = step(JobStatus::Running, Trigger::Exited { success: true });
    assert!(gantry::db::jobs::apply_move(db, succeeded, &exited, true).await.unwrap().is_some());
    let stopped = step(JobStatus::Running, Trigger::TimedOut { limit_secs: 60 });
    let both = [timed_out.clone(), retried.clone()];
    assert_eq!(gantry::db::jobs::apply_moves(db, &both, &stopped, false).await.unwrap().len(), 2);
    // Stopped while queued: it never ran.
    let reply = gateway.post_json(&format!("/api/v1/jobs/{never_ran}/stop/"), "alice", json!({})).await;
    assert_eq!(reply.status, 200, "{}", reply.json);

    let record = check_record(&gateway, failed, "FAILED", 1).await;
    assert!(record.run_ms >= 30, "{record:?}");
    assert_eq!(record.instance.as_deref(), Some(crn), "the instance it ran for: {record:?}");
    assert_eq!(
        (record.cpu_millis, record.memory_mib, record.compute_profile.as_deref()),
        (Some(2000), Some(8192), Some("cpu-2x8"))
    );
    let job = gantry::db::jobs::find(db, failed).await.unwrap().unwrap();
    assert_eq!(
        (record.author_id.as_str(), record.program_id.as_str()),
        (job.author_id.as_str(), job.program_id.as_deref().unwrap())
    );
    assert!(!record.trial, "{record:?}");
    check_record(&gateway, succeeded, "SUCCEEDED", 1).await;
    check_record(&gateway, timed_out, "STOPPED", 1).await;
    check_record(&gateway, retried, "STOPPED", 2).await;
    let record = check_record(&gateway, never_ran, "STOPPED", 1).await;
    assert_eq!((record.run_ms, record.cpu_core_ms, record.cpu_millis), (0, 0, None), "{record:?}");

    // A move that finds the job ended writes nothing more.
    assert!(gantry::db::jobs::apply_move(db, failed, &crashed, false).await.unwrap().is_none());
    let records = gantry::db::usage::records(db, 0, i64::MAX).await.unwrap();
    assert_eq!(records.len(), 5, "one record a job: {records:?}");
    // The kept totals are the records': a recount changes nothing.
    let recounted = gantry::db::counts::recount(db).await.unwrap();
    assert_eq!(recounted.before, recounted.after, "{recounted}");
    assert_eq!(recounted.after.5, 5, "{recounted}");
    // Usage retention: records of days before the cutoff go with their days' totals; a cutoff
    // of today keeps today's.
    let today = gantry::db::now_micros().div_euclid(86_400_000_000);
    assert_eq!(gantry::db::usage::prune(db, today).await.unwrap(), 0);
    assert_eq!(gantry::db::usage::prune(db, today + 1).await.unwrap(), 5);
    assert!(gantry::db::usage::records(db, 0, i64::MAX).await.unwrap().is_empty());
    let recounted = gantry::db::counts::recount(db).await.unwrap();
    assert_eq!((recounted.before.5, recounted.after.5), (0, 0), "{recounted}");
}

/// Runs `title` as `user` and moves it as a runner would: into RUNNING, then, with `end`, out.
async fn run_and_move(gateway: &Gateway, user: &str, title: &str, end: Option<Trigger>) -> String {
    let body = match title.split_once('/') {
        Some((provider, title)) => json!({"title": title, "provider": provider, "arguments": "{}"}),
        None => json!({"title": title, "arguments": "{}"}),
    };
    let reply = gateway.post_json("/api/v1/programs/run/", user, body).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    let id = reply.json["id"].as_str().unwrap().to_string();
    let db = &gateway.state.db;
    let allocation = Allocation { cpu_millis: 1000, memory_mib: 1024, ..Allocation::default() };
    gantry::db::jobs::record_allocation(db, &id, &allocation).await.unwrap();
    for (from, trigger) in [(JobStatus::Queued, Trigger::Admitted), (JobStatus::Pending, Trigger::Started)] {
        assert!(
            gantry::db::jobs::apply_move(db, &id, &decide(from, &trigger).unwrap(), false).await.unwrap().is_some()
        );
    }
    if let Some(end) = end {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let mv = decide(JobStatus::Running, &end).unwrap();
        assert!(gantry::db::jobs::apply_move(db, &id, &mv, false).await.unwrap().is_some());
    }
    id
}

async fn totals_are_read_by_those_they_belong_to(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.provider("acme", None, "erin").await;
    gateway.upload_function("erin", &[("title", "acme/solver"), ("entrypoint", "main.py")]).await;
    gateway.admin(AdminCommand::AddMember { group: "runners".into(), user: "alice".into() }).await;
    gateway.admin(AdminCommand::AddMember { group: "runners".into(), user: "bob".into() }).await;
    gateway
        .admin(AdminCommand::Grant {
            provider: "acme".into(),
            function: "solver".into(),
            group: "runners".into(),
            view: true,
            run: true,
        })
        .await;
    gateway.upload_function("alice", &[("title", "mine"), ("entrypoint", "main.py")]).await;
    let done = Some(Trigger::Exited { success: true });
    let mine = run_and_move(&gateway, "alice", "mine", done.clone()).await;
    let solved = run_and_move(&gateway, "alice", "acme/solver", done.clone()).await;
    // Running: counted up to now, in the running column.
    let running = run_and_move(&gateway, "alice", "mine", None).await;
    run_and_move(&gateway, "bob", "acme/solver", Some(Trigger::Crashed { reason: "exit code 1".into() })).await;
    let db = &gateway.state.db;
    let run_ms = |id: &str| {
        let id = id.to_string();
        async move { gantry::db::usage::record(db, &id).await.unwrap().unwrap().run_ms }
    };
    let (mine_ms, solved_ms) = (run_ms(&mine).await, run_ms(&solved).await);

    // A job's own usage: its record once ended, what it used so far while it runs.
    let own = gateway.get(&format!("/api/v1/jobs/{mine}/usage/"), "alice").await.json;
    assert_eq!(
        (own["status"].as_str(), own["run_seconds"].as_f64(), own["cpu_cores"].as_f64()),
        (Some("SUCCEEDED"), Some(mine_ms as f64 / 1000.0), Some(1.0)),
        "{own}"
    );
    assert!(own["ended"].is_string() && own["attempts"] == 1, "{own}");
    let so_far = gateway.get(&format!("/api/v1/jobs/{running}/usage/"), "alice").await.json;
    assert_eq!((so_far["status"].as_str(), so_far["ended"].is_null()), (Some("RUNNING"), true), "{so_far}");
    assert!(so_far["run_seconds"].as_f64().unwrap() > 0.0, "{so_far}");
    let others = gateway.get(&format!("/api/v1/jobs/{mine}/usage/"), "bob").await;
    assert_eq!(others.status.as_u16(), 404, "{}", others.json);

    // alice: her own jobs, by function (the default), this month (the default period).
    let answer = gateway.get("/api/v1/usage/", "alice").await;
    assert_eq!(answer.status, 200, "{}", answer.json);
    let usage = answer.json;
    assert_eq!((usage["total"]["jobs"].as_i64(), usage["total"]["running"].as_i64()), (Some(2), Some(1)), "{usage}");
    let groups = usage["groups"].as_array().unwrap();
    let named =
        |name: &str| groups.iter().find(|g| g["name"] == name).unwrap_or_else(|| panic!("{name}: {usage}")).clone();
    assert_eq!((named("mine")["jobs"].as_i64(), named("mine")["running"].as_i64()), (Some(1), Some(1)), "{usage}");
    assert!(named("mine")["run_seconds"].as_f64().unwrap() >= mine_ms as f64 / 1000.0, "running time added: {usage}");
    assert_eq!(named("solver")["run_seconds"].as_f64(), Some(solved_ms as f64 / 1000.0), "{usage}");
    assert_eq!(named("solver")["cpu_core_seconds"].as_f64(), Some(solved_ms as f64 / 1000.0), "one core: {usage}");
    // By day: today's date.
    let by_day = gateway.get("/api/v1/usage/?group_by=day", "alice").await.json;
    let today = gantry::db::format_timestamp(gantry::db::now_micros())[..10].to_string();
    assert_eq!(by_day["groups"][0]["key"], today, "{by_day}");
    assert_eq!(by_day["groups"].as_array().unwrap().len(), 1, "{by_day}");
    let chart = gateway.get("/api/v1/usage/?group_by=day,function", "alice").await.json;
    let keys: Vec<(&str, &str)> = chart["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["key"].as_str().unwrap(), g["name"].as_str().unwrap()))
        .collect();
    assert_eq!(keys.len(), 2, "{chart}");
    assert!(keys.iter().all(|(key, _)| key.starts_with(&format!("{today} "))), "{chart}");
    assert!(keys.iter().any(|(_, name)| *name == "mine") && keys.iter().any(|(_, name)| *name == "solver"), "{chart}");

    // bob sees his own only; not alice's, not acme's.
    let bobs = gateway.get("/api/v1/usage/?group_by=size", "bob").await.json;
    assert_eq!((bobs["total"]["jobs"].as_i64(), bobs["total"]["running"].as_i64()), (Some(1), Some(0)), "{bobs}");
    let refused = gateway.get("/api/v1/usage/?provider=acme", "bob").await;
    assert_eq!(refused.status, 403, "{}", refused.json);
    assert_eq!(refused.message(), "Only an admin of provider acme reads its usage.");

    // erin, acme's admin: its function's jobs of every user, by user; none of alice's own function.
    let acme = gateway.get("/api/v1/usage/?provider=acme&group_by=user", "erin").await.json;
    assert_eq!(acme["total"]["jobs"].as_i64(), Some(2), "{acme}");
    let users: Vec<&str> = acme["groups"].as_array().unwrap().iter().filter_map(|g| g["name"].as_str()).collect();
    assert_eq!(users.len(), 2, "alice and bob: {acme}");
    assert_eq!(gateway.get("/api/v1/usage/", "erin").await.json["total"]["jobs"].as_i64(), Some(0));

    // The operator: everyone's, by provider, as CSV for a spreadsheet.
    let csv = gateway
        .admin(AdminCommand::Usage {
            from: None,
            to: None,
            group_by: "provider".into(),
            user: None,
            provider: None,
            csv: true,
        })
        .await;
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "provider,name,jobs,running,wait_seconds,run_seconds,cpu_core_seconds,gib_seconds,gpu_seconds"
    );
    assert_eq!(lines.len(), 3, "no provider (alice's own function) and acme: {csv}");
    let acme_line: Vec<&str> = lines.iter().find(|l| l.contains(",acme,")).unwrap().split(',').collect();
    assert_eq!(acme_line[2..4], ["2", "0"], "{csv}");
    let table = gateway
        .admin(AdminCommand::Usage {
            from: Some("2020-01-01".into()),
            to: Some("2020-02-01".into()),
            group_by: "day".into(),
            user: Some("alice".into()),
            provider: None,
            csv: false,
        })
        .await;
    assert!(table.ends_with("(no usage in this period)"), "{table}");

    // Bad input: a clear 400 naming the problem.
    for (query, message) in [
        ("from=2026-13-01", "'from' must be a date as YYYY-MM-DD, got '2026-13-01'."),
        ("from=2026-11-02&to=2026-11-01", "'to' (2026-11-01) must be after 'from' (2026-11-02)."),
        ("from=2025-01-01&to=2026-11-01", "A period covers at most 400 days; this one covers 669."),
        ("group_by=colour", "'group_by' must be one of function, size, day, day,function, user; got 'colour'."),
        ("group_by=user", "'group_by=user' needs 'provider': a provider's admins see its functions' jobs by user."),
    ] {
        let reply = gateway.get(&format!("/api/v1/usage/?{query}"), "alice").await;
        assert_eq!((reply.status.as_u16(), reply.message()), (400, message.to_string()), "{query}");
    }
    let operator = gateway.get("/api/v1/usage/?group_by=provider", "alice").await;
    assert_eq!(operator.status, 403, "{}", operator.json);
    let missing = gateway.get("/api/v1/usage/?provider=nobody", "alice").await;
    assert_eq!((missing.status.as_u16(), missing.message()), (404, "Provider nobody doesn't exist.".to_string()));
}

/// Runs `fn` as `user` and starts it with `cores` cores (a huge allocation makes hours of use in
/// milliseconds of run).
async fn run_started(gateway: &Gateway, user: &str, cores: i64) -> Result<String, (u16, String)> {
    let reply = gateway.post_json("/api/v1/programs/run/", user, json!({"title": "fn", "arguments": "{}"})).await;
    if reply.status != 200 {
        return Err((reply.status.as_u16(), reply.message()));
    }
    let id = reply.json["id"].as_str().unwrap().to_string();
    let db = &gateway.state.db;
    gantry::db::jobs::record_allocation(db, &id, &Allocation { cpu_millis: cores * 1000, ..Allocation::default() })
        .await
        .unwrap();
    for (from, trigger) in [(JobStatus::Queued, Trigger::Admitted), (JobStatus::Pending, Trigger::Started)] {
        assert!(
            gantry::db::jobs::apply_move(db, &id, &decide(from, &trigger).unwrap(), false).await.unwrap().is_some()
        );
    }
    Ok(id)
}

async fn sql(gateway: &Gateway, statement: &str) {
    match &gateway.state.db {
        gantry::db::Db::Postgres(pool) => sqlx::query(statement).execute(pool).await.map(|_| ()),
        gantry::db::Db::Sqlite(pool, _) => sqlx::query(statement).execute(pool).await.map(|_| ()),
    }
    .unwrap();
}

async fn scalar(gateway: &Gateway, query: &str) -> i64 {
    match &gateway.state.db {
        gantry::db::Db::Postgres(pool) => sqlx::query_scalar(query).fetch_one(pool).await,
        gantry::db::Db::Sqlite(pool, _) => sqlx::query_scalar(query).fetch_one(pool).await,
    }
    .unwrap()
}

/// Whole months are summed once after they end (`usage_by_month`), and a period's totals read
/// them for its whole months and the day rows for the rest, answering what the day rows alone
/// did; grouped by day, the day rows only. Retention drops months wholly past its cut; a
/// recount makes the months again from the day rows. Jobs are moved into past months by moving
/// their day rows, as the month's turn is simulated elsewhere.
async fn ended_months_are_summed_once_and_read_as_their_days_were(backend: Backend) {
    use gantry::domain::usage::{date_of, day_of, month_of};
    let gateway = Gateway::start(backend).await;
    gateway.provider("acme", None, "erin").await;
    gateway.upload_function("erin", &[("title", "acme/solver"), ("entrypoint", "main.py")]).await;
    gateway.upload_function("alice", &[("title", "mine"), ("entrypoint", "main.py")]).await;
    let db = &gateway.state.db;
    let today = day_of(gantry::db::now_micros());
    // Three months back (m2) and the month before last (m1): both ended over a day ago.
    let m1 = month_of(month_of(month_of(today).0 - 1).0 - 1).0;
    let m2 = month_of(m1 - 1).0;
    let done = Some(Trigger::Exited { success: true });
    let to_day = |day: i64| format!("UPDATE usage_by_day SET day = {day} WHERE day = {today}");
    run_and_move(&gateway, "alice", "mine", done.clone()).await;
    sql(&gateway, &to_day(m2 + 3)).await;
    run_and_move(&gateway, "alice", "mine", done.clone()).await;
    run_and_move(&gateway, "erin", "acme/solver", done.clone()).await;
    sql(&gateway, &to_day(m1 + 10)).await;
    run_and_move(&gateway, "alice", "mine", done.clone()).await;
    // From the second day of m2's month (a part of a month) to today.
    let period = format!("from={}&to={}", date_of(m2 + 1), date_of(today + 1));
    let read = |user: &'static str, query: String| {
        let gateway = &gateway;
        async move {
            let reply = gateway.get(&format!("/api/v1/usage/?{query}"), user).await;
            assert_eq!(reply.status, 200, "{query}: {}", reply.json);
            reply.json
        }
    };
    let answers = || async {
        vec![
            read("alice", format!("{period}&group_by=function")).await,
            read("alice", format!("{period}&group_by=size")).await,
            read("erin", format!("{period}&group_by=user&provider=acme")).await,
            read("alice", format!("{period}&group_by=day")).await,
        ]
    };
    let by_days = answers().await;
    assert_eq!(by_days[0]["total"]["jobs"], 3, "{}", by_days[0]);
    assert_eq!(by_days[2]["total"]["jobs"], 1, "{}", by_days[2]);
    assert_eq!(scalar(&gateway, "SELECT COUNT(*) FROM usage_by_month").await, 0);

    let before = gantry::db::usage::months_summed_before(gantry::db::now_micros());
    let summed = gantry::db::usage::sum_months(db, before).await.unwrap();
    // m2's month, m1's, and the last one unless today is its first day after.
    assert!(summed >= 2, "{summed} months summed");
    assert_eq!(gantry::db::usage::sum_months(db, before).await.unwrap(), 0, "each month is summed once");
    let through = scalar(&gateway, "SELECT through FROM usage_months").await;
    assert!(through > m1 && through <= month_of(today).0, "{through}");
    assert_eq!(answers().await, by_days, "the months' sums answer what their days did");

    // The whole month m1 is read from its sum: without its day rows, only grouping by day changes.
    sql(&gateway, &format!("DELETE FROM usage_by_day WHERE day >= {m1} AND day < {}", month_of(m1).1)).await;
    let from_months = answers().await;
    assert_eq!(from_months[..3], by_days[..3], "a whole month is read from its sum");
    assert_eq!(from_months[3]["total"]["jobs"], 2, "by day, from the day rows: {}", from_months[3]);
    // m2's month is cut by the period: its day rows are read, not its sum.
    sql(&gateway, &format!("DELETE FROM usage_by_day WHERE day = {}", m2 + 3)).await;
    assert_eq!(read("alice", format!("{period}&group_by=function")).await["total"]["jobs"], 2);

    // Retention: months wholly before its cut go, the one it cuts stays.
    gantry::db::usage::prune(db, m1 + 5).await.unwrap();
    let months = format!("SELECT COUNT(*) FROM usage_by_month WHERE month = {m2}");
    assert_eq!(scalar(&gateway, &months).await, 0);
    assert!(scalar(&gateway, &format!("SELECT COUNT(*) FROM usage_by_month WHERE month = {m1}")).await > 0);

    // A recount: the day rows from the records (all ended today), the months made again.
    let recounted = gantry::db::counts::recount(db).await.unwrap();
    assert_eq!(recounted.after.5, 4, "{recounted}");
    assert_eq!(scalar(&gateway, "SELECT through FROM usage_months").await, 0);
    assert_eq!(scalar(&gateway, "SELECT COUNT(*) FROM usage_by_month").await, 0);
    let again = read("alice", format!("{period}&group_by=function")).await;
    assert_eq!(again["total"]["jobs"], 3, "nothing counted twice: {again}");
}

async fn budgets_hold_back_new_runs_never_running_jobs_and_reset_with_the_month(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    // As a server runs: what a run reads of its budgets is kept until a change is announced
    // (`set-budget`, a group's members), which the follower sees within 100 ms.
    let _follower = gantry::api::state::follow_changes(
        &gateway.state.db,
        &gateway.state.auth,
        &gateway.state.functions,
        &gateway.state.budgets,
    );
    let told = || tokio::time::sleep(std::time::Duration::from_millis(400));
    for user in ["alice", "bob", "carol"] {
        gateway.upload_function(user, &[("title", "fn"), ("entrypoint", "main.py")]).await;
    }
    let set = |user: Option<&str>, group: Option<&str>, cpu_hours: Option<f64>| AdminCommand::SetBudget {
        user: user.map(str::to_string),
        group: group.map(str::to_string),
        provider: None,
        function: None,
        cpu_hours,
        gpu_hours: None,
        remove: false,
    };
    assert_eq!(
        gateway.admin(set(Some("alice"), None, Some(10.0))).await,
        "budget of user alice: CPU 10 h a month, GPU no limit a month"
    );
    // 3.6 million cores: an hour of CPU every millisecond it runs.
    let first = run_started(&gateway, "alice", 3_600_000).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    // Its use up to now (30 h and more) spends the budget: the next run is refused, it runs on.
    let (status, message) = run_started(&gateway, "alice", 1).await.unwrap_err();
    let (_, next_month) = gantry::domain::usage::month_of(gantry::db::now_micros().div_euclid(86_400_000_000));
    assert_eq!(status, 429, "{message}");
    assert!(message.starts_with("Budget spent: the CPU-hours budget of user alice is 10 a month and "), "{message}");
    assert!(message.ends_with(&format!("; it resets on {}.", gantry::domain::usage::date_of(next_month))), "{message}");
    let job = gateway.get(&format!("/api/v1/jobs/{first}/"), "alice").await.json;
    assert_eq!(job["status"], "RUNNING", "a budget never stops a running job: {job}");
    // jobs/queue/ shows it, used and left.
    let queue = gateway.get("/api/v1/jobs/queue/", "alice").await.json;
    let budget = &queue["budgets"][0];
    assert_eq!(
        (budget["kind"].as_str(), budget["name"].as_str(), budget["cpu_hours"].as_f64()),
        (Some("user"), Some("alice"), Some(10.0)),
        "{queue}"
    );
    assert!(budget["cpu_hours_used"].as_f64().unwrap() >= 10.0 && budget["cpu_hours_left"] == 0.0, "{queue}");
    assert_eq!(budget["gpu_hours"], serde_json::Value::Null, "{queue}");
    // Others are not held back by alice's budget.
    run_started(&gateway, "bob", 1).await.unwrap();

    // The month turns: its use now lies in the month before, and runs start again.
    let ended = decide(JobStatus::Running, &Trigger::Exited { success: true }).unwrap();
    assert!(gantry::db::jobs::apply_move(&gateway.state.db, &first, &ended, false).await.unwrap().is_some());
    run_started(&gateway, "alice", 1).await.unwrap_err();
    sql(&gateway, "UPDATE usage_by_day SET day = day - 40").await;
    let allowed = run_started(&gateway, "alice", 1).await;
    assert!(allowed.is_ok(), "{allowed:?}");

    // A group's budget counts its members' jobs together.
    gateway.admin(AdminCommand::AddMember { group: "team".into(), user: "bob".into() }).await;
    gateway.admin(AdminCommand::AddMember { group: "team".into(), user: "carol".into() }).await;
    gateway.admin(set(None, Some("team"), Some(1.0))).await;
    told().await;
    run_started(&gateway, "carol", 3_600_000).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    let (status, message) = run_started(&gateway, "bob", 1).await.unwrap_err();
    assert_eq!(status, 429);
    assert!(message.starts_with("Budget spent: the CPU-hours budget of group team is 1 a month"), "{message}");
    let listed = gateway.admin(AdminCommand::Budgets).await;
    assert!(listed.contains("group team: CPU ") && listed.contains("user alice: CPU "), "{listed}");
    // Removed, it holds nothing back.
    let removed = AdminCommand::SetBudget {
        user: None,
        group: Some("team".into()),
        provider: None,
        function: None,
        cpu_hours: None,
        gpu_hours: None,
        remove: true,
    };
    assert_eq!(gateway.admin(removed).await, "budget of group team removed");
    told().await;
    run_started(&gateway, "bob", 1).await.unwrap();

    // A function's budget counts every user's jobs of it; jobs/queue/ shows it to those who ran
    // it this month or have active jobs of it.
    gateway.provider("acme", None, "erin").await;
    gateway.upload_function("erin", &[("title", "acme/solver"), ("entrypoint", "main.py")]).await;
    let function_budget = AdminCommand::SetBudget {
        user: None,
        group: None,
        provider: Some("acme".into()),
        function: Some("solver".into()),
        cpu_hours: Some(2.0),
        gpu_hours: None,
        remove: false,
    };
    gateway.admin(function_budget).await;
    let solve = json!({"title": "solver", "provider": "acme", "arguments": "{}"});
    let reply = gateway.post_json("/api/v1/programs/run/", "erin", solve.clone()).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    let solving = reply.json["id"].as_str().unwrap().to_string();
    let db = &gateway.state.db;
    gantry::db::jobs::record_allocation(
        db,
        &solving,
        &Allocation { cpu_millis: 3_600_000_000, ..Allocation::default() },
    )
    .await
    .unwrap();
    for (from, trigger) in [(JobStatus::Queued, Trigger::Admitted), (JobStatus::Pending, Trigger::Started)] {
        assert!(
            gantry::db::jobs::apply_move(db, &solving, &decide(from, &trigger).unwrap(), false)
                .await
                .unwrap()
                .is_some()
        );
    }
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    let refused = gateway.post_json("/api/v1/programs/run/", "erin", solve).await;
    assert_eq!(refused.status, 429, "{}", refused.json);
    assert!(
        refused.message().starts_with("Budget spent: the CPU-hours budget of function acme/solver is 2 a month"),
        "{}",
        refused.message()
    );
    let queue = gateway.get("/api/v1/jobs/queue/", "erin").await.json;
    let listed: Vec<(&str, &str)> = queue["budgets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["kind"].as_str().unwrap(), b["name"].as_str().unwrap()))
        .collect();
    assert_eq!(listed, [("function", "acme/solver")], "{queue}");
    assert_eq!(queue["budgets"][0]["cpu_hours_left"], 0.0, "{queue}");
    // Not to a user who never ran it.
    let queue = gateway.get("/api/v1/jobs/queue/", "bob").await.json;
    assert!(queue["budgets"].as_array().unwrap().iter().all(|b| b["kind"] != "function"), "{queue}");
}
