//! Validation of a function's declared dependencies against the allow-list served by
//! `GET dependencies-versions/`. Dependencies are never installed by the gateway; the list only
//! records what the function expects to find in its runtime image.

use serde_json::Value;

/// The allow-list of extra requirements, one pinned requirement per entry.
pub const ALLOWED: [&str; 10] = [
    "ffsim==0.0.60",
    "mergedeep==1.3.4",
    "mthree==3.0.0",
    "pyscf==2.13.1",
    "cotengrust==0.2.0",
    "qiskit-addon-aqc-tensor[quimb-jax]==0.3.1",
    "qiskit-addon-obp==0.3.0",
    "qiskit-addon-sqd==0.12.1",
    "qiskit-addon-utils==0.2.0",
    "qiskit-aer==0.17.2",
];

fn normalize_name(name: &str) -> String {
    let base = name.split('[').next().unwrap_or_default();
    base.trim().to_ascii_lowercase().replace(['_', '.'], "-")
}

/// Parses the `dependencies` field (a JSON array, or a string holding one) into the list of
/// requirement strings to store. Elements are `"name"`, `"name==version"` or `{"name": "version"}`.
pub fn parse(value: &Value) -> Result<Vec<String>, String> {
    let parsed;
    let value = match value {
        Value::String(text) => {
            parsed = serde_json::from_str::<Value>(text)
                .map_err(|e| format!("'dependencies' should be an array of strings or objects: {e}"))?;
            &parsed
        }
        other => other,
    };
    let items = value.as_array().ok_or("'dependencies' should be an array.")?;
    let mut requirements = Vec::with_capacity(items.len());
    for item in items {
        let requirement = match item {
            Value::String(text) => text.trim().to_string(),
            Value::Object(object) => {
                if object.len() != 1 {
                    return Err("'dependencies' should be an array with dict containing one dependency only.".into());
                }
                let (name, version) = object.iter().next().expect("one entry");
                let version = version.as_str().ok_or("'dependencies' should be an array with strings or dict.")?;
                if version.starts_with(|c: char| c.is_ascii_digit()) {
                    format!("{name}=={version}")
                } else {
                    format!("{name}{version}")
                }
            }
            _ => return Err("'dependencies' should be an array with strings or dict.".into()),
        };
        check(&requirement)?;
        requirements.push(requirement);
    }
    Ok(requirements)
}

fn check(requirement: &str) -> Result<(), String> {
    let operators = ["===", "==", "~=", "!=", "<=", ">=", "<", ">"];
    let position = requirement.find(|c: char| "=~!<>".contains(c));
    let (name, version) = match position {
        None => (requirement, None),
        Some(index) => {
            let rest = &requirement[index..];
            if !rest.starts_with("==") || rest.starts_with("===") || rest.contains(',') {
                return Err("'dependencies' needs one fixed version using the '==' operator.".into());
            }
            let version = rest[2..].trim();
            if version.is_empty() || operators.iter().any(|op| version.contains(op)) {
                return Err("'dependencies' needs one fixed version using the '==' operator.".into());
            }
            (&requirement[..index], Some(version))
        }
    };
    if name.trim().is_empty() {
        return Err("Error while parsing dependencies.".into());
    }
    let wanted = normalize_name(name);
    let allowed = ALLOWED.iter().find(|entry| normalize_name(entry.split("==").next().unwrap_or_default()) == wanted);
    let Some(allowed) = allowed else {
        return Err(format!(
            "Dependency `{}` is not allowed. You can request the dependency here: https://github.com/Qiskit/qiskit-serverless/issues/new?template=pip_dependency_request.yaml",
            name.trim()
        ));
    };
    if let Some(version) = version {
        let allowed_version = allowed.split("==").nth(1).unwrap_or_default();
        if version != allowed_version {
            return Err(format!(
                "Dependency ({}) version ({version}) is not allowed. Valid versions: {allowed}",
                name.trim()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn accepts_allowed_pins_names_and_objects() {
        assert_eq!(parse(&json!("[]")).unwrap(), Vec::<String>::new());
        assert_eq!(parse(&json!(["mergedeep==1.3.4", "qiskit-aer"])).unwrap(), ["mergedeep==1.3.4", "qiskit-aer"]);
        assert_eq!(parse(&json!([{"mergedeep": "1.3.4"}])).unwrap(), ["mergedeep==1.3.4"]);
        assert_eq!(parse(&json!("[\"qiskit_aer==0.17.2\"]")).unwrap(), ["qiskit_aer==0.17.2"]);
    }

    #[test]
    fn rejects_with_the_reference_messages() {
        assert!(parse(&json!("nope")).unwrap_err().contains("should be an array of strings"));
        assert_eq!(parse(&json!({})).unwrap_err(), "'dependencies' should be an array.");
        assert!(parse(&json!([1])).unwrap_err().contains("strings or dict"));
        assert!(parse(&json!(["mergedeep>=1.0"])).unwrap_err().contains("'=='"));
        assert!(parse(&json!(["numpy"])).unwrap_err().contains("Dependency `numpy` is not allowed"));
        assert!(parse(&json!(["mergedeep==9"])).unwrap_err().contains("Valid versions: mergedeep==1.3.4"));
        assert!(parse(&json!([{"a": "1", "b": "2"}])).unwrap_err().contains("one dependency only"));
    }
}
