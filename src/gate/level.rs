//! A level's gate: its meters, pause, stop and the queue of lanes waiting
//! at it, and the gates of a shaper by name.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock, Weak};
use std::time::Duration;

use once_cell::race::OnceBox;
use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;
use tokio::time::Instant;

use super::cause::{PauseCause, Paused, Stop};
use crate::meters::{Meters, Quota, Rate, Requests, Terms};
use crate::spacing::Departures;
use crate::sync::{lock, lock_briefly, read, write};
use crate::time::later;

/// A gate's level, and its key in the map its level's gates are listed
/// in (the `GateMap`), so that it leaves the map when dropped. A field of
/// the gate: it drops with it. The map is the level's, one pointer for
/// all its gates: a lane per tenant holds a gate each.
pub(crate) struct Listed {
    level: Arc<GateLevel>,
    /// The name it is listed under, the gate's alone (the map's slot keeps
    /// its hash, lanes read it here), then its resting meters': a box, not
    /// an `Arc`, whose counts took 16 bytes more of every tenant's name.
    /// `None`: listed nowhere (a standalone lane's gate, the fallback
    /// meters of a fleet's).
    key: Option<Box<str>>,
}

/// A map of gates, as a gate's listing sees it.
pub(crate) trait Unlist: Send + Sync {
    /// The gate listed under `key` was dropped.
    fn forget(&self, key: &str);
}

impl Listed {
    /// A gate of `level`, listed under `key` in `map`: the one map every
    /// gate of the level is listed in (a registry makes its own levels).
    pub(crate) fn new(level: Arc<GateLevel>, key: Box<str>, map: Weak<dyn Unlist>) -> Self {
        let listed_in = level.map.get_or_init(|| map.clone());
        debug_assert!(
            Weak::ptr_eq(listed_in, &map),
            "a level's gates are listed in one map"
        );
        Self {
            level,
            key: Some(key),
        }
    }

    /// A gate of `level`, listed nowhere.
    pub(crate) fn nowhere(level: Arc<GateLevel>) -> Self {
        Self { level, key: None }
    }
}

impl Drop for Listed {
    fn drop(&mut self) {
        let map = self.level.map.get().and_then(Weak::upgrade);
        if let (Some(key), Some(map)) = (&self.key, map) {
            map.forget(key);
        }
    }
}

/// How a gate behaves besides its quotas: what it needs of the lane
/// policy, and nothing else (so a gate knows nothing of lanes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct GateSettings {
    pub(crate) headroom: Duration,
    pub(crate) max_pause: Duration,
    /// A vendor answers the requests the gate releases (a shaper's
    /// gates): a burst waits for its first word, and the meters keep a
    /// ledger of releases to read its counts against. A standalone lane's
    /// gate hears no vendor, and does neither (see `Terms::unheard`).
    pub(crate) hears: bool,
}

impl GateSettings {
    /// What meters with these settings make of `quotas` now.
    fn terms(&self, quotas: Arc<[Quota]>) -> Terms {
        let terms = Terms::new(quotas, self.headroom, Instant::now());
        if self.hears { terms } else { terms.unheard() }
    }
}

/// What every gate of a level shares: the level's name, the settings,
/// and its quotas now, with what they say of requests. One per level, not
/// one per gate: a level keyed per tenant has a gate for each.
#[derive(Debug)]
pub(crate) struct GateLevel {
    /// A live change of the level's quotas finds its gates by it.
    name: Box<str>,
    settings: GateSettings,
    /// As built, or as last changed live; a new gate's meters count them.
    /// A read-write lock: every new gate of the level reads them (a
    /// tenant's new lane makes one), in parallel; only a live change, or
    /// a fleet's first share, writes.
    quotas: RwLock<LevelQuotas>,
    /// The largest request cost its quotas can ever allow (an atomic, so
    /// admission needs no lock to check it; the level's, not each gate's:
    /// a lane per tenant holds a gate each).
    capacity: AtomicU64,
    /// The map its shared gates are listed in, once one is.
    map: OnceLock<Weak<dyn Unlist>>,
}

/// A level's quotas, their request side (of the whole quotas, not of
/// the local share a fleet's fallback meters hold) and what its gates'
/// meters count by, changed together.
#[derive(Debug)]
struct LevelQuotas {
    quotas: Arc<[Quota]>,
    requests: Requests,
    terms: Arc<Terms>,
    /// The terms of a fleet's share of the quotas, once a gate counts
    /// them: a fleet of `.0` shapers.
    share: Option<(u32, Arc<Terms>)>,
}

