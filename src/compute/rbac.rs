//! What each Kubernetes role asks of the API server: the exact (group, resource, verbs) the
//! gateway's and the controller's code use, so the Helm chart grants exactly that (a check
//! compares the rendered Roles with `gantry rbac`) and a test checks every request the roles
//! make against it.

use serde::Serialize;

/// Where a rule applies: the release's namespace (a Role) or the whole cluster (a ClusterRole).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Namespaced,
    Cluster,
}

/// One permission: the verbs on one resource (or subresource, `pods/log`) of one API group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    /// `""` is the core group.
    pub api_group: &'static str,
    pub resource: &'static str,
    /// Sorted.
    pub verbs: &'static [&'static str],
    pub scope: Scope,
}

const fn rule(api_group: &'static str, resource: &'static str, verbs: &'static [&'static str]) -> Rule {
    Rule { api_group, resource, verbs, scope: Scope::Namespaced }
}

/// `gantry gateway`: applies a job's FunctionJob and Secret (server-side apply creates them,
/// so both `create` and `patch`), sets `spec.stopRequested`, lists and deletes resources in its
/// drift sweep, and reads a running job's pod log.
pub const GATEWAY: &[Rule] = &[
    rule(crate::crd::GROUP, "functionjobs", &["create", "delete", "list", "patch"]),
    rule("", "secrets", &["create", "patch"]),
    rule("", "pods/log", &["get"]),
];

/// `gantry controller`: watches FunctionJobs (their metadata, keeping no more; each reconcile
/// reads its resource with a `get`) and their pods, manages its finalizer (`patch`; pods' owner references do not block their
/// owner's deletion, so `functionjobs/finalizers` is not needed),
/// deletes resources without a job row and finished ones after their keep window, writes their
/// status, creates, reads, stops and deletes pods, deletes a finished job's Secret (its token),
/// reads pod logs for archiving, records Events, holds the leader
/// Lease, and checks at start that the CRD is installed.
pub const CONTROLLER: &[Rule] = &[
    rule(crate::crd::GROUP, "functionjobs", &["delete", "get", "list", "patch", "watch"]),
    rule(crate::crd::GROUP, "functionjobs/status", &["patch"]),
    rule("", "pods", &["create", "delete", "get", "list", "watch"]),
    rule("", "pods/log", &["get"]),
    rule("", "secrets", &["delete"]),
    rule("events.k8s.io", "events", &["create"]),
    rule("coordination.k8s.io", "leases", &["create", "get", "update"]),
    Rule {
        api_group: "apiextensions.k8s.io",
        resource: "customresourcedefinitions",
        verbs: &["get"],
        scope: Scope::Cluster,
    },
];

/// What `gantry rbac` prints: `{"gateway": [rules], "controller": [rules]}`.
pub fn document() -> serde_json::Value {
    serde_json::json!({"gateway": GATEWAY, "controller": CONTROLLER})
}

/// Whether `rules` allow `verb` on `resource` of `api_group`.
pub fn allows(rules: &[Rule], api_group: &str, resource: &str, verb: &str) -> bool {
    rules.iter().any(|rule| rule.api_group == api_group && rule.resource == resource && rule.verbs.contains(&verb))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_are_sorted_and_rules_unique() {
        for rules in [GATEWAY, CONTROLLER] {
            for rule in rules {
                assert!(rule.verbs.is_sorted(), "{rule:?}");
            }
            let mut keys: Vec<_> = rules.iter().map(|r| (r.api_group, r.resource)).collect();
            keys.sort();
            keys.dedup();
            assert_eq!(keys.len(), rules.len());
        }
    }

    #[test]
    fn the_document_names_scopes_and_core_groups() {
        let document = document();
        let secrets = &document["gateway"][1];
        assert_eq!(secrets["apiGroup"], "");
        assert_eq!(secrets["resource"], "secrets");
        assert_eq!(secrets["scope"], "namespaced");
        assert_eq!(document["controller"].as_array().unwrap().last().unwrap()["scope"], "cluster");
        assert!(allows(CONTROLLER, "", "pods", "watch"));
        assert!(!allows(GATEWAY, "", "pods", "get"));
    }
}
