//! Providers and their admin groups.

use super::{Db, Error, announced, new_id, now_micros, on_db, query_error};

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ProviderRow {
    pub id: String,
    pub name: String,
    pub registry: Option<String>,
}

/// Name of the admin group created with every provider.
pub fn admin_group_name(provider: &str) -> String {
    format!("{provider}-admins")
}

pub async fn find_by_name(db: &Db, name: &str) -> Result<Option<ProviderRow>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, ProviderRow>("SELECT id, name, registry FROM providers WHERE name = $1")
        .bind(name)
        .fetch_optional(pool)
        .await)
    .map_err(query_error("find provider"))
}

/// Creates the provider (or updates its registry) and makes sure its admin group exists and is
/// attached to it.
pub async fn upsert(db: &Db, name: &str, registry: Option<&str>) -> Result<ProviderRow, Error> {
    on_db!(db, pool => sqlx::query("INSERT INTO providers (id, name, registry, created) VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO UPDATE SET registry = excluded.registry")
        .bind(new_id())
        .bind(name)
        .bind(registry)
        .bind(now_micros())
        .execute(pool)
        .await
        .map(|r| r.rows_affected()))
    .map_err(query_error("create provider"))?;
    let provider = find_by_name(db, name)
        .await?
        .ok_or(Error::Query { operation: "create provider", source: sqlx::Error::RowNotFound })?;
    let group = super::users::ensure_group(db, &admin_group_name(name)).await?;
    add_admin_group(db, &provider.id, &group.id).await?;
    Ok(provider)
}

pub async fn add_admin_group(db: &Db, provider_id: &str, group_id: &str) -> Result<(), Error> {
    announced!(db, tx => sqlx::query("INSERT INTO provider_admin_groups (provider_id, group_id) VALUES ($1, $2) ON CONFLICT DO NOTHING")
        .bind(provider_id)
        .bind(group_id)
        .execute(&mut *tx)
        .await?
        .rows_affected())
    .map_err(query_error("add provider admin group"))?;
    Ok(())
}

/// Whether the user is in one of the provider's admin groups.
/// The id of provider `name` and whether `user_id` is one of its admins, in one statement (the
/// provider listing's first step); `None` when there is no such provider.
pub async fn find_with_admin(db: &Db, name: &str, user_id: &str) -> Result<Option<(String, bool)>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, (String, bool)>(
        "SELECT p.id, EXISTS (SELECT 1 FROM provider_admin_groups a JOIN group_members m ON m.group_id = a.group_id \
         WHERE a.provider_id = p.id AND m.user_id = $2) FROM providers p WHERE p.name = $1")
        .bind(name)
        .bind(user_id)
        .fetch_optional(pool)
        .await)
    .map_err(query_error("find provider and check its admins"))
}

pub async fn is_admin(db: &Db, provider_id: &str, user_id: &str) -> Result<bool, Error> {
    on_db!(db, pool => sqlx::query_scalar::<_, bool>(
        "SELECT EXISTS (SELECT 1 FROM provider_admin_groups a JOIN group_members m ON m.group_id = a.group_id WHERE a.provider_id = $1 AND m.user_id = $2)")
        .bind(provider_id)
        .bind(user_id)
        .fetch_one(pool)
        .await)
    .map_err(query_error("check provider admin"))
}
