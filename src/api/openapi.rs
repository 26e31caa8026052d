//! The published interface description (OpenAPI 3.1), served at `/swagger.json` and
//! `/openapi.json` and rendered as a self-contained page at `/swagger/` (no external scripts, so
//! it works offline).
//!
//! Nothing here describes an endpoint: the paths, parameters, bodies and answers come from the
//! handlers' `#[utoipa::path]` annotations and the request and answer types beside them (and in
//! `shared`), gathered by the route list that also builds the router (`api::documented_routes`).
//! This module adds what every operation shares: the document's title, the bearer scheme and the
//! error answers.

use std::sync::Arc;

use axum::Json;
use axum::response::Html;
use serde_json::Value;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{OpenApi as Document, Ref, RefOr};
use utoipa::{Modify, OpenApi, ToResponse};

use super::error::{DetailBody, ErrorBody};

#[derive(ToResponse)]
#[response(description = "invalid input")]
#[allow(dead_code)]
pub struct BadRequest(ErrorBody);

#[derive(ToResponse)]
#[response(description = "missing or invalid token")]
#[allow(dead_code)]
pub struct Unauthorized(DetailBody);

#[derive(ToResponse)]
#[response(description = "not found or not visible")]
#[allow(dead_code)]
pub struct NotFound(ErrorBody);

#[derive(ToResponse)]
#[response(description = "body above MAX_REQUEST_BODY_SIZE_MB")]
#[allow(dead_code)]
pub struct PayloadTooLarge(ErrorBody);

#[derive(ToResponse)]
#[response(
    description = "a request with this Idempotency-Key is still in progress, or a concurrent upload of the same function won"
)]
#[allow(dead_code)]
pub struct Conflict(ErrorBody);

#[derive(ToResponse)]
#[response(description = "this Idempotency-Key was already used with a different request")]
#[allow(dead_code)]
pub struct KeyReused(ErrorBody);

#[derive(ToResponse)]
#[response(
    description = "the database or the object store cannot serve the request now (retry after `Retry-After` seconds), or a data folder cannot be read; the message names which"
)]
#[allow(dead_code)]
pub struct Unavailable(ErrorBody);

#[derive(ToResponse)]
#[response(description = "the storage is full or cannot be written; the message names it and what was not stored")]
#[allow(dead_code)]
pub struct InsufficientStorage(ErrorBody);

struct BearerScheme;

impl Modify for BearerScheme {
    fn modify(&self, document: &mut Document) {
        let components = document.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Gantry gateway API",
        description = "Job gateway for user-uploaded functions, compatible with the qiskit-serverless client. Every path is also served without its trailing slash. Text fields are trimmed of surrounding whitespace."
    ),
    components(schemas(ErrorBody, DetailBody), responses(BadRequest, Unauthorized, NotFound, PayloadTooLarge, Conflict, KeyReused, Unavailable, InsufficientStorage)),
    modifiers(&BearerScheme)
)]
struct Base;

/// The document the routes are added to.
pub fn base() -> Document {
    Base::openapi()
}

/// The errors every authenticated operation may answer, by reference: 400 (invalid input), 401,
/// 404 (unknown or not visible), 413 (body too large) and 503 (database or storage unavailable);
/// one that may write (`writes`: any method but GET) also 507 (storage full); with an
/// `Idempotency-Key` also 409 (in progress) and 422 (the key used with another request).
fn add_error_answers(operation: &mut Operation, writes: bool) {
    if operation.security.as_ref().is_none_or(|s| s.is_empty()) {
        return;
    }
    let idempotent = operation.parameters.iter().flatten().any(|parameter| parameter.name == "Idempotency-Key");
    let keyed: &[(&str, &str)] = if idempotent { &[("409", "Conflict"), ("422", "KeyReused")] } else { &[] };
    let common = [
        ("400", "BadRequest"),
        ("401", "Unauthorized"),
        ("404", "NotFound"),
        ("413", "PayloadTooLarge"),
        ("503", "Unavailable"),
    ];
    let stored: &[(&str, &str)] = if writes { &[("507", "InsufficientStorage")] } else { &[] };
    for &(status, name) in common.iter().chain(keyed).chain(stored) {
        operation
            .responses
            .responses
            .entry(status.to_string())
            .or_insert_with(|| RefOr::Ref(Ref::from_response_name(name)));
    }
}

/// The whole document from the routes' own: every operation with its error answers.
pub fn finish(mut document: Document) -> Document {
    for item in document.paths.paths.values_mut() {
        if let Some(operation) = &mut item.get {
            add_error_answers(operation, false);
        }
        let writing = [&mut item.put, &mut item.post, &mut item.delete, &mut item.patch];
        for operation in writing.into_iter().flatten() {
            add_error_answers(operation, true);
        }
    }
    document
}

pub async fn swagger_json(document: Arc<Value>) -> Json<Value> {
    Json(document.as_ref().clone())
}

/// A plain page listing every operation; the JSON document is one link away.
pub async fn swagger_ui(document: Arc<Value>) -> Html<String> {
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
