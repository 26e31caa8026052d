//! The published interface description (OpenAPI 3.1), served at `/swagger.json` and rendered as a
//! self-contained page at `/swagger/` (no external scripts, so it works offline).

use axum::Json;
use axum::response::Html;
use serde_json::{Value, json};

/// A query parameter with its schema (constraints the handler enforces) and an example.
fn query(name: &str, required: bool, schema: Value, description: &str) -> Value {
    json!({"name": name, "in": "query", "required": required, "schema": schema, "description": description})
}

/// A non-empty text; `example` is what a generated request sends.
fn text(example: &str) -> Value {
    json!({"type": "string", "minLength": 1, "example": example})
}

fn operation(summary: &str, parameters: Vec<Value>, body: Option<Value>, response: Value) -> Value {
    let mut op = json!({
        "summary": summary,
        "parameters": parameters,
        "security": [{"bearer": []}],
        "responses": {
            "200": {"description": "success", "content": {"application/json": {"schema": response}}},
            "400": {"$ref": "#/components/responses/BadRequest"},
            "401": {"$ref": "#/components/responses/Unauthorized"},
            "404": {"$ref": "#/components/responses/NotFound"},
            "413": {"$ref": "#/components/responses/PayloadTooLarge"}
        }
    });
    if let Some(body) = body {
        op["requestBody"] = body;
    }
    op
}

/// The `Last-Event-ID` header a reconnecting EventSource sends.
fn last_event_id_header() -> Value {
    json!({"name": "Last-Event-ID", "in": "header", "required": false, "schema": {"type": "integer", "minimum": 0},
        "description": "resume after this event id"})
}

/// The `Idempotency-Key` header of `programs/run/` and `programs/upload/` (see `api::idempotency`).
fn idempotency_key_header() -> Value {
    json!({"name": "Idempotency-Key", "in": "header", "required": false,
        "schema": {"type": "string", "pattern": "^[!-~]{1,255}$", "example": "retry-7f3c2a"},
        "description": "1 to 255 visible ASCII characters: a retry with the same key within 24 h gets the first answer (status and body) and creates nothing; the same key with a different request answers 422"})
}

/// An operation whose success is a stream of one of `types` instead of JSON.
fn streamed(mut op: Value, types: &[&str]) -> Value {
    let content: serde_json::Map<String, Value> =
        types.iter().map(|t| (t.to_string(), json!({"schema": {"type": "string"}}))).collect();
    op["responses"]["200"] = json!({"description": "a stream that ends with the job", "content": content});
    op
}

/// A followed log: SSE (`log` events whose id is the byte offset after them, then `end`) or
/// chunked text.
fn log_stream(summary: &str) -> Value {
    streamed(
        operation(
            summary,
            vec![
                json!({"name": "job_id", "in": "path", "required": true, "schema": {"type": "string", "format": "uuid", "example": EXAMPLE_ID}}),
                query(
                    "offset",
                    false,
                    json!({"type": "integer", "minimum": 0, "default": 0}),
                    "byte offset to start from",
                ),
                query(
                    "format",
                    false,
                    json!({"type": "string", "enum": ["sse", "text"]}),
                    "default: SSE when Accept names text/event-stream or Last-Event-ID is sent, else text",
                ),
                last_event_id_header(),
            ],
            None,
            json!({}),
        ),
        &["text/event-stream", "text/plain"],
    )
}

fn public(summary: &str) -> Value {
    json!({"summary": summary, "security": [], "responses": {"200": {"description": "success"}, "503": {"description": "not ready"}}})
}

/// A body accepted as JSON and as a form; with `multipart`, also as `multipart/form-data`, the
/// only encoding that carries file parts (properties of `format: binary`).
fn form_body(properties: Value, required: &[&str], multipart: bool) -> Value {
    let schema = json!({"type": "object", "properties": properties, "required": required});
    let has_files = schema["properties"].as_object().is_some_and(|p| p.values().any(|v| v["format"] == "binary"));
    let mut content = serde_json::Map::new();
    if !has_files {
        content.insert("application/json".into(), json!({"schema": schema}));
        content.insert("application/x-www-form-urlencoded".into(), json!({"schema": schema}));
    }
    if multipart || has_files {
        content.insert("multipart/form-data".into(), json!({"schema": schema}));
    }
    json!({"required": true, "content": content})
}

