//! `oidc`: bearer JWTs issued by an OpenID Connect provider. The signing keys come from the
//! provider's discovery document (`<issuer>/.well-known/openid-configuration` → `jwks_uri`); a
//! token signed with a key not seen yet makes the keys be fetched again (at most every
//! `--oidc-key-refresh-seconds`), so rotated keys are picked up without a restart. The signature
//! (asymmetric algorithms only), issuer, audience, expiry and not-before are checked; the user
//! and groups come from configurable claims.

use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};
use serde_json::Value;

use super::upstream::{Upstream, UpstreamError};
use super::{Identity, Rejection};

/// Clock skew tolerated on `exp` and `nbf`.
const LEEWAY_SECONDS: u64 = 30;

pub struct Oidc {
    /// The issuer URL exactly as tokens name it in `iss`.
    pub issuer: String,
    pub audience: String,
    pub user_claim: String,
    pub groups_claim: Option<String>,
    pub upstream: Upstream,
    /// Shortest time between two fetches of the keys caused by unknown key ids.
    refresh_every: Duration,
    keys: tokio::sync::RwLock<Keys>,
    /// Held while the keys are fetched, so concurrent requests make one fetch.
    refreshing: tokio::sync::Mutex<()>,
}

struct Keys {
    set: JwkSet,
    fetched: Option<Instant>,
}

impl Oidc {
    pub fn new(
        issuer: String,
        audience: String,
        user_claim: String,
        groups_claim: Option<String>,
        upstream: Upstream,
        refresh_every: Duration,
    ) -> Oidc {
        Oidc {
            issuer,
            audience,
            user_claim,
            groups_claim,
            upstream,
            refresh_every,
            keys: tokio::sync::RwLock::new(Keys { set: JwkSet { keys: Vec::new() }, fetched: None }),
            refreshing: tokio::sync::Mutex::new(()),
        }
    }

    /// The token's identity and when the token expires.
    pub async fn verify(&self, token: &str) -> Result<(Identity, Option<u64>), Rejection> {
        let header = decode_header(token).map_err(|_| Rejection::Invalid)?;
        if !matches!(
            header.alg,
            Algorithm::RS256
                | Algorithm::RS384
                | Algorithm::RS512
                | Algorithm::PS256
                | Algorithm::PS384
                | Algorithm::PS512
                | Algorithm::ES256
                | Algorithm::ES384
                | Algorithm::EdDSA
        ) {
            return Err(Rejection::Invalid);
        }
        let key = self.key(header.kid.as_deref()).await?.ok_or(Rejection::Invalid)?;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_nbf = true;
        validation.leeway = LEEWAY_SECONDS;
        let claims = decode::<Value>(token, &key, &validation).map_err(|_| Rejection::Invalid)?.claims;
        let identity = Identity::from_claims(&claims, &self.user_claim, self.groups_claim.as_deref(), "The token")
            .map_err(Rejection::Unusable)?;
        Ok((identity, claims.get("exp").and_then(Value::as_u64)))
    }

    /// The key `kid` names (the only key when the token names none), fetching the keys again
    /// when it is not known yet.
    async fn key(&self, kid: Option<&str>) -> Result<Option<DecodingKey>, Rejection> {
        if let Some(key) = self.known_key(kid).await {
            return Ok(Some(key));
        }
        let _one_fetch = self.refreshing.lock().await;
        // Another request may have fetched them meanwhile.
        if let Some(key) = self.known_key(kid).await {
            return Ok(Some(key));
        }
        let recently = self.keys.read().await.fetched.is_some_and(|at| at.elapsed() < self.refresh_every);
        if recently {
            return Ok(None);
        }
        let set = self.fetch_keys().await.map_err(|error| {
            Rejection::Unavailable(format!(
                "We couldn't verify your token at this time: the identity provider {error}. Please try again later."
            ))
        })?;
        *self.keys.write().await = Keys { set, fetched: Some(Instant::now()) };
        Ok(self.known_key(kid).await)
    }

    async fn known_key(&self, kid: Option<&str>) -> Option<DecodingKey> {
        let keys = self.keys.read().await;
        let jwk = match kid {
            Some(kid) => keys.set.find(kid),
            None if keys.set.keys.len() == 1 => keys.set.keys.first(),
            None => None,
        }?;
        DecodingKey::from_jwk(jwk).ok()
    }

    async fn fetch_keys(&self) -> Result<JwkSet, UpstreamError> {
        let discovery_url = format!("{}/.well-known/openid-configuration", self.issuer.trim_end_matches('/'));
        let discovery = self.upstream.get_json(&discovery_url).await?;
        let jwks_uri = discovery.get("jwks_uri").and_then(Value::as_str).ok_or(UpstreamError::Unreadable)?;
        let keys = self.upstream.get_json(jwks_uri).await?;
        serde_json::from_value(keys).map_err(|_| UpstreamError::Unreadable)
    }
}
