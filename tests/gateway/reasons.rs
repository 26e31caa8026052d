//! Why a job ended, in the job's answer: `status_reason` carries the reason of the terminal
//! status move (absent for a success and while the job runs), in `jobs/{id}/` and the listings,
//! written by both ways a move is stored (one job on PostgreSQL without outbox is one statement;
//! batches and SQLite take the other).

use gantry::domain::lifecycle::{JobStatus, Trigger, decide};
use serde_json::{Value, json};

use crate::both_backends;
use crate::harness::{Backend, Gateway};

both_backends!(an_ended_job_says_why_in_its_answer_and_the_listing,);

async fn run(gateway: &Gateway) -> String {
    let reply = gateway.post_json("/api/v1/programs/run/", "alice", json!({"title": "fn", "arguments": "{}"})).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    reply.json["id"].as_str().unwrap().to_string()
}

async fn an_ended_job_says_why_in_its_answer_and_the_listing(backend: Backend) {
    // No runner: the moves are made here, as a runner makes them.
    let gateway = Gateway::start(backend).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    let db = &gateway.state.db;
    let step = |from: JobStatus, trigger: Trigger| decide(from, &trigger).unwrap();
    let admitted = step(JobStatus::Queued, Trigger::Admitted);
    let started = step(JobStatus::Pending, Trigger::Started);
    let (crashed, ok, timed_out) = (run(&gateway).await, run(&gateway).await, run(&gateway).await);
    // A batch move (the other statement) for the admission, one-job moves for the rest.
    let all = [crashed.clone(), ok.clone(), timed_out.clone()];
    assert_eq!(gantry::db::jobs::apply_moves(db, &all, &admitted, false).await.unwrap().len(), 3);
    for id in &all {
        assert!(gantry::db::jobs::apply_move(db, id, &started, false).await.unwrap());
    }
    let running = gateway.get(&format!("/api/v1/jobs/{crashed}/"), "alice").await.json;
    assert_eq!(running.get("status_reason"), None, "a running job has no reason: {running}");
    let why = "exit code 1: ZeroDivisionError: division by zero";
    let failed = step(JobStatus::Running, Trigger::Crashed { reason: why.into() });
    assert!(gantry::db::jobs::apply_move(db, &crashed, &failed, false).await.unwrap());
    let succeeded = step(JobStatus::Running, Trigger::Exited { success: true });
    assert!(gantry::db::jobs::apply_move(db, &ok, &succeeded, false).await.unwrap());
    let stopped = step(JobStatus::Running, Trigger::TimedOut);
    assert_eq!(
        gantry::db::jobs::apply_moves(db, std::slice::from_ref(&timed_out), &stopped, false).await.unwrap().len(),
        1
    );

    let answer = gateway.get(&format!("/api/v1/jobs/{crashed}/"), "alice").await.json;
    assert_eq!((answer["status"].as_str(), answer["status_reason"].as_str()), (Some("FAILED"), Some(why)), "{answer}");
    let answer = gateway.get(&format!("/api/v1/jobs/{ok}/"), "alice").await.json;
    assert_eq!(answer["status"], "SUCCEEDED");
    assert_eq!(answer.get("status_reason"), None, "a success has no reason: {answer}");
    let answer = gateway.get(&format!("/api/v1/jobs/{timed_out}/"), "alice").await.json;
    assert!(answer["status_reason"].as_str().unwrap().contains("PROGRAM_TIMEOUT"), "{answer}");
    // The same in the listing; and the reason is the status event's.
    let page = gateway.get("/api/v1/jobs/?limit=10", "alice").await.json;
    let listed: Vec<(&str, Option<&str>)> = page["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|job| (job["id"].as_str().unwrap(), job.get("status_reason").and_then(Value::as_str)))
        .collect();
    assert!(listed.contains(&(crashed.as_str(), Some(why))), "{page}");
    assert!(listed.contains(&(ok.as_str(), None)), "{page}");
    let events = gateway.get(&format!("/api/v1/jobs/{crashed}/events/"), "alice").await.json;
    // Events come newest first.
    let last = events.as_array().unwrap().iter().find(|e| e["event_type"] == "STATUS_CHANGE").unwrap().clone();
    assert_eq!(last["data"]["reason"], why, "{events}");
}
