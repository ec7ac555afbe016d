//! A gate: quotas and a pause that a release must pass.
//!
//! A lane holds a gate of its own (the quotas of a standalone `Lane`,
//! its own pause) and, in a shaper, one shared gate per level: the route's
//! or tenant's quotas for its key, and the vendor's, which every lane under
//! that vendor holds at once. A lane releases its head only when every gate
//! it holds allows it, at the same instant, and charges them all together.
//! That is what keeps every level's quota exact
//! at the moment a request leaves, whatever the queueing: a request never
//! waits in one level after another (which would bunch up the pace the
//! first level set), it waits once, in its own lane, for all of them.
//!
//! A pause, the learned quota and adaptive pacing belong to a gate too: a
//! 429 seen by one tenant's request pauses the vendor's gate, and so every
//! lane that shares it.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;
use tokio::time::Instant;

use crate::adaptive::{Adaptive, Aimd};
use crate::drain::Drain;
use crate::meters::{Meters, Quota, Rate, Unit};
use crate::retry::{Backoff, Ledger, RetryBudget};
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
    level: String,
    /// The largest request cost every meter can ever allow (an atomic, so
    /// admission needs no lock to check it).
    capacity: AtomicU64,
    headroom: Duration,
    max_pause: Duration,
    meters: Mutex<Meters>,
    paused_until: Mutex<Option<(Instant, PauseCause)>>,
    pace: Mutex<Pace>,
    ledger: Mutex<Ledger>,
    throttle_streak: AtomicU32,
    fallback: Backoff,
    /// Lanes whose head only this gate holds back, by how long they have
    /// waited: the gate's next slot goes to the first.
    queue: Mutex<BTreeSet<Waiter>>,
    /// Woken when the gate's first waiter changes.
    turn: Arc<Notify>,
    /// Where a shared gate is registered, to leave the map when dropped.
    registry: Option<(Weak<GateMap>, String)>,
    /// The vendor said no pause helps (out of credit): until then, every
    /// request ends at once. The flag spares the hot path a lock.
    stopped: Mutex<Option<(Instant, Arc<Stop>)>>,
    is_stopped: AtomicBool,
    /// The level of a vendor bucket that does not say its rate.
    drain: Mutex<Drain>,
    /// The vendor has answered (the meters know it too): every later
    /// answer skips their lock.
    heard: AtomicBool,
    /// A quota learned from a refusal is being probed back up: successes
    /// look at the pace (else they skip its lock).
    probing: AtomicBool,
}

/// Why a lane is paused, as [`LaneSnapshot`](crate::LaneSnapshot), the
/// `tracing` events and the logs say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum PauseCause {
    /// A final answer said the quota is used up until a reset, and the
    /// lane's own releases did not explain it.
    Spent,
    /// A throttle said when to come back (`Retry-After` or a reset).
    Hinted,
    /// A throttle said nothing usable: the growing fallback pause.
    Unhinted,
    /// Another instance of the fleet paused the vendor's quota.
    Fleet,
    /// The application called [`Lane::pause_for`](crate::Lane::pause_for).
    Requested,
}

impl PauseCause {
    /// The cause's name, as metrics label it.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Spent => "spent",
            Self::Hinted => "hinted",
            Self::Unhinted => "unhinted",
            Self::Fleet => "fleet",
            Self::Requested => "requested",
        }
    }
}

/// Why a gate refuses everything for a while, as the vendor said it.
#[derive(Debug)]
pub(crate) struct Stop {
    pub(crate) status: u16,
    pub(crate) body: String,
}

/// A gate's request window, as a vendor's signal is read against it.
struct Window {
    since: Instant,
    length: Duration,
    declared: Rate,
    /// The pace kept now: a learned quota, else the declared one.
    kept: Rate,
}

impl Window {
    /// The vendor's `limit` (a count in the declared window) allows at
    /// least what the gate keeps to.
    fn allows(&self, limit: u64) -> bool {
        self.declared_rate(limit)
            .is_none_or(|rate| slower_first(rate, self.kept).is_ge())
    }

    /// `count` in the declared window, as a rate (`None`: more than any
    /// rate holds).
    fn declared_rate(&self, count: u64) -> Option<Rate> {
        u32::try_from(count)
            .ok()
            .map(|count| Rate::new(count, self.declared.per))
    }
}

