//! Which outcomes are tried again, and how long to wait first.
//!
//! Two kinds of trouble, handled at two depths (which answer is which is
//! decided in one place, the crate's `throttle` module):
//!
//! - **Throttles** (429, 503, 529, and a 403 that carries `Retry-After` or a
//!   used-up request limit, as GitHub sends): the vendor says the *lane* is
//!   too fast. The
//!   whole lane pauses (see [`Lane::pause_for`](crate::lane)); the request
//!   goes back to the head of the queue. Any method is retried: the vendor
//!   did not process the request.
//! - **Failures** (500, 502, 504, 408, transport errors): something went
//!   wrong with *this* request. It waits out a per-request backoff (full
//!   jitter, never longer than `max_pause`) in its lane's queue, blocking
//!   nobody, then goes ahead of everyone who came after it, spending quota
//!   again. Only idempotent
//!   methods are retried, unless the user opts in, because the vendor may
//!   have acted on the first attempt; a connection that was never made is
//!   safe to retry for any method.
//!
//! Failure retries also draw on the lane's [`RetryBudget`]: when a vendor
//! is down, every request fails, and retrying each one would multiply our
//! traffic by `max_attempts` exactly when it hurts most. Throttle retries
//! don't draw on it: the lane's pause already paces them.
//!
//! A request whose body cannot be cloned (a stream) is sent once: its
//! response, whatever it is, goes back to the caller.
//!
//! # Next to other retry layers
//!
//! - **reqwest-middleware** (feature `middleware`): `Shaper` is a
//!   `Middleware`. `callshaper::middleware::shaper_error(&error)` gets the
//!   shaper's `Error` back, also through reqwest-retry's wrapping.
//! - **tower** (feature `tower`): `ShaperLayer::new(shaper)` wraps hyper's
//!   client (or any `Service<http::Request<reqwest::Body>>`) and reqwest's own
//!   `Service<reqwest::Request>`; errors are tower's `BoxError`, and the
//!   shaper's own downcast to `callshaper::Error`. A client of any other kind
//!   (a `ClientWithMiddleware`, a signing wrapper) becomes a tower service
//!   with `tower::service_fn`.
//!
//! **Put the shaper below every layer that retries, and let it own the
//! retries.** The shaper sees only what passes through it:
//!
//! | stack (outermost first) | what happens |
//! |---|---|
//! | reqwest-retry → **shaper** → client | supported. Each of reqwest-retry's tries passes the lane as the same request (it keeps its place); its sends count against one `max_attempts` for all layers, after which the shaper refuses (`Error::AttemptsSpent`) without sending; the shaper's give-ups are final for reqwest-retry (a refused connection is tried `max_attempts` times in all, not 4 × 3). `tests/retry_layers.rs`: a vendor answering 500, one throttling with `Retry-After: 2`, a closed port: every send paced, at most `max_attempts` sends per request, no request during a pause. |
//! | **shaper** → reqwest-retry → client | unsupported: reqwest-retry's retries never pass the lane. They go out unpaced, during pauses, up to `max_attempts × (1 + its retries)` times. The shaper cannot see them, so it cannot warn. |
//! | **shaper** → `reqwest::Client` with `ClientBuilder::retry(..)` | the same: reqwest's own retry policy resends below the shaper. Its default resends only requests the server refused at the protocol level (never processed), which is safe; a policy retrying 429 or 5xx is not. Hand the shaper a client built with `.retry(reqwest::retry::never())` if you changed it. |

use std::collections::VecDeque;
use std::time::Duration;

use reqwest::Method;
use tokio::time::Instant;

use crate::time::later;

