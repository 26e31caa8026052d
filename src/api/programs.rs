//! Function endpoints: list, get by title, upload and argument validation. Each parses its
//! request and calls one `service::programs` function.

use axum::Json;
use axum::extract::{Path, State};

use axum::response::Response;

use super::answers::{FunctionRecord, Valid};
use super::error::ApiError;
use super::extract::Query;
use super::fields::RequestFields;
use super::idempotency::{self, IdempotencyKey, IdempotencyKeyHeader};
use super::requests::{ProgramsQuery, ProviderQuery, UploadFields, UploadMultipart, ValidateBody, ValidateRequest};
use super::service::programs as service;
use super::state::AppState;
use crate::auth::Caller;

pub use super::service::programs::VALIDATION_TIME_LIMIT;

/// List the functions the caller can see
#[utoipa::path(get, path = "/programs/", tag = "functions", params(ProgramsQuery),
    responses((status = 200, description = "the functions", body = Vec<FunctionRecord>)),
    security(("bearer" = [])))]
pub async fn list_programs(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<ProgramsQuery>,
) -> Result<Json<Vec<FunctionRecord>>, ApiError> {
    Ok(Json(service::list(&state, &caller, query).await?))
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
    Ok(Json(service::by_title(&state, &caller, &title, query.provider).await?))
}

/// Create or update a function (upsert)
///
/// `title` (or `provider` and `title`) names the function. When it exists (and the caller may
/// manage it), the request updates it: only the fields sent change, so `title` alone is a
/// valid update that keeps everything. When it does not exist, the request creates it and
/// needs what the function runs: `entrypoint` and `artifact` (multipart only), or `image` with
/// `provider` (a provider's container image); without them the answer is 400 `At least one of
/// attributes (entrypoint, image) is required.` or asks for the artifact. `type` is honoured
/// on creation only. With an `Idempotency-Key`, a retry gets the first answer.
#[utoipa::path(post, path = "/programs/upload/", tag = "functions", params(IdempotencyKeyHeader),
    request_body(content(
        (UploadMultipart = "multipart/form-data"),
        (UploadFields = "application/json"),
        (UploadFields = "application/x-www-form-urlencoded"))),
    responses((status = 200, description = "the function as stored", body = FunctionRecord)),
    security(("bearer" = [])))]
pub async fn upload_program(
    State(state): State<AppState>,
    caller: Caller,
    key: IdempotencyKey,
    fields: RequestFields,
) -> Result<Response, ApiError> {
    let request = key.with_request(&fields).await?;
    let (db, user_id) = (state.db.clone(), caller.user_id.clone());
    let work = async move {
        let (provider, title) = service::upload_target(&fields)?;
        service::upload(&state, &caller, provider, title, fields).await.map(Json)
    };
    Ok(idempotency::answer_once(&db, &user_id, request, work).await)
}

/// Validate arguments against a function's schema
#[utoipa::path(post, path = "/programs/validate_arguments/", tag = "functions",
    request_body(content(
        (ValidateBody = "application/json"),
        (ValidateBody = "application/x-www-form-urlencoded"))),
    responses((status = 200, description = "the arguments are valid", body = Valid)),
    security(("bearer" = [])))]
pub async fn validate_arguments(
    State(state): State<AppState>,
    caller: Caller,
    fields: RequestFields,
) -> Result<Json<Valid>, ApiError> {
    let request = ValidateRequest::parse(&fields)?;
    Ok(Json(service::validate(&state, &caller, request).await?))
}
