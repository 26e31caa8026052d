//! The exporter's HTTP client: the crate's one outgoing client (`http`), driven on the Tokio
//! runtime. The SDK's batch processor calls it from its own thread with a plain executor, which
//! cannot drive hyper's I/O, so each send runs as a task of the runtime and the batch thread
//! waits for that task. Every send is bounded by the OTLP timeout.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};

use crate::http::{HttpBody, http_client};

/// The most of a collector's answer that is read (it is a small protobuf status).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

#[derive(Clone)]
pub(super) struct OtlpClient {
    client: crate::http::HttpClient,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
}

impl std::fmt::Debug for OtlpClient {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("OtlpClient").field("timeout", &self.timeout).finish_non_exhaustive()
    }
}

impl OtlpClient {
    pub(super) fn new(runtime: tokio::runtime::Handle) -> Result<OtlpClient, String> {
        Ok(OtlpClient { client: http_client()?, runtime, timeout: timeout(|name| std::env::var(name).ok()) })
    }
}

/// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds), else
/// the standard 10 s.
fn timeout(variable: impl Fn(&str) -> Option<String>) -> Duration {
    ["OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"]
        .iter()
        .find_map(|name| variable(name).and_then(|value| value.trim().parse::<u64>().ok()))
        .map_or(Duration::from_secs(10), Duration::from_millis)
}

#[async_trait::async_trait]
impl HttpClient for OtlpClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (client, timeout) = (self.client.clone(), self.timeout);
        let request =
            request.map(|body| -> HttpBody { http_body_util::Full::new(body).map_err(|never| match never {}).boxed() });
        let sent = self.runtime.spawn(async move {
            tokio::time::timeout(timeout, async move {
                let answer = client.request(request).await?;
                let (parts, body) = answer.into_parts();
                let body = http_body_util::Limited::new(body, MAX_ANSWER_BYTES).collect().await?.to_bytes();
                Ok::<_, HttpError>(Response::from_parts(parts, body))
            })
            .await
            .map_err(|_| HttpError::from(format!("the collector did not answer within {timeout:?}")))?
        });
        sent.await.map_err(|e| HttpError::from(format!("the export task ended: {e}")))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeout_is_the_standard_variables_in_milliseconds() {
        assert_eq!(timeout(|_| None), Duration::from_secs(10));
        assert_eq!(
            timeout(|name| (name == "OTEL_EXPORTER_OTLP_TIMEOUT").then(|| "250".into())),
            Duration::from_millis(250)
        );
        let both = |name: &str| Some(if name == "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT" { "100" } else { "900" }.into());
        assert_eq!(timeout(both), Duration::from_millis(100));
    }
}
