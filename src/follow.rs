//! Following a job live: its events as they are recorded, its log as it grows. However many
//! clients follow one job, one task reads the source (the database, the log) and shares what it
//! read through a `watch` channel; the task ends when the job ends or its last follower leaves.
//!
//! A log hub keeps only a window of the newest bytes (`LOG_WINDOW`); a follower that is further
//! behind (it started from the beginning of a long log, or its client reads slowly) catches up
//! from the source itself, in bounded steps, until it is inside the window again.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::sync::watch;

use crate::compute::Compute;
use crate::db::{Db, jobs};
use crate::domain::lifecycle::JobStatus;
use crate::storage::{Storage, keys};

/// Newest log bytes a hub keeps for its followers.
pub const LOG_WINDOW: usize = 1024 * 1024;
/// Largest piece of log handed to a follower at once.
pub const LOG_PIECE: usize = 64 * 1024;
/// Events read from the database per poll.
const EVENTS_PER_READ: i64 = 1000;

/// The events of one job read so far.
#[derive(Debug, Default)]
pub struct EventsSeen {
    pub events: Vec<Arc<jobs::EventRow>>,
    /// The job has ended (or is gone) and every event it will have is in `events`.
    pub finished: bool,
}

/// The newest part of one job's log read so far.
#[derive(Debug, Default)]
pub struct LogSeen {
    /// Pieces (offset, bytes), contiguous, ending at `end`; at most about `LOG_WINDOW` bytes.
    pub pieces: VecDeque<(u64, Bytes)>,
    /// Bytes of log read so far.
    pub end: u64,
    /// The job has ended (or is gone) and the log is complete up to `end`.
    pub finished: bool,
}

impl LogSeen {
    /// Where the window starts.
    pub fn start(&self) -> u64 {
        self.pieces.front().map(|(offset, _)| *offset).unwrap_or(self.end)
    }

    /// The window's bytes from `from` (inside the window) on, at most `LOG_PIECE` of them.
    pub fn piece_from(&self, from: u64) -> Option<Bytes> {
        self.pieces.iter().find_map(|(offset, bytes)| {
            let end = offset + bytes.len() as u64;
            (from >= *offset && from < end).then(|| {
                let start = (from - offset) as usize;
                bytes.slice(start..bytes.len().min(start + LOG_PIECE))
            })
        })
    }
}

/// A hub's shared state: followers hold it, the registry only a weak reference.
pub struct Hub<T> {
    pub seen: watch::Receiver<Arc<T>>,
}

type Registry<K, T> = Mutex<HashMap<K, Weak<Hub<T>>>>;

/// The live hubs of one gateway process.
pub struct Follows {
    events: Registry<String, EventsSeen>,
    logs: Registry<(String, bool), LogSeen>,
    poll: Duration,
    /// Set once the server begins a graceful shutdown: every stream then ends at once with a
    /// `restarting` event, so clients reconnect (to another replica, or this one restarted)
    /// instead of holding a connection the shutdown would cut at the end of its grace.
    draining: watch::Sender<bool>,
}

impl Default for Follows {
    fn default() -> Self {
        Follows::new(Duration::from_millis(500))
    }
}

impl Follows {
    /// Hubs that look for news every `poll`.
    pub fn new(poll: Duration) -> Follows {
        Follows { events: Mutex::default(), logs: Mutex::default(), poll, draining: watch::Sender::new(false) }
    }

    /// The server is shutting down: the streams end (`draining` resolves for each).
    pub fn drain(&self) {
        self.draining.send_replace(true);
    }

    /// Whether `drain` was called.
    pub fn is_draining(&self) -> bool {
        *self.draining.borrow()
    }

    /// Resolves once `drain` is called (at once if it was).
    pub fn draining(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut receiver = self.draining.subscribe();
        async move {
            // An error means the Follows is gone: no stream of it outlives that.
            let _ = receiver.wait_for(|draining| *draining).await;
        }
    }

    /// Follows the events of `job_id`, joining the hub if there is one.
    pub fn events(&self, db: &Db, job_id: &str) -> Arc<Hub<EventsSeen>> {
        let (db, poll, id) = (db.clone(), self.poll, job_id.to_string());
        join(&self.events, job_id.to_string(), move |seen| follow_events(db, id, poll, seen))
    }

