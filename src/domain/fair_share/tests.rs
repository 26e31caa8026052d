//! Table tests of one pass and of passes in a row (issue 48's "Done when": weights 1:2:1 settle
//! within 5 % of 25/50/25; a tenant that becomes active is served in the next pass when its
//! guarantee is free, after the grace when it was lent to backfill).

use super::*;

fn tenant(name: &str, gpu_guaranteed: usize, weight: u32, borrow_cap: Option<usize>) -> Tenant {
    Tenant {
        name: name.into(),
        cpu: Quota { guaranteed: 0, borrow_cap: None },
        gpu: Quota { guaranteed: gpu_guaranteed, borrow_cap },
        gpu_model: None,
        weight,
    }
}

fn waiting(id: &str, user: &str, tenant: &str, created: i64, backfill: bool) -> Waiting {
    Waiting {
        id: id.into(),
        user: user.into(),
        tenant: tenant.into(),
        gpu: true,
        created,
        backfill,
        gpus: 1,
        gpu_model: None,
    }
}

/// A job holding a slot, as the tests keep them.
#[derive(Debug, Clone)]
struct Running {
    id: String,
    user: String,
    tenant: String,
    gpu: bool,
    admitted: i64,
    backfill: bool,
}

fn holding(id: &str, user: &str, tenant: &str, admitted: i64, backfill: bool) -> Running {
    Running { id: id.into(), user: user.into(), tenant: tenant.into(), gpu: true, admitted, backfill }
}

/// A pass over `running` (its load and backfill jobs leaked: tests only).
fn pass<'a>(
    tenants: &'a [Tenant],
    queue: &'a [Waiting],
    running: &'a [Running],
    usage: &'a HashMap<String, f64>,
    gpu_slots: usize,
    now: i64,
) -> Pass<'a> {
    let load = load_of(running.iter().map(|job| (job.user.as_str(), job.tenant.as_str(), job.gpu, job.backfill)));
    let backfill: Vec<Holding> = running
        .iter()
        .filter(|job| job.backfill)
        .map(|job| Holding { id: job.id.clone(), tenant: job.tenant.clone(), gpu: job.gpu, admitted: job.admitted })
        .collect();
    Pass {
        tenants,
        queue,
        running: Box::leak(load.into_boxed_slice()),
        backfill: Box::leak(backfill.into_boxed_slice()),
        free_gpus: None,
        user_usage: usage,
        job_weight: 1.0,
        jobs_per_user: 1_000,
        cpu_slots: 0,
        gpu_slots,
        now,
        grace: 60,
        max_preemptions: 2,
    }
}

fn ids(admitted: &[(String, bool)]) -> Vec<&str> {
    admitted.iter().map(|(id, _)| id.as_str()).collect()
}

/// Tenants A, B, C with weights 1:2:1 and no guarantee share 100 GPU slots, every tenant with
/// more waiting than it could run: A and B from the start, C from the fourth pass; a quarter of
/// the running jobs end after each pass (picked by a fixed sequence). After ten passes each is
/// within 5 % of 25/50/25.
#[test]
fn weights_one_two_one_settle_within_five_percent_of_their_shares() {
    let tenants = [tenant("a", 0, 1, None), tenant("b", 0, 2, None), tenant("c", 0, 1, None)];
    let usage = HashMap::new();
    let mut running: Vec<Running> = Vec::new();
    let mut next_id = 0;
    let mut seed: u64 = 7;
    for round in 0..10 {
        let active: &[&str] = if round < 3 { &["a", "b"] } else { &["a", "b", "c"] };
        let queue: Vec<Waiting> = active
            .iter()
            .flat_map(|t| {
                (0..150)
                    .map(move |i| waiting(&format!("{t}-q{round}-{i}"), &format!("{t}-user{}", i % 10), t, i, false))
            })
            .collect();
        let decision = decide(&pass(&tenants, &queue, &running, &usage, 100, round));
        for (id, _) in &decision.admitted {
            let job = queue.iter().find(|job| job.id == *id).unwrap();
            running.push(holding(&format!("{id}-{next_id}"), &job.user, &job.tenant, round, false));
            next_id += 1;
        }
        assert_eq!(running.len(), 100, "the slots are used: round {round}");
        // A quarter of the running jobs end.
        for _ in 0..25 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let index = (seed >> 33) as usize % running.len();
            running.swap_remove(index);
        }
    }
    // The eleventh pass fills the slots the last quarter freed: the shares it leaves.
    let queue: Vec<Waiting> = ["a", "b", "c"]
        .iter()
        .flat_map(|t| (0..50).map(move |i| waiting(&format!("{t}-last-{i}"), "u", t, i, false)))
        .collect();
    let decision = decide(&Pass { jobs_per_user: 10_000, ..pass(&tenants, &queue, &running, &usage, 100, 11) });
    let mut used: HashMap<String, usize> = HashMap::new();
    for job in &running {
        *used.entry(job.tenant.clone()).or_default() += 1;
    }
    for (id, _) in &decision.admitted {
        *used.entry(id.split('-').next().unwrap().to_string()).or_default() += 1;
    }
    for (tenant, share) in [("a", 25), ("b", 50), ("c", 25)] {
        let got = used.get(tenant).copied().unwrap_or(0);
        assert!(got.abs_diff(share) <= 5, "{tenant}: {got} of 100, its share {share} ({used:?})");
    }
}

