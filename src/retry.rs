//! Which outcomes are tried again, and how long to wait first.
//!
//! Two kinds of trouble, handled at two depths:
//!
//! - **Throttles** (429, 503): the vendor says the *lane* is too fast. The
//!   whole lane pauses (see [`Lane::pause_for`](crate::lane)); the request
//!   goes back to the head of the queue. Any method is retried: the vendor
//!   did not process the request.
//! - **Failures** (500, 502, 504, 408, transport errors): something went
//!   wrong with *this* request. It waits a per-request backoff (full jitter)
//!   and goes back to the queue, spending quota again. Only idempotent
//!   methods are retried, unless the user opts in, because the vendor may
//!   have acted on the first attempt; a connection that was never made is
//!   safe to retry for any method.
//!
//! A request whose body cannot be cloned (a stream) is sent once: its
//! response, whatever it is, goes back to the caller.

use std::time::Duration;

use reqwest::{Method, StatusCode};

/// Retry limits and per-request backoff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Sends allowed for a request that keeps failing (500, 502, 504, 408,
    /// transport errors), the first one included.
    pub max_attempts: u32,
    /// Throttled answers (429, 503) one request may receive before it gives
    /// up with [`Error::RetriesExhausted`](crate::Error::RetriesExhausted).
    pub max_throttles: u32,
    /// Exponential backoff between failed attempts of one request.
    pub backoff: Backoff,
    /// Retry failures of non-idempotent methods (POST, PATCH) too.
    pub retry_non_idempotent: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            max_throttles: 10,
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(10)),
            retry_non_idempotent: false,
        }
    }
}

/// Exponential backoff: the `n`th wait is drawn from `base * 2^n`, capped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first step.
    pub base: Duration,
    /// No step is longer than this.
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
        self.ceiling(n).mul_f64(fastrand::f64())
    }

    /// Equal jitter (uniform in `ceiling(n)/2 ..= ceiling(n)`): for the
    /// lane's fallback pause. There is one pause per lane, not a crowd of
    /// clients to spread, so the floor matters more: it guarantees the pause
    /// really grows with each throttle.
    pub fn equal_jitter(&self, n: u32) -> Duration {
        let ceiling = self.ceiling(n);
        ceiling / 2 + (ceiling / 2).mul_f64(fastrand::f64())
    }
}

/// What to do with the outcome of one send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Hand the outcome to the caller.
    Done,
    /// The vendor throttled the lane.
    Throttled,
    /// This request failed; it may be tried again.
    Failed,
}

/// Statuses that mean "the lane is too fast".
pub(crate) fn is_throttle(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE
}

pub(crate) fn classify_status(status: StatusCode) -> Verdict {
    if is_throttle(status) {
        Verdict::Throttled
    } else if matches!(
        status,
        StatusCode::INTERNAL_SERVER_ERROR
            | StatusCode::BAD_GATEWAY
            | StatusCode::GATEWAY_TIMEOUT
            | StatusCode::REQUEST_TIMEOUT
    ) {
        Verdict::Failed
    } else {
        Verdict::Done
    }
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
    fn throttles_failures_and_the_rest() {
        assert_eq!(
            classify_status(StatusCode::TOO_MANY_REQUESTS),
            Verdict::Throttled
        );
        assert_eq!(
            classify_status(StatusCode::SERVICE_UNAVAILABLE),
            Verdict::Throttled
        );
        assert_eq!(classify_status(StatusCode::BAD_GATEWAY), Verdict::Failed);
        assert_eq!(classify_status(StatusCode::NOT_IMPLEMENTED), Verdict::Done);
        assert_eq!(classify_status(StatusCode::FORBIDDEN), Verdict::Done);
        assert!(is_idempotent(&Method::PUT));
        assert!(!is_idempotent(&Method::POST));
    }
}
