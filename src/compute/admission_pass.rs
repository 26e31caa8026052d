//! One admission pass, shared by the runners: it reads the tenants, the queue's windows, the
//! load and the users' recent usage, asks `fair_share::decide`, moves the admitted jobs to
//! PENDING (each with its reason when tenants are declared), marks the backfill jobs a tenant
//! reclaims, and keeps what it saw of each tenant (`tenant_shares`) for the queue page and the
//! gauges.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{job_step, publish_move};
use crate::db::{self, Db, jobs, tenants};
use crate::domain::admission::{FairShare, Limits, QueuedJob};
use crate::domain::fair_share::{self, Holding, Load, NO_TENANT, Pass, Waiting};
use crate::domain::lifecycle::{self, JobStatus, Trigger};
use crate::events::Publisher;

/// Status moves an admission pass writes in one transaction: the first jobs of a long queue
/// start while the next are being written.
const ADMISSION_BATCH: usize = 100;

/// The oldest queued jobs an admission pass considers.
pub const ADMISSION_WINDOW: usize = 1000;

/// The oldest queued jobs of each tenant a pass considers besides.
pub const TENANT_WINDOW: usize = 200;

/// The load a pass works against.
#[derive(Debug, Clone, Default)]
pub struct Capacity {
    /// The models of the GPUs no job holds, where the runner lends GPUs itself; `None` where
    /// something else places them (Kubernetes).
    pub free_gpus: Option<Vec<String>>,
}

/// A runner's fair-share settings and what its passes keep between them: the users' decayed
/// usage (read again at most every `USAGE_EVERY`) and the tenant shares last written.
#[derive(Default)]
pub struct Memory {
    fair: FairShare,
    usage: Mutex<Option<(Instant, HashMap<String, f64>)>>,
    shares: Mutex<Vec<tenants::Share>>,
}

impl Memory {
    pub fn new(fair: FairShare) -> Memory {
        Memory { fair, ..Memory::default() }
    }
}

/// How often the users' decayed usage is read again from the ledger.
const USAGE_EVERY: Duration = Duration::from_secs(10);

/// What a pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Passed {
    /// Jobs moved to PENDING.
    pub moved: usize,
    /// Whether more may fit at once (a window was admitted whole).
    pub more: bool,
    /// Backfill jobs marked to stop, with the tenant reclaiming.
    pub preempted: Vec<(String, String)>,
}

