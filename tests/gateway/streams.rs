//! Event streams: status moves published to the real NATS JetStream server and to signed
//! webhooks through the outbox (in order, nothing lost while a sink is down), and jobs followed
//! live over Server-Sent Events (events and logs), on both backends.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use futures::StreamExt;
use http_body_util::BodyExt;
use serde_json::{Value, json};

use crate::both_backends;
use crate::eventually::until;
use crate::harness::{Backend, Gateway, tar_of};

both_backends!(
    nats_receives_every_move_in_order_with_the_documented_fields,
    moves_made_while_nats_is_unreachable_are_delivered_once_it_is_back,
    webhooks_are_signed_retried_and_delivered_once_each,
    events_a_receiver_rejects_are_kept_with_their_error,
    the_outbox_keeps_only_the_newest_delivered_events,
    a_deleted_nats_stream_is_created_again_for_the_next_events,
    every_job_event_is_published_once_with_its_type_and_a_gapless_sequence,
    an_event_stream_resumes_with_last_event_id_without_gaps_or_repeats,
    a_log_follower_receives_every_line_of_a_job_that_prints_for_seconds,
    logs_answers_stream_a_large_archived_log,
);

pub fn nats_url() -> String {
    std::env::var("GANTRY_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// Prints `lines` numbered lines, `pause` seconds apart, then returns.
pub const PRINTER: &str = r#"
import json, os, sys, time
with open(os.environ["ARGUMENTS_PATH"]) as handle:
    arguments = json.load(handle)
for i in range(arguments.get("lines", 0)):
    print(f"line {i} ✓ of the printer", flush=True)
    time.sleep(arguments.get("pause", 0))
time.sleep(arguments.get("nap", 0))
"#;

async fn upload_printer(gateway: &Gateway) {
    let artifact = tar_of(&[("main.py", PRINTER.as_bytes())]);
    let reply = gateway
        .post_multipart(
            "/api/v1/programs/upload/",
            "alice",
            &[("title", "printer"), ("entrypoint", "main.py")],
            &[("artifact", "artifact.tar", &artifact)],
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.json);
}

async fn run_printer(gateway: &Gateway, arguments: Value) -> String {
    let reply = gateway
        .post_json("/api/v1/programs/run/", "alice", json!({"title": "printer", "arguments": arguments.to_string()}))
        .await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    reply.json["id"].as_str().unwrap().to_string()
}

fn terminal(job: &Value) -> bool {
    matches!(job["status"].as_str(), Some("SUCCEEDED" | "FAILED" | "STOPPED"))
}

const EVENT_FIELDS: [&str; 9] =
    ["specversion", "id", "source", "type", "subject", "time", "datacontenttype", "sequence", "data"];
const DATA_FIELDS: [&str; 10] =
    ["job_id", "function", "provider", "user", "old_status", "new_status", "sub_status", "origin", "context", "time"];

/// The (old, new) statuses of published CloudEvents, checking each one's shape.
fn moves_of(events: &[Value], job_id: &str) -> Vec<(Value, Value)> {
    events
        .iter()
        .map(|event| {
            let keys: HashSet<&str> = event.as_object().unwrap().keys().map(String::as_str).collect();
            assert_eq!(keys, EVENT_FIELDS.into_iter().collect(), "{event}");
            let data_keys: HashSet<&str> = event["data"].as_object().unwrap().keys().map(String::as_str).collect();
            assert_eq!(data_keys, DATA_FIELDS.into_iter().collect(), "{event}");
            assert_eq!(event["specversion"], "1.0");
            assert_eq!(event["type"], "dev.gantry.job.status");
            assert_eq!(event["subject"], job_id);
            assert_eq!(event["data"]["job_id"], job_id);
            assert_eq!(event["data"]["function"], "printer");
            assert_eq!(event["data"]["provider"], Value::Null);
            assert_eq!(event["data"]["user"], "alice");
            (event["data"]["old_status"].clone(), event["data"]["new_status"].clone())
        })
        .collect()
}

fn full_lifecycle() -> Vec<(Value, Value)> {
    vec![
        (Value::Null, json!("QUEUED")),
        (json!("QUEUED"), json!("PENDING")),
        (json!("PENDING"), json!("RUNNING")),
        (json!("RUNNING"), json!("SUCCEEDED")),
    ]
}

/// A stream name and subject prefix of this test alone.
pub fn nats_names() -> (String, String) {
    let unique = uuid::Uuid::new_v4().simple().to_string();
    (format!("GANTRY_TEST_{unique}"), format!("gantrytest.{unique}"))
}

/// Every message of `stream`, in stream order.
async fn stream_messages(stream: &str) -> Vec<async_nats::jetstream::message::StreamMessage> {
    let client = async_nats::connect(nats_url()).await.expect("NATS answers");
    let jetstream = async_nats::jetstream::new(client);
    let mut handle = jetstream.get_stream(stream).await.expect("the stream exists");
    let last = handle.info().await.unwrap().state.last_sequence;
    let mut messages = Vec::new();
    for sequence in 1..=last {
        messages.push(handle.get_raw_message(sequence).await.unwrap());
    }
    messages
}

pub async fn delete_stream(stream: &str) {
    let client = async_nats::connect(nats_url()).await.expect("NATS answers");
    let _ = async_nats::jetstream::new(client).delete_stream(stream).await;
}

async fn nats_receives_every_move_in_order_with_the_documented_fields(backend: Backend) {
    let (stream, prefix) = nats_names();
    let client = async_nats::connect(nats_url()).await.expect("NATS answers on GANTRY_TEST_NATS_URL");
    let mut subscription = client.subscribe(format!("{prefix}.>")).await.unwrap();
    let gateway = Gateway::start(backend)
        .await
        .with_events(|events| {
            events.events_nats_url = Some(nats_url());
            events.events_nats_subject = prefix.clone();
            events.events_nats_stream = stream.clone();
            events.events_source = "/gantry/test".into();
        })
        .await
        .with_runner(|_| {})
        .await;
    upload_printer(&gateway).await;
    let job_id = run_printer(&gateway, json!({"lines": 2})).await;
    let job = gateway.wait_for_job("alice", &job_id, 60, terminal).await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");

    let mut received = Vec::new();
    let mut ids = Vec::new();
    while received.len() < 4 {
        let message = tokio::time::timeout(Duration::from_secs(20), subscription.next())
            .await
            .expect("every move reaches a NATS subscriber")
            .unwrap();
        assert_eq!(message.subject.as_str(), format!("{prefix}.{job_id}"));
        let event: Value = serde_json::from_slice(&message.payload).unwrap();
        let headers = message.headers.expect("headers");
        assert_eq!(headers.get("Nats-Msg-Id").map(|v| v.as_str()), event["id"].as_str());
        assert_eq!(headers.get("Content-Type").map(|v| v.as_str()), Some("application/cloudevents+json"));
        assert_eq!(event["source"], "/gantry/test");
        ids.push(event["id"].as_str().unwrap().to_string());
        received.push(event);
    }
    assert_eq!(moves_of(&received, &job_id), full_lifecycle());
    let sequences: Vec<i64> = received.iter().map(|e| e["sequence"].as_str().unwrap().parse().unwrap()).collect();
    assert!(sequences.windows(2).all(|pair| pair[0] < pair[1]), "sequences grow: {sequences:?}");
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 4);
    let db = &gateway.state.db;
    until("the outbox marks every event delivered", Duration::from_secs(10), || async move {
        gantry::db::outbox::counts(db).await.unwrap() == (0, 4, 0)
    })
    .await;
    // The stream kept exactly those four, in order.
    let stored: Vec<Value> =
        stream_messages(&stream).await.iter().map(|m| serde_json::from_slice(&m.payload).unwrap()).collect();
    assert_eq!(stored, received);
    delete_stream(&stream).await;
}

/// The CloudEvents `sequence` of a published event.
fn sequence(event: &Value) -> i64 {
    event["sequence"].as_str().expect("sequence is a string").parse().expect("sequence is a number")
}

/// The published events of `stream`, in stream order.
async fn stored_events(stream: &str) -> Vec<Value> {
    stream_messages(stream).await.iter().map(|m| serde_json::from_slice(&m.payload).unwrap()).collect()
}

async fn stop_job(gateway: &Gateway, job_id: &str) -> Value {
    let stopped = gateway.post_json(&format!("/api/v1/jobs/{job_id}/stop/"), "alice", json!({})).await;
    assert_eq!(stopped.status, 200, "{}", stopped.json);
    gateway.wait_for_job("alice", job_id, 60, terminal).await
}

/// Someone deletes the stream (as a broker restarted on empty storage loses it): the next event,
/// between two jobs or between two events of one job, creates it again and arrives, in order.
async fn a_deleted_nats_stream_is_created_again_for_the_next_events(backend: Backend) {
    let (stream, prefix) = nats_names();
    let gateway = Gateway::start(backend)
        .await
        .with_events(|events| {
            events.events_nats_url = Some(nats_url());
            events.events_nats_subject = prefix.clone();
            events.events_nats_stream = stream.clone();
        })
        .await
        .with_runner(|_| {})
        .await;
    upload_printer(&gateway).await;
    let first = run_printer(&gateway, json!({})).await;
    gateway.wait_for_job("alice", &first, 60, terminal).await;
    let db = &gateway.state.db;
    let delivered = |n: i64| async move {
        let (_, delivered, failed) = gantry::db::outbox::counts(db).await.unwrap();
        assert_eq!(failed, 0);
        delivered == n
    };
    until("the first job's events reach NATS", Duration::from_secs(20), || delivered(4)).await;
    assert_eq!(moves_of(&stored_events(&stream).await, &first), full_lifecycle());

    // Between two jobs.
    delete_stream(&stream).await;
    let second = run_printer(&gateway, json!({"nap": 120})).await;
    gateway.wait_for_job("alice", &second, 60, |job| job["status"] == "RUNNING").await;
    until("the next job's events reach the stream created again", Duration::from_secs(20), || delivered(7)).await;
    let stored = stored_events(&stream).await;
    assert_eq!(moves_of(&stored, &second), full_lifecycle()[..3], "in order, each once");
    assert_eq!(stored.iter().map(sequence).collect::<Vec<_>>(), [1, 2, 3]);

    // Between two events of one job.
    delete_stream(&stream).await;
    let job = stop_job(&gateway, &second).await;
    assert_eq!(job["status"], "STOPPED", "{job}");
    until("the job's next event reaches the stream created again", Duration::from_secs(20), || delivered(8)).await;
    let stored = stored_events(&stream).await;
    assert_eq!(moves_of(&stored, &second), [(json!("RUNNING"), json!("STOPPED"))]);
    assert_eq!(sequence(&stored[0]), 4);
    delete_stream(&stream).await;
}

/// The CloudEvents types of the job driven by the test below, in order.
const DRIVEN_TYPES: [&str; 8] = [
    "dev.gantry.job.status",
    "dev.gantry.job.status",
    "dev.gantry.job.status",
    "dev.gantry.job.sub_status",
    "dev.gantry.job.error",
    "dev.gantry.job.sub_status",
    "dev.gantry.job.status",
    "dev.gantry.job.log_lost",
];

/// Checks what one sink received of the driven job: each event once, sequences 1..8 in order,
/// each with its type and fields.
fn check_driven_events(sink: &str, events: &[Value], job_id: &str) {
    let sequences: Vec<i64> = events.iter().map(sequence).collect();
    assert_eq!(sequences, (1..=8).collect::<Vec<_>>(), "{sink}: every event once, without gaps");
    let types: Vec<&str> = events.iter().map(|event| event["type"].as_str().unwrap()).collect();
    assert_eq!(types, DRIVEN_TYPES, "{sink}");
    assert_eq!(events.iter().map(|e| &e["id"]).collect::<HashSet<_>>().len(), 8, "{sink}: distinct ids");
    let statuses: Vec<_> = [0, 1, 2, 6].map(|i| events[i].clone()).to_vec();
    assert_eq!(
        moves_of(&statuses, job_id),
        [
            (Value::Null, json!("QUEUED")),
            (json!("QUEUED"), json!("PENDING")),
            (json!("PENDING"), json!("RUNNING")),
            (json!("RUNNING"), json!("STOPPED")),
        ],
        "{sink}: status moves keep their data"
    );
    for event in events {
        let keys: HashSet<&str> = event.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, EVENT_FIELDS.into_iter().collect(), "{sink}: {event}");
        assert_eq!(event["subject"], job_id, "{sink}");
        assert_eq!(event["data"]["job_id"], job_id, "{sink}");
        assert_eq!((&event["data"]["user"], &event["data"]["function"]), (&json!("alice"), &json!("printer")));
    }
    let data = |i: usize| events[i]["data"].clone();
    let common = |status: &str, sub_status: Value, origin: &str, context: &str| {
        json!({"job_id": job_id, "function": "printer", "provider": null, "user": "alice", "status": status,
               "sub_status": sub_status, "origin": origin, "context": context})
    };
    let without_time = |mut data: Value| {
        assert!(data.as_object_mut().unwrap().remove("time").is_some_and(|t| t.is_string()), "{sink}: {data}");
        data
    };
    assert_eq!(without_time(data(3)), common("RUNNING", json!("MAPPING"), "API", "SET_SUB_STATUS"), "{sink}");
    let mut error = common("RUNNING", json!("MAPPING"), "API", "SEND_ERROR");
    let error_fields =
        json!({"code": "E42", "message": "the answer failed", "exception": "ValueError", "args": {"k": 1}});
    error.as_object_mut().unwrap().extend(error_fields.as_object().unwrap().clone());
    assert_eq!(without_time(data(4)), error, "{sink}");
    assert_eq!(without_time(data(5)), common("RUNNING", json!("EXECUTING_QPU"), "API", "SET_SUB_STATUS"), "{sink}");
    let mut lost = common("STOPPED", Value::Null, "SCHEDULER", "ARCHIVE_LOGS");
    lost["message"] = json!("the job's log was lost: test");
    assert_eq!(without_time(data(7)), lost, "{sink}");
}

