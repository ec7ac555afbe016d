//! The vendor gate's pace: what it keeps to besides its declared quotas
//! (a learned quota and its probe, adaptive pacing, a bucket's leak), as
//! plain state, and the arithmetic of each step.

use std::time::Duration;

use tokio::time::Instant;

use crate::adaptive::Aimd;
use crate::meters::Rate;
use crate::time::later;

/// What slows the vendor's gate below its quotas.
#[derive(Default)]
pub(super) struct Pace {
    /// A lower quota the vendor announced, or a refusal taught.
    pub(super) learned: Option<Rate>,
    /// Adaptive pacing's share of the request rate.
    pub(super) aimd: Option<Aimd>,
    /// When the last refused request had been released: releases before
    /// it were not all accepted.
    pub(super) refused_at: Option<Instant>,
    /// How a quota learned from a refusal is probed back up.
    pub(super) probe: Option<Probe>,
    /// The capacity of the vendor's bucket, when `learned` is its rate (a
    /// leak read off its levels, or a quota a bucket vendor taught by a
    /// refusal): then the lane may use the room the vendor reports, and
    /// the learned rate refills it (`Meters::set_leak`) rather than
    /// spacing every request.
    pub(super) leak: Option<u64>,
    /// A bucket that does not say its rate refused the lane, and its levels
    /// have not shown the rate yet: the lane keeps to its declared rate
    /// without bursts, so the bucket neither fills at once (another
    /// refusal) nor runs empty, and its levels show what leaks.
    pub(super) unread: bool,
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
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Probe {
    /// When the pace next rises.
    pub(super) at: Instant,
    pub(super) quiet: Duration,
    /// The quota the refusal taught, which a refused probe returns to.
    pub(super) base: Rate,
    /// True once the pace rose above `base`.
    pub(super) raised: bool,
}

/// Declared windows without a refusal before a learned quota is probed.
pub(super) const PROBE_QUIET: u32 = 30;

impl Probe {
    /// The probe of `rate`, taught by a refusal now under `declared`.
    pub(super) fn of(rate: Rate, declared: Rate, now: Instant) -> Self {
        let quiet = declared.per.saturating_mul(PROBE_QUIET);
        Self {
            at: later(now, quiet),
            quiet,
            base: rate,
            raised: false,
        }
    }
}

/// The intervals a [`Pace`] asks of the meters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Intervals {
    /// Keep every request this far apart.
    pub(super) spacing: Option<Duration>,
    /// A vendor bucket of this capacity, refilled one unit per interval.
    pub(super) leak: Option<(u64, Duration)>,
}

impl Pace {
    /// Raise a learned quota a step once its probe is due at `now` (see
    /// [`Probe`]), towards `declared`. `None`: nothing to probe any more;
    /// else whether the pace changed.
    pub(super) fn probe(&mut self, now: Instant, declared: Option<Rate>) -> Option<bool> {
        let (Some(probe), Some(learned), Some(declared)) = (self.probe, self.learned, declared)
        else {
            return None;
        };
        if now < probe.at {
            return Some(false);
        }
        let step = (learned.count / 20).max(1);
        let raised = Rate::new(learned.count.saturating_add(step), learned.per);
        if raised.cmp_speed(&declared).is_ge() {
            self.learned = None;
            self.probe = None;
        } else {
            self.learned = Some(raised);
            self.probe = Some(Probe {
                at: later(now, declared.per),
                raised: true,
                ..probe
            });
        }
        Some(true)
    }

    /// A refusal came while the probe was raised past what the vendor
    /// allows: back to what the refusal taught, and twice as long before
    /// trying again. False when no probe was raised.
    pub(super) fn probe_refused(&mut self, now: Instant) -> bool {
        let Some(probe) = self.probe.filter(|p| p.raised) else {
            return false;
        };
        let quiet = probe.quiet.saturating_mul(2);
        self.learned = Some(probe.base);
        self.probe = Some(Probe {
            at: later(now, quiet),
            quiet,
            raised: false,
            ..probe
        });
        true
    }

    /// Keep to `rate` from now on, probed back up as `probe` says; `leak`:
    /// the rate is that of a vendor's bucket of this capacity. Never at or
    /// above `declared`: the user's declaration is the ceiling. True when
    /// the pace changed.
    pub(super) fn keep_to(
        &mut self,
        rate: Rate,
        declared: Option<Rate>,
        probe: Option<Probe>,
        leak: Option<u64>,
    ) -> bool {
        let Some(declared) = declared else {
            return false;
        };
        if rate.cmp_speed(&declared).is_ge() || self.learned == Some(rate) {
            return false;
        }
        self.learned = Some(rate);
        self.probe = probe;
        self.leak = leak;
        true
    }

