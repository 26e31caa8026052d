//! Jobs through the API: run (limits, validation, nothing partial), listings, retrieval,
//! results, sub-status, events, runtime jobs, stop, logs and their permissions. Jobs here are
//! not executed (no runner); `lifecycle.rs` runs them for real.

use serde_json::{Value, json};

use crate::both_backends;
use crate::harness::{Backend, Gateway};

both_backends!(
    run_queues_a_job_with_its_first_event,
    rejected_runs_leave_nothing_behind,
    active_job_limit_holds_under_concurrency,
    runs_and_status_moves_at_once_never_deadlock,
    listings_filter_paginate_and_order,
    job_endpoints_are_author_only,
    sub_status_events_and_runtime_jobs,
    results_and_logs_read_order,
    stop_requests,
    provider_job_listing_and_logs,
    a_cancelled_run_never_leaves_a_transaction_open,
    runs_waiting_together_each_get_their_own_answer,
    text_fields_are_trimmed_like_the_reference,
    existing_ids_finds_exactly_the_jobs_with_rows,
    the_sweep_asks_only_for_unfinished_jobs_older_than_its_cutoff,
    a_page_far_past_the_end_is_empty_not_an_overflow,
);

/// Found by schemathesis: `offset + limit` past i64's range panicked the handler (a dropped
/// connection in debug builds, a wrapped `next` link in release builds).
async fn a_page_far_past_the_end_is_empty_not_an_overflow(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.provider("acme", None, "alice").await;
    for path in ["/api/v1/jobs/?", "/api/v1/jobs/provider/?provider=acme&"] {
        let far = format!("{path}limit=16204&offset=9223372036854775806");
        let reply = gateway.get(&far, "alice").await;
        assert_eq!(reply.status, 200, "{path}: {}", reply.json);
        assert_eq!(reply.json["results"], serde_json::json!([]), "{path}");
        assert_eq!(reply.json["next"], serde_json::Value::Null, "{path}: {}", reply.json);
    }
}

/// The drift sweep's batch question (more ids than one batch holds).
async fn existing_ids_finds_exactly_the_jobs_with_rows(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    let mut real = Vec::new();
    for _ in 0..3 {
        let reply = run(&gateway, "alice", "fn", "{}").await;
        assert_eq!(reply.status, 200, "{}", reply.json);
        real.push(reply.json["id"].as_str().unwrap().to_string());
    }
    let mut asked: Vec<String> = (0..1200).map(|_| gantry::db::new_id()).collect();
    asked.insert(7, real[0].clone());
    asked.insert(600, real[1].clone());
    asked.push(real[2].clone());
    let found = gantry::db::jobs::existing_ids(&gateway.state.db, &asked).await.unwrap();
    assert_eq!(found, real.iter().cloned().collect());
    assert!(gantry::db::jobs::existing_ids(&gateway.state.db, &[]).await.unwrap().is_empty());
}

/// The drift sweep's first question: a job run after the cutoff is still being given its
/// resources by its own run, and a finished one needs none, so neither is named.
async fn the_sweep_asks_only_for_unfinished_jobs_older_than_its_cutoff(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    let id = |reply: crate::harness::Reply| reply.json["id"].as_str().unwrap().to_string();
    let old = id(run(&gateway, "alice", "fn", "{}").await);
    let stopped = id(run(&gateway, "alice", "fn", "{}").await);
    let reply = gateway.post_json(&format!("/api/v1/jobs/{stopped}/stop/"), "alice", json!({})).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let cutoff = gantry::db::now_micros();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let young = id(run(&gateway, "alice", "fn", "{}").await);
    let db = &gateway.state.db;
    assert_eq!(gantry::db::jobs::active_ids(db, cutoff).await.unwrap(), std::slice::from_ref(&old));
    let mut everything = gantry::db::jobs::active_ids(db, i64::MAX).await.unwrap();
    everything.sort();
    let mut expected = vec![old, young];
    expected.sort();
    assert_eq!(everything, expected);
}

async fn text_fields_are_trimmed_like_the_reference(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    let upload = gateway
        .upload_function(
            "alice",
            &[
                ("title", "  fn \n"),
                ("entrypoint", " main.py "),
                ("description", "  a function\n"),
                ("version", " 1.0 "),
            ],
        )
        .await;
    assert_eq!(upload.status, 200, "{}", upload.json);
    assert_eq!(
        (&upload.json["title"], &upload.json["entrypoint"], &upload.json["description"], &upload.json["version"]),
        (&json!("fn"), &json!("main.py"), &json!("a function"), &json!("1.0"))
    );
    let id = run(&gateway, "alice", " fn ", "  {}\n").await.json["id"].as_str().unwrap().to_string();
    // A job's send_error with a message built by traceback.format_exception_only.
    let sent = gateway
        .post_json(
            &format!("/api/v1/jobs/{id}/event/"),
            "alice",
            json!({"type": " error ", "code": " 1 ", "message": "ValueError: bad value\n", "exception": "ValueError\n", "args": {"k": " v "}}),
        )
        .await;
    assert_eq!(sent.status, 200, "{}", sent.json);
    let events = gateway.get(&format!("/api/v1/jobs/{id}/events/?type=ERROR"), "alice").await.json;
    assert_eq!(
        events[0]["data"],
        json!({"code": "1", "message": "ValueError: bad value", "exception": "ValueError", "args": {"k": " v "}}),
        "text fields trimmed, JSON args kept as sent"
    );
    let added =
        gateway.post_json(&format!("/api/v1/jobs/{id}/runtime_jobs/"), "alice", json!({"runtime_job": " rj \n"})).await;
    assert_eq!(added.message(), format!("RuntimeJob object [rj] created for serverless job id [{id}]."));
    let patched = gateway
        .call(
            "PATCH",
            &format!("/api/v1/jobs/{id}/sub_status/"),
            Some("alice"),
            Some("application/x-www-form-urlencoded"),
            "sub_status=+MAPPING%0A".into(),
        )
        .await;
    assert_eq!((patched.status.as_u16(), &patched.json["job"]["sub_status"]), (200, &json!("MAPPING")));
}

