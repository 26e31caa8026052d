//! JSON Schema checks for function arguments. A stored schema is vetted once at upload
//! (size, depth, width, no external references, compiles); arguments are validated on their
//! transport encoding with bounded size and depth, a linear-time regex engine, and a wall-clock
//! bound enforced by the caller (`validate_bounded` in the API layer).

use serde_json::Value;

/// Longest accepted schema text.
pub const MAX_SCHEMA_CHARS: usize = 65_536;
/// Deepest accepted nesting of schema and arguments.
pub const MAX_DEPTH: usize = 64;
/// Most sub-schemas (objects and booleans) in one schema.
pub const MAX_SUBSCHEMAS: usize = 200;
/// Longest rendered value in an error message.
const MAX_REPR_CHARS: usize = 150;
/// Longest error message.
const MAX_MESSAGE_CHARS: usize = 500;

/// A failed validation in the contract's shape: `message` and `path`.
#[derive(Debug, Clone, PartialEq)]
pub struct SchemaViolation {
    pub message: String,
    pub path: Vec<Value>,
}

impl SchemaViolation {
    fn at_root(message: String) -> Self {
        Self { message, path: Vec::new() }
    }
}

/// What the upload stores for an `arguments_schema` field: `None` removes the schema.
pub fn parse_stored_schema(text: &str) -> Result<Option<Value>, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() || trimmed == "null" {
        return Ok(None);
    }
    if trimmed.chars().count() > MAX_SCHEMA_CHARS {
        return Err(format!(
            "arguments_schema is {} characters long and the maximum is {MAX_SCHEMA_CHARS}.",
            trimmed.chars().count()
        ));
    }
    let schema: Value = serde_json::from_str(trimmed)
        .map_err(|e| format!("arguments_schema cannot be used: it is not valid JSON ({e})."))?;
    vet_schema(schema)
}

/// Checks a schema value; `{}` means "no schema".
pub fn vet_schema(schema: Value) -> Result<Option<Value>, String> {
    match &schema {
        Value::Object(object) if object.is_empty() => return Ok(None),
        Value::Object(_) | Value::Bool(_) => {}
        _ => {
            return Err("arguments_schema cannot be used: it must be a JSON object or a boolean.".into());
        }
    }
    if depth(&schema) > MAX_DEPTH {
        return Err(format!("arguments_schema cannot be used: it is nested deeper than {MAX_DEPTH} levels."));
    }
    let count = count_subschemas(&schema);
    if count > MAX_SUBSCHEMAS {
        return Err(format!(
            "arguments_schema cannot be used: it has {count} sub-schemas and the maximum is {MAX_SUBSCHEMAS}."
        ));
    }
    if let Some(reference) = external_reference(&schema) {
        return Err(format!("arguments_schema cannot be used: external reference '{reference}' is not allowed."));
    }
    compile(&schema).map_err(|e| format!("arguments_schema cannot be used: {e}."))?;
    Ok(Some(schema))
}

fn compile(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::options()
        .with_pattern_options(jsonschema::PatternOptions::regex().size_limit(1 << 20).dfa_size_limit(1 << 20))
        .should_validate_formats(true)
        .build(schema)
        .map_err(|e| e.to_string())
}

/// Validates the transport-encoded `arguments` text against a schema. Runs in bounded memory
/// and linear-time pattern matching; callers bound the wall-clock time.
pub fn validate_arguments(schema: &Value, arguments: &str, max_bytes: usize) -> Result<(), SchemaViolation> {
    if arguments.len() > max_bytes {
        return Err(SchemaViolation::at_root(format!(
            "arguments is {} bytes long and the maximum is {max_bytes} bytes (MAX_ARGUMENTS_LENGTH_MB).",
            arguments.len()
        )));
    }
    let instance = parse_arguments(arguments)?;
    if let Value::Bool(false) = schema {
        return Err(SchemaViolation::at_root(format!(
            "'false schema' validation failed, schema requires false: rejected value {}",
            repr(&instance)
        )));
    }
    let validator = compile(schema)
        .map_err(|e| SchemaViolation::at_root(format!("the function arguments schema cannot be used: {e}")))?;
    match validator.iter_errors(&instance).next() {
        None => Ok(()),
        Some(error) => Err(describe(schema, &instance, &error)),
    }
}

