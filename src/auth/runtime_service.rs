//! The caller's IBM Quantum runtime service, as `stop` uses it: the runtime jobs a job reported
//! (`jobs/{id}/runtime_jobs/`) are cancelled and their sessions closed with the credentials the
//! client sends with `stop` (the serialized `QiskitRuntimeService`), as the reference gateway
//! does. The API key is exchanged at IAM (`POST <IAM>/identity/token`) for an access token, then
//! the runtime API is asked as the instance (`Service-CRN`): `GET /api/v1/jobs/{id}` (404: the
//! job is unknown to these credentials), `POST /api/v1/jobs/{id}/cancel` (409: not cancellable
//! any more) and `DELETE /api/v1/sessions/{id}/close` (cancels the session's jobs).
//!
//! Where those services are comes from Gantry's settings, never from the caller: the account's
//! `url` is ignored, so a caller cannot aim the gateway's requests elsewhere. `--iam-url` and
//! `--runtime-api-url` win where set; else the instance's CRN decides, as the Python client's
//! defaults do: `https://iam.cloud.ibm.com` and `https://quantum.cloud.ibm.com` (`.test.` in
//! both for staging CRNs), the host prefixed with `<region>.` outside `us-east`.
//!
//! The credentials live only for the request: never stored, logged or put in an event, and
//! every upstream failure is reported without the key, the token or the service's body. All
//! calls of one `stop` share one deadline (the upstream timeout), so a slow service delays the
//! answer by at most that much.

use std::collections::HashSet;
use std::time::Duration;

use hyper::{Method, StatusCode};
use serde_json::Value;
use tokio::time::Instant;

use super::platform::{IAM_URL, runtime_api_base};
use super::upstream::{Upstream, UpstreamError};
use crate::secrets::Secret;

pub const SERVICE_NOT_FOUND: &str = "QiskitRuntimeService not found, cannot stop runtime jobs.";
pub const SERVICE_UNREADABLE: &str =
    "QiskitRuntimeService could not be read (not a serialized service), cannot stop runtime jobs.";
pub const NO_RUNTIME_JOBS: &str = "No active runtime job ID associated with this serverless job ID.";
/// Where the Python client's defaults put the runtime API (production instances).
const RUNTIME_API_URL: &str = "https://quantum.cloud.ibm.com";
/// The same for instances whose CRN names the `staging` cloud.
const STAGING_IAM_URL: &str = "https://iam.test.cloud.ibm.com";
const STAGING_RUNTIME_API_URL: &str = "https://quantum.test.cloud.ibm.com";
/// The region the bare runtime API host serves when it is not configured.
const DEFAULT_REGION: &str = "us-east";

/// The `service` field of `stop`, read.
#[derive(Debug)]
pub enum ServiceField {
    /// Absent, `""`, `"null"` or any other JSON the reference reads as false.
    Absent,
    /// A serialized service: `{"__type__": ..., "__value__": {<account>}}`.
    Account(RuntimeAccount),
    /// Text that is not JSON, or JSON without a `__value__` object.
    Unreadable,
}

/// The account of a serialized runtime service: what cancelling needs of it.
pub struct RuntimeAccount {
    pub channel: Option<String>,
    pub token: Option<Secret>,
    pub instance: Option<String>,
}

impl std::fmt::Debug for RuntimeAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeAccount")
            .field("channel", &self.channel)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

/// Reads the `service` text the client sends (`json.dumps(service)` with the Qiskit encoder).
pub fn parse_service(text: Option<&str>) -> ServiceField {
    let Some(text) = text.map(str::trim).filter(|t| !t.is_empty()) else { return ServiceField::Absent };
    let Ok(value) = serde_json::from_str::<Value>(text) else { return ServiceField::Unreadable };
    let falsy = match &value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    };
    if falsy {
        return ServiceField::Absent;
    }
    let Some(account) = value.get("__value__").and_then(Value::as_object) else { return ServiceField::Unreadable };
    let text = |key: &str| account.get(key).and_then(Value::as_str).map(str::trim).filter(|v| !v.is_empty());
    ServiceField::Account(RuntimeAccount {
        channel: text("channel").map(str::to_string),
        token: text("token").map(|token| Secret::new(token.to_string())),
        instance: text("instance").map(str::to_string),
    })
}