impl LevelQuotas {
    fn of(quotas: Arc<[Quota]>, settings: GateSettings) -> Self {
        let requests = Requests::of(&quotas);
        let terms = Arc::new(settings.terms(quotas.clone()));
        Self {
            quotas,
            requests,
            terms,
            share: None,
        }
    }
}

impl GateLevel {
    /// The level `name`, holding `quotas` now, with `settings`.
    pub(crate) fn new(name: &str, quotas: Arc<[Quota]>, settings: GateSettings) -> Self {
        let quotas = LevelQuotas::of(quotas, settings);
        Self {
            name: name.into(),
            settings,
            capacity: AtomicU64::new(quotas.terms.capacity()),
            quotas: RwLock::new(quotas),
            map: OnceLock::new(),
        }
    }

    /// The level's quotas now.
    pub(crate) fn quotas(&self) -> Arc<[Quota]> {
        read(&self.quotas).quotas.clone()
    }

    /// The level holds `quotas` from now on; its gates follow by
    /// [`Gate::requote`].
    pub(crate) fn requote(&self, quotas: &[Quota]) {
        let quotas = LevelQuotas::of(Arc::from(quotas), self.settings);
        let mut held = write(&self.quotas);
        self.capacity
            .store(quotas.terms.capacity(), Ordering::Relaxed);
        *held = quotas;
    }

    /// What the level's gates count by now: the whole quotas, or with a
    /// shared store one `share` of each (the fallback meters), made once
    /// for all of them.
    fn terms(&self, share: u32) -> Arc<Terms> {
        let shared = |quotas: &LevelQuotas| match &quotas.share {
            Some((of, terms)) if *of == share => Some(terms.clone()),
            _ => None,
        };
        {
            let quotas = read(&self.quotas);
            if share <= 1 {
                return quotas.terms.clone();
            }
            if let Some(terms) = shared(&quotas) {
                return terms;
            }
        }
        // The share's terms, made once: looked for again under the write
        // lock, as another gate may have made them meanwhile.
        let mut quotas = write(&self.quotas);
        if let Some(terms) = shared(&quotas) {
            return terms;
        }
        let local: Arc<[Quota]> = quotas.quotas.iter().map(|q| q.share(share)).collect();
        let terms = Arc::new(self.settings.terms(local));
        quotas.share = Some((share, terms.clone()));
        terms
    }
}

/// A level's gate: its meters, its pause and stop, and the queue of lanes
/// waiting at it. What the vendor's answers teach lives beside the
/// vendor's gate, in its model (`vendor/`), which paces these meters.
pub(crate) struct Gate {
    /// The level whose quotas it holds, shared by the level's gates, and
    /// where the gate is listed, to leave the map when dropped.
    listed: Listed,
    meters: Mutex<Meters>,
    /// Its pause, stop and queue, made the first time one is needed.
    cold: OnceBox<Cold>,
    /// A stop is in force (see [`Cold::stopped`]): the flag spares the hot
    /// path a lock.
    is_stopped: AtomicBool,
    /// The vendor has answered (the meters know it too): every later
    /// answer skips their lock.
    heard: AtomicBool,
}

/// What most gates never need: a lane per tenant holds a gate each, and
/// nearly all of them see no pause, no stop, no other lane waiting and no
/// strict spacing.
/// Kept apart, made on first use, so such a gate carries a pointer for it;
/// a gate without it has none of them, which the hot path reads without a
/// lock.
#[derive(Default)]
struct Cold {
    paused: Mutex<Option<Paused>>,
    /// Lanes whose head only this gate holds back, by how long they have
    /// waited: the gate's next slot goes to the first.
    queue: Mutex<BTreeSet<Contender>>,
    /// Woken when the gate's first waiter changes; made when a lane first
    /// waits for it.
    turn: OnceLock<Arc<Notify>>,
    /// The vendor said no pause helps (out of credit): until then, every
    /// request ends at once.
    stopped: Mutex<Option<(Instant, Arc<Stop>)>>,
    /// When the last request really went, for strict spacing.
    departures: Departures,
}

/// A lane waiting at a gate: since when, and which lane.
pub(crate) type Contender = (Instant, u64);

impl Gate {
    /// A gate of the level `listed` names, counting its quotas now. With a
    /// shared store the quotas live there, and the local meters are the
    /// fallback: one `share` of each quota.
    pub(crate) fn new(listed: Listed, share: u32) -> Self {
        let meters = Meters::new(listed.level.terms(share), Instant::now());
        Self::of(listed, meters)
    }

