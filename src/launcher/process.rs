//! The function's process: started in its own process group with stdout and stderr on one pipe,
//! supervised until it exits or is stopped (the whole group is killed after a grace), its output
//! passed through and routed into the live logs.

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::process::{Child, Command};

use super::prepare::sandbox;
use super::{
    DRAIN_GRACE, Error, LINE_HEAD_BYTES, LIVE_LOG_INTERVAL, LIVE_PROVIDER_LOG, LIVE_USER_LOG, Launch, READ_CHUNK_BYTES,
    STOP_GRACE, code_dir,
};
use crate::domain::logs::{LogRouter, relative_to};

/// The function's process and the read end of its output: stdout and stderr are one pipe (as a
/// shell's `2>&1`), so the log keeps the order in which the process wrote its lines.
pub(super) struct Started {
    child: Child,
    output: std::io::PipeReader,
}

pub(super) fn spawn(launch: &Launch, environment: &[(OsString, OsString)], script: &str) -> Result<Started, Error> {
    let spawn_error = |source| Error::Spawn { python: launch.job.python.clone(), source };
    let (output, writer) = std::io::pipe().map_err(spawn_error)?;
    let error_writer = writer.try_clone().map_err(spawn_error)?;
    let mut command = Command::new(&launch.job.python);
    if let Some(isolation) = &launch.isolation {
        let prepared = sandbox(launch, isolation, environment).prepare()?;
        if !prepared.enforced() {
            say!("gantry launch: warning: the kernel does not offer Landlock; the job is not confined");
        }
        prepared.apply_to(&mut command);
    }
    launch.limits.apply_to(&mut command);
    command
        .arg(script)
        .current_dir(code_dir(launch))
        .env_clear()
        .envs(environment.iter().map(|(name, value)| (name, value)))
        .stdin(Stdio::null())
        .stdout(Stdio::from(writer))
        .stderr(Stdio::from(error_writer))
        .process_group(0);
    let child = command.spawn().map_err(spawn_error)?;
    super::bounds::prefer_the_job_for_oom_kills();
    // The command holds this process's copies of the write end: dropped here, the pipe ends
    // when the last process of the job closes it.
    drop(command);
    Ok(Started { child, output })
}

/// The logs of the running job, shared by the two output readers and the live-log writer.
pub(super) struct Live {
    router: LogRouter,
    /// Lines arrived since the live logs were last written.
    changed: bool,
    /// The start of the last line that was not blank (a traceback's exception).
    last_line: String,
    /// The code folder as the job's paths name it (given and resolved), removed from the lines
    /// so paths read relative to the function's folder.
    code_folders: Vec<String>,
}

/// Bytes kept of the last line (enough for an exception's name and errno).
const LAST_LINE_BYTES: usize = 256;

impl Live {
    fn push_line(&mut self, line: &str) {
        let line = &relative_to(line, &self.code_folders);
        self.router.push_line(line);
        if !line.trim().is_empty() {
            let mut end = line.len().min(LAST_LINE_BYTES);
            while !line.is_char_boundary(end) {
                end -= 1;
            }
            self.last_line.clear();
            self.last_line.push_str(&line[..end]);
        }
    }
}

pub(super) fn lock(live: &Mutex<Live>) -> std::sync::MutexGuard<'_, Live> {
    live.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How the function's process ended, and its logs.
pub(super) struct Ending {
    pub(super) status: Result<ExitStatus, Error>,
    pub(super) router: LogRouter,
    /// The last line the function wrote that was not blank (its start).
    pub(super) last_line: String,
}

