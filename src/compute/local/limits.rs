//! Bounds of the local runner's process jobs: each job (its launcher and everything the function
//! starts, as in a pod) gets its function size's memory, a number of processes and a largest
//! file. Memory and processes are enforced by a cgroup of the job's own where the machine lets
//! the server make one (cgroup v2 where its cgroup is delegated, else, as root on cgroup v1, the
//! memory and pids controllers), and otherwise by rlimits the launcher sets on the function's
//! process (`RLIMIT_DATA`, `RLIMIT_NPROC`); the largest file is always `RLIMIT_FSIZE`. The job's
//! cgroups live below the server's own, in a folder named after its work folders, so servers
//! sharing a machine never touch each other's; they are removed (their processes killed) when
//! the job ends, and stale ones at start.

use std::collections::HashSet;
use std::ffi::{CString, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

use crate::db::jobs::Launch;
use crate::domain::lifecycle::{LimitHit, limit_kind};
use crate::domain::sizes;
use crate::domain::usage::Allocation;

/// The words of the exit record and of `limit_reached` for the kinds of limit.
const MEMORY: &str = limit_kind::MEMORY;
const PROCESSES: &str = limit_kind::PROCESSES;

/// The bounds of every process job of this runner, and how they are enforced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobLimits {
    /// Cgroups for memory and processes; `None`: rlimits.
    pub cgroups: Option<Cgroups>,
    /// Processes (and threads) of one job at once.
    pub processes: u64,
    /// Largest file a job may write, in bytes.
    pub file_bytes: u64,
}

/// What a job's processes used, where the runner could tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Used {
    /// CPU milliseconds, user and system.
    pub cpu_ms: Option<i64>,
    pub memory_peak_bytes: Option<i64>,
}

/// Where this runner makes its jobs' cgroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cgroups {
    /// One cgroup per job below `parent`, with the memory and pids controllers.
    V2 { parent: PathBuf },
    /// One cgroup per job below each parent, in the memory and the pids hierarchy.
    V1 { memory: PathBuf, pids: PathBuf },
}

/// The cgroup folders of one job (none under rlimits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobCgroup {
    version: u8,
    /// v2: the job's cgroup; v1: its memory cgroup, then its pids cgroup.
    folders: Vec<PathBuf>,
}

/// Name of a job's cgroup.
fn job_folder(job_id: &str) -> String {
    format!("job-{job_id}")
}

impl JobLimits {
    /// Bounds enforced by rlimits only.
    pub fn rlimits(processes: u64, file_bytes: u64) -> JobLimits {
        JobLimits { cgroups: None, processes, file_bytes }
    }

    /// Bounds enforced by the best mechanism this machine lets this process use (see the
    /// module's comment); `work_root` names this server's folder of job cgroups.
    pub fn detect(work_root: &Path, processes: u64, file_bytes: u64) -> JobLimits {
        let name = format!("gantry-{:016x}", fnv1a(work_root.as_os_str().as_encoded_bytes()));
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let cgroups = delegated_v2(&own, &mounts, &name).or_else(|| writable_v1(&own, &mounts, &name));
        JobLimits { cgroups, processes, file_bytes }
    }

    /// One line for the start-up report: what bounds a job and how.
    pub fn describe(&self) -> String {
        let how = match &self.cgroups {
            Some(Cgroups::V2 { parent }) => format!("cgroup v2 memory+pids (in {})", parent.display()),
            Some(Cgroups::V1 { memory, pids }) => {
                format!("cgroup v1 memory+pids (in {} and {})", memory.display(), pids.display())
            }
            None => "rlimits (RLIMIT_DATA for memory, RLIMIT_NPROC for processes, per process and per user)".into(),
        };
        format!(
            "job limits: {how}; memory by function size, {} processes a job, RLIMIT_FSIZE {} MiB a file",
            self.processes,
            self.file_bytes >> 20
        )
    }

    /// The cgroup folders of `job_id` (they may not exist).
    pub fn cgroup_of(&self, job_id: &str) -> Option<JobCgroup> {
        Some(match self.cgroups.as_ref()? {
            Cgroups::V2 { parent } => JobCgroup { version: 2, folders: vec![parent.join(job_folder(job_id))] },
            Cgroups::V1 { memory, pids } => {
                JobCgroup { version: 1, folders: vec![memory.join(job_folder(job_id)), pids.join(job_folder(job_id))] }
            }
        })
    }

