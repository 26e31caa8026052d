//! Small pieces every layer may use: the duration syntax of the timeout flags, the shutdown
//! signal the long-running roles stop on, and replacing a file whole. Nothing here imports
//! another module of the crate.

use std::io;
use std::path::{Path, PathBuf};

/// A boxed error that crosses tasks: what the job objects and the HTTP bodies carry.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An error with its chain of causes, for logs and records where a user reads it whole.
pub fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Opens the regular file `name` inside `folder` for reading without following any symbolic
/// link on the way and without leaving `folder` (Linux `openat2` with `RESOLVE_BENEATH` and
/// `RESOLVE_NO_SYMLINKS`), and without blocking on a FIFO: for files a job could have replaced
/// (its live logs, what its container archived), which the server must never read elsewhere.
pub fn open_beneath(folder: &Path, name: &Path) -> io::Result<std::fs::File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::ffi::OsStrExt;
    let folder = std::fs::File::open(folder)?;
    let name = std::ffi::CString::new(name.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a file name with a NUL byte"))?;
    // SAFETY: a zeroed open_how is its documented default; the fields set below are plain integers.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2(2) with a directory descriptor we hold, a NUL-terminated path and a
    // properly sized open_how; the returned descriptor is owned by the File below.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            folder.as_raw_fd(),
            name.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    let file = unsafe { std::fs::File::from_raw_fd(fd as i32) };
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    Ok(file)
}

/// `PROGRAM_TIMEOUT`: a number of hours, or a number with `s`, `m` or `h`.
pub fn parse_timeout(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let (number, unit_seconds) = match text.char_indices().last() {
        Some((index, 's')) => (&text[..index], 1.0),
        Some((index, 'm')) => (&text[..index], 60.0),
        Some((index, 'h')) => (&text[..index], 3600.0),
        _ => (text, 3600.0),
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("invalid timeout '{text}': use hours (24) or a number with s, m or h"))?;
    if !(value.is_finite() && value > 0.0) {
        return Err(format!("invalid timeout '{text}': it must be positive"));
    }
    Ok(std::time::Duration::from_secs_f64(value * unit_seconds))
}

/// SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {}
        _ = terminate => {}
    }
}

/// Lower-case hexadecimal of `bytes` (digests in headers and keys).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// What a replaced file gets: bytes from memory, or a copy of another file.
#[derive(Debug, Clone, Copy)]
pub enum Contents<'a> {
    Bytes(&'a [u8]),
    CopyOf(&'a Path),
}

/// A staging file beside `destination`, unique to this call (hidden, so listings skip it).
fn staging_beside(destination: &Path) -> PathBuf {
    let folder = destination.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    folder.join(format!(".incoming-{}", uuid::Uuid::new_v4().simple()))
}

/// Replaces `destination` whole or not at all: the contents are written to a staging file beside
/// it (with `mode`, when given), which is then renamed over it, so a reader sees the old file or
/// the new one, never a part. On any failure the staging file is removed.
pub async fn replace_file(destination: &Path, contents: Contents<'_>, mode: Option<u32>) -> io::Result<()> {
    let staging = staging_beside(destination);
    let outcome = async {
        match contents {
            Contents::Bytes(bytes) => tokio::fs::write(&staging, bytes).await?,
            Contents::CopyOf(source) => {
                tokio::fs::copy(source, &staging).await?;
            }
        }
        if let Some(mode) = mode {
            use std::os::unix::fs::PermissionsExt;
            tokio::fs::set_permissions(&staging, std::fs::Permissions::from_mode(mode)).await?;
        }
        tokio::fs::rename(&staging, destination).await
    }
    .await;
    if outcome.is_err() {
        let _ = tokio::fs::remove_file(&staging).await;
    }
    outcome
}

/// `replace_file` for code that cannot wait on a runtime (the init container's copy).
pub fn replace_file_blocking(destination: &Path, contents: Contents<'_>, mode: Option<u32>) -> io::Result<()> {
    let staging = staging_beside(destination);
    let outcome = (|| {
        match contents {
            Contents::Bytes(bytes) => std::fs::write(&staging, bytes)?,
            Contents::CopyOf(source) => {
                std::fs::copy(source, &staging)?;
            }
        }
        if let Some(mode) = mode {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(mode))?;
        }
        std::fs::rename(&staging, destination)
    })();
    if outcome.is_err() {
        let _ = std::fs::remove_file(&staging);
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_beneath_reads_regular_files_only_and_never_leaves_the_folder() {
        let root = tempfile::tempdir().unwrap();
        let folder = root.path().join("job");
        std::fs::create_dir_all(folder.join("sub")).unwrap();
        std::fs::write(folder.join("user.log"), "mine").unwrap();
        std::fs::write(folder.join("sub/result.json"), "{}").unwrap();
        std::fs::write(root.path().join("secret"), "server's").unwrap();
        std::os::unix::fs::symlink(root.path().join("secret"), folder.join("link")).unwrap();
        std::os::unix::fs::symlink(root.path(), folder.join("up")).unwrap();
        let fifo = std::ffi::CString::new(folder.join("fifo").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo(3) with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);

        let read = |name: &str| open_beneath(&folder, Path::new(name)).map(|f| io::read_to_string(f).unwrap());
        assert_eq!(read("user.log").unwrap(), "mine");
        assert_eq!(read("sub/result.json").unwrap(), "{}");
        assert!(read("link").is_err(), "a link to a file outside");
        assert!(read("up/secret").is_err(), "a link to a folder outside");
        assert!(read("../secret").is_err(), "a way up");
        assert!(read(&root.path().join("secret").display().to_string()).is_err(), "an absolute path");
        assert!(read("fifo").is_err(), "a FIFO (without blocking)");
        assert_eq!(read("missing").unwrap_err().kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn timeouts_are_hours_or_carry_a_unit() {
        use std::time::Duration;
        assert_eq!(parse_timeout("24").unwrap(), Duration::from_secs(24 * 3600));
        assert_eq!(parse_timeout("0.5").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse_timeout("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_timeout("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_timeout("2h").unwrap(), Duration::from_secs(7200));
        assert!(parse_timeout("soon").is_err());
        assert!(parse_timeout("0").is_err());
    }

    #[tokio::test]
    async fn a_replaced_file_is_whole_and_a_failure_leaves_no_staging_file() {
        let folder = tempfile::tempdir().unwrap();
        let target = folder.path().join("f");
        std::fs::write(&target, "old").unwrap();
        replace_file(&target, Contents::Bytes(b"new"), None).await.unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new");
        let source = folder.path().join("source");
        std::fs::write(&source, "copied").unwrap();
        replace_file_blocking(&target, Contents::CopyOf(&source), Some(0o755)).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "copied");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&target).unwrap().permissions().mode() & 0o777, 0o755);
        // A rename onto a folder fails: the staging file goes, the folder stays.
        let occupied = folder.path().join("occupied");
        std::fs::create_dir_all(occupied.join("inside")).unwrap();
        assert!(replace_file(&occupied, Contents::Bytes(b"x"), None).await.is_err());
        assert!(replace_file_blocking(&occupied, Contents::Bytes(b"x"), None).is_err());
        let mut names: Vec<String> =
            std::fs::read_dir(folder.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, ["f", "occupied", "source"]);
    }
}
