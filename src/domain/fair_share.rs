//! Fair shares between tenants (issue 48, item 2 and the decisions of item 3): which queued jobs
//! start now and which backfill jobs are stopped to give a tenant back its guarantee. A pure
//! function of the tenants' quotas, the queue, the load and the users' recent usage, called by
//! every runner's admission pass (`compute::admission_pass`). With no tenant declared it is fair
//! share between users: every job is of `NO_TENANT`, users by their recent usage.
//!
//! One pass, for CPU slots and GPU slots each:
//! 1. Guarantees: a tenant below its guarantee (counting its jobs that are not backfill) is
//!    served first (the tenant furthest below it first, a job at a time), from the free slots;
//!    backfill jobs never take a guarantee.
//! 2. Lending: the free slots left go, a job at a time, to the tenant whose use beyond its
//!    guarantee is the smallest for its weight (jobs of no tenant share as one tenant of weight
//!    1 and no guarantee), up to each tenant's borrowing cap. A guarantee its tenant does not
//!    use is lent this way too.
//! 3. Reclaim: a tenant below its guarantee with jobs waiting and no free slot for them gets
//!    back what was lent to backfill jobs: the youngest backfill jobs, its own or of tenants
//!    beyond their guarantee, are stopped, once the tenant's oldest waiting job has waited the grace period,
//!    at most `max_preemptions` a pass. Its jobs start in a later pass, when the slots are free.
//!    A job that is not backfill is never stopped.
//!
//! Within a tenant, users go by their recent usage (decayed; the caller's `user_usage`, plus
//! `job_weight` for each job admitted to them in this pass), then by their oldest job; the
//! per-user cap and the global slots always hold. Where the runner lends the machine's own GPUs
//! (`gantry serve`), a GPU job also needs as many free GPUs of its model as it asks for.

use std::collections::{BTreeMap, HashMap};

/// The tenant of jobs that belong to none: it shares what is not guaranteed, weight 1.
pub const NO_TENANT: &str = "";

/// A tenant's quota for one kind of slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Slots it is guaranteed.
    pub guaranteed: usize,
    /// Slots it may use beyond its guarantee (`None`: no cap).
    pub borrow_cap: Option<usize>,
}

/// A tenant: a provider, a group or an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub name: String,
    pub cpu: Quota,
    pub gpu: Quota,
    /// The GPU model its GPU guarantee is of (`None`: any): then only its jobs asking for that
    /// model count toward the guarantee and are served first by it; its other GPU jobs run on
    /// lent capacity.
    pub gpu_model: Option<String>,
    /// Its share of lent capacity against the others' (at least 1).
    pub weight: u32,
}

/// A queued job as fair sharing sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub id: String,
    pub user: String,
    /// `NO_TENANT` for none.
    pub tenant: String,
    pub gpu: bool,
    pub created: i64,
    /// Runs only on lent or unguaranteed capacity, and may be stopped to give it back.
    pub backfill: bool,
    /// GPUs the job asks for (0 for a CPU job) and their model (`None`: any).
    pub gpus: u32,
    pub gpu_model: Option<String>,
}

/// Jobs holding slots (pending or running), counted by user, tenant, kind and backfill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Load {
    pub user: String,
    pub tenant: String,
    pub gpu: bool,
    pub backfill: bool,
    /// The GPU model its jobs asked for (`None`: any, or a CPU job).
    pub gpu_model: Option<String>,
    pub count: usize,
}

/// A backfill job holding a slot: what a reclaim may stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    pub id: String,
    pub tenant: String,
    pub gpu: bool,
    /// When it was admitted: the youngest backfill jobs are stopped first.
    pub admitted: i64,
}

/// The load of the jobs in `holding`, one job each (for callers and tests that have the jobs).
pub fn load_of<'a>(holding: impl IntoIterator<Item = (&'a str, &'a str, bool, bool)>) -> Vec<Load> {
    let mut counts: BTreeMap<(&str, &str, bool, bool), usize> = BTreeMap::new();
    for key in holding {
        *counts.entry(key).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|((user, tenant, gpu, backfill), count)| Load {
            user: user.to_string(),
            tenant: tenant.to_string(),
            gpu,
            backfill,
            gpu_model: None,
            count,
        })
        .collect()
}