/// A lane waiting at a gate: since when, and which lane.
pub(crate) type Waiter = (Instant, u64);

/// What slows a gate below its quotas.
struct Pace {
    /// The slowest of the gate's quotas that count requests: the ceiling a
    /// learned quota or adaptive pacing is measured against.
    declared: Option<Rate>,
    /// A lower quota the vendor announced.
    learned: Option<Rate>,
    /// Adaptive pacing's share of the request rate.
    aimd: Option<Aimd>,
    /// When the last refused request had been released: releases before
    /// it were not all accepted.
    refused_at: Option<Instant>,
    /// How a quota learned from a refusal is probed back up.
    probe: Option<Probe>,
}

/// Probing a quota learned from a refusal back up towards the declared
/// one, slowly: a refusal may have come from a consumer since gone, or an
/// outage, and a lane must not keep a low pace for ever.
///
/// After `quiet` without a refusal ([`PROBE_QUIET`] declared windows at
/// first), the pace rises by a twentieth (at least one request) per
/// declared window, up to the declared quota, where probing ends. A
/// refusal while raised puts the pace back where it was and doubles
/// `quiet`: against a vendor that really allows the learned quota, probing
/// costs one refusal after 30 windows, then after 60, 120, ... (at most 2
/// in the first 60 windows, 7 in 3,600).
#[derive(Debug, Clone, Copy)]
struct Probe {
    /// When the pace next rises.
    at: Instant,
    quiet: Duration,
    /// The quota the refusal taught, which a refused probe returns to.
    base: Rate,
    /// True once the pace rose above `base`.
    raised: bool,
}

