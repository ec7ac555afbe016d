//! Lock and map helpers every layer uses, defined once.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// A mutex whose data stays valid even if a holder panicked: every critical
/// section in this crate leaves its data consistent at each step.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Give memory back once a map is mostly empty (after a burst of keys),
/// at a cost amortized over the removals that emptied it.
pub(crate) fn shrink<V>(map: &mut HashMap<String, V>) {
    if map.capacity() > 64 && map.len() < map.capacity() / 4 {
        map.shrink_to(map.len() * 2);
    }
}