/// What one pass works against.
#[derive(Debug, Clone)]
pub struct Pass<'a> {
    pub tenants: &'a [Tenant],
    pub queue: &'a [Waiting],
    /// What holds slots now.
    pub running: &'a [Load],
    /// The backfill jobs among them.
    pub backfill: &'a [Holding],
    /// The models of the GPUs no job holds, where the runner lends GPUs itself; `None` where
    /// something else places them (Kubernetes): GPU slots alone bound GPU jobs then.
    pub free_gpus: Option<&'a [String]>,
    /// Each user's recent usage, decayed (any unit; lower goes first).
    pub user_usage: &'a HashMap<String, f64>,
    /// What one job admitted in this pass adds to its user's usage (the same unit).
    pub job_weight: f64,
    /// Pending+running jobs a user may have.
    pub jobs_per_user: usize,
    pub cpu_slots: usize,
    pub gpu_slots: usize,
    /// Now, and how long a tenant's oldest waiting job waits before backfill is stopped for it
    /// (microseconds).
    pub now: i64,
    pub grace: i64,
    /// Backfill jobs stopped at most per pass.
    pub max_preemptions: usize,
}

/// Why a queued job did not start in this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// Its user has `jobs_per_user` jobs pending or running.
    UserCap,
    /// Its tenant uses its guarantee and its borrowing cap.
    BorrowingCap,
    /// Its tenant is below its guarantee but the slots are lent out (given back as they free,
    /// or by stopping backfill after the grace).
    TenantQuota,
    /// No slot of its kind is free (every tenant at or beyond its share).
    Slots,
    /// A GPU slot is free but not the GPUs it asks for (their number, or its model).
    GpuModel,
}

impl Hold {
    /// The word `jobs/queue/` shows.
    pub fn as_str(&self) -> &'static str {
        match self {
            Hold::UserCap => "user_cap",
            Hold::BorrowingCap => "borrowing_cap",
            Hold::TenantQuota => "tenant_quota",
            Hold::Slots => "slots",
            Hold::GpuModel => "gpu_model",
        }
    }
}

/// What a pass decided.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    /// Jobs to start, in order, with whether each runs on lent capacity (beyond its tenant's
    /// guarantee).
    pub admitted: Vec<(String, bool)>,
    /// Backfill jobs to stop, with the tenant reclaiming its guarantee.
    pub preempted: Vec<(String, String)>,
    /// Why each queued job that did not start waits.
    pub held: BTreeMap<String, Hold>,
}

/// One kind of slot's state through a pass.
struct Kind<'p> {
    gpu: bool,
    free: usize,
    /// Jobs holding slots per tenant.
    used: HashMap<&'p str, usize>,
    /// Of those, the ones that are not backfill: what counts toward a guarantee.
    firm: HashMap<&'p str, usize>,
}

