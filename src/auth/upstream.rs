//! Calls to the services that vouch for credentials (a token endpoint, an identity provider)
//! and to the runtime service `stop` cancels runtime jobs on: each with a deadline, the answer's
//! body read whole (these answers are small) and capped.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::{Method, Request, StatusCode, header};

use crate::http::{HttpClient, empty, http_client};

/// Largest answer read from an upstream service.
const MAX_ANSWER_BYTES: usize = 1024 * 1024;

/// What went wrong reaching a service, in words fit for the caller's error message (never the
/// credential, never the service's body).
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("did not answer within {0} s")]
    Timeout(u64),
    #[error("could not be reached")]
    Unreachable,
    #[error("answered {0}")]
    Status(StatusCode),
    #[error("gave an answer that could not be read")]
    Unreadable,
}

#[derive(Clone)]
pub struct Upstream {
    client: HttpClient,
    timeout: Duration,
}

impl Upstream {
    pub fn new(timeout: Duration) -> anyhow::Result<Upstream> {
        let client = http_client().map_err(anyhow::Error::msg)?;
        Ok(Upstream { client, timeout })
    }

    /// GETs `url` (with `authorization` as the header's value, if any): the status and body.
    pub async fn get(&self, url: &str, authorization: Option<&str>) -> Result<(StatusCode, Bytes), UpstreamError> {
        self.exchange(url, authorization, &[], None).await
    }

    /// GETs `url` with `authorization` and the other `headers`: the status and body.
    pub async fn get_with(
        &self,
        url: &str,
        authorization: &str,
        headers: &[(&str, &str)],
    ) -> Result<(StatusCode, Bytes), UpstreamError> {
        self.exchange(url, Some(authorization), headers, None).await
    }

    /// POSTs the form `fields` to `url`: the status and body.
    pub async fn post_form(&self, url: &str, fields: &[(&str, &str)]) -> Result<(StatusCode, Bytes), UpstreamError> {
        let form = serde_urlencoded::to_string(fields).map_err(|_| UpstreamError::Unreadable)?;
        self.exchange(url, None, &[], Some(("application/x-www-form-urlencoded", Bytes::from(form)))).await
    }

    /// POSTs `body` of `content_type` to `url` with `headers`: the status and body.
    pub async fn post(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        content_type: &str,
        body: Bytes,
    ) -> Result<(StatusCode, Bytes), UpstreamError> {
        self.exchange(url, None, headers, Some((content_type, body))).await
    }

    /// Sends a request without a body (`method` to `url` with `authorization` and the other
    /// `headers`): the status and body.
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        authorization: &str,
        headers: &[(&str, &str)],
    ) -> Result<(StatusCode, Bytes), UpstreamError> {
        self.request(method, url, Some(authorization), headers, None).await
    }

    async fn exchange(
        &self,
        url: &str,
        authorization: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<(&str, Bytes)>,
    ) -> Result<(StatusCode, Bytes), UpstreamError> {
        let method = if body.is_some() { Method::POST } else { Method::GET };
        self.request(method, url, authorization, headers, body).await
    }

    async fn request(
        &self,
        method: Method,
        url: &str,
        authorization: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<(&str, Bytes)>,
    ) -> Result<(StatusCode, Bytes), UpstreamError> {
        let mut request = Request::builder().method(method).uri(url).header(header::ACCEPT, "application/json");
        if let Some(value) = authorization {
            request = request.header(header::AUTHORIZATION, value);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let body = match body {
            Some((content_type, body)) => {
                request = request.header(header::CONTENT_TYPE, content_type);
                http_body_util::Full::new(body).map_err(|never| match never {}).boxed()
            }
            None => empty(),
        };
        let request = request.body(body).map_err(|_| UpstreamError::Unreachable)?;
        let exchange = async {
            let response = self.client.request(request).await.map_err(|error| {
                // The host only: a URL's path or query may hold a secret (webhooks).
                let host = url.parse::<hyper::Uri>().ok().and_then(|uri| uri.host().map(str::to_string));
                tracing::warn!(host, error = &error as &dyn std::error::Error, "upstream service unreachable");
                UpstreamError::Unreachable
            })?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|_| UpstreamError::Unreadable)?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .unwrap_or(Err(UpstreamError::Timeout(self.timeout.as_secs())))
    }

    /// GETs `url` and parses a 200 answer as JSON; any other status is an error.
    pub async fn get_json(&self, url: &str) -> Result<serde_json::Value, UpstreamError> {
        self.get_json_as(url, None).await
    }

    /// GETs `url` with `authorization` and parses a 200 answer as JSON.
    pub async fn get_json_as(
        &self,
        url: &str,
        authorization: Option<&str>,
    ) -> Result<serde_json::Value, UpstreamError> {
        match self.get(url, authorization).await? {
            (StatusCode::OK, body) => serde_json::from_slice(&body).map_err(|_| UpstreamError::Unreadable),
            (status, _) => Err(UpstreamError::Status(status)),
        }
    }
}
