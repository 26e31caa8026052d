//! File endpoints: a user's own area (`files/…`) and a provider's area (`files/provider/…`),
//! each handler parsing its query and calling one flow below. Names are sanitized to a basename,
//! so no request can reach outside its folder; uploads are sniffed against the MIME allow-list
//! before anything is stored.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::access::resolve_function;
use super::error::ApiError;
use super::extract::Query;
use super::fields::{RequestFields, UploadedFile};
use super::shared::Message;
use super::state::AppState;
use crate::auth::Caller;
use crate::db::{programs, providers};
use crate::domain::names;
use crate::domain::visibility::{self, ProviderOperation};
use crate::storage::keys;

/// List the caller's files of a function (one area for all of a user's custom functions)
#[utoipa::path(get, path = "/files/", tag = "files", params(UserFilesQuery),
    responses((status = 200, description = "the file names", body = FileList)),
    security(("bearer" = [])))]
pub async fn list_user_files(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<UserFilesQuery>,
) -> Result<Json<FileList>, ApiError> {
    let results = list(&state, &caller, Area::User, &query.into()).await?;
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
    let files = list(&state, &caller, Area::User, &query.into()).await?;
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
    download(&state, &caller, Area::User, &query.into()).await
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
    Ok(Json(delete(&state, &caller, Area::User, &query.into()).await?))
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
    Ok(Json(upload(&state, &caller, Area::User, &query.into(), fields).await?))
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
    let results = list(&state, &caller, Area::Provider, &query.into()).await?;
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
    download(&state, &caller, Area::Provider, &query.into()).await
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
    Ok(Json(delete(&state, &caller, Area::Provider, &query.into()).await?))
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
    Ok(Json(upload(&state, &caller, Area::Provider, &query.into(), fields).await?))
}

/// Whose area a request reaches: the caller's own, or the provider's of one of its functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Area {
    User,
    Provider,
}

struct Target {
    function: String,
    provider: Option<String>,
}

fn target(query: &FileQuery, provider_required: bool) -> Result<Target, ApiError> {
    let function = query
        .function
        .as_deref()
        .map(|f| names::sanitize_title(f, false))
        .filter(|f| !f.is_empty())
        .ok_or_else(|| ApiError::BadRequest("'function' not provided or is not valid".into()))?;
    let provider = query.provider.as_deref().map(|p| names::sanitize_title(p, false)).filter(|p| !p.is_empty());
    if provider_required && provider.is_none() {
        return Err(ApiError::BadRequest("'provider' not provided or is not valid".into()));
    }
    Ok(Target { function, provider })
}

fn file_name(query: &FileQuery) -> Result<Option<String>, ApiError> {
    match query.file.as_deref() {
        None | Some("") => Err(ApiError::BadRequest("'file' not provided or is not valid".into())),
        Some(raw) => Ok(names::sanitize_file_name(raw)),
    }
}

/// The folder of `area` the query names, if the caller may read it (or, with `write`, change it).
async fn folder(
    state: &AppState,
    caller: &Caller,
    area: Area,
    query: &FileQuery,
    write: bool,
) -> Result<String, ApiError> {
    match area {
        Area::User => user_folder(state, caller, query, write).await,
        Area::Provider => provider_folder(state, caller, query, write).await,
    }
}

/// The caller's own file folder of a function they may use.
async fn user_folder(state: &AppState, caller: &Caller, query: &FileQuery, write: bool) -> Result<String, ApiError> {
    let target = target(query, false)?;
    let rule = if write { visibility::can_write_user_files } else { visibility::can_read_user_files };
    let row =
        resolve_function(state, caller, target.provider.as_deref(), &target.function, rule).await.map_err(|error| {
            match error {
                ApiError::NotFound(_) => ApiError::function_not_found(None, &target.function),
                other => other,
            }
        })?;
    Ok(keys::user_files(&caller.username, row.provider_name.as_deref().map(|p| (p, row.title.as_str()))))
}

/// The provider's file folder of one of its functions, for those who manage it.
async fn provider_folder(
    state: &AppState,
    caller: &Caller,
    query: &FileQuery,
    write: bool,
) -> Result<String, ApiError> {
    let operation = if write { ProviderOperation::FilesWrite } else { ProviderOperation::FilesRead };
    let target = target(query, true)?;
    let provider_name = target.provider.expect("required above");
    let row =
        programs::find_provider_function_named(&state.db, &caller.user_id, &provider_name, &target.function).await?;
    match row {
        Some(row) if visibility::can_manage(caller.access(&row), operation) => {
            Ok(keys::provider_files(&provider_name, &row.title))
        }
        Some(_) => Err(ApiError::provider_not_found(&provider_name)),
        // No such function: its provider's admins learn that, everyone else that there is no
        // such provider (for them).
        None => match providers::find_by_name(&state.db, &provider_name).await? {
            Some(provider) if providers::is_admin(&state.db, &provider.id, &caller.user_id).await? => {
                Err(ApiError::function_not_found(Some(&provider_name), &target.function))
            }
            _ => Err(ApiError::provider_not_found(&provider_name)),
        },
    }
}

