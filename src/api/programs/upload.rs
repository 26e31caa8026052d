//! `POST programs/upload/`: create or update a function, an upsert with the reference's merge
//! rules, storing the artifact and removing it again when the database write fails. With an
//! `Idempotency-Key`, a retry gets the first answer.

use std::borrow::Cow;

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use serde_json::{Map, Value};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::Schema;
use utoipa::{PartialSchema, ToSchema};

use crate::api::error::ApiError;
use crate::api::fields::{RequestFields, UploadedFile};
use crate::api::idempotency::{self, IdempotencyKey, IdempotencyKeyHeader};
use crate::api::shared::{FunctionRecord, Size, bad, one_provider};
use crate::api::state::AppState;
use crate::auth::Caller;
use crate::db::programs::{self, ProgramFields, ProgramRow};
use crate::db::providers::{self, ProviderRow};
use crate::domain::visibility::{self, ProviderOperation};
use crate::domain::{dependencies, names, schema, sizes};
use crate::storage::keys;

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
        let (provider, title) = upload_target(&fields)?;
        upload(&state, &caller, provider, title, fields).await.map(Json)
    };
    Ok(idempotency::answer_once(&db, &user_id, request, work).await)
}

/// The function an upload names: `title` (at most 255 characters, maybe `provider/title`) and
/// `provider`, sanitized.
pub fn upload_target(fields: &RequestFields) -> Result<(Option<String>, String), ApiError> {
    let raw_title = fields.required_text("title")?;
    if raw_title.chars().count() > 255 {
        return Err(bad("'title' must be at most 255 characters."));
    }
    names::split_title(&raw_title, fields.text("provider").as_deref()).map_err(bad)
}

/// Creates or updates the function `provider/title` from the upload's fields: checks the
/// caller may, merges the fields sent onto the stored ones, stores a new artifact, writes the
/// function (removing the new artifact if that fails) and removes the artifact it replaced.
pub async fn upload(
    state: &AppState,
    caller: &Caller,
    provider_name: Option<String>,
    title: String,
    mut fields: RequestFields,
) -> Result<FunctionRecord, ApiError> {
    let not_found = || ApiError::function_not_found(provider_name.as_deref(), &title);
    let (provider, existing) = upload_access(state, caller, provider_name.as_deref(), &title, &fields).await?;
    let base = match &existing {
        Some(row) => ProgramFields::from_row(row),
        None => ProgramFields {
            dependencies: "[]".into(),
            env_vars: "{}".into(),
            program_type: "GENERIC".into(),
            runner: "local".into(),
            sizes: "{}".into(),
            ..Default::default()
        },
    };
    let mut program = merge_upload(&fields, base, provider.as_ref(), existing.is_none())?;
    let program_id = existing.as_ref().map(|row| row.id.clone()).unwrap_or_else(crate::db::new_id);

    let previous_artifact = program.artifact_key.clone();
    let stored_artifact = match fields.take_file("artifact") {
        Some(artifact) => Some(store_artifact(state, &program_id, &program, artifact).await?),
        None if existing.is_none() && program.image.is_none() => {
            return Err(bad("An artifact (.tar) is required to create a function with an entrypoint."));
        }
        None => None,
    };
    if let Some(key) = &stored_artifact {
        program.artifact_key = Some(key.clone());
    }

    let written = match &existing {
        Some(_) => programs::update(&state.db, &program_id, &program).await,
        None => {
            let provider_id = provider.as_ref().map(|p| p.id.as_str());
            programs::insert(&state.db, &program_id, &title, provider_id, &caller.user_id, &program).await
        }
    };
    if let Err(error) = written {
        // Compensation: the new artifact belongs to no function.
        if let Some(key) = &stored_artifact
            && let Err(cleanup) = state.storage.delete(key).await
        {
            tracing::warn!(
                error = &cleanup as &dyn std::error::Error,
                "failed to remove the artifact of a failed upload"
            );
        }
        if error.unique_violation().is_some() {
            return Err(ApiError::Conflict(format!(
                "Function {title} was uploaded by another request at the same time; retry the upload."
            )));
        }
        return Err(error.into());
    }
    if let (Some(old), Some(_)) = (previous_artifact, &stored_artifact)
        && let Err(error) = state.storage.delete(&old).await
    {
        tracing::warn!(error = &error as &dyn std::error::Error, "failed to remove a replaced artifact");
    }
    let row = programs::find_by_id(&state.db, &caller.user_id, &program_id).await?.ok_or_else(not_found)?;
    Ok(FunctionRecord::of(&row))
}

