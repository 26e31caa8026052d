//! Tenants and their quotas as an operator sets them (docs/scheduling.md): `gantry admin
//! set-quota` and `quotas`, and the seed `serve` and `controller` apply at start
//! (`--tenants`, the chart's `tenants`).

use anyhow::{Context, bail};
use serde::Deserialize;

use crate::db::tenants::{self, Kind, Quotas};
use crate::db::{Db, providers, users};

/// Most slots a guarantee or a borrowing cap may name.
pub const MAX_SLOTS: i64 = 1_000_000;
/// Largest weight.
pub const MAX_WEIGHT: i64 = 1_000;

/// A borrowing cap as given: a number of slots, or `none` for no cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap(pub Option<i64>);

/// `none` (no cap) or a number of slots.
pub fn parse_cap(text: &str) -> Result<Cap, String> {
    match text.trim() {
        "none" => Ok(Cap(None)),
        number => {
            number.parse::<i64>().ok().filter(|n| (0..=MAX_SLOTS).contains(n)).map(|n| Cap(Some(n))).ok_or_else(|| {
                format!("a borrowing cap is a number of slots from 0 to {MAX_SLOTS}, or none; got '{text}'")
            })
        }
    }
}

/// What `set-quota` was given; what is not given keeps its value (or, for a new tenant, its
/// default: no guarantee, no cap, weight 1).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuotaChange {
    pub cpu: Option<i64>,
    pub gpu: Option<i64>,
    pub cpu_borrow_cap: Option<Cap>,
    pub gpu_borrow_cap: Option<Cap>,
    /// The model its GPU guarantee is of.
    pub gpu_model: Option<GpuModel>,
    pub weight: Option<i64>,
}

/// A GPU model as given: a profile's model, or none (`any`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuModel(pub Option<String>);

/// A profile's model (`h200`, `a100p`), or `any`.
pub fn parse_gpu_model(text: &str) -> Result<GpuModel, String> {
    match text.trim() {
        "" | "any" => Ok(GpuModel(None)),
        model if model.len() <= 64 && model.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') => {
            Ok(GpuModel(Some(model.to_ascii_lowercase())))
        }
        other => Err(format!("a GPU model is a profile's model such as h200 or a100p, or any; got '{other}'")),
    }
}

/// A seed's cap: a number, `null` or `"none"` (no cap).
fn cap_field<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Cap>, D::Error> {
    match serde_json::Value::deserialize(deserializer)? {
        serde_json::Value::Null => Ok(Some(Cap(None))),
        serde_json::Value::String(text) => parse_cap(&text).map(Some).map_err(serde::de::Error::custom),
        serde_json::Value::Number(n) => parse_cap(&n.to_string()).map(Some).map_err(serde::de::Error::custom),
        other => Err(serde::de::Error::custom(format!("a borrowing cap is a number or none, got {other}"))),
    }
}

impl QuotaChange {
    /// The quotas after this change of `current` (a new tenant's defaults when none).
    pub fn apply(&self, current: Option<&tenants::TenantRow>) -> anyhow::Result<Quotas> {
        let slots = |name: &str, value: Option<i64>, current: i64| -> anyhow::Result<i64> {
            match value {
                Some(n) if !(0..=MAX_SLOTS).contains(&n) => {
                    bail!("--{name} is a number of slots from 0 to {MAX_SLOTS}, got {n}")
                }
                Some(n) => Ok(n),
                None => Ok(current),
            }
        };
        let weight = match self.weight {
            Some(w) if !(1..=MAX_WEIGHT).contains(&w) => bail!("--weight is from 1 to {MAX_WEIGHT}, got {w}"),
            Some(w) => w,
            None => current.map_or(1, |t| t.weight),
        };
        Ok(Quotas {
            cpu_guaranteed: slots("cpu", self.cpu, current.map_or(0, |t| t.cpu_guaranteed))?,
            cpu_borrow_cap: self.cpu_borrow_cap.map_or(current.and_then(|t| t.cpu_borrow_cap), |cap| cap.0),
            gpu_guaranteed: slots("gpu", self.gpu, current.map_or(0, |t| t.gpu_guaranteed))?,
            gpu_borrow_cap: self.gpu_borrow_cap.map_or(current.and_then(|t| t.gpu_borrow_cap), |cap| cap.0),
            gpu_model: match &self.gpu_model {
                Some(GpuModel(model)) => model.clone(),
                None => current.and_then(|t| t.gpu_model.clone()),
            },
            weight,
        })
    }
}

/// Which tenant: exactly one of a provider, a group or an instance, checked to exist (an
/// instance is any name the runs' `Service-CRN` carries).
pub async fn tenant_key(
    db: &Db,
    provider: Option<String>,
    group: Option<String>,
    instance: Option<String>,
) -> anyhow::Result<(Kind, String)> {
    match (provider, group, instance) {
        (Some(provider), None, None) => {
            providers::find_by_name(db, &provider)
                .await?
                .with_context(|| format!("provider {provider} does not exist"))?;
            Ok((Kind::Provider, provider))
        }
        (None, Some(group), None) => {
            users::find_group(db, &group).await?.with_context(|| format!("group {group} does not exist"))?;
            Ok((Kind::Group, group))
        }
        (None, None, Some(instance)) if !instance.trim().is_empty() => {
            Ok((Kind::Instance, instance.trim().to_string()))
        }
        (None, None, Some(_)) => bail!("--instance needs the instance's name (its CRN)"),
        _ => bail!("say which tenant: one of --provider, --group or --instance"),
    }
}

