//! Reading functions: those the caller can see (`programs/`, as `filter` narrows them) and one by
//! title (`programs/get_by_title/{title}/`).

use axum::Json;
use axum::extract::{Path, State};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::api::access::resolve_function;
use crate::api::error::ApiError;
use crate::api::extract::Query;
use crate::api::shared::FunctionRecord;
use crate::api::state::AppState;
use crate::auth::Caller;
use crate::db::programs;
use crate::domain::names;
use crate::domain::visibility::{self, FunctionAccess};

/// List the functions the caller can see
#[utoipa::path(get, path = "/programs/", tag = "functions", params(ProgramsQuery),
    responses((status = 200, description = "the functions", body = Vec<FunctionRecord>)),
    security(("bearer" = [])))]
pub async fn list_programs(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<ProgramsQuery>,
) -> Result<Json<Vec<FunctionRecord>>, ApiError> {
    Ok(Json(list(&state, &caller, query).await?))
}

/// One function by title (own function, or a provider's with `provider`)
#[utoipa::path(get, path = "/programs/get_by_title/{title}/", tag = "functions",
    params(("title" = String, Path, min_length = 1, example = "example-fn", description = "function title"), ProviderQuery),
    responses((status = 200, description = "the function", body = FunctionRecord)),
    security(("bearer" = [])))]
pub async fn get_program_by_title(
    State(state): State<AppState>,
    caller: Caller,
    Path(title): Path<String>,
    Query(query): Query<ProviderQuery>,
) -> Result<Json<FunctionRecord>, ApiError> {
    Ok(Json(by_title(&state, &caller, &title, query.provider).await?))
}

/// The functions the caller can see, as `filter` narrows them.
pub async fn list(state: &AppState, caller: &Caller, query: ProgramsQuery) -> Result<Vec<FunctionRecord>, ApiError> {
    let provider = query.provider.as_deref().map(|p| names::sanitize_title(p, false)).filter(|p| !p.is_empty());
    let rows =
        programs::list_candidates(&state.db, &caller.user_id, provider.as_deref(), caller.has_instance()).await?;
    let rule: fn(FunctionAccess) -> bool = match query.filter.as_deref() {
        Some("serverless") => |access| !access.has_provider && access.is_author,
        Some("catalog") => visibility::in_catalog,
        _ => visibility::can_view,
    };
    Ok(rows.iter().filter(|row| rule(caller.access(row))).map(FunctionRecord::of).collect())
}

/// One function the caller can see, by title (and provider).
pub async fn by_title(
    state: &AppState,
    caller: &Caller,
    title: &str,
    provider: Option<String>,
) -> Result<FunctionRecord, ApiError> {
    let provider = provider.map(|p| names::sanitize_title(&p, false)).filter(|p| !p.is_empty());
    let title = names::sanitize_title(title, false);
    let row = resolve_function(state, caller, provider.as_deref(), &title, visibility::can_view).await?;
    Ok(FunctionRecord::of(&row))
}

/// `GET programs/`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ProgramsQuery {
    /// serverless (own functions) or catalog (provider functions the caller may run); other
    /// values list everything.
    pub filter: Option<String>,
    /// Only functions of this provider.
    pub provider: Option<String>,
}

/// `GET programs/get_by_title/{title}/`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ProviderQuery {
    /// Provider name.
    pub provider: Option<String>,
}
