//! The outbound event stream. Every job status move is logged once committed (the default sink);
//! with NATS JetStream or webhooks configured, every job event (status moves, sub-status changes,
//! errors sent by the function, a lost log) is also recorded in an outbox in the event's own
//! transaction, and a publisher delivers the outbox at least once, in order per job, as
//! CloudEvents whose `sequence` is the job event's number (1..n, no gaps). A sink that is down
//! never blocks or undoes a move: its events wait in the outbox.

pub mod sinks;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Notify;

use crate::db::outbox::{self, Attempt, DrainLock, Outbox, OutboxRow};
use crate::db::{self, Db};
use crate::telemetry::{self, context};
use sinks::{Sink, SinkError};
use tracing::Instrument;

// What a published event says: plain data, shared with the database layer that records it.
pub use crate::domain::event_data::{
    ERROR_EVENT_TYPE, EventData, LOG_LOST_EVENT_TYPE, MoveData, STATUS_EVENT_TYPE, SUB_STATUS_EVENT_TYPE,
    cloud_event_type,
};

/// One committed status move, as the log sink writes it.
#[derive(Debug, Clone, Serialize)]
pub struct StatusEvent {
    pub job_id: String,
    pub status: String,
    pub origin: String,
    pub context: String,
    pub created: String,
}

/// Where status moves go. `publish` runs after the commit and must be quick.
pub trait Publisher: Send + Sync {
    fn publish(&self, event: &StatusEvent) -> Result<(), String>;

    /// Whether job events are also recorded in the outbox (some outbound sink is configured).
    fn outbox(&self) -> bool {
        false
    }

    /// What a status move records in the outbox: its job event, and its usage events where
    /// they are published.
    fn moves_outbox(&self) -> Outbox {
        self.outbox().into()
    }

    /// Says that a job event other than a status move was committed (with its outbox row), so
    /// it leaves without waiting for the next poll.
    fn recorded(&self) {}
}

/// The default sink: one structured log line per move (`target: gantry::events`).
pub struct LogPublisher;

impl Publisher for LogPublisher {
    fn publish(&self, event: &StatusEvent) -> Result<(), String> {
        tracing::info!(
            target: "gantry::events",
            job_id = %event.job_id,
            status = %event.status,
            origin = %event.origin,
            context = %event.context,
            "job status changed"
        );
        Ok(())
    }
}

/// Publishes, logging and dropping a failure.
pub fn publish(publisher: &Arc<dyn Publisher>, event: StatusEvent) {
    if let Err(error) = publisher.publish(&event) {
        tracing::warn!(job.id = %event.job_id, error = %error, "failed to publish a job status event; dropped");
    }
}

/// The CloudEvents 1.0 JSON form of an outbox row.
pub fn cloud_event(source: &str, row: &OutboxRow) -> serde_json::Value {
    let data: serde_json::Value = serde_json::from_str(&row.data).unwrap_or(serde_json::Value::Null);
    serde_json::json!({
        "specversion": "1.0",
        "id": row.id,
        "source": source,
        "type": row.event_type,
        "subject": row.job_id,
        "time": db::format_timestamp(row.created),
        "datacontenttype": "application/json",
        "sequence": row.seq.to_string(),
        "data": data,
    })
}

/// What an outbox row is about (a sink's subject): its job, `<job id>.usage` for a usage event.
fn subject_of(row: &OutboxRow) -> String {
    match row.stream.as_str() {
        USAGE_STREAM => format!("{}.usage", row.job_id),
        _ => row.job_id.clone(),
    }
}

/// The outbox stream of usage events.
const USAGE_STREAM: &str = "usage";

