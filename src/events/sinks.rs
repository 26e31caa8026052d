//! The outbound sinks: NATS JetStream and signed webhooks. A sink sends one CloudEvent and says
//! whether a failure is worth retrying.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::auth::upstream::{Upstream, UpstreamError};

/// The content type of a CloudEvent in structured JSON mode.
pub const CLOUDEVENTS_JSON: &str = "application/cloudevents+json";
/// The webhook signature header: `sha256=<hex HMAC-SHA256 of the body>`.
pub const SIGNATURE_HEADER: &str = "X-Gantry-Signature";
/// Longest wait for one sink to accept one event.
const SEND_DEADLINE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkError {
    /// Worth another try later (unreachable, timed out, 5xx, 429).
    Retry(String),
    /// Will not succeed by retrying (the receiver rejected the event).
    Permanent(String),
}

#[async_trait::async_trait]
pub trait Sink: Send + Sync {
    /// Names the sink in the outbox's `delivered_to` (stable across restarts).
    fn name(&self) -> &str;
    /// Sends one event (`body`, CloudEvents JSON); `id` is the event's id, `subject` what it is
    /// about: its job's id, `<job id>.usage` for a job's usage events.
    async fn send(&self, id: &str, subject: &str, body: Bytes) -> Result<(), SinkError>;
}

/// Publishes to `<prefix>.<job id>` (a job's usage events: `<prefix>.<job id>.usage`) on a JetStream stream, with the event id as `Nats-Msg-Id` so
/// the stream drops a redelivered duplicate within its duplicate window. The stream is created
/// when missing, at any time: a server restarted on empty storage, or a deleted stream, gets it
/// back with the next event.
pub struct NatsSink {
    jetstream: async_nats::jetstream::Context,
    prefix: String,
    stream: String,
    /// The stream was there at the last publish; cleared by a failed publish, so the next
    /// attempt checks the stream (and creates it) first.
    stream_ready: AtomicBool,
}

/// Why one publish failed.
struct PublishFailure {
    /// The server says no stream holds the subject.
    stream_missing: bool,
    error: SinkError,
}

impl NatsSink {
    /// Connects in the background: a server that is down now only delays delivery.
    pub async fn connect(url: &str, prefix: &str, stream: &str) -> anyhow::Result<NatsSink> {
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .max_reconnects(None)
            .connection_timeout(Duration::from_secs(5))
            .connect(url)
            .await
            .map_err(|e| anyhow::anyhow!("invalid NATS server {}: {e}", crate::db::redact(url)))?;
        let mut jetstream = async_nats::jetstream::new(client);
        jetstream.set_timeout(SEND_DEADLINE);
        Ok(NatsSink {
            jetstream,
            prefix: prefix.trim_end_matches('.').to_string(),
            stream: stream.to_string(),
            stream_ready: AtomicBool::new(false),
        })
    }

    async fn ensure_stream(&self) -> Result<(), SinkError> {
        if self.stream_ready.load(Ordering::Relaxed) {
            return Ok(());
        }
        let config = async_nats::jetstream::stream::Config {
            name: self.stream.clone(),
            subjects: vec![format!("{}.>", self.prefix)],
            ..Default::default()
        };
        let created = tokio::time::timeout(SEND_DEADLINE, self.jetstream.get_or_create_stream(config)).await;
        match created {
            Ok(Ok(_)) => {
                self.stream_ready.store(true, Ordering::Relaxed);
                Ok(())
            }
            Ok(Err(error)) => Err(SinkError::Retry(format!("NATS stream {}: {error}", self.stream))),
            Err(_) => Err(SinkError::Retry(format!(
                "NATS stream {}: no answer within {} s",
                self.stream,
                SEND_DEADLINE.as_secs()
            ))),
        }
    }

    /// Publishes one event and waits for the stream's acknowledgement.
    async fn publish(&self, id: &str, subject: &str, body: Bytes) -> Result<(), PublishFailure> {
        use async_nats::jetstream::context::PublishErrorKind;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", id);
        headers.insert("Content-Type", CLOUDEVENTS_JSON);
        let subject = format!("{}.{subject}", self.prefix);
        let published = async {
            let ack = self.jetstream.publish_with_headers(subject, headers, body).await?;
            ack.await
        };
        match tokio::time::timeout(SEND_DEADLINE, published).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(PublishFailure {
                stream_missing: error.kind() == PublishErrorKind::StreamNotFound,
                error: SinkError::Retry(format!("NATS: {error}")),
            }),
            Err(_) => Err(PublishFailure {
                stream_missing: false,
                error: SinkError::Retry(format!("NATS: no acknowledgement within {} s", SEND_DEADLINE.as_secs())),
            }),
        }
    }
}

