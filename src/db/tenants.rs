//! Tenants and their quotas (`tenants`, migration 0027), the tenant each job counts against
//! (`jobs.tenant`), and what the last admission pass saw of each (`tenant_shares`).

use super::{BeginWrite, Db, Error, now_micros, on_db, query_error};
use crate::domain::fair_share::{Quota, Tenant};

/// What a tenant is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A provider: its functions' jobs.
    Provider,
    /// A group: its members' jobs of user functions.
    Group,
    /// An instance under `runtime_platform`: the jobs run for it.
    Instance,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Provider => "provider",
            Kind::Group => "group",
            Kind::Instance => "instance",
        }
    }

    /// The tenant's name: `<kind>:<key>`.
    pub fn name(self, key: &str) -> String {
        format!("{}:{key}", self.as_str())
    }
}

/// The tenant a job counts against, as a SQL expression over the job's instance, provider id
/// and author (SQL expressions themselves): the most specific tenant that matches (its
/// instance, then its function's provider, then, for a user function, the first of its
/// author's groups by name), or NULL.
macro_rules! tenant_of {
    ($instance:literal, $provider_id:literal, $author:literal) => {
        concat!(
            "(SELECT t.name FROM tenants t WHERE (t.kind = 'instance' AND t.key = ",
            $instance,
            ") OR (t.kind = 'provider' AND t.key = (SELECT pr.name FROM providers pr WHERE pr.id = ",
            $provider_id,
            ")) OR (t.kind = 'group' AND ",
            $provider_id,
            " IS NULL AND t.key IN (SELECT g.name FROM user_groups g JOIN group_members m ON m.group_id = g.id \
             WHERE m.user_id = ",
            $author,
            ")) ORDER BY CASE t.kind WHEN 'instance' THEN 0 WHEN 'provider' THEN 1 ELSE 2 END, t.name LIMIT 1)"
        )
    };
}
pub(crate) use tenant_of;

/// A declared tenant with its quotas.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct TenantRow {
    pub name: String,
    pub kind: String,
    pub key: String,
    pub cpu_guaranteed: i64,
    pub cpu_borrow_cap: Option<i64>,
    pub gpu_guaranteed: i64,
    pub gpu_borrow_cap: Option<i64>,
    pub gpu_model: Option<String>,
    pub weight: i64,
    pub updated: i64,
}

impl TenantRow {
    /// The tenant as admission sees it.
    pub fn tenant(&self) -> Tenant {
        let count = |n: i64| usize::try_from(n).unwrap_or(0);
        Tenant {
            name: self.name.clone(),
            cpu: Quota { guaranteed: count(self.cpu_guaranteed), borrow_cap: self.cpu_borrow_cap.map(count) },
            gpu: Quota { guaranteed: count(self.gpu_guaranteed), borrow_cap: self.gpu_borrow_cap.map(count) },
            gpu_model: self.gpu_model.clone(),
            weight: u32::try_from(self.weight).unwrap_or(u32::MAX).max(1),
        }
    }
}

/// A tenant's quotas as `set` writes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quotas {
    pub cpu_guaranteed: i64,
    pub cpu_borrow_cap: Option<i64>,
    pub gpu_guaranteed: i64,
    pub gpu_borrow_cap: Option<i64>,
    /// The model its GPU guarantee is of (`None`: any).
    pub gpu_model: Option<String>,
    pub weight: i64,
}

/// Every tenant, by name.
pub async fn list(db: &Db) -> Result<Vec<TenantRow>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, TenantRow>(
        "SELECT name, kind, key, cpu_guaranteed, cpu_borrow_cap, gpu_guaranteed, gpu_borrow_cap, gpu_model, weight, updated \
         FROM tenants ORDER BY name")
        .fetch_all(pool)
        .await)
    .map_err(query_error("list tenants"))
}

/// The active jobs' tenants decided again (a tenant was declared or removed); only the rows
/// whose tenant changes are written (the others are read: on PostgreSQL every active job).
const REASSIGN: &str = concat!(
    "UPDATE jobs SET tenant = ",
    tenant_of!("jobs.instance", "jobs.provider_id", "jobs.author_id"),
    " WHERE status IN ('QUEUED', 'PENDING', 'RUNNING') AND COALESCE(tenant, '') <> COALESCE(",
    tenant_of!("jobs.instance", "jobs.provider_id", "jobs.author_id"),
    ", '')"
);