    /// A gate of its level again, counting with the `meters` it rested with
    /// (see `gate/map.rs`), brought up to the level's quotas if they
    /// changed meanwhile. Only a gate on no store rests.
    pub(crate) fn resumed(listed: Listed, mut meters: Meters) -> Self {
        let terms = listed.level.terms(1);
        if !Arc::ptr_eq(&terms, meters.terms()) {
            meters.requote(terms, Instant::now());
        }
        Self::of(listed, meters)
    }

    /// A gate of its level counting with `meters`: nothing in force yet.
    fn of(listed: Listed, meters: Meters) -> Self {
        Self {
            meters: Mutex::new(meters),
            cold: OnceBox::new(),
            listed,
            is_stopped: AtomicBool::new(false),
            heard: AtomicBool::new(false),
        }
    }

    /// Whether the gate can rest as its meters alone at `now`: it is
    /// listed (shared by name), and holds nothing else that counts: no
    /// pause or stop in force, no lane waiting at it, no strict turn on
    /// its way, and its last send further back than its spacing.
    pub(crate) fn can_rest(&self, now: Instant) -> bool {
        if self.listed.key.is_none() {
            return false;
        }
        let Some(cold) = self.cold.get() else {
            return true;
        };
        let departures = &cold.departures;
        let spaced = match (departures.last(), self.spacing()) {
            (Some(last), Some(gap)) => later(last, gap) <= now,
            _ => true,
        };
        self.paused_until(now).is_none()
            && self.stopped().is_none()
            && lock(&cold.queue).is_empty()
            && !departures.in_transit()
            && spaced
    }

    /// The key it is listed under, if it is, borrowed: a lane's name reads
    /// it (`lane/name.rs`).
    pub(crate) fn key(&self) -> Option<&str> {
        self.listed.key.as_deref()
    }

    /// The gate's meters and the name they rest under, at `now` (after
    /// [`can_rest`](Self::can_rest)), their ledger holding no release its
    /// window left behind; `None` for a gate listed nowhere. Its listing
    /// goes without its name, and so leaves its entry to the map, which
    /// holds the entry's lock.
    pub(crate) fn into_rest(self, now: Instant) -> Option<(Meters, Box<str>)> {
        let Self {
            meters, mut listed, ..
        } = self;
        let key = listed.key.take()?;
        let mut meters = meters.into_inner().unwrap_or_else(PoisonError::into_inner);
        meters.forget_stale(now);
        Some((meters, key))
    }

    /// Refuse every request for `period` from now: the vendor said no pause
    /// helps.
    pub(crate) fn stop_for(&self, period: Duration, stop: Stop) {
        *lock(&self.cold().stopped) = Some((later(Instant::now(), period), Arc::new(stop)));
        self.is_stopped.store(true, Ordering::Release);
    }

    /// Why the gate refuses everything now, if it does.
    pub(crate) fn stopped(&self) -> Option<Arc<Stop>> {
        if !self.is_stopped.load(Ordering::Acquire) {
            return None;
        }
        let mut stopped = lock(&self.cold().stopped);
        match &*stopped {
            Some((until, stop)) if *until > Instant::now() => Some(stop.clone()),
            _ => {
                *stopped = None;
                self.is_stopped.store(false, Ordering::Release);
                None
            }
        }
    }

    fn cold(&self) -> &Cold {
        self.cold.get_or_init(Box::default)
    }

