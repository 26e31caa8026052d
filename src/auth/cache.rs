//! Verdicts of upstream checks, kept for a while so a busy client costs one upstream call per
//! TTL. Keyed by the SHA-256 of the credential: the credential itself is never kept.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// Entries beyond this many make the next insert drop the expired ones.
const PRUNE_ABOVE: usize = 10_000;

/// The cache key of a credential.
pub fn credential_key(credential: &str) -> [u8; 32] {
    Sha256::digest(credential.as_bytes()).into()
}

pub struct VerdictCache<V> {
    ttl: Duration,
    entries: Mutex<HashMap<[u8; 32], (Instant, V)>>,
}

impl<V: Clone> VerdictCache<V> {
    pub fn new(ttl: Duration) -> Self {
        VerdictCache { ttl, entries: Mutex::new(HashMap::new()) }
    }

    /// The verdict kept for `key`, unless it expired.
    pub fn get(&self, key: &[u8; 32]) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.get(key).filter(|(expires, _)| *expires > Instant::now()).map(|(_, value)| value.clone())
    }

    /// Keeps `value` for the TTL, or until `not_after` if that is sooner (a token's expiry).
    pub fn put(&self, key: [u8; 32], value: V, not_after: Option<Instant>) {
        if self.ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let expires = not_after.map_or(now + self.ttl, |at| at.min(now + self.ttl));
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= PRUNE_ABOVE {
            entries.retain(|_, (at, _)| *at > now);
        }
        entries.insert(key, (expires, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_are_kept_by_digest_until_they_expire() {
        let cache = VerdictCache::new(Duration::from_secs(60));
        let key = credential_key("secret-token");
        assert_ne!(&key[..], b"secret-token");
        assert_eq!(cache.get(&key), None);
        cache.put(key, "alice".to_string(), None);
        assert_eq!(cache.get(&key).as_deref(), Some("alice"));
        assert_eq!(cache.get(&credential_key("other")), None);
        // A token expiring sooner than the TTL is not kept past its expiry.
        cache.put(key, "alice".to_string(), Some(Instant::now()));
        assert_eq!(cache.get(&key), None);
        // A zero TTL keeps nothing.
        let off = VerdictCache::new(Duration::ZERO);
        off.put(key, 1, None);
        assert_eq!(off.get(&key), None);
    }
}
