//! The job listings: their filters, turned into one `WHERE` clause for the page and the counts
//! (read from the kept counts where the filters allow), and the page query.

use super::{DAY_MICROS, JobRow, day_of};
use crate::db::{Db, Error, on_db, query_error};

/// A value bound into a dynamically built query.
#[derive(Debug, Clone)]
pub enum Param {
    Text(String),
    Int(i64),
}

/// Filters of the job listings; each present filter narrows the result.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub author_id: Option<String>,
    pub provider_id: Option<String>,
    pub program_ids: Option<Vec<String>>,
    pub status: Option<String>,
    /// `Some(true)`: provider functions only (catalog); `Some(false)`: user functions only.
    pub catalog: Option<bool>,
    pub created_after: Option<i64>,
}

/// Where each filter looks, in the jobs table or in the kept counts.
struct FilterColumns {
    author: &'static str,
    provider: &'static str,
    status: &'static str,
    program: &'static str,
    /// The kept counts narrow `created_after` to whole days after its day.
    by_day: bool,
}

const JOB_COLUMNS: FilterColumns = FilterColumns {
    author: "j.author_id",
    provider: "j.provider_id",
    status: "j.status",
    program: "j.program_id",
    by_day: false,
};
const COUNT_COLUMNS: FilterColumns = FilterColumns {
    author: "jc.author_id",
    provider: "p.provider_id",
    status: "jc.status",
    program: "jc.program_id",
    by_day: true,
};

impl JobFilter {
    /// `WHERE …` over the given columns, with its numbered parameters.
    fn clause(&self, columns: &FilterColumns) -> (String, Vec<Param>) {
        let mut clauses = Vec::new();
        let mut params = Vec::new();
        let mut equal = |column: &str, param: Param, clauses: &mut Vec<String>| {
            params.push(param);
            clauses.push(format!("{column} = ${}", params.len()));
        };
        if let Some(author) = &self.author_id {
            equal(columns.author, Param::Text(author.clone()), &mut clauses);
        }
        if let Some(provider) = &self.provider_id {
            equal(columns.provider, Param::Text(provider.clone()), &mut clauses);
        }
        if let Some(status) = &self.status {
            equal(columns.status, Param::Text(status.clone()), &mut clauses);
        }
        if let Some(after) = self.created_after {
            if columns.by_day {
                params.push(Param::Int(day_of(after)));
                clauses.push(format!("jc.day > ${}", params.len()));
            } else {
                params.push(Param::Int(after));
                clauses.push(format!("j.created >= ${}", params.len()));
            }
        }
        if let Some(ids) = &self.program_ids {
            let mut placeholders = Vec::new();
            for id in ids {
                params.push(Param::Text(id.clone()));
                placeholders.push(format!("${}", params.len()));
            }
            clauses.push(match placeholders.is_empty() {
                true => "1 = 0".to_string(),
                false => format!("{} IN ({})", columns.program, placeholders.join(", ")),
            });
        }
        match self.catalog {
            Some(true) => clauses.push(format!("{} IS NOT NULL", columns.provider)),
            Some(false) => clauses.push(format!("{} IS NULL", columns.provider)),
            None => {}
        }
        let clause = if clauses.is_empty() { String::new() } else { format!("WHERE {}", clauses.join(" AND ")) };
        (clause, params)
    }

    fn where_clause(&self) -> (String, Vec<Param>) {
        self.clause(&JOB_COLUMNS)
    }

    /// The count of matching jobs from the kept counts; with `created_after`, the whole days after
    /// its day from `job_counts_by_day` plus that day's rows counted in `jobs`.
    fn count_queries(&self) -> Vec<(String, Vec<Param>)> {
        let (clause, params) = self.clause(&COUNT_COLUMNS);
        let table = if self.created_after.is_some() { "job_counts_by_day" } else { "job_counts" };
        let mut queries = vec![(
            format!(
                "SELECT CAST(COALESCE(SUM(jc.n), 0) AS BIGINT) FROM {table} jc \
                 LEFT JOIN programs p ON p.id = jc.program_id {clause}"
            ),
            params,
        )];
        if let Some(after) = self.created_after {
            let (clause, mut params) = self.clause(&JOB_COLUMNS);
            params.push(Param::Int((day_of(after) + 1) * DAY_MICROS));
            queries.push((format!("SELECT COUNT(*) FROM jobs j {clause} AND j.created < ${}", params.len()), params));
        }
        queries
    }
}

macro_rules! bind_params {
    ($query:expr, $params:expr) => {{
        let mut query = $query;
        for param in $params {
            query = match param {
                Param::Text(text) => query.bind(text.clone()),
                Param::Int(value) => query.bind(*value),
            };
        }
        query
    }};
}

/// One page of jobs, newest first, and the total matching.
pub async fn list(db: &Db, filter: &JobFilter, limit: Option<i64>, offset: i64) -> Result<(i64, Vec<JobRow>), Error> {
    let (clause, params) = filter.where_clause();
    // The page is chosen on the jobs table alone (its index gives the order), then joined.
    let page_sql = format!(
        "{} FROM (SELECT * FROM jobs j {clause} ORDER BY j.created DESC, j.id DESC LIMIT {} OFFSET {}) j {} \
         ORDER BY j.created DESC, j.id DESC",
        job_columns!(),
        limit.map(|l| l.max(0)).unwrap_or(i64::MAX),
        offset.max(0),
        job_joins!(),
    );
    let mut count = 0;
    for (count_sql, count_params) in filter.count_queries() {
        count += on_db!(db, pool => bind_params!(sqlx::query_scalar::<_, i64>(&count_sql), &count_params).fetch_one(pool).await)
            .map_err(query_error("count jobs"))?;
    }
    let rows = on_db!(db, pool => bind_params!(sqlx::query_as::<_, JobRow>(&page_sql), &params).fetch_all(pool).await)
        .map_err(query_error("list jobs"))?;
    Ok((count, rows))
}
