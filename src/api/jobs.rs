//! Job endpoints: run, listings, one job, result, logs, stop, sub-status, events and runtime
//! jobs. Unknown jobs and jobs the caller may not see answer the same 404.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::ApiError;
use super::fields::RequestFields;
use super::idempotency::{self, IdempotencyKey};
use super::programs::{arguments_text, check_arguments, resolve_function};
use super::state::AppState;
use crate::auth::Caller;
use crate::compute::StopOutcome;
use crate::db::jobs::{self, JobFilter, JobRow, NewJob, SubStatusOutcome};
use crate::db::{self, programs, providers};
use crate::domain::lifecycle::JobStatus;
use crate::domain::visibility::ProviderOperation;
use crate::domain::{names, sizes, visibility};
use crate::events::{self, StatusEvent};
use crate::storage::keys;

const SUB_STATUSES: [&str; 5] = ["MAPPING", "OPTIMIZING_HARDWARE", "WAITING_QPU", "EXECUTING_QPU", "POST_PROCESSING"];

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::BadRequest(message.into())
}

pub fn job_not_found(job_id: &str) -> ApiError {
    ApiError::NotFound(format!("Job [{job_id}] not found"))
}

fn program_summary(job: &JobRow) -> Value {
    json!({ "id": job.program_id, "title": job.program_title, "provider": job.provider_name })
}

/// A job in listings and retrieval (without result).
fn job_record(job: &JobRow) -> Value {
    json!({
        "id": job.id,
        "status": job.status,
        "sub_status": job.sub_status,
        "program": program_summary(job),
        "created": db::format_timestamp(job.created),
        "updated": db::format_timestamp(job.updated),
        "function_size": job.function_size,
        "gpu": job.gpu,
    })
}

/// The job if it exists and the caller is its author.
pub(super) async fn own_job(state: &AppState, caller: &Caller, job_id: &str) -> Result<JobRow, ApiError> {
    let job = jobs::find(&state.db, job_id).await?.ok_or_else(|| job_not_found(job_id))?;
    if job.author_id != caller.user_id {
        return Err(job_not_found(job_id));
    }
    Ok(job)
}

/// Whether the caller manages the job's provider function (provider admin or its author).
pub(super) async fn manages_job_function(
    state: &AppState,
    caller: &Caller,
    job: &JobRow,
    operation: ProviderOperation,
) -> Result<bool, ApiError> {
    let Some(program_id) = &job.program_id else { return Ok(false) };
    Ok(programs::find_by_id(&state.db, &caller.user_id, program_id)
        .await?
        .is_some_and(|program| visibility::can_manage(caller.access(&program), operation)))
}

/// Runs a function: queues a job. With an `Idempotency-Key`, a retry gets the first answer.
pub async fn run_program(
    State(state): State<AppState>,
    caller: Caller,
    key: IdempotencyKey,
    headers: HeaderMap,
    fields: RequestFields,
) -> Result<Response, ApiError> {
    let request = key.with_request(&fields).await?;
    let (db, user_id) = (state.db.clone(), caller.user_id.clone());
    Ok(idempotency::answer_once(&db, &user_id, request, queue_job(state, caller, headers, fields)).await)
}

