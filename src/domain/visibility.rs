//! Who may see, run and manage a function. The database loads a caller's relation to a function
//! (`FunctionAccess`); these functions decide. The same rules serve every endpoint, so a listing
//! never shows what a direct read would refuse.
//!
//! Two modes, as in the reference (its §3.1): group rules (grants and provider admin groups),
//! and, when the runtime API lists an instance's functions (`runtime_platform`), that list's
//! per-function permissions, which then replace the group rules for the request.

use std::collections::HashMap;

/// A caller's relation to one function, as loaded from the database.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FunctionAccess {
    /// The function belongs to a provider (otherwise it is a user's own function).
    pub has_provider: bool,
    /// The caller uploaded the function first.
    pub is_author: bool,
    /// The caller is in one of the provider's admin groups.
    pub is_provider_admin: bool,
    /// A group of the caller was granted `view` on the function.
    pub view_granted: bool,
    /// A group of the caller was granted `run` on the function.
    pub run_granted: bool,
    /// A group of the caller is one of the function's trial groups (`trial_instances`) and was
    /// granted `run` on it.
    pub trial_granted: bool,
    /// Runtime-instances mode: the instance's permissions on this function (for a user's own
    /// function, the instance's custom-function permissions). `None`: group rules.
    pub instance: Option<Permissions>,
}

/// Permissions of an instance, as the runtime API names them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Permissions(u16);

impl Permissions {
    pub const READ: Permissions = Permissions(1);
    pub const RUN: Permissions = Permissions(1 << 1);
    pub const WRITE: Permissions = Permissions(1 << 2);
    pub const FILES_READ: Permissions = Permissions(1 << 3);
    pub const FILES_WRITE: Permissions = Permissions(1 << 4);
    pub const JOB_READ: Permissions = Permissions(1 << 5);
    pub const PROVIDER_LOGS_READ: Permissions = Permissions(1 << 6);
    pub const PROVIDER_FILES_READ: Permissions = Permissions(1 << 7);
    pub const PROVIDER_FILES_WRITE: Permissions = Permissions(1 << 8);
    pub const CUSTOM_RUN: Permissions = Permissions(1 << 9);
    pub const CUSTOM_WRITE: Permissions = Permissions(1 << 10);

    /// The permission a runtime API string names (unknown strings grant nothing).
    pub fn named(name: &str) -> Permissions {
        match name {
            "function.read" => Self::READ,
            "function.run" => Self::RUN,
            "function.write" => Self::WRITE,
            "function-files.read" => Self::FILES_READ,
            "function-files.write" => Self::FILES_WRITE,
            "function-job.read" => Self::JOB_READ,
            "function-provider-logs.read" => Self::PROVIDER_LOGS_READ,
            "function-provider-files.read" => Self::PROVIDER_FILES_READ,
            "function-provider-files.write" => Self::PROVIDER_FILES_WRITE,
            "function-custom.run" => Self::CUSTOM_RUN,
            "function-custom.write" => Self::CUSTOM_WRITE,
            _ => Permissions(0),
        }
    }

    pub fn from_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Permissions {
        Permissions(names.into_iter().fold(0, |bits, name| bits | Self::named(name).0))
    }

    pub fn has(self, wanted: Permissions) -> bool {
        self.0 & wanted.0 == wanted.0 && wanted.0 != 0
    }
}

/// What the runtime API says an instance may use: per provider function, and for the users'
/// own (custom) functions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceAccess {
    /// By (provider, function title).
    pub functions: HashMap<(String, String), Permissions>,
    pub custom: Permissions,
    /// The `business_model` of each function whose entry names one (`TRIAL`: its jobs run as
    /// trials).
    pub business_models: HashMap<(String, String), String>,
}

impl InstanceAccess {
    /// The business model the instance's entry gives `provider`'s function `title`.
    pub fn business_model(&self, provider: &str, title: &str) -> Option<&str> {
        self.business_models.get(&(provider.to_string(), title.to_string())).map(String::as_str)
    }

    /// Whether jobs of `provider`'s function `title` run as trials (`ENV_ACCESS_TRIAL`).
    pub fn trial(&self, provider: &str, title: &str) -> bool {
        self.business_model(provider, title) == Some(TRIAL)
    }

    /// The permissions on a function: `provider`'s function `title`, or a custom one.
    pub fn on(&self, provider: Option<&str>, title: &str) -> Permissions {
        match provider {
            Some(provider) => {
                self.functions.get(&(provider.to_string(), title.to_string())).copied().unwrap_or_default()
            }
            None => self.custom,
        }
    }
}

/// Reading the function (listing without filter, `get_by_title`). A user function is visible to
/// its author only; a provider function to provider admins and granted groups (instances:
/// `function.read`). Authorship of a provider function alone does not make it visible.
pub fn can_view(access: FunctionAccess) -> bool {
    match (access.instance, access.has_provider) {
        (Some(permissions), true) => permissions.has(Permissions::READ),
        (_, false) => access.is_author,
        (None, true) => access.is_provider_admin || access.view_granted || access.run_granted,
    }
}

