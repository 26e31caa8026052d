//! Every message `reference-contract.md` quotes, triggered through HTTP: ours must start with
//! exactly the reference's text (users' code compares these strings). One table, run in order
//! against one installation; each row names the request, the status and the expected prefix.

use serde_json::{Value, json};

use crate::both_backends;
use crate::harness::{Backend, Gateway, Reply, multipart, tar_of};

both_backends!(every_quoted_message_starts_with_the_reference_text);

enum Body {
    None,
    Json(Value),
    Form(&'static [(&'static str, &'static str)]),
    Upload(Vec<(&'static str, String)>, Option<(&'static str, Vec<u8>)>),
}

struct Case {
    method: &'static str,
    path: String,
    token: Option<&'static str>,
    body: Body,
    status: u16,
    prefix: String,
}

fn case(
    method: &'static str,
    path: impl Into<String>,
    token: &'static str,
    body: Body,
    status: u16,
    prefix: impl Into<String>,
) -> Case {
    Case { method, path: path.into(), token: Some(token), body, status, prefix: prefix.into() }
}

/// The text a client shows: `message`, `detail` (401) or `logs`.
fn text_of(reply: &Reply) -> String {
    ["message", "detail", "logs"].iter().find_map(|key| reply.json[key].as_str()).unwrap_or_default().to_string()
}

async fn send(gateway: &Gateway, case: &Case) -> Reply {
    match &case.body {
        Body::None => gateway.call(case.method, &case.path, case.token, None, axum::body::Body::empty()).await,
        Body::Json(value) => {
            gateway.call(case.method, &case.path, case.token, Some("application/json"), value.to_string().into()).await
        }
        Body::Form(fields) => {
            let body = serde_urlencoded::to_string(fields).unwrap();
            gateway
                .call(case.method, &case.path, case.token, Some("application/x-www-form-urlencoded"), body.into())
                .await
        }
        Body::Upload(fields, file) => {
            let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let files: Vec<(&str, &str, &[u8])> = file
                .iter()
                .map(|(name, bytes)| {
                    (
                        if name.ends_with(".txt") || name.ends_with(".html") { "file" } else { "artifact" },
                        *name,
                        bytes.as_slice(),
                    )
                })
                .collect();
            let (content_type, body) = multipart(&fields, &files);
            gateway.call(case.method, &case.path, case.token, Some(&content_type), body.into()).await
        }
    }
}

fn upload(fields: &[(&'static str, &str)]) -> Body {
    let fields = fields.iter().map(|(k, v)| (*k, v.to_string())).collect();
    Body::Upload(fields, None)
}

async fn job(gateway: &Gateway, token: &str, title: &str, provider: Option<&str>) -> String {
    let body = json!({"title": title, "provider": provider, "arguments": "{}"});
    let reply = gateway.post_json("/api/v1/programs/run/", token, body).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    reply.json["id"].as_str().unwrap().to_string()
}

async fn every_quoted_message_starts_with_the_reference_text(backend: Backend) {
    let gateway = Gateway::start_with(backend, |config| config.active_jobs_per_user = 1).await;
    gateway.provider("acme", Some("docker.io/acme"), "erin").await;
    gateway.upload_function("erin", &[("title", "acme/tool"), ("entrypoint", "main.py")]).await;
    gateway.upload_function("erin", &[("title", "acme/off"), ("entrypoint", "main.py")]).await;
    gateway
        .admin(gantry::admin::AdminCommand::DisableFunction {
            provider: "acme".into(),
            function: "off".into(),
            message: None,
        })
        .await;
    gateway.admin(gantry::admin::AdminCommand::AddAdmin { provider: "acme".into(), user: "alice".into() }).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    gateway
        .upload_function(
            "carol",
            &[
                ("title", "typed"),
                ("entrypoint", "main.py"),
                ("arguments_schema", r#"{"type": "object", "properties": {"n": {"minimum": 3}}}"#),
            ],
        )
        .await;
    gateway.admin(gantry::admin::AdminCommand::DeactivateUser { user: "mallory".into() }).await;
    // A finished job, then the one active job alice's limit of 1 allows.
    let stopped = job(&gateway, "alice", "fn", None).await;
    assert_eq!(gateway.post_json(&format!("/api/v1/jobs/{stopped}/stop/"), "alice", json!({})).await.status, 200);
    let id = job(&gateway, "alice", "fn", None).await;
    let provider_job = job(&gateway, "erin", "tool", Some("acme")).await;
    let missing = "00000000-0000-4000-8000-000000000000";
    let tar = tar_of(&[("main.py", b"print(1)\n")]);
    let long_schema = format!("{{\"description\": \"{}\"}}", "x".repeat(70_000));

    let cases = vec![
        // §6: authentication (401, `detail`).
        Case {
            method: "GET",
            path: "/api/v1/programs/".into(),
            token: None,
            body: Body::None,
            status: 401,
            prefix: "Authorization token was not provided.".into(),
        },
        case("GET", "/api/v1/programs/", "not!valid", Body::None, 401, "Authorization token is not valid."),
        case(
            "GET",
            "/api/v1/programs/",
            "mallory",
            Body::None,
            401,
            "Your user was deactivated. Please contact IBM support for reactivation.",
        ),
        // §1.3, §1.4: functions.
        case(
            "GET",
            "/api/v1/programs/get_by_title/nope/",
            "alice",
            Body::None,
            404,
            "Qiskit Function nope doesn't exist.",
        ),
        case(
            "GET",
            "/api/v1/programs/get_by_title/nope/?provider=acme",
            "alice",
            Body::None,
            404,
            "Qiskit Function acme/nope doesn't exist.",
        ),
        case(
            "GET",
            format!("/api/v1/programs/{missing}/get_jobs/"),
            "alice",
            Body::None,
            404,
            format!("Qiskit Function {missing} doesn't exist."),
        ),
        // §1.5, §7.5: upload.
        case(
            "POST",
            "/api/v1/programs/upload/",
            "erin",
            upload(&[("entrypoint", "main.py")]),
            400,
            "This field is required.",
        ),
        case(
            "POST",
            "/api/v1/programs/upload/",
            "erin",
            upload(&[("title", "acme/x"), ("provider", "acme")]),
            400,
            "Provider defined in title and in provider fields.",
        ),
        case(
            "POST",
            "/api/v1/programs/upload/",
            "erin",
            upload(&[("title", "a/b/c")]),
            400,
            "Qiskit Function title is malformed. It can only contain one slash.",
        ),
        case(
            "POST",
            "/api/v1/programs/upload/",
            "alice",
            upload(&[("title", "fn"), ("entrypoint", "../main.py")]),
            400,
            "Invalid entrypoint. It must be a relative path to a .py file without '..' segments or shell characters.",
        ),
        case(
            "POST",
            "/api/v1/programs/upload/",
            "alice",
            upload(&[("title", "img"), ("image", "docker.io/x")]),
            400,
            "Custom images are only available if you are a provider.",
        ),
        case(
            "POST",
            "/api/v1/programs/upload/",
            "erin",
            upload(&[("title", "ghost/img"), ("image", "docker.io/x")]),
            400,
            "ghost is not valid provider.",
        ),
        case(
            "POST",
            "/api/v1/programs/upload/",
            "erin",
            upload(&[("title", "acme/img"), ("image", "docker.io/acmex/y")]),
            400,
            "Custom images must be in docker.io/acme.",
        ),
        case(
            "POST",
            "/api/v1/programs/upload/",
            "alice",
            upload(&[("title", "fn"), ("version", "not-a-version")]),
            400,
            "Invalid version - expected format x.y.z",
        ),
        case(
            "POST",
            "/api/v1/programs/upload/",
            "alice",
            upload(&[("title", "fn"), ("arguments_schema", &long_schema)]),
            400,
            format!("arguments_schema is {} characters long and the maximum is 65536.", long_schema.len()),
        ),
        case(
            "POST",
            "/api/v1/programs/upload/",
            "alice",
            upload(&[("title", "fn"), ("arguments_schema", "[1]")]),
            400,
            "arguments_schema cannot be used: ",
        ),
        case(
            "POST",
            "/api/v1/programs/upload/",
            "alice",
            upload(&[("title", "new")]),
            400,
            "At least one of attributes (entrypoint, image) is required.",
        ),
        case(
            "POST",
            "/api/v1/programs/upload/",
            "alice",
            upload(&[("title", "fn"), ("dependencies", "nope")]),
            400,
            "'dependencies' should be an array of strings or objects: ",
        ),
        case(
            "POST",
            "/api/v1/programs/upload/",
            "alice",
            upload(&[("title", "fn"), ("dependencies", "{}")]),
            400,
            "'dependencies' should be an array.",
        ),
        case(
            "POST",
            "/api/v1/programs/upload/",
            "alice",
            upload(&[("title", "fn"), ("dependencies", "[1]")]),
            400,
            "'dependencies' should be an array with strings or dict.",
        ),
        case(
            "POST",
            "/api/v1/programs/upload/",
            "alice",
            upload(&[("title", "fn"), ("dependencies", r#"[{"a": "1", "b": "2"}]"#)]),
            400,
            "'dependencies' should be an array with dict containing one dependency only.",
        ),
        case(
            "POST",
            "/api/v1/programs/upload/",
            "alice",
            upload(&[("title", "fn"), ("dependencies", r#"["mergedeep>=1.0"]"#)]),
            400,
            "'dependencies' needs one fixed version using the '==' operator.",
        ),
        case(
            "POST",
            "/api/v1/programs/upload/",
            "alice",
            upload(&[("title", "fn"), ("dependencies", r#"["numpy==1.0"]"#)]),
            400,
            "Dependency `numpy` is not allowed. You can request the dependency here: https://github.com/Qiskit/qiskit-serverless/issues/new?template=pip_dependency_request.yaml",
        ),
        case(
            "POST",
            "/api/v1/programs/upload/",
            "alice",
            upload(&[("title", "fn"), ("dependencies", r#"["mergedeep==9.9.9"]"#)]),
            400,
            "Dependency (mergedeep) version (9.9.9) is not allowed. Valid versions: mergedeep==1.3.4",
        ),
        case(
            "POST",
            "/api/v1/programs/upload/",
            "alice",
            Body::Upload(
                vec![("title", "zip".into()), ("entrypoint", "main.py".into())],
                Some(("code.zip", tar.clone())),
            ),
            400,
            "File extension “zip” is not allowed. Allowed extensions are: tar.",
        ),
        // §1.6, §7.6: run.
        case(
            "POST",
            "/api/v1/programs/run/",
            "carol",
            Body::Json(json!({"title": "typed"})),
            400,
            "This field is required.",
        ),
        case(
            "POST",
            "/api/v1/programs/run/",
            "carol",
            Body::Json(json!({"title": "typed", "arguments": "  "})),
            400,
            "This field may not be blank.",
        ),
        case(
            "POST",
            "/api/v1/programs/run/",
            "carol",
            Body::Json(json!({"title": "nope", "arguments": "{}"})),
            404,
            "Qiskit Function nope doesn't exist.",
        ),
        case(
            "POST",
            "/api/v1/programs/run/",
            "carol",
            Body::Json(json!({"title": "nope", "provider": "acme", "arguments": "{}"})),
            404,
            "Qiskit Function acme/nope doesn't exist.",
        ),
        case(
            "POST",
            "/api/v1/programs/run/",
            "erin",
            Body::Json(json!({"title": "off", "provider": "acme", "arguments": "{}"})),
            423,
            "IBM has temporarily disabled access to this function",
        ),
        case(
            "POST",
            "/api/v1/programs/run/",
            "alice",
            Body::Json(json!({"title": "fn", "arguments": "{}"})),
            429,
            "Active job limit reached. The maximum allowed is 1.",
        ),
        case(
            "POST",
            "/api/v1/programs/run/",
            "carol",
            Body::Json(json!({"title": "typed", "arguments": "{\"n\": 1}"})),
            400,
            "'minimum' validation failed, schema requires 3: rejected value 1",
        ),
        case(
            "POST",
            "/api/v1/programs/run/",
            "carol",
            Body::Json(json!({"title": "typed", "arguments": "{"})),
            400,
            "arguments is not valid JSON: ",
        ),
        // §1.7: validate_arguments.
        case(
            "POST",
            "/api/v1/programs/validate_arguments/",
            "carol",
            Body::Json(json!({"title": "!!", "arguments": "{}"})),
            400,
            "Invalid title.",
        ),
        // §1.8, §1.9: listings.
        case("GET", "/api/v1/jobs/?function=nope", "alice", Body::None, 404, "Qiskit Function nope doesn't exist."),
        case("GET", "/api/v1/jobs/?filter=x", "alice", Body::None, 400, "\"x\" is not a valid choice."),
        case("GET", "/api/v1/jobs/provider/", "erin", Body::None, 400, "'provider' not provided or is not valid"),
        case("GET", "/api/v1/jobs/provider/?provider=nope", "erin", Body::None, 404, "Provider nope doesn't exist."),
        // Pages above 100 (get_jobs: 1,000) go to PostgreSQL with their values written in:
        // quotes and backslashes in a value stay text.
        case("GET", "/api/v1/programs/o%27b/get_jobs/", "erin", Body::None, 404, "Qiskit Function o'b doesn't exist."),
        case(
            "GET",
            "/api/v1/programs/o%5C%27b/get_jobs/",
            "erin",
            Body::None,
            404,
            "Qiskit Function o\\'b doesn't exist.",
        ),
        case(
            "GET",
            "/api/v1/jobs/provider/?provider=acme&function=nope",
            "erin",
            Body::None,
            404,
            "Qiskit Function acme/nope doesn't exist.",
        ),
        // §1.10 - §1.13: one job, logs, result.
        case(
            "GET",
            format!("/api/v1/jobs/{id}/?with_result=maybe"),
            "alice",
            Body::None,
            400,
            "Must be a valid boolean.",
        ),
        case("GET", format!("/api/v1/jobs/{missing}/"), "alice", Body::None, 404, format!("Job [{missing}] not found")),
        case("GET", format!("/api/v1/jobs/{id}/"), "bob", Body::None, 404, format!("Job [{id}] not found")),
        case("GET", format!("/api/v1/jobs/{id}/result/"), "bob", Body::None, 404, format!("Job [{id}] not found")),
        case(
            "GET",
            format!("/api/v1/jobs/{id}/logs/"),
            "bob",
            Body::None,
            403,
            format!("You don't have access to read user logs of the job [{id}]"),
        ),
        case("GET", format!("/api/v1/jobs/{id}/logs/"), "alice", Body::None, 200, "No logs yet."),
        case("GET", format!("/api/v1/jobs/{provider_job}/logs/"), "erin", Body::None, 200, "No logs available."),
        case(
            "GET",
            format!("/api/v1/jobs/{id}/provider-logs/"),
            "alice",
            Body::None,
            403,
            format!("You don't have access to job [{id}]"),
        ),
        case(
            "GET",
            format!("/api/v1/jobs/{provider_job}/provider-logs/"),
            "bob",
            Body::None,
            403,
            format!("You don't have access to job [{provider_job}]"),
        ),
        case("GET", format!("/api/v1/jobs/{provider_job}/provider-logs/"), "erin", Body::None, 200, "No logs yet."),
        // §1.15: sub-status.
        case(
            "PATCH",
            format!("/api/v1/jobs/{id}/sub_status/"),
            "alice",
            Body::Form(&[("sub_status", "NOPE")]),
            400,
            "'sub_status' not provided or is not valid",
        ),
        case(
            "PATCH",
            format!("/api/v1/jobs/{id}/sub_status/"),
            "alice",
            Body::Json(json!({"sub_status": null})),
            400,
            "'sub_status' cannot be null",
        ),
        case(
            "PATCH",
            format!("/api/v1/jobs/{stopped}/sub_status/"),
            "alice",
            Body::Form(&[("sub_status", "MAPPING")]),
            403,
            "Cannot update 'sub_status' when is not in active status. (Currently STOPPED)",
        ),
        // §1.16: stop.
        case(
            "POST",
            format!("/api/v1/jobs/{id}/stop/"),
            "alice",
            Body::Json(json!({"service": null})),
            400,
            "This field may not be null.",
        ),
        // §1.17: runtime jobs.
        case(
            "POST",
            format!("/api/v1/jobs/{id}/runtime_jobs/"),
            "alice",
            Body::Json(json!({"runtime_job": "rj"})),
            200,
            format!("RuntimeJob object [rj] created for serverless job id [{id}]."),
        ),
        case(
            "POST",
            format!("/api/v1/jobs/{stopped}/runtime_jobs/"),
            "alice",
            Body::Json(json!({"runtime_job": "rj"})),
            200,
            format!("Failed to create RuntimeJob object [rj] for job id [{stopped}]. Error: "),
        ),
        // §1.18: events.
        case(
            "POST",
            format!("/api/v1/jobs/{id}/event/"),
            "alice",
            Body::Json(json!({"type": "INFO", "code": "1", "message": "m", "exception": "E"})),
            400,
            "Type is not valid. Valid types: ['ERROR']",
        ),
        case(
            "POST",
            format!("/api/v1/jobs/{id}/event/"),
            "alice",
            Body::Json(json!({"type": "ERROR", "message": "m", "exception": "E"})),
            400,
            "This field is required.",
        ),
        case(
            "POST",
            format!("/api/v1/jobs/{stopped}/event/"),
            "alice",
            Body::Json(json!({"type": "ERROR", "code": "1", "message": "m", "exception": "E"})),
            403,
            "You can create events on active jobs only",
        ),
        case(
            "GET",
            format!("/api/v1/jobs/{id}/events/?type=INFO"),
            "alice",
            Body::None,
            400,
            "Type is not valid. Valid types: ['ERROR']",
        ),
        // §1.19, §1.20: files.
        case(
            "POST",
            "/api/v1/files/upload/?function=fn",
            "alice",
            Body::Upload(vec![], None),
            400,
            "A file should be uploaded.",
        ),
        case(
            "POST",
            "/api/v1/files/upload/?function=fn",
            "alice",
            Body::Upload(vec![], Some(("page.html", b"<html><body>x</body></html>".to_vec()))),
            400,
            "Uploaded file is not a valid type.",
        ),
        case(
            "POST",
            "/api/v1/files/upload/?function=nope",
            "alice",
            Body::Upload(vec![], Some(("a.txt", b"a".to_vec()))),
            404,
            "Qiskit Function nope doesn't exist.",
        ),
        case(
            "GET",
            "/api/v1/files/download/?function=fn&file=none.txt",
            "alice",
            Body::None,
            404,
            "Requested file was not found.",
        ),
        case(
            "DELETE",
            "/api/v1/files/delete/?function=fn&file=none.txt",
            "alice",
            Body::None,
            404,
            "Requested file was not found.",
        ),
        case(
            "POST",
            "/api/v1/files/upload/?function=fn",
            "alice",
            Body::Upload(vec![], Some(("a.txt", b"a".to_vec()))),
            200,
            "",
        ),
        case(
            "DELETE",
            "/api/v1/files/delete/?function=fn&file=a.txt",
            "alice",
            Body::None,
            200,
            "Requested file was deleted.",
        ),
        case(
            "GET",
            "/api/v1/files/provider/?function=tool&provider=nope",
            "erin",
            Body::None,
            404,
            "Provider nope doesn't exist.",
        ),
        case(
            "GET",
            "/api/v1/files/provider/?function=nope&provider=acme",
            "erin",
            Body::None,
            404,
            "Qiskit Function acme/nope doesn't exist.",
        ),
    ];
    let mut failures = Vec::new();
    for case in &cases {
        let reply = send(&gateway, case).await;
        let text = text_of(&reply);
        if reply.status.as_u16() != case.status || !text.starts_with(&case.prefix) {
            failures.push(format!(
                "{} {}: expected {} starting with {:?}, got {} {}",
                case.method, case.path, case.status, case.prefix, reply.status, reply.json
            ));
        }
    }
    assert!(failures.is_empty(), "{} of {} messages differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
}
