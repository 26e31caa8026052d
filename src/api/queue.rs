//! `GET jobs/queue/`: where the caller's unfinished jobs stand, for the console's queue panel
//! and any client. Not part of the reference API (an addition, in the OpenAPI document).

use axum::Json;
use axum::extract::State;
use serde::Serialize;

use super::error::ApiError;
use super::state::AppState;
use crate::auth::Caller;
use crate::db::{self, queue};

/// At most this many of the caller's unfinished jobs are listed.
const LISTED: i64 = 500;

/// The caller's queue: active slots used and allowed, and each unfinished job's place.
#[derive(Debug, Serialize)]
pub struct QueueAnswer {
    /// The most QUEUED+PENDING+RUNNING jobs the caller may have at once (`run` answers 429
    /// beyond it).
    pub active_limit: i64,
    /// The caller's QUEUED+PENDING+RUNNING jobs.
    pub active: usize,
    /// Of those, QUEUED.
    pub queued: usize,
    /// Of those, PENDING or RUNNING.
    pub running: usize,
    /// Oldest first.
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

pub async fn my_queue(State(state): State<AppState>, caller: Caller) -> Result<Json<QueueAnswer>, ApiError> {
    let places = queue::places(&state.db, &caller.user_id, LISTED).await?;
    let queued = places.iter().filter(|p| p.status == "QUEUED").count();
    Ok(Json(QueueAnswer {
        active_limit: state.config.active_jobs_per_user,
        active: places.len(),
        queued,
        running: places.len() - queued,
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
