//! The job listings: their filters, turned into one `WHERE` clause for the page and the counts
//! (read from the kept counts where the filters allow), and the page query.

use super::{DAY_MICROS, JobRow, day_of};
use crate::db::params::Param;
use crate::db::{Db, Error, query_error};
use crate::domain::paging::{Cursor, Direction};

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
    /// The jobs of the provider of this name, read only when the user administers it (then
    /// `provider_id` is left out): `page_if_admin` finds the provider and the right in the
    /// listing's own statement.
    pub admin_of: Option<AdminOf>,
}

/// A provider by name and a user who must administer it.
#[derive(Debug, Clone)]
pub struct AdminOf {
    pub provider: String,
    pub user_id: String,
}

impl JobFilter {
    /// The SQL expression of the provider's id the listing is narrowed to, binding its
    /// parameter: the id, or the provider found by name.
    fn provider_expression(&self, params: &mut Vec<Param>) -> Option<String> {
        match (&self.provider_id, &self.admin_of) {
            (Some(id), _) => Some(bind(params, Param::Text(id.clone()))),
            (None, Some(admin)) => Some(format!(
                "(SELECT id FROM providers WHERE name = {})",
                bind(params, Param::Text(admin.provider.clone()))
            )),
            (None, None) => None,
        }
    }