    /// Follows the user (or provider) log of `job_id`.
    pub fn log(&self, source: LogSource, job_id: &str, provider: bool) -> Arc<Hub<LogSeen>> {
        let (poll, id) = (self.poll, job_id.to_string());
        join(&self.logs, (job_id.to_string(), provider), move |seen| follow_log(source, id, provider, poll, seen))
    }

    /// Hubs running now (for tests and metrics).
    pub fn running(&self) -> usize {
        live(&self.events) + live(&self.logs)
    }
}

fn live<K, T>(registry: &Registry<K, T>) -> usize {
    registry.lock().unwrap_or_else(|e| e.into_inner()).values().filter(|hub| hub.strong_count() > 0).count()
}

/// Returns the live hub for `key`, or starts one with `task`.
fn join<K, T, F, Fut>(registry: &Registry<K, T>, key: K, task: F) -> Arc<Hub<T>>
where
    K: std::hash::Hash + Eq,
    T: Default + Send + Sync + 'static,
    F: FnOnce(watch::Sender<Arc<T>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut hubs = registry.lock().unwrap_or_else(|e| e.into_inner());
    hubs.retain(|_, hub| hub.strong_count() > 0);
    if let Some(hub) = hubs.get(&key).and_then(Weak::upgrade) {
        return hub;
    }
    let (sender, seen) = watch::channel(Arc::new(T::default()));
    let hub = Arc::new(Hub { seen });
    hubs.insert(key, Arc::downgrade(&hub));
    tokio::spawn(task(sender));
    hub
}

/// Waits `poll`, or returns false when every follower has left.
async fn next_poll<T>(seen: &watch::Sender<Arc<T>>, poll: Duration, first: &mut bool) -> bool {
    if std::mem::take(first) {
        return !seen.is_closed();
    }
    tokio::select! {
        () = seen.closed() => false,
        () = tokio::time::sleep(poll) => !seen.is_closed(),
    }
}

async fn follow_events(db: Db, job_id: String, poll: Duration, seen: watch::Sender<Arc<EventsSeen>>) {
    let mut first = true;
    let mut last_seq = 0;
    while next_poll(&seen, poll, &mut first).await {
        // The status first: a terminal status means its event is already committed.
        let ended = match jobs::find(&db, &job_id).await {
            Ok(job) => job.is_none_or(|job| job.status().is_terminal()),
            Err(error) => {
                tracing::warn!(job.id = %job_id, error = &error as &dyn std::error::Error, "failed to follow job events");
                continue;
            }
        };
        let mut fresh = Vec::new();
        loop {
            match jobs::events_after(&db, &job_id, last_seq, EVENTS_PER_READ).await {
                Ok(rows) => {
                    let full = rows.len() as i64 == EVENTS_PER_READ;
                    last_seq = rows.last().map(|row| row.seq).unwrap_or(last_seq);
                    fresh.extend(rows.into_iter().map(Arc::new));
                    if !full {
                        break;
                    }
                }
                Err(error) => {
                    tracing::warn!(job.id = %job_id, error = &error as &dyn std::error::Error, "failed to follow job events");
                    break;
                }
            }
        }
        if !fresh.is_empty() || ended {
            seen.send_modify(|state| {
                let mut events = state.events.clone();
                events.extend(fresh);
                *state = Arc::new(EventsSeen { events, finished: ended });
            });
        }
        if ended {
            return;
        }
    }
}

/// Where a job's log is read from: the archive once the job has ended, the backend while it runs,
/// the database copy as a last resort.
#[derive(Clone)]
pub struct LogSource {
    pub db: Db,
    pub storage: Storage,
    pub compute: Arc<dyn Compute>,
}

