//! Job listings: the caller's jobs (`jobs/`) and the jobs of a provider's functions
//! (`jobs/provider/`), filtered and paginated by offset or by keyset cursor, and the jobs of one
//! function (`programs/{id}/get_jobs/`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};
use serde::{Deserialize, Serialize};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{AnyOfBuilder, ObjectBuilder, Schema};
use utoipa::{IntoParams, PartialSchema, ToSchema};

use crate::api::error::ApiError;
use crate::api::extract::Query;
use crate::api::shared::{JobRecord, bad};
use crate::api::state::AppState;
use crate::auth::Caller;
use crate::db::jobs::{self, AdminOf, JobFilter, Window};
use crate::db::{programs, providers};
use crate::domain::lifecycle::JobStatus;
use crate::domain::names;
use crate::domain::paging::{self, Cursor, Links};
use crate::domain::visibility::{self, ProviderOperation};

/// Jobs of one function (every author's, without result, for its provider side)
#[utoipa::path(get, path = "/programs/{program_id}/get_jobs/", tag = "jobs",
    params(("program_id" = String, Path, format = Uuid, example = "00000000-0000-4000-8000-000000000000", description = "function id")),
    responses((status = 200, description = "at most 1,000 jobs", body = Vec<JobRecord>)),
    security(("bearer" = [])))]
pub async fn get_program_jobs(
    State(state): State<AppState>,
    caller: Caller,
    Path(program_id): Path<String>,
) -> Result<Json<Vec<JobRecord>>, ApiError> {
    Ok(Json(of_function(&state, &caller, &program_id).await?))
}

/// The caller's jobs, newest first
#[utoipa::path(get, path = "/jobs/", tag = "jobs", params(JobsQuery),
    responses((status = 200, description = "a page of jobs", body = JobPage)),
    security(("bearer" = [])))]
pub async fn list_jobs(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Query(query): Query<JobsQuery>,
) -> Result<Json<JobPage>, ApiError> {
    Ok(Json(list(&state, &caller, &headers, query).await?))
}

/// Jobs of a provider's functions, every author
#[utoipa::path(get, path = "/jobs/provider/", tag = "jobs", params(ProviderJobsQuery),
    responses((status = 200, description = "a page of jobs", body = JobPage)),
    security(("bearer" = [])))]
pub async fn list_provider_jobs(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Query(query): Query<ProviderJobsQuery>,
) -> Result<Json<JobPage>, ApiError> {
    Ok(Json(list_provider(&state, &caller, &headers, query.into()).await?))
}

fn parse_count(name: &str, value: Option<&str>, default: i64) -> Result<i64, ApiError> {
    match value {
        None => Ok(default),
        Some(text) => text
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .ok_or_else(|| bad(format!("'{name}' must be a non-negative integer."))),
    }
}

/// ISO 8601 datetime (with or without zone; naive is UTC) or date, as microseconds.
pub fn parse_created_after(text: &str) -> Result<i64, ApiError> {
    let text = text.trim();
    if let Ok(parsed) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(parsed.timestamp_micros());
    }
    for format in ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M"] {
        if let Ok(naive) = chrono::NaiveDateTime::parse_from_str(text, format) {
            return Ok(naive.and_utc().timestamp_micros());
        }
    }
    if let Ok(date) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Ok(date.and_hms_opt(0, 0, 0).expect("midnight exists").and_utc().timestamp_micros());
    }
    Err(bad(format!("'created_after' must be an ISO 8601 date or datetime, got '{text}'.")))
}

/// Builds the common filter of the two paginated listings.
fn base_filter(query: &JobsQuery) -> Result<JobFilter, ApiError> {
    let mut filter = JobFilter::default();
    if let Some(status) = query.status.as_deref().filter(|s| !s.is_empty()) {
        // Any text, as the reference takes it: a status's name in any case selects it, and a
        // value no job has (`CANCELLED`, a typo) answers an empty page, never a 400.
        let text = status.trim();
        filter.status = Some(match text.to_ascii_uppercase().parse::<JobStatus>() {
            Ok(known) => known.as_str().to_string(),
            Err(_) => text.to_string(),
        });
    }
    filter.catalog = match query.filter.as_deref() {
        None | Some("") => None,
        Some("catalog") => Some(true),
        Some("serverless") => Some(false),
        Some(other) => {
            return Err(bad(format!("\"{other}\" is not a valid choice. 'filter' takes catalog or serverless.")));
        }
    };
    if let Some(after) = query.created_after.as_deref().filter(|s| !s.is_empty()) {
        filter.created_after = Some(parse_created_after(after)?);
    }
    Ok(filter)
}

