//! The fixed window: "1000 per day", counted in aligned windows.

use std::time::Duration;

use tokio::time::Instant;

use super::meter::Meter;
use super::rate::Rate;
use super::windows::Windows;

/// At most `count` units in each window `[origin + k·per', origin +
/// (k+1)·per')`, with `per' = per + headroom` and `origin` the meter's
/// creation.
///
/// # The guarantee
///
/// At most `count` per aligned window, and the cheapest state of all (two
/// numbers). But the windows are ours, not the vendor's: a vendor counting
/// a strict sliding window can see **up to `2 × count`** around a boundary
/// (a full window's worth at its end, another at the next one's start).
/// Pick it for vendors that count in fixed windows themselves (daily or
/// monthly quotas), and expect bursts at window starts.
#[derive(Debug, Clone)]
pub struct FixedWindow {
    count: u64,
    windows: Windows,
    /// The window index and what it has spent.
    current: (u64, u64),
}

impl FixedWindow {
    /// `rate.count` per window of `rate.per + headroom`, from `origin`.
    pub fn new(rate: Rate, headroom: Duration, origin: Instant) -> Self {
        Self {
            count: u64::from(rate.count),
            windows: Windows::new(origin, rate.per.saturating_add(headroom)),
            current: (0, 0),
        }
    }

    fn index(&self, at: Instant) -> u64 {
        self.windows.index(at)
    }

    fn start(&self, index: u64) -> Instant {
        self.windows.start(index)
    }

    fn spent(&self, index: u64) -> u64 {
        if self.current.0 == index {
            self.current.1
        } else {
            0
        }
    }
}

impl Meter for FixedWindow {
    fn capacity(&self) -> u64 {
        self.count
    }

    fn earliest(&self, cost: u64, now: Instant) -> Instant {
        let index = self.index(now);
        if self.spent(index).saturating_add(cost) <= self.count {
            now
        } else {
            self.start(index.saturating_add(1))
        }
    }

    fn commit(&mut self, cost: u64, now: Instant) {
        let index = self.index(now);
        self.current = (index, self.spent(index).saturating_add(cost));
    }

    fn settle(&mut self, charged: u64, actual: u64, at: Instant) {
        if self.current.0 == self.index(at) {
            self.current.1 = self
                .current
                .1
                .saturating_add(actual)
                .saturating_sub(charged);
        }
    }

    fn is_idle(&self, now: Instant) -> bool {
        self.spent(self.index(now)) == 0
    }

    fn interval(&self) -> Duration {
        self.windows.length() / u32::try_from(self.count).unwrap_or(u32::MAX).max(1)
    }

    fn eta(&self, ahead: u64, cost: u64, now: Instant) -> Instant {
        // Windows fill up in turn: the rest of this one, then `count` each.
        let index = self.index(now);
        let room = self.count.saturating_sub(self.spent(index));
        let need = ahead.saturating_add(cost);
        if need <= room {
            return now;
        }
        let count = self.count.max(1);
        self.start(index.saturating_add((need - room).div_ceil(count)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_window_holds_count_and_the_next_starts_fresh() {
        let t0 = Instant::now();
        let mut window = FixedWindow::new(Rate::new(3, Duration::from_secs(1)), Duration::ZERO, t0);
        let late = t0 + Duration::from_millis(900);
        for _ in 0..3 {
            assert_eq!(window.earliest(1, late), late);
            window.commit(1, late);
        }
        let next = t0 + Duration::from_secs(1);
        assert_eq!(window.earliest(1, late), next);
        // The boundary burst: three more right at the next window's start.
        for _ in 0..3 {
            assert_eq!(window.earliest(1, next), next);
            window.commit(1, next);
        }
    }
}
