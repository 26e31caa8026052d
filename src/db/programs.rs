//! Functions ("programs"): lookups that also load the caller's relation to the function, and the
//! create/update writes of the upload upsert.

use super::{Db, Error, announced, now_micros, on_db, query_error};
use crate::domain::visibility::FunctionAccess;

/// Whether user `$1` is in an admin group of the provider of function `p` (false for a user's
/// own function).
macro_rules! provider_admin {
    () => {
        "EXISTS (SELECT 1 FROM provider_admin_groups a JOIN group_members m ON m.group_id = a.group_id \
         WHERE a.provider_id = p.provider_id AND m.user_id = $1)"
    };
}
pub(super) use provider_admin;

/// Columns of a program plus the caller's relation to it; `$1` is always the caller's user id.
/// Grants count through the caller's groups, but for a user whose groups an identity provider
/// sets only through the memberships written from its answer (`users::set_groups`): one added
/// by hand grants nothing. Provider admin groups are `gantry admin`'s and always count.
macro_rules! program_select {
    () => {
        concat!(
            "SELECT p.id, p.title, p.provider_id, pr.name AS provider_name, p.author_id, p.entrypoint, \
         p.artifact_key, p.image, p.dependencies, p.env_vars, p.arguments_schema, p.type AS program_type, \
         p.version, p.description, p.documentation_url, p.runner, p.gpu, p.retry_after_start, p.backfill, p.disabled, p.disabled_message, \
         p.sizes, p.default_size, p.created, p.updated, \
         (p.author_id = $1) AS is_author, ",
            provider_admin!(),
            " AS is_provider_admin, \
         EXISTS (SELECT 1 FROM program_grants g JOIN group_members m ON m.group_id = g.group_id \
                 WHERE g.program_id = p.id AND m.user_id = $1 AND g.can_view \
                 AND (m.from_provider OR NOT EXISTS (SELECT 1 FROM users u WHERE u.id = $1 AND u.groups_from_provider))) \
                 AS view_granted, \
         EXISTS (SELECT 1 FROM program_grants g JOIN group_members m ON m.group_id = g.group_id \
                 WHERE g.program_id = p.id AND m.user_id = $1 AND g.can_run \
                 AND (m.from_provider OR NOT EXISTS (SELECT 1 FROM users u WHERE u.id = $1 AND u.groups_from_provider))) \
                 AS run_granted, \
         EXISTS (SELECT 1 FROM program_trial_groups t \
                 JOIN program_grants g ON g.program_id = t.program_id AND g.group_id = t.group_id AND g.can_run \
                 JOIN group_members m ON m.group_id = t.group_id \
                 WHERE t.program_id = p.id AND m.user_id = $1 \
                 AND (m.from_provider OR NOT EXISTS (SELECT 1 FROM users u WHERE u.id = $1 AND u.groups_from_provider))) \
                 AS trial_granted \
         FROM programs p LEFT JOIN providers pr ON pr.id = p.provider_id "
        )
    };
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ProgramRow {
    pub id: String,
    pub title: String,
    pub provider_id: Option<String>,
    pub provider_name: Option<String>,
    pub author_id: String,
    pub entrypoint: Option<String>,
    pub artifact_key: Option<String>,
    pub image: Option<String>,
    pub dependencies: String,
    pub env_vars: String,
    pub arguments_schema: Option<String>,
    pub program_type: String,
    pub version: Option<String>,
    pub description: Option<String>,
    pub documentation_url: Option<String>,
    pub runner: String,
    pub gpu: bool,
    /// The function's opt-in to be started again after its code started (on Kubernetes).
    pub retry_after_start: bool,
    /// Its jobs run as backfill (docs/scheduling.md).
    pub backfill: bool,
    pub disabled: bool,
    pub disabled_message: Option<String>,
    pub sizes: String,
    pub default_size: Option<String>,
    pub created: i64,
    pub updated: i64,
    pub is_author: bool,
    pub is_provider_admin: bool,
    pub view_granted: bool,
    pub run_granted: bool,
    pub trial_granted: bool,
}

impl ProgramRow {
    pub fn access(&self) -> FunctionAccess {
        FunctionAccess {
            has_provider: self.provider_id.is_some(),
            is_author: self.is_author,
            is_provider_admin: self.is_provider_admin,
            view_granted: self.view_granted,
            run_granted: self.run_granted,
            trial_granted: self.trial_granted,
            instance: None,
        }
    }
}

/// The provider function `(provider_id, title)`, with the caller's relation to it.
pub async fn find_provider_function(
    db: &Db,
    user_id: &str,
    provider_id: &str,
    title: &str,
) -> Result<Option<ProgramRow>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, ProgramRow>(concat!(program_select!(), "WHERE p.provider_id = $2 AND p.title = $3"))
        .bind(user_id)
        .bind(provider_id)
        .bind(title)
        .fetch_optional(pool)
        .await)
    .map_err(query_error("find provider function"))
}

