//! Waiting for a condition, the one way the suite does it: `eventually` runs a check again and
//! again until it gives a value, or fails once a time limit has passed, naming what it waited
//! for, how long it waited and the last state the check saw.
//!
//! A check answers `Ok(value)` when the condition holds and `Err(state)` when it does not yet,
//! `state` (anything `Display`) being what the failure should show: the job, the objects left.
//! `until` is the form for a plain yes or no. A check may also assert what must hold at every
//! round: its panic fails the test at once. The `_blocking` forms are for code that does not run
//! on the runtime (a `#[test] fn`, a synchronous helper); `eventually_every` is for the few waits
//! where how often the check runs matters.

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

/// How often `eventually`, `until` and their blocking forms run their check.
pub const EVERY: Duration = Duration::from_millis(50);

/// Runs `check` every 50 ms until it answers `Ok`, and returns that value. Once `within` has
/// passed, panics with `what` (the condition awaited), the time waited and the last `Err`.
pub async fn eventually<T, E: Display, F>(what: &str, within: Duration, check: impl FnMut() -> F) -> T
where
    F: Future<Output = Result<T, E>>,
{
    eventually_every(what, within, EVERY, check).await
}

/// `eventually`, with the check run every `every` (where how often it looks matters: a check
/// that also asserts what must hold at each round, or one that measures how soon it held).
pub async fn eventually_every<T, E: Display, F>(
    what: &str,
    within: Duration,
    every: Duration,
    mut check: impl FnMut() -> F,
) -> T
where
    F: Future<Output = Result<T, E>>,
{
    let started = Instant::now();
    loop {
        match check().await {
            Ok(value) => return value,
            Err(last) if started.elapsed() >= within => timed_out(what, within, started, &last),
            Err(_) => tokio::time::sleep(every).await,
        }
    }
}

/// Waits (checking every 50 ms) until `condition` holds; once `within` has passed, panics with
/// `what` and the time waited.
pub async fn until<F>(what: &str, within: Duration, mut condition: impl FnMut() -> F)
where
    F: Future<Output = bool>,
{
    eventually(what, within, || {
        let holds = condition();
        async move { if holds.await { Ok(()) } else { Err("") } }
    })
    .await
}

/// `eventually` for synchronous code: the thread sleeps between checks.
#[track_caller]
pub fn eventually_blocking<T, E: Display>(what: &str, within: Duration, mut check: impl FnMut() -> Result<T, E>) -> T {
    let started = Instant::now();
    loop {
        match check() {
            Ok(value) => return value,
            Err(last) if started.elapsed() >= within => timed_out(what, within, started, &last),
            Err(_) => std::thread::sleep(EVERY),
        }
    }
}

/// `until` for synchronous code: the thread sleeps between checks.
#[track_caller]
pub fn until_blocking(what: &str, within: Duration, mut condition: impl FnMut() -> bool) {
    eventually_blocking(what, within, || if condition() { Ok(()) } else { Err("") })
}

#[track_caller]
fn timed_out(what: &str, within: Duration, started: Instant, last: &dyn Display) -> ! {
    let waited = started.elapsed();
    let last = last.to_string();
    if last.is_empty() {
        panic!("{what}: not within {within:?} (waited {waited:.1?})");
    }
    panic!("{what}: not within {within:?} (waited {waited:.1?}); last seen: {last}")
}

#[tokio::test]
async fn eventually_returns_the_first_value_the_check_gives() {
    let mut rounds = 0;
    let value = eventually("the third round", Duration::from_secs(5), || {
        rounds += 1;
        let round = rounds;
        async move { if round == 3 { Ok(round * 10) } else { Err(format!("round {round}")) } }
    })
    .await;
    assert_eq!((value, rounds), (30, 3));
}

#[tokio::test]
async fn eventually_fails_naming_what_it_waited_for_how_long_and_the_last_state() {
    use futures::FutureExt;
    let mut rounds = 0;
    let waiting = eventually("a value", Duration::from_millis(200), || {
        rounds += 1;
        let round = rounds;
        async move { Err::<(), _>(format!("still nothing at round {round}")) }
    });
    let panic = std::panic::AssertUnwindSafe(waiting).catch_unwind().await.expect_err("it times out");
    let message = panic.downcast::<String>().expect("a formatted message");
    assert!(message.starts_with("a value: not within 200ms (waited "), "{message}");
    assert!(message.ends_with(&format!("; last seen: still nothing at round {rounds}")), "{message}");
    assert!(rounds > 1, "checked again until the time was up: {rounds} round(s)");
}

#[test]
#[should_panic(expected = "never: not within 100ms")]
fn until_blocking_fails_once_its_time_is_up() {
    until_blocking("never", Duration::from_millis(100), || false);
}
