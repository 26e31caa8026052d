//! Who may see, run and manage a function. The database loads a caller's relation to a function
//! (`FunctionAccess`); these functions decide. The same rules serve every endpoint, so a listing
//! never shows what a direct read would refuse.

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
}

/// Reading the function (listing without filter, `get_by_title`). A user function is visible to
/// its author only; a provider function to provider admins and granted groups. Authorship of a
/// provider function alone does not make it visible.
pub fn can_view(access: FunctionAccess) -> bool {
    if access.has_provider {
        access.is_provider_admin || access.view_granted || access.run_granted
    } else {
        access.is_author
    }
}

/// Running it, validating arguments for it, and listing it in the catalog.
pub fn can_run(access: FunctionAccess) -> bool {
    if access.has_provider { access.is_provider_admin || access.run_granted } else { access.is_author }
}

/// The six provider operations: new version upload, job listing, provider logs and the three
/// provider file operations. The author of a provider function holds them for that function.
pub fn can_manage(access: FunctionAccess) -> bool {
    access.has_provider && (access.is_provider_admin || access.is_author)
}

/// The caller's own file area for the function (user files).
pub fn can_use_user_files(access: FunctionAccess) -> bool {
    can_run(access)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider_fn() -> FunctionAccess {
        FunctionAccess { has_provider: true, ..Default::default() }
    }

    #[test]
    fn user_functions_belong_to_their_author_only() {
        let own = FunctionAccess { is_author: true, ..Default::default() };
        assert!(can_view(own) && can_run(own) && can_use_user_files(own));
        assert!(!can_manage(own));
        let other = FunctionAccess::default();
        assert!(!can_view(other) && !can_run(other) && !can_use_user_files(other));
    }

    #[test]
    fn provider_function_author_only_manages() {
        let author = FunctionAccess { is_author: true, ..provider_fn() };
        assert!(can_manage(author));
        assert!(!can_view(author) && !can_run(author) && !can_use_user_files(author));
    }

    #[test]
    fn admins_do_everything_and_grants_do_what_they_say() {
        let admin = FunctionAccess { is_provider_admin: true, ..provider_fn() };
        assert!(can_view(admin) && can_run(admin) && can_manage(admin));
        let viewer = FunctionAccess { view_granted: true, ..provider_fn() };
        assert!(can_view(viewer) && !can_run(viewer) && !can_manage(viewer));
        let runner = FunctionAccess { run_granted: true, ..provider_fn() };
        assert!(can_view(runner) && can_run(runner) && can_use_user_files(runner) && !can_manage(runner));
        assert!(!can_view(provider_fn()));
    }
}
