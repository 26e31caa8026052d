//! `GET jobs/queue/` (not part of the reference API): where the caller's unfinished jobs stand,
//! the active slots used of the limit and, for each queued job, how many queued jobs of any user
//! came before it and what holds it back.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::api::error::ApiError;
use crate::api::extract::Query;
use crate::api::shared::ProgramSummary;
use crate::api::state::AppState;
use crate::api::usage::{BudgetUse, BudgetsOf, budget_uses};
use crate::auth::Caller;
use crate::db::{self, queue, tenants};
use crate::domain::admission::Limits;

/// Where the caller's unfinished jobs stand: active slots used of the limit, and for each queued job how many queued jobs of any user came before it (oldest first)
///
/// Not part of the reference API.
#[utoipa::path(get, path = "/jobs/queue/", tag = "jobs", params(QueueQuery),
    responses((status = 200, description = "the caller's queue", body = QueueAnswer)),
    security(("bearer" = [])))]
pub async fn my_queue(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<QueueQuery>,
) -> Result<Json<QueueAnswer>, ApiError> {
    Ok(Json(queue(&state, &caller, query.limit.as_deref()).await?))
}

/// At most this many of the caller's unfinished jobs are listed (and the default).
pub const MAX_QUEUE_LISTED: i64 = 500;

/// Where the caller's unfinished jobs stand.
pub async fn queue(state: &AppState, caller: &Caller, limit: Option<&str>) -> Result<QueueAnswer, ApiError> {
    let limit = match limit.map(str::trim) {
        None | Some("") => MAX_QUEUE_LISTED,
        Some(text) => text.parse::<i64>().ok().filter(|n| (0..=MAX_QUEUE_LISTED).contains(n)).ok_or_else(|| {
            ApiError::BadRequest(format!("'limit' must be an integer from 0 to {MAX_QUEUE_LISTED}, got '{text}'."))
        })?,
    };
    let admission = state.config.admission;
    let (counts, places) = queue::read(&state.db, &caller.user_id, limit, admission.is_some()).await?;
    let running = counts.pending + counts.running;
    let in_use = counts.slots;
    // The tenants of the listed jobs, with what the last admission pass saw of each.
    let tenants = match places.iter().any(|p| p.tenant.is_some()) {
        true => tenant_shares(state, &places).await?,
        false => Vec::new(),
    };
    let waits = match (admission, in_use) {
        (Some(limits), Some(in_use)) => waiting_for(&places, running, limits, in_use, &tenants),
        _ => vec![None; places.len()],
    };
    let slots = |limit: usize, used: i64| SlotUse { used, limit: i64::try_from(limit).unwrap_or(i64::MAX) };
    Ok(QueueAnswer {
        active_limit: state.config.active_jobs_per_user,
        active: counts.queued + running,
        queued: counts.queued,
        running,
        running_limit: admission.map(|limits| i64::try_from(limits.jobs_per_user).unwrap_or(i64::MAX)),
        cpu_slots: admission.zip(in_use).map(|(limits, (cpu, _))| slots(limits.cpu_slots, cpu)),
        gpu_slots: admission.zip(in_use).map(|(limits, (_, gpu))| slots(limits.gpu_slots, gpu)),
        jobs: places
            .into_iter()
            .zip(waits)
            .map(|(p, waiting_for)| {
                let queued = p.status == "QUEUED";
                QueuedPlace {
                    tenant: p.tenant,
                    backfill: p.backfill,
                    ahead: queued.then_some(p.ahead),
                    position: queued.then_some(p.ahead + 1),
                    waiting_for,
                    gpu: p.gpu,
                    program: ProgramSummary { id: p.program_id, provider: p.provider_name, title: p.program_title },
                    id: p.id,
                    status: p.status,
                    created: db::format_timestamp(p.created),
                }
            })
            .collect(),
        tenants,
        budgets: budget_uses(state, BudgetsOf::User(&caller.user_id))
            .await?
            .into_iter()
            .map(|(_, _, usage)| usage)
            .collect(),
    })
}

