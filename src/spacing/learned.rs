//! What a refusal says of the vendor's spacing, read against the lane's
//! ledger, and the gap it teaches ([`Learned`]).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::meters::{Rate, Releases};
use crate::time::later;

/// A refusal, as the lane's own ledger saw it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refusal {
    /// The gap between the refused release and the one before it.
    pub(crate) gap: Duration,
    /// The lane's releases in the declared window before the refused one.
    pub(crate) before: u64,
    /// The release before the refused one.
    pub(crate) prior: Instant,
    /// The lane kept strict spacing already.
    pub(crate) strict: bool,
    /// The refusal said nothing at all (no limit, no remaining, no
    /// `Retry-After`): a bare 429 or nginx's 503. A vendor that says when
    /// to come back is taken at its word.
    pub(crate) silent: bool,
    /// The smallest gap the vendor accepted in the window before it:
    /// between two releases, neither refused (the vendor measures a
    /// release after a refused one from the one before that).
    pub(crate) accepted: Option<Duration>,
    /// Every release the lane ever made before the refused one is in the
    /// window: it has not sent for a window yet, so its count says nothing
    /// of the vendor's.
    pub(crate) cold: bool,
}

/// The declared request rate, as a refusal is read against it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Declared {
    /// `per / count`: the spacing the vendor's rate means.
    pub(crate) spacing: Duration,
    /// `(per + headroom) / count`: the lane's interval.
    pub(crate) interval: Duration,
    /// `count`.
    pub(crate) count: u64,
    /// `per`.
    pub(crate) per: Duration,
}

impl Declared {
    /// `rate`, read with the lane's `headroom`.
    pub(crate) fn new(rate: Rate, headroom: Duration) -> Self {
        let count = rate.count.max(1);
        Self {
            spacing: rate.per / count,
            interval: rate.interval(headroom),
            count: u64::from(count),
            per: rate.per,
        }
    }
}

/// What a refusal says of the vendor's spacing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reading {
    /// Not a spacing refusal: the vendor counts, and the count learning
    /// reads it (`VendorModel::refused`).
    Count,
    /// The lane keeps its sends at least this far apart from now on.
    Spacing(Duration),
    /// A count, which shows that the lone refusal before it, read as
    /// jitter, was the count's first: the lane keeps no spacing again.
    Retracted,
}

/// Declared windows without a spacing refusal before a learned gap steps
/// back down.
const QUIET: u32 = 30;

/// How far from the largest refused gap to the grown one a settle steps
/// down to, in quarters: three quarters leaves the step above the vendor's
/// spacing when it lies anywhere in the lower three of the bracket, which
/// nginx's and a GCRA's do after a quarter's growth (100 ms in 85-107,
/// 10 in 9-11.25).
const SETTLE: u32 = 3;

/// The least a margin for jitter grows by: what moves a gap between the
/// lane's clock and the vendor's (the hand-over to the connection's task,
/// the vendor's event loop) is absolute, up to about half a millisecond
/// on loopback, however short the interval.
const JITTER: Duration = Duration::from_micros(500);

/// The margin a lane's first spacing reading keeps beyond its interval:
/// jitter on loopback reaches about a millisecond (nginx's clock is
/// cached per event-loop turn), and each refusal a smaller margin lets
/// through costs a request. Against nginx at `10r/s` none kept to the
/// interval met 1-3 refusals, a millisecond meets the first alone (and
/// costs 1 %). Never more than a twentieth of the interval: at `100r/s`
/// a millisecond cost 4 % of the quota and refusals stayed, since jitter
/// on a busy machine passes it now and then anyway.
fn first_margin(interval: Duration) -> Duration {
    (JITTER * 2).min(interval / 20)
}