/// A tenant whose guarantee is free is served before older jobs of a tenant that has none.
#[test]
fn a_tenant_below_its_guarantee_is_served_first_in_the_next_pass() {
    let tenants = [tenant("x", 10, 1, None), tenant("y", 0, 1, None)];
    let running: Vec<Running> = (0..90).map(|i| holding(&format!("y{i}"), "yuser", "y", i, false)).collect();
    let mut queue: Vec<Waiting> = (0..50).map(|i| waiting(&format!("yq{i}"), "yuser", "y", i, false)).collect();
    queue.push(waiting("x-new", "xuser", "x", 1_000, false));
    let usage = HashMap::new();
    let decision = decide(&pass(&tenants, &queue, &running, &usage, 100, 1_000));
    assert_eq!(decision.admitted[0], ("x-new".to_string(), false), "first, on its guarantee");
    assert_eq!(decision.admitted.len(), 10);
    assert!(decision.admitted[1..].iter().all(|(id, lent)| id.starts_with("yq") && *lent));
    assert_eq!(decision.held.get("yq49"), Some(&Hold::Slots));
}

/// Its guarantee lent to backfill: nothing before the grace; then the youngest backfill jobs
/// are stopped (at most `max_preemptions` a pass), and its jobs start once the slots are free.
#[test]
fn a_guarantee_lent_to_backfill_is_reclaimed_after_the_grace() {
    let tenants = [tenant("x", 10, 1, None), tenant("y", 0, 1, None)];
    let mut running: Vec<Running> = (0..100).map(|i| holding(&format!("y{i:03}"), "yuser", "y", i, true)).collect();
    let queue: Vec<Waiting> = (0..3).map(|i| waiting(&format!("x{i}"), "xuser", "x", 1_000, false)).collect();
    let usage = HashMap::new();
    let early = decide(&pass(&tenants, &queue, &running, &usage, 100, 1_030));
    assert!(early.admitted.is_empty() && early.preempted.is_empty(), "{early:?}");
    assert_eq!(early.held.get("x0"), Some(&Hold::TenantQuota));
    let after = decide(&pass(&tenants, &queue, &running, &usage, 100, 1_060));
    assert_eq!(after.preempted, [("y099".to_string(), "x".to_string()), ("y098".to_string(), "x".to_string())]);
    assert!(after.admitted.is_empty(), "the stopped jobs' slots are not free yet");
    // They ended: x's jobs start on its guarantee, and one more backfill job is stopped.
    running.retain(|job| !after.preempted.iter().any(|(id, _)| *id == job.id));
    let next = decide(&pass(&tenants, &queue, &running, &usage, 100, 1_061));
    assert_eq!(ids(&next.admitted), ["x0", "x1"]);
    assert_eq!(next.preempted, [("y097".to_string(), "x".to_string())]);
}