/// Status moves, sub-status changes, an error the function sends and a lost log: NATS, the
/// webhook and the SSE stream each see the job's events 1..n once, each with its type.
async fn every_job_event_is_published_once_with_its_type_and_a_gapless_sequence(backend: Backend) {
    let (stream, prefix) = nats_names();
    let (url, received) = receiver(|_| 200).await;
    let gateway = Gateway::start(backend)
        .await
        .with_events(|events| {
            events.events_nats_url = Some(nats_url());
            events.events_nats_subject = prefix.clone();
            events.events_nats_stream = stream.clone();
            events.events_webhook_url = vec![url.clone()];
            events.events_webhook_secret = Some(gantry::secrets::Secret::new("hook-key".into()));
        })
        .await
        .with_runner(|_| {})
        .await;
    upload_printer(&gateway).await;
    let job_id = run_printer(&gateway, json!({"nap": 120})).await;
    let uri = format!("/api/v1/jobs/{job_id}/events/stream/");
    let mut live = SseReader::new(gateway.open(&uri, "alice", &[("accept", "text/event-stream")]).await);
    gateway.wait_for_job("alice", &job_id, 60, |job| job["status"] == "RUNNING").await;

    // What the function sends through the gateway while it runs.
    let sub_status = |value: &'static str| {
        let (gateway, path) = (&gateway, format!("/api/v1/jobs/{job_id}/sub_status/"));
        async move {
            let body = format!("sub_status={value}").into();
            let reply =
                gateway.call("PATCH", &path, Some("alice"), Some("application/x-www-form-urlencoded"), body).await;
            assert_eq!(reply.status, 200, "{}", reply.json);
        }
    };
    sub_status("MAPPING").await;
    sub_status("MAPPING").await; // unchanged: no event
    let sent = gateway
        .post_json(
            &format!("/api/v1/jobs/{job_id}/event/"),
            "alice",
            json!({"type": "ERROR", "code": "E42", "message": "the answer failed", "exception": "ValueError",
                   "args": "{\"k\": 1}"}),
        )
        .await;
    assert_eq!(sent.status, 200, "{}", sent.json);
    sub_status("EXECUTING_QPU").await;
    assert_eq!(stop_job(&gateway, &job_id).await["status"], "STOPPED");
    // SSE: the live follower ends after the terminal status event.
    let kinds = [
        "STATUS_CHANGE",
        "STATUS_CHANGE",
        "STATUS_CHANGE",
        "SUB_STATUS_CHANGE",
        "ERROR",
        "SUB_STATUS_CHANGE",
        "STATUS_CHANGE",
        "LOG_LOST",
    ];
    let expected: Vec<(String, String)> = (1..=8).map(|n: usize| (n.to_string(), kinds[n - 1].to_string())).collect();
    let mut followed = Vec::new();
    while let Some(event) = live.next().await {
        followed.push((event.id.unwrap(), event.event.unwrap()));
    }
    assert_eq!(followed, expected[..7], "the live SSE follower");
    // The controller's note of a lost log, recorded after the job ended.
    let note = json!({"message": "the job's log was lost: test"});
    assert!(
        gantry::db::jobs::insert_finished_event(&gateway.state.db, &job_id, "LOG_LOST", "ARCHIVE_LOGS", &note)
            .await
            .unwrap()
    );

    let db = &gateway.state.db;
    until("every event is delivered to both sinks", Duration::from_secs(30), || async move {
        gantry::db::outbox::counts(db).await.unwrap() == (0, 8, 0)
    })
    .await;
    check_driven_events("NATS", &stored_events(&stream).await, &job_id);
    let hooked: Vec<Value> = received
        .lock()
        .unwrap()
        .requests
        .iter()
        .map(|(_, body, status)| {
            assert_eq!(*status, 200);
            serde_json::from_slice(body).unwrap()
        })
        .collect();
    check_driven_events("webhook", &hooked, &job_id);

    // SSE: a follower after the end sees every event.
    let mut later = SseReader::new(gateway.open(&uri, "alice", &[("accept", "text/event-stream")]).await);
    let mut followed = Vec::new();
    while let Some(event) = later.next().await {
        followed.push((event.id.unwrap(), event.event.unwrap()));
    }
    assert_eq!(followed, expected, "a follower after the end");
    delete_stream(&stream).await;
}

