//! Function artifacts: uncompressed tar archives of Python code. Every member is checked before
//! an artifact is accepted (and again before it is unpacked): relative paths only, no `..`, no
//! links leaving the root, no device files. What an artifact unpacks to is bounded too
//! (`--max-unpacked-mib`): each member counts at its full declared size, so a sparse member of a
//! few bytes that declares gigabytes of holes counts as those gigabytes, as it would be written.

use std::io::Read;
use std::path::{Component, Path};

/// Bytes in a MiB.
const MIB: u64 = 1024 * 1024;

/// What an artifact may unpack to by default (`--max-unpacked-mib`, `GANTRY_MAX_UNPACKED_MIB`):
/// ten times the default request body limit, since a plain tar unpacks to about its own size.
pub const DEFAULT_MAX_UNPACKED_MIB: u64 = 512;

/// What a member of the archive is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberKind {
    File,
    Directory,
    Link,
    Other,
}

/// Why a member is refused, or `Ok` with its normalized relative path.
pub fn check_member(path: &str, kind: MemberKind, link_target: Option<&str>) -> Result<String, String> {
    let normalized =
        normalize_relative(path).ok_or_else(|| format!("member '{path}' has an absolute or escaping path"))?;
    match kind {
        MemberKind::File | MemberKind::Directory => {}
        MemberKind::Link => {
            let target = link_target.unwrap_or_default();
            let parent = Path::new(&normalized).parent().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
            let joined = if parent.is_empty() { target.to_string() } else { format!("{parent}/{target}") };
            if target.starts_with('/') || normalize_relative(&joined).is_none() {
                return Err(format!("member '{path}' links outside the archive ('{target}')"));
            }
        }
        MemberKind::Other => {
            return Err(format!("member '{path}' is a device, fifo or other special file"));
        }
    }
    Ok(normalized)
}