/// The provider and the stored function of an upload, when the caller may upload it.
async fn upload_access(
    state: &AppState,
    caller: &Caller,
    provider_name: Option<&str>,
    title: &str,
    fields: &RequestFields,
) -> Result<(Option<ProviderRow>, Option<ProgramRow>), ApiError> {
    let not_found = || ApiError::function_not_found(provider_name, title);
    match provider_name {
        Some(name) => {
            let provider = match providers::find_by_name(&state.db, name).await? {
                Some(provider) => provider,
                // As the reference: an image names its provider, which must exist.
                None if fields.text("image").is_some_and(|image| !image.is_empty()) => {
                    return Err(bad(format!("{name} is not valid provider.")));
                }
                None => return Err(not_found()),
            };
            let existing = programs::find_provider_function(&state.db, &caller.user_id, &provider.id, title).await?;
            let allowed = match &existing {
                Some(row) => visibility::can_manage(caller.access(row), ProviderOperation::Upload),
                // Instances: `function.write` on the (provider, title) even for a new function.
                None if caller.instance.is_some() => visibility::can_manage(
                    visibility::FunctionAccess {
                        has_provider: true,
                        instance: Some(caller.permissions_on(Some(name), title)),
                        ..Default::default()
                    },
                    ProviderOperation::Upload,
                ),
                None => providers::is_admin(&state.db, &provider.id, &caller.user_id).await?,
            };
            if !allowed {
                return Err(not_found());
            }
            Ok((Some(provider), existing))
        }
        None if !visibility::can_upload_custom(caller.instance.as_ref().map(|access| access.custom)) => {
            Err(not_found())
        }
        None => Ok((None, programs::find_user_function(&state.db, &caller.user_id, title).await?)),
    }
}

/// Checks an uploaded artifact (a .tar whose members are safe and hold the entrypoint) and
/// stores it under a new key of the function; returns the key.
async fn store_artifact(
    state: &AppState,
    program_id: &str,
    program: &ProgramFields,
    artifact: UploadedFile,
) -> Result<String, ApiError> {
    let file_name = artifact.file_name.clone().unwrap_or_default();
    if !file_name.is_empty() && !file_name.to_ascii_lowercase().ends_with(".tar") {
        let extension = file_name.rsplit_once('.').map(|(_, e)| e).unwrap_or_default();
        return Err(bad(format!("File extension “{extension}” is not allowed. Allowed extensions are: tar.")));
    }
    let path = artifact.path.to_path_buf();
    let limit_mib = state.config.max_unpacked_mib;
    let members = tokio::task::spawn_blocking(move || crate::artifact::inspect(&path, limit_mib))
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| bad(format!("Invalid artifact: {e}.")))?;
    if let Some(entrypoint) = &program.entrypoint
        && program.image.is_none()
        && !members.iter().any(|m| m == entrypoint)
    {
        return Err(bad(format!("Invalid artifact: the entrypoint '{entrypoint}' is not in the archive.")));
    }
    let key = keys::artifact(program_id, &uuid::Uuid::new_v4().to_string());
    let not_stored = || match file_name.as_str() {
        "" => Some("the artifact was not stored".to_string()),
        name => Some(format!("the artifact {name} was not stored")),
    };
    state
        .storage
        .put_file(&key, &artifact.path)
        .await
        .map_err(|e| ApiError::storage(&state.storage, e, not_stored()))?;
    Ok(key)
}

/// A field given as JSON text inside a form, or as a JSON value in a JSON body.
fn json_field(fields: &RequestFields, name: &str) -> Result<Option<Value>, ApiError> {
    match fields.value(name) {
        None => Ok(None),
        Some(Value::String(text)) if text.trim().is_empty() => Ok(None),
        Some(Value::String(text)) => {
            serde_json::from_str(text).map(Some).map_err(|e| bad(format!("'{name}' is not valid JSON: {e}")))
        }
        Some(other) => Ok(Some(other.clone())),
    }
}

fn parse_bool(name: &str, value: &Value) -> Result<bool, ApiError> {
    match value {
        Value::Bool(flag) => Ok(*flag),
        Value::String(text) => match text.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" | "" => Ok(false),
            _ => Err(bad(format!("'{name}' must be a valid boolean."))),
        },
        _ => Err(bad(format!("'{name}' must be a valid boolean."))),
    }
}

