//! A job's result: read by its author (`GET jobs/{id}/result/`, 204 when there is none) and
//! saved the legacy way by older in-job clients (`POST`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::api::access::own_job;
use crate::api::error::ApiError;
use crate::api::fields::RequestFields;
use crate::api::shared::JobRecord;
use crate::api::state::AppState;
use crate::auth::Caller;
use crate::db::jobs::JobRow;
use crate::storage::keys;

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
    Ok(match result(&state, &caller, &job_id).await? {
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
    Ok(Json(save_result(&state, &caller, &job_id, &fields).await?))
}

pub async fn stored_result(state: &AppState, job: &JobRow) -> Result<Option<String>, ApiError> {
    let stored = state.storage.read_to_bytes(&keys::job_result(&job.id)).await;
    match stored.map_err(|e| ApiError::storage(&state.storage, e, None))? {
        Some(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        None => Ok(job.result.clone()),
    }
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

/// `POST jobs/{job_id}/result/` (older in-job clients).
#[derive(Debug, Clone, ToSchema)]
pub struct SaveResultRequest {
    #[schema(min_length = 1, example = "{}")]
    pub result: String,
}

impl SaveResultRequest {
    pub fn parse(fields: &RequestFields) -> Result<SaveResultRequest, ApiError> {
        Ok(SaveResultRequest { result: fields.required_text("result")? })
    }
}

/// The answer of `result/`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResultAnswer {
    pub result: String,
}
