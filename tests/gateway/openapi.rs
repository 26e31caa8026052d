//! Requests generated from the published OpenAPI document alone, as client generators and
//! fuzzers build them: for every operation, and for each body encoding it documents and each
//! branch of a body's `anyOf`, one built from its required fields and examples is accepted (or
//! answered 404: the example ids exist nowhere), and every request that breaks one documented
//! constraint (a required field or parameter left out, a value outside an enum, below a minimum,
//! of the wrong type or format, too short or too long, no token) is answered 4xx.

use axum::body::Body;
use serde_json::{Map, Value, json};

use crate::both_backends;
use crate::harness::{Backend, Gateway, multipart, tar_of};

both_backends!(
    requests_built_from_the_document_are_accepted,
    each_documented_way_to_upload_creates_or_updates_a_function,
    requests_breaking_a_documented_constraint_are_4xx
);

/// One documented constraint to break.
#[derive(Debug, Clone)]
enum Break {
    OmitQuery(String),
    Query(String, String),
    Path(String, String),
    OmitField(String),
    Field(String, Value),
    NoToken,
}

struct Operation {
    method: String,
    template: String,
    spec: Value,
}

fn operations(document: &Value) -> Vec<Operation> {
    let mut all = Vec::new();
    for (template, methods) in document["paths"].as_object().unwrap() {
        for (method, spec) in methods.as_object().unwrap() {
            all.push(Operation { method: method.to_uppercase(), template: template.clone(), spec: spec.clone() });
        }
    }
    all
}