/// Retry limits and per-request backoff. In a file, every field is
/// optional and defaults as below. In code, start from the defaults and
/// change what differs (new settings may come in a minor release, each
/// with a default):
///
/// ```
/// use callshaper::retry::RetryPolicy;
///
/// let mut retry = RetryPolicy::default();
/// retry.max_attempts = 5;
/// let shaper = callshaper::Shaper::builder()
///     .rate(10, std::time::Duration::from_secs(1))
///     .retry(retry)
///     .build()?;
/// # Ok::<(), callshaper::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
pub struct RetryPolicy {
    /// Sends allowed for a request that keeps failing (500, 502, 504, 408,
    /// transport errors), the first one included.
    pub max_attempts: u32,
    /// Throttled answers (429, 503, 529) one request may receive before it gives
    /// up with [`Error::RetriesExhausted`](crate::Error::RetriesExhausted).
    pub max_throttles: u32,
    /// Exponential backoff between failed attempts of one request.
    pub backoff: Backoff,
    /// Retry failures of non-idempotent methods (POST, PATCH) too.
    pub retry_non_idempotent: bool,
    /// How many failure retries a lane may spend, relative to its traffic.
    pub budget: RetryBudget,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            max_throttles: 10,
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(10)),
            retry_non_idempotent: false,
            budget: RetryBudget::default(),
        }
    }
}

/// A lane's allowance of failure retries, after Finagle's `RetryBudget` and
/// tower's `TpsBudget`: over the last `ttl`, retries may be at most
/// `min_per_sec × ttl + ratio × requests`. With the defaults (20%, 10/s,
/// 10 s), a healthy lane never notices it, and a vendor that fails every
/// request sees at most 1.2 times our traffic plus a trickle, instead of
/// `max_attempts` times.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
pub struct RetryBudget {
    /// Retries allowed per request sent. Default 0.2.
    pub ratio: f64,
    /// Retries allowed per second whatever the traffic. Default 10.
    pub min_per_sec: u32,
    /// The window the budget is counted over. Default 10 s.
    #[cfg_attr(feature = "serde", serde(with = "crate::time::human"))]
    pub ttl: Duration,
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self {
            ratio: 0.2,
            min_per_sec: 10,
            ttl: Duration::from_secs(10),
        }
    }
}

const SLOTS: u32 = 10;

/// The budget's allowance, as it stands: requests and retries in ten slots covering `ttl`.
#[derive(Debug)]
pub(crate) struct Allowance {
    budget: RetryBudget,
    slot: Duration,
    /// `(slot start, requests, retries)`, oldest first.
    slots: VecDeque<(Instant, u32, u32)>,
}

impl Allowance {
    pub(crate) fn new(budget: RetryBudget) -> Self {
        Self {
            budget,
            slot: (budget.ttl / SLOTS).max(Duration::from_millis(1)),
            slots: VecDeque::new(),
        }
    }

    /// The slot `now` falls in, forgetting slots older than `ttl`.
    fn current(&mut self, now: Instant) -> &mut (Instant, u32, u32) {
        let ttl = self.budget.ttl;
        while self
            .slots
            .front()
            .is_some_and(|&(start, _, _)| later(start, ttl) <= now)
        {
            self.slots.pop_front();
        }
        let slot = self.slot;
        match self.slots.back() {
            Some(&(start, _, _)) if later(start, slot) > now => {}
            _ => self.slots.push_back((now, 0, 0)),
        }
        let last = self.slots.len() - 1;
        &mut self.slots[last]
    }

    /// A first attempt went out.
    pub(crate) fn deposit(&mut self, now: Instant) {
        let slot = self.current(now);
        slot.1 = slot.1.saturating_add(1);
    }

    /// Spend one retry, if the budget allows it.
    pub(crate) fn withdraw(&mut self, now: Instant) -> bool {
        self.current(now);
        let (requests, retries) = self
            .slots
            .iter()
            .fold((0u64, 0u64), |(q, r), &(_, sq, sr)| {
                (q + u64::from(sq), r + u64::from(sr))
            });
        let floor = f64::from(self.budget.min_per_sec) * self.budget.ttl.as_secs_f64();
        let allowed = floor + self.budget.ratio * requests as f64;
        if retries as f64 + 1.0 > allowed {
            return false;
        }
        let slot = self.current(now);
        slot.2 = slot.2.saturating_add(1);
        true
    }
}