async fn run(gateway: &Gateway, token: &str, title: &str, arguments: &str) -> crate::harness::Reply {
    gateway
        .post_json(
            "/api/v1/programs/run/",
            token,
            json!({"title": title, "arguments": arguments, "config": {"workers": null, "auto_scaling": false}}),
        )
        .await
}

/// A plain job of `author` for `program` with id `id`, as `run` writes it.
pub(crate) fn queued_job(program: &str, author: &str, id: String) -> gantry::db::jobs::NewJob {
    gantry::db::jobs::NewJob {
        id,
        program_id: program.to_string(),
        provider_id: None,
        author_id: author.to_string(),
        arguments: "{}".into(),
        config: "{}".into(),
        env_vars: "{}".into(),
        runner: "local".into(),
        gpu: false,
        function_size: None,
        trial: false,
        business_model: "SUBSIDIZED".into(),
        traceparent: None,
        instance: None,
        backfill: false,
        gpu_model: None,
    }
}

async fn job_rows(gateway: &Gateway) -> i64 {
    let (count, _) = gantry::db::jobs::list(&gateway.state.db, &Default::default(), Some(1), 0).await.unwrap();
    count
}

async fn run_queues_a_job_with_its_first_event(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway
        .upload_function(
            "alice",
            &[
                ("title", "fn"),
                ("entrypoint", "main.py"),
                ("sizes", r#"{"S": null, "L": null}"#),
                ("default_size", "S"),
            ],
        )
        .await;
    let reply = run(&gateway, "alice", "fn", r#"{"x": [1, 2]}"#).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(reply.json["status"], "QUEUED");
    let id = reply.json["id"].as_str().unwrap().to_string();
    let job = gateway.get(&format!("/api/v1/jobs/{id}/"), "alice").await;
    assert_eq!(job.json["status"], "QUEUED");
    assert_eq!(job.json["program"]["title"], "fn");
    assert_eq!(job.json["function_size"], "S");
    assert_eq!(job.json["result"], Value::Null);
    let events = gateway.get(&format!("/api/v1/jobs/{id}/events/"), "alice").await.json;
    assert_eq!(events.as_array().unwrap().len(), 1);
    assert_eq!(events[0]["event_type"], "STATUS_CHANGE");
    assert_eq!(events[0]["origin"], "API");
    assert_eq!(events[0]["context"], "RUN_PROGRAM");
    assert_eq!(events[0]["data"], json!({"status": "QUEUED"}));
    // The caller's token is kept sealed with the job, never in plain text.
    let stored = gantry::db::jobs::launch(&gateway.state.db, &id).await.unwrap().unwrap().info.env_vars;
    assert!(stored.contains("enc:v1:") && !stored.contains("alice"), "{stored}");
    // The size can be chosen from the catalog, in any case.
    let sized = gateway
        .post_json("/api/v1/programs/run/", "alice", json!({"title": "fn", "arguments": "{}", "function_size": "l"}))
        .await;
    assert_eq!(sized.status, 200);
    let sized_job = gateway.get(&format!("/api/v1/jobs/{}/", sized.json["id"].as_str().unwrap()), "alice").await;
    assert_eq!(sized_job.json["function_size"], "L");
}

async fn rejected_runs_leave_nothing_behind(backend: Backend) {
    let gateway = Gateway::start_with(backend, |config| config.active_jobs_per_user = 1).await;
    let schema = json!({"type": "object", "required": ["n"]}).to_string();
    gateway
        .upload_function(
            "alice",
            &[("title", "fn"), ("entrypoint", "main.py"), ("arguments_schema", &schema), ("sizes", r#"{"S": null}"#)],
        )
        .await;
    let cases = [
        (json!({"title": "fn", "arguments": "{}"}), 400, "'required' validation failed"),
        (json!({"title": "fn", "arguments": "{\"n\": 1}", "compute_profile": "cx3d-4x16"}), 400, "function_size"),
        (
            json!({"title": "fn", "arguments": "{\"n\": 1}", "function_size": "XL"}),
            400,
            "not in the sizes of function fn",
        ),
        (json!({"title": "fn", "arguments": "{\"n\": 1}", "function_size": "huge"}), 400, "Invalid function size"),
        (json!({"title": "nope", "arguments": "{}"}), 404, "Qiskit Function nope doesn't exist."),
        (json!({"title": "fn"}), 400, "This field is required. ('arguments')"),
        (json!({"title": "fn", "arguments": "{\"n\": 1}", "config": 5}), 400, "'config' must be a JSON object."),
    ];
    for (body, status, message) in cases {
        let reply = gateway.post_json("/api/v1/programs/run/", "alice", body.clone()).await;
        assert_eq!(reply.status.as_u16(), status, "{body}: {}", reply.json);
        assert!(reply.message().contains(message), "{body}: {}", reply.message());
        assert_eq!(job_rows(&gateway).await, 0, "{body} left a job");
    }
    assert_eq!(run(&gateway, "bob", "fn", "{\"n\": 1}").await.status, 404);
    assert_eq!(run(&gateway, "alice", "fn", "{\"n\": 1}").await.status, 200);
    let limited = run(&gateway, "alice", "fn", "{\"n\": 1}").await;
    assert_eq!(limited.status, 429);
    assert_eq!(limited.message(), "Active job limit reached. The maximum allowed is 1.");
    assert_eq!(job_rows(&gateway).await, 1);
    let events: i64 = match &gateway.state.db {
        gantry::db::Db::Sqlite(pool, _) => {
            sqlx::query_scalar("SELECT COUNT(*) FROM job_events").fetch_one(pool).await.unwrap()
        }
        gantry::db::Db::Postgres(pool) => {
            sqlx::query_scalar("SELECT COUNT(*) FROM job_events").fetch_one(pool).await.unwrap()
        }
    };
    assert_eq!(events, 1);
}

async fn active_job_limit_holds_under_concurrency(backend: Backend) {
    let gateway = Gateway::start_with(backend, |config| config.active_jobs_per_user = 50).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    let gateway = std::sync::Arc::new(gateway);
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let gateway = gateway.clone();
        tasks.push(tokio::spawn(async move { run(&gateway, "alice", "fn", "{}").await.status.as_u16() }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 50, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 50, "{statuses:?}");
    assert_eq!(job_rows(&gateway).await, 50);
    // Another user is not affected.
    gateway.upload_function("bob", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    assert_eq!(run(&gateway, "bob", "fn", "{}").await.status, 200);
}

/// Runs of one user race with status moves of that user's jobs (what an admission pass does):
/// both write the same kept-count rows, and neither may deadlock or lose a count.
async fn runs_and_status_moves_at_once_never_deadlock(backend: Backend) {
    use gantry::domain::lifecycle::{JobStatus, Move, Origin};
    let gateway = Gateway::start_with(backend, |config| config.active_jobs_per_user = 1000).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    let gateway = std::sync::Arc::new(gateway);
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel::<String>();
    let mut runs = Vec::new();
    for _ in 0..8 {
        let (gateway, sender) = (gateway.clone(), sender.clone());
        runs.push(tokio::spawn(async move {
            for _ in 0..10 {
                let reply = run(&gateway, "alice", "fn", "{}").await;
                assert_eq!(reply.status, 200, "{}", reply.json);
                sender.send(reply.json["id"].as_str().unwrap().to_string()).unwrap();
            }
        }));
    }
    drop(sender);
    let mover = {
        let gateway = gateway.clone();
        tokio::spawn(async move {
            let db = &gateway.state.db;
            let mv = Move {
                from: JobStatus::Queued,
                to: JobStatus::Pending,
                origin: Origin::Scheduler,
                context: "MOVE",
                data: serde_json::json!({}),
            };
            let mut moved = 0;
            while let Some(id) = receiver.recv().await {
                moved += gantry::db::jobs::apply_moves(db, &[id], &mv, false).await.expect("a move").len();
            }
            moved
        })
    };
    for task in runs {
        tokio::time::timeout(std::time::Duration::from_secs(60), task).await.expect("runs finish").unwrap();
    }
    let moved = tokio::time::timeout(std::time::Duration::from_secs(60), mover).await.expect("moves finish").unwrap();
    assert_eq!(moved, 80);
    let count = |status: &'static str| {
        let gateway = gateway.clone();
        async move {
            let filter = gantry::db::jobs::JobFilter { status: Some(status.into()), ..Default::default() };
            gantry::db::jobs::list(&gateway.state.db, &filter, Some(1), 0).await.unwrap().0
        }
    };
    assert_eq!((count("QUEUED").await, count("PENDING").await), (0, 80));
}

async fn listings_filter_paginate_and_order(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.provider("acme", None, "erin").await;
    gateway.upload_function("erin", &[("title", "acme/tool"), ("entrypoint", "main.py")]).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    gateway.upload_function("alice", &[("title", "other"), ("entrypoint", "main.py")]).await;
    gateway.admin(gantry::admin::AdminCommand::AddMember { group: "g".into(), user: "alice".into() }).await;
    gateway
        .admin(gantry::admin::AdminCommand::Grant {
            provider: "acme".into(),
            function: "tool".into(),
            group: "g".into(),
            view: true,
            run: true,
        })
        .await;
    let mut ids = Vec::new();
    for title in ["fn", "fn", "other"] {
        ids.push(run(&gateway, "alice", title, "{}").await.json["id"].as_str().unwrap().to_string());
    }
    let provider_job = gateway
        .post_json("/api/v1/programs/run/", "alice", json!({"title": "tool", "provider": "acme", "arguments": "{}"}))
        .await;
    assert_eq!(provider_job.status, 200, "{}", provider_job.json);
    ids.push(provider_job.json["id"].as_str().unwrap().to_string());
    run(&gateway, "bob", "fn", "{}").await;

    let all = gateway.get("/api/v1/jobs/", "alice").await.json;
    assert_eq!(all["count"], 4);
    let listed: Vec<&str> = all["results"].as_array().unwrap().iter().map(|j| j["id"].as_str().unwrap()).collect();
    let newest_first: Vec<&str> = ids.iter().rev().map(String::as_str).collect();
    assert_eq!(listed, newest_first);
    assert!(all["results"][0].get("result").is_none());

    let count = |query: &str| {
        let gateway = &gateway;
        let query = query.to_string();
        async move { gateway.get(&format!("/api/v1/jobs/?{query}"), "alice").await.json["count"].as_i64().unwrap() }
    };
    assert_eq!(count("function=fn").await, 2);
    assert_eq!(count("function=tool&provider=acme").await, 1);
    assert_eq!(count("filter=catalog").await, 1);
    assert_eq!(count("filter=serverless").await, 3);
    assert_eq!(count("status=QUEUED").await, 4);
    assert_eq!(count("status=SUCCEEDED").await, 0);
    assert_eq!(count("status=QUEUED&filter=serverless&function=other").await, 1);
    assert_eq!(count("created_after=2000-01-01").await, 4);
    assert_eq!(count("created_after=2999-01-01T00:00:00Z").await, 0);
    // Within today: the kept per-day counts and the rows of the first day add up.
    let at = |offset: chrono::Duration| (chrono::Utc::now() + offset).format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
    assert_eq!(count(&format!("created_after={}", at(chrono::Duration::hours(-1)))).await, 4);
    assert_eq!(
        count(&format!("created_after={}&status=QUEUED&function=fn", at(chrono::Duration::hours(-30)))).await,
        2
    );
    assert_eq!(count(&format!("created_after={}", at(chrono::Duration::minutes(10)))).await, 0);
    let last =
        gateway.get("/api/v1/jobs/?limit=1", "alice").await.json["results"][0]["created"].as_str().unwrap().to_string();
    assert_eq!(count(&format!("created_after={last}")).await, 1, "created_after is inclusive");
    assert_eq!(count("provider=nope").await, 0);

    let page = gateway.get("/api/v1/jobs?limit=2&offset=0&status=QUEUED", "alice").await.json;
    assert_eq!(page["results"].as_array().unwrap().len(), 2);
    assert!(page["next"].as_str().unwrap().ends_with("/api/v1/jobs/?limit=2&offset=2"), "{}", page["next"]);
    assert_eq!(page["previous"], Value::Null);
    let last = gateway.get("/api/v1/jobs/?limit=2&offset=2", "alice").await.json;
    assert_eq!(last["next"], Value::Null);
    assert!(last["previous"].as_str().unwrap().ends_with("/api/v1/jobs/?limit=2&offset=0"));
    assert_eq!(gateway.get("/api/v1/jobs/", "alice").await.json["results"].as_array().unwrap().len(), 4);
    // A page past the end still carries the count (read in the same statement as the page).
    let past = gateway.get("/api/v1/jobs/?limit=2&offset=10&status=QUEUED", "alice").await.json;
    assert_eq!((past["count"].as_i64(), past["results"].as_array().map(Vec::len)), (Some(4), Some(0)), "{past}");
    assert!(past["previous"].as_str().unwrap().ends_with("/api/v1/jobs/?limit=2&offset=8"), "{past}");
    let none = gateway.get("/api/v1/jobs/?status=SUCCEEDED&limit=0", "alice").await.json;
    assert_eq!((none["count"].as_i64(), none["results"].as_array().map(Vec::len)), (Some(0), Some(0)), "{none}");

    for (query, message) in
        [("filter=nope", "not a valid choice"), ("created_after=yesterday", "'created_after'"), ("limit=-1", "'limit'")]
    {
        let reply = gateway.get(&format!("/api/v1/jobs/?{query}"), "alice").await;
        assert_eq!(reply.status, 400, "{query}");
        assert!(reply.message().contains(message), "{query}: {}", reply.message());
    }
    // `status` is free text, as the reference takes it: a name in any case selects its jobs, a
    // value no job has (qiskit-ibm-catalog's CANCELLED, a typo) gives an empty page, never a 400.
    assert_eq!(count("status=queued").await, 4);
    for unknown in ["CANCELLED", "DONE", "%27%3B%20DROP%20TABLE%20jobs%3B--"] {
        for path in ["/api/v1/jobs/", "/api/v1/jobs/provider/"] {
            let query = if path.ends_with("provider/") { "provider=acme&" } else { "" };
            let who = if query.is_empty() { "alice" } else { "erin" };
            let reply = gateway.get(&format!("{path}?{query}status={unknown}"), who).await;
            assert_eq!(reply.status, 200, "{path} {unknown}: {}", reply.json);
            assert_eq!(
                (reply.json["count"].as_i64(), reply.json["results"].as_array().map(Vec::len)),
                (Some(0), Some(0))
            );
        }
    }
    let missing = gateway.get("/api/v1/jobs/?function=missing", "alice").await;
    assert_eq!((missing.status.as_u16(), missing.message()), (404, "Qiskit Function missing doesn't exist.".into()));

    // programs/{id}/get_jobs/: own jobs for a user, every author's (no result) for the provider side.
    let program_id = gateway.get("/api/v1/programs/get_by_title/tool?provider=acme", "erin").await.json["id"]
        .as_str()
        .unwrap()
        .to_string();
    let erins = gateway
        .post_json("/api/v1/programs/run/", "erin", json!({"title": "tool", "provider": "acme", "arguments": "{}"}))
        .await;
    assert_eq!(erins.status, 200, "{}", erins.json);
    let for_admin = gateway.get(&format!("/api/v1/programs/{program_id}/get_jobs/"), "erin").await.json;
    assert_eq!(for_admin.as_array().unwrap().len(), 2, "{for_admin}");
    assert_eq!(for_admin[0]["id"], erins.json["id"], "newest first: {for_admin}");
    assert!(for_admin.as_array().unwrap().iter().all(|job| job.get("result").is_none()), "{for_admin}");
    let for_alice = gateway.get(&format!("/api/v1/programs/{program_id}/get_jobs/"), "alice").await.json;
    assert_eq!(for_alice.as_array().unwrap().len(), 1, "only her own: {for_alice}");
    assert_ne!(for_alice[0]["id"], erins.json["id"]);
    assert!(for_alice[0].get("result").is_some());
    assert_eq!(gateway.get(&format!("/api/v1/programs/{program_id}/get_jobs/"), "bob").await.json, json!([]));
}

async fn job_endpoints_are_author_only(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    let id = run(&gateway, "alice", "fn", "{}").await.json["id"].as_str().unwrap().to_string();
    let missing = "00000000-0000-0000-0000-000000000000";
    for job in [id.as_str(), missing, "not-a-uuid"] {
        let expected = format!("Job [{job}] not found");
        for (method, path) in [
            ("GET", format!("/api/v1/jobs/{job}/")),
            ("GET", format!("/api/v1/jobs/{job}/result/")),
            ("GET", format!("/api/v1/jobs/{job}/events/")),
            ("GET", format!("/api/v1/jobs/{job}/runtime_jobs/")),
            ("POST", format!("/api/v1/jobs/{job}/stop/")),
            ("POST", format!("/api/v1/jobs/{job}/event/")),
            ("POST", format!("/api/v1/jobs/{job}/runtime_jobs/")),
        ] {
            let reply = match method {
                "GET" => gateway.get(&path, "bob").await,
                _ => gateway.post_json(&path, "bob", json!({"type": "ERROR", "code": "1", "message": "m", "exception": "E", "runtime_job": "r", "service": "null"})).await,
            };
            assert_eq!(reply.status, 404, "{method} {path}");
            assert_eq!(reply.message(), expected, "{method} {path}");
        }
        let patch = gateway
            .call(
                "PATCH",
                &format!("/api/v1/jobs/{job}/sub_status/"),
                Some("bob"),
                Some("application/x-www-form-urlencoded"),
                "sub_status=MAPPING".into(),
            )
            .await;
        assert_eq!(patch.status, 404);
    }
    // Logs: an existing job of someone else is 403, an unknown one 404.
    let logs = gateway.get(&format!("/api/v1/jobs/{id}/logs/"), "bob").await;
    assert_eq!(
        (logs.status.as_u16(), logs.message()),
        (403, format!("You don't have access to read user logs of the job [{id}]"))
    );
    assert_eq!(gateway.get(&format!("/api/v1/jobs/{missing}/logs/"), "bob").await.status, 404);
    let provider_logs = gateway.get(&format!("/api/v1/jobs/{id}/provider-logs/"), "alice").await;
    assert_eq!(provider_logs.status, 403, "user functions have no provider logs");
    // The job is unchanged by all of that.
    assert_eq!(gateway.get(&format!("/api/v1/jobs/{id}/"), "alice").await.json["status"], "QUEUED");
}

async fn sub_status_events_and_runtime_jobs(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    let id = run(&gateway, "alice", "fn", "{}").await.json["id"].as_str().unwrap().to_string();
    let patch = |value: &'static str| {
        let gateway = &gateway;
        let path = format!("/api/v1/jobs/{id}/sub_status/");
        async move {
            gateway
                .call(
                    "PATCH",
                    &path,
                    Some("alice"),
                    Some("application/x-www-form-urlencoded"),
                    format!("sub_status={value}").into(),
                )
                .await
        }
    };
    let reply = patch("EXECUTING_QPU").await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(reply.json["job"]["sub_status"], "EXECUTING_QPU");
    patch("EXECUTING_QPU").await;
    let bad = patch("DANCING").await;
    assert_eq!((bad.status.as_u16(), bad.message()), (400, "'sub_status' not provided or is not valid".into()));

    let error = gateway
        .post_json(&format!("/api/v1/jobs/{id}/event/"), "alice", json!({"type": "error", "code": 1112, "message": "went wrong", "exception": "CustomError", "args": {"ultimate": 42}}))
        .await;
    assert_eq!(error.status, 200, "{}", error.json);
    let wrong = gateway
        .post_json(
            &format!("/api/v1/jobs/{id}/event/"),
            "alice",
            json!({"type": "INFO", "code": "1", "message": "m", "exception": "E"}),
        )
        .await;
    assert_eq!((wrong.status.as_u16(), wrong.message()), (400, "Type is not valid. Valid types: ['ERROR']".into()));
    let incomplete =
        gateway.post_json(&format!("/api/v1/jobs/{id}/event/"), "alice", json!({"type": "ERROR", "code": "1"})).await;
    assert_eq!(incomplete.status, 400);

    let events = gateway.get(&format!("/api/v1/jobs/{id}/events/"), "alice").await.json;
    let kinds: Vec<&str> = events.as_array().unwrap().iter().map(|e| e["event_type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["ERROR", "SUB_STATUS_CHANGE", "STATUS_CHANGE"],
        "one sub-status event for one change, newest first"
    );
    for event in events.as_array().unwrap() {
        for key in ["event_type", "origin", "context", "created", "data"] {
            assert!(event.get(key).is_some(), "{key} missing in {event}");
        }
    }
    let errors = gateway.get(&format!("/api/v1/jobs/{id}/events/?type=error"), "alice").await.json;
    assert_eq!(errors.as_array().unwrap().len(), 1);
    assert_eq!(
        errors[0]["data"],
        json!({"code": "1112", "message": "went wrong", "exception": "CustomError", "args": {"ultimate": 42}})
    );
    assert_eq!(gateway.get(&format!("/api/v1/jobs/{id}/events/?type=INFO"), "alice").await.status, 400);

    assert_eq!(
        gateway.get(&format!("/api/v1/jobs/{id}/runtime_jobs/"), "alice").await.json,
        json!({"runtime_jobs": []})
    );
    let added = gateway
        .post_json(
            &format!("/api/v1/jobs/{id}/runtime_jobs/"),
            "alice",
            json!({"runtime_job": "rj1", "runtime_session": "s1"}),
        )
        .await;
    assert_eq!(added.status, 200);
    assert!(added.message().contains("rj1"));
    gateway.post_json(&format!("/api/v1/jobs/{id}/runtime_jobs/"), "alice", json!({"runtime_job": "rj2"})).await;
    assert_eq!(
        gateway.get(&format!("/api/v1/jobs/{id}/runtime_jobs/"), "alice").await.json,
        json!({"runtime_jobs": [{"runtime_job": "rj1", "runtime_session": "s1"}, {"runtime_job": "rj2", "runtime_session": null}]})
    );
    // As the reference: a duplicate is reported in a 200 answer, and nothing changes.
    let duplicate =
        gateway.post_json(&format!("/api/v1/jobs/{id}/runtime_jobs/"), "alice", json!({"runtime_job": "rj1"})).await;
    assert_eq!(duplicate.status, 200);
    assert!(
        duplicate
            .message()
            .starts_with(&format!("Failed to create RuntimeJob object [rj1] for job id [{id}]. Error: ")),
        "{}",
        duplicate.message()
    );
    assert_eq!(
        gateway.get(&format!("/api/v1/jobs/{id}/runtime_jobs/"), "alice").await.json["runtime_jobs"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // After the job ended: no sub-status, no error events.
    let stopped = gateway.post_json(&format!("/api/v1/jobs/{id}/stop/"), "alice", json!({"service": "null"})).await;
    assert_eq!(stopped.status, 200);
    let late = patch("MAPPING").await;
    assert_eq!(
        (late.status.as_u16(), late.message()),
        (403, "Cannot update 'sub_status' when is not in active status. (Currently STOPPED)".into())
    );
    let late_event = gateway
        .post_json(
            &format!("/api/v1/jobs/{id}/event/"),
            "alice",
            json!({"type": "ERROR", "code": "1", "message": "m", "exception": "E"}),
        )
        .await;
    assert_eq!(
        (late_event.status.as_u16(), late_event.message()),
        (403, "You can create events on active jobs only".into())
    );
    // Terminal moves clear the sub-status.
    assert_eq!(gateway.get(&format!("/api/v1/jobs/{id}/"), "alice").await.json["sub_status"], Value::Null);
}

async fn results_and_logs_read_order(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    let id = run(&gateway, "alice", "fn", "{}").await.json["id"].as_str().unwrap().to_string();
    let empty = gateway.get(&format!("/api/v1/jobs/{id}/result/"), "alice").await;
    assert_eq!(empty.status, 204);
    assert_eq!(gateway.get(&format!("/api/v1/jobs/{id}/logs/"), "alice").await.json, json!({"logs": "No logs yet."}));
    // The legacy save (older in-job clients), then the result as the client reads it: a string.
    let saved =
        gateway.post_form(&format!("/api/v1/jobs/{id}/result/"), "alice", &[("result", r#"{"ultimate": 42}"#)]).await;
    assert_eq!(saved.status, 200, "{}", saved.json);
    assert_eq!(
        gateway.get(&format!("/api/v1/jobs/{id}/result/"), "alice").await.json,
        json!({"result": "{\"ultimate\": 42}"})
    );
    assert_eq!(gateway.get(&format!("/api/v1/jobs/{id}/"), "alice").await.json["result"], "{\"ultimate\": 42}");
    assert!(gateway.get(&format!("/api/v1/jobs/{id}/?with_result=false"), "alice").await.json.get("result").is_none());
    assert_eq!(gateway.get(&format!("/api/v1/jobs/{id}/?with_result=maybe"), "alice").await.status, 400);
    // An archived log wins.
    gateway
        .state
        .storage
        .put_bytes(&gantry::storage::keys::job_user_log(&id), "line 1\nline 2\n".into())
        .await
        .unwrap();
    assert_eq!(
        gateway.get(&format!("/api/v1/jobs/{id}/logs/"), "alice").await.json,
        json!({"logs": "line 1\nline 2\n"})
    );
}

async fn stop_requests(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    let id = run(&gateway, "alice", "fn", "{}").await.json["id"].as_str().unwrap().to_string();
    let stop = gateway
        .post_json(
            &format!("/api/v1/jobs/{id}/stop/"),
            "alice",
            json!({"service": "{\"__type__\": \"QiskitRuntimeService\", \"__value__\": {\"token\": \"secret\"}}"}),
        )
        .await;
    assert_eq!(stop.status, 200, "{}", stop.json);
    assert!(stop.message().contains("Stop requested"), "{}", stop.message());
    let job = gateway.get(&format!("/api/v1/jobs/{id}/"), "alice").await.json;
    assert_eq!(job["status"], "STOPPED");
    let events = gateway.get(&format!("/api/v1/jobs/{id}/events/"), "alice").await.json;
    assert_eq!(events[0]["context"], "STOP_JOB");
    assert_eq!(events[0]["data"]["status"], "STOPPED");
    let again = gateway.post_json(&format!("/api/v1/jobs/{id}/stop/"), "alice", json!({})).await;
    assert_eq!(again.status, 200);
    assert!(again.message().contains("had already finished (STOPPED)"), "{}", again.message());
    assert_eq!(gateway.get(&format!("/api/v1/jobs/{id}/events/"), "alice").await.json.as_array().unwrap().len(), 2);
    // Stopped jobs no longer count towards the active limit.
    assert_eq!(gateway.get("/api/v1/jobs/?status=STOPPED", "alice").await.json["count"], 1);
}

async fn provider_job_listing_and_logs(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.provider("acme", None, "erin").await;
    gateway.admin(gantry::admin::AdminCommand::AddAdmin { provider: "acme".into(), user: "paul".into() }).await;
    gateway.upload_function("paul", &[("title", "acme/tool"), ("entrypoint", "main.py")]).await;
    gateway.admin(gantry::admin::AdminCommand::RemoveAdmin { provider: "acme".into(), user: "paul".into() }).await;
    gateway.upload_function("erin", &[("title", "acme/other"), ("entrypoint", "main.py")]).await;
    gateway.admin(gantry::admin::AdminCommand::AddMember { group: "users".into(), user: "alice".into() }).await;
    for function in ["tool", "other"] {
        gateway.grant_run("acme", function, "users").await;
    }
    let tool_job = gateway
        .post_json("/api/v1/programs/run/", "alice", json!({"title": "tool", "provider": "acme", "arguments": "{}"}))
        .await
        .json["id"]
        .as_str()
        .unwrap()
        .to_string();
    gateway
        .post_json("/api/v1/programs/run/", "alice", json!({"title": "other", "provider": "acme", "arguments": "{}"}))
        .await;

    let list = |token: &'static str, query: &'static str| {
        let gateway = &gateway;
        async move {
            let reply = gateway.get(&format!("/api/v1/jobs/provider/?{query}"), token).await;
            (reply.status.as_u16(), reply.json["count"].as_i64().unwrap_or(-1), reply.message())
        }
    };
    assert_eq!(list("erin", "provider=acme").await.1, 2);
    assert_eq!(list("erin", "provider=acme&function=tool").await.1, 1);
    // The count sums each of the provider's functions' kept counts: another provider's jobs are
    // not in it, the status and creation filters narrow it.
    gateway.provider("beta", None, "bob").await;
    gateway.upload_function("bob", &[("title", "beta/x"), ("entrypoint", "main.py")]).await;
    let beta = gateway
        .post_json("/api/v1/programs/run/", "bob", json!({"title": "x", "provider": "beta", "arguments": "{}"}))
        .await;
    assert_eq!(beta.status, 200, "{}", beta.json);
    assert_eq!(list("bob", "provider=beta").await.1, 1);
    assert_eq!(list("erin", "provider=acme").await.1, 2);
    assert_eq!(list("erin", "provider=acme&status=QUEUED&created_after=2000-01-01T00:00:00Z").await.1, 2);
    assert_eq!(list("erin", "provider=acme&status=SUCCEEDED").await.1, 0);
    assert_eq!(list("erin", "provider=acme&function=tool&created_after=2999-01-01T00:00:00Z").await.1, 0);
    assert_eq!(list("paul", "provider=acme").await.1, 1, "the author sees the jobs of the function he wrote");
    assert_eq!(list("paul", "provider=acme&function=other").await, (404, -1, "Provider acme doesn't exist.".into()));
    assert_eq!(list("alice", "provider=acme").await, (404, -1, "Provider acme doesn't exist.".into()));
    assert_eq!(list("erin", "provider=nope").await, (404, -1, "Provider nope doesn't exist.".into()));
    assert_eq!(
        list("erin", "provider=acme&function=missing").await,
        (404, -1, "Qiskit Function acme/missing doesn't exist.".into())
    );
    assert_eq!(list("erin", "").await, (400, -1, "'provider' not provided or is not valid".into()));
    let page = gateway.get("/api/v1/jobs/provider/?provider=acme&limit=1&offset=1", "erin").await.json;
    assert_eq!(page["next"], Value::Null);
    assert!(page["previous"].as_str().unwrap().ends_with("/api/v1/jobs/provider/?limit=1&offset=0"));
    assert!(page["results"][0].get("result").is_none());

    // Retrieval: the provider side sees status but never the result.
    gateway.post_form(&format!("/api/v1/jobs/{tool_job}/result/"), "alice", &[("result", "{\"secret\": 1}")]).await;
    let as_admin = gateway.get(&format!("/api/v1/jobs/{tool_job}/"), "erin").await.json;
    assert_eq!(as_admin["status"], "QUEUED");
    assert_eq!(as_admin["result"], Value::Null);
    assert_eq!(gateway.get(&format!("/api/v1/jobs/{tool_job}/"), "alice").await.json["result"], "{\"secret\": 1}");
    assert_eq!(gateway.get(&format!("/api/v1/jobs/{tool_job}/result/"), "erin").await.status, 404);

    // Logs matrix: user logs for the author only, provider logs for the provider side only.
    let status = |path: String, token: &'static str| {
        let gateway = &gateway;
        async move { gateway.get(&path, token).await.status.as_u16() }
    };
    let logs = format!("/api/v1/jobs/{tool_job}/logs/");
    let provider_logs = format!("/api/v1/jobs/{tool_job}/provider-logs/");
    assert_eq!(
        [status(logs.clone(), "alice").await, status(logs.clone(), "erin").await, status(logs, "paul").await],
        [200, 403, 403]
    );
    assert_eq!(
        [
            status(provider_logs.clone(), "alice").await,
            status(provider_logs.clone(), "erin").await,
            status(provider_logs, "paul").await
        ],
        [403, 200, 200]
    );

    // The provider's count, whole or by status, comes from its own kept rows (migration 0021):
    // a stop moves one job there, a recount finds nothing to change.
    let stopped = gateway.post_json(&format!("/api/v1/jobs/{tool_job}/stop/"), "alice", json!({})).await;
    assert_eq!(stopped.status, 200, "{}", stopped.json);
    assert_eq!(list("erin", "provider=acme").await.1, 2);
    assert_eq!(list("erin", "provider=acme&status=QUEUED").await.1, 1);
    assert_eq!(list("erin", "provider=acme&status=STOPPED").await.1, 1);
    assert_eq!(list("bob", "provider=beta&status=QUEUED").await.1, 1);
    let recounted = gantry::db::counts::recount(&gateway.state.db).await.unwrap();
    assert_eq!(recounted.before, recounted.after, "{recounted}");
    assert_eq!(recounted.after.2, 3, "{recounted}");
}

async fn a_cancelled_run_never_leaves_a_transaction_open(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    let program = gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await.json["id"]
        .as_str()
        .unwrap()
        .to_string();
    let author = gantry::db::users::find_by_username(&gateway.state.db, "alice").await.unwrap().unwrap().id;
    let new_job = || queued_job(&program, &author, gantry::db::new_id());
    // Clients that disconnect cancel their requests at any point, also inside the transaction,
    // while others keep the pool busy.
    for round in 0..20u64 {
        let mut attempts = Vec::new();
        for i in 0..16u64 {
            let (db, job) = (gateway.state.db.clone(), new_job());
            attempts.push(tokio::spawn(async move {
                let cancel_after = std::time::Duration::from_micros((round * 16 + i) * 37 % 4000);
                let _ =
                    tokio::time::timeout(cancel_after, gantry::db::jobs::insert_with_limit(&db, &job, 100_000, false))
                        .await;
            }));
        }
        for attempt in attempts {
            attempt.await.unwrap();
        }
        let next = new_job();
        let done = tokio::time::timeout(
            std::time::Duration::from_secs(3),
            gantry::db::jobs::insert_with_limit(&gateway.state.db, &next, 100_000, false),
        )
        .await;
        assert!(matches!(done, Ok(Ok(Some(_)))), "a run after cancelled ones (round {round}): {done:?}");
    }
}

/// Runs that wait for the writer together (on SQLite, the write lock is held while they queue,
/// so they are committed by one group commit): each gets its own answer, refused by the active
/// job limit, failed (an id already taken) or written, and the kept counts match the rows.
async fn runs_waiting_together_each_get_their_own_answer(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    let db = gateway.state.db.clone();
    let mut programs = Vec::new();
    for user in ["alice", "bob"] {
        let program = gateway.upload_function(user, &[("title", "fn"), ("entrypoint", "main.py")]).await.json["id"]
            .as_str()
            .unwrap()
            .to_string();
        let author = gantry::db::users::find_by_username(&db, user).await.unwrap().unwrap().id;
        programs.push((program, author));
    }
    let new_job = |(program, author): &(String, String), id: String| queued_job(program, author, id);
    let taken = gantry::db::new_id();
    gantry::db::jobs::insert_with_limit(&db, &new_job(&programs[1], taken.clone()), 10, true).await.unwrap().unwrap();
    // Queued while the writer is held, so that they wait together.
    let together = |jobs: Vec<(gantry::db::jobs::NewJob, i64)>| {
        let db = db.clone();
        async move {
            let held = db.write_lock().await;
            let mut runs = Vec::new();
            for (job, limit) in jobs {
                let db = db.clone();
                runs.push(tokio::spawn(
                    async move { gantry::db::jobs::insert_with_limit(&db, &job, limit, true).await },
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            drop(held);
            let mut outcomes = Vec::new();
            for run in runs {
                outcomes.push(run.await.unwrap());
            }
            outcomes
        }
    };
    // Six runs of alice under a limit of three (the later ones count those queued before them
    // in the same batch), two of bob.
    let outcomes = together(
        (0..6)
            .map(|_| (new_job(&programs[0], gantry::db::new_id()), 3))
            .chain((0..2).map(|_| (new_job(&programs[1], gantry::db::new_id()), 10)))
            .collect(),
    )
    .await;
    let written = |outcomes: &[Result<Option<i64>, gantry::db::Error>]| {
        outcomes.iter().filter(|o| matches!(o, Ok(Some(_)))).count()
    };
    assert_eq!(written(&outcomes[..6]), 3, "{outcomes:?}");
    assert_eq!(outcomes[..6].iter().filter(|o| matches!(o, Ok(None))).count(), 3, "{outcomes:?}");
    assert_eq!(written(&outcomes[6..]), 2, "{outcomes:?}");
    // A run with an id already taken fails alone; the runs beside it stand.
    let outcomes = together(vec![
        (new_job(&programs[1], gantry::db::new_id()), 10),
        (new_job(&programs[1], taken), 10),
        (new_job(&programs[1], gantry::db::new_id()), 10),
    ])
    .await;
    let failure = outcomes[1].as_ref().expect_err("a run with a taken id fails");
    assert!(failure.unique_violation().is_some(), "{failure:?}");
    assert_eq!(written(&outcomes), 2, "{outcomes:?}");
    // One row, one first event and one outbox event per written job; the kept counts exact.
    assert_eq!(job_rows(&gateway).await, 8);
    let recounted = gantry::db::counts::recount(&db).await.unwrap();
    assert_eq!(recounted.before, recounted.after);
    assert_eq!(recounted.after.4, 8, "eight queued jobs");
    let (waiting, _, _) = gantry::db::outbox::counts(&db).await.unwrap();
    assert_eq!(waiting, 8);
}
