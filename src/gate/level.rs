//! A level's gate: its meters, pause, stop and the queue of lanes waiting
//! at it, and the gates of a shaper by name.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;
use tokio::time::Instant;

use super::cause::{PauseCause, Paused, Stop};
use super::pace::Pace;
use super::window::WindowEnds;
use crate::adaptive::{Adaptive, Aimd};
use crate::drain::Drain;
use crate::meters::{Meters, Quota, Rate};
use crate::retry::{Allowance, Backoff, RetryBudget};
use crate::spacing::{Departures, Learned};
use crate::sync::{lock, shrink};
use crate::time::later;

/// The shared gates of a shaper, by name. Weak: a gate lives as long as a
/// lane holds it, and removes itself when the last one lets go.
pub(crate) type GateMap = Mutex<HashMap<String, Weak<Gate>>>;

/// How a gate behaves besides its quotas: what it needs of the lane policy
/// and retry policy, and nothing else (so a gate knows nothing of lanes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct GateSettings {
    pub(crate) headroom: Duration,
    pub(crate) max_pause: Duration,
    pub(crate) fallback: Backoff,
    pub(crate) adaptive: Option<Adaptive>,
    pub(crate) budget: RetryBudget,
}

pub(crate) struct Gate {
    /// The level whose quotas it holds, by name: a live change of them
    /// finds its gates by it.
    pub(super) level: String,
    /// The largest request cost every meter can ever allow (an atomic, so
    /// admission needs no lock to check it).
    pub(super) capacity: AtomicU64,
    pub(super) headroom: Duration,
    pub(super) max_pause: Duration,
    pub(super) meters: Mutex<Meters>,
    pub(super) paused_until: Mutex<Option<Paused>>,
    pub(super) pace: Mutex<Pace>,
    pub(super) allowance: Mutex<Allowance>,
    pub(super) throttle_streak: AtomicU32,
    pub(super) fallback: Backoff,
    /// Lanes whose head only this gate holds back, by how long they have
    /// waited: the gate's next slot goes to the first.
    pub(super) queue: Mutex<BTreeSet<Contender>>,
    /// Woken when the gate's first waiter changes.
    pub(super) turn: Arc<Notify>,
    /// Where a shared gate is registered, to leave the map when dropped.
    pub(super) registry: Option<(Weak<GateMap>, String)>,
    /// The vendor said no pause helps (out of credit): until then, every
    /// request ends at once. The flag spares the hot path a lock.
    pub(super) stopped: Mutex<Option<(Instant, Arc<Stop>)>>,
    pub(super) is_stopped: AtomicBool,
    /// The level of a vendor bucket that does not say its rate.
    pub(super) drain: Mutex<Drain>,
    /// The vendor has answered (the meters know it too): every later
    /// answer skips their lock.
    pub(super) heard: AtomicBool,
    /// A quota learned from a refusal is being probed back up: successes
    /// look at the pace (else they skip its lock).
    pub(super) probing: AtomicBool,
    /// When the last request really went, for strict spacing.
    pub(super) departures: Departures,
    /// The spacing the vendor's refusals taught.
    pub(super) spacing: Mutex<Learned>,
    /// A learned spacing waits to step down: successes look at it (else
    /// they skip its lock).
    pub(super) decaying: AtomicBool,
}

/// A lane waiting at a gate: since when, and which lane.
pub(crate) type Contender = (Instant, u64);

