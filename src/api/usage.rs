//! `GET usage/` (not part of the reference API, issue 47): the totals of the usage ledger for a
//! period, grouped by function, size or day (or by user, for a provider's admins over its
//! functions): a user reads their own jobs'; with `provider`, an admin of that provider reads
//! every user's jobs of its functions; nobody reads anyone else's. Read from the kept totals per
//! day (`db::usage::totals`), the jobs running now counted up to now.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::api::error::ApiError;
use crate::api::extract::Query;
use crate::api::state::AppState;
use crate::auth::Caller;
use crate::db::budgets::{self, Budget};
use crate::db::usage::{self, GroupBy, Scope, Total};
use crate::db::{self, providers};
use crate::domain::usage::{Figures, HOUR_MS, date_of, day_number, month_of, spent};

/// The longest period one request covers, in days.
pub const MAX_PERIOD_DAYS: i64 = 400;

/// The most groups one answer lists (those with the most CPU-core time; the totals count all).
pub const MAX_GROUPS: usize = 1000;

/// The query of `GET usage/`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// First day of the period (`YYYY-MM-DD`, UTC; default: the first of this month).
    #[param(example = "2026-11-01")]
    pub from: Option<String>,
    /// Day after the period (`YYYY-MM-DD`, UTC; default: the first of next month). At most 400
    /// days after `from`.
    #[param(example = "2026-12-01")]
    pub to: Option<String>,
    /// How the totals are grouped: `function` (default), `size`, `day`, `day,function` (keys
    /// `YYYY-MM-DD <function id>`), or `user` (with `provider` only).
    #[param(example = "function")]
    pub group_by: Option<String>,
    /// A provider the caller administers: its functions' jobs of every user instead of the
    /// caller's own.
    pub provider: Option<String>,
}

/// Usage figures: jobs ended in the period, jobs running now (counted up to now), and their
/// time and allocation in seconds.
#[derive(Debug, Clone, Serialize, ToSchema, PartialEq)]
pub struct UsageFigures {
    pub cpu_core_seconds: f64,
    pub gib_seconds: f64,
    pub gpu_seconds: f64,
    pub jobs: i64,
    pub run_seconds: f64,
    pub running: i64,
    pub wait_seconds: f64,
}

impl UsageFigures {
    fn of(jobs: i64, running: i64, figures: Figures) -> UsageFigures {
        let seconds = |ms: i64| ms as f64 / 1000.0;
        UsageFigures {
            cpu_core_seconds: seconds(figures.cpu_core_ms),
            gib_seconds: seconds(figures.gib_ms),
            gpu_seconds: seconds(figures.gpu_ms),
            jobs,
            run_seconds: seconds(figures.run_ms),
            running,
            wait_seconds: seconds(figures.wait_ms),
        }
    }
}

/// One group's totals.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct UsageGroup {
    #[serde(flatten)]
    pub figures: UsageFigures,
    /// The group: a function's id, a size (`""`: none asked), a day (`YYYY-MM-DD`), a day and a
    /// function (`YYYY-MM-DD <function id>`), a user's id.
    pub key: String,
    /// What the key names: the function's title, the user's name (null otherwise).
    pub name: Option<String>,
}

/// The totals of a period.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct UsageAnswer {
    /// First day of the period.
    pub from: String,
    pub group_by: String,
    /// The totals per group, by key: at most 1,000, those with the most CPU-core time when
    /// there are more (`groups_left_out` says how many are not listed; `total` counts them).
    pub groups: Vec<UsageGroup>,
    /// Groups not listed beyond the first 1,000.
    pub groups_left_out: usize,
    /// The provider whose functions' jobs these are; null: the caller's own jobs.
    pub provider: Option<String>,
    /// Day after the period.
    pub to: String,
    /// The whole period's totals.
    pub total: UsageFigures,
}

/// Totals of the usage ledger for a period: the caller's jobs, or with `provider` its functions' jobs of every user
///
/// Not part of the reference API.
#[utoipa::path(get, path = "/usage/", tag = "usage", params(UsageQuery),
    responses((status = 200, description = "the period's totals", body = UsageAnswer)),
    security(("bearer" = [])))]
pub async fn get_usage(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<UsageQuery>,
) -> Result<Json<UsageAnswer>, ApiError> {
    Ok(Json(totals(&state, &caller, &query).await?))
}

