//! Function artifacts: uncompressed tar archives of Python code. Every member is checked before
//! an artifact is accepted (and again before it is unpacked): relative paths only, no `..`, no
//! links leaving the root, no device files.

use std::path::{Component, Path};

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

/// Reads a tar file and checks every member; returns the normalized member paths.
pub fn inspect(file: &Path) -> Result<Vec<String>, String> {
    let reader = std::fs::File::open(file).map_err(|e| format!("cannot open the artifact: {e}"))?;
    let mut archive = tar::Archive::new(reader);
    let entries = archive.entries().map_err(|e| format!("the artifact is not a valid tar archive: {e}"))?;
    let mut members = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("the artifact is not a valid tar archive: {e}"))?;
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
            members.push(normalized);
        }
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
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
        assert_eq!(inspect(&good).unwrap(), vec!["pkg/main.py".to_string()]);

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
        assert!(inspect(&bad).unwrap_err().contains("unsafe"));

        let garbage = dir.path().join("garbage.tar");
        std::fs::write(&garbage, vec![7u8; 1024]).unwrap();
        assert!(inspect(&garbage).is_err());
    }
}
