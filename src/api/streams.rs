//! Streamed answers: a job's events and log followed live (Server-Sent Events or chunked text),
//! and `logs/` answers whose archived log is copied from storage into the JSON body piece by
//! piece instead of being held whole.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};

use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use utoipa::{IntoParams, ToSchema};

use super::access::{log_reader_job, own_job};
use super::error::ApiError;
use super::extract::Query;
use super::shared::EventRecord;
use super::state::AppState;
use crate::auth::Caller;
use crate::db::jobs::{self, JobRow};
use crate::domain::lifecycle::JobStatus;
use crate::follow::{EventsSeen, Hub, LOG_PIECE, LogSeen, LogSource, Utf8Pieces};

/// How often an idle stream sends an SSE comment, so proxies keep it open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

fn log_source(state: &AppState) -> LogSource {
    LogSource { db: state.db.clone(), storage: state.storage.clone(), compute: state.compute.clone() }
}

/// `Last-Event-ID` (the header a reconnecting EventSource sends), or `?last_event_id=`.
fn last_event_id(headers: &HeaderMap, query: Option<&str>) -> Result<Option<u64>, ApiError> {
    let text = headers.get("last-event-id").and_then(|value| value.to_str().ok()).or(query);
    match text.map(str::trim).filter(|text| !text.is_empty()) {
        None => Ok(None),
        Some(text) => text
            .parse()
            .map(Some)
            .map_err(|_| ApiError::BadRequest(format!("Last-Event-ID must be a non-negative integer, not '{text}'"))),
    }
}

/// Events of a job as Server-Sent Events, oldest first, as they are recorded; ends after the terminal event. Each event's id is its sequence number
///
/// A client that reconnects with `Last-Event-ID` resumes after it.
#[utoipa::path(get, path = "/jobs/{job_id}/events/stream/", tag = "streams",
    params(("job_id" = String, Path, format = Uuid, example = "00000000-0000-4000-8000-000000000000", description = "job id"),
        EventStreamQuery, LastEventIdHeader),
    responses((status = 200, description = "a stream that ends with the job", content((String = "text/event-stream")))),
    security(("bearer" = [])))]
pub async fn stream_job_events(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
    Query(query): Query<EventStreamQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let after = last_event_id(&headers, query.last_event_id.as_deref())?.unwrap_or(0);
    let job = own_job(&state, &caller, &job_id).await?;
    let hub = state.follows.events(&state.db, &job.id);
    let follower = EventFollower { seen: hub.seen.clone(), _hub: hub, last: after as i64, queue: Vec::new() };
    let job_id = job.id.clone();
    let follows = Arc::clone(&state.follows);
    let events = futures::stream::unfold(follower, move |mut follower| {
        let job_id = job_id.clone();
        async move {
            let row = follower.next().await?;
            let event = Event::default()
                .id(row.seq.to_string())
                .event(row.event_type.clone())
                .data(serde_json::to_string(&EventRecord::of(&job_id, &row)).unwrap_or_default());
            Some((event, follower))
        }
    })
    .take_until(follows.draining());
    let restarting = futures::stream::once(async move { follows.is_draining().then(restarting_event) })
        .filter_map(std::future::ready);
    Ok(sse(events.chain(restarting).map(Ok::<_, Infallible>)))
}

/// The last event of a stream the server ended because it is shutting down: reconnect (with
/// `Last-Event-ID`) to go on, from another replica or this one restarted.
fn restarting_event() -> Event {
    Event::default()
        .event("restarting")
        .data(r#"{"message": "The server is restarting: reconnect to go on from the last event received."}"#)
}

fn sse(events: impl futures::Stream<Item = Result<Event, Infallible>> + Send + 'static) -> Response {
    let mut response = Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)).into_response();
    // Proxies such as nginx would otherwise buffer the stream.
    response.headers_mut().insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

struct EventFollower {
    _hub: Arc<Hub<EventsSeen>>,
    seen: watch::Receiver<Arc<EventsSeen>>,
    last: i64,
    queue: Vec<Arc<jobs::EventRow>>,
}

