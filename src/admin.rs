//! `gantry admin`: users, groups, providers, grants and functions managed without SQL, and the
//! history's garbage collection (`gc`, see `retention`).

use anyhow::{Context, bail};
use clap::{Args, Subcommand};

use crate::compute::quotas;
use crate::db::{self, DatabaseArgs, Db};
use crate::storage::{Storage, StorageArgs};

#[derive(Debug, Args)]
pub struct AdminArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// The object storage, opened by `gc` only (the other commands need no storage credentials).
    #[command(flatten)]
    pub storage: StorageArgs,
    #[command(subcommand)]
    pub command: AdminCommand,
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Create a provider (or change its registry) and its admin group `<name>-admins`.
    CreateProvider {
        name: String,
        /// Custom images of this provider must equal this registry or start with it and `/`.
        #[arg(long)]
        registry: Option<String>,
    },
    /// Add a user to a provider's admin group (creates the user if needed).
    AddAdmin {
        #[arg(long)]
        provider: String,
        #[arg(long)]
        user: String,
    },
    /// Remove a user from a provider's admin group.
    RemoveAdmin {
        #[arg(long)]
        provider: String,
        #[arg(long)]
        user: String,
    },
    /// Add a user to a group (creates both if needed).
    AddMember {
        #[arg(long)]
        group: String,
        #[arg(long)]
        user: String,
    },
    /// Grant a group view and/or run on a provider function; with neither flag, revoke.
    Grant {
        #[arg(long)]
        provider: String,
        #[arg(long)]
        function: String,
        #[arg(long)]
        group: String,
        #[arg(long)]
        view: bool,
        #[arg(long)]
        run: bool,
    },
    /// Make a group one of a provider function's trial groups (the reference's
    /// `trial_instances`): runs by its members are trials (`ENV_ACCESS_TRIAL=True`) where the
    /// group is also granted run (`grant --run`).
    AddTrialGroup {
        #[arg(long)]
        provider: String,
        #[arg(long)]
        function: String,
        #[arg(long)]
        group: String,
    },
    /// Make a group no longer one of a provider function's trial groups.
    RemoveTrialGroup {
        #[arg(long)]
        provider: String,
        #[arg(long)]
        function: String,
        #[arg(long)]
        group: String,
    },
    /// Disable a provider function: runs answer 423 with the message (default: the reference's
    /// text) until it is enabled again.
    DisableFunction {
        #[arg(long)]
        provider: String,
        #[arg(long)]
        function: String,
        #[arg(long)]
        message: Option<String>,
    },
    /// Enable a disabled provider function again.
    EnableFunction {
        #[arg(long)]
        provider: String,
        #[arg(long)]
        function: String,
    },
    /// Refuse every request of a user (401) until reactivated.
    DeactivateUser { user: String },
    /// Allow a deactivated user again.
    ActivateUser { user: String },
    /// Job events the outbound sinks could not take (given up, or rejected), with their errors.
    EventsFailed {
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// Queue every undeliverable job event again (after fixing the sink), to be sent at once.
    EventsRetry,
    /// Count the kept job counts again from the jobs (after loading jobs by other means, or to
    /// repair drift); holds writes to the jobs while it counts.
    Recount,
    /// Set a monthly budget (docs/usage.md): a user's, a group's (its members' jobs together) or
    /// a provider's function's (every user's jobs of it), in CPU-hours and GPU-hours; a run past
    /// a spent budget is refused with 429, running jobs go on. Without either limit, or with
    /// --remove, the budget goes.
    SetBudget {
        /// The user whose jobs it limits.
        #[arg(long, conflicts_with_all = ["group", "provider"])]
        user: Option<String>,
        /// The group whose members' jobs it limits together.
        #[arg(long, conflicts_with = "provider")]
        group: Option<String>,
        /// With --function: the provider function whose jobs it limits.
        #[arg(long, requires = "function")]
        provider: Option<String>,
        #[arg(long, requires = "provider")]
        function: Option<String>,
        /// Allocated CPU a month: cores × hours (e.g. 100, 2.5).
        #[arg(long)]
        cpu_hours: Option<f64>,
        /// GPU time a month: GPUs × hours.
        #[arg(long)]
        gpu_hours: Option<f64>,
        /// Remove the budget.
        #[arg(long, conflicts_with_all = ["cpu_hours", "gpu_hours"])]
        remove: bool,
    },
    /// List the budgets with this month's use.
    Budgets,
    /// Declare a tenant or change its quotas (docs/scheduling.md): a provider (its functions'
    /// jobs), a group (its members' jobs of user functions) or an instance (the jobs run for it
    /// under runtime_platform), with guaranteed CPU and GPU slots, borrowing caps and a weight.
    /// What is not given keeps its value (a new tenant: no guarantee, no cap, weight 1).
    /// Applies at the next admission pass, on every runner; --remove takes the tenant away.
    SetQuota {
        #[arg(long, conflicts_with_all = ["group", "instance"])]
        provider: Option<String>,
        #[arg(long, conflicts_with = "instance")]
        group: Option<String>,
        /// The instance's name, as runs carry it in `Service-CRN`.
        #[arg(long)]
        instance: Option<String>,
        /// CPU-job slots guaranteed.
        #[arg(long)]
        cpu: Option<i64>,
        /// GPU-job slots guaranteed.
        #[arg(long)]
        gpu: Option<i64>,
        /// CPU slots it may use beyond its guarantee, or `none` for no cap.
        #[arg(long, value_parser = quotas::parse_cap)]
        cpu_borrow_cap: Option<quotas::Cap>,
        /// GPU slots it may use beyond its guarantee, or `none` for no cap.
        #[arg(long, value_parser = quotas::parse_cap)]
        gpu_borrow_cap: Option<quotas::Cap>,
        /// The GPU model its GPU guarantee is of (a profile's model: h200, a100p), or `any`:
        /// only its jobs asking for that model count toward it and are served first.
        #[arg(long, value_parser = quotas::parse_gpu_model)]
        gpu_model: Option<quotas::GpuModel>,
        /// Its share of lent capacity against the others' (1 to 1000).
        #[arg(long)]
        weight: Option<i64>,
        /// Remove the tenant: its jobs go to the next tenant that matches them, or to none.
        #[arg(long, conflicts_with_all = ["cpu", "gpu", "cpu_borrow_cap", "gpu_borrow_cap", "gpu_model", "weight"])]
        remove: bool,
    },
    /// List the tenants with their quotas and what the last admission pass saw of each.
    Quotas,
    /// The usage ledger's totals for a period (docs/usage.md): everyone's, or one user's or one
    /// provider's, grouped by function, size, day, user or provider; as a table or CSV.
    Usage {
        /// First day (`YYYY-MM-DD`, UTC; default: the first of this month).
        #[arg(long)]
        from: Option<String>,
        /// Day after the period (default: the first of next month).
        #[arg(long)]
        to: Option<String>,
        /// function, size, day, user or provider.
        #[arg(long, default_value = "function")]
        group_by: String,
        /// Only this user's jobs (by name).
        #[arg(long, conflicts_with = "provider")]
        user: Option<String>,
        /// Only the jobs of this provider's functions (by name).
        #[arg(long)]
        provider: Option<String>,
        /// Comma-separated values with a header line, for a spreadsheet.
        #[arg(long)]
        csv: bool,
    },
    /// Delete finished jobs (SUCCEEDED, FAILED, STOPPED) last updated more than --older-than days
    /// ago, with their events, runtime jobs and objects (arguments, result, logs), in batches.
    Gc {
        /// Days since a finished job's last update: a number, 0 or more (fractions allowed).
        #[arg(long, value_parser = crate::retention::parse_days)]
        older_than: std::time::Duration,
        /// Say what would be deleted (jobs, events, objects, the oldest and newest job) and
        /// delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

impl AdminArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        let Self { database, storage, command } = self;
        let db = database.open().await?;
        let storage = match command {
            AdminCommand::Gc { .. } => Some(storage.open(&database.data_dir)?),
            _ => None,
        };
        println!("{}", admin_with(&db, storage.as_ref(), command).await?);
        Ok(())
    }
}

