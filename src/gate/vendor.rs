//! What a gate reads from the vendor against its own releases: the
//! quota a refusal teaches and its probe, spacing, a bucket's levels,
//! window ends, whether "0 left" is the lane's own spending, adaptive
//! pacing and the throttle streak.

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::cause::Spending;
use super::level::Gate;
use super::pace::{PROBE_QUIET, Pace, Probe};
use super::window::{Window, opened, opened_like, slack};
use crate::adaptive::Aimd;
use crate::meters::Rate;
use crate::spacing::{Declared, Reading};
use crate::sync::lock;
use crate::time::later;

impl Gate {
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

    /// A strict gate on a shared store was refused without a word (no
    /// limit, no hint): the gap to keep before the next send, on the first
    /// such refusal since a success; `None` after it, for the growing
    /// fallback. The fleet keeps the declared spacing within its headroom,
    /// so a lone bare refusal is the jitter between its instances and the
    /// vendor (a late send, a limiter's coarse clock: nginx stamps requests
    /// on a clock cached per event-loop turn), which no instance can read
    /// against the fleet's sends (it keeps no ledger of the others'). It
    /// costs one interval instead of the fallback's second. A vendor that
    /// refuses again before any success is counting, not spacing.
    pub(crate) fn fleet_spacing_refused(&self) -> Option<Duration> {
        let gap = self.spacing()?;
        (self.throttle_streak.fetch_add(1, Ordering::Relaxed) == 0).then_some(gap)
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
    pub(super) fn probe(&self, now: Instant) {
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
        if raised.cmp_speed(&declared).is_ge() {
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

    pub(super) fn adapt(&self, step: fn(&mut Aimd)) {
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
    pub(super) fn keep_to(&self, rate: Rate, probe: Option<Probe>, leak: Option<u64>) -> bool {
        let mut pace = lock(&self.pace);
        let Some(declared) = pace.declared else {
            return false;
        };
        if rate.cmp_speed(&declared).is_ge() || pace.learned == Some(rate) {
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
        if limit.is_some() && self.counted_limit(limit, released).is_none() {
            // A burst's size says nothing of the vendor's count.
            return None;
        }
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
        let (first, gap, opened) = {
            let meters = lock(&self.meters);
            let releases = meters.releases()?;
            let first = releases.between(since, released).1;
            let opened = opened(releases, first, window.length);
            let gap = releases.longest_gap(since, released);
            (first, gap, opened)
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
        let count = match limit {
            Some(limit) => limit,
            None => self.accepted(since, released)?,
        };
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

    /// A vendor's stated request `limit`, if it can count requests over
    /// the window that ends with the request released at `released`:
    /// `None` when the vendor accepted more of the lane's own releases in
    /// that window (those before it, less those it refused for their
    /// spacing). A GCRA states the requests it lets through at once, its
    /// burst plus one (redis-cell's `CL.THROTTLE` and the `throttled`
    /// library's `X-RateLimit-Limit`: 1 for a tolerance under one
    /// interval), not a count; read as a count over the window, a lane at
    /// 100/s learned 1/s. A limit of one is that too, whatever the lane
    /// sent: the GCRA refuses a lane's second request, before any count
    /// could show, and "one per window" and "one at a time" read alike;
    /// taken for spacing, a real count of one costs a refusal per quarter
    /// the gap grows, taken for a count, a GCRA at 10/s costs 90 % of
    /// its quota until the probe climbs back. Without a ledger (a fleet
    /// lane), a larger limit stands.
    pub(crate) fn counted_limit(&self, limit: Option<u64>, released: Instant) -> Option<u64> {
        let limit = limit.filter(|&limit| limit > 1)?;
        let accepted = self
            .window(released)
            .and_then(|window| self.accepted(window.since, released));
        accepted
            .is_none_or(|accepted| accepted <= limit)
            .then_some(limit)
    }

    /// Of the gate's releases from `since` up to `until`, those the vendor
    /// accepted as far as the gate knows: all but the ones it refused for
    /// their spacing. `None` without a ledger.
    fn accepted(&self, since: Instant, until: Instant) -> Option<u64> {
        let released = lock(&self.meters).releases()?.between(since, until).0;
        let refused = lock(&self.spacing).refused_between(since, until);
        Some(released.saturating_sub(refused))
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

    /// A learned spacing steps down after a quiet spell (see [`Learned`]).
    pub(super) fn decay(&self, now: Instant) {
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
        // A stated limit that counts nothing (a GCRA's burst) says no more
        // of the vendor's quota than none, whatever hint came with it.
        let stated = limit.is_some();
        let limit = self.counted_limit(limit, released);
        let silent = silent || (stated && limit.is_none());
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
            Spending::Own => lock(&self.meters)
                .releases()
                .is_some_and(|releases| opened(releases, Some(released), window.length).is_some()),
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
    pub(super) fn window(&self, released: Instant) -> Option<Window> {
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

    pub(crate) fn learned(&self) -> Option<Rate> {
        lock(&self.pace).learned
    }

    /// Keep requests apart by the slowest of the learned quota, adaptive
    /// pacing's share of the request rate and, while a bucket's levels are
    /// unread, the declared rate without bursts; none: as declared. A
    /// learned leak instead refills the vendor's bucket in the meters. Never
    /// further apart than `max_pause`: a vendor announcing one request a
    /// day must not hold every request for a day.
    pub(super) fn repace(&self, pace: &Pace) {
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
}