/// Exponential backoff: the `n`th wait is drawn from `base * 2^n`, capped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct Backoff {
    /// The first step.
    #[cfg_attr(feature = "serde", serde(with = "crate::time::human"))]
    pub base: Duration,
    /// No step is longer than this.
    #[cfg_attr(feature = "serde", serde(with = "crate::time::human"))]
    pub cap: Duration,
}

impl Backoff {
    /// Steps of `base * 2^n`, never above `cap`.
    pub const fn new(base: Duration, cap: Duration) -> Self {
        Self { base, cap }
    }

    /// `min(cap, base * 2^n)`.
    pub fn ceiling(&self, n: u32) -> Duration {
        self.base
            .checked_mul(1u32.checked_shl(n).unwrap_or(u32::MAX))
            .unwrap_or(self.cap)
            .min(self.cap)
    }

    /// Full jitter (uniform in `0..=ceiling(n)`): for independent requests,
    /// spreading retries over the whole range is what keeps them from
    /// arriving together.
    pub fn full_jitter(&self, n: u32) -> Duration {
        fraction(self.ceiling(n), fastrand::f64())
    }

    /// Equal jitter (uniform in `ceiling(n)/2 ..= ceiling(n)`): for the
    /// lane's fallback pause. There is one pause per lane, not a crowd of
    /// clients to spread, so the floor matters more: it guarantees the pause
    /// really grows with each throttle.
    pub fn equal_jitter(&self, n: u32) -> Duration {
        let half = self.ceiling(n) / 2;
        half.saturating_add(fraction(half, fastrand::f64()))
    }
}

/// `d × x` for `x` in `0..=1`, without `mul_f64`'s overflow panic: near
/// `Duration::MAX`, `d` as an `f64` rounds up past what a `Duration` holds.
fn fraction(d: Duration, x: f64) -> Duration {
    Duration::try_from_secs_f64(d.as_secs_f64() * x.clamp(0.0, 1.0))
        .unwrap_or(d)
        .min(d)
}

/// RFC 9110 §9.2.2: methods whose repetition has the same effect as one.
pub(crate) fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        assert_eq!(backoff.ceiling(0), Duration::from_millis(100));
        assert_eq!(backoff.ceiling(3), Duration::from_millis(800));
        assert_eq!(backoff.ceiling(4), Duration::from_secs(1));
        assert_eq!(backoff.ceiling(200), Duration::from_secs(1));
        for n in 0..10 {
            let full = backoff.full_jitter(n);
            let equal = backoff.equal_jitter(n);
            assert!(full <= backoff.ceiling(n));
            assert!(equal >= backoff.ceiling(n) / 2 && equal <= backoff.ceiling(n));
        }
    }

    #[test]
    fn idempotent_methods() {
        assert!(is_idempotent(&Method::PUT));
        assert!(!is_idempotent(&Method::POST));
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_allows_the_floor_plus_a_ratio_of_traffic() {
        let budget = RetryBudget {
            ratio: 0.2,
            min_per_sec: 1,
            ttl: Duration::from_secs(10),
        };
        let mut allowance = Allowance::new(budget);
        let now = Instant::now();
        for _ in 0..100 {
            allowance.deposit(now);
        }
        // 1/s × 10 s + 20% of 100 = 30 retries.
        let granted = (0..100).filter(|_| allowance.withdraw(now)).count();
        assert_eq!(granted, 30);
        // Ten seconds on, the books are empty: the floor again.
        let later = now + Duration::from_secs(11);
        let granted = (0..100).filter(|_| allowance.withdraw(later)).count();
        assert_eq!(granted, 10);
    }
}