/// A TCP relay to NATS that can be cut: while down it closes every connection it has and every
/// new one at once, as a server that went away.
struct Relay {
    url: String,
    up: tokio::sync::watch::Sender<bool>,
}

impl Relay {
    async fn start(target: &str, up: bool) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("nats://{}", listener.local_addr().unwrap());
        let (state, _) = tokio::sync::watch::channel(up);
        let target = target.trim_start_matches("nats://").to_string();
        let watcher = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else { return };
                let mut up = watcher.subscribe();
                if !*up.borrow() {
                    continue;
                }
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = up.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        Relay { url, up: state }
    }

    fn set(&self, up: bool) {
        self.up.send_replace(up);
    }
}

async fn moves_made_while_nats_is_unreachable_are_delivered_once_it_is_back(backend: Backend) {
    let (stream, prefix) = nats_names();
    let relay = Relay::start(&nats_url(), false).await;
    let gateway = Gateway::start(backend)
        .await
        .with_events(|events| {
            events.events_nats_url = Some(relay.url.clone());
            events.events_nats_subject = prefix.clone();
            events.events_nats_stream = stream.clone();
        })
        .await
        .with_runner(|_| {})
        .await;
    upload_printer(&gateway).await;
    let job_id = run_printer(&gateway, json!({"lines": 1})).await;
    let job = gateway.wait_for_job("alice", &job_id, 60, terminal).await;
    assert_eq!(job["status"], "SUCCEEDED", "the job completes while NATS is unreachable: {job}");
    let (waiting, delivered, failed) = gantry::db::outbox::counts(&gateway.state.db).await.unwrap();
    assert_eq!((waiting, delivered, failed), (4, 0, 0), "every move waits in the outbox");

    relay.set(true);
    let db = &gateway.state.db;
    until("the outbox delivers everything once NATS is back", Duration::from_secs(90), || async move {
        gantry::db::outbox::counts(db).await.unwrap() == (0, 4, 0)
    })
    .await;
    let stored: Vec<Value> =
        stream_messages(&stream).await.iter().map(|m| serde_json::from_slice(&m.payload).unwrap()).collect();
    assert_eq!(moves_of(&stored, &job_id), full_lifecycle(), "in order, each once");
    delete_stream(&stream).await;
}

