//! Who may reach what: the lookups every action starts with, each answering the contract's 404
//! or 403 when the caller may not (unknown and invisible answer alike where the contract says so).

use crate::api::error::ApiError;
use crate::api::state::AppState;
use crate::auth::Caller;
use crate::db::jobs::{self, JobRow};
use crate::db::programs;
use crate::domain::visibility::{self, FunctionAccess, ProviderOperation};

pub fn job_not_found(job_id: &str) -> ApiError {
    ApiError::NotFound(format!("Job [{job_id}] not found"))
}

/// The job if it exists and the caller is its author.
pub async fn own_job(state: &AppState, caller: &Caller, job_id: &str) -> Result<JobRow, ApiError> {
    let job = jobs::find(&state.db, job_id).await?.ok_or_else(|| job_not_found(job_id))?;
    if job.author_id != caller.user_id {
        return Err(job_not_found(job_id));
    }
    Ok(job)
}

/// Whether the caller manages the job's provider function (provider admin or its author).
pub async fn manages_job_function(
    state: &AppState,
    caller: &Caller,
    job: &JobRow,
    operation: ProviderOperation,
) -> Result<bool, ApiError> {
    let Some(program_id) = &job.program_id else { return Ok(false) };
    Ok(programs::find_by_id(&state.db, &caller.user_id, program_id)
        .await?
        .is_some_and(|program| visibility::can_manage(caller.access(&program), operation)))
}

/// The job whose user log (or, with `provider`, provider log) the caller may read: user logs
/// are the author's, provider logs the provider side's.
pub async fn log_reader_job(
    state: &AppState,
    caller: &Caller,
    job_id: &str,
    provider: bool,
) -> Result<JobRow, ApiError> {
    let job = jobs::find(&state.db, job_id).await?.ok_or_else(|| job_not_found(job_id))?;
    if !provider && job.author_id != caller.user_id {
        return Err(ApiError::Forbidden(format!("You don't have access to read user logs of the job [{job_id}]")));
    }
    if provider
        && (job.provider_id.is_none() || !manages_job_function(state, caller, &job, ProviderOperation::Logs).await?)
    {
        return Err(ApiError::Forbidden(format!("You don't have access to job [{job_id}]")));
    }
    Ok(job)
}

/// Finds a function by optional provider and title, checking `rule` against the caller's access.
/// Missing provider, missing function and refused access all answer the same 404.
pub async fn resolve_function(
    state: &AppState,
    caller: &Caller,
    provider: Option<&str>,
    title: &str,
    rule: fn(FunctionAccess) -> bool,
) -> Result<programs::ProgramRow, ApiError> {
    let row = find_function(state, caller, provider, title).await?;
    row.filter(|row| rule(caller.access(row))).ok_or_else(|| ApiError::function_not_found(provider, title))
}

/// `resolve_function` for `run`: from memory when the caller resolved the same function before
/// and no change was announced since (`AppState::functions`), so the job's own transaction is
/// the only one.
pub async fn runnable_function(
    state: &AppState,
    caller: &Caller,
    provider: Option<&str>,
    title: &str,
) -> Result<programs::ProgramRow, ApiError> {
    let key = (caller.user_id.clone(), provider.map(str::to_string), title.to_string());
    let generation = state.functions.generation();
    let row = match state.functions.get(&key) {
        Some(row) => Some(row),
        None => {
            let row = find_function(state, caller, provider, title).await?;
            if let Some(row) = &row {
                state.functions.put(generation, key, row.clone());
            }
            row
        }
    };
    row.filter(|row| visibility::can_run(caller.access(row)))
        .ok_or_else(|| ApiError::function_not_found(provider, title))
}

/// The function by optional provider and title, with the caller's relation to it: one statement.
async fn find_function(
    state: &AppState,
    caller: &Caller,
    provider: Option<&str>,
    title: &str,
) -> Result<Option<programs::ProgramRow>, ApiError> {
    Ok(match provider {
        Some(name) => programs::find_provider_function_named(&state.db, &caller.user_id, name, title).await?,
        None => programs::find_user_function(&state.db, &caller.user_id, title).await?,
    })
}