/// The provider function `(provider name, title)`, with the caller's relation to it: one
/// statement for what a provider lookup and a function lookup would answer (no row for an
/// unknown provider as for an unknown function).
pub async fn find_provider_function_named(
    db: &Db,
    user_id: &str,
    provider: &str,
    title: &str,
) -> Result<Option<ProgramRow>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, ProgramRow>(concat!(program_select!(), "WHERE pr.name = $2 AND p.title = $3"))
        .bind(user_id)
        .bind(provider)
        .bind(title)
        .fetch_optional(pool)
        .await)
    .map_err(query_error("find provider function"))
}

/// The caller's own user function (no provider) with that title.
pub async fn find_user_function(db: &Db, user_id: &str, title: &str) -> Result<Option<ProgramRow>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, ProgramRow>(concat!(program_select!(), "WHERE p.author_id = $1 AND p.provider_id IS NULL AND p.title = $2"))
        .bind(user_id)
        .bind(title)
        .fetch_optional(pool)
        .await)
    .map_err(query_error("find user function"))
}

pub async fn find_by_id(db: &Db, user_id: &str, id: &str) -> Result<Option<ProgramRow>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, ProgramRow>(concat!(program_select!(), "WHERE p.id = $2"))
        .bind(user_id)
        .bind(id)
        .fetch_optional(pool)
        .await)
    .map_err(query_error("find function"))
}

/// Every function the caller might see: their own user functions and provider functions
/// (optionally of one provider). The visibility rules then filter this set.
///
/// Without an instance (`every_provider_function` false) a provider function can concern the
/// caller only through a relation the database holds: they wrote it, administer its provider or
/// belong to a group granted on it. Those are picked first (each by an index), so the answer's
/// cost follows the caller's functions, not the catalog: reading all 10,000 provider functions
/// of the scale seed, each with its relation subqueries, took 80 ms of PostgreSQL per request.
/// With an instance, its permissions may open any provider function: all are read.
pub async fn list_candidates(
    db: &Db,
    user_id: &str,
    provider: Option<&str>,
    every_provider_function: bool,
) -> Result<Vec<ProgramRow>, Error> {
    const RELATED: &str = "SELECT o.id FROM programs o WHERE o.author_id = $1 \
           UNION SELECT f.id FROM programs f JOIN provider_admin_groups a ON a.provider_id = f.provider_id \
             JOIN group_members m ON m.group_id = a.group_id WHERE m.user_id = $1 \
           UNION SELECT g.program_id FROM program_grants g JOIN group_members m ON m.group_id = g.group_id \
             WHERE m.user_id = $1";
    // On PostgreSQL the related ids are gathered first, as an array, and then looked up by key:
    // written as `IN (subquery)` the planner cannot know how few they are and scanned every
    // function to join them (1.3 ms of PostgreSQL per request at 10,000 functions, 0.1 ms so).
    let related = match (every_provider_function, db) {
        (true, _) => String::new(),
        (false, Db::Postgres(_)) => format!("AND p.id = ANY (ARRAY ({RELATED})) "),
        (false, Db::Sqlite(..)) => format!("AND p.id IN ({RELATED}) "),
    };
    let sql = format!(
        "{}WHERE ((p.provider_id IS NULL AND p.author_id = $1) OR p.provider_id IS NOT NULL) \
         AND ($2 IS NULL OR pr.name = $2) {related}ORDER BY p.created, p.id",
        program_select!(),
    );
    on_db!(db, pool => sqlx::query_as::<_, ProgramRow>(&sql)
        .bind(user_id)
        .bind(provider)
        .fetch_all(pool)
        .await)
    .map_err(query_error("list functions"))
}