/// The spacing a vendor's refusals taught, and how it decays.
///
/// # The reading
///
/// With `g` the gap before the refused release, `S = per / count` and
/// `T = (per + headroom) / count` (the lane's interval):
///
/// 1. **`g < S`**: the send came sooner than the declared rate allows at
///    all: the lane's own forgiven lateness, against a vendor that measures
///    spacing. The lane turns strict at `T` plus a margin for jitter
///    ([`first_margin`], a millisecond, at most `T / 20`; a gap already
///    learned stays); its count stays. (A lane
///    not yet strict reads 2 and 3 only from a refusal that says nothing
///    of the vendor's quota, a bare 429 or nginx's 503, at a gap of about
///    `T`, or any gap in the first quarter of its first window; any other
///    is a count, 4.)
/// 2. **The vendor accepted a gap of `g` or less in the window before**
///    (between two releases it did not refuse), and the lane was near its
///    full count (within a tenth of what its kept gap lets into a window)
///    or the send before was accepted: jitter between the
///    lane's clock and the vendor's. The lane's ledger sees when it
///    released, not when the request landed: the hand-over to the caller,
///    a cold connection, and nginx's millisecond clock cached per
///    event-loop turn each move a gap by up to a millisecond, so nginx
///    accepts 99.5 ms and refuses 99.9. The margin widens by `T / 50` (at
///    least [`JITTER`]) up to `T + T / 10`; a gap at that or past it grows
///    a step for a refusal within `T / step` gaps of the last spacing
///    reading, where the step costs less than the refusals it saves, and
///    stays for a rarer one (the jitter's tail). Capped, a
///    gap under the vendor's spacing that jitter let through refused the
///    lane for good (256 refusals against nginx at 100r/s, declared
///    150/s), and a loaded machine's jitter past a tenth refused a lane
///    at the true rate 24 times in 1,000. A lane not yet strict turns strict so near its
///    full count, or at a gap under `T` (a release whose lateness it
///    forgave, which is where jitter bites): taking jitter for a count
///    would teach it a lower quota (9/s against nginx's 10), a margin
///    costs it 2 %.
/// 3. **Nothing that close was accepted in the window**: the vendor's spacing may be
///    longer than `g` (a lane declared faster than a spacing vendor: nginx
///    refuses the second request of a 15/s lane 67 ms in). The first such
///    refusal turns the lane strict at `T` plus the margin of 2; each later one grows
///    the gap by a quarter, never past the smallest gap the vendor
///    accepted, nor past the declared window: 68 ms, then 85, then 107
///    against nginx's 100, three refusals. The vendor's spacing now lies
///    between the largest gap it refused and the one kept (the
///    *bracket*): see the settle below.
/// 4. Otherwise the vendor counts: a quota below the declared one, which
///    the count learning reads. So is a second refusal in a row at a gap
///    the vendor accepted (a spacing vendor measures it from the last send
///    it accepted, two gaps back), and one below the lane's count at a gap
///    the vendor accepted, after its first window, within two windows of
///    the last spacing reading (a window vendor's refusals come back every
///    window; jitter's are rare once the lane is strict). A lone refusal
///    at the lane's own interval is read as jitter (2), not as a count,
///    even below the lane's count: a request handed to its connection
///    late lands the next one closer to it on the wire than the ledger
///    shows, and a count read from that held a lane at nginx's true rate
///    to 40 % of it. A count vendor refuses the next send too, which
///    reads as a count and takes the first reading back (the lane keeps
///    no spacing again): one refusal more, against a quota lost.
///
/// # The settle
///
/// A quarter's growth overshoots by up to a quarter: 11.25 ms against
/// nginx's 10 at `100r/s` (89 % of its rate at best), 107 against its 100
/// at `10r/s`. Once a grown gap has gone a declared window without a
/// spacing refusal, it steps down once to three quarters of the way from
/// the largest refused gap to it ([`SETTLE`]): 10.7 ms (94 %) and 101.5 ms
/// (98.5 %). A refusal of that step puts the grown gap back, as any
/// refused step does; the bracket is spent either way, so settling costs
/// at most one refusal.
///
/// # The decay
///
/// A gap above `T` steps down by a twentieth of `T` after [`QUIET`]
/// declared windows without a spacing refusal; a refused step puts it back
/// and doubles the wait, as a learned quota's probe does. The lane stays
/// strict: a vendor that refused a send for its spacing measures spacing.
/// So the decay keeps a margin for the jitter between the two clocks:
/// never below `S` plus [`JITTER`] (nor `T`). At `100r/s` the headroom
/// leaves `T` 0.05 ms past nginx's 10, and a gap decayed to it met a
/// refusal 30 s into every run of a minute; at `10r/s` `T` is past it
/// already.
#[derive(Debug, Default)]
pub(crate) struct Learned {
    gap: Option<Duration>,
    /// The releases the vendor refused, within the ledger's window: the
    /// gaps between the others are the ones it accepted.
    refused: VecDeque<Instant>,
    /// When the gap next steps down, how long the wait was, and the gap
    /// before the step (`Some` while a step is on trial).
    step_at: Option<Instant>,
    quiet: Duration,
    trial: Option<Duration>,
    /// The refused release last read as spacing.
    spaced: Option<Instant>,
    /// The largest gap refused for a spacing longer than it, while the gap
    /// grown past it has yet to settle: the bracket's lower end.
    floor: Option<Duration>,
    /// The least gap a decay steps down to: the vendor's spacing plus
    /// [`JITTER`], never below the lane's interval.
    least: Duration,
    /// The refused release that first turned the lane strict as jitter
    /// where a count vendor's first refusal reads the same: a refusal of
    /// the send after it takes that reading back.
    doubted: Option<Instant>,
}

