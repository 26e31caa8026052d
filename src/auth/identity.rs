//! What a mechanism says of a credential: who it is (`Identity`) or why it was refused
//! (`Rejection`), and the claim lookup the mechanisms share (`field`).

use std::sync::Arc;

use serde_json::Value;

use crate::domain::visibility::InstanceAccess;

/// Who a credential is, as the mechanism tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub username: String,
    /// The user's groups, when the mechanism owns group membership.
    pub groups: Option<Vec<String>>,
    /// Runtime-instances mode: what the caller's instance may use (replaces the group rules).
    pub instance: Option<Arc<InstanceAccess>>,
}

/// Why a credential was refused.
#[derive(Debug)]
pub enum Rejection {
    /// Not a credential the mechanism accepts.
    Invalid,
    /// Accepted, but not usable (no user id where configured): the message says why.
    Unusable(String),
    /// The service that vouches for credentials failed: the message says how.
    Unavailable(String),
}

/// The value at a dotted path of a JSON object (`user.id`); a key that itself contains dots
/// (a URL-shaped claim name) is found whole first.
pub fn field<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    if let Some(found) = value.get(path) {
        return Some(found);
    }
    path.split('.').try_fold(value, |value, key| value.get(key))
}
