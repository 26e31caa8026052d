//! A job's events: an ERROR event recorded from inside the active job (`POST jobs/{id}/event/`)
//! and the list, newest first (`GET jobs/{id}/events/`); `streams` follows them live.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};

use crate::api::access::own_job;
use crate::api::error::ApiError;
use crate::api::extract::Query;
use crate::api::fields::RequestFields;
use crate::api::shared::{EventRecord, bad};
use crate::api::state::AppState;
use crate::auth::Caller;
use crate::db::jobs;

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
    add_event(&state, &caller, &job_id, &fields).await?;
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
    Ok(Json(events(&state, &caller, &job_id, query.event_type).await?))
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

/// The one event type a job may record (any letter case when sent).
#[derive(Debug, Clone, Copy, ToSchema)]
#[schema(rename_all = "UPPERCASE", example = "ERROR")]
pub enum EventType {
    Error,
}

/// The event type of `event/` and `events/?type=`: `ERROR` in any letter case.
pub fn event_type(raw: Option<String>) -> Result<Option<String>, ApiError> {
    match raw.map(|t| t.trim().to_ascii_uppercase()) {
        None => Ok(None),
        Some(t) if t == "ERROR" => Ok(Some(t)),
        Some(_) => Err(bad("Type is not valid. Valid types: ['ERROR']")),
    }
}

/// `POST jobs/{job_id}/event/`: an ERROR event of an active job.
#[derive(Debug, Clone, ToSchema)]
pub struct EventRequest {
    #[schema(rename = "type", value_type = EventType, inline)]
    pub event_type: String,
    #[schema(min_length = 1, example = "E1")]
    pub code: String,
    #[schema(min_length = 1, example = "failed")]
    pub message: String,
    #[schema(min_length = 1, example = "ValueError")]
    pub exception: String,
    /// Any JSON value, or JSON text.
    #[schema(value_type = Value, required = false)]
    pub args: Value,
}

impl EventRequest {
    pub fn parse(fields: &RequestFields) -> Result<EventRequest, ApiError> {
        let event_type =
            event_type(fields.text("type"))?.ok_or_else(|| bad("Type is not valid. Valid types: ['ERROR']"))?;
        Ok(EventRequest {
            event_type,
            code: fields.required_text("code")?,
            message: fields.required_text("message")?,
            exception: fields.required_text("exception")?,
            args: match fields.value("args") {
                Some(Value::String(text)) => serde_json::from_str(text).unwrap_or(Value::String(text.clone())),
                Some(other) => other.clone(),
                None => Value::Null,
            },
        })
    }
}

/// `GET jobs/{job_id}/events/`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Only events of this type (any letter case).
    #[serde(rename = "type")]
    #[param(value_type = Option<EventType>, inline)]
    pub event_type: Option<String>,
}
