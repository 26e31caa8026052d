//! Serving HTTP/1 connections so that no client can hold the server: a new connection must
//! complete its first request's headers within the header time from its start (one that never
//! speaks is closed then), a kept-alive one is closed after the idle time without a request or
//! the header time after its next request began; a request body fails (`408`) when it stops
//! arriving for the body time, or when it arrives slower than the minimum rate once the body time
//! has passed (a body trickled a byte at a time cannot hold its connection); open connections are
//! capped, and at the cap the connection waiting longest without a request in progress is closed
//! to admit the new one (only when every connection is answering a request is the new one
//! answered `503` and closed); accepting never stops; a graceful shutdown lets requests in flight
//! finish for the grace, then cuts the rest.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use clap::Args;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};

/// Descriptors kept free for everything but client connections (database, storage, jobs, logs)
/// when the connection cap follows the open-files limit.
const RESERVED_FILES: u64 = 256;

/// What the answer to a connection over the cap says before it is closed.
const OVER_CAPACITY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\nretry-after: 1\r\ncontent-type: application/json\r\ncontent-length: 58\r\n\r\n{\"message\": \"Too many open connections, try again later\"}\n";

/// Limits on client connections (`gantry serve` and `gantry gateway`).
#[derive(Debug, Clone, Args)]
pub struct ConnectionArgs {
    /// Seconds a new connection has from its start to complete its first request's headers (a
    /// kept-alive one, from its next request's first byte); the connection is closed after.
    #[arg(long, env = "GANTRY_HEADER_TIMEOUT_SECONDS", default_value_t = 30.0)]
    pub header_timeout_seconds: f64,
    /// Seconds a request body may go without a byte arriving; the request then fails (`408`) and
    /// the connection is closed.
    #[arg(long, env = "GANTRY_BODY_TIMEOUT_SECONDS", default_value_t = 60.0)]
    pub body_timeout_seconds: f64,
    /// Bytes a second a request body must average once `--body-timeout-seconds` have passed since
    /// it began: each byte received adds 1/rate seconds to its deadline, and a body past its
    /// deadline fails (`408`) and its connection is closed.
    #[arg(long, env = "GANTRY_BODY_MIN_BYTES_PER_SECOND", default_value_t = 1024)]
    pub body_min_bytes_per_second: u64,
    /// Seconds a connection may wait for its next request (keep-alive) before it is closed.
    #[arg(long, env = "GANTRY_IDLE_TIMEOUT_SECONDS", default_value_t = 75.0)]
    pub idle_timeout_seconds: f64,
    /// Open client connections at most; more are answered `503` and closed at once. Default:
    /// the open-files limit less 256 (at least 16).
    #[arg(long, env = "GANTRY_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Seconds a shutdown (SIGTERM) lets requests in flight finish before the connections left
    /// are cut and the process ends.
    #[arg(long, env = "GANTRY_SHUTDOWN_GRACE_SECONDS", default_value_t = 20.0)]
    pub shutdown_grace_seconds: f64,
}

impl Default for ConnectionArgs {
    fn default() -> Self {
        ConnectionArgs {
            header_timeout_seconds: 30.0,
            body_timeout_seconds: 60.0,
            body_min_bytes_per_second: 1024,
            idle_timeout_seconds: 75.0,
            max_connections: None,
            shutdown_grace_seconds: 20.0,
        }
    }
}

/// The limits in effect, from the flags and the process's open-files limit.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    /// Bytes a second a body must average past `body_timeout` (at least 1).
    pub body_min_rate: u64,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub shutdown_grace: Duration,
}

fn seconds(value: f64) -> Duration {
    Duration::try_from_secs_f64(value.max(0.001)).unwrap_or(Duration::MAX / 4)
}

/// The connection cap that follows an open-files limit of `files`.
pub fn cap_below(files: u64) -> usize {
    usize::try_from(files.saturating_sub(RESERVED_FILES).max(16)).unwrap_or(usize::MAX)
}

impl ConnectionArgs {
    pub fn limits(&self) -> ConnectionLimits {
        let max_connections = self.max_connections.unwrap_or_else(|| cap_below(open_files_limit()));
        ConnectionLimits {
            header_timeout: seconds(self.header_timeout_seconds),
            body_timeout: seconds(self.body_timeout_seconds),
            body_min_rate: self.body_min_bytes_per_second.max(1),
            idle_timeout: seconds(self.idle_timeout_seconds),
            max_connections: max_connections.max(1),
            shutdown_grace: seconds(self.shutdown_grace_seconds),
        }
    }
}

