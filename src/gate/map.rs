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
//! for a while weighs about three quarters of what it did (236–249 B of
//! heap, where its lane was 306–332, in `--bench tenants`). Its meters go
//! once they count nothing, and what they kept alive with them.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use hashbrown::hash_table;
use tokio::time::Instant;

use super::level::{Gate, GateLevel, Listed, Unlist};
use crate::meters::Meters;
use crate::observability::Count;
use crate::sync::{Going, Rehash, Shard, Sharded};

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
    shards: Sharded<Listing>,
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

/// A gate in the map, in a slot of 16 bytes (one with the name beside
/// the entry took 32, one with a resting gate's name in it 24): a live
/// gate, whose name is its own, read there, with its name's hash, kept
/// because a dropped gate's name can no longer be read and its shard's
/// table may grow before its listing leaves; or a resting gate, its name
/// in its box. A live tenant's slot is the one to keep small: a shard's
/// table is half empty after it grows, so each tenant pays for two.
enum Listing {
    Live { hash: u64, gate: Weak<Gate> },
    Resting(Box<Resting>),
}

impl Rehash for Listing {
    fn name_hash(&self, seed: &foldhash::quality::RandomState) -> u64 {
        match self {
            Self::Live { hash, .. } => *hash,
            Self::Resting(resting) => seed.hash_one(&*resting.key),
        }
    }
}

impl Listing {
    /// A place held while its gate is made, or its entry leaves.
    fn vacant() -> Self {
        Self::Live {
            hash: 0,
            gate: Weak::new(),
        }
    }
}

