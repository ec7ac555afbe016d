//! When a strict lane's last request went, and got there ([`Departures`]).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

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
/// the last departure on by the difference, over RFC 6298's smoothed
/// round trip. The departure moves no later than the answer less the
/// usual round trip: a send never waits more than a gap past any answer,
/// and a vendor that usually takes longer than the gap to answer never
/// moves one. An answer that comes after the next send was released is
/// too late for it.
///
/// Only the excess over the smoothed round trip *and its mean deviation*
/// used to count, so that the ordinary spread cost nothing. But a delay
/// within the deviation still lands the request late, and a busy
/// machine's deviation is wide: with both cores kept busy, a lane at a
/// real nginx's `100r/s` met 2–7 refusals in 1,000 sends (4.2 on average)
/// and kept 66–90 % of the quota (83 %), its gap grown up to 14.7 ms by
/// refusals that followed a slow answer; counting every excess, 1–3
/// refusals (1.7) and 78–92 % (88 %), its gap 10.6–11.1 ms (13 runs each,
/// taken in turns). On a quiet machine both met one refusal and kept
/// 94 %.
///
/// The price is paid where a slow answer was slow on its way back, the
/// vendor having seen the request on time: the next send then waits for
/// nothing. Answers coming back 30–70 ms after a vendor at 10/s saw each
/// request cost a strict lane 94.2 % of its quota, 97.6 % counting only
/// the excess over the deviation as well. A strict lane is one whose
/// vendor measures spacing, by its own declaration or a refusal: there a
/// send held back costs less than one refused.
#[derive(Debug, Default)]
pub(crate) struct Departures {
    last: AtomicStamp,
    in_transit: AtomicU32,
    /// The smoothed round trip, in nanoseconds (RFC 6298's `SRTT`); 0:
    /// none yet.
    round_trip: AtomicU64,
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
    /// trip past the usual (the smoothed one) moves the last departure on
    /// by the excess (see the type's docs).
    pub(crate) fn answered(&self, went: Instant, at: Instant) {
        let took = nanos(at.saturating_duration_since(went)).max(1);
        let usual = self.round_trip.load(Ordering::Acquire);
        if usual == 0 {
            self.round_trip.store(took, Ordering::Release);
            return;
        }
        let excess = took.saturating_sub(usual);
        if excess > 0 {
            self.last.raise(later(went, Duration::from_nanos(excess)));
        }
        // RFC 6298's gain of an eighth. Two answers at once may each store
        // theirs: an estimate either way.
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
