//! A lane's limits as declared: a [`Quota`] is an [`Algorithm`] and its
//! numbers, and what it counts ([`Unit`]); each makes its fresh meter.

use std::time::Duration;

use tokio::time::Instant;

use super::custom::CustomMeter;
use super::fixed_window::FixedWindow;
use super::leaky_bucket::LeakyBucket;
use super::meter::Meter;
use super::rate::Rate;
use super::sliding_log::SlidingLog;
use super::sliding_window::SlidingWindow;
use super::token_bucket::TokenBucket;
use crate::error::ConfigError;

/// What a meter counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Unit {
    /// Each request counts one.
    #[default]
    Requests,
    /// Each request counts its cost (tokens, credits); see
    /// [`RequestBuilder::cost`](crate::shaper::RequestBuilder::cost).
    Cost,
}

/// An algorithm and its numbers. Non-exhaustive: a new algorithm is not a
/// breaking change.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Algorithm {
    /// [`LeakyBucket`]: smooth, no burst.
    LeakyBucket(Rate),
    /// [`TokenBucket`]: bursts up to `capacity`, refilled at `refill`.
    TokenBucket {
        /// The burst.
        capacity: u64,
        /// The refill rate.
        refill: Rate,
    },
    /// [`FixedWindow`].
    FixedWindow(Rate),
    /// [`SlidingLog`].
    SlidingLog(Rate),
    /// [`SlidingWindow`] (the sliding window counter).
    SlidingWindow(Rate),
    /// Your own [`Meter`], in memory only.
    Custom(CustomMeter),
}

/// One limit of a lane: an algorithm, and what it counts.
///
/// ```
/// use std::time::Duration;
/// use callshaper::Quota;
/// let minute = Duration::from_secs(60);
/// // An LLM vendor: 500 requests and 90,000 tokens per minute.
/// let quotas = [Quota::leaky_bucket(500, minute), Quota::sliding_log(90_000, minute).per_cost()];
/// ```
///
/// With the `serde` feature, a quota reads and writes as one flat table,
/// as a config file declares it:
/// `{ algorithm = "sliding_log", count = 90000, per = "1m", unit = "cost" }`
/// (a token bucket adds `capacity`); it is checked as it is read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(try_from = "super::declared::Declared")
)]
pub struct Quota {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// What it counts.
    pub unit: Unit,
    /// No two requests closer than the quota's interval, measured from
    /// when the last one really went (see [`Quota::strict`]).
    pub strict: bool,
}

impl Quota {
    /// Whether it counts requests (not each request's cost): the one
    /// test of it, for the quotas a lane's request rate, ledger and
    /// bursts are read from.
    pub(crate) fn counts_requests(&self) -> bool {
        self.unit == Unit::Requests
    }

    /// True when its meter lets more than one request go at once (a
    /// leaky bucket never does; your own meter is taken not to).
    pub(crate) fn bursts(&self) -> bool {
        match &self.algorithm {
            Algorithm::TokenBucket { capacity, .. } => *capacity > 1,
            Algorithm::FixedWindow(rate)
            | Algorithm::SlidingLog(rate)
            | Algorithm::SlidingWindow(rate) => rate.count > 1,
            Algorithm::LeakyBucket(_) | Algorithm::Custom(_) => false,
        }
    }

    /// The capacity of a token bucket: the burst it lets go at once, and
    /// what a vendor running one says its limit is.
    pub(crate) fn bucket_capacity(&self) -> Option<u64> {
        match &self.algorithm {
            Algorithm::TokenBucket { capacity, .. } => Some(*capacity),
            _ => None,
        }
    }

    fn new(algorithm: Algorithm) -> Self {
        Self {
            algorithm,
            unit: Unit::Requests,
            strict: false,
        }
    }

    /// A leaky bucket: `count` per `per`, one every `per / count`.
    pub fn leaky_bucket(count: u32, per: Duration) -> Self {
        Self::new(Algorithm::LeakyBucket(Rate::new(count, per)))
    }

    /// A token bucket: bursts up to `capacity`, refilled `count` per `per`.
    /// A build refuses one that takes longer than the longest window (366
    /// days) to refill from empty: a request settled at the bucket's
    /// capacity waits that long at most.
    pub fn token_bucket(capacity: u64, count: u32, per: Duration) -> Self {
        Self::new(Algorithm::TokenBucket {
            capacity,
            refill: Rate::new(count, per),
        })
    }

    /// A fixed window: `count` per aligned window of `per`.
    pub fn fixed_window(count: u32, per: Duration) -> Self {
        Self::new(Algorithm::FixedWindow(Rate::new(count, per)))
    }

    /// A sliding log: `count` in any window of `per`, exactly.
    pub fn sliding_log(count: u32, per: Duration) -> Self {
        Self::new(Algorithm::SlidingLog(Rate::new(count, per)))
    }

    /// A meter of your own (see [`CustomMeter`]).
    pub fn custom(meter: CustomMeter) -> Self {
        Self::new(Algorithm::Custom(meter))
    }