/// One runtime job a job reported, with its session if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedRuntimeJob {
    pub job: String,
    pub session: Option<String>,
}

/// The client of the runtime service and of IAM, with Gantry's settings.
pub struct RuntimeService {
    upstream: Upstream,
    /// `--iam-url`, when set.
    iam_url: Option<String>,
    /// `--runtime-api-url`, when set, and the region its bare host serves.
    api_url: Option<String>,
    default_region: String,
    timeout: Duration,
}

/// Where a call for one instance goes.
#[derive(Debug, PartialEq, Eq)]
pub struct Addresses {
    pub token_url: String,
    /// The runtime API's `/api/v1`.
    pub api_url: String,
}

impl RuntimeService {
    pub fn new(
        iam_url: Option<String>,
        api_url: Option<String>,
        default_region: String,
        timeout: Duration,
    ) -> anyhow::Result<RuntimeService> {
        let set =
            |url: Option<String>| url.map(|u| u.trim().trim_end_matches('/').to_string()).filter(|u| !u.is_empty());
        Ok(RuntimeService {
            upstream: Upstream::new(timeout)?,
            iam_url: set(iam_url),
            api_url: set(api_url),
            default_region,
            timeout,
        })
    }

    /// IAM's token endpoint and the runtime API for the instance `crn`.
    pub fn addresses(&self, crn: &str) -> Addresses {
        let staging = crn.split(':').nth(2) == Some("staging");
        let iam = self.iam_url.as_deref().unwrap_or(if staging { STAGING_IAM_URL } else { IAM_URL });
        let api = match &self.api_url {
            Some(base) => runtime_api_base(base, &self.default_region, crn),
            None => {
                runtime_api_base(if staging { STAGING_RUNTIME_API_URL } else { RUNTIME_API_URL }, DEFAULT_REGION, crn)
            }
        };
        Addresses { token_url: format!("{iam}/identity/token"), api_url: format!("{api}/api/v1") }
    }

    /// Cancels each of `reported` (a session closed once for all its jobs) as `account`: one
    /// message part per runtime job or session, in the reference's words.
    pub async fn cancel(&self, account: &RuntimeAccount, reported: &[ReportedRuntimeJob]) -> Vec<String> {
        let deadline = Instant::now() + self.timeout;
        let caller = self.authorize(account, deadline).await;
        let mut parts = Vec::new();
        let mut sessions = HashSet::new();
        for entry in reported {
            let ReportedRuntimeJob { job, session } = entry;
            let caller = match &caller {
                Ok(caller) => caller,
                Err(problem) => {
                    parts.push(format!("Runtime job {job} could not be canceled. Exception: {problem}"));
                    continue;
                }
            };
            match self.call(caller, Method::GET, &format!("jobs/{}?exclude_params=true", segment(job)), deadline).await
            {
                Ok(status) if status.is_success() => {}
                Ok(StatusCode::NOT_FOUND) => {
                    parts.push(format!(
                        "Runtime job {job} not found in runtime service. Check that credentials used to authenticate match."
                    ));
                    continue;
                }
                Ok(status) => {
                    let problem = Problem::Status("the runtime service", status);
                    parts.push(format!("Runtime job {job} could not be canceled. Exception: {problem}"));
                    continue;
                }
                Err(problem) => {
                    parts.push(format!("Runtime job {job} could not be canceled. Exception: {problem}"));
                    continue;
                }
            }
            match session.as_deref().filter(|s| !s.is_empty()) {
                // Closing a session cancels its jobs: once per session, whatever the outcome.
                Some(session) => {
                    if !sessions.insert(session.to_string()) {
                        continue;
                    }
                    let path = format!("sessions/{}/close", segment(session));
                    parts.push(match self.call(caller, Method::DELETE, &path, deadline).await {
                        Ok(status) if status.is_success() => {
                            format!("Canceled runtime session: {session} and associated runtime jobs.")
                        }
                        Ok(status) => format!(
                            "Runtime session {session} could not be canceled. Exception: {}",
                            Problem::Status("the runtime service", status)
                        ),
                        Err(problem) => {
                            format!("Runtime session {session} could not be canceled. Exception: {problem}")
                        }
                    });
                }
                None => {
                    let path = format!("jobs/{}/cancel", segment(job));
                    parts.push(match self.call(caller, Method::POST, &path, deadline).await {
                        Ok(status) if status.is_success() => format!("Canceled runtime job [{job}]."),
                        Ok(StatusCode::CONFLICT) => {
                            format!("Runtime job {job} could not be canceled (invalid state).")
                        }
                        Ok(status) => format!(
                            "Runtime job {job} could not be canceled. Exception: {}",
                            Problem::Status("the runtime service", status)
                        ),
                        Err(problem) => format!("Runtime job {job} could not be canceled. Exception: {problem}"),
                    });
                }
            }
        }
        parts
    }