/// The soft open-files limit (RLIMIT_NOFILE) of this process.
fn open_files_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct it is given and nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return 65_536;
    }
    limit.rlim_cur
}

/// Where a connection is: waiting for a request (since when, when its first byte came, and
/// whether it is the connection's first) or answering some.
#[derive(Debug, Clone, Copy)]
enum Phase {
    Waiting { since: Instant, first_byte: Option<Instant>, first_request: bool },
    Busy(usize),
}

/// A connection's phase, moved by its reads and its requests; `changed` wakes its watchdog, which
/// closes the connection when it is past its deadline or `evicted`.
struct Activity {
    phase: Mutex<Phase>,
    changed: Notify,
    evicted: AtomicBool,
}

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity {
            phase: Mutex::new(Phase::Waiting { since: Instant::now(), first_byte: None, first_request: true }),
            changed: Notify::new(),
            evicted: AtomicBool::new(false),
        })
    }

    /// Whether the connection has begun its next request's headers, and since when it waits
    /// without a request in progress; `None` while answering.
    fn waiting_since(&self) -> Option<(bool, Instant)> {
        match *self.phase.lock().unwrap_or_else(|poison| poison.into_inner()) {
            Phase::Waiting { since, first_byte, .. } => Some((first_byte.is_some(), since)),
            Phase::Busy(_) => None,
        }
    }

    /// Has the connection closed (to admit another at the cap).
    fn evict(&self) {
        self.evicted.store(true, Ordering::Relaxed);
        self.changed.notify_one();
    }

    fn update(&self, change: impl FnOnce(&mut Phase)) {
        let mut phase = self.phase.lock().unwrap_or_else(|poison| poison.into_inner());
        change(&mut phase);
        self.changed.notify_one();
    }

    fn read_bytes(&self) {
        let waiting_first = matches!(
            *self.phase.lock().unwrap_or_else(|poison| poison.into_inner()),
            Phase::Waiting { first_byte: None, .. }
        );
        if waiting_first {
            self.update(|phase| {
                if let Phase::Waiting { first_byte: first @ None, .. } = phase {
                    *first = Some(Instant::now());
                }
            });
        }
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.update(|phase| {
            *phase = match *phase {
                Phase::Waiting { .. } => Phase::Busy(1),
                Phase::Busy(n) => Phase::Busy(n + 1),
            }
        });
        InFlight(Arc::clone(self))
    }

    /// When the connection is to be closed if nothing changes; `None` while answering. A new
    /// connection has the header time from its start for its first request, said or not.
    fn deadline(&self, limits: &ConnectionLimits) -> Option<Instant> {
        match *self.phase.lock().unwrap_or_else(|poison| poison.into_inner()) {
            Phase::Waiting { since, first_request: true, .. } => Some(since + limits.header_timeout),
            Phase::Waiting { first_byte: Some(first), .. } => Some(first + limits.header_timeout),
            Phase::Waiting { since, first_byte: None, .. } => Some(since + limits.idle_timeout),
            Phase::Busy(_) => None,
        }
    }
}

/// One request being answered, until its response body is sent or dropped.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.update(|phase| {
            *phase = match *phase {
                Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
                _ => Phase::Waiting { since: Instant::now(), first_byte: None, first_request: false },
            }
        });
    }
}

/// The socket, noting each read in the connection's activity.
struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.read_bytes();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Why a request body failed: it stopped arriving, or it arrived too slowly.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BodyStalled {
    /// Nothing for this long.
    Stopped(Duration),
    /// `received` bytes in `elapsed`, below `min_rate` bytes a second past `grace`.
    TooSlow { received: u64, elapsed: Duration, min_rate: u64, grace: Duration },
}

impl std::fmt::Display for BodyStalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyStalled::Stopped(timeout) => {
                write!(f, "{} seconds passed without a byte of the request body", timeout.as_secs_f64())
            }
            BodyStalled::TooSlow { received, elapsed, min_rate, grace } => write!(
                f,
                "the request body arrived too slowly: {received} bytes in {:.0} seconds (at least {min_rate} bytes a \
                 second are needed after the first {} seconds)",
                elapsed.as_secs_f64(),
                grace.as_secs_f64()
            ),
        }
    }
}

impl std::error::Error for BodyStalled {}

/// The deadline of a body that began at `started` and has `received` bytes: the grace, plus
/// 1/`min_rate` seconds a byte received (pure).
pub fn body_deadline(started: Instant, received: u64, grace: Duration, min_rate: u64) -> Instant {
    const MOST: f64 = 365.0 * 24.0 * 3600.0;
    let earned = Duration::from_secs_f64((received as f64 / min_rate.max(1) as f64).min(MOST));
    started + grace.saturating_add(earned)
}

