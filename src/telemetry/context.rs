//! One job's trace across processes. The `run` request's span context is kept with the job as a
//! W3C `traceparent` (`00-<trace id>-<span id>-<flags>`); every later step of the job (status
//! moves, deliveries, reconciles, the launcher, the function) starts a span whose parent is
//! that context, so they all join the request's trace.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The variables a job's process finds its parent span in: `traceparent`, as the reference
/// gateway sets it, and `TRACEPARENT`, the OpenTelemetry name for environment carriers.
pub const ENVIRONMENT: [&str; 2] = ["traceparent", "TRACEPARENT"];

/// The context of a well-formed `traceparent`; None for anything else (W3C: an invalid header
/// is ignored, never refused).
pub fn parse(traceparent: &str) -> Option<opentelemetry::Context> {
    let traceparent = traceparent.trim();
    // W3C's fixed widths (the propagator alone takes shorter ids).
    let widths: Vec<usize> = traceparent.split('-').map(str::len).collect();
    let hex = traceparent.bytes().all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if widths[..widths.len().min(4)] != [2, 32, 16, 2] || !hex {
        return None;
    }
    let carrier = HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
    let context = TraceContextPropagator::new().extract(&carrier);
    context.span().span_context().is_valid().then_some(context)
}

/// The `traceparent` of `span`, when spans have ids (`super::enabled`).
pub fn traceparent_of(span: &Span) -> Option<String> {
    if !super::enabled() {
        return None;
    }
    let context = span.context();
    let ids = context.span().span_context().clone();
    ids.is_valid().then(|| format!("00-{}-{}-{:02x}", ids.trace_id(), ids.span_id(), ids.trace_flags().to_u8()))
}

/// The `traceparent` of the current span.
pub fn current() -> Option<String> {
    traceparent_of(&Span::current())
}

/// Makes `span` a child of `traceparent` (when it parses). Must come before the span is first
/// entered.
pub fn adopt(span: &Span, traceparent: Option<&str>) {
    if let Some(parent) = traceparent.and_then(parse) {
        // Fails only when the span is disabled or already started: it then keeps its parent.
        let _ = span.set_parent(parent);
    }
}

/// A span for one step of a job (`step` is its name, e.g. `gantry.job.move`), a child of the
/// job's trace; `Span::none()` while spans are off, so a step costs nothing then. The fields
/// a step may record are declared here: the status it moved to and from, the origin of the
/// move, the pod, the reconcile's verdict.
pub fn job_span(step: &'static str, job_id: &str, traceparent: Option<&str>) -> Span {
    if !super::enabled() {
        return Span::none();
    }
    let span = tracing::info_span!(
        "job step",
        otel.name = step,
        otel.status_code = tracing::field::Empty,
        gantry.job.id = %job_id,
        gantry.job.status = tracing::field::Empty,
        gantry.job.previous_status = tracing::field::Empty,
        gantry.job.origin = tracing::field::Empty,
        k8s.pod.name = tracing::field::Empty,
        gantry.reconcile.outcome = tracing::field::Empty,
    );
    adopt(&span, traceparent);
    span
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_well_formed_traceparent_is_a_parent() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let parsed = parse(good).expect("a valid traceparent");
        assert_eq!(parsed.span().span_context().trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parsed.span().span_context().span_id().to_string(), "00f067aa0ba902b7");
        for bad in [
            "",
            "garbage",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f35-00f0-01",
        ] {
            assert!(parse(bad).is_none(), "{bad} must not parse");
        }
    }

    #[test]
    fn a_job_step_costs_nothing_while_spans_are_off() {
        assert!(!crate::telemetry::enabled());
        assert!(
            job_span("gantry.job.move", "j1", Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
                .is_none()
        );
        assert_eq!(current(), None);
    }
}