/// The paginated envelope. Without `cursor`: the reference's offset pages, whose `next` and
/// `previous` links carry only `limit` and `offset`. With `cursor` (empty for the first page):
/// keyset pages, whose links carry `limit`, the next or previous cursor and the request's
/// filters (see `domain::paging`).
async fn page(
    state: &AppState,
    headers: &HeaderMap,
    path: &str,
    filter: &JobFilter,
    query: &JobsQuery,
) -> Result<JobPage, ApiError> {
    let empty = || JobPage { count: 0, next: None, previous: None, results: Vec::new() };
    Ok(page_if_admin(state, headers, path, filter, query).await?.unwrap_or_else(empty))
}

/// `page`, for a filter with `admin_of`: `None` when its user does not administer its provider
/// (see `jobs::page_if_admin`). Without `admin_of`, always `Some`.
async fn page_if_admin(
    state: &AppState,
    headers: &HeaderMap,
    path: &str,
    filter: &JobFilter,
    query: &JobsQuery,
) -> Result<Option<JobPage>, ApiError> {
    let limit = parse_count("limit", query.limit.as_deref(), 10)?;
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
    let scheme = headers.get("x-forwarded-proto").and_then(|h| h.to_str().ok()).unwrap_or("http");
    let page_limit = if limit == 0 { None } else { Some(limit) };
    let Some(cursor) = query.cursor.as_deref() else {
        let offset = parse_count("offset", query.offset.as_deref(), 0)?;
        let Some((count, rows, _)) = jobs::page_if_admin(&state.db, filter, page_limit, Window::Offset(offset)).await?
        else {
            return Ok(None);
        };
        let link = |offset: i64| format!("{scheme}://{host}{path}?limit={limit}&offset={offset}");
        let end = offset.saturating_add(limit);
        let next = (end < count || (limit == 0 && offset < count)).then(|| link(end));
        let previous = (offset > 0).then(|| link((offset - limit).max(0)));
        return Ok(Some(JobPage {
            count,
            next,
            previous,
            results: rows.into_iter().map(JobRecord::from_row).collect(),
        }));
    };
    if query.offset.is_some() {
        return Err(bad("'cursor' and 'offset' cannot be used together: a cursor already says where the page starts."));
    }
    let from = match cursor.trim() {
        "" => None,
        text => Some(Cursor::decode(text).map_err(bad)?),
    };
    let Some((count, rows, more)) =
        jobs::page_if_admin(&state.db, filter, page_limit, Window::Keyset(from.as_ref())).await?
    else {
        return Ok(None);
    };
    let places: Vec<(i64, &str)> = rows.iter().map(|job| (job.created, job.id.as_str())).collect();
    let Links { next, previous } = paging::links(&places, more, from.as_ref());
    let link = |cursor: Cursor| format!("{scheme}://{host}{path}?{}", keyset_query(limit, &cursor, query));
    Ok(Some(JobPage {
        count,
        next: next.map(link),
        previous: previous.map(link),
        results: rows.into_iter().map(JobRecord::from_row).collect(),
    }))
}

/// The query of a keyset page's link: `limit`, `cursor`, then the request's filters as sent.
fn keyset_query(limit: i64, cursor: &Cursor, query: &JobsQuery) -> String {
    let mut pairs = vec![("limit", limit.to_string()), ("cursor", cursor.encode())];
    let filters = [
        ("provider", &query.provider),
        ("function", &query.function),
        ("status", &query.status),
        ("filter", &query.filter),
        ("created_after", &query.created_after),
    ];
    pairs.extend(filters.into_iter().filter_map(|(name, value)| value.clone().map(|value| (name, value))));
    serde_urlencoded::to_string(&pairs).expect("text pairs always encode")
}

/// The caller's jobs, newest first, filtered and paginated.
pub async fn list(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    query: JobsQuery,
) -> Result<JobPage, ApiError> {
    let mut filter = base_filter(&query)?;
    filter.author_id = Some(caller.user_id.clone());
    let provider = query.provider.as_deref().map(|p| names::sanitize_title(p, false)).filter(|p| !p.is_empty());
    let provider_id = match &provider {
        Some(name) => match providers::find_by_name(&state.db, name).await? {
            Some(row) => Some(row.id),
            None => Some(String::new()),
        },
        None => None,
    };
    if let Some(function) = query.function.as_deref().filter(|f| !f.is_empty()) {
        let title = names::sanitize_title(function, false);
        let ids = jobs::program_ids_by_title(&state.db, &title, provider_id.as_deref()).await?;
        if ids.is_empty() {
            return Err(ApiError::function_not_found(None, &title));
        }
        filter.program_ids = Some(ids);
    }
    filter.provider_id = provider_id;
    page(state, headers, "/api/v1/jobs/", &filter, &query).await
}