/// A request body that fails when no frame arrives for `timeout` or when it falls behind its
/// deadline (`body_deadline`), and says why in `stalled`.
struct Stalling {
    inner: Incoming,
    timeout: Duration,
    min_rate: u64,
    started: Instant,
    received: u64,
    sleep: Option<Pin<Box<Sleep>>>,
    deadline: Pin<Box<Sleep>>,
    stalled: Arc<Mutex<Option<BodyStalled>>>,
}

impl Stalling {
    fn fail(&mut self, why: BodyStalled) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        *self.stalled.lock().unwrap_or_else(|poison| poison.into_inner()) = Some(why);
        Poll::Ready(Some(Err(Box::new(why))))
    }

    fn too_slow(&self) -> BodyStalled {
        BodyStalled::TooSlow {
            received: self.received,
            elapsed: self.started.elapsed(),
            min_rate: self.min_rate,
            grace: self.timeout,
        }
    }
}

impl HttpBody for Stalling {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.sleep = None;
                if let Some(Ok(data)) = frame.as_ref().map(|f| f.as_ref().map(Frame::data_ref)) {
                    this.received += data.map_or(0, |d| d.len() as u64);
                    let due = body_deadline(this.started, this.received, this.timeout, this.min_rate);
                    if Instant::now() > due && !this.inner.is_end_stream() {
                        let why = this.too_slow();
                        return this.fail(why);
                    }
                    this.deadline.as_mut().reset(due);
                }
                Poll::Ready(frame.map(|frame| frame.map_err(Into::into)))
            }
            Poll::Pending => {
                if this.deadline.as_mut().poll(cx).is_ready() {
                    let why = this.too_slow();
                    return this.fail(why);
                }
                let timeout = this.timeout;
                let sleep = this.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => this.fail(BodyStalled::Stopped(timeout)),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body holding its request's place among the connection's requests in flight.
struct Answering {
    inner: Body,
    _in_flight: InFlight,
}

impl HttpBody for Answering {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The application as hyper calls it on one connection.
#[derive(Clone)]
struct Connection<S> {
    app: S,
    activity: Arc<Activity>,
    body_timeout: Duration,
    body_min_rate: u64,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl<S> hyper::service::Service<hyper::Request<Incoming>> for Connection<S>
where
    S: tower::Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, request: hyper::Request<Incoming>) -> Answer {
        let in_flight = self.activity.begin();
        let (timeout, min_rate) = (self.body_timeout, self.body_min_rate);
        let stalled = Arc::new(Mutex::new(None));
        let flag = Arc::clone(&stalled);
        let started = Instant::now();
        let request = request.map(|inner| {
            Body::new(Stalling {
                inner,
                timeout,
                min_rate,
                started,
                received: 0,
                sleep: None,
                deadline: Box::pin(tokio::time::sleep_until(body_deadline(started, 0, timeout, min_rate))),
                stalled: flag,
            })
        });
        let answered = tower::ServiceExt::oneshot(self.app.clone(), request);
        Box::pin(async move {
            let mut response = answered.await?;
            let why = *stalled.lock().unwrap_or_else(|poison| poison.into_inner());
            if let Some(why) = why {
                // Whatever the handler made of the failed read: the client is told why, and the
                // connection (its body half-sent) is not reused.
                response = stalled_answer(why);
            }
            Ok(response.map(|inner| Body::new(Answering { inner, _in_flight: in_flight })))
        })
    }
}

/// Serves `app` on `listener` under `limits` until `shutdown` resolves, then for at most the
/// shutdown grace.
pub async fn serve<S>(
    listener: TcpListener,
    app: S,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()>
where
    S: tower::Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let open = Arc::new(Open::default());
    let (stop, stopping) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(None).keep_alive(true);
    let builder = Arc::new(builder);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of descriptors (or a connection reset before it was taken): wait a little
                // and go on accepting; the cap and the timeouts free descriptors.
                tracing::warn!(%error, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let slot = match Arc::clone(&slots).try_acquire_owned() {
            Ok(slot) => Some(slot),
            // At the cap: the connection waiting longest without a request in progress makes
            // room, so clients holding sockets cannot keep others out.
            Err(_) if open.evict_longest_waiting(limits.max_connections) => {
                tokio::time::timeout(EVICTION_WAIT, Arc::clone(&slots).acquire_owned()).await.ok().and_then(Result::ok)
            }
            Err(_) => None,
        };
        let Some(slot) = slot else {
            // Every connection is answering a request: say so if the socket takes it at once,
            // and close.
            let _ = stream.try_write(OVER_CAPACITY);
            tracing::debug!(max = limits.max_connections, "connection refused: too many open connections");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let activity = Activity::new();
        let service = Connection {
            app: app.clone(),
            activity: Arc::clone(&activity),
            body_timeout: limits.body_timeout,
            body_min_rate: limits.body_min_rate,
        };
        let builder = Arc::clone(&builder);
        let mut stopping = stopping.clone();
        let registered = open.register(&activity);
        connections.spawn(async move {
            let _slot = slot;
            let _registered = registered;
            let io = TokioIo::new(Watched { stream, activity: Arc::clone(&activity) });
            let connection = builder.serve_connection(io, service);
            tokio::pin!(connection);
            let mut draining = false;
            loop {
                let deadline = activity.deadline(&limits);
                tokio::select! {
                    _ = connection.as_mut() => return,
                    () = activity.changed.notified() => {
                        if activity.evicted.load(Ordering::Relaxed) {
                            return; // dropping the connection closes it
                        }
                    }
                    () = sleep_until(deadline) => {
                        if activity.deadline(&limits).is_some_and(|due| due <= Instant::now()) {
                            return; // dropping the connection closes it
                        }
                    }
                    _ = stopping.changed(), if !draining => {
                        draining = true;
                        connection.as_mut().graceful_shutdown();
                    }
                }
            }
        });
    }
    drop(listener);
    let _ = stop.send(true);
    let open = connections.len();
    if open > 0 {
        tracing::info!(open, grace = ?limits.shutdown_grace, "shutting down: letting requests in flight finish");
    }
    let finished =
        tokio::time::timeout(limits.shutdown_grace, async { while connections.join_next().await.is_some() {} }).await;
    if finished.is_err() {
        tracing::warn!(cut = connections.len(), "shutdown grace over: closing the connections left");
        connections.shutdown().await;
    }
    Ok(())
}

/// How long a new connection at the cap waits for the place an evicted one frees.
const EVICTION_WAIT: Duration = Duration::from_secs(1);

/// The open connections' activities, for choosing one to evict at the cap.
#[derive(Default)]
struct Open {
    connections: Mutex<std::collections::HashMap<u64, Arc<Activity>>>,
    next: std::sync::atomic::AtomicU64,
    /// Evictions since the last log line, and when that was.
    evictions: Mutex<(u64, Option<Instant>)>,
}

/// A connection's place in `Open`, given back when its task ends.
struct Registered {
    open: Arc<Open>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.open.connections.lock().unwrap_or_else(|poison| poison.into_inner()).remove(&self.id);
    }
}

/// How often evictions are logged at most.
const EVICTION_LOG_EVERY: Duration = Duration::from_secs(60);

impl Open {
    fn register(self: &Arc<Self>, activity: &Arc<Activity>) -> Registered {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.connections.lock().unwrap_or_else(|poison| poison.into_inner()).insert(id, Arc::clone(activity));
        Registered { open: Arc::clone(self), id }
    }

    /// Closes the connection waiting longest without a request in progress, a silent one before
    /// one that has begun its next request; false when every connection is answering one. Logs
    /// the first eviction, then at most once a minute with the count since.
    fn evict_longest_waiting(&self, cap: usize) -> bool {
        let victim = {
            let connections = self.connections.lock().unwrap_or_else(|poison| poison.into_inner());
            connections
                .values()
                .filter(|activity| !activity.evicted.load(Ordering::Relaxed))
                .filter_map(|activity| activity.waiting_since().map(|key| (key, Arc::clone(activity))))
                .min_by_key(|(key, _)| *key)
        };
        let Some(((_, since), victim)) = victim else { return false };
        victim.evict();
        let mut evictions = self.evictions.lock().unwrap_or_else(|poison| poison.into_inner());
        evictions.0 += 1;
        if evictions.1.is_none_or(|last| last.elapsed() >= EVICTION_LOG_EVERY) {
            tracing::warn!(
                evicted = evictions.0,
                cap,
                idle_seconds = since.elapsed().as_secs(),
                "open connections at the cap: closed the one waiting longest without a request to admit a new one"
            );
            *evictions = (0, Some(Instant::now()));
        }
        true
    }
}

/// `408` saying why the body failed, closing the connection.
fn stalled_answer(why: BodyStalled) -> Response {
    let message = why.to_string();
    let mut response =
        (StatusCode::REQUEST_TIMEOUT, axum::Json(serde_json::json!({ "message": message }))).into_response();
    response.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    response
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
