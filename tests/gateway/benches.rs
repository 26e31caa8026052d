//! Benchmarks, not tests: each is `#[ignore]`d and run by its script under `bench/` (see
//! docs/benchmarks.md), printing its figures on `BENCH` or `SOAK` lines.

pub mod controller;
pub mod soak;

/// CPU seconds (user and system) a process has used so far: `self` or a pid.
pub(crate) fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces); utime and stime are the 14th and 15th.
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default().split_whitespace().collect();
    let ticks: u64 = fields.get(11..13).map(|f| f.iter().filter_map(|t| t.parse::<u64>().ok()).sum()).unwrap_or(0);
    // The kernel's USER_HZ is 100 on every Linux architecture this runs on.
    ticks as f64 / 100.0
}
