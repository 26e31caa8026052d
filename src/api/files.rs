//! File endpoints: a user's own area (`files/…`) and a provider's area (`files/provider/…`).
//! Each parses its query and calls one `service::files` function.

use axum::Json;
use axum::extract::State;

use axum::response::Response;

use super::answers::{FileList, Message, SpecFileList};
use super::error::ApiError;
use super::extract::Query;
use super::fields::RequestFields;
use super::requests::{FileUpload, ProviderFileQuery, ProviderFilesQuery, UserFileQuery, UserFilesQuery};
use super::service::files::{self as service, Area};
use super::state::AppState;
use crate::auth::Caller;

/// List the caller's files of a function (one area for all of a user's custom functions)
#[utoipa::path(get, path = "/files/", tag = "files", params(UserFilesQuery),
    responses((status = 200, description = "the file names", body = FileList)),
    security(("bearer" = [])))]
pub async fn list_user_files(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<UserFilesQuery>,
) -> Result<Json<FileList>, ApiError> {
    let results = service::list(&state, &caller, Area::User, &query.into()).await?;
    Ok(Json(FileList { results }))
}

/// List the caller's files of a function (spec shape)
#[utoipa::path(get, path = "/files/list/", tag = "files", params(UserFilesQuery),
    responses((status = 200, description = "the file names", body = SpecFileList)),
    security(("bearer" = [])))]
pub async fn list_user_files_spec(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<UserFilesQuery>,
) -> Result<Json<SpecFileList>, ApiError> {
    let files = service::list(&state, &caller, Area::User, &query.into()).await?;
    Ok(Json(SpecFileList { files }))
}

/// Download a file (streamed)
#[utoipa::path(get, path = "/files/download/", tag = "files", params(UserFileQuery),
    responses((status = 200, description = "the file", content_type = "application/octet-stream", body = Vec<u8>)),
    security(("bearer" = [])))]
pub async fn download_user_file(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<UserFileQuery>,
) -> Result<Response, ApiError> {
    service::download(&state, &caller, Area::User, &query.into()).await
}

/// Delete a file
#[utoipa::path(delete, path = "/files/delete/", tag = "files", params(UserFileQuery),
    responses((status = 200, description = "deleted", body = Message)),
    security(("bearer" = [])))]
pub async fn delete_user_file(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<UserFileQuery>,
) -> Result<Json<Message>, ApiError> {
    Ok(Json(service::delete(&state, &caller, Area::User, &query.into()).await?))
}

/// Upload a file to the caller's area
#[utoipa::path(post, path = "/files/upload/", tag = "files", params(UserFilesQuery),
    request_body(content((FileUpload = "multipart/form-data"))),
    responses((status = 200, description = "the key the file was stored under", body = Message),
        (status = 409, description = "a folder holds the file's name in the area (a job made one): the file was not stored", body = crate::api::error::ErrorBody)),
    security(("bearer" = [])))]
pub async fn upload_user_file(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<UserFilesQuery>,
    fields: RequestFields,
) -> Result<Json<Message>, ApiError> {
    Ok(Json(service::upload(&state, &caller, Area::User, &query.into(), fields).await?))
}

/// List a provider's files of a function
#[utoipa::path(get, path = "/files/provider/", tag = "files", params(ProviderFilesQuery),
    responses((status = 200, description = "the file names", body = FileList)),
    security(("bearer" = [])))]
pub async fn list_provider_files(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<ProviderFilesQuery>,
) -> Result<Json<FileList>, ApiError> {
    let results = service::list(&state, &caller, Area::Provider, &query.into()).await?;
    Ok(Json(FileList { results }))
}

/// Download a provider file
#[utoipa::path(get, path = "/files/provider/download/", tag = "files", params(ProviderFileQuery),
    responses((status = 200, description = "the file", content_type = "application/octet-stream", body = Vec<u8>)),
    security(("bearer" = [])))]
pub async fn download_provider_file(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<ProviderFileQuery>,
) -> Result<Response, ApiError> {
    service::download(&state, &caller, Area::Provider, &query.into()).await
}

/// Delete a provider file
#[utoipa::path(delete, path = "/files/provider/delete/", tag = "files", params(ProviderFileQuery),
    responses((status = 200, description = "deleted", body = Message)),
    security(("bearer" = [])))]
pub async fn delete_provider_file(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<ProviderFileQuery>,
) -> Result<Json<Message>, ApiError> {
    Ok(Json(service::delete(&state, &caller, Area::Provider, &query.into()).await?))
}

/// Upload a provider file
#[utoipa::path(post, path = "/files/provider/upload/", tag = "files", params(ProviderFilesQuery),
    request_body(content((FileUpload = "multipart/form-data"))),
    responses((status = 200, description = "the key the file was stored under", body = Message),
        (status = 409, description = "a folder holds the file's name in the area (a job made one): the file was not stored", body = crate::api::error::ErrorBody)),
    security(("bearer" = [])))]
pub async fn upload_provider_file(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<ProviderFilesQuery>,
    fields: RequestFields,
) -> Result<Json<Message>, ApiError> {
    Ok(Json(service::upload(&state, &caller, Area::Provider, &query.into(), fields).await?))
}
