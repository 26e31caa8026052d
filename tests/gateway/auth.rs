//! `custom_token` and `oidc` against fake token and identity services on loopback (axum),
//! with real RS256-signed JWTs: who the caller is, groups from the service, what is refused
//! and how, the cache (no second upstream call), a slow service that blocks nobody else, key
//! rotation, and an unreachable provider.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use clap::Parser;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

use crate::both_backends;
use crate::eventually::eventually;
use crate::harness::{Backend, Gateway};

both_backends!(
    custom_token_asks_the_token_service,
    oidc_verifies_the_providers_tokens,
    oidc_accepts_a_key_rotated_right_after_a_fetch,
    oidc_fetches_once_for_a_flood_of_unknown_key_ids,
    oidc_says_a_key_is_not_published_rather_than_blaming_the_token,
    runtime_platform_checks_keys_plans_and_channels,
    a_job_calls_back_as_its_caller_under_runtime_platform,
    the_runtime_api_replaces_group_rules_per_function,
    hand_added_members_of_provider_groups_gain_nothing
);

/// The fake services: a token endpoint (`/whoami`) and an OpenID provider (discovery, JWKS).
#[derive(Clone)]
struct Fake {
    base: String,
    calls: Arc<AtomicUsize>,
    jwks: Arc<Mutex<Value>>,
}