/// Where events go besides the log, and how hard to try.
#[derive(Debug, Clone, clap::Args)]
pub struct EventArgs {
    /// NATS server to publish job events to (JetStream), e.g. nats://127.0.0.1:4222.
    #[arg(long, env = "GANTRY_EVENTS_NATS_URL")]
    pub events_nats_url: Option<String>,
    /// Subject prefix: each event goes to `<prefix>.<job id>`.
    #[arg(long, env = "GANTRY_EVENTS_NATS_SUBJECT", default_value = "gantry.jobs")]
    pub events_nats_subject: String,
    /// JetStream stream holding the subjects; created (for `<prefix>.>`) when missing.
    #[arg(long, env = "GANTRY_EVENTS_NATS_STREAM", default_value = "GANTRY_JOBS")]
    pub events_nats_stream: String,
    /// URL to POST each event to (repeat for several, or separate with commas).
    #[arg(long, env = "GANTRY_EVENTS_WEBHOOK_URL", value_delimiter = ',')]
    pub events_webhook_url: Vec<String>,
    /// Key of the webhook signature (`X-Gantry-Signature: sha256=<hex HMAC-SHA256 of the body>`).
    #[arg(long, env = "GANTRY_EVENTS_WEBHOOK_SECRET", hide_env_values = true)]
    pub events_webhook_secret: Option<crate::secrets::Secret>,
    /// CloudEvents `source` of the published events.
    #[arg(long, env = "GANTRY_EVENTS_SOURCE", default_value = "/gantry")]
    pub events_source: String,
    /// How long an event is retried before it is marked undeliverable (kept, with its error).
    #[arg(long, env = "GANTRY_EVENTS_RETRY_FOR", default_value = "24h", value_parser = crate::shared::parse_timeout)]
    pub events_retry_for: Duration,
    /// Delivered events kept in the outbox (the oldest beyond are deleted).
    #[arg(long, env = "GANTRY_EVENTS_KEEP_DELIVERED", default_value_t = 10_000)]
    pub events_keep_delivered: i64,
    /// How often the outbox is read when no move wakes the publisher, in milliseconds.
    #[arg(long, env = "GANTRY_EVENTS_POLL_MS", default_value_t = 1000)]
    pub events_poll_ms: u64,
    /// Whether jobs' usage events (started, in progress, completed, licence: docs/usage.md)
    /// are published with their job events.
    #[arg(long, env = "GANTRY_EVENTS_USAGE", default_value_t = true, action = clap::ArgAction::Set)]
    pub events_usage: bool,
    /// How often a running job's usage leaves as an "in progress" usage event (15m, 1h, 30s;
    /// `off` for none). Its started and completed events leave whatever this says.
    #[arg(long, env = "GANTRY_EVENTS_USAGE_PROGRESS", default_value = "15m", value_parser = parse_every)]
    pub events_usage_progress: Every,
}

/// A period, or none (`off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Every(pub Option<Duration>);

/// `off` (or `0`, `none`), else a duration as `--timeout` takes it.
pub fn parse_every(text: &str) -> Result<Every, String> {
    match text.trim() {
        "off" | "none" | "0" => Ok(Every(None)),
        _ => match crate::shared::parse_timeout(text)? {
            period if period < Duration::from_secs(1) => {
                Err(format!("invalid period '{text}': at least a second (1s), or off"))
            }
            period => Ok(Every(Some(period))),
        },
    }
}

/// Statements (of up to 500 jobs each) recording "in progress" events per check.
const PROGRESS_STATEMENTS_PER_CHECK: usize = 100;

impl EventArgs {
    /// Whether any outbound sink is configured.
    pub fn outbound(&self) -> bool {
        self.events_nats_url.is_some() || !self.events_webhook_url.is_empty()
    }

    /// Names the configured sinks, for the start-up line.
    pub fn describe(&self) -> String {
        let mut sinks = vec!["log".to_string()];
        if let Some(url) = &self.events_nats_url {
            sinks.push(format!("nats {} ({}.<job id>)", db::redact(url), self.events_nats_subject));
        }
        sinks.extend(self.events_webhook_url.iter().map(|url| format!("webhook {}", sinks::shown_url(url))));
        sinks.join(", ")
    }

    /// The publisher for this process; with outbound sinks, also starts draining the outbox.
    pub async fn start(&self, db: &Db) -> anyhow::Result<Arc<dyn Publisher>> {
        if !self.outbound() {
            return Ok(Arc::new(LogPublisher));
        }
        let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
        if let Some(url) = &self.events_nats_url {
            sinks.push(Box::new(
                sinks::NatsSink::connect(url, &self.events_nats_subject, &self.events_nats_stream).await?,
            ));
        }
        if !self.events_webhook_url.is_empty() && self.events_webhook_secret.is_none() {
            anyhow::bail!(
                "webhook events need a signing key: set --events-webhook-secret (GANTRY_EVENTS_WEBHOOK_SECRET)"
            );
        }
        for (index, url) in self.events_webhook_url.iter().enumerate() {
            let secret =
                self.events_webhook_secret.as_ref().map(|s| s.expose().as_bytes().to_vec()).unwrap_or_default();
            sinks.push(Box::new(sinks::WebhookSink::new(format!("webhook{}", index + 1), url, secret)?));
        }
        let wake = Arc::new(Notify::new());
        let drainer = Drainer {
            db: db.clone(),
            sinks,
            source: self.events_source.clone(),
            retry_for: self.events_retry_for,
            keep_delivered: self.events_keep_delivered,
            poll: Duration::from_millis(self.events_poll_ms.max(10)),
            wake: Arc::clone(&wake),
            progress: self.events_usage_progress.0.filter(|_| self.events_usage),
        };
        tokio::spawn(drainer.run());
        Ok(Arc::new(OutboxPublisher { wake, usage: self.events_usage }))
    }
}

/// Logs each move and wakes the outbox publisher (the move itself recorded the outbox row).
struct OutboxPublisher {
    wake: Arc<Notify>,
    /// Usage events are published too.
    usage: bool,
}