/// What a webhook receiver saw: every request's signature header and body, and its answer.
#[derive(Default)]
struct Received {
    requests: Vec<(Option<String>, Vec<u8>, u16)>,
}

/// A webhook receiver on loopback answering `answer(n)` to its n-th request (from 0).
async fn receiver(answer: fn(usize) -> u16) -> (String, Arc<Mutex<Received>>) {
    let received = Arc::new(Mutex::new(Received::default()));
    let seen = Arc::clone(&received);
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let seen = Arc::clone(&seen);
            async move {
                let mut seen = seen.lock().unwrap();
                let status = answer(seen.requests.len());
                let signature = headers.get("x-gantry-signature").map(|v| v.to_str().unwrap().to_string());
                seen.requests.push((signature, body.to_vec(), status));
                axum::http::StatusCode::from_u16(status).unwrap()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, received)
}

fn hmac_hex(key: &[u8], body: &[u8]) -> String {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
    mac.update(body);
    mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

async fn webhooks_are_signed_retried_and_delivered_once_each(backend: Backend) {
    // The first three requests fail as a receiver that is down would.
    let (url, received) = receiver(|n| if n < 3 { 500 } else { 200 }).await;
    let gateway = Gateway::start(backend)
        .await
        .with_events(|events| {
            events.events_webhook_url = vec![url.clone()];
            events.events_webhook_secret = Some(gantry::secrets::Secret::new("hook-key".into()));
        })
        .await
        .with_runner(|_| {})
        .await;
    upload_printer(&gateway).await;
    let job_id = run_printer(&gateway, json!({"lines": 1})).await;
    gateway.wait_for_job("alice", &job_id, 60, terminal).await;
    let seen = &received;
    until("the webhook accepts all four events", Duration::from_secs(60), || async move {
        seen.lock().unwrap().requests.iter().filter(|r| r.2 == 200).count() >= 4
    })
    .await;
    // Nothing more arrives once everything was accepted.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let received = received.lock().unwrap();
    for (signature, body, _) in &received.requests {
        assert_eq!(signature.as_deref(), Some(format!("sha256={}", hmac_hex(b"hook-key", body)).as_str()));
    }
    let failed: Vec<Value> =
        received.requests.iter().filter(|r| r.2 == 500).map(|r| serde_json::from_slice(&r.1).unwrap()).collect();
    assert_eq!(failed.len(), 3);
    assert!(failed.iter().all(|event| event["data"]["new_status"] == "QUEUED"), "the first event was retried");
    let accepted: Vec<Value> =
        received.requests.iter().filter(|r| r.2 == 200).map(|r| serde_json::from_slice(&r.1).unwrap()).collect();
    assert_eq!(moves_of(&accepted, &job_id), full_lifecycle(), "each event once, in order");
    assert_eq!(accepted.iter().map(|e| e["id"].as_str().unwrap()).collect::<HashSet<_>>().len(), 4);
    assert_eq!(accepted[0]["id"], failed[0]["id"], "a retry is the same event");
}

async fn events_a_receiver_rejects_are_kept_with_their_error(backend: Backend) {
    let (url, received) = receiver(|_| 410).await;
    let gateway = Gateway::start(backend)
        .await
        .with_events(|events| {
            events.events_webhook_url = vec![url.clone()];
            events.events_webhook_secret = Some(gantry::secrets::Secret::new("hook-key".into()));
        })
        .await;
    upload_printer(&gateway).await;
    let job_id = run_printer(&gateway, json!({})).await;
    let db = &gateway.state.db;
    until("the rejected event is marked undeliverable", Duration::from_secs(20), || async move {
        gantry::db::outbox::counts(db).await.unwrap() == (0, 0, 1)
    })
    .await;
    let failures = gantry::db::outbox::failures(&gateway.state.db, 10).await.unwrap();
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].1, job_id);
    assert!(failures[0].2.contains("rejected the event: 410"), "{}", failures[0].2);
    assert_eq!(received.lock().unwrap().requests.len(), 1, "a rejection is not retried");
    let listed = gateway.admin(gantry::admin::AdminCommand::EventsFailed { limit: 10 }).await;
    assert!(listed.contains("1 undeliverable") && listed.contains(&job_id), "{listed}");
    // An operator queues it again: it is sent once more (and rejected again here).
    let requeued = gateway.admin(gantry::admin::AdminCommand::EventsRetry).await;
    assert!(requeued.starts_with("1 undeliverable events queued again"), "{requeued}");
    let seen = &received;
    until("the requeued event is sent again", Duration::from_secs(20), || async move {
        seen.lock().unwrap().requests.len() == 2
    })
    .await;
    until("and kept as undeliverable again", Duration::from_secs(20), || async move {
        gantry::db::outbox::counts(db).await.unwrap() == (0, 0, 1)
    })
    .await;
}

