//! What is in flight, and what waits for it: the queued jobs admission considers, the pending
//! and running jobs (for admission's load, timeouts and reconciliation) and the job counts by
//! status (for metrics).

use super::JobRow;
use crate::db::{Db, Error, on_db, query_error};
use crate::domain::admission::QueuedJob;

/// Pending and running jobs counted per author and kind (GPU or not): the load admission works
/// against, without loading the jobs themselves.
pub async fn in_flight_load(db: &Db) -> Result<Vec<(String, bool, i64)>, Error> {
    on_db!(db, pool => sqlx::query_as::<_, (String, bool, i64)>(
        "SELECT author_id, gpu, COUNT(*) FROM jobs WHERE status IN ('PENDING', 'RUNNING') GROUP BY author_id, gpu")
        .fetch_all(pool)
        .await)
    .map_err(query_error("count running jobs"))
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

/// Queued jobs, oldest first (at most `limit`), for admission.
pub async fn queued(db: &Db, limit: i64) -> Result<Vec<QueuedJob>, Error> {
    #[derive(sqlx::FromRow)]
    struct Row {
        id: String,
        author_id: String,
        gpu: bool,
        created: i64,
        function_size: Option<String>,
        /// The function's size catalog, read for GPU jobs only (how many GPUs, which model).
        sizes: Option<String>,
    }
    let rows = on_db!(db, pool => sqlx::query_as::<_, Row>(
        "SELECT j.id, j.author_id, j.gpu, j.created, j.function_size, \
         CASE WHEN j.gpu THEN (SELECT p.sizes FROM programs p WHERE p.id = j.program_id) END AS sizes \
         FROM jobs j WHERE j.status = 'QUEUED' ORDER BY j.created, j.id LIMIT $1")
        .bind(limit)
        .fetch_all(pool)
        .await)
    .map_err(query_error("list queued jobs"))?;
    Ok(rows
        .into_iter()
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
            QueuedJob { id: r.id, author_id: r.author_id, gpu: r.gpu, created: r.created, gpus, gpu_model }
        })
        .collect())
}
