//! The leaky bucket, written as GCRA with no burst: the lane's default.

use std::time::Duration;

use tokio::time::Instant;

use super::meter::Meter;
use super::rate::{Rate, Shape, settle_tat, spacing_nanos};
use crate::time::{Stamp, nanos};

/// One release every `T = (per + headroom) / count`, no burst.
///
/// # The arithmetic
///
/// The state is one instant, `tat` (the theoretical arrival time): the
/// earliest moment the next request may go.
///
/// - `earliest(now) = max(tat, now)`;
/// - `commit(cost, now)`: `tat = tat + cost·T` when `now <= tat + slack`,
///   else `tat = now + cost·T`.
///
/// With `slack = 0` this is the textbook leaky bucket: at most one unit
/// every `T`, and an idle bucket does not save up a burst. Timers fire late,
/// though (tokio rounds sleeps up to the next millisecond, and a busy machine
/// adds more); if every late wake-up pushed the schedule back, a 200/s lane
/// would drift to about 80% of its quota. `slack` forgives lateness up to
/// `headroom / 2`: a release that is late by less than that keeps the
/// schedule.
///
/// # The guarantee
///
/// A release `r_k` is never earlier than its `tat_k`, and `tat_{k+1} >= r_k -
/// slack + T`, so for any `count + 1` consecutive single-unit releases
/// `r_{k+count} - r_k >= count·T - slack = per + headroom / 2`: a vendor
/// counting in a strict sliding window of `per` never sees more than `count`.
/// The other half of the headroom absorbs network jitter.
///
/// Weighted by cost (tokens), the bucket charges a request's cost *after* it
/// goes: the average holds exactly, but a strict sliding window can see up to
/// `count + cost − 1` units around one heavy request. For a vendor that
/// counts tokens in a strict window, use [`SlidingLog`](super::SlidingLog).
///
/// governor implements the same algorithm, but reads its own clock and
/// charges as it answers; the lane needs tokio's clock (so the paused test
/// clock drives it) and a question that spends nothing, so this small
/// version is ours.
#[derive(Debug, Clone)]
pub struct LeakyBucket {
    count: u64,
    /// `T` and the slack in nanoseconds (by [`nanos`]), `tat` and the last
    /// release as stamps: integer arithmetic on every release, and 40
    /// bytes, where instants and durations took 72.
    interval: u64,
    slack: u64,
    tat: Stamp,
    last: Stamp,
}

impl LeakyBucket {
    /// A bucket releasing one unit every `rate.interval(headroom)`.
    pub fn new(rate: Rate, headroom: Duration) -> Self {
        Self {
            count: u64::from(rate.count),
            ..Self::with_interval(rate.interval(headroom), headroom / 2)
        }
    }

    /// A bucket of requests spaced `interval` apart, for a pace set at run
    /// time (a quota the vendor announced, adaptive pacing), forgiving
    /// lateness up to `slack` as the declared buckets do: without it, a
    /// learned 100/s drifts to 89 % of its quota on real timers.
    pub(crate) fn with_interval(interval: Duration, slack: Duration) -> Self {
        Self {
            count: u64::MAX,
            interval: nanos(interval),
            slack: nanos(slack),
            tat: Stamp::NONE,
            last: Stamp::NONE,
        }
    }

    /// Change the pace. The next release is one new interval after the last
    /// one, so slowing down takes effect at once and speeding up makes no
    /// burst.
    pub fn set_interval(&mut self, interval: Duration) {
        self.interval = nanos(interval);
        if self.last != Stamp::NONE {
            self.tat = self.last.later(self.interval);
        }
    }

    /// Its numbers, which every gate counting its quota shares.
    pub(crate) fn shape(&self) -> Shape {
        Shape {
            capacity: self.count,
            interval: self.interval,
            forgiven: self.slack,
        }
    }

    /// The bucket of `shape` whose state is `tat`. Its last release is
    /// not kept: only a pace's interval changes ([`set_interval`](Self::set_interval)),
    /// and a pace is kept whole.
    pub(crate) fn shaped(shape: &Shape, tat: Stamp) -> Self {
        Self {
            count: shape.capacity,
            interval: shape.interval,
            slack: shape.forgiven,
            tat,
            last: Stamp::NONE,
        }
    }