impl Learned {
    /// The refusal of the release at `released`, as the lane's ledger
    /// (`releases`, from `since`) saw it; `None` when the ledger holds no
    /// release before it.
    pub(crate) fn refusal(
        &mut self,
        releases: &Releases,
        since: Instant,
        released: Instant,
        strict: bool,
        silent: bool,
    ) -> Option<Refusal> {
        while self.refused.front().is_some_and(|&at| at < since) {
            self.refused.pop_front();
        }
        let prior = releases.before(released)?;
        let inside: Vec<Instant> = releases
            .instants()
            .filter(|&at| at >= since && at < released)
            .collect();
        let accepted = inside
            .windows(2)
            .filter(|pair| !pair.iter().any(|at| self.refused.contains(at)))
            .map(|pair| pair[1].saturating_duration_since(pair[0]))
            .min();
        let before = u64::try_from(inside.len()).unwrap_or(u64::MAX);
        Some(Refusal {
            gap: released.saturating_duration_since(prior),
            before,
            prior,
            strict,
            silent,
            accepted,
            cold: releases.around(released).0 <= before,
        })
    }

    /// How many releases from `since` up to `until` the vendor refused
    /// (that the lane knows of): the count learning takes them out of what
    /// the vendor accepted.
    pub(crate) fn refused_between(&self, since: Instant, until: Instant) -> u64 {
        let refused = self.refused.iter().filter(|&&at| at >= since && at < until);
        u64::try_from(refused.count()).unwrap_or(u64::MAX)
    }

    /// The gap learned, if any.
    #[cfg(test)]
    pub(super) fn gap(&self) -> Option<Duration> {
        self.gap
    }

    /// True while a learned gap above `interval` (and the least a decay
    /// keeps) waits to step down.
    pub(crate) fn decays(&self, interval: Duration) -> bool {
        self.gap.is_some_and(|gap| gap > interval.max(self.least))
    }

    /// The vendor refused the release at `released` (`refusal`, read
    /// against the ledger), at `now`: what it says, and the gap kept from
    /// now on when it is spacing.
    pub(crate) fn refused(
        &mut self,
        refusal: Refusal,
        declared: Declared,
        released: Instant,
        now: Instant,
    ) -> Reading {
        let doubted = self.doubted.take() == Some(refusal.prior);
        match self.read(refusal, declared, released, now) {
            Reading::Count if doubted => {
                self.retract();
                Reading::Retracted
            }
            reading => reading,
        }
    }

    /// The reading of [`Learned::refused`], before a doubted one is taken
    /// back.
    fn read(
        &mut self,
        refusal: Refusal,
        declared: Declared,
        released: Instant,
        now: Instant,
    ) -> Reading {
        // A refusal after an accepted send is not yet a pattern; two in a
        // row at a gap the vendor accepted before are a count.
        let isolated = !self.refused.contains(&refusal.prior);
        if self.refused.back().is_none_or(|&last| last < released) {
            self.refused.push_back(released);
        }
        let Refusal { gap, before, .. } = refusal;
        // The first quarter of the lane's first window: its connections
        // are new (their jitter lands here), and a count says nothing yet.
        let opening = refusal.cold && before < declared.count / 4;
        let t = declared.interval;
        self.least = declared.spacing.saturating_add(JITTER).max(t);
        let step = (t / 50).max(JITTER).min(t / 10);
        let kept = self.gap.unwrap_or(t).max(t);
        // Within a tenth of the count its kept gap lets into a window: a
        // margin keeps a strict lane below its declared count, and a busy
        // lane's sends still wander a little.
        let fits = declared.per.as_nanos() / kept.as_nanos().max(1);
        let fits = u64::try_from(fits).unwrap_or(u64::MAX).min(declared.count);
        let near_full = before.saturating_add(fits / 10).saturating_add(2) >= fits;
        let accepted_closer = refusal.accepted.is_some_and(|a| a <= gap);
        let recent = self.spaced.is_some_and(|at| {
            released.saturating_duration_since(at) < declared.per.saturating_mul(2)
        });
        let gap = if gap < declared.spacing {
            match self.gap {
                Some(_) => kept,
                None => t.saturating_add(first_margin(t)),
            }
        } else if let Some(before_step) = self.trial.take_if(|_| !accepted_closer) {
            // A step down was refused: back, and wait twice as long. Not
            // when the vendor accepted as close a gap in the window: a
            // step below its spacing is refused at once, so that refusal
            // is jitter about the step (the trial stays).
            self.quiet = self.quiet.saturating_mul(2);
            before_step
        } else if gap > kept.saturating_mul(2)
            || (!refusal.strict
                && (!refusal.silent || (gap > t.saturating_add(t / 10) && !opening)))
        {
            // A lane that was not pushing at its pace shows no spacing (a
            // throttle after a pause, an outage). One not yet strict meets
            // a count when the vendor says what it counts, or refused a gap
            // well over the declared interval (the lane kept to a learned
            // quota, or probed it).
            return Reading::Count;
        } else if accepted_closer && !isolated {
            // Two in a row at a gap the vendor accepts: a spacing vendor
            // measures the second from the last it accepted, two gaps back.
            return Reading::Count;
        } else if accepted_closer && !near_full && recent && !refusal.cold {
            // Refused below the lane's count at a gap the vendor accepts,
            // soon after the last spacing reading: it counts fewer than
            // declared in each window.
            return Reading::Count;
        } else if accepted_closer {
            if !refusal.strict && self.gap.is_none() && gap >= t && !near_full && !opening {
                // On the lane's own schedule, below its count: the send
                // before landed late, or the vendor counts fewer.
                self.doubted = Some(released);
            }
            self.widened(kept, gap, step, declared, released)
        } else if self.gap.is_none() {
            // No word yet of what the vendor accepts: the first refusal
            // may be the send after a cold connection's, landing closer
            // than it left. Strict, with a margin.
            t.saturating_add(step.max(first_margin(t)))
        } else {
            // A quarter past the gap the lane kept, not past the refused
            // one: that one fired late, and a quarter of its lateness too
            // overshot nginx's 10 ms by 18 % (11.8 ms). Never within a step
            // of a gap the vendor refused.
            let grown = kept.saturating_add(kept / 4).max(gap.saturating_add(step));
            let ceiling = refusal
                .accepted
                .filter(|a| *a > gap)
                .unwrap_or(declared.per)
                .min(declared.per);
            self.floor = Some(self.floor.map_or(gap, |floor| floor.max(gap)));
            kept.max(grown.min(ceiling))
        };
        if self.quiet.is_zero() {
            self.quiet = declared.per.saturating_mul(QUIET);
        }
        // A gap grown past a refused one settles after a declared window.
        let settles = self.floor.is_some_and(|floor| floor < gap);
        let wait = if settles { declared.per } else { self.quiet };
        self.step_at = Some(later(now, wait));
        self.gap = Some(gap);
        self.spaced = Some(released);
        Reading::Spacing(gap)
    }

