//! The launcher's own output on the local runner. Its stdout (the job's output, echoed as a pod's
//! log would carry it) and its stderr (its own messages) come through pipes into `launcher.log`
//! in the job's work folder, bounded like the kept log: once the file holds the log size limit,
//! a line says it was cut and nothing more is written, so a job printing a GiB never leaves a GiB
//! file. The last lines of its stderr are kept in memory for the job's ending: when storage could
//! not take the exit record (a full disk), the launcher writes it there.

use std::collections::VecDeque;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::task::JoinHandle;

use crate::domain::lifecycle::{Trigger, exit_reason, signal_reason};

/// The ending the launcher's exit record says (its limit aside): a success; a function that
/// failed, with its exit code (or signal) and last exception line; a launch that failed before
/// the function ran, or a function whose result or logs could not be shipped, with the error.
pub fn ending_of(record: &Value) -> Trigger {
    let exception = record["exception"].as_str();
    match (record["exit_code"].as_i64(), record["signal"].as_i64(), record["error"].as_str()) {
        (Some(0), _, None) => Trigger::Exited { success: true },
        (Some(code), _, _) if code != 0 => Trigger::Crashed { reason: exit_reason(code, exception) },
        (None, Some(signal), _) => Trigger::Crashed { reason: signal_reason(signal, exception) },
        (_, _, Some(error)) => Trigger::Crashed { reason: error.to_string() },
        _ => Trigger::Exited { success: false },
    }
}

/// Lines of the launcher's stderr kept for the job's ending.
const KEPT_LINES: usize = 20;
/// Bytes kept of each of those lines.
const KEPT_LINE_BYTES: usize = 4096;

/// `launcher.log`, written up to its limit.
struct BoundedFile {
    file: Option<std::fs::File>,
    written: u64,
    limit: u64,
    cut: bool,
}

impl BoundedFile {
    /// Appends what fits; the first time something does not, a line saying so. Write errors (a
    /// full disk) are ignored: the job's own log and ending do not depend on this file.
    fn write(&mut self, bytes: &[u8]) {
        if self.cut {
            return;
        }
        let Some(file) = self.file.as_mut() else { return };
        let room = usize::try_from(self.limit.saturating_sub(self.written)).unwrap_or(usize::MAX);
        let kept = &bytes[..bytes.len().min(room)];
        if file.write_all(kept).is_err() {
            self.file = None;
            return;
        }
        self.written += kept.len() as u64;
        if kept.len() < bytes.len() {
            self.cut = true;
            let _ = write!(
                file,
                "\n[gantry: launcher.log stops at its limit of {} bytes (the log size limit); the job's log keeps its newest lines]\n",
                self.limit
            );
        }
    }
}

fn lock(file: &Mutex<BoundedFile>) -> std::sync::MutexGuard<'_, BoundedFile> {
    file.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Reads the launcher's stdout and stderr into `path` (at most `limit` bytes and a line saying
/// it was cut) until both close; the task's answer is the last lines of stderr.
pub fn collect(
    stdout: impl AsyncRead + Unpin + Send + 'static,
    stderr: impl AsyncRead + Unpin + Send + 'static,
    path: &Path,
    limit: u64,
) -> JoinHandle<Vec<String>> {
    let file = std::fs::File::create(path).ok();
    let file = Arc::new(Mutex::new(BoundedFile { file, written: 0, limit, cut: false }));
    let echo = tokio::spawn(copy(stdout, Arc::clone(&file), |_| {}));
    tokio::spawn(async move {
        let mut lines = Lines::default();
        copy(stderr, file, |bytes| lines.feed(bytes)).await;
        let _ = echo.await;
        lines.finish()
    })
}

async fn copy(mut pipe: impl AsyncRead + Unpin, file: Arc<Mutex<BoundedFile>>, mut also: impl FnMut(&[u8])) {
    let mut chunk = vec![0u8; 8 * 1024];
    loop {
        let read = match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        lock(&file).write(&chunk[..read]);
        also(&chunk[..read]);
    }
}