/// The names of the files in an area.
pub async fn list(state: &AppState, caller: &Caller, area: Area, query: &FileQuery) -> Result<Vec<String>, ApiError> {
    let folder = folder(state, caller, area, query, false).await?;
    state.storage.list(&folder).await.map_err(|e| ApiError::storage(&state.storage, e, None))
}

/// A file of an area, streamed with its type, length and name.
pub async fn download(state: &AppState, caller: &Caller, area: Area, query: &FileQuery) -> Result<Response, ApiError> {
    let folder = folder(state, caller, area, query, false).await?;
    let name = file_name(query)?.ok_or_else(ApiError::file_not_found)?;
    let object = state.storage.get(&format!("{folder}{name}")).await;
    let object =
        object.map_err(|e| ApiError::storage(&state.storage, e, None))?.ok_or_else(ApiError::file_not_found)?;
    let content_type = mime_guess::from_path(&name).first_or_octet_stream().to_string();
    let size = object.size;
    let mut response = crate::api::fields::stream_body(object).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_str(&content_type).expect("mime types are valid headers"));
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    headers.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_str(&format!("attachment; filename={name}")).expect("sanitized names are valid headers"),
    );
    Ok(response)
}

/// Deletes a file of an area.
pub async fn delete(state: &AppState, caller: &Caller, area: Area, query: &FileQuery) -> Result<Message, ApiError> {
    let folder = folder(state, caller, area, query, true).await?;
    let name = file_name(query)?.ok_or_else(ApiError::file_not_found)?;
    let deleted = state.storage.delete(&format!("{folder}{name}")).await;
    let not_deleted = || Some(format!("the file {name} was not deleted"));
    if deleted.map_err(|e| ApiError::storage(&state.storage, e, not_deleted()))? {
        Ok(Message::new("Requested file was deleted."))
    } else {
        Err(ApiError::file_not_found())
    }
}

/// Stores an uploaded file in an area: the file is checked before the function is looked up,
/// as with the reference. Answers the key it was stored under.
pub async fn upload(
    state: &AppState,
    caller: &Caller,
    area: Area,
    query: &FileQuery,
    mut fields: RequestFields,
) -> Result<Message, ApiError> {
    let file = checked_file(state, &mut fields)?;
    let folder = folder(state, caller, area, query, true).await?;
    let name = file
        .file_name
        .as_deref()
        .and_then(names::sanitize_file_name)
        .ok_or_else(|| ApiError::BadRequest("The uploaded file has no usable name.".into()))?;
    let key = format!("{folder}{name}");
    let not_stored = || Some(format!("the file {name} was not stored"));
    let stored = state.storage.put_spooled(&key, file.path).await;
    stored.map_err(|e| match e.is_folder_in_the_way() {
        true => ApiError::Conflict(format!(
            "A folder named {name} is where the file would go: the file {name} was not stored."
        )),
        false => ApiError::storage(&state.storage, e, not_stored()),
    })?;
    Ok(Message::new(key))
}

fn checked_file(state: &AppState, fields: &mut RequestFields) -> Result<UploadedFile, ApiError> {
    let file = fields.take_file("file").ok_or_else(|| ApiError::BadRequest("A file should be uploaded.".into()))?;
    let mime = sniff_mime(&file.head);
    if !state.config.allowed_mime_types.iter().any(|allowed| allowed == &mime) {
        return Err(ApiError::BadRequest(format!(
            "Uploaded file is not a valid type. Its content is {mime}; accepted types: {}.",
            state.config.allowed_mime_types.join(", ")
        )));
    }
    Ok(file)
}

/// The MIME type of uploaded content, from its first bytes: known binary signatures first, then
/// JSON, then text; anything else is `application/octet-stream`.
pub fn sniff_mime(head: &[u8]) -> String {
    if head.is_empty() {
        return "application/x-empty".into();
    }
    if let Some(kind) = infer::get(head) {
        return kind.mime_type().to_string();
    }
    if is_tar(head) {
        return "application/x-tar".into();
    }
    let text = match std::str::from_utf8(head) {
        Ok(text) => Some(text),
        // The head may cut a multi-byte character.
        Err(error) if error.error_len().is_none() => std::str::from_utf8(&head[..error.valid_up_to()]).ok(),
        Err(_) => None,
    };
    match text {
        Some(text) if !text.contains('\0') => {
            let trimmed = text.trim_start();
            let lower = trimmed.to_ascii_lowercase();
            if lower.starts_with("<!doctype html") || lower.starts_with("<html") || lower.starts_with("<script") {
                "text/html".into()
            } else if lower.starts_with("#!") {
                "text/x-shellscript".into()
            } else if (trimmed.starts_with('{') || trimmed.starts_with('['))
                && serde_json::from_str::<Value>(text).is_ok()
            {
                "application/json".into()
            } else {
                "text/plain".into()
            }
        }
        _ => "application/octet-stream".into(),
    }
}

