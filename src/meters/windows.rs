//! Windows counted from an origin, for the meters that count in windows.

use std::time::Duration;

use tokio::time::Instant;

/// Windows of `length` counted from `origin`, for the meters that count in
/// windows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Windows {
    origin: Instant,
    length: Duration,
}

impl Windows {
    pub(crate) fn new(origin: Instant, length: Duration) -> Self {
        Self {
            origin,
            length: length.max(Duration::from_nanos(1)),
        }
    }

    /// The window `at` falls in.
    pub(crate) fn index(&self, at: Instant) -> u64 {
        let elapsed = at.saturating_duration_since(self.origin).as_nanos();
        u64::try_from(elapsed / self.length.as_nanos()).unwrap_or(u64::MAX)
    }

    /// Where window `index` starts.
    pub(crate) fn start(&self, index: u64) -> Instant {
        let offset = self.length.as_nanos().saturating_mul(u128::from(index));
        self.origin + Duration::from_nanos(u64::try_from(offset).unwrap_or(u64::MAX))
    }

    pub(crate) fn length(&self) -> Duration {
        self.length
    }
}