    /// The access token and instance the runtime API is asked with.
    async fn authorize(&self, account: &RuntimeAccount, deadline: Instant) -> Result<Authorized, Problem> {
        match account.channel.as_deref() {
            None | Some("ibm_quantum_platform" | "ibm_cloud") => {}
            Some(_) => return Err(Problem::Channel),
        }
        let token = account.token.as_ref().ok_or(Problem::Missing("token"))?;
        let crn = account.instance.clone().ok_or(Problem::Missing("instance"))?;
        let addresses = self.addresses(&crn);
        let fields = [("grant_type", "urn:ibm:params:oauth:grant-type:apikey"), ("apikey", token.expose())];
        let exchange = self.upstream.post_form(&addresses.token_url, &fields);
        let (status, body) = tokio::time::timeout_at(deadline, exchange)
            .await
            .map_err(|_| self.late("IAM"))?
            .map_err(|error| Problem::Upstream("IAM", error))?;
        if !status.is_success() {
            return Err(Problem::Status("IAM", status));
        }
        let answer: Value =
            serde_json::from_slice(&body).map_err(|_| Problem::Upstream("IAM", UpstreamError::Unreadable))?;
        let access_token = answer
            .get("access_token")
            .and_then(Value::as_str)
            .ok_or(Problem::Upstream("IAM", UpstreamError::Unreadable))?;
        Ok(Authorized { authorization: Secret::new(format!("Bearer {access_token}")), crn, api_url: addresses.api_url })
    }

    /// One call to the runtime API: its status.
    async fn call(
        &self,
        caller: &Authorized,
        method: Method,
        path: &str,
        deadline: Instant,
    ) -> Result<StatusCode, Problem> {
        let url = format!("{}/{path}", caller.api_url);
        let headers = [("Service-CRN", caller.crn.as_str())];
        let call = self.upstream.send(method, &url, caller.authorization.expose(), &headers);
        let (status, _) = tokio::time::timeout_at(deadline, call)
            .await
            .map_err(|_| self.late("the runtime service"))?
            .map_err(|error| Problem::Upstream("the runtime service", error))?;
        Ok(status)
    }

    fn late(&self, service: &'static str) -> Problem {
        Problem::Upstream(service, UpstreamError::Timeout(self.timeout.as_secs()))
    }
}

/// The runtime API as the caller.
struct Authorized {
    authorization: Secret,
    crn: String,
    api_url: String,
}

