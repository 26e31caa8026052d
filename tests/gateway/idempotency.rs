//! `Idempotency-Key` on `programs/run/` and `programs/upload/` (issue 19): a retry gets the first
//! answer and creates nothing; the key with another request is a 422; keys are per user; 50
//! concurrent identical runs make one job; answers asking to retry later release the key; a
//! request in progress is waited for and an abandoned one taken over; invalid keys are a 400;
//! expired keys are deleted by the expiry pass and then run again.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, header};
use gantry::api::idempotency;
use gantry::db::Db;
use serde_json::{Value, json};

use crate::both_backends;
use crate::harness::{Backend, Gateway, Reply, multipart, tar_of};

both_backends!(
    a_retried_run_returns_the_first_answer_and_creates_nothing,
    the_same_key_with_another_request_is_422,
    keys_are_scoped_per_user,
    concurrent_identical_runs_create_one_job,
    a_retried_upload_returns_the_first_answer_and_one_version,
    final_answers_are_kept_and_retry_later_answers_release_the_key,
    a_request_in_progress_is_waited_for_and_an_abandoned_one_taken_over,
    invalid_keys_are_400_naming_the_header,
    expired_keys_are_deleted_in_batches_and_then_run_again,
);

const RUN: &str = "/api/v1/programs/run/";
const UPLOAD: &str = "/api/v1/programs/upload/";

fn run_body(arguments: &str) -> Value {
    json!({"title": "fn", "arguments": arguments, "config": {"workers": null, "auto_scaling": false}})
}

async fn keyed_run(gateway: &Gateway, user: &str, key: &str, body: &Value) -> Reply {
    let request = Request::builder()
        .method("POST")
        .uri(RUN)
        .header(header::AUTHORIZATION, format!("Bearer {user}"))
        .header(header::CONTENT_TYPE, "application/json")
        .header("Idempotency-Key", key)
        .body(Body::from(body.to_string()))
        .unwrap();
    gateway.send(request).await
}

async fn keyed_upload(gateway: &Gateway, user: &str, key: &str, title: &str, main: &[u8]) -> Reply {
    let artifact = tar_of(&[("main.py", main)]);
    let (content_type, body) =
        multipart(&[("title", title), ("entrypoint", "main.py")], &[("artifact", "artifact.tar", &artifact)]);
    let request = Request::builder()
        .method("POST")
        .uri(UPLOAD)
        .header(header::AUTHORIZATION, format!("Bearer {user}"))
        .header(header::CONTENT_TYPE, content_type)
        .header("Idempotency-Key", key)
        .body(Body::from(body))
        .unwrap();
    gateway.send(request).await
}

/// The user's jobs, as the API counts them.
async fn jobs_of(gateway: &Gateway, user: &str) -> i64 {
    let reply = gateway.get("/api/v1/jobs/?limit=0", user).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    reply.json["count"].as_i64().unwrap()
}

async fn upload_fn(gateway: &Gateway, user: &str) {
    let reply = gateway.upload_function(user, &[("title", "fn"), ("entrypoint", "main.py")]).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
}

fn replayed(reply: &Reply) -> bool {
    reply.headers.get(idempotency::REPLAYED_HEADER).is_some_and(|v| v == "true")
}

async fn user_id(gateway: &Gateway, username: &str) -> String {
    gantry::db::users::find_by_username(&gateway.state.db, username).await.unwrap().unwrap().id
}

async fn execute(gateway: &Gateway, sql: &str, value: i64) -> u64 {
    match &gateway.state.db {
        Db::Sqlite(pool, _) => sqlx::query(sql).bind(value).execute(pool).await.unwrap().rows_affected(),
        Db::Postgres(pool) => sqlx::query(sql).bind(value).execute(pool).await.unwrap().rows_affected(),
    }
}

async fn stored_keys(gateway: &Gateway) -> i64 {
    let sql = "SELECT COUNT(*) FROM idempotency_keys";
    match &gateway.state.db {
        Db::Sqlite(pool, _) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
        Db::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
    }
}

