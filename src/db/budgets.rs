//! Budgets (`budgets`, migration 0025): an operator's monthly limit on the allocated CPU and
//! GPU time of a user, a group (its members' jobs together) or a function (every user's jobs of
//! it), checked by `run` against the usage ledger's totals of the month.

use super::usage::{self, GroupBy, Scope};
use super::{Db, Error, on_db, query_error};
use crate::domain::usage::Figures;

/// What a budget limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    User,
    Group,
    Function,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::User => "user",
            Kind::Group => "group",
            Kind::Function => "function",
        }
    }

    fn parse(text: &str) -> Kind {
        match text {
            "user" => Kind::User,
            "group" => Kind::Group,
            _ => Kind::Function,
        }
    }
}

/// A budget, with the name of what it limits (the user's or group's name, the function's
/// `provider/title`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub kind: Kind,
    pub subject_id: String,
    pub name: String,
    /// Allocated CPU a month, in core-milliseconds; `None`: no limit.
    pub cpu_core_ms: Option<i64>,
    /// GPU time a month, in GPU-milliseconds; `None`: no limit.
    pub gpu_ms: Option<i64>,
}

impl Budget {
    /// Whose usage the budget counts.
    pub fn scope(&self) -> Scope<'_> {
        match self.kind {
            Kind::User => Scope::User(&self.subject_id),
            Kind::Group => Scope::Group(&self.subject_id),
            Kind::Function => Scope::Function(&self.subject_id),
        }
    }
}

#[derive(sqlx::FromRow)]
struct BudgetRow {
    kind: String,
    subject_id: String,
    name: Option<String>,
    cpu_core_ms: Option<i64>,
    gpu_ms: Option<i64>,
}

impl From<BudgetRow> for Budget {
    fn from(row: BudgetRow) -> Budget {
        Budget {
            kind: Kind::parse(&row.kind),
            name: row.name.unwrap_or_else(|| row.subject_id.clone()),
            subject_id: row.subject_id,
            cpu_core_ms: row.cpu_core_ms,
            gpu_ms: row.gpu_ms,
        }
    }
}

/// The name of a budget's subject, as a SQL expression over `b`.
const NAME: &str = "CASE b.kind \
     WHEN 'user' THEN (SELECT u.username FROM users u WHERE u.id = b.subject_id) \
     WHEN 'group' THEN (SELECT g.name FROM user_groups g WHERE g.id = b.subject_id) \
     ELSE (SELECT COALESCE(pr.name || '/', '') || p.title FROM programs p LEFT JOIN providers pr ON pr.id = p.provider_id \
           WHERE p.id = b.subject_id) END";

/// Sets (or, with neither limit, removes) the budget of `kind` on `subject_id`.
pub async fn set(
    db: &Db,
    kind: Kind,
    subject_id: &str,
    cpu_core_ms: Option<i64>,
    gpu_ms: Option<i64>,
) -> Result<(), Error> {
    let (sql, both) = match (cpu_core_ms, gpu_ms) {
        (None, None) => ("DELETE FROM budgets WHERE kind = $1 AND subject_id = $2", false),
        _ => (
            "INSERT INTO budgets (kind, subject_id, cpu_core_ms, gpu_ms) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (kind, subject_id) DO UPDATE SET cpu_core_ms = excluded.cpu_core_ms, gpu_ms = excluded.gpu_ms",
            true,
        ),
    };
    // Announced: the servers' kept budgets of runs (`api::state::BudgetCache`) are forgotten.
    super::announced!(db, tx => {
        let query = sqlx::query(sql).bind(kind.as_str()).bind(subject_id);
        let query = if both { query.bind(cpu_core_ms).bind(gpu_ms) } else { query };
        query.execute(&mut *tx).await?.rows_affected()
    })
    .map_err(query_error("set a budget"))?;
    Ok(())
}

/// Every budget, by kind and name.
pub async fn list(db: &Db) -> Result<Vec<Budget>, Error> {
    let sql = format!("SELECT b.kind, b.subject_id, {NAME} AS name, b.cpu_core_ms, b.gpu_ms FROM budgets b");
    let rows: Vec<BudgetRow> = on_db!(db, pool => sqlx::query_as::<_, BudgetRow>(&sql).fetch_all(pool).await)
        .map_err(query_error("list budgets"))?;
    let mut budgets: Vec<Budget> = rows.into_iter().map(Budget::from).collect();
    budgets.sort_by(|a, b| (a.kind.as_str(), &a.name).cmp(&(b.kind.as_str(), &b.name)));
    Ok(budgets)
}

/// The budgets a run of `program_id` by `user_id` counts against: the user's, those of the
/// user's groups, the function's. One statement, by their keys.
pub async fn applying(db: &Db, user_id: &str, program_id: &str) -> Result<Vec<Budget>, Error> {
    let sql = format!(
        "SELECT b.kind, b.subject_id, {NAME} AS name, b.cpu_core_ms, b.gpu_ms FROM budgets b \
         WHERE (b.kind = 'user' AND b.subject_id = $1) \
            OR (b.kind = 'group' AND b.subject_id IN (SELECT m.group_id FROM group_members m WHERE m.user_id = $1)) \
            OR (b.kind = 'function' AND b.subject_id = $2)"
    );
    let rows: Vec<BudgetRow> = on_db!(db, pool => sqlx::query_as::<_, BudgetRow>(&sql)
        .bind(user_id)
        .bind(program_id)
        .fetch_all(pool)
        .await)
    .map_err(query_error("read the budgets of a run"))?;
    Ok(rows.into_iter().map(Budget::from).collect())
}

/// The budgets `user_id`'s runs count against as `jobs/queue/` shows them: the user's, their
/// groups', and those of the functions they ran since day `since_day` or have active jobs of.
/// One statement.
pub async fn of_user(db: &Db, user_id: &str, since_day: i64) -> Result<Vec<Budget>, Error> {
    let sql = format!(
        "SELECT b.kind, b.subject_id, {NAME} AS name, b.cpu_core_ms, b.gpu_ms FROM budgets b \
         WHERE (b.kind = 'user' AND b.subject_id = $1) \
            OR (b.kind = 'group' AND b.subject_id IN (SELECT m.group_id FROM group_members m WHERE m.user_id = $1)) \
            OR (b.kind = 'function' AND (b.subject_id IN (SELECT u.program_id FROM usage_by_day u \
                                                           WHERE u.author_id = $1 AND u.day >= $2) \
                 OR b.subject_id IN (SELECT j.program_id FROM jobs j WHERE j.author_id = $1 \
                                      AND j.status IN ('QUEUED', 'PENDING', 'RUNNING'))))"
    );
    let mut rows: Vec<BudgetRow> = on_db!(db, pool => sqlx::query_as::<_, BudgetRow>(&sql)
        .bind(user_id)
        .bind(since_day)
        .fetch_all(pool)
        .await)
    .map_err(query_error("read a user's budgets"))?;
    rows.sort_by(|a, b| (&a.kind, &a.name).cmp(&(&b.kind, &b.name)));
    Ok(rows.into_iter().map(Budget::from).collect())
}

/// What `budget`'s subject used over the days `[from_day, to_day)`, its running jobs counted up
/// to `now`.
pub async fn used(db: &Db, budget: &Budget, from_day: i64, to_day: i64, now: i64) -> Result<Figures, Error> {
    let totals = usage::totals(db, budget.scope(), from_day, to_day, GroupBy::Size, now).await?;
    Ok(totals.into_iter().fold(Figures::default(), |sum, total| sum.plus(total.figures)))
}