/// `programs/upload/`'s body. Creating a function needs `entrypoint` and `artifact` (code) or
/// `image` and `provider` (a provider's container image): multipart states both as `anyOf`, so a
/// request built from either branch is accepted. JSON and forms cannot carry the artifact: there
/// it is the image. An update needs neither (the operation's summary says so).
fn upload_body(properties: Value) -> Value {
    let code = json!({"required": ["entrypoint", "artifact"]});
    let image = json!({"required": ["image", "provider"]});
    let multipart = json!({"type": "object", "properties": properties, "required": ["title"], "anyOf": [code, image]});
    let mut fields = properties;
    fields.as_object_mut().expect("the properties are an object").remove("artifact");
    let fields = json!({"type": "object", "properties": fields, "required": ["title", "image", "provider"]});
    json!({"required": true, "content": {
        "multipart/form-data": {"schema": multipart},
        "application/json": {"schema": fields},
        "application/x-www-form-urlencoded": {"schema": fields}}})
}

const STATUSES: [&str; 6] = ["QUEUED", "PENDING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED"];
const SUB_STATUSES: [&str; 5] = ["MAPPING", "OPTIMIZING_HARDWARE", "WAITING_QPU", "EXECUTING_QPU", "POST_PROCESSING"];
const SIZES: [&str; 4] = ["S", "M", "L", "XL"];
/// The example ids: no job or function has them, so requests with them answer 404.
const EXAMPLE_ID: &str = "00000000-0000-4000-8000-000000000000";

