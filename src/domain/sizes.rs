//! Function size catalog: the labels `S`, `M`, `L`, `XL`, accepted in any case and stored in
//! uppercase. A function's catalog maps each label to an optional compute profile.

use serde_json::{Map, Value};

pub const SIZE_LABELS: [&str; 4] = ["S", "M", "L", "XL"];

/// Normalizes one label, or explains which labels are valid.
pub fn parse_label(raw: &str) -> Result<String, String> {
    let upper = raw.trim().to_ascii_uppercase();
    if SIZE_LABELS.contains(&upper.as_str()) {
        Ok(upper)
    } else {
        Err(format!("Invalid function size '{raw}'. Valid sizes: S, M, L, XL."))
    }
}

/// Parses the client's `sizes` field (a JSON object `{label: compute_profile}`) into a catalog
/// with uppercase labels. Every profile must be one Gantry can read (`profile_resources`): an
/// unreadable one is refused with its name, never defaulted in silence. An empty text is no
/// profile, as `null`.
pub fn parse_catalog(value: &Value) -> Result<Map<String, Value>, String> {
    let object = value
        .as_object()
        .ok_or_else(|| "'sizes' should be a JSON object mapping size labels to compute profiles.".to_string())?;
    let mut catalog = Map::new();
    for (label, profile) in object {
        let label = parse_label(label)?;
        let profile = match profile {
            Value::Null => Value::Null,
            Value::String(text) if text.trim().is_empty() => Value::Null,
            Value::String(text) => {
                let text = text.trim();
                if profile_resources(text).is_none() {
                    return Err(format!(
                        "'sizes' value for '{label}': compute profile '{text}' cannot be read. A profile is \
                         [<family>-]<cpus>x<memory GiB>[x<gpus>[<gpu model>]], such as 24x120, cx3d-4x16 or \
                         gx3d-24x120x2a100p."
                    ));
                }
                Value::String(text.to_string())
            }
            _ => return Err(format!("'sizes' value for '{label}' should be a string.")),
        };
        catalog.insert(label, profile);
    }
    Ok(catalog)
}

/// CPU, memory and GPUs of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resources {
    /// Kubernetes CPU quantity.
    pub cpu: String,
    /// Kubernetes memory quantity.
    pub memory: String,
    pub gpus: u32,
    /// The GPU model the profile names (`a100p`, `l40s`), lowercase; `None`: any GPU.
    pub gpu_model: Option<String>,
}

/// Most GPUs one profile may name (as a `FunctionJob` admits).
pub const MAX_PROFILE_GPUS: u32 = 16;

/// The resources a compute profile names, or `None` when Gantry cannot read it. Profiles are
/// the reference's ids, with or without a family prefix and a GPU part:
/// `[<family>-]<cpus>x<memory GiB>[x<gpus>[<model>]]`, such as `24x120`, `16x128`, `cx3d-4x16`,
/// `gx3d-24x120x2a100p` (2 GPUs of model `a100p`) or `24x120x1l40s`. CPUs, memory and a GPU
/// count are at least 1, GPUs at most `MAX_PROFILE_GPUS`.
pub fn profile_resources(profile: &str) -> Option<Resources> {
    static PATTERN: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"^(?:[a-z]+\d+[a-z]?-)?(\d{1,4})x(\d{1,6})(?:x(\d{1,2})([a-z][a-z0-9]{0,31})?)?$")
            .expect("the profile pattern is valid")
    });
    let captures = PATTERN.captures(profile)?;
    let number = |i: usize| captures.get(i).map(|m| m.as_str().parse::<u32>().ok().filter(|n| *n > 0));
    let (cpus, memory) = (number(1)??, number(2)??);
    let gpus = match number(3) {
        None => 0,
        Some(count) => count.filter(|n| *n <= MAX_PROFILE_GPUS)?,
    };
    Some(Resources {
        cpu: cpus.to_string(),
        memory: format!("{memory}Gi"),
        gpus,
        gpu_model: captures.get(4).map(|m| m.as_str().to_string()),
    })
}

/// The compute profile of a job's size in its function's catalog, if it names one.
pub fn job_profile<'a>(catalog: &'a Map<String, Value>, size: Option<&str>) -> Option<&'a str> {
    size.and_then(|label| catalog.get(label)).and_then(Value::as_str).filter(|p| !p.is_empty())
}

/// The resources of a job: from the compute profile of its size in the function's catalog when
/// there is one, else `default` (with one GPU for GPU functions). A function without GPU gets
/// none, whatever its profile says.
pub fn job_resources(catalog: &Map<String, Value>, size: Option<&str>, gpu: bool, default: &Resources) -> Resources {
    let from_profile = job_profile(catalog, size).and_then(profile_resources);
    let mut resources = from_profile.unwrap_or_else(|| default.clone());
    if gpu && resources.gpus == 0 {
        resources.gpus = 1;
    }
    if !gpu {
        resources.gpus = 0;
        resources.gpu_model = None;
    }
    resources
}

