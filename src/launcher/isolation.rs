//! Isolation of the jobs of the local runner. User code runs on the server's machine, so each
//! job's process is confined before it executes python: Landlock lets it write only its own
//! folders (its code, a private temporary folder and `DATA_PATH`, all inside its work folder)
//! and read only those and what running Python needs; it cannot signal, trace or connect to the
//! abstract sockets of processes outside its own sandbox (other jobs, its launcher, the server).
//! When the server runs as root, the job also runs as an unprivileged user. The launcher and the
//! server make themselves non-dumpable, so no process of the same user can read their memory,
//! environment or file descriptors through `/proc`.
//!
//! The launcher builds the rules before it forks (`Sandbox::prepare`); the forked child only
//! adds its own `/proc/<pid>` and enforces them, with plain system calls (nothing that could
//! allocate runs between fork and exec).

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use landlock::{ABI, Access, AccessFs, BitFlags, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, Scope};

/// The user jobs run as when the server runs as root and none is configured (`nobody`).
pub const DEFAULT_JOB_ID: u32 = 65534;
/// The Landlock ABI whose rights are asked for: filesystem rights including device ioctls
/// (ABI 5) and the signal and abstract socket scopes (ABI 6). Older kernels get what they offer.
const TARGET_ABI: ABI = ABI::V6;
/// The first ABI that scopes signals and abstract unix sockets.
pub const SCOPED_SIGNALS_ABI: i32 = 6;

/// Folders and files of the system a job may read (and execute): the interpreter's libraries,
/// certificates, name resolution, time zones, users and groups. Missing ones are skipped.
const SYSTEM_READ: &[&str] = &[
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/bin",
    "/sbin",
    "/opt",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/ssl",
    "/etc/pki",
    "/etc/ca-certificates",
    "/etc/ca-certificates.conf",
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/nsswitch.conf",
    "/etc/gai.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/services",
    "/etc/protocols",
    "/etc/mime.types",
    "/etc/alternatives",
    "/etc/os-release",
    "/etc/fonts",
    "/etc/matplotlibrc",
    "/dev/random",
    "/dev/urandom",
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/proc/stat",
    "/proc/loadavg",
    "/proc/uptime",
    "/proc/version",
    "/proc/filesystems",
    "/proc/sys",
    "/sys/devices/system/cpu",
    "/sys/fs/cgroup",
];
/// Devices a job may write: the sinks and sources every runtime opens, and POSIX shared memory
/// (`multiprocessing` semaphores), which is shared by all jobs.
const SYSTEM_WRITE: &[&str] = &["/dev/null", "/dev/zero", "/dev/full", "/dev/shm"];

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to build the job's Landlock rules")]
    Rules { source: landlock::RulesetError },
    #[error("failed to hand {path} over to the job's user")]
    HandOver { path: PathBuf, source: io::Error },
}

/// How a job is confined: what it may write and read, and as whom it runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sandbox {
    /// Folders the job owns: read, write, create, remove, execute.
    pub writable: Vec<PathBuf>,
    /// Folders and files it may read and execute, besides the system's (`SYSTEM_READ`).
    pub readable: Vec<PathBuf>,
    /// Device files it may open read-write (the GPUs it holds), besides `SYSTEM_WRITE`.
    pub devices: Vec<PathBuf>,
    /// The user and group it runs as; `None` keeps the launcher's (when not root).
    pub user: Option<(u32, u32)>,
}

/// A sandbox ready to be entered by a forked child.
pub struct Prepared {
    /// The Landlock ruleset; `None` when the kernel has no Landlock.
    ruleset: Option<OwnedFd>,
    user: Option<(u32, u32)>,
}

