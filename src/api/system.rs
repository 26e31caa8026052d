//! Probes, version and the dependency allow-list.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;

use super::error::ApiError;
use super::state::AppState;
use crate::auth::Caller;
use crate::domain::dependencies;

/// Gateway version
#[utoipa::path(get, path = "/version/", tag = "system",
    responses((status = 200, description = "the version", body = Version)))]
pub async fn version(State(state): State<AppState>) -> Json<Version> {
    Json(Version { version: state.config.version.clone() })
}

/// Alive
#[utoipa::path(get, path = "/liveness/", tag = "system",
    responses((status = 200, description = "alive", body = Probe)))]
pub async fn liveness() -> Json<Probe> {
    Json(Probe { status: "alive" })
}

/// Ready when database and storage answer
#[utoipa::path(get, path = "/readiness/", tag = "system",
    responses((status = 200, description = "ready", body = Probe), (status = 503, description = "not ready", body = Probe)))]
pub async fn readiness(State(state): State<AppState>) -> (StatusCode, Json<Probe>) {
    if let Err(error) = state.db.ping().await {
        tracing::warn!(error = &error as &dyn std::error::Error, "readiness: database unavailable");
        return (StatusCode::SERVICE_UNAVAILABLE, Json(Probe { status: "database_unavailable" }));
    }
    if let Err(error) = state.storage.check().await {
        tracing::warn!(error = &error as &dyn std::error::Error, "readiness: storage unavailable");
        return (StatusCode::SERVICE_UNAVAILABLE, Json(Probe { status: "storage_unavailable" }));
    }
    (StatusCode::OK, Json(Probe { status: "ready" }))
}

/// Allowed extra dependencies
#[utoipa::path(get, path = "/dependencies-versions/", tag = "system",
    responses((status = 200, description = "pinned requirements", body = Vec<String>)),
    security(("bearer" = [])))]
pub async fn dependencies_versions(_caller: Caller) -> Result<Json<Vec<&'static str>>, ApiError> {
    Ok(Json(dependencies::ALLOWED.to_vec()))
}

/// `GET version/`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Version {
    pub version: String,
}

/// `GET liveness/` and `readiness/`: `alive`, `ready`, `database_unavailable` or
/// `storage_unavailable`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Probe {
    pub status: &'static str,
}
