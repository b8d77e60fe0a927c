//! Reads the hot path makes again and again of records that almost never change,
//! answered from memory: the principal an API key names (every API request) and a
//! tenant's endpoints (every event's fan-out). Each was a database read per request;
//! together a sixteenth of the server's CPU under load, and a tenant's fan-out read
//! and decoded every one of its endpoints per event.
//!
//! Why a cached answer is never older than what the API has confirmed: every write
//! through the store that changes what a cache holds bumps the cache's generation
//! after its commit and before its caller hears "done", and an entry is used only if
//! it was read at the generation in force now. A read that started before a write and
//! lands after it carries the old generation, so it is stored but never used. The
//! database is locked to one process, so every write goes through this store; a change
//! made past it by hand (an operator's `sqlite3` shell) is seen once the entry is
//! [`TRUSTED_FOR`] old.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use chrono::{DateTime, Utc};

/// How long an entry is used without a write through the store: bounds how long a
/// change made by hand goes unseen, while a busy tenant still reads its endpoints once
/// in thousands of events.
pub(super) const TRUSTED_FOR: chrono::Duration = chrono::Duration::seconds(5);
/// Entries kept at most; past it the cache starts again empty (it refills with what is
/// read next), so a flood of distinct keys cannot grow it without bound.
pub(super) const MAX_ENTRIES: usize = 10_000;

/// One cache: values by key, each valid at the generation it was read at.
pub(super) struct ReadCache<K, V> {
    generation: AtomicU64,
    entries: Mutex<HashMap<K, Entry<V>>>,
}

struct Entry<V> {
    generation: u64,
    read_at: DateTime<Utc>,
    value: V,
}

impl<K: Hash + Eq, V: Clone> Default for ReadCache<K, V> {
    fn default() -> Self {
        Self {
            generation: AtomicU64::new(0),
            entries: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Hash + Eq, V: Clone> ReadCache<K, V> {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<K, Entry<V>>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Taken before a read of the database: what the read finds is kept only as of it.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// The value for `key`, if one was read since the last write and is still trusted.
    /// Looked up by a borrowed key (`&str` for a `String`): a hit, every API request,
    /// allocates nothing.
    pub fn get<Q>(&self, key: &Q, now: DateTime<Utc>) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let current = self.generation();
        let entries = self.entries();
        let entry = entries.get(key)?;
        (entry.generation == current && now - entry.read_at < TRUSTED_FOR)
            .then(|| entry.value.clone())
    }

    /// Keep `value`, read from the database at `generation` (see [`Self::generation`]).
    pub fn put(&self, key: K, value: V, generation: u64, now: DateTime<Utc>) {
        let mut entries = self.entries();
        if entries.len() >= MAX_ENTRIES && !entries.contains_key(&key) {
            entries.clear();
        }
        entries.insert(
            key,
            Entry {
                generation,
                read_at: now,
                value,
            },
        );
    }

    /// A write that may change a cached value has committed: nothing read before it is
    /// used again.
    pub fn invalidate(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
#[path = "read_cache_tests.rs"]
mod tests;