impl Sandbox {
    /// Builds the Landlock rules (in the launcher, before the fork).
    pub fn prepare(&self) -> Result<Prepared, Error> {
        let rules = |source| Error::Rules { source };
        let read = AccessFs::from_read(TARGET_ABI);
        let all = AccessFs::from_all(TARGET_ABI);
        let device = AccessFs::from_read(TARGET_ABI) | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev;
        let mut ruleset = Ruleset::default()
            .handle_access(all)
            .map_err(rules)?
            .scope(Scope::from_all(TARGET_ABI))
            .map_err(rules)?
            .create()
            .map_err(rules)?;
        let system_read = SYSTEM_READ.iter().map(PathBuf::from);
        for (path, access) in system_read
            .chain(self.readable.iter().cloned())
            .map(|path| (path, read))
            .chain(
                SYSTEM_WRITE.iter().map(|path| (PathBuf::from(path), if *path == "/dev/shm" { all } else { device })),
            )
            .chain(self.devices.iter().map(|path| (path.clone(), device)))
            .chain(self.writable.iter().map(|path| (path.clone(), all)))
        {
            // A path that does not exist on this machine grants nothing.
            let Ok(fd) = PathFd::new(&path) else { continue };
            let access =
                if std::fs::metadata(&path).is_ok_and(|m| !m.is_dir()) { access & file_rights() } else { access };
            ruleset = ruleset.add_rule(PathBeneath::new(fd, access)).map_err(rules)?;
        }
        Ok(Prepared { ruleset: ruleset.into(), user: self.user })
    }
}

/// The rights that apply to a file (not a folder).
fn file_rights() -> BitFlags<AccessFs> {
    AccessFs::Execute | AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev
}

impl Prepared {
    /// Whether Landlock rules will be enforced (false on a kernel without Landlock).
    pub fn enforced(&self) -> bool {
        self.ruleset.is_some()
    }

    /// Makes `command`'s child run as the job's user and enter the sandbox before it executes.
    pub fn apply_to(self, command: &mut tokio::process::Command) {
        if let Some((uid, gid)) = self.user {
            // std drops the supplementary groups when it changes the user as root.
            command.uid(uid).gid(gid);
        }
        let ruleset = self.ruleset;
        let read = AccessFs::from_read(ABI::V1).bits();
        // SAFETY: the closure runs in the forked child before exec and only makes system calls
        // on stack values and descriptors it owns: no allocation, no lock.
        unsafe {
            command.pre_exec(move || {
                let Some(ruleset) = &ruleset else { return Ok(()) };
                enter(ruleset.as_raw_fd(), read)
            });
        }
    }
}

/// `struct landlock_path_beneath_attr` (packed, as the kernel declares it).
#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

const LANDLOCK_RULE_PATH_BENEATH: libc::c_long = 1;

/// In the forked child: lets it read its own `/proc/<pid>` (`/proc/self`), then enforces the
/// rules on itself and everything it will start.
fn enter(ruleset: libc::c_int, read: u64) -> io::Result<()> {
    let check = |result: libc::c_long| if result < 0 { Err(io::Error::last_os_error()) } else { Ok(result) };
    // SAFETY: plain system calls on a NUL-terminated literal, a stack struct and owned fds.
    unsafe {
        let own = check(libc::open(c"/proc/self".as_ptr(), libc::O_PATH | libc::O_CLOEXEC) as libc::c_long)?;
        let attr = PathBeneathAttr { allowed_access: read, parent_fd: own as i32 };
        let added = libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const PathBeneathAttr,
            0,
        );
        libc::close(own as i32);
        check(added)?;
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) as libc::c_long)?;
        check(libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0))?;
    }
    Ok(())
}

/// The Landlock ABI version the kernel offers; `None` when it has no Landlock (not built in, or
/// not enabled at boot).
pub fn landlock_abi() -> Option<i32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the version query takes no attribute pointer.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    (version > 0).then(|| i32::try_from(version).unwrap_or(i32::MAX))
}

/// Makes this process non-dumpable: processes of the same user (jobs, when the server does not
/// run as root) can no longer read its memory, environment or descriptors through `/proc` or
/// attach to it. Reset by `exec`, so each process sets it for itself.
pub fn forbid_dumping() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this process is dumpable.
pub fn dumpable() -> bool {
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) == 1 }
}