/// Every stored field of a function, as written by an upload.
#[derive(Debug, Clone, Default)]
pub struct ProgramFields {
    pub entrypoint: Option<String>,
    pub artifact_key: Option<String>,
    pub image: Option<String>,
    pub dependencies: String,
    pub env_vars: String,
    pub arguments_schema: Option<String>,
    pub program_type: String,
    pub version: Option<String>,
    pub description: Option<String>,
    pub documentation_url: Option<String>,
    pub runner: String,
    pub gpu: bool,
    pub retry_after_start: bool,
    pub backfill: bool,
    pub sizes: String,
    pub default_size: Option<String>,
}

impl ProgramFields {
    pub fn from_row(row: &ProgramRow) -> Self {
        Self {
            entrypoint: row.entrypoint.clone(),
            artifact_key: row.artifact_key.clone(),
            image: row.image.clone(),
            dependencies: row.dependencies.clone(),
            env_vars: row.env_vars.clone(),
            arguments_schema: row.arguments_schema.clone(),
            program_type: row.program_type.clone(),
            version: row.version.clone(),
            description: row.description.clone(),
            documentation_url: row.documentation_url.clone(),
            runner: row.runner.clone(),
            gpu: row.gpu,
            retry_after_start: row.retry_after_start,
            backfill: row.backfill,
            sizes: row.sizes.clone(),
            default_size: row.default_size.clone(),
        }
    }
}

/// Inserts a new function and returns its id. A concurrent upload of the same title surfaces as a
/// unique violation (`Error::unique_violation`).
pub async fn insert(
    db: &Db,
    id: &str,
    title: &str,
    provider_id: Option<&str>,
    author_id: &str,
    fields: &ProgramFields,
) -> Result<(), Error> {
    let now = now_micros();
    announced!(db, tx => sqlx::query(
        "INSERT INTO programs (id, title, provider_id, author_id, entrypoint, artifact_key, image, dependencies, env_vars, \
         arguments_schema, type, version, description, documentation_url, runner, gpu, sizes, default_size, created, updated, \
         retry_after_start, backfill) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $19, $20, $21)")
        .bind(id)
        .bind(title)
        .bind(provider_id)
        .bind(author_id)
        .bind(&fields.entrypoint)
        .bind(&fields.artifact_key)
        .bind(&fields.image)
        .bind(&fields.dependencies)
        .bind(&fields.env_vars)
        .bind(&fields.arguments_schema)
        .bind(&fields.program_type)
        .bind(&fields.version)
        .bind(&fields.description)
        .bind(&fields.documentation_url)
        .bind(&fields.runner)
        .bind(fields.gpu)
        .bind(&fields.sizes)
        .bind(&fields.default_size)
        .bind(now)
        .bind(fields.retry_after_start)
        .bind(fields.backfill)
        .execute(&mut *tx)
        .await?
        .rows_affected())
    .map_err(query_error("create function"))?;
    Ok(())
}

