//! The artifact unpacked member by member, never through a link, and never past what it may
//! unpack to.

use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::artifact::{MemberKind, add_unpacked, check_member, declared_size};

/// Unpacks the tar `archive` into a fresh directory `root`, member by member. Every member is
/// checked with `artifact::check_member`; folders and files are created by hand below `root`,
/// never through a link, and symbolic links are created only after every file, so no member
/// is ever written through one. Anything that is not a folder, file or link is refused. A file
/// member whose declared size (a sparse one's holes included) would take the total past
/// `limit_mib` MiB is refused before it is written: an artifact stored before the limit was
/// checked at upload is bounded here.
pub(super) fn unpack(archive: &Path, root: &Path, limit_mib: u64) -> Result<(), String> {
    if std::fs::symlink_metadata(root).is_ok() {
        std::fs::remove_dir_all(root).map_err(|e| format!("failed to clear {}: {e}", root.display()))?;
    }
    std::fs::create_dir_all(root).map_err(|e| format!("failed to create {}: {e}", root.display()))?;
    let file = std::fs::File::open(archive).map_err(|e| format!("failed to open the artifact: {e}"))?;
    let invalid = |e: io::Error| format!("the artifact is not a valid tar archive: {e}");
    let mut tar = tar::Archive::new(file);
    let mut symlinks = Vec::new();
    let mut unpacked = 0;
    for entry in tar.entries().map_err(invalid)? {
        let mut entry = entry.map_err(invalid)?;
        let entry_type = entry.header().entry_type();
        let path = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let link = entry.link_name_bytes().map(|target| String::from_utf8_lossy(&target).into_owned());
        match entry_type {
            tar::EntryType::XGlobalHeader
            | tar::EntryType::XHeader
            | tar::EntryType::GNULongName
            | tar::EntryType::GNULongLink => {}
            tar::EntryType::Directory => {
                let relative = check_member(&path, MemberKind::Directory, None)?;
                create_folders(root, &relative, true)?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                let relative = check_member(&path, MemberKind::File, None)?;
                unpacked = add_unpacked(unpacked, &relative, declared_size(&mut entry), limit_mib)?;
                let destination = clear_destination(root, &relative)?;
                let executable = entry.header().mode().is_ok_and(|mode| mode & 0o111 != 0);
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(if executable { 0o755 } else { 0o644 })
                    .open(&destination)
                    .map_err(|e| format!("failed to create member '{relative}': {e}"))?;
                io::copy(&mut entry, &mut file).map_err(|e| format!("failed to write member '{relative}': {e}"))?;
            }
            tar::EntryType::Symlink => {
                let target = link.unwrap_or_default();
                let relative = check_member(&path, MemberKind::Link, Some(&target))?;
                symlinks.push((relative, target));
            }
            tar::EntryType::Link => {
                // Hard link targets are relative to the archive root, not to the member's folder.
                let target = link.unwrap_or_default();
                let depth = Path::new(&path).components().count().saturating_sub(1);
                let from_member = format!("{}{target}", "../".repeat(depth));
                let relative = check_member(&path, MemberKind::Link, Some(&from_member))?;
                let source = check_member(&target, MemberKind::File, None)?;
                let source_path = existing_file(root, &source)
                    .ok_or_else(|| format!("member '{path}' links to '{target}', which is not an earlier file"))?;
                let destination = clear_destination(root, &relative)?;
                std::fs::hard_link(&source_path, &destination)
                    .map_err(|e| format!("failed to create member '{relative}': {e}"))?;
            }
            _ => {
                check_member(&path, MemberKind::Other, None)?;
            }
        }
    }
    for (relative, target) in symlinks {
        let destination = clear_destination(root, &relative)?;
        std::os::unix::fs::symlink(&target, &destination)
            .map_err(|e| format!("failed to create member '{relative}': {e}"))?;
    }
    Ok(())
}

/// Creates the folders of the normalized relative path `relative` below `root` (its last
/// component too when `whole`), refusing to pass through anything but a real folder.
pub(super) fn create_folders(root: &Path, relative: &str, whole: bool) -> Result<PathBuf, String> {
    let components: Vec<&str> = relative.split('/').filter(|c| !c.is_empty()).collect();
    let folders = if whole { components.len() } else { components.len().saturating_sub(1) };
    let mut current = root.to_path_buf();
    for component in &components[..folders] {
        current.push(component);
        match std::fs::symlink_metadata(&current) {
            Ok(metadata) if metadata.is_dir() => {}
            Ok(_) => {
                return Err(format!("member '{relative}' passes through a file or link"));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir(&current).map_err(|e| format!("failed to create folder for '{relative}': {e}"))?
            }
            Err(e) => return Err(format!("failed to inspect '{relative}': {e}")),
        }
    }
    Ok(root.join(relative))
}

/// The path of a new file or link member below `root`, with its folders created and an
/// earlier file or link of the same name removed (a later member wins, as with `tar -x`).
pub(super) fn clear_destination(root: &Path, relative: &str) -> Result<PathBuf, String> {
    if relative.is_empty() {
        return Err("a file member has an empty name".to_string());
    }
    let destination = create_folders(root, relative, false)?;
    match std::fs::symlink_metadata(&destination) {
        Ok(metadata) if metadata.is_dir() => {
            Err(format!("member '{relative}' conflicts with a folder of the same name"))
        }
        Ok(_) => std::fs::remove_file(&destination)
            .map(|()| destination)
            .map_err(|e| format!("failed to replace member '{relative}': {e}")),
        Err(_) => Ok(destination),
    }
}

/// The path of an already unpacked regular file, reached without passing through a link.
pub(super) fn existing_file(root: &Path, relative: &str) -> Option<PathBuf> {
    let mut current = root.to_path_buf();
    let components: Vec<&str> = relative.split('/').collect();
    let (last, folders) = components.split_last()?;
    for folder in folders {
        current.push(folder);
        if !std::fs::symlink_metadata(&current).ok()?.is_dir() {
            return None;
        }
    }
    current.push(last);
    std::fs::symlink_metadata(&current).ok()?.is_file().then_some(current)
}