async fn queue_job(
    state: AppState,
    caller: Caller,
    headers: HeaderMap,
    fields: RequestFields,
) -> Result<Json<Value>, ApiError> {
    if fields.value("compute_profile").is_some() {
        return Err(bad(
            "'compute_profile' was removed: use 'function_size' with one of the function's sizes (S, M, L, XL).",
        ));
    }
    let raw_title = fields.required_text("title")?;
    let provider = fields.text("provider").map(|p| names::sanitize_title(&p, false)).filter(|p| !p.is_empty());
    let title = names::sanitize_title(&raw_title, false);
    let arguments = arguments_text(&fields)?;
    let config = match fields.value("config") {
        None => json!({}),
        Some(Value::String(text)) => {
            serde_json::from_str::<Value>(text).map_err(|e| bad(format!("'config' is not valid JSON: {e}")))?
        }
        Some(other) => other.clone(),
    };
    if !config.is_object() {
        return Err(bad("'config' must be a JSON object."));
    }
    let program = resolve_function(&state, &caller, provider.as_deref(), &title, visibility::can_run).await?;
    if program.disabled {
        return Err(ApiError::Locked(
            program
                .disabled_message
                .clone()
                .unwrap_or_else(|| "IBM has temporarily disabled access to this function".into()),
        ));
    }
    let catalog: serde_json::Map<String, Value> = serde_json::from_str(&program.sizes).unwrap_or_default();
    let function_size = match fields.text("function_size").filter(|s| !s.trim().is_empty()) {
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
    if !state.compute.runs_images() && program.artifact_key.is_none() {
        return Err(bad(format!(
            "Function {title} runs a container image, which needs the Kubernetes backend; this gateway runs jobs as local processes."
        )));
    }
    check_arguments(&state, &program, arguments.clone()).await?;
    let header_text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let instance = header_text("service-crn");
    // No channel with an instance is the quantum platform (as the platform check decides).
    let channel = header_text("service-channel")
        .unwrap_or_else(|| if instance.is_some() { "ibm_quantum_platform" } else { "local" }.into());
    // Runtime-instances mode: a provider function whose business model is TRIAL runs as a trial.
    let trial = match (&caller.instance, program.provider_name.as_deref()) {
        (Some(access), Some(provider)) => access.trial(provider, &program.title),
        _ => false,
    };
    let request_env = json!({
        "token": state.tokens.seal(&caller.token),
        "channel": channel,
        "instance": instance,
        "trial": trial,
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
        gpu: program.gpu && program.provider_id.is_some(),
        function_size,
    };
    let limit = state.config.active_jobs_per_user;
    let Some(created) = jobs::insert_with_limit(&state.db, &job, limit, state.publisher.outbox()).await? else {
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
    Ok(Json(json!({
        "id": job.id,
        "status": "QUEUED",
        "program": program.id,
        "created": db::format_timestamp(created),
        "result": null,
    })))
}

#[derive(Debug, Deserialize, Default)]
pub struct ListQuery {
    function: Option<String>,
    provider: Option<String>,
    status: Option<String>,
    filter: Option<String>,
    created_after: Option<String>,
    limit: Option<String>,
    offset: Option<String>,
}

fn parse_count(name: &str, value: Option<&str>, default: i64) -> Result<i64, ApiError> {
    match value {
        None => Ok(default),
        Some(text) => text
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .ok_or_else(|| bad(format!("'{name}' must be a non-negative integer."))),
    }
}

/// ISO 8601 datetime (with or without zone; naive is UTC) or date, as microseconds.
pub fn parse_created_after(text: &str) -> Result<i64, ApiError> {
    let text = text.trim();
    if let Ok(parsed) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(parsed.timestamp_micros());
    }
    for format in ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M"] {
        if let Ok(naive) = chrono::NaiveDateTime::parse_from_str(text, format) {
            return Ok(naive.and_utc().timestamp_micros());
        }
    }
    if let Ok(date) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Ok(date.and_hms_opt(0, 0, 0).expect("midnight exists").and_utc().timestamp_micros());
    }
    Err(bad(format!("'created_after' must be an ISO 8601 date or datetime, got '{text}'.")))
}

/// Builds the common filter of the two paginated listings.
fn base_filter(query: &ListQuery) -> Result<JobFilter, ApiError> {
    let mut filter = JobFilter::default();
    if let Some(status) = query.status.as_deref().filter(|s| !s.is_empty()) {
        let status: JobStatus = status.trim().to_ascii_uppercase().parse().map_err(|_| {
            bad(format!(
                "'status' must be one of QUEUED, PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED (got '{status}')."
            ))
        })?;
        filter.status = Some(status.as_str().to_string());
    }
    filter.catalog = match query.filter.as_deref() {
        None | Some("") => None,
        Some("catalog") => Some(true),
        Some("serverless") => Some(false),
        Some(other) => {
            return Err(bad(format!("\"{other}\" is not a valid choice. 'filter' takes catalog or serverless.")));
        }
    };
    if let Some(after) = query.created_after.as_deref().filter(|s| !s.is_empty()) {
        filter.created_after = Some(parse_created_after(after)?);
    }
    Ok(filter)
}

/// The paginated envelope with `next`/`previous` links carrying only `limit` and `offset`.
async fn page(
    state: &AppState,
    headers: &HeaderMap,
    path: &str,
    filter: &JobFilter,
    query: &ListQuery,
    with_result: bool,
) -> Result<Json<Value>, ApiError> {
    let limit = parse_count("limit", query.limit.as_deref(), 10)?;
    let offset = parse_count("offset", query.offset.as_deref(), 0)?;
    let (count, rows) = jobs::list(&state.db, filter, if limit == 0 { None } else { Some(limit) }, offset).await?;
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
    let scheme = headers.get("x-forwarded-proto").and_then(|h| h.to_str().ok()).unwrap_or("http");
    let link = |offset: i64| format!("{scheme}://{host}{path}?limit={limit}&offset={offset}");
    let next = (offset + limit < count || (limit == 0 && offset < count)).then(|| link(offset + limit));
    let previous = (offset > 0).then(|| link((offset - limit).max(0)));
    let results: Vec<Value> = rows
        .iter()
        .map(|job| {
            let mut record = job_record(job);
            if with_result {
                record["result"] = job.result.clone().map(Value::String).unwrap_or(Value::Null);
            }
            record
        })
        .collect();
    Ok(Json(json!({ "count": count, "next": next, "previous": previous, "results": results })))
}