/// Whether this process runs as root (jobs then run as another user).
pub fn running_as_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// What `serve` does about isolation at start, from the kernel's Landlock ABI, the
/// authentication mechanism and whether unisolated jobs were accepted: `Ok` with warnings to
/// print, or `Err` with the reason it refuses to run jobs.
pub fn start_policy(abi: Option<i32>, auth_mechanism: &str, accept_unisolated: bool) -> Result<Vec<String>, String> {
    let mut warnings = Vec::new();
    match abi {
        None => {
            let risk = "the kernel does not offer Landlock: jobs on the local runner are not isolated from each other, \
                        the data dir (database, objects, other users' files) or the server's files";
            if auth_mechanism != "mock_token" && !accept_unisolated {
                return Err(format!(
                    "{risk}; with {auth_mechanism} authentication gantry refuses to run jobs locally. Use a kernel with \
                     Landlock (Linux 5.13+, 6.12+ for signal scoping, enabled with lsm=...,landlock), run jobs on \
                     Kubernetes, or start with --accept-unisolated-jobs (GANTRY_ACCEPT_UNISOLATED_JOBS) to accept the risk"
                ));
            }
            warnings.push(format!("warning: {risk}"));
        }
        Some(abi) if abi < SCOPED_SIGNALS_ABI => warnings.push(format!(
            "warning: the kernel offers Landlock ABI {abi}, without signal scoping (ABI {SCOPED_SIGNALS_ABI}, Linux 6.12): \
             jobs running as the same user can signal each other's processes"
        )),
        Some(_) => {}
    }
    Ok(warnings)
}

/// The user jobs run as: the configured one, `nobody` by default when the server runs as root,
/// and the server's own otherwise (it cannot switch). Root is refused.
pub fn job_user(as_root: bool, uid: Option<u32>, gid: Option<u32>) -> Result<Option<(u32, u32)>, String> {
    if !as_root {
        return Ok(None);
    }
    let uid = uid.unwrap_or(DEFAULT_JOB_ID);
    let gid = gid.unwrap_or(DEFAULT_JOB_ID);
    if uid == 0 || gid == 0 {
        return Err("jobs never run as root: give --job-uid and --job-gid of an unprivileged user".into());
    }
    Ok(Some((uid, gid)))
}

/// The folders holding the interpreter `python` (as given to `--python`): each folder along its
/// chain of symbolic links (a folder named `bin` or `shims` stands for its parent, the
/// installation's prefix), and for a virtual environment the base installation named by its
/// `pyvenv.cfg`. A bare name is looked up in `path` (the `PATH` variable).
pub fn interpreter_paths(python: &str, path: Option<&OsStr>) -> Vec<PathBuf> {
    let mut current = if python.contains('/') {
        Some(PathBuf::from(python))
    } else {
        path.into_iter()
            .flat_map(std::env::split_paths)
            .map(|folder| folder.join(python))
            .find(|candidate| candidate.is_file())
    };
    let mut paths: Vec<PathBuf> = Vec::new();
    let mut add = |path: PathBuf| {
        if !paths.contains(&path) {
            paths.push(path);
        }
    };
    for _ in 0..40 {
        let Some(file) = current.take() else { break };
        let file = std::path::absolute(&file).unwrap_or(file);
        if let Some(folder) = file.parent() {
            let prefix = installation_prefix(folder);
            if let Some(home) = venv_home(&prefix) {
                add(installation_prefix(&home));
                if let Ok(real) = home.canonicalize() {
                    add(installation_prefix(&real));
                }
            }
            add(prefix);
        }
        current = std::fs::read_link(&file).ok().map(|target| match file.parent() {
            Some(folder) if target.is_relative() => folder.join(target),
            _ => target,
        });
    }
    paths
}

fn installation_prefix(folder: &Path) -> PathBuf {
    match (folder.file_name().and_then(OsStr::to_str), folder.parent()) {
        (Some("bin" | "shims"), Some(parent)) if parent != Path::new("/") && parent != Path::new("/usr") => {
            parent.to_path_buf()
        }
        _ => folder.to_path_buf(),
    }
}