async fn the_outbox_keeps_only_the_newest_delivered_events(backend: Backend) {
    let (url, received) = receiver(|_| 200).await;
    let gateway = Gateway::start(backend)
        .await
        .with_events(|events| {
            events.events_webhook_url = vec![url.clone()];
            events.events_webhook_secret = Some(gantry::secrets::Secret::new("hook-key".into()));
            events.events_keep_delivered = 2;
        })
        .await
        .with_runner(|_| {})
        .await;
    upload_printer(&gateway).await;
    let job_id = run_printer(&gateway, json!({})).await;
    gateway.wait_for_job("alice", &job_id, 60, terminal).await;
    let db = &gateway.state.db;
    until("delivered rows beyond the newest two are pruned", Duration::from_secs(30), || async move {
        gantry::db::outbox::counts(db).await.unwrap() == (0, 2, 0)
    })
    .await;
    assert_eq!(received.lock().unwrap().requests.len(), 4, "pruning comes after delivery");
}

/// One Server-Sent Event.
#[derive(Debug, Clone, PartialEq)]
struct Sse {
    id: Option<String>,
    event: Option<String>,
    data: String,
}

/// Reads Server-Sent Events from a streamed body.
struct SseReader {
    body: Body,
    buffer: String,
}

impl SseReader {
    fn new(response: axum::response::Response) -> SseReader {
        assert_eq!(response.status(), 200);
        let content_type = response.headers()["content-type"].to_str().unwrap().to_string();
        assert!(content_type.starts_with("text/event-stream"), "{content_type}");
        SseReader { body: response.into_body(), buffer: String::new() }
    }

