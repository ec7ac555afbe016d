//! [`VendorModel`]: what one vendor's answers taught its lanes, and how
//! that paces the vendor gate's meters; the throttle streak and the
//! retry allowance it keeps for them.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::drain::Drain;
use super::pace::{Pace, Probe};
use super::report::Report;
use super::window::Window;
use crate::adaptive::{Adaptive, Aimd};
use crate::gate::{Gate, Keep};
use crate::meters::Rate;
use crate::retry::{Allowance, Backoff, RetryBudget};
use crate::spacing::Learned;
use crate::sync::{Listing, Listings, lock};

/// The vendor models of a shaper, by the name of the vendor gate each
/// reads for: one per vendor key, shared by every lane under it.
pub(crate) type VendorMap = Listings<VendorModel>;

/// What a vendor's model needs of the lane and retry policies.
#[derive(Debug, Clone, Copy)]
pub(crate) struct VendorSettings {
    pub(crate) fallback: Backoff,
    pub(crate) adaptive: Option<Adaptive>,
    pub(crate) budget: RetryBudget,
}

/// One vendor's model, shared by every lane under it, beside the vendor's
/// gate (the broadest level's), whose meters it paces: a 429 one tenant's
/// request met slows every tenant's.
///
/// Each piece of state is a plain struct with its own arithmetic and
/// tests ([`Pace`], [`Report`], [`Drain`], [`Learned`], [`Allowance`]);
/// the model locks them, reads them against the gate's releases, and
/// hands the meters what follows.
pub(crate) struct VendorModel {
    pub(super) gate: Arc<Gate>,
    fallback: Backoff,
    pub(super) pace: Mutex<Pace>,
    pub(super) report: Mutex<Report>,
    allowance: Mutex<Allowance>,
    pub(super) throttle_streak: AtomicU32,
    /// A fleet lane's lone bare refusal since the last success was read
    /// as its instances' jitter (see `fleet_spacing_refused`): not in the
    /// streak, so a count's fallback starts where it would without it.
    pub(super) fleet_jitter: AtomicBool,
    /// The level of a vendor bucket that does not say its rate.
    pub(super) drain: Mutex<Drain>,
    /// A quota learned from a refusal is being probed back up: successes
    /// look at the pace (else they skip its lock).
    probing: AtomicBool,
    /// The spacing the vendor's refusals taught.
    pub(super) spacing: Mutex<Learned>,
    /// A learned spacing waits to step down: successes look at it (else
    /// they skip its lock).
    pub(super) decaying: AtomicBool,
    /// Where a shared model is listed, to leave the map when dropped.
    _listing: Option<Listing<VendorModel>>,
}

impl VendorModel {
    /// The model of the vendor whose gate is `gate`.
    pub(crate) fn new(
        gate: Arc<Gate>,
        settings: VendorSettings,
        listing: Option<Listing<VendorModel>>,
    ) -> Self {
        let aimd = match (settings.adaptive, gate.declared()) {
            (Some(knobs), Some(ceiling)) => Some(Aimd::new(knobs, ceiling)),
            _ => None,
        };
        Self {
            gate,
            fallback: settings.fallback,
            pace: Mutex::new(Pace {
                aimd,
                ..Pace::default()
            }),
            report: Mutex::new(Report::default()),
            allowance: Mutex::new(Allowance::new(settings.budget)),
            throttle_streak: AtomicU32::new(0),
            fleet_jitter: AtomicBool::new(false),
            drain: Mutex::new(Drain::default()),
            probing: AtomicBool::new(false),
            spacing: Mutex::new(Learned::default()),
            decaying: AtomicBool::new(false),
            _listing: listing,
        }
    }