#[async_trait::async_trait]
impl Sink for NatsSink {
    fn name(&self) -> &str {
        "nats"
    }

    async fn send(&self, id: &str, subject: &str, body: Bytes) -> Result<(), SinkError> {
        self.ensure_stream().await?;
        let Err(failure) = self.publish(id, subject, body.clone()).await else {
            return Ok(());
        };
        // Whatever failed, the stream may be gone: the next attempt checks it first. A stream
        // known to be missing is created again at once, and the event published to it.
        self.stream_ready.store(false, Ordering::Relaxed);
        if !failure.stream_missing {
            return Err(failure.error);
        }
        tracing::warn!(nats.stream = %self.stream, "NATS stream missing; creating it again");
        self.ensure_stream().await?;
        self.publish(id, subject, body).await.map_err(|failure| {
            self.stream_ready.store(false, Ordering::Relaxed);
            failure.error
        })
    }
}

/// POSTs each event to a URL, signed with HMAC-SHA256 over the body.
pub struct WebhookSink {
    name: String,
    url: String,
    /// The URL as messages show it: scheme and host only (paths and queries may hold secrets).
    shown: String,
    key: Vec<u8>,
    upstream: Upstream,
}

impl WebhookSink {
    pub fn new(name: String, url: &str, key: Vec<u8>) -> anyhow::Result<WebhookSink> {
        let parsed: hyper::Uri = url.parse().map_err(|e| anyhow::anyhow!("invalid webhook URL: {e}"))?;
        if !matches!(parsed.scheme_str(), Some("http" | "https")) || parsed.host().is_none() {
            anyhow::bail!("invalid webhook URL {}: use http(s)://host/path", shown_url(url));
        }
        Ok(WebhookSink {
            name,
            url: url.to_string(),
            shown: shown_url(url),
            key,
            upstream: Upstream::new(SEND_DEADLINE)?,
        })
    }
}

/// `scheme://host[:port]/…` of a URL: what logs and messages may show of a webhook.
pub fn shown_url(url: &str) -> String {
    match url.parse::<hyper::Uri>() {
        Ok(uri) => match (uri.scheme_str(), uri.host()) {
            (Some(scheme), Some(host)) => match uri.port_u16() {
                Some(port) => format!("{scheme}://{host}:{port}/…"),
                None => format!("{scheme}://{host}/…"),
            },
            _ => "(invalid URL)".into(),
        },
        Err(_) => "(invalid URL)".into(),
    }
}

/// The signature header's value for `body`.
pub fn signature(key: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    format!("sha256={}", crate::shared::hex(&digest))
}

#[async_trait::async_trait]
impl Sink for WebhookSink {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send(&self, id: &str, _subject: &str, body: Bytes) -> Result<(), SinkError> {
        let signature = signature(&self.key, &body);
        let headers = [(SIGNATURE_HEADER, signature.as_str()), ("X-Gantry-Event-Id", id)];
        match self.upstream.post(&self.url, &headers, CLOUDEVENTS_JSON, body).await {
            Ok((status, _)) if status.is_success() => Ok(()),
            Ok((status, _)) if status.is_client_error() && ![408, 425, 429].contains(&status.as_u16()) => {
                Err(SinkError::Permanent(format!("webhook {} rejected the event: {status}", self.shown)))
            }
            Ok((status, _)) => Err(SinkError::Retry(format!("webhook {} answered {status}", self.shown))),
            Err(error @ (UpstreamError::Timeout(_) | UpstreamError::Unreachable | UpstreamError::Unreadable)) => {
                Err(SinkError::Retry(format!("webhook {} {error}", self.shown)))
            }
            Err(UpstreamError::Status(status)) => {
                Err(SinkError::Retry(format!("webhook {} answered {status}", self.shown)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_urls_are_shown_without_path_query_or_credentials() {
        assert_eq!(shown_url("https://hooks.example.com/services/T0/B0/SECRET?token=x"), "https://hooks.example.com/…");
        assert_eq!(shown_url("http://user:pw@127.0.0.1:8080/hook"), "http://127.0.0.1:8080/…");
    }

    #[test]
    fn signatures_are_hmac_sha256_hex() {
        // RFC 4231 test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