    /// Its state: when the next request may go.
    pub(crate) fn tat(&self) -> Stamp {
        self.tat
    }

    /// [`Meter::earliest`] at the stamp `now`.
    pub(crate) fn earliest_at(&self, now: Stamp) -> Stamp {
        self.tat.max(now)
    }

    /// [`Meter::commit`] at the stamp `now`.
    pub(crate) fn commit_at(&mut self, cost: u64, now: Stamp) {
        // On schedule, or late by no more than the slack: keep the
        // schedule, so timer lateness does not add up. Idle, or far
        // behind: start a new schedule from now.
        let base = if self.tat != Stamp::NONE && now <= self.tat.later(self.slack) {
            self.tat
        } else {
            now
        };
        self.tat = base.later(spacing_nanos(self.interval, cost));
        self.last = now;
    }
}

impl Meter for LeakyBucket {
    fn capacity(&self) -> u64 {
        self.count
    }

    fn earliest(&self, _cost: u64, now: Instant) -> Instant {
        Stamp::answer(now, |at| self.earliest_at(at))
    }

    fn commit(&mut self, cost: u64, now: Instant) {
        self.commit_at(cost, Stamp::of(now));
    }

    fn settle(&mut self, charged: u64, actual: u64, _at: Instant) {
        settle_tat(&mut self.tat, self.interval, charged, actual);
    }

    fn is_idle(&self, now: Instant) -> bool {
        self.tat <= Stamp::of(now)
    }

    fn interval(&self) -> Duration {
        Duration::from_nanos(self.interval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn releases_one_per_interval_without_burst() {
        let mut bucket = LeakyBucket::new(Rate::new(10, Duration::from_secs(1)), Duration::ZERO);
        let start = Instant::now();
        assert_eq!(bucket.earliest(1, start), start);
        bucket.commit(1, start);
        assert_eq!(
            bucket.earliest(1, start),
            start + Duration::from_millis(100),
            "a second release right away would be a burst"
        );
        // Idle for ten seconds: no burst saved up.
        let later = start + Duration::from_secs(10);
        assert!(bucket.is_idle(later));
        bucket.commit(1, later);
        assert_eq!(
            bucket.earliest(1, later),
            later + Duration::from_millis(100)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_pace_counts_from_the_last_release() {
        let mut bucket = LeakyBucket::new(Rate::new(10, Duration::from_secs(1)), Duration::ZERO);
        let t0 = Instant::now();
        bucket.commit(1, t0);
        bucket.set_interval(Duration::from_millis(200));
        assert_eq!(bucket.earliest(1, t0), t0 + Duration::from_millis(200));
        bucket.set_interval(Duration::from_millis(50));
        assert_eq!(bucket.earliest(1, t0), t0 + Duration::from_millis(50));
    }

    #[tokio::test(start_paused = true)]
    async fn late_wakeups_within_slack_keep_the_schedule() {
        let mut bucket = LeakyBucket::new(
            Rate::new(200, Duration::from_secs(1)),
            Duration::from_millis(4),
        );
        let t0 = Instant::now();
        bucket.commit(1, t0);
        let due = bucket.earliest(1, t0);
        // Woken 1 ms late: the next slot is still one interval after `due`.
        bucket.commit(1, due + Duration::from_millis(1));
        assert_eq!(bucket.earliest(1, due), due + bucket.interval());
        // Woken 10 ms late (past the 2 ms slack): the schedule restarts.
        let late = bucket.earliest(1, due) + Duration::from_millis(10);
        bucket.commit(1, late);
        assert_eq!(bucket.earliest(1, late), late + bucket.interval());
    }

    #[tokio::test(start_paused = true)]
    async fn cost_spaces_releases_and_settling_refunds_it() {
        let mut bucket = LeakyBucket::new(Rate::new(1000, Duration::from_secs(1)), Duration::ZERO);
        let t0 = Instant::now();
        bucket.commit(1000, t0);
        assert_eq!(bucket.earliest(1, t0), t0 + Duration::from_secs(1));
        // Estimated 1,000, used 200: 800 units come back.
        bucket.settle(1000, 200, t0);
        assert_eq!(bucket.earliest(1, t0), t0 + Duration::from_millis(200));
    }
}