impl LogSource {
    /// The archived log from `offset` to its end, as a stream of pieces; `None` when there is no
    /// archive (then the database copy is the log).
    pub async fn archived_from(
        &self,
        job: &jobs::JobRow,
        provider: bool,
        offset: u64,
    ) -> Result<Option<futures::stream::BoxStream<'static, std::io::Result<Bytes>>>, crate::storage::Error> {
        use futures::StreamExt;
        let key = if provider { keys::job_provider_log(&job.id) } else { keys::job_user_log(&job.id) };
        if let Some(object) = self.storage.get(&key).await? {
            return Ok(Some(skip_bytes(object.body, offset).boxed()));
        }
        // As `logs/`: the user log of a provider function has no database copy.
        if !provider && job.provider_id.is_some() {
            return Ok(None);
        }
        let stored = jobs::stored_logs(&self.db, &job.id).await.ok().flatten().unwrap_or_default();
        let bytes = Bytes::from(stored);
        let rest = bytes.slice((offset as usize).min(bytes.len())..);
        Ok(Some(futures::stream::iter(split_pieces(rest).into_iter().map(Ok)).boxed()))
    }

    /// What a running job has logged from `offset` on (at most `limit` bytes).
    pub async fn live_from(&self, job_id: &str, provider: bool, offset: u64, limit: usize) -> Bytes {
        self.compute.clone().live_log_since(job_id, provider, offset, limit).await.unwrap_or_default()
    }
}

/// Drops the first `skip` bytes of a stream of pieces.
pub fn skip_bytes(
    body: impl futures::Stream<Item = std::io::Result<Bytes>> + Send + 'static,
    skip: u64,
) -> impl futures::Stream<Item = std::io::Result<Bytes>> + Send + 'static {
    use futures::StreamExt;
    let mut left = skip;
    body.filter_map(move |piece| {
        let out = match piece {
            Ok(bytes) if left >= bytes.len() as u64 => {
                left -= bytes.len() as u64;
                None
            }
            Ok(bytes) => {
                let rest = bytes.slice(left as usize..);
                left = 0;
                Some(Ok(rest))
            }
            Err(error) => Some(Err(error)),
        };
        futures::future::ready(out)
    })
}

/// Cuts bytes into pieces of at most `LOG_PIECE`.
fn split_pieces(mut bytes: Bytes) -> Vec<Bytes> {
    let mut pieces = Vec::new();
    while !bytes.is_empty() {
        pieces.push(bytes.split_to(bytes.len().min(LOG_PIECE)));
    }
    pieces
}

/// The hub of one job's log: polls the backend while the job runs, reads the rest of the
/// archive once it has ended. Only whole lines are shared while the job runs (so a piece never
/// splits a character), unless a line outgrows a piece.
async fn follow_log(
    source: LogSource,
    job_id: String,
    provider: bool,
    poll: Duration,
    seen: watch::Sender<Arc<LogSeen>>,
) {
    use futures::StreamExt;
    let mut first = true;
    let mut end: u64 = 0;
    while next_poll(&seen, poll, &mut first).await {
        let job = match jobs::find(&source.db, &job_id).await {
            Ok(Some(job)) => job,
            Ok(None) => return finish(&seen),
            Err(error) => {
                tracing::warn!(job.id = %job_id, error = &error as &dyn std::error::Error, "failed to follow a job log");
                continue;
            }
        };
        if job.status().is_terminal() {
            match source.archived_from(&job, provider, end).await {
                Ok(Some(mut pieces)) => {
                    while let Some(piece) = pieces.next().await {
                        let Ok(piece) = piece else { break };
                        for piece in split_pieces(piece) {
                            end = share(&seen, end, piece);
                        }
                        if seen.is_closed() {
                            return;
                        }
                    }
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(job.id = %job_id, error = &error as &dyn std::error::Error, "failed to read an archived log")
                }
            }
            return finish(&seen);
        }
        if job.status() != JobStatus::Running {
            continue;
        }
        // Several reads per poll when the log grows fast, each bounded.
        loop {
            let fresh = source.live_from(&job_id, provider, end, LOG_WINDOW).await;
            let whole = match fresh.iter().rposition(|&byte| byte == b'\n') {
                Some(last_newline) => fresh.slice(..=last_newline),
                None if fresh.len() >= LOG_PIECE => fresh.slice(..char_boundary(&fresh, LOG_PIECE)),
                None => Bytes::new(),
            };
            if whole.is_empty() {
                break;
            }
            let read_all = whole.len() == fresh.len() && fresh.len() < LOG_WINDOW;
            for piece in split_pieces(whole) {
                end = share(&seen, end, piece);
            }
            if read_all {
                break;
            }
        }
    }
}

