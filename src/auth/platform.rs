//! `runtime_platform`: IBM Cloud API keys, as the reference gateway checks them (its §6.4).
//! The key is exchanged for an IAM access token (`POST <IAM>/identity/token`) whose JWT is
//! verified with IAM's keys (`<IAM>/identity/keys`; RS256, `exp`, `iat`): the user is its
//! `iam_id`, the account its `account.bss`. The user's groups are the account's access groups
//! (`GET <IAM>/v2/groups?account_id=`) but `Public Access`, set on every request. The instance
//! named by `Service-CRN` must be on an allowed plan (`GET <resource
//! controller>/v2/resource_instances/<CRN>` → `resource_plan_id`). Channels (`Service-Channel`):
//! `ibm_quantum_platform` (also when absent) and `ibm_cloud`; `local` is the reference's mock
//! check (only with `SETTINGS_AUTH_MOCK_TOKEN` set: that token is the user `mockuser`). Logins
//! and plans are cached by the SHA-256 of the key (and the CRN), never the key itself.
//!
//! Not built: the runtime API's per-function permissions (the reference's runtime-instances
//! mode); access follows the group rules, as in the reference with that mode off.

use std::time::Duration;

use hyper::StatusCode;
use jsonwebtoken::{Validation, decode, decode_header};
use serde_json::Value;

use super::cache::{VerdictCache, credential_key};
use super::jwks::{KeyCache, KeySource, asymmetric};
use super::upstream::Upstream;
use super::{Identity, Rejection};

pub const NOT_AUTHENTICATED: &str = "You couldn't be authenticated, please review your API Key.";
pub const IAM_PROBLEM: &str =
    "There was a problem in the authentication process with IBM Quantum Platform, please try later.";
pub const NOT_ENTITLED: &str = "Your instance's resource plan is not entitled to use Qiskit Functions. Please use an instance provisioned on a supported plan, or contact IBM support if you believe this is an error.";
pub const REVIEW_CRN: &str =
    "There was a problem in the authentication process with IBM Quantum Platform, please review your CRN.";
pub const WRONG_CHANNEL: &str =
    "The value of the channel is not correct. Verify that you are using one of these: ibm_cloud, ibm_quantum_platform";
/// The user every `local`-channel caller is, as in the reference.
pub const MOCK_USER: &str = "mockuser";
/// The access group every account has, which is not a group of Gantry's.
const PUBLIC_ACCESS: &str = "Public Access";

pub struct Platform {
    pub iam_url: String,
    pub resource_controller_url: String,
    pub plans_allowed: Vec<String>,
    pub mock_token: Option<String>,
    upstream: Upstream,
    keys: KeyCache,
    logins: VerdictCache<Login>,
    plans: VerdictCache<String>,
}

/// What an API key is, cached.
#[derive(Clone)]
struct Login {
    iam_id: String,
    groups: Vec<String>,
    /// Kept only to read the instance's plan as the caller.
    access_token: String,
}

impl Platform {
    pub fn new(
        iam_url: String,
        resource_controller_url: String,
        plans_allowed: Vec<String>,
        mock_token: Option<String>,
        upstream: Upstream,
        ttl: Duration,
    ) -> Platform {
        let iam_url = iam_url.trim_end_matches('/').to_string();
        let keys = KeyCache::new(
            KeySource::Url(format!("{iam_url}/identity/keys")),
            upstream.clone(),
            Duration::from_secs(10),
        );
        Platform {
            iam_url,
            resource_controller_url: resource_controller_url.trim_end_matches('/').to_string(),
            plans_allowed,
            mock_token,
            upstream,
            keys,
            logins: VerdictCache::new(ttl),
            plans: VerdictCache::new(ttl),
        }
    }

    /// Who the API key `key` is, on `channel` for the instance `crn`.
    pub async fn verify(&self, key: &str, channel: Option<&str>, crn: Option<&str>) -> Result<Identity, Rejection> {
        match channel {
            None | Some("ibm_quantum_platform" | "ibm_cloud") => {}
            Some("local") => {
                return match &self.mock_token {
                    Some(mock) if mock == key => Ok(Identity { username: MOCK_USER.into(), groups: None }),
                    Some(_) => Err(Rejection::Invalid),
                    None => Err(Rejection::Unusable(WRONG_CHANNEL.into())),
                };
            }
            Some(_) => return Err(Rejection::Unusable(WRONG_CHANNEL.into())),
        }
        let login = self.login(key).await?;
        let plan = self.plan(key, &login, crn).await?;
        if !self.plans_allowed.contains(&plan) {
            return Err(Rejection::Unusable(NOT_ENTITLED.into()));
        }
        Ok(Identity { username: login.iam_id, groups: Some(login.groups) })
    }