    /// The gate's meters, locked. Lanes holding several gates lock them in
    /// level order (the same in every lane), so none can deadlock.
    pub(crate) fn meters(&self) -> MutexGuard<'_, Meters> {
        lock_briefly(&self.meters)
    }

    /// A wake-up for when the first waiter in the gate's queue changes,
    /// enabled now so no change after this call is missed.
    pub(crate) fn next_turn(&self) -> std::pin::Pin<Box<OwnedNotified>> {
        let turn = self.cold().turn.get_or_init(|| Arc::new(Notify::new()));
        let mut turn = Box::pin(turn.clone().notified_owned());
        turn.as_mut().enable();
        turn
    }

    /// Wake whoever waits for the gate's first waiter to change. Nobody
    /// waits before the wake-up is made, and whoever makes it checks the
    /// gate after: no change is missed.
    fn wake_first(&self) {
        if let Some(turn) = self.cold.get().and_then(|cold| cold.turn.get()) {
            turn.notify_waiters();
        }
    }

    /// Join the gate's queue of waiting lanes (again: no change).
    pub(crate) fn enlist(&self, waiter: Contender) {
        lock(&self.cold().queue).insert(waiter);
    }

    /// Leave the gate's queue; wakes the others if the first changed.
    pub(crate) fn delist(&self, waiter: Contender) {
        let Some(cold) = self.cold.get() else { return };
        let mut queue = lock(&cold.queue);
        let was_first = queue.first() == Some(&waiter);
        if queue.remove(&waiter) && was_first {
            self.wake_first();
        }
    }

    /// True when some lane waits for this gate: newcomers queue behind it.
    pub(crate) fn has_queue(&self) -> bool {
        self.cold
            .get()
            .is_some_and(|cold| !lock(&cold.queue).is_empty())
    }

    /// True when no other lane waits ahead of `waiter`.
    pub(crate) fn is_first(&self, waiter: Contender) -> bool {
        self.cold.get().is_none_or(|cold| {
            lock(&cold.queue)
                .first()
                .is_none_or(|first| *first == waiter)
        })
    }

    /// True when the gate has nothing to say against a request of `cost`
    /// at the door: not stopped, and its quotas can hold the cost. One
    /// load each, for the fast path; when false, [`stopped`](Self::stopped)
    /// and [`too_costly`](Self::too_costly) say why.
    pub(crate) fn admits_at_once(&self, cost: u64) -> bool {
        !self.is_stopped.load(Ordering::Acquire) && self.too_costly(cost).is_none()
    }

    /// The smallest capacity a request of `cost` exceeds, if any.
    pub(crate) fn too_costly(&self, cost: u64) -> Option<u64> {
        let capacity = self.listed.level.capacity.load(Ordering::Relaxed);
        (cost > capacity).then_some(capacity)
    }

    /// The pause in force at `now`, if any.
    pub(crate) fn paused_until(&self, now: Instant) -> Option<Instant> {
        let cold = self.cold.get()?;
        lock(&cold.paused)
            .as_ref()
            .map(|pause| pause.until)
            .filter(|until| *until > now)
    }

    /// The pause in force at `now` and why, if any.
    pub(crate) fn pause(&self, now: Instant) -> Option<Paused> {
        let cold = self.cold.get()?;
        lock(&cold.paused)
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
        let until = later(Instant::now(), pause.min(self.max_pause()));
        let mut paused = lock(&self.cold().paused);
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
    /// turn is still on its way to the wire (see `spacing/departures.rs`).
    pub(crate) fn departures(&self) -> &Departures {
        &self.cold().departures
    }

    /// A strict turn through this gate went on the wire at `at` (`None`:
    /// it never went); a lane waiting for that word looks again.
    pub(crate) fn went(&self, at: Option<Instant>) {
        self.cold().departures.went(at);
        self.wake_first();
    }

    /// A strict turn through this gate that went at `went` was answered
    /// at `at` (see [`Departures::answered`]).
    pub(crate) fn answered(&self, went: Instant, at: Instant) {
        self.cold().departures.answered(went, at);
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
        read(&self.listed.level.quotas).requests.rate
    }

    /// The request side of the gate's quotas.
    pub(crate) fn requests(&self) -> Requests {
        read(&self.listed.level.quotas).requests
    }

    /// The spacing of the declared request rate, if any.
    pub(crate) fn request_interval(&self) -> Option<Duration> {
        self.declared().map(|rate| rate.interval(self.headroom()))
    }

    /// What every quota of the gate is stretched by.
    pub(crate) fn headroom(&self) -> Duration {
        self.listed.level.settings.headroom
    }

    /// The longest the gate pauses, or spaces its requests.
    pub(crate) fn max_pause(&self) -> Duration {
        self.listed.level.settings.max_pause
    }

    /// The vendor answered: true when this was its first word, which a
    /// burst may be waiting for (see `Meters::heard`); lanes waiting for
    /// it are woken.
    pub(crate) fn heard(&self) -> bool {
        if self.heard.load(Ordering::Acquire) {
            return false;
        }
        let first = lock(&self.meters).heard(Instant::now());
        self.heard.store(true, Ordering::Release);
        // Lanes on a shared store wait for it too, with nothing released
        // from these meters.
        self.wake_first();
        first
    }

    /// The name of the level whose quotas the gate holds.
    pub(crate) fn level(&self) -> &str {
        &self.listed.level.name
    }

    /// Hold its level's quotas now (a live change, which
    /// [`GateLevel::requote`] took first): the meters change as
    /// `Meters::requote` says, the pause stays, and lanes waiting at the
    /// gate look again. The vendor's model, which paces these meters,
    /// follows (`VendorModel::requoted`, called by the registry). A shared
    /// store refuses live changes (its quotas are the fleet's), so the
    /// gate counts the whole quotas.
    pub(crate) fn requote(&self) {
        let terms = self.listed.level.terms(1);
        lock(&self.meters).requote(terms, Instant::now());
        self.wake_first();
    }

    pub(crate) fn is_idle(&self, now: Instant) -> bool {
        self.paused_until(now).is_none() && lock(&self.meters).is_idle(now)
    }
}
