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
//! With `RUNTIME_API_BASE_URL` set, the instance's functions and their permissions come from the
//! regional runtime API (`GET /api/v1/functions`, the region from the CRN) and replace the group
//! rules for the request (the reference's runtime-instances mode); its 204 keeps the group rules.

use std::sync::Arc;
use std::time::Duration;

use hyper::StatusCode;
use jsonwebtoken::{Validation, decode, decode_header};
use serde_json::Value;

use super::cache::{VerdictCache, credential_key};
use super::identity::{Identity, Rejection};
use super::jwks::{KeyCache, KeyLookup, KeySource, asymmetric, unpublished_key_message};
use super::upstream::Upstream;
use crate::domain::visibility::{InstanceAccess, Permissions};

pub const NOT_AUTHENTICATED: &str = "You couldn't be authenticated, please review your API Key.";
pub const IAM_PROBLEM: &str =
    "There was a problem in the authentication process with IBM Quantum Platform, please try later.";
pub const NOT_ENTITLED: &str = "Your instance's resource plan is not entitled to use Qiskit Functions. Please use an instance provisioned on a supported plan, or contact IBM support if you believe this is an error.";
pub const REVIEW_CRN: &str =
    "There was a problem in the authentication process with IBM Quantum Platform, please review your CRN.";
pub const WRONG_CHANNEL: &str =
    "The value of the channel is not correct. Verify that you are using one of these: ibm_cloud, ibm_quantum_platform";
pub const RUNTIME_UNAVAILABLE: &str = "We couldn't verify your access to Qiskit Functions at this time. Please try again later, or contact IBM support if the problem persists.";
/// IAM of production IBM Cloud accounts, unless `--iam-url` names another.
pub const IAM_URL: &str = "https://iam.cloud.ibm.com";
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
    runtime: Option<RuntimeApi>,
}

/// The regional runtime API listing an instance's functions.
pub struct RuntimeApi {
    /// The default region's URL (`RUNTIME_API_BASE_URL`).
    pub base_url: String,
    /// `RUNTIME_API_DEFAULT_REGION`: CRNs of this region use the bare URL.
    pub default_region: String,
    /// By the SHA-256 of key and CRN; `None`: the API answered 204 (group rules).
    pub accesses: VerdictCache<Option<Arc<InstanceAccess>>>,
}

/// Where the runtime API lists the functions of the instance `crn`.
pub fn runtime_functions_url(base_url: &str, default_region: &str, crn: &str) -> String {
    format!("{}/api/v1/functions", runtime_api_base(base_url, default_region, crn))
}

/// The runtime API serving the instance `crn`: the base URL, its host prefixed with `<region>.`
/// when the CRN's region (its sixth `:` segment) is not the default.
pub fn runtime_api_base(base_url: &str, default_region: &str, crn: &str) -> String {
    let base = base_url.trim_end_matches('/');
    match crn.split(':').nth(5).filter(|region| !region.is_empty() && *region != default_region) {
        Some(region) => match base.split_once("://") {
            Some((scheme, host)) => format!("{scheme}://{region}.{host}"),
            None => format!("{region}.{base}"),
        },
        None => base.to_string(),
    }
}

