//! Users and groups: who a token is, whether they are active, which groups they belong to.

use super::{Db, Error, announced, new_id, now_micros, on_db, query_error};

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct UserRow {
    pub id: String,
    pub username: String,
    pub is_active: bool,
}

pub async fn find_by_username(db: &Db, username: &str) -> Result<Option<UserRow>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, UserRow>("SELECT id, username, is_active FROM users WHERE username = $1")
        .bind(username)
        .fetch_optional(pool)
        .await)
    .map_err(query_error("find user"))
}

/// The user with that name, created (active) on first sight. One read on the common path.
pub async fn ensure(db: &Db, username: &str) -> Result<UserRow, Error> {
    if let Some(user) = find_by_username(db, username).await? {
        return Ok(user);
    }
    on_db!(db, pool => sqlx::query("INSERT INTO users (id, username, is_active, created) VALUES ($1, $2, TRUE, $3) ON CONFLICT (username) DO NOTHING")
        .bind(new_id())
        .bind(username)
        .bind(now_micros())
        .execute(pool)
        .await
        .map(|r| r.rows_affected()))
    .map_err(query_error("create user"))?;
    find_by_username(db, username)
        .await?
        .ok_or(Error::Query { operation: "create user", source: sqlx::Error::RowNotFound })
}

/// Sets `is_active`; returns false when no such user exists. Announced (`announced!`): every
/// server forgets the users it keeps in memory.
pub async fn set_active(db: &Db, username: &str, active: bool) -> Result<bool, Error> {
    let changed = announced!(db, tx => sqlx::query("UPDATE users SET is_active = $1 WHERE username = $2")
        .bind(active)
        .bind(username)
        .execute(&mut *tx)
        .await?
        .rows_affected())
    .map_err(query_error("update user"))?;
    Ok(changed > 0)
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct GroupRow {
    pub id: String,
    pub name: String,
}

pub async fn ensure_group(db: &Db, name: &str) -> Result<GroupRow, Error> {
    on_db!(db, pool => sqlx::query("INSERT INTO user_groups (id, name, created) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING")
        .bind(new_id())
        .bind(name)
        .bind(now_micros())
        .execute(pool)
        .await
        .map(|r| r.rows_affected()))
    .map_err(query_error("create group"))?;
    on_db!(db, pool => sqlx::query_as::<_, GroupRow>("SELECT id, name FROM user_groups WHERE name = $1")
        .bind(name)
        .fetch_one(pool)
        .await)
    .map_err(query_error("find group"))
}

pub async fn find_group(db: &Db, name: &str) -> Result<Option<GroupRow>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, GroupRow>("SELECT id, name FROM user_groups WHERE name = $1")
        .bind(name)
        .fetch_optional(pool)
        .await)
    .map_err(query_error("find group"))
}

pub async fn add_member(db: &Db, group_id: &str, user_id: &str) -> Result<(), Error> {
    insert_member(db, group_id, user_id, false).await
}

/// Adds a membership; `from_provider` marks one the identity provider's answer wrote. A
/// membership the provider wrote stays the provider's when it is added by hand too.
async fn insert_member(db: &Db, group_id: &str, user_id: &str, from_provider: bool) -> Result<(), Error> {
    announced!(db, tx => sqlx::query("INSERT INTO group_members (group_id, user_id, from_provider) VALUES ($1, $2, $3) \
        ON CONFLICT (group_id, user_id) DO UPDATE SET from_provider = group_members.from_provider OR excluded.from_provider")
        .bind(group_id)
        .bind(user_id)
        .bind(from_provider)
        .execute(&mut *tx)
        .await?
        .rows_affected())
    .map_err(query_error("add group member"))?;
    Ok(())
}

pub async fn remove_member(db: &Db, group_id: &str, user_id: &str) -> Result<bool, Error> {
    let removed = announced!(db, tx => sqlx::query("DELETE FROM group_members WHERE group_id = $1 AND user_id = $2")
        .bind(group_id)
        .bind(user_id)
        .execute(&mut *tx)
        .await?
        .rows_affected())
    .map_err(query_error("remove group member"))?;
    Ok(removed > 0)
}

/// Names of the groups `user_id` belongs to.
pub async fn group_names(db: &Db, user_id: &str) -> Result<Vec<String>, Error> {
    on_db!(db, pool => sqlx::query_scalar::<_, String>("SELECT g.name FROM user_groups g JOIN group_members m ON m.group_id = g.id WHERE m.user_id = $1 ORDER BY g.name")
        .bind(user_id)
        .fetch_all(pool)
        .await)
    .map_err(query_error("list user groups"))
}

/// Makes `user_id` a member of exactly `names` (created when new, with no grants): what an
/// identity provider that owns group membership says. From then on only memberships written
/// here grant anything to the user (`users.groups_from_provider`): one added by hand grants
/// nothing even before the next request removes it. Provider admin groups are `gantry admin`'s
/// (`add-admin`), so their memberships stay. When nothing changed: one update that changes no
/// row (the user's flag) and one read.
pub async fn set_groups(db: &Db, user_id: &str, names: &[String]) -> Result<(), Error> {
    let wanted: std::collections::BTreeSet<&str> =
        names.iter().map(|n| n.trim()).filter(|n| !n.is_empty() && n.len() <= 150).collect();
    // The user's flag first: from this commit on, hand-added memberships no longer count.
    // Not announced: a hand-added membership it stops counting is replaced below, announced.
    on_db!(db, pool => sqlx::query("UPDATE users SET groups_from_provider = TRUE WHERE id = $1 AND NOT groups_from_provider")
        .bind(user_id)
        .execute(pool)
        .await
        .map(|r| r.rows_affected()))
    .map_err(query_error("mark user's groups as the provider's"))?;
    let current = on_db!(db, pool => sqlx::query_as::<_, (String, String, bool)>("SELECT g.id, g.name, m.from_provider FROM user_groups g JOIN group_members m ON m.group_id = g.id WHERE m.user_id = $1 AND g.id NOT IN (SELECT group_id FROM provider_admin_groups)")
        .bind(user_id)
        .fetch_all(pool)
        .await)
    .map_err(query_error("list user groups"))?;
    for (group_id, name, from_provider) in &current {
        if !wanted.contains(name.as_str()) {
            remove_member(db, group_id, user_id).await?;
        } else if !from_provider {
            // Added by hand before the provider named it too: now the provider's.
            add_provider_member(db, group_id, user_id).await?;
        }
    }
    for name in wanted.iter().filter(|name| !current.iter().any(|(_, c, _)| c == *name)) {
        let group = ensure_group(db, name).await?;
        add_provider_member(db, &group.id, user_id).await?;
    }
    Ok(())
}

/// Makes `user_id` a member of the group as the identity provider's answer says.
async fn add_provider_member(db: &Db, group_id: &str, user_id: &str) -> Result<(), Error> {
    insert_member(db, group_id, user_id, true).await
}
