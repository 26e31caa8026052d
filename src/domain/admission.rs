//! Admission's inputs and settings, shared by every compute backend: a queued job as the pass
//! reads it, the limits (a per-user cap on pending+running jobs, global CPU-job and GPU-job
//! slots) and the fair-share settings. The decision itself is `fair_share::decide`.

use std::time::Duration;

/// A queued job, as admission sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedJob {
    pub id: String,
    pub author_id: String,
    pub gpu: bool,
    pub created: i64,
    /// GPUs the job asks for (0 for a CPU job) and their model (`None`: any).
    pub gpus: u32,
    pub gpu_model: Option<String>,
    /// The tenant it counts against (`fair_share::NO_TENANT` for none).
    pub tenant: String,
    pub backfill: bool,
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `LIMITS_JOBS_PER_USER`.
    pub jobs_per_user: usize,
    /// `LIMITS_MAX_CLUSTERS`: CPU jobs at once.
    pub cpu_slots: usize,
    /// `LIMITS_MAX_GPU_CLUSTERS`: GPU jobs at once.
    pub gpu_slots: usize,
}

/// How fair sharing weighs users and gives guarantees back (`LimitsArgs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FairShare {
    /// A user's past use counts half as much after this long (never zero).
    pub half_life: Duration,
    /// How long a tenant's oldest job waits for its guarantee before backfill is stopped for it.
    pub grace: Duration,
    /// Backfill jobs stopped at most per pass.
    pub max_preemptions: usize,
}

impl Default for FairShare {
    fn default() -> Self {
        FairShare { half_life: Duration::from_secs(3600), grace: Duration::from_secs(120), max_preemptions: 10 }
    }
}