/// Declares the tenant `kind:key` or changes its quotas; a new tenant takes the active jobs
/// that match it (in the same transaction). Answers whether it was new.
pub async fn set(db: &Db, kind: Kind, key: &str, quotas: Quotas) -> Result<bool, Error> {
    let name = kind.name(key);
    let _writer = db.write_lock().await;
    on_db!(db, pool => async {
        let mut tx = pool.begin_write().await?;
        let existed: Option<String> = sqlx::query_scalar("SELECT name FROM tenants WHERE name = $1")
            .bind(&name)
            .fetch_optional(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO tenants (name, kind, key, cpu_guaranteed, cpu_borrow_cap, gpu_guaranteed, gpu_borrow_cap, weight, updated, gpu_model) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (name) DO UPDATE SET \
             cpu_guaranteed = excluded.cpu_guaranteed, cpu_borrow_cap = excluded.cpu_borrow_cap, \
             gpu_guaranteed = excluded.gpu_guaranteed, gpu_borrow_cap = excluded.gpu_borrow_cap, \
             weight = excluded.weight, updated = excluded.updated, gpu_model = excluded.gpu_model")
            .bind(&name)
            .bind(kind.as_str())
            .bind(key)
            .bind(quotas.cpu_guaranteed)
            .bind(quotas.cpu_borrow_cap)
            .bind(quotas.gpu_guaranteed)
            .bind(quotas.gpu_borrow_cap)
            .bind(quotas.weight)
            .bind(now_micros())
            .bind(&quotas.gpu_model)
            .execute(&mut *tx)
            .await?;
        if existed.is_none() {
            sqlx::query(REASSIGN).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok::<_, sqlx::Error>(existed.is_none())
    }.await)
    .map_err(query_error("set a tenant's quotas"))
}

/// Removes the tenant `name`; its active jobs go to the next tenant that matches them, or to
/// none. Answers whether it existed.
pub async fn remove(db: &Db, name: &str) -> Result<bool, Error> {
    let _writer = db.write_lock().await;
    on_db!(db, pool => async {
        let mut tx = pool.begin_write().await?;
        let removed = sqlx::query("DELETE FROM tenants WHERE name = $1").bind(name).execute(&mut *tx).await?.rows_affected();
        if removed > 0 {
            sqlx::query(REASSIGN).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM tenant_shares WHERE tenant = $1").bind(name).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok::<_, sqlx::Error>(removed > 0)
    }.await)
    .map_err(query_error("remove a tenant"))
}

/// What the last admission pass saw of a tenant's use of one kind of slot.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Share {
    /// `""`: jobs of no tenant.
    pub tenant: String,
    pub gpu: bool,
    pub used: i64,
    pub firm: i64,
    pub waiting: i64,
    pub updated: i64,
}

/// Every tenant's share as the last pass saw it.
pub async fn shares(db: &Db) -> Result<Vec<Share>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, Share>(
        "SELECT tenant, gpu, used, firm, waiting, updated FROM tenant_shares ORDER BY tenant, gpu")
        .fetch_all(pool)
        .await)
    .map_err(query_error("read tenant shares"))
}

/// Replaces the shares with what a pass saw (in one transaction).
pub async fn write_shares(db: &Db, shares: &[Share]) -> Result<(), Error> {
    let _writer = db.write_lock().await;
    on_db!(db, pool => async {
        let mut tx = pool.begin_write().await?;
        sqlx::query("DELETE FROM tenant_shares").execute(&mut *tx).await?;
        for share in shares {
            sqlx::query("INSERT INTO tenant_shares (tenant, gpu, used, firm, waiting, updated) VALUES ($1, $2, $3, $4, $5, $6)")
                .bind(&share.tenant)
                .bind(share.gpu)
                .bind(share.used)
                .bind(share.firm)
                .bind(share.waiting)
                .bind(share.updated)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok::<_, sqlx::Error>(())
    }.await)
    .map_err(query_error("write tenant shares"))
}