    async fn login(&self, key: &str) -> Result<Login, Rejection> {
        let cache_key = credential_key(key);
        if let Some(login) = self.logins.get(&cache_key) {
            return Ok(login);
        }
        let problem = || Rejection::Unavailable(IAM_PROBLEM.into());
        let url = format!("{}/identity/token", self.iam_url);
        let fields = [("grant_type", "urn:ibm:params:oauth:grant-type:apikey"), ("apikey", key)];
        let (status, body) = self.upstream.post_form(&url, &fields).await.map_err(|_| problem())?;
        match status {
            StatusCode::OK => {}
            StatusCode::BAD_REQUEST | StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::NOT_FOUND => {
                return Err(Rejection::Unusable(NOT_AUTHENTICATED.into()));
            }
            _ => return Err(problem()),
        }
        let answer: Value = serde_json::from_slice(&body).map_err(|_| problem())?;
        let access_token = answer.get("access_token").and_then(Value::as_str).ok_or_else(problem)?.to_string();
        let claims = self.verified_claims(&access_token).await?;
        let iam_id = claims.get("iam_id").and_then(Value::as_str).filter(|id| !id.is_empty());
        let account = claims.pointer("/account/bss").and_then(Value::as_str);
        let (Some(iam_id), Some(account)) = (iam_id, account) else {
            return Err(Rejection::Unusable(NOT_AUTHENTICATED.into()));
        };
        let groups = self.access_groups(account, &access_token).await;
        let login = Login { iam_id: iam_id.to_string(), groups, access_token };
        self.logins.put(cache_key, login.clone(), None);
        Ok(login)
    }

    /// The IAM token's claims once its signature, `exp` and `iat` hold.
    async fn verified_claims(&self, token: &str) -> Result<Value, Rejection> {
        let invalid = || Rejection::Unusable(NOT_AUTHENTICATED.into());
        let header = decode_header(token).map_err(|_| invalid())?;
        if !asymmetric(header.alg) {
            return Err(invalid());
        }
        let key = self.keys.key(header.kid.as_deref()).await.map_err(|_| Rejection::Unavailable(IAM_PROBLEM.into()))?;
        let key = key.ok_or_else(invalid)?;
        let mut validation = Validation::new(header.alg);
        validation.validate_aud = false;
        validation.set_required_spec_claims(&["exp", "iat"]);
        validation.leeway = 30;
        let claims = decode::<Value>(token, &key, &validation).map_err(|_| invalid())?.claims;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
        if claims.get("iat").and_then(Value::as_u64).is_none_or(|iat| iat > now + 30) {
            return Err(invalid());
        }
        Ok(claims)
    }

    /// The account's access groups but `Public Access`; none when they cannot be read.
    async fn access_groups(&self, account: &str, access_token: &str) -> Vec<String> {
        let url = format!("{}/v2/groups?account_id={}", self.iam_url, urlencode(account));
        let Ok(answer) = self.upstream.get_json_as(&url, Some(&format!("Bearer {access_token}"))).await else {
            return Vec::new();
        };
        answer
            .get("groups")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|group| group.get("name").and_then(Value::as_str) != Some(PUBLIC_ACCESS))
            .filter_map(|group| group.get("id").and_then(Value::as_str).map(str::to_string))
            .collect()
    }

    /// The resource plan of the instance `crn`, read as the caller.
    async fn plan(&self, key: &str, login: &Login, crn: Option<&str>) -> Result<String, Rejection> {
        let review = || Rejection::Unusable(REVIEW_CRN.into());
        let crn = crn.filter(|crn| !crn.trim().is_empty()).ok_or_else(review)?;
        let cache_key = credential_key(&format!("{key}\n{crn}"));
        if let Some(plan) = self.plans.get(&cache_key) {
            return Ok(plan);
        }
        let url = format!("{}/v2/resource_instances/{}", self.resource_controller_url, urlencode(crn));
        let answer = self
            .upstream
            .get_json_as(&url, Some(&format!("Bearer {}", login.access_token)))
            .await
            .map_err(|_| review())?;
        let plan = answer.get("resource_plan_id").and_then(Value::as_str).ok_or_else(review)?.to_string();
        self.plans.put(cache_key, plan.clone(), None);
        Ok(plan)
    }
}

fn urlencode(text: &str) -> String {
    serde_urlencoded::to_string([("", text)]).unwrap_or_default().trim_start_matches('=').to_string()
}