/// The whole document; every route of `api::router` appears here (a test checks it), with every
/// constraint its handler enforces (required fields and parameters, enums, formats, file parts)
/// and examples from which a valid request can be generated (another test does so).
pub fn document() -> Value {
    let function = json!({"$ref": "#/components/schemas/Function"});
    let function_param = || query("function", true, text("example-fn"), "function title");
    let file_params = || vec![function_param(), query("provider", false, json!({"type": "string"}), "provider name")];
    let file_params_required_provider =
        || vec![function_param(), query("provider", true, text("example-provider"), "provider name")];
    let with_file = |mut params: Vec<Value>| {
        params.push(query("file", true, text("notes.txt"), "file name"));
        params
    };
    let upload_file = || {
        form_body(
            json!({"file": {"type": "string", "format": "binary", "contentMediaType": "text/plain", "example": "notes.txt",
                   "description": "the file; its content must sniff as one of the accepted MIME types"}}),
            &["file"],
            true,
        )
    };
    let file_list =
        json!({"type": "object", "properties": {"results": {"type": "array", "items": {"type": "string"}}}});
    let message = json!({"type": "object", "properties": {"message": {"type": "string"}}});
    let binary = json!({"type": "string", "format": "binary"});
    let id_path = |name: &str| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string", "format": "uuid", "example": EXAMPLE_ID}});
    let job = json!({"$ref": "#/components/schemas/Job"});
    let page = json!({"type": "object", "properties": {"count": {"type": "integer"}, "next": {"type": ["string", "null"]},
        "previous": {"type": ["string", "null"]}, "results": {"type": "array", "items": job}}});
    let logs = json!({"type": "object", "properties": {"logs": {"type": "string"}}});
    let job_list_params = |provider_required: bool| {
        let provider = match provider_required {
            true => text("example-provider"),
            false => json!({"type": "string"}),
        };
        vec![
            query("provider", provider_required, provider, "provider name"),
            query("function", false, json!({"type": "string"}), "function title; 404 when no such function exists"),
            query("status", false, json!({"type": "string", "enum": STATUSES}), "job status"),
            query(
                "filter",
                false,
                json!({"type": "string", "enum": ["catalog", "serverless"]}),
                "catalog (provider functions) or serverless (own functions)",
            ),
            query(
                "created_after",
                false,
                json!({"type": "string", "format": "date-time"}),
                "ISO 8601 date or datetime (naive is UTC), inclusive",
            ),
            query("limit", false, json!({"type": "integer", "minimum": 0, "default": 10}), "page size, 0 for all"),
            query("offset", false, json!({"type": "integer", "minimum": 0, "default": 0}), "results skipped"),
        ]
    };
    let arguments = json!({"type": "string", "minLength": 1, "example": "{}",
        "description": "the arguments as encoded JSON text (the client sends a string; a JSON object is accepted too), validated against the function's schema"});
    json!({
        "openapi": "3.1.0",
        "info": {"title": "Gantry gateway API", "version": env!("CARGO_PKG_VERSION"),
                 "description": "Job gateway for user-uploaded functions, compatible with the qiskit-serverless client. Every path is also served without its trailing slash. Text fields are trimmed of surrounding whitespace."},
        "paths": {
            "/api/v1/programs/": {"get": operation("List the functions the caller can see", vec![
                query("filter", false, json!({"type": "string"}), "serverless (own functions) or catalog (provider functions the caller may run); other values list everything"),
                query("provider", false, json!({"type": "string"}), "only functions of this provider")], None, json!({"type": "array", "items": function}))},
            "/api/v1/programs/get_by_title/{title}/": {"get": {
                "summary": "One function by title (own function, or a provider's with `provider`)",
                "parameters": [{"name": "title", "in": "path", "required": true, "schema": text("example-fn")}, query("provider", false, json!({"type": "string"}), "provider name")],
                "security": [{"bearer": []}],
                "responses": {"200": {"description": "the function", "content": {"application/json": {"schema": function}}},
                              "401": {"$ref": "#/components/responses/Unauthorized"},
                              "404": {"$ref": "#/components/responses/NotFound"}}}},
            "/api/v1/programs/upload/": {"post": operation("Create or update a function (upsert). Creating needs `entrypoint` and `artifact`, or `image` (providers); an update changes only the fields sent", vec![idempotency_key_header()], Some(upload_body(json!({
                "title": {"type": "string", "minLength": 1, "maxLength": 255, "example": "example-fn", "description": "sanitized to letters, digits, _ and -; `provider/title` names a provider function"},
                "provider": {"type": "string", "example": "example-provider", "description": "the provider of a provider function (or `provider/title` as `title`); required with `image`"},
                "entrypoint": {"type": "string", "pattern": "^[A-Za-z0-9_./-]+\\.py$", "example": "main.py", "description": "relative path of a .py file inside the artifact, no `..`"},
                "artifact": {"type": "string", "format": "binary", "contentMediaType": "application/x-tar", "example": "artifact.tar", "description": "uncompressed .tar holding the entrypoint"},
                "image": {"type": "string", "example": "registry.example/example-provider/example-fn:1.0", "description": "container image (provider functions only; must be in the provider's registry)"},
                "dependencies": {"type": "string", "description": "JSON array of pinned requirements from dependencies-versions/"},
                "env_vars": {"type": "string", "description": "JSON object of strings"}, "description": {"type": "string"},
                "version": {"type": "string", "description": "a PEP 440 version such as 1.2.3"},
                "type": {"type": "string", "enum": ["GENERIC", "APPLICATION", "CIRCUIT"]},
                "arguments_schema": {"type": "string", "maxLength": 65536, "description": "JSON Schema (object or boolean); {} removes it"},
                "sizes": {"type": "string", "description": "JSON object {label: compute profile}, labels S, M, L, XL"},
                "default_size": {"type": "string", "enum": SIZES}, "function_size": {"type": "string", "enum": SIZES},
                "gpu": {"type": "boolean", "description": "provider functions only"}}))), function.clone())},
            "/api/v1/programs/validate_arguments/": {"post": operation("Validate arguments against a function's schema", vec![],
                Some(form_body(json!({"title": text("example-fn"), "provider": {"type": "string"}, "arguments": arguments}), &["title", "arguments"], false)),
                json!({"type": "object", "properties": {"valid": {"type": "boolean"}}}))},
            "/api/v1/programs/run/": {"post": operation("Run a function: queue a job", vec![idempotency_key_header()],
                Some(form_body(json!({"title": text("example-fn"), "provider": {"type": "string"},
                    "arguments": arguments,
                    "function_size": {"type": "string", "enum": SIZES, "description": "a label of the function's sizes"},
                    "config": {"type": "object", "properties": {"workers": {"type": ["integer", "null"]}, "auto_scaling": {"type": "boolean"}}}}), &["title", "arguments"], false)),
                json!({"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}, "status": {"type": "string"}}}))},
            "/api/v1/programs/{program_id}/get_jobs/": {"get": operation("Jobs of one function (every author's, without result, for its provider side)",
                vec![id_path("program_id")], None, json!({"type": "array", "items": job.clone()}))},
            "/api/v1/jobs/": {"get": operation("The caller's jobs, newest first", job_list_params(false), None, page.clone())},
            "/api/v1/jobs/provider/": {"get": operation("Jobs of a provider's functions, every author", job_list_params(true), None, page)},
            "/api/v1/jobs/queue/": {"get": operation("Where the caller's unfinished jobs stand: active slots used of the limit, and for each queued job how many queued jobs of any user came before it (oldest first)", vec![query("limit", false, json!({"type": "integer", "minimum": 0, "maximum": 500, "default": 500, "example": 10}), "list at most this many jobs (the counts cover all)")], None,
                json!({"type": "object", "required": ["active_limit", "active", "queued", "running", "jobs"], "properties": {
                    "active_limit": {"type": "integer", "description": "most QUEUED+PENDING+RUNNING jobs the caller may have (run answers 429 beyond)"},
                    "active": {"type": "integer"}, "queued": {"type": "integer"}, "running": {"type": "integer", "description": "PENDING or RUNNING"},
                    "jobs": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "string"}, "status": {"type": "string", "enum": ["QUEUED", "PENDING", "RUNNING"]},
                        "created": {"type": "string", "format": "date-time"}, "ahead": {"type": ["integer", "null"], "description": "queued jobs created before this one (QUEUED jobs only)"}}}}}}))},
            "/api/v1/jobs/{job_id}/": {"get": operation("One job", vec![id_path("job_id"), query("with_result", false, json!({"type": "boolean", "default": true}), "include the result (author only)")], None, job.clone())},
            "/api/v1/jobs/{job_id}/result/": {
                "get": operation("The job's result as JSON text (204 when none)", vec![id_path("job_id")], None, json!({"type": "object", "properties": {"result": {"type": "string"}}})),
                "post": operation("Save a result (older in-job clients)", vec![id_path("job_id")], Some(form_body(json!({"result": text("{}")}), &["result"], false)), job.clone())},
            "/api/v1/jobs/{job_id}/logs/": {"get": operation("User logs (job author)", vec![id_path("job_id")], None, logs.clone())},
            "/api/v1/jobs/{job_id}/logs/stream/": {"get": log_stream("User log followed live until the job ends (job author)")},
            "/api/v1/jobs/{job_id}/provider-logs/": {"get": operation("Provider logs (provider side)", vec![id_path("job_id")], None, logs)},
            "/api/v1/jobs/{job_id}/provider-logs/stream/": {"get": log_stream("Provider log followed live until the job ends (provider side)")},
            "/api/v1/jobs/{job_id}/stop/": {"post": operation("Request a stop; the job's status tells when it stopped", vec![id_path("job_id")],
                Some(form_body(json!({"service": {"type": "string", "description": "serialized runtime service; never stored"}}), &[], false)), message.clone())},
            "/api/v1/jobs/{job_id}/sub_status/": {"patch": operation("Set the sub-status of an active job (from inside the job)", vec![id_path("job_id")],
                Some(form_body(json!({"sub_status": {"type": "string", "enum": SUB_STATUSES, "example": "MAPPING"}}), &["sub_status"], false)),
                json!({"type": "object", "properties": {"job": job.clone()}}))},
            "/api/v1/jobs/{job_id}/event/": {"post": operation("Record an ERROR event of an active job", vec![id_path("job_id")],
                Some(form_body(json!({"type": {"type": "string", "enum": ["ERROR"], "example": "ERROR", "description": "any letter case"}, "code": text("E1"), "message": text("failed"),
                    "exception": text("ValueError"), "args": {}}), &["type", "code", "message", "exception"], false)), json!({}))},
            "/api/v1/jobs/{job_id}/events/": {"get": operation("Events of a job, newest first", vec![id_path("job_id"), query("type", false, json!({"type": "string", "enum": ["ERROR"]}), "only events of this type (any letter case)")], None,
                json!({"type": "array", "items": {"type": "object", "properties": {"event_type": {"type": "string"}, "origin": {"type": "string"},
                    "context": {"type": "string"}, "created": {"type": "string", "format": "date-time"}, "data": {"type": "object"}}}}))},
            "/api/v1/jobs/{job_id}/events/stream/": {"get": streamed(operation(
                "Events of a job as Server-Sent Events, oldest first, as they are recorded; ends after the terminal event. Each event's id is its sequence number",
                vec![id_path("job_id"), query("last_event_id", false, json!({"type": "integer", "minimum": 0}), "resume after this event (the Last-Event-ID header wins)"), last_event_id_header()],
                None, json!({})), &["text/event-stream"])},
            "/api/v1/jobs/{job_id}/runtime_jobs/": {
                "get": operation("Runtime jobs the job reported", vec![id_path("job_id")], None, json!({"type": "object", "properties": {"runtime_jobs": {"type": "array"}}})),
                "post": operation("Report a runtime job", vec![id_path("job_id")], Some(form_body(json!({"runtime_job": {"type": "string", "minLength": 1, "maxLength": 100, "example": "runtime-job-1"}, "runtime_session": {"type": ["string", "null"]}}), &["runtime_job"], false)), message.clone())},
            "/api/v1/files/": {"get": operation("List the caller's files of a function (one area for all of a user's custom functions)", file_params(), None, file_list.clone())},
            "/api/v1/files/list/": {"get": operation("List the caller's files of a function (spec shape)", file_params(), None,
                json!({"type": "object", "properties": {"files": {"type": "array", "items": {"type": "string"}}}}))},
            "/api/v1/files/upload/": {"post": operation("Upload a file to the caller's area", file_params(), Some(upload_file()), message.clone())},
            "/api/v1/files/download/": {"get": operation("Download a file (streamed in 64 KB chunks)", with_file(file_params()), None, binary.clone())},
            "/api/v1/files/delete/": {"delete": operation("Delete a file", with_file(file_params()), None, message.clone())},
            "/api/v1/files/provider/": {"get": operation("List a provider's files of a function", file_params_required_provider(), None, file_list)},
            "/api/v1/files/provider/upload/": {"post": operation("Upload a provider file", file_params_required_provider(), Some(upload_file()), message.clone())},
            "/api/v1/files/provider/download/": {"get": operation("Download a provider file", with_file(file_params_required_provider()), None, binary)},
            "/api/v1/files/provider/delete/": {"delete": operation("Delete a provider file", with_file(file_params_required_provider()), None, message)},
            "/api/v1/dependencies-versions/": {"get": operation("Allowed extra dependencies", vec![], None, json!({"type": "array", "items": {"type": "string"}}))},
            "/api/v1/version/": {"get": public("Gateway version")},
            "/api/v1/readiness/": {"get": public("Ready when database and storage answer")},
            "/api/v1/liveness/": {"get": public("Alive")},
            "/version/": {"get": public("Gateway version")},
            "/readiness/": {"get": public("Ready when database and storage answer")},
            "/liveness/": {"get": public("Alive")}
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Function": {"type": "object", "properties": {
                    "id": {"type": "string", "format": "uuid"}, "title": {"type": "string"}, "provider": {"type": ["string", "null"]},
                    "entrypoint": {"type": ["string", "null"]}, "image": {"type": ["string", "null"]},
                    "dependencies": {"type": "array", "items": {"type": "string"}}, "type": {"type": "string"},
                    "version": {"type": ["string", "null"]}, "description": {"type": ["string", "null"]}, "gpu": {"type": "boolean"},
                    "arguments_schema": {"type": ["object", "boolean", "null"]}, "function_size": {"type": ["string", "null"]},
                    "sizes": {"type": "object"}, "default_size": {"type": ["string", "null"]}}},
                "Job": {"type": "object", "properties": {
                    "id": {"type": "string", "format": "uuid"}, "status": {"type": "string", "enum": STATUSES}, "sub_status": {"type": ["string", "null"]},
                    "program": {"type": "object", "properties": {"id": {"type": "string"}, "title": {"type": "string"}, "provider": {"type": ["string", "null"]}}},
                    "created": {"type": "string", "format": "date-time"}, "result": {"type": ["string", "null"]}}},
                "Error": {"type": "object", "properties": {"message": {"type": "string"}, "path": {"type": "array"}}}
            },
            "responses": {
                "BadRequest": {"description": "invalid input", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
                "Unauthorized": {"description": "missing or invalid token", "content": {"application/json": {"schema": {"type": "object", "properties": {"detail": {"type": "string"}}}}}},
                "NotFound": {"description": "not found or not visible", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
                "PayloadTooLarge": {"description": "body above MAX_REQUEST_BODY_SIZE_MB", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
            }
        }
    })
}

pub async fn swagger_json() -> Json<Value> {
    Json(document())
}

/// A plain page listing every operation; the JSON document is one link away.
pub async fn swagger_ui() -> Html<String> {
    let document = document();
    let mut rows = String::new();
    if let Some(paths) = document["paths"].as_object() {
        for (path, operations) in paths {
            for (method, operation) in operations.as_object().into_iter().flatten() {
                rows.push_str(&format!(
                    "<tr><td><code>{}</code></td><td><code>{path}</code></td><td>{}</td></tr>\n",
                    method.to_uppercase(),
                    operation["summary"].as_str().unwrap_or_default()
                ));
            }
        }
    }
    Html(format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Gantry API</title></head><body>\
         <h1>Gantry gateway API</h1><p>OpenAPI document: <a href=\"/swagger.json\">/swagger.json</a></p>\
         <table border=\"1\" cellpadding=\"4\"><tr><th>method</th><th>path</th><th>summary</th></tr>\n{rows}</table></body></html>"
    ))
}