/// Declared windows without a refusal before a learned quota is probed.
const PROBE_QUIET: u32 = 30;

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
                learned: None,
                aimd,
                refused_at: None,
                probe: None,
            }),
            ledger: Mutex::new(Ledger::new(settings.budget)),
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
    pub(crate) fn enlist(&self, waiter: Waiter) {
        lock(&self.queue).insert(waiter);
    }

    /// Leave the gate's queue; wakes the others if the first changed.
    pub(crate) fn delist(&self, waiter: Waiter) {
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
    pub(crate) fn is_first(&self, waiter: Waiter) -> bool {
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
        self.pause(now).map(|(until, _)| until)
    }

    /// The pause in force at `now` and why, if any.
    pub(crate) fn pause(&self, now: Instant) -> Option<(Instant, PauseCause)> {
        let pause = (*lock(&self.paused_until))?;
        (pause.0 > now).then_some(pause)
    }

    /// Pause for `pause` from now, clamped to `max_pause`, because of
    /// `cause`; never backward (a shorter pause keeps the longer one and
    /// its cause).
    pub(crate) fn pause_for(&self, pause: Duration, cause: PauseCause) -> Instant {
        let until = later(Instant::now(), pause.min(self.max_pause));
        let mut paused = lock(&self.paused_until);
        let pause = match *paused {
            Some(current) if current.0 >= until => current,
            _ => (until, cause),
        };
        *paused = Some(pause);
        pause.0
    }

    /// A throttle: the vendor's hint, else the fallback backoff, which grows
    /// with each consecutive throttle (and adaptive pacing cuts the rate:
    /// the vendor said nothing, so the rate itself must be what is wrong).
    pub(crate) fn throttled(&self, hint: Option<Duration>) -> Duration {
        let streak = self.throttle_streak.fetch_add(1, Ordering::Relaxed);
        match hint {
            Some(hint) => hint,
            None => {
                self.adapt(Aimd::throttled);
                self.fallback.equal_jitter(streak)
            }
        }
    }

    /// A success: the fallback starts over, adaptive pacing grows back.
    pub(crate) fn succeeded(&self) {
        self.throttle_streak.store(0, Ordering::Relaxed);
        self.adapt(Aimd::succeeded);
        if self.probing.load(Ordering::Relaxed) {
            self.probe(Instant::now());
        }
    }

    /// Raise a learned quota a step, once its probe is due (see [`Probe`]).
    fn probe(&self, now: Instant) {
        let mut pace = lock(&self.pace);
        let (Some(probe), Some(learned), Some(declared)) =
            (pace.probe, pace.learned, pace.declared)
        else {
            self.probing.store(false, Ordering::Relaxed);
            return;
        };
        if now < probe.at {
            return;
        }
        let step = (learned.count / 20).max(1);
        let raised = Rate::new(learned.count.saturating_add(step), learned.per);
        if slower_first(raised, declared).is_ge() {
            pace.learned = None;
            pace.probe = None;
            self.probing.store(false, Ordering::Relaxed);
        } else {
            pace.learned = Some(raised);
            pace.probe = Some(Probe {
                at: later(now, declared.per),
                raised: true,
                ..probe
            });
        }
        self.repace(&pace);
    }

    fn adapt(&self, step: fn(&mut Aimd)) {
        let mut pace = lock(&self.pace);
        if let Some(aimd) = pace.aimd.as_mut() {
            step(aimd);
            self.repace(&pace);
        }
    }

    /// The vendor announced its quota: a lower one than this gate's
    /// request rate becomes its pace (never a higher one: the user's
    /// declaration is the ceiling). True when this changed the pace.
    pub(crate) fn learn(&self, announced: Rate) -> bool {
        // Announced or read, a quota is the vendor's word: not probed.
        self.keep_to(announced, None)
    }

    /// Keep to `rate` from now on, probed back up as `probe` says (see
    /// [`Gate::learn`]). True when this changed the pace.
    fn keep_to(&self, rate: Rate, probe: Option<Probe>) -> bool {
        let mut pace = lock(&self.pace);
        let Some(declared) = pace.declared else {
            return false;
        };
        if slower_first(rate, declared).is_ge() || pace.learned == Some(rate) {
            return false;
        }
        pace.learned = Some(rate);
        pace.probe = probe;
        self.probing.store(probe.is_some(), Ordering::Relaxed);
        self.repace(&pace);
        true
    }

    /// The vendor refused a request this gate released at `released` (a
    /// 429, or "nothing left" its releases don't explain), saying its
    /// limit is `limit` and its reset `reset` if it did. Learn the quota the vendor really
    /// allows: its limit, else the releases it accepted in the window
    /// before the refusal (those since the previous refusal, if one was in
    /// the window), over the declared window; never faster than the pace
    /// already kept. Only a vendor whose window looks like the declared one
    /// teaches: its reset between a quarter of the window and the window
    /// (give or take a rounded-up second), or without a reset, a refusal at
    /// least a quarter into the lane's window. A lane declared 1,000 a
    /// minute against a vendor counting 10 a second hears a reset of a
    /// second, and one declared 10 a second against 3 per 2 s hears two:
    /// the vendor's window is not the declared one, and the pause until
    /// its reset is the answer. The quota learned, if the pace changed.
    pub(crate) fn refused(
        &self,
        limit: Option<u64>,
        reset: Option<Duration>,
        released: Instant,
    ) -> Option<Rate> {
        let window = self.window(released)?;
        let mut since = window.since;
        let previous = {
            let mut pace = lock(&self.pace);
            let previous = pace.refused_at;
            pace.refused_at = Some(previous.map_or(released, |p| p.max(released)));
            if let Some(probe) = pace.probe.filter(|p| p.raised) {
                // The probe went past what the vendor allows: back to what
                // the refusal taught, and wait twice as long to try again.
                let quiet = probe.quiet.saturating_mul(2);
                pace.learned = Some(probe.base);
                pace.probe = Some(Probe {
                    at: later(Instant::now(), quiet),
                    quiet,
                    raised: false,
                    ..probe
                });
                self.repace(&pace);
                return None;
            }
            previous
        };
        if let Some(previous) = previous {
            // Releases before the previous refusal were not all accepted.
            since = since.max(later(previous, Duration::from_nanos(1)));
        }
        let (accepted, first, gap) = {
            let meters = lock(&self.meters);
            let releases = meters.releases()?;
            let (accepted, first) = releases.between(since, released);
            (accepted, first, releases.longest_gap(since, released))
        };
        // Without a stated limit, what the vendor accepted says what it
        // allows only if the lane was pushing at its pace all along: a
        // vendor that throttles everything after a quiet spell (an outage,
        // a forced 429) has not shown its quota.
        let kept = window.kept;
        let busy = gap <= kept.interval(self.headroom).saturating_mul(2);
        if limit.is_none() && !busy {
            return None;
        }
        let count = limit.unwrap_or(accepted);
        if count == 0 || window.allows(count) {
            return None;
        }
        let length = window.length;
        let looks_declared = match reset {
            Some(reset) => {
                let rounding = (length / 10).min(Duration::from_secs(1));
                reset >= length / 4 && reset <= length.saturating_add(rounding)
            }
            None => released.saturating_duration_since(first?) >= length / 4,
        };
        if !looks_declared {
            return None;
        }
        let rate = window.declared_rate(count)?;
        let quiet = window.declared.per.saturating_mul(PROBE_QUIET);
        let probe = Probe {
            at: later(Instant::now(), quiet),
            quiet,
            base: rate,
            raised: false,
        };
        self.keep_to(rate, Some(probe)).then_some(rate)
    }

    /// The vendor answered: true when this was its first word, which a
    /// burst may be waiting for (see `Meters::heard`); lanes waiting for it are woken.
    pub(crate) fn heard(&self) -> bool {
        if self.heard.load(Ordering::Acquire) {
            return false;
        }
        let first = lock(&self.meters).heard();
        self.heard.store(true, Ordering::Release);
        if first {
            self.turn.notify_waiters();
        }
        first
    }

    /// A vendor's bucket had `remaining` requests left as it counted the
    /// request released at `released` (`refused`: it refused it). The
    /// meters allow no more than that (`Meters::hold_to`). For a bucket of
    /// `capacity` that does not say its rate (`leaks`: Shopify), the rate
    /// it leaks at is read off its levels ([`Drain`]), and once it has
    /// refused the lane, kept to: the first estimate, then each closer one.
    /// The quota learned, if the pace changed.
    pub(crate) fn bucket(
        &self,
        remaining: u64,
        leaks: Option<u64>,
        released: Instant,
        refused: bool,
    ) -> Option<Rate> {
        let around = {
            let mut meters = lock(&self.meters);
            meters.hold_to(remaining, released, Instant::now());
            meters.releases().map(|releases| releases.around(released))
        };
        let (capacity, around) = (leaks?, around?);
        let window = self.window(released)?;
        let used = capacity.saturating_sub(remaining);
        // Two declared windows: a level is whole units, so a short span
        // reads a coarse rate.
        let span = window.declared.per.saturating_mul(2);
        let leak = lock(&self.drain).observe(used, around, released, refused, span)?;
        // Never refused: the declared quota is not shown too fast.
        lock(&self.pace).refused_at?;
        // In hundredths of the declared window's count, rounded down.
        let per = window.declared.per.saturating_mul(100);
        let count = (leak * per.as_secs_f64()).floor();
        if !(1.0..f64::from(u32::MAX)).contains(&count) {
            return None;
        }
        let rate = Rate::new(count as u32, per);
        // A reading within 1 % of the pace kept is no news.
        let close = |a: Rate, b: Rate| (a.per_second() / b.per_second() - 1.0).abs() < 0.01;
        if self.learned().is_some_and(|learned| close(learned, rate)) {
            return None;
        }
        self.learn(rate).then_some(rate)
    }

    /// When the vendor frees a unit by this gate's releases alone: its
    /// oldest release in the window that ends with the request released at
    /// `released`, one window on. Only for a vendor allowing at least what
    /// the gate keeps to, whose window is then taken as the declared one:
    /// a vendor sending whole-second resets ("1") would otherwise hold the
    /// lane a second each time another consumer fills the window, when
    /// the lane's own oldest request leaves it a few milliseconds later.
    pub(crate) fn frees_at(&self, limit: u64, released: Instant) -> Option<Instant> {
        let window = self.window(released).filter(|w| w.allows(limit))?;
        let oldest = lock(&self.meters).releases()?.first_since(window.since)?;
        let interval = window.kept.interval(self.headroom);
        Some(later(oldest, window.length.saturating_add(interval)))
    }

    /// Whether this gate's own releases explain a vendor saying `used` of
    /// its `limit` are spent, for a request released at `released`: the
    /// vendor allows at least what the gate keeps to (so the meters keep
    /// the lane within it), and the gate released at least `used` in the
    /// window that ends with that request. Then "nothing left" is the lane
    /// at full quota, which its meters already pace; otherwise somebody
    /// else spends the quota, or the vendor counts less than declared.
    ///
    /// With `ledger` false (a fleet on a shared store, whose releases this
    /// process does not see), the first condition alone decides: the
    /// store's meters keep the fleet within the quota.
    pub(crate) fn explains(&self, limit: u64, used: u64, released: Instant, ledger: bool) -> bool {
        let Some(window) = self.window(released).filter(|w| w.allows(limit)) else {
            return false;
        };
        !ledger
            || lock(&self.meters)
                .releases()
                .is_some_and(|releases| releases.since(window.since) >= used)
    }

    /// The declared request window (stretched by headroom) that ends with a
    /// request released at `released`, which a vendor's signal about it is
    /// read against; `None` when no quota counts requests.
    fn window(&self, released: Instant) -> Option<Window> {
        let pace = lock(&self.pace);
        let declared = pace.declared?;
        let length = declared.per.saturating_add(self.headroom);
        Some(Window {
            since: released.checked_sub(length).unwrap_or(released),
            length,
            declared,
            // A quota the vendor announced and the lane now keeps to counts
            // as declared.
            kept: pace.learned.unwrap_or(declared),
        })
    }

    /// The spacing of the declared request rate, if any.
    pub(crate) fn request_interval(&self) -> Option<Duration> {
        self.declared().map(|rate| rate.interval(self.headroom))
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

    pub(crate) fn learned(&self) -> Option<Rate> {
        lock(&self.pace).learned
    }

    /// Keep requests apart by the slowest of the learned quota and adaptive
    /// pacing's share of the request rate; neither: as declared. Never
    /// further apart than `max_pause`: a vendor announcing one request a
    /// day must not hold every request for a day.
    fn repace(&self, pace: &Pace) {
        let learned = pace.learned.map(|rate| rate.interval(self.headroom));
        let adaptive = pace.aimd.as_ref().and_then(|aimd| {
            let nominal = pace.declared?.interval(self.headroom);
            let stretched = nominal.as_secs_f64() / aimd.share();
            (aimd.share() < 1.0)
                .then(|| Duration::try_from_secs_f64(stretched).unwrap_or(self.max_pause))
        });
        let interval = learned.max(adaptive).map(|i| i.min(self.max_pause));
        let mut meters = lock(&self.meters);
        if meters.pace() != interval {
            meters.set_pace(interval);
        }
    }

    pub(crate) fn deposit(&self) {
        lock(&self.ledger).deposit(Instant::now());
    }

    pub(crate) fn withdraw_retry(&self) -> bool {
        lock(&self.ledger).withdraw(Instant::now())
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
        .filter(|q| q.unit == Unit::Requests)
        .map(Quota::rate)
        .min_by(|a, b| slower_first(*a, *b))
}

/// Orders rates slowest first, comparing `count / per` without division.
fn slower_first(a: Rate, b: Rate) -> std::cmp::Ordering {
    let a_speed = u128::from(a.count) * b.per.as_nanos();
    let b_speed = u128::from(b.count) * a.per.as_nanos();
    a_speed.cmp(&b_speed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meters::Quota;

    #[tokio::test(start_paused = true)]
    async fn the_lane_that_waited_longest_is_first_and_its_going_wakes_the_rest() {
        let quotas = [Quota::leaky_bucket(10, Duration::from_secs(1))];
        let settings = GateSettings {
            headroom: Duration::from_millis(5),
            max_pause: Duration::from_secs(120),
            fallback: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
            adaptive: None,
            budget: RetryBudget::default(),
        };
        let gate = Gate::new("", &quotas, settings, None, 1);
        let t0 = Instant::now();
        let (older, newer) = ((t0, 7), (t0 + Duration::from_millis(5), 3));
        assert!(!gate.has_queue());
        gate.enlist(newer);
        gate.enlist(older);
        gate.enlist(older);
        assert!(gate.is_first(older) && !gate.is_first(newer));
        let woken = gate.next_turn();
        gate.delist(older);
        assert!(gate.is_first(newer));
        tokio::time::timeout(Duration::from_millis(1), woken)
            .await
            .expect("the next lane is woken");
        gate.delist(newer);
        assert!(!gate.has_queue());
    }
}