async fn a_retried_run_returns_the_first_answer_and_creates_nothing(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    upload_fn(&gateway, "alice").await;
    let first = keyed_run(&gateway, "alice", "retry-1", &run_body("{\"n\": 1}")).await;
    assert_eq!(first.status, 200, "{}", first.json);
    assert!(!replayed(&first));
    let id = first.json["id"].as_str().unwrap();
    for _ in 0..3 {
        let retry = keyed_run(&gateway, "alice", "retry-1", &run_body("{\"n\": 1}")).await;
        assert_eq!((retry.status, &retry.bytes), (first.status, &first.bytes));
        assert!(replayed(&retry));
    }
    // The same fields in another order and spacing are the same request.
    let reordered: Value = serde_json::from_str(
        r#"{"config": {"auto_scaling": false, "workers": null},   "arguments": "{\"n\": 1}", "title": "fn"}"#,
    )
    .unwrap();
    assert_eq!(keyed_run(&gateway, "alice", "retry-1", &reordered).await.json["id"], id);
    assert_eq!(jobs_of(&gateway, "alice").await, 1);
    // Another key, or none, is another run.
    let other = keyed_run(&gateway, "alice", "retry-2", &run_body("{\"n\": 1}")).await;
    assert_ne!(other.json["id"], id);
    assert_eq!(gateway.post_json(RUN, "alice", run_body("{\"n\": 1}")).await.status, 200);
    assert_eq!(jobs_of(&gateway, "alice").await, 3);
}

async fn the_same_key_with_another_request_is_422(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    upload_fn(&gateway, "alice").await;
    let first = keyed_run(&gateway, "alice", "k/1", &run_body("{\"n\": 1}")).await;
    assert_eq!(first.status, 200, "{}", first.json);
    let conflict = keyed_run(&gateway, "alice", "k/1", &run_body("{\"n\": 2}")).await;
    assert_eq!(conflict.status, 422, "{}", conflict.json);
    assert_eq!(conflict.json, json!({"message": "Idempotency-Key 'k/1' was already used with a different request."}));
    // Another endpoint is another request too.
    let upload = keyed_upload(&gateway, "alice", "k/1", "fn", b"print('hello')\n").await;
    assert_eq!((upload.status.as_u16(), upload.message()), (422, conflict.message()));
    assert_eq!(jobs_of(&gateway, "alice").await, 1);
    // The first request still gets its answer.
    assert_eq!(keyed_run(&gateway, "alice", "k/1", &run_body("{\"n\": 1}")).await.bytes, first.bytes);
}

async fn keys_are_scoped_per_user(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    upload_fn(&gateway, "alice").await;
    upload_fn(&gateway, "bob").await;
    let alice = keyed_run(&gateway, "alice", "shared", &run_body("{}")).await;
    let bob = keyed_run(&gateway, "bob", "shared", &run_body("{}")).await;
    assert_eq!((alice.status.as_u16(), bob.status.as_u16()), (200, 200), "{} {}", alice.json, bob.json);
    assert!(!replayed(&bob));
    assert_ne!(alice.json["id"], bob.json["id"]);
    // Bob's job is his own, and another body from bob is not judged against alice's.
    assert_eq!(gateway.get(&format!("/api/v1/jobs/{}/", bob.json["id"].as_str().unwrap()), "bob").await.status, 200);
    assert_eq!(keyed_run(&gateway, "alice", "shared", &run_body("{}")).await.bytes, alice.bytes);
    assert_eq!(keyed_run(&gateway, "bob", "shared", &run_body("{}")).await.bytes, bob.bytes);
    assert_eq!((jobs_of(&gateway, "alice").await, jobs_of(&gateway, "bob").await), (1, 1));
}

async fn concurrent_identical_runs_create_one_job(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    upload_fn(&gateway, "alice").await;
    let gateway = Arc::new(gateway);
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let gateway = gateway.clone();
            tokio::spawn(async move { keyed_run(&gateway, "alice", "fifty", &run_body("{\"n\": 50}")).await })
        })
        .collect();
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await.unwrap());
    }
    for reply in &replies {
        assert_eq!(reply.status, 200, "{}", reply.json);
        assert_eq!(reply.bytes, replies[0].bytes);
    }
    assert_eq!(replies.iter().filter(|reply| !replayed(reply)).count(), 1);
    assert_eq!(jobs_of(&gateway, "alice").await, 1);
}