    /// The next event; `None` when the stream ended.
    async fn next(&mut self) -> Option<Sse> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut event = Sse { id: None, event: None, data: String::new() };
                let mut data = Vec::new();
                for line in block.lines() {
                    if let Some(value) = line.strip_prefix("id:") {
                        event.id = Some(value.trim_start().to_string());
                    } else if let Some(value) = line.strip_prefix("event:") {
                        event.event = Some(value.trim_start().to_string());
                    } else if let Some(value) = line.strip_prefix("data:") {
                        data.push(value.strip_prefix(' ').unwrap_or(value).to_string());
                    }
                }
                // As a browser's EventSource does: a block without data lines (a keep-alive
                // comment, or an event with no data) is never dispatched.
                if data.is_empty() {
                    continue;
                }
                event.data = data.join("\n");
                return Some(event);
            }
            let frame = tokio::time::timeout(Duration::from_secs(30), self.body.frame())
                .await
                .expect("the stream makes progress")?
                .expect("body");
            if let Ok(bytes) = frame.into_data() {
                self.buffer.push_str(std::str::from_utf8(&bytes).unwrap());
            }
        }
    }
}

async fn an_event_stream_resumes_with_last_event_id_without_gaps_or_repeats(backend: Backend) {
    let gateway = Gateway::start(backend).await.with_runner(|_| {}).await;
    upload_printer(&gateway).await;
    let job_id = run_printer(&gateway, json!({"nap": 3})).await;
    let uri = format!("/api/v1/jobs/{job_id}/events/stream/");
    let mut first = SseReader::new(gateway.open(&uri, "alice", &[("accept", "text/event-stream")]).await);
    let mut seen = Vec::new();
    for _ in 0..2 {
        seen.push(first.next().await.expect("an event"));
    }
    assert_eq!(gateway.state.follows.running(), 1, "the follower's hub");
    drop(first);
    assert_eq!(gateway.state.follows.running(), 0, "a follower that leaves releases its hub");
    // Events recorded while no one listens.
    for n in 0..3 {
        let reply = gateway
            .post_form(
                &format!("/api/v1/jobs/{job_id}/event/"),
                "alice",
                &[("type", "ERROR"), ("code", "E1"), ("message", &format!("number {n}")), ("exception", "x")],
            )
            .await;
        assert_eq!(reply.status, 200, "{}", reply.json);
    }
    let last = seen.last().unwrap().id.clone().unwrap();
    let mut second = SseReader::new(gateway.open(&uri, "alice", &[("last-event-id", &last)]).await);
    while let Some(event) = second.next().await {
        seen.push(event);
    }
    let job = gateway.get(&format!("/api/v1/jobs/{job_id}/"), "alice").await.json;
    assert!(terminal(&job), "the stream ended only after the job did: {job}");

    // Newest first: the reverse of the stream's order.
    let mut listed: Vec<Value> =
        gateway.get(&format!("/api/v1/jobs/{job_id}/events/"), "alice").await.json.as_array().unwrap().clone();
    listed.reverse();
    let streamed: Vec<Value> = seen.iter().map(|event| serde_json::from_str(&event.data).unwrap()).collect();
    assert_eq!(streamed.len(), 7, "4 status moves and 3 errors: {streamed:?}");
    let streamed_ids: Vec<&str> = streamed.iter().map(|e| e["id"].as_str().unwrap()).collect();
    let listed_ids: Vec<&str> = listed.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(streamed_ids, listed_ids, "every event once, in order");
    assert_eq!(streamed, listed, "the same shape as events/");
    let kinds: Vec<&str> = seen.iter().map(|e| e.event.as_deref().unwrap()).collect();
    assert_eq!(kinds.iter().filter(|kind| **kind == "ERROR").count(), 3);
    assert_eq!(streamed.last().unwrap()["data"]["status"], "SUCCEEDED");
    // Without outbound sinks nothing is written to the outbox, not even a late LOG_LOST.
    let note = json!({"message": "lost"});
    assert!(
        gantry::db::jobs::insert_finished_event(&gateway.state.db, &job_id, "LOG_LOST", "ARCHIVE_LOGS", &note)
            .await
            .unwrap()
    );
    assert_eq!(gantry::db::outbox::counts(&gateway.state.db).await.unwrap(), (0, 0, 0));
    // Another user's job is not there for them.
    let response = gateway.open(&uri, "mallory", &[]).await;
    assert_eq!(response.status(), 404);
    let response = gateway.open(&uri, "alice", &[("last-event-id", "soon")]).await;
    assert_eq!(response.status(), 400);
}