impl Fake {
    async fn start() -> Fake {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let fake = Fake { base, calls: Arc::default(), jwks: Arc::new(Mutex::new(jwks(&["a"]))) };
        let app = Router::new()
            .route("/whoami", get(whoami))
            .route("/identity/token", axum::routing::post(iam_token))
            .route(
                "/identity/keys",
                get(|State(fake): State<Fake>| async move {
                    fake.calls.fetch_add(1, Ordering::SeqCst);
                    axum::Json(fake.jwks.lock().unwrap().clone())
                }),
            )
            .route("/v2/groups", get(access_groups))
            .route("/v2/resource_instances/{crn}", get(resource_instance))
            .route("/api/v1/functions", get(runtime_functions))
            .route("/.well-known/openid-configuration", get(discovery))
            .route(
                "/jwks",
                get(|State(fake): State<Fake>| async move {
                    fake.calls.fetch_add(1, Ordering::SeqCst);
                    axum::Json(fake.jwks.lock().unwrap().clone())
                }),
            )
            .with_state(fake.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        fake
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

async fn whoami(State(fake): State<Fake>, headers: HeaderMap) -> (StatusCode, axum::Json<Value>) {
    fake.calls.fetch_add(1, Ordering::SeqCst);
    let token = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default();
    match token.strip_prefix("Bearer ").unwrap_or_default() {
        "carol-1" | "carol-2" => {
            (StatusCode::OK, axum::Json(json!({"user": {"id": "carol"}, "groups": ["team-a", "team-b"]})))
        }
        "dave" => (StatusCode::OK, axum::Json(json!({"user": {"id": "dave"}}))),
        "no-id" => (StatusCode::OK, axum::Json(json!({"user": {}}))),
        "broken" => (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(json!({"error": "boom"}))),
        "slow" => {
            tokio::time::sleep(Duration::from_secs(4)).await;
            (StatusCode::OK, axum::Json(json!({"user": {"id": "slowpoke"}})))
        }
        _ => (StatusCode::UNAUTHORIZED, axum::Json(json!({"error": "unknown token"}))),
    }
}

/// IAM's API key exchange: known keys get a signed access token.
async fn iam_token(
    State(fake): State<Fake>,
    axum::Form(form): axum::Form<std::collections::HashMap<String, String>>,
) -> (StatusCode, axum::Json<Value>) {
    fake.calls.fetch_add(1, Ordering::SeqCst);
    assert_eq!(form.get("grant_type").map(String::as_str), Some("urn:ibm:params:oauth:grant-type:apikey"));
    let claims = |iam_id: &str, expires: u64| json!({"iam_id": iam_id, "account": {"bss": "acct-1"}, "iat": now() - 5, "exp": expires, "sub": "x"});
    let token = match form.get("apikey").map(String::as_str).unwrap_or_default() {
        "key-alice" | "key-alice-2" => jwt("a", "a", claims("IBMid-alice", now() + 3600)),
        "key-bob" => jwt("a", "a", claims("IBMid-bob", now() + 3600)),
        "key-expired" => jwt("a", "a", claims("IBMid-alice", now() - 600)),
        "key-forged" => jwt("b", "a", claims("IBMid-alice", now() + 3600)),
        // IAM signing with a key it does not publish (yet).
        "key-unpublished" => jwt("b", "b", claims("IBMid-alice", now() + 3600)),
        "key-iam-down" => return (StatusCode::BAD_GATEWAY, axum::Json(json!({}))),
        _ => return (StatusCode::BAD_REQUEST, axum::Json(json!({"errorCode": "BXNIM0415E"}))),
    };
    (StatusCode::OK, axum::Json(json!({"access_token": token, "token_type": "Bearer", "expires_in": 3600})))
}

async fn access_groups(
    State(fake): State<Fake>,
    axum::extract::Query(query): axum::extract::Query<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
) -> (StatusCode, axum::Json<Value>) {
    fake.calls.fetch_add(1, Ordering::SeqCst);
    assert!(headers.get("authorization").unwrap().to_str().unwrap().starts_with("Bearer ey"));
    assert_eq!(query.get("account_id").map(String::as_str), Some("acct-1"));
    let groups = json!({"groups": [{"id": "AccessGroup-physics", "name": "physics"},
                                    {"id": "AccessGroup-public", "name": "Public Access"}]});
    (StatusCode::OK, axum::Json(groups))
}

const CRN_OK: &str = "crn:v1:bluemix:public:quantum-computing:us-east:a/acct-1:instance-ok::";
const CRN_FREE: &str = "crn:v1:bluemix:public:quantum-computing:us-east:a/acct-1:instance-free::";
/// Entitled instances the runtime API answers 204 (group rules) and 500 for.
const CRN_LEGACY: &str = "crn:v1:bluemix:public:quantum-computing:us-east:a/acct-1:instance-legacy::";
const CRN_BROKEN: &str = "crn:v1:bluemix:public:quantum-computing:us-east:a/acct-1:instance-broken::";

/// The runtime API: the functions and permissions of the instance in `Service-CRN`.
async fn runtime_functions(State(fake): State<Fake>, headers: HeaderMap) -> (StatusCode, axum::Json<Value>) {
    fake.calls.fetch_add(1, Ordering::SeqCst);
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    assert!(header("authorization").starts_with("apikey "), "the runtime API is asked with the API key");
    match header("service-crn").as_str() {
        CRN_OK => (
            StatusCode::OK,
            axum::Json(json!({
                "functions": [
                    {"provider": "acme", "name": "viewable", "permissions": ["function.read"], "business_model": "SUBSIDIZED"},
                    {"provider": "acme", "name": "runnable", "business_model": "TRIAL",
                     "permissions": ["function.read", "function.run", "function-files.read", "function-job.read"]},
                    {"provider": "acme", "permissions": ["function.run"]}
                ],
                "custom_functions": {"permissions": ["function-custom.write"]}
            })),
        ),
        CRN_LEGACY => (StatusCode::NO_CONTENT, axum::Json(Value::Null)),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(json!({"error": "boom"}))),
    }
}

async fn resource_instance(
    State(fake): State<Fake>,
    axum::extract::Path(crn): axum::extract::Path<String>,
) -> (StatusCode, axum::Json<Value>) {
    fake.calls.fetch_add(1, Ordering::SeqCst);
    match crn.as_str() {
        CRN_OK => (StatusCode::OK, axum::Json(json!({"crn": crn, "resource_plan_id": "plan-premium"}))),
        CRN_FREE => (StatusCode::OK, axum::Json(json!({"crn": crn, "resource_plan_id": "internal-plan-lite-7"}))),
        CRN_LEGACY | CRN_BROKEN => {
            (StatusCode::OK, axum::Json(json!({"crn": crn, "resource_plan_id": "plan-premium"})))
        }
        _ => (StatusCode::NOT_FOUND, axum::Json(json!({"message": "not found"}))),
    }
}

async fn discovery(State(fake): State<Fake>) -> axum::Json<Value> {
    axum::Json(json!({"issuer": fake.base, "jwks_uri": format!("{}/jwks", fake.base)}))
}

fn key_file(name: &str, extension: &str) -> Vec<u8> {
    std::fs::read(format!("{}/tests/gateway/keys/oidc-test-{name}.{extension}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// The public keys `names` as a JWKS, each with its name as key id.
fn jwks(names: &[&str]) -> Value {
    let keys: Vec<Value> = names
        .iter()
        .map(|name| {
            let modulus = String::from_utf8(key_file(name, "n")).unwrap();
            json!({"kty": "RSA", "kid": name, "use": "sig", "alg": "RS256", "n": modulus.trim(), "e": "AQAB"})
        })
        .collect();
    json!({"keys": keys})
}

/// A JWT signed with the private key `signer`, naming `kid` in its header.
fn jwt(signer: &str, kid: &str, claims: Value) -> String {
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some(kid.into());
    jsonwebtoken::encode(&header, &claims, &EncodingKey::from_rsa_pem(&key_file(signer, "pem")).unwrap()).unwrap()
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

/// The authenticator the command line `words` configures, as `gantry serve` would build it.
fn authenticator(words: &[&str]) -> Arc<gantry::auth::Authenticator> {
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        auth: gantry::auth::AuthArgs,
    }
    let cli = Cli::try_parse_from(std::iter::once("gantry").chain(words.iter().copied())).unwrap();
    Arc::new(cli.auth.authenticator().unwrap())
}

/// runtime_platform against the fakes (IAM and resource controller), entitled plan
/// `plan-premium`, then `extra`.
fn platform_settings<'a>(fake: &'a Fake, extra: &[&'a str]) -> Vec<&'a str> {
    let mut words = vec![
        "--auth-mechanism",
        "runtime_platform",
        "--iam-url",
        &fake.base,
        "--resource-controller-url",
        &fake.base,
        "--resource-plans-allowed",
        "plan-standard,plan-premium",
    ];
    words.extend_from_slice(extra);
    words
}

async fn groups_of(gateway: &Gateway, username: &str) -> Vec<String> {
    let user = gantry::db::users::find_by_username(&gateway.state.db, username).await.unwrap().unwrap();
    gantry::db::users::group_names(&gateway.state.db, &user.id).await.unwrap()
}

async fn custom_token_asks_the_token_service(backend: Backend) {
    let fake = Fake::start().await;
    let mut gateway = Gateway::start(backend).await;
    let url = format!("{}/whoami", fake.base);
    gateway.state.auth = authenticator(&[
        "--auth-mechanism",
        "custom_token",
        "--custom-token-url",
        &url,
        "--custom-token-user-field",
        "user.id",
        "--custom-token-groups-field",
        "groups",
        "--auth-timeout-seconds",
        "2",
    ]);
    let jobs = "/api/v1/jobs/";

    // The service names the user and their groups; the user's groups become exactly those,
    // but for provider admin groups, which `gantry admin` manages.
    gateway.provider("acme", None, "carol").await;
    gateway.admin(gantry::admin::AdminCommand::AddMember { group: "old-team".into(), user: "carol".into() }).await;
    let reply = gateway.get(jobs, "carol-1").await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    let admin_group = gantry::db::providers::admin_group_name("acme");
    let mut expected = vec![admin_group, "team-a".to_string(), "team-b".to_string()];
    expected.sort();
    assert_eq!(groups_of(&gateway, "carol").await, expected);
    assert_eq!(fake.calls(), 1);
    // The verdict is cached: no second call for the same token; another token is asked.
    assert_eq!(gateway.get(jobs, "carol-1").await.status, 200);
    assert_eq!(fake.calls(), 1);
    assert_eq!(gateway.get(jobs, "carol-2").await.status, 200);
    assert_eq!(fake.calls(), 2);

    // Refused tokens, and a service failing: 401 with a message saying which.
    let reply = gateway.get(jobs, "mallory").await;
    assert_eq!(
        (reply.status.as_u16(), reply.json.clone()),
        (401, json!({"detail": "Authorization token is not valid."}))
    );
    let reply = gateway.get(jobs, "broken").await;
    assert_eq!(reply.status, 401);
    let detail = reply.json["detail"].as_str().unwrap();
    assert!(detail.contains("the token service answered 500 Internal Server Error"), "{detail}");
    let reply = gateway.get(jobs, "no-id").await;
    assert_eq!(reply.status, 401);
    assert!(reply.json["detail"].as_str().unwrap().contains("no user id at 'user.id'"), "{}", reply.json);

    // A slow service times out, and meanwhile other callers are served.
    let slow = {
        let gateway_state = gateway.state.clone();
        tokio::spawn(async move {
            let request = axum::http::Request::get(jobs)
                .header("authorization", "Bearer slow")
                .body(axum::body::Body::empty())
                .unwrap();
            let response = tower::ServiceExt::oneshot(gantry::api::app(gateway_state), request).await.unwrap();
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
            (status, String::from_utf8_lossy(&body).into_owned())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(gateway.get(jobs, "dave").await.status, 200);
    assert!(!slow.is_finished(), "the slow service's answer should still be awaited");
    let (status, body) = slow.await.unwrap();
    assert_eq!(status, 401);
    assert!(body.contains("the token service did not answer within 2 s"), "{body}");
    // Without a groups field in the answer, the user's groups are none.
    assert!(groups_of(&gateway, "dave").await.is_empty());

    // A deactivated user is refused even with a cached verdict.
    gantry::db::users::set_active(&gateway.state.db, "carol", false).await.unwrap();
    let reply = gateway.get(jobs, "carol-1").await;
    assert_eq!(
        (reply.status.as_u16(), reply.json),
        (401, json!({"detail": "Your user was deactivated. Please contact IBM support for reactivation."}))
    );
}

async fn oidc_verifies_the_providers_tokens(backend: Backend) {
    let fake = Fake::start().await;
    let mut gateway = Gateway::start(backend).await;
    let args = [
        "--auth-mechanism",
        "oidc",
        "--oidc-issuer",
        &fake.base,
        "--oidc-audience",
        "gantry",
        "--oidc-user-claim",
        "preferred_username",
        "--oidc-groups-claim",
        "groups",
        "--oidc-key-refresh-seconds",
        "0",
    ];
    gateway.state.auth = authenticator(&args);
    let jobs = "/api/v1/jobs/";
    let claims = |user: &str, audience: &str, expires: u64| {
        json!({"iss": fake.base, "aud": audience, "exp": expires, "iat": now(), "sub": "0001",
               "preferred_username": user, "groups": ["physics"]})
    };
    let invalid = json!({"detail": "Authorization token is not valid."});

    let token = jwt("a", "a", claims("erin", "gantry", now() + 300));
    let reply = gateway.get(jobs, &token).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(groups_of(&gateway, "erin").await, ["physics"]);
    let fetched = fake.calls();
    assert_eq!(gateway.get(jobs, &token).await.status, 200);
    assert_eq!(fake.calls(), fetched, "a known token and key need no call");

    for (what, token) in [
        ("expired", jwt("a", "a", claims("erin", "gantry", now() - 120))),
        ("another audience", jwt("a", "a", claims("erin", "other-app", now() + 300))),
        ("signed with another key", jwt("b", "a", claims("erin", "gantry", now() + 300))),
        (
            "another issuer",
            jwt(
                "a",
                "a",
                json!({"iss": "https://elsewhere", "aud": "gantry", "exp": now() + 300, "preferred_username": "erin"}),
            ),
        ),
        ("not a JWT", "erin".to_string()),
    ] {
        let reply = gateway.get(jobs, &token).await;
        assert_eq!((reply.status.as_u16(), &reply.json), (401, &invalid), "{what}");
    }

    // The provider rotates to key b: a token signed with it makes the keys be fetched again.
    *fake.jwks.lock().unwrap() = jwks(&["b"]);
    let rotated = jwt("b", "b", claims("frank", "gantry", now() + 300));
    assert_eq!(gateway.get(jobs, &rotated).await.status, 200);
    assert!(fake.calls() > fetched);

    // A provider that cannot be reached: 401 saying so, never a 500.
    let closed = format!("http://127.0.0.1:{}", crate::e2e_kubernetes::free_port());
    let mut unreachable = args.to_vec();
    unreachable[3] = &closed;
    gateway.state.auth = authenticator(&unreachable);
    let reply = gateway.get(jobs, &jwt("a", "a", claims("erin", "gantry", now() + 300))).await;
    assert_eq!(reply.status, 401);
    assert!(
        reply.json["detail"].as_str().unwrap().contains("the identity provider could not be reached"),
        "{}",
        reply.json
    );
}

/// `oidc` against the fake provider with the default limit on key fetches (10 s).
fn default_oidc(fake: &Fake) -> Arc<gantry::auth::Authenticator> {
    authenticator(&["--auth-mechanism", "oidc", "--oidc-issuer", &fake.base, "--oidc-audience", "gantry"])
}

/// The claims of a valid token for `user`.
fn oidc_claims(fake: &Fake, user: &str) -> Value {
    json!({"iss": fake.base, "aud": "gantry", "exp": now() + 300, "iat": now(), "sub": user})
}

/// The provider rotates its keys a moment after Gantry fetched them: the first token signed
/// with the new key is accepted at once, for one more fetch.
async fn oidc_accepts_a_key_rotated_right_after_a_fetch(backend: Backend) {
    let fake = Fake::start().await;
    let mut gateway = Gateway::start(backend).await;
    gateway.state.auth = default_oidc(&fake);
    let jobs = "/api/v1/jobs/";
    assert_eq!(gateway.get(jobs, &jwt("a", "a", oidc_claims(&fake, "grace"))).await.status, 200);
    assert_eq!(fake.calls(), 1);

    *fake.jwks.lock().unwrap() = jwks(&["b"]);
    let reply = gateway.get(jobs, &jwt("b", "b", oidc_claims(&fake, "heidi"))).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(fake.calls(), 2, "the rotation costs one fetch");
    assert_eq!(gateway.get(jobs, &jwt("b", "b", oidc_claims(&fake, "ivan"))).await.status, 200);
    assert_eq!(fake.calls(), 2, "the new key is known from then on");
}

/// Tokens naming made-up key ids, all within the limit's window: the first is checked against
/// freshly fetched keys (it could be a rotation), the others make no fetch.
async fn oidc_fetches_once_for_a_flood_of_unknown_key_ids(backend: Backend) {
    let fake = Fake::start().await;
    let mut gateway = Gateway::start(backend).await;
    gateway.state.auth = default_oidc(&fake);
    let jobs = "/api/v1/jobs/";
    assert_eq!(gateway.get(jobs, &jwt("a", "a", oidc_claims(&fake, "grace"))).await.status, 200);
    assert_eq!(fake.calls(), 1);

    // Twenty at once, then ten one after the other.
    let forged: Vec<String> =
        (0..30).map(|i| jwt("a", &format!("forged-{i}"), oidc_claims(&fake, "mallory"))).collect();
    let mut replies = futures::future::join_all(forged[..20].iter().map(|token| gateway.get(jobs, token))).await;
    for token in &forged[20..] {
        replies.push(gateway.get(jobs, token).await);
    }
    for reply in replies {
        assert_eq!(reply.status, 401, "{}", reply.json);
        assert!(reply.json["detail"].as_str().unwrap().contains("is not among the keys"), "{}", reply.json);
    }
    assert_eq!(fake.calls(), 2, "a flood of unknown key ids makes one fetch");
    // Known keys still work meanwhile, without a fetch.
    assert_eq!(gateway.get(jobs, &jwt("a", "a", oidc_claims(&fake, "grace"))).await.status, 200);
    assert_eq!(fake.calls(), 2);
}

/// A token signed with a key the provider does not publish, even once its keys are fetched
/// again: the answer says so (a rotation in progress, not the caller's token at fault).
async fn oidc_says_a_key_is_not_published_rather_than_blaming_the_token(backend: Backend) {
    let fake = Fake::start().await;
    let mut gateway = Gateway::start(backend).await;
    gateway.state.auth = default_oidc(&fake);
    let jobs = "/api/v1/jobs/";
    assert_eq!(gateway.get(jobs, &jwt("a", "a", oidc_claims(&fake, "grace"))).await.status, 200);

    let reply = gateway.get(jobs, &jwt("b", "b", oidc_claims(&fake, "heidi"))).await;
    let expected = gantry::auth::jwks::unpublished_key_message("b", "the identity provider");
    assert_eq!((reply.status.as_u16(), &reply.json), (401, &json!({"detail": expected})));
    assert!(expected.contains("key 'b', which is not among the keys the identity provider publishes"), "{expected}");
    assert!(expected.contains("rotating its keys"), "{expected}");
    assert_eq!(fake.calls(), 2, "the keys were fetched again before answering");
}

/// A request as the client sends it: the API key as bearer token, and its channel and instance
/// headers when it has them.
fn client_request(
    method: &str,
    uri: &str,
    key: &str,
    channel: Option<&str>,
    crn: Option<&str>,
) -> axum::http::request::Builder {
    let mut request =
        axum::http::Request::builder().method(method).uri(uri).header("authorization", format!("Bearer {key}"));
    if let Some(channel) = channel {
        request = request.header("service-channel", channel);
    }
    if let Some(crn) = crn {
        request = request.header("service-crn", crn);
    }
    request
}

/// `GET jobs/` as the client `key` on `channel` with the instance `crn`.
async fn platform_get(gateway: &Gateway, key: &str, channel: Option<&str>, crn: Option<&str>) -> (u16, Value) {
    let request = client_request("GET", "/api/v1/jobs/", key, channel, crn);
    let reply = gateway.send(request.body(axum::body::Body::empty()).unwrap()).await;
    (reply.status.as_u16(), reply.json)
}

async fn runtime_platform_checks_keys_plans_and_channels(backend: Backend) {
    use gantry::auth::platform::{IAM_PROBLEM, NOT_AUTHENTICATED, NOT_ENTITLED, REVIEW_CRN, WRONG_CHANNEL};
    let fake = Fake::start().await;
    let mut gateway = Gateway::start(backend).await;
    gateway.state.auth = authenticator(&platform_settings(&fake, &["--mock-token", "awesome_token"]));
    let detail = |text: &str| json!({"detail": text});
    let platform = Some("ibm_quantum_platform");

    // A valid key on an entitled instance: the user is the IAM id, the groups the account's
    // access groups but Public Access.
    assert_eq!(platform_get(&gateway, "key-alice", platform, Some(CRN_OK)).await.0, 200);
    assert_eq!(groups_of(&gateway, "IBMid-alice").await, ["AccessGroup-physics"]);
    // Cached: the same key and instance make no upstream call; no channel header with a CRN
    // is the quantum platform, and ibm_cloud is accepted too.
    let calls = fake.calls();
    assert_eq!(platform_get(&gateway, "key-alice", None, Some(CRN_OK)).await.0, 200);
    assert_eq!(platform_get(&gateway, "key-alice", Some("ibm_cloud"), Some(CRN_OK)).await.0, 200);
    assert_eq!(fake.calls(), calls);
    // Another key is exchanged again.
    assert_eq!(platform_get(&gateway, "key-alice-2", platform, Some(CRN_OK)).await.0, 200);
    assert!(fake.calls() > calls);

    // Each refusal with the reference's message.
    assert_eq!(
        platform_get(&gateway, "key-alice", Some("ibm_quantum"), Some(CRN_OK)).await,
        (401, detail(WRONG_CHANNEL))
    );
    let (status, body) = platform_get(&gateway, "key-alice", platform, Some(CRN_FREE)).await;
    assert_eq!((status, &body), (401, &detail(NOT_ENTITLED)));
    assert!(!body.to_string().contains("internal-plan-lite-7"), "no internal plan id is revealed");
    let unknown = "crn:v1:bluemix:public:quantum-computing:eu-de:a/acct-1:nope::";
    assert_eq!(platform_get(&gateway, "key-alice", platform, Some(unknown)).await, (401, detail(REVIEW_CRN)));
    assert_eq!(platform_get(&gateway, "key-bob", platform, None).await, (401, detail(REVIEW_CRN)));
    for key in ["key-unknown", "key-expired", "key-forged"] {
        assert_eq!(
            platform_get(&gateway, key, platform, Some(CRN_OK)).await,
            (401, detail(NOT_AUTHENTICATED)),
            "{key}"
        );
    }
    assert_eq!(platform_get(&gateway, "key-iam-down", platform, Some(CRN_OK)).await, (401, detail(IAM_PROBLEM)));
    // IAM's token signed with a key IAM does not publish, even once its keys are fetched again
    // (at once, although they were fetched moments ago): said so, not blamed on the API key.
    let calls = fake.calls();
    assert_eq!(
        platform_get(&gateway, "key-unpublished", platform, Some(CRN_OK)).await,
        (401, detail(&gantry::auth::jwks::unpublished_key_message("b", "IAM")))
    );
    assert_eq!(fake.calls(), calls + 2, "the key exchange and one fetch of the keys");

    // The local channel is the reference's mock check: the mock token is the user mockuser.
    assert_eq!(platform_get(&gateway, "awesome_token", Some("local"), None).await.0, 200);
    assert!(gantry::db::users::find_by_username(&gateway.state.db, "mockuser").await.unwrap().is_some());
    let invalid = detail("Authorization token is not valid.");
    assert_eq!(platform_get(&gateway, "key-alice", Some("local"), None).await, (401, invalid));

    // A deactivated user is refused.
    gantry::db::users::set_active(&gateway.state.db, "IBMid-alice", false).await.unwrap();
    assert_eq!(
        platform_get(&gateway, "key-alice", platform, Some(CRN_OK)).await,
        (401, detail("Your user was deactivated. Please contact IBM support for reactivation."))
    );
}

/// Sends `method uri` as a client on the quantum platform channel with instance `CRN_OK`.
async fn as_platform_client(
    gateway: &Gateway,
    method: &str,
    uri: &str,
    key: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> crate::harness::Reply {
    let mut request = client_request(method, uri, key, Some("ibm_quantum_platform"), Some(CRN_OK));
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    gateway.send(request.body(axum::body::Body::from(body)).unwrap()).await
}

/// The job's own calls back (the real client's `update_status`) carry the caller's channel and
/// instance, so they authenticate under runtime_platform as the caller.
async fn a_job_calls_back_as_its_caller_under_runtime_platform(backend: Backend) {
    let fake = Fake::start().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let mut gateway = Gateway::start(backend).await.with_runner(|config| config.gateway_host = url.clone()).await;
    gateway.state.auth = authenticator(&platform_settings(&fake, &[]));
    tokio::spawn(gantry::ops::serve_http(
        listener,
        gateway.state.clone(),
        None,
        gantry::ops::ConnectionArgs::default().limits(),
        std::future::pending(),
    ));

    let main = b"from qiskit_serverless import save_result, update_status\n\
save_result({\"updated\": bool(update_status(\"MAPPING\"))})\n";
    let artifact = crate::harness::tar_of(&[("main.py", main)]);
    let (content_type, body) = crate::harness::multipart(
        &[("title", "calls-back"), ("entrypoint", "main.py")],
        &[("artifact", "artifact.tar", &artifact)],
    );
    let uploaded =
        as_platform_client(&gateway, "POST", "/api/v1/programs/upload/", "key-alice", Some(&content_type), body).await;
    assert_eq!(uploaded.status, 200, "{}", uploaded.json);
    let run = json!({"title": "calls-back", "arguments": "{}", "config": {}}).to_string().into_bytes();
    let ran =
        as_platform_client(&gateway, "POST", "/api/v1/programs/run/", "key-alice", Some("application/json"), run).await;
    assert_eq!(ran.status, 200, "{}", ran.json);
    let job_id = ran.json["id"].as_str().unwrap().to_string();
    let job = eventually("the job finished", Duration::from_secs(60), || async {
        let job =
            as_platform_client(&gateway, "GET", &format!("/api/v1/jobs/{job_id}/"), "key-alice", None, Vec::new())
                .await
                .json;
        if matches!(job["status"].as_str(), Some("SUCCEEDED" | "FAILED" | "STOPPED")) { Ok(job) } else { Err(job) }
    })
    .await;
    assert_eq!(job["status"], "SUCCEEDED", "{job}");
    let result: Value = serde_json::from_str(job["result"].as_str().unwrap_or("{}")).unwrap_or_default();
    assert_eq!(result, json!({"updated": true}), "the job's update_status call was refused: {job}");
}

/// The real client (`tests/e2e/client_platform.py`) against a `gantry serve` process with
/// runtime_platform, IAM and the resource controller faked here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by tests/run.sh: needs GANTRY_TEST_PYTHON and the built client"]
async fn the_real_client_authenticates_with_runtime_platform() {
    let python = std::env::var("GANTRY_TEST_PYTHON").expect("GANTRY_TEST_PYTHON: a Python with qiskit-serverless");
    let fake = Fake::start().await;
    let folder = tempfile::tempdir().unwrap();
    let port = crate::e2e_kubernetes::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let log = folder.path().join("serve.log");
    let data = folder.path().join("data").display().to_string();
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec!["serve", "--listen", &listen, "--data-dir", &data, "--python", &python];
    args.extend(platform_settings(&fake, &[]));
    let args: Vec<String> = args.into_iter().map(str::to_string).collect();
    let mut serve = crate::e2e_kubernetes::spawn_role(&args, &[], &log);
    crate::e2e_kubernetes::wait_until_ready(&url, &mut [(&mut serve, &log)]).await;
    crate::e2e_kubernetes::run_client_checks(
        &python,
        &["tests/e2e/client_platform.py", &url, "key-alice", CRN_OK, CRN_FREE],
        &[("gantry serve", &log)],
    )
    .await;
    let _ = serve.kill().await;
}

/// `path` as the platform client `key` with the instance `crn`.
async fn platform_call(gateway: &Gateway, method: &str, path: &str, crn: &str, body: Option<Value>) -> (u16, Value) {
    let mut request = client_request(method, path, "key-alice", Some("ibm_quantum_platform"), Some(crn));
    let body = match body {
        Some(body) => {
            request = request.header("content-type", "application/json");
            axum::body::Body::from(body.to_string())
        }
        None => axum::body::Body::empty(),
    };
    let reply = gateway.send(request.body(body).unwrap()).await;
    (reply.status.as_u16(), reply.json)
}

/// Runtime-instances mode: the runtime API's per-function permissions decide, not the groups;
/// its 204 keeps the group rules; its failure is a 401 with the reference's message.
async fn the_runtime_api_replaces_group_rules_per_function(backend: Backend) {
    use gantry::auth::platform::RUNTIME_UNAVAILABLE;
    let fake = Fake::start().await;
    let mut gateway = Gateway::start(backend).await;
    // The provider's functions, uploaded with the default mock_token authentication.
    gateway.provider("acme", None, "acme-admin").await;
    for title in ["viewable", "runnable", "hidden"] {
        let reply = gateway
            .upload_function("acme-admin", &[("title", title), ("provider", "acme"), ("entrypoint", "main.py")])
            .await;
        assert_eq!(reply.status, 200, "{}", reply.json);
    }
    gateway.state.auth = authenticator(&platform_settings(&fake, &["--runtime-api-url", &fake.base]));
    let titles = |list: &Value| {
        let mut titles: Vec<String> =
            list.as_array().unwrap().iter().map(|f| f["title"].as_str().unwrap().to_string()).collect();
        titles.sort();
        titles
    };

    // Listing and reading follow function.read.
    let (status, list) = platform_call(&gateway, "GET", "/api/v1/programs/", CRN_OK, None).await;
    assert_eq!((status, titles(&list)), (200, vec!["runnable".to_string(), "viewable".to_string()]));
    let (_, catalog) = platform_call(&gateway, "GET", "/api/v1/programs/?filter=catalog", CRN_OK, None).await;
    assert_eq!(titles(&catalog), ["runnable", "viewable"]);
    let by_title = |title: &str| format!("/api/v1/programs/get_by_title/{title}/?provider=acme");
    assert_eq!(platform_call(&gateway, "GET", &by_title("viewable"), CRN_OK, None).await.0, 200);
    assert_eq!(platform_call(&gateway, "GET", &by_title("hidden"), CRN_OK, None).await.0, 404);
    // Running follows function.run.
    let run = |title: &str| json!({"title": title, "provider": "acme", "arguments": "{}", "config": {}});
    assert_eq!(platform_call(&gateway, "POST", "/api/v1/programs/run/", CRN_OK, Some(run("viewable"))).await.0, 404);
    let (status, job) = platform_call(&gateway, "POST", "/api/v1/programs/run/", CRN_OK, Some(run("runnable"))).await;
    assert_eq!(status, 200, "{job}");
    // Its access entry's business model is TRIAL: the job runs as a trial (ENV_ACCESS_TRIAL).
    let row = gantry::db::jobs::launch(&gateway.state.db, job["id"].as_str().unwrap()).await.unwrap().unwrap().info;
    assert!(row.trial, "the job records that it is a trial");
    // User files follow function-files.read / .write.
    let files = |title: &str| format!("/api/v1/files/?function={title}&provider=acme");
    assert_eq!(platform_call(&gateway, "GET", &files("runnable"), CRN_OK, None).await.0, 200);
    assert_eq!(platform_call(&gateway, "GET", &files("viewable"), CRN_OK, None).await.0, 404);
    let delete = "/api/v1/files/delete/?function=runnable&provider=acme&file=x.txt";
    assert_eq!(platform_call(&gateway, "DELETE", delete, CRN_OK, None).await.0, 404);
    // Provider operations follow their own permissions: jobs of every author, not provider files.
    assert_eq!(
        platform_call(&gateway, "GET", "/api/v1/jobs/provider/?provider=acme&function=runnable", CRN_OK, None).await.0,
        200
    );
    // get_jobs too: the instance's permission, not a relation in the database, makes it the
    // provider side (every author's jobs, without their results).
    let (_, runnable) = platform_call(&gateway, "GET", &by_title("runnable"), CRN_OK, None).await;
    let of_runnable = format!("/api/v1/programs/{}/get_jobs/", runnable["id"].as_str().unwrap());
    let (status, jobs) = platform_call(&gateway, "GET", &of_runnable, CRN_OK, None).await;
    assert_eq!((status, jobs.as_array().map(Vec::len)), (200, Some(1)), "{jobs}");
    assert!(jobs[0].get("result").is_none(), "listed as the provider side: {jobs}");
    let provider_files = "/api/v1/files/provider/?function=runnable&provider=acme";
    assert_eq!(platform_call(&gateway, "GET", provider_files, CRN_OK, None).await.0, 404);
    // The runtime API is asked once per key and instance while its answer is cached.
    let calls = fake.calls();
    assert_eq!(platform_call(&gateway, "GET", "/api/v1/programs/", CRN_OK, None).await.0, 200);
    assert_eq!(fake.calls(), calls);

    // 204: the group rules: alice has no grant, so the provider's functions are hidden.
    let (status, list) = platform_call(&gateway, "GET", "/api/v1/programs/", CRN_LEGACY, None).await;
    assert_eq!((status, titles(&list)), (200, Vec::<String>::new()));
    gateway.grant_run("acme", "hidden", "AccessGroup-physics").await;
    let (_, list) = platform_call(&gateway, "GET", "/api/v1/programs/", CRN_LEGACY, None).await;
    assert_eq!(titles(&list), ["hidden"]);

    // The runtime API failing: 401 with the reference's message, never a 500.
    assert_eq!(
        platform_call(&gateway, "GET", "/api/v1/programs/", CRN_BROKEN, None).await,
        (401, json!({"detail": RUNTIME_UNAVAILABLE}))
    );
}

/// Titles of the functions `GET programs/` lists in `reply`.
fn listed(reply: &crate::harness::Reply) -> Vec<String> {
    let list = reply.json.as_array().unwrap_or_else(|| panic!("{}", reply.json));
    list.iter().map(|f| f["title"].as_str().unwrap().to_string()).collect()
}

/// Groups from an identity provider are exact on every request: a membership added by hand
/// (`gantry admin add-member`) to a group of a user whose groups the provider sets grants
/// nothing, not even in the moment before servers are told of the change and while the user
/// and the verdict are kept in memory; provider admin groups still count.
async fn hand_added_members_of_provider_groups_gain_nothing(backend: Backend) {
    use gantry::admin::AdminCommand::AddMember;
    let fake = Fake::start().await;
    let mut gateway = Gateway::start(backend).await;
    gateway.provider("acme", None, "acme-admin").await;
    let reply = gateway
        .upload_function("acme-admin", &[("title", "tool"), ("provider", "acme"), ("entrypoint", "main.py")])
        .await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    gateway.grant_run("acme", "tool", "team-c").await;
    gateway.grant_run("acme", "tool", "AccessGroup-chem").await;
    let programs = "/api/v1/programs/";
    let by_title = "/api/v1/programs/get_by_title/tool/?provider=acme";

    // custom_token with a groups field: carol's groups are team-a and team-b.
    let url = format!("{}/whoami", fake.base);
    gateway.state.auth = authenticator(&[
        "--auth-mechanism",
        "custom_token",
        "--custom-token-url",
        &url,
        "--custom-token-user-field",
        "user.id",
        "--custom-token-groups-field",
        "groups",
    ]);
    let follower = gantry::api::state::follow_changes(
        &gateway.state.db,
        &gateway.state.auth,
        &gateway.state.functions,
        &gateway.state.budgets,
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(listed(&gateway.get(programs, "carol-1").await).is_empty());
    gateway.admin(AddMember { group: "team-c".into(), user: "carol".into() }).await;
    // At once, with carol and her verdict in memory, and after every server was told.
    assert!(listed(&gateway.get(programs, "carol-1").await).is_empty(), "a hand-added member sees the function");
    assert_eq!(gateway.get(by_title, "carol-1").await.status, 404);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(listed(&gateway.get(programs, "carol-1").await).is_empty());
    assert_eq!(gateway.get(by_title, "carol-1").await.status, 404);
    // A group the provider names does grant, and a provider admin group added by hand counts.
    gateway.grant_run("acme", "tool", "team-a").await;
    assert_eq!(listed(&gateway.get(programs, "carol-1").await), ["tool"]);
    follower.abort();

    // runtime_platform: bob's groups are the account's IAM access groups (AccessGroup-physics).
    gateway.state.auth = authenticator(&platform_settings(&fake, &[]));
    let follower = gantry::api::state::follow_changes(
        &gateway.state.db,
        &gateway.state.auth,
        &gateway.state.functions,
        &gateway.state.budgets,
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let get = |path: &'static str| platform_call(&gateway, "GET", path, CRN_LEGACY, None);
    let (status, list) = get(programs).await;
    assert_eq!((status, list), (200, json!([])));
    gateway.admin(AddMember { group: "AccessGroup-chem".into(), user: "IBMid-alice".into() }).await;
    let (status, list) = get(programs).await;
    assert_eq!((status, list), (200, json!([])), "a hand-added member of an IAM group sees the function");
    assert_eq!(get(by_title).await.0, 404);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(get(programs).await.1, json!([]));
    gateway.admin(gantry::admin::AdminCommand::AddAdmin { provider: "acme".into(), user: "IBMid-alice".into() }).await;
    let (_, list) = get(programs).await;
    assert_eq!(list.as_array().map(Vec::len), Some(1), "provider admins are gantry admin's: {list}");
    follower.abort();
}