/// A job that is not backfill is never stopped: the tenant waits for slots to free.
#[test]
fn a_job_that_is_not_backfill_is_never_stopped() {
    let tenants = [tenant("x", 10, 1, None), tenant("y", 0, 1, None)];
    let running: Vec<Running> = (0..100).map(|i| holding(&format!("y{i}"), "yuser", "y", i, false)).collect();
    let queue = [waiting("x0", "xuser", "x", 0, false)];
    let usage = HashMap::new();
    let decision = decide(&pass(&tenants, &queue, &running, &usage, 100, 1_000_000));
    assert!(decision.preempted.is_empty() && decision.admitted.is_empty());
    assert_eq!(decision.held.get("x0"), Some(&Hold::TenantQuota));
}

/// Borrowing stops at the tenant's cap; backfill runs on a guarantee nobody uses (as lent
/// capacity) and gives it back to its own tenant's jobs after the grace.
#[test]
fn borrowing_stops_at_the_cap_and_backfill_gives_back_an_idle_guarantee() {
    let tenants = [tenant("y", 0, 1, Some(20)), tenant("x", 5, 1, Some(0))];
    let mut queue: Vec<Waiting> = (0..50).map(|i| waiting(&format!("y{i:02}"), "yuser", "y", i, false)).collect();
    queue.extend((0..3).map(|i| waiting(&format!("xb{i}"), "xuser", "x", i, true)));
    let usage = HashMap::new();
    let decision = decide(&pass(&tenants, &queue, &[], &usage, 100, 0));
    assert_eq!(decision.admitted.iter().filter(|(id, _)| id.starts_with('y')).count(), 20);
    assert_eq!(decision.held.get("y49"), Some(&Hold::BorrowingCap));
    let backfill: Vec<&(String, bool)> = decision.admitted.iter().filter(|(id, _)| id.starts_with("xb")).collect();
    assert_eq!(backfill.len(), 3);
    assert!(backfill.iter().all(|(_, lent)| *lent), "backfill always runs on lent capacity");
    // On a full machine, x's own jobs take its guarantee back from its backfill after the grace.
    let mut running: Vec<Running> = (0..3).map(|i| holding(&format!("xb{i}"), "xuser", "x", i, true)).collect();
    running.extend((0..2).map(|i| holding(&format!("y{i}"), "yuser", "y", i, false)));
    let queue = [waiting("x-firm", "xuser", "x", 100, false)];
    let decision = decide(&pass(&tenants, &queue, &running, &usage, 5, 160));
    assert_eq!(decision.preempted, [("xb2".to_string(), "x".to_string())]);
}

/// Within a tenant, the user with the least recent usage goes first; each job admitted in the
/// pass adds `job_weight` to its user.
#[test]
fn within_a_tenant_users_go_by_their_decayed_usage() {
    let tenants = [tenant("t", 0, 1, None)];
    let queue = [
        waiting("heavy-old", "heavy", "t", 0, false),
        waiting("heavy-2", "heavy", "t", 1, false),
        waiting("light-1", "light", "t", 5, false),
        waiting("light-2", "light", "t", 6, false),
    ];
    let usage = HashMap::from([("heavy".to_string(), 100.0), ("light".to_string(), 0.0)]);
    let small = Pass { job_weight: 60.0, ..pass(&tenants, &queue, &[], &usage, 2, 0) };
    assert_eq!(ids(&decide(&small).admitted), ["light-1", "light-2"]);
    let large = Pass { job_weight: 200.0, ..pass(&tenants, &queue, &[], &usage, 2, 0) };
    assert_eq!(ids(&decide(&large).admitted), ["light-1", "heavy-old"]);
    // Ties: the oldest job, then the id.
    let even = HashMap::new();
    assert_eq!(ids(&decide(&pass(&tenants, &queue, &[], &even, 1, 0)).admitted), ["heavy-old"]);
}

