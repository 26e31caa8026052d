//! Authentication: `Authenticator::authenticate` turns `Authorization: Bearer <token>` into a
//! `Caller` (the API's extractor calls it),
//! with the mechanism `SETTINGS_AUTH_MECHANISM` names:
//!
//! - `mock_token` (the embedded default) accepts any token and maps each distinct token to its
//!   own user, named by the token itself, so several people (or tests) can share a small
//!   installation and an operator can manage them with `gantry admin` by that name. It is for
//!   development and trusted networks only: whoever knows a name can act as that user.
//! - `custom_token` asks an external endpoint who the token is (`custom`).
//! - `oidc` verifies JWTs of an OpenID Connect provider (`oidc`).
//!
//! `runtime_service` is the caller's IBM Quantum runtime service as `stop` uses it (cancelling
//! a job's runtime jobs with the credentials sent with the stop), through the same IAM and
//! upstream client as `runtime_platform`.
//!
//! Verdicts of the upstream checks are cached by the SHA-256 of the token (`cache`); upstream
//! calls have a deadline and hold no lock, so a slow service delays only the requests that wait
//! for it. Tokens are never logged.
//!
//! The user a token names is kept in memory too (`db::watched`), so a request of a known token
//! costs no database round trip; `observe` keeps it true to changes made anywhere.

pub mod cache;
pub mod custom;
pub mod identity;
pub mod jwks;
pub mod oidc;
pub mod platform;
pub mod runtime_service;
pub mod upstream;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, header};

use crate::db;
use crate::db::users::UserRow;
use crate::db::watched::Watched;
use crate::domain::names::is_valid_user_name;
use crate::domain::visibility::{FunctionAccess, InstanceAccess, Permissions};
use cache::{VerdictCache, credential_key};
pub use identity::{Identity, Rejection, field};

/// How tokens are checked (`SETTINGS_AUTH_MECHANISM`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMechanism {
    /// Any token; each distinct token is its own user, named by the token.
    #[value(name = "mock_token")]
    MockToken,
    /// Tokens checked by an external HTTP endpoint (`--custom-token-url`).
    #[value(name = "custom_token")]
    CustomToken,
    /// IBM Cloud API keys (IAM), instance plans and access groups.
    #[value(name = "runtime_platform")]
    RuntimePlatform,
    /// JWTs of an OpenID Connect provider (`--oidc-issuer`, `--oidc-audience`).
    #[value(name = "oidc")]
    Oidc,
}

