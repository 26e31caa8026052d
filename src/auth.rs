//! Authentication: the `Caller` extractor turns `Authorization: Bearer <token>` into a user.
//!
//! `mock_token` (the embedded default) accepts any token and maps each distinct token to its own
//! user, named by the token itself, so several people (or tests) can share a small installation
//! and an operator can manage them with `gantry admin` by that name. It is for development and
//! trusted networks only: whoever knows a name can act as that user.

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;

use crate::db;
use crate::domain::names::is_valid_user_name;
use crate::error::ApiError;
use crate::state::AppState;

/// How tokens are checked (`SETTINGS_AUTH_MECHANISM`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMechanism {
    /// Any token; each distinct token is its own user, named by the token.
    #[value(name = "mock_token")]
    MockToken,
    /// Tokens checked against an external API (not built yet).
    #[value(name = "custom_token")]
    CustomToken,
    /// IBM Quantum platform identity service (not built yet).
    #[value(name = "runtime_platform")]
    RuntimePlatform,
}

/// The authenticated user of a request.
#[derive(Clone)]
pub struct Caller {
    pub user_id: String,
    pub username: String,
    /// The raw bearer token, handed to jobs so they can call back as the user. Never logged.
    pub token: String,
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

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let header_value = parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or_default();
        let token = token_from_header(header_value)
            .ok_or_else(|| ApiError::Unauthorized("Authorization token was not provided.".into()))?;
        // mock_token is the only mechanism `gantry` starts with (see `cli`).
        if !is_valid_user_name(token) {
            return Err(ApiError::Unauthorized(
                "Authorization token is not valid. With mock_token it must be 1-150 characters of letters, digits, '_', '.', '@' or '-'.".into(),
            ));
        }
        let user = db::users::ensure(&state.db, token).await?;
        if !user.is_active {
            return Err(ApiError::Unauthorized(
                "Your user was deactivated. Please contact IBM support for reactivation.".into(),
            ));
        }
        Ok(Caller { user_id: user.id, username: user.username, token: token.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_the_last_word_of_the_header() {
        assert_eq!(token_from_header("Bearer abc"), Some("abc"));
        assert_eq!(token_from_header("apikey abc"), Some("abc"));
        assert_eq!(token_from_header("abc"), Some("abc"));
        assert_eq!(token_from_header("Bearer "), None);
        assert_eq!(token_from_header(""), None);
    }
}