/// The `example` of a schema, or of a parameter (which may state it beside its schema).
fn example(schema: &Value) -> Option<String> {
    match &schema["example"] {
        Value::String(text) => Some(text.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

/// One way to send an operation's body: a documented media type and, when the schema has
/// `anyOf`, one of its branches.
#[derive(Debug, Clone)]
struct BodyVariant {
    media_type: String,
    /// The schema a request of this branch follows: the branch's required fields added, and the
    /// fields only the other branches require left out (a request built from one branch sends
    /// nothing of another).
    schema: Value,
}

/// Every documented encoding of the operation's body, each `anyOf` branch apart; none without a
/// body.
fn bodies(operation: &Operation) -> Vec<BodyVariant> {
    let mut all = Vec::new();
    for (media_type, content) in operation.spec["requestBody"]["content"].as_object().into_iter().flatten() {
        let schema = &content["schema"];
        // Branches that require fields are ways to send the body; others only constrain values.
        let Some(branches) =
            schema["anyOf"].as_array().filter(|branches| branches.iter().any(|branch| !required(branch).is_empty()))
        else {
            all.push(BodyVariant { media_type: media_type.clone(), schema: schema.clone() });
            continue;
        };
        for branch in branches {
            let own = required(branch);
            let mut effective = schema.clone();
            effective.as_object_mut().unwrap().remove("anyOf");
            effective["required"] = json!(required(schema).into_iter().chain(own.iter().cloned()).collect::<Vec<_>>());
            for name in branches.iter().flat_map(required).filter(|name| !own.contains(name)) {
                effective["properties"].as_object_mut().unwrap().remove(&name);
            }
            all.push(BodyVariant { media_type: media_type.clone(), schema: effective });
        }
    }
    all
}

fn required(schema: &Value) -> Vec<String> {
    schema["required"].as_array().into_iter().flatten().filter_map(|v| v.as_str().map(str::to_string)).collect()
}

/// A value outside what `schema` allows, for each constraint it states.
fn breaking_values(schema: &Value, for_path: bool) -> Vec<Value> {
    let mut values = Vec::new();
    if schema["enum"].is_array() {
        values.push(json!("NOT-IN-THE-ENUM"));
    }
    if let Some(minimum) = schema["minimum"].as_i64() {
        values.push(json!((minimum - 1).to_string()));
    }
    match schema["type"].as_str() {
        Some("integer") => values.push(json!("not-a-number")),
        Some("boolean") => values.push(json!("maybe")),
        _ => {}
    }
    match schema["format"].as_str() {
        Some("uuid") => values.push(json!("not-a-uuid")),
        Some("date-time") => values.push(json!("yesterday")),
        _ => {}
    }
    if !for_path && schema["minLength"].as_u64().is_some_and(|n| n > 0) {
        values.push(json!(""));
    }
    if let Some(maximum) = schema["maxLength"].as_u64() {
        values.push(json!("x".repeat(maximum as usize + 1)));
    }
    values
}

fn breaks(operation: &Operation, body: Option<&BodyVariant>) -> Vec<Break> {
    let mut all = Vec::new();
    for parameter in operation.spec["parameters"].as_array().into_iter().flatten() {
        let name = parameter["name"].as_str().unwrap().to_string();
        let in_path = parameter["in"] == "path";
        if parameter["required"] == true && !in_path {
            all.push(Break::OmitQuery(name.clone()));
        }
        for value in breaking_values(&parameter["schema"], in_path) {
            let value = value.as_str().unwrap().to_string();
            all.push(if in_path { Break::Path(name.clone(), value) } else { Break::Query(name.clone(), value) });
        }
    }
    if let Some(BodyVariant { schema, .. }) = body {
        for name in required(schema) {
            all.push(Break::OmitField(name));
        }
        for (name, property) in schema["properties"].as_object().unwrap() {
            for value in breaking_values(property, false) {
                all.push(Break::Field(name.clone(), value));
            }
        }
    }
    if operation.spec["security"].as_array().is_some_and(|s| !s.is_empty()) {
        all.push(Break::NoToken);
    }
    all
}

/// The request built from the document's required fields and examples, with its body sent as
/// `body` says, and one constraint broken when `broken` is given.
async fn send(
    gateway: &Gateway,
    operation: &Operation,
    body: Option<&BodyVariant>,
    broken: Option<&Break>,
) -> crate::harness::Reply {
    let mut path = operation.template.clone();
    let mut query = Vec::new();
    for parameter in operation.spec["parameters"].as_array().into_iter().flatten() {
        let name = parameter["name"].as_str().unwrap();
        let mut value = example(parameter).or_else(|| example(&parameter["schema"]));
        match broken {
            Some(Break::OmitQuery(n)) if n == name => value = None,
            Some(Break::Query(n, v) | Break::Path(n, v)) if n == name => value = Some(v.clone()),
            _ => {}
        }
        if parameter["in"] == "path" {
            path = path.replace(&format!("{{{name}}}"), &value.expect("path parameters have examples"));
        } else if let Some(value) =
            value.filter(|_| parameter["required"] == true || matches!(broken, Some(Break::Query(n, _)) if n == name))
        {
            query.push((name.to_string(), value));
        }
    }
    if !query.is_empty() {
        path = format!("{path}?{}", serde_urlencoded::to_string(&query).unwrap());
    }
    let token = (!matches!(broken, Some(Break::NoToken))).then_some("alice");
    let Some(BodyVariant { media_type, schema }) = body else {
        return gateway.call(&operation.method, &path, token, None, Body::empty()).await;
    };
    let required = required(schema);
    let mut fields = Map::new();
    let mut files: Vec<(String, String, Vec<u8>)> = Vec::new();
    for (name, property) in schema["properties"].as_object().unwrap() {
        let mut value = (required.contains(name) || property["example"] != Value::Null)
            .then(|| property["example"].clone())
            .filter(|v| !v.is_null());
        match broken {
            Some(Break::OmitField(n)) if n == name => value = None,
            Some(Break::Field(n, v)) if n == name => value = Some(v.clone()),
            _ => {}
        }
        let Some(value) = value else { continue };
        if property["format"] == "binary" {
            let file_name = value.as_str().unwrap().to_string();
            let bytes = match property["contentMediaType"].as_str() {
                Some("application/x-tar") => tar_of(&[("main.py", b"print('generated')\n")]),
                _ => b"generated from the document\n".to_vec(),
            };
            files.push((name.clone(), file_name, bytes));
        } else {
            fields.insert(name.clone(), value);
        }
    }
    let texts: Vec<(String, String)> = fields
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string())))
        .collect();
    match media_type.as_str() {
        "multipart/form-data" => {
            let texts: Vec<(&str, &str)> = texts.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let parts: Vec<(&str, &str, &[u8])> =
                files.iter().map(|(n, f, b)| (n.as_str(), f.as_str(), b.as_slice())).collect();
            let (content_type, body) = multipart(&texts, &parts);
            gateway.call(&operation.method, &path, token, Some(&content_type), body.into()).await
        }
        "application/x-www-form-urlencoded" => {
            assert!(files.is_empty(), "{} {}: a form cannot carry files", operation.method, operation.template);
            let body = serde_urlencoded::to_string(&texts).unwrap();
            gateway.call(&operation.method, &path, token, Some(media_type), body.into()).await
        }
        "application/json" => {
            assert!(files.is_empty(), "{} {}: JSON cannot carry files", operation.method, operation.template);
            let body = Value::Object(fields).to_string();
            gateway.call(&operation.method, &path, token, Some(media_type), body.into()).await
        }
        other => panic!("{} {}: no request is built for {other}", operation.method, operation.template),
    }
}