impl Gate {
    /// A gate for `quotas`, with `settings` (headroom, pause limits,
    /// adaptive pacing, retry budget). With a shared store the quotas live
    /// there, and the local meters are the fallback: one `share` of each
    /// quota.
    pub(crate) fn new(
        level: &str,
        quotas: &[Quota],
        settings: GateSettings,
        registry: Option<(Weak<GateMap>, String)>,
        share: u32,
    ) -> Self {
        let now = Instant::now();
        let request_rate = request_rate(quotas);
        let aimd = match (settings.adaptive, request_rate) {
            (Some(knobs), Some(ceiling)) => Some(Aimd::new(knobs, ceiling)),
            _ => None,
        };
        let mut meters = Meters::new(quotas, settings.headroom, now);
        let capacity = meters.capacity();
        if share > 1 {
            let local: Vec<Quota> = quotas.iter().map(|q| q.share(share)).collect();
            meters = Meters::new(&local, settings.headroom, now);
        }
        Self {
            level: level.to_owned(),
            capacity: AtomicU64::new(capacity),
            meters: Mutex::new(meters),
            headroom: settings.headroom,
            max_pause: settings.max_pause,
            paused_until: Mutex::new(None),
            pace: Mutex::new(Pace {
                declared: request_rate,
                bucket: request_bucket(quotas),
                learned: None,
                aimd,
                refused_at: None,
                probe: None,
                leak: None,
                unread: false,
                ends: WindowEnds::default(),
                left: None,
                burst_room: false,
            }),
            allowance: Mutex::new(Allowance::new(settings.budget)),
            throttle_streak: AtomicU32::new(0),
            fallback: settings.fallback,
            queue: Mutex::new(BTreeSet::new()),
            turn: Arc::new(Notify::new()),
            registry,
            stopped: Mutex::new(None),
            is_stopped: AtomicBool::new(false),
            drain: Mutex::new(Drain::default()),
            heard: AtomicBool::new(false),
            probing: AtomicBool::new(false),
            departures: Departures::new(now),
            spacing: Mutex::new(Learned::default()),
            decaying: AtomicBool::new(false),
        }
    }

    /// Refuse every request for `period` from now: the vendor said no pause
    /// helps.
    pub(crate) fn stop_for(&self, period: Duration, stop: Stop) {
        *lock(&self.stopped) = Some((later(Instant::now(), period), Arc::new(stop)));
        self.is_stopped.store(true, Ordering::Release);
    }

    /// Why the gate refuses everything now, if it does.
    pub(crate) fn stopped(&self) -> Option<Arc<Stop>> {
        if !self.is_stopped.load(Ordering::Acquire) {
            return None;
        }
        let mut stopped = lock(&self.stopped);
        match &*stopped {
            Some((until, stop)) if *until > Instant::now() => Some(stop.clone()),
            _ => {
                *stopped = None;
                self.is_stopped.store(false, Ordering::Release);
                None
            }
        }
    }