/// Jobs of a provider's functions, every author's: all of them for its admins, those of the
/// functions they wrote for authors.
pub async fn list_provider(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    query: JobsQuery,
) -> Result<JobPage, ApiError> {
    let provider_name = query
        .provider
        .as_deref()
        .map(|p| names::sanitize_title(p, false))
        .filter(|p| !p.is_empty())
        .ok_or_else(|| bad("'provider' not provided or is not valid"))?;
    let function = query.function.as_deref().filter(|f| !f.is_empty());
    if function.is_none() {
        // An admin's listing of every function's jobs: the provider, the right and the page in
        // one statement. Anyone else's goes on below.
        let mut filter = base_filter(&query)?;
        filter.admin_of = Some(AdminOf { provider: provider_name.clone(), user_id: caller.user_id.clone() });
        if let Some(page) = page_if_admin(state, headers, "/api/v1/jobs/provider/", &filter, &query).await? {
            return Ok(page);
        }
    }
    let (provider_id, is_admin) = providers::find_with_admin(&state.db, &provider_name, &caller.user_id)
        .await?
        .ok_or_else(|| ApiError::provider_not_found(&provider_name))?;
    let mut filter = base_filter(&query)?;
    filter.provider_id = Some(provider_id.clone());
    match function {
        Some(function) => {
            let title = names::sanitize_title(function, false);
            match programs::find_provider_function(&state.db, &caller.user_id, &provider_id, &title).await? {
                Some(program) if visibility::can_manage(caller.access(&program), ProviderOperation::Jobs) => {
                    filter.program_ids = Some(vec![program.id])
                }
                None if is_admin => return Err(ApiError::function_not_found(Some(&provider_name), &title)),
                _ => return Err(ApiError::provider_not_found(&provider_name)),
            }
        }
        None if is_admin => {}
        None => {
            // Authors of provider functions see the jobs of the functions they wrote.
            let authored: Vec<String> =
                programs::list_candidates(&state.db, &caller.user_id, Some(&provider_name), caller.has_instance())
                    .await?
                    .into_iter()
                    .filter(|program| visibility::can_manage(caller.access(program), ProviderOperation::Jobs))
                    .map(|program| program.id)
                    .collect();
            if authored.is_empty() {
                return Err(ApiError::provider_not_found(&provider_name));
            }
            filter.program_ids = Some(authored);
        }
    }
    page(state, headers, "/api/v1/jobs/provider/", &filter, &query).await
}

/// Jobs of one function: all authors' (without result) for those who manage it, else the
/// caller's own (with result); at most 1,000.
pub async fn of_function(state: &AppState, caller: &Caller, program_id: &str) -> Result<Vec<JobRecord>, ApiError> {
    const LISTED: i64 = 1000;
    let missing = || ApiError::NotFound(format!("Qiskit Function {program_id} doesn't exist."));
    let (manages, rows) = if caller.has_instance() {
        // An instance's permissions decide who manages the function's jobs: the function is
        // read first.
        let program = programs::find_by_id(&state.db, &caller.user_id, program_id).await?.ok_or_else(missing)?;
        let manages = visibility::can_manage(caller.access(&program), ProviderOperation::Jobs);
        let filter = JobFilter {
            program_ids: Some(vec![program.id.clone()]),
            author_id: (!manages).then(|| caller.user_id.clone()),
            ..Default::default()
        };
        (manages, jobs::list(&state.db, &filter, Some(LISTED), 0).await?.1)
    } else {
        // The caller's relation to the function decides, found in the page's own statement.
        jobs::of_function(&state.db, program_id, &caller.user_id, LISTED).await?.ok_or_else(missing)?
    };
    Ok(rows
        .iter()
        .map(|job| match manages {
            true => JobRecord::of(job),
            false => JobRecord::of(job).with_result(job.result.clone()),
        })
        .collect())
}