/// Why a runtime job or session could not be cancelled, in words that never carry the
/// credentials or an upstream body (they end up in the answer's message).
#[derive(Debug, thiserror::Error)]
enum Problem {
    #[error("the service's channel is not one of ibm_cloud, ibm_quantum_platform")]
    Channel,
    #[error("the service has no {0}")]
    Missing(&'static str),
    #[error("{0} answered {1}")]
    Status(&'static str, StatusCode),
    #[error("{0} {1}")]
    Upstream(&'static str, UpstreamError),
}

/// `text` as one URL path segment: everything but ASCII letters, digits, `-` and `_`
/// percent-encoded, so a reported id cannot reach another path.
fn segment(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CRN: &str = "crn:v1:bluemix:public:quantum-computing:us-east:a/acct:instance::";

    fn service(iam: Option<&str>, api: Option<&str>) -> RuntimeService {
        RuntimeService::new(iam.map(str::to_string), api.map(str::to_string), "us-east".into(), Duration::from_secs(5))
            .unwrap()
    }

    #[test]
    fn the_service_field_reads_as_the_reference_reads_it() {
        for absent in [None, Some(""), Some("null"), Some(" null "), Some("false"), Some("0"), Some("{}"), Some("\"\"")]
        {
            assert!(matches!(parse_service(absent), ServiceField::Absent), "{absent:?}");
        }
        for unreadable in ["not json", "{\"__type__\": \"QiskitRuntimeService\"}", "[1]", "{\"__value__\": 3}"] {
            assert!(matches!(parse_service(Some(unreadable)), ServiceField::Unreadable), "{unreadable}");
        }
        let text = r#"{"__type__": "QiskitRuntimeService", "__value__": {"channel": "ibm_cloud", "url": "https://elsewhere.example", "token": "key-1", "instance": "crn:x", "verify": true}}"#;
        let ServiceField::Account(account) = parse_service(Some(text)) else { panic!("an account") };
        assert_eq!(account.channel.as_deref(), Some("ibm_cloud"));
        assert_eq!(account.token.as_ref().map(Secret::expose), Some("key-1"));
        assert_eq!(account.instance.as_deref(), Some("crn:x"));
        assert!(!format!("{account:?}").contains("key-1"), "the key is never Debug-printed");
    }

    #[test]
    fn the_crn_picks_the_addresses_unless_settings_name_them() {
        let defaults = service(None, None);
        assert_eq!(
            defaults.addresses(CRN),
            Addresses {
                token_url: "https://iam.cloud.ibm.com/identity/token".into(),
                api_url: "https://quantum.cloud.ibm.com/api/v1".into()
            }
        );
        let eu = CRN.replace("us-east", "eu-de");
        assert_eq!(defaults.addresses(&eu).api_url, "https://eu-de.quantum.cloud.ibm.com/api/v1");
        let staging = CRN.replace("bluemix", "staging");
        assert_eq!(
            defaults.addresses(&staging),
            Addresses {
                token_url: "https://iam.test.cloud.ibm.com/identity/token".into(),
                api_url: "https://quantum.test.cloud.ibm.com/api/v1".into()
            }
        );
        let configured = service(Some("http://127.0.0.1:9/"), Some("http://127.0.0.1:8"));
        assert_eq!(
            configured.addresses(CRN),
            Addresses {
                token_url: "http://127.0.0.1:9/identity/token".into(),
                api_url: "http://127.0.0.1:8/api/v1".into()
            }
        );
    }

    #[test]
    fn reported_ids_stay_one_path_segment() {
        assert_eq!(segment("d1abc-23_x"), "d1abc-23_x");
        assert_eq!(segment("../../v2/x?y"), "%2E%2E%2F%2E%2E%2Fv2%2Fx%3Fy");
    }

    #[tokio::test]
    async fn an_account_without_what_cancelling_needs_names_what_is_missing() {
        let reported = [ReportedRuntimeJob { job: "rj".into(), session: None }];
        let account = RuntimeAccount { channel: Some("local".into()), token: None, instance: None };
        assert_eq!(
            service(None, None).cancel(&account, &reported).await,
            [
                "Runtime job rj could not be canceled. Exception: the service's channel is not one of ibm_cloud, ibm_quantum_platform"
            ]
        );
        let account = RuntimeAccount { channel: None, token: Some(Secret::new("k".into())), instance: None };
        assert_eq!(
            service(None, None).cancel(&account, &reported).await,
            ["Runtime job rj could not be canceled. Exception: the service has no instance"]
        );
    }
}
