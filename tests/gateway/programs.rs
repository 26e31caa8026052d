//! Function upload, listing, lookup and argument validation.

use serde_json::json;

use crate::both_backends;
use crate::harness::{Backend, Gateway, tar_of};

both_backends!(
    upload_lists_and_reads_back_every_field,
    reupload_merges_present_fields_only,
    bad_uploads_are_400_and_store_nothing,
    provider_images_must_be_in_the_registry,
    get_by_title_without_provider_finds_only_own_functions,
    arguments_are_validated_against_the_schema,
    hostile_arguments_and_schemas_are_bounded,
);

async fn upload_lists_and_reads_back_every_field(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    let reply = gateway
        .upload_function(
            "alice",
            &[
                ("title", "My Function"),
                ("entrypoint", "./main.py"),
                ("dependencies", r#"["mergedeep==1.3.4"]"#),
                ("description", "adds numbers"),
                ("version", "1.2.3"),
                ("arguments_schema", r#"{"type": "object", "required": ["n"]}"#),
                ("sizes", r#"{"s": "cx3d-4x16", "m": null}"#),
                ("default_size", "s"),
                ("arguments", "{}"),
                ("runner", "ray"),
            ],
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    let function = &reply.json;
    assert_eq!(function["title"], "MyFunction");
    assert_eq!(function["entrypoint"], "main.py");
    assert_eq!(function["dependencies"], json!(["mergedeep==1.3.4"]));
    assert_eq!(function["arguments_schema"], json!({"type": "object", "required": ["n"]}));
    assert_eq!(function["sizes"], json!({"S": "cx3d-4x16", "M": null}));
    assert_eq!(function["function_size"], "S");
    assert_eq!(function["version"], "1.2.3");
    assert_eq!(function["type"], "GENERIC");
    assert_eq!(function["provider"], json!(null));

    let list = gateway.get("/api/v1/programs", "alice").await;
    assert_eq!(list.status, 200);
    assert_eq!(list.json.as_array().unwrap().len(), 1);
    assert_eq!(list.json[0]["id"], function["id"]);
    assert_eq!(gateway.get("/api/v1/programs/?filter=serverless", "alice").await.json.as_array().unwrap().len(), 1);
    assert_eq!(gateway.get("/api/v1/programs/?filter=catalog", "alice").await.json, json!([]));

    let by_title = gateway.get("/api/v1/programs/get_by_title/MyFunction", "alice").await;
    assert_eq!(by_title.status, 200);
    assert_eq!(by_title.json["version"], "1.2.3");
    assert_eq!(by_title.json["arguments_schema"]["required"], json!(["n"]));

    // Another user sees nothing and gets the same 404 as for a missing function.
    assert_eq!(gateway.get("/api/v1/programs/", "bob").await.json, json!([]));
    let hidden = gateway.get("/api/v1/programs/get_by_title/MyFunction/", "bob").await;
    let missing = gateway.get("/api/v1/programs/get_by_title/Nope/", "bob").await;
    assert_eq!(hidden.status, 404);
    assert_eq!(hidden.message(), "Qiskit Function MyFunction doesn't exist.");
    assert_eq!(missing.message(), "Qiskit Function Nope doesn't exist.");

    // A JSON upload of an image-less function without artifact is refused; size labels any case.
    let uploaded = gateway
        .upload_function("alice", &[("title", "sized"), ("entrypoint", "main.py"), ("function_size", "xl")])
        .await;
    assert_eq!(uploaded.json["function_size"], "XL");
    assert_eq!(uploaded.json["sizes"], json!({"XL": null}));
}

async fn reupload_merges_present_fields_only(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    let first = gateway
        .upload_function(
            "alice",
            &[
                ("title", "fn"),
                ("entrypoint", "main.py"),
                ("description", "first"),
                ("version", "1.0"),
                ("env_vars", r#"{"A": "1"}"#),
                ("arguments_schema", r#"{"type": "object"}"#),
            ],
        )
        .await;
    assert_eq!(first.status, 200);

    // Only the title: everything is kept.
    let again = gateway.post_form("/api/v1/programs/upload/", "alice", &[("title", "fn")]).await;
    assert_eq!(again.status, 200, "{}", again.json);
    for field in ["id", "entrypoint", "description", "version", "arguments_schema", "dependencies"] {
        assert_eq!(again.json[field], first.json[field], "{field}");
    }

    // A new description and version; the schema stays when not sent.
    let changed = gateway
        .post_form(
            "/api/v1/programs/upload/",
            "alice",
            &[("title", "fn"), ("description", "second"), ("version", "2.0")],
        )
        .await;
    assert_eq!(changed.json["description"], "second");
    assert_eq!(changed.json["version"], "2.0");
    assert_eq!(changed.json["arguments_schema"], json!({"type": "object"}));

    // An empty schema removes it.
    let cleared =
        gateway.post_form("/api/v1/programs/upload/", "alice", &[("title", "fn"), ("arguments_schema", "{}")]).await;
    assert_eq!(cleared.json["arguments_schema"], json!(null));

    // A new artifact replaces the old one.
    let artifact = tar_of(&[("main.py", b"print(2)\n")]);
    let replaced = gateway
        .post_multipart(
            "/api/v1/programs/upload/",
            "alice",
            &[("title", "fn")],
            &[("artifact", "artifact.tar", &artifact)],
        )
        .await;
    assert_eq!(replaced.status, 200);
    assert_eq!(replaced.json["id"], first.json["id"]);
    assert_eq!(gateway.get("/api/v1/programs/", "alice").await.json.as_array().unwrap().len(), 1);
}

async fn bad_uploads_are_400_and_store_nothing(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    let good_tar = tar_of(&[("main.py", b"print(1)\n")]);
    let other_tar = tar_of(&[("other.py", b"print(1)\n")]);
    type Case<'a> = (Vec<(&'a str, &'a str)>, Option<(&'a str, Vec<u8>)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec![("entrypoint", "main.py")],
            Some(("artifact.tar", good_tar.clone())),
            "This field is required. ('title')",
        ),
        (
            vec![("title", "f"), ("entrypoint", "main.py"), ("function_size", "XXL")],
            Some(("artifact.tar", good_tar.clone())),
            "Invalid function size 'XXL'",
        ),
        (
            vec![("title", "f"), ("entrypoint", "main.py"), ("sizes", r#"{"huge": "x"}"#)],
            Some(("artifact.tar", good_tar.clone())),
            "Invalid function size 'huge'",
        ),
        (
            vec![("title", "f"), ("entrypoint", "main.py"), ("sizes", r#"{"M": "big-and-fast"}"#)],
            Some(("artifact.tar", good_tar.clone())),
            "'sizes' value for 'M': compute profile 'big-and-fast' cannot be read",
        ),
        (
            vec![("title", "f"), ("entrypoint", "../main.py")],
            Some(("artifact.tar", good_tar.clone())),
            "Invalid entrypoint",
        ),
        (
            vec![("title", "f"), ("entrypoint", "main.py"), ("version", "not a version")],
            Some(("artifact.tar", good_tar.clone())),
            "Invalid version",
        ),
        (
            vec![("title", "f"), ("entrypoint", "main.py"), ("dependencies", r#"["numpy"]"#)],
            Some(("artifact.tar", good_tar.clone())),
            "Dependency `numpy` is not allowed",
        ),
        (
            vec![("title", "f"), ("entrypoint", "main.py"), ("dependencies", "nope")],
            Some(("artifact.tar", good_tar.clone())),
            "'dependencies' should be an array",
        ),
        (
            vec![("title", "f"), ("entrypoint", "main.py"), ("arguments_schema", "42")],
            Some(("artifact.tar", good_tar.clone())),
            "arguments_schema cannot be used",
        ),
        (
            vec![
                ("title", "f"),
                ("entrypoint", "main.py"),
                ("arguments_schema", r#"{"$ref": "https://example.com/s.json"}"#),
            ],
            Some(("artifact.tar", good_tar.clone())),
            "external reference",
        ),
        (
            vec![("title", "f"), ("entrypoint", "main.py")],
            Some(("artifact.zip", good_tar.clone())),
            "Allowed extensions are: tar",
        ),
        (
            vec![("title", "f"), ("entrypoint", "main.py")],
            Some(("artifact.tar", b"not a tar at all".repeat(64))),
            "Invalid artifact",
        ),
        (
            vec![("title", "f"), ("entrypoint", "main.py")],
            Some(("artifact.tar", other_tar)),
            "entrypoint 'main.py' is not in the archive",
        ),
        (vec![("title", "f"), ("entrypoint", "main.py")], None, "artifact (.tar) is required"),
        (vec![("title", "f")], None, "At least one of attributes (entrypoint, image) is required."),
        (
            vec![("title", "f"), ("image", "docker.io/x")],
            None,
            "Custom images are only available if you are a provider.",
        ),
        (vec![("title", "a/b/c"), ("entrypoint", "main.py")], None, "only contain one slash"),
        (
            vec![("title", "f"), ("entrypoint", "main.py"), ("gpu", "true")],
            Some(("artifact.tar", good_tar.clone())),
            "only available for provider functions",
        ),
    ];
    for (fields, file, expected) in cases {
        let files: Vec<(&str, &str, &[u8])> =
            file.iter().map(|(name, bytes)| ("artifact", *name, bytes.as_slice())).collect();
        let reply = gateway.post_multipart("/api/v1/programs/upload/", "alice", &fields, &files).await;
        assert_eq!(reply.status, 400, "{fields:?}: {}", reply.json);
        assert!(reply.message().contains(expected), "{fields:?}: {} does not contain {expected}", reply.message());
    }
    assert_eq!(gateway.get("/api/v1/programs/", "alice").await.json, json!([]));
    // No artifact object was left behind by the refused uploads.
    assert!(gateway.state.storage.list("artifacts/").await.unwrap().is_empty());
}

async fn provider_images_must_be_in_the_registry(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.provider("acme", Some("docker.io/awesome"), "erin").await;
    let upload = |image: &'static str| {
        let gateway = &gateway;
        async move {
            gateway.post_form("/api/v1/programs/upload/", "erin", &[("title", "acme/imagefn"), ("image", image)]).await
        }
    };
    let attacker = upload("docker.io/awesome.attacker.com/x").await;
    assert_eq!(attacker.status, 400);
    assert_eq!(attacker.message(), "Custom images must be in docker.io/awesome.");
    assert_eq!(upload("docker.io/awesome").await.status, 200);
    let ok = upload("docker.io/awesome/runner:1").await;
    assert_eq!(ok.status, 200, "{}", ok.json);
    assert_eq!(ok.json["provider"], "acme");
    assert_eq!(ok.json["title"], "imagefn");
    assert_eq!(ok.json["image"], "docker.io/awesome/runner:1");

    // Provider given twice, and an unknown provider (same 404 as no access).
    let twice = gateway
        .post_form(
            "/api/v1/programs/upload/",
            "erin",
            &[("title", "acme/x"), ("provider", "acme"), ("image", "docker.io/awesome")],
        )
        .await;
    assert_eq!(twice.message(), "Provider defined in title and in provider fields.");
    let unknown = gateway.post_form("/api/v1/programs/upload/", "erin", &[("title", "nope/x"), ("image", "i")]).await;
    // As the reference's serializer: an image's provider must exist (checked before access).
    assert_eq!((unknown.status.as_u16(), unknown.message()), (400, "nope is not valid provider.".into()));
    let no_image =
        gateway.post_form("/api/v1/programs/upload/", "erin", &[("title", "nope/x"), ("entrypoint", "a.py")]).await;
    assert_eq!((no_image.status.as_u16(), no_image.message()), (404, "Qiskit Function nope/x doesn't exist.".into()));
}

async fn get_by_title_without_provider_finds_only_own_functions(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.provider("acme", None, "erin").await;
    let provider_fn =
        gateway.upload_function("erin", &[("title", "shared"), ("provider", "acme"), ("entrypoint", "main.py")]).await;
    assert_eq!(provider_fn.status, 200, "{}", provider_fn.json);
    assert_eq!(gateway.get("/api/v1/programs/get_by_title/shared", "erin").await.status, 404);
    assert_eq!(gateway.get("/api/v1/programs/get_by_title/shared?provider=acme", "erin").await.status, 200);
    let own = gateway.upload_function("erin", &[("title", "shared"), ("entrypoint", "main.py")]).await;
    assert_eq!(own.status, 200);
    let found = gateway.get("/api/v1/programs/get_by_title/shared", "erin").await;
    assert_eq!(found.json["id"], own.json["id"]);
    assert_eq!(found.json["provider"], json!(null));
    // A slash in the title (literal or encoded) never names a function.
    assert_eq!(gateway.get("/api/v1/programs/get_by_title/acme%2Fshared", "erin").await.status, 404);
    assert_eq!(gateway.get("/api/v1/programs/get_by_title/acme/shared", "erin").await.status, 404);
}

async fn arguments_are_validated_against_the_schema(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}, "circuit": {"type": "object", "required": ["__type__", "__value__"]}}, "required": ["n"]}).to_string();
    gateway
        .upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py"), ("arguments_schema", &schema)])
        .await;
    let validate = |arguments: &str| {
        let gateway = &gateway;
        let body = json!({"title": "fn", "arguments": arguments, "provider": null});
        async move { gateway.post_json("/api/v1/programs/validate_arguments/", "alice", body).await }
    };
    let ok = validate(r#"{"n": 3, "circuit": {"__type__": "QuantumCircuit", "__value__": "eJw="}}"#).await;
    assert_eq!(ok.status, 200, "{}", ok.json);
    assert_eq!(ok.json, json!({"valid": true}));
    let low = validate(r#"{"n": 1}"#).await;
    assert_eq!(low.status, 400);
    assert_eq!(
        low.json,
        json!({"message": "'minimum' validation failed, schema requires 3: rejected value 1", "path": ["n"]})
    );
    let circuit = validate(r#"{"n": 5, "circuit": {"__type__": "QuantumCircuit"}}"#).await;
    assert!(circuit.message().starts_with("'required' validation failed"), "{}", circuit.json);
    assert_eq!(circuit.json["path"], json!(["circuit"]));
    let invalid = validate("{nope").await;
    assert!(invalid.message().starts_with("arguments is not valid JSON"));
    assert_eq!(invalid.json["path"], json!([]));
    // Without a schema everything passes; boolean false rejects everything.
    gateway.upload_function("alice", &[("title", "free"), ("entrypoint", "main.py")]).await;
    let free = gateway
        .post_json("/api/v1/programs/validate_arguments/", "alice", json!({"title": "free", "arguments": "{\"x\": 1}"}))
        .await;
    assert_eq!(free.status, 200);
    gateway
        .upload_function("alice", &[("title", "closed"), ("entrypoint", "main.py"), ("arguments_schema", "false")])
        .await;
    let closed = gateway
        .post_json("/api/v1/programs/validate_arguments/", "alice", json!({"title": "closed", "arguments": "{}"}))
        .await;
    assert_eq!(closed.status, 400);
    // Unknown function and someone else's function: the same 404.
    let other = gateway
        .post_json("/api/v1/programs/validate_arguments/", "bob", json!({"title": "fn", "arguments": "{}"}))
        .await;
    assert_eq!(other.status, 404);
    assert_eq!(other.message(), "Qiskit Function fn doesn't exist.");
    let missing = gateway.post_json("/api/v1/programs/validate_arguments/", "alice", json!({"title": "fn"})).await;
    assert_eq!(missing.status, 400);
    // Form-encoded bodies work too.
    let form = gateway
        .post_form("/api/v1/programs/validate_arguments/", "alice", &[("title", "fn"), ("arguments", r#"{"n": 9}"#)])
        .await;
    assert_eq!(form.status, 200);
}

async fn hostile_arguments_and_schemas_are_bounded(backend: Backend) {
    let gateway = Gateway::start_with(backend, |config| config.max_arguments_bytes = 512 * 1024).await;
    let schema = json!({"type": "object", "properties": {"items": {"type": "array", "uniqueItems": true}, "s": {"type": "string", "pattern": "^(a+)+$"}}}).to_string();
    gateway
        .upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py"), ("arguments_schema", &schema)])
        .await;
    // The reference spent 8 s of CPU on uniqueItems over 4,000 objects; here it is hashed.
    let mut items: Vec<serde_json::Value> =
        (0..4000).map(|i| json!({"id": i, "payload": {"a": [i, i + 1], "b": "x"}})).collect();
    items.push(json!({"id": 0, "payload": {"a": [0, 1], "b": "x"}}));
    let arguments = json!({"items": items}).to_string();
    let started = std::time::Instant::now();
    let reply = gateway
        .post_json("/api/v1/programs/validate_arguments/", "alice", json!({"title": "fn", "arguments": arguments}))
        .await;
    assert_eq!(reply.status, 400);
    assert!(reply.message().starts_with("'uniqueItems' validation failed"), "{}", reply.message());
    assert_eq!(reply.json["path"], json!(["items"]));
    // Bounded by the gateway's own time limit, not by the input.
    assert!(
        started.elapsed() < gantry::api::programs::validate::VALIDATION_TIME_LIMIT + std::time::Duration::from_secs(5)
    );

    let redos = json!({"s": format!("{}b", "a".repeat(40_000))}).to_string();
    let reply = gateway
        .post_json("/api/v1/programs/validate_arguments/", "alice", json!({"title": "fn", "arguments": redos}))
        .await;
    assert!(reply.message().starts_with("'pattern' validation failed"), "{}", reply.message());

    let deep = format!("{{\"x\": {}{}}}", "[".repeat(100), "]".repeat(100));
    let reply = gateway
        .post_json("/api/v1/programs/validate_arguments/", "alice", json!({"title": "fn", "arguments": deep}))
        .await;
    assert_eq!(reply.status, 400);
    assert!(reply.message().contains("nested deeper than 64"), "{}", reply.message());

    let big = json!({"s": "a".repeat(600 * 1024)}).to_string();
    let reply = gateway
        .post_json("/api/v1/programs/validate_arguments/", "alice", json!({"title": "fn", "arguments": big}))
        .await;
    assert_eq!(reply.status, 400);
    assert!(reply.message().contains("MAX_ARGUMENTS_LENGTH_MB"), "{}", reply.message());

    // Oversized and too wide schemas are refused at upload.
    let huge = json!({"description": "x".repeat(70_000)}).to_string();
    let reply = gateway.upload_function("alice", &[("title", "fn"), ("arguments_schema", &huge)]).await;
    assert!(reply.message().contains("maximum is 65536"), "{}", reply.json);
    let wide: serde_json::Map<String, serde_json::Value> =
        (0..300).map(|i| (format!("p{i}"), json!({"type": "string"}))).collect();
    let reply = gateway
        .upload_function("alice", &[("title", "fn"), ("arguments_schema", &json!({"properties": wide}).to_string())])
        .await;
    assert!(reply.message().contains("sub-schemas"), "{}", reply.json);
}
