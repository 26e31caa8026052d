//! The usage ledger's arithmetic (issue 47): what a runner gave a job (`Allocation`, from the
//! Kubernetes quantities of its resources), and what a job's ending is metered as (`Figures`):
//! its wait and run time in milliseconds and the allocation over its run time. Pure: the
//! database writes the figures in the transaction of the job's terminal move.

use chrono::{Datelike, NaiveDate};

use super::sizes::{Resources, memory_bytes};

/// Microseconds in a day: the kept counts and the usage ledger count days of UTC.
pub const DAY_MICROS: i64 = 86_400_000_000;

/// The day (since the Unix epoch, UTC) of the time `micros` (microseconds since the epoch).
pub fn day_of(micros: i64) -> i64 {
    micros.div_euclid(DAY_MICROS)
}

/// `NaiveDate::from_ymd(1970, 1, 1).num_days_from_ce()`.
const EPOCH_DAYS_FROM_CE: i32 = 719_163;

/// A date (`YYYY-MM-DD`, UTC) as days since the Unix epoch: the ledger's day numbers.
pub fn day_number(text: &str) -> Option<i64> {
    NaiveDate::parse_from_str(text.trim(), "%Y-%m-%d")
        .ok()
        .map(|date| i64::from(date.num_days_from_ce() - EPOCH_DAYS_FROM_CE))
}

/// The date of a day number (`YYYY-MM-DD`), or the number itself when no date has it.
pub fn date_of(day: i64) -> String {
    let days = i32::try_from(day).ok().and_then(|d| d.checked_add(EPOCH_DAYS_FROM_CE));
    days.and_then(NaiveDate::from_num_days_from_ce_opt).map_or_else(|| day.to_string(), |date| date.to_string())
}

/// The first day of the month of day `day`, and of the month after: a budget's period and the
/// default period of the totals.
pub fn month_of(day: i64) -> (i64, i64) {
    let date = i32::try_from(day).ok().and_then(|d| d.checked_add(EPOCH_DAYS_FROM_CE));
    let Some(date) = date.and_then(NaiveDate::from_num_days_from_ce_opt) else { return (day, day + 1) };
    let first = date.with_day(1).unwrap_or(date);
    let next = first.checked_add_months(chrono::Months::new(1)).unwrap_or(first);
    let number = |d: NaiveDate| i64::from(d.num_days_from_ce() - EPOCH_DAYS_FROM_CE);
    (number(first), number(next))
}

/// The whole months inside the days `[from, to)`, as `[first, end)` (first days of months);
/// `(to, to)` when no month is whole in it. A period's totals read those months' sums
/// (`usage_by_month`) and its other days' (`usage_by_day`).
pub fn whole_months(from: i64, to: i64) -> (i64, i64) {
    let (start, next) = month_of(from);
    let first = if start == from { from } else { next };
    let end = month_of(to).0;
    if first < end { (first, end) } else { (to, to) }
}

/// What a runner gave a job when it started it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Allocation {
    /// The compute profile of the job's size, when its function's catalog names one.
    pub compute_profile: Option<String>,
    /// CPU in thousandths of a core.
    pub cpu_millis: i64,
    pub memory_mib: i64,
    pub gpus: i64,
    pub gpu_model: Option<String>,
}

impl Allocation {
    /// The allocation of `resources` (a pod's or a container's), of profile `profile`. A
    /// quantity that cannot be read counts as none.
    pub fn of(resources: &Resources, profile: Option<&str>) -> Allocation {
        Allocation {
            compute_profile: profile.map(str::to_string),
            cpu_millis: cpu_millis(&resources.cpu).unwrap_or(0),
            memory_mib: memory_bytes(&resources.memory)
                .map_or(0, |bytes| i64::try_from(bytes >> 20).unwrap_or(i64::MAX)),
            gpus: i64::from(resources.gpus),
            gpu_model: resources.gpu_model.clone(),
        }
    }
}

/// A Kubernetes CPU quantity in thousandths of a core: `2` is 2000, `1.5` is 1500, `250m` is 250.
pub fn cpu_millis(quantity: &str) -> Option<i64> {
    let quantity = quantity.trim();
    if let Some(millis) = quantity.strip_suffix('m') {
        return millis.parse::<i64>().ok().filter(|m| *m >= 0);
    }
    let cores: f64 = quantity.parse().ok().filter(|c: &f64| c.is_finite() && *c >= 0.0)?;
    let millis = (cores * 1000.0).round();
    (millis <= i64::MAX as f64).then_some(millis as i64)
}

