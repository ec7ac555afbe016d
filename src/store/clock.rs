//! How the store's time (us) and this instance's clock map onto each
//! other.
//!
//! Each reply was computed at a store time `now` somewhere between its send
//! and its receipt, so the true offset between the clocks lies between
//! `send − now` and `receipt − now`: mapped by the upper bound, a slot is
//! never due before the store reserved it. The least upper bound of the
//! replies of the last [`FRESH`] is the closest. Any one reply may be slow
//! to come back (the first opens connections and loads scripts; a busy
//! instance polls its reply late, by ten milliseconds and more on a loaded
//! machine), and a lane paced by its quota sees few replies, so the span
//! holds many: mapped by one reply, two instances' slots fell as much as a
//! slow reply apart, and a fleet of three met 11–27 refusals in 90 from a
//! spacing limiter. A slot mapped late arrives late instead, and one late
//! by more than the lane forgives is dropped (see
//! `lane/release/reserved.rs`).
//!
//! Clocks move: they drift, an NTP step or a failover to another host
//! steps the store's. A reply whose lower bound (`send − now`) is already
//! above the least offset shows that offset is stale, and the span starts
//! over from that reply, so a step maps no slot early by more than a
//! round trip.
//!
//! A slot used late closes its gap to the slots after it. The **floor**
//! bounds that. A used slot `k` (released at `L_k`, reserved at store time
//! `t_k`) keeps every later slot at `L ≥ t + (L_k − t_k) − late` for a
//! window, so the vendor sees the pair no closer than the store reserved
//! them, less `late`: as if slot `k` had been late by `late`, which the
//! meters already forgive. The floor remembers the highest such bound per
//! window of store time, for one to two windows, in constant space.

use std::time::Duration;

use tokio::time::Instant;

use crate::time::{later, micros};

/// How far back (store time) a reply's offset still counts: replies that
/// close in time see the same clocks, and the drift of two clocks over it
/// is a few microseconds.
const FRESH: i64 = 2_000_000;

#[derive(Debug, Clone, Copy)]
pub(super) struct StoreClock {
    /// Local instants are kept as microseconds since this one.
    base: Instant,
    /// The latest reply's send, and the store's time then: a local instant
    /// maps to a store time no later than it was (settling looks for the
    /// nearest charge anyway).
    sent: Option<(Instant, i64)>,
    /// Each recent reply's receipt less its store time (us): the least
    /// counts.
    offsets: Epochs,
    floor: Epochs,
}

impl StoreClock {
    /// A clock that remembers used slots for `keep` (the gates' longest
    /// window) of store time.
    pub(super) fn new(keep: Duration) -> Self {
        Self {
            base: Instant::now(),
            sent: None,
            offsets: Epochs::new(FRESH, i64::min),
            floor: Epochs::new(micros(keep).max(1), i64::max),
        }
    }

    /// A reply computed at store time `now` was sent at `sent` and came
    /// back at `received`. When even its send comes after the least offset
    /// (the clocks moved apart since that was seen), that offset no longer
    /// bounds them, and this reply starts the span over.
    pub(super) fn reply(&mut self, sent: Instant, received: Instant, now: i64) {
        let lower = self.local(sent).saturating_sub(now);
        if self.offsets.at(now).is_some_and(|least| least < lower) {
            self.offsets = Epochs::new(FRESH, i64::min);
        }
        self.sent = Some((sent, now));
        self.offsets
            .note(now, self.local(received).saturating_sub(now));
    }

    /// A slot reserved at store time `t` was used at `at`; the lateness the
    /// meters forgive is `late`.
    pub(super) fn used(&mut self, at: Instant, t: i64, late: Duration) {
        let bound = self
            .local(at)
            .saturating_sub(t)
            .saturating_sub(micros(late));
        self.floor.note(t, bound);
    }

    /// The store time of local instant `at`.
    pub(super) fn store_time(&self, at: Instant) -> Option<i64> {
        let (local, store) = self.sent?;
        Some(store.saturating_add(self.local(at).saturating_sub(self.local(local))))
    }

