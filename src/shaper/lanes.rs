//! The registry's lanes by name: in shards, so that finding a lane takes
//! one shard's lock and lookups on other shards go on meanwhile; swept for
//! idle lanes by one task per shaper (not one per lane, and none while
//! there is no lane); held to `max_lanes`.
//!
//! **Eviction never loses state.** A lane goes only when nobody holds it
//! and nobody waits in it, and each of its gates either counts nothing or
//! lives on without it. The sweeper lets a lane quiet for `idle` go while
//! its own gate still counts (a daily quota partly spent): that gate's
//! meters rest in the gate map (`gate/map.rs`) until they count nothing,
//! and the vendor's gate lives on with the model they keep. The next
//! request for its key makes a new lane around them and sees no
//! difference. A pause, a stop or strict spacing in flight keeps its lane.
//!
//! **The cap.** Past `max_lanes`, making a lane first evicts an idle one:
//! the least recently used of a sample of [`SAMPLE`] in a shard (as
//! Redis's `allkeys-lru` samples), shard after shard until one is found.
//! When none can go, the request that needed a new lane ends with
//! [`Error::LaneLimit`]. The cap evicts only lanes whose every gate counts
//! nothing: resting gates are not lanes, and are not counted.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use hashbrown::hash_table;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::Error;
use crate::gate::GateMap;
use crate::lane::{Lane, LaneSnapshot, Leaving};
use crate::observability::Count;
use crate::sync::{Going, Hashed, Named, Rehash, SHARDS, Sharded, lock};
use crate::time::{AtomicTick, later};

/// The longest idle timeout: a lane tells its quiet within
/// [`AtomicTick::REACH`] (24.8 days), and the sweeper looks at a lane an
/// eighth of the timeout after it is due at most, so a quiet lane is let
/// go before its quiet is past telling. A lane that goes loses nothing:
/// what its meters count rests.
const LONGEST_IDLE: Duration = Duration::from_secs(20 * 86_400);
const _: () = assert!(LONGEST_IDLE.as_millis() * 9 / 8 < AtomicTick::REACH.as_millis());

/// Lanes looked at to pick one to evict for the cap.
const SAMPLE: usize = 32;

/// A lane in its map, found by its name, which the lane keeps in parts
/// (see `lane/name.rs`), with that name's hash: a shard's table growing
/// would otherwise write every lane's name out to hash it again (600
/// instructions of a tenant's first request at a million tenants). The
/// lane keeps the hash, not the slot: a slot is 8 bytes, and a shard's
/// table is half empty after it grows, so each tenant pays for two.
struct Entry {
    lane: Lane,
}

impl Named for Entry {
    fn is_named(&self, name: &str) -> bool {
        self.lane.name().is(name)
    }
}

impl Rehash for Entry {
    fn name_hash(&self, _: &foldhash::quality::RandomState) -> u64 {
        self.lane.listed()
    }
}

/// A lane the cap can evict without losing anything: held by nobody but
/// the map, and counting nothing of its own (see [`Leaving::Bare`]).
fn evictable(lane: &Lane) -> bool {
    lane.can_leave(Instant::now(), Leaving::Bare, &Going::default())
}

pub(super) struct Lanes {
    shards: Sharded<Entry>,
    /// Lanes in the map, and those being made (a place taken under the cap).
    live: AtomicUsize,
    max: Option<usize>,
    /// A lane quiet and idle this long is dropped: the policy's
    /// `idle_timeout`, at most [`LONGEST_IDLE`].
    idle: Duration,
    /// Shut down: no lane is made any more.
    shut: AtomicBool,
    /// The task that drops idle lanes, on the runtime that made the last
    /// lane (a task ends with its runtime; the next lane made, or found,
    /// starts another).
    sweeper: Mutex<Option<JoinHandle<()>>>,
    /// A sweeper task lives: set as one is spawned, cleared as it ends,
    /// however it ends (its runtime may end under it).
    sweeping: Arc<AtomicBool>,
    /// Told when a lane's dispatcher retires (see `sweep`).
    retired: Arc<Notify>,
    count: Count,
    /// Where a lane that goes leaves the meters that still count.
    gates: Arc<GateMap>,
    /// Held while a lane is let go (a sweep, an eviction for the cap): a
    /// lane goes on the word that another still holds its vendor's model,
    /// which one going at a time may rely on. It holds when the resting
    /// meters are next looked at, which only a sweep reads.
    leaving: Mutex<Option<Instant>>,
}