/// Applies the fields present in an upload onto the stored (or default) function fields.
fn merge_upload(
    fields: &RequestFields,
    mut program: ProgramFields,
    provider: Option<&ProviderRow>,
    creating: bool,
) -> Result<ProgramFields, ApiError> {
    if let Some(entrypoint) = fields.text("entrypoint") {
        program.entrypoint = Some(names::normalize_entrypoint(&entrypoint).map_err(bad)?);
    }
    if let Some(image) = fields.text("image").filter(|i| !i.trim().is_empty()) {
        let image = image.trim().to_string();
        let provider = provider.ok_or_else(|| bad("Custom images are only available if you are a provider."))?;
        if let Some(registry) = provider.registry.as_deref().filter(|r| !r.is_empty()) {
            let registry = registry.trim_end_matches('/');
            if image != registry && !image.starts_with(&format!("{registry}/")) {
                return Err(bad(format!("Custom images must be in {registry}.")));
            }
        }
        program.image = Some(image);
    }
    if let Some(value) = fields.value("dependencies") {
        let requirements = dependencies::parse(value).map_err(bad)?;
        program.dependencies = serde_json::to_string(&requirements).expect("strings serialize");
    }
    if let Some(value) = json_field(fields, "env_vars")? {
        let object = value.as_object().ok_or_else(|| bad("'env_vars' should be a JSON object of strings."))?;
        if object.values().any(|v| !v.is_string()) {
            return Err(bad("'env_vars' should be a JSON object of strings."));
        }
        program.env_vars = value.to_string();
    }
    if let Some(description) = fields.text("description") {
        program.description = Some(description);
    }
    if let Some(url) = fields.text("documentation_url") {
        program.documentation_url = Some(url);
    }
    if let Some(version) = fields.text("version") {
        if !names::is_valid_version(&version) {
            return Err(bad(format!("Invalid version - expected format x.y.z (got '{version}').")));
        }
        program.version = Some(version.trim().to_string());
    }
    if let Some(runner) = fields.text("runner").filter(|r| !r.trim().is_empty()) {
        let runner = runner.trim().to_ascii_lowercase();
        if !matches!(runner.as_str(), "ray" | "fleets" | "local" | "kubernetes") {
            return Err(bad(format!("Invalid runner '{runner}'. Valid runners: ray, fleets, local, kubernetes.")));
        }
        program.runner = runner;
    }
    if creating && let Some(kind) = fields.text("type") {
        let kind = kind.trim().to_ascii_uppercase();
        if !matches!(kind.as_str(), "GENERIC" | "APPLICATION" | "CIRCUIT") {
            return Err(bad(format!(
                "\"{kind}\" is not a valid choice for 'type'. Valid types: GENERIC, APPLICATION, CIRCUIT."
            )));
        }
        program.program_type = kind;
    }
    if let Some(value) = fields.value("gpu") {
        let gpu = parse_bool("gpu", value)?;
        if gpu && provider.is_none() {
            return Err(bad("GPU resources are only available for provider functions."));
        }
        program.gpu = gpu;
    }
    if let Some(value) = fields.value("retry_after_start") {
        program.retry_after_start = parse_bool("retry_after_start", value)?;
    }
    if let Some(value) = fields.value("backfill") {
        program.backfill = parse_bool("backfill", value)?;
    }
    if fields.has("arguments_schema") {
        let stored = match fields.value("arguments_schema") {
            None => None,
            Some(Value::String(text)) => schema::parse_stored_schema(text).map_err(bad)?,
            Some(other) => {
                let length = other.to_string().chars().count();
                if length > schema::MAX_SCHEMA_CHARS {
                    return Err(bad(format!(
                        "arguments_schema is {length} characters long and the maximum is {}.",
                        schema::MAX_SCHEMA_CHARS
                    )));
                }
                schema::vet_schema(other.clone()).map_err(bad)?
            }
        };
        program.arguments_schema = stored.map(|s| s.to_string());
    }
    let mut catalog: Map<String, Value> = serde_json::from_str(&program.sizes).unwrap_or_default();
    if let Some(value) = json_field(fields, "sizes")? {
        catalog = sizes::parse_catalog(&value).map_err(bad)?;
        if program.default_size.as_ref().is_some_and(|d| !catalog.contains_key(d)) {
            program.default_size = None;
        }
    }
    let requested_default = fields.text("default_size").or_else(|| fields.text("function_size"));
    if let Some(label) = requested_default.filter(|l| !l.trim().is_empty()) {
        let label = sizes::parse_label(&label).map_err(bad)?;
        if catalog.is_empty() {
            catalog.insert(label.clone(), Value::Null);
        } else if !catalog.contains_key(&label) {
            return Err(bad(format!("Default size '{label}' is not in the function's sizes.")));
        }
        program.default_size = Some(label);
    }
    program.sizes = Value::Object(catalog).to_string();
    if program.entrypoint.is_none() && program.image.is_none() {
        return Err(bad("At least one of attributes (entrypoint, image) is required."));
    }
    Ok(program)
}