    /// Whether the listing may be read: true, or with `admin_of` whether its user administers
    /// its provider (false when there is no such provider).
    fn allowed_expression(&self, params: &mut Vec<Param>) -> String {
        match &self.admin_of {
            None => "TRUE".to_string(),
            Some(admin) => {
                let provider = bind(params, Param::Text(admin.provider.clone()));
                let user = bind(params, Param::Text(admin.user_id.clone()));
                format!(
                    "EXISTS (SELECT 1 FROM providers pr JOIN provider_admin_groups a ON a.provider_id = pr.id \
                     JOIN group_members m ON m.group_id = a.group_id WHERE pr.name = {provider} AND m.user_id = {user})"
                )
            }
        }
    }
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
    /// `WHERE …` over the given columns; its parameters are appended to `params` and numbered
    /// after those already there.
    fn clause(&self, columns: &FilterColumns, params: &mut Vec<Param>) -> String {
        let mut clauses = Vec::new();
        if let Some(author) = &self.author_id {
            clauses.push(format!("{} = {}", columns.author, bind(params, Param::Text(author.clone()))));
        }
        if let Some(provider) = self.provider_expression(params) {
            clauses.push(format!("{} = {provider}", columns.provider));
        }
        if let Some(status) = &self.status {
            clauses.push(format!("{} = {}", columns.status, bind(params, Param::Text(status.clone()))));
        }
        if let Some(after) = self.created_after {
            clauses.push(match columns.by_day {
                true => format!("jc.day > {}", bind(params, Param::Int(day_of(after)))),
                false => format!("j.created >= {}", bind(params, Param::Int(after))),
            });
        }
        if let Some(ids) = &self.program_ids {
            let placeholders: Vec<String> = ids.iter().map(|id| bind(params, Param::Text(id.clone()))).collect();
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
        if clauses.is_empty() { String::new() } else { format!("WHERE {}", clauses.join(" AND ")) }
    }

    /// The count of matching jobs, as one SQL expression: from the kept counts; with
    /// `created_after`, the whole days after its day from `job_counts_by_day` plus that day's
    /// rows counted in `jobs`.
    ///
    /// A provider's count, unless narrowed to functions, users or days, is the sum of its few
    /// rows in `job_provider_counts`. Narrowed, it sums its functions' counts one function at a time (a correlated
    /// subquery per function: a range of `job_counts_program_idx` each). Joined, the planner
    /// read all of `job_counts` instead (926,000 rows, 243 ms at 10 million jobs), as it cannot
    /// know that 100 functions hold a fraction of it.
    fn count_expression(&self, params: &mut Vec<Param>) -> String {
        let table = if self.created_after.is_some() { "job_counts_by_day" } else { "job_counts" };
        let narrowed = self.author_id.is_some()
            || self.program_ids.is_some()
            || self.created_after.is_some()
            || self.catalog.is_some();
        let kept = match self.provider_expression(params) {
            // A provider's jobs, by status or not: its own few rows (migration 0021).
            Some(provider) if !narrowed => {
                let status = match &self.status {
                    Some(status) => format!(" AND status = {}", bind(params, Param::Text(status.clone()))),
                    None => String::new(),
                };
                format!(
                    "(SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM job_provider_counts WHERE provider_id = {provider}{status})"
                )
            }
            Some(provider) => {
                let rest =
                    JobFilter { provider_id: None, admin_of: None, ..self.clone() }.clause(&COUNT_COLUMNS, params);
                let of_function = match rest.is_empty() {
                    true => "WHERE jc.program_id = p.id".to_string(),
                    false => format!("{rest} AND jc.program_id = p.id"),
                };
                format!(
                    "(SELECT CAST(COALESCE(SUM((SELECT SUM(jc.n) FROM {table} jc {of_function})), 0) AS BIGINT) \
                     FROM programs p WHERE p.provider_id = {provider})"
                )
            }
            None => {
                let clause = self.clause(&COUNT_COLUMNS, params);
                format!(
                    "(SELECT CAST(COALESCE(SUM(jc.n), 0) AS BIGINT) FROM {table} jc \
                     LEFT JOIN programs p ON p.id = jc.program_id {clause})"
                )
            }
        };
        match self.created_after {
            None => kept,
            Some(after) => {
                let clause = self.clause(&JOB_COLUMNS, params);
                let day_end = bind(params, Param::Int((day_of(after) + 1) * DAY_MICROS));
                format!("{kept} + (SELECT COUNT(*) FROM jobs j {clause} AND j.created < {day_end})")
            }
        }
    }
}

/// Appends `param` and answers its placeholder.
fn bind(params: &mut Vec<Param>, param: Param) -> String {
    params.push(param);
    format!("${}", params.len())
}

/// `sql` with each `$N` replaced by the literal of `params[N - 1]`, or `None` when a value
/// cannot be written safely as a plain literal: text holding a backslash (an escape where
/// `standard_conforming_strings` is off) or a NUL (which ends a simple query's text), or a
/// placeholder without its value. Quotes are doubled; nothing else needs escaping then, on
/// either setting.
pub(super) fn with_values_written_in(sql: &str, params: &[Param]) -> Option<String> {
    let mut out = String::with_capacity(sql.len() + 64);
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..].bytes().take_while(u8::is_ascii_digit).count();
        let number: usize = rest[at + 1..at + 1 + digits].parse().ok()?;
        match params.get(number.checked_sub(1)?)? {
            // In brackets when negative: `x-$1` must not become the comment `x--1`.
            Param::Int(value) if *value < 0 => out.push_str(&format!("({value})")),
            Param::Int(value) => out.push_str(&value.to_string()),
            Param::Bool(value) => out.push_str(if *value { "TRUE" } else { "FALSE" }),
            // Never bound by a listing; written as the database would read them.
            Param::OptInt(None) | Param::OptText(None) => out.push_str("NULL"),
            Param::OptInt(Some(value)) => out.push_str(&format!("({value})")),
            Param::OptText(Some(_)) => return None,
            Param::Text(text) if text.contains(['\\', '\0']) => return None,
            Param::Text(text) => {
                out.push('\'');
                out.push_str(&text.replace('\'', "''"));
                out.push('\'');
            }
        }
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    Some(out)
}