/// A day of the query (`YYYY-MM-DD`) as days since the epoch.
fn day_of(name: &str, text: &str) -> Result<i64, ApiError> {
    day_number(text)
        .ok_or_else(|| ApiError::BadRequest(format!("'{name}' must be a date as YYYY-MM-DD, got '{text}'.")))
}

/// Parses a period and a grouping, checks the caller's right to the scope, reads the totals.
pub async fn totals(state: &AppState, caller: &Caller, query: &UsageQuery) -> Result<UsageAnswer, ApiError> {
    let now = db::now_micros();
    let (this_month, next_month) = month_of(crate::db::counts::day_of(now));
    let from = query.from.as_deref().map(|t| day_of("from", t)).transpose()?.unwrap_or(this_month);
    let to = query.to.as_deref().map(|t| day_of("to", t)).transpose()?.unwrap_or(next_month);
    if to <= from {
        return Err(ApiError::BadRequest(format!("'to' ({}) must be after 'from' ({}).", date_of(to), date_of(from))));
    }
    if to - from > MAX_PERIOD_DAYS {
        return Err(ApiError::BadRequest(format!(
            "A period covers at most {MAX_PERIOD_DAYS} days; this one covers {}.",
            to - from
        )));
    }
    let group_text = query.group_by.as_deref().map(str::trim).unwrap_or("function");
    let group_by = match group_text {
        "function" => GroupBy::Function,
        "size" => GroupBy::Size,
        "day" => GroupBy::Day,
        "day,function" => GroupBy::DayFunction,
        "user" if query.provider.is_some() => GroupBy::User,
        "user" => {
            return Err(ApiError::BadRequest(
                "'group_by=user' needs 'provider': a provider's admins see its functions' jobs by user.".into(),
            ));
        }
        "provider" => {
            return Err(ApiError::Forbidden(
                "Usage by provider is an operator's: `gantry admin usage --group-by provider`.".into(),
            ));
        }
        other => {
            return Err(ApiError::BadRequest(format!(
                "'group_by' must be one of function, size, day, day,function, user; got '{other}'."
            )));
        }
    };
    let provider_id = match query.provider.as_deref() {
        None => None,
        Some(name) => {
            let (id, admin) = providers::find_with_admin(&state.db, name, &caller.user_id)
                .await?
                .ok_or_else(|| ApiError::provider_not_found(name))?;
            if !admin {
                return Err(ApiError::Forbidden(format!("Only an admin of provider {name} reads its usage.")));
            }
            Some(id)
        }
    };
    let scope = match &provider_id {
        Some(id) => Scope::Provider(id),
        None => Scope::User(&caller.user_id),
    };
    let groups = usage::totals(&state.db, scope, from, to, group_by, now).await?;
    Ok(answer(from, to, group_text, query.provider.clone(), groups))
}

/// The answer for `groups`, keyed as users read them (days as dates).
fn answer(from: i64, to: i64, group_by: &str, provider: Option<String>, mut groups: Vec<Total>) -> UsageAnswer {
    let (mut jobs, mut running, mut figures) = (0, 0, Figures::default());
    for group in &groups {
        jobs += group.jobs;
        running += group.running;
        figures = figures.plus(group.figures);
    }
    let groups_left_out = groups.len().saturating_sub(MAX_GROUPS);
    if groups_left_out > 0 {
        // The heaviest, listed by key as the others are.
        groups.sort_by(|a, b| b.figures.cpu_core_ms.cmp(&a.figures.cpu_core_ms).then_with(|| a.key.cmp(&b.key)));
        groups.truncate(MAX_GROUPS);
        groups.sort_by(|a, b| a.key.cmp(&b.key));
    }
    let groups = groups
        .into_iter()
        .map(|group| {
            let key = match group_by {
                "day" => group.key.parse().map_or(group.key.clone(), date_of),
                "day,function" => match group.key.split_once(' ') {
                    Some((day, function)) => format!("{} {function}", day.parse().map_or(day.to_string(), date_of)),
                    None => group.key,
                },
                _ => group.key,
            };
            UsageGroup { figures: UsageFigures::of(group.jobs, group.running, group.figures), key, name: group.name }
        })
        .collect();
    UsageAnswer {
        from: date_of(from),
        group_by: group_by.to_string(),
        groups,
        groups_left_out,
        provider,
        to: date_of(to),
        total: UsageFigures::of(jobs, running, figures),
    }
}

