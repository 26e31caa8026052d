//! The wake-ups reconciles ask for (a pending pod's deadline, a running job's minute, a finished
//! job's keep window), kept compact: one due time per resource name, not an entry of
//! kube-runtime's scheduler per timer. Its entries (the request twice, about 800 bytes) held
//! every pending job's deadline for its whole wait: tens of MB at 100,000 jobs
//! (`bench/controller.sh tenants`). A reconcile's plan stands for its resource, so the wake-up it
//! asks for replaces the one asked before; a wake-up no longer wanted costs a reconcile that
//! finds nothing to do.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use tokio::time::Instant;

/// Due times by resource name.
#[derive(Default)]
pub struct Timers {
    state: Mutex<State>,
    /// Told when a wake-up became the earliest.
    sooner: tokio::sync::Notify,
}

#[derive(Default)]
struct State {
    /// Each name's current due time.
    due: HashMap<Arc<str>, Instant>,
    /// (due time, name), earliest first; an entry whose time is no longer its name's is stale.
    queue: BinaryHeap<Reverse<(Instant, Arc<str>)>>,
}

impl Timers {
    /// Wakes the resource `name` once `after` has passed, instead of any wake-up asked before.
    pub fn wake_in(&self, name: &str, after: Duration) {
        let at = Instant::now() + after;
        let mut state = self.lock();
        let name: Arc<str> = match state.due.get_key_value(name) {
            Some((key, _)) => Arc::clone(key),
            None => Arc::from(name),
        };
        state.due.insert(Arc::clone(&name), at);
        let earliest = state.queue.peek().is_none_or(|Reverse((first, _))| at < *first);
        state.queue.push(Reverse((at, name)));
        // Stale entries are dropped as they come due; a queue mostly stale is rebuilt.
        if state.queue.len() > 2 * state.due.len() + 1024 {
            let fresh: BinaryHeap<_> = state.due.iter().map(|(name, at)| Reverse((*at, Arc::clone(name)))).collect();
            state.queue = fresh;
        }
        drop(state);
        if earliest {
            self.sooner.notify_one();
        }
    }

    /// Forgets the resource's wake-up (it is gone).
    pub fn forget(&self, name: &str) {
        self.lock().due.remove(name);
    }

    /// How many resources have a wake-up.
    pub fn len(&self) -> usize {
        self.lock().due.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The names whose wake-ups are due now, each once, removed.
    fn take_due(&self, now: Instant) -> (Vec<Arc<str>>, Option<Instant>) {
        let mut state = self.lock();
        let mut names = Vec::new();
        while let Some(Reverse((at, _))) = state.queue.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((at, name))) = state.queue.pop() else { break };
            if state.due.get(&name) == Some(&at) {
                state.due.remove(&name);
                names.push(name);
            }
        }
        let next = state.queue.peek().map(|Reverse((at, _))| *at);
        (names, next)
    }

    /// The names as they come due, for as long as the stream is read.
    pub fn due(self: Arc<Self>) -> impl Stream<Item = Arc<str>> + Send {
        futures::stream::unfold(self, |timers| async move {
            loop {
                let (names, next) = timers.take_due(Instant::now());
                if !names.is_empty() {
                    return Some((futures::stream::iter(names), timers));
                }
                let sooner = timers.sooner.notified();
                match next {
                    Some(at) => {
                        tokio::select! {
                            () = tokio::time::sleep_until(at) => {}
                            () = sooner => {}
                        }
                    }
                    None => sooner.await,
                }
            }
        })
        .flatten()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn next(stream: &mut (impl Stream<Item = Arc<str>> + Unpin)) -> String {
        stream.next().await.unwrap().to_string()
    }

    #[tokio::test(start_paused = true)]
    async fn wake_ups_come_due_in_order_once_each() {
        let timers = Arc::new(Timers::default());
        timers.wake_in("b", Duration::from_secs(20));
        timers.wake_in("a", Duration::from_secs(10));
        let mut due = Box::pin(Arc::clone(&timers).due());
        let started = Instant::now();
        assert_eq!(next(&mut due).await, "a");
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        assert_eq!(next(&mut due).await, "b");
        assert_eq!(started.elapsed(), Duration::from_secs(20));
        assert!(timers.is_empty());
        // Nothing more: the stream waits.
        assert!(tokio::time::timeout(Duration::from_secs(3600), due.next()).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_wake_up_asked_for_replaces_the_earlier_ones() {
        let timers = Arc::new(Timers::default());
        timers.wake_in("job", Duration::from_secs(60));
        timers.wake_in("job", Duration::from_secs(5));
        timers.wake_in("other", Duration::from_secs(30));
        timers.wake_in("job", Duration::from_secs(600));
        assert_eq!(timers.len(), 2);
        let mut due = Box::pin(Arc::clone(&timers).due());
        let started = Instant::now();
        assert_eq!(next(&mut due).await, "other");
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        assert_eq!(next(&mut due).await, "job");
        assert_eq!(started.elapsed(), Duration::from_secs(600), "neither the 5 s nor the 60 s wake-up came");
    }

    #[tokio::test(start_paused = true)]
    async fn a_sooner_wake_up_asked_while_waiting_is_not_held_behind_a_later_one() {
        let timers = Arc::new(Timers::default());
        timers.wake_in("late", Duration::from_secs(3600));
        let mut due = Box::pin(Arc::clone(&timers).due());
        let started = Instant::now();
        let asker = Arc::clone(&timers);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            asker.wake_in("soon", Duration::from_secs(2));
        });
        assert_eq!(next(&mut due).await, "soon");
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_forgotten_wake_up_never_comes_and_stale_entries_stay_bounded() {
        let timers = Arc::new(Timers::default());
        timers.wake_in("gone", Duration::from_secs(1));
        timers.forget("gone");
        for round in 0..10_000u64 {
            timers.wake_in("busy", Duration::from_secs(100 + round));
        }
        let queued = timers.lock().queue.len();
        let due = timers.len();
        assert!(queued <= 2 * due + 1024 + 1, "{queued} entries for {due} wake-ups");
        let mut due = Box::pin(Arc::clone(&timers).due());
        let started = Instant::now();
        assert_eq!(next(&mut due).await, "busy");
        assert_eq!(started.elapsed(), Duration::from_secs(100 + 9_999));
    }
}
