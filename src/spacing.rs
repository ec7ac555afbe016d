//! Strict spacing: no two sends closer than an interval, measured from
//! when the last one really went, and the spacing a vendor's refusals
//! teach.
//!
//! Window-counting vendors (a sliding log, a fixed window, a token bucket)
//! count requests; the meters hold that count and forgive timer lateness,
//! so a release that fires late keeps the schedule and the next may follow
//! it sooner than the interval. A vendor that measures *spacing* instead
//! (nginx's `limit_req` without `burst`, a GCRA with a small tolerance)
//! refuses exactly that send: at `10r/s` nginx refuses a request 99 ms
//! after the last one it accepted, on its millisecond clock. A strict lane
//! waits a full interval after the last send ([`Departures`]), and a lane
//! refused for its spacing learns how far apart the vendor wants its
//! sends ([`Learned`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::meters::{Rate, Releases};
use crate::time::{AtomicStamp, later, nanos};

/// When the lane's last request really went on the wire (or, by its
/// answer, likely reached the vendor), and how many turns released on a
/// strict lane have not said yet whether they went.
///
/// Atomics, not the meters' lock: a turn reports as it drops, which may be
/// while the dispatcher holds that lock to hand out the next.
///
/// # A slow round trip
///
/// A request that left on time may still reach the vendor late: the
/// hand-over to its connection's task, or the vendor's own event loop,
/// held it up. The next send, on time, then lands closer than the gap.
/// Against a real nginx at `100r/s` every refusal of a strict lane
/// followed such a request: its round trip took 1.95 and 2.85 ms where
/// the usual was 0.74, and nginx saw a 13 ms gap and then an 8. So an
/// answer slower than usual ([`answered`](Departures::answered)) moves
/// the last departure on by the difference: RFC 6298's smoothed round
/// trip and its mean deviation say what is usual, and only the excess
/// over both counts, so the ordinary spread costs nothing. An answer that
/// comes after the next send was released is too late for it, and a
/// vendor slower to answer than the gap never moves a send at all.
#[derive(Debug, Default)]
pub(crate) struct Departures {
    last: AtomicStamp,
    in_transit: AtomicU32,
    /// The smoothed round trip and its mean deviation, in nanoseconds
    /// (RFC 6298's `SRTT` and `RTTVAR`); 0: none yet.
    round_trip: AtomicU64,
    deviation: AtomicU64,
}

impl Departures {
    /// A turn was released on a strict lane: it says when it went
    /// ([`went`](Self::went)) before the next may be measured from it.
    pub(crate) fn leave(&self) {
        self.in_transit.fetch_add(1, Ordering::AcqRel);
    }

