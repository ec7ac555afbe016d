//! When to come back, as the vendor wrote it: `Retry-After` (seconds or
//! an HTTP-date) and the millisecond headers read ahead of it.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};

use super::formats::{http_date, number, seconds, step};

/// How long the vendor asked us to wait, if it said so in a form we read.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use reqwest::header::{HeaderMap, HeaderValue};
///
/// let mut headers = HeaderMap::new();
/// headers.insert("retry-after", HeaderValue::from_static("3"));
/// assert_eq!(
///     callshaper::signals::retry_after(&headers, SystemTime::now()),
///     Some(Duration::from_secs(3))
/// );
/// ```
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    read_retry_after(headers, now).map(|(_, _, wait)| wait)
}

/// How finely the vendor wrote the wait [`retry_after`] reads in
/// `headers`: the true wait is within this of it, since a vendor rounds
/// (a GCRA that wants 10 ms more says `Retry-After: 1`). A second for
/// whole seconds or an HTTP-date, a millisecond for the millisecond
/// headers, what a fraction's digits say; zero without a hint.
pub(crate) fn retry_after_precision(headers: &HeaderMap) -> Duration {
    // The date is only looked at, not measured: any instant reads it.
    match read_retry_after(headers, SystemTime::UNIX_EPOCH) {
        Some((name, value, _)) if name == RETRY_AFTER.as_str() => step(value),
        Some((_, value, _)) => step(value) / 1000,
        None => Duration::ZERO,
    }
}

/// Headers of milliseconds that say when to come back, ahead of
/// `Retry-After`.
pub(super) const RETRY_AFTER_MS: [&str; 3] = [
    "retry-after-ms",
    "x-amz-retry-after",
    "grpc-retry-pushback-ms",
];

/// The header [`retry_after`] reads, its value, and the wait it says.
pub(super) fn read_retry_after(
    headers: &HeaderMap,
    now: SystemTime,
) -> Option<(&'static str, &HeaderValue, Duration)> {
    for name in RETRY_AFTER_MS {
        if let Some(value) = headers.get(name)
            && let Some(ms) = number(value)
        {
            return Some((name, value, seconds(ms / 1000.0)));
        }
    }
    let value = headers.get(RETRY_AFTER)?;
    let wait = number(value)
        .map(seconds)
        .or_else(|| http_date(value, now))?;
    Some((RETRY_AFTER.as_str(), value, wait))
}
