//! `oidc`: bearer JWTs issued by an OpenID Connect provider. The signing keys come from the
//! provider's discovery document (`<issuer>/.well-known/openid-configuration` → `jwks_uri`); a
//! token signed with a key not seen yet makes the keys be fetched again (at once, then at most
//! every `--oidc-key-refresh-seconds`, see `jwks`), so rotated keys are picked up without a
//! restart, and a key the provider still does not publish is answered as such, not as the
//! caller's fault. The signature (asymmetric algorithms only), issuer, audience, expiry and
//! not-before are checked; the user and groups come from configurable claims.

use std::time::Duration;

use jsonwebtoken::{Validation, decode, decode_header};
use serde_json::Value;

use super::identity::{Identity, Rejection};
use super::jwks::{KeyCache, KeyLookup, KeySource, asymmetric, unpublished_key_message};
use super::upstream::Upstream;

/// Clock skew tolerated on `exp` and `nbf`.
const LEEWAY_SECONDS: u64 = 30;

pub struct Oidc {
    /// The issuer URL exactly as tokens name it in `iss`.
    pub issuer: String,
    pub audience: String,
    pub user_claim: String,
    pub groups_claim: Option<String>,
    keys: KeyCache,
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
        let keys = KeyCache::new(KeySource::Discovery(issuer.clone()), upstream, refresh_every);
        Oidc { issuer, audience, user_claim, groups_claim, keys }
    }

    /// The token's identity and when the token expires.
    pub async fn verify(&self, token: &str) -> Result<(Identity, Option<u64>), Rejection> {
        let header = decode_header(token).map_err(|_| Rejection::Invalid)?;
        if !asymmetric(header.alg) {
            return Err(Rejection::Invalid);
        }
        let key = self.keys.key(header.kid.as_deref()).await.map_err(|error| {
            Rejection::Unavailable(format!(
                "We couldn't verify your token at this time: the identity provider {error}. Please try again later."
            ))
        })?;
        let key = match (key, header.kid.as_deref()) {
            (KeyLookup::Found(key), _) => key,
            (KeyLookup::Unpublished, Some(kid)) => {
                return Err(Rejection::Unavailable(unpublished_key_message(kid, "the identity provider")));
            }
            (KeyLookup::Unpublished | KeyLookup::Unusable, _) => return Err(Rejection::Invalid),
        };
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
}
