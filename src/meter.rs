//! Meters decide *when* the head of a lane's queue may go.
//!
//! The lane asks a meter two questions: "when could the next request go?"
//! ([`LeakyBucket::earliest`], which spends nothing) and, once the request
//! has really been handed to its caller, "charge it" ([`LeakyBucket::commit`]).
//! Keeping the two apart is what lets a cancelled caller spend no quota and
//! lets admission predict a wait without reserving anything.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::ConfigError;

/// A quota: `count` requests per `per`.
///
/// ```
/// use std::time::Duration;
/// let rate = callshaper::Rate::new(10, Duration::from_secs(1));
/// assert_eq!(rate.interval(Duration::ZERO), Duration::from_millis(100));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// How many requests the vendor accepts in one window.
    pub count: u32,
    /// The vendor's window.
    pub per: Duration,
}

impl Rate {
    /// `count` requests per `per`.
    pub const fn new(count: u32, per: Duration) -> Self {
        Self { count, per }
    }

    /// The spacing between two releases when the window is stretched by
    /// `headroom`: `(per + headroom) / count`.
    pub fn interval(&self, headroom: Duration) -> Duration {
        (self.per + headroom) / self.count.max(1)
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.count == 0 {
            return Err(ConfigError::new("rate.count", "must be at least 1"));
        }
        if self.per.is_zero() {
            return Err(ConfigError::new("rate.per", "must be longer than zero"));
        }
        Ok(())
    }
}

/// The default meter: a leaky bucket, written as GCRA (the generic cell rate
/// algorithm) with no burst.
///
/// # The arithmetic
///
/// The state is one instant, `tat` (the theoretical arrival time): the
/// earliest moment the next request may go. With `T = (per + headroom) /
/// count`:
///
/// - `earliest(now) = max(tat, now)`;
/// - `commit(now)`: `tat = tat + T` when `now <= tat + slack`, else
///   `tat = now + T`.
///
/// With `slack = 0` this is the textbook leaky bucket: at most one release
/// every `T`, and an idle bucket does not save up a burst. Timers fire late,
/// though (tokio rounds sleeps up to the next millisecond, and a busy machine
/// adds more); if every late wake-up pushed the schedule back, a 200/s lane
/// would drift to about 80% of its quota. `slack` forgives lateness up to
/// `headroom / 2`: a release that is late by less than that keeps the
/// schedule. That never breaks the vendor's window: a release `r_k` is never
/// earlier than its `tat_k`, and `tat_{k+1} >= r_k - slack + T`, so for any
/// `count + 1` consecutive releases `r_{k+count} - r_k >= count * T - slack
/// = per + headroom / 2`. The other half of the headroom absorbs network
/// jitter between our release and the vendor's clock.
///
/// governor implements the same algorithm, but reads its own clock and
/// charges as it answers; the lane needs tokio's clock (so the paused test
/// clock drives it) and a question that spends nothing, so this small
/// version is ours.
#[derive(Debug, Clone)]
pub struct LeakyBucket {
    interval: Duration,
    slack: Duration,
    tat: Option<Instant>,
    last: Option<Instant>,
}

impl LeakyBucket {
    /// A bucket releasing one request every `rate.interval(headroom)`.
    pub fn new(rate: Rate, headroom: Duration) -> Self {
        Self {
            interval: rate.interval(headroom),
            slack: headroom / 2,
            tat: None,
            last: None,
        }
    }

    /// The spacing between two releases.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// When the next request could go; spends nothing.
    pub fn earliest(&self, now: Instant) -> Instant {
        match self.tat {
            Some(tat) if tat > now => tat,
            _ => now,
        }
    }

    /// Charge one release at `now`.
    pub fn commit(&mut self, now: Instant) {
        let base = match self.tat {
            // On schedule, or late by no more than the slack: keep the
            // schedule, so timer lateness does not add up.
            Some(tat) if now <= tat + self.slack => tat,
            // Idle, or far behind: start a new schedule from now.
            _ => now,
        };
        self.tat = Some(base + self.interval);
        self.last = Some(now);
    }

    /// Change the pace. The next release is one new interval after the last
    /// one, so slowing down takes effect at once and speeding up makes no
    /// burst.
    pub fn set_interval(&mut self, interval: Duration) {
        self.interval = interval;
        if let Some(last) = self.last {
            self.tat = Some(last + interval);
        }
    }

    /// True when the bucket is as good as new at `now`: forgetting it would
    /// not let anything go sooner than it may.
    pub fn is_idle(&self, now: Instant) -> bool {
        self.tat.is_none_or(|tat| tat <= now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn releases_one_per_interval_without_burst() {
        let mut bucket = LeakyBucket::new(Rate::new(10, Duration::from_secs(1)), Duration::ZERO);
        let start = Instant::now();
        assert_eq!(bucket.earliest(start), start);
        bucket.commit(start);
        assert_eq!(
            bucket.earliest(start),
            start + Duration::from_millis(100),
            "a second release right away would be a burst"
        );
        // Idle for ten seconds: no burst saved up.
        let later = start + Duration::from_secs(10);
        assert!(bucket.is_idle(later));
        bucket.commit(later);
        assert_eq!(bucket.earliest(later), later + Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_pace_counts_from_the_last_release() {
        let mut bucket = LeakyBucket::new(Rate::new(10, Duration::from_secs(1)), Duration::ZERO);
        let t0 = Instant::now();
        bucket.commit(t0);
        bucket.set_interval(Duration::from_millis(200));
        assert_eq!(bucket.earliest(t0), t0 + Duration::from_millis(200));
        bucket.set_interval(Duration::from_millis(50));
        assert_eq!(bucket.earliest(t0), t0 + Duration::from_millis(50));
    }

    #[tokio::test(start_paused = true)]
    async fn late_wakeups_within_slack_keep_the_schedule() {
        let mut bucket = LeakyBucket::new(
            Rate::new(200, Duration::from_secs(1)),
            Duration::from_millis(4),
        );
        let t0 = Instant::now();
        bucket.commit(t0);
        let due = bucket.earliest(t0);
        // Woken 1 ms late: the next slot is still one interval after `due`.
        bucket.commit(due + Duration::from_millis(1));
        assert_eq!(bucket.earliest(due), due + bucket.interval());
        // Woken 10 ms late (past the 2 ms slack): the schedule restarts.
        let late = bucket.earliest(due) + Duration::from_millis(10);
        bucket.commit(late);
        assert_eq!(bucket.earliest(late), late + bucket.interval());
    }
}
