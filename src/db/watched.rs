//! What a server keeps in memory of users and functions, so a request whose user or function
//! was read before costs no database round trip for it.
//!
//! A kept value is only used while changes are followed (`watch_auth_changes`): every
//! announced change (`announced!`: deactivation, groups, grants, admins, a new version of a
//! function, made on any replica or by `gantry admin`) empties every `Watched`, and while
//! changes cannot be followed (no watcher running, or its connection lost) nothing is kept, so
//! every request reads from the database as it would without the cache. A read that started
//! before a change never stores what it read after the change (`generation`).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::{Db, Error};

/// Entries beyond this many empty the cache before the next insert (it then refills with what
/// is used).
const MAX_ENTRIES: usize = 100_000;

pub struct Watched<K, V> {
    entries: Mutex<HashMap<K, V>>,
    /// Raised by every change; a read started under an older generation is not stored.
    generation: AtomicU64,
    /// Whether changes are followed; off, nothing is read from or stored in the cache.
    following: AtomicBool,
}

impl<K, V> Default for Watched<K, V> {
    fn default() -> Self {
        Watched {
            entries: Mutex::new(HashMap::new()),
            generation: AtomicU64::new(0),
            following: AtomicBool::new(false),
        }
    }
}

impl<K: Eq + Hash, V: Clone> Watched<K, V> {
    /// The generation to hand back to `put` with what a read returns; take it before the read.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    pub fn get(&self, key: &K) -> Option<V> {
        if !self.following.load(Ordering::SeqCst) {
            return None;
        }
        self.lock().get(key).cloned()
    }

    /// Keeps `value`, read while the cache was at `generation`, unless a change came since.
    pub fn put(&self, generation: u64, key: K, value: V) {
        let mut entries = self.lock();
        // Checked under the lock that `forget_all` takes, so a change cannot slip between.
        if !self.following.load(Ordering::SeqCst) || self.generation.load(Ordering::SeqCst) != generation {
            return;
        }
        if entries.len() >= MAX_ENTRIES {
            entries.clear();
        }
        entries.insert(key, value);
    }

    /// What the watcher of changes reports.
    pub fn observe(&self, event: AuthWatch) {
        match event {
            AuthWatch::Following => {
                self.forget_all();
                self.following.store(true, Ordering::SeqCst);
            }
            AuthWatch::Changed => self.forget_all(),
            AuthWatch::Lost => {
                self.following.store(false, Ordering::SeqCst);
                self.forget_all();
            }
        }
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn forget_all(&self) {
        let mut entries = self.lock();
        self.generation.fetch_add(1, Ordering::SeqCst);
        entries.clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, V>> {
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The PostgreSQL channel told of every announced change (`announced!`).
pub const AUTH_CHANNEL: &str = "gantry_auth";

/// What `watch_auth_changes` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthWatch {
    /// Changes are being followed from now on: what was cached before may be stale.
    Following,
    /// A change was made: what is cached is stale.
    Changed,
    /// Changes can no longer be followed (the connection was lost): nothing may be cached
    /// until `Following` is reported again.
    Lost,
}

/// Follows announced changes (`announced!`) made anywhere, forever, reporting to `report`: on
/// PostgreSQL by LISTEN on its own connection (reconnected with backoff when lost), on SQLite
/// by reading the auth stamp every `poll` (another process may share the file).
pub async fn watch_auth_changes(db: &Db, poll: std::time::Duration, report: impl Fn(AuthWatch)) {
    let mut backoff = std::time::Duration::from_millis(100);
    loop {
        match db {
            Db::Postgres(pool) => {
                let listening = async {
                    let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
                    listener.listen(AUTH_CHANNEL).await?;
                    Ok::<_, sqlx::Error>(listener)
                };
                match listening.await {
                    Ok(mut listener) => {
                        report(AuthWatch::Following);
                        backoff = std::time::Duration::from_millis(100);
                        // `try_recv` answers None when the connection was lost: notifications
                        // sent meanwhile are gone, so follow again from a new connection.
                        let why = loop {
                            match listener.try_recv().await {
                                Ok(Some(_)) => report(AuthWatch::Changed),
                                Ok(None) => break "the connection was lost".to_string(),
                                Err(error) => break error.to_string(),
                            }
                        };
                        tracing::warn!(why, "stopped following changes; cached users and functions are not used");
                        report(AuthWatch::Lost);
                    }
                    Err(error) => {
                        tracing::warn!(error = %error, "cannot follow user changes; cached users are not used");
                        report(AuthWatch::Lost);
                    }
                }
            }
            Db::Sqlite(..) => {
                let mut seen = None;
                loop {
                    match stamp(db).await {
                        Ok(now) => {
                            match seen {
                                None => {
                                    report(AuthWatch::Following);
                                    backoff = std::time::Duration::from_millis(100);
                                }
                                Some(before) if before != now => report(AuthWatch::Changed),
                                Some(_) => {}
                            }
                            seen = Some(now);
                        }
                        Err(_) => {
                            report(AuthWatch::Lost);
                            break;
                        }
                    }
                    tokio::time::sleep(poll).await;
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(std::time::Duration::from_secs(5));
    }
}

async fn stamp(db: &Db) -> Result<i64, Error> {
    super::on_db!(db, pool => sqlx::query_scalar::<_, i64>("SELECT n FROM auth_stamp WHERE id = 1").fetch_one(pool).await)
        .map_err(super::query_error("read auth stamp"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_kept_until_changes_are_followed() {
        let cache = Watched::default();
        cache.put(cache.generation(), "ann", 1);
        assert_eq!(cache.get(&"ann"), None);
        cache.observe(AuthWatch::Following);
        cache.put(cache.generation(), "ann", 1);
        assert_eq!(cache.get(&"ann"), Some(1));
    }

    #[test]
    fn a_change_empties_the_cache_and_a_read_from_before_it_is_not_kept() {
        let cache = Watched::default();
        cache.observe(AuthWatch::Following);
        cache.put(cache.generation(), "ann", 1);
        // A request reads bob while a deactivation of bob commits and is reported.
        let before = cache.generation();
        cache.observe(AuthWatch::Changed);
        cache.put(before, "bob", 1);
        assert_eq!(cache.get(&"ann"), None);
        assert_eq!(cache.get(&"bob"), None, "a read from before the change must not be kept");
        cache.put(cache.generation(), "bob", 2);
        assert_eq!(cache.get(&"bob"), Some(2));
    }

    #[test]
    fn a_lost_watch_stops_the_cache_until_it_follows_again() {
        let cache = Watched::default();
        cache.observe(AuthWatch::Following);
        cache.put(cache.generation(), "ann", 1);
        cache.observe(AuthWatch::Lost);
        assert_eq!(cache.get(&"ann"), None);
        cache.put(cache.generation(), "ann", 1);
        assert!(cache.is_empty(), "nothing is stored while changes are not followed");
        cache.observe(AuthWatch::Following);
        assert_eq!(cache.get(&"ann"), None, "following again starts empty");
    }
}
