//! The registry's lanes by name: in shards, so that finding a lane takes
//! one shard's lock and lookups on other shards go on meanwhile; swept for
//! idle lanes by one task per shaper (not one per lane, and none while
//! there is no lane); held to `max_lanes`.
//!
//! **Eviction never loses state.** A lane goes only when nobody holds it
//! and it is idle: nobody waiting, no pause, every meter rested. Such a
//! lane behaves exactly as a new one would, so the next request for its
//! key makes a new lane and sees no difference. A daily quota partly
//! spent, or a pause, keeps its lane.
//!
//! **The cap.** Past `max_lanes`, making a lane first evicts an idle one:
//! the least recently used of a sample of [`SAMPLE`] in a shard (as
//! Redis's `allkeys-lru` samples), shard after shard until one is found.
//! When none can go, the request that needed a new lane ends with
//! [`Error::LaneLimit`].

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::error::Error;
use crate::lane::{Lane, LaneSnapshot};
use crate::observability::LaneCount;
use crate::sync::{lock, shrink};

/// Shards of the map: enough that two cores rarely meet on one, few
/// enough that a sweep's pass over them is cheap.
const SHARDS: usize = 64;

/// Lanes looked at to pick one to evict for the cap.
const SAMPLE: usize = 32;

/// A lane that can go without losing anything: idle, and held by nobody
/// but the map.
fn evictable(lane: &Lane) -> bool {
    lane.held_alone() && lane.is_idle()
}

type Shard = Mutex<HashMap<Arc<str>, Lane>>;

pub(super) struct Lanes {
    shards: Box<[Shard]>,
    hasher: RandomState,
    /// Lanes in the map, and those being made (a place taken under the cap).
    live: AtomicUsize,
    max: Option<usize>,
    /// A lane quiet and idle this long is dropped.
    idle: Duration,
    /// Shut down: no lane is made any more.
    shut: AtomicBool,
    /// The task that drops idle lanes, on the runtime that made the last
    /// lane (a task ends with its runtime; the next lane starts another).
    sweeper: Mutex<Option<JoinHandle<()>>>,
    /// Told when a lane's dispatcher retires (see `sweep`).
    retired: Arc<Notify>,
    count: LaneCount,
}