    /// When store time `t` comes on this instance's clock: by the closest
    /// recent offset, and no closer to a slot used in the last window than
    /// the floor allows.
    pub(super) fn local_time(&self, t: i64) -> Option<Instant> {
        // The least offset of the replies fresh when the latest came.
        let (_, latest) = self.sent?;
        let offset = self.offsets.at(latest)?;
        let offset = self.floor.at(t).map_or(offset, |floor| offset.max(floor));
        let after = u64::try_from(t.saturating_add(offset)).unwrap_or(0);
        Some(later(self.base, Duration::from_micros(after)))
    }

    /// Microseconds from `base` to `at`, negative before it.
    fn local(&self, at: Instant) -> i64 {
        if at >= self.base {
            micros(at - self.base)
        } else {
            -micros(self.base - at)
        }
    }
}

/// The extreme (`pick`: the least or the highest) of the values noted in
/// each span of store time, for the current span and the one before: a
/// value noted at `t` counts at least until `t + span`, at most until
/// `t + 2·span`.
#[derive(Debug, Clone, Copy)]
struct Epochs {
    span: i64,
    pick: fn(i64, i64) -> i64,
    /// Where the current span starts (store time).
    start: i64,
    current: Option<i64>,
    previous: Option<i64>,
}

impl Epochs {
    fn new(span: i64, pick: fn(i64, i64) -> i64) -> Self {
        Self {
            span,
            pick,
            start: i64::MIN,
            current: None,
            previous: None,
        }
    }

    fn note(&mut self, t: i64, value: i64) {
        let elapsed = t.saturating_sub(self.start);
        if elapsed >= self.span {
            self.previous = if elapsed >= self.span.saturating_mul(2) {
                None
            } else {
                self.current
            };
            self.current = None;
            self.start = t;
        }
        self.current = Some(self.current.map_or(value, |c| (self.pick)(c, value)));
    }