    /// Makes the job's cgroup with its limits (blocking). A leftover of the same job is
    /// emptied first.
    pub fn create(&self, job_id: &str, memory_bytes: u64) -> io::Result<Option<JobCgroup>> {
        let Some(cgroup) = self.cgroup_of(job_id) else { return Ok(None) };
        cgroup.remove();
        for folder in &cgroup.folders {
            std::fs::create_dir(folder)?;
        }
        let made = (|| {
            if cgroup.version == 2 {
                let folder = &cgroup.folders[0];
                std::fs::write(folder.join("memory.max"), memory_bytes.to_string())?;
                // No swap beyond the memory limit (absent without swap accounting).
                let _ = std::fs::write(folder.join("memory.swap.max"), "0");
                std::fs::write(folder.join("pids.max"), self.processes.to_string())
            } else {
                std::fs::write(cgroup.folders[0].join("memory.limit_in_bytes"), memory_bytes.to_string())?;
                let _ = std::fs::write(cgroup.folders[0].join("memory.memsw.limit_in_bytes"), memory_bytes.to_string());
                std::fs::write(cgroup.folders[1].join("pids.max"), self.processes.to_string())
            }
        })();
        if let Err(error) = made {
            cgroup.remove();
            return Err(error);
        }
        Ok(Some(cgroup))
    }

    /// The flags that make `gantry launch` set rlimits on the function's process: the file size
    /// always, memory and processes when no cgroup bounds them.
    pub fn launcher_args(&self, memory_bytes: u64, in_cgroup: bool) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["--limit-file-bytes".into(), self.file_bytes.to_string().into()];
        if !in_cgroup {
            args.extend([
                "--limit-memory-bytes".into(),
                memory_bytes.to_string().into(),
                "--limit-processes".into(),
                self.processes.to_string().into(),
            ]);
        }
        args
    }

    /// Removes the (empty) folders this runner's job cgroups are made in, for a runner that
    /// ends for good (a test's); a folder still holding a job's cgroup stays.
    pub fn remove_folders(&self) {
        let parents = match &self.cgroups {
            Some(Cgroups::V2 { parent }) => vec![parent.clone()],
            Some(Cgroups::V1 { memory, pids }) => vec![memory.clone(), pids.clone()],
            None => Vec::new(),
        };
        for parent in parents {
            let _ = std::fs::remove_dir(parent);
        }
    }

    /// Removes every job cgroup of this runner but those of `keep` (jobs still running),
    /// killing what is left in them: what a server killed before its jobs ended left (blocking).
    /// Returns how many were removed.
    pub fn remove_stale(&self, keep: &HashSet<String>) -> usize {
        let parents = match &self.cgroups {
            Some(Cgroups::V2 { parent }) => vec![parent.clone()],
            Some(Cgroups::V1 { memory, pids }) => vec![memory.clone(), pids.clone()],
            None => return 0,
        };
        let mut stale = HashSet::new();
        for parent in parents {
            for entry in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if let Some(job_id) = name.strip_prefix("job-")
                    && entry.path().is_dir()
                    && !keep.contains(job_id)
                {
                    stale.insert(job_id.to_string());
                }
            }
        }
        for job_id in &stale {
            if let Some(cgroup) = self.cgroup_of(job_id) {
                cgroup.remove();
            }
        }
        stale.len()
    }
}

impl JobCgroup {
    /// The `cgroup.procs` files a process writes `0` to, to join the job's cgroup.
    pub fn procs_files(&self) -> Vec<CString> {
        use std::os::unix::ffi::OsStrExt;
        self.folders
            .iter()
            .map(|folder| CString::new(folder.join("cgroup.procs").as_os_str().as_bytes()).expect("no NUL in a path"))
            .collect()
    }

    /// The folders of the job's cgroup (one on v2, memory then pids on v1).
    pub fn folders(&self) -> &[PathBuf] {
        &self.folders
    }