/// Reads the output until python exits, keeping the live logs current; on `stop`, terminates
/// the process group, then kills it after `STOP_GRACE`.
pub(super) async fn supervise<F: Future<Output = ()>>(
    launch: &Launch,
    started: Started,
    mut stop: Pin<&mut F>,
) -> Ending {
    let live = Arc::new(Mutex::new(Live {
        router: LogRouter::new(launch.job.provider_function, launch.job.logs_size_limit),
        changed: true,
        last_line: String::new(),
        code_folders: code_folders(&code_dir(launch)),
    }));
    let Started { mut child, output } = started;
    let group = child.id();
    let mut readers = Vec::new();
    // One stream for both (the order the process wrote in), echoed to the launcher's stdout.
    match tokio::net::unix::pipe::Receiver::from_owned_fd(std::os::fd::OwnedFd::from(output)) {
        Ok(output) => {
            readers.push(tokio::spawn(pump(output, tokio::io::stdout(), live.clone(), launch.job.logs_size_limit)));
        }
        Err(error) => say!("gantry launch: failed to read the job's output: {error}"),
    }

    let mut ticker = tokio::time::interval(LIVE_LOG_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stop_requested = false;
    let mut kill_at = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.map_err(|source| Error::Wait { source }),
            () = stop.as_mut(), if !stop_requested => {
                stop_requested = true;
                signal_group(group, libc::SIGTERM);
                kill_at = Some(tokio::time::Instant::now() + STOP_GRACE);
            }
            () = tokio::time::sleep_until(kill_at.unwrap_or_else(tokio::time::Instant::now)),
                if kill_at.is_some() => {
                signal_group(group, libc::SIGKILL);
                kill_at = None;
            }
            _ = ticker.tick() => {
                let _ = write_live_logs(&launch.job.work_dir, &live).await;
            }
        }
    };

    // The pipes close when the last process holding them ends. Whatever the job left running
    // gets a short grace, then the whole group is killed; readers still blocked after that
    // (a process that left the group) are abandoned.
    let aborts: Vec<_> = readers.iter().map(|r| r.abort_handle()).collect();
    let mut drained = std::pin::pin!(futures::future::join_all(readers));
    let _ = tokio::time::timeout(DRAIN_GRACE, drained.as_mut()).await;
    signal_group(group, libc::SIGKILL);
    if tokio::time::timeout(DRAIN_GRACE, drained.as_mut()).await.is_err() {
        aborts.iter().for_each(tokio::task::AbortHandle::abort);
        drained.await;
    }

    {
        lock(&live).changed = true;
    }
    if let Err(e) = write_live_logs(&launch.job.work_dir, &live).await {
        say!("gantry launch: failed to write the live logs: {e}");
    }
    let (router, last_line) = {
        let mut live = lock(&live);
        let router = std::mem::replace(&mut live.router, LogRouter::new(launch.job.provider_function, 0));
        (router, std::mem::take(&mut live.last_line))
    };
    Ending { status, router, last_line }
}

/// `code` as a job's paths may name it: as given and, when it differs, resolved (Python names
/// its main script by the resolved working folder); absolute paths only, longest first, so no
/// shorter one cuts into a longer one.
fn code_folders(code: &Path) -> Vec<String> {
    let mut folders: Vec<String> = [Some(code.to_path_buf()), std::fs::canonicalize(code).ok()]
        .into_iter()
        .flatten()
        .filter(|path| path.is_absolute())
        .map(|path| path.to_string_lossy().trim_end_matches('/').to_string())
        .filter(|path| !path.is_empty())
        .collect();
    folders.sort_by_key(|path| std::cmp::Reverse(path.len()));
    folders.dedup();
    folders
}

/// Sends `signal` to the process group led by the function's process (created with
/// `process_group(0)`, so its id is the group's).
pub(super) fn signal_group(group: Option<u32>, signal: libc::c_int) {
    let Some(group) = group.and_then(|id| libc::pid_t::try_from(id).ok()) else {
        return;
    };
    if group > 1 {
        // SAFETY: `kill` has no memory-safety preconditions; a negative id names a group.
        unsafe {
            libc::kill(-group, signal);
        }
    }
}

/// Copies the job's output pipe to `echo` unchanged and routes its lines into the logs.
/// Write errors on `echo` (the launcher's own output closed) are ignored.
pub(super) async fn pump(
    mut pipe: impl AsyncRead + Unpin,
    mut echo: impl AsyncWrite + Unpin,
    live: Arc<Mutex<Live>>,
    logs_size_limit: usize,
) {
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    let mut lines = LineSplitter::new(logs_size_limit);
    let mut echo_open = true;
    loop {
        let read = match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        let bytes = &chunk[..read];
        if echo_open {
            echo_open = echo.write_all(bytes).await.is_ok() && echo.flush().await.is_ok();
        }
        let mut live = lock(&live);
        lines.feed(bytes, |line| live.push_line(line));
        live.changed = true;
    }
    if let Some(line) = lines.finish() {
        let mut live = lock(&live);
        live.push_line(&line);
        live.changed = true;
    }
}

