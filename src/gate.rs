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
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;
use tokio::time::Instant;

use crate::adaptive::{Adaptive, Aimd};
use crate::drain::Drain;
use crate::meters::{Meters, Quota, Rate, Releases, Unit};
use crate::retry::{Backoff, Ledger, RetryBudget};
use crate::spacing::{Declared, Departures, Learned, Reading};
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
    paused_until: Mutex<Option<Paused>>,
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
    /// When the last request really went, for strict spacing.
    departures: Departures,
    /// The spacing the vendor's refusals taught.
    spacing: Mutex<Learned>,
    /// A learned spacing waits to step down: successes look at it (else
    /// they skip its lock).
    decaying: AtomicBool,
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
    /// A final answer said one unit is left, and the lane's own releases
    /// did not explain the rest spent: another consumer spends the same
    /// quota and is as likely to take that unit as the lane's next
    /// request. The lane leaves it and waits until its own oldest release
    /// frees one.
    Contested,
    /// A vendor that measures the spacing of requests (nginx's
    /// `limit_req`) refused one for coming too soon after the last: the
    /// lane keeps its sends further apart, strictly, from then on (see
    /// [`LaneSnapshot::spacing`](crate::LaneSnapshot::spacing)), and
    /// waits until that gap after the refused one.
    Spacing,
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
            Self::Contested => "contested",
            Self::Spacing => "spacing",
            Self::Hinted => "hinted",
            Self::Unhinted => "unhinted",
            Self::Fleet => "fleet",
            Self::Requested => "requested",
        }
    }
}

/// A pause in force: until when, why, and what the vendor said that asked
/// for it, as it said it (`retry-after: 2`), if it did.
#[derive(Debug, Clone)]
pub(crate) struct Paused {
    pub(crate) until: Instant,
    pub(crate) cause: PauseCause,
    pub(crate) said: Option<Arc<str>>,
}

/// Why a gate refuses everything for a while, as the vendor said it.
#[derive(Debug)]
pub(crate) struct Stop {
    pub(crate) status: u16,
    pub(crate) body: String,
}

/// Whose releases a vendor's signal is read against.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Spending {
    /// This process's own: the lane is the quota's only user here.
    Own,
    /// A fleet's, as the shared store's ledger counted them.
    Fleet(Booked),
    /// A fleet's, which the store did not say.
    Unknown,
}

/// What a fleet booked in a gate's request window ending at a release, as
/// its shared store counted it: at least `count` slots (the count errs
/// high), the oldest of which leaves the window at `leaves`, if known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Booked {
    pub(crate) count: u64,
    pub(crate) leaves: Option<Instant>,
}

/// A gate's request window, as a vendor's signal is read against it.
struct Window {
    since: Instant,
    length: Duration,
    declared: Rate,
    /// The pace kept now: a learned quota, else the declared one.
    kept: Rate,
    /// The declared bucket's capacity, if a token bucket counts requests.
    bucket: Option<u64>,
}