    /// Which limit the job reached, from the kernel's counters: a process killed at the memory
    /// limit, or a process refused at the process limit (a `limit_kind`; the figures are the
    /// caller's).
    pub fn limit_reached(&self) -> Option<&'static str> {
        let counter = |file: PathBuf, name: &str| -> u64 {
            std::fs::read_to_string(file).ok().map_or(0, |text| event_count(&text, name))
        };
        let (memory, pids) = match self.version {
            2 => (self.folders[0].join("memory.events"), self.folders[0].join("pids.events")),
            _ => (self.folders[0].join("memory.oom_control"), self.folders[1].join("pids.events")),
        };
        if counter(memory, "oom_kill") > 0 {
            Some(MEMORY)
        } else if counter(pids, "max") > 0 {
            Some(PROCESSES)
        } else {
            None
        }
    }

    /// What the job's processes used, from the kernel's counters: CPU milliseconds (v2's
    /// `cpu.stat`; v1 keeps no CPU account here) and peak memory in bytes (v2's `memory.peak`,
    /// v1's `memory.max_usage_in_bytes`); each `None` where the kernel does not say.
    pub fn used(&self) -> (Option<i64>, Option<i64>) {
        let read = |file: PathBuf| std::fs::read_to_string(file).ok();
        let folder = &self.folders[0];
        if self.version == 2 {
            let cpu = read(folder.join("cpu.stat")).and_then(|text| {
                text.lines().find_map(|line| line.strip_prefix("usage_usec ")?.trim().parse::<i64>().ok())
            });
            let peak = read(folder.join("memory.peak")).and_then(|text| text.trim().parse::<i64>().ok());
            (cpu.map(|micros| micros / 1000), peak)
        } else {
            (None, read(folder.join("memory.max_usage_in_bytes")).and_then(|text| text.trim().parse::<i64>().ok()))
        }
    }

    /// Kills every process left in the job's cgroup and removes it (blocking; a missing one is
    /// fine). Gives up after a few seconds (a process stuck in the kernel), leaving it for the
    /// next start.
    pub fn remove(&self) {
        if self.version == 2 {
            let _ = std::fs::write(self.folders[0].join("cgroup.kill"), "1");
        }
        for _ in 0..250 {
            let mut left = false;
            for folder in &self.folders {
                let Ok(text) = std::fs::read_to_string(folder.join("cgroup.procs")) else { continue };
                for pid in text.lines().filter_map(|line| line.trim().parse::<libc::pid_t>().ok()) {
                    left = true;
                    // SAFETY: kill(2) has no memory-safety preconditions.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                    }
                }
            }
            if !left {
                let removed = self.folders.iter().all(|folder| match std::fs::remove_dir(folder) {
                    Ok(()) => true,
                    Err(error) => error.kind() == io::ErrorKind::NotFound,
                });
                if removed {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::warn!(cgroup = %self.folders[0].display(), "could not empty and remove a job's cgroup");
    }
}

/// In a forked child before exec: joins the cgroups whose `cgroup.procs` files are given.
/// Only system calls on what the caller prepared: nothing allocates.
pub fn join(procs_files: &[CString]) -> io::Result<()> {
    for file in procs_files {
        // SAFETY: open/write/close on a NUL-terminated path and a static buffer.
        unsafe {
            let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let written = libc::write(fd, b"0".as_ptr().cast(), 1);
            let error = io::Error::last_os_error();
            libc::close(fd);
            if written != 1 {
                return Err(error);
            }
        }
    }
    Ok(())
}

/// The value of `name` in a `key value` counter file (`memory.events`, `pids.events`,
/// `memory.oom_control`); 0 when absent.
fn event_count(text: &str, name: &str) -> u64 {
    text.lines()
        .filter_map(|line| line.split_once(' '))
        .find(|(key, _)| *key == name)
        .and_then(|(_, value)| value.trim().parse().ok())
        .unwrap_or(0)
}

/// FNV-1a: a stable short name for a folder.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3))
}

/// A mounted cgroup hierarchy: its mount point, the root of it that is mounted, its file system
/// type and super options (the v1 controllers).
struct Mount {
    point: PathBuf,
    root: String,
    fstype: String,
    options: String,
}

fn mounts(mountinfo: &str) -> Vec<Mount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let fields: Vec<&str> = before.split(' ').collect();
            let after: Vec<&str> = after.split(' ').collect();
            Some(Mount {
                point: PathBuf::from(unescape(fields.get(4)?)),
                root: unescape(fields.get(3)?),
                fstype: after.first()?.to_string(),
                options: after.get(2).copied().unwrap_or_default().to_string(),
            })
        })
        .collect()
}