fn is_tar(head: &[u8]) -> bool {
    head.len() >= 262 && &head[257..262] == b"ustar"
}

/// A file upload (multipart only).
#[derive(Debug, Clone, ToSchema)]
#[allow(dead_code)]
pub struct FileUpload {
    /// The file; its content must sniff as one of the accepted MIME types.
    #[schema(value_type = String, format = Binary, content_media_type = "text/plain", example = "notes.txt")]
    file: String,
}

/// Where a files request points: the function, its provider, a file.
#[derive(Debug, Default)]
pub struct FileQuery {
    pub function: Option<String>,
    pub provider: Option<String>,
    pub file: Option<String>,
}

/// The caller's files of a function (`files/`, `files/list/`, `files/upload/`).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UserFilesQuery {
    /// Function title.
    #[param(required = true, min_length = 1, pattern = "[A-Za-z0-9_-]", example = "example-fn")]
    pub function: Option<String>,
    /// Provider name.
    pub provider: Option<String>,
}

/// One of the caller's files (`files/download/`, `files/delete/`).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UserFileQuery {
    /// Function title.
    #[param(required = true, min_length = 1, pattern = "[A-Za-z0-9_-]", example = "example-fn")]
    pub function: Option<String>,
    /// Provider name.
    pub provider: Option<String>,
    /// File name.
    #[param(required = true, min_length = 1, example = "notes.txt")]
    pub file: Option<String>,
}

/// A provider's files of one of its functions (`files/provider/`, `files/provider/upload/`).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ProviderFilesQuery {
    /// Function title.
    #[param(required = true, min_length = 1, pattern = "[A-Za-z0-9_-]", example = "example-fn")]
    pub function: Option<String>,
    /// Provider name.
    #[param(required = true, min_length = 1, pattern = "[A-Za-z0-9_-]", example = "example-provider")]
    pub provider: Option<String>,
}

/// One of a provider's files (`files/provider/download/`, `files/provider/delete/`).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ProviderFileQuery {
    /// Function title.
    #[param(required = true, min_length = 1, pattern = "[A-Za-z0-9_-]", example = "example-fn")]
    pub function: Option<String>,
    /// Provider name.
    #[param(required = true, min_length = 1, pattern = "[A-Za-z0-9_-]", example = "example-provider")]
    pub provider: Option<String>,
    /// File name.
    #[param(required = true, min_length = 1, example = "notes.txt")]
    pub file: Option<String>,
}

impl From<UserFilesQuery> for FileQuery {
    fn from(q: UserFilesQuery) -> FileQuery {
        FileQuery { function: q.function, provider: q.provider, file: None }
    }
}

impl From<UserFileQuery> for FileQuery {
    fn from(q: UserFileQuery) -> FileQuery {
        FileQuery { function: q.function, provider: q.provider, file: q.file }
    }
}

impl From<ProviderFilesQuery> for FileQuery {
    fn from(q: ProviderFilesQuery) -> FileQuery {
        FileQuery { function: q.function, provider: q.provider, file: None }
    }
}

impl From<ProviderFileQuery> for FileQuery {
    fn from(q: ProviderFileQuery) -> FileQuery {
        FileQuery { function: q.function, provider: q.provider, file: q.file }
    }
}

/// The file names of an area (`files/`, `files/provider/`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FileList {
    pub results: Vec<String>,
}

/// The file names of an area in the spec's shape (`files/list/`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SpecFileList {
    pub files: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_is_sniffed_like_libmagic_would() {
        assert_eq!(sniff_mime(b"hello world\n"), "text/plain");
        assert_eq!(sniff_mime(b"{\"a\": 1}"), "application/json");
        assert_eq!(sniff_mime(b"a,b\n1,2\n"), "text/plain");
        assert_eq!(sniff_mime(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0]), "application/gzip");
        assert_eq!(sniff_mime(b"PK\x03\x04rest"), "application/zip");
        assert_eq!(sniff_mime(b"\x89PNG\r\n\x1a\n0000"), "image/png");
        assert_eq!(sniff_mime(b"<html><body>x</body></html>"), "text/html");
        assert_eq!(sniff_mime(&[0, 1, 2, 3, 255]), "application/octet-stream");
        let mut tar = vec![0u8; 512];
        tar[257..262].copy_from_slice(b"ustar");
        tar[0] = b'a';
        assert_eq!(sniff_mime(&tar), "application/x-tar");
    }
}
