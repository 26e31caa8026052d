//! The jobs of one function as `programs/{id}/get_jobs/` lists them, with the caller's right to
//! every author's jobs found in the same statement.

use super::JobRow;
use super::listing::page_rows;
use crate::db::params::Param;
use crate::db::programs::provider_admin;
use crate::db::{Db, Error, query_error};

/// The newest `limit` jobs of function `program_id`: every author's when `user_id` manages the
/// function's jobs by their relation to it (a provider function they wrote or whose provider
/// they administer; `visibility::can_manage` without an instance), else their own. Answers
/// whether they manage it and the jobs; `None` when there is no such function. One statement:
/// the right decides which of two guarded branches reads jobs (the other is skipped whole), each
/// walking its index in the page's order.
pub async fn of_function(
    db: &Db,
    program_id: &str,
    user_id: &str,
    limit: i64,
) -> Result<Option<(bool, Vec<JobRow>)>, Error> {
    let limit = limit.max(0);
    let sql = format!(
        "WITH f AS (SELECT COALESCE(p.provider_id IS NOT NULL AND (p.author_id = $1 OR {admin}), FALSE) AS manages \
                    FROM programs p WHERE p.id = $2) \
         SELECT f.manages AS manages, page.* FROM f LEFT JOIN ({columns} FROM ( \
             SELECT * FROM (SELECT * FROM jobs j WHERE j.program_id = $2 AND (SELECT manages FROM f) \
                            ORDER BY j.created DESC, j.id DESC LIMIT {limit}) every_author \
             UNION ALL \
             SELECT * FROM (SELECT * FROM jobs j WHERE j.program_id = $2 AND j.author_id = $1 \
                              AND NOT (SELECT manages FROM f) \
                            ORDER BY j.created DESC, j.id DESC LIMIT {limit}) own) j) page ON TRUE \
         ORDER BY page.created DESC, page.id DESC",
        admin = provider_admin!(),
        columns = job_columns!(),
    );
    let params = [Param::Text(user_id.to_string()), Param::Text(program_id.to_string())];
    // Planned for its values: a generic plan for 1,000 jobs of a function assumes the average
    // function (see `page_if_admin`).
    let (manages, jobs) = page_rows!(db, &sql, &params, false, row => sqlx::Row::try_get::<bool, _>(row, "manages")?)
        .map_err(query_error("list the function's jobs"))?;
    Ok(manages.map(|manages| (manages, jobs)))
}