/// mountinfo's octal escapes (`\040` for a space).
fn unescape(text: &str) -> String {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(value) = bytes.get(i + 1..i + 4).and_then(|digits| std::str::from_utf8(digits).ok())
            && let Ok(value) = u8::from_str_radix(value, 8)
        {
            out.push(value);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The folder of this process's cgroup in the hierarchy mounted by `mount`, from its
/// `/proc/self/cgroup` path.
fn folder_of(mount: &Mount, path: &str) -> PathBuf {
    let relative = path.strip_prefix(mount.root.trim_end_matches('/')).unwrap_or(path);
    mount.point.join(relative.trim_start_matches('/'))
}

/// The server's cgroup v2 folder, when it may make cgroups with the memory and pids
/// controllers below it: then the folder of this runner's jobs, ready.
fn delegated_v2(own: &str, mountinfo: &str, name: &str) -> Option<Cgroups> {
    let path = own.lines().find_map(|line| line.strip_prefix("0::"))?;
    let mount = mounts(mountinfo).into_iter().find(|m| m.fstype == "cgroup2")?;
    let folder = folder_of(&mount, path);
    let controllers = std::fs::read_to_string(folder.join("cgroup.controllers")).ok()?;
    let offered: Vec<&str> = controllers.split_whitespace().collect();
    if !offered.contains(&"memory") || !offered.contains(&"pids") {
        return None;
    }
    let enable = |folder: &Path| std::fs::write(folder.join("cgroup.subtree_control"), "+memory +pids");
    if enable(&folder).is_err() {
        // A cgroup holding processes cannot hand controllers down: the server moves itself
        // into a leaf of its own first (what a delegated service does).
        let leaf = folder.join("gantry-server");
        std::fs::create_dir_all(&leaf).ok()?;
        std::fs::write(leaf.join("cgroup.procs"), std::process::id().to_string()).ok()?;
        enable(&folder).ok()?;
    }
    let parent = folder.join(name);
    std::fs::create_dir_all(&parent).ok()?;
    enable(&parent).ok()?;
    Some(Cgroups::V2 { parent })
}

/// The server's memory and pids cgroups of cgroup v1, when it may make cgroups below them
/// (as root): then the folders of this runner's jobs, ready.
fn writable_v1(own: &str, mountinfo: &str, name: &str) -> Option<Cgroups> {
    let mounts = mounts(mountinfo);
    let folder = |controller: &str| -> Option<PathBuf> {
        let path = own.lines().find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers.split(',').any(|c| c == controller).then_some(path)
        })?;
        let mount =
            mounts.iter().find(|m| m.fstype == "cgroup" && m.options.split(',').any(|option| option == controller))?;
        let parent = folder_of(mount, path).join(name);
        std::fs::create_dir_all(&parent).ok()?;
        Some(parent)
    };
    Some(Cgroups::V1 { memory: folder("memory")?, pids: folder("pids")? })
}

/// The local runner's use of its job limits.
impl super::LocalRunner {
    /// The job's memory limit in bytes: its size's memory, as a container or pod of it gets.
    pub(super) fn memory_bytes(&self, loaded: &Launch) -> u64 {
        let Launch { job, info } = loaded;
        let catalog: Map<String, Value> =
            info.function_sizes.as_deref().and_then(|s| serde_json::from_str(s).ok()).unwrap_or_default();
        let default = self.config.containers.default_resources();
        let resources = sizes::job_resources(&catalog, job.function_size.as_deref(), job.gpu, &default);
        sizes::memory_bytes(&resources.memory).or_else(|| sizes::memory_bytes(&default.memory)).unwrap_or(u64::MAX)
    }

    /// What the job is given (its size's resources, else the default), as the usage ledger
    /// records it.
    pub(super) fn allocation(&self, loaded: &Launch) -> Allocation {
        let Launch { job, info } = loaded;
        let catalog: Map<String, Value> =
            info.function_sizes.as_deref().and_then(|s| serde_json::from_str(s).ok()).unwrap_or_default();
        let default = self.config.containers.default_resources();
        let resources = sizes::job_resources(&catalog, job.function_size.as_deref(), job.gpu, &default);
        Allocation::of(&resources, sizes::job_profile(&catalog, job.function_size.as_deref()))
    }

    /// Makes the job's cgroup; `None` under rlimits, or when it cannot be made (then rlimits
    /// bound the job, and the reason is logged).
    pub(super) async fn job_cgroup(&self, job_id: &str, memory_bytes: u64) -> Option<JobCgroup> {
        let job_limits = self.config.job_limits.clone();
        let id = job_id.to_string();
        match tokio::task::spawn_blocking(move || job_limits.create(&id, memory_bytes)).await {
            Ok(Ok(cgroup)) => cgroup,
            Ok(Err(error)) => {
                tracing::warn!(job.id = %job_id, error = &error as &dyn std::error::Error, "failed to make the job's cgroup; rlimits bound it instead");
                None
            }
            Err(_) => None,
        }
    }