/// One admission pass (see the module's comment): `admitted` gets each job that moved as soon
/// as its batch is committed, `preempt` each backfill job marked to stop (the runner stops it;
/// it ends STOPPED with the reclaiming tenant in its reason).
pub async fn admit_queued(
    db: &Db,
    publisher: &Arc<dyn Publisher>,
    capacity: &Capacity,
    limits: Limits,
    memory: &Memory,
    mut admitted: impl FnMut(&QueuedJob),
    mut preempt: impl FnMut(&str),
) -> Result<Passed, db::Error> {
    let declared = tenants::list(db).await?;
    let tenants: Vec<fair_share::Tenant> = declared.iter().map(tenants::TenantRow::tenant).collect();
    let names: Vec<String> = declared.iter().map(|t| t.name.clone()).collect();
    let queue = jobs::queued(db, ADMISSION_WINDOW as i64, &names, TENANT_WINDOW as i64).await?;
    if queue.is_empty() && tenants.is_empty() {
        // Nothing to admit, nothing to reclaim for, no tenant's figures to keep.
        forget_shares(db, memory).await?;
        return Ok(Passed::default());
    }
    let guaranteed = tenants.iter().any(|t| t.cpu.guaranteed > 0 || t.gpu.guaranteed > 0);
    let backfill: Vec<Holding> = match guaranteed {
        true => jobs::backfill_in_flight(db).await?,
        false => Vec::new(),
    };
    // Read after the backfill jobs: one that ends between the two reads is then a holding no
    // longer counted in the load (its reclaim a no-op), never load without its holding (a
    // reclaim of another backfill job than the one already going: found by the doubles' test).
    let load: Vec<Load> = jobs::in_flight_load(db).await?;
    let (fair, now) = (memory.fair, db::now_micros());
    let half_life_ms = fair.half_life.as_millis().max(1) as f64;
    let mut user_usage = recent_usage(db, memory, fair.half_life, now).await?;
    // A job holding a slot weighs as a half-life of a slot's use (ended jobs weigh by the ledger).
    for held in &load {
        *user_usage.entry(held.user.clone()).or_default() += held.count as f64 * half_life_ms;
    }
    let waiting: Vec<Waiting> = queue
        .iter()
        .map(|job| Waiting {
            id: job.id.clone(),
            user: job.author_id.clone(),
            tenant: job.tenant.clone(),
            gpu: job.gpu,
            created: job.created,
            backfill: job.backfill,
            gpus: job.gpus,
            gpu_model: job.gpu_model.clone(),
        })
        .collect();
    let decision = fair_share::decide(&Pass {
        tenants: &tenants,
        queue: &waiting,
        running: &load,
        backfill: &backfill,
        free_gpus: capacity.free_gpus.as_deref(),
        user_usage: &user_usage,
        job_weight: half_life_ms,
        jobs_per_user: limits.jobs_per_user,
        cpu_slots: limits.cpu_slots,
        gpu_slots: limits.gpu_slots,
        now,
        grace: i64::try_from(fair.grace.as_micros()).unwrap_or(i64::MAX),
        max_preemptions: fair.max_preemptions,
    });
    let by_id: HashMap<&str, &QueuedJob> = queue.iter().map(|job| (job.id.as_str(), job)).collect();
    let mut passed = Passed { more: decision.admitted.len() >= ADMISSION_WINDOW, ..Passed::default() };
    if let Some(mv) = lifecycle::decide(JobStatus::Queued, &Trigger::Admitted) {
        // One move per reason (with no tenant declared, one for all), in batches. The jobs are
        // grouped by reason over the whole pass, in the order of each reason's first job: a
        // reason names its tenant, and grouped per batch, a pass over 100 tenants made nearly
        // every move a transaction of its own (45,859 for 100,000 jobs, bench/controller.sh
        // tenants).
        let mut groups: Vec<(Option<String>, Vec<String>)> = Vec::new();
        let mut group_of: HashMap<Option<String>, usize> = HashMap::new();
        for (id, lent) in &decision.admitted {
            let tenant = by_id.get(id.as_str()).map_or(NO_TENANT, |job| job.tenant.as_str());
            let reason = (!tenants.is_empty()).then(|| admission_reason(tenant, *lent));
            let group = *group_of.entry(reason.clone()).or_insert_with(|| {
                groups.push((reason, Vec::new()));
                groups.len() - 1
            });
            groups[group].1.push(id.clone());
        }
        for (reason, ids) in groups {
            let mut mv = mv.clone();
            if let Some(reason) = reason {
                mv.data["reason"] = serde_json::Value::String(reason);
            }
            for batch in ids.chunks(ADMISSION_BATCH) {
                for job_id in jobs::apply_moves(db, batch, &mv, publisher.moves_outbox()).await? {
                    let span = job_step(db, "gantry.job.admit", &job_id).await;
                    span.record("gantry.job.previous_status", JobStatus::Queued.as_str());
                    span.record("gantry.job.status", mv.to.as_str());
                    publish_move(publisher, &job_id, &mv);
                    if let Some(job) = by_id.get(job_id.as_str()) {
                        admitted(job);
                    }
                    passed.moved += 1;
                }
            }
        }
    }
    for (job_id, tenant) in &decision.preempted {
        if jobs::mark_preempted(db, job_id, tenant).await? {
            tracing::info!(job.id = %job_id, tenant = %tenant, "stopping a backfill job: its tenant reclaims its guarantee");
            preempt(job_id);
            passed.preempted.push((job_id.clone(), tenant.clone()));
        }
    }
    if !tenants.is_empty() {
        keep_shares(db, memory, &tenants, &load, &decision.admitted, &queue, now).await?;
    } else {
        forget_shares(db, memory).await?;
    }
    Ok(passed)
}