async fn a_log_follower_receives_every_line_of_a_job_that_prints_for_seconds(backend: Backend) {
    let gateway = Gateway::start(backend).await.with_runner(|_| {}).await;
    upload_printer(&gateway).await;
    let job_id = run_printer(&gateway, json!({"lines": 30, "pause": 0.1})).await;
    let uri = format!("/api/v1/jobs/{job_id}/logs/stream/");
    let mut sse = SseReader::new(gateway.open(&uri, "alice", &[("accept", "text/event-stream")]).await);
    let text = gateway.open(&format!("{uri}?format=text"), "alice", &[]).await;
    assert_eq!(text.headers()["content-type"], "text/plain; charset=utf-8");
    let text_body = tokio::spawn(async move { text.into_body().collect().await.unwrap().to_bytes() });

    let mut followed = String::new();
    let mut middle = None;
    let mut ended = false;
    while let Some(event) = sse.next().await {
        match event.event.as_deref() {
            Some("log") => {
                followed.push_str(&event.data);
                if event.data.contains("line 10 ") {
                    middle = event.id.clone();
                    // Two followers of one job share one reader.
                    assert_eq!(gateway.state.follows.running(), 1);
                }
            }
            Some("end") => {
                let end: Value = serde_json::from_str(&event.data).unwrap();
                assert_eq!(end["offset"].as_u64(), Some(followed.len() as u64), "{end}");
                ended = true;
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
    assert!(ended, "the stream says it ended");
    let job = gateway.get(&format!("/api/v1/jobs/{job_id}/"), "alice").await.json;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    let expected: String = (0..30).map(|i| format!("line {i} ✓ of the printer\n")).collect();
    assert_eq!(followed, expected);
    assert_eq!(String::from_utf8(text_body.await.unwrap().to_vec()).unwrap(), expected);
    assert_eq!(gateway.get(&format!("/api/v1/jobs/{job_id}/logs/"), "alice").await.json["logs"], expected);

    // Resuming from an event id, and reading an ended job's log from a byte offset.
    let middle = middle.expect("line 10 was seen");
    let offset: usize = middle.parse().unwrap();
    let mut resumed = SseReader::new(gateway.open(&uri, "alice", &[("last-event-id", &middle)]).await);
    let mut rest = String::new();
    while let Some(event) = resumed.next().await {
        if event.event.as_deref() == Some("log") {
            rest.push_str(&event.data);
        }
    }
    assert_eq!(rest, expected[offset..]);
    let tail = gateway.get(&format!("{uri}?format=text&offset={offset}"), "alice").await;
    assert_eq!(String::from_utf8(tail.bytes).unwrap(), expected[offset..]);
    assert_eq!(gateway.get(&format!("{uri}?offset=-1"), "alice").await.status, 400);
    assert_eq!(gateway.get(&uri, "mallory").await.status, 403);
    let follows = &gateway.state.follows;
    until("hubs stop when their job ends", Duration::from_secs(5), || async move { follows.running() == 0 }).await;
}

async fn logs_answers_stream_a_large_archived_log(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    upload_printer(&gateway).await;
    let job_id = run_printer(&gateway, json!({})).await;
    // 3 MB of lines with characters that need escaping or take several bytes.
    let log: String = (0..60_000).map(|i| format!("{i:06} \"quoted\" \\ tab\t ✓ é 𝄞\n")).collect();
    gateway.state.storage.put_bytes(&gantry::storage::keys::job_user_log(&job_id), log.clone().into()).await.unwrap();
    let reply = gateway.get(&format!("/api/v1/jobs/{job_id}/logs/"), "alice").await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.headers["content-type"], "application/json");
    assert_eq!(reply.json, json!({ "logs": log }));
}