impl EventFollower {
    /// The next event after `last`, waiting for it; `None` once the job's events are complete.
    async fn next(&mut self) -> Option<Arc<jobs::EventRow>> {
        loop {
            if !self.queue.is_empty() {
                let row = self.queue.remove(0);
                self.last = row.seq;
                return Some(row);
            }
            let state = self.seen.borrow_and_update().clone();
            self.queue = state.events.iter().filter(|row| row.seq > self.last).cloned().collect();
            if !self.queue.is_empty() {
                continue;
            }
            if state.finished
                || self.seen.changed().await.is_err() && self.seen.borrow().events.len() == state.events.len()
            {
                return None;
            }
        }
    }
}

/// User log followed live until the job ends (job author)
///
/// SSE (`log` events whose id is the byte offset after them, then `end`) or chunked text.
#[utoipa::path(get, path = "/jobs/{job_id}/logs/stream/", tag = "streams",
    params(("job_id" = String, Path, format = Uuid, example = "00000000-0000-4000-8000-000000000000", description = "job id"),
        LogStreamQuery, LastEventIdHeader),
    responses((status = 200, description = "a stream that ends with the job",
        content((String = "text/event-stream"), (String = "text/plain")))),
    security(("bearer" = [])))]
pub async fn stream_job_logs(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
    Query(query): Query<LogStreamQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let job = log_reader_job(&state, &caller, &job_id, false).await?;
    stream_log(&state, job, false, &query, &headers).await
}

/// Provider log followed live until the job ends (provider side)
///
/// SSE (`log` events whose id is the byte offset after them, then `end`) or chunked text.
#[utoipa::path(get, path = "/jobs/{job_id}/provider-logs/stream/", tag = "streams",
    params(("job_id" = String, Path, format = Uuid, example = "00000000-0000-4000-8000-000000000000", description = "job id"),
        LogStreamQuery, LastEventIdHeader),
    responses((status = 200, description = "a stream that ends with the job",
        content((String = "text/event-stream"), (String = "text/plain")))),
    security(("bearer" = [])))]
pub async fn stream_job_provider_logs(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
    Query(query): Query<LogStreamQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let job = log_reader_job(&state, &caller, &job_id, true).await?;
    stream_log(&state, job, true, &query, &headers).await
}

async fn stream_log(
    state: &AppState,
    job: JobRow,
    provider: bool,
    query: &LogStreamQuery,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let sse_wanted = match query.format.as_deref().map(str::trim) {
        Some("sse") => true,
        Some("text") => false,
        Some(other) => return Err(ApiError::BadRequest(format!("format must be 'sse' or 'text', not '{other}'"))),
        // An EventSource asks for `text/event-stream`, and sends `Last-Event-ID` when it resumes.
        None => {
            headers.contains_key("last-event-id")
                || headers
                    .get(header::ACCEPT)
                    .and_then(|value| value.to_str().ok())
                    .is_some_and(|accept| accept.contains("text/event-stream"))
        }
    };
    let offset = match query.offset.as_deref().map(str::trim).filter(|text| !text.is_empty()) {
        None => 0,
        Some(text) => text
            .parse::<u64>()
            .map_err(|_| ApiError::BadRequest(format!("offset must be a non-negative integer, not '{text}'")))?,
    };
    let offset = if sse_wanted { last_event_id(headers, None)?.unwrap_or(offset) } else { offset };
    let source = log_source(state);
    let follower = if job.status().is_terminal() {
        // Nothing more will be written: the archive alone, no hub.
        let archive = source.archived_from(&job, provider, offset).await;
        let archive = archive.map_err(|e| ApiError::storage(&state.storage, e, None))?;
        LogFollower {
            hub: None,
            source,
            job_id: job.id.clone(),
            provider,
            pos: offset,
            archive: Some(archive),
            hub_gone: false,
        }
    } else {
        let hub = state.follows.log(source.clone(), &job.id, provider);
        LogFollower {
            hub: Some((hub.seen.clone(), hub)),
            source,
            job_id: job.id.clone(),
            provider,
            pos: offset,
            archive: None,
            hub_gone: false,
        }
    };
    // A server shutting down ends the stream at once (the text answer simply ends; a client
    // resumes it with `offset`).
    let follows = Arc::clone(&state.follows);
    let pieces = futures::stream::unfold(follower, |mut follower| async move {
        let piece = follower.next().await?;
        Some(((follower.pos, piece), follower))
    })
    .take_until(follows.draining());
    if !sse_wanted {
        let body = Body::from_stream(pieces.map(|(_, piece)| Ok::<_, Infallible>(piece)));
        let mut response = body.into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        response.headers_mut().insert("x-accel-buffering", HeaderValue::from_static("no"));
        return Ok(response);
    }
    // SSE carries text: pieces are decoded without splitting characters; each event's id is the
    // byte offset after it, so `Last-Event-ID` resumes exactly there.
    // The closing `end` event carries the log's length as data: an event without a data line
    // is never dispatched by a browser's EventSource.
    let mut decoder = Utf8Pieces::default();
    let reached = Arc::new(std::sync::atomic::AtomicU64::new(offset));
    let last = Arc::clone(&reached);
    let events = pieces
        .map(move |(end, piece)| {
            reached.store(end, std::sync::atomic::Ordering::Relaxed);
            let text = decoder.push(&piece);
            Event::default().id(end.to_string()).event("log").data(sse_safe(&text))
        })
        .chain(futures::stream::once(async move {
            if follows.is_draining() {
                return restarting_event();
            }
            let offset = last.load(std::sync::atomic::Ordering::Relaxed);
            Event::default().event("end").data(format!("{{\"offset\": {offset}}}"))
        }))
        .map(Ok::<_, Infallible>);
    Ok(sse(events))
}

