//! Public keys of a JWT issuer, fetched from its JWKS (found directly or through OpenID
//! discovery) and fetched again when a token names a key not seen yet (a rotation), at most
//! every `refresh_every` so forged key ids cannot flood the issuer.

use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;

use super::upstream::{Upstream, UpstreamError};

/// Where the keys are.
pub enum KeySource {
    /// `<issuer>/.well-known/openid-configuration` names the JWKS (`jwks_uri`).
    Discovery(String),
    /// The JWKS itself.
    Url(String),
}

/// Signature algorithms accepted: asymmetric ones only (never `none` or a shared secret).
pub fn asymmetric(algorithm: Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::RS256
            | Algorithm::RS384
            | Algorithm::RS512
            | Algorithm::PS256
            | Algorithm::PS384
            | Algorithm::PS512
            | Algorithm::ES256
            | Algorithm::ES384
            | Algorithm::EdDSA
    )
}

pub struct KeyCache {
    source: KeySource,
    upstream: Upstream,
    refresh_every: Duration,
    keys: tokio::sync::RwLock<(JwkSet, Option<Instant>)>,
    /// Held while the keys are fetched, so concurrent requests make one fetch.
    refreshing: tokio::sync::Mutex<()>,
}

impl KeyCache {
    pub fn new(source: KeySource, upstream: Upstream, refresh_every: Duration) -> KeyCache {
        KeyCache {
            source,
            upstream,
            refresh_every,
            keys: tokio::sync::RwLock::new((JwkSet { keys: Vec::new() }, None)),
            refreshing: tokio::sync::Mutex::new(()),
        }
    }

    /// The key `kid` names (the only key when the token names none), fetching the keys again
    /// when it is not known yet. `None`: no such key.
    pub async fn key(&self, kid: Option<&str>) -> Result<Option<DecodingKey>, UpstreamError> {
        if let Some(key) = self.known_key(kid).await {
            return Ok(Some(key));
        }
        let _one_fetch = self.refreshing.lock().await;
        // Another request may have fetched them meanwhile.
        if let Some(key) = self.known_key(kid).await {
            return Ok(Some(key));
        }
        if self.keys.read().await.1.is_some_and(|at| at.elapsed() < self.refresh_every) {
            return Ok(None);
        }
        let set = self.fetch().await?;
        *self.keys.write().await = (set, Some(Instant::now()));
        Ok(self.known_key(kid).await)
    }

    async fn known_key(&self, kid: Option<&str>) -> Option<DecodingKey> {
        let keys = self.keys.read().await;
        let jwk = match kid {
            Some(kid) => keys.0.find(kid),
            None if keys.0.keys.len() == 1 => keys.0.keys.first(),
            None => None,
        }?;
        DecodingKey::from_jwk(jwk).ok()
    }

    async fn fetch(&self) -> Result<JwkSet, UpstreamError> {
        let url = match &self.source {
            KeySource::Url(url) => url.clone(),
            KeySource::Discovery(issuer) => {
                let discovery_url = format!("{}/.well-known/openid-configuration", issuer.trim_end_matches('/'));
                let discovery = self.upstream.get_json(&discovery_url).await?;
                discovery.get("jwks_uri").and_then(Value::as_str).ok_or(UpstreamError::Unreadable)?.to_string()
            }
        };
        let keys = self.upstream.get_json(&url).await?;
        serde_json::from_value(keys).map_err(|_| UpstreamError::Unreadable)
    }
}
