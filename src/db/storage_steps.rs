//! One-time storage steps that completed (see `storage::migrate`), so a start-up does not
//! repeat them.

use super::{Db, Error, now_micros, on_db, query_error};

pub async fn is_done(db: &Db, name: &str) -> Result<bool, Error> {
    let found: Option<i64> =
        on_db!(db, pool => sqlx::query_scalar("SELECT completed FROM storage_steps WHERE name = $1")
        .bind(name)
        .fetch_optional(pool)
        .await)
        .map_err(query_error("read storage steps"))?;
    Ok(found.is_some())
}

pub async fn mark_done(db: &Db, name: &str) -> Result<(), Error> {
    on_db!(db, pool => sqlx::query("INSERT INTO storage_steps (name, completed) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING")
        .bind(name)
        .bind(now_micros())
        .execute(pool)
        .await
        .map(|_| ()))
    .map_err(query_error("record a storage step"))
}