fn check_user_name(user: &str) -> anyhow::Result<()> {
    if !crate::domain::names::is_valid_user_name(user) {
        bail!("invalid user name '{user}': use 1-150 letters, digits, '_', '.', '@' or '-'");
    }
    Ok(())
}

async fn find_provider_function(db: &Db, provider: &str, function: &str) -> anyhow::Result<db::programs::ProgramRow> {
    let provider_row = find_provider(db, provider).await?;
    // Any user id works for the lookup: only the function itself is needed here.
    db::programs::find_provider_function(db, "", &provider_row.id, function)
        .await?
        .with_context(|| format!("function {provider}/{function} does not exist"))
}

async fn find_provider(db: &Db, name: &str) -> anyhow::Result<db::providers::ProviderRow> {
    db::providers::find_by_name(db, name).await?.with_context(|| {
        format!("provider {name} does not exist (create it with `gantry admin create-provider {name}`)")
    })
}

/// Carries out one admin command that needs only the database, and says what it did.
pub async fn admin(db: &Db, command: AdminCommand) -> anyhow::Result<String> {
    admin_with(db, None, command).await
}

/// Carries out one admin command and says what it did; `gc` needs `storage`.
pub async fn admin_with(db: &Db, storage: Option<&Storage>, command: AdminCommand) -> anyhow::Result<String> {
    use crate::db::{programs, providers, users};
    Ok(match command {
        AdminCommand::CreateProvider { name, registry } => {
            let clean = crate::domain::names::sanitize_title(&name, false);
            if clean != name || name.is_empty() {
                bail!("invalid provider name '{name}': use letters, digits, '_' and '-'");
            }
            providers::upsert(db, &name, registry.as_deref()).await?;
            format!("provider {name} ready (admin group {})", providers::admin_group_name(&name))
        }
        AdminCommand::AddAdmin { provider, user } => {
            check_user_name(&user)?;
            let provider = find_provider(db, &provider).await?;
            let group = users::ensure_group(db, &providers::admin_group_name(&provider.name)).await?;
            providers::add_admin_group(db, &provider.id, &group.id).await?;
            let user_row = users::ensure(db, &user).await?;
            users::add_member(db, &group.id, &user_row.id).await?;
            format!("{user} is now an admin of provider {}", provider.name)
        }
        AdminCommand::RemoveAdmin { provider, user } => {
            let provider = find_provider(db, &provider).await?;
            let group = users::find_group(db, &providers::admin_group_name(&provider.name)).await?;
            let user_row = users::find_by_username(db, &user).await?;
            let removed = match (group, user_row) {
                (Some(group), Some(user_row)) => users::remove_member(db, &group.id, &user_row.id).await?,
                _ => false,
            };
            if removed {
                format!("{user} is no longer an admin of provider {}", provider.name)
            } else {
                format!("{user} was not an admin of provider {}", provider.name)
            }
        }
        AdminCommand::AddMember { group, user } => {
            check_user_name(&user)?;
            let group_row = users::ensure_group(db, &group).await?;
            let user_row = users::ensure(db, &user).await?;
            users::add_member(db, &group_row.id, &user_row.id).await?;
            format!("{user} is now a member of group {group}")
        }
        AdminCommand::DisableFunction { provider, function, message } => {
            let program = find_provider_function(db, &provider, &function).await?;
            programs::set_disabled(db, &program.id, true, message.as_deref()).await?;
            format!("{provider}/{function} is disabled")
        }
        AdminCommand::EnableFunction { provider, function } => {
            let program = find_provider_function(db, &provider, &function).await?;
            programs::set_disabled(db, &program.id, false, None).await?;
            format!("{provider}/{function} is enabled")
        }
        AdminCommand::Grant { provider, function, group, view, run } => {
            let program = find_provider_function(db, &provider, &function).await?;
            let group_row = users::ensure_group(db, &group).await?;
            programs::grant(db, &program.id, &group_row.id, view, run).await?;
            format!("group {group} on {provider}/{function}: view={view} run={run}")
        }
        AdminCommand::AddTrialGroup { provider, function, group } => {
            let program = find_provider_function(db, &provider, &function).await?;
            let group_row = users::ensure_group(db, &group).await?;
            programs::set_trial_group(db, &program.id, &group_row.id, true).await?;
            let mut said = format!("group {group} is a trial group of {provider}/{function}");
            if !programs::run_granted_to(db, &program.id, &group_row.id).await? {
                said.push_str(&format!(
                    " (its members' runs become trials once it is granted run: \
                     gantry admin grant --provider {provider} --function {function} --group {group} --run)"
                ));
            }
            said
        }
        AdminCommand::RemoveTrialGroup { provider, function, group } => {
            let program = find_provider_function(db, &provider, &function).await?;
            let removed = match users::find_group(db, &group).await? {
                Some(group_row) => programs::set_trial_group(db, &program.id, &group_row.id, false).await?,
                None => false,
            };
            match removed {
                true => format!("group {group} is no longer a trial group of {provider}/{function}"),
                false => format!("group {group} was not a trial group of {provider}/{function}"),
            }
        }
        AdminCommand::DeactivateUser { user } => {
            check_user_name(&user)?;
            users::ensure(db, &user).await?;
            users::set_active(db, &user, false).await?;
            format!("user {user} deactivated")
        }
        AdminCommand::ActivateUser { user } => {
            if !users::set_active(db, &user, true).await? {
                bail!("user {user} does not exist");
            }
            format!("user {user} activated")
        }
        AdminCommand::EventsFailed { limit } => {
            let (waiting, delivered, failed) = db::outbox::counts(db).await?;
            let mut lines =
                vec![format!("event outbox: {waiting} waiting, {delivered} delivered (kept), {failed} undeliverable")];
            for (event, job, error) in db::outbox::failures(db, limit.max(0)).await? {
                lines.push(format!("event {event} of job {job}: {error}"));
            }
            lines.join("\n")
        }
        AdminCommand::EventsRetry => {
            let requeued = db::outbox::requeue_failed(db).await?;
            format!(
                "{requeued} undeliverable events queued again (a running publisher sends them within its poll period)"
            )
        }
        AdminCommand::Recount => {
            let recounted = db::counts::recount(db).await?;
            let months = db::usage::sum_months(db, db::usage::months_summed_before(db::now_micros())).await?;
            format!("{recounted}; usage totals of {months} ended months summed again")
        }
        AdminCommand::SetBudget { user, group, provider, function, cpu_hours, gpu_hours, remove } => {
            use crate::db::budgets::{self, Kind};
            let (kind, subject_id, name) = match (user, group, provider.zip(function)) {
                (Some(user), _, _) => {
                    let row = users::find_by_username(db, &user)
                        .await?
                        .with_context(|| format!("user {user} does not exist"))?;
                    (Kind::User, row.id, format!("user {user}"))
                }
                (None, Some(group), _) => {
                    let row = users::find_group(db, &group)
                        .await?
                        .with_context(|| format!("group {group} does not exist"))?;
                    (Kind::Group, row.id, format!("group {group}"))
                }
                (None, None, Some((provider, function))) => {
                    let program = find_provider_function(db, &provider, &function).await?;
                    (Kind::Function, program.id, format!("function {provider}/{function}"))
                }
                (None, None, None) => bail!("say whose budget: --user, --group, or --provider with --function"),
            };
            let millis = |name: &str, hours: Option<f64>| -> anyhow::Result<Option<i64>> {
                match hours {
                    Some(h) if !(0.0..=1e9).contains(&h) => {
                        bail!("--{name} must be a number of hours from 0 to 1e9, got {h}")
                    }
                    Some(h) => Ok(Some((h * crate::domain::usage::HOUR_MS as f64).round() as i64)),
                    None => Ok(None),
                }
            };
            let (cpu, gpu) = (millis("cpu-hours", cpu_hours)?, millis("gpu-hours", gpu_hours)?);
            if remove || (cpu.is_none() && gpu.is_none()) {
                budgets::set(db, kind, &subject_id, None, None).await?;
                format!("budget of {name} removed")
            } else {
                budgets::set(db, kind, &subject_id, cpu, gpu).await?;
                let limit = |h: Option<f64>| h.map_or("no limit".to_string(), |h| format!("{h} h"));
                format!("budget of {name}: CPU {} a month, GPU {} a month", limit(cpu_hours), limit(gpu_hours))
            }
        }
        AdminCommand::SetQuota {
            provider,
            group,
            instance,
            cpu,
            gpu,
            cpu_borrow_cap,
            gpu_borrow_cap,
            gpu_model,
            weight,
            remove,
        } => {
            let (kind, key) = quotas::tenant_key(db, provider, group, instance).await?;
            if remove {
                let name = kind.name(&key);
                match db::tenants::remove(db, &name).await? {
                    true => format!(
                        "tenant {name} removed: its active jobs count against the next tenant that matches them, or none"
                    ),
                    false => bail!("tenant {name} does not exist"),
                }
            } else {
                let change = quotas::QuotaChange { cpu, gpu, cpu_borrow_cap, gpu_borrow_cap, gpu_model, weight };
                quotas::set(db, kind, &key, &change).await?
            }
        }
        AdminCommand::Quotas => quotas::list(db).await?,
        AdminCommand::Budgets => {
            let now = db::now_micros();
            let (from, to) = crate::domain::usage::month_of(db::counts::day_of(now));
            let mut lines = vec![format!(
                "budgets for {} (they reset on {})",
                &crate::domain::usage::date_of(from)[..7],
                crate::domain::usage::date_of(to)
            )];
            let hours = |ms: i64| format!("{:.3}", ms as f64 / crate::domain::usage::HOUR_MS as f64);
            for budget in db::budgets::list(db).await? {
                let used = db::budgets::used(db, &budget, from, to, now).await?;
                let of = |limit: Option<i64>, used: i64| match limit {
                    Some(limit) => format!("{} of {} h", hours(used), hours(limit)),
                    None => format!("{} h (no limit)", hours(used)),
                };
                lines.push(format!(
                    "{} {}: CPU {}, GPU {}",
                    budget.kind.as_str(),
                    budget.name,
                    of(budget.cpu_core_ms, used.cpu_core_ms),
                    of(budget.gpu_ms, used.gpu_ms)
                ));
            }
            if lines.len() == 1 {
                lines.push("(no budgets)".into());
            }
            lines.join("\n")
        }
        AdminCommand::Usage { from, to, group_by, user, provider, csv } => {
            usage_report(db, from, to, &group_by, user, provider, csv).await?
        }
        AdminCommand::Gc { older_than, dry_run } => {
            let storage = storage.context("gantry admin gc needs the object storage")?;
            let policy = crate::retention::Policy::new(older_than);
            let now = db::now_micros();
            let report = match dry_run {
                true => crate::retention::survey(db, storage, &policy, now).await?,
                false => crate::retention::collect(db, storage, &policy, now).await?,
            };
            report.to_string()
        }
    })
}

