//! One job: `jobs/{id}/` (for its author, with its result, or for who manages its function,
//! without), the arguments it was run with (author only) and its trace.

use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::result::stored_result;
use crate::api::access::{job_not_found, manages_job_function, own_job};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::Query;
use crate::api::shared::{JobRecord, bad};
use crate::api::state::AppState;
use crate::auth::Caller;
use crate::db::jobs;
use crate::domain::visibility::ProviderOperation;

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
    Ok(Json(get(&state, &caller, &job_id, query.with_result.as_deref()).await?))
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
    Ok(Json(arguments(&state, &caller, &job_id).await?))
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
    Ok(Json(trace(&state, &caller, &job_id).await?))
}

fn parse_bool(name: &str, value: Option<&str>, default: bool) -> Result<bool, ApiError> {
    match value.map(|v| v.trim().to_ascii_lowercase()) {
        None => Ok(default),
        Some(v) if ["true", "1", "yes", "on", "t", "y"].contains(&v.as_str()) => Ok(true),
        Some(v) if ["false", "0", "no", "off", "f", "n"].contains(&v.as_str()) => Ok(false),
        Some(_) => Err(bad(format!("Must be a valid boolean. ('{name}')"))),
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

/// `GET jobs/{job_id}/`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RetrieveQuery {
    /// Include the result (author only).
    #[param(value_type = Option<bool>, default = true)]
    pub with_result: Option<String>,
}

/// The answer of `arguments/`: the JSON text the job was run with.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ArgumentsAnswer {
    pub arguments: String,
}

/// The answer of `trace/`: the job's trace id and, with `--trace-link`, its address.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TraceAnswer {
    #[schema(example = "4bf92f3577b34da6a3ce929d0e0e4736")]
    pub trace_id: String,
    pub link: Option<String>,
}