/// One job's usage: its record once it ended, else what it used so far.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JobUsageAnswer {
    /// 1 + its infrastructure retries.
    pub attempts: i64,
    pub cpu_core_seconds: f64,
    /// The CPU time its processes used, where the runner measures it (`gantry serve`'s process
    /// jobs, once ended); null otherwise.
    #[schema(required = true)]
    pub cpu_used_seconds: Option<f64>,
    /// The most memory it held, in bytes, where the runner measures it (as `cpu_used_seconds`).
    #[schema(required = true)]
    pub memory_peak_bytes: Option<i64>,
    /// The cores its runner gave it; null before it started.
    #[schema(required = true)]
    pub cpu_cores: Option<f64>,
    /// When it ended; null while it has not.
    #[schema(required = true)]
    pub ended: Option<String>,
    pub gib_seconds: f64,
    #[schema(required = true)]
    pub gpu_model: Option<String>,
    pub gpu_seconds: f64,
    #[schema(required = true)]
    pub gpus: Option<i64>,
    /// The memory its runner gave it, in GiB; null before it started.
    #[schema(required = true)]
    pub memory_gib: Option<f64>,
    /// The compute profile of its size.
    // Not `compute_profile`: the document never names what `run` no longer takes.
    #[schema(required = true)]
    pub profile: Option<String>,
    pub run_seconds: f64,
    /// Its status (the one it ended in, once it ended).
    pub status: String,
    pub wait_seconds: f64,
}

/// A job's usage: what it waited, ran and was given, and its allocation over its run (so far, while it runs)
///
/// Not part of the reference API. Answered to those who may read the job.
#[utoipa::path(get, path = "/jobs/{job_id}/usage/", tag = "usage",
    params(("job_id" = String, Path, format = Uuid, example = "00000000-0000-4000-8000-000000000000", description = "job id")),
    responses((status = 200, description = "the job's usage", body = JobUsageAnswer)),
    security(("bearer" = [])))]
pub async fn get_job_usage(
    State(state): State<AppState>,
    caller: Caller,
    axum::extract::Path(job_id): axum::extract::Path<String>,
) -> Result<Json<JobUsageAnswer>, ApiError> {
    Ok(Json(job_usage(&state, &caller, &job_id).await?))
}

/// The usage of a job the caller may read.
pub async fn job_usage(state: &AppState, caller: &Caller, job_id: &str) -> Result<JobUsageAnswer, ApiError> {
    crate::api::jobs::read::get(state, caller, job_id, Some("false")).await?;
    let now = db::now_micros();
    let record =
        usage::of_job(&state.db, job_id, now).await?.ok_or_else(|| crate::api::access::job_not_found(job_id))?;
    let seconds = |ms: i64| ms as f64 / 1000.0;
    let ended = matches!(record.status.as_str(), "SUCCEEDED" | "FAILED" | "STOPPED");
    Ok(JobUsageAnswer {
        attempts: record.attempts,
        profile: record.compute_profile,
        cpu_core_seconds: seconds(record.cpu_core_ms),
        cpu_used_seconds: record.cpu_used_ms.map(seconds),
        memory_peak_bytes: record.memory_peak_bytes,
        cpu_cores: record.cpu_millis.map(|m| m as f64 / 1000.0),
        ended: ended.then(|| db::format_timestamp(record.ended)),
        gib_seconds: seconds(record.gib_ms),
        gpu_model: record.gpu_model,
        gpu_seconds: seconds(record.gpu_ms),
        gpus: record.gpus,
        memory_gib: record.memory_mib.map(|m| m as f64 / 1024.0),
        run_seconds: seconds(record.run_ms),
        status: record.status,
        wait_seconds: seconds(record.wait_ms),
    })
}

/// A budget the caller's runs count against, and what it used this month.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BudgetUse {
    /// `user`, `group` or `function`.
    pub kind: String,
    /// The user's or group's name, the function's `provider/title`.
    pub name: String,
    /// The month it counts (`YYYY-MM`, UTC).
    pub period: String,
    /// The day it starts again from nothing.
    pub resets: String,
    /// CPU-hours a month (allocated cores × hours); null: no limit.
    #[schema(required = true)]
    pub cpu_hours: Option<f64>,
    pub cpu_hours_used: f64,
    /// What is left of it (0 once spent); null: no limit.
    #[schema(required = true)]
    pub cpu_hours_left: Option<f64>,
    /// GPU-hours a month; null: no limit.
    #[schema(required = true)]
    pub gpu_hours: Option<f64>,
    pub gpu_hours_used: f64,
    #[schema(required = true)]
    pub gpu_hours_left: Option<f64>,
}