/// How callers are authenticated: the mechanism and its settings.
#[derive(Debug, Clone, clap::Args)]
pub struct AuthArgs {
    /// How bearer tokens are checked.
    #[arg(long, env = "SETTINGS_AUTH_MECHANISM", value_enum, default_value = "mock_token")]
    pub auth_mechanism: AuthMechanism,
    /// custom_token: the endpoint asked who a token is (`GET`, `Authorization: Bearer <token>`).
    #[arg(long, env = "GANTRY_CUSTOM_TOKEN_URL")]
    pub custom_token_url: Option<String>,
    /// custom_token: where the user's id is in the endpoint's JSON answer (dotted path).
    #[arg(long, env = "GANTRY_CUSTOM_TOKEN_USER_FIELD", default_value = "id")]
    pub custom_token_user_field: String,
    /// custom_token: where the user's groups are in the answer; when set, the user's groups are
    /// set to them on every request.
    #[arg(long, env = "GANTRY_CUSTOM_TOKEN_GROUPS_FIELD")]
    pub custom_token_groups_field: Option<String>,
    /// oidc: the issuer URL, exactly as tokens name it in `iss`.
    #[arg(long, env = "GANTRY_OIDC_ISSUER")]
    pub oidc_issuer: Option<String>,
    /// oidc: the audience tokens must be issued for (`aud`).
    #[arg(long, env = "GANTRY_OIDC_AUDIENCE")]
    pub oidc_audience: Option<String>,
    /// oidc: the claim naming the user.
    #[arg(long, env = "GANTRY_OIDC_USER_CLAIM", default_value = "sub")]
    pub oidc_user_claim: String,
    /// oidc: the claim listing the user's groups; when set, the user's groups are set to them on
    /// every request.
    #[arg(long, env = "GANTRY_OIDC_GROUPS_CLAIM")]
    pub oidc_groups_claim: Option<String>,
    /// oidc: once a token signed with a key not seen yet made the provider's keys be fetched,
    /// the seconds before another such token may (forged key ids cannot flood the provider); the
    /// first such token after any other fetch fetches at once (a rotation).
    #[arg(long, env = "GANTRY_OIDC_KEY_REFRESH_SECONDS", default_value_t = 10)]
    pub oidc_key_refresh_seconds: u64,
    /// IAM's base URL: runtime_platform's API key exchange, keys and access groups, and `stop`'s
    /// exchange of the runtime service's key; unset, `https://iam.cloud.ibm.com` (for `stop`,
    /// `https://iam.test.cloud.ibm.com` when the instance's CRN is a staging one).
    #[arg(long, env = "IAM_IBM_CLOUD_BASE_URL")]
    pub iam_url: Option<String>,
    /// runtime_platform: the resource controller's base URL (instance plans).
    #[arg(
        long,
        env = "RESOURCE_CONTROLLER_IBM_CLOUD_BASE_URL",
        default_value = "https://resource-controller.cloud.ibm.com"
    )]
    pub resource_controller_url: String,
    /// runtime_platform: resource plan ids entitled to use the service (comma-separated).
    #[arg(long, env = "RESOURCE_PLANS_ID_ALLOWED", value_delimiter = ',')]
    pub resource_plans_allowed: Vec<String>,
    /// runtime_platform: the token the `local` channel accepts (as the user `mockuser`); unset,
    /// the `local` channel is refused.
    #[arg(long, env = "SETTINGS_AUTH_MOCK_TOKEN")]
    pub mock_token: Option<crate::secrets::Secret>,
    /// The runtime API (the default region's URL): runtime_platform lists an instance's
    /// functions and permissions there (unset, access follows the group rules), and `stop`
    /// cancels the job's runtime jobs there (unset, the address the instance's CRN implies).
    #[arg(long, env = "RUNTIME_API_BASE_URL")]
    pub runtime_api_url: Option<String>,
    /// The region served by the bare `RUNTIME_API_BASE_URL`; other regions
    /// use its host prefixed with `<region>.`.
    #[arg(long, env = "RUNTIME_API_DEFAULT_REGION", default_value = "us-east")]
    pub runtime_api_default_region: String,
    /// runtime_platform: seconds an instance's function list is reused.
    #[arg(long, env = "RUNTIME_API_CACHE_TTL", default_value_t = 60)]
    pub runtime_api_cache_ttl_seconds: u64,
    /// Seconds a verified token's identity is reused without asking upstream again.
    #[arg(long, env = "IAM_IBM_CLOUD_CACHE_TTL", default_value_t = 60)]
    pub auth_cache_ttl_seconds: u64,
    /// Seconds an upstream authentication call may take; also all of `stop`'s calls to the
    /// runtime service together.
    #[arg(long, env = "GANTRY_AUTH_TIMEOUT_SECONDS", default_value_t = 5)]
    pub auth_timeout_seconds: u64,
}

