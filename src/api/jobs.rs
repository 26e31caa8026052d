//! Job endpoints: run, listings, one job, result, stop, sub-status, events and runtime jobs.
//! Each parses its request and calls one `service::jobs` function.

use axum::Json;
use axum::extract::{Path, State};

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::answers::{
    ArgumentsAnswer, EventRecord, JobAnswer, JobPage, JobRecord, Message, QueueAnswer, ResultAnswer, RunAnswer,
    RuntimeJobs, TraceAnswer,
};
use super::error::{ApiError, ErrorBody};
use super::extract::Query;
use super::fields::RequestFields;
use super::idempotency::{self, IdempotencyKey, IdempotencyKeyHeader};
use super::requests::{
    EventRequest, EventsQuery, JobsQuery, ProviderJobsQuery, QueueQuery, RetrieveQuery, RunHeaders, RunRequest,
    RuntimeJobRequest, SaveResultRequest, StopRequest, SubStatusRequest,
};
use super::service::jobs as service;
use super::state::AppState;
use crate::auth::Caller;

/// Run a function: queue a job
///
/// With an `Idempotency-Key`, a retry gets the first answer.
#[utoipa::path(post, path = "/programs/run/", tag = "jobs", params(IdempotencyKeyHeader),
    request_body(content(
        (RunRequest = "application/json"),
        (RunRequest = "application/x-www-form-urlencoded"))),
    responses((status = 200, description = "the queued job", body = RunAnswer),
        (status = 423, description = "the function is disabled", body = ErrorBody),
        (status = 429, description = "the caller's active-job limit is reached", body = ErrorBody)),
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
        service::run(&state, &caller, request, RunHeaders::of(&headers)).await.map(Json)
    };
    Ok(idempotency::answer_once(&db, &user_id, request, work).await)
}

/// Jobs of one function (every author's, without result, for its provider side)
#[utoipa::path(get, path = "/programs/{program_id}/get_jobs/", tag = "jobs",
    params(("program_id" = String, Path, format = Uuid, example = "00000000-0000-4000-8000-000000000000", description = "function id")),
    responses((status = 200, description = "at most 1,000 jobs", body = Vec<JobRecord>)),
    security(("bearer" = [])))]
pub async fn get_program_jobs(
    State(state): State<AppState>,
    caller: Caller,
    Path(program_id): Path<String>,
) -> Result<Json<Vec<JobRecord>>, ApiError> {
    Ok(Json(service::of_function(&state, &caller, &program_id).await?))
}

/// The caller's jobs, newest first
#[utoipa::path(get, path = "/jobs/", tag = "jobs", params(JobsQuery),
    responses((status = 200, description = "a page of jobs", body = JobPage)),
    security(("bearer" = [])))]
pub async fn list_jobs(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Query(query): Query<JobsQuery>,
) -> Result<Json<JobPage>, ApiError> {
    Ok(Json(service::list(&state, &caller, &headers, query).await?))
}

/// Jobs of a provider's functions, every author
#[utoipa::path(get, path = "/jobs/provider/", tag = "jobs", params(ProviderJobsQuery),
    responses((status = 200, description = "a page of jobs", body = JobPage)),
    security(("bearer" = [])))]
pub async fn list_provider_jobs(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Query(query): Query<ProviderJobsQuery>,
) -> Result<Json<JobPage>, ApiError> {
    Ok(Json(service::list_provider(&state, &caller, &headers, query.into()).await?))
}

/// Where the caller's unfinished jobs stand: active slots used of the limit, and for each queued job how many queued jobs of any user came before it (oldest first)
///
/// Not part of the reference API.
#[utoipa::path(get, path = "/jobs/queue/", tag = "jobs", params(QueueQuery),
    responses((status = 200, description = "the caller's queue", body = QueueAnswer)),
    security(("bearer" = [])))]
pub async fn my_queue(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<QueueQuery>,
) -> Result<Json<QueueAnswer>, ApiError> {
    Ok(Json(service::queue(&state, &caller, query.limit.as_deref()).await?))
}

/// One job
#[utoipa::path(get, path = "/jobs/{job_id}/", tag = "jobs",
    params(("job_id" = String, Path, format = Uuid, example = "00000000-0000-4000-8000-000000000000", description = "job id"), RetrieveQuery),
    responses((status = 200, description = "the job", body = JobRecord)),
    security(("bearer" = [])))]
pub async fn get_job(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
    Query(query): Query<RetrieveQuery>,
) -> Result<Json<JobRecord>, ApiError> {
    Ok(Json(service::get(&state, &caller, &job_id, query.with_result.as_deref()).await?))
}

