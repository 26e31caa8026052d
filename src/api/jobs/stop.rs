//! `POST jobs/{id}/stop/`: compute stops the caller's job, then the runtime jobs it reported are
//! cancelled with the runtime service the request carries.

use axum::Json;
use axum::extract::{Path, State};
use serde_json::Value;
use utoipa::ToSchema;

use crate::api::access::own_job;
use crate::api::error::ApiError;
use crate::api::fields::RequestFields;
use crate::api::shared::{Message, bad};
use crate::api::state::AppState;
use crate::auth::Caller;
use crate::auth::runtime_service::{self, ReportedRuntimeJob, ServiceField, parse_service};
use crate::compute::StopOutcome;
use crate::db::jobs;

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
    Ok(Json(stop(&state, &caller, &job_id, &fields).await?))
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

/// `POST jobs/{job_id}/stop/`.
#[derive(Debug, ToSchema)]
pub struct StopRequest {
    /// The serialized runtime service (`QiskitRuntimeService`: channel, token, instance) whose
    /// runtime jobs the job reported are cancelled; `"null"` or absent: none. Used for this
    /// request only: never logged or stored.
    #[schema(value_type = Option<String>, nullable = false)]
    pub service: ServiceField,
}

impl StopRequest {
    /// Checks the body and reads the `service` (a serialized runtime service with credentials).
    pub fn parse(fields: &RequestFields) -> Result<StopRequest, ApiError> {
        if fields.values.get("service").is_some_and(Value::is_null) {
            return Err(bad("This field may not be null. ('service')"));
        }
        Ok(StopRequest { service: parse_service(fields.text("service").as_deref()) })
    }
}