/// Decides one pass (see the module's comment).
pub fn decide(pass: &Pass) -> Decision {
    let mut decision = Decision::default();
    let mut per_user: HashMap<&str, usize> = HashMap::new();
    for load in pass.running {
        *per_user.entry(load.user.as_str()).or_default() += load.count;
    }
    let mut free_gpus: Option<Vec<&str>> = pass.free_gpus.map(|free| free.iter().map(String::as_str).collect());
    let mut admitted_to: HashMap<&str, usize> = HashMap::new();
    // The tenants by name (the first of a name, as a search in order finds it): looked up for
    // every tenant at every admission, a search of the list was most of a pass over 100.
    let mut by_name: HashMap<&str, &Tenant> = HashMap::new();
    for tenant in pass.tenants {
        by_name.entry(tenant.name.as_str()).or_insert(tenant);
    }
    let mut preemptions = 0;
    for gpu in [false, true] {
        let slots = if gpu { pass.gpu_slots } else { pass.cpu_slots };
        let mut kind = Kind { gpu, free: 0, used: HashMap::new(), firm: HashMap::new() };
        for load in pass.running.iter().filter(|load| load.gpu == gpu) {
            *kind.used.entry(load.tenant.as_str()).or_default() += load.count;
            let tenant = by_name.get(load.tenant.as_str()).copied();
            if toward(tenant, gpu, load.backfill, load.gpu_model.as_deref()) {
                *kind.firm.entry(load.tenant.as_str()).or_default() += load.count;
            }
        }
        kind.free = slots.saturating_sub(kind.used.values().sum());
        // Each tenant's queue of this kind, oldest first (users are chosen at each admission).
        let mut queues: BTreeMap<&str, Vec<&Waiting>> = BTreeMap::new();
        for job in pass.queue.iter().filter(|job| job.gpu == gpu) {
            queues.entry(job.tenant.as_str()).or_default().push(job);
        }
        for jobs in queues.values_mut() {
            jobs.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
        }
        let mut state = State {
            pass,
            tenants: &by_name,
            per_user: &mut per_user,
            admitted_to: &mut admitted_to,
            free_gpus: &mut free_gpus,
            kind,
        };
        // 1. Guarantees, the tenant furthest below its own first.
        while state.kind.free > 0 {
            let mut below: Vec<(usize, &str)> = queues
                .iter()
                .filter(|(_, jobs)| !jobs.is_empty())
                .filter_map(|(tenant, _)| {
                    let quota = state.quota(tenant);
                    let used = state.firm(tenant);
                    (used < quota.guaranteed).then_some((used * 1_000_000 / quota.guaranteed.max(1), *tenant))
                })
                .collect();
            below.sort_unstable();
            let Some((tenant, index)) = below
                .into_iter()
                .find_map(|(_, tenant)| state.next(&queues[tenant], false).map(|index| (tenant, index)))
            else {
                break;
            };
            let jobs = queues.get_mut(tenant).expect("listed");
            let job = jobs.remove(index);
            state.admit(job, false, &mut decision);
        }
        // 2. Lending: the smallest use beyond the guarantee for the weight first.
        while state.kind.free > 0 {
            let mut lenders: Vec<(u128, &str)> = queues
                .iter()
                .filter(|(tenant, jobs)| !jobs.is_empty() && !state.at_cap(tenant))
                .map(|(tenant, _)| {
                    let quota = state.quota(tenant);
                    let beyond = state.used(tenant).saturating_sub(quota.guaranteed) as u128;
                    // beyond / weight, compared exactly; ties by name.
                    (beyond * 1_000_000 / u128::from(state.weight(tenant)), *tenant)
                })
                .collect();
            lenders.sort_unstable();
            // The first in that order with a job that can start.
            let Some((tenant, index)) = lenders
                .into_iter()
                .find_map(|(_, tenant)| state.next(&queues[tenant], true).map(|index| (tenant, index)))
            else {
                break;
            };
            let jobs = queues.get_mut(tenant).expect("listed");
            let job = jobs.remove(index);
            let lent = !state.toward(job) || state.firm(tenant) >= state.quota(tenant).guaranteed;
            state.admit(job, lent, &mut decision);
        }
        // 3. Reclaim from backfill, and why the rest waits.
        for (tenant, jobs) in &queues {
            let quota = state.quota(tenant);
            let below = quota.guaranteed.saturating_sub(state.firm(tenant));
            let waiting_for_guarantee = jobs.iter().filter(|job| state.toward(job)).count().min(below);
            if waiting_for_guarantee > 0 && state.kind.free == 0 {
                let oldest =
                    jobs.iter().filter(|job| state.toward(job)).map(|job| job.created).min().unwrap_or(pass.now);
                if pass.now - oldest >= pass.grace {
                    let allowed = pass.max_preemptions.saturating_sub(preemptions).min(waiting_for_guarantee);
                    for id in state.reclaimable(tenant, &decision).into_iter().take(allowed) {
                        decision.preempted.push((id, tenant.to_string()));
                        preemptions += 1;
                    }
                }
            }
            for job in jobs {
                let hold = if state.per_user.get(job.user.as_str()).copied().unwrap_or(0) >= pass.jobs_per_user {
                    Hold::UserCap
                } else if state.kind.free > 0 && !state.fits(job) {
                    Hold::GpuModel
                } else if state.toward(job) && state.firm(tenant) < quota.guaranteed {
                    Hold::TenantQuota
                } else if state.at_cap(tenant) {
                    Hold::BorrowingCap
                } else {
                    Hold::Slots
                };
                decision.held.insert(job.id.clone(), hold);
            }
        }
    }
    decision
}