/// The largest index ≤ `at` that does not split a UTF-8 character of `bytes`.
fn char_boundary(bytes: &[u8], at: usize) -> usize {
    let mut at = at.min(bytes.len());
    while at > 0 && at < bytes.len() && (bytes[at] & 0xC0) == 0x80 {
        at -= 1;
    }
    at
}

/// Appends a piece to the window, dropping the oldest pieces beyond `LOG_WINDOW`.
fn share(seen: &watch::Sender<Arc<LogSeen>>, end: u64, piece: Bytes) -> u64 {
    let new_end = end + piece.len() as u64;
    seen.send_modify(|state| {
        let mut pieces = state.pieces.clone();
        pieces.push_back((end, piece));
        let mut size: usize = pieces.iter().map(|(_, bytes)| bytes.len()).sum();
        while size > LOG_WINDOW && pieces.len() > 1 {
            size -= pieces.pop_front().map(|(_, bytes)| bytes.len()).unwrap_or_default();
        }
        *state = Arc::new(LogSeen { pieces, end: new_end, finished: false });
    });
    new_end
}

fn finish(seen: &watch::Sender<Arc<LogSeen>>) {
    seen.send_modify(|state| {
        *state = Arc::new(LogSeen { pieces: state.pieces.clone(), end: state.end, finished: true });
    });
}

/// Decodes a stream of byte pieces as UTF-8 without splitting a character across pieces: the
/// incomplete tail of one piece waits for the next. Invalid bytes become U+FFFD.
#[derive(Default)]
pub struct Utf8Pieces {
    carry: BytesMut,
}

impl Utf8Pieces {
    pub fn push(&mut self, piece: &[u8]) -> String {
        self.carry.extend_from_slice(piece);
        let mut out = String::new();
        let kept = {
            let mut rest: &[u8] = &self.carry;
            loop {
                match std::str::from_utf8(rest) {
                    Ok(text) => {
                        out.push_str(text);
                        break 0;
                    }
                    Err(error) => {
                        let (valid, after) = rest.split_at(error.valid_up_to());
                        out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                        match error.error_len() {
                            Some(invalid) => {
                                out.push(char::REPLACEMENT_CHARACTER);
                                rest = &after[invalid..];
                            }
                            // An incomplete character at the end: it waits for the next piece.
                            None => break after.len(),
                        }
                    }
                }
            }
        };
        let done = self.carry.len() - kept;
        let _ = self.carry.split_to(done);
        out
    }

    /// What is left at the end of the stream.
    pub fn finish(&mut self) -> String {
        let rest = self.carry.split();
        String::from_utf8_lossy(&rest).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters_split_across_pieces_are_joined() {
        let text = "héllo wörld ✓ done";
        let bytes = text.as_bytes();
        for cut in 0..bytes.len() {
            let mut decoder = Utf8Pieces::default();
            let mut out = decoder.push(&bytes[..cut]);
            out.push_str(&decoder.push(&bytes[cut..]));
            out.push_str(&decoder.finish());
            assert_eq!(out, text, "cut at {cut}");
        }
        let mut decoder = Utf8Pieces::default();
        let mut out = decoder.push(b"a\xffb\xe2");
        out.push_str(&decoder.push(b"\x9c\x93"));
        assert_eq!(out, "a\u{fffd}b✓");
    }

    #[test]
    fn the_window_keeps_the_newest_bytes() {
        let (sender, seen) = watch::channel(Arc::new(LogSeen::default()));
        let mut end = 0;
        for _ in 0..40 {
            end = share(&sender, end, Bytes::from(vec![b'x'; LOG_PIECE]));
        }
        let state = seen.borrow().clone();
        assert_eq!(state.end, 40 * LOG_PIECE as u64);
        assert_eq!(state.start(), state.end - LOG_WINDOW as u64);
        assert_eq!(state.piece_from(state.start() + 10).unwrap().len(), LOG_PIECE - 10);
        assert!(state.piece_from(0).is_none());
    }
}