/// A job's times and allocation as its terminal move sees them (microseconds since the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ending {
    pub created: i64,
    /// When it first moved into RUNNING; `None`: it never ran.
    pub running_since: Option<i64>,
    pub ended: i64,
    pub cpu_millis: Option<i64>,
    pub memory_mib: Option<i64>,
    pub gpus: Option<i64>,
}

/// What a job's ending is metered as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Figures {
    /// Created to RUNNING, or to its end when it never ran.
    pub wait_ms: i64,
    /// RUNNING to its end; 0 when it never ran.
    pub run_ms: i64,
    /// Cores × run milliseconds.
    pub cpu_core_ms: i64,
    /// GiB × run milliseconds.
    pub gib_ms: i64,
    /// GPUs × run milliseconds.
    pub gpu_ms: i64,
}

impl Figures {
    /// The figures of a job's ending. A clock that went back counts as no time.
    pub fn of(ending: &Ending) -> Figures {
        let millis = |from: i64, to: i64| (to.saturating_sub(from) / 1000).max(0);
        let wait_ms = millis(ending.created, ending.running_since.unwrap_or(ending.ended));
        let run_ms = ending.running_since.map_or(0, |since| millis(since, ending.ended));
        let times = |per: Option<i64>, divisor: i128| {
            let product = i128::from(run_ms) * i128::from(per.unwrap_or(0).max(0)) / divisor;
            i64::try_from(product).unwrap_or(i64::MAX)
        };
        Figures {
            wait_ms,
            run_ms,
            cpu_core_ms: times(ending.cpu_millis, 1000),
            gib_ms: times(ending.memory_mib, 1024),
            gpu_ms: times(ending.gpus, 1),
        }
    }

    /// These figures and `other`'s summed (saturating).
    pub fn plus(self, other: Figures) -> Figures {
        Figures {
            wait_ms: self.wait_ms.saturating_add(other.wait_ms),
            run_ms: self.run_ms.saturating_add(other.run_ms),
            cpu_core_ms: self.cpu_core_ms.saturating_add(other.cpu_core_ms),
            gib_ms: self.gib_ms.saturating_add(other.gib_ms),
            gpu_ms: self.gpu_ms.saturating_add(other.gpu_ms),
        }
    }
}

/// Milliseconds in an hour: budgets are set and shown in CPU-hours and GPU-hours.
pub const HOUR_MS: i64 = 3_600_000;