/// Splits a byte stream into lines (lossy UTF-8, without `\n` or `\r\n`) in bounded memory:
/// of a line longer than the log limit only its first bytes (for the tag) and its last
/// `max_line_bytes` (all a log could keep of it) are held.
pub(super) struct LineSplitter {
    pending: Vec<u8>,
    max_line_bytes: usize,
}

impl LineSplitter {
    fn new(max_line_bytes: usize) -> Self {
        Self { pending: Vec::new(), max_line_bytes: max_line_bytes.max(1) }
    }

    fn feed(&mut self, mut bytes: &[u8], mut emit: impl FnMut(&str)) {
        while let Some(end) = bytes.iter().position(|b| *b == b'\n') {
            self.append(&bytes[..end]);
            emit(&self.take());
            bytes = &bytes[end + 1..];
        }
        self.append(bytes);
    }

    /// The last line when the stream did not end with a newline.
    fn finish(&mut self) -> Option<String> {
        (!self.pending.is_empty()).then(|| self.take())
    }

    fn append(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
        if self.pending.len() > LINE_HEAD_BYTES + 2 * self.max_line_bytes {
            let cut_end = self.pending.len() - self.max_line_bytes;
            self.pending.drain(LINE_HEAD_BYTES..cut_end);
        }
    }

    fn take(&mut self) -> String {
        if self.pending.last() == Some(&b'\r') {
            self.pending.pop();
        }
        let line = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        line
    }
}

/// Writes the renders of both logs to the work directory if lines arrived since last time.
pub(super) async fn write_live_logs(work_dir: &Path, live: &Mutex<Live>) -> io::Result<()> {
    let (user, provider) = {
        let mut live = lock(live);
        if !live.changed {
            return Ok(());
        }
        live.changed = false;
        let router = &live.router;
        (router.user.render(), router.provider_function().then(|| router.provider.render()))
    };
    write_atomically(&work_dir.join(LIVE_USER_LOG), user.as_bytes()).await?;
    if let Some(provider) = provider {
        write_atomically(&work_dir.join(LIVE_PROVIDER_LOG), provider.as_bytes()).await?;
    }
    Ok(())
}

/// Replaces `path` whole, so a reader never sees a partial file.
pub(super) async fn write_atomically(path: &Path, contents: &[u8]) -> io::Result<()> {
    crate::shared::replace_file(path, crate::shared::Contents::Bytes(contents), None).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_split_into_lines_across_reads() {
        let mut splitter = LineSplitter::new(100);
        let mut lines = Vec::new();
        splitter.feed(b"one\ntw", |line| lines.push(line.to_string()));
        splitter.feed(b"o\r\n\nthree", |line| lines.push(line.to_string()));
        lines.extend(splitter.finish());
        assert_eq!(lines, ["one", "two", "", "three"]);
        assert_eq!(splitter.finish(), None);

        let mut lines = Vec::new();
        splitter.feed(b"bad \xff byte\n", |line| lines.push(line.to_string()));
        assert_eq!(lines, ["bad \u{fffd} byte"]);
    }

    #[test]
    fn an_endless_line_is_held_in_bounded_memory_with_its_tag_and_end() {
        let mut splitter = LineSplitter::new(10);
        splitter.feed(b"[PRIVATE] ", |_| {});
        for _ in 0..1000 {
            splitter.feed(b"abcdefghij", |_| {});
            assert!(splitter.pending.len() <= LINE_HEAD_BYTES + 20);
        }
        splitter.feed(b"END", |_| {});
        let line = splitter.finish().unwrap();
        assert!(line.starts_with("[PRIVATE] "));
        assert!(line.ends_with("ghijEND"));
        let mut router = LogRouter::new(true, 11);
        router.push_line(&line);
        assert!(router.provider.render().ends_with("]\ndefghijEND\n"));
    }
}