/// Whether a GPU's model name (`NVIDIA A100-PCIE-40GB`, as the driver names it, or a node
/// label's `NVIDIA-A100-PCIE-40GB`) is a profile's model (`a100p`): the profile's letters and
/// digits appear in the name's, case and punctuation aside.
pub fn gpu_model_matches(name: &str, profile_model: &str) -> bool {
    let plain = |text: &str| text.chars().filter(char::is_ascii_alphanumeric).collect::<String>().to_ascii_lowercase();
    let wanted = plain(profile_model);
    !wanted.is_empty() && plain(name).contains(&wanted)
}

/// A Kubernetes memory quantity (`8Gi`, `512Mi`, `1G`, `123`) in bytes, or `None` when it is
/// not one (a fraction, an unknown suffix). The one reading of a size's memory: a job's
/// container, its pod's ending and a local job's limit all use it.
pub fn memory_bytes(quantity: &str) -> Option<u64> {
    const UNITS: [(&str, u64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("K", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    for (suffix, factor) in UNITS {
        if let Some(number) = quantity.strip_suffix(suffix) {
            return number.parse::<u64>().ok()?.checked_mul(factor);
        }
    }
    quantity.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn compute_profiles_name_cpu_memory_and_gpus() {
        let resources = |cpu: &str, memory: &str, gpus, model: Option<&str>| Resources {
            cpu: cpu.into(),
            memory: memory.into(),
            gpus,
            gpu_model: model.map(str::to_string),
        };
        for (profile, expected) in [
            ("cx3d-4x16", Some(resources("4", "16Gi", 0, None))),
            ("bx2d-2x8", Some(resources("2", "8Gi", 0, None))),
            ("24x120", Some(resources("24", "120Gi", 0, None))),
            ("16x128", Some(resources("16", "128Gi", 0, None))),
            ("gx3d-24x120x1a100p", Some(resources("24", "120Gi", 1, Some("a100p")))),
            ("gx3d-24x120x2a100p", Some(resources("24", "120Gi", 2, Some("a100p")))),
            ("24x120x1l40s", Some(resources("24", "120Gi", 1, Some("l40s")))),
            ("8x64x4h200", Some(resources("8", "64Gi", 4, Some("h200")))),
            ("CX3D-4x16", None),
            ("nonsense", None),
            ("0x16", None),
            ("4x0", None),
            ("4x16x0a100", None),
            ("4x16x17a100", None),
            ("4x16x1", Some(resources("4", "16Gi", 1, None))),
            ("4x16x", None),
            ("-4x16", None),
            ("4x16 ", None),
        ] {
            assert_eq!(profile_resources(profile), expected, "{profile}");
        }
        let default = resources("4", "8Gi", 0, None);
        let catalog: Map<String, Value> =
            serde_json::from_value(json!({"S": "cx3d-2x8", "M": null, "L": "24x120x2l40s"})).unwrap();
        assert_eq!(job_resources(&catalog, Some("S"), false, &default), resources("2", "8Gi", 0, None));
        assert_eq!(job_resources(&catalog, Some("M"), false, &default), default);
        assert_eq!(
            job_resources(&catalog, None, true, &default),
            resources("4", "8Gi", 1, None),
            "GPU functions get a GPU"
        );
        assert_eq!(job_resources(&catalog, Some("L"), true, &default), resources("24", "120Gi", 2, Some("l40s")));
        assert_eq!(
            job_resources(&catalog, Some("L"), false, &default),
            resources("24", "120Gi", 0, None),
            "no GPU for a function without GPU, whatever its profile"
        );
        assert_eq!(job_profile(&catalog, Some("L")), Some("24x120x2l40s"));
        assert_eq!(job_profile(&catalog, Some("M")), None);
        assert_eq!(job_profile(&catalog, None), None);
    }

    use super::*;
    use serde_json::json;

    #[test]
    fn memory_quantities_are_read_in_bytes() {
        assert_eq!(memory_bytes("8Gi"), Some(8 << 30));
        assert_eq!(memory_bytes("512Mi"), Some(512 << 20));
        assert_eq!(memory_bytes("1G"), Some(1_000_000_000));
        assert_eq!(memory_bytes("123"), Some(123));
        assert_eq!(memory_bytes("1.5Gi"), None);
        assert_eq!(memory_bytes("lots"), None);
    }

    #[test]
    fn labels_are_case_insensitive_and_stored_uppercase() {
        assert_eq!(parse_label("xl").unwrap(), "XL");
        assert_eq!(parse_label("m").unwrap(), "M");
        assert!(parse_label("XXL").unwrap_err().contains("Valid sizes"));
        assert!(parse_label("").is_err());
    }

    #[test]
    fn catalogs_are_normalized() {
        let catalog = parse_catalog(&json!({"s": "cx3d-4x16", "L": null, "m": "24x120", "xl": ""})).unwrap();
        assert_eq!(Value::Object(catalog), json!({"S": "cx3d-4x16", "L": null, "M": "24x120", "XL": null}));
        assert!(parse_catalog(&json!({"huge": "x"})).is_err());
        assert!(parse_catalog(&json!(["S"])).is_err());
        let unreadable = parse_catalog(&json!({"M": "large-please"})).unwrap_err();
        assert!(unreadable.contains("'large-please'") && unreadable.contains("'M'"), "{unreadable}");
    }
}