/// The `home` folder of a virtual environment's `pyvenv.cfg` (where its base interpreter is).
fn venv_home(prefix: &Path) -> Option<PathBuf> {
    let config = std::fs::read_to_string(prefix.join("pyvenv.cfg")).ok()?;
    config.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == "home").then(|| PathBuf::from(value.trim()))
    })
}

/// Gives `path` and everything below it to `uid`:`gid`, never following a symbolic link.
pub fn hand_over(path: &Path, uid: u32, gid: u32) -> Result<(), Error> {
    let error = |source| Error::HandOver { path: path.to_path_buf(), source };
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).map_err(error)?;
    if std::fs::symlink_metadata(path).map_err(error)?.is_dir() {
        for entry in std::fs::read_dir(path).map_err(error)? {
            hand_over(&entry.map_err(error)?.path(), uid, gid)?;
        }
    }
    Ok(())
}

/// The first folder on the way to `path` that `uid`:`gid` may not pass through (no search
/// permission), if any: jobs running as that user could not reach their work folders.
pub fn unreachable_folder(path: &Path, uid: u32, gid: u32) -> io::Result<Option<PathBuf>> {
    use std::os::unix::fs::MetadataExt;
    let path = path.canonicalize()?;
    for folder in path.ancestors().collect::<Vec<_>>().into_iter().rev() {
        let metadata = std::fs::metadata(folder)?;
        let mode = metadata.mode();
        let searchable = if metadata.uid() == uid {
            mode & 0o100 != 0
        } else if metadata.gid() == gid {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        };
        if !searchable {
            return Ok(Some(folder.to_path_buf()));
        }
    }
    Ok(None)
}