/// The per-user cap and the global slots hold whatever the shares say; CPU and GPU slots are
/// counted apart.
#[test]
fn user_caps_and_slots_still_hold() {
    let tenants = [tenant("t", 50, 1, None)];
    let mut queue: Vec<Waiting> = (0..5).map(|i| waiting(&format!("a{i}"), "alice", "t", i, false)).collect();
    queue.push(Waiting { gpu: false, ..waiting("cpu1", "bob", "t", 0, false) });
    queue.push(Waiting { gpu: false, ..waiting("cpu2", "bob", "t", 1, false) });
    let running = [holding("a-running", "alice", "t", 0, false)];
    let usage = HashMap::new();
    let decision = decide(&Pass { jobs_per_user: 3, cpu_slots: 1, ..pass(&tenants, &queue, &running, &usage, 100, 0) });
    assert_eq!(ids(&decision.admitted), ["cpu1", "a0", "a1"]);
    assert_eq!(decision.held.get("a2"), Some(&Hold::UserCap));
    assert_eq!(decision.held.get("cpu2"), Some(&Hold::Slots), "no CPU slot free, no CPU guarantee");
}

/// Without tenants it is fair share between users: with no usage yet, oldest first and one job
/// per user before anyone's second (each admission weighs on its user).
#[test]
fn without_tenants_users_take_turns_oldest_first() {
    let cpu =
        |id: &str, user: &str, created| Waiting { gpu: false, gpus: 0, ..waiting(id, user, NO_TENANT, created, false) };
    let queue = [cpu("a1", "a", 1), cpu("a2", "a", 2), cpu("a3", "a", 3), cpu("b1", "b", 5)];
    let usage = HashMap::new();
    let decision = decide(&Pass { cpu_slots: 3, ..pass(&[], &queue, &[], &usage, 0, 0) });
    assert_eq!(ids(&decision.admitted), ["a1", "b1", "a2"]);
    assert_eq!(decision.held.get("a3"), Some(&Hold::Slots));
    // A user with recent usage (a) goes after one without.
    let heavy = HashMap::from([("a".to_string(), 10.0)]);
    let decision = decide(&Pass { cpu_slots: 1, ..pass(&[], &queue, &[], &heavy, 0, 0) });
    assert_eq!(ids(&decision.admitted), ["b1"]);
}

/// Where the runner lends the machine's own GPUs, a GPU job waits for enough free GPUs of its
/// model; the jobs behind it that fit go first; without a list (Kubernetes) slots decide.
#[test]
fn where_gpus_are_lent_a_gpu_job_waits_for_enough_free_gpus_of_its_model() {
    let usage = HashMap::new();
    let two = |id: &str, user: &str, created| Waiting { gpus: 2, ..waiting(id, user, NO_TENANT, created, false) };
    let l40s = |id: &str, user: &str, created| Waiting {
        gpu_model: Some("l40s".into()),
        ..waiting(id, user, NO_TENANT, created, false)
    };
    let any = |id: &str, user: &str, created| waiting(id, user, NO_TENANT, created, false);
    let run = |queue: &[Waiting], free: Option<&[&str]>| {
        let free: Option<Vec<String>> = free.map(|models| models.iter().map(|m| m.to_string()).collect());
        let free = free.map(|f| &*Box::leak(f.into_boxed_slice()));
        decide(&Pass { free_gpus: free, ..pass(&[], queue, &[], &usage, 4, 0) })
    };
    // One GPU free: the two-GPU job waits (for its GPUs), the one-GPU job behind it runs.
    let queue = [two("g2", "a", 1), any("g1", "b", 2)];
    let decision = run(&queue, Some(&["NVIDIA H200"]));
    assert_eq!(ids(&decision.admitted), ["g1"]);
    assert_eq!(decision.held.get("g2"), Some(&Hold::GpuModel));
    // Two free: the older two-GPU job takes both, the other waits.
    assert_eq!(ids(&run(&queue, Some(&["NVIDIA H200", "NVIDIA H200"])).admitted), ["g2"]);
    // A model: only a GPU of that model serves it.
    let queue = [l40s("m1", "a", 1), any("g1", "b", 2)];
    assert_eq!(ids(&run(&queue, Some(&["NVIDIA H200"])).admitted), ["g1"]);
    assert_eq!(ids(&run(&queue, Some(&["NVIDIA H200", "NVIDIA L40S"])).admitted), ["m1", "g1"]);
    assert_eq!(ids(&run(&queue, Some(&["NVIDIA L40S"])).admitted), ["m1"]);
    // No GPU free: none of them.
    assert!(run(&queue, Some(&[])).admitted.is_empty());
    // Without a list (Kubernetes), slots alone decide.
    assert_eq!(ids(&run(&[two("g2", "a", 1)], None).admitted), ["g2"]);
}