    /// Forget the doubted reading, the lane's only one: it was not strict
    /// before it, so all but the refusals and the least gap are as new.
    fn retract(&mut self) {
        *self = Self {
            refused: std::mem::take(&mut self.refused),
            least: self.least,
            ..Self::default()
        };
    }

    /// The gap after a refusal the vendor's accepted gaps show to be
    /// jitter about the lane's interval `T`, the gap kept being `kept`.
    ///
    /// Jitter widens the margin by `step` up to a tenth of `T`. From there
    /// a step costs `step / T` of every send, and pays only where refusals
    /// come more often than one in `T / step` sends: jitter the tenth does
    /// not cover (a 100/s lane held at 11.05 ms met 24 refusals in 1,000 on
    /// a loaded machine), or a vendor's spacing longer than declared, which
    /// jitter let a closer gap through (capped, the lane stayed under it
    /// for good: 256 refusals in 300). A rarer refusal is the jitter's
    /// tail, and the gap stays.
    fn widened(
        &self,
        kept: Duration,
        gap: Duration,
        step: Duration,
        declared: Declared,
        released: Instant,
    ) -> Duration {
        let t = declared.interval;
        let most = t.saturating_add(t / 10);
        let widened = kept.max(gap).saturating_add(step);
        let sends = t.as_nanos() / step.as_nanos().max(1);
        let often = kept.saturating_mul(u32::try_from(sends).unwrap_or(u32::MAX));
        let frequent = self
            .spaced
            .is_some_and(|at| released.saturating_duration_since(at) < often);
        match (kept >= most, frequent) {
            (false, _) => widened.min(most),
            (true, true) => widened.min(declared.per),
            (true, false) => kept,
        }
    }

    /// A quiet spell: the gap steps down once its wait is over, to the
    /// settle's point when it grew past a refused gap, else a twentieth of
    /// `interval` (never below `interval`). The gap in force, if it
    /// changed.
    pub(crate) fn decay(&mut self, interval: Duration, now: Instant) -> Option<Duration> {
        let (gap, at) = (self.gap?, self.step_at?);
        let least = interval.max(self.least);
        if now < at || gap <= least {
            return None;
        }
        // The gap before this step, which a refusal of it goes back to.
        self.trial = Some(gap);
        let stepped = match self.floor.take() {
            Some(floor) if floor < gap => floor.saturating_add((gap - floor) / 4 * SETTLE),
            _ => gap.saturating_sub(interval / 20),
        }
        .max(least);
        self.gap = Some(stepped);
        self.step_at = Some(later(now, self.quiet));
        Some(stepped)
    }
}