/// The limit of a budget that `used` reached, if one did: which (`"CPU"` or `"GPU"`), the
/// limit and what was used (core- or GPU-milliseconds). A run past it is refused.
pub fn spent(cpu_core_ms: Option<i64>, gpu_ms: Option<i64>, used: &Figures) -> Option<(&'static str, i64, i64)> {
    if let Some(limit) = cpu_core_ms
        && used.cpu_core_ms >= limit
    {
        return Some(("CPU", limit, used.cpu_core_ms));
    }
    gpu_ms.filter(|limit| used.gpu_ms >= *limit).map(|limit| ("GPU", limit, used.gpu_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: i64 = 1_000_000;

    #[test]
    fn a_period_holds_the_whole_months_between_its_ends() {
        let day = |text: &str| day_number(text).unwrap();
        // A year up to yesterday: eleven whole months between two parts of months.
        assert_eq!(whole_months(day("2025-11-29"), day("2026-11-28")), (day("2025-12-01"), day("2026-11-01")));
        // Ends on months' first days: those months are whole.
        assert_eq!(whole_months(day("2026-01-01"), day("2026-03-01")), (day("2026-01-01"), day("2026-03-01")));
        assert_eq!(whole_months(day("2026-01-01"), day("2026-02-01")), (day("2026-01-01"), day("2026-02-01")));
        // No whole month: the period's end, twice.
        assert_eq!(whole_months(day("2026-01-01"), day("2026-01-31")), (day("2026-01-31"), day("2026-01-31")));
        assert_eq!(whole_months(day("2026-01-15"), day("2026-02-14")), (day("2026-02-14"), day("2026-02-14")));
        assert_eq!(whole_months(day("2026-01-15"), day("2026-01-15")), (day("2026-01-15"), day("2026-01-15")));
    }

    #[test]
    fn days_are_counted_from_the_epoch_and_months_bound_a_period() {
        assert_eq!(day_number("1970-01-01"), Some(0));
        assert_eq!(day_number("2026-11-29"), Some(20_786));
        assert_eq!(date_of(20_786), "2026-11-29");
        assert_eq!(month_of(20_786), (day_number("2026-11-01").unwrap(), day_number("2026-12-01").unwrap()));
        assert_eq!(month_of(day_number("2026-12-31").unwrap()).1, day_number("2027-01-01").unwrap());
        assert_eq!(day_number("2026-13-01"), None);
        assert_eq!(date_of(i64::MAX), i64::MAX.to_string());
    }

    #[test]
    fn cpu_quantities_read_as_thousandths_of_a_core() {
        assert_eq!(cpu_millis("2"), Some(2000));
        assert_eq!(cpu_millis("1.5"), Some(1500));
        assert_eq!(cpu_millis("250m"), Some(250));
        assert_eq!(cpu_millis("0"), Some(0));
        for bad in ["", "two", "-1", "-5m", "1.5m", "NaN", "inf"] {
            assert_eq!(cpu_millis(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_allocation_reads_its_resources() {
        let resources = Resources { cpu: "4".into(), memory: "16Gi".into(), gpus: 2, gpu_model: Some("l40s".into()) };
        let allocation = Allocation::of(&resources, Some("gpu-4x16x2l40s"));
        assert_eq!(
            allocation,
            Allocation {
                compute_profile: Some("gpu-4x16x2l40s".into()),
                cpu_millis: 4000,
                memory_mib: 16 * 1024,
                gpus: 2,
                gpu_model: Some("l40s".into())
            }
        );
        let unreadable = Resources { cpu: "lots".into(), memory: "much".into(), gpus: 0, gpu_model: None };
        assert_eq!(Allocation::of(&unreadable, None), Allocation::default());
    }

    #[test]
    fn a_job_that_ran_is_metered_from_running_to_its_end() {
        let ending = Ending {
            created: 100 * SECOND,
            running_since: Some(103 * SECOND),
            ended: 113 * SECOND + 500_000,
            cpu_millis: Some(1500),
            memory_mib: Some(2048),
            gpus: Some(1),
        };
        let figures = Figures::of(&ending);
        assert_eq!(
            figures,
            Figures { wait_ms: 3000, run_ms: 10_500, cpu_core_ms: 15_750, gib_ms: 21_000, gpu_ms: 10_500 }
        );
    }

    #[test]
    fn a_job_that_never_ran_waited_until_its_end_and_used_nothing() {
        let ending = Ending {
            created: 5 * SECOND,
            running_since: None,
            ended: 65 * SECOND,
            cpu_millis: None,
            memory_mib: None,
            gpus: None,
        };
        assert_eq!(Figures::of(&ending), Figures { wait_ms: 60_000, ..Figures::default() });
    }

    #[test]
    fn a_clock_that_went_back_counts_no_time_and_huge_figures_saturate() {
        let back = Ending {
            created: 10 * SECOND,
            running_since: Some(9 * SECOND),
            ended: 8 * SECOND,
            cpu_millis: Some(1000),
            memory_mib: None,
            gpus: None,
        };
        assert_eq!(Figures::of(&back), Figures::default());
        let huge = Ending {
            created: 0,
            running_since: Some(0),
            ended: i64::MAX,
            cpu_millis: Some(i64::MAX),
            memory_mib: None,
            gpus: Some(8),
        };
        let figures = Figures::of(&huge);
        assert_eq!(figures.cpu_core_ms, i64::MAX);
        let most = Figures { run_ms: i64::MAX, ..Figures::default() };
        assert_eq!(most.plus(figures).run_ms, i64::MAX);
    }

    #[test]
    fn a_budget_is_spent_once_its_use_reaches_its_limit() {
        let used = Figures { cpu_core_ms: 10 * HOUR_MS, gpu_ms: HOUR_MS, ..Figures::default() };
        assert_eq!(spent(None, None, &used), None);
        assert_eq!(spent(Some(11 * HOUR_MS), Some(2 * HOUR_MS), &used), None);
        assert_eq!(spent(Some(10 * HOUR_MS), None, &used), Some(("CPU", 10 * HOUR_MS, 10 * HOUR_MS)));
        assert_eq!(spent(Some(20 * HOUR_MS), Some(HOUR_MS / 2), &used), Some(("GPU", HOUR_MS / 2, HOUR_MS)));
        // A budget of nothing refuses every run.
        assert_eq!(spent(Some(0), None, &Figures::default()), Some(("CPU", 0, 0)));
    }
}