impl AuthArgs {
    /// The authenticator these settings describe; refuses incomplete settings and the
    /// mechanisms that are not built.
    pub fn authenticator(&self) -> anyhow::Result<Authenticator> {
        let upstream = || upstream::Upstream::new(Duration::from_secs(self.auth_timeout_seconds.max(1)));
        let required = |value: &Option<String>, what: &str| {
            value
                .clone()
                .filter(|v| !v.trim().is_empty())
                .ok_or_else(|| anyhow::anyhow!("SETTINGS_AUTH_MECHANISM={} needs {what}", self.mechanism_name()))
        };
        let check = match self.auth_mechanism {
            AuthMechanism::MockToken => Check::Mock,
            AuthMechanism::CustomToken => Check::Custom(Box::new(custom::CustomToken {
                url: required(&self.custom_token_url, "--custom-token-url (GANTRY_CUSTOM_TOKEN_URL)")?,
                user_field: self.custom_token_user_field.clone(),
                groups_field: self.custom_token_groups_field.clone(),
                upstream: upstream()?,
            })),
            AuthMechanism::Oidc => Check::Oidc(Box::new(oidc::Oidc::new(
                required(&self.oidc_issuer, "--oidc-issuer (GANTRY_OIDC_ISSUER)")?,
                required(&self.oidc_audience, "--oidc-audience (GANTRY_OIDC_AUDIENCE)")?,
                self.oidc_user_claim.clone(),
                self.oidc_groups_claim.clone(),
                upstream()?,
                Duration::from_secs(self.oidc_key_refresh_seconds),
            ))),
            AuthMechanism::RuntimePlatform => {
                let plans: Vec<String> = self
                    .resource_plans_allowed
                    .iter()
                    .map(|p| p.trim().to_string())
                    .filter(|p| !p.is_empty())
                    .collect();
                if plans.is_empty() {
                    anyhow::bail!(
                        "SETTINGS_AUTH_MECHANISM=runtime_platform needs --resource-plans-allowed (RESOURCE_PLANS_ID_ALLOWED): no instance would be entitled"
                    );
                }
                Check::Platform(Box::new(platform::Platform::new(
                    self.iam_url.clone().unwrap_or_else(|| platform::IAM_URL.to_string()),
                    self.resource_controller_url.clone(),
                    plans,
                    self.mock_token.as_ref().map(|token| token.expose().to_string()),
                    upstream()?,
                    Duration::from_secs(self.auth_cache_ttl_seconds),
                    self.runtime_api_url.as_ref().filter(|url| !url.trim().is_empty()).map(|url| {
                        platform::RuntimeApi {
                            base_url: url.clone(),
                            default_region: self.runtime_api_default_region.clone(),
                            accesses: VerdictCache::new(Duration::from_secs(self.runtime_api_cache_ttl_seconds)),
                        }
                    }),
                )))
            }
        };
        Ok(Authenticator {
            check,
            verdicts: VerdictCache::new(Duration::from_secs(self.auth_cache_ttl_seconds)),
            users: Watched::default(),
        })
    }

    /// The client `stop` cancels a job's runtime jobs with (any mechanism: the credentials are
    /// the ones the caller sends with `stop`).
    pub fn runtime_service(&self) -> anyhow::Result<runtime_service::RuntimeService> {
        runtime_service::RuntimeService::new(
            self.iam_url.clone(),
            self.runtime_api_url.clone(),
            self.runtime_api_default_region.clone(),
            Duration::from_secs(self.auth_timeout_seconds.max(1)),
        )
    }

    pub fn mechanism_name(&self) -> String {
        clap::ValueEnum::to_possible_value(&self.auth_mechanism).map(|v| v.get_name().to_string()).unwrap_or_default()
    }
}

enum Check {
    Mock,
    Custom(Box<custom::CustomToken>),
    Oidc(Box<oidc::Oidc>),
    Platform(Box<platform::Platform>),
}

/// The configured mechanism with its cache of verdicts.
pub struct Authenticator {
    check: Check,
    verdicts: VerdictCache<Identity>,
    /// The users of known tokens, by name; used only while changes are followed (`observe`).
    users: Watched<String, CachedUser>,
}

impl Authenticator {
    /// `mock_token`, as `gantry serve` starts by default and the tests use.
    pub fn mock() -> Authenticator {
        Authenticator { check: Check::Mock, verdicts: VerdictCache::new(Duration::ZERO), users: Watched::default() }
    }

    /// What the watcher of changes reports (`db::watched::watch_auth_changes`); until it
    /// reports that changes are followed, every request reads its user from the database.
    pub fn observe(&self, event: db::watched::AuthWatch) {
        self.users.observe(event);
    }

