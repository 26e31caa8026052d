//! The one outgoing HTTP(S) client of the crate, with its body type: used by the job's scoped
//! storage access, the launcher's mirror of a file area through the gateway, the upstream
//! authentication services and the webhook sink. It imports nothing of the crate but `shared`.

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::shared::BoxError;

pub type HttpClient =
    Client<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>, HttpBody>;
pub type HttpBody = http_body_util::combinators::BoxBody<Bytes, BoxError>;

/// An HTTP(S) client trusting the system's root certificates.
pub fn http_client() -> Result<HttpClient, String> {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()
        .map_err(|e| format!("failed to load the system's root certificates: {e}"))?
        .https_or_http()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}

pub fn empty() -> HttpBody {
    http_body_util::Empty::new().map_err(|never| match never {}).boxed()
}