async fn a_retried_upload_returns_the_first_answer_and_one_version(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    let first = keyed_upload(&gateway, "alice", "upload-1", "fn", b"print('v1')\n").await;
    assert_eq!(first.status, 200, "{}", first.json);
    let program_id = first.json["id"].as_str().unwrap().to_string();
    let artifacts = gateway.state.storage.list(&format!("artifacts/{program_id}/")).await.unwrap();
    assert_eq!(artifacts.len(), 1);
    let retry = keyed_upload(&gateway, "alice", "upload-1", "fn", b"print('v1')\n").await;
    assert_eq!((retry.status, &retry.bytes), (first.status, &first.bytes));
    assert!(replayed(&retry));
    // Not uploaded again: the same update time, the same stored artifact.
    let stored = gateway.get("/api/v1/programs/get_by_title/fn/", "alice").await.json;
    assert_eq!(stored["updated"], first.json["updated"]);
    assert_eq!(gateway.state.storage.list(&format!("artifacts/{program_id}/")).await.unwrap(), artifacts);
    // Other artifact bytes under the same key are another request.
    let other = keyed_upload(&gateway, "alice", "upload-1", "fn", b"print('v2')\n").await;
    assert_eq!(other.status, 422, "{}", other.json);
    assert_eq!(other.message(), "Idempotency-Key 'upload-1' was already used with a different request.");
    // A new key uploads a new version.
    let second = keyed_upload(&gateway, "alice", "upload-2", "fn", b"print('v2')\n").await;
    assert_eq!(second.status, 200, "{}", second.json);
    assert_eq!(second.json["id"], first.json["id"]);
    assert_ne!(second.json["updated"], first.json["updated"]);
}

async fn final_answers_are_kept_and_retry_later_answers_release_the_key(backend: Backend) {
    let gateway = Gateway::start_with(backend, |config| config.active_jobs_per_user = 1).await;
    // A 404 is the answer to that request, even once the function exists.
    let missing = keyed_run(&gateway, "alice", "early", &run_body("{}")).await;
    assert_eq!(missing.status, 404, "{}", missing.json);
    upload_fn(&gateway, "alice").await;
    let again = keyed_run(&gateway, "alice", "early", &run_body("{}")).await;
    assert_eq!((again.status, &again.bytes, replayed(&again)), (missing.status, &missing.bytes, true));
    assert_eq!(jobs_of(&gateway, "alice").await, 0);
    // A 429 asks to retry later: the key is released, and the retry runs once there is room.
    let running = gateway.post_json(RUN, "alice", run_body("{}")).await;
    assert_eq!(running.status, 200, "{}", running.json);
    let limited = keyed_run(&gateway, "alice", "later", &run_body("{}")).await;
    assert_eq!(limited.status, 429, "{}", limited.json);
    let stopped = gateway
        .post_json(&format!("/api/v1/jobs/{}/stop/", running.json["id"].as_str().unwrap()), "alice", json!({}))
        .await;
    assert_eq!(stopped.status, 200, "{}", stopped.json);
    let retried = keyed_run(&gateway, "alice", "later", &run_body("{}")).await;
    assert_eq!(retried.status, 200, "{}", retried.json);
    assert!(!replayed(&retried));
    assert_eq!(jobs_of(&gateway, "alice").await, 2);
}