/// Usage halves per half-life: an hour's run an hour ago weighs half an hour's run now; the
/// order it gives puts the user who ran long ago before the one who ran just now.
#[test]
fn usage_decays_by_the_half_life() {
    let hour = 3_600_000_000i64;
    let bucket = hour / 8;
    let now = 10 * hour;
    // alice ran 60 minutes that ended an hour ago, bob 40 minutes that just ended.
    let rows =
        vec![("alice".to_string(), (now - hour) / bucket, 3_600_000), ("bob".to_string(), now / bucket - 1, 2_400_000)];
    let usage = decayed(&rows, bucket, hour, now);
    let alice = usage["alice"];
    assert!((alice - 3_600_000.0 * 0.5f64.powf(1.0 - 1.0 / 16.0)).abs() < 1.0, "{usage:?}");
    assert!(usage["bob"] > alice, "{usage:?}");
    // Halved again after another half-life; nothing left to speak of after ten.
    let later = decayed(&rows, bucket, hour, now + hour);
    assert!((later["alice"] * 2.0 - alice).abs() < 1.0, "{later:?}");
    assert!(decayed(&rows, bucket, hour, now + 10 * hour)["alice"] < alice / 1000.0);
    // In a pass, alice (less decayed usage) goes first.
    let queue = [waiting("b", "bob", "t", 0, false), waiting("a", "alice", "t", 1, false)];
    assert_eq!(ids(&decide(&pass(&[tenant("t", 0, 1, None)], &queue, &[], &usage, 1, 0)).admitted), ["a"]);
}

/// A GPU guarantee of one model: only the tenant's jobs asking for that model are served first
/// and count toward it; its other GPU jobs borrow like anyone's.
#[test]
fn a_gpu_guarantee_of_one_model_serves_only_that_model_first() {
    let h200 = Tenant { gpu_model: Some("h200".into()), ..tenant("x", 2, 1, None) };
    let tenants = [h200, tenant("y", 0, 1, None)];
    let model = |id: &str, user: &str, tenant: &str, created, model: &str| Waiting {
        gpu_model: Some(model.into()),
        ..waiting(id, user, tenant, created, false)
    };
    // y's older jobs wait; of x's, the H200 ones start first on its guarantee, the L40S one only
    // on what is lent.
    let queue = [
        waiting("y1", "yuser", "y", 0, false),
        model("x-l40s", "xuser", "x", 1, "l40s"),
        model("x-h200-a", "xuser", "x", 2, "h200"),
        model("x-h200-b", "xuser2", "x", 3, "h200"),
    ];
    let usage = HashMap::new();
    let decision = decide(&pass(&tenants, &queue, &[], &usage, 3, 0));
    assert_eq!(decision.admitted[..2], [("x-h200-a".to_string(), false), ("x-h200-b".to_string(), false)]);
    assert_eq!(decision.admitted.len(), 3, "{decision:?}");
    assert_eq!(decision.held.len(), 1, "{decision:?}");
    // Its L40S job running does not fill the H200 guarantee: an H200 job is still below it.
    let running = [Running { id: "l".into(), ..holding("l", "xuser", "x", 0, false) }];
    let load = vec![Load {
        user: "xuser".into(),
        tenant: "x".into(),
        gpu: true,
        backfill: false,
        gpu_model: Some("l40s".into()),
        count: 1,
    }];
    let queue = [model("x-h200", "xuser2", "x", 5, "h200"), waiting("y2", "yuser", "y", 0, false)];
    let decision = decide(&Pass { running: &load, ..pass(&tenants, &queue, &running, &usage, 2, 0) });
    assert_eq!(decision.admitted, [("x-h200".to_string(), false)], "{decision:?}");
}