/// Overwrites the mutable fields of an existing function (`type` and author never change).
pub async fn update(db: &Db, id: &str, fields: &ProgramFields) -> Result<(), Error> {
    announced!(db, tx => sqlx::query(
        "UPDATE programs SET entrypoint = $2, artifact_key = $3, image = $4, dependencies = $5, env_vars = $6, \
         arguments_schema = $7, version = $8, description = $9, documentation_url = $10, runner = $11, gpu = $12, \
         sizes = $13, default_size = $14, updated = $15, retry_after_start = $16, backfill = $17 WHERE id = $1")
        .bind(id)
        .bind(&fields.entrypoint)
        .bind(&fields.artifact_key)
        .bind(&fields.image)
        .bind(&fields.dependencies)
        .bind(&fields.env_vars)
        .bind(&fields.arguments_schema)
        .bind(&fields.version)
        .bind(&fields.description)
        .bind(&fields.documentation_url)
        .bind(&fields.runner)
        .bind(fields.gpu)
        .bind(&fields.sizes)
        .bind(&fields.default_size)
        .bind(now_micros())
        .bind(fields.retry_after_start)
        .bind(fields.backfill)
        .execute(&mut *tx)
        .await?
        .rows_affected())
    .map_err(query_error("update function"))?;
    Ok(())
}

/// Grants (or revokes, with both false) a group's view/run rights on a function.
pub async fn grant(db: &Db, program_id: &str, group_id: &str, can_view: bool, can_run: bool) -> Result<(), Error> {
    announced!(db, tx => sqlx::query(
        "INSERT INTO program_grants (program_id, group_id, can_view, can_run) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (program_id, group_id) DO UPDATE SET can_view = excluded.can_view, can_run = excluded.can_run")
        .bind(program_id)
        .bind(group_id)
        .bind(can_view)
        .bind(can_run)
        .execute(&mut *tx)
        .await?
        .rows_affected())
    .map_err(query_error("grant function access"))?;
    Ok(())
}

/// Disables a function (runs answer 423 with `message`, or the reference's default) or enables it
/// again (`disabled` false clears the message).
pub async fn set_disabled(db: &Db, program_id: &str, disabled: bool, message: Option<&str>) -> Result<(), Error> {
    announced!(db, tx => sqlx::query("UPDATE programs SET disabled = $1, disabled_message = $2, updated = $3 WHERE id = $4")
        .bind(disabled)
        .bind(message.filter(|_| disabled))
        .bind(now_micros())
        .bind(program_id)
        .execute(&mut *tx)
        .await?
        .rows_affected())
    .map_err(query_error("disable function"))?;
    Ok(())
}

/// Makes a group one of the function's trial groups (`add`) or no longer one; returns whether
/// anything changed.
pub async fn set_trial_group(db: &Db, program_id: &str, group_id: &str, add: bool) -> Result<bool, Error> {
    let changed = if add {
        announced!(db, tx => sqlx::query(
            "INSERT INTO program_trial_groups (program_id, group_id) VALUES ($1, $2) ON CONFLICT DO NOTHING")
            .bind(program_id)
            .bind(group_id)
            .execute(&mut *tx)
            .await?
            .rows_affected())
    } else {
        announced!(db, tx => sqlx::query("DELETE FROM program_trial_groups WHERE program_id = $1 AND group_id = $2")
            .bind(program_id)
            .bind(group_id)
            .execute(&mut *tx)
            .await?
            .rows_affected())
    }
    .map_err(query_error("set trial group"))?;
    Ok(changed > 0)
}

/// Whether a group was granted `run` on a function.
pub async fn run_granted_to(db: &Db, program_id: &str, group_id: &str) -> Result<bool, Error> {
    on_db!(db, pool => sqlx::query_scalar::<_, bool>(
        "SELECT EXISTS (SELECT 1 FROM program_grants WHERE program_id = $1 AND group_id = $2 AND can_run)")
        .bind(program_id)
        .bind(group_id)
        .fetch_one(pool)
        .await)
    .map_err(query_error("read grant"))
}