fn hours(ms: i64) -> f64 {
    (ms as f64 / HOUR_MS as f64 * 1000.0).round() / 1000.0
}

/// Which budgets `budget_uses` reads.
pub enum BudgetsOf<'a> {
    /// Those a run of the function `program_id` counts against.
    Run { user_id: &'a str, program_id: &'a str },
    /// Those the user's runs count against as `jobs/queue/` shows them (`budgets::of_user`).
    User(&'a str),
}

/// The budgets `of`, each with what it used this month, its running jobs counted up to now.
pub async fn budget_uses(state: &AppState, of: BudgetsOf<'_>) -> Result<Vec<(Budget, Figures, BudgetUse)>, ApiError> {
    let now = db::now_micros();
    let (from, to) = month_of(db::counts::day_of(now));
    let found = match of {
        BudgetsOf::Run { user_id, program_id } => {
            let key = (user_id.to_string(), program_id.to_string());
            match state.budgets.get(&key) {
                Some(kept) => kept,
                None => {
                    let generation = state.budgets.generation();
                    let read = budgets::applying(&state.db, user_id, program_id).await?;
                    state.budgets.put(generation, key, read.clone());
                    read
                }
            }
        }
        BudgetsOf::User(user_id) => budgets::of_user(&state.db, user_id, from).await?,
    };
    let mut uses = Vec::new();
    for budget in found {
        let used = budgets::used(&state.db, &budget, from, to, now).await?;
        let left = |limit: Option<i64>, used: i64| limit.map(|limit| hours((limit - used).max(0)));
        let usage = BudgetUse {
            kind: budget.kind.as_str().to_string(),
            name: budget.name.clone(),
            period: date_of(from)[..7].to_string(),
            resets: date_of(to),
            cpu_hours: budget.cpu_core_ms.map(hours),
            cpu_hours_used: hours(used.cpu_core_ms),
            cpu_hours_left: left(budget.cpu_core_ms, used.cpu_core_ms),
            gpu_hours: budget.gpu_ms.map(hours),
            gpu_hours_used: hours(used.gpu_ms),
            gpu_hours_left: left(budget.gpu_ms, used.gpu_ms),
        };
        uses.push((budget, used, usage));
    }
    Ok(uses)
}

/// Refuses a run (429) that would start past a spent budget, naming the budget, what was used
/// and when it resets. Running jobs go on: a budget only holds back new runs.
pub async fn check_budgets(state: &AppState, user_id: &str, program_id: &str) -> Result<(), ApiError> {
    for (budget, used, usage) in budget_uses(state, BudgetsOf::Run { user_id, program_id }).await? {
        if let Some((which, limit, used)) = spent(budget.cpu_core_ms, budget.gpu_ms, &used) {
            return Err(ApiError::TooManyRequests(format!(
                "Budget spent: the {which}-hours budget of {} {} is {} a month and {} were used in {}; it resets on {}.",
                usage.kind,
                usage.name,
                hours(limit),
                hours(used),
                usage.period,
                usage.resets
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_lists_at_most_a_thousand_groups_the_heaviest_and_totals_them_all() {
        let groups: Vec<Total> = (0..1005)
            .map(|i| Total {
                key: format!("k{i:04}"),
                jobs: 1,
                figures: Figures { cpu_core_ms: i, ..Figures::default() },
                ..Total::default()
            })
            .collect();
        let answer = answer(0, 1, "user", None, groups);
        assert_eq!((answer.groups.len(), answer.groups_left_out), (1000, 5));
        assert_eq!(answer.total.jobs, 1005);
        assert_eq!(answer.groups[0].key, "k0005", "the five lightest left out, the rest by key");
        assert!(answer.groups.windows(2).all(|pair| pair[0].key < pair[1].key));
    }

    #[test]
    fn a_bad_day_names_its_parameter() {
        assert_eq!(day_of("from", " 2026-11-01 ").unwrap(), 20_758);
        let error = day_of("to", "2026-13-01").unwrap_err().to_string();
        assert_eq!(error, "'to' must be a date as YYYY-MM-DD, got '2026-13-01'.");
    }
}
