//! The runtime jobs a job reports (`POST jobs/{id}/runtime_jobs/`) and their list; `stop`
//! cancels them.

use axum::Json;
use axum::extract::{Path, State};
use serde::Serialize;
use utoipa::ToSchema;

use crate::api::access::own_job;
use crate::api::error::ApiError;
use crate::api::fields::RequestFields;
use crate::api::shared::{Message, bad};
use crate::api::state::AppState;
use crate::auth::Caller;
use crate::db::jobs;

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
    Ok(Json(runtime_jobs(&state, &caller, &job_id).await?))
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
    Ok(Json(record_runtime_job(&state, &caller, &job_id, &fields).await?))
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
pub async fn record_runtime_job(
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

/// `POST jobs/{job_id}/runtime_jobs/`.
#[derive(Debug, Clone, ToSchema)]
pub struct RuntimeJobRequest {
    #[schema(min_length = 1, max_length = 100, example = "runtime-job-1")]
    pub runtime_job: String,
    pub runtime_session: Option<String>,
}

impl RuntimeJobRequest {
    pub fn parse(fields: &RequestFields) -> Result<RuntimeJobRequest, ApiError> {
        let runtime_job = fields.required_text("runtime_job")?;
        if runtime_job.len() > 100 {
            return Err(bad("'runtime_job' must be at most 100 characters."));
        }
        let runtime_session = fields.text("runtime_session").filter(|s| !s.is_empty());
        Ok(RuntimeJobRequest { runtime_job, runtime_session })
    }
}

/// One runtime job a job reported.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RuntimeJob {
    pub runtime_job: String,
    #[schema(required = true)]
    pub runtime_session: Option<String>,
}

/// The answer of `runtime_jobs/`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RuntimeJobs {
    pub runtime_jobs: Vec<RuntimeJob>,
}
