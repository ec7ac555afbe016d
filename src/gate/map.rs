//! The shared gates of a shaper by name ([`GateMap`]), and the meters of
//! gates at rest.
//!
//! A gate lives as long as a lane holds it. A lane that goes (quiet for
//! its `idle_timeout`) while its own gate still counts something, a daily
//! quota partly spent, leaves that gate's meters here, **resting**, with
//! what keeps its vendor's model alive ([`Keep`]). The next lane of that
//! key takes them back, so a key's lane going costs the key nothing of
//! its quota. A resting gate is its meters and its name, where a live one
//! is also a lane, its gate, and their names and entries: a tenant quiet
//! for a while weighs about seven tenths of what it did (260–285 B of
//! heap, where its lane was 362–401, in `--bench tenants`). Its meters go once
//! they count nothing, and what they kept alive with them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use hashbrown::hash_table;
use tokio::time::Instant;

use super::level::{Gate, GateLevel, Listed, Unlist};
use crate::meters::Meters;
use crate::observability::Count;
use crate::sync::{Going, Sharded};

/// What a resting gate keeps alive: its vendor's model, whose gate holds
/// the vendor's own count, which no lane may hold any more.
pub(crate) trait Keep: Send + Sync {
    /// Forgetting it at `now` loses nothing (nothing counted, no pause).
    fn rested(&self, now: Instant) -> bool;
}

/// The shared gates of a shaper by name: the live ones (held by their
/// lanes, listed weakly, leaving the map as the last holder lets go), and
/// the resting ones. In shards, as the lanes are: every new lane takes a
/// gate's shard, and a sweep of a million resting gates holds one shard
/// at a time.
pub(crate) struct GateMap {
    shards: Sharded<(Arc<str>, Entry)>,
    /// Resting gates: the sweeper goes on while there are any.
    resting: AtomicUsize,
    /// The same, as a gauge.
    count: Count,
}

impl Default for GateMap {
    fn default() -> Self {
        Self {
            shards: Sharded::default(),
            resting: AtomicUsize::new(0),
            count: Count::resting_gates(),
        }
    }
}

enum Entry {
    Live(Weak<Gate>),
    Resting(Box<Resting>),
}

