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

/// An HTTP(S) client trusting the system's root certificates. Where the system has none (a
/// provider's image without CA certificates, in which the launcher runs), plain `http://` still
/// works and an `https://` request fails its handshake (the server's certificate cannot be
/// trusted): a job that only calls its gateway back over HTTP needs no certificates.
pub fn http_client() -> Result<HttpClient, String> {
    let builder = match hyper_rustls::HttpsConnectorBuilder::new().with_native_roots() {
        Ok(builder) => builder,
        Err(error) => {
            tracing::debug!(%error, "no root certificates on this system: only plain HTTP can be trusted");
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(without_roots()?)
        }
    };
    Ok(Client::builder(TokioExecutor::new()).build(builder.https_or_http().enable_http1().build()))
}

/// A TLS configuration that trusts no certificate.
fn without_roots() -> Result<rustls::ClientConfig, String> {
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("failed to set up TLS: {e}"))?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth())
}

pub fn empty() -> HttpBody {
    http_body_util::Empty::new().map_err(|never| match never {}).boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found in a provider's image without CA certificates: the launcher could not call its
    /// gateway back over plain HTTP because loading the (absent) roots failed the whole client.
    #[tokio::test]
    async fn without_root_certificates_plain_http_still_works() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut request = [0u8; 1024];
                let _ = socket.read(&mut request).await;
                let _ = socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok").await;
            }
        });
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(without_roots().unwrap())
            .https_or_http()
            .enable_http1()
            .build();
        let client: HttpClient = Client::builder(TokioExecutor::new()).build(connector);
        let request = |scheme: &str| hyper::Request::get(format!("{scheme}://{address}/")).body(empty()).unwrap();
        let answer = client.request(request("http")).await.expect("plain HTTP needs no certificate");
        assert_eq!(answer.status(), 200);
        assert!(client.request(request("https")).await.is_err(), "HTTPS trusts nothing without roots");
    }
}