/// SSE data cannot hold carriage returns: they become line breaks.
fn sse_safe(text: &str) -> String {
    text.replace("\r\n", "\n").replace('\r', "\n")
}

type Archive = Option<BoxStream<'static, std::io::Result<Bytes>>>;
/// A log hub's state as this follower sees it, and the hub it keeps alive.
type Joined = (watch::Receiver<Arc<LogSeen>>, Arc<Hub<LogSeen>>);

struct LogFollower {
    hub: Option<Joined>,
    source: LogSource,
    job_id: String,
    provider: bool,
    /// Bytes of the log this follower has been given (plus its starting offset).
    pos: u64,
    /// Reading the archive itself: the job had ended, and this follower was behind the window.
    archive: Option<Archive>,
    hub_gone: bool,
}

impl LogFollower {
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(archive) = &mut self.archive {
                let piece = archive.as_mut()?.next().await?;
                return match piece {
                    Ok(piece) => {
                        self.pos += piece.len() as u64;
                        Some(piece)
                    }
                    Err(error) => {
                        tracing::warn!(job.id = %self.job_id, error = &error as &dyn std::error::Error, "archived log read failed mid-stream");
                        None
                    }
                };
            }
            let (seen, _) = self.hub.as_mut()?;
            let state = seen.borrow_and_update().clone();
            if self.pos < state.start() {
                if state.finished {
                    let job = jobs::find(&self.source.db, &self.job_id).await.ok()??;
                    self.archive = Some(self.source.archived_from(&job, self.provider, self.pos).await.ok()?);
                    continue;
                }
                let wanted = LOG_PIECE.min((state.start() - self.pos) as usize);
                let piece = self.source.live_from(&self.job_id, self.provider, self.pos, wanted).await;
                if piece.is_empty() {
                    // The live log no longer has these bytes (it was cut to its size limit).
                    self.pos = state.start();
                    continue;
                }
                self.pos += piece.len() as u64;
                return Some(piece);
            }
            if let Some(piece) = state.piece_from(self.pos) {
                self.pos += piece.len() as u64;
                return Some(piece);
            }
            if state.finished || self.hub_gone {
                return None;
            }
            drop(state);
            if seen.changed().await.is_err() {
                self.hub_gone = true;
            }
        }
    }
}

/// The answer of `logs/` and `provider-logs/`: `{"logs": "..."}`. An archived log is streamed
/// from storage into the body; a live log or the database copy is small and sent whole.
pub async fn logs_answer(state: &AppState, job: &JobRow, provider: bool) -> Result<Response, ApiError> {
    let key = if provider {
        crate::storage::keys::job_provider_log(&job.id)
    } else {
        crate::storage::keys::job_user_log(&job.id)
    };
    let stored = state.storage.get(&key).await.map_err(|e| ApiError::storage(&state.storage, e, None))?;
    if let Some(object) = stored {
        let job_id = job.id.clone();
        let mut decoder = Utf8Pieces::default();
        let mut failed = false;
        let escaped = object.body.map(move |piece| match piece {
            Ok(piece) => Ok::<_, std::io::Error>(Bytes::from(json_string_body(&decoder.push(&piece)))),
            Err(error) => {
                if !std::mem::replace(&mut failed, true) {
                    tracing::error!(job.id = %job_id, error = &error as &dyn std::error::Error, "archived log read failed mid-answer");
                }
                Err(error)
            }
        });
        let head = futures::stream::once(async { Ok(Bytes::from_static(b"{\"logs\": \"")) });
        let tail = futures::stream::once(async { Ok(Bytes::from_static(b"\"}")) });
        let body = Body::from_stream(head.chain(escaped).chain(tail));
        let mut response = body.into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return Ok(response);
    }
    if job.status() == JobStatus::Running
        && let Some(text) = state.compute.clone().live_log(&job.id, provider).await
    {
        return Ok(Json(Logs { logs: text }).into_response());
    }
    // As the reference: the user log of a provider function has no database copy.
    if !provider && job.provider_id.is_some() {
        return Ok(Json(Logs { logs: "No logs available.".into() }).into_response());
    }
    let stored: Option<String> = jobs::stored_logs(&state.db, &job.id).await?;
    let text = stored.filter(|s| !s.is_empty()).unwrap_or_else(|| "No logs yet.".into());
    Ok(Json(Logs { logs: text }).into_response())
}