/// Which jobs a listing keeps: those of provider functions or of the caller's own.
#[derive(Debug, Clone, Copy, ToSchema)]
#[schema(rename_all = "lowercase")]
pub enum JobsFilter {
    Catalog,
    Serverless,
}

/// `schema`, or the empty text the listings read as no filter.
fn or_empty(schema: RefOr<Schema>) -> Schema {
    let empty = ObjectBuilder::new().schema_type(utoipa::openapi::Type::String).max_length(Some(0)).build();
    Schema::AnyOf(AnyOfBuilder::new().item(schema).item(empty).build())
}

/// `created_after`: a date-time, a date or empty (no bound), as the listings read it.
fn created_after_schema() -> Schema {
    use utoipa::openapi::schema::{KnownFormat, SchemaFormat, Type};
    let text = |format: KnownFormat| {
        ObjectBuilder::new().schema_type(Type::String).format(Some(SchemaFormat::KnownFormat(format))).build()
    };
    let dated = AnyOfBuilder::new().item(text(KnownFormat::DateTime)).item(text(KnownFormat::Date)).build();
    or_empty(RefOr::T(Schema::AnyOf(dated)))
}

fn filter_or_empty() -> Schema {
    or_empty(JobsFilter::schema())
}

/// The filters and page of `jobs/`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct JobsQuery {
    /// Provider name.
    pub provider: Option<String>,
    /// Function title; 404 when no such function exists.
    pub function: Option<String>,
    /// Job status (QUEUED, PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED; any letter case);
    /// empty means any, a value no job has (CANCELLED) an empty page, as the reference.
    #[param(example = "SUCCEEDED")]
    pub status: Option<String>,
    /// catalog (provider functions) or serverless (own functions); empty means both.
    #[param(schema_with = filter_or_empty)]
    pub filter: Option<String>,
    /// ISO 8601 date or datetime (naive is UTC), inclusive; empty means no bound.
    #[param(schema_with = created_after_schema)]
    pub created_after: Option<String>,
    /// Page size, 0 for all.
    #[param(value_type = Option<i64>, minimum = 0, default = 10)]
    pub limit: Option<String>,
    /// Results skipped.
    #[param(value_type = Option<i64>, minimum = 0, default = 0)]
    pub offset: Option<String>,
    /// Keyset pagination instead of `offset`: empty for the first page, then the cursor of a
    /// page's `next` or `previous` link (whose links then carry cursors and the filters).
    pub cursor: Option<String>,
}

/// The filters and page of `jobs/provider/`: `provider` is required.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ProviderJobsQuery {
    /// Provider name.
    #[param(required = true, min_length = 1, pattern = "[A-Za-z0-9_-]", example = "example-provider")]
    pub provider: Option<String>,
    /// Function title; 404 when no such function exists.
    pub function: Option<String>,
    /// Job status (QUEUED, PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED; any letter case);
    /// empty means any, a value no job has (CANCELLED) an empty page, as the reference.
    #[param(example = "SUCCEEDED")]
    pub status: Option<String>,
    /// catalog (provider functions) or serverless (own functions); empty means both.
    #[param(schema_with = filter_or_empty)]
    pub filter: Option<String>,
    /// ISO 8601 date or datetime (naive is UTC), inclusive; empty means no bound.
    #[param(schema_with = created_after_schema)]
    pub created_after: Option<String>,
    /// Page size, 0 for all.
    #[param(value_type = Option<i64>, minimum = 0, default = 10)]
    pub limit: Option<String>,
    /// Results skipped.
    #[param(value_type = Option<i64>, minimum = 0, default = 0)]
    pub offset: Option<String>,
    /// Keyset pagination instead of `offset`: empty for the first page, then the cursor of a
    /// page's `next` or `previous` link (whose links then carry cursors and the filters).
    pub cursor: Option<String>,
}

impl From<ProviderJobsQuery> for JobsQuery {
    fn from(query: ProviderJobsQuery) -> JobsQuery {
        let ProviderJobsQuery { provider, function, status, filter, created_after, limit, offset, cursor } = query;
        JobsQuery { provider, function, status, filter, created_after, limit, offset, cursor }
    }
}

/// A page of jobs, with `next`/`previous` links: `limit` and `offset`, or with `cursor`, `limit`,
/// the next or previous cursor and the filters.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JobPage {
    pub count: i64,
    #[schema(required = true)]
    pub next: Option<String>,
    #[schema(required = true)]
    pub previous: Option<String>,
    pub results: Vec<JobRecord>,
}
