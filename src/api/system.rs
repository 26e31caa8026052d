//! Probes, version and the dependency allow-list.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::error::ApiError;
use super::state::AppState;
use crate::auth::Caller;
use crate::domain::dependencies;

pub async fn version(State(state): State<AppState>) -> Json<Value> {
    Json(json!({ "version": state.config.version }))
}

pub async fn liveness() -> Json<Value> {
    Json(json!({ "status": "alive" }))
}

/// Ready when both the database and the object storage answer.
pub async fn readiness(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    if let Err(error) = state.db.ping().await {
        tracing::warn!(error = &error as &dyn std::error::Error, "readiness: database unavailable");
        return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "status": "database_unavailable" })));
    }
    if let Err(error) = state.storage.check().await {
        tracing::warn!(error = &error as &dyn std::error::Error, "readiness: storage unavailable");
        return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "status": "storage_unavailable" })));
    }
    (StatusCode::OK, Json(json!({ "status": "ready" })))
}

pub async fn dependencies_versions(_caller: Caller) -> Result<Json<Vec<&'static str>>, ApiError> {
    Ok(Json(dependencies::ALLOWED.to_vec()))
}