/// The tenants of `places`' jobs with their quotas and what the last admission pass saw.
async fn tenant_shares(state: &AppState, places: &[queue::QueuePlace]) -> Result<Vec<TenantShare>, ApiError> {
    let shares = tenants::shares(&state.db).await?;
    let mut listed = Vec::new();
    for tenant in tenants::list(&state.db).await? {
        if !places.iter().any(|p| p.tenant.as_deref() == Some(tenant.name.as_str())) {
            continue;
        }
        let figures = |gpu: bool| {
            let (guaranteed, borrow_cap) = match gpu {
                true => (tenant.gpu_guaranteed, tenant.gpu_borrow_cap),
                false => (tenant.cpu_guaranteed, tenant.cpu_borrow_cap),
            };
            let share = shares.iter().find(|s| s.tenant == tenant.name && s.gpu == gpu);
            let (used, firm, waiting) = share.map_or((0, 0, 0), |s| (s.used, s.firm, s.waiting));
            TenantSlots {
                guaranteed,
                borrow_cap,
                used,
                backfill: used - firm,
                borrowed: (used - guaranteed).max(0),
                lent: (guaranteed - firm).max(0),
                waiting,
            }
        };
        let updated = shares.iter().filter(|s| s.tenant == tenant.name).map(|s| s.updated).max();
        listed.push(TenantShare {
            cpu: figures(false),
            gpu: figures(true),
            name: tenant.name,
            weight: tenant.weight,
            seen: updated.map(db::format_timestamp),
        });
    }
    Ok(listed)
}

/// What holds each of the caller's queued jobs (oldest first) back now: admission starts the
/// caller's oldest queued jobs while the caller is under its running limit and a slot of the
/// job's kind is free, so each queued job uses up one of each before the next is looked at; a
/// job of a tenant at its borrowing cap waits for its tenant, and one of a tenant below its
/// guarantee waits for its guarantee to come back (`tenant_quota`).
fn waiting_for(
    places: &[queue::QueuePlace],
    running: i64,
    limits: Limits,
    (cpu, gpu): (i64, i64),
    tenants: &[TenantShare],
) -> Vec<Option<WaitingFor>> {
    let free = |limit: usize, used: i64| (i64::try_from(limit).unwrap_or(i64::MAX) - used).max(0);
    let mut under_limit = free(limits.jobs_per_user, running);
    let (mut cpu_free, mut gpu_free) = (free(limits.cpu_slots, cpu), free(limits.gpu_slots, gpu));
    places
        .iter()
        .map(|place| {
            if place.status != "QUEUED" {
                return None;
            }
            let tenant = place
                .tenant
                .as_deref()
                .and_then(|name| tenants.iter().find(|t| t.name == name))
                .map(|t| if place.gpu { &t.gpu } else { &t.cpu });
            let slots = if place.gpu { &mut gpu_free } else { &mut cpu_free };
            // In the order the pass decides: the user's cap, the tenant's guarantee, its cap, slots.
            let below_guarantee = tenant.is_some_and(|t| !place.backfill && t.used - t.backfill < t.guaranteed);
            let at_cap = tenant.is_some_and(|t| t.borrow_cap.is_some_and(|cap| t.used >= t.guaranteed + cap));
            Some(if under_limit == 0 {
                WaitingFor::RunningLimit
            } else if *slots == 0 && below_guarantee {
                WaitingFor::TenantQuota
            } else if at_cap && !below_guarantee {
                WaitingFor::BorrowingCap
            } else if *slots == 0 {
                if place.gpu { WaitingFor::GpuSlots } else { WaitingFor::CpuSlots }
            } else {
                under_limit -= 1;
                *slots -= 1;
                WaitingFor::NextAdmission
            })
        })
        .collect()
}

/// `GET jobs/queue/`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct QueueQuery {
    /// List at most this many jobs (the counts cover all).
    #[param(value_type = Option<i64>, minimum = 0, maximum = 500, default = 500, example = 10)]
    pub limit: Option<String>,
}