/// Parses arguments with a depth bound (serde_json's own recursion limit is 128).
pub fn parse_arguments(arguments: &str) -> Result<Value, SchemaViolation> {
    let value: Value = serde_json::from_str(arguments)
        .map_err(|e| SchemaViolation::at_root(format!("arguments is not valid JSON: {e}")))?;
    if depth(&value) > MAX_DEPTH {
        return Err(SchemaViolation::at_root(format!("arguments are nested deeper than {MAX_DEPTH} levels.")));
    }
    Ok(value)
}

fn describe(schema: &Value, instance: &Value, error: &jsonschema::ValidationError<'_>) -> SchemaViolation {
    let schema_path = error.schema_path.as_str();
    let keyword = schema_path.rsplit('/').next().unwrap_or_default().replace("~1", "/").replace("~0", "~");
    let required = schema.pointer(schema_path).map(repr).unwrap_or_else(|| "a valid value".into());
    let mut message =
        format!("'{keyword}' validation failed, schema requires {required}: rejected value {}", repr(&error.instance));
    if message.chars().count() > MAX_MESSAGE_CHARS {
        message = message.chars().take(MAX_MESSAGE_CHARS).collect::<String>() + "... (message truncated)";
    }
    SchemaViolation { message, path: instance_path(instance, error.instance_path.as_str()) }
}

/// Turns a JSON pointer into path segments: indices of arrays as numbers, keys as strings.
fn instance_path(instance: &Value, pointer: &str) -> Vec<Value> {
    let mut current = Some(instance);
    let mut path = Vec::new();
    for raw in pointer.split('/').skip(1) {
        let segment = raw.replace("~1", "/").replace("~0", "~");
        match current {
            Some(Value::Array(items)) => {
                let index = segment.parse::<usize>().ok();
                current = index.and_then(|i| items.get(i));
                path.push(index.map(Value::from).unwrap_or(Value::String(segment)));
            }
            Some(Value::Object(object)) => {
                current = object.get(&segment);
                path.push(Value::String(segment));
            }
            _ => {
                current = None;
                path.push(Value::String(segment));
            }
        }
    }
    path
}

fn repr(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > MAX_REPR_CHARS {
        text.chars().take(MAX_REPR_CHARS).collect::<String>() + "..."
    } else {
        text
    }
}

/// Nesting depth, computed without recursion so a hostile value cannot overflow the stack.
pub fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 1usize)];
    while let Some((value, level)) = stack.pop() {
        deepest = deepest.max(level);
        match value {
            Value::Array(items) => stack.extend(items.iter().map(|v| (v, level + 1))),
            Value::Object(object) => stack.extend(object.values().map(|v| (v, level + 1))),
            _ => {}
        }
    }
    deepest
}

fn count_subschemas(schema: &Value) -> usize {
    let mut count = 0;
    let mut stack = vec![schema];
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(object) => {
                count += 1;
                for (key, child) in object {
                    // `enum`, `const` and `examples` hold data, not schemas.
                    if !matches!(key.as_str(), "enum" | "const" | "examples" | "default") {
                        stack.push(child);
                    }
                }
            }
            Value::Bool(_) => count += 1,
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    count
}

