//! Fair shares between tenants (issue 48, item 2 and the decisions of item 3): which queued jobs
//! start now and which backfill jobs are stopped to give a tenant back its guarantee. A pure
//! function of the tenants' quotas, the queue, the running jobs and the users' recent usage.
//! Not yet called by the runners: `admission::admit` is what they use today.
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
//! per-user cap and the global slots always hold.

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
}

/// A job holding a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    pub id: String,
    pub user: String,
    pub tenant: String,
    pub gpu: bool,
    /// When it was admitted: the youngest backfill jobs are stopped first.
    pub admitted: i64,
    pub backfill: bool,
}

/// What one pass works against.
#[derive(Debug, Clone)]
pub struct Pass<'a> {
    pub tenants: &'a [Tenant],
    pub queue: &'a [Waiting],
    pub running: &'a [Holding],
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
}

impl Hold {
    /// The word `jobs/queue/` shows.
    pub fn as_str(&self) -> &'static str {
        match self {
            Hold::UserCap => "user_cap",
            Hold::BorrowingCap => "borrowing_cap",
            Hold::TenantQuota => "tenant_quota",
            Hold::Slots => "slots",
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
    for job in pass.running {
        *per_user.entry(job.user.as_str()).or_default() += 1;
    }
    let mut admitted_to: HashMap<&str, usize> = HashMap::new();
    let mut preemptions = 0;
    for gpu in [false, true] {
        let slots = if gpu { pass.gpu_slots } else { pass.cpu_slots };
        let mut kind = Kind { gpu, free: 0, used: HashMap::new(), firm: HashMap::new() };
        for job in pass.running.iter().filter(|job| job.gpu == gpu) {
            *kind.used.entry(job.tenant.as_str()).or_default() += 1;
            if !job.backfill {
                *kind.firm.entry(job.tenant.as_str()).or_default() += 1;
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
        let mut state = State { pass, per_user: &mut per_user, admitted_to: &mut admitted_to, kind };
        // 1. Guarantees, the tenant furthest below its own first.
        loop {
            let below = queues
                .iter()
                .filter_map(|(tenant, jobs)| {
                    let quota = state.quota(tenant);
                    let used = state.firm(tenant);
                    (used < quota.guaranteed && state.next(jobs, false).is_some())
                        .then_some((used * 1_000_000 / quota.guaranteed.max(1), *tenant))
                })
                .min();
            let Some((_, tenant)) = below else { break };
            if state.kind.free == 0 {
                break;
            }
            let jobs = queues.get_mut(tenant).expect("listed");
            let index = state.next(jobs, false).expect("checked");
            let job = jobs.remove(index);
            state.admit(job, false, &mut decision);
        }
        // 2. Lending: the smallest use beyond the guarantee for the weight first.
        while state.kind.free > 0 {
            let lender = queues
                .iter()
                .filter(|(tenant, jobs)| !state.at_cap(tenant) && state.next(jobs, true).is_some())
                .map(|(tenant, _)| {
                    let quota = state.quota(tenant);
                    let beyond = state.used(tenant).saturating_sub(quota.guaranteed) as u128;
                    // beyond / weight, compared exactly; ties by name.
                    (beyond * 1_000_000 / u128::from(state.weight(tenant)), *tenant)
                })
                .min();
            let Some((_, tenant)) = lender else { break };
            let jobs = queues.get_mut(tenant).expect("listed");
            let index = state.next(jobs, true).expect("checked");
            let job = jobs.remove(index);
            let lent = job.backfill || state.firm(tenant) >= state.quota(tenant).guaranteed;
            state.admit(job, lent, &mut decision);
        }
        // 3. Reclaim from backfill, and why the rest waits.
        for (tenant, jobs) in &queues {
            let quota = state.quota(tenant);
            let below = quota.guaranteed.saturating_sub(state.firm(tenant));
            let waiting_for_guarantee = jobs.iter().filter(|job| !job.backfill).count().min(below);
            if waiting_for_guarantee > 0 && state.kind.free == 0 {
                let oldest = jobs.iter().filter(|job| !job.backfill).map(|job| job.created).min().unwrap_or(pass.now);
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
                } else if !job.backfill && state.firm(tenant) < quota.guaranteed {
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
    per_user: &'m mut HashMap<&'p str, usize>,
    admitted_to: &'m mut HashMap<&'p str, usize>,
    kind: Kind<'p>,
}

impl<'p> State<'p, '_> {
    fn tenant(&self, name: &str) -> Option<&'p Tenant> {
        self.pass.tenants.iter().find(|tenant| tenant.name == name)
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
            .filter(|(_, job)| lent || !job.backfill)
            .filter(|(_, job)| self.per_user.get(job.user.as_str()).copied().unwrap_or(0) < self.pass.jobs_per_user)
            .min_by(|(_, a), (_, b)| {
                score(&a.user).total_cmp(&score(&b.user)).then_with(|| (a.created, &a.id).cmp(&(b.created, &b.id)))
            })
            .map(|(index, _)| index)
    }

    fn admit(&mut self, job: &'p Waiting, lent: bool, decision: &mut Decision) {
        self.kind.free -= 1;
        *self.kind.used.entry(job.tenant.as_str()).or_default() += 1;
        if !job.backfill {
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
            .running
            .iter()
            .filter(|job| job.gpu == self.kind.gpu && job.backfill)
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

#[cfg(test)]
mod tests;