/// The runtime API's 200 answer: per function and for custom functions (invalid entries
/// skipped).
pub fn parse_instance_access(answer: &Value) -> InstanceAccess {
    let names = |value: Option<&Value>| {
        Permissions::from_names(value.and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str))
    };
    let functions = answer
        .get("functions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let provider = entry.get("provider").and_then(Value::as_str).filter(|p| !p.is_empty())?;
            let name = entry.get("name").and_then(Value::as_str).filter(|n| !n.is_empty())?;
            Some(((provider.to_string(), name.to_string()), names(entry.get("permissions"))))
        })
        .collect();
    let business_models = answer
        .get("functions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let provider = entry.get("provider").and_then(Value::as_str)?;
            let name = entry.get("name").and_then(Value::as_str)?;
            let model = entry.get("business_model").and_then(Value::as_str).filter(|m| !m.is_empty())?;
            Some(((provider.to_string(), name.to_string()), model.to_string()))
        })
        .collect();
    InstanceAccess { functions, custom: names(answer.pointer("/custom_functions/permissions")), business_models }
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
        runtime: Option<RuntimeApi>,
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
            runtime,
        }
    }

    /// Who the API key `key` is, on `channel` for the instance `crn`.
    pub async fn verify(&self, key: &str, channel: Option<&str>, crn: Option<&str>) -> Result<Identity, Rejection> {
        match channel {
            None | Some("ibm_quantum_platform" | "ibm_cloud") => {}
            Some("local") => {
                return match &self.mock_token {
                    Some(mock) if mock == key => {
                        Ok(Identity { username: MOCK_USER.into(), groups: None, instance: None })
                    }
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
        let instance = match (&self.runtime, crn) {
            (Some(runtime), Some(crn)) => self.instance_access(runtime, key, crn).await?,
            _ => None,
        };
        Ok(Identity { username: login.iam_id, groups: Some(login.groups), instance })
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
        let key = match (key, header.kid.as_deref()) {
            (KeyLookup::Found(key), _) => key,
            // IAM's own token: a key it does not publish is a rotation on its side, not the key's fault.
            (KeyLookup::Unpublished, Some(kid)) => {
                return Err(Rejection::Unavailable(unpublished_key_message(kid, "IAM")));
            }
            (KeyLookup::Unpublished | KeyLookup::Unusable, _) => return Err(invalid()),
        };
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

impl Platform {
    /// What the runtime API says the instance `crn` may use; `None` when it answers 204.
    async fn instance_access(
        &self,
        runtime: &RuntimeApi,
        key: &str,
        crn: &str,
    ) -> Result<Option<Arc<InstanceAccess>>, Rejection> {
        let cache_key = credential_key(&format!("{key}\n{crn}"));
        if let Some(access) = runtime.accesses.get(&cache_key) {
            return Ok(access);
        }
        let unavailable = || Rejection::Unavailable(RUNTIME_UNAVAILABLE.into());
        let url = runtime_functions_url(&runtime.base_url, &runtime.default_region, crn);
        let (status, body) =
            self.upstream.get_with(&url, &format!("apikey {key}"), &[("Service-CRN", crn)]).await.map_err(|error| {
                tracing::warn!(%error, "the runtime API failed");
                unavailable()
            })?;
        let access = match status {
            StatusCode::NO_CONTENT => None,
            StatusCode::OK => {
                let answer: Value = serde_json::from_slice(&body).map_err(|_| unavailable())?;
                Some(Arc::new(parse_instance_access(&answer)))
            }
            status => {
                tracing::warn!(%status, "the runtime API refused to list the instance's functions");
                return Err(unavailable());
            }
        };
        runtime.accesses.put(cache_key, access.clone(), None);
        Ok(access)
    }
}

fn urlencode(text: &str) -> String {
    serde_urlencoded::to_string([("", text)]).unwrap_or_default().trim_start_matches('=').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crns_region_picks_the_runtime_apis_host() {
        let crn = |region: &str| format!("crn:v1:bluemix:public:quantum-computing:{region}:a/acct:instance::");
        let base = "https://quantum.cloud.example/";
        assert_eq!(
            runtime_functions_url(base, "us-east", &crn("us-east")),
            "https://quantum.cloud.example/api/v1/functions"
        );
        assert_eq!(
            runtime_functions_url(base, "us-east", &crn("eu-de")),
            "https://eu-de.quantum.cloud.example/api/v1/functions"
        );
        assert_eq!(
            runtime_functions_url(base, "us-east", "not-a-crn"),
            "https://quantum.cloud.example/api/v1/functions"
        );
    }

    #[test]
    fn the_runtime_apis_answer_becomes_permissions_and_bad_entries_are_skipped() {
        let answer = serde_json::json!({
            "functions": [
                {"provider": "acme", "name": "solver", "permissions": ["function.read", "function.run"], "business_model": "TRIAL"},
                {"provider": "acme", "permissions": ["function.run"]},
                {"name": "orphan", "permissions": ["function.run"]},
                "not an object"
            ],
            "custom_functions": {"permissions": ["function-custom.run"]}
        });
        let access = parse_instance_access(&answer);
        assert_eq!(access.functions.len(), 1);
        let solver = access.on(Some("acme"), "solver");
        assert!(solver.has(Permissions::READ) && solver.has(Permissions::RUN) && !solver.has(Permissions::WRITE));
        assert_eq!(access.on(Some("acme"), "other"), Permissions::default());
        assert!(access.on(None, "mine").has(Permissions::CUSTOM_RUN));
        assert!(access.trial("acme", "solver") && !access.trial("acme", "other"));
    }
}
