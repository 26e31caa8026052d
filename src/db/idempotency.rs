//! Idempotency keys (`api::idempotency` decides what they mean): a request's reservation of its
//! (user, key), the answer recorded on it, its takeover, its release and the batched expiry.
//! Every write after the reservation is conditioned on the reservation's `owner`, so only the
//! request holding it changes it.

use super::{Db, Error, on_db, query_error};

/// One user's key.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct IdempotencyKeyRow {
    pub request_hash: String,
    /// The request holding the reservation.
    pub owner: String,
    /// `None` while that request is in progress.
    pub status_code: Option<i32>,
    pub body: Option<String>,
    /// When the reservation was made (microseconds since the Unix epoch).
    pub created: i64,
}

/// Reserves `key` for `owner`; `false` when the user already has that key.
pub async fn reserve(
    db: &Db,
    user_id: &str,
    key: &str,
    request_hash: &str,
    owner: &str,
    now: i64,
) -> Result<bool, Error> {
    on_db!(db, pool => sqlx::query(
        "INSERT INTO idempotency_keys (user_id, idempotency_key, request_hash, owner, created) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (user_id, idempotency_key) DO NOTHING")
        .bind(user_id)
        .bind(key)
        .bind(request_hash)
        .bind(owner)
        .bind(now)
        .execute(pool)
        .await
        .map(|done| done.rows_affected() == 1))
    .map_err(query_error("reserve an idempotency key"))
}

pub async fn find(db: &Db, user_id: &str, key: &str) -> Result<Option<IdempotencyKeyRow>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, IdempotencyKeyRow>(
        "SELECT request_hash, owner, status_code, body, created FROM idempotency_keys \
         WHERE user_id = $1 AND idempotency_key = $2")
        .bind(user_id)
        .bind(key)
        .fetch_optional(pool)
        .await)
    .map_err(query_error("read an idempotency key"))
}

/// Makes the key a new reservation of `owner` for `request_hash`, if it is still held by
/// `previous_owner` (an abandoned reservation, or an expired key); `false` when another request
/// changed it first.
pub async fn take_over(
    db: &Db,
    user_id: &str,
    key: &str,
    previous_owner: &str,
    request_hash: &str,
    owner: &str,
    now: i64,
) -> Result<bool, Error> {
    on_db!(db, pool => sqlx::query(
        "UPDATE idempotency_keys SET request_hash = $1, owner = $2, status_code = NULL, body = NULL, created = $3 \
         WHERE user_id = $4 AND idempotency_key = $5 AND owner = $6")
        .bind(request_hash)
        .bind(owner)
        .bind(now)
        .bind(user_id)
        .bind(key)
        .bind(previous_owner)
        .execute(pool)
        .await
        .map(|done| done.rows_affected() == 1))
    .map_err(query_error("take over an idempotency key"))
}

/// Records the answer of `owner`'s request; `false` when the reservation is no longer its own.
pub async fn record_answer(
    db: &Db,
    user_id: &str,
    key: &str,
    owner: &str,
    status_code: i32,
    body: &str,
) -> Result<bool, Error> {
    on_db!(db, pool => sqlx::query(
        "UPDATE idempotency_keys SET status_code = $1, body = $2 \
         WHERE user_id = $3 AND idempotency_key = $4 AND owner = $5")
        .bind(status_code)
        .bind(body)
        .bind(user_id)
        .bind(key)
        .bind(owner)
        .execute(pool)
        .await
        .map(|done| done.rows_affected() == 1))
    .map_err(query_error("record the answer of an idempotency key"))
}

/// Deletes `owner`'s reservation, so the next request with the key runs again.
pub async fn release(db: &Db, user_id: &str, key: &str, owner: &str) -> Result<(), Error> {
    on_db!(db, pool => sqlx::query(
        "DELETE FROM idempotency_keys WHERE user_id = $1 AND idempotency_key = $2 AND owner = $3")
        .bind(user_id)
        .bind(key)
        .bind(owner)
        .execute(pool)
        .await
        .map(|_| ()))
    .map_err(query_error("release an idempotency key"))
}

/// Deletes up to `limit` keys reserved before `cutoff`, oldest first; returns how many went.
pub async fn delete_expired(db: &Db, cutoff: i64, limit: i64) -> Result<u64, Error> {
    on_db!(db, pool => sqlx::query(
        "DELETE FROM idempotency_keys WHERE (user_id, idempotency_key) IN \
         (SELECT user_id, idempotency_key FROM idempotency_keys WHERE created < $1 ORDER BY created LIMIT $2)")
        .bind(cutoff)
        .bind(limit)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))
    .map_err(query_error("delete expired idempotency keys"))
}