/// `body` with only its required fields, as a generator that fills in nothing optional sends
/// it.
fn required_only(body: &BodyVariant) -> BodyVariant {
    let required = required(&body.schema);
    let mut schema = body.schema.clone();
    schema["properties"].as_object_mut().unwrap().retain(|name, _| required.contains(name));
    BodyVariant { media_type: body.media_type.clone(), schema }
}

/// The operation sent once per documented body (once when it has none).
fn with_bodies(operation: &Operation) -> Vec<Option<BodyVariant>> {
    let bodies = bodies(operation);
    if bodies.is_empty() { vec![None] } else { bodies.into_iter().map(Some).collect() }
}

/// The published document as a generator reads it: every `$ref` to a schema replaced by the
/// schema it names, every `allOf` merged into one schema.
async fn document(gateway: &Gateway) -> Value {
    let document = gateway.call("GET", "/swagger.json", None, None, Body::empty()).await.json;
    resolved(&document, &document)
}

const SCHEMAS: &str = "#/components/schemas/";

fn resolved(value: &Value, document: &Value) -> Value {
    match value {
        Value::Object(map) => {
            if let Some(name) = map.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix(SCHEMAS)) {
                let mut target = resolved(&document["components"]["schemas"][name], document);
                for (key, sibling) in map.iter().filter(|(key, _)| *key != "$ref") {
                    target[key] = resolved(sibling, document);
                }
                return target;
            }
            let mut object: Map<String, Value> =
                map.iter().map(|(key, value)| (key.clone(), resolved(value, document))).collect();
            if let Some(Value::Array(parts)) = object.remove("allOf") {
                for part in parts {
                    merge(&mut object, part);
                }
            }
            Value::Object(object)
        }
        Value::Array(items) => Value::Array(items.iter().map(|item| resolved(item, document)).collect()),
        other => other.clone(),
    }
}

/// Adds one `allOf` part to a schema: properties and required fields join, other keys are taken
/// where the schema has none.
fn merge(object: &mut Map<String, Value>, part: Value) {
    let Value::Object(part) = part else { return };
    for (key, value) in part {
        match (key.as_str(), object.get_mut(&key), value) {
            ("properties", Some(Value::Object(properties)), Value::Object(more)) => properties.extend(more),
            ("required", Some(Value::Array(required)), Value::Array(more)) => {
                let new: Vec<Value> = more.into_iter().filter(|name| !required.contains(name)).collect();
                required.extend(new);
            }
            (_, None, value) => {
                object.insert(key, value);
            }
            _ => {}
        }
    }
}

/// What the examples name: alice's function `example-fn`, when `with_function`, and the provider
/// `example-provider` alice administers (for a provider's image).
async fn examples_exist(gateway: &Gateway, with_function: bool) {
    if with_function {
        gateway.upload_function("alice", &[("title", "example-fn"), ("entrypoint", "main.py")]).await;
    }
    gateway.provider("example-provider", None, "alice").await;
}

