//! Faults a test puts on the machine and always lifts, even when the test fails: a small tmpfs
//! mounted over a folder (storage full), a file made immutable (a database file that cannot be
//! written), a private PostgreSQL cluster stopped and started (never the machine's own server).
//! They need root; without it (or without the tool) a test skips with the reason printed, but
//! under `CI=true` it fails, so the fault table cannot silently shrink in CI.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether the fault `what` can be put here; `false` (after printing why) when the test should
/// skip. Panics under `CI=true` instead of skipping.
pub fn can_inject(what: &str, why_not: Option<String>) -> bool {
    let Some(why_not) = why_not else { return true };
    if std::env::var("CI").is_ok_and(|ci| ci == "true") {
        panic!("CI=true and the fault '{what}' cannot be put on this machine: {why_not}");
    }
    eprintln!("skipped: the fault '{what}' cannot be put on this machine: {why_not}");
    false
}

/// Why faults needing root cannot be put here, if they cannot.
pub fn root_missing() -> Option<String> {
    // SAFETY: geteuid(2) has no preconditions.
    (unsafe { libc::geteuid() } != 0).then(|| "the tests do not run as root".to_string())
}

fn run(program: &str, arguments: &[&str]) -> Result<(), String> {
    let output = Command::new(program).args(arguments).output().map_err(|e| format!("{program}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!("{program} {}: {}", arguments.join(" "), String::from_utf8_lossy(&output.stderr).trim()))
    }
}

/// A tmpfs of a few KiB mounted over a folder, unmounted when dropped.
pub struct Tmpfs {
    folder: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size_kib` KiB over `folder` (created if missing).
    pub fn mount(folder: &Path, size_kib: u64) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(folder).map_err(|e| format!("create {}: {e}", folder.display()))?;
        let folder_text = folder.display().to_string();
        run("mount", &["-t", "tmpfs", "-o", &format!("size={size_kib}k,mode=0755"), "tmpfs", &folder_text])?;
        Ok(Tmpfs { folder: folder.to_path_buf() })
    }

    /// Fills the tmpfs with `name` until no byte more fits.
    pub fn fill(&self, name: &str) {
        use std::io::Write;
        let mut file = std::fs::File::create(self.folder.join(name)).expect("filler file");
        let block = vec![0u8; 4096];
        loop {
            if let Err(error) = file.write_all(&block) {
                assert_eq!(error.raw_os_error(), Some(libc::ENOSPC), "filling {}: {error}", self.folder.display());
                break;
            }
        }
        // A last partial block, so not even a byte is free.
        while file.write(&[0u8]).is_ok_and(|n| n == 1) {}
    }

    /// Remounts it read-only (`true`) or writable again.
    pub fn set_read_only(&self, read_only: bool) {
        let options = if read_only { "remount,ro" } else { "remount,rw" };
        run("mount", &["-o", options, &self.folder.display().to_string()]).expect("remount");
    }

    /// Every file below the mount, relative to it.
    pub fn files(&self) -> Vec<String> {
        let mut files = Vec::new();
        let mut folders = vec![self.folder.clone()];
        while let Some(folder) = folders.pop() {
            for entry in std::fs::read_dir(&folder).expect("read the mount").flatten() {
                let path = entry.path();
                if path.is_dir() {
                    folders.push(path);
                } else {
                    files.push(path.strip_prefix(&self.folder).unwrap().display().to_string());
                }
            }
        }
        files.sort();
        files
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let folder = self.folder.display().to_string();
        if run("umount", &[&folder]).is_err() {
            // Busy (a file still open): detach it now, the kernel frees it when the last user goes.
            let _ = run("umount", &["-l", &folder]);
        }
    }
}

/// Files made immutable (`chattr +i`: not even root may write them), made mutable again when
/// dropped.
pub struct Immutable {
    paths: Vec<PathBuf>,
}

impl Immutable {
    pub fn set(paths: &[PathBuf]) -> Result<Immutable, String> {
        let mut guard = Immutable { paths: Vec::new() };
        for path in paths {
            run("chattr", &["+i", &path.display().to_string()])?;
            guard.paths.push(path.clone());
        }
        Ok(guard)
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        for path in &self.paths {
            let _ = run("chattr", &["-i", &path.display().to_string()]);
        }
    }
}

/// A throw-away PostgreSQL cluster of its own (initdb as the `postgres` user, on a free port,
/// in a temporary folder), stopped and removed when dropped.
pub struct PrivateCluster {
    bin: PathBuf,
    folder: tempfile::TempDir,
    port: u16,
}

impl PrivateCluster {
    /// Why no private cluster can be made here, if it cannot.
    pub fn missing() -> Option<String> {
        if let Some(why) = root_missing() {
            return Some(why);
        }
        match Self::bin() {
            None => Some("no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/initdb)".into()),
            Some(_) => None,
        }
    }

    fn bin() -> Option<PathBuf> {
        let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .flatten()
            .map(|entry| entry.path().join("bin"))
            .filter(|bin| bin.join("initdb").is_file())
            .collect();
        versions.sort();
        versions.pop()
    }

    pub fn start() -> PrivateCluster {
        let bin = Self::bin().expect("PostgreSQL binaries (check PrivateCluster::missing first)");
        let folder = tempfile::tempdir().expect("cluster folder");
        run("chown", &["postgres:postgres", &folder.path().display().to_string()]).expect("chown the cluster folder");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let cluster = PrivateCluster { bin, folder, port };
        let data = cluster.data();
        cluster
            .as_postgres(
                "initdb",
                &["-D", &data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8", "--locale=C.UTF-8"],
            )
            .expect("initdb");
        cluster.up().expect("start the private cluster");
        cluster
    }

    fn data(&self) -> String {
        self.folder.path().join("data").display().to_string()
    }

    fn as_postgres(&self, tool: &str, arguments: &[&str]) -> Result<(), String> {
        let tool = self.bin.join(tool).display().to_string();
        let mut all = vec!["-u", "postgres", "--", &tool];
        all.extend_from_slice(arguments);
        run("runuser", &all)
    }

    /// Starts the server (again), waiting until it accepts connections.
    pub fn up(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off",
            self.port,
            self.folder.path().display()
        );
        let log = self.folder.path().join("server.log").display().to_string();
        self.as_postgres("pg_ctl", &["-D", &self.data(), "-l", &log, "-w", "-o", &options, "start"])
    }

    /// Stops the server: `fast` (what a restart does: connections terminated, a clean shutdown)
    /// or `immediate` (as if killed: crash recovery at the next start).
    pub fn down(&self, mode: &str) {
        self.as_postgres("pg_ctl", &["-D", &self.data(), "-m", mode, "-w", "stop"]).expect("stop the private cluster");
    }

    /// A superuser's URL of its `postgres` database.
    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = self.as_postgres("pg_ctl", &["-D", &self.data(), "-m", "immediate", "-w", "stop"]);
    }
}
