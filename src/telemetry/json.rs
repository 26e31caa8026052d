//! `--log-format json`: one JSON object a line, `{"timestamp", "level", "target", "message",
//! "fields", "span", "trace_id", "span_id"}`, the ids those of the span the event happened in
//! (absent outside any span), so a log line leads to its trace.

use std::fmt;

use opentelemetry::trace::TraceContextExt;
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

pub(super) struct JsonLines;

/// An event's fields as JSON values.
#[derive(Default)]
struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().into(), Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), Value::String(value.into()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.insert(field.name().into(), Value::String(crate::shared::describe(value)));
    }
}

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, context: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let mut fields = fields.0;
        let message = fields.remove("message").unwrap_or(Value::Null);
        let metadata = event.metadata();
        let mut line = Map::new();
        line.insert("timestamp".into(), chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true).into());
        line.insert("level".into(), metadata.level().as_str().into());
        line.insert("target".into(), metadata.target().into());
        line.insert("message".into(), message);
        line.insert("fields".into(), Value::Object(fields));
        if let Some(span) = context.lookup_current() {
            line.insert("span".into(), span.name().into());
            let ids = tracing::dispatcher::get_default(|dispatch| {
                tracing_opentelemetry::get_otel_context(&span.id(), dispatch)
            })
            .map(|otel| otel.span().span_context().clone())
            .filter(|ids| ids.is_valid());
            if let Some(ids) = ids {
                line.insert("trace_id".into(), ids.trace_id().to_string().into());
                line.insert("span_id".into(), ids.span_id().to_string().into());
            }
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}
