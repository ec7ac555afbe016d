//! What the vendor last reported of its own state, as plain state: the
//! ends of its fixed window, what its bucket had left, and whether its
//! "nothing left" is burst room.

use std::time::Duration;

use tokio::time::Instant;

use super::window::WindowEnds;
use crate::meters::Rate;

#[derive(Default)]
pub(super) struct Report {
    /// The ends of the vendor's fixed window, as it wrote them.
    pub(super) ends: WindowEnds,
    /// What the vendor's bucket last said it had left, and when the request
    /// it counted last had been released (for a lane on a shared store,
    /// whose bursts keep within it).
    pub(super) left: Option<(u64, Instant)>,
    /// The vendor's "remaining" is its burst room, not what is left of a
    /// window (see `VendorModel::burst_room`).
    pub(super) burst_room: bool,
}

impl Report {
    /// The vendor's bucket said it has `remaining` left, counting the
    /// request released at `released`. A later report wins; one about an
    /// earlier request (an answer that overtook another) does not.
    pub(super) fn said_left(&mut self, remaining: u64, released: Instant) {
        if self.left.is_none_or(|(_, counted)| counted <= released) {
            self.left = Some((remaining, released));
        }
    }

    /// What the vendor's bucket has left at `now` by what it last said,
    /// plus what `rate` refills since, and when the request that answer
    /// counted had been released. The vendor's bucket refills too: a word
    /// from before a quiet spell must not hold a burst after it.
    pub(super) fn left(&self, now: Instant, rate: Rate) -> Option<(u64, Instant)> {
        let (left, counted) = self.left?;
        let since = now.saturating_duration_since(counted).as_nanos();
        let per = rate.per.max(Duration::from_nanos(1)).as_nanos();
        let refilled = since.saturating_mul(u128::from(rate.count)) / per;
        let refilled = u64::try_from(refilled).unwrap_or(u64::MAX);
        Some((left.saturating_add(refilled), counted))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a vendor's bucket has left: its latest word (not one about an
    /// earlier request), plus what the pace refilled since, saturating.
    #[test]
    fn what_the_vendor_said_is_left_refills_at_the_pace() {
        let rate = Rate::new(10, Duration::from_secs(1));
        let t0 = Instant::now();
        let mut report = Report::default();
        assert_eq!(report.left(t0, rate), None);
        report.said_left(3, t0);
        report.said_left(7, t0 - Duration::from_millis(1));
        assert_eq!(report.left(t0, rate), Some((3, t0)), "an older word loses");
        let later = t0 + Duration::from_millis(250);
        assert_eq!(report.left(later, rate), Some((5, t0)), "2.5 refilled");
        let quiet = t0 + Duration::from_secs(3_600);
        assert_eq!(report.left(quiet, rate), Some((36_003, t0)));
        let flood = Rate::new(u32::MAX, Duration::from_nanos(1));
        let far = t0 + Duration::from_secs(u32::MAX.into());
        assert_eq!(report.left(far, flood), Some((u64::MAX, t0)));
    }
}