impl Lanes {
    pub(super) fn new(max: Option<usize>, idle: Duration) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            hasher: RandomState::new(),
            live: AtomicUsize::new(0),
            max,
            idle,
            shut: AtomicBool::new(false),
            sweeper: Mutex::new(None),
            retired: Arc::new(Notify::new()),
            count: LaneCount::new(),
        }
    }

    fn shard_of(&self, name: &str) -> usize {
        // The modulo of a 64-bit hash: the low bits are as good as any.
        (self.hasher.hash_one(name) % SHARDS as u64) as usize
    }

    /// The lane named `name`, if it is live.
    pub(super) fn find(&self, name: &str) -> Option<Lane> {
        lock(&self.shards[self.shard_of(name)]).get(name).cloned()
    }

    /// The lane named `name`: the live one, or one `make` makes (after
    /// evicting an idle lane if the cap is reached). `Error::Shutdown`
    /// once shut down; `Error::LaneLimit` when the cap is reached and no
    /// lane can go.
    pub(super) fn open(
        self: &Arc<Self>,
        name: &str,
        make: impl FnOnce() -> Lane,
    ) -> Result<Lane, Error> {
        let shard = self.shard_of(name);
        self.take_place(name, shard)?;
        let mut lanes = lock(&self.shards[shard]);
        // Checked under the shard's lock, which `shut_down` takes after
        // setting the flag: a lane made here is either refused or drained.
        if self.shut.load(Ordering::Acquire) {
            drop(lanes);
            self.give_place();
            return Err(Error::Shutdown);
        }
        if let Some(lane) = lanes.get(name) {
            // Made by another request meanwhile.
            let lane = lane.clone();
            drop(lanes);
            self.give_place();
            return Ok(lane);
        }
        let lane = make();
        lanes.insert(lane.shared_key(), lane.clone());
        drop(lanes);
        self.count.opened();
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
        let Some((shard, name)) = quietest else {
            return false;
        };
        let mut lanes = lock(&self.shards[shard]);
        // Looked at again under the lock: a request may have taken it up.
        if lanes.get(&name).is_none_or(|lane| !evictable(lane)) {
            return true;
        }
        lanes.remove(&name);
        drop(lanes);
        self.dropped(1);
        true
    }

    /// The quietest evictable lane among the first `sample` met (all,
    /// without one), shard after shard from `from`: its shard and name.
    fn quietest(&self, from: usize, sample: Option<usize>) -> Option<(usize, Arc<str>)> {
        let mut left = sample.unwrap_or(usize::MAX);
        let mut quietest: Option<(Duration, usize, Arc<str>)> = None;
        for i in 0..SHARDS {
            let shard = (from + i) % SHARDS;
            for (name, lane) in lock(&self.shards[shard]).iter().take(left) {
                left -= 1;
                let quiet = lane.quiet_for();
                if quietest.as_ref().is_none_or(|(q, ..)| quiet > *q) && evictable(lane) {
                    quietest = Some((quiet, shard, name.clone()));
                }
            }
            if left == 0 {
                break;
            }
        }
        quietest.map(|(_, shard, name)| (shard, name))
    }

    fn dropped(&self, n: usize) {
        self.live.fetch_sub(n, Ordering::AcqRel);
        self.count.closed(n);
    }

    /// Start the sweeper if none runs (on this runtime or at all).
    fn sweep_later(self: &Arc<Self>) {
        let mut sweeper = lock(&self.sweeper);
        if sweeper.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        *sweeper = Some(tokio::spawn(sweep(Arc::downgrade(self), self.idle)));
    }

    /// Drop every lane quiet for `idle` that is idle and held by nobody;
    /// how long until the next may be due (`None`: none until a busy lane
    /// retires its dispatcher, which nudges the sweeper).
    fn sweep(&self) -> Option<Duration> {
        let mut next: Option<Duration> = None;
        let mut due = |after: Duration| next = Some(next.map_or(after, |n| n.min(after)));
        for shard in self.shards.iter() {
            let mut lanes = lock(shard);
            let before = lanes.len();
            lanes.retain(|_, lane| {
                let quiet = lane.quiet_for();
                if quiet < self.idle {
                    due(self.idle - quiet);
                    return true;
                }
                if lane.is_busy() {
                    // Its release, then its dispatcher's retirement, come
                    // first: the nudge says when.
                    return true;
                }
                let keep = !evictable(lane);
                if keep {
                    // Held, paused or its meters still charged: look again
                    // an `idle` later, as its dispatcher once did.
                    due(self.idle);
                }
                keep
            });
            let gone = before - lanes.len();
            if gone > 0 {
                shrink(&mut lanes);
                drop(lanes);
                self.dropped(gone);
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
        if self.live.load(Ordering::Acquire) > 0 {
            return false;
        }
        *sweeper = None;
        true
    }

    /// How many lanes are live.
    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|shard| lock(shard).len()).sum()
    }

    /// What the lane `name` is doing, if it is live.
    pub(super) fn snapshot(&self, name: &str) -> Option<LaneSnapshot> {
        self.find(name).map(|lane| lane.snapshot())
    }

    /// Every live lane, shard by shard (each lock held only while its
    /// lanes are copied out).
    pub(super) fn all(&self) -> Vec<Lane> {
        self.shards
            .iter()
            .flat_map(|shard| lock(shard).values().cloned().collect::<Vec<_>>())
            .collect()
    }

    /// Make no lane any more, and close the live ones.
    pub(super) fn shut_down(&self) {
        self.shut.store(true, Ordering::Release);
        for shard in self.shards.iter() {
            let closing: Vec<Lane> = lock(shard).drain().map(|(_, lane)| lane).collect();
            self.dropped(closing.len());
            for lane in closing {
                lane.close();
            }
        }
        if let Some(sweeper) = lock(&self.sweeper).take() {
            sweeper.abort();
        }
    }
}

/// Sweep `lanes` when their quietest could next be due (first, `idle`
/// after the first lane), or soon after a busy lane's dispatcher retired,
/// while they exist and hold any. A lane is dropped once it has been
/// quiet for `idle` and is idle; one held back by a pause or its meters is
/// looked at again `idle` later; one with a dispatcher is left to it. No
/// two sweeps are closer than a millisecond, nor, for retirements, than a
/// quarter of `idle`: a sweep reads every lane.
async fn sweep(lanes: Weak<Lanes>, idle: Duration) {
    let least = Duration::from_millis(1);
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