pub async fn list_jobs(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Query(query): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let mut filter = base_filter(&query)?;
    filter.author_id = Some(caller.user_id.clone());
    let provider = query.provider.as_deref().map(|p| names::sanitize_title(p, false)).filter(|p| !p.is_empty());
    let provider_id = match &provider {
        Some(name) => match providers::find_by_name(&state.db, name).await? {
            Some(row) => Some(row.id),
            None => Some(String::new()),
        },
        None => None,
    };
    if let Some(function) = query.function.as_deref().filter(|f| !f.is_empty()) {
        let title = names::sanitize_title(function, false);
        let ids = jobs::program_ids_by_title(&state.db, &title, provider_id.as_deref()).await?;
        if ids.is_empty() {
            return Err(ApiError::function_not_found(None, &title));
        }
        filter.program_ids = Some(ids);
    }
    filter.provider_id = provider_id;
    page(&state, &headers, "/api/v1/jobs/", &filter, &query, false).await
}

pub async fn list_provider_jobs(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Query(query): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let provider_name = query
        .provider
        .as_deref()
        .map(|p| names::sanitize_title(p, false))
        .filter(|p| !p.is_empty())
        .ok_or_else(|| bad("'provider' not provided or is not valid"))?;
    let provider = providers::find_by_name(&state.db, &provider_name)
        .await?
        .ok_or_else(|| ApiError::provider_not_found(&provider_name))?;
    let is_admin = providers::is_admin(&state.db, &provider.id, &caller.user_id).await?;
    let mut filter = base_filter(&query)?;
    filter.provider_id = Some(provider.id.clone());
    match query.function.as_deref().filter(|f| !f.is_empty()) {
        Some(function) => {
            let title = names::sanitize_title(function, false);
            match programs::find_provider_function(&state.db, &caller.user_id, &provider.id, &title).await? {
                Some(program) if visibility::can_manage(caller.access(&program), ProviderOperation::Jobs) => {
                    filter.program_ids = Some(vec![program.id])
                }
                None if is_admin => return Err(ApiError::function_not_found(Some(&provider_name), &title)),
                _ => return Err(ApiError::provider_not_found(&provider_name)),
            }
        }
        None if is_admin => {}
        None => {
            // Authors of provider functions see the jobs of the functions they wrote.
            let authored: Vec<String> = programs::list_candidates(&state.db, &caller.user_id, Some(&provider_name))
                .await?
                .into_iter()
                .filter(|program| visibility::can_manage(caller.access(program), ProviderOperation::Jobs))
                .map(|program| program.id)
                .collect();
            if authored.is_empty() {
                return Err(ApiError::provider_not_found(&provider_name));
            }
            filter.program_ids = Some(authored);
        }
    }
    page(&state, &headers, "/api/v1/jobs/provider/", &filter, &query, false).await
}

#[derive(Debug, Deserialize)]
pub struct RetrieveQuery {
    with_result: Option<String>,
}

fn parse_bool(name: &str, value: Option<&str>, default: bool) -> Result<bool, ApiError> {
    match value.map(|v| v.trim().to_ascii_lowercase()) {
        None => Ok(default),
        Some(v) if ["true", "1", "yes", "on", "t", "y"].contains(&v.as_str()) => Ok(true),
        Some(v) if ["false", "0", "no", "off", "f", "n"].contains(&v.as_str()) => Ok(false),
        Some(_) => Err(bad(format!("Must be a valid boolean. ('{name}')"))),
    }
}