/// `text` as the inside of a JSON string (escaped, without the quotes).
fn json_string_body(text: &str) -> String {
    let quoted = serde_json::to_string(text).unwrap_or_default();
    quoted[1..quoted.len() - 1].to_string()
}

/// User logs (job author)
#[utoipa::path(get, path = "/jobs/{job_id}/logs/", tag = "jobs",
    params(("job_id" = String, Path, format = Uuid, example = "00000000-0000-4000-8000-000000000000", description = "job id")),
    responses((status = 200, description = "the log", body = Logs)),
    security(("bearer" = [])))]
pub async fn get_job_logs(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
) -> Result<Response, ApiError> {
    let job = log_reader_job(&state, &caller, &job_id, false).await?;
    logs_answer(&state, &job, false).await
}

/// Provider logs (provider side)
#[utoipa::path(get, path = "/jobs/{job_id}/provider-logs/", tag = "jobs",
    params(("job_id" = String, Path, format = Uuid, example = "00000000-0000-4000-8000-000000000000", description = "job id")),
    responses((status = 200, description = "the log", body = Logs)),
    security(("bearer" = [])))]
pub async fn get_job_provider_logs(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
) -> Result<Response, ApiError> {
    let job = log_reader_job(&state, &caller, &job_id, true).await?;
    logs_answer(&state, &job, true).await
}

/// `GET jobs/{job_id}/events/stream/`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventStreamQuery {
    /// Resume after this event (the Last-Event-ID header wins).
    #[param(value_type = Option<i64>, minimum = 0)]
    pub last_event_id: Option<String>,
}

/// The `Last-Event-ID` header a reconnecting EventSource sends.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Header)]
pub struct LastEventIdHeader {
    /// Resume after this event id.
    #[param(rename = "Last-Event-ID", value_type = Option<i64>, nullable = false, minimum = 0)]
    pub last_event_id: Option<String>,
}

/// `GET jobs/{job_id}/logs/stream/` and `provider-logs/stream/`: `offset` and `format` (`sse`
/// or `text`; by default SSE when `Accept` names `text/event-stream` or the request carries
/// `Last-Event-ID`, else chunked text).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LogStreamQuery {
    /// Byte offset to start from.
    #[param(value_type = Option<i64>, minimum = 0, default = 0)]
    pub offset: Option<String>,
    /// Default: SSE when Accept names text/event-stream or Last-Event-ID is sent, else text.
    #[param(value_type = Option<LogFormat>, inline)]
    pub format: Option<String>,
}

/// How a followed log is sent.
#[derive(Debug, Clone, Copy, ToSchema)]
#[schema(rename_all = "lowercase")]
pub enum LogFormat {
    Sse,
    Text,
}

/// The answer of `logs/` and `provider-logs/` (an archived log is streamed into this shape).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Logs {
    pub logs: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_string_bodies_join_into_the_whole_string() {
        let text = "line \"one\"\n\ttab \\ back ✓\u{1}";
        let joined: String = text.split_inclusive(' ').map(json_string_body).collect();
        let parsed: String = serde_json::from_str(&format!("\"{joined}\"")).unwrap();
        assert_eq!(parsed, text);
    }

    #[test]
    fn carriage_returns_become_line_breaks_for_sse() {
        assert_eq!(sse_safe("a\r\nb\rc\n"), "a\nb\nc\n");
    }
}