impl Window {
    /// The vendor's `limit` allows at least what the gate keeps to: as a
    /// count in the declared window, or, where the lane declared a token
    /// bucket, as the bucket's capacity. A vendor running a bucket says
    /// its capacity as its limit, whatever its refill (5 for a burst of 5
    /// at 10/s), and a declared bucket of that size already holds the lane
    /// to it; read as 5 a second, it would pause the lane after every
    /// burst and keep it to half the quota.
    fn allows(&self, limit: u64) -> bool {
        self.bucket.is_some_and(|capacity| limit >= capacity)
            || self
                .declared_rate(limit)
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
    /// The smallest token bucket among them, if one is (see
    /// `Window::allows`).
    bucket: Option<u64>,
    /// A lower quota the vendor announced.
    learned: Option<Rate>,
    /// Adaptive pacing's share of the request rate.
    aimd: Option<Aimd>,
    /// When the last refused request had been released: releases before
    /// it were not all accepted.
    refused_at: Option<Instant>,
    /// How a quota learned from a refusal is probed back up.
    probe: Option<Probe>,
    /// The capacity of the vendor's bucket, when `learned` is its rate (a
    /// leak read off its levels, or a quota a bucket vendor taught by a
    /// refusal): then the lane may use the room the vendor reports, and
    /// the learned rate refills it (`Meters::set_leak`) rather than
    /// spacing every request.
    leak: Option<u64>,
    /// A bucket that does not say its rate refused the lane, and its levels
    /// have not shown the rate yet: the lane keeps to its declared rate
    /// without bursts, so the bucket neither fills at once (another
    /// refusal) nor runs empty, and its levels show what leaks.
    unread: bool,
    /// The ends of the vendor's fixed window, as it wrote them.
    ends: WindowEnds,
    /// What the vendor's bucket last said it had left, and when the request
    /// it counted last had been released (for a lane on a shared store,
    /// whose bursts keep within it).
    left: Option<(u64, Instant)>,
    /// The vendor's "remaining" is its burst room, not what is left of a
    /// window (see [`Gate::burst_room`]).
    burst_room: bool,
}

/// The ends a vendor wrote for its fixed window (GitHub's epoch second),
/// the step between the last two, and when the last one was first heard.
/// A reset read at a refusal may say anything from nothing to the window
/// plus its precision, wherever the window began; an end stays put through
/// its window, so the step to the next is the window itself, to the second.
/// A lane idle for a window sees a step of two, which looks like no
/// declared window and teaches nothing.
#[derive(Debug, Default)]
struct WindowEnds {
    last: Option<SystemTime>,
    step: Option<Duration>,
    /// When the first answer that carried `last` came, if the end before
    /// it was heard too: that window was open by then.
    opened: Option<Instant>,
}

impl WindowEnds {
    fn saw(&mut self, end: SystemTime, at: Instant) {
        match self.last.map(|last| end.duration_since(last)) {
            Some(Ok(step)) if step.is_zero() => return,
            Some(Ok(step)) => {
                self.step = Some(step);
                self.opened = Some(at);
            }
            // The first end, or an earlier one: an answer that overtook
            // another, or the vendor's clock stepped back.
            _ => self.opened = None,
        }
        self.last = Some(end);
    }

    /// Whether the last step looks like a window of `length`.
    fn steps_like(&self, length: Duration) -> bool {
        self.step
            .is_some_and(|step| step.abs_diff(length) <= slack(length))
    }

