//! The `Caller` of a request, as an axum extractor: what `auth::Authenticator` says of its
//! headers, with a refusal rendered as the contract's 401. And `Query`: query parameters whose
//! refusal is the contract's 400 body, not axum's plain text.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::state::AppState;
use crate::auth::Caller;

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        Ok(state.auth.authenticate(&state.db, &parts.headers).await?)
    }
}

/// The query parameters as `axum::extract::Query` reads them; a query it cannot read (a
/// parameter sent twice, say) answers 400 `{"message": …}` like every other invalid input.
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Query(value)),
            Err(rejection) => Err(ApiError::BadRequest(rejection.body_text())),
        }
    }
}
