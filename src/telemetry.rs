//! Traces and logs of every role (docs/observability.md). Logs go to stderr as human text or,
//! with `--log-format json`, one JSON object a line carrying the current trace and span ids.
//! Spans are exported over OTLP/HTTP (protobuf) in batches from a thread of their own only when
//! the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set;
//! without it no exporter exists and the job steps make no spans. A collector that is down or
//! slow loses spans (the batch queue drops the oldest), never a request: nothing on a request's
//! path waits for an export.
//!
//! `context` carries one job's trace across processes: the W3C `traceparent` text that the
//! job's row, its FunctionJob annotation and its environment hold.

pub mod context;
pub mod db_waits;
mod export;
mod json;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer as _, Registry};

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human text (colored on a terminal).
    #[default]
    Text,
    /// One JSON object a line: timestamp, level, target, message, fields, trace_id, span_id.
    Json,
}

/// Set under `--log-format json`: start-up warnings become log lines then.
static JSON: AtomicBool = AtomicBool::new(false);

/// A warning for whoever starts the process (`warning: …`): that plain line on stderr, or under
/// `--log-format json` a warning log line, so every line of stderr stays JSON.
pub fn operator_warning(text: &str) {
    if JSON.load(Ordering::Relaxed) {
        tracing::warn!("{}", text.strip_prefix("warning: ").unwrap_or(text));
    } else {
        eprintln!("{text}");
    }
}

/// Set once spans get trace ids (exported, or for JSON logs): job steps make spans only then.
static SPANS: AtomicBool = AtomicBool::new(false);

/// Whether spans are made and carry ids. Off by default, so that tracing costs nothing unless
/// it was asked for.
pub fn enabled() -> bool {
    SPANS.load(Ordering::Relaxed)
}

/// The `OTEL_*` variables a job's launcher is given (from the role's own environment) so its
/// spans and the function's reach the same collector. The service name is left out (the
/// launcher and the function name themselves).
pub const FORWARDED_PREFIX: &str = "OTEL_";
const NOT_FORWARDED: [&str; 1] = ["OTEL_SERVICE_NAME"];

/// The variables of `variables` (name, value) a job's launcher inherits.
pub fn forwarded(variables: impl Iterator<Item = (String, String)>) -> Vec<(String, String)> {
    let mut forwarded: Vec<(String, String)> = variables
        .filter(|(name, _)| name.starts_with(FORWARDED_PREFIX) && !NOT_FORWARDED.contains(&name.as_str()))
        .collect();
    forwarded.sort();
    forwarded
}

/// The collector's credentials: the launcher uses them and keeps them from the function's
/// environment.
pub const COLLECTOR_CREDENTIALS: [&str; 2] = ["OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"];

/// Whether the variables ask for an exporter: an endpoint set, the SDK not disabled and the
/// traces exporter not `none`.
pub fn exporter_configured(variable: impl Fn(&str) -> Option<String>) -> bool {
    let set = |name: &str| variable(name).is_some_and(|value| !value.trim().is_empty());
    let disabled = variable("OTEL_SDK_DISABLED").is_some_and(|value| value.trim().eq_ignore_ascii_case("true"));
    let none = variable("OTEL_TRACES_EXPORTER").is_some_and(|value| value.trim().eq_ignore_ascii_case("none"));
    (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) && !disabled && !none
}

/// What `init` set up; `shutdown` sends the spans still queued.
#[must_use = "call shutdown before the process ends, or queued spans are lost"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

/// How long the end of a process waits for its last spans to be sent.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

impl Telemetry {
    /// Sends the queued spans, waiting at most a few seconds (a dead collector delays the end
    /// of the process by no more).
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else { return };
        // The SDK blocks its caller while the batch thread sends; keep that off the runtime.
        let ended = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(SHUTDOWN_WAIT));
        match tokio::time::timeout(SHUTDOWN_WAIT + Duration::from_secs(1), ended).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => tracing::warn!(error = %error, "failed to send the last spans"),
            _ => tracing::warn!("the last spans were not sent in time"),
        }
    }
}

/// Installs the process's logging and, when configured, its span exporter. `service` is the
/// service name unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` names one. Must run
/// inside the Tokio runtime (the exporter sends through it).
pub fn init(service: &'static str, format: LogFormat) -> Telemetry {
    // Each layer has its filter: the logs and spans `RUST_LOG`'s (or the default), the
    // database-wait layer only sqlx's pool acquisitions, at whatever level the logs are.
    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let exporting = exporter_configured(|name| std::env::var(name).ok());
    let (provider, problem) = match (exporting, format) {
        (false, LogFormat::Text) => (None, None),
        _ => match provider(service, exporting) {
            Ok(provider) => (Some(provider), None),
            Err(problem) => {
                (Some(provider(service, false).expect("a provider without exporter builds")), Some(problem))
            }
        },
    };
    let mut layers: Vec<Box<dyn tracing_subscriber::Layer<Registry> + Send + Sync>> = vec![
        db_waits::AcquireLayer
            .with_filter(
                tracing_subscriber::filter::Targets::new().with_target(db_waits::ACQUIRE_TARGET, tracing::Level::TRACE),
            )
            .boxed(),
    ];
    if let Some(provider) = &provider {
        layers
            .push(tracing_opentelemetry::layer().with_tracer(provider.tracer("gantry")).with_filter(filter()).boxed());
    }
    let writer = std::io::stderr;
    layers.push(match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(writer)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_filter(filter())
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .with_writer(writer)
            .event_format(json::JsonLines)
            .with_filter(filter())
            .boxed(),
    });
    tracing_subscriber::registry().with(layers).init();
    if let Some(problem) = problem {
        tracing::warn!(error = %problem, "failed to set up the span exporter; spans are not exported");
    }
    SPANS.store(provider.is_some(), Ordering::Relaxed);
    JSON.store(format == LogFormat::Json, Ordering::Relaxed);
    Telemetry { provider }
}

fn provider(service: &'static str, exporting: bool) -> Result<SdkTracerProvider, String> {
    let named = std::env::var_os("OTEL_SERVICE_NAME").is_some()
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|attributes| attributes.contains("service.name="));
    let mut resource = Resource::builder();
    if !named {
        resource = resource.with_service_name(service);
    }
    let mut builder = SdkTracerProvider::builder().with_resource(resource.build());
    if exporting {
        let client = export::OtlpClient::new(tokio::runtime::Handle::current())?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_http_client(client)
            .build()
            .map_err(|e| e.to_string())?;
        builder = builder.with_batch_exporter(exporter);
    }
    Ok(builder.build())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn variables<'a>(set: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| set.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string())
    }

    #[test]
    fn spans_are_exported_only_with_an_endpoint() {
        assert!(!exporter_configured(variables(&[])));
        assert!(!exporter_configured(variables(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])));
        assert!(exporter_configured(variables(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")])));
        assert!(exporter_configured(variables(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/v1/traces")])));
        let disabled = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_SDK_DISABLED", "TRUE")];
        assert!(!exporter_configured(variables(&disabled)));
        let none = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_TRACES_EXPORTER", "none")];
        assert!(!exporter_configured(variables(&none)));
    }

    #[test]
    fn the_launcher_gets_the_otel_variables_but_the_service_name() {
        let given = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_SERVICE_NAME", "gateway"),
            ("PATH", "/bin"),
            ("OTEL_TRACES_SAMPLER", "always_on"),
        ];
        let forwarded = forwarded(given.iter().map(|(n, v)| (n.to_string(), v.to_string())));
        let names: Vec<&str> = forwarded.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_SAMPLER"]);
    }
}