/// Running it and validating arguments for it (instances: `function.run`; a user's own
/// function needs `function-custom.run`).
pub fn can_run(access: FunctionAccess) -> bool {
    match (access.instance, access.has_provider) {
        (Some(permissions), true) => permissions.has(Permissions::RUN),
        (Some(permissions), false) => access.is_author && permissions.has(Permissions::CUSTOM_RUN),
        (None, true) => access.is_provider_admin || access.run_granted,
        (None, false) => access.is_author,
    }
}

/// Listed by `filter=catalog`: provider functions the caller may run (instances: read).
pub fn in_catalog(access: FunctionAccess) -> bool {
    access.has_provider
        && match access.instance {
            Some(permissions) => permissions.has(Permissions::READ),
            None => can_run(access),
        }
}

/// The provider operations on one function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderOperation {
    /// A new version (`function.write`).
    Upload,
    /// Jobs of every author (`function-job.read`).
    Jobs,
    /// Provider logs (`function-provider-logs.read`).
    Logs,
    /// Provider files: list and download (`function-provider-files.read`).
    FilesRead,
    /// Provider files: upload and delete (`function-provider-files.write`).
    FilesWrite,
}

impl ProviderOperation {
    fn permission(self) -> Permissions {
        match self {
            Self::Upload => Permissions::WRITE,
            Self::Jobs => Permissions::JOB_READ,
            Self::Logs => Permissions::PROVIDER_LOGS_READ,
            Self::FilesRead => Permissions::PROVIDER_FILES_READ,
            Self::FilesWrite => Permissions::PROVIDER_FILES_WRITE,
        }
    }
}

/// A provider operation. With group rules the provider's admins and the function's author hold
/// all of them; with instances each needs its own permission.
pub fn can_manage(access: FunctionAccess, operation: ProviderOperation) -> bool {
    access.has_provider
        && match access.instance {
            Some(permissions) => permissions.has(operation.permission()),
            None => access.is_provider_admin || access.is_author,
        }
}

/// Whether the caller's run of the function is a trial (`ENV_ACCESS_TRIAL`), as the reference
/// decides it (its §3.5): in runtime-instances mode a provider function's business model
/// (`instance_trial`: the instance's entry says `TRIAL`) decides; otherwise a group of the
/// caller that is one of the function's trial groups and holds `run` on it makes it one.
pub fn is_trial(access: FunctionAccess, instance_trial: bool) -> bool {
    match (access.instance, access.has_provider) {
        (Some(_), true) => instance_trial,
        _ => access.trial_granted,
    }
}

/// The business model of a run: `TRIAL` for a trial; in runtime-instances mode, a provider
/// function's entry's (`SUBSIDIZED` or `CONSUMPTION`); else `SUBSIDIZED` (the reference's §3.5).
pub fn business_model(access: FunctionAccess, trial: bool, instance_model: Option<&str>) -> &'static str {
    if trial {
        return TRIAL;
    }
    match (access.instance, access.has_provider, instance_model) {
        (Some(_), true, Some("CONSUMPTION")) => "CONSUMPTION",
        _ => "SUBSIDIZED",
    }
}

/// The business model of a trial.
pub const TRIAL: &str = "TRIAL";

/// Reading the caller's own file area for the function (instances: `function-files.read`).
pub fn can_read_user_files(access: FunctionAccess) -> bool {
    user_files(access, Permissions::FILES_READ)
}

/// Writing the caller's own file area for the function (instances: `function-files.write`).
pub fn can_write_user_files(access: FunctionAccess) -> bool {
    user_files(access, Permissions::FILES_WRITE)
}

fn user_files(access: FunctionAccess, wanted: Permissions) -> bool {
    match (access.instance, access.has_provider) {
        (Some(permissions), true) => permissions.has(wanted),
        (Some(_), false) => access.is_author,
        (None, _) => can_run(access),
    }
}