/// Where a gate being made goes: its resting meters' entry, or a free
/// place for one.
enum Slot<'a> {
    Found(&'a mut Listing),
    Free(hash_table::VacantEntry<'a, Listing>),
}

/// A resting gate: the name it rests under, its meters, and what they
/// keep alive.
struct Resting {
    key: Box<str>,
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
        let hash = hashed.hash();
        // Live gates of the same hash but another name (a 64-bit hash
        // shared: all but never) are let go of outside the lock, which a
        // gate's last drop takes.
        let mut others: Vec<Arc<Gate>> = Vec::new();
        let mut gates = self.shards.shard_of(&hashed);
        // One probe: the live gate, or the resting meters to wake in their
        // own entry, or the place for a new gate. A dead gate's entry is
        // not its name's any more: its listing removes it as it leaves.
        let mut live = None;
        let found = gates.entry_by(hash, |listing| match listing {
            Listing::Resting(resting) => *resting.key == *key,
            Listing::Live { hash: of, gate } => {
                *of == hash
                    && match gate.upgrade() {
                        Some(gate) if gate.key() == Some(key) => {
                            live = Some(gate);
                            true
                        }
                        stray => {
                            others.extend(stray);
                            false
                        }
                    }
            }
        });
        if let Some(gate) = live {
            drop(gates);
            drop(others);
            return gate;
        }
        // The entry to make the gate in (the resting one wakes in place,
        // under the key it kept), or the place for one.
        let (slot, rested) = match found {
            hash_table::Entry::Occupied(found) => {
                let listing = found.into_mut();
                match std::mem::replace(listing, Listing::vacant()) {
                    Listing::Resting(resting) => (Slot::Found(listing), Some(*resting)),
                    // Only a live gate is found otherwise, and returned above.
                    Listing::Live { .. } => (Slot::Found(listing), None),
                }
            }
            hash_table::Entry::Vacant(place) => (Slot::Free(place), None),
        };
        if rested.is_some() {
            self.resting.fetch_sub(1, Ordering::AcqRel);
            self.count.down(1);
        }
        let (key, meters, keep) = match rested {
            Some(Resting { key, meters, keep }) => (key, Some(meters), Some(keep)),
            None => (Box::from(key), None, None),
        };
        let map: Weak<dyn Unlist> = Arc::downgrade(self) as Weak<Self>;
        let gate = Arc::new(make(Listed::new(level(), key, map), meters));
        let live = Listing::Live {
            hash,
            gate: Arc::downgrade(&gate),
        };
        match slot {
            Slot::Found(listing) => *listing = live,
            Slot::Free(place) => {
                place.insert(live);
            }
        }
        drop(gates);
        // Let go of outside the lock: the last hold of a model drops its
        // gate, which leaves this map.
        drop((keep, others));
        gate
    }

    /// Let the gate `gate` go: when nothing else holds it and its meters
    /// still count something, they rest here with `keep`. True when they
    /// do. A gate another lane holds stays with it; one with more than
    /// meters (a pause, a queue, strict spacing: see [`Gate::can_rest`])
    /// or with nothing counted goes as a gate does.
    pub(crate) fn rest(&self, gate: Arc<Gate>, keep: &Arc<dyn Keep>, now: Instant) -> bool {
        let Some(key) = gate.key() else {
            return false;
        };
        let hashed = self.shards.hashed(key);
        let hash = hashed.hash();
        // Its entry is found by its address once it is dropped, when its
        // name can no longer be read there.
        let at = Arc::as_ptr(&gate);
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
        let Some((meters, key)) = gate.into_rest(now) else {
            drop(gates);
            return false;
        };
        let its_own = |listing: &Listing| match listing {
            Listing::Live { gate, .. } => std::ptr::eq(gate.as_ptr(), at),
            Listing::Resting(_) => false,
        };
        let rests = !meters.is_idle(now)
            && match gates.find_mut_by(hash, its_own) {
                Some(listing) => {
                    *listing = Listing::Resting(Box::new(Resting {
                        key,
                        meters,
                        keep: keep.clone(),
                    }));
                    true
                }
                None => false,
            };
        if rests {
            self.resting.fetch_add(1, Ordering::AcqRel);
            self.count.up();
        } else {
            // Its listing went without its name: its dead entry goes here.
            forget_dead(&mut gates, hash);
        }
        drop(gates);
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
            .filter_map(|listing| match listing {
                Listing::Live { gate, .. } => gate.upgrade(),
                Listing::Resting(_) => None,
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
        let mut gone: Vec<Listing> = Vec::new();
        // What the picked ones keep, held until they go at the end.
        let mut holds = Going::default();
        for mut gates in self.shards.shards() {
            gates.retain(|listing| {
                let Listing::Resting(resting) = listing else {
                    return true;
                };
                if !go(resting, holds.on(&*resting.keep)) {
                    return true;
                }
                holds.add(&*resting.keep);
                gone.push(std::mem::replace(listing, Listing::vacant()));
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
        forget_dead(&mut self.shards.shard_of(&key), key.hash());
    }
}

/// A dropped gate of `hash` leaves `gates`: any dead gate's entry of that
/// hash goes. A dead gate's name can no longer be read, and each dead
/// entry is one listing's to remove (all of the same name, all but
/// surely).
fn forget_dead(gates: &mut Shard<'_, Listing>, hash: u64) {
    let dead = |listing: &Listing| match listing {
        Listing::Live { gate, .. } => gate.strong_count() == 0,
        Listing::Resting(_) => false,
    };
    if gates.remove_by(hash, dead).is_some() {
        gates.shrink();
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A gate's slot in its shard is its hash and its entry, 16 bytes: its
    /// name is the gate's own, or in its resting box (a live tenant's slot
    /// took 32 with the name beside it, 24 with a resting name in it). A
    /// field that grows it shows here first.
    #[test]
    fn a_gate_is_listed_in_16_bytes() {
        assert_eq!(size_of::<Listing>(), 16);
    }

    /// A map's slot keeps a live gate's hash, not its name (the gate's own):
    /// resting meters are still found after their shard's table grew and
    /// shrank around them (placed again by their name's hash), a dropped
    /// gate's entry leaves even when a new gate of its name was listed
    /// first, and so does the entry of one let go with nothing to rest.
    #[tokio::test(start_paused = true)]
    async fn resting_meters_are_found_after_the_map_grew_and_shrank_around_them() {
        use crate::gate::tests::{settings, vendor};
        use crate::meters::{Meters, Quota};

        let entries = |map: &GateMap| map.shards.shards().map(|shard| shard.len()).sum::<usize>();

        let map = Arc::new(GateMap::default());
        let level = Arc::new(GateLevel::new(
            "tenant",
            Arc::from([Quota::fixed_window(5, Duration::from_secs(60))]),
            settings(Duration::ZERO),
        ));
        let gate = |key: &str| {
            map.gate(
                key,
                || level.clone(),
                |listed, rested: Option<Meters>| match rested {
                    Some(meters) => Gate::resumed(listed, meters),
                    None => Gate::new(listed, 1),
                },
            )
        };
        let keep: Arc<dyn Keep> = vendor(Quota::fixed_window(1, Duration::from_secs(3600)));
        let now = Instant::now();
        // Past the first word's wait, which holds a burst.
        let then = now + crate::meters::FIRST_WORD;
        let acme = gate("acme");
        for _ in 0..3 {
            acme.meters().commit(1, now);
        }
        assert!(map.rest(acme, &keep, now));
        // Enough gates to grow every shard's table several times over, then
        // let go of, which shrinks them again.
        let crowd: Vec<Arc<Gate>> = (0..20_000).map(|i| gate(&format!("t{i}"))).collect();
        assert_eq!(map.resting(), 1);
        drop(crowd);
        let woken = gate("acme");
        assert_eq!(map.resting(), 0, "woken, not made anew");
        woken.meters().commit(1, then);
        assert!(woken.meters().earliest(1, then) <= then, "one is left");
        woken.meters().commit(1, then);
        assert!(
            woken.meters().earliest(1, then) > then,
            "three before it rested and two since are the window's five"
        );

        // A gate dropped while a new one of its name is listed: the new one
        // stays found, and each dropped gate's entry leaves.
        let first = gate("globex");
        let weak = Arc::downgrade(&first);
        drop(first);
        assert!(weak.upgrade().is_none());
        let second = gate("globex");
        assert!(Arc::ptr_eq(&second, &gate("globex")));
        assert_eq!(entries(&map), 2, "acme's and the second globex's");
        drop((woken, second));
        assert_eq!(entries(&map), 0, "every gate left");

        // A gate let go with nothing counted does not rest, and leaves.
        let idle = gate("initech");
        assert!(!map.rest(idle, &keep, now));
        assert_eq!((map.resting(), entries(&map)), (0, 0), "nothing rests");
    }
}