async fn stored_result(state: &AppState, job: &JobRow) -> Result<Option<String>, ApiError> {
    match state.storage.read_to_bytes(&keys::job_result(&job.id)).await? {
        Some(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        None => Ok(job.result.clone()),
    }
}

pub async fn get_job(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
    Query(query): Query<RetrieveQuery>,
) -> Result<Json<Value>, ApiError> {
    let with_result = parse_bool("with_result", query.with_result.as_deref(), true)?;
    let job = jobs::find(&state.db, &job_id).await?.ok_or_else(|| job_not_found(&job_id))?;
    let is_author = job.author_id == caller.user_id;
    if !is_author && !manages_job_function(&state, &caller, &job, ProviderOperation::Jobs).await? {
        return Err(job_not_found(&job_id));
    }
    let mut record = job_record(&job);
    if with_result {
        record["result"] = match is_author {
            true => stored_result(&state, &job).await?.map(Value::String).unwrap_or(Value::Null),
            false => Value::Null,
        };
    }
    Ok(Json(record))
}

pub async fn get_job_result(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
) -> Result<Response, ApiError> {
    let job = own_job(&state, &caller, &job_id).await?;
    Ok(match stored_result(&state, &job).await? {
        Some(result) => Json(json!({ "result": result })).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    })
}

/// The legacy way to save a result (older in-job clients).
pub async fn save_job_result(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
    fields: RequestFields,
) -> Result<Json<Value>, ApiError> {
    let job = own_job(&state, &caller, &job_id).await?;
    let result = fields.required_text("result")?;
    state.storage.put_bytes(&keys::job_result(&job.id), result.clone().into()).await?;
    let mut record = job_record(&job);
    record["result"] = Value::String(result);
    Ok(Json(record))
}

/// The job whose user log (or, with `provider`, provider log) the caller may read: user logs
/// are the author's, provider logs the provider side's.
pub(super) async fn log_reader_job(
    state: &AppState,
    caller: &Caller,
    job_id: &str,
    provider: bool,
) -> Result<JobRow, ApiError> {
    let job = jobs::find(&state.db, job_id).await?.ok_or_else(|| job_not_found(job_id))?;
    if !provider && job.author_id != caller.user_id {
        return Err(ApiError::Forbidden(format!("You don't have access to read user logs of the job [{job_id}]")));
    }
    if provider
        && (job.provider_id.is_none() || !manages_job_function(state, caller, &job, ProviderOperation::Logs).await?)
    {
        return Err(ApiError::Forbidden(format!("You don't have access to job [{job_id}]")));
    }
    Ok(job)
}

pub async fn stop_job(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
    fields: RequestFields,
) -> Result<Json<Value>, ApiError> {
    own_job(&state, &caller, &job_id).await?;
    if fields.values.get("service").is_some_and(Value::is_null) {
        return Err(bad("This field may not be null. ('service')"));
    }
    // The `service` field (a serialized runtime service with credentials) is never logged or stored.
    let outcome = state.compute.clone().stop(&job_id).await?;
    let message = match outcome {
        StopOutcome::Requested => {
            format!("Stop requested for job {job_id}; its status will show STOPPED once it has stopped.")
        }
        StopOutcome::AlreadyFinished(status) => {
            format!("Job {job_id} had already finished ({status}); nothing to stop.")
        }
    };
    Ok(Json(json!({ "message": message })))
}

pub async fn set_sub_status(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
    fields: RequestFields,
) -> Result<Json<Value>, ApiError> {
    let job = own_job(&state, &caller, &job_id).await?;
    if fields.values.get("sub_status").is_some_and(Value::is_null) {
        return Err(bad("'sub_status' cannot be null"));
    }
    let value = fields
        .text("sub_status")
        .filter(|v| SUB_STATUSES.contains(&v.as_str()))
        .ok_or_else(|| bad("'sub_status' not provided or is not valid"))?;
    match jobs::set_sub_status(&state.db, &job.id, &value, state.publisher.outbox()).await? {
        SubStatusOutcome::Updated => state.publisher.recorded(),
        SubStatusOutcome::Unchanged => {}
        SubStatusOutcome::NotActive(status) => {
            return Err(ApiError::Forbidden(format!(
                "Cannot update 'sub_status' when is not in active status. (Currently {status})"
            )));
        }
        SubStatusOutcome::Missing => return Err(job_not_found(&job_id)),
    }
    let job = jobs::find(&state.db, &job_id).await?.ok_or_else(|| job_not_found(&job_id))?;
    Ok(Json(json!({ "job": job_record(&job) })))
}

fn event_type(raw: Option<String>) -> Result<Option<String>, ApiError> {
    match raw.map(|t| t.trim().to_ascii_uppercase()) {
        None => Ok(None),
        Some(t) if t == "ERROR" => Ok(Some(t)),
        Some(_) => Err(bad("Type is not valid. Valid types: ['ERROR']")),
    }
}

pub async fn create_job_event(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
    fields: RequestFields,
) -> Result<StatusCode, ApiError> {
    let job = own_job(&state, &caller, &job_id).await?;
    if event_type(fields.text("type"))?.is_none() {
        return Err(bad("Type is not valid. Valid types: ['ERROR']"));
    }
    let data = json!({
        "code": fields.required_text("code")?,
        "message": fields.required_text("message")?,
        "exception": fields.required_text("exception")?,
        "args": match fields.value("args") {
            Some(Value::String(text)) => serde_json::from_str(text).unwrap_or(Value::String(text.clone())),
            Some(other) => other.clone(),
            None => Value::Null,
        },
    });
    if !jobs::insert_error_event(&state.db, &job.id, &data, state.publisher.outbox()).await? {
        return Err(ApiError::Forbidden("You can create events on active jobs only".into()));
    }
    state.publisher.recorded();
    Ok(StatusCode::OK)
}

#[derive(Debug, Deserialize)]
pub struct EventsQuery {
    #[serde(rename = "type")]
    event_type: Option<String>,
}

pub async fn list_job_events(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
    Query(query): Query<EventsQuery>,
) -> Result<Json<Vec<Value>>, ApiError> {
    let job = own_job(&state, &caller, &job_id).await?;
    let wanted = event_type(query.event_type.filter(|t| !t.is_empty()))?;
    let events = jobs::list_events(&state.db, &job.id, wanted.as_deref()).await?;
    Ok(Json(events.iter().map(|event| event_json(&job.id, event)).collect()))
}

/// A job event as `events/` lists it and `events/stream/` sends it.
pub(super) fn event_json(job_id: &str, event: &jobs::EventRow) -> Value {
    json!({
        "id": event.id,
        "job": job_id,
        "event_type": event.event_type,
        "origin": event.origin,
        "context": event.context,
        "created": db::format_timestamp(event.created),
        "data": serde_json::from_str::<Value>(&event.data).unwrap_or(Value::Null),
    })
}

pub async fn list_runtime_jobs(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let job = own_job(&state, &caller, &job_id).await?;
    let rows = jobs::list_runtime_jobs(&state.db, &job.id).await?;
    let items: Vec<Value> = rows
        .into_iter()
        .map(|r| json!({ "runtime_job": r.runtime_job, "runtime_session": r.runtime_session }))
        .collect();
    Ok(Json(json!({ "runtime_jobs": items })))
}

pub async fn add_runtime_job(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
    fields: RequestFields,
) -> Result<Json<Value>, ApiError> {
    let job = own_job(&state, &caller, &job_id).await?;
    let runtime_job = fields.required_text("runtime_job")?;
    if runtime_job.len() > 100 {
        return Err(bad("'runtime_job' must be at most 100 characters."));
    }
    let session = fields.text("runtime_session").filter(|s| !s.is_empty());
    match jobs::insert_runtime_job(&state.db, &job.id, &runtime_job, session.as_deref()).await {
        Ok(()) => Ok(Json(
            json!({ "message": format!("RuntimeJob object [{runtime_job}] created for serverless job id [{job_id}].") }),
        )),
        // As the reference: a failed association is reported in a 200 answer.
        Err(error) if error.unique_violation().is_some() => Ok(Json(json!({
            "message": format!(
                "Failed to create RuntimeJob object [{runtime_job}] for job id [{job_id}]. Error: runtime job {runtime_job} is already recorded."
            )
        }))),
        Err(error) => Err(error.into()),
    }
}

/// Jobs of one function: all authors' (without result) for those who manage it, else the
/// caller's own.
pub async fn get_program_jobs(
    State(state): State<AppState>,
    caller: Caller,
    Path(program_id): Path<String>,
) -> Result<Json<Vec<Value>>, ApiError> {
    let program = programs::find_by_id(&state.db, &caller.user_id, &program_id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("Qiskit Function {program_id} doesn't exist.")))?;
    let manages = visibility::can_manage(caller.access(&program), ProviderOperation::Jobs);
    let filter = JobFilter {
        program_ids: Some(vec![program.id.clone()]),
        author_id: (!manages).then(|| caller.user_id.clone()),
        ..Default::default()
    };
    let (_, rows) = jobs::list(&state.db, &filter, Some(1000), 0).await?;
    Ok(Json(
        rows.iter()
            .map(|job| {
                let mut record = job_record(job);
                if !manages {
                    record["result"] = job.result.clone().map(Value::String).unwrap_or(Value::Null);
                }
                record
            })
            .collect(),
    ))
}