fn external_reference(schema: &Value) -> Option<String> {
    let mut stack = vec![schema];
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(object) => {
                for (key, child) in object {
                    if matches!(key.as_str(), "$ref" | "$dynamicRef" | "$recursiveRef")
                        && let Some(target) = child.as_str()
                        && !target.starts_with('#')
                    {
                        return Some(target.to_string());
                    }
                    stack.push(child);
                }
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn empty_schema_text_or_object_removes_the_schema() {
        assert_eq!(parse_stored_schema("{}").unwrap(), None);
        assert_eq!(parse_stored_schema("").unwrap(), None);
        assert_eq!(parse_stored_schema("true").unwrap(), Some(json!(true)));
    }

    #[test]
    fn unusable_schemas_are_refused() {
        assert!(parse_stored_schema("42").unwrap_err().contains("object or a boolean"));
        assert!(parse_stored_schema("{").unwrap_err().contains("not valid JSON"));
        assert!(
            parse_stored_schema(r#"{"$ref": "http://evil.example/s.json"}"#)
                .unwrap_err()
                .contains("external reference")
        );
        let wide: serde_json::Map<String, Value> =
            (0..300).map(|i| (format!("p{i}"), json!({"type": "string"}))).collect();
        assert!(vet_schema(json!({"properties": wide})).unwrap_err().contains("sub-schemas"));
        let mut deep = json!({"type": "string"});
        for _ in 0..70 {
            deep = json!({"items": deep});
        }
        assert!(vet_schema(deep).unwrap_err().contains("deeper"));
        let huge = format!(r#"{{"description": "{}"}}"#, "x".repeat(70_000));
        assert!(parse_stored_schema(&huge).unwrap_err().contains("maximum is 65536"));
        assert!(parse_stored_schema(r#"{"type": 12}"#).unwrap_err().contains("cannot be used"));
    }

    #[test]
    fn violations_name_keyword_requirement_value_and_path() {
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}, "xs": {"type": "array", "items": {"type": "string"}}}, "required": ["n"]});
        let error = validate_arguments(&schema, r#"{"n": 1}"#, 1 << 20).unwrap_err();
        assert_eq!(error.message, "'minimum' validation failed, schema requires 3: rejected value 1");
        assert_eq!(error.path, vec![json!("n")]);
        let error = validate_arguments(&schema, r#"{"n": 4, "xs": ["a", 2]}"#, 1 << 20).unwrap_err();
        assert!(error.message.starts_with("'type' validation failed, schema requires \"string\""), "{}", error.message);
        assert_eq!(error.path, vec![json!("xs"), json!(1)]);
        let error = validate_arguments(&schema, "{}", 1 << 20).unwrap_err();
        assert!(error.message.starts_with("'required' validation failed"));
        assert!(validate_arguments(&schema, r#"{"n": 5}"#, 1 << 20).is_ok());
    }

    #[test]
    fn boolean_schemas_accept_or_reject_everything() {
        assert!(validate_arguments(&json!(true), r#"{"a": 1}"#, 100).is_ok());
        assert!(validate_arguments(&json!(false), "{}", 100).unwrap_err().message.contains("false"));
    }

    #[test]
    fn transport_encoded_objects_are_validated_as_sent() {
        let schema = json!({"properties": {"circuit": {"type": "object", "required": ["__type__", "__value__"], "properties": {"__type__": {"const": "QuantumCircuit"}}}}});
        assert!(
            validate_arguments(&schema, r#"{"circuit": {"__type__": "QuantumCircuit", "__value__": "eJw="}}"#, 1000)
                .is_ok()
        );
        assert!(validate_arguments(&schema, r#"{"circuit": [1]}"#, 1000).is_err());
    }

    #[test]
    fn hostile_arguments_are_bounded() {
        assert!(validate_arguments(&json!(true), "xx", 1).unwrap_err().message.contains("MAX_ARGUMENTS_LENGTH_MB"));
        let deep = "[".repeat(100) + &"]".repeat(100);
        assert!(validate_arguments(&json!({}), &deep, 1 << 20).unwrap_err().message.contains("deeper"));
        assert!(
            validate_arguments(&json!({}), "{", 100).unwrap_err().message.starts_with("arguments is not valid JSON")
        );
        // Catastrophic backtracking patterns run in linear time with the regex engine.
        let schema = json!({"properties": {"s": {"pattern": "^(a+)+$"}}});
        let arguments = format!(r#"{{"s": "{}b"}}"#, "a".repeat(50_000));
        assert!(validate_arguments(&schema, &arguments, 1 << 20).unwrap_err().message.starts_with("'pattern'"));
    }

    #[test]
    fn long_messages_are_truncated() {
        let schema = json!({"properties": {"s": {"enum": ["a".repeat(400), "b".repeat(400)]}}});
        let error = validate_arguments(&schema, &format!(r#"{{"s": "{}"}}"#, "c".repeat(400)), 1 << 20).unwrap_err();
        assert!(error.message.chars().count() <= 530);
    }
}