/// Where a gate being made goes: its key's entry, dead or resting, or a
/// free place for one.
enum Slot<'a> {
    Found(&'a mut Entry),
    Free(hash_table::VacantEntry<'a, (Arc<str>, Entry)>),
}

struct Resting {
    meters: Meters,
    keep: Arc<dyn Keep>,
}

impl GateMap {
    /// The live gate named `key`; else one `make` builds now, given its
    /// listing (in this map, of the `level` it asks for, whose gates are
    /// all listed here) and the meters it rested with, if it rested.
    pub(crate) fn gate(
        self: &Arc<Self>,
        key: &str,
        level: impl FnOnce() -> Arc<GateLevel>,
        make: impl FnOnce(Listed, Option<Meters>) -> Gate,
    ) -> Arc<Gate> {
        let hashed = self.shards.hashed(key);
        let mut gates = self.shards.shard_of(&hashed);
        // One probe: the gate, or its entry to make it in (a resting one
        // wakes in place, under the key it kept), or the place for one.
        let (slot, key, rested) = match gates.entry(&hashed) {
            hash_table::Entry::Occupied(found) => {
                let (key, entry) = found.into_mut();
                if let Entry::Live(gate) = entry
                    && let Some(gate) = gate.upgrade()
                {
                    return gate;
                }
                let rested = match std::mem::replace(entry, Entry::Live(Weak::new())) {
                    Entry::Resting(resting) => Some(*resting),
                    // Dead, its listing yet to leave: finding this gate
                    // live, it leaves the entry be.
                    Entry::Live(_) => None,
                };
                (Slot::Found(entry), key.clone(), rested)
            }
            hash_table::Entry::Vacant(place) => (Slot::Free(place), Arc::from(key), None),
        };
        if rested.is_some() {
            self.resting.fetch_sub(1, Ordering::AcqRel);
            self.count.down(1);
        }
        let (meters, keep) = rested
            .map(|Resting { meters, keep }| (meters, keep))
            .unzip();
        let map: Weak<dyn Unlist> = Arc::downgrade(self) as Weak<Self>;
        let gate = Arc::new(make(Listed::new(level(), key.clone(), map), meters));
        let live = Entry::Live(Arc::downgrade(&gate));
        match slot {
            Slot::Found(entry) => *entry = live,
            Slot::Free(place) => {
                place.insert((key, live));
            }
        }
        drop(gates);
        // Let go of outside the lock: the last hold of a model drops its
        // gate, which leaves this map.
        drop(keep);
        gate
    }

    /// Let the gate `gate` go: when nothing else holds it and its meters
    /// still count something, they rest here with `keep`. True when they
    /// do. A gate another lane holds stays with it; one with more than
    /// meters (a pause, a queue, strict spacing: see [`Gate::can_rest`])
    /// or with nothing counted goes as a gate does.
    pub(crate) fn rest(&self, gate: Arc<Gate>, keep: &Arc<dyn Keep>, now: Instant) -> bool {
        let Some(key) = gate.listed_key() else {
            return false;
        };
        let hashed = self.shards.hashed(&key);
        let mut gates = self.shards.shard_of(&hashed);
        // Under the lock nobody takes a gate up (`gate` upgrades under
        // it): one holder now is the last.
        let gate = match Arc::try_unwrap(gate) {
            Ok(gate) => gate,
            Err(shared) => {
                // Let go of outside the lock: the other holder may let go
                // first, and a gate's last drop takes the lock.
                drop(gates);
                drop(shared);
                return false;
            }
        };
        if !gate.can_rest(now) {
            drop(gates);
            // Dropped outside the lock: its listing takes it.
            drop(gate);
            return false;
        }
        let Some((meters, listed)) = gate.into_rest(now) else {
            drop(gates);
            return false;
        };
        let rests = !meters.is_idle(now)
            && gates
                .get_mut(&hashed)
                .is_some_and(|(_, entry)| match entry {
                    Entry::Live(live) if live.strong_count() == 0 => {
                        *entry = Entry::Resting(Box::new(Resting {
                            meters,
                            keep: keep.clone(),
                        }));
                        true
                    }
                    _ => false,
                });
        if rests {
            self.resting.fetch_add(1, Ordering::AcqRel);
            self.count.up();
        }
        drop(gates);
        // Its listing leaves a dead entry, never a resting one.
        drop(listed);
        rests
    }

    /// Resting gates whose meters count nothing any more go, with what
    /// they kept alive, unless that still counts something and nothing
    /// else keeps it. True when some still rest.
    pub(crate) fn sweep(&self, now: Instant) -> bool {
        self.forget_resting(|resting, going| resting.can_go(now, going)) > 0
    }

    /// How many gates rest.
    pub(crate) fn resting(&self) -> usize {
        self.resting.load(Ordering::Acquire)
    }

    /// Run `change` under the map's lock, then the live gates (for a live
    /// change of their quotas, ordered against gates being made); resting
    /// meters catch up as they wake ([`Gate::resumed`]).
    pub(crate) fn live_after(&self, change: impl FnOnce()) -> Vec<Arc<Gate>> {
        // Every shard, in order (nothing else holds two).
        let shards: Vec<_> = self.shards.shards().collect();
        change();
        shards
            .iter()
            .flat_map(|gates| gates.iter())
            .filter_map(|(_, entry)| match entry {
                Entry::Live(gate) => gate.upgrade(),
                Entry::Resting(_) => None,
            })
            .collect()
    }

    /// Forget every resting gate (the shaper shut down).
    pub(crate) fn clear_resting(&self) {
        self.forget_resting(|_, _| true);
    }

    /// Forget the resting gates `go` picks, shard by shard, given each
    /// and how many of those it already picked keep what it keeps; how
    /// many still rest. What they kept alive is let go of outside the
    /// locks, as in `gate`.
    fn forget_resting(&self, go: impl Fn(&Resting, usize) -> bool) -> usize {
        let mut gone: Vec<Entry> = Vec::new();
        // What the picked ones keep, held until they go at the end.
        let mut holds = Going::default();
        for mut gates in self.shards.shards() {
            gates.retain(|(_, entry)| {
                let Entry::Resting(resting) = entry else {
                    return true;
                };
                if !go(resting, holds.on(&*resting.keep)) {
                    return true;
                }
                holds.add(&*resting.keep);
                gone.push(std::mem::replace(entry, Entry::Live(Weak::new())));
                false
            });
        }
        self.count.down(gone.len());
        let left = self
            .resting
            .fetch_sub(gone.len(), Ordering::AcqRel)
            .saturating_sub(gone.len());
        drop(gone);
        left
    }
}

impl Unlist for GateMap {
    /// A live gate listed under `key` was dropped: its entry goes, unless
    /// the key was listed again since, or rests.
    fn forget(&self, key: &str) {
        let key = self.shards.hashed(key);
        let mut gates = self.shards.shard_of(&key);
        if matches!(gates.get(&key), Some((_, Entry::Live(gate))) if gate.strong_count() == 0) {
            gates.remove(&key);
            gates.shrink();
        }
    }
}

impl Resting {
    /// Its meters count nothing, and what it keeps alive either counts
    /// nothing or is kept by someone else too: not only by the `going`
    /// resting gates that go in the same sweep and keep it until they go.
    fn can_go(&self, now: Instant, going: usize) -> bool {
        self.meters.is_idle(now)
            && (Arc::strong_count(&self.keep) > 1 + going || self.keep.rested(now))
    }
}