    /// The vendor's gate.
    pub(crate) fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }

    /// The gate's quotas changed (see `Gate::requote`): adaptive pacing
    /// takes the new ceiling, and the meters the pace again. The learned
    /// quota and spacing, the pause and the retry allowance stay.
    pub(crate) fn requoted(&self) {
        let mut pace = lock(&self.pace);
        if let (Some(aimd), Some(ceiling)) = (pace.aimd.as_mut(), self.gate.declared()) {
            aimd.set_ceiling(ceiling);
        }
        self.repace(&pace);
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
        // Read first: nearly every success finds it clear, and writes no
        // more than before the flag was.
        if self.fleet_jitter.load(Ordering::Relaxed) {
            self.fleet_jitter.store(false, Ordering::Relaxed);
        }
        self.adapt(Aimd::succeeded);
        if self.probing.load(Ordering::Relaxed) {
            self.probe(Instant::now());
        }
        if self.decaying.load(Ordering::Relaxed) {
            self.decay(Instant::now());
        }
    }

    /// Raise a learned quota a step, once its probe is due (see
    /// [`Probe`]).
    fn probe(&self, now: Instant) {
        let mut pace = lock(&self.pace);
        match pace.probe(now, self.gate.declared()) {
            None => self.probing.store(false, Ordering::Relaxed),
            Some(false) => {}
            Some(true) => {
                self.probing.store(pace.probe.is_some(), Ordering::Relaxed);
                self.repace(&pace);
            }
        }
    }

    fn adapt(&self, step: fn(&mut Aimd)) {
        let mut pace = lock(&self.pace);
        if let Some(aimd) = pace.aimd.as_mut() {
            step(aimd);
            self.repace(&pace);
        }
    }

    /// The vendor announced its quota: a lower one than the gate's
    /// request rate becomes its pace (never a higher one: the user's
    /// declaration is the ceiling). True when this changed the pace.
    pub(crate) fn learn(&self, announced: Rate) -> bool {
        // An announced quota is the vendor's word: not probed.
        self.keep_to(announced, None, None)
    }

    /// Keep to `rate` from now on, probed back up as `probe` says (see
    /// [`Pace::keep_to`]); `leak`: the rate is that of a vendor's bucket
    /// of this capacity. True when this changed the pace.
    pub(super) fn keep_to(&self, rate: Rate, probe: Option<Probe>, leak: Option<u64>) -> bool {
        let mut pace = lock(&self.pace);
        if !pace.keep_to(rate, self.gate.declared(), probe, leak) {
            return false;
        }
        self.probing.store(probe.is_some(), Ordering::Relaxed);
        self.repace(&pace);
        true
    }

    /// A learned spacing steps down after a quiet spell (see [`Learned`]).
    fn decay(&self, now: Instant) {
        let Some(interval) = self.gate.request_interval() else {
            return;
        };
        let mut meters = self.gate.meters();
        let mut learned = lock(&self.spacing);
        if let Some(gap) = learned.decay(interval, now) {
            meters.set_spacing(Some(gap));
        }
        self.decaying
            .store(learned.decays(interval), Ordering::Relaxed);
    }

    /// Hand the gate's meters what `pace` keeps to (see
    /// [`Pace::intervals`]).
    pub(super) fn repace(&self, pace: &Pace) {
        let intervals = pace.intervals(
            self.gate.declared(),
            self.gate.headroom(),
            self.gate.max_pause(),
        );
        let mut meters = self.gate.meters();
        if meters.pace() != intervals.spacing {
            meters.set_pace(intervals.spacing);
        }
        meters.set_leak(intervals.leak, Instant::now());
    }

    /// A request's first attempt, at `now`: it earns the vendor's retry
    /// budget some.
    pub(crate) fn deposit(&self, now: Instant) {
        lock(&self.allowance).deposit(now);
    }

    /// A retry spends the vendor's retry budget: false when it has none.
    pub(crate) fn withdraw_retry(&self) -> bool {
        lock(&self.allowance).withdraw(Instant::now())
    }

    /// The quota the vendor taught, if it is kept to now.
    pub(crate) fn learned(&self) -> Option<Rate> {
        lock(&self.pace).learned
    }

    /// The gate's request window that ends with a request released at
    /// `released`, with the pace kept now (see [`Window::of`]).
    pub(super) fn window(&self, released: Instant) -> Option<Window> {
        Window::of(&self.gate, self.learned(), released)
    }
}

/// A resting gate keeps its vendor's model alive: the model's gate holds
/// the vendor's own count, which no lane may hold any more.
impl Keep for VendorModel {
    fn rested(&self, now: Instant) -> bool {
        self.gate().is_idle(now)
    }
}
