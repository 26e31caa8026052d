//! `PATCH jobs/{id}/sub_status/`: what a running job says it is doing, set from inside the job
//! while it is active.

use axum::Json;
use axum::extract::{Path, State};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::api::access::{job_not_found, own_job};
use crate::api::error::ApiError;
use crate::api::fields::RequestFields;
use crate::api::shared::{JobRecord, bad};
use crate::api::state::AppState;
use crate::auth::Caller;
use crate::db::jobs::{self, SubStatusOutcome};

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
    Ok(Json(update_sub_status(&state, &caller, &job_id, &fields).await?))
}

/// Sets the sub-status of the caller's active job.
pub async fn update_sub_status(
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

/// What a running job says it is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ToSchema)]
#[schema(rename_all = "SCREAMING_SNAKE_CASE", example = "MAPPING")]
pub enum SubStatus {
    Mapping,
    OptimizingHardware,
    WaitingQpu,
    ExecutingQpu,
    PostProcessing,
}

impl SubStatus {
    pub const ALL: [SubStatus; 5] = [
        SubStatus::Mapping,
        SubStatus::OptimizingHardware,
        SubStatus::WaitingQpu,
        SubStatus::ExecutingQpu,
        SubStatus::PostProcessing,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SubStatus::Mapping => "MAPPING",
            SubStatus::OptimizingHardware => "OPTIMIZING_HARDWARE",
            SubStatus::WaitingQpu => "WAITING_QPU",
            SubStatus::ExecutingQpu => "EXECUTING_QPU",
            SubStatus::PostProcessing => "POST_PROCESSING",
        }
    }

    pub fn parse(text: &str) -> Option<SubStatus> {
        SubStatus::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// `PATCH jobs/{job_id}/sub_status/`.
#[derive(Debug, Clone, ToSchema)]
pub struct SubStatusRequest {
    #[schema(inline)]
    pub sub_status: SubStatus,
}

impl SubStatusRequest {
    pub fn parse(fields: &RequestFields) -> Result<SubStatusRequest, ApiError> {
        if fields.values.get("sub_status").is_some_and(Value::is_null) {
            return Err(bad("'sub_status' cannot be null"));
        }
        let sub_status = fields
            .text("sub_status")
            .and_then(|v| SubStatus::parse(&v))
            .ok_or_else(|| bad("'sub_status' not provided or is not valid"))?;
        Ok(SubStatusRequest { sub_status })
    }
}

/// The answer of `sub_status/`: the job after the change.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JobAnswer {
    pub job: JobRecord,
}
