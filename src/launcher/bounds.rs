//! The rlimits the launcher sets on the function's process when the local runner asks (a job
//! not bounded by a cgroup, and the largest file of every local job), and how a failed job's
//! last output line tells that it reached one of them: Python turns a refused allocation into
//! `MemoryError`, a refused fork into `[Errno 11]`, a write past the file size into `[Errno 27]`
//! (it ignores `SIGXFSZ`).

use crate::domain::lifecycle::limit_kind;

/// Limits of the function's processes, set with `setrlimit` before python executes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::Args)]
pub struct ProcessLimits {
    /// `RLIMIT_DATA` of the function's processes, in bytes (each process's memory).
    #[arg(long = "limit-memory-bytes", env = "GANTRY_LIMIT_MEMORY_BYTES")]
    pub memory_bytes: Option<u64>,
    /// `RLIMIT_NPROC` of the function's processes (counted over all processes of its user).
    #[arg(long = "limit-processes", env = "GANTRY_LIMIT_PROCESSES")]
    pub processes: Option<u64>,
    /// `RLIMIT_FSIZE` of the function's processes: the largest file they may write, in bytes.
    #[arg(long = "limit-file-bytes", env = "GANTRY_LIMIT_FILE_BYTES")]
    pub file_bytes: Option<u64>,
}

impl ProcessLimits {
    /// Makes `command`'s child set the limits on itself before it executes.
    pub fn apply_to(self, command: &mut tokio::process::Command) {
        if self == ProcessLimits::default() {
            return;
        }
        // SAFETY: the closure runs in the forked child before exec and only calls setrlimit on
        // stack values: no allocation, no lock.
        unsafe {
            command.pre_exec(move || {
                let set = |resource, value: Option<u64>| -> std::io::Result<()> {
                    let Some(value) = value else { return Ok(()) };
                    let limit = libc::rlimit { rlim_cur: value, rlim_max: value };
                    if libc::setrlimit(resource, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                };
                set(libc::RLIMIT_DATA, self.memory_bytes)?;
                set(libc::RLIMIT_NPROC, self.processes)?;
                set(libc::RLIMIT_FSIZE, self.file_bytes)
            });
        }
    }

    /// The limit (a `limit_kind`) a failed function reached, from the last line it wrote (the
    /// exception of its traceback); only limits set here count.
    pub fn reached(&self, last_line: &str) -> Option<&'static str> {
        let line = last_line.trim();
        if self.memory_bytes.is_some() && (line == "MemoryError" || line.starts_with("MemoryError:")) {
            return Some(limit_kind::MEMORY);
        }
        if self.file_bytes.is_some() && line.contains("[Errno 27] File too large") {
            return Some(limit_kind::FILE_SIZE);
        }
        if self.processes.is_some() && line.contains("[Errno 11] Resource temporarily unavailable") {
            return Some(limit_kind::PROCESSES);
        }
        None
    }
}

/// Lowers the launcher's own standing with the kernel's out-of-memory killer (when it may), so
/// that in a job's cgroup the function's processes are killed first and the launcher lives to
/// record how the job ended. Called once the function's process is started: it keeps its own.
pub fn prefer_the_job_for_oom_kills() {
    let _ = std::fs::write("/proc/self/oom_score_adj", "-500");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_functions_last_line_names_the_limit_it_reached() {
        let all = ProcessLimits { memory_bytes: Some(1), processes: Some(2), file_bytes: Some(3) };
        assert_eq!(all.reached("MemoryError"), Some("memory"));
        assert_eq!(all.reached("MemoryError: cannot allocate"), Some("memory"));
        assert_eq!(all.reached("OSError: [Errno 27] File too large"), Some("file_size"));
        assert_eq!(all.reached("BlockingIOError: [Errno 11] Resource temporarily unavailable"), Some("processes"));
        assert_eq!(all.reached("RuntimeError: this function failed on purpose"), None);
        assert_eq!(all.reached("NotAMemoryError"), None);
        let file_only = ProcessLimits { file_bytes: Some(3), ..ProcessLimits::default() };
        assert_eq!(file_only.reached("MemoryError"), None, "a cgroup bounds memory: its counters say");
        assert_eq!(file_only.reached("OSError: [Errno 27] File too large"), Some("file_size"));
    }

    #[test]
    fn a_child_gets_its_limits() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let output = runtime.block_on(async {
            let mut command = tokio::process::Command::new("cat");
            command.arg("/proc/self/limits");
            ProcessLimits { memory_bytes: Some(512 << 20), processes: None, file_bytes: Some(1 << 20) }
                .apply_to(&mut command);
            command.output().await.unwrap()
        });
        let limits = String::from_utf8_lossy(&output.stdout);
        let soft = |name: &str| {
            let line = limits.lines().find(|line| line.starts_with(name)).unwrap();
            line[name.len()..].split_whitespace().next().unwrap().to_string()
        };
        assert_eq!(soft("Max file size"), "1048576");
        assert_eq!(soft("Max data size"), (512u64 << 20).to_string());
    }
}