/// Empties the kept shares once the last tenant went (nothing to show then).
async fn forget_shares(db: &Db, memory: &Memory) -> Result<(), db::Error> {
    if memory.shares.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
        return Ok(());
    }
    tenants::write_shares(db, &[]).await?;
    memory.shares.lock().unwrap_or_else(|p| p.into_inner()).clear();
    Ok(())
}

/// The reason an admission's event gives, where tenants are declared.
fn admission_reason(tenant: &str, lent: bool) -> String {
    match (tenant, lent) {
        (NO_TENANT, _) => "admitted on capacity no tenant is guaranteed or uses".to_string(),
        (tenant, false) => format!("admitted within the guarantee of tenant {tenant}"),
        (tenant, true) => format!("admitted on capacity lent to tenant {tenant}"),
    }
}

/// Each user's run time of the last eight half-lives, decayed by the half-life (milliseconds
/// of a slot, now), read again from the ledger at most every `USAGE_EVERY`.
async fn recent_usage(
    db: &Db,
    memory: &Memory,
    half_life: Duration,
    now: i64,
) -> Result<HashMap<String, f64>, db::Error> {
    if let Some((read, usage)) = memory.usage.lock().unwrap_or_else(|p| p.into_inner()).as_ref()
        && read.elapsed() < USAGE_EVERY
    {
        return Ok(usage.clone());
    }
    let half_life = i64::try_from(half_life.as_micros()).unwrap_or(i64::MAX).max(1);
    let bucket = (half_life / 8).max(1_000_000);
    let rows = db::usage::recent_run_by_user(db, now.saturating_sub(half_life.saturating_mul(8)), bucket).await?;
    let usage = fair_share::decayed(&rows, bucket, half_life, now);
    *memory.usage.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), usage.clone()));
    Ok(usage)
}

/// Writes what the pass saw of each tenant (after its admissions) when it changed.
async fn keep_shares(
    db: &Db,
    memory: &Memory,
    tenants: &[fair_share::Tenant],
    load: &[Load],
    admitted: &[(String, bool)],
    queue: &[QueuedJob],
    now: i64,
) -> Result<(), db::Error> {
    let mut figures: std::collections::BTreeMap<(String, bool), (i64, i64, i64)> = Default::default();
    for tenant in tenants {
        for gpu in [false, true] {
            figures.insert((tenant.name.clone(), gpu), (0, 0, 0));
        }
    }
    for entry in load {
        let figure = figures.entry((entry.tenant.clone(), entry.gpu)).or_default();
        figure.0 += entry.count as i64;
        if !entry.backfill {
            figure.1 += entry.count as i64;
        }
    }
    let started: std::collections::HashSet<&str> = admitted.iter().map(|(id, _)| id.as_str()).collect();
    for job in queue {
        let figure = figures.entry((job.tenant.clone(), job.gpu)).or_default();
        if started.contains(job.id.as_str()) {
            figure.0 += 1;
            if !job.backfill {
                figure.1 += 1;
            }
        } else {
            figure.2 += 1;
        }
    }
    let shares: Vec<tenants::Share> = figures
        .into_iter()
        .map(|((tenant, gpu), (used, firm, waiting))| tenants::Share { tenant, gpu, used, firm, waiting, updated: now })
        .collect();
    let same = |a: &[tenants::Share], b: &[tenants::Share]| {
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| {
                (&x.tenant, x.gpu, x.used, x.firm, x.waiting) == (&y.tenant, y.gpu, y.used, y.firm, y.waiting)
            })
    };
    if same(&memory.shares.lock().unwrap_or_else(|p| p.into_inner()), &shares) {
        return Ok(());
    }
    tenants::write_shares(db, &shares).await?;
    *memory.shares.lock().unwrap_or_else(|p| p.into_inner()) = shares;
    Ok(())
}