/// The kind of a function.
#[derive(Debug, Clone, Copy, ToSchema)]
#[schema(rename_all = "UPPERCASE")]
pub enum ProgramType {
    Generic,
    Application,
    Circuit,
}

/// `POST programs/upload/`: create or update a function (upsert). The fields of an update are
/// those sent; the upload applies them (`programs::upload::upload`). This type describes the
/// body; it is read from the `RequestFields` as they come.
#[derive(Debug, Clone, ToSchema)]
#[allow(dead_code)]
pub struct UploadRequest {
    /// Sanitized to letters, digits, _ and -; `provider/title` names a provider function.
    #[schema(
        min_length = 1,
        max_length = 255,
        pattern = "^[^/]*[A-Za-z0-9_-][^/]*(/[^/]*[A-Za-z0-9_-][^/]*)?$",
        example = "example-fn"
    )]
    title: String,
    /// The provider of a provider function (or `provider/title` as `title`); required with
    /// `image`.
    #[schema(nullable = false, example = "example-provider")]
    provider: Option<String>,
    /// Relative path of a .py file inside the artifact, no `..`.
    #[schema(nullable = false, pattern = r"^[A-Za-z0-9_./-]+\.py$", example = "main.py")]
    entrypoint: Option<String>,
    /// Uncompressed .tar holding the entrypoint.
    #[schema(value_type = Option<String>, nullable = false, format = Binary,
        content_media_type = "application/x-tar", example = "artifact.tar")]
    artifact: Option<String>,
    /// Container image (provider functions only; must be in the provider's registry).
    #[schema(nullable = false, example = "registry.example/example-provider/example-fn:1.0")]
    image: Option<String>,
    /// JSON array of pinned requirements from dependencies-versions/.
    #[schema(nullable = false)]
    dependencies: Option<String>,
    /// JSON object of strings.
    #[schema(nullable = false)]
    env_vars: Option<String>,
    #[schema(nullable = false)]
    description: Option<String>,
    /// A PEP 440 version such as 1.2.3.
    #[schema(nullable = false)]
    version: Option<String>,
    #[schema(rename = "type", value_type = Option<ProgramType>, inline, nullable = false)]
    program_type: Option<String>,
    /// JSON Schema (object or boolean); {} removes it.
    #[schema(nullable = false, max_length = 65536)]
    arguments_schema: Option<String>,
    /// JSON object {label: compute profile}, labels S, M, L, XL.
    #[schema(nullable = false)]
    sizes: Option<String>,
    #[schema(value_type = Option<Size>, inline, nullable = false)]
    default_size: Option<String>,
    #[schema(value_type = Option<Size>, inline, nullable = false)]
    function_size: Option<String>,
    /// Provider functions only.
    #[schema(nullable = false)]
    gpu: Option<bool>,
    /// On Kubernetes: start a job again on a new pod when the cluster ends its pod (evicted,
    /// preempted, node lost) after the function's code started. Off by default, since a rerun
    /// may repeat work (and paid quantum work) done before; a job ended before its code started
    /// is started again either way.
    #[schema(nullable = false)]
    retry_after_start: Option<bool>,
    /// Its jobs run as backfill: only on capacity lent or guaranteed to nobody, stopped when a
    /// tenant reclaims its guarantee (docs/scheduling.md). A run's `config.backfill` marks one
    /// job.
    #[schema(nullable = false)]
    backfill: Option<bool>,
}

/// The upload body as multipart, the only encoding that carries the artifact. Only `title` is
/// required: an update names the stored function and carries the fields that change. Whether a
/// request creates or updates depends on what is stored, so what a creation needs besides
/// (`entrypoint` and `artifact`, or a provider's `image`) is stated in the operation's text,
/// not as a schema a client would apply to updates too.
pub struct UploadMultipart;

impl PartialSchema for UploadMultipart {
    fn schema() -> RefOr<Schema> {
        one_provider(UploadRequest::schema())
    }
}

impl ToSchema for UploadMultipart {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("UploadMultipart")
    }
}

/// The upload body as JSON or a form, which cannot carry the artifact: an update with only
/// `title` and the fields that change, or the creation of a provider's image function (`image`
/// and `provider`, stated in the operation's text as for multipart).
pub struct UploadFields;

impl PartialSchema for UploadFields {
    fn schema() -> RefOr<Schema> {
        let mut schema = UploadRequest::schema();
        if let RefOr::T(Schema::Object(object)) = &mut schema {
            object.properties.retain(|name, _| name != "artifact");
        }
        one_provider(schema)
    }
}

impl ToSchema for UploadFields {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("UploadFields")
    }
}
