//! `POST programs/validate_arguments/`: arguments checked against the schema of a function the
//! caller may run, bounded in concurrency and time; `run` checks its arguments the same way
//! (`check_arguments`).

use std::borrow::Cow;
use std::sync::LazyLock;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use serde_json::Value;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::Schema;
use utoipa::{PartialSchema, ToSchema};

use crate::api::access::resolve_function;
use crate::api::error::ApiError;
use crate::api::fields::RequestFields;
use crate::api::shared::{arguments_text, bad, one_provider};
use crate::api::state::AppState;
use crate::auth::Caller;
use crate::db::programs::ProgramRow;
use crate::domain::{names, schema, visibility};

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
    Ok(Json(validate(&state, &caller, request).await?))
}

/// Longest a single argument validation may run before the request is answered with a 400.
pub const VALIDATION_TIME_LIMIT: Duration = Duration::from_secs(5);

/// Validations running at once; more wait, so hostile inputs cannot take every core.
static VALIDATION_SLOTS: LazyLock<tokio::sync::Semaphore> = LazyLock::new(|| tokio::sync::Semaphore::new(2));

/// Validates arguments against the schema of a function the caller may run.
pub async fn validate(state: &AppState, caller: &Caller, request: ValidateRequest) -> Result<Valid, ApiError> {
    let ValidateRequest { title, provider, arguments } = request;
    let row = resolve_function(state, caller, provider.as_deref(), &title, visibility::can_run).await?;
    check_arguments(state, &row, arguments).await?;
    Ok(Valid { valid: true })
}

/// Validates arguments against a function's stored schema, bounded in concurrency and time.
pub async fn check_arguments(state: &AppState, row: &ProgramRow, arguments: String) -> Result<(), ApiError> {
    let Some(schema_text) = row.arguments_schema.clone() else {
        return Ok(());
    };
    let schema: Value = serde_json::from_str(&schema_text)
        .map_err(|e| bad(format!("the function arguments schema cannot be used: {e}")))?;
    let max_bytes = state.config.max_arguments_bytes;
    let _slot = VALIDATION_SLOTS.acquire().await.map_err(ApiError::internal)?;
    let task = tokio::task::spawn_blocking(move || schema::validate_arguments(&schema, &arguments, max_bytes));
    match tokio::time::timeout(VALIDATION_TIME_LIMIT, task).await {
        Err(_) => Err(bad(format!(
            "argument validation took longer than {} s and was abandoned; simplify the arguments or the schema.",
            VALIDATION_TIME_LIMIT.as_secs()
        ))),
        Ok(joined) => joined
            .map_err(ApiError::internal)?
            .map_err(|violation| ApiError::InvalidArguments { message: violation.message, path: violation.path }),
    }
}

/// `POST programs/validate_arguments/`.
#[derive(Debug, Clone, ToSchema)]
pub struct ValidateRequest {
    /// The function's title; `provider/title` names a provider function.
    #[schema(min_length = 1, pattern = "^[^/]*[A-Za-z0-9_-][^/]*(/[^/]*[A-Za-z0-9_-][^/]*)?$", example = "example-fn")]
    pub title: String,
    #[schema(nullable = false)]
    pub provider: Option<String>,
    /// The arguments as encoded JSON text (the client sends a string; a JSON object is accepted
    /// too), validated against the function's schema.
    #[schema(min_length = 1, example = "{}")]
    pub arguments: String,
}

impl ValidateRequest {
    pub fn parse(fields: &RequestFields) -> Result<ValidateRequest, ApiError> {
        let raw_title = fields.required_text("title")?;
        let (provider, title) = names::split_title(&raw_title, fields.text("provider").as_deref()).map_err(bad)?;
        let arguments = arguments_text(fields)?;
        Ok(ValidateRequest { title, provider, arguments })
    }
}

/// The validation body: `ValidateRequest` with the `title`/`provider` rule of uploads.
pub struct ValidateBody;

impl PartialSchema for ValidateBody {
    fn schema() -> RefOr<Schema> {
        one_provider(ValidateRequest::schema())
    }
}

impl ToSchema for ValidateBody {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("ValidateBody")
    }
}

/// The answer of `validate_arguments/`: the arguments fit the schema (else a 400 says where not).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Valid {
    pub valid: bool,
}