    /// The gate's meters, locked. Lanes holding several gates lock them in
    /// level order (the same in every lane), so none can deadlock.
    pub(crate) fn meters(&self) -> MutexGuard<'_, Meters> {
        lock(&self.meters)
    }

    /// A wake-up for when the first waiter in the gate's queue changes,
    /// enabled now so no change after this call is missed.
    pub(crate) fn next_turn(&self) -> std::pin::Pin<Box<OwnedNotified>> {
        let mut turn = Box::pin(self.turn.clone().notified_owned());
        turn.as_mut().enable();
        turn
    }

    /// Join the gate's queue of waiting lanes (again: no change).
    pub(crate) fn enlist(&self, waiter: Contender) {
        lock(&self.queue).insert(waiter);
    }

    /// Leave the gate's queue; wakes the others if the first changed.
    pub(crate) fn delist(&self, waiter: Contender) {
        let mut queue = lock(&self.queue);
        let was_first = queue.first() == Some(&waiter);
        if queue.remove(&waiter) && was_first {
            self.turn.notify_waiters();
        }
    }

    /// True when some lane waits for this gate: newcomers queue behind it.
    pub(crate) fn has_queue(&self) -> bool {
        !lock(&self.queue).is_empty()
    }

    /// True when no other lane waits ahead of `waiter`.
    pub(crate) fn is_first(&self, waiter: Contender) -> bool {
        lock(&self.queue)
            .first()
            .is_none_or(|first| *first == waiter)
    }

    /// The smallest capacity a request of `cost` exceeds, if any.
    pub(crate) fn too_costly(&self, cost: u64) -> Option<u64> {
        let capacity = self.capacity.load(Ordering::Relaxed);
        (cost > capacity).then_some(capacity)
    }

    /// The pause in force at `now`, if any.
    pub(crate) fn paused_until(&self, now: Instant) -> Option<Instant> {
        lock(&self.paused_until)
            .as_ref()
            .map(|pause| pause.until)
            .filter(|until| *until > now)
    }

    /// The pause in force at `now` and why, if any.
    pub(crate) fn pause(&self, now: Instant) -> Option<Paused> {
        lock(&self.paused_until)
            .as_ref()
            .filter(|pause| pause.until > now)
            .cloned()
    }

    /// Pause for `pause` from now, clamped to `max_pause`, because of
    /// `cause` and what the vendor `said`; never backward (a shorter pause
    /// keeps the longer one and its cause).
    pub(crate) fn pause_for(
        &self,
        pause: Duration,
        cause: PauseCause,
        said: Option<&Arc<str>>,
    ) -> Instant {
        let until = later(Instant::now(), pause.min(self.max_pause));
        let mut paused = lock(&self.paused_until);
        match paused.as_ref() {
            Some(current) if current.until >= until => current.until,
            _ => {
                *paused = Some(Paused {
                    until,
                    cause,
                    said: said.cloned(),
                });
                until
            }
        }
    }

    /// When the last request through this gate really went, and whether a
    /// turn is still on its way to the wire (see `spacing.rs`).
    pub(crate) fn departures(&self) -> &Departures {
        &self.departures
    }

    /// A strict turn through this gate went on the wire at `at` (`None`:
    /// it never went); a lane waiting for that word looks again.
    pub(crate) fn went(&self, at: Option<Instant>) {
        self.departures.went(at);
        self.turn.notify_waiters();
    }

    /// The strict spacing in force, if any.
    pub(crate) fn spacing(&self) -> Option<Duration> {
        lock(&self.meters).spacing()
    }

    /// True once the vendor answered a request of this gate's.
    pub(crate) fn has_heard(&self) -> bool {
        self.heard.load(Ordering::Acquire)
    }

    /// The tightest request quota declared for the gate, if it has one.
    pub(crate) fn declared(&self) -> Option<Rate> {
        lock(&self.pace).declared
    }

    /// The name of the level whose quotas the gate holds.
    pub(crate) fn level(&self) -> &str {
        &self.level
    }

    /// Hold `quotas` from now on (a live change of the level's quotas):
    /// the meters change as `Meters::requote` says, the pause, the learned
    /// quota, adaptive pacing and the retry budget stay, and lanes waiting
    /// at the gate look again.
    pub(crate) fn requote(&self, quotas: &[Quota]) {
        let mut pace = lock(&self.pace);
        let declared = request_rate(quotas);
        pace.declared = declared;
        pace.bucket = request_bucket(quotas);
        if let (Some(aimd), Some(ceiling)) = (pace.aimd.as_mut(), declared) {
            aimd.set_ceiling(ceiling);
        }
        {
            let mut meters = lock(&self.meters);
            meters.requote(quotas, self.headroom, Instant::now());
            self.capacity.store(meters.capacity(), Ordering::Relaxed);
        }
        self.repace(&pace);
        drop(pace);
        self.turn.notify_waiters();
    }

    pub(crate) fn deposit(&self) {
        lock(&self.allowance).deposit(Instant::now());
    }

    pub(crate) fn withdraw_retry(&self) -> bool {
        lock(&self.allowance).withdraw(Instant::now())
    }

    pub(crate) fn is_idle(&self, now: Instant) -> bool {
        self.paused_until(now).is_none() && lock(&self.meters).is_idle(now)
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        let Some((registry, key)) = &self.registry else {
            return;
        };
        let Some(registry) = registry.upgrade() else {
            return;
        };
        let mut gates = lock(&registry);
        if gates.get(key).is_some_and(|gate| gate.strong_count() == 0) {
            gates.remove(key);
            shrink(&mut gates);
        }
    }
}

/// The slowest quota counting requests.
pub(crate) fn request_rate(quotas: &[Quota]) -> Option<Rate> {
    quotas
        .iter()
        .filter(|q| q.counts_requests())
        .map(Quota::rate)
        .min_by(|a, b| a.cmp_speed(b))
}

/// The smallest capacity among `quotas`' token buckets that count
/// requests.
pub(super) fn request_bucket(quotas: &[Quota]) -> Option<u64> {
    quotas
        .iter()
        .filter(|q| q.counts_requests())
        .filter_map(Quota::bucket_capacity)
        .min()
}
