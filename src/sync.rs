//! Lock and map helpers every layer uses, defined once.

use std::collections::HashMap;
use std::sync::{
    Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak,
};

/// A mutex whose data stays valid even if a holder panicked: every critical
/// section in this crate leaves its data consistent at each step.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// [`lock`] for reading an `RwLock`.
pub(crate) fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

/// [`lock`] for writing an `RwLock`.
pub(crate) fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

/// A map by name, hashed with a random seed per map (as std's maps are),
/// by foldhash rather than SipHash: a request finds its lane and gates
/// by name, and a tenant's first request hashes its names several times,
/// which SipHash made an eighth of its cost.
pub(crate) type Names<K, V> = HashMap<K, V, foldhash::quality::RandomState>;

/// Give memory back once a map is mostly empty (after a burst of keys),
/// at a cost amortized over the removals that emptied it.
pub(crate) fn shrink<K: Eq + std::hash::Hash, V, S: std::hash::BuildHasher>(
    map: &mut HashMap<K, V, S>,
) {
    if map.capacity() > 64 && map.len() < map.capacity() / 4 {
        map.shrink_to(map.len() * 2);
    }
}

/// Values shared by name, held weakly: each lives as long as something
/// holds it, and leaves the map when the last holder lets go (its
/// [`Listing`] drops with it).
pub(crate) type Listings<T> = Mutex<Names<Arc<str>, Weak<T>>>;

/// Where a value is listed in its [`Listings`], so that it leaves them
/// when dropped. A field of the value: it drops with it.
pub(crate) struct Listing<T> {
    map: Weak<Listings<T>>,
    /// The map's own key: one allocation for both.
    key: Arc<str>,
}

impl<T> Drop for Listing<T> {
    fn drop(&mut self) {
        let Some(map) = self.map.upgrade() else {
            return;
        };
        let mut map = lock(&map);
        // A value listed again under the key since is not this one.
        if map
            .get(&self.key)
            .is_some_and(|value| value.strong_count() == 0)
        {
            map.remove(&self.key);
            shrink(&mut map);
        }
    }
}

/// The value listed under `key`, else one `make` builds now (given its
/// listing) and lists.
pub(crate) fn listed<T>(
    map: &Arc<Listings<T>>,
    key: &str,
    make: impl FnOnce(Listing<T>) -> T,
) -> Arc<T> {
    let mut values = lock(map);
    if let Some(value) = values.get(key).and_then(Weak::upgrade) {
        return value;
    }
    let key: Arc<str> = Arc::from(key);
    let listing = Listing {
        map: Arc::downgrade(map),
        key: key.clone(),
    };
    let value = Arc::new(make(listing));
    values.insert(key, Arc::downgrade(&value));
    value
}
