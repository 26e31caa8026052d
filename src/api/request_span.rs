//! The span of each request, after the OpenTelemetry HTTP server conventions: named
//! `<method> <route>`, a child of the caller's `traceparent` header when it sent one, with the
//! job's id on routes of one job (`gantry.job.id`), and the answer's status. While spans are
//! off (`telemetry::enabled`) it is tower-http's debug span, which the default filter drops.

use std::time::Duration;

use axum::extract::MatchedPath;
use axum::http::{Request, Response};
use tracing::Span;
use tracing::field::Empty;

use crate::telemetry::{self, context};

/// The route of one job: the fourth segment of the path is its id.
const ONE_JOB_ROUTE: &str = "/api/v1/jobs/{job_id}/";

pub fn make_span<B>(request: &Request<B>) -> Span {
    let method = request.method();
    let path = request.uri().path();
    if !telemetry::enabled() {
        return tracing::debug_span!("request", method = %method, uri = %request.uri(), version = ?request.version());
    }
    let route = request.extensions().get::<MatchedPath>().map_or("unmatched", MatchedPath::as_str);
    let span = tracing::info_span!(
        "request",
        otel.name = %format!("{method} {route}"),
        otel.kind = "server",
        otel.status_code = Empty,
        http.request.method = %method,
        http.route = %route,
        url.path = %path,
        http.response.status_code = Empty,
        gantry.job.id = Empty,
        gantry.function = Empty,
        gantry.provider = Empty,
    );
    if route.starts_with(ONE_JOB_ROUTE)
        && let Some(id) = path.split('/').nth(4).filter(|id| !id.is_empty())
    {
        span.record("gantry.job.id", id);
    }
    let traceparent = request.headers().get("traceparent").and_then(|value| value.to_str().ok());
    context::adopt(&span, traceparent);
    span
}

pub fn record_answer<B>(response: &Response<B>, _latency: Duration, span: &Span) {
    let status = response.status();
    span.record("http.response.status_code", status.as_u16());
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
}