    /// What the meters keep to: requests apart by the slowest of the
    /// learned quota, adaptive pacing's share of the `declared` rate and,
    /// while a bucket's levels are unread, the declared rate without
    /// bursts; none: as declared. A learned leak instead refills the
    /// vendor's bucket. Never further apart than `max_pause`: a vendor
    /// announcing one request a day must not hold every request for a day.
    pub(super) fn intervals(
        &self,
        declared: Option<Rate>,
        headroom: Duration,
        max_pause: Duration,
    ) -> Intervals {
        let learned = self.learned.map(|rate| rate.interval(headroom));
        // A bucket's leak refills the room the vendor reports; any other
        // learned quota spaces every request.
        let (learned, leak) = match self.leak {
            Some(capacity) => (None, learned.map(|interval| (capacity, interval))),
            None => (learned, None),
        };
        let adaptive = self.aimd.as_ref().and_then(|aimd| {
            let nominal = declared?.interval(headroom);
            let stretched = nominal.as_secs_f64() / aimd.share();
            (aimd.share() < 1.0)
                .then(|| Duration::try_from_secs_f64(stretched).unwrap_or(max_pause))
        });
        let unread = declared
            .filter(|_| self.unread)
            .map(|rate| rate.interval(headroom));
        let spacing = learned.max(adaptive).max(unread).map(|i| i.min(max_pause));
        Intervals { spacing, leak }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn per_second(count: u32) -> Rate {
        Rate::new(count, SECOND)
    }

    /// A learned quota waits its quiet spell, then rises a twentieth (at
    /// least one) per declared window up to the declared quota, where
    /// probing ends; a refusal while raised goes back to the base and
    /// doubles the quiet spell.
    #[test]
    fn a_learned_quota_is_probed_up_and_a_refused_probe_waits_twice_as_long() {
        let (declared, now) = (per_second(10), Instant::now());
        let mut pace = Pace::default();
        let probe = Probe::of(per_second(8), declared, now);
        assert!(pace.keep_to(per_second(8), Some(declared), Some(probe), None));
        assert!(
            !pace.keep_to(per_second(8), Some(declared), None, None),
            "no news"
        );
        assert_eq!(pace.probe(now + 29 * SECOND, Some(declared)), Some(false));
        assert_eq!(pace.probe(now + 30 * SECOND, Some(declared)), Some(true));
        assert_eq!(pace.learned, Some(per_second(9)));
        assert_eq!(pace.probe(now + 30 * SECOND, Some(declared)), Some(false));
        assert!(pace.probe_refused(now + 31 * SECOND));
        assert_eq!(pace.learned, Some(per_second(8)), "back to the base");
        let again = pace.probe.map(|p| (p.at, p.quiet, p.raised));
        assert_eq!(again, Some((now + 91 * SECOND, 60 * SECOND, false)));
        assert!(!pace.probe_refused(now + 32 * SECOND), "not raised");
        assert_eq!(pace.probe(now + 91 * SECOND, Some(declared)), Some(true));
        assert_eq!(pace.probe(now + 92 * SECOND, Some(declared)), Some(true));
        assert_eq!((pace.learned, pace.probe), (None, None), "declared again");
        assert_eq!(pace.probe(now + 93 * SECOND, Some(declared)), None);
    }

    /// The declared quota is the ceiling: a faster or equal rate teaches
    /// nothing, and without a request quota nothing is learned.
    #[test]
    fn nothing_faster_than_declared_is_kept() {
        let mut pace = Pace::default();
        let declared = Some(per_second(10));
        assert!(!pace.keep_to(per_second(10), declared, None, None));
        assert!(!pace.keep_to(per_second(11), declared, None, None));
        assert!(!pace.keep_to(per_second(1), None, None, None));
        assert_eq!(pace.learned, None);
    }

    /// The slowest of what slows the gate spaces it, capped at
    /// `max_pause`; a leak refills a bucket instead of spacing.
    #[test]
    fn the_slowest_reason_spaces_requests_up_to_max_pause() {
        let (declared, max_pause) = (Some(per_second(10)), 120 * SECOND);
        let mut pace = Pace::default();
        let none = Intervals {
            spacing: None,
            leak: None,
        };
        assert_eq!(pace.intervals(declared, Duration::ZERO, max_pause), none);
        pace.unread = true;
        let spaced = pace.intervals(declared, Duration::ZERO, max_pause).spacing;
        assert_eq!(spaced, Some(SECOND / 10));
        pace.learned = Some(per_second(4));
        let spaced = pace.intervals(declared, Duration::ZERO, max_pause).spacing;
        assert_eq!(spaced, Some(SECOND / 4), "the slower");
        pace.learned = Some(Rate::new(1, 86_400 * SECOND));
        let spaced = pace.intervals(declared, Duration::ZERO, max_pause).spacing;
        assert_eq!(spaced, Some(max_pause), "a day a request, capped");
        pace.unread = false;
        pace.learned = Some(per_second(4));
        pace.leak = Some(40);
        let leak = Intervals {
            spacing: None,
            leak: Some((40, SECOND / 4)),
        };
        assert_eq!(pace.intervals(declared, Duration::ZERO, max_pause), leak);
    }
}
