//! The sliding log: exact, at the cost of remembering every release.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::meter::Meter;
use super::rate::Rate;
use crate::time::later;

/// At most `count` units in any window `(t − per', t]`, `per' = per +
/// headroom`, checked against a log of every release still in the window.
///
/// # The arithmetic
///
/// `earliest(cost, now)`: if the units logged after `now − per'` plus `cost`
/// fit in `count`, now; else walk the log from its oldest live entry,
/// dropping entries until they would fit: the last one dropped leaves the
/// window at its time `+ per'`, and that is when the request may go.
///
/// # The guarantee
///
/// Exact: a vendor counting a strict sliding window of `per` never sees more
/// than `count` units, weighted or not (headroom absorbs jitter). It costs
/// memory: one entry (24 bytes) per release in the window, so a quota of
/// 90,000 tokens per minute in single-token requests would keep 90,000.
#[derive(Debug, Clone)]
pub struct SlidingLog {
    count: u64,
    window: Duration,
    /// `(release, units)`, oldest first.
    log: VecDeque<(Instant, u64)>,
    /// The units in `log`.
    total: u64,
}

impl SlidingLog {
    /// `rate.count` in any window of `rate.per + headroom`.
    pub fn new(rate: Rate, headroom: Duration) -> Self {
        Self {
            count: u64::from(rate.count),
            window: rate.per.saturating_add(headroom),
            log: VecDeque::new(),
            total: 0,
        }
    }

    fn live(&self, at: Instant, now: Instant) -> bool {
        later(at, self.window) > now
    }
}

impl Meter for SlidingLog {
    fn capacity(&self) -> u64 {
        self.count
    }

    fn earliest(&self, cost: u64, now: Instant) -> Instant {
        let mut total = self.total;
        let mut entries = self.log.iter();
        for &(at, units) in entries.by_ref() {
            if self.live(at, now) {
                if total.saturating_add(cost) <= self.count {
                    return now;
                }
                total = total.saturating_sub(units);
                if total.saturating_add(cost) <= self.count {
                    return later(at, self.window);
                }
                break;
            }
            total = total.saturating_sub(units);
        }
        for &(at, units) in entries {
            total = total.saturating_sub(units);
            if total.saturating_add(cost) <= self.count {
                return later(at, self.window);
            }
        }
        now
    }

    fn commit(&mut self, cost: u64, now: Instant) {
        while let Some(&(at, units)) = self.log.front() {
            if self.live(at, now) {
                break;
            }
            self.total = self.total.saturating_sub(units);
            self.log.pop_front();
        }
        self.log.push_back((now, cost));
        self.total = self.total.saturating_add(cost);
    }

    fn settle(&mut self, charged: u64, actual: u64, at: Instant) {
        if let Some(entry) = self
            .log
            .iter_mut()
            .rev()
            .find(|(when, units)| *when == at && *units == charged)
        {
            entry.1 = actual;
            self.total = self.total.saturating_sub(charged).saturating_add(actual);
        }
    }

    fn is_idle(&self, now: Instant) -> bool {
        self.log.back().is_none_or(|&(at, _)| !self.live(at, now))
    }

    fn interval(&self) -> Duration {
        self.window / u32::try_from(self.count).unwrap_or(u32::MAX).max(1)
    }

    fn eta(&self, ahead: u64, cost: u64, now: Instant) -> Instant {
        // Room for `ahead + cost` units: wait for enough logged units to
        // leave; beyond the log, a window per `count` more.
        let live: Vec<_> = self
            .log
            .iter()
            .filter(|&&(at, _)| self.live(at, now))
            .collect();
        let used = live
            .iter()
            .fold(0_u64, |used, &&(_, units)| used.saturating_add(units));
        let need = ahead.saturating_add(cost);
        let Some(mut excess) = used
            .saturating_add(need)
            .checked_sub(self.count)
            .filter(|&e| e > 0)
        else {
            return now;
        };
        for &&(at, units) in &live {
            excess = excess.saturating_sub(units);
            if excess == 0 {
                return later(at, self.window);
            }
        }
        let windows = u32::try_from(excess.div_ceil(self.count.max(1))).unwrap_or(u32::MAX);
        later(
            live.last().map_or(now, |&&(at, _)| at),
            self.window.saturating_mul(windows.saturating_add(1)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn waits_for_enough_old_units_to_leave() {
        let mut log = SlidingLog::new(Rate::new(10, Duration::from_secs(1)), Duration::ZERO);
        let t0 = Instant::now();
        log.commit(4, t0);
        log.commit(4, t0 + Duration::from_millis(300));
        let now = t0 + Duration::from_millis(500);
        assert_eq!(log.earliest(2, now), now);
        assert_eq!(
            log.earliest(3, now),
            t0 + Duration::from_secs(1),
            "the first 4 must leave"
        );
        assert_eq!(
            log.earliest(9, now),
            t0 + Duration::from_millis(1300),
            "both must leave"
        );
        // Estimated 4, used 1: three units come back at once.
        log.settle(4, 1, t0);
        assert_eq!(log.earliest(5, now), now);
        assert!(log.is_idle(t0 + Duration::from_millis(1300)));
    }
}