    /// Who `token` is; `runtime_platform` also reads the request's channel and instance
    /// (`Service-Channel`, `Service-CRN`).
    pub async fn identify(&self, token: &str, channel: Option<&str>, crn: Option<&str>) -> Result<Identity, AuthError> {
        match &self.check {
            Check::Mock => return Ok(Identity { username: token.to_string(), groups: None, instance: None }),
            // It keeps its own caches: its verdict depends on the instance too.
            Check::Platform(platform) => return platform.verify(token, channel, crn).await.map_err(unauthorized),
            Check::Custom(_) | Check::Oidc(_) => {}
        }
        let key = credential_key(token);
        if let Some(identity) = self.verdicts.get(&key) {
            return Ok(identity);
        }
        let verdict = match &self.check {
            Check::Mock | Check::Platform(_) => unreachable!("answered above, without the cache"),
            Check::Custom(custom) => custom.verify(token).await.map(|identity| (identity, None)),
            Check::Oidc(oidc) => oidc.verify(token).await.map(|(identity, expires)| {
                // Kept no longer than the token lives.
                let left = expires.map(|at| {
                    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
                    Instant::now() + Duration::from_secs(at.saturating_sub(now))
                });
                (identity, left)
            }),
        };
        let (identity, not_after) = verdict.map_err(unauthorized)?;
        if !is_valid_user_name(&identity.username) {
            return Err(AuthError::Denied(format!(
                "Authorization token is not valid: its user id '{}' is not 1-150 characters of letters, digits, '_', '.', '@' or '-'.",
                identity.username.chars().take(150).collect::<String>()
            )));
        }
        self.verdicts.put(key, identity.clone(), not_after);
        Ok(identity)
    }
}

fn unauthorized(rejection: Rejection) -> AuthError {
    AuthError::Denied(match rejection {
        Rejection::Invalid => "Authorization token is not valid.".into(),
        Rejection::Unusable(why) | Rejection::Unavailable(why) => why,
    })
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mechanism = match self.check {
            Check::Mock => "mock_token",
            Check::Custom(_) => "custom_token",
            Check::Oidc(_) => "oidc",
            Check::Platform(_) => "runtime_platform",
        };
        f.debug_struct("Authenticator").field("mechanism", &mechanism).finish_non_exhaustive()
    }
}

/// A user as kept in memory: their row and the groups last written for them from the identity
/// provider's answer.
#[derive(Debug, Clone, PartialEq)]
struct CachedUser {
    row: UserRow,
    synced_groups: Option<Vec<String>>,
}

/// Shared by every request.
pub type SharedAuthenticator = Arc<Authenticator>;

/// The authenticated user of a request.
#[derive(Clone)]
pub struct Caller {
    pub user_id: String,
    pub username: String,
    /// The raw bearer token, handed to jobs so they can call back as the user. Never logged.
    pub token: String,
    /// Runtime-instances mode: the instance's per-function permissions.
    pub instance: Option<Arc<InstanceAccess>>,
}

impl Caller {
    /// The caller's relation to a function: the database's, with the instance's permissions
    /// in runtime-instances mode.
    pub fn access(&self, row: &db::programs::ProgramRow) -> FunctionAccess {
        FunctionAccess {
            instance: self.instance.as_ref().map(|access| access.on(row.provider_name.as_deref(), &row.title)),
            ..row.access()
        }
    }

    /// Whether the caller works through an instance, whose permissions may open any provider
    /// function.
    pub fn has_instance(&self) -> bool {
        self.instance.is_some()
    }

    /// The instance's permissions on a function (none without an instance).
    pub fn permissions_on(&self, provider: Option<&str>, title: &str) -> Permissions {
        self.instance.as_ref().map(|access| access.on(provider, title)).unwrap_or_default()
    }
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller").field("username", &self.username).finish_non_exhaustive()
    }
}

/// The token of an `Authorization` header: its last space-separated word, so `Bearer X`,
/// `apikey X` and a bare `X` all work, as with the reference gateway.
pub fn token_from_header(value: &str) -> Option<&str> {
    value.split_whitespace().last().filter(|t| !t.eq_ignore_ascii_case("bearer"))
}

/// Why a request has no caller.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The request is not authenticated; the message says why (a 401 in the contract's shape).
    #[error("{0}")]
    Denied(String),
    /// The caller's user could not be read or written.
    #[error(transparent)]
    Database(#[from] db::Error),
}