    /// Removes the cgroups a previous run left (jobs it was running when it was killed and that
    /// were not adopted): their processes are killed.
    pub(super) async fn remove_stale_cgroups(&self) {
        let keep: HashSet<String> = self.processes.lock().expect("lock").keys().cloned().collect();
        let job_limits = self.config.job_limits.clone();
        match tokio::task::spawn_blocking(move || job_limits.remove_stale(&keep)).await {
            Ok(0) | Err(_) => {}
            Ok(removed) => tracing::info!(removed, "removed the cgroups of jobs a previous run left"),
        }
    }

    /// Which limit a failed job reached (its cgroup's counters, else what the launcher could
    /// tell: `limit` of its exit record) and what it used (`Used`: its cgroup's counters, else
    /// its exit record's); the job's cgroup is removed, whatever is left in it killed.
    pub(super) async fn limit_reached(
        &self,
        job_id: &str,
        failed: bool,
        record: Option<&Value>,
    ) -> (Option<LimitHit>, Used) {
        let cgroup = self.config.job_limits.cgroup_of(job_id);
        let (counted, (cpu, peak)) = tokio::task::spawn_blocking(move || {
            let Some(cgroup) = cgroup else { return (None, (None, None)) };
            let reached = cgroup.limit_reached();
            let used = cgroup.used();
            cgroup.remove();
            (reached, used)
        })
        .await
        .unwrap_or((None, (None, None)));
        let said = |field: &str| record.and_then(|r| r[field].as_i64());
        let used = Used {
            cpu_ms: cpu.or_else(|| said("cpu_used_ms")),
            memory_peak_bytes: peak.or_else(|| said("memory_peak_bytes")),
        };
        (self.limit_hit(job_id, failed, counted.or_else(|| record.and_then(|r| r["limit"].as_str()))).await, used)
    }

    /// The limit of kind `kind` a failed job reached, with its figures.
    async fn limit_hit(&self, job_id: &str, failed: bool, kind: Option<&str>) -> Option<LimitHit> {
        let kind = kind?;
        if !failed {
            return None;
        }
        let memory_bytes = match self.load(job_id).await {
            Ok(loaded) => self.memory_bytes(&loaded),
            Err(_) => 0,
        };
        let limits = &self.config.job_limits;
        LimitHit::of_kind(kind, memory_bytes, limits.processes, limits.file_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_from_the_kernels_files() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(event_count(v1, "oom_kill"), 2);
        let v2 = "low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(event_count(v2, "oom_kill"), 1);
        assert_eq!(event_count(v2, "max"), 5);
        assert_eq!(event_count("max 0\n", "max"), 0);
        assert_eq!(event_count("", "max"), 0);
    }

    #[test]
    fn cgroup_folders_are_found_from_the_mounts_and_the_process_path() {
        let mountinfo = "\
30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
31 25 0:27 / /sys/fs/cgroup/pids rw,relatime shared:10 - cgroup cgroup rw,pids
32 25 0:28 / /sys/fs/cgroup/unified rw,relatime shared:11 - cgroup2 cgroup2 rw
33 25 0:29 /kube/pod1 /sys/fs/cgroup/cpu\\040x rw - cgroup cgroup rw,cpu";
        let found = mounts(mountinfo);
        assert_eq!(found.len(), 4);
        let memory = found.iter().find(|m| m.options.contains("memory")).unwrap();
        assert_eq!(folder_of(memory, "/process_api/abc"), PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"));
        assert_eq!(folder_of(memory, "/"), PathBuf::from("/sys/fs/cgroup/memory"));
        let cpu = &found[3];
        assert_eq!(cpu.point, PathBuf::from("/sys/fs/cgroup/cpu x"));
        assert_eq!(folder_of(cpu, "/kube/pod1/inner"), PathBuf::from("/sys/fs/cgroup/cpu x/inner"));
        assert_eq!(found[2].fstype, "cgroup2");
    }

    #[test]
    fn rlimits_carry_memory_and_processes_only_without_a_cgroup() {
        let limits = JobLimits::rlimits(64, 1 << 20);
        let args = |in_cgroup| {
            limits.launcher_args(1 << 30, in_cgroup).into_iter().map(|a| a.into_string().unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(args(true), ["--limit-file-bytes", "1048576"]);
        assert_eq!(
            args(false),
            ["--limit-file-bytes", "1048576", "--limit-memory-bytes", "1073741824", "--limit-processes", "64"]
        );
        assert!(limits.describe().starts_with("job limits: rlimits"), "{}", limits.describe());
        assert_eq!(limits.cgroup_of("x"), None);
    }

    #[test]
    fn each_server_has_its_own_folder_of_job_cgroups() {
        assert_ne!(fnv1a(b"/data/a/jobs"), fnv1a(b"/data/b/jobs"));
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    }
}