/// A pass over one kind of slot.
struct State<'p, 'm> {
    pass: &'p Pass<'p>,
    /// `pass.tenants` by name.
    tenants: &'m HashMap<&'p str, &'p Tenant>,
    per_user: &'m mut HashMap<&'p str, usize>,
    admitted_to: &'m mut HashMap<&'p str, usize>,
    /// The models of the GPUs still free, where the runner lends them.
    free_gpus: &'m mut Option<Vec<&'p str>>,
    kind: Kind<'p>,
}

impl<'p> State<'p, '_> {
    fn tenant(&self, name: &str) -> Option<&'p Tenant> {
        self.tenants.get(name).copied()
    }

    fn quota(&self, name: &str) -> Quota {
        match self.tenant(name) {
            Some(tenant) if self.kind.gpu => tenant.gpu,
            Some(tenant) => tenant.cpu,
            None => Quota { guaranteed: 0, borrow_cap: None },
        }
    }

    fn weight(&self, name: &str) -> u32 {
        self.tenant(name).map_or(1, |tenant| tenant.weight.max(1))
    }

    fn used(&self, name: &str) -> usize {
        self.kind.used.get(name).copied().unwrap_or(0)
    }

    /// What counts toward its guarantee: its jobs that are not backfill.
    fn firm(&self, name: &str) -> usize {
        self.kind.firm.get(name).copied().unwrap_or(0)
    }

    /// Whether the tenant uses its guarantee and all it may borrow.
    fn at_cap(&self, name: &str) -> bool {
        let quota = self.quota(name);
        quota.borrow_cap.is_some_and(|cap| self.used(name) >= quota.guaranteed + cap)
    }

    /// The index in `jobs` of the next job to admit: of the users under their cap, the one with
    /// the least recent usage (then the oldest job); backfill jobs only when `lent`.
    fn next(&self, jobs: &[&'p Waiting], lent: bool) -> Option<usize> {
        let score = |user: &str| {
            self.pass.user_usage.get(user).copied().unwrap_or(0.0)
                + self.admitted_to.get(user).copied().unwrap_or(0) as f64 * self.pass.job_weight
        };
        jobs.iter()
            .enumerate()
            .filter(|(_, job)| lent || self.toward(job))
            .filter(|(_, job)| self.per_user.get(job.user.as_str()).copied().unwrap_or(0) < self.pass.jobs_per_user)
            .filter(|(_, job)| self.fits(job))
            .min_by(|(_, a), (_, b)| {
                score(&a.user).total_cmp(&score(&b.user)).then_with(|| (a.created, &a.id).cmp(&(b.created, &b.id)))
            })
            .map(|(index, _)| index)
    }

    /// Whether a queued job would count toward its tenant's guarantee.
    fn toward(&self, job: &Waiting) -> bool {
        toward(self.tenant(&job.tenant), self.kind.gpu, job.backfill, job.gpu_model.as_deref())
    }

    /// Whether the GPUs a GPU job asks for are free, where the runner lends them.
    fn fits(&self, job: &Waiting) -> bool {
        !job.gpu || self.free_gpus.as_deref().is_none_or(|free| gpus_fit(free, job).is_some())
    }

    fn admit(&mut self, job: &'p Waiting, lent: bool, decision: &mut Decision) {
        if job.gpu
            && let Some(free) = self.free_gpus.as_mut()
        {
            let taken = gpus_fit(free, job).expect("admitted only when its GPUs are free");
            for index in taken.into_iter().rev() {
                free.remove(index);
            }
        }
        self.kind.free -= 1;
        *self.kind.used.entry(job.tenant.as_str()).or_default() += 1;
        if self.toward(job) {
            *self.kind.firm.entry(job.tenant.as_str()).or_default() += 1;
        }
        *self.per_user.entry(job.user.as_str()).or_default() += 1;
        *self.admitted_to.entry(job.user.as_str()).or_default() += 1;
        decision.admitted.push((job.id.clone(), lent));
    }

    /// Backfill jobs of this kind holding what `reclaiming` is guaranteed: its own, and those
    /// of tenants beyond their guarantees (no more from one than it holds beyond it), not
    /// already chosen; youngest first.
    fn reclaimable(&self, reclaiming: &str, decision: &Decision) -> Vec<String> {
        let mut candidates: Vec<&Holding> = self
            .pass
            .backfill
            .iter()
            .filter(|job| job.gpu == self.kind.gpu)
            .filter(|job| !decision.preempted.iter().any(|(id, _)| *id == job.id))
            .collect();
        candidates.sort_by(|a, b| (b.admitted, &b.id).cmp(&(a.admitted, &a.id)));
        let mut taken: HashMap<&str, usize> = HashMap::new();
        candidates
            .into_iter()
            .filter(|job| {
                if job.tenant == reclaiming {
                    return true;
                }
                let beyond = self.used(&job.tenant).saturating_sub(self.quota(&job.tenant).guaranteed);
                let count = taken.entry(job.tenant.as_str()).or_default();
                *count += 1;
                *count <= beyond
            })
            .map(|job| job.id.clone())
            .collect()
    }
}