    /// What counts at store time `t`.
    fn at(&self, t: i64) -> Option<i64> {
        let elapsed = t.saturating_sub(self.start);
        if elapsed >= self.span.saturating_mul(2) {
            None
        } else if elapsed >= self.span {
            self.current
        } else {
            match (self.current, self.previous) {
                (Some(a), Some(b)) => Some((self.pick)(a, b)),
                (a, b) => a.or(b),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const LATE: Duration = Duration::from_millis(2);

    #[tokio::test(start_paused = true)]
    async fn a_lone_reply_maps_its_slots_by_its_receipt() {
        let mut clock = StoreClock::new(Duration::from_secs(1));
        let t0 = Instant::now();
        clock.reply(t0, t0 + 80 * MS, 1_000_000);
        assert_eq!(clock.local_time(1_000_000), Some(t0 + 80 * MS));
        assert_eq!(clock.local_time(1_050_000), Some(t0 + 130 * MS));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fast_reply_keeps_its_gap_to_a_used_slow_slot_less_the_lateness_forgiven() {
        let mut clock = StoreClock::new(Duration::from_secs(1));
        let t0 = Instant::now();
        // A slow first reply: computed at store time 1_000_000 us, received
        // 80 ms after it was sent; its slot goes when it arrives.
        clock.reply(t0, t0 + 80 * MS, 1_000_000);
        let first = clock.local_time(1_000_000).unwrap();
        clock.used(first, 1_000_000, LATE);
        // A fast reply sent 100 ms in, computed at 1_096_000: by its own
        // receipt its slot at 1_100_000 would go at 105 ms, 25 ms after the
        // first where the store reserved 100 ms between them.
        clock.reply(t0 + 100 * MS, t0 + 101 * MS, 1_096_000);
        let second = clock.local_time(1_100_000).unwrap();
        assert_eq!(second - first, 100 * MS - LATE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reply_slow_to_come_back_maps_its_slots_by_a_recent_fast_one() {
        let mut clock = StoreClock::new(Duration::from_secs(1));
        let t0 = Instant::now();
        clock.reply(t0, t0 + MS, 1_000_000);
        // Computed 10 ms later, but back only 6 ms after that: its slot is
        // due when the store's time says, 4 ms before it arrived.
        clock.reply(t0 + 10 * MS, t0 + 17 * MS, 1_010_000);
        assert_eq!(clock.local_time(1_012_000), Some(t0 + 13 * MS));
        // A slower reply 300 ms on changes nothing: the fast one still
        // bounds the clocks.
        clock.reply(t0 + 300 * MS, t0 + 305 * MS, 1_300_000);
        assert_eq!(clock.local_time(1_300_000), Some(t0 + 301 * MS));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reply_delays_the_lane_for_a_window_at_most() {
        let keep = Duration::from_secs(1);
        let mut clock = StoreClock::new(keep);
        let t0 = Instant::now();
        clock.reply(t0, t0 + 80 * MS, 0);
        clock.used(t0 + 80 * MS, 0, LATE);
        // Two windows of store time later, only the fast reply counts.
        clock.reply(t0 + 2000 * MS, t0 + 2001 * MS, 2_000_000);
        assert_eq!(clock.local_time(2_000_000), Some(t0 + 2001 * MS));
    }

    #[tokio::test(start_paused = true)]
    async fn the_lane_follows_a_store_clock_that_drifts() {
        // The store's clock gains 1 ms every second on ours (1,000 ppm,
        // twice what NTP slews at most): the lane's slots stay within a
        // millisecond of their replies, where a mapping pinned to the first
        // reply would lag 10 ms after 10 s.
        let keep = Duration::from_secs(1);
        let mut clock = StoreClock::new(keep);
        let t0 = Instant::now();
        for second in 0..=10_i64 {
            let local = t0 + Duration::from_secs(second as u64);
            let store = second * 1_001_000;
            clock.reply(local, local + MS, store);
            let slot = clock.local_time(store).unwrap();
            clock.used(slot, store, LATE);
            assert!(slot - (local + MS) <= MS, "{second}: {:?}", slot - local);
        }
    }

    /// Among replies at a few a second, one polled late (10 ms) maps
    /// nothing by its receipt: the fast ones of the last seconds bound the
    /// clocks closer.
    #[tokio::test(start_paused = true)]
    async fn a_late_reply_among_fast_ones_of_the_last_seconds_maps_nothing_late() {
        let mut clock = StoreClock::new(Duration::from_secs(1));
        let t0 = Instant::now();
        clock.reply(t0, t0 + MS, 1_000_000);
        // 700 ms later (store time too), back 10 ms late.
        clock.reply(t0 + 700 * MS, t0 + 711 * MS, 1_700_500);
        assert_eq!(clock.local_time(1_800_000), Some(t0 + 801 * MS));
    }

    /// The store's clock steps back 50 ms (a failover to a host behind):
    /// the offset seen before would map every slot 50 ms early; the first
    /// reply after the step shows it stale and maps by itself.
    #[tokio::test(start_paused = true)]
    async fn a_store_clock_that_steps_back_maps_no_slot_early() {
        let mut clock = StoreClock::new(Duration::from_secs(1));
        let t0 = Instant::now();
        clock.reply(t0, t0 + MS, 1_000_000);
        // 500 ms later on our clock, the store reads 450 ms later.
        clock.reply(t0 + 500 * MS, t0 + 502 * MS, 1_450_500);
        assert_eq!(clock.local_time(1_550_000), Some(t0 + 601 * MS + MS / 2));
    }

    #[tokio::test(start_paused = true)]
    async fn settling_maps_a_local_instant_by_the_latest_send() {
        let mut clock = StoreClock::new(Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(clock.store_time(t0), None);
        clock.reply(t0 + 10 * MS, t0 + 60 * MS, 1_010_000);
        assert_eq!(clock.store_time(t0 + 20 * MS), Some(1_020_000));
        assert_eq!(clock.store_time(t0), Some(1_000_000));
    }

    #[tokio::test(start_paused = true)]
    async fn hostile_store_times_saturate() {
        let mut clock = StoreClock::new(Duration::MAX);
        let t0 = Instant::now();
        clock.reply(t0, t0, i64::MIN);
        assert!(clock.local_time(i64::MAX).unwrap() > t0);
        clock.used(t0, i64::MAX, Duration::MAX);
        clock.reply(t0, t0, i64::MAX);
        assert_eq!(clock.local_time(i64::MIN), Some(t0));
        clock.used(t0 + MS, i64::MIN, LATE);
        assert!(clock.local_time(0).is_some());
        assert!(clock.store_time(t0 + MS).is_some());
        let mut zero = StoreClock::new(Duration::ZERO);
        zero.reply(t0, t0, 5);
        zero.used(t0, 5, LATE);
        assert!(zero.local_time(5).is_some());
    }
}
