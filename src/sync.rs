//! Lock and map helpers every layer uses, defined once.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{
    Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak,
};

use hashbrown::{HashTable, hash_table};

/// A mutex whose data stays valid even if a holder panicked: every critical
/// section in this crate leaves its data consistent at each step.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// [`lock`], for a lock held a hundred nanoseconds or so by threads that
/// take it in a loop (a gate's meters, released from every core): tried
/// a few times, with a doubling pause between tries, before the thread
/// waits in the kernel.
///
/// - `Mutex::lock` spins only until the lock is first contended; from
///   then on each locker sleeps in the kernel and each unlock wakes one
///   there, and two cores taking one lane's meters in a loop fall into
///   that convoy and stay in it: 64 tasks on one lane took 142-166 ns a
///   permit over 2 million permits, 103-108 ns tried first.
/// - Each try is a compare-and-swap, which takes the lock's cache line
///   from its holder, failing or not: a waiter that tries often slows the
///   holder it waits for. The first pause is about as long as the lock is
///   held ([`FIRST_PAUSE`]), and the pauses add up to about a thousand
///   before the thread sleeps (9 µs on the cores these figures come from,
///   where a pause takes 9 ns). Tried after one pause, then two, and so
///   on to 255 in all, 64 tasks on one lane took 120-137 ns a permit in
///   a plain loop of 2 million, and 345-398 ns in `--bench permits`;
///   after eight, 94-101 and 214-220 ns.
pub(crate) fn lock_briefly<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    for round in 0..TRIES {
        match mutex.try_lock() {
            Ok(guard) => return guard,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => return poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                for _ in 0..FIRST_PAUSE << round {
                    std::hint::spin_loop();
                }
            }
        }
    }
    lock(mutex)
}

/// How many times [`lock_briefly`] tries before it waits: 1,016 pauses
/// in all.
const TRIES: u32 = 7;

/// The pauses before [`lock_briefly`]'s second try, doubling for each
/// next one.
const FIRST_PAUSE: u32 = 8;

/// A map by name, hashed with a random seed per map (as std's maps are),
/// by foldhash rather than SipHash: a request finds its lane and gates
/// by name, and a tenant's first request hashes its names several times,
/// which SipHash made an eighth of its cost.
pub(crate) type Names<K, V> = HashMap<K, V, foldhash::quality::RandomState>;

/// An entry of a [`Sharded`] map: its name's hash, as its shard's table
/// asks it to place the entry again as it grows or shrinks.
pub(crate) trait Rehash {
    /// Its name's hash by `seed`, as [`Sharded::hashed`] reckons it (or as
    /// it was reckoned when the entry went in, if it keeps it, or what it
    /// holds does).
    fn name_hash(&self, seed: &foldhash::quality::RandomState) -> u64;
}

/// An entry of a [`Sharded`] map that holds the name it is found by, so
/// the map keeps no key of its own (a lane's entry is its handle, 8
/// bytes, where a key beside it took 16 more), and it may keep that name
/// in parts (a lane's, in its gates' keys).
pub(crate) trait Named: Rehash {
    /// True when it is named `name`.
    fn is_named(&self, name: &str) -> bool;
}

/// A name with its hash, reckoned once: its shard, its lookup and its
/// insertion all read it (a tenant's first request hashed its lane's
/// name five times). Hashed by one map, for that map: each map's seed is
/// its own.
#[derive(Clone, Copy)]
pub(crate) struct Hashed<'a> {
    name: &'a str,
    hash: u64,
}

impl<'a> Hashed<'a> {
    pub(crate) fn name(&self) -> &'a str {
        self.name
    }

    /// Its hash, for an entry that keeps it (see [`Named::name_hash`]).
    pub(crate) fn hash(&self) -> u64 {
        self.hash
    }
}

/// Entries by name in [`SHARDS`] shards, each behind a lock of its own:
/// finding a name takes one shard's lock, and lookups on the other shards
/// go on meanwhile (the shaper's lanes, its gates). Hashed with foldhash
/// and a random seed per map, as [`Names`] are.
pub(crate) struct Sharded<T> {
    shards: Box<[Mutex<HashTable<T>>]>,
    seed: foldhash::quality::RandomState,
}

/// Shards of a [`Sharded`] map: enough that two cores rarely meet on one,
/// few enough that a pass over them all is cheap.
pub(crate) const SHARDS: usize = 64;

impl<T> Default for Sharded<T> {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            seed: foldhash::quality::RandomState::default(),
        }
    }
}

impl<T: Rehash> Sharded<T> {
    /// `name`, hashed for this map.
    pub(crate) fn hashed<'a>(&self, name: &'a str) -> Hashed<'a> {
        Hashed {
            name,
            hash: self.seed.hash_one(name),
        }
    }

    /// The shard `name` is in. Read from the hash's middle bits: a shard's
    /// table places its entries by the low bits and tells them apart by
    /// the top seven, which all its entries would otherwise share.
    pub(crate) fn index_of(&self, name: &Hashed<'_>) -> usize {
        (name.hash >> 40) as usize % SHARDS
    }

    /// Shard `at` (modulo [`SHARDS`]), locked.
    pub(crate) fn shard(&self, at: usize) -> Shard<'_, T> {
        Shard {
            table: lock(&self.shards[at % SHARDS]),
            seed: &self.seed,
        }
    }

    /// The shard `name` is in, locked.
    pub(crate) fn shard_of(&self, name: &Hashed<'_>) -> Shard<'_, T> {
        self.shard(self.index_of(name))
    }

    /// Every shard, in order, each locked only as it is taken.
    pub(crate) fn shards(&self) -> impl Iterator<Item = Shard<'_, T>> {
        (0..SHARDS).map(|at| self.shard(at))
    }
}