impl Publisher for OutboxPublisher {
    fn publish(&self, event: &StatusEvent) -> Result<(), String> {
        self.wake.notify_one();
        LogPublisher.publish(event)
    }

    fn outbox(&self) -> bool {
        true
    }

    fn moves_outbox(&self) -> Outbox {
        if self.usage { Outbox::JobsAndUsage } else { Outbox::Jobs }
    }

    fn recorded(&self) {
        self.wake.notify_one();
    }
}

/// How often the publisher looks for running jobs due an "in progress" event: a tenth of the
/// period, at most a minute (an event is at most that late), at least a tenth of a second.
fn progress_check(every: Duration) -> Duration {
    (every / 10).clamp(Duration::from_millis(100), Duration::from_secs(60))
}

/// Rows read from the outbox per pass.
const BATCH: i64 = 500;
/// Jobs whose events are delivered at once (each job's in order).
const JOBS_AT_ONCE: usize = 16;
/// The longest wait between two attempts on one event.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Delivers the outbox to the sinks.
pub struct Drainer {
    pub db: Db,
    pub sinks: Vec<Box<dyn Sink>>,
    pub source: String,
    pub retry_for: Duration,
    pub keep_delivered: i64,
    pub poll: Duration,
    pub wake: Arc<Notify>,
    /// The period of running jobs' "in progress" usage events; `None`: none.
    pub progress: Option<Duration>,
}

impl Drainer {
    pub async fn run(self) {
        let mut lock = DrainLock::new();
        let mut passes: u64 = 0;
        let mut progress_checked = tokio::time::Instant::now();
        loop {
            let mut busy = false;
            if lock.acquire(&self.db).await {
                if let Some(every) = self.progress
                    && progress_checked.elapsed() >= progress_check(every)
                {
                    progress_checked = tokio::time::Instant::now();
                    self.record_progress(every).await;
                }
                match self.pass().await {
                    Ok(delivered) => busy = delivered > 0,
                    Err(error) => {
                        tracing::error!(error = &error as &dyn std::error::Error, "event outbox pass failed")
                    }
                }
                passes += 1;
                if passes.is_multiple_of(64)
                    && let Err(error) = outbox::prune(&self.db, self.keep_delivered).await
                {
                    tracing::warn!(error = &error as &dyn std::error::Error, "failed to prune the event outbox");
                }
            }
            if !busy {
                tokio::select! {
                    () = self.wake.notified() => {}
                    () = tokio::time::sleep(self.poll) => {}
                }
            }
        }
    }

    /// Records the "in progress" usage events that are due (all of them, a batch at a time).
    async fn record_progress(&self, every: Duration) {
        let every = i64::try_from(every.as_micros()).unwrap_or(i64::MAX);
        // Each statement takes the jobs due at its start; a bounded number of them a check, so
        // jobs that fall due again meanwhile cannot keep the publisher here.
        for _ in 0..PROGRESS_STATEMENTS_PER_CHECK {
            match db::jobs::record_progress(&self.db, every, db::now_micros()).await {
                Ok(recorded) if recorded > 0 => tracing::debug!(recorded, "usage in progress recorded"),
                Ok(_) => break,
                Err(error) => {
                    tracing::warn!(error = &error as &dyn std::error::Error, "failed to record usage in progress");
                    break;
                }
            }
        }
    }

    /// One pass over the oldest undelivered rows; returns how many were delivered.
    pub async fn pass(&self) -> Result<usize, db::Error> {
        use futures::StreamExt;
        let rows = outbox::pending(&self.db, BATCH).await?;
        let mut by_job: BTreeMap<(String, String), Vec<OutboxRow>> = BTreeMap::new();
        for row in rows {
            by_job.entry((row.job_id.clone(), row.stream.clone())).or_default().push(row);
        }
        let delivered: Vec<Result<usize, db::Error>> = futures::stream::iter(by_job.into_values())
            .map(|mut rows| async move {
                rows.sort_by_key(|row| row.seq);
                self.deliver_in_order(rows).await
            })
            .buffer_unordered(JOBS_AT_ONCE)
            .collect()
            .await;
        delivered.into_iter().sum()
    }

