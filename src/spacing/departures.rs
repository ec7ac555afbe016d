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
/// the last departure on by the difference: RFC 6298's smoothed round
/// trip and its mean deviation say what is usual, and only the excess
/// over both counts, so the ordinary spread costs nothing. The departure
/// moves no later than the answer less the usual round trip: a send never
/// waits more than a gap past any answer, and a vendor that usually takes
/// longer than the gap to answer never moves one. An answer that comes
/// after the next send was released is too late for it.
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
        let deviation = (deviation - deviation / 4).saturating_add(took.abs_diff(usual) / 4);
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