/// The caller's queue: active slots used and allowed, and each unfinished job's place.
#[derive(Debug, Serialize, ToSchema)]
pub struct QueueAnswer {
    /// The most QUEUED+PENDING+RUNNING jobs the caller may have at once (`run` answers 429
    /// beyond it).
    pub active_limit: i64,
    /// The caller's QUEUED+PENDING+RUNNING jobs, all of them (not only those listed).
    pub active: i64,
    /// Of those, QUEUED.
    pub queued: i64,
    /// Of those, PENDING or RUNNING.
    pub running: i64,
    /// The most PENDING+RUNNING jobs the caller may have at once (`LIMITS_JOBS_PER_USER`): more
    /// wait QUEUED. Null where this server does not admit jobs itself and was not told the limit.
    #[schema(required = true)]
    pub running_limit: Option<i64>,
    /// The slots CPU jobs of every user share (`LIMITS_MAX_CLUSTERS`), as `running_limit`.
    #[schema(required = true)]
    pub cpu_slots: Option<SlotUse>,
    /// The slots GPU jobs of every user share (`LIMITS_MAX_GPU_CLUSTERS`).
    #[schema(required = true)]
    pub gpu_slots: Option<SlotUse>,
    /// The oldest of them, at most `limit` (default and most: 500).
    pub jobs: Vec<QueuedPlace>,
    /// The tenants the listed jobs count against (docs/scheduling.md), with their quotas and
    /// use as the last admission pass saw them; empty when none of them has a tenant.
    pub tenants: Vec<TenantShare>,
    /// The budgets the caller's runs count against (theirs, their groups', and those of the
    /// functions they ran this month or have active jobs of), with this month's use.
    pub budgets: Vec<BudgetUse>,
}

/// A tenant's quotas and use.
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantShare {
    /// `provider:<name>`, `group:<name>` or `instance:<name>`.
    pub name: String,
    /// Its share of lent capacity against the others'.
    pub weight: i64,
    pub cpu: TenantSlots,
    pub gpu: TenantSlots,
    /// When an admission pass last saw a change of its figures (null: none has yet).
    #[schema(format = DateTime, required = true)]
    pub seen: Option<String>,
}

/// A tenant's slots of one kind.
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantSlots {
    /// Slots it is served first.
    pub guaranteed: i64,
    /// Slots it may use beyond its guarantee (null: no cap).
    #[schema(required = true)]
    pub borrow_cap: Option<i64>,
    /// Its jobs holding slots (pending or running).
    pub used: i64,
    /// Of those, backfill jobs (they do not count toward its guarantee).
    pub backfill: i64,
    /// What it uses beyond its guarantee.
    pub borrowed: i64,
    /// What of its guarantee its own jobs do not use (others may use it meanwhile).
    pub lent: i64,
    /// Its jobs waiting in admission's window.
    pub waiting: i64,
}

/// Slots in use (pending and running jobs of every user) of those there are.
#[derive(Debug, Serialize, ToSchema)]
pub struct SlotUse {
    pub used: i64,
    pub limit: i64,
}

/// What keeps a queued job waiting, as things stand now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WaitingFor {
    /// The caller already has `running_limit` jobs pending or running (or ahead of this one).
    RunningLimit,
    /// Every CPU slot is taken.
    CpuSlots,
    /// Every GPU slot is taken.
    GpuSlots,
    /// Its tenant is below its guarantee but the slots are lent out: they come back as jobs
    /// end, or by stopping backfill after the grace.
    TenantQuota,
    /// Its tenant uses its guarantee and all it may borrow.
    BorrowingCap,
    /// Nothing: admission starts it at its next pass.
    NextAdmission,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct QueuedPlace {
    pub id: String,
    /// QUEUED, PENDING or RUNNING.
    pub status: String,
    #[schema(format = DateTime)]
    pub created: String,
    /// For a QUEUED job, how many queued jobs of any user came before it; null otherwise.
    #[schema(required = true)]
    pub ahead: Option<i64>,
    /// For a QUEUED job, its place in the queue of every user (`ahead` + 1); null otherwise.
    #[schema(required = true)]
    pub position: Option<i64>,
    /// For a QUEUED job, which limit holds it back; null otherwise (or when the limits are not
    /// known here).
    #[schema(required = true)]
    pub waiting_for: Option<WaitingFor>,
    pub gpu: bool,
    /// The tenant it counts against (null: none).
    #[schema(required = true)]
    pub tenant: Option<String>,
    /// It runs as backfill.
    pub backfill: bool,
    /// Its function.
    pub program: ProgramSummary,
}
