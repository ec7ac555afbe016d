//! The token bucket: bursts up to a capacity, the average enforced.

use std::time::Duration;

use tokio::time::Instant;

use super::meter::Meter;
use super::rate::{Rate, Shape, settle_tat, spacing_nanos};
use crate::time::{Stamp, nanos};

/// A bucket of `capacity` tokens refilled at `refill` ("10 RPS with bursts up
/// to 50": capacity 50, refill 10 per second). A request takes `cost`
/// tokens; a full bucket lets `capacity` go at once.
///
/// # The arithmetic
///
/// GCRA again, with a tolerance: with `T = refill.interval(headroom)` per
/// token, `B = capacity` and `J = headroom / 2`, the state `tat` is when the
/// bucket would be full again.
///
/// - `earliest(cost, now) = max(now, tat − ((B − cost)·T − J))`;
/// - `commit(cost, now)`: `tat = max(tat, now) + cost·T`.
///
/// # The guarantee
///
/// For releases `r_i ≤ r_j` of `n` units in all, the rule gives
/// `n ≤ B + (r_j − r_i − J) / T`. A vendor running the same bucket sees each
/// request up to `J` late, so the span it measures can shrink by `J`: it
/// allows `n ≤ B + (r_j − r_i − J) / T_vendor`, which holds because
/// `T ≥ T_vendor`. So it never refuses us, even when a burst opening fresh
/// connections lands late and the refill after it goes on time (the case
/// that `tolerance = (B − cost)·T` alone lost). The price: a full bucket lets
/// `B − 1` go at once and the last of the burst `J` later. The stretch of
/// `T` absorbs drift over longer spans.
///
/// A vendor counting a strict sliding window of `per` can see up to
/// `capacity + count` units in one window (a full burst, then a window's
/// refill): match the vendor's algorithm, not just its numbers.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    capacity: u64,
    /// `T` and `J` (how late a release may land at the vendor) in
    /// nanoseconds, `tat` a stamp (`Stamp::NONE` until the first charge):
    /// integer arithmetic on every release, and small, as a lane per
    /// tenant keeps a bucket each.
    interval: u64,
    jitter: u64,
    tat: Stamp,
}

impl TokenBucket {
    /// `capacity` tokens, refilled at `refill` stretched by `headroom`.
    pub fn new(capacity: u64, refill: Rate, headroom: Duration) -> Self {
        Self::with_interval(capacity, refill.interval(headroom), headroom / 2)
    }

    /// `capacity` tokens, one back every `interval`, a release forgiven
    /// `jitter` of lateness: a vendor's bucket whose rate was read at run
    /// time.
    pub(crate) fn with_interval(capacity: u64, interval: Duration, jitter: Duration) -> Self {
        Self {
            capacity,
            interval: nanos(interval),
            jitter: nanos(jitter),
            tat: Stamp::NONE,
        }
    }

    /// Its numbers, which every gate counting its quota shares.
    pub(crate) fn shape(&self) -> Shape {
        Shape {
            capacity: self.capacity,
            interval: self.interval,
            forgiven: self.jitter,
        }
    }

    /// The bucket of `shape` whose state is `tat`.
    pub(crate) fn shaped(shape: &Shape, tat: Stamp) -> Self {
        Self {
            capacity: shape.capacity,
            interval: shape.interval,
            jitter: shape.forgiven,
            tat,
        }
    }

    /// Its state: when it is full again.
    pub(crate) fn tat(&self) -> Stamp {
        self.tat
    }

    fn tokens(&self, n: u64) -> u64 {
        spacing_nanos(self.interval, n)
    }

    /// How far ahead of `tat` a request of `cost` may go.
    fn tolerance(&self, cost: u64) -> u64 {
        self.tokens(self.capacity.saturating_sub(cost))
            .saturating_sub(self.jitter)
    }

    /// When a request of `cost` may go, were the bucket full again at
    /// `tat`: `tat` less the tolerance, and never before `now`. A bucket
    /// never charged (`tat` is `Stamp::NONE`, the earliest stamp) lets it
    /// go now.
    fn when_full_at(&self, tat: Stamp, cost: u64, now: Stamp) -> Stamp {
        tat.earlier(self.tolerance(cost))
            .map_or(now, |at| at.max(now))
    }

    /// [`Meter::earliest`] at the stamp `now`.
    pub(crate) fn earliest_at(&self, cost: u64, now: Stamp) -> Stamp {
        self.when_full_at(self.tat, cost, now)
    }

    /// [`Meter::commit`] at the stamp `now`.
    pub(crate) fn commit_at(&mut self, cost: u64, now: Stamp) {
        // `Stamp::NONE` is earlier than any stamp: a first charge counts
        // from now.
        self.tat = self.tat.max(now).later(self.tokens(cost));
    }
}

impl Meter for TokenBucket {
    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn earliest(&self, cost: u64, now: Instant) -> Instant {
        Stamp::answer(now, |at| self.earliest_at(cost, at))
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

    fn eta(&self, ahead: u64, cost: u64, now: Instant) -> Instant {
        // After `ahead` tokens go, the bucket is full again at `tat`.
        Stamp::answer(now, |at| {
            let tat = self.tat.max(at).later(self.tokens(ahead));
            self.when_full_at(tat, cost, at)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_full_bucket_bursts_then_refills_at_the_rate() {
        let mut bucket = TokenBucket::new(5, Rate::new(10, Duration::from_secs(1)), Duration::ZERO);
        let t0 = Instant::now();
        for _ in 0..5 {
            assert_eq!(bucket.earliest(1, t0), t0);
            bucket.commit(1, t0);
        }
        assert_eq!(bucket.earliest(1, t0), t0 + Duration::from_millis(100));
        assert_eq!(bucket.earliest(3, t0), t0 + Duration::from_millis(300));
        assert!(bucket.is_idle(t0 + Duration::from_millis(500)));
    }

    /// The case a flaky fleet test found: the burst lands late (fresh
    /// connections), the refill after it goes on time.
    #[tokio::test(start_paused = true)]
    async fn a_late_burst_cannot_crowd_the_refill() {
        let ms = Duration::from_millis;
        let headroom = ms(50);
        let mut bucket = TokenBucket::new(5, Rate::new(10, Duration::from_secs(1)), headroom);
        let t0 = Instant::now();
        let mut releases = Vec::new();
        let mut now = t0;
        for _ in 0..6 {
            now = bucket.earliest(1, now);
            bucket.commit(1, now);
            releases.push(now - t0);
        }
        assert_eq!(&releases[..4], &[Duration::ZERO; 4], "four at once");
        assert_eq!(releases[4], ms(25), "the fifth half the headroom later");
        // The vendor's bucket (100 ms a token) refills from the first
        // arrival: up to 25 ms late, the sixth must still come 100 ms after.
        assert!(releases[5] >= ms(25) + ms(100), "{releases:?}");
    }
}
