//! Sanitization of titles, provider names, user names and file names. Whatever reaches object
//! storage keys has gone through one of these functions, so no name can escape its folder.

/// Keeps only `A-Z a-z 0-9 _ -` (and `/` when `allow_slash`), as the reference gateway does for
/// titles and provider names: `"Provider Function"` becomes `"ProviderFunction"`.
pub fn sanitize_title(raw: &str, allow_slash: bool) -> String {
    raw.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-' || (allow_slash && *c == '/')).collect()
}

/// A title split into an optional provider and the function title, following the upload and
/// validate rules: `"prov/title"` names a provider function; two slashes are malformed.
pub fn split_title(raw_title: &str, provider: Option<&str>) -> Result<(Option<String>, String), String> {
    let title = sanitize_title(raw_title, true);
    let provider = provider.map(|p| sanitize_title(p, false)).filter(|p| !p.is_empty());
    let mut parts = title.split('/');
    let first = parts.next().unwrap_or_default().to_string();
    match (parts.next(), parts.next()) {
        (None, _) => {
            if first.is_empty() {
                return Err("Invalid title.".into());
            }
            Ok((provider, first))
        }
        (Some(second), None) => {
            if provider.is_some() {
                return Err("Provider defined in title and in provider fields.".into());
            }
            if first.is_empty() || second.is_empty() {
                return Err("Invalid title.".into());
            }
            Ok((Some(first), second.to_string()))
        }
        (Some(_), Some(_)) => Err("Qiskit Function title is malformed. It can only contain one slash.".into()),
    }
}

/// A file name from a request reduced to a safe basename: the last path component (after `/` or
/// `\`), characters outside `A-Z a-z 0-9 _ . -` removed. `None` when nothing usable is left
/// (empty, `.` or `..`), so a traversal attempt simply names no file.
pub fn sanitize_file_name(raw: &str) -> Option<String> {
    let base = raw.rsplit(['/', '\\']).next().unwrap_or_default();
    let cleaned: String = base.chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')).collect();
    if cleaned.is_empty() || cleaned.chars().all(|c| c == '.') { None } else { Some(cleaned) }
}

/// Whether a user name is usable as a storage folder and a database key.
pub fn is_valid_user_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 150
        && !name.chars().all(|c| c == '.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '@' | '-'))
}

/// Normalizes an entry point: a relative POSIX path to a `.py` file without `..` segments or
/// shell characters. `./main.py` becomes `main.py`.
pub fn normalize_entrypoint(raw: &str) -> Result<String, String> {
    const MESSAGE: &str =
        "Invalid entrypoint. It must be a relative path to a .py file without '..' segments or shell characters.";
    if raw.starts_with('/') || raw.contains('\\') {
        return Err(MESSAGE.into());
    }
    let mut segments = Vec::new();
    for segment in raw.split('/') {
        match segment {
            "" | "." => {}
            ".." => return Err(MESSAGE.into()),
            other => segments.push(other),
        }
    }
    let path = segments.join("/");
    let valid_chars = path.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-'));
    if path.len() <= 3 || !path.ends_with(".py") || !valid_chars {
        return Err(MESSAGE.into());
    }
    Ok(path)
}

/// PEP 440 versions as the reference accepts them (`1.2.3`, `v1.0`, `2.0rc1`, `1.0.post1`, ...).
pub fn is_valid_version(version: &str) -> bool {
    use std::sync::LazyLock;
    static PEP440: LazyLock<regex::Regex> = LazyLock::new(|| {
        regex::Regex::new(
            r"(?i)^v?([0-9]+!)?[0-9]+(\.[0-9]+)*([-_.]?(a|b|c|rc|alpha|beta|pre|preview)[-_.]?[0-9]*)?((-[0-9]+)|([-_.]?(post|rev|r)[-_.]?[0-9]*))?([-_.]?dev[-_.]?[0-9]*)?(\+[a-z0-9]+([-_.][a-z0-9]+)*)?$",
        )
        .expect("the PEP 440 pattern is valid")
    });
    PEP440.is_match(version.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_lose_everything_but_safe_characters() {
        assert_eq!(sanitize_title("Provider Function", false), "ProviderFunction");
        assert_eq!(sanitize_title("../../etc", false), "etc");
        assert_eq!(sanitize_title("a/b", true), "a/b");
        assert_eq!(sanitize_title("a%2Fb\0", false), "a2Fb");
    }

    #[test]
    fn split_title_applies_the_slash_rules() {
        assert_eq!(
            split_title("default/Provider Function", None),
            Ok((Some("default".into()), "ProviderFunction".into()))
        );
        assert_eq!(split_title("fn", Some("p")), Ok((Some("p".into()), "fn".into())));
        assert!(split_title("p/fn", Some("q")).is_err());
        assert!(split_title("a/b/c", None).unwrap_err().contains("one slash"));
        assert_eq!(split_title("   ", None), Err("Invalid title.".into()));
    }

    #[test]
    fn file_names_cannot_traverse() {
        assert_eq!(sanitize_file_name("../other/x.txt").as_deref(), Some("x.txt"));
        assert_eq!(sanitize_file_name("/etc/passwd").as_deref(), Some("passwd"));
        assert_eq!(sanitize_file_name(".."), None);
        assert_eq!(sanitize_file_name("a\0b"), Some("ab".into()));
        assert_eq!(sanitize_file_name("..\\..\\win.ini").as_deref(), Some("win.ini"));
        assert_eq!(sanitize_file_name(""), None);
    }

    #[test]
    fn entrypoints_are_relative_python_files() {
        assert_eq!(normalize_entrypoint("./main.py").unwrap(), "main.py");
        assert_eq!(normalize_entrypoint("pkg/run.py").unwrap(), "pkg/run.py");
        assert!(normalize_entrypoint("/abs.py").is_err());
        assert!(normalize_entrypoint("../up.py").is_err());
        assert!(normalize_entrypoint("main.sh").is_err());
        assert!(normalize_entrypoint("a;rm -rf.py").is_err());
    }

    #[test]
    fn versions_follow_pep_440() {
        for ok in ["1.2.3", "0.1", "v1.0", "2.0rc1", "1.0.post1", "1.0.dev3", "1.0+local.1"] {
            assert!(is_valid_version(ok), "{ok}");
        }
        for bad in ["", "abc", "1..2", "1.2.3-beta-x"] {
            assert!(!is_valid_version(bad), "{bad}");
        }
    }

    #[test]
    fn user_names_are_safe_folder_names() {
        assert!(is_valid_user_name("alice@example.com"));
        assert!(!is_valid_user_name(".."));
        assert!(!is_valid_user_name("a/b"));
        assert!(!is_valid_user_name(""));
    }
}