async fn requests_built_from_the_document_are_accepted(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    // The function and provider the examples name exist; the example ids do not.
    examples_exist(&gateway, true).await;
    let document = document(&gateway).await;
    let mut refused = Vec::new();
    let mut accepted = 0;
    for operation in operations(&document) {
        let bodies = with_bodies(&operation);
        let minimal = bodies.iter().flatten().map(required_only).map(Some);
        for body in bodies.iter().cloned().chain(minimal) {
            let reply = send(&gateway, &operation, body.as_ref(), None).await;
            match reply.status.as_u16() {
                200..=299 => accepted += 1,
                404 => {}
                _ => refused.push(format!(
                    "{} {} {body:?}: {} {}",
                    operation.method, operation.template, reply.status, reply.json
                )),
            }
        }
    }
    assert!(refused.is_empty(), "requests built from the document were refused:\n{}", refused.join("\n"));
    // Not everything may hide behind 404: upload, run, validation, files and listings succeed.
    assert!(accepted >= 15, "only {accepted} operations answered 2xx");
}

/// Each documented encoding of an upload, with the optional examples, creates the function on a
/// gateway where it does not exist yet. With the required fields alone (`title`, all the
/// document requires, as an update needs no more) it updates the caller's existing function
/// and keeps what it had; for a function that does not exist, that request is the 400 the
/// operation's text states (creating needs what the function runs).
async fn each_documented_way_to_upload_creates_or_updates_a_function(backend: Backend) {
    let document = document(&Gateway::start(backend).await).await;
    let upload = operations(&document).into_iter().find(|o| o.template == "/api/v1/programs/upload/").unwrap();
    let description = upload.spec["description"].as_str().unwrap_or_default();
    assert!(description.contains("valid update"), "the operation states what an update needs: {description}");
    let bodies = bodies(&upload);
    let mut refused = Vec::new();
    for body in &bodies {
        let gateway = Gateway::start(backend).await;
        examples_exist(&gateway, true).await;
        let stored = || async {
            let mut function = gateway.get("/api/v1/programs/get_by_title/example-fn/", "alice").await.json;
            function.as_object_mut().expect("a function").remove("updated");
            function
        };
        let before = stored().await;
        let reply = send(&gateway, &upload, Some(body), None).await;
        if reply.status != 200 {
            refused.push(format!("{body:?}: {} {}", reply.status, reply.json));
        }
        let minimal = required_only(body);
        assert_eq!(required(&minimal.schema), ["title"], "{minimal:?}");
        let reply = send(&gateway, &upload, Some(&minimal), None).await;
        if reply.status != 200 {
            refused.push(format!("{minimal:?}: {} {}", reply.status, reply.json));
        }
        assert_eq!(stored().await, before, "an update with only the title keeps the function as it was");

        let fresh = Gateway::start(backend).await;
        let reply = send(&fresh, &upload, Some(&minimal), None).await;
        assert_eq!(reply.status, 400, "{minimal:?}: {}", reply.json);
        assert_eq!(reply.message(), "At least one of attributes (entrypoint, image) is required.");
    }
    assert!(refused.is_empty(), "uploads built from the document were refused:\n{}", refused.join("\n"));
    // Multipart, JSON and a form.
    assert_eq!(bodies.len(), 3, "{bodies:#?}");
}

async fn requests_breaking_a_documented_constraint_are_4xx(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    // The provider exists, so that leaving a field out of an upload is what refuses it; no
    // function exists, so that an upload without its branch's fields would create one.
    examples_exist(&gateway, false).await;
    let document = document(&gateway).await;
    let mut accepted = Vec::new();
    let mut checked = 0;
    for operation in operations(&document) {
        for body in with_bodies(&operation) {
            for broken in breaks(&operation, body.as_ref()) {
                let reply = send(&gateway, &operation, body.as_ref(), Some(&broken)).await;
                checked += 1;
                if !reply.status.is_client_error() {
                    accepted.push(format!(
                        "{} {} {body:?} with {broken:?}: {} {}",
                        operation.method, operation.template, reply.status, reply.json
                    ));
                }
            }
        }
    }
    assert!(accepted.is_empty(), "requests breaking the document were not refused:\n{}", accepted.join("\n"));
    assert!(checked > 60, "only {checked} constraints checked");
}
