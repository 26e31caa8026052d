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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