/// The arguments the job was run with, as sent (job author only)
///
/// Others, a provider's admins included, get 404 as for a job that is not theirs: arguments may
/// hold what the author shares with no one.
#[utoipa::path(get, path = "/jobs/{job_id}/arguments/", tag = "jobs",
    params(("job_id" = String, Path, format = Uuid, example = "00000000-0000-4000-8000-000000000000", description = "job id")),
    responses((status = 200, description = "the arguments", body = ArgumentsAnswer), (status = 404, description = "no such job of the caller's", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_job_arguments(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
) -> Result<Json<ArgumentsAnswer>, ApiError> {
    Ok(Json(service::arguments(&state, &caller, &job_id).await?))
}

/// The job's trace: its id and, when the gateway knows a tracing UI, the address of the trace
///
/// Answered to those who may read the job; 404 for a job with no trace (run while neither
/// tracing nor the caller's `traceparent` gave it one).
#[utoipa::path(get, path = "/jobs/{job_id}/trace/", tag = "jobs",
    params(("job_id" = String, Path, format = Uuid, example = "00000000-0000-4000-8000-000000000000", description = "job id")),
    responses((status = 200, description = "the trace", body = TraceAnswer), (status = 404, description = "no such job of the caller's, or no trace", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_job_trace(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
) -> Result<Json<TraceAnswer>, ApiError> {
    Ok(Json(service::trace(&state, &caller, &job_id).await?))
}

/// The job's result as JSON text (204 when none)
#[utoipa::path(get, path = "/jobs/{job_id}/result/", tag = "jobs",
    params(("job_id" = String, Path, format = Uuid, example = "00000000-0000-4000-8000-000000000000", description = "job id")),
    responses((status = 200, description = "the result", body = ResultAnswer), (status = 204, description = "no result yet")),
    security(("bearer" = [])))]
pub async fn get_job_result(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
) -> Result<Response, ApiError> {
    Ok(match service::result(&state, &caller, &job_id).await? {
        Some(answer) => Json(answer).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    })
}

/// Save a result (older in-job clients)
#[utoipa::path(post, path = "/jobs/{job_id}/result/", tag = "jobs",
    params(("job_id" = String, Path, format = Uuid, example = "00000000-0000-4000-8000-000000000000", description = "job id")),
    request_body(content(
        (SaveResultRequest = "application/json"),
        (SaveResultRequest = "application/x-www-form-urlencoded"))),
    responses((status = 200, description = "the job with its result", body = JobRecord)),
    security(("bearer" = [])))]
pub async fn save_job_result(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
    fields: RequestFields,
) -> Result<Json<JobRecord>, ApiError> {
    Ok(Json(service::save_result(&state, &caller, &job_id, &fields).await?))
}

/// Request a stop; the job's status tells when it stopped
#[utoipa::path(post, path = "/jobs/{job_id}/stop/", tag = "jobs",
    params(("job_id" = String, Path, format = Uuid, example = "00000000-0000-4000-8000-000000000000", description = "job id")),
    request_body(content(
        (StopRequest = "application/json"),
        (StopRequest = "application/x-www-form-urlencoded"))),
    responses((status = 200, description = "what was done", body = Message)),
    security(("bearer" = [])))]
pub async fn stop_job(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
    fields: RequestFields,
) -> Result<Json<Message>, ApiError> {
    Ok(Json(service::stop(&state, &caller, &job_id, &fields).await?))
}

/// Set the sub-status of an active job (from inside the job)
#[utoipa::path(patch, path = "/jobs/{job_id}/sub_status/", tag = "jobs",
    params(("job_id" = String, Path, format = Uuid, example = "00000000-0000-4000-8000-000000000000", description = "job id")),
    request_body(content(
        (SubStatusRequest = "application/json"),
        (SubStatusRequest = "application/x-www-form-urlencoded"))),
    responses((status = 200, description = "the job", body = JobAnswer)),
    security(("bearer" = [])))]
pub async fn set_sub_status(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
    fields: RequestFields,
) -> Result<Json<JobAnswer>, ApiError> {
    Ok(Json(service::set_sub_status(&state, &caller, &job_id, &fields).await?))
}

/// Record an ERROR event of an active job
#[utoipa::path(post, path = "/jobs/{job_id}/event/", tag = "jobs",
    params(("job_id" = String, Path, format = Uuid, example = "00000000-0000-4000-8000-000000000000", description = "job id")),
    request_body(content(
        (EventRequest = "application/json"),
        (EventRequest = "application/x-www-form-urlencoded"))),
    responses((status = 200, description = "recorded")),
    security(("bearer" = [])))]
pub async fn create_job_event(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
    fields: RequestFields,
) -> Result<StatusCode, ApiError> {
    service::add_event(&state, &caller, &job_id, &fields).await?;
    Ok(StatusCode::OK)
}

/// Events of a job, newest first
#[utoipa::path(get, path = "/jobs/{job_id}/events/", tag = "jobs",
    params(("job_id" = String, Path, format = Uuid, example = "00000000-0000-4000-8000-000000000000", description = "job id"), EventsQuery),
    responses((status = 200, description = "the events", body = Vec<EventRecord>)),
    security(("bearer" = [])))]
pub async fn list_job_events(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
    Query(query): Query<EventsQuery>,
) -> Result<Json<Vec<EventRecord>>, ApiError> {
    Ok(Json(service::events(&state, &caller, &job_id, query.event_type).await?))
}

/// Runtime jobs the job reported
#[utoipa::path(get, path = "/jobs/{job_id}/runtime_jobs/", tag = "jobs",
    params(("job_id" = String, Path, format = Uuid, example = "00000000-0000-4000-8000-000000000000", description = "job id")),
    responses((status = 200, description = "the runtime jobs", body = RuntimeJobs)),
    security(("bearer" = [])))]
pub async fn list_runtime_jobs(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
) -> Result<Json<RuntimeJobs>, ApiError> {
    Ok(Json(service::runtime_jobs(&state, &caller, &job_id).await?))
}

/// Report a runtime job
#[utoipa::path(post, path = "/jobs/{job_id}/runtime_jobs/", tag = "jobs",
    params(("job_id" = String, Path, format = Uuid, example = "00000000-0000-4000-8000-000000000000", description = "job id")),
    request_body(content(
        (RuntimeJobRequest = "application/json"),
        (RuntimeJobRequest = "application/x-www-form-urlencoded"))),
    responses((status = 200, description = "what was recorded", body = Message)),
    security(("bearer" = [])))]
pub async fn add_runtime_job(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
    fields: RequestFields,
) -> Result<Json<Message>, ApiError> {
    Ok(Json(service::add_runtime_job(&state, &caller, &job_id, &fields).await?))
}