/// Sets a tenant's quotas; answers what it now is.
pub async fn set(db: &Db, kind: Kind, key: &str, change: &QuotaChange) -> anyhow::Result<String> {
    let name = kind.name(key);
    let current = tenants::list(db).await?.into_iter().find(|t| t.name == name);
    let quotas = change.apply(current.as_ref())?;
    let new = tenants::set(db, kind, key, quotas.clone()).await?;
    let cap = |cap: Option<i64>| cap.map_or("no cap".to_string(), |n| format!("at most {n} more"));
    Ok(format!(
        "tenant {name}: CPU {} guaranteed ({}), GPU {}{} guaranteed ({}), weight {}{}",
        quotas.cpu_guaranteed,
        cap(quotas.cpu_borrow_cap),
        quotas.gpu_guaranteed,
        quotas.gpu_model.as_ref().map(|m| format!(" {m}")).unwrap_or_default(),
        cap(quotas.gpu_borrow_cap),
        quotas.weight,
        if new { "; new: its active jobs count against it from the next admission pass" } else { "" }
    ))
}

/// Every tenant with its quotas and what the last admission pass saw.
pub async fn list(db: &Db) -> anyhow::Result<String> {
    let shares = tenants::shares(db).await?;
    let mut lines = Vec::new();
    for tenant in tenants::list(db).await? {
        let kind = |gpu: bool| {
            let (guaranteed, cap) = if gpu {
                (tenant.gpu_guaranteed, tenant.gpu_borrow_cap)
            } else {
                (tenant.cpu_guaranteed, tenant.cpu_borrow_cap)
            };
            let model = match (gpu, &tenant.gpu_model) {
                (true, Some(model)) => format!(" ({model})"),
                _ => String::new(),
            };
            let share = shares.iter().find(|s| s.tenant == tenant.name && s.gpu == gpu);
            let (used, firm, waiting) = share.map_or((0, 0, 0), |s| (s.used, s.firm, s.waiting));
            format!(
                "{}{model} guaranteed {guaranteed}, borrowing cap {}, using {used} ({} backfill), lent {}, waiting {waiting}",
                if gpu { "GPU" } else { "CPU" },
                cap.map_or("none".to_string(), |n| n.to_string()),
                used - firm,
                (guaranteed - firm).max(0)
            )
        };
        lines.push(format!("{} (weight {}): {}; {}", tenant.name, tenant.weight, kind(false), kind(true)));
    }
    if let Some(none) = shares
        .iter()
        .filter(|s| s.tenant.is_empty())
        .map(|s| (s.gpu, s.used, s.waiting))
        .reduce(|a, b| (a.0, a.1 + b.1, a.2 + b.2))
    {
        lines.push(format!("jobs of no tenant: using {}, waiting {}", none.1, none.2));
    }
    if lines.is_empty() {
        lines.push("(no tenants: admission is fair between users alone)".into());
    }
    Ok(lines.join("\n"))
}

/// One tenant of a seed (`GANTRY_TENANTS`, the chart's `tenants`): exactly one of `provider`,
/// `group`, `instance`, and its quotas.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Seeded {
    pub provider: Option<String>,
    pub group: Option<String>,
    pub instance: Option<String>,
    pub cpu: Option<i64>,
    pub gpu: Option<i64>,
    #[serde(default, deserialize_with = "cap_field")]
    pub cpu_borrow_cap: Option<Cap>,
    #[serde(default, deserialize_with = "cap_field")]
    pub gpu_borrow_cap: Option<Cap>,
    pub gpu_model: Option<String>,
    pub weight: Option<i64>,
}

/// Applies a seed (a JSON list of `Seeded`): each tenant declared or its quotas set to the
/// seed's. Answers a line per tenant.
pub async fn seed(db: &Db, json: &str) -> anyhow::Result<Vec<String>> {
    let seeded: Vec<Seeded> = serde_json::from_str(json).context("GANTRY_TENANTS is not a JSON list of tenants")?;
    let mut lines = Vec::new();
    for tenant in seeded {
        let change = QuotaChange {
            cpu: tenant.cpu,
            gpu: tenant.gpu,
            cpu_borrow_cap: tenant.cpu_borrow_cap,
            gpu_borrow_cap: tenant.gpu_borrow_cap,
            gpu_model: tenant.gpu_model.as_deref().map(parse_gpu_model).transpose().map_err(anyhow::Error::msg)?,
            weight: tenant.weight,
        };
        let (kind, key) = tenant_key(db, tenant.provider, tenant.group, tenant.instance).await?;
        lines.push(set(db, kind, &key, &change).await?);
    }
    Ok(lines)
}