impl Authenticator {
    /// The caller of a request with these headers: the token's user, created on first sight,
    /// refused when deactivated; groups the mechanism names are stored with the user.
    pub async fn authenticate(&self, db: &db::Db, headers: &HeaderMap) -> Result<Caller, AuthError> {
        let header_value = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or_default();
        let token = token_from_header(header_value)
            .ok_or_else(|| AuthError::Denied("Authorization token was not provided.".into()))?;
        if matches!(self.check, Check::Mock) && !is_valid_user_name(token) {
            return Err(AuthError::Denied(
                "Authorization token is not valid. With mock_token it must be 1-150 characters of letters, digits, '_', '.', '@' or '-'.".into(),
            ));
        }
        let header_text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
        let identity = self.identify(token, header_text("service-channel"), header_text("service-crn")).await?;
        let generation = self.users.generation();
        let known = self.users.get(&identity.username);
        let mut user = match known.clone() {
            Some(user) => user,
            None => CachedUser { row: db::users::ensure(db, &identity.username).await?, synced_groups: None },
        };
        if !user.row.is_active {
            self.users.put(generation, user.row.username.clone(), user);
            return Err(AuthError::Denied(
                "Your user was deactivated. Please contact IBM support for reactivation.".into(),
            ));
        }
        if let Some(groups) = &identity.groups
            && user.synced_groups.as_ref() != Some(groups)
        {
            db::users::set_groups(db, &user.row.id, groups).await?;
            user.synced_groups = Some(groups.clone());
        }
        if known.as_ref() != Some(&user) {
            self.users.put(generation, user.row.username.clone(), user.clone());
        }
        let UserRow { id, username, .. } = user.row;
        Ok(Caller { user_id: id, username, token: token.to_string(), instance: identity.instance })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(words: &[&str]) -> anyhow::Result<Authenticator> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            auth: AuthArgs,
        }
        let cli = <Cli as clap::Parser>::try_parse_from(std::iter::once("gantry").chain(words.iter().copied()))?;
        cli.auth.authenticator()
    }

    #[test]
    fn incomplete_settings_and_unbuilt_mechanisms_are_refused_by_name() {
        let error = settings(&["--auth-mechanism", "custom_token"]).unwrap_err().to_string();
        assert!(error.contains("needs --custom-token-url (GANTRY_CUSTOM_TOKEN_URL)"), "{error}");
        let error = settings(&["--auth-mechanism", "oidc", "--oidc-issuer", "https://idp"]).unwrap_err().to_string();
        assert!(error.contains("needs --oidc-audience (GANTRY_OIDC_AUDIENCE)"), "{error}");
        let error = settings(&["--auth-mechanism", "runtime_platform"]).unwrap_err().to_string();
        assert!(error.contains("needs --resource-plans-allowed (RESOURCE_PLANS_ID_ALLOWED)"), "{error}");
        assert!(settings(&[]).is_ok());
    }

    #[test]
    fn fields_are_dotted_paths_or_whole_keys() {
        let answer = serde_json::json!({"user": {"id": 7}, "https://example.com/groups": ["a"]});
        assert_eq!(field(&answer, "user.id"), Some(&serde_json::json!(7)));
        assert_eq!(field(&answer, "https://example.com/groups"), Some(&serde_json::json!(["a"])));
        assert_eq!(field(&answer, "user.name"), None);
        let identity = Identity::from_claims(&answer, "user.id", Some("https://example.com/groups"), "x").unwrap();
        assert_eq!(identity, Identity { username: "7".into(), groups: Some(vec!["a".into()]), instance: None });
    }

    #[test]
    fn the_token_is_the_last_word_of_the_header() {
        assert_eq!(token_from_header("Bearer abc"), Some("abc"));
        assert_eq!(token_from_header("apikey abc"), Some("abc"));
        assert_eq!(token_from_header("abc"), Some("abc"));
        assert_eq!(token_from_header("Bearer "), None);
        assert_eq!(token_from_header(""), None);
    }
}
