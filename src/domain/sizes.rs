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
/// with uppercase labels.
pub fn parse_catalog(value: &Value) -> Result<Map<String, Value>, String> {
    let object = value
        .as_object()
        .ok_or_else(|| "'sizes' should be a JSON object mapping size labels to compute profiles.".to_string())?;
    let mut catalog = Map::new();
    for (label, profile) in object {
        if !(profile.is_string() || profile.is_null()) {
            return Err(format!("'sizes' value for '{label}' should be a string."));
        }
        catalog.insert(parse_label(label)?, profile.clone());
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
}

/// The resources a compute profile names (the reference's format
/// `<family>-<cpus>x<memory GiB>[x<gpus><model>]`, such as `cx3d-4x16` or `gx3d-24x120x1a100p`),
/// or `None` when the profile does not follow it.
pub fn profile_resources(profile: &str) -> Option<Resources> {
    let pattern =
        regex::Regex::new(r"^[a-z]+\d+[a-z]?-(\d+)x(\d+)(?:x(\d+)[a-z0-9]+)?$").expect("the profile pattern is valid");
    let captures = pattern.captures(profile)?;
    Some(Resources {
        cpu: captures[1].to_string(),
        memory: format!("{}Gi", &captures[2]),
        gpus: captures.get(3).map_or(Some(0), |g| g.as_str().parse().ok())?,
    })
}

/// The resources of a job: from the compute profile of its size in the function's catalog when
/// there is one, else `default` (with one GPU for GPU functions).
pub fn job_resources(catalog: &Map<String, Value>, size: Option<&str>, gpu: bool, default: &Resources) -> Resources {
    let from_profile = size.and_then(|label| catalog.get(label)).and_then(Value::as_str).and_then(profile_resources);
    let mut resources = from_profile.unwrap_or_else(|| default.clone());
    if gpu && resources.gpus == 0 {
        resources.gpus = 1;
    }
    if !gpu {
        resources.gpus = 0;
    }
    resources
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
        let resources = |cpu: &str, memory: &str, gpus| Resources { cpu: cpu.into(), memory: memory.into(), gpus };
        assert_eq!(profile_resources("cx3d-4x16"), Some(resources("4", "16Gi", 0)));
        assert_eq!(profile_resources("gx3d-24x120x1a100p"), Some(resources("24", "120Gi", 1)));
        assert_eq!(profile_resources("bx2d-2x8"), Some(resources("2", "8Gi", 0)));
        assert_eq!(profile_resources("CX3D-4x16"), None);
        assert_eq!(profile_resources("nonsense"), None);
        let default = resources("4", "8Gi", 0);
        let catalog: Map<String, Value> = serde_json::from_value(json!({"S": "cx3d-2x8", "M": null})).unwrap();
        assert_eq!(job_resources(&catalog, Some("S"), false, &default), resources("2", "8Gi", 0));
        assert_eq!(job_resources(&catalog, Some("M"), false, &default), default);
        assert_eq!(job_resources(&catalog, None, true, &default), resources("4", "8Gi", 1), "GPU functions get a GPU");
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
        let catalog = parse_catalog(&json!({"s": "cx3d-4x16", "L": null})).unwrap();
        assert_eq!(Value::Object(catalog), json!({"S": "cx3d-4x16", "L": null}));
        assert!(parse_catalog(&json!({"huge": "x"})).is_err());
        assert!(parse_catalog(&json!(["S"])).is_err());
    }
}