/// Uploading a user's own (custom) function: always with group rules; instances need
/// `function-custom.write`.
pub fn can_upload_custom(instance: Option<Permissions>) -> bool {
    instance.is_none_or(|permissions| permissions.has(Permissions::CUSTOM_WRITE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider_fn() -> FunctionAccess {
        FunctionAccess { has_provider: true, ..Default::default() }
    }

    const ALL: [ProviderOperation; 5] = [
        ProviderOperation::Upload,
        ProviderOperation::Jobs,
        ProviderOperation::Logs,
        ProviderOperation::FilesRead,
        ProviderOperation::FilesWrite,
    ];

    #[test]
    fn user_functions_belong_to_their_author_only() {
        let own = FunctionAccess { is_author: true, ..Default::default() };
        assert!(can_view(own) && can_run(own) && can_read_user_files(own) && can_write_user_files(own));
        assert!(ALL.iter().all(|op| !can_manage(own, *op)));
        let other = FunctionAccess::default();
        assert!(!can_view(other) && !can_run(other) && !can_read_user_files(other));
    }

    #[test]
    fn provider_function_author_only_manages() {
        let author = FunctionAccess { is_author: true, ..provider_fn() };
        assert!(ALL.iter().all(|op| can_manage(author, *op)));
        assert!(!can_view(author) && !can_run(author) && !can_read_user_files(author));
    }

    #[test]
    fn admins_do_everything_and_grants_do_what_they_say() {
        let admin = FunctionAccess { is_provider_admin: true, ..provider_fn() };
        assert!(can_view(admin) && can_run(admin) && can_manage(admin, ProviderOperation::Upload));
        let viewer = FunctionAccess { view_granted: true, ..provider_fn() };
        assert!(can_view(viewer) && !can_run(viewer) && !in_catalog(viewer));
        assert!(!can_manage(viewer, ProviderOperation::Jobs));
        let runner = FunctionAccess { run_granted: true, ..provider_fn() };
        assert!(can_view(runner) && can_run(runner) && in_catalog(runner) && can_write_user_files(runner));
        assert!(!can_manage(runner, ProviderOperation::Logs));
        assert!(!can_view(provider_fn()));
    }

    #[test]
    fn instance_permissions_replace_group_rules_one_by_one() {
        let with = |names: &[&str]| FunctionAccess {
            instance: Some(Permissions::from_names(names.iter().copied())),
            // Group rules that would allow everything do not count in this mode.
            is_provider_admin: true,
            is_author: true,
            run_granted: true,
            ..provider_fn()
        };
        let none = with(&[]);
        assert!(!can_view(none) && !can_run(none) && !in_catalog(none) && !can_read_user_files(none));
        assert!(ALL.iter().all(|op| !can_manage(none, *op)));
        let reader = with(&["function.read"]);
        assert!(can_view(reader) && in_catalog(reader) && !can_run(reader));
        let runner = with(&["function.run", "function-files.read"]);
        assert!(can_run(runner) && !can_view(runner) && can_read_user_files(runner) && !can_write_user_files(runner));
        let operator = with(&["function-job.read", "function-provider-files.write", "no.such.permission"]);
        assert!(can_manage(operator, ProviderOperation::Jobs) && can_manage(operator, ProviderOperation::FilesWrite));
        assert!(
            !can_manage(operator, ProviderOperation::FilesRead) && !can_manage(operator, ProviderOperation::Upload)
        );
        // A user's own function: authorship, and function-custom.run to run it.
        let custom = |names: &[&str]| FunctionAccess {
            is_author: true,
            instance: Some(Permissions::from_names(names.iter().copied())),
            ..Default::default()
        };
        assert!(can_view(custom(&[])) && !can_run(custom(&[])) && can_run(custom(&["function-custom.run"])));
        assert!(!can_upload_custom(Some(Permissions::default())));
        assert!(can_upload_custom(Some(Permissions::named("function-custom.write"))) && can_upload_custom(None));
    }

    #[test]
    fn trial_follows_trial_groups_or_the_instance_business_model() {
        let trial_group = FunctionAccess { run_granted: true, trial_granted: true, ..provider_fn() };
        assert!(is_trial(trial_group, false));
        assert!(!is_trial(FunctionAccess { run_granted: true, ..provider_fn() }, false));
        // Instances mode, provider function: the business model alone decides.
        let instance = Some(Permissions::named("function.run"));
        assert!(!is_trial(FunctionAccess { instance, ..trial_group }, false));
        assert!(is_trial(FunctionAccess { instance, ..provider_fn() }, true));
        // A user's own function has no business model entry: trial groups decide, in both modes.
        let own = FunctionAccess { is_author: true, instance, trial_granted: true, ..Default::default() };
        assert!(is_trial(own, true) && !is_trial(FunctionAccess { trial_granted: false, ..own }, true));
    }

    #[test]
    fn a_run_has_the_business_model_of_its_trial_or_its_instance_entry() {
        let instance = Some(Permissions::named("function.run"));
        let on_instance = FunctionAccess { instance, ..provider_fn() };
        assert_eq!(business_model(on_instance, false, Some("CONSUMPTION")), "CONSUMPTION");
        assert_eq!(business_model(on_instance, false, Some("SUBSIDIZED")), "SUBSIDIZED");
        assert_eq!(business_model(on_instance, true, Some("TRIAL")), "TRIAL");
        // No entry, or no instance: a trial or subsidized (an entry's unknown word is not taken).
        assert_eq!(business_model(on_instance, false, None), "SUBSIDIZED");
        assert_eq!(business_model(on_instance, false, Some("FREE")), "SUBSIDIZED");
        assert_eq!(business_model(provider_fn(), false, Some("CONSUMPTION")), "SUBSIDIZED");
        assert_eq!(business_model(provider_fn(), true, None), "TRIAL");
    }
}