/// Runs a page statement built with `bind`'s placeholders and reads its rows: per row the
/// leading columns (`$head`, an expression of `$row`), and the job when the row holds one (a
/// page past the end is one row of NULL job columns). Answers `(last head, jobs)`, `None` as
/// head for no rows at all. A statement not `$persistent` is planned for its values; on
/// PostgreSQL it goes as one query with its values written in (one round trip, one
/// transaction); bound to an unnamed statement it takes two (sqlx describes the statement
/// first, and each exchange ends PostgreSQL's implicit transaction).
macro_rules! page_rows {
    ($db:expr, $sql:expr, $params:expr, $persistent:expr, $row:ident => $head:expr) => {{
        let inlined = match $db {
            $crate::db::Db::Postgres(_) if !$persistent => {
                $crate::db::jobs::listing::with_values_written_in($sql, $params)
            }
            _ => None,
        };
        $crate::db::on_db!($db, pool => async {
            let rows = match &inlined {
                Some(text) => sqlx::raw_sql(text).fetch_all(pool).await?,
                None => $crate::db::jobs::bind_params!(sqlx::query($sql).persistent($persistent), $params)
                    .fetch_all(pool)
                    .await?,
            };
            let mut head = None;
            let mut jobs: Vec<$crate::db::jobs::JobRow> = Vec::with_capacity(rows.len());
            for $row in &rows {
                head = Some($head);
                if sqlx::Row::try_get::<Option<String>, _>($row, "id")?.is_some() {
                    jobs.push(sqlx::FromRow::from_row($row)?);
                }
            }
            Ok::<_, sqlx::Error>((head, jobs))
        }.await)
    }};
}
pub(super) use page_rows;

/// Which part of a listing to read.
#[derive(Debug, Clone, Copy)]
pub enum Window<'a> {
    /// Skip this many jobs (the reference's pagination).
    Offset(i64),
    /// The jobs on one side of a cursor's job; `None`: from the newest.
    Keyset(Option<&'a Cursor>),
}

/// One page of jobs, newest first, and the total matching, in one statement: the count is
/// joined to the page, so a page past the end still carries it (a row of NULL job columns).
pub async fn list(db: &Db, filter: &JobFilter, limit: Option<i64>, offset: i64) -> Result<(i64, Vec<JobRow>), Error> {
    let (total, jobs, _) = page_if_admin(db, filter, limit, Window::Offset(offset)).await?.unwrap_or_default();
    Ok((total, jobs))
}

/// The largest page whose statement is prepared once and kept (see `page`).
const PLANNED_WITH_VALUES_ABOVE: i64 = 100;

