//! What a refusal teaches the vendor's model: a quota the vendor really
//! allows (a count over its window), a spacing (nginx's `limit_req`), or
//! nothing (a burst's size, a window longer than declared).

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::model::VendorModel;
use super::pace::Probe;
use super::window::{opened, opened_like, slack};
use crate::meters::Rate;
use crate::spacing::{Declared, Reading};
use crate::sync::lock;
use crate::time::later;

impl VendorModel {
    /// The vendor refused a request the gate released at `released` (a
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
        // "Nothing left" read as burst room let this request go.
        let steps_like = {
            let mut report = lock(&self.report);
            report.burst_room = false;
            report.ends.steps_like(window.length)
        };
        let previous = {
            let mut pace = lock(&self.pace);
            let previous = pace.refused_at;
            pace.refused_at = Some(previous.map_or(released, |p| p.max(released)));
            if pace.probe_refused(Instant::now()) {
                // The probe went past what the vendor allows.
                self.repace(&pace);
                return None;
            }
            previous
        };
        if let Some(previous) = previous {
            // Releases before the previous refusal were not all accepted.
            since = since.max(later(previous, Duration::from_nanos(1)));
        }
        let (first, gap, opened) = {
            let meters = self.gate.meters();
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
        let busy = gap <= window.kept.interval(self.gate.headroom()).saturating_mul(2);
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
                        || opened.is_some_and(|opened| {
                            opened_like(opened, reset, precision, length, window.declared.per)
                        })
                }
                None => released.saturating_duration_since(first?) >= length / 4,
            };
        if !looks_declared {
            return None;
        }
        let rate = window.declared_rate(count)?;
        let probe = Probe::of(rate, window.declared, Instant::now());
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
    /// accepted as far as the model knows: all but the ones it refused for
    /// their spacing. `None` without a ledger.
    fn accepted(&self, since: Instant, until: Instant) -> Option<u64> {
        let released = self.gate.meters().releases()?.between(since, until).0;
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
            let meters = self.gate.meters();
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

    /// The vendor refused the request released at `released`, saying its
    /// limit is `limit` if it did (`silent`: it said nothing at all): read
    /// against the ledger, is it the lane's spacing (see [`Learned`])? The
    /// gap kept from now on, if so. Only for quotas that never burst: a
    /// burst's gaps say nothing of the vendor's spacing.
    ///
    /// [`Learned`]: crate::spacing::Learned
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
        let mut meters = self.gate.meters();
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
        let declared = Declared::new(kept, self.gate.headroom());
        match learned.refused(refusal, declared, released, Instant::now()) {
            Reading::Count => None,
            Reading::Retracted => {
                meters.set_spacing(None);
                self.decaying.store(false, Ordering::Relaxed);
                None
            }
            Reading::Spacing(gap) => {
                let gap = gap.min(self.gate.max_pause());
                meters.set_spacing(Some(gap));
                self.decaying
                    .store(learned.decays(declared.interval), Ordering::Relaxed);
                Some(gap)
            }
        }
    }

    /// A refusal read as spacing that also said when to come back: true
    /// when the vendor refused before, with no success since (the streak a
    /// success resets), counted.
    pub(crate) fn refused_again(&self) -> bool {
        self.throttle_streak.fetch_add(1, Ordering::Relaxed) > 0
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
    /// refuses again before any success is counting, not spacing: the
    /// fallback's, which starts where it would have without the jitter's
    /// reading (the streak leaves it out).
    pub(crate) fn fleet_spacing_refused(&self) -> Option<Duration> {
        let gap = self.gate.spacing()?;
        let lone = self.throttle_streak.load(Ordering::Relaxed) == 0
            && !self.fleet_jitter.swap(true, Ordering::Relaxed);
        lone.then_some(gap)
    }
}
