//! The `Caller` of a request, as an axum extractor: what `auth::Authenticator` says of its
//! headers, with a refusal rendered as the contract's 401.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use super::error::ApiError;
use super::state::AppState;
use crate::auth::Caller;

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        Ok(state.auth.authenticate(&state.db, &parts.headers).await?)
    }
}