    /// When the window ending at `end` closes at the latest, by our clock:
    /// it was open when its first answer came, and lasts a step. (A step
    /// over an idle window is longer than the window: later, never early.)
    fn closes(&self, end: SystemTime) -> Option<Instant> {
        if self.last != Some(end) {
            return None;
        }
        Some(later(self.opened?, self.step?))
    }
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

/// How far a vendor's window may be from the declared `length` and still
/// look like it: a tenth, at most a second.
fn slack(length: Duration) -> Duration {
    (length / 10).min(Duration::from_secs(1))
}

/// `first`, if it is the lane's first release after a quiet `length` (or
/// ever): a window that opens at the first request (Flask-Limiter's,
/// express-rate-limit's) opened there.
fn opened(releases: &Releases, first: Option<Instant>, length: Duration) -> Option<Instant> {
    first.filter(|&first| {
        releases
            .before(first)
            .is_none_or(|before| later(before, length) <= first)
    })
}

/// True when a window's end `reset` from now, written to `precision`
/// (rounded up: it may overstate the end by that much, never understate
/// it), is `length` after the lane's release at `opened`, as a window that
/// opens at the first request ends. A whole-second end read from now says
/// anything up to the window plus a second, so a 1 s window whose end was
/// written 1.4 s ahead looks like no declared window; read from where the
/// window opened, a window of `length` spans `[length, length +
/// precision)` to its written end, and one twice as long never less than
/// twice `length` (the declared `length` carries the headroom, which
/// covers the request's way to the vendor).
fn opened_like(opened: Instant, reset: Duration, precision: Duration, length: Duration) -> bool {
    let span = later(Instant::now(), reset).saturating_duration_since(opened);
    span >= length / 4 && span.saturating_sub(precision) < length
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

    /// A success: the fallback starts over, adaptive pacing grows back, a
    /// learned quota or spacing steps back once its quiet spell is over.
    pub(crate) fn succeeded(&self) {
        self.throttle_streak.store(0, Ordering::Relaxed);
        self.adapt(Aimd::succeeded);
        if self.probing.load(Ordering::Relaxed) {
            self.probe(Instant::now());
        }
        if self.decaying.load(Ordering::Relaxed) {
            self.decay(Instant::now());
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
        // An announced quota is the vendor's word: not probed.
        self.keep_to(announced, None, None)
    }

    /// Keep to `rate` from now on, probed back up as `probe` says (see
    /// [`Gate::learn`]); `leak`: the rate is that of a vendor's bucket of
    /// this capacity. True when this changed the pace.
    fn keep_to(&self, rate: Rate, probe: Option<Probe>, leak: Option<u64>) -> bool {
        let mut pace = lock(&self.pace);
        let Some(declared) = pace.declared else {
            return false;
        };
        if slower_first(rate, declared).is_ge() || pace.learned == Some(rate) {
            return false;
        }
        pace.learned = Some(rate);
        pace.probe = probe;
        pace.leak = leak;
        self.probing.store(probe.is_some(), Ordering::Relaxed);
        self.repace(&pace);
        true
    }

    /// The vendor wrote `end` as the end of its fixed window, in an answer
    /// that came at `at`.
    pub(crate) fn saw_end(&self, end: SystemTime, at: Instant) {
        lock(&self.pace).ends.saw(end, at);
    }

    /// When the vendor's fixed window that ends at `end` (as it wrote it)
    /// closes at the latest, if the lane saw it open and the step between
    /// its ends looks like the declared window. (A sliding window written
    /// as instants moves its end with every request: its steps say nothing
    /// of when a unit frees.)
    pub(crate) fn window_closes(&self, end: SystemTime) -> Option<Instant> {
        let length = self.window(Instant::now())?.length;
        let pace = lock(&self.pace);
        if !pace.ends.steps_like(length) {
            return None;
        }
        pace.ends.closes(end)
    }

    /// The vendor refused a request this gate released at `released` (a
    /// 429, or "nothing left" its releases don't explain), saying its
    /// limit is `limit` and its reset `reset` if it did. Learn the quota the vendor really
    /// allows: its limit, else the releases it accepted in the window
    /// before the refusal (those since the previous refusal, if one was in
    /// the window), over the declared window; never faster than the pace
    /// already kept. Only a vendor whose window looks like the declared one
    /// teaches: the step between the last two ends of its fixed window
    /// (see [`saw_end`](Self::saw_end)) within a tenth of the window (at
    /// most a second); else its reset (read as `(reset, precision)`) between a quarter
    /// of the window and the window, give or take a tenth of the window (at
    /// most a second) and, for a bucket, its precision (a whole-second
    /// "full again" at a 1 s window may read 2); a window's end, read from
    /// the lane's first release after a quiet window, the window give or
    /// take its precision (see [`opened_like`]); or without a reset, a refusal at
    /// least a quarter into the lane's window. A lane declared 1,000 a
    /// minute against a vendor counting 10 a second hears a reset of a
    /// second, and one declared 10 a second against 3 per 2 s hears two:
    /// the vendor's window is not the declared one, and the pause until
    /// its reset is the answer. A vendor whose limit is a bucket of
    /// `bucket` units (one that refills: OpenAI, Anthropic) has the quota
    /// learned refill that bucket, so the lane still uses what the vendor
    /// says is left after a pause, rather than spacing every request. The
    /// quota learned, if the pace changed.
    pub(crate) fn refused(
        &self,
        limit: Option<u64>,
        reset: Option<(Duration, Duration)>,
        released: Instant,
        bucket: Option<u64>,
    ) -> Option<Rate> {
        let window = self.window(released)?;
        let mut since = window.since;
        let (previous, steps_like) = {
            let mut pace = lock(&self.pace);
            // "Nothing left" read as burst room let this request go.
            pace.burst_room = false;
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
            (previous, pace.ends.steps_like(window.length))
        };
        if let Some(previous) = previous {
            // Releases before the previous refusal were not all accepted.
            since = since.max(later(previous, Duration::from_nanos(1)));
        }
        let (accepted, first, gap, opened) = {
            let meters = lock(&self.meters);
            let releases = meters.releases()?;
            let (accepted, first) = releases.between(since, released);
            let opened = opened(releases, first, window.length);
            let gap = releases.longest_gap(since, released);
            (accepted, first, gap, opened)
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
        // Releases refused for their spacing were not accepted.
        let accepted =
            accepted.saturating_sub(lock(&self.spacing).refused_between(since, released));
        let count = limit.unwrap_or(accepted);
        if count == 0 || window.allows(count) {
            return None;
        }
        let length = window.length;
        let looks_declared = steps_like
            || match reset {
                Some((reset, precision)) if bucket.is_some() => {
                    reset.saturating_add(precision) >= length / 4
                        && reset.saturating_sub(precision) <= length.saturating_add(slack(length))
                }
                Some((reset, precision)) => {
                    let within =
                        reset >= length / 4 && reset <= length.saturating_add(slack(length));
                    within
                        || opened
                            .is_some_and(|opened| opened_like(opened, reset, precision, length))
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
        self.keep_to(rate, Some(probe), bucket).then_some(rate)
    }

    /// True when a window's end `reset` from now, written to `precision`
    /// (rounded up), in the answer to a request released at `released`, is
    /// further than the declared window can end (give or take a tenth of
    /// it): the vendor's window is longer than declared, and the pause
    /// until its end is the answer (a pace learned from it would spread
    /// the vendor's burst: 3 per fixed 2 s, paced, is 2 a window). The
    /// window is measured from the lane's first release after a quiet
    /// window (which the vendor counted in it), or from now.
    pub(crate) fn longer_window(
        &self,
        reset: Duration,
        precision: Duration,
        released: Instant,
    ) -> bool {
        let Some(window) = self.window(released) else {
            return false;
        };
        let now = Instant::now();
        let from = {
            let meters = lock(&self.meters);
            let Some(releases) = meters.releases() else {
                return false;
            };
            let first = releases.between(window.since, released).1;
            opened(releases, first, window.length).unwrap_or(now)
        };
        let least = later(now, reset)
            .saturating_duration_since(from)
            .saturating_sub(precision);
        least > window.length.saturating_add(slack(window.length))
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

    /// A learned spacing steps down after a quiet spell (see [`Learned`]).
    fn decay(&self, now: Instant) {
        let Some(interval) = self.request_interval() else {
            return;
        };
        let mut meters = lock(&self.meters);
        let mut learned = lock(&self.spacing);
        if let Some(gap) = learned.decay(interval, now) {
            meters.set_spacing(Some(gap));
        }
        self.decaying
            .store(learned.decays(interval), Ordering::Relaxed);
    }

    /// The vendor refused the request released at `released`, saying its
    /// limit is `limit` if it did (`silent`: it said nothing at all): read
    /// against the ledger, is it the lane's spacing (see [`Learned`])? The
    /// gap kept from now on, if so. Only for quotas that never burst: a
    /// burst's gaps say nothing of the vendor's spacing.
    pub(crate) fn spacing_refused(
        &self,
        limit: Option<u64>,
        silent: bool,
        released: Instant,
    ) -> Option<Duration> {
        let window = self.window(released)?;
        if limit.is_some_and(|limit| !window.allows(limit)) {
            // The vendor says it counts fewer: the count learning's.
            return None;
        }
        let mut meters = lock(&self.meters);
        if meters.bursts() {
            return None;
        }
        let strict = meters.spacing().is_some();
        let mut learned = lock(&self.spacing);
        let refusal =
            learned.refusal(meters.releases()?, window.since, released, strict, silent)?;
        // A vendor that states its limit is read against the pace the lane
        // keeps: a lane that learned that limit (a GCRA's, below the
        // declared) and sent a gap under its spacing was refused for its
        // spacing. A silent vendor's refusal is read against the declared
        // quota: the lane's learned pace is its own guess, probed up.
        let kept = if limit.is_some() {
            window.kept
        } else {
            window.declared
        };
        let declared = Declared::new(kept, self.headroom);
        match learned.refused(refusal, declared, released, Instant::now()) {
            Reading::Count => None,
            Reading::Spacing(gap) => {
                let gap = gap.min(self.max_pause);
                meters.set_spacing(Some(gap));
                self.decaying
                    .store(learned.decays(declared.interval), Ordering::Relaxed);
                Some(gap)
            }
        }
    }

    /// The strict spacing in force, if any.
    pub(crate) fn spacing(&self) -> Option<Duration> {
        lock(&self.meters).spacing()
    }

    /// True once the vendor answered a request of this gate's.
    pub(crate) fn has_heard(&self) -> bool {
        self.heard.load(Ordering::Acquire)
    }

    /// The vendor's bucket said it has `remaining` left, counting the
    /// request released at `released`. A later report wins; one about an
    /// earlier request (an answer that overtook another) does not.
    pub(crate) fn said_left(&self, remaining: u64, released: Instant) {
        let mut pace = lock(&self.pace);
        if pace.left.is_none_or(|(_, counted)| counted <= released) {
            pace.left = Some((remaining, released));
        }
    }

    /// What the vendor's bucket has left at `now` by what it last said,
    /// plus what the pace the gate keeps refills since, and when the
    /// request that answer counted had been released. The vendor's bucket
    /// refills too: a word from before a quiet spell must not hold a burst
    /// after it. `None` without a word, or without a request pace.
    pub(crate) fn left(&self, now: Instant) -> Option<(u64, Instant)> {
        let pace = lock(&self.pace);
        let (left, counted) = pace.left?;
        let rate = pace.learned.or(pace.declared)?;
        let since = now.saturating_duration_since(counted).as_nanos();
        let refilled = since.saturating_mul(u128::from(rate.count)) / rate.per.as_nanos().max(1);
        let refilled = u64::try_from(refilled).unwrap_or(u64::MAX);
        Some((left.saturating_add(refilled), counted))
    }

    /// The vendor answered: true when this was its first word, which a
    /// burst may be waiting for (see `Meters::heard`); lanes waiting for it are woken.
    pub(crate) fn heard(&self) -> bool {
        if self.heard.load(Ordering::Acquire) {
            return false;
        }
        let first = lock(&self.meters).heard(Instant::now());
        self.heard.store(true, Ordering::Release);
        // Lanes on a shared store wait for it too, with nothing released
        // from these meters.
        self.turn.notify_waiters();
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
        let leak = lock(&self.drain).observe(used, around, released, refused, span);
        {
            let mut pace = lock(&self.pace);
            // Refused: paced until the levels show the leak; read: the
            // reading paces from now on.
            let read = leak.is_some() && pace.refused_at.is_some();
            let unread = !read && (pace.unread || refused);
            if unread != pace.unread {
                pace.unread = unread;
                self.repace(&pace);
            }
            // Never refused: the declared quota is not shown too fast.
            pace.refused_at?;
        }
        let leak = leak?;
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
        // A reading is the vendor's word: not probed.
        self.keep_to(rate, None, Some(capacity)).then_some(rate)
    }

    /// When the vendor frees a unit by this gate's releases alone: its
    /// oldest release in the window that ends with the request released at
    /// `released`, one window on. Only for a vendor allowing at least what
    /// the gate keeps to, whose window is then taken as the declared one:
    /// a vendor sending whole-second resets ("1") would otherwise hold the
    /// lane a second each time another consumer fills the window, when
    /// the lane's own oldest request leaves it a few milliseconds later.
    ///
    /// A fleet's ledger says when its oldest slot leaves the window, which
    /// is the same instant.
    pub(crate) fn frees_at(
        &self,
        limit: u64,
        released: Instant,
        spending: Spending,
    ) -> Option<Instant> {
        let window = self.window(released).filter(|w| w.allows(limit))?;
        match spending {
            Spending::Own => {
                let oldest = lock(&self.meters).releases()?.first_since(window.since)?;
                Some(later(oldest, window.length))
            }
            Spending::Fleet(booked) => booked.leaves,
            Spending::Unknown => None,
        }
    }

    /// Whether this gate's own releases explain a vendor saying `used` of
    /// its `limit` are spent, for a request released at `released`: the
    /// vendor allows at least what the gate keeps to (so the meters keep
    /// the lane within it), and the gate released at least `used` in the
    /// window that ends with that request. Then "nothing left" is the lane
    /// at full quota, which its meters already pace; otherwise somebody
    /// else spends the quota, or the vendor counts less than declared.
    ///
    /// A fleet's releases are what its store counted booked in that window
    /// as it booked the slot (`store/meters.lua`, `ledger_count`); where the
    /// store did not say (a turn from the local fallback), the first
    /// condition alone decides, as the store's meters keep the fleet within
    /// the quota.
    pub(crate) fn explains(
        &self,
        limit: u64,
        used: u64,
        released: Instant,
        spending: Spending,
    ) -> bool {
        let Some(window) = self.window(released).filter(|w| w.allows(limit)) else {
            return false;
        };
        match spending {
            Spending::Own => lock(&self.meters)
                .releases()
                .is_some_and(|releases| releases.since(window.since) >= used),
            Spending::Fleet(booked) => booked.count >= used,
            Spending::Unknown => true,
        }
    }

    /// Whether the vendor's "nothing left" on a request released at
    /// `released` is its burst room rather than a spent window (`None`:
    /// a window), learning it once shown. A GCRA with a small tolerance (or a bucket a request
    /// deep) says "0 left" after every request it accepts, with a reset a
    /// unit away that a whole-second header writes as 1 s. Read as a
    /// window, that is another consumer spending the rest, and a pause
    /// until the reset after every request: 1 % of a 100/s quota. It shows
    /// on the first release after a quiet window (on a shared store, the
    /// only slot the fleet booked in it): a window that counts would have
    /// the whole quota less one left, unless another consumer spent all of
    /// it but one in the meantime. That rare case costs one refusal, which
    /// unlearns it (`Gate::refused`); meanwhile the meters keep to the
    /// quota, and a GCRA's spacing is learned from its refusals as
    /// nginx's is.
    /// True the first time it shows, so the lane can say so once.
    pub(crate) fn burst_room(&self, released: Instant, spending: Spending) -> Option<bool> {
        if lock(&self.pace).burst_room {
            return Some(false);
        }
        let window = self.window(released)?;
        let quiet = match spending {
            Spending::Own => lock(&self.meters).releases().is_some_and(|releases| {
                releases
                    .before(released)
                    .is_none_or(|before| later(before, window.length) <= released)
            }),
            Spending::Fleet(booked) => booked.count <= 1,
            Spending::Unknown => false,
        };
        if quiet {
            lock(&self.pace).burst_room = true;
        }
        quiet.then_some(true)
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
            bucket: pace.bucket,
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

    pub(crate) fn learned(&self) -> Option<Rate> {
        lock(&self.pace).learned
    }

    /// Keep requests apart by the slowest of the learned quota, adaptive
    /// pacing's share of the request rate and, while a bucket's levels are
    /// unread, the declared rate without bursts; none: as declared. A
    /// learned leak instead refills the vendor's bucket in the meters. Never
    /// further apart than `max_pause`: a vendor announcing one request a
    /// day must not hold every request for a day.
    fn repace(&self, pace: &Pace) {
        let learned = pace.learned.map(|rate| rate.interval(self.headroom));
        // A bucket's leak refills the room the vendor reports; any other
        // learned quota spaces every request.
        let (learned, leak) = match pace.leak {
            Some(capacity) => (None, learned.map(|interval| (capacity, interval))),
            None => (learned, None),
        };
        let adaptive = pace.aimd.as_ref().and_then(|aimd| {
            let nominal = pace.declared?.interval(self.headroom);
            let stretched = nominal.as_secs_f64() / aimd.share();
            (aimd.share() < 1.0)
                .then(|| Duration::try_from_secs_f64(stretched).unwrap_or(self.max_pause))
        });
        let unread = pace
            .declared
            .filter(|_| pace.unread)
            .map(|rate| rate.interval(self.headroom));
        let interval = learned
            .max(adaptive)
            .max(unread)
            .map(|i| i.min(self.max_pause));
        let mut meters = lock(&self.meters);
        if meters.pace() != interval {
            meters.set_pace(interval);
        }
        meters.set_leak(leak, Instant::now());
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

/// The smallest capacity among `quotas`' token buckets that count
/// requests.
fn request_bucket(quotas: &[Quota]) -> Option<u64> {
    quotas
        .iter()
        .filter(|q| q.unit == Unit::Requests)
        .filter_map(Quota::bucket_capacity)
        .min()
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

    fn settings(headroom: Duration) -> GateSettings {
        GateSettings {
            headroom,
            max_pause: Duration::from_secs(120),
            fallback: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
            adaptive: None,
            budget: RetryBudget::default(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_lane_that_waited_longest_is_first_and_its_going_wakes_the_rest() {
        let quotas = [Quota::leaky_bucket(10, Duration::from_secs(1))];
        let gate = Gate::new("", &quotas, settings(Duration::from_millis(5)), None, 1);
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

    /// A vendor's limit is read against the declared quota: as a count in
    /// its window, or as a declared bucket's capacity, which a bucket
    /// vendor says as its limit (5 for a burst of 5 at 10/s).
    #[tokio::test(start_paused = true)]
    async fn a_limit_the_size_of_the_declared_bucket_is_its_capacity() {
        let second = Duration::from_secs(1);
        let bucket = [Quota::token_bucket(5, 10, second)];
        let window = [Quota::sliding_log(10, second)];
        for (quotas, limit, explained) in [
            (&bucket, 5, true),
            (&bucket, 4, false),
            (&bucket, 10, true),
            (&window, 5, false),
            (&window, 10, true),
        ] {
            let gate = Gate::new("", quotas, settings(Duration::ZERO), None, 1);
            let t0 = Instant::now();
            for _ in 0..limit {
                gate.meters().commit(1, t0);
            }
            assert_eq!(
                gate.explains(limit, limit, t0, Spending::Own),
                explained,
                "{quotas:?}, {limit} spent"
            );
        }
    }

    /// "0 left" on the first release after a quiet window is burst room,
    /// learned once; on a release with another in its window it is not
    /// shown; a refusal unlearns it; a fleet shows it by booking one slot.
    #[tokio::test(start_paused = true)]
    async fn nothing_left_after_a_quiet_window_is_burst_room() {
        let second = Duration::from_secs(1);
        let quotas = [Quota::leaky_bucket(10, second)];
        let gate = Gate::new("", &quotas, settings(Duration::ZERO), None, 1);
        let t0 = Instant::now();
        gate.meters().commit(1, t0);
        let t1 = t0 + Duration::from_millis(100);
        gate.meters().commit(1, t1);
        assert_eq!(
            gate.burst_room(t1, Spending::Own),
            None,
            "one in its window"
        );
        assert_eq!(gate.burst_room(t0, Spending::Own), Some(true), "shown");
        assert_eq!(gate.burst_room(t1, Spending::Own), Some(false), "known");
        gate.refused(Some(10), None, t1, None);
        assert_eq!(gate.burst_room(t1, Spending::Own), None, "unlearned");
        let fleet = |count| {
            Spending::Fleet(Booked {
                count,
                leaves: None,
            })
        };
        assert_eq!(gate.burst_room(t1, fleet(2)), None);
        assert_eq!(gate.burst_room(t1, Spending::Unknown), None);
        assert_eq!(gate.burst_room(t1, fleet(1)), Some(true));
    }

    /// On a shared store the fleet's count, as the store booked the slot,
    /// stands for the lane's own releases; where the store did not say, a
    /// limit the gate keeps within is the fleet's own spending.
    #[tokio::test(start_paused = true)]
    async fn a_fleets_count_is_read_as_a_lanes_own_releases() {
        let second = Duration::from_secs(1);
        let quotas = [Quota::sliding_log(10, second)];
        let gate = Gate::new("", &quotas, settings(Duration::ZERO), None, 1);
        let t0 = Instant::now();
        let leaves = t0 + Duration::from_millis(400);
        let full = Booked {
            count: 10,
            leaves: Some(leaves),
        };
        let short = Booked { count: 7, ..full };
        assert!(gate.explains(10, 10, t0, Spending::Fleet(full)));
        assert!(!gate.explains(10, 10, t0, Spending::Fleet(short)));
        assert!(gate.explains(10, 10, t0, Spending::Unknown));
        assert!(!gate.explains(3, 3, t0, Spending::Unknown), "a lower limit");
        assert_eq!(
            gate.frees_at(10, t0, Spending::Fleet(short)),
            Some(leaves),
            "when the fleet's oldest leaves"
        );
        assert_eq!(gate.frees_at(10, t0, Spending::Unknown), None);
    }

    /// What a vendor's bucket has left: its latest word (not one about an
    /// earlier request), plus what the gate's pace refilled since.
    #[tokio::test(start_paused = true)]
    async fn what_the_vendor_said_is_left_refills_at_the_gates_pace() {
        let quotas = [Quota::token_bucket(10, 10, Duration::from_secs(1))];
        let gate = Gate::new("", &quotas, settings(Duration::ZERO), None, 1);
        let t0 = Instant::now();
        assert_eq!(gate.left(t0), None);
        gate.said_left(3, t0);
        gate.said_left(7, t0 - Duration::from_millis(1));
        assert_eq!(gate.left(t0), Some((3, t0)), "an older word loses");
        let later = t0 + Duration::from_millis(250);
        assert_eq!(gate.left(later), Some((5, t0)), "2.5 refilled at 10/s");
        let quiet = t0 + Duration::from_secs(3_600);
        assert_eq!(gate.left(quiet), Some((36_003, t0)));
    }

    /// A fixed window's end read again says nothing; the next end gives
    /// the step, and the window it ends closes a step after it was first
    /// heard. An end that goes back (an answer that overtook another)
    /// places no window until the next step.
    #[test]
    fn the_step_between_window_ends_is_the_window() {
        let second = Duration::from_secs(1);
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let t0 = Instant::now();
        let mut ends = WindowEnds::default();
        ends.saw(end, t0);
        ends.saw(end, t0 + second / 2);
        assert_eq!((ends.step, ends.closes(end)), (None, None));
        ends.saw(end + second, t0 + second);
        ends.saw(end + second, t0 + second * 3 / 2);
        assert_eq!(ends.step, Some(second));
        assert_eq!(ends.closes(end + second), Some(t0 + 2 * second));
        assert_eq!(ends.closes(end), None, "not the window heard last");
        ends.saw(end, t0 + second * 3 / 2);
        assert_eq!(ends.closes(end), None, "an end that went back");
        ends.saw(end + 4 * second, t0 + 4 * second);
        assert_eq!(ends.step, Some(4 * second), "an idle window in between");
        assert_eq!(ends.closes(end + 4 * second), Some(t0 + 8 * second));
    }
}
