//! The router and the OpenAPI document cannot drift: every documented operation is served (its
//! path and method reach a handler, not the fallback), every other method on a documented path
//! answers 405, and the only routes outside the document are the document itself and the
//! console, which `api::router` adds by name.

use axum::body::Body;

use crate::both_backends;
use crate::harness::{Backend, Gateway};

both_backends!(every_route_is_documented_with_its_methods_and_every_documented_route_is_served);

const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

/// The routes `api::router` adds beside the documented ones.
const UNDOCUMENTED: [&str; 5] = ["/swagger/", "/swagger.json", "/openapi.json", "/", "/console/"];

/// `template` with each `{name}` replaced by a value.
fn concrete(template: &str) -> String {
    let mut path = String::new();
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        let end = rest[start..].find('}').expect("closed parameter") + start;
        path.push_str(&rest[..start]);
        path.push_str("00000000-0000-4000-8000-000000000000");
        rest = &rest[end + 1..];
    }
    path.push_str(rest);
    path
}

async fn every_route_is_documented_with_its_methods_and_every_documented_route_is_served(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    let document = gateway.call("GET", "/swagger.json", None, None, Body::empty()).await.json;
    let paths = document["paths"].as_object().expect("paths");
    assert!(paths.len() > 30, "{} paths", paths.len());
    let mut drift = Vec::new();
    for (template, operations) in paths {
        let documented: Vec<String> = operations.as_object().unwrap().keys().map(|m| m.to_uppercase()).collect();
        let path = concrete(template);
        for method in METHODS {
            let reply = gateway.call(method, &path, None, None, Body::empty()).await;
            let fallback = reply.status == 404 && reply.message().starts_with("Not found: ");
            let served = !fallback && reply.status != 405;
            if served != documented.iter().any(|m| m == method) {
                drift.push(format!("{method} {template}: documented {documented:?}, answered {}", reply.status));
            }
        }
    }
    assert!(drift.is_empty(), "the router and the document differ:\n{}", drift.join("\n"));
    // The routes outside the document are served, and the router source adds no other.
    for path in UNDOCUMENTED {
        assert!(!paths.contains_key(path), "{path}");
        let reply = gateway.call("GET", path, None, None, Body::empty()).await;
        assert_ne!(reply.status, 405, "{path}");
        assert!(path == "/" || reply.status == 200, "{path}: {}", reply.status);
    }
    let source = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/api.rs")).unwrap();
    let added: Vec<&str> = source.split(".route(\"").skip(1).filter_map(|rest| rest.split('"').next()).collect();
    let expected: Vec<&str> = UNDOCUMENTED.iter().copied().chain(["/console/{*path}"]).collect();
    let mut sorted = added.clone();
    sorted.sort();
    let mut wanted = expected.clone();
    wanted.sort();
    assert_eq!(sorted, wanted, "api.rs adds routes by hand that the document does not describe");
    assert!(!source.contains(".nest_service(") && !source.contains(".route_service("), "routes outside the list");
}
