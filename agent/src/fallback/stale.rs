use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use tokio::time::Instant;

use crate::policy::Timestamp;

/// Slots per set: an entry can live in any of the 4 slots of its key's set.
const WAYS: usize = 4;

#[derive(Debug)]
struct Entry<K, V> {
    key: K,
    value: V,
    stored: Instant,
    stored_wall: Timestamp,
}

/// A value served from the stale-if-error cache.
#[derive(Clone, Debug, PartialEq)]
pub struct Stale<V> {
    /// The cached value.
    pub value: V,
    /// How old it is (monotonic).
    pub age: Duration,
    /// When it was stored (wall clock, for reports).
    pub stored_at: Timestamp,
}

/// Keeps the last good answer per key, to serve when the dependency fails (RFC 5861
/// `stale-if-error`): a value may be served on error while its age is at most
/// `max_staleness`.
///
/// Bounded: at most `max_entries` (rounded up to a multiple of 4) in a 4-way
/// set-associative table; a new key evicts the oldest entry of its set. Lock-free: each
/// slot is an `ArcSwapOption`, so reads never block and never contend with each other;
/// storing allocates one entry (the cost of keeping a copy), reading clones the value.
#[derive(Debug)]
pub struct StaleCache<K, V> {
    slots: Box<[ArcSwapOption<Entry<K, V>>]>,
    max_staleness_ns: AtomicU64,
    hasher: RandomState,
}

impl<K: Hash + Eq, V: Clone> StaleCache<K, V> {
    /// A cache of at most `max_entries` values (at least 4) served up to `max_staleness`
    /// old.
    pub fn new(max_entries: usize, max_staleness: Duration) -> Self {
        let sets = max_entries.div_ceil(WAYS).max(1);
        Self {
            slots: (0..sets * WAYS).map(|_| ArcSwapOption::empty()).collect(),
            max_staleness_ns: AtomicU64::new(u64::try_from(max_staleness.as_nanos()).unwrap_or(u64::MAX)),
            hasher: RandomState::new(),
        }
    }

    /// Changes the staleness limit (entries are kept).
    pub fn set_max_staleness(&self, max_staleness: Duration) {
        self.max_staleness_ns
            .store(u64::try_from(max_staleness.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Entries the cache can hold.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    fn set(&self, key: &K) -> &[ArcSwapOption<Entry<K, V>>] {
        let sets = self.slots.len() / WAYS;
        let s = (self.hasher.hash_one(key) % sets as u64) as usize;
        &self.slots[s * WAYS..(s + 1) * WAYS]
    }

    /// Stores the fresh `value` of `key`, replacing an older value of the same key, else
    /// an empty slot, else the oldest entry of the key's set.
    pub fn put(&self, key: K, value: V) {
        let set = self.set(&key);
        let mut same = None;
        let mut empty = None;
        let mut oldest: Option<(usize, Instant)> = None;
        for (i, slot) in set.iter().enumerate() {
            match &*slot.load() {
                Some(e) if e.key == key => {
                    same = Some(i);
                    break;
                }
                Some(e) => {
                    if oldest.is_none_or(|(_, t)| e.stored < t) {
                        oldest = Some((i, e.stored));
                    }
                }
                None => {
                    empty = empty.or(Some(i));
                }
            }
        }
        let target = same.or(empty).or(oldest.map(|(i, _)| i)).unwrap_or(0);
        set[target].store(Some(Arc::new(Entry {
            key,
            value,
            stored: Instant::now(),
            stored_wall: Timestamp::now(),
        })));
    }

    /// The cached value of `key` if it is at most `max_staleness` old (to serve on error).
    pub fn get_if_error(&self, key: &K) -> Option<Stale<V>> {
        let limit = Duration::from_nanos(self.max_staleness_ns.load(Ordering::Relaxed));
        for slot in self.set(key) {
            if let Some(e) = &*slot.load()
                && e.key == *key
            {
                let age = e.stored.elapsed();
                return (age <= limit).then(|| Stale {
                    value: e.value.clone(),
                    age,
                    stored_at: e.stored_wall,
                });
            }
        }
        None
    }

    /// Entries held now (any age).
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.load().is_some()).count()
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
