//! Instant arithmetic that cannot panic.
//!
//! Durations reach the crate from callers (`max_wait`, `max_pause`, store
//! options), from vendors (`Retry-After`, resets) and from a store's
//! replies. `Instant + Duration` panics on overflow, so every instant built
//! from such a value goes through [`later`].

#[cfg(feature = "serde")]
pub(crate) mod human;

use std::time::Duration;

use tokio::time::Instant;

/// Far enough to mean "never" for a wait, near enough that every platform's
/// clock can hold it past now: 100 years. Also the longest pause a vendor's
/// header can ask for (`signals::LONGEST`).
pub(crate) const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `at + by`, saturating at `FAR` from `at` instead of panicking. (Only a
/// clock that cannot hold a century past `at` gets `at` itself back.)
pub(crate) fn later(at: Instant, by: Duration) -> Instant {
    at.checked_add(by.min(FAR)).unwrap_or(at)
}

/// A duration in microseconds (the stores' unit), saturating.
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_durations_saturate_instead_of_panicking() {
        let now = Instant::now();
        assert_eq!(
            later(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        assert_eq!(later(now, Duration::MAX), now + FAR);
        assert!(later(now, Duration::MAX) > now + Duration::from_secs(3600 * 24 * 365));
    }
}