/// `a/./b` → `a/b`; `None` for absolute paths or any path whose `..` climbs above the root.
fn normalize_relative(path: &str) -> Option<String> {
    if path.contains('\0') {
        return None;
    }
    let mut parts: Vec<String> = Vec::new();
    for component in Path::new(path).components() {
        match component {
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(parts.join("/"))
}

/// Bytes a file member takes once unpacked: its full declared size. A GNU sparse member
/// declares it as its real size (which `Entry::size` gives); a PAX sparse one (which the tar
/// crate does not expand, but another tool would) as `GNU.sparse.realsize` or `GNU.sparse.size`.
pub fn declared_size<R: Read>(entry: &mut tar::Entry<'_, R>) -> u64 {
    let mut size = entry.size().max(entry.header().size().unwrap_or_default());
    if let Ok(Some(extensions)) = entry.pax_extensions() {
        for extension in extensions.flatten() {
            if matches!(extension.key(), Ok("GNU.sparse.realsize" | "GNU.sparse.size"))
                && let Some(declared) = extension.value().ok().and_then(|v| v.trim().parse::<u64>().ok())
            {
                size = size.max(declared);
            }
        }
    }
    size
}

/// Adds a member of `size` bytes to the `total` unpacked so far; refuses, naming the limit,
/// when the sum passes `limit_mib`.
pub fn add_unpacked(total: u64, member: &str, size: u64, limit_mib: u64) -> Result<u64, String> {
    let sum = total.saturating_add(size);
    if sum > limit_mib.saturating_mul(MIB) {
        return Err(format!(
            "it unpacks to more than the limit of {limit_mib} MiB (--max-unpacked-mib): \
             with member '{member}' ({} MiB) it reaches {} MiB",
            size.div_ceil(MIB),
            sum.div_ceil(MIB)
        ));
    }
    Ok(sum)
}

/// Reads a tar file and checks every member and what they unpack to (at most `limit_mib`
/// MiB); returns the normalized member paths.
pub fn inspect(file: &Path, limit_mib: u64) -> Result<Vec<String>, String> {
    let reader = std::fs::File::open(file).map_err(|e| format!("cannot open the artifact: {e}"))?;
    let mut archive = tar::Archive::new(reader);
    let entries = archive.entries().map_err(|e| format!("the artifact is not a valid tar archive: {e}"))?;
    let mut members = Vec::new();
    let mut unpacked = 0;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("the artifact is not a valid tar archive: {e}"))?;
        let header = entry.header();
        let path = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let kind = match header.entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => MemberKind::File,
            tar::EntryType::Directory => MemberKind::Directory,
            tar::EntryType::Symlink | tar::EntryType::Link => MemberKind::Link,
            tar::EntryType::XGlobalHeader
            | tar::EntryType::XHeader
            | tar::EntryType::GNULongName
            | tar::EntryType::GNULongLink => continue,
            _ => MemberKind::Other,
        };
        let link = entry.link_name_bytes().map(|b| String::from_utf8_lossy(&b).into_owned());
        let link = match (kind, header.entry_type()) {
            // Hard link targets are relative to the archive root, not to the member's folder.
            (MemberKind::Link, tar::EntryType::Link) => link.map(|target| {
                let depth = Path::new(&path).components().count().saturating_sub(1);
                format!("{}{target}", "../".repeat(depth))
            }),
            _ => link,
        };
        let normalized =
            check_member(&path, kind, link.as_deref()).map_err(|e| format!("the artifact is unsafe: {e}"))?;
        if kind == MemberKind::File {
            let size = declared_size(&mut entry);
            unpacked = add_unpacked(unpacked, &normalized, size, limit_mib)?;
            members.push(normalized);
        }
    }
    Ok(members)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn plain_members_are_normalized() {
        assert_eq!(check_member("./main.py", MemberKind::File, None).unwrap(), "main.py");
        assert_eq!(check_member("pkg/a/../b.py", MemberKind::File, None).unwrap(), "pkg/b.py");
    }

    #[test]
    fn escaping_members_are_refused() {
        assert!(check_member("../evil.py", MemberKind::File, None).is_err());
        assert!(check_member("/etc/passwd", MemberKind::File, None).is_err());
        assert!(check_member("a/../../x", MemberKind::File, None).is_err());
        assert!(check_member("dev", MemberKind::Other, None).is_err());
    }

    #[test]
    fn links_must_stay_inside() {
        assert!(check_member("pkg/link", MemberKind::Link, Some("../main.py")).is_ok());
        assert!(check_member("pkg/link", MemberKind::Link, Some("../../etc/passwd")).is_err());
        assert!(check_member("link", MemberKind::Link, Some("/etc/passwd")).is_err());
    }

    #[test]
    fn archives_are_inspected_member_by_member() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.tar");
        let mut builder = tar::Builder::new(std::fs::File::create(&good).unwrap());
        let mut header = tar::Header::new_gnu();
        header.set_size(5);
        header.set_mode(0o644);
        builder.append_data(&mut header, "pkg/main.py", &b"print"[..]).unwrap();
        builder.finish().unwrap();
        drop(builder);
        assert_eq!(inspect(&good, DEFAULT_MAX_UNPACKED_MIB).unwrap(), vec!["pkg/main.py".to_string()]);

        // A member named with `..` written byte by byte (the tar crate refuses to build one).
        let bad = dir.path().join("bad.tar");
        let mut header = tar::Header::new_old();
        header.as_old_mut().name[..13].copy_from_slice(b"../escape.txt");
        header.set_size(0);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        let mut bytes = header.as_bytes().to_vec();
        bytes.extend_from_slice(&[0u8; 1024]);
        std::fs::write(&bad, bytes).unwrap();
        assert!(inspect(&bad, DEFAULT_MAX_UNPACKED_MIB).unwrap_err().contains("unsafe"));

        let garbage = dir.path().join("garbage.tar");
        std::fs::write(&garbage, vec![7u8; 1024]).unwrap();
        assert!(inspect(&garbage, DEFAULT_MAX_UNPACKED_MIB).is_err());
    }

    /// A tar whose member `holes.bin` is a GNU sparse file of 512 stored bytes that declares
    /// `declared` bytes, beside `main.py` (5 bytes).
    pub(crate) fn sparse_tar(declared: u64) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        let mut main = tar::Header::new_gnu();
        main.set_size(5);
        main.set_mode(0o644);
        builder.append_data(&mut main, "main.py", &b"print"[..]).unwrap();
        let mut header = tar::Header::new_gnu();
        header.set_path("holes.bin").unwrap();
        header.set_entry_type(tar::EntryType::GNUSparse);
        header.set_mode(0o644);
        header.set_size(512);
        let gnu = header.as_gnu_mut().unwrap();
        gnu.set_real_size(declared);
        gnu.sparse[0].set_offset(declared - 512);
        gnu.sparse[0].set_length(512);
        header.set_cksum();
        builder.append(&header, &[b'x'; 512][..]).unwrap();
        builder.into_inner().unwrap()
    }

    #[test]
    fn sparse_members_count_at_their_declared_size() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sparse.tar");
        std::fs::write(&file, sparse_tar(2 * 1024 * MIB)).unwrap();
        assert!(std::fs::metadata(&file).unwrap().len() < 4096);
        let refused = inspect(&file, 512).unwrap_err();
        assert_eq!(
            refused,
            "it unpacks to more than the limit of 512 MiB (--max-unpacked-mib): \
             with member 'holes.bin' (2048 MiB) it reaches 2049 MiB"
        );
        assert_eq!(inspect(&file, 2049).unwrap(), ["main.py", "holes.bin"]);
        // Plain members count at their size: exactly at the limit passes, a byte more does not.
        assert_eq!(add_unpacked(0, "a", MIB, 1), Ok(MIB));
        assert!(add_unpacked(MIB, "b", 1, 1).unwrap_err().contains("limit of 1 MiB"));
    }

    #[test]
    fn pax_sparse_members_count_at_their_declared_real_size() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pax.tar");
        let mut builder = tar::Builder::new(std::fs::File::create(&file).unwrap());
        builder.append_pax_extensions([("GNU.sparse.realsize", &b"3221225472"[..])]).unwrap();
        let mut header = tar::Header::new_ustar();
        header.set_size(5);
        header.set_mode(0o644);
        builder.append_data(&mut header, "GNUSparseFile.0/holes.bin", &b"12345"[..]).unwrap();
        builder.finish().unwrap();
        drop(builder);
        assert!(inspect(&file, 3071).unwrap_err().contains("(3072 MiB)"));
        assert_eq!(inspect(&file, 3072).unwrap().len(), 1);
    }
}