/// Prepares the data dir for jobs running as another user: they may pass through it to their
/// work folders (search only, no listing) but reach nothing else in it (the database, the key,
/// the objects, the upload spool stay the server's alone). Landlock confines jobs anyway; this
/// is the second wall for when it is missing.
pub fn restrict_data_dir(data_dir: &Path, work_root: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let search_only = std::fs::Permissions::from_mode(0o711);
    std::fs::set_permissions(data_dir, search_only.clone())?;
    std::fs::create_dir_all(work_root)?;
    std::fs::set_permissions(work_root, search_only)?;
    let work_root = work_root.canonicalize()?;
    for entry in std::fs::read_dir(data_dir)? {
        let entry = entry?;
        let path = entry.path();
        let metadata = std::fs::symlink_metadata(&path)?;
        if metadata.file_type().is_symlink() || path.canonicalize().is_ok_and(|real| real == work_root) {
            continue;
        }
        let mode = if metadata.is_dir() { 0o700 } else { 0o600 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// How the local runner asks `gantry launch` to confine a job.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobIsolation {
    /// The user and group the job runs as (when the launcher runs as root).
    pub user: Option<(u32, u32)>,
    /// Folders the job may read besides the system's and its interpreter's.
    pub readable: Vec<PathBuf>,
    /// Device files the job may open read-write (the GPUs it holds).
    pub devices: Vec<PathBuf>,
}

impl JobIsolation {
    /// The flags of `gantry launch` that say so (see `LaunchArgs`).
    pub fn launcher_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["--isolate".into()];
        if let Some((uid, gid)) = self.user {
            args.extend(["--job-uid".into(), uid.to_string().into(), "--job-gid".into(), gid.to_string().into()]);
        }
        for path in &self.readable {
            args.extend(["--read-path".into(), path.clone().into_os_string()]);
        }
        for path in &self.devices {
            args.extend(["--device-path".into(), path.clone().into_os_string()]);
        }
        args
    }
}

/// Opens the regular file `relative` below the folder `root` without following any symbolic
/// link below `root` and without blocking on a FIFO: the launcher reads files a job may have
/// replaced with links to the server's files.
pub fn open_beneath(root: &Path, relative: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::ffi::OsStrExt;
    let components: Vec<&OsStr> = relative
        .components()
        .map(|component| match component {
            std::path::Component::Normal(name) => Ok(name),
            _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "not a plain relative path")),
        })
        .collect::<io::Result<_>>()?;
    let (last, folders) = components.split_last().ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut current: OwnedFd = std::fs::File::open(root)?.into();
    let open_at = |folder: &OwnedFd, name: &OsStr, flags: libc::c_int| -> io::Result<OwnedFd> {
        let name = std::ffi::CString::new(name.as_bytes())?;
        // SAFETY: openat on an owned folder descriptor and a NUL-terminated name.
        let fd = unsafe { libc::openat(folder.as_raw_fd(), name.as_ptr(), flags | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just returned by openat, owned by nothing else.
        Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
    };
    for folder in folders {
        current = open_at(&current, folder, libc::O_RDONLY | libc::O_DIRECTORY)?;
    }
    let file = std::fs::File::from(open_at(&current, last, libc::O_RDONLY | libc::O_NONBLOCK)?);
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_landlock_jobs_run_only_with_mock_tokens_or_when_accepted() {
        assert_eq!(start_policy(Some(7), "custom_token", false), Ok(vec![]));
        let warnings = start_policy(None, "mock_token", false).unwrap();
        assert!(warnings[0].contains("does not offer Landlock"), "{warnings:?}");
        let refusal = start_policy(None, "runtime_platform", false).unwrap_err();
        assert!(refusal.contains("--accept-unisolated-jobs"), "{refusal}");
        assert!(start_policy(None, "oidc", false).is_err());
        assert_eq!(start_policy(None, "oidc", true).unwrap().len(), 1);
        let old = start_policy(Some(4), "oidc", false).unwrap();
        assert!(old[0].contains("signal each other"), "{old:?}");
    }

    #[test]
    fn jobs_of_a_root_server_run_as_nobody_or_the_configured_user_never_root() {
        assert_eq!(job_user(false, Some(1000), Some(1000)), Ok(None));
        assert_eq!(job_user(true, None, None), Ok(Some((65534, 65534))));
        assert_eq!(job_user(true, Some(1000), Some(100)), Ok(Some((1000, 100))));
        assert!(job_user(true, Some(0), None).is_err());
        assert!(job_user(true, Some(1000), Some(0)).is_err());
    }

    #[test]
    fn a_closed_folder_on_the_way_to_the_work_folders_is_found() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let work_root = dir.path().join("data/jobs");
        std::fs::create_dir_all(&work_root).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let closed = unreachable_folder(&work_root, 65534, 65534).unwrap();
        assert_eq!(closed, Some(dir.path().canonicalize().unwrap()));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        assert_eq!(unreachable_folder(&work_root, 65534, 65534).unwrap(), None, "below a searchable temp folder");
    }

    #[test]
    fn a_virtual_environment_brings_its_base_installation() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base");
        std::fs::create_dir_all(base.join("bin")).unwrap();
        std::fs::write(base.join("bin/python3.11"), "").unwrap();
        let venv = dir.path().join("venv");
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        std::fs::write(venv.join("pyvenv.cfg"), format!("home = {}\nversion = 3.11\n", base.join("bin").display()))
            .unwrap();
        std::os::unix::fs::symlink(base.join("bin/python3.11"), venv.join("bin/python3")).unwrap();
        std::os::unix::fs::symlink("python3", venv.join("bin/python")).unwrap();

        let paths = interpreter_paths(venv.join("bin/python").to_str().unwrap(), None);

        assert!(paths.contains(&venv), "{paths:?}");
        assert!(paths.contains(&base), "{paths:?}");
        assert!(!paths.contains(&dir.path().to_path_buf()), "{paths:?}");
        let bare = interpreter_paths("python3", Some(venv.join("bin").as_os_str()));
        assert!(bare.contains(&venv) && bare.contains(&base), "{bare:?}");
    }

    #[test]
    fn a_server_makes_itself_non_dumpable() {
        // In a child process, so the test runner itself stays as it was.
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "launcher::isolation::tests::non_dumpable_child", "--ignored", "--nocapture"])
            .status()
            .unwrap();
        assert!(status.success());
    }

    #[test]
    #[ignore = "run by a_server_makes_itself_non_dumpable in its own process"]
    fn non_dumpable_child() {
        assert!(dumpable());
        forbid_dumping().unwrap();
        assert!(!dumpable());
    }
}