/// Whether a job counts toward its tenant's guarantee: it is not backfill and, for a GPU job of
/// a tenant whose GPU guarantee names a model, it asks for that model.
fn toward(tenant: Option<&Tenant>, gpu: bool, backfill: bool, model: Option<&str>) -> bool {
    if backfill {
        return false;
    }
    let wanted = match tenant {
        Some(Tenant { gpu_model: Some(wanted), .. }) if gpu => wanted,
        _ => return true,
    };
    model.is_some_and(|model| crate::domain::sizes::gpu_model_matches(model, wanted))
}

/// Each user's recent usage from their run time per bucket of end time (`(user, bucket number,
/// run_ms)`, buckets of `bucket` microseconds): every bucket's run time halved per `half_life`
/// (microseconds, at least 1) from the bucket's middle to `now`.
pub fn decayed(rows: &[(String, i64, i64)], bucket: i64, half_life: i64, now: i64) -> HashMap<String, f64> {
    let mut usage: HashMap<String, f64> = HashMap::new();
    for (user, number, run_ms) in rows {
        let age = (now - (number * bucket + bucket / 2)).max(0) as f64;
        *usage.entry(user.clone()).or_default() += *run_ms as f64 * 0.5f64.powf(age / half_life.max(1) as f64);
    }
    usage
}

/// The positions in `free` (models of free GPUs) of the GPUs `job` would take, in order;
/// `None` when too few fit.
fn gpus_fit(free: &[&str], job: &Waiting) -> Option<Vec<usize>> {
    let wanted = job.gpus.max(1) as usize;
    let fitting: Vec<usize> = free
        .iter()
        .enumerate()
        .filter(|(_, model)| job.gpu_model.as_deref().is_none_or(|m| crate::domain::sizes::gpu_model_matches(model, m)))
        .map(|(index, _)| index)
        .take(wanted)
        .collect();
    (fitting.len() == wanted).then_some(fitting)
}

#[cfg(test)]
mod tests;