    /// A turn went on the wire at `at` (`None`: it never went).
    pub(crate) fn went(&self, at: Option<Instant>) {
        if let Some(at) = at {
            self.last.raise(at);
        }
        // Never below zero, whatever order reports come in.
        let _ = self
            .in_transit
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// The request that went at `went` was answered at `at`: a round
    /// trip past the usual (the smoothed one plus its deviation) moves the
    /// last departure on by the excess (see the type's docs).
    pub(crate) fn answered(&self, went: Instant, at: Instant) {
        let took = nanos(at.saturating_duration_since(went)).max(1);
        let usual = self.round_trip.load(Ordering::Acquire);
        let deviation = self.deviation.load(Ordering::Acquire);
        if usual == 0 {
            // RFC 6298's first measurement: the deviation is half of it.
            self.round_trip.store(took, Ordering::Release);
            self.deviation.store(took / 2, Ordering::Release);
            return;
        }
        let excess = took.saturating_sub(usual.saturating_add(deviation));
        if excess > 0 {
            self.last.raise(later(went, Duration::from_nanos(excess)));
        }
        // RFC 6298's gains: a quarter for the deviation, an eighth for the
        // round trip. Two answers at once may each store theirs: an
        // estimate either way.
        let deviation = deviation - deviation / 4 + took.abs_diff(usual) / 4;
        self.deviation.store(deviation, Ordering::Release);
        let usual = (usual - usual / 8).saturating_add(took / 8).max(1);
        self.round_trip.store(usual, Ordering::Release);
    }

    /// When the last request went, if one did.
    pub(crate) fn last(&self) -> Option<Instant> {
        self.last.load().get()
    }

    /// True while a released turn has not said whether it went.
    pub(crate) fn in_transit(&self) -> bool {
        self.in_transit.load(Ordering::Acquire) > 0
    }
}

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
///    the vendor accepted when the lane sent on its own schedule (`g >=
///    T`, not yet strict; past the first quarter of its first window,
///    where new connections' jitter lands and a count says nothing yet),
///    or, after its first window, within two windows of the last spacing
///    reading (a window vendor's refusals come back every window; jitter's
///    are rare once the lane is strict).
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
        let recent = self
            .spaced
            .is_some_and(|at| released.saturating_duration_since(at) < declared.per * 2);
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
        } else if accepted_closer
            && !near_full
            && ((recent && !refusal.cold) || (!refusal.strict && gap >= t && !opening))
        {
            // Refused below the lane's count at a gap the vendor accepts,
            // on the lane's own schedule or soon again: it counts fewer
            // than declared in each window.
            return Reading::Count;
        } else if accepted_closer {
            // Jitter about the declared interval widens the margin up to a
            // tenth. From there a step costs `step / T` of every send, and
            // pays only where refusals come more often than one in `T /
            // step` sends: jitter the tenth does not cover (a 100/s lane
            // held at 11.05 ms met 24 refusals in 1,000 on a loaded
            // machine), or a vendor's spacing longer than declared, which
            // jitter let a closer gap through (capped, the lane stayed
            // under it for good: 256 refusals in 300). A rarer refusal is
            // the jitter's tail, and the gap stays.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// 10 a second with 5 ms of headroom.
    fn ten() -> Declared {
        Declared::new(Rate::new(10, Duration::from_secs(1)), ms(5))
    }

    /// 15 a second with 5 ms of headroom: a 67 ms interval.
    fn fifteen() -> Declared {
        Declared::new(Rate::new(15, Duration::from_secs(1)), ms(5))
    }

    /// Round trips about the usual (0.7-0.9 ms) move the last departure
    /// on by tens of microseconds at most; one of 2.7 ms, held up on its
    /// way, by what passes the usual and its deviation (nginx saw such a
    /// request 2 ms late, and refused the next, sent on time).
    #[tokio::test(start_paused = true)]
    async fn a_slow_round_trip_moves_the_last_departure_on_by_its_excess() {
        let departures = Departures::default();
        let t0 = Instant::now();
        let us = Duration::from_micros;
        let mut went = t0;
        for took in [700, 900, 800, 700, 900, 800, 700, 900, 800, 800] {
            departures.leave();
            departures.went(Some(went));
            departures.answered(went, went + us(took));
            let moved = departures.last().expect("a departure") - went;
            assert!(moved < us(50), "{took} µs is usual: moved {moved:?}");
            went += ms(10);
        }
        departures.leave();
        departures.went(Some(went));
        departures.answered(went, went + us(2_700));
        let moved = departures.last().expect("a departure") - went;
        assert!(
            moved > us(1_700) && moved < us(2_000),
            "{moved:?} past the request's own departure"
        );
    }

    /// A gap learned against nginx's 100r/s (10.55 ms, the interval
    /// 10.05 plus the first margin) decays to nginx's 10 ms plus the
    /// jitter's half millisecond and stays there: at the interval itself,
    /// 0.05 ms past nginx's spacing, jitter refuses a send.
    #[tokio::test(start_paused = true)]
    async fn a_decayed_gap_keeps_a_margin_for_jitter() {
        let hundred = Declared::new(Rate::new(100, Duration::from_secs(1)), ms(5));
        let mut learned = Learned::default();
        let t0 = Instant::now();
        let sooner = Refusal {
            gap: Duration::from_micros(9_900),
            before: 40,
            prior: t0,
            strict: false,
            silent: true,
            accepted: None,
            cold: false,
        };
        let learned_gap = Duration::from_nanos(10_552_500);
        assert_eq!(
            learned.refused(sooner, hundred, t0, t0),
            Reading::Spacing(learned_gap)
        );
        let t = hundred.interval;
        let mut now = t0;
        let mut gap = learned_gap;
        for _ in 0..4 {
            now += Duration::from_secs(30);
            if let Some(stepped) = learned.decay(t, now) {
                gap = stepped;
            }
        }
        assert_eq!(gap, Duration::from_micros(10_500));
        assert!(!learned.decays(t), "at the least it keeps");
    }

    /// The ledger's accepted gaps leave out the refused releases and the
    /// release after each (the vendor measures it from the one before).
    #[tokio::test(start_paused = true)]
    async fn the_gaps_the_vendor_accepted_are_read_off_the_ledger() {
        let t0 = Instant::now();
        let mut releases = Releases::new(Duration::from_secs(1), 10);
        for at in [0, 67, 150, 300] {
            releases.record(t0 + ms(at));
        }
        let mut learned = Learned::default();
        let first = learned
            .refusal(&releases, t0, t0 + ms(67), false, true)
            .expect("a release before");
        assert_eq!((first.gap, first.accepted), (ms(67), None));
        learned.refused(first, fifteen(), t0 + ms(67), t0);
        let later = learned
            .refusal(&releases, t0, t0 + ms(300), true, true)
            .expect("a release before");
        // 0 -> 67 and 67 -> 150 touch the refused release; 150 -> 300 is
        // the refused one's own gap.
        assert_eq!(
            (later.gap, later.accepted, later.before),
            (ms(150), None, 3)
        );
        assert!(learned.refusal(&releases, t0, t0, false, true).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_send_sooner_than_the_rate_turns_the_lane_strict_a_millisecond_past_its_interval() {
        let mut learned = Learned::default();
        let now = Instant::now();
        let refusal = Refusal {
            gap: Duration::from_micros(99_300),
            before: 4,
            prior: now,
            strict: false,
            silent: true,
            accepted: None,
            cold: false,
        };
        let reading = learned.refused(refusal, ten(), now, now);
        let margin = Duration::from_millis(1);
        assert_eq!(reading, Reading::Spacing(ten().interval + margin));
    }

    #[tokio::test(start_paused = true)]
    async fn jitter_widens_the_margin_a_fiftieth_at_a_time_then_only_when_refused_often() {
        let mut learned = Learned::default();
        let t0 = Instant::now();
        let refusal = Refusal {
            gap: ten().interval,
            before: 9,
            prior: t0,
            strict: true,
            silent: true,
            accepted: Some(ten().interval),
            cold: false,
        };
        let first = learned.refused(refusal, ten(), t0 + ms(1), t0);
        assert_eq!(first, Reading::Spacing(Duration::from_micros(102_510)));
        let mut last = first;
        for i in 0..4 {
            last = learned.refused(refusal, ten(), t0 + ms(2 + i), t0);
        }
        let tenth = Duration::from_micros(110_550);
        assert_eq!(last, Reading::Spacing(tenth));
        // At the tenth, a refusal more than 50 gaps (`T / step`) after the
        // last is the jitter's tail: the gap stays. One sooner widens it a
        // step.
        let rare = t0 + Duration::from_secs(6);
        assert_eq!(
            learned.refused(refusal, ten(), rare, rare),
            Reading::Spacing(tenth)
        );
        assert_eq!(
            learned.refused(refusal, ten(), rare + ms(500), rare),
            Reading::Spacing(tenth + ten().interval / 50)
        );
    }

    /// A gap learned past the jitter margin in the lane's first window,
    /// and a refusal at it that a closer accepted gap calls jitter (the
    /// closer one landed later than it left): the gap grows a step, rather
    /// than staying under the vendor's spacing for good.
    #[tokio::test(start_paused = true)]
    async fn jitter_about_a_learned_gap_still_widens_it() {
        let mut learned = Learned::default();
        let t0 = Instant::now();
        let first = Refusal {
            gap: ms(67),
            before: 1,
            prior: t0,
            strict: false,
            silent: true,
            accepted: None,
            cold: true,
        };
        learned.refused(first, fifteen(), t0 + ms(67), t0);
        let grown = Refusal {
            gap: learned.gap.expect("a learned gap"),
            prior: t0 + ms(140),
            strict: true,
            ..first
        };
        learned.refused(grown, fifteen(), t0 + ms(210), t0);
        let kept = learned.gap.expect("a grown gap");
        assert!(kept > ms(74), "past the jitter margin: {kept:?}");
        let jitter = Refusal {
            gap: kept,
            prior: t0 + ms(500),
            accepted: Some(kept - ms(1)),
            ..grown
        };
        let Reading::Spacing(widened) = learned.refused(jitter, fifteen(), t0 + ms(600), t0) else {
            panic!("a spacing refusal");
        };
        assert!(widened > kept, "{widened:?} after {kept:?}");
    }

    /// nginx at 10r/s, the lane declared 15/s: refused at 67 ms, then at
    /// 68 ms, then at 85 ms, then kept at 107 ms, above nginx's 100.
    #[tokio::test(start_paused = true)]
    async fn an_early_refusal_grows_the_gap_by_a_quarter() {
        let declared = fifteen();
        let mut learned = Learned::default();
        let now = Instant::now();
        let early = |gap| Refusal {
            gap,
            before: 1,
            prior: now,
            strict: gap > ms(67),
            silent: true,
            accepted: None,
            cold: false,
        };
        let first = learned.refused(early(ms(67)), declared, now, now);
        assert_eq!(first, Reading::Spacing(Duration::from_micros(68_340)));
        let second = learned.refused(early(Duration::from_micros(68_340)), declared, now, now);
        assert_eq!(second, Reading::Spacing(Duration::from_micros(85_425)));
        let third = learned.refused(early(Duration::from_micros(85_425)), declared, now, now);
        assert_eq!(
            third,
            Reading::Spacing(Duration::from_nanos(106_781_250)),
            "past nginx's 100 ms"
        );
    }

    /// nginx at 10r/s, the lane declared 15/s: the gap grown three times
    /// by refusals early in the window, to 106.8 ms, the largest refused
    /// 85.4 ms.
    fn grown_against_nginx(t0: Instant) -> (Learned, Duration) {
        let mut learned = Learned::default();
        let mut gap = ms(67);
        for _ in 0..3 {
            let early = Refusal {
                gap,
                before: 1,
                prior: t0,
                strict: gap > ms(67),
                silent: true,
                accepted: None,
                cold: false,
            };
            let Reading::Spacing(grown) = learned.refused(early, fifteen(), t0, t0) else {
                panic!("a spacing refusal");
            };
            gap = grown;
        }
        assert_eq!(gap, Duration::from_nanos(106_781_250));
        (learned, gap)
    }

    /// A refusal of the settled gap, as a vendor refuses a step below its
    /// spacing: at once, no gap that close accepted.
    fn settle_refused(settled: Duration, at: Instant, accepted: Duration) -> Refusal {
        Refusal {
            gap: settled,
            before: 9,
            prior: at,
            strict: true,
            silent: true,
            accepted: Some(accepted),
            cold: false,
        }
    }

    /// The grown gap settles after a quiet declared window, three quarters
    /// of the way down from the largest refused gap: 101.4 ms. Refused, it
    /// goes back, and the spent bracket leaves the slow decay.
    #[tokio::test(start_paused = true)]
    async fn a_grown_gap_settles_within_its_bracket_once() {
        let t0 = Instant::now();
        let (mut learned, grown) = grown_against_nginx(t0);
        let window = t0 + Duration::from_secs(1);
        assert_eq!(learned.decay(ms(67), window - ms(1)), None);
        let settled = learned.decay(ms(67), window).expect("a settle");
        assert!(
            settled > ms(101) && settled < ms(102),
            "three quarters up from 85.4 to 106.8: {settled:?}"
        );
        let at = window + ms(101);
        let refused = settle_refused(settled, window, grown);
        let back = learned.refused(refused, fifteen(), at, at);
        assert_eq!(
            back,
            Reading::Spacing(grown),
            "the refused settle goes back"
        );
        let later = window + Duration::from_secs(31);
        assert_eq!(learned.decay(ms(67), later), None, "the bracket is spent");
    }

    /// A refusal of the settled gap after the vendor accepted a gap as
    /// close is jitter about it, not its refusal: the lane stays near the
    /// settled gap (a step above it) rather than going back to the grown.
    #[tokio::test(start_paused = true)]
    async fn jitter_about_a_settled_gap_does_not_undo_the_settle() {
        let t0 = Instant::now();
        let (mut learned, grown) = grown_against_nginx(t0);
        let window = t0 + Duration::from_secs(1);
        let settled = learned.decay(ms(67), window).expect("a settle");
        let at = window + Duration::from_millis(900);
        let jitter = settle_refused(settled, at, settled - ms(1));
        let Reading::Spacing(kept) = learned.refused(jitter, fifteen(), at + settled, at) else {
            panic!("a spacing refusal");
        };
        assert!(kept >= settled && kept < grown, "{kept:?}");
    }

    /// A vendor counting 3 a second with bare 429s, against a lane
    /// declared 10: a refusal at a gap it accepted before, on the lane's
    /// schedule, is a count, which the count learning reads. One at a gap
    /// under the lane's interval (a release whose lateness it forgave) may
    /// be jitter: the lane turns strict with a margin, and the next, soon
    /// after, is a count. A refusal that states a limit is a count at once.
    #[tokio::test(start_paused = true)]
    async fn a_refusal_at_an_accepted_gap_is_a_count() {
        let mut learned = Learned::default();
        let now = Instant::now();
        let refusal = Refusal {
            gap: ten().interval,
            before: 3,
            prior: now + ms(200),
            strict: false,
            silent: true,
            accepted: Some(ms(100)),
            cold: false,
        };
        assert_eq!(
            learned.refused(refusal, ten(), now + ms(300), now),
            Reading::Count
        );
        let mut forgiven = Learned::default();
        let sooner = Refusal {
            gap: ms(100),
            ..refusal
        };
        assert_eq!(
            forgiven.refused(sooner, ten(), now + ms(300), now),
            Reading::Spacing(Duration::from_micros(102_510)),
            "maybe jitter"
        );
        let again = Refusal {
            strict: true,
            prior: now + ms(1200),
            ..sooner
        };
        assert_eq!(
            forgiven.refused(again, ten(), now + ms(1300), now + ms(1300)),
            Reading::Count
        );
        let mut fresh = Learned::default();
        let stating = Refusal {
            silent: false,
            ..refusal
        };
        assert_eq!(
            fresh.refused(stating, ten(), now + ms(300), now),
            Reading::Count
        );
        assert_eq!(fresh.gap, None);
    }

    /// After a quiet spell the gap steps down; a refused step goes back and
    /// waits twice as long.
    #[tokio::test(start_paused = true)]
    async fn a_learned_gap_decays_and_a_refused_step_goes_back() {
        let declared = fifteen();
        let mut learned = Learned::default();
        let t0 = Instant::now();
        let refusal = Refusal {
            gap: ms(90),
            before: 1,
            prior: t0,
            strict: true,
            silent: true,
            accepted: None,
            cold: false,
        };
        let Reading::Spacing(gap) = learned.refused(refusal, declared, t0, t0) else {
            panic!("a spacing refusal");
        };
        assert_eq!(learned.decay(ms(67), t0 + Duration::from_secs(29)), None);
        let stepped = learned
            .decay(ms(67), t0 + Duration::from_secs(30))
            .expect("a step down after 30 windows");
        assert!(stepped < gap);
        let t1 = t0 + Duration::from_secs(31);
        let back = learned.refused(refusal, declared, t1, t1);
        assert_eq!(back, Reading::Spacing(gap), "the refused step goes back");
        assert_eq!(learned.decay(ms(67), t1 + Duration::from_secs(59)), None);
        assert!(
            learned
                .decay(ms(67), t1 + Duration::from_secs(60))
                .is_some()
        );
    }
}
