//! Public keys of a JWT issuer, fetched from its JWKS (found directly or through OpenID
//! discovery) and fetched again when a token names a key not seen yet (a rotation). A token
//! naming an unknown key id right after a fetch still makes one fetch (a rotation is exactly the
//! case the limit must not block); after a fetch that an unknown key id itself caused, the next
//! one waits `refresh_every`, so forged key ids cannot make the issuer be asked on each request.

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

/// What the keys say about the key a token names.
pub enum KeyLookup {
    /// The key, ready to check the signature with.
    Found(DecodingKey),
    /// A published key of a kind that cannot check signatures.
    Unusable,
    /// The issuer publishes no key with that id (or, for a token naming none, not exactly one
    /// key), even after its keys were fetched again, or while a fetch must wait.
    Unpublished,
}

/// What a caller whose token is signed with a key id its `issuer` does not publish is told: not
/// a fault of the caller's credential, and usually a rotation in progress.
pub fn unpublished_key_message(kid: &str, issuer: &str) -> String {
    let kid: String = kid.chars().take(100).collect();
    format!(
        "We couldn't verify the token: it is signed with the key '{kid}', which is not among the keys {issuer} publishes \
         (it may be rotating its keys). Please try again in a few seconds."
    )
}

/// The last fetch of the keys.
#[derive(Debug, Clone, Copy)]
struct LastFetch {
    at: Instant,
    /// It was caused by a token naming a key id the keys fetched before lacked (not the first
    /// fetch).
    for_unknown_kid: bool,
}

/// Whether a token naming a key id the keys lack may make them be fetched again: the first
/// time, right after a fetch that an unknown key id did not cause (a rotation just after the
/// keys were read must not wait), and otherwise once `refresh_every` has passed.
fn may_fetch(last: Option<LastFetch>, now: Instant, refresh_every: Duration) -> bool {
    match last {
        None => true,
        Some(last) => !last.for_unknown_kid || now.saturating_duration_since(last.at) >= refresh_every,
    }
}

pub struct KeyCache {
    source: KeySource,
    upstream: Upstream,
    refresh_every: Duration,
    keys: tokio::sync::RwLock<(JwkSet, Option<LastFetch>)>,
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
    /// when it is not known yet and `may_fetch` allows.
    pub async fn key(&self, kid: Option<&str>) -> Result<KeyLookup, UpstreamError> {
        if let Some(found) = self.known_key(kid).await {
            return Ok(found);
        }
        let _one_fetch = self.refreshing.lock().await;
        // Another request may have fetched them meanwhile.
        if let Some(found) = self.known_key(kid).await {
            return Ok(found);
        }
        let last = self.keys.read().await.1;
        if !may_fetch(last, Instant::now(), self.refresh_every) {
            return Ok(KeyLookup::Unpublished);
        }
        let set = self.fetch().await?;
        *self.keys.write().await = (set, Some(LastFetch { at: Instant::now(), for_unknown_kid: last.is_some() }));
        Ok(self.known_key(kid).await.unwrap_or(KeyLookup::Unpublished))
    }

    async fn known_key(&self, kid: Option<&str>) -> Option<KeyLookup> {
        let keys = self.keys.read().await;
        let jwk = match kid {
            Some(kid) => keys.0.find(kid),
            None if keys.0.keys.len() == 1 => keys.0.keys.first(),
            None => None,
        }?;
        Some(DecodingKey::from_jwk(jwk).map_or(KeyLookup::Unusable, KeyLookup::Found))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_key_id_fetches_at_once_unless_the_last_fetch_was_for_one() {
        let every = Duration::from_secs(10);
        let start = Instant::now();
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        // Never fetched: fetch.
        assert!(may_fetch(None, start, every));
        // Right after the first fetch (a rotation just after the keys were read): fetch.
        assert!(may_fetch(Some(LastFetch { at: start, for_unknown_kid: false }), at(1), every));
        // Right after a fetch an unknown key id caused (a flood of forged ones): wait.
        let after_unknown = Some(LastFetch { at: start, for_unknown_kid: true });
        assert!(!may_fetch(after_unknown, at(1), every));
        assert!(!may_fetch(after_unknown, at(9), every));
        assert!(may_fetch(after_unknown, at(10), every));
    }
}
