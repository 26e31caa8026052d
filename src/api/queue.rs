//! `GET jobs/queue/`: where the caller's unfinished jobs stand, for the console's queue panel
//! and any client. Not part of the reference API (an addition, in the OpenAPI document).

use axum::Json;
use axum::extract::{Query, State};
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use super::state::AppState;
use crate::auth::Caller;
use crate::db::{self, queue};

/// At most this many of the caller's unfinished jobs are listed (and the default).
const MAX_LISTED: i64 = 500;

#[derive(Debug, Deserialize, Default)]
pub struct QueueQuery {
    limit: Option<String>,
}

/// The caller's queue: active slots used and allowed, and each unfinished job's place.
#[derive(Debug, Serialize)]
pub struct QueueAnswer {
    /// The most QUEUED+PENDING+RUNNING jobs the caller may have at once (`run` answers 429
    /// beyond it).
    pub active_limit: i64,
    /// The caller's QUEUED+PENDING+RUNNING jobs, all of them (not only those listed).
    pub active: i64,
    /// Of those, QUEUED.
    pub queued: i64,
    /// Of those, PENDING or RUNNING.
    pub running: i64,
    /// The oldest of them, at most `limit` (default and most: 500).
    pub jobs: Vec<QueuedPlace>,
}

#[derive(Debug, Serialize)]
pub struct QueuedPlace {
    pub id: String,
    pub status: String,
    pub created: String,
    /// For a QUEUED job, how many queued jobs of any user came before it; null otherwise.
    pub ahead: Option<i64>,
}

pub async fn my_queue(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<QueueQuery>,
) -> Result<Json<QueueAnswer>, ApiError> {
    let limit = match query.limit.as_deref().map(str::trim) {
        None | Some("") => MAX_LISTED,
        Some(text) => text.parse::<i64>().ok().filter(|n| (0..=MAX_LISTED).contains(n)).ok_or_else(|| {
            ApiError::BadRequest(format!("'limit' must be an integer from 0 to {MAX_LISTED}, got '{text}'."))
        })?,
    };
    let counts = queue::active_counts(&state.db, &caller.user_id).await?;
    let count = |status: &str| counts.iter().filter(|(s, _)| s == status).map(|(_, n)| n).sum::<i64>();
    let places = queue::places(&state.db, &caller.user_id, limit).await?;
    Ok(Json(QueueAnswer {
        active_limit: state.config.active_jobs_per_user,
        active: count("QUEUED") + count("PENDING") + count("RUNNING"),
        queued: count("QUEUED"),
        running: count("PENDING") + count("RUNNING"),
        jobs: places
            .into_iter()
            .map(|p| QueuedPlace {
                ahead: (p.status == "QUEUED").then_some(p.ahead),
                id: p.id,
                status: p.status,
                created: db::format_timestamp(p.created),
            })
            .collect(),
    }))
}