impl Lanes {
    pub(super) fn new(max: Option<usize>, idle: Duration, gates: Arc<GateMap>) -> Self {
        Self {
            shards: Sharded::default(),
            live: AtomicUsize::new(0),
            max,
            idle: idle.min(LONGEST_IDLE),
            shut: AtomicBool::new(false),
            sweeper: Mutex::new(None),
            sweeping: Arc::new(AtomicBool::new(false)),
            retired: Arc::new(Notify::new()),
            count: Count::lanes(),
            gates,
            leaving: Mutex::new(None),
        }
    }

    /// `name`, hashed once for [`find`](Self::find) and
    /// [`open`](Self::open).
    pub(super) fn hashed<'a>(&self, name: &'a str) -> Hashed<'a> {
        self.shards.hashed(name)
    }

    /// The lane named `name`, if it is live.
    pub(super) fn find(&self, name: &Hashed<'_>) -> Option<Lane> {
        let lanes = self.shards.shard_of(name);
        lanes.get(name).map(|entry| entry.lane.clone())
    }

    /// The lane named `name`: the live one, or one `make` makes (after
    /// evicting an idle lane if the cap is reached). `Error::Shutdown`
    /// once shut down; `Error::LaneLimit` when the cap is reached and no
    /// lane can go.
    pub(super) fn open(
        self: &Arc<Self>,
        name: &Hashed<'_>,
        make: impl FnOnce(u64) -> Lane,
    ) -> Result<Lane, Error> {
        let shard = self.shards.index_of(name);
        self.take_place(name.name(), shard)?;
        let mut lanes = self.shards.shard(shard);
        // Checked under the shard's lock, which `shut_down` takes after
        // setting the flag: a lane made here is either refused or drained.
        if self.shut.load(Ordering::Acquire) {
            drop(lanes);
            self.give_place();
            return Err(Error::Shutdown);
        }
        let lane = match lanes.entry(name) {
            hash_table::Entry::Occupied(found) => {
                // Made by another request meanwhile.
                let lane = found.get().lane.clone();
                drop(lanes);
                self.give_place();
                return Ok(lane);
            }
            hash_table::Entry::Vacant(place) => {
                let lane = make(name.hash());
                place.insert(Entry { lane: lane.clone() });
                lane
            }
        };
        drop(lanes);
        self.count.up();
        self.sweep_later();
        Ok(lane)
    }

    /// Count a lane about to be made, under the cap: evicting idle lanes
    /// to make room, or refusing when none can go.
    fn take_place(&self, name: &str, shard: usize) -> Result<(), Error> {
        let Some(max) = self.max else {
            self.live.fetch_add(1, Ordering::AcqRel);
            return Ok(());
        };
        loop {
            let taken = self
                .live
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < max).then_some(n + 1)
                });
            if taken.is_ok() {
                return Ok(());
            }
            if !self.evict_one(shard) {
                return Err(Error::LaneLimit {
                    lane: name.to_owned(),
                    max_lanes: max,
                });
            }
        }
    }

    fn give_place(&self) {
        self.live.fetch_sub(1, Ordering::AcqRel);
    }

    /// Evict one idle lane that nobody holds: the quietest of the first
    /// [`SAMPLE`] lanes met, shard after shard from `from`; when none of
    /// those can go, the quietest of all. False if none can go at all.
    fn evict_one(&self, from: usize) -> bool {
        let quietest = self
            .quietest(from, Some(SAMPLE))
            .or_else(|| self.quietest(from, None));
        let Some((shard, lane)) = quietest else {
            return false;
        };
        // Found again by its name: held here, it could not go.
        let name = lane.name().to_string();
        drop(lane);
        let name = self.shards.hashed(&name);
        let _leaving = lock(&self.leaving);
        let mut lanes = self.shards.shard(shard);
        // Looked at again under the lock: a request may have taken it up.
        if lanes.get(&name).is_none_or(|entry| !evictable(&entry.lane)) {
            return true;
        }
        let evicted = lanes.remove(&name);
        drop(lanes);
        // Dropped while going is held, outside the shard's lock.
        drop(evicted);
        self.dropped(1);
        true
    }

    /// The quietest evictable lane among the first `sample` met (all,
    /// without one), shard after shard from `from`: its shard and itself.
    fn quietest(&self, from: usize, sample: Option<usize>) -> Option<(usize, Lane)> {
        let mut left = sample.unwrap_or(usize::MAX);
        let mut quietest: Option<(Duration, usize, Lane)> = None;
        for i in 0..SHARDS {
            let shard = (from + i) % SHARDS;
            for Entry { lane, .. } in self.shards.shard(shard).iter().take(left) {
                left -= 1;
                let quiet = lane.quiet_for();
                if quietest.as_ref().is_none_or(|(q, ..)| quiet > *q) && evictable(lane) {
                    quietest = Some((quiet, shard, lane.clone()));
                }
            }
            if left == 0 {
                break;
            }
        }
        quietest.map(|(_, shard, lane)| (shard, lane))
    }

    fn dropped(&self, n: usize) {
        self.live.fetch_sub(n, Ordering::AcqRel);
        self.count.down(n);
    }

    /// Start the sweeper if none runs (on this runtime or at all).
    fn sweep_later(self: &Arc<Self>) {
        let mut sweeper = lock(&self.sweeper);
        // Set first: a task ending at once clears it after.
        self.sweeping.store(true, Ordering::Release);
        if sweeper.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        let sweeping = Sweeping(self.sweeping.clone());
        *sweeper = Some(tokio::spawn(sweep(
            Arc::downgrade(self),
            self.idle,
            sweeping,
        )));
    }

    /// A request found its lane (on a runtime): if the sweeper ended with
    /// the runtime it ran on, start another here. Lanes are otherwise let
    /// go only once a new lane is made.
    pub(super) fn keep_swept(self: &Arc<Self>) {
        if !self.sweeping.load(Ordering::Acquire) {
            self.sweep_later();
        }
    }

    /// Let every lane quiet for `idle` go that nobody holds or waits in
    /// and that loses nothing by going ([`Lane::can_leave`]), its meters
    /// resting if they count; forget resting meters that count nothing any
    /// more. How long until the next may be due (`None`: none until a busy
    /// lane retires its dispatcher, which nudges the sweeper; never while
    /// it left no lane).
    fn sweep(&self) -> Option<Duration> {
        let mut resting_at = lock(&self.leaving);
        let now = Instant::now();
        let mut next: Option<Duration> = None;
        let mut due = |after: Duration| next = Some(next.map_or(after, |n| n.min(after)));
        let mut going: Vec<Lane> = Vec::new();
        let mut kept = 0;
        // The roads the lanes in `going` hold, and the vendors' models
        // the roads going whole hold.
        let mut holds = Going::default();
        for mut lanes in self.shards.shards() {
            let before = lanes.len();
            lanes.retain(|Entry { lane, .. }| {
                let quiet = lane.quiet_at(now);
                if quiet < self.idle {
                    due(self.idle - quiet);
                    return true;
                }
                if lane.is_busy() {
                    // Its release, then its dispatcher's retirement, come
                    // first: the nudge says when.
                    return true;
                }
                // The lanes going before it in this shard hold their
                // road, and through it their vendor's model, until they go.
                if lane.can_leave(now, Leaving::Resting, &holds) {
                    lane.goes(&mut holds);
                    going.push(lane.clone());
                    return false;
                }
                // Held, paused or strict in flight: look again an `idle`
                // later, as its dispatcher once did.
                due(self.idle);
                true
            });
            let gone = before - lanes.len();
            kept += lanes.len();
            drop(lanes);
            if gone > 0 {
                self.dropped(gone);
            }
            // Outside the shard's lock: a gate that rests takes the gate
            // map's, which a lane being made takes under a shard's.
            for lane in going.drain(..) {
                lane.leave(&self.gates, now);
            }
            holds.clear();
        }
        // No lane left: one made since its shard was read (as the last one
        // went, say) is news to this sweep, and without a dispatcher it
        // never nudges the sweeper, which would then wait for good. Looked
        // at an `idle` later, unless the sweeper retires first.
        if kept == 0 {
            due(self.idle);
        }
        // Resting meters are looked at once an `idle` (a pass over the
        // gate map holds its lock, which every new lane takes).
        if self.gates.resting() > 0 {
            match *resting_at {
                Some(at) if at > now => due(at - now),
                _ => {
                    *resting_at = Some(later(now, self.idle));
                    if self.gates.sweep(now) {
                        due(self.idle);
                    }
                }
            }
        }
        next
    }

    /// A lane's dispatcher retired: its lane may be due an `idle` later.
    pub(super) fn nudge(&self) -> Arc<Notify> {
        self.retired.clone()
    }

    /// The sweeper ends with the last lane (the next lane starts one):
    /// under the sweeper's lock, which a lane made takes after counting
    /// itself live, so no lane is left without one.
    fn retire_sweeper(&self) -> bool {
        let mut sweeper = lock(&self.sweeper);
        if self.live.load(Ordering::Acquire) > 0 || self.gates.resting() > 0 {
            return false;
        }
        *sweeper = None;
        true
    }

    /// How many lanes are live.
    pub(super) fn len(&self) -> usize {
        self.shards.shards().map(|shard| shard.len()).sum()
    }

    /// What the lane `name` is doing, if it is live.
    pub(super) fn snapshot(&self, name: &str) -> Option<LaneSnapshot> {
        self.find(&self.hashed(name)).map(|lane| lane.snapshot())
    }

    /// Every live lane, shard by shard (each lock held only while its
    /// lanes are copied out).
    pub(super) fn all(&self) -> Vec<Lane> {
        self.shards
            .shards()
            .flat_map(|shard| {
                let lanes = shard.iter().map(|entry| entry.lane.clone());
                lanes.collect::<Vec<_>>()
            })
            .collect()
    }

    /// Make no lane any more, and close the live ones.
    pub(super) fn shut_down(&self) {
        self.shut.store(true, Ordering::Release);
        for mut shard in self.shards.shards() {
            let closing: Vec<Lane> = shard.drain().map(|entry| entry.lane).collect();
            drop(shard);
            self.dropped(closing.len());
            for lane in closing {
                lane.close();
            }
        }
        if let Some(sweeper) = lock(&self.sweeper).take() {
            sweeper.abort();
        }
        self.gates.clear_resting();
    }
}

