//! `POST programs/run/`: queue a job of a function the caller may run, within the caller's
//! active-job limit (429 beyond), and hand it to compute. With an `Idempotency-Key`, a retry
//! gets the first answer.

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Serialize;
use serde_json::{Value, json};
use tracing::Instrument;
use utoipa::ToSchema;

use crate::api::access::runnable_function;
use crate::api::error::{ApiError, ErrorBody};
use crate::api::fields::RequestFields;
use crate::api::idempotency::{self, IdempotencyKey, IdempotencyKeyHeader};
use crate::api::programs::validate::check_arguments;
use crate::api::shared::{Size, arguments_text, bad};
use crate::api::state::AppState;
use crate::auth::Caller;
use crate::db::jobs::{self, NewJob};
use crate::db::{self};
use crate::domain::{names, sizes, visibility};
use crate::events::{self, StatusEvent};
use crate::telemetry::{self, context};

/// Run a function: queue a job
///
/// With an `Idempotency-Key`, a retry gets the first answer.
#[utoipa::path(post, path = "/programs/run/", tag = "jobs", params(IdempotencyKeyHeader),
    request_body(content(
        (RunRequest = "application/json"),
        (RunRequest = "application/x-www-form-urlencoded"))),
    responses((status = 200, description = "the queued job", body = RunAnswer),
        (status = 423, description = "the function is disabled", body = ErrorBody),
        (status = 429, description = "the caller's active-job limit is reached, or a budget the run counts against is spent", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn run_program(
    State(state): State<AppState>,
    caller: Caller,
    key: IdempotencyKey,
    headers: HeaderMap,
    fields: RequestFields,
) -> Result<Response, ApiError> {
    let request = key.with_request(&fields).await?;
    let (db, user_id) = (state.db.clone(), caller.user_id.clone());
    let work = async move {
        let request = RunRequest::parse(&fields)?;
        run(&state, &caller, request, RunHeaders::of(&headers)).await.map(Json)
    };
    Ok(idempotency::answer_once(&db, &user_id, request, work).await)
}

/// A database client span (OpenTelemetry conventions) around one statement's work, while spans
/// are on.
fn database_span(db: &db::Db, operation: &'static str, table: &'static str) -> tracing::Span {
    if !telemetry::enabled() {
        return tracing::Span::none();
    }
    let system = match db.backend_name() {
        "postgres" => "postgresql",
        other => other,
    };
    tracing::info_span!(
        "db",
        otel.name = %format!("{operation} {table}"),
        otel.kind = "client",
        db.system.name = system,
        db.operation.name = operation,
        db.collection.name = table,
    )
}

/// Queues a job of a function the caller may run: checks the function is enabled, the size is
/// one of its sizes, this gateway can run it and the arguments fit its schema; records the job
/// within the caller's active-job limit (429 beyond), publishes QUEUED and hands it to compute.
pub async fn run(
    state: &AppState,
    caller: &Caller,
    request: RunRequest,
    headers: RunHeaders,
) -> Result<RunAnswer, ApiError> {
    let RunRequest { title, provider, arguments, function_size, config } = request;
    let backfill = config.get("backfill").and_then(Value::as_bool).unwrap_or(false);
    let span = tracing::Span::current();
    span.record("gantry.function", title.as_str());
    if let Some(provider) = &provider {
        span.record("gantry.provider", provider.as_str());
    }
    let program = runnable_function(state, caller, provider.as_deref(), &title).await?;
    if program.disabled {
        return Err(ApiError::Locked(
            program
                .disabled_message
                .clone()
                .unwrap_or_else(|| "IBM has temporarily disabled access to this function".into()),
        ));
    }
    let catalog: serde_json::Map<String, Value> = serde_json::from_str(&program.sizes).unwrap_or_default();
    let function_size = match function_size {
        Some(raw) => {
            let label = sizes::parse_label(&raw).map_err(bad)?;
            if !catalog.contains_key(&label) {
                let mut labels: Vec<&String> = catalog.keys().collect();
                labels.sort();
                let offered = if labels.is_empty() {
                    "none".to_string()
                } else {
                    labels.iter().map(|l| l.as_str()).collect::<Vec<_>>().join(", ")
                };
                return Err(bad(format!(
                    "function_size '{label}' is not in the sizes of function {title} ({offered})."
                )));
            }
            Some(label)
        }
        None => program.default_size.clone(),
    };
    let gpu = program.gpu && program.provider_id.is_some();
    let image = program.artifact_key.is_none();
    let none = sizes::Resources { cpu: String::new(), memory: String::new(), gpus: 0, gpu_model: None };
    let asked = sizes::job_resources(&catalog, function_size.as_deref(), gpu, &none);
    if let Err(why) = state.compute.can_run(image, &asked) {
        return Err(bad(format!("Function {title} cannot run here: {why}")));
    }
    check_arguments(state, &program, arguments.clone()).await?;
    crate::api::usage::check_budgets(state, &caller.user_id, &program.id).await?;
    let instance = headers.instance;
    // No channel with an instance is the quantum platform (as the platform check decides).
    let channel =
        headers.channel.unwrap_or_else(|| if instance.is_some() { "ibm_quantum_platform" } else { "local" }.into());
    let instance_model = match (&caller.instance, program.provider_name.as_deref()) {
        (Some(access), Some(provider)) => access.business_model(provider, &program.title),
        _ => None,
    };
    let trial = visibility::is_trial(caller.access(&program), instance_model == Some(visibility::TRIAL));
    let business_model = visibility::business_model(caller.access(&program), trial, instance_model);
    let request_env = json!({
        "token": state.tokens.seal(&caller.token),
        "channel": channel,
        "instance": &instance,
    });
    let job = NewJob {
        id: db::new_id(),
        program_id: program.id.clone(),
        provider_id: program.provider_id.clone(),
        author_id: caller.user_id.clone(),
        arguments,
        config: config.to_string(),
        env_vars: request_env.to_string(),
        runner: program.runner.clone(),
        gpu,
        function_size,
        trial,
        business_model: business_model.to_string(),
        // The job's trace: this request's span, or (spans off) the trace the caller sent.
        traceparent: context::current().or(headers.traceparent.filter(|sent| context::parse(sent).is_some())),
        instance,
        backfill: program.backfill || backfill,
        gpu_model: if gpu { asked.gpu_model.clone() } else { None },
    };
    span.record("gantry.job.id", job.id.as_str());
    let limit = state.config.active_jobs_per_user;
    let inserted = jobs::insert_with_limit(&state.db, &job, limit, state.publisher.outbox())
        .instrument(database_span(&state.db, "INSERT", "jobs"))
        .await?;
    let Some(created) = inserted else {
        return Err(ApiError::TooManyRequests(format!("Active job limit reached. The maximum allowed is {limit}.")));
    };
    events::publish(
        &state.publisher,
        StatusEvent {
            job_id: job.id.clone(),
            status: "QUEUED".into(),
            origin: "API".into(),
            context: "RUN_PROGRAM".into(),
            created: db::format_timestamp(db::now_micros()),
        },
    );
    state.compute.clone().submit(&job.id).await;
    Ok(RunAnswer {
        created: db::format_timestamp(created),
        id: job.id,
        program: program.id,
        result: None,
        status: "QUEUED".into(),
    })
}

/// `config` of a run (accepted, kept with the job).
#[derive(Debug, Clone, ToSchema)]
pub struct RunConfig {
    pub workers: Option<i64>,
    #[schema(required = false)]
    pub auto_scaling: bool,
    /// Run this job as backfill (docs/scheduling.md).
    #[schema(required = false)]
    pub backfill: bool,
}

/// `POST programs/run/`.
#[derive(Debug, Clone, ToSchema)]
pub struct RunRequest {
    /// The function's title (sanitized to letters, digits, _ and -).
    #[schema(min_length = 1, example = "example-fn")]
    pub title: String,
    /// The provider of a provider function.
    #[schema(nullable = false)]
    pub provider: Option<String>,
    /// The arguments as encoded JSON text (the client sends a string; a JSON object is accepted
    /// too), validated against the function's schema.
    #[schema(min_length = 1, example = "{}")]
    pub arguments: String,
    // One of the function's sizes (checked once the function is found).
    #[schema(value_type = Option<Size>, inline, nullable = false)]
    pub function_size: Option<String>,
    #[schema(value_type = Option<RunConfig>, inline, nullable = false)]
    pub config: Value,
}

impl RunRequest {
    pub fn parse(fields: &RequestFields) -> Result<RunRequest, ApiError> {
        if fields.value("compute_profile").is_some() {
            return Err(bad(
                "'compute_profile' was removed: use 'function_size' with one of the function's sizes (S, M, L, XL).",
            ));
        }
        let raw_title = fields.required_text("title")?;
        let provider = fields.text("provider").map(|p| names::sanitize_title(&p, false)).filter(|p| !p.is_empty());
        let title = names::sanitize_title(&raw_title, false);
        let arguments = arguments_text(fields)?;
        let config = match fields.value("config") {
            None => Value::Object(Default::default()),
            Some(Value::String(text)) => {
                serde_json::from_str::<Value>(text).map_err(|e| bad(format!("'config' is not valid JSON: {e}")))?
            }
            Some(other) => other.clone(),
        };
        if !config.is_object() {
            return Err(bad("'config' must be a JSON object."));
        }
        if let Some(backfill) = config.get("backfill")
            && !backfill.is_boolean()
        {
            return Err(bad(format!("'config.backfill' must be true or false, got {backfill}.")));
        }
        let function_size = fields.text("function_size").filter(|s| !s.trim().is_empty());
        Ok(RunRequest { title, provider, arguments, function_size, config })
    }
}

/// The headers of a run that the job keeps: `Service-CRN` (the instance) and `Service-Channel`.
#[derive(Debug, Clone, Default)]
pub struct RunHeaders {
    pub instance: Option<String>,
    pub channel: Option<String>,
    /// The caller's W3C trace context: kept with the job when spans are off.
    pub traceparent: Option<String>,
}

impl RunHeaders {
    pub fn of(headers: &axum::http::HeaderMap) -> RunHeaders {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        RunHeaders { instance: text("service-crn"), channel: text("service-channel"), traceparent: text("traceparent") }
    }
}

/// The answer of `programs/run/`: the queued job.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RunAnswer {
    #[schema(format = DateTime)]
    pub created: String,
    #[schema(format = Uuid)]
    pub id: String,
    /// The function's id.
    pub program: String,
    /// Always null: the job has just been queued.
    #[schema(required = true, value_type = Option<String>)]
    pub result: Option<String>,
    /// `QUEUED`.
    pub status: String,
}
