//! The declared request window a vendor's signal is read against
//! ([`Window`]), the ends a vendor wrote for its fixed window
//! ([`WindowEnds`]), and where a window that opens at the first request
//! opened.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::gate::Gate;
use crate::meters::{Rate, Releases};
use crate::time::later;

/// A gate's request window, as a vendor's signal is read against it.
pub(super) struct Window {
    pub(super) since: Instant,
    pub(super) length: Duration,
    pub(super) declared: Rate,
    /// The pace kept now: a learned quota, else the declared one.
    pub(super) kept: Rate,
    /// The declared bucket's capacity, if a token bucket counts requests.
    pub(super) bucket: Option<u64>,
}

impl Window {
    /// The declared request window of `gate` (stretched by its headroom)
    /// that ends with a request released at `released`, which a vendor's
    /// signal about it is read against, with `learned` the pace kept if
    /// the vendor taught one; `None` when no quota counts requests.
    pub(super) fn of(gate: &Gate, learned: Option<Rate>, released: Instant) -> Option<Self> {
        let requests = gate.requests();
        let declared = requests.rate?;
        let length = declared.per.saturating_add(gate.headroom());
        Some(Self {
            since: released.checked_sub(length).unwrap_or(released),
            length,
            declared,
            // A quota the vendor announced and the lane now keeps to counts
            // as declared.
            kept: learned.unwrap_or(declared),
            bucket: requests.bucket.map(std::num::NonZeroU64::get),
        })
    }

    /// The vendor's `limit` allows at least what the gate keeps to: as a
    /// count in the declared window, or, where the lane declared a token
    /// bucket, as the bucket's capacity. A vendor running a bucket says
    /// its capacity as its limit, whatever its refill (5 for a burst of 5
    /// at 10/s), and a declared bucket of that size already holds the lane
    /// to it; read as 5 a second, it would pause the lane after every
    /// burst and keep it to half the quota.
    pub(super) fn allows(&self, limit: u64) -> bool {
        self.bucket.is_some_and(|capacity| limit >= capacity)
            || self
                .declared_rate(limit)
                .is_none_or(|rate| rate.cmp_speed(&self.kept).is_ge())
    }

    /// `count` in the declared window, as a rate (`None`: more than any
    /// rate holds).
    pub(super) fn declared_rate(&self, count: u64) -> Option<Rate> {
        u32::try_from(count)
            .ok()
            .map(|count| Rate::new(count, self.declared.per))
    }
}

/// The ends a vendor wrote for its fixed window (GitHub's epoch second),
/// the step between the last two, and when the last one was first heard.
/// A reset read at a refusal may say anything from nothing to the window
/// plus its precision, wherever the window began; an end stays put through
/// its window, so the step to the next is the window itself, to the second.
/// A lane idle for a window sees a step of two, which looks like no
/// declared window and teaches nothing.
#[derive(Debug, Default)]
pub(super) struct WindowEnds {
    pub(super) last: Option<SystemTime>,
    pub(super) step: Option<Duration>,
    /// When the first answer that carried `last` came, if the end before
    /// it was heard too: that window was open by then.
    pub(super) opened: Option<Instant>,
}

impl WindowEnds {
    pub(super) fn saw(&mut self, end: SystemTime, at: Instant) {
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
    pub(super) fn steps_like(&self, length: Duration) -> bool {
        self.step
            .is_some_and(|step| step.abs_diff(length) <= slack(length))
    }

    /// When the window ending at `end` closes at the latest, by our clock:
    /// it was open when its first answer came, and lasts a step. (A step
    /// over an idle window is longer than the window: later, never early.)
    pub(super) fn closes(&self, end: SystemTime) -> Option<Instant> {
        if self.last != Some(end) {
            return None;
        }
        Some(later(self.opened?, self.step?))
    }
}

/// How far a vendor's window may be from the declared `length` and still
/// look like it: a tenth, at most a second.
pub(super) fn slack(length: Duration) -> Duration {
    (length / 10).min(Duration::from_secs(1))
}

/// `first`, if it is the lane's first release after a quiet `length` (or
/// ever): a window that opens at the first request (Flask-Limiter's,
/// express-rate-limit's) opened there.
pub(super) fn opened(
    releases: &Releases,
    first: Option<Instant>,
    length: Duration,
) -> Option<Instant> {
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
/// precision)` to its written end (the declared `length` carries the
/// headroom, which covers the request's way to the vendor). A window
/// twice the `declared` one (without the headroom) spans at least twice
/// that, which `length + precision` may pass by the headroom: 3 per 2 s
/// written to the second read as 3 per second when the second's rounding
/// added less than the headroom (5 ms of it: one run in two hundred), and
/// the lane paced into the vendor's next 429. So a span of twice the
/// declared window never reads as it.
pub(super) fn opened_like(
    opened: Instant,
    reset: Duration,
    precision: Duration,
    length: Duration,
    declared: Duration,
) -> bool {
    let span = later(Instant::now(), reset).saturating_duration_since(opened);
    span >= length / 4
        && span.saturating_sub(precision) < length
        && span < declared.saturating_mul(2)
}

#[cfg(test)]
mod tests {
    use super::*;

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