/// Sweep `lanes` when their quietest could next be due (first, `idle`
/// after the first lane), or soon after a busy lane's dispatcher retired,
/// while they exist and hold any, or meters rest. A lane goes once it has
/// been quiet for `idle` and loses nothing by going; one held back (a
/// pause, strict spacing in flight) is looked at again `idle` later; one
/// with a dispatcher is left to it. No two sweeps are closer than an
/// eighth of `idle` (a lane goes at most that late) nor a millisecond,
/// nor, for retirements, than a quarter of `idle`: a sweep reads every
/// lane, and lanes made all the time would have it read them all every
/// millisecond.
async fn sweep(lanes: Weak<Lanes>, idle: Duration, _sweeping: Sweeping) {
    let least = (idle / 8).max(Duration::from_millis(1));
    let mut wait = Some(idle);
    loop {
        let Some(retired) = lanes.upgrade().map(|lanes| lanes.nudge()) else {
            return;
        };
        let nudged = async {
            retired.notified().await;
            tokio::time::sleep((idle / 4).max(least)).await;
        };
        match wait {
            Some(wait) => tokio::select! {
                () = tokio::time::sleep(wait.max(least)) => {}
                () = nudged => {}
            },
            None => nudged.await,
        }
        let Some(lanes) = lanes.upgrade() else { return };
        wait = lanes.sweep();
        if lanes.retire_sweeper() {
            return;
        }
    }
}

/// Held by a sweeper task: says no sweeper runs once it ends, as it
/// returns or as its runtime drops it.
struct Sweeping(Arc<AtomicBool>);

impl Drop for Sweeping {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    /// A lane's slot in its shard is its handle alone, 8 bytes: the lane
    /// keeps its name's hash (a slot with it took 16). A field that grows
    /// it shows here first.
    #[test]
    fn a_lane_is_listed_in_8_bytes() {
        assert_eq!(size_of::<super::Entry>(), 8);
    }
}