    /// Why no shared store can hold this quota, if none can: a meter of
    /// the user's own runs in this process only.
    pub(crate) fn in_memory_only(&self) -> Option<&'static str> {
        matches!(self.algorithm, Algorithm::Custom(_)).then_some(
            "a custom meter runs in this process only: with a shared store, use the built-in algorithms",
        )
    }

    /// A sliding window counter: `count` in any window of `per`, nearly.
    pub fn sliding_window(count: u32, per: Duration) -> Self {
        Self::new(Algorithm::SlidingWindow(Rate::new(count, per)))
    }

    /// One of `n` equal shares of this quota (counts and capacity divided,
    /// rounded down, at least 1): what one instance of a fleet of `n` may
    /// use on its own.
    pub(crate) fn share(&self, n: u32) -> Self {
        if n <= 1 {
            return self.clone();
        }
        let part = |count: u32| (count / n).max(1);
        let algorithm = match self.algorithm.clone() {
            Algorithm::LeakyBucket(r) => Algorithm::LeakyBucket(Rate::new(part(r.count), r.per)),
            Algorithm::TokenBucket { capacity, refill } => Algorithm::TokenBucket {
                capacity: (capacity / u64::from(n)).max(1),
                refill: Rate::new(part(refill.count), refill.per),
            },
            Algorithm::FixedWindow(r) => Algorithm::FixedWindow(Rate::new(part(r.count), r.per)),
            Algorithm::SlidingLog(r) => Algorithm::SlidingLog(Rate::new(part(r.count), r.per)),
            Algorithm::SlidingWindow(r) => {
                Algorithm::SlidingWindow(Rate::new(part(r.count), r.per))
            }
            // Shares are for a store's fallback, and no store holds one.
            custom @ Algorithm::Custom(_) => custom,
        };
        Self {
            algorithm,
            unit: self.unit,
            strict: self.strict,
        }
    }

    /// Keep every two requests at least the quota's interval apart
    /// (`(per + headroom) / count`), measured from when the last one really
    /// went on the wire, for a vendor that measures the *spacing* of
    /// requests rather than counting them in a window: nginx's
    /// `limit_req` without `burst` refuses a request that comes 99 ms after
    /// the last one it accepted at `10r/s`, a GCRA with a small tolerance
    /// likewise.
    ///
    /// Without it, a lane holds the count (never more than `count` in any
    /// window of `per`) but forgives timer lateness: a release that fires
    /// late keeps the schedule, so the next may go up to `headroom / 2`
    /// sooner than the interval after it. That is what lets a 200/s lane
    /// use 99 % of its quota on millisecond timers. Strict, lateness is
    /// never made up: each send waits a full interval after the last one.
    /// The turn is released ahead and waits at its door, which the OS's
    /// timer wakes to the microsecond, so a strict 200/s lane still uses
    /// 99.3 % of a counting vendor's quota (99.4 % without), for a few
    /// percent of a core (4.6 % at 100/s and 8.3 % at 200/s, against 1.0
    /// and 2.4 %, on this project's 2-core machine). A lane that meets a
    /// spacing refusal turns strict by itself.
    ///
    /// ```
    /// use std::time::Duration;
    /// use callshaper::Quota;
    /// let nginx = Quota::leaky_bucket(10, Duration::from_secs(1)).strict();
    /// assert!(nginx.strict);
    /// ```
    ///
    /// On a shared store the store spaces the fleet's slots, and a strict
    /// lane's slot goes at its instant, never early and not a timer tick
    /// late. Two instances' sends are then apart by the interval less
    /// both instances' error in mapping the store's clock to their own
    /// (up to a millisecond or two on a busy machine), which the
    /// headroom's share of each gap, `headroom / count`, must cover: 20 ms
    /// at 10/s against nginx. A fleet keeps no ledger of its own, so it
    /// does not turn strict by itself.
    pub fn strict(mut self) -> Self {
        self.strict = true;
        self
    }

    /// Count each request's cost (tokens) instead of requests.
    pub fn per_cost(mut self) -> Self {
        self.unit = Unit::Cost;
        self
    }

    /// The rate the quota allows on average.
    pub fn rate(&self) -> Rate {
        match self.algorithm {
            Algorithm::LeakyBucket(rate)
            | Algorithm::FixedWindow(rate)
            | Algorithm::SlidingLog(rate)
            | Algorithm::SlidingWindow(rate)
            | Algorithm::TokenBucket { refill: rate, .. } => rate,
            Algorithm::Custom(ref meter) => meter.rate(),
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        self.rate().validate()?;
        if let Algorithm::TokenBucket { capacity, refill } = self.algorithm {
            if capacity == 0 {
                return Err(ConfigError::new("capacity", "must be at least 1"));
            }
            // `capacity × per / count` against the longest window, in
            // u128: a bucket spent down (by a burst, or a cost settled at
            // its capacity) waits that long to refill, and a meter keeps
            // its instants within a year of now.
            let refill_nanos = u128::from(capacity) * refill.per.as_nanos();
            let longest = Rate::LONGEST_WINDOW.as_nanos() * u128::from(refill.count);
            if refill_nanos > longest {
                return Err(ConfigError::new(
                    "capacity",
                    format!(
                        "{capacity} at {} per {:?} takes longer than the longest window, 366 days, to refill",
                        refill.count, refill.per
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A fresh meter for this quota.
    pub fn meter(&self, headroom: Duration, now: Instant) -> Box<dyn Meter> {
        match self.algorithm {
            Algorithm::LeakyBucket(rate) => Box::new(LeakyBucket::new(rate, headroom)),
            Algorithm::TokenBucket { capacity, refill } => {
                Box::new(TokenBucket::new(capacity, refill, headroom))
            }
            Algorithm::FixedWindow(rate) => Box::new(FixedWindow::new(rate, headroom, now)),
            Algorithm::SlidingLog(rate) => Box::new(SlidingLog::new(rate, headroom)),
            Algorithm::SlidingWindow(rate) => Box::new(SlidingWindow::new(rate, headroom, now)),
            Algorithm::Custom(ref meter) => meter.meter(headroom, now),
        }
    }
}
