//! Jobs: run (queue a job within the caller's active-job limit), listings, one job, its result,
//! stop, sub-status, events, runtime jobs, the jobs of one function and the caller's queue.
//! Unknown jobs and jobs the caller may not see answer the same 404. A body sent to one job is
//! parsed once the job is found, the order in which the reference checks them.

use axum::http::{HeaderMap, header};
use serde_json::{Value, json};

use super::access::{job_not_found, manages_job_function, own_job, runnable_function};
use super::programs::check_arguments;
use crate::api::answers::{
    ArgumentsAnswer, EventRecord, JobAnswer, JobPage, JobRecord, Message, ProgramSummary, QueueAnswer, QueuedPlace,
    ResultAnswer, RunAnswer, RuntimeJob, RuntimeJobs, SlotUse, TraceAnswer, WaitingFor,
};
use crate::api::error::ApiError;
use crate::api::fields::RequestFields;
use crate::api::requests::{
    EventRequest, JobsQuery, RunHeaders, RunRequest, RuntimeJobRequest, SaveResultRequest, StopRequest,
    SubStatusRequest, event_type,
};
use crate::api::state::AppState;
use crate::auth::Caller;
use crate::auth::runtime_service::{self, ReportedRuntimeJob, ServiceField};
use crate::compute::StopOutcome;
use crate::db::jobs::{self, AdminOf, JobFilter, JobRow, NewJob, SubStatusOutcome, Window};
use crate::db::{self, programs, providers, queue};
use crate::domain::admission::Limits;
use crate::domain::lifecycle::JobStatus;
use crate::domain::paging::{self, Cursor, Links};
use crate::domain::visibility::ProviderOperation;
use crate::domain::{names, sizes, visibility};
use crate::events::{self, StatusEvent};
use crate::storage::keys;
use crate::telemetry::{self, context};
use tracing::Instrument;

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

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::BadRequest(message.into())
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
    let instance = headers.instance;
    // No channel with an instance is the quantum platform (as the platform check decides).
    let channel =
        headers.channel.unwrap_or_else(|| if instance.is_some() { "ibm_quantum_platform" } else { "local" }.into());
    let instance_trial = match (&caller.instance, program.provider_name.as_deref()) {
        (Some(access), Some(provider)) => access.trial(provider, &program.title),
        _ => false,
    };
    let trial = visibility::is_trial(caller.access(&program), instance_trial);
    let request_env = json!({
        "token": state.tokens.seal(&caller.token),
        "channel": channel,
        "instance": instance,
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
        // The job's trace: this request's span, or (spans off) the trace the caller sent.
        traceparent: context::current().or(headers.traceparent.filter(|sent| context::parse(sent).is_some())),
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
fn base_filter(query: &JobsQuery) -> Result<JobFilter, ApiError> {
    let mut filter = JobFilter::default();
    if let Some(status) = query.status.as_deref().filter(|s| !s.is_empty()) {
        // Any text, as the reference takes it: a status's name in any case selects it, and a
        // value no job has (`CANCELLED`, a typo) answers an empty page, never a 400.
        let text = status.trim();
        filter.status = Some(match text.to_ascii_uppercase().parse::<JobStatus>() {
            Ok(known) => known.as_str().to_string(),
            Err(_) => text.to_string(),
        });
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

/// The paginated envelope. Without `cursor`: the reference's offset pages, whose `next` and
/// `previous` links carry only `limit` and `offset`. With `cursor` (empty for the first page):
/// keyset pages, whose links carry `limit`, the next or previous cursor and the request's
/// filters (see `domain::paging`).
async fn page(
    state: &AppState,
    headers: &HeaderMap,
    path: &str,
    filter: &JobFilter,
    query: &JobsQuery,
) -> Result<JobPage, ApiError> {
    let empty = || JobPage { count: 0, next: None, previous: None, results: Vec::new() };
    Ok(page_if_admin(state, headers, path, filter, query).await?.unwrap_or_else(empty))
}

/// `page`, for a filter with `admin_of`: `None` when its user does not administer its provider
/// (see `jobs::page_if_admin`). Without `admin_of`, always `Some`.
async fn page_if_admin(
    state: &AppState,
    headers: &HeaderMap,
    path: &str,
    filter: &JobFilter,
    query: &JobsQuery,
) -> Result<Option<JobPage>, ApiError> {
    let limit = parse_count("limit", query.limit.as_deref(), 10)?;
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
    let scheme = headers.get("x-forwarded-proto").and_then(|h| h.to_str().ok()).unwrap_or("http");
    let page_limit = if limit == 0 { None } else { Some(limit) };
    let Some(cursor) = query.cursor.as_deref() else {
        let offset = parse_count("offset", query.offset.as_deref(), 0)?;
        let Some((count, rows, _)) = jobs::page_if_admin(&state.db, filter, page_limit, Window::Offset(offset)).await?
        else {
            return Ok(None);
        };
        let link = |offset: i64| format!("{scheme}://{host}{path}?limit={limit}&offset={offset}");
        let end = offset.saturating_add(limit);
        let next = (end < count || (limit == 0 && offset < count)).then(|| link(end));
        let previous = (offset > 0).then(|| link((offset - limit).max(0)));
        return Ok(Some(JobPage {
            count,
            next,
            previous,
            results: rows.into_iter().map(JobRecord::from_row).collect(),
        }));
    };
    if query.offset.is_some() {
        return Err(bad("'cursor' and 'offset' cannot be used together: a cursor already says where the page starts."));
    }
    let from = match cursor.trim() {
        "" => None,
        text => Some(Cursor::decode(text).map_err(bad)?),
    };
    let Some((count, rows, more)) =
        jobs::page_if_admin(&state.db, filter, page_limit, Window::Keyset(from.as_ref())).await?
    else {
        return Ok(None);
    };
    let places: Vec<(i64, &str)> = rows.iter().map(|job| (job.created, job.id.as_str())).collect();
    let Links { next, previous } = paging::links(&places, more, from.as_ref());
    let link = |cursor: Cursor| format!("{scheme}://{host}{path}?{}", keyset_query(limit, &cursor, query));
    Ok(Some(JobPage {
        count,
        next: next.map(link),
        previous: previous.map(link),
        results: rows.into_iter().map(JobRecord::from_row).collect(),
    }))
}

/// The query of a keyset page's link: `limit`, `cursor`, then the request's filters as sent.
fn keyset_query(limit: i64, cursor: &Cursor, query: &JobsQuery) -> String {
    let mut pairs = vec![("limit", limit.to_string()), ("cursor", cursor.encode())];
    let filters = [
        ("provider", &query.provider),
        ("function", &query.function),
        ("status", &query.status),
        ("filter", &query.filter),
        ("created_after", &query.created_after),
    ];
    pairs.extend(filters.into_iter().filter_map(|(name, value)| value.clone().map(|value| (name, value))));
    serde_urlencoded::to_string(&pairs).expect("text pairs always encode")
}

/// The caller's jobs, newest first, filtered and paginated.
pub async fn list(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    query: JobsQuery,
) -> Result<JobPage, ApiError> {
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
    page(state, headers, "/api/v1/jobs/", &filter, &query).await
}

/// Jobs of a provider's functions, every author's: all of them for its admins, those of the
/// functions they wrote for authors.
pub async fn list_provider(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    query: JobsQuery,
) -> Result<JobPage, ApiError> {
    let provider_name = query
        .provider
        .as_deref()
        .map(|p| names::sanitize_title(p, false))
        .filter(|p| !p.is_empty())
        .ok_or_else(|| bad("'provider' not provided or is not valid"))?;
    let function = query.function.as_deref().filter(|f| !f.is_empty());
    if function.is_none() {
        // An admin's listing of every function's jobs: the provider, the right and the page in
        // one statement. Anyone else's goes on below.
        let mut filter = base_filter(&query)?;
        filter.admin_of = Some(AdminOf { provider: provider_name.clone(), user_id: caller.user_id.clone() });
        if let Some(page) = page_if_admin(state, headers, "/api/v1/jobs/provider/", &filter, &query).await? {
            return Ok(page);
        }
    }
    let (provider_id, is_admin) = providers::find_with_admin(&state.db, &provider_name, &caller.user_id)
        .await?
        .ok_or_else(|| ApiError::provider_not_found(&provider_name))?;
    let mut filter = base_filter(&query)?;
    filter.provider_id = Some(provider_id.clone());
    match function {
        Some(function) => {
            let title = names::sanitize_title(function, false);
            match programs::find_provider_function(&state.db, &caller.user_id, &provider_id, &title).await? {
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
            let authored: Vec<String> =
                programs::list_candidates(&state.db, &caller.user_id, Some(&provider_name), caller.has_instance())
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
    page(state, headers, "/api/v1/jobs/provider/", &filter, &query).await
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
    let stored = state.storage.read_to_bytes(&keys::job_result(&job.id)).await;
    match stored.map_err(|e| ApiError::storage(&state.storage, e, None))? {
        Some(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        None => Ok(job.result.clone()),
    }
}

/// One job, for its author (with its result unless `with_result` is false) or for who manages
/// its function (result null).
pub async fn get(
    state: &AppState,
    caller: &Caller,
    job_id: &str,
    with_result: Option<&str>,
) -> Result<JobRecord, ApiError> {
    let with_result = parse_bool("with_result", with_result, true)?;
    let job = jobs::find(&state.db, job_id).await?.ok_or_else(|| job_not_found(job_id))?;
    let is_author = job.author_id == caller.user_id;
    if !is_author && !manages_job_function(state, caller, &job, ProviderOperation::Jobs).await? {
        return Err(job_not_found(job_id));
    }
    let record = JobRecord::of(&job);
    Ok(match (with_result, is_author) {
        (false, _) => record,
        (true, true) => record.with_result(stored_result(state, &job).await?),
        (true, false) => record.with_result(None),
    })
}

/// The job's trace (those who may read the job), with its address in a tracing UI when the
/// gateway has `--trace-link`.
pub async fn trace(state: &AppState, caller: &Caller, job_id: &str) -> Result<TraceAnswer, ApiError> {
    get(state, caller, job_id, Some("false")).await?;
    let trace_id = jobs::traceparent(&state.db, job_id)
        .await?
        .and_then(|traceparent| traceparent.split('-').nth(1).map(str::to_string))
        .ok_or_else(|| ApiError::NotFound(format!("Job {job_id} has no trace.")))?;
    let link = state.config.trace_link.as_ref().map(|template| template.replace("{trace_id}", &trace_id));
    Ok(TraceAnswer { trace_id, link })
}

/// The arguments of the caller's job, as sent to `run`.
pub async fn arguments(state: &AppState, caller: &Caller, job_id: &str) -> Result<ArgumentsAnswer, ApiError> {
    let job = own_job(state, caller, job_id).await?;
    let arguments = jobs::arguments(&state.db, &job.id).await?.ok_or_else(|| job_not_found(job_id))?;
    Ok(ArgumentsAnswer { arguments })
}

/// The result of the caller's job; `None` when it has none (204).
pub async fn result(state: &AppState, caller: &Caller, job_id: &str) -> Result<Option<ResultAnswer>, ApiError> {
    let job = own_job(state, caller, job_id).await?;
    Ok(stored_result(state, &job).await?.map(|result| ResultAnswer { result }))
}

/// Saves a result the legacy way (older in-job clients).
pub async fn save_result(
    state: &AppState,
    caller: &Caller,
    job_id: &str,
    fields: &RequestFields,
) -> Result<JobRecord, ApiError> {
    let job = own_job(state, caller, job_id).await?;
    let request = SaveResultRequest::parse(fields)?;
    state.storage.put_bytes(&keys::job_result(&job.id), request.result.clone().into()).await.map_err(|e| {
        ApiError::storage(&state.storage, e, Some(format!("the result of job {} was not stored", job.id)))
    })?;
    Ok(JobRecord::of(&job).with_result(Some(request.result)))
}

/// Asks compute to stop the caller's job, then cancels the runtime jobs it reported with the
/// runtime service the caller sent (the job is stopped whatever that service answers). The
/// message says what happened to each, after the stop's own part.
pub async fn stop(
    state: &AppState,
    caller: &Caller,
    job_id: &str,
    fields: &RequestFields,
) -> Result<Message, ApiError> {
    let job = own_job(state, caller, job_id).await?;
    let StopRequest { service } = StopRequest::parse(fields)?;
    let outcome = state.compute.clone().stop(job_id).await?;
    let mut parts = vec![match outcome {
        StopOutcome::Requested => {
            format!("Stop requested for job {job_id}; its status will show STOPPED once it has stopped.")
        }
        StopOutcome::AlreadyFinished(status) => {
            format!("Job {job_id} had already finished ({status}); nothing to stop.")
        }
    }];
    match service {
        ServiceField::Absent => parts.push(runtime_service::SERVICE_NOT_FOUND.into()),
        ServiceField::Unreadable => parts.push(runtime_service::SERVICE_UNREADABLE.into()),
        ServiceField::Account(account) => {
            let reported: Vec<ReportedRuntimeJob> = jobs::list_runtime_jobs(&state.db, &job.id)
                .await?
                .into_iter()
                .map(|row| ReportedRuntimeJob { job: row.runtime_job, session: row.runtime_session })
                .collect();
            if reported.is_empty() {
                parts.push(runtime_service::NO_RUNTIME_JOBS.into());
            } else {
                parts.extend(state.runtime.cancel(&account, &reported).await);
            }
        }
    }
    Ok(Message::new(parts.join(" ")))
}

/// Sets the sub-status of the caller's active job.
pub async fn set_sub_status(
    state: &AppState,
    caller: &Caller,
    job_id: &str,
    fields: &RequestFields,
) -> Result<JobAnswer, ApiError> {
    let job = own_job(state, caller, job_id).await?;
    let request = SubStatusRequest::parse(fields)?;
    match jobs::set_sub_status(&state.db, &job.id, request.sub_status.as_str(), state.publisher.outbox()).await? {
        SubStatusOutcome::Updated => state.publisher.recorded(),
        SubStatusOutcome::Unchanged => {}
        SubStatusOutcome::NotActive(status) => {
            return Err(ApiError::Forbidden(format!(
                "Cannot update 'sub_status' when is not in active status. (Currently {status})"
            )));
        }
        SubStatusOutcome::Missing => return Err(job_not_found(job_id)),
    }
    let job = jobs::find(&state.db, job_id).await?.ok_or_else(|| job_not_found(job_id))?;
    Ok(JobAnswer { job: JobRecord::of(&job) })
}

/// Records an ERROR event of the caller's active job.
pub async fn add_event(
    state: &AppState,
    caller: &Caller,
    job_id: &str,
    fields: &RequestFields,
) -> Result<(), ApiError> {
    let job = own_job(state, caller, job_id).await?;
    let request = EventRequest::parse(fields)?;
    let data = json!({
        "code": request.code,
        "message": request.message,
        "exception": request.exception,
        "args": request.args,
    });
    if !jobs::insert_error_event(&state.db, &job.id, &data, state.publisher.outbox()).await? {
        return Err(ApiError::Forbidden("You can create events on active jobs only".into()));
    }
    state.publisher.recorded();
    Ok(())
}

/// The events of the caller's job, newest first, optionally of one type.
pub async fn events(
    state: &AppState,
    caller: &Caller,
    job_id: &str,
    wanted: Option<String>,
) -> Result<Vec<EventRecord>, ApiError> {
    let job = own_job(state, caller, job_id).await?;
    let wanted = event_type(wanted.filter(|t| !t.is_empty()))?;
    let events = jobs::list_events(&state.db, &job.id, wanted.as_deref()).await?;
    Ok(events.iter().map(|event| EventRecord::of(&job.id, event)).collect())
}

/// The runtime jobs the caller's job reported.
pub async fn runtime_jobs(state: &AppState, caller: &Caller, job_id: &str) -> Result<RuntimeJobs, ApiError> {
    let job = own_job(state, caller, job_id).await?;
    let rows = jobs::list_runtime_jobs(&state.db, &job.id).await?;
    Ok(RuntimeJobs {
        runtime_jobs: rows
            .into_iter()
            .map(|r| RuntimeJob { runtime_job: r.runtime_job, runtime_session: r.runtime_session })
            .collect(),
    })
}

/// Records a runtime job of the caller's job. As the reference, one already recorded is
/// reported in a 200 answer.
pub async fn add_runtime_job(
    state: &AppState,
    caller: &Caller,
    job_id: &str,
    fields: &RequestFields,
) -> Result<Message, ApiError> {
    let job = own_job(state, caller, job_id).await?;
    let RuntimeJobRequest { runtime_job, runtime_session } = RuntimeJobRequest::parse(fields)?;
    match jobs::insert_runtime_job(&state.db, &job.id, &runtime_job, runtime_session.as_deref()).await {
        Ok(()) => {
            Ok(Message::new(format!("RuntimeJob object [{runtime_job}] created for serverless job id [{job_id}].")))
        }
        Err(error) if error.unique_violation().is_some() => Ok(Message::new(format!(
            "Failed to create RuntimeJob object [{runtime_job}] for job id [{job_id}]. Error: runtime job {runtime_job} is already recorded."
        ))),
        Err(error) => Err(error.into()),
    }
}

/// Jobs of one function: all authors' (without result) for those who manage it, else the
/// caller's own (with result); at most 1,000.
pub async fn of_function(state: &AppState, caller: &Caller, program_id: &str) -> Result<Vec<JobRecord>, ApiError> {
    const LISTED: i64 = 1000;
    let missing = || ApiError::NotFound(format!("Qiskit Function {program_id} doesn't exist."));
    let (manages, rows) = if caller.has_instance() {
        // An instance's permissions decide who manages the function's jobs: the function is
        // read first.
        let program = programs::find_by_id(&state.db, &caller.user_id, program_id).await?.ok_or_else(missing)?;
        let manages = visibility::can_manage(caller.access(&program), ProviderOperation::Jobs);
        let filter = JobFilter {
            program_ids: Some(vec![program.id.clone()]),
            author_id: (!manages).then(|| caller.user_id.clone()),
            ..Default::default()
        };
        (manages, jobs::list(&state.db, &filter, Some(LISTED), 0).await?.1)
    } else {
        // The caller's relation to the function decides, found in the page's own statement.
        jobs::of_function(&state.db, program_id, &caller.user_id, LISTED).await?.ok_or_else(missing)?
    };
    Ok(rows
        .iter()
        .map(|job| match manages {
            true => JobRecord::of(job),
            false => JobRecord::of(job).with_result(job.result.clone()),
        })
        .collect())
}

/// At most this many of the caller's unfinished jobs are listed (and the default).
pub const MAX_QUEUE_LISTED: i64 = 500;

/// Where the caller's unfinished jobs stand.
pub async fn queue(state: &AppState, caller: &Caller, limit: Option<&str>) -> Result<QueueAnswer, ApiError> {
    let limit = match limit.map(str::trim) {
        None | Some("") => MAX_QUEUE_LISTED,
        Some(text) => text.parse::<i64>().ok().filter(|n| (0..=MAX_QUEUE_LISTED).contains(n)).ok_or_else(|| {
            ApiError::BadRequest(format!("'limit' must be an integer from 0 to {MAX_QUEUE_LISTED}, got '{text}'."))
        })?,
    };
    let admission = state.config.admission;
    let (counts, places) = queue::read(&state.db, &caller.user_id, limit, admission.is_some()).await?;
    let running = counts.pending + counts.running;
    let in_use = counts.slots;
    let waits = match (admission, in_use) {
        (Some(limits), Some(in_use)) => waiting_for(&places, running, limits, in_use),
        _ => vec![None; places.len()],
    };
    let slots = |limit: usize, used: i64| SlotUse { used, limit: i64::try_from(limit).unwrap_or(i64::MAX) };
    Ok(QueueAnswer {
        active_limit: state.config.active_jobs_per_user,
        active: counts.queued + running,
        queued: counts.queued,
        running,
        running_limit: admission.map(|limits| i64::try_from(limits.jobs_per_user).unwrap_or(i64::MAX)),
        cpu_slots: admission.zip(in_use).map(|(limits, (cpu, _))| slots(limits.cpu_slots, cpu)),
        gpu_slots: admission.zip(in_use).map(|(limits, (_, gpu))| slots(limits.gpu_slots, gpu)),
        jobs: places
            .into_iter()
            .zip(waits)
            .map(|(p, waiting_for)| {
                let queued = p.status == "QUEUED";
                QueuedPlace {
                    ahead: queued.then_some(p.ahead),
                    position: queued.then_some(p.ahead + 1),
                    waiting_for,
                    gpu: p.gpu,
                    program: ProgramSummary { id: p.program_id, provider: p.provider_name, title: p.program_title },
                    id: p.id,
                    status: p.status,
                    created: db::format_timestamp(p.created),
                }
            })
            .collect(),
    })
}

/// What holds each of the caller's queued jobs (oldest first) back now: admission starts the
/// caller's oldest queued jobs while the caller is under its running limit and a slot of the
/// job's kind is free, so each queued job uses up one of each before the next is looked at.
fn waiting_for(
    places: &[queue::QueuePlace],
    running: i64,
    limits: Limits,
    (cpu, gpu): (i64, i64),
) -> Vec<Option<WaitingFor>> {
    let free = |limit: usize, used: i64| (i64::try_from(limit).unwrap_or(i64::MAX) - used).max(0);
    let mut under_limit = free(limits.jobs_per_user, running);
    let (mut cpu_free, mut gpu_free) = (free(limits.cpu_slots, cpu), free(limits.gpu_slots, gpu));
    places
        .iter()
        .map(|place| {
            if place.status != "QUEUED" {
                return None;
            }
            let slots = if place.gpu { &mut gpu_free } else { &mut cpu_free };
            Some(if under_limit == 0 {
                WaitingFor::RunningLimit
            } else if *slots == 0 {
                if place.gpu { WaitingFor::GpuSlots } else { WaitingFor::CpuSlots }
            } else {
                under_limit -= 1;
                *slots -= 1;
                WaitingFor::NextAdmission
            })
        })
        .collect()
}