async fn a_request_in_progress_is_waited_for_and_an_abandoned_one_taken_over(backend: Backend) {
    let gateway = Arc::new(Gateway::start(backend).await);
    upload_fn(&gateway, "alice").await;
    let alice = user_id(&gateway, "alice").await;
    let body = run_body("{}");
    let hash = idempotency::request_hash("POST", RUN, body.as_object().unwrap(), &[]);
    let now = gantry::db::now_micros();
    // Another request holds the key and answers a moment later: this one waits and replays it.
    let db = &gateway.state.db;
    assert!(gantry::db::idempotency::reserve(db, &alice, "busy", &hash, "other", now).await.unwrap());
    let waiting = {
        let (gateway, body) = (gateway.clone(), body.clone());
        tokio::spawn(async move { keyed_run(&gateway, "alice", "busy", &body).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "a request answered before the one in progress");
    let answer = r#"{"id": "from-the-first-request"}"#;
    assert!(gantry::db::idempotency::record_answer(db, &alice, "busy", "other", 200, answer).await.unwrap());
    let waited = waiting.await.unwrap();
    assert_eq!((waited.status.as_u16(), waited.bytes.as_slice()), (200, answer.as_bytes()));
    // A reservation left without an answer for 60 s is taken over: the request runs.
    let abandoned = now - 61_000_000;
    assert!(gantry::db::idempotency::reserve(db, &alice, "crashed", &hash, "gone", abandoned).await.unwrap());
    let taken = keyed_run(&gateway, "alice", "crashed", &body).await;
    assert_eq!(taken.status, 200, "{}", taken.json);
    assert!(!replayed(&taken));
    assert_eq!(keyed_run(&gateway, "alice", "crashed", &body).await.bytes, taken.bytes);
    assert_eq!(jobs_of(&gateway, "alice").await, 1);
}

async fn invalid_keys_are_400_naming_the_header(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    upload_fn(&gateway, "alice").await;
    let too_long = "k".repeat(256);
    for key in [too_long.as_str(), "", "two words", "tab\tkey"] {
        let reply = keyed_run(&gateway, "alice", key, &run_body("{}")).await;
        assert_eq!(reply.status, 400, "{key:?}: {}", reply.json);
        assert!(reply.message().starts_with("Idempotency-Key "), "{key:?}: {}", reply.json);
        let upload = keyed_upload(&gateway, "alice", key, "fn", b"print('x')\n").await;
        assert_eq!((upload.status.as_u16(), upload.message()), (400, reply.message()));
    }
    let non_ascii = Request::builder()
        .method("POST")
        .uri(RUN)
        .header(header::AUTHORIZATION, "Bearer alice")
        .header(header::CONTENT_TYPE, "application/json")
        .header("Idempotency-Key", axum::http::HeaderValue::from_bytes("clé".as_bytes()).unwrap())
        .body(Body::from(run_body("{}").to_string()))
        .unwrap();
    let reply = gateway.send(non_ascii).await;
    assert_eq!(reply.status, 400, "{}", reply.json);
    assert!(reply.message().starts_with("Idempotency-Key "), "{}", reply.json);
    assert_eq!(jobs_of(&gateway, "alice").await, 0);
    // The OpenAPI document states the same rule on both operations.
    let document = gateway.call("GET", "/swagger.json", None, None, Body::empty()).await.json;
    for path in [RUN, UPLOAD] {
        let parameters = document["paths"][path]["post"]["parameters"].as_array().unwrap();
        let documented = parameters.iter().find(|p| p["name"] == "Idempotency-Key" && p["in"] == "header");
        let pattern = regex::Regex::new(documented.unwrap()["schema"]["pattern"].as_str().unwrap()).unwrap();
        assert!(pattern.is_match(&"k".repeat(255)) && pattern.is_match("k/1~!"), "{path}");
        assert!([too_long.as_str(), "", "two words", "clé"].iter().all(|key| !pattern.is_match(key)), "{path}");
    }
    // The longest key is fine.
    assert_eq!(keyed_run(&gateway, "alice", &"k".repeat(255), &run_body("{}")).await.status, 200);
}

async fn expired_keys_are_deleted_in_batches_and_then_run_again(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    upload_fn(&gateway, "alice").await;
    let old = keyed_run(&gateway, "alice", "yesterday", &run_body("{}")).await;
    assert_eq!(old.status, 200, "{}", old.json);
    let recent = keyed_run(&gateway, "alice", "today", &run_body("{}")).await;
    assert_eq!(recent.status, 200, "{}", recent.json);
    // More expired keys than one batch holds.
    let alice = user_id(&gateway, "alice").await;
    let day_ago = gantry::db::now_micros() - 25 * 3600 * 1_000_000;
    for i in 0..(idempotency::EXPIRY_BATCH + 20) {
        let reserved =
            gantry::db::idempotency::reserve(&gateway.state.db, &alice, &format!("old-{i}"), "h", "o", day_ago).await;
        assert!(reserved.unwrap());
    }
    let moved =
        execute(&gateway, "UPDATE idempotency_keys SET created = $1 WHERE idempotency_key = 'yesterday'", day_ago)
            .await;
    assert_eq!(moved, 1);
    let deleted = idempotency::expire(&gateway.state.db, gantry::db::now_micros()).await.unwrap();
    assert_eq!(deleted, idempotency::EXPIRY_BATCH as u64 + 21);
    assert_eq!(stored_keys(&gateway).await, 1);
    // The expired key runs again; the recent one still answers as first.
    let again = keyed_run(&gateway, "alice", "yesterday", &run_body("{}")).await;
    assert_eq!(again.status, 200, "{}", again.json);
    assert!(!replayed(&again));
    assert_ne!(again.json["id"], old.json["id"]);
    assert_eq!(keyed_run(&gateway, "alice", "today", &run_body("{}")).await.bytes, recent.bytes);
    assert_eq!(jobs_of(&gateway, "alice").await, 3);
}