/// The last lines of a stream, each cut to its first `KEPT_LINE_BYTES`.
#[derive(Default)]
struct Lines {
    kept: VecDeque<String>,
    pending: Vec<u8>,
}

impl Lines {
    fn feed(&mut self, mut bytes: &[u8]) {
        while let Some(end) = bytes.iter().position(|b| *b == b'\n') {
            self.append(&bytes[..end]);
            self.end_line();
            bytes = &bytes[end + 1..];
        }
        self.append(bytes);
    }

    fn append(&mut self, bytes: &[u8]) {
        let room = KEPT_LINE_BYTES.saturating_sub(self.pending.len());
        self.pending.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn end_line(&mut self) {
        let line = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        if self.kept.len() == KEPT_LINES {
            self.kept.pop_front();
        }
        self.kept.push_back(line);
    }

    fn finish(mut self) -> Vec<String> {
        if !self.pending.is_empty() {
            self.end_line();
        }
        self.kept.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_stops_at_its_limit_with_a_line_saying_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("launcher.log");
        let mut file = BoundedFile { file: std::fs::File::create(&path).ok(), written: 0, limit: 10, cut: false };
        file.write(b"12345");
        file.write(b"67890abc");
        file.write(b"more");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("1234567890\n[gantry: launcher.log stops at its limit of 10 bytes"), "{text}");
        assert!(!text.contains("abc") && !text.contains("more"), "{text}");
    }

    #[test]
    fn the_last_lines_are_kept_cut_to_their_start() {
        let mut lines = Lines::default();
        for n in 0..30 {
            lines.feed(format!("line {n}\n").as_bytes());
        }
        lines.feed(&vec![b'x'; 10_000]);
        lines.feed(b"\nlast");
        let kept = lines.finish();
        assert_eq!(kept.len(), KEPT_LINES);
        assert_eq!(kept[0], "line 12");
        assert_eq!(kept[KEPT_LINES - 2].len(), KEPT_LINE_BYTES);
        assert_eq!(kept[KEPT_LINES - 1], "last");
    }

    #[tokio::test]
    async fn both_pipes_go_to_the_file_and_stderr_lines_are_answered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("launcher.log");
        let stdout: &[u8] = &[b'o'; 100_000];
        let stderr: &[u8] = b"gantry launch: first\ngantry launch: second\n";
        let lines = collect(stdout, stderr, &path, 1000).await.unwrap();
        assert_eq!(lines, ["gantry launch: first", "gantry launch: second"]);
        assert!(std::fs::metadata(&path).unwrap().len() < 1200);
    }

    #[test]
    fn an_exit_record_says_how_the_job_ended() {
        let ending = |record: Value| ending_of(&record);
        let crashed = |reason: &str| Trigger::Crashed { reason: reason.into() };
        let record = |code: Value, signal: Value, error: Value, exception: Value| serde_json::json!({"exit_code": code, "signal": signal, "error": error, "limit": null, "exception": exception});
        let null = Value::Null;
        assert_eq!(
            ending(record(0.into(), null.clone(), null.clone(), null.clone())),
            Trigger::Exited { success: true }
        );
        let raised = record(1.into(), null.clone(), null.clone(), "ZeroDivisionError: division by zero".into());
        assert_eq!(ending(raised), crashed("exit code 1: ZeroDivisionError: division by zero"));
        assert_eq!(ending(record(3.into(), null.clone(), null.clone(), null.clone())), crashed("exit code 3"));
        assert_eq!(ending(record(null.clone(), 9.into(), null.clone(), null.clone())), crashed("ended by signal 9"));
        let unshipped = record(0.into(), null.clone(), "failed to upload jobs/x/result.json".into(), null.clone());
        assert_eq!(ending(unshipped), crashed("failed to upload jobs/x/result.json"));
        let not_started = record(null.clone(), null.clone(), "failed to find the entrypoint".into(), null.clone());
        assert_eq!(ending(not_started), crashed("failed to find the entrypoint"));
        assert_eq!(ending(record(null.clone(), null.clone(), null.clone(), null)), Trigger::Exited { success: false });
    }
}