/// `gantry admin usage`: the totals as a table, or CSV.
async fn usage_report(
    db: &Db,
    from: Option<String>,
    to: Option<String>,
    group_by: &str,
    user: Option<String>,
    provider: Option<String>,
    csv: bool,
) -> anyhow::Result<String> {
    use crate::db::usage::{GroupBy, Scope};
    use crate::domain::usage::{date_of, day_number, month_of};
    let now = db::now_micros();
    let (this_month, next_month) = month_of(db::counts::day_of(now));
    let day = |name: &str, text: Option<String>, default: i64| match text {
        None => Ok(default),
        Some(text) => day_number(&text).with_context(|| format!("--{name} must be a date as YYYY-MM-DD, got '{text}'")),
    };
    let (from, to) = (day("from", from, this_month)?, day("to", to, next_month)?);
    if to <= from {
        bail!("--to ({}) must be after --from ({})", date_of(to), date_of(from));
    }
    let grouping = match group_by {
        "function" => GroupBy::Function,
        "size" => GroupBy::Size,
        "day" => GroupBy::Day,
        "user" => GroupBy::User,
        "provider" => GroupBy::Provider,
        other => bail!("--group-by must be one of function, size, day, user, provider; got '{other}'"),
    };
    let user_id = match &user {
        Some(name) => Some(
            db::users::find_by_username(db, name).await?.with_context(|| format!("user {name} does not exist"))?.id,
        ),
        None => None,
    };
    let provider_id = match &provider {
        Some(name) => Some(
            db::providers::find_by_name(db, name).await?.with_context(|| format!("provider {name} does not exist"))?.id,
        ),
        None => None,
    };
    let scope = match (&user_id, &provider_id) {
        (Some(id), _) => Scope::User(id),
        (None, Some(id)) => Scope::Provider(id),
        (None, None) => Scope::Everyone,
    };
    let totals = db::usage::totals(db, scope, from, to, grouping, now).await?;
    let seconds = |ms: i64| format!("{:.3}", ms as f64 / 1000.0);
    let rows: Vec<[String; 9]> = totals
        .iter()
        .map(|t| {
            let key =
                if grouping == GroupBy::Day { t.key.parse().map_or(t.key.clone(), date_of) } else { t.key.clone() };
            let f = t.figures;
            [
                key,
                t.name.clone().unwrap_or_default(),
                t.jobs.to_string(),
                t.running.to_string(),
                seconds(f.wait_ms),
                seconds(f.run_ms),
                seconds(f.cpu_core_ms),
                seconds(f.gib_ms),
                seconds(f.gpu_ms),
            ]
        })
        .collect();
    let header = [
        group_by,
        "name",
        "jobs",
        "running",
        "wait_seconds",
        "run_seconds",
        "cpu_core_seconds",
        "gib_seconds",
        "gpu_seconds",
    ];
    if csv {
        let field = |text: &str| {
            if text.contains([',', '"', '\n', '\r']) {
                format!("\"{}\"", text.replace('"', "\"\""))
            } else {
                text.to_string()
            }
        };
        let mut lines = vec![header.join(",")];
        lines.extend(rows.iter().map(|row| row.iter().map(|f| field(f)).collect::<Vec<_>>().join(",")));
        return Ok(lines.join("\n"));
    }
    let mut lines = vec![format!("usage from {} to {} (the day after), by {group_by}", date_of(from), date_of(to))];
    lines.push(header.join("\t"));
    lines.extend(rows.iter().map(|row| row.join("\t")));
    if rows.is_empty() {
        lines.push("(no usage in this period)".into());
    }
    Ok(lines.join("\n"))
}