    /// Delivers one stream of one job's rows in order, stopping at the first that must wait.
    async fn deliver_in_order(&self, rows: Vec<OutboxRow>) -> Result<usize, db::Error> {
        let mut delivered = 0;
        for row in rows {
            let now = db::now_micros();
            if row.next_attempt > now {
                break;
            }
            let span = if telemetry::enabled() {
                let traceparent = db::jobs::traceparent(&self.db, &row.job_id).await.ok().flatten();
                context::job_span("gantry.event.deliver", &row.job_id, traceparent.as_deref())
            } else {
                tracing::Span::none()
            };
            let (delivered_to, outcome) = self.deliver(&row).instrument(span.clone()).await;
            if outcome.is_err() {
                span.record("otel.status_code", "ERROR");
            }
            let attempt = match outcome {
                Ok(()) => Attempt::Delivered,
                Err(SinkError::Permanent(error)) => Attempt::Failed { error },
                Err(SinkError::Retry(error)) => {
                    let age = Duration::from_micros((now - row.created).max(0) as u64);
                    if age >= self.retry_for {
                        Attempt::Failed { error: format!("gave up after {} attempts: {error}", row.attempts + 1) }
                    } else {
                        let backoff = Duration::from_secs(1 << row.attempts.clamp(0, 6)).min(MAX_BACKOFF);
                        Attempt::Retry { error, next_attempt: now + backoff.as_micros() as i64 }
                    }
                }
            };
            match &attempt {
                Attempt::Failed { error } => {
                    tracing::error!(job.id = %row.job_id, event.id = %row.id, error = %error, "job event undeliverable; kept in the outbox")
                }
                Attempt::Retry { error, .. } => {
                    tracing::warn!(job.id = %row.job_id, event.id = %row.id, error = %error, "job event not delivered; will retry")
                }
                Attempt::Delivered => delivered += 1,
            }
            outbox::record(&self.db, &row.id, &delivered_to, &attempt, now).await?;
            if matches!(attempt, Attempt::Retry { .. }) {
                break;
            }
        }
        Ok(delivered)
    }

    /// Sends one row to every sink that does not have it yet: the sinks that have it now, and the
    /// first failure.
    async fn deliver(&self, row: &OutboxRow) -> (String, Result<(), SinkError>) {
        let mut done: Vec<String> =
            row.delivered_to.split(',').filter(|name| !name.is_empty()).map(str::to_string).collect();
        let body = match serde_json::to_vec(&cloud_event(&self.source, row)) {
            Ok(body) => bytes::Bytes::from(body),
            Err(error) => return (done.join(","), Err(SinkError::Permanent(error.to_string()))),
        };
        for sink in &self.sinks {
            if done.iter().any(|name| name == sink.name()) {
                continue;
            }
            if let Err(error) = sink.send(&row.id, &subject_of(row), body.clone()).await {
                return (done.join(","), Err(error));
            }
            done.push(sink.name().to_string());
        }
        (done.join(","), Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_progress_period_is_a_second_at_least_or_off() {
        assert_eq!(parse_every("15m"), Ok(Every(Some(Duration::from_secs(900)))));
        assert_eq!(parse_every("off"), Ok(Every(None)));
        assert_eq!(parse_every("1s"), Ok(Every(Some(Duration::from_secs(1)))));
        assert!(parse_every("0.5s").unwrap_err().contains("at least a second"));
        assert!(parse_every("soon").is_err());
    }

    #[test]
    fn each_job_event_type_has_its_cloud_event_type() {
        assert_eq!(cloud_event_type("STATUS_CHANGE"), STATUS_EVENT_TYPE);
        assert_eq!(cloud_event_type("SUB_STATUS_CHANGE"), SUB_STATUS_EVENT_TYPE);
        assert_eq!(cloud_event_type("ERROR"), ERROR_EVENT_TYPE);
        assert_eq!(cloud_event_type("LOG_LOST"), LOG_LOST_EVENT_TYPE);
    }

    fn event_data() -> EventData {
        EventData {
            job_id: "j1".into(),
            function: Some("f".into()),
            provider: None,
            user: "alice".into(),
            status: "RUNNING".into(),
            sub_status: Some("MAPPING".into()),
            origin: "API".into(),
            context: "SET_SUB_STATUS".into(),
            time: "2026-01-01T00:00:00Z".into(),
            fields: Default::default(),
        }
    }

    #[test]
    fn event_data_carries_the_events_fields_without_repeating_the_jobs() {
        let data = serde_json::to_value(event_data().with_fields(r#"{"sub_status": "MAPPING"}"#)).unwrap();
        assert_eq!(data.as_object().unwrap().len(), 9, "{data}");
        assert_eq!(data["sub_status"], "MAPPING");
        let error = r#"{"code": "E1", "message": "m", "exception": "x", "args": [1], "status": "forged"}"#;
        let data = serde_json::to_value(event_data().with_fields(error)).unwrap();
        assert_eq!(data["status"], "RUNNING", "a field of the event never replaces the job's: {data}");
        assert_eq!(
            (&data["code"], &data["message"], &data["exception"], &data["args"]),
            (&serde_json::json!("E1"), &serde_json::json!("m"), &serde_json::json!("x"), &serde_json::json!([1]))
        );
        let data = serde_json::to_value(event_data().with_fields("[1, 2]")).unwrap();
        assert_eq!(data["value"], serde_json::json!([1, 2]));
    }
}
