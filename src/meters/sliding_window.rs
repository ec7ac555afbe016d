//! The sliding window counter: near-exact, two numbers of state.

use std::time::Duration;

use tokio::time::Instant;

use super::meter::Meter;
use super::rate::Rate;
use super::windows::Windows;
use crate::time::later;

/// The previous and current fixed windows, weighted: the estimate at `t` is
/// `previous × (1 − elapsed/per') + current`, and a request goes when the
/// estimate plus its cost fits in `count` (`per' = per + headroom`).
///
/// # The arithmetic
///
/// When the estimate is too high, the wait is solved for directly: with
/// `p` and `c` the two counts and `cost` the request, the current window
/// must be `1 − (count − c − cost) / p` elapsed; if `c + cost` alone is too
/// much, the same holds in the next window with `p = c`, `c = 0`.
///
/// # The guarantee
///
/// Near-exact and cheap, but an estimate: it assumes the previous window's
/// traffic was spread evenly. Under a steady backlog (the lane's usual
/// state) it never exceeds a strict sliding window of `per`; if the previous
/// window's requests were bunched at its end, a strict vendor can see up to
/// about `2 × count` in the worst case. Use [`SlidingLog`](super::SlidingLog)
/// when the vendor is strict and the traffic bursty.
#[derive(Debug, Clone)]
pub struct SlidingWindow {
    count: u64,
    windows: Windows,
    /// `(index of the current window, previous count, current count)`.
    state: (u64, u64, u64),
}

impl SlidingWindow {
    /// `rate.count` per window of `rate.per + headroom`, from `origin`.
    pub fn new(rate: Rate, headroom: Duration, origin: Instant) -> Self {
        Self {
            count: u64::from(rate.count),
            windows: Windows::new(origin, rate.per.saturating_add(headroom)),
            state: (0, 0, 0),
        }
    }

    fn index(&self, at: Instant) -> u64 {
        self.windows.index(at)
    }

    fn start(&self, index: u64) -> Instant {
        self.windows.start(index)
    }

    /// The (previous, current) counts as seen from window `index`.
    fn counts(&self, index: u64) -> (u64, u64) {
        let (at, previous, current) = self.state;
        match index.checked_sub(at) {
            Some(0) => (previous, current),
            Some(1) => (current, 0),
            _ => (0, 0),
        }
    }

    /// The first instant in window `index` at which `previous` weighs
    /// little enough for `room` more units.
    fn when_fits(&self, index: u64, previous: u64, room: u64) -> Instant {
        if previous == 0 || room >= previous {
            return self.start(index);
        }
        let elapsed = 1.0 - room as f64 / previous as f64;
        // Round up, so the estimate at the returned instant really fits. A
        // window past any clock's reach (a caller's `Duration::MAX`)
        // saturates: far off, not a panic.
        let offset = Duration::try_from_secs_f64(self.windows.length().as_secs_f64() * elapsed)
            .unwrap_or(Duration::MAX)
            .saturating_add(Duration::from_nanos(1));
        later(self.start(index), offset)
    }
}

impl Meter for SlidingWindow {
    fn capacity(&self) -> u64 {
        self.count
    }

    fn earliest(&self, cost: u64, now: Instant) -> Instant {
        let index = self.index(now);
        let (previous, current) = self.counts(index);
        if current.saturating_add(cost) <= self.count {
            let at = self.when_fits(index, previous, self.count - current - cost);
            return at.max(now);
        }
        let next = index.saturating_add(1);
        self.when_fits(next, current, self.count.saturating_sub(cost))
            .max(now)
    }

    fn commit(&mut self, cost: u64, now: Instant) {
        let index = self.index(now);
        let (previous, current) = self.counts(index);
        self.state = (index, previous, current.saturating_add(cost));
    }

    fn settle(&mut self, charged: u64, actual: u64, at: Instant) {
        let fix = |n: &mut u64| *n = n.saturating_add(actual).saturating_sub(charged);
        match self.index(at).checked_sub(self.state.0) {
            Some(0) => fix(&mut self.state.2),
            None if self.state.0.checked_sub(self.index(at)) == Some(1) => fix(&mut self.state.1),
            _ => {}
        }
    }

    fn is_idle(&self, now: Instant) -> bool {
        self.counts(self.index(now)) == (0, 0)
    }

    fn interval(&self) -> Duration {
        self.windows.length() / u32::try_from(self.count).unwrap_or(u32::MAX).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_previous_window_weighs_less_as_the_current_one_ages() {
        let t0 = Instant::now();
        let mut meter =
            SlidingWindow::new(Rate::new(10, Duration::from_secs(1)), Duration::ZERO, t0);
        for _ in 0..10 {
            assert_eq!(meter.earliest(1, t0), t0);
            meter.commit(1, t0);
        }
        // Next window: 10 × (1 − elapsed) + 0 + 1 <= 10 from 10% in.
        let next = t0 + Duration::from_secs(1);
        let at = meter.earliest(1, t0);
        assert!(
            at > next + Duration::from_millis(99) && at < next + Duration::from_millis(101),
            "{:?}",
            at - t0
        );
        meter.commit(1, at);
        let second = meter.earliest(1, at);
        assert!(
            second > next + Duration::from_millis(199)
                && second < next + Duration::from_millis(201)
        );
        assert!(meter.is_idle(t0 + Duration::from_secs(3)));
    }
}
