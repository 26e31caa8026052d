//! The web console: static files under `/console/`, embedded in the binary at build time (see
//! `build.rs`), served without authentication; every API call the console makes authenticates
//! like any client's. Every answer carries a strict Content-Security-Policy (own origin only, no
//! inline script or style), `X-Frame-Options: DENY` and `nosniff`.
//!
//! For work on the console itself, `GANTRY_CONSOLE_DIR` names a folder whose files are served
//! instead, read at each request (names limited to plain path segments: no `..`, no hidden
//! files), so a page can be changed without rebuilding.

use std::path::PathBuf;
use std::sync::OnceLock;

use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use bytes::Bytes;

include!(concat!(env!("OUT_DIR"), "/console_assets.rs"));

/// The policy every console answer carries.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; font-src 'self'; manifest-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

fn override_dir() -> Option<&'static PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| std::env::var_os("GANTRY_CONSOLE_DIR").map(PathBuf::from)).as_ref()
}

/// `GET /`: a browser goes to the console; other clients get the API's 404 as before.
pub async fn root(headers: HeaderMap) -> Response {
    let wants_html =
        headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|accept| accept.contains("text/html"));
    if wants_html {
        Redirect::to("/console/").into_response()
    } else {
        super::error::ApiError::NotFound("Not found: /".into()).into_response()
    }
}

pub async fn index() -> Response {
    asset("index.html").await
}

pub async fn file(Path(path): Path<String>) -> Response {
    asset(&path).await
}

/// A name made of plain segments (letters, digits, `-`, `_`, `.`, not starting with `.`).
fn plain(name: &str) -> bool {
    !name.is_empty()
        && name.split('/').all(|segment| {
            !segment.is_empty()
                && !segment.starts_with('.')
                && segment.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        })
}

async fn asset(name: &str) -> Response {
    let body: Option<Bytes> = if !plain(name) {
        None
    } else if let Some(dir) = override_dir() {
        tokio::fs::read(dir.join(name)).await.ok().map(Bytes::from)
    } else {
        ASSETS.iter().find(|(n, _)| *n == name).map(|(_, bytes)| Bytes::from_static(bytes))
    };
    let mut response = match body {
        Some(bytes) => {
            let mut response = bytes.into_response();
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type(name)));
            // Revalidated on each load: an upgraded gateway serves its own console at once.
            response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            response
        }
        None => (StatusCode::NOT_FOUND, "Not found").into_response(),
    };
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}

fn content_type(name: &str) -> &'static str {
    match name.rsplit('.').next().unwrap_or_default() {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "json" => "application/json",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_are_served() {
        assert!(plain("index.html"));
        assert!(plain("js/jobs.js"));
        for bad in ["", "../secret", "js/../../x", ".env", "js/.hidden", "a//b", "/etc/passwd", "a\\b", "%2e%2e/x"] {
            assert!(!plain(bad), "{bad}");
        }
    }

    #[test]
    fn the_console_is_embedded() {
        assert!(ASSETS.iter().any(|(name, _)| *name == "index.html"), "console/index.html is embedded");
    }
}
