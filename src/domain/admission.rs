//! Admission: which queued jobs start now. A pure function of the queue and the current load,
//! shared by every compute backend: a per-user cap on pending+running jobs, global CPU-job and
//! GPU-job slots, and oldest-first fair share across users (each round admits at most one job
//! per user, users ordered by their oldest waiting job). Where the runner lends the machine's own
//! GPUs (`gantry serve`), a GPU job also needs as many free GPUs of its model as it asks for.

use std::collections::{HashMap, VecDeque};

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
}

/// The load admission works against.
#[derive(Debug, Clone, Default)]
pub struct Capacity {
    /// Pending+running jobs per user.
    pub running_per_user: HashMap<String, usize>,
    /// Pending+running CPU jobs and GPU jobs in total.
    pub running_cpu: usize,
    pub running_gpu: usize,
    /// The models of the GPUs no job holds, where the runner lends GPUs itself; `None` where
    /// something else places them (Kubernetes): GPU slots alone bound GPU jobs then.
    pub free_gpus: Option<Vec<String>>,
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

/// The ids to admit, in admission order. `queue` may come in any order.
pub fn admit(queue: &[QueuedJob], capacity: &Capacity, limits: Limits) -> Vec<String> {
    let mut per_user: HashMap<&str, VecDeque<&QueuedJob>> = HashMap::new();
    let mut sorted: Vec<&QueuedJob> = queue.iter().collect();
    sorted.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
    for job in sorted {
        per_user.entry(job.author_id.as_str()).or_default().push_back(job);
    }
    let mut running = capacity.running_per_user.clone();
    let mut cpu_free = limits.cpu_slots.saturating_sub(capacity.running_cpu);
    let mut gpu_free = limits.gpu_slots.saturating_sub(capacity.running_gpu);
    let mut free_gpus = capacity.free_gpus.clone();
    let mut admitted = Vec::new();
    loop {
        // Users with something admissible, ordered by their oldest admissible job.
        let mut heads: Vec<(&str, &QueuedJob)> = Vec::new();
        for (user, jobs) in per_user.iter_mut() {
            if running.get(*user).copied().unwrap_or(0) >= limits.jobs_per_user {
                jobs.clear();
                continue;
            }
            while let Some(front) = jobs.front() {
                let slots = if front.gpu { gpu_free } else { cpu_free };
                if slots > 0 && (!front.gpu || gpus_fit(free_gpus.as_deref(), front).is_some()) {
                    break;
                }
                // No slot of this kind left for this job; later jobs of the user may still fit.
                jobs.pop_front();
            }
            if let Some(front) = jobs.front() {
                heads.push((user, front));
            }
        }
        if heads.is_empty() {
            break;
        }
        heads.sort_by(|a, b| (a.1.created, &a.1.id).cmp(&(b.1.created, &b.1.id)));
        let mut progressed = false;
        for (user, job) in heads {
            let slots = if job.gpu { &mut gpu_free } else { &mut cpu_free };
            if *slots == 0 {
                continue;
            }
            if job.gpu {
                let Some(taken) = gpus_fit(free_gpus.as_deref(), job) else { continue };
                if let Some(free) = free_gpus.as_mut() {
                    for index in taken.into_iter().rev() {
                        free.remove(index);
                    }
                }
            }
            *slots -= 1;
            *running.entry(user.to_string()).or_default() += 1;
            admitted.push(job.id.clone());
            per_user.get_mut(user).expect("user present").pop_front();
            progressed = true;
        }
        if !progressed {
            break;
        }
    }
    admitted
}

/// The positions in `free` (models of free GPUs) of the GPUs `job` would take, in order;
/// `None` when too few fit. Without a list (`None`), nothing is counted: `Some` of nothing.
fn gpus_fit(free: Option<&[String]>, job: &QueuedJob) -> Option<Vec<usize>> {
    let Some(free) = free else { return Some(Vec::new()) };
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
mod tests {
    use super::*;

    fn job(id: &str, user: &str, created: i64, gpu: bool) -> QueuedJob {
        QueuedJob { id: id.into(), author_id: user.into(), gpu, created, gpus: u32::from(gpu), gpu_model: None }
    }

    const LIMITS: Limits = Limits { jobs_per_user: 2, cpu_slots: 6, gpu_slots: 1 };

    #[test]
    fn oldest_first_with_one_job_per_user_per_round() {
        let queue =
            [job("a1", "a", 1, false), job("a2", "a", 2, false), job("a3", "a", 3, false), job("b1", "b", 5, false)];
        assert_eq!(admit(&queue, &Capacity::default(), LIMITS), ["a1", "b1", "a2"]);
    }

    #[test]
    fn per_user_cap_counts_running_jobs() {
        let queue = [job("a1", "a", 1, false), job("b1", "b", 2, false)];
        let capacity =
            Capacity { running_per_user: HashMap::from([("a".to_string(), 2)]), running_cpu: 2, ..Default::default() };
        assert_eq!(admit(&queue, &capacity, LIMITS), ["b1"]);
    }

    #[test]
    fn global_slots_bound_cpu_and_gpu_separately() {
        let queue = [job("g1", "a", 1, true), job("g2", "b", 2, true), job("c1", "c", 3, false)];
        let capacity = Capacity { running_cpu: 5, ..Default::default() };
        assert_eq!(admit(&queue, &capacity, LIMITS), ["g1", "c1"]);
        let full = Capacity { running_cpu: 6, running_gpu: 1, ..Default::default() };
        assert!(admit(&queue, &full, LIMITS).is_empty());
    }

    #[test]
    fn a_heavy_user_does_not_starve_others() {
        let mut queue: Vec<QueuedJob> = (0..50).map(|i| job(&format!("h{i}"), "heavy", i, false)).collect();
        queue.push(job("l1", "light", 100, false));
        let limits = Limits { jobs_per_user: 10, cpu_slots: 3, gpu_slots: 0 };
        assert_eq!(admit(&queue, &Capacity::default(), limits), ["h0", "l1", "h1"]);
    }

    #[test]
    fn a_gpu_job_waiting_for_a_slot_does_not_block_the_users_cpu_jobs() {
        let queue = [job("g1", "a", 1, true), job("c1", "a", 2, false)];
        let capacity = Capacity { running_gpu: 1, ..Default::default() };
        assert_eq!(admit(&queue, &capacity, LIMITS), ["c1"]);
    }

    #[test]
    fn where_gpus_are_lent_a_gpu_job_waits_for_enough_free_gpus_of_its_model() {
        let limits = Limits { jobs_per_user: 5, cpu_slots: 6, gpu_slots: 4 };
        let two = |id: &str, user: &str, created| QueuedJob { gpus: 2, ..job(id, user, created, true) };
        let l40s = |id: &str, user: &str, created| QueuedJob {
            gpu_model: Some("l40s".into()),
            ..job(id, user, created, true)
        };
        let free = |models: &[&str]| Capacity {
            free_gpus: Some(models.iter().map(|m| m.to_string()).collect()),
            ..Default::default()
        };
        // One GPU free: the two-GPU job waits, the one-GPU job behind it runs.
        let queue = [two("g2", "a", 1), job("g1", "b", 2, true)];
        assert_eq!(admit(&queue, &free(&["NVIDIA H200"]), limits), ["g1"]);
        // Two free: the older two-GPU job takes both, the other waits.
        assert_eq!(admit(&queue, &free(&["NVIDIA H200", "NVIDIA H200"]), limits), ["g2"]);
        // A model: only a GPU of that model serves it.
        let queue = [l40s("m1", "a", 1), job("g1", "b", 2, true)];
        assert_eq!(admit(&queue, &free(&["NVIDIA H200"]), limits), ["g1"]);
        assert_eq!(admit(&queue, &free(&["NVIDIA H200", "NVIDIA L40S"]), limits), ["m1", "g1"]);
        assert_eq!(admit(&queue, &free(&["NVIDIA L40S"]), limits), ["m1"]);
        // No GPU free: none of them, CPU jobs still.
        let queue = [job("g1", "a", 1, true), job("c1", "a", 2, false)];
        assert_eq!(admit(&queue, &free(&[]), limits), ["c1"]);
        // Without a list (Kubernetes), slots alone decide.
        assert_eq!(admit(&[two("g2", "a", 1)], &Capacity::default(), limits), ["g2"]);
    }
}