/// One shard of a [`Sharded`] map, locked.
pub(crate) struct Shard<'a, T> {
    table: MutexGuard<'a, HashTable<T>>,
    seed: &'a foldhash::quality::RandomState,
}

impl<T: Named> Shard<'_, T> {
    pub(crate) fn get(&self, name: &Hashed<'_>) -> Option<&T> {
        self.table
            .find(name.hash, |entry| entry.is_named(name.name))
    }

    /// The entry named `name`, or the place to put one: a single probe of
    /// the table, where a lookup and then an insert take three (on a
    /// million entries, each a likely miss of the cache).
    pub(crate) fn entry(&mut self, name: &Hashed<'_>) -> hash_table::Entry<'_, T> {
        self.entry_by(name.hash, |entry| entry.is_named(name.name))
    }

    pub(crate) fn remove(&mut self, name: &Hashed<'_>) -> Option<T> {
        self.remove_by(name.hash, |entry| entry.is_named(name.name))
    }
}

impl<T: Rehash> Shard<'_, T> {
    /// The entry of `hash` that `is` picks: for entries whose name cannot
    /// always be read (a gate's, once dropped).
    pub(crate) fn find_mut_by(&mut self, hash: u64, is: impl FnMut(&T) -> bool) -> Option<&mut T> {
        self.table.find_mut(hash, is)
    }

    /// [`entry`](Self::entry), picked by `is`.
    pub(crate) fn entry_by(
        &mut self,
        hash: u64,
        is: impl FnMut(&T) -> bool,
    ) -> hash_table::Entry<'_, T> {
        let seed = self.seed;
        self.table.entry(hash, is, |t| t.name_hash(seed))
    }

    /// [`remove`](Self::remove), picked by `is`.
    pub(crate) fn remove_by(&mut self, hash: u64, is: impl FnMut(&T) -> bool) -> Option<T> {
        let found = self.table.find_entry(hash, is);
        found.ok().map(|entry| entry.remove().0)
    }

    /// Keep the entries `keep` says to, giving memory back once the shard
    /// is mostly empty (as [`shrink`] does).
    pub(crate) fn retain(&mut self, keep: impl FnMut(&mut T) -> bool) {
        self.table.retain(keep);
        self.shrink();
    }

    /// [`shrink`], for a shard.
    pub(crate) fn shrink(&mut self) {
        let len = self.table.len();
        if mostly_empty(len, self.table.capacity()) {
            let seed = self.seed;
            self.table.shrink_to(len * 2, |t| t.name_hash(seed));
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.table.iter()
    }

    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// Every entry, taken out.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.table.drain()
    }
}

/// Give memory back once a map is mostly empty (after a burst of keys),
/// at a cost amortized over the removals that emptied it.
pub(crate) fn shrink<K: Eq + std::hash::Hash, V, S: BuildHasher>(map: &mut HashMap<K, V, S>) {
    if mostly_empty(map.len(), map.capacity()) {
        map.shrink_to(map.len() * 2);
    }
}

/// A map of `len` entries with room for `capacity` is worth shrinking (to
/// twice its entries): a quarter full, and past a few cache lines.
fn mostly_empty(len: usize, capacity: usize) -> bool {
    capacity > 64 && len < capacity / 4
}

/// The holds a sweep is letting go of, counted for each thing held (by
/// its address): a holder going in the same sweep still holds until it
/// goes, and is no word that what it holds lives on. Nearly always one
/// or two things are held (a vendor's model), so a list.
#[derive(Default)]
pub(crate) struct Going(Vec<(*const (), usize)>);

impl Going {
    /// How many of the holds going are on `held`.
    pub(crate) fn on<T: ?Sized>(&self, held: &T) -> usize {
        let at = std::ptr::from_ref(held).cast::<()>();
        self.0
            .iter()
            .find(|(on, _)| *on == at)
            .map_or(0, |(_, n)| *n)
    }

    /// One more hold on `held` is going.
    pub(crate) fn add<T: ?Sized>(&mut self, held: &T) {
        let at = std::ptr::from_ref(held).cast::<()>();
        match self.0.iter_mut().find(|(on, _)| *on == at) {
            Some((_, n)) => *n += 1,
            None => self.0.push((at, 1)),
        }
    }

    /// The holds counted went.
    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }
}

/// Values shared by name, held weakly: each lives as long as something
/// holds it, and leaves the map when the last holder lets go (its
/// [`Listing`] drops with it). Behind a read-write lock: every new lane
/// finds its vendor's model and its road here, and those that find them
/// (all but the first of a vendor's or a road's) only read, in parallel.
pub(crate) type Listings<T> = RwLock<Names<Arc<str>, Weak<T>>>;

/// [`lock`], to read.
pub(crate) fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

/// [`lock`], to write.
pub(crate) fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

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
        let mut map = write(&map);
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

/// The value listed under `key`, if one lives.
pub(crate) fn found<T>(map: &Listings<T>, key: &str) -> Option<Arc<T>> {
    read(map).get(key).and_then(Weak::upgrade)
}

/// Every value listed that lives. Each is upgraded under the lock and let
/// go of by the caller, outside it: a value's last drop takes the lock.
pub(crate) fn living<T>(map: &Listings<T>) -> Vec<Arc<T>> {
    read(map).values().filter_map(Weak::upgrade).collect()
}

/// The value listed under `key`, else one `make` builds now (given its
/// listing) and lists.
pub(crate) fn listed<T>(
    map: &Arc<Listings<T>>,
    key: &str,
    make: impl FnOnce(Listing<T>) -> T,
) -> Arc<T> {
    if let Some(value) = found(map, key) {
        return value;
    }
    // Made under the write lock, looked for again: one value per key.
    let mut values = write(map);
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
