//! `custom_token`: the bearer token is checked by an external HTTP endpoint of the operator's
//! choosing. Gantry sends `GET <url>` with `Authorization: Bearer <token>`; a 200 answer is a
//! JSON object naming the user (and optionally their groups) at configurable fields; 401, 403
//! and 404 mean the token is not valid; anything else is the service failing.

use hyper::StatusCode;
use serde_json::Value;

use super::identity::{Identity, Rejection, field};
use super::upstream::{Upstream, UpstreamError};

#[derive(Clone)]
pub struct CustomToken {
    pub url: String,
    /// Where the user's id is in the answer (dotted path, e.g. `user.id`).
    pub user_field: String,
    /// Where the user's groups are (a list of names), if the service tells them.
    pub groups_field: Option<String>,
    pub upstream: Upstream,
}

impl CustomToken {
    pub async fn verify(&self, token: &str) -> Result<Identity, Rejection> {
        let unavailable = |error: UpstreamError| {
            Rejection::Unavailable(format!(
                "We couldn't verify your token at this time: the token service {error}. Please try again later."
            ))
        };
        let (status, body) =
            self.upstream.get(&self.url, Some(&format!("Bearer {token}"))).await.map_err(unavailable)?;
        match status {
            StatusCode::OK => {}
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::NOT_FOUND => return Err(Rejection::Invalid),
            status => return Err(unavailable(UpstreamError::Status(status))),
        }
        let answer: Value = serde_json::from_slice(&body).map_err(|_| unavailable(UpstreamError::Unreadable))?;
        Identity::from_claims(&answer, &self.user_field, self.groups_field.as_deref(), "the token service's answer")
            .map_err(Rejection::Unavailable)
    }
}

impl Identity {
    /// The user at `user_field` and the groups at `groups_field` of a JSON object (a token
    /// service's answer, a JWT's claims). A number is accepted as an id; groups may be a list of
    /// names or one name.
    pub fn from_claims(
        claims: &Value,
        user_field: &str,
        groups_field: Option<&str>,
        source: &str,
    ) -> Result<Identity, String> {
        let username = match field(claims, user_field) {
            Some(Value::String(name)) if !name.is_empty() => name.clone(),
            Some(Value::Number(number)) => number.to_string(),
            _ => return Err(format!("{source} has no user id at '{user_field}'.")),
        };
        let groups = groups_field.map(|path| match field(claims, path) {
            Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).map(str::to_string).collect(),
            Some(Value::String(one)) => vec![one.clone()],
            _ => Vec::new(),
        });
        Ok(Identity { username, groups, instance: None })
    }
}