/// One page of jobs, newest first, the total matching, and (for a keyset window) whether more
/// jobs lie beyond the page on the side it was read towards; one statement.
///
/// An offset window past the first page picks the page's ids alone first (the filter's index
/// holds them, so the skipped jobs' rows are never read), then reads those jobs. A keyset window
/// starts in the index at the cursor's job and reads one job more than the page, to tell
/// whether more follow.
///
/// With `admin_of`: `None` when its user does not administer its provider (or there is no such
/// provider), found in the page's own statement, so an admin's listing is one round trip.
/// Without `admin_of`, always `Some`.
pub async fn page_if_admin(
    db: &Db,
    filter: &JobFilter,
    limit: Option<i64>,
    window: Window<'_>,
) -> Result<Option<(i64, Vec<JobRow>, bool)>, Error> {
    let mut params = Vec::new();
    let allowed = filter.allowed_expression(&mut params);
    let count = filter.count_expression(&mut params);
    let mut clause = filter.clause(&JOB_COLUMNS, &mut params);
    let limit = limit.map(|l| l.max(0));
    let (selected, order, bounds, newer) = match window {
        Window::Offset(offset) => (
            if offset > 0 { "j.id" } else { "*" },
            "DESC",
            format!("LIMIT {} OFFSET {}", limit.unwrap_or(i64::MAX), offset.max(0)),
            false,
        ),
        Window::Keyset(from) => {
            let newer = from.is_some_and(|cursor| cursor.direction == Direction::Newer);
            if let Some(cursor) = from {
                let created = bind(&mut params, Param::Int(cursor.created));
                let id = bind(&mut params, Param::Text(cursor.id.clone()));
                let side = if newer { ">" } else { "<" };
                let condition = format!("(j.created, j.id) {side} ({created}, {id})");
                clause = match clause.is_empty() {
                    true => format!("WHERE {condition}"),
                    false => format!("{clause} AND {condition}"),
                };
            }
            let bounds = match limit {
                Some(limit) => format!("LIMIT {}", limit.saturating_add(1)),
                None => String::new(),
            };
            ("*", if newer { "ASC" } else { "DESC" }, bounds, newer)
        }
    };
    // The page is chosen on the jobs table alone (its index gives the order), then joined.
    let chosen = format!("SELECT {selected} FROM jobs j {clause} ORDER BY j.created {order}, j.id {order} {bounds}");
    let chosen = match selected {
        "*" => format!("({chosen}) j"),
        _ => format!("({chosen}) k JOIN jobs j ON j.id = k.id"),
    };
    let sql = format!(
        "SELECT total.n AS total, total.allowed AS allowed, page.* FROM (SELECT {allowed} AS allowed, {count} AS n) total \
         LEFT JOIN ({} FROM {chosen} {}) page ON total.allowed ORDER BY page.created DESC, page.id DESC",
        job_columns!(),
        job_joins!(),
    );
    // A page of more than `PLANNED_WITH_VALUES_ABOVE` jobs is planned for its own values: a
    // prepared statement's generic plan assumes every function or user has the average number
    // of jobs, and for 1,000 jobs of a function that has 166,290 (the scale seed's heaviest) it
    // read all of them and sorted (640 ms) instead of walking the index's first 1,000 (29 ms).
    // Planning each time costs ~0.3 ms, little beside such a page; small pages keep the cache.
    let persistent = limit.is_some_and(|limit| limit <= PLANNED_WITH_VALUES_ABOVE);
    let (head, mut jobs) =
        page_rows!(db, &sql, &params, persistent, row => (sqlx::Row::try_get::<bool, _>(row, "allowed")?,
            sqlx::Row::try_get::<i64, _>(row, "total")?))
        .map_err(query_error("list jobs"))?;
    // The count's row is always there (the page is joined to it).
    let (allowed, total) = head.unwrap_or_default();
    if !allowed {
        return Ok(None);
    }
    let more = matches!(window, Window::Keyset(_)) && limit.is_some_and(|limit| jobs.len() as i64 > limit);
    if more {
        // The job beyond the page: the oldest when read towards older jobs, else the newest.
        if newer {
            jobs.remove(0)
        } else {
            jobs.pop().expect("more jobs than the limit")
        };
    }
    Ok(Some((total, jobs, more)))
}

#[cfg(test)]
mod tests {
    use super::{Param, with_values_written_in};

    #[test]
    fn values_are_written_in_as_literals_or_not_at_all() {
        let params: Vec<Param> = (1..=10).map(Param::Int).chain([Param::Text("o'brien".into())]).collect();
        let sql = "SELECT $1, $10, $11 FROM t WHERE a = $2";
        assert_eq!(
            with_values_written_in(sql, &params).as_deref(),
            Some("SELECT 1, 10, 'o''brien' FROM t WHERE a = 2")
        );
        // A value that a plain literal cannot carry safely, or a placeholder without a value:
        // the caller binds instead.
        assert_eq!(with_values_written_in("SELECT $1", &[Param::Text("a\\' OR true --".into())]), None);
        assert_eq!(with_values_written_in("SELECT $1", &[Param::Text("a\0b".into())]), None);
        assert_eq!(with_values_written_in("SELECT x-$1", &[Param::Int(-1)]).as_deref(), Some("SELECT x-(-1)"));
        assert_eq!(with_values_written_in("SELECT $2", &[Param::Int(1)]), None);
        assert_eq!(with_values_written_in("SELECT $0", &[Param::Int(1)]), None);
        assert_eq!(with_values_written_in("SELECT $ 1", &[Param::Int(1)]), None);
    }
}
