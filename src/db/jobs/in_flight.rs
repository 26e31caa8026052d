//! What is in flight, and what waits for it: the queued jobs admission considers, the pending
//! and running jobs (for admission's load, timeouts and reconciliation) and the job counts by
//! status (for metrics).

use super::JobRow;
use crate::db::{Db, Error, on_db, query_error};
use crate::domain::admission::QueuedJob;
use crate::domain::fair_share::{Holding, Load};

/// Pending and running jobs counted per author, tenant, kind (GPU or not) and backfill: the load
/// admission works against, without loading the jobs themselves.
pub async fn in_flight_load(db: &Db) -> Result<Vec<Load>, Error> {
    let rows = on_db!(db, pool => sqlx::query_as::<_, (String, String, bool, bool, Option<String>, i64)>(
        "SELECT author_id, COALESCE(tenant, ''), gpu, backfill, gpu_model, COUNT(*) FROM jobs \
         WHERE status IN ('PENDING', 'RUNNING') GROUP BY author_id, COALESCE(tenant, ''), gpu, backfill, gpu_model")
        .fetch_all(pool)
        .await)
    .map_err(query_error("count running jobs"))?;
    Ok(rows
        .into_iter()
        .map(|(user, tenant, gpu, backfill, gpu_model, count)| Load {
            user,
            tenant,
            gpu,
            backfill,
            gpu_model,
            count: usize::try_from(count).unwrap_or(0),
        })
        .collect())
}

/// The backfill jobs holding slots (pending or running), with when their current run started
/// (or they were queued, before that): what a reclaim may stop.
pub async fn backfill_in_flight(db: &Db) -> Result<Vec<Holding>, Error> {
    let rows = on_db!(db, pool => sqlx::query_as::<_, (String, String, bool, i64)>(
        "SELECT id, COALESCE(tenant, ''), gpu, COALESCE(running_since + carried_run_us, created) FROM jobs \
         WHERE backfill AND status IN ('PENDING', 'RUNNING')")
        .fetch_all(pool)
        .await)
    .map_err(query_error("list backfill jobs"))?;
    Ok(rows.into_iter().map(|(id, tenant, gpu, admitted)| Holding { id, tenant, gpu, admitted }).collect())
}

/// Marks a backfill job to be stopped for `tenant` (a reclaim), as a stop request that names
/// who took its slot back; false when it is no longer pending or running.
pub async fn mark_preempted(db: &Db, job_id: &str, tenant: &str) -> Result<bool, Error> {
    let _writer = db.write_lock().await;
    on_db!(db, pool => sqlx::query(
        "UPDATE jobs SET stop_requested = TRUE, preempted_by = $2 \
         WHERE id = $1 AND status IN ('PENDING', 'RUNNING') AND NOT stop_requested")
        .bind(job_id)
        .bind(tenant)
        .execute(pool)
        .await
        .map(|done| done.rows_affected() > 0))
    .map_err(query_error("mark a job preempted"))
}

/// Who reclaimed the slot of a job stopped for it (`mark_preempted`), if anyone did.
pub async fn preempted_by(db: &Db, job_id: &str) -> Result<Option<String>, Error> {
    on_db!(db, pool => sqlx::query_scalar::<_, Option<String>>("SELECT preempted_by FROM jobs WHERE id = $1")
        .bind(job_id)
        .fetch_optional(pool)
        .await)
    .map(Option::flatten)
    .map_err(query_error("read who preempted a job"))
}

/// How many jobs are in each status (for metrics), from the kept counts: their rows grow with
/// users and functions, not with jobs (a `COUNT(*)` of `jobs` read all 10 million rows).
pub async fn count_by_status(db: &Db) -> Result<Vec<(String, i64)>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, (String, i64)>(
        "SELECT status, CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM job_counts GROUP BY status")
        .fetch_all(pool)
        .await)
    .map_err(query_error("count jobs by status"))
}

/// Whether any job is pending or running: one entry of the partial index, however many there
/// are (loading them all, as `in_flight` does, took 13 s and 500 MiB at 1.5 million).
pub async fn any_in_flight(db: &Db) -> Result<bool, Error> {
    on_db!(db, pool => sqlx::query_scalar::<_, bool>(
        "SELECT EXISTS (SELECT 1 FROM jobs WHERE status IN ('PENDING', 'RUNNING'))")
        .fetch_one(pool)
        .await)
    .map_err(query_error("look for running jobs"))
}

/// Pending and running jobs (for load, timeouts and reconciliation).
pub async fn in_flight(db: &Db) -> Result<Vec<JobRow>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, JobRow>(concat!(job_select!(), "WHERE j.status IN ('PENDING', 'RUNNING')"))
        .fetch_all(pool)
        .await)
    .map_err(query_error("list running jobs"))
}

/// Queued jobs for admission: the oldest `limit` of all, and each tenant's (of `tenants`) oldest
/// `per_tenant`, so a tenant's jobs are seen however many older jobs of others wait; each once.
pub async fn queued(db: &Db, limit: i64, tenants: &[String], per_tenant: i64) -> Result<Vec<QueuedJob>, Error> {
    #[derive(sqlx::FromRow)]
    struct Row {
        id: String,
        author_id: String,
        gpu: bool,
        created: i64,
        function_size: Option<String>,
        /// The function's size catalog, read for GPU jobs only (how many GPUs, which model).
        sizes: Option<String>,
        tenant: String,
        backfill: bool,
    }
    const COLUMNS: &str = "SELECT j.id, j.author_id, j.gpu, j.created, j.function_size, \
         CASE WHEN j.gpu THEN (SELECT p.sizes FROM programs p WHERE p.id = j.program_id) END AS sizes, \
         COALESCE(j.tenant, '') AS tenant, j.backfill FROM jobs j WHERE j.status = 'QUEUED'";
    // One statement: the windows as subqueries (each its own indexed read), joined.
    let mut sql = format!("SELECT * FROM ({COLUMNS} ORDER BY j.created, j.id LIMIT $1) w0");
    for index in 0..tenants.len() {
        sql.push_str(&format!(
            " UNION ALL SELECT * FROM ({COLUMNS} AND j.tenant = ${} ORDER BY j.created, j.id LIMIT $2) w{}",
            index + 3,
            index + 1
        ));
    }
    let rows = on_db!(db, pool => {
        let mut query = sqlx::query_as::<_, Row>(&sql).bind(limit);
        if !tenants.is_empty() {
            query = query.bind(per_tenant);
        }
        for tenant in tenants {
            query = query.bind(tenant);
        }
        query.fetch_all(pool).await
    })
    .map_err(query_error("list queued jobs"))?;
    let mut seen = std::collections::HashSet::new();
    Ok(rows
        .into_iter()
        .filter(|r| seen.insert(r.id.clone()))
        .map(|r| {
            let (gpus, gpu_model) = match r.gpu {
                false => (0, None),
                true => {
                    let catalog: serde_json::Map<String, serde_json::Value> =
                        r.sizes.as_deref().and_then(|s| serde_json::from_str(s).ok()).unwrap_or_default();
                    let none = crate::domain::sizes::Resources {
                        cpu: String::new(),
                        memory: String::new(),
                        gpus: 0,
                        gpu_model: None,
                    };
                    let resources =
                        crate::domain::sizes::job_resources(&catalog, r.function_size.as_deref(), true, &none);
                    (resources.gpus, resources.gpu_model)
                }
            };
            QueuedJob {
                id: r.id,
                author_id: r.author_id,
                gpu: r.gpu,
                created: r.created,
                gpus,
                gpu_model,
                tenant: r.tenant,
                backfill: r.backfill,
            }
        })
        .collect())
}
