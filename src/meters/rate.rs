//! [`Rate`], and the arithmetic of time at a rate that the GCRA meters
//! share.

use std::time::Duration;

use crate::error::ConfigError;
use crate::time::Stamp;

/// A rate: `count` per `per`.
///
/// ```
/// use std::time::Duration;
/// let rate = callshaper::Rate::new(10, Duration::from_secs(1));
/// assert_eq!(rate.interval(Duration::ZERO), Duration::from_millis(100));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct Rate {
    /// How many units the vendor accepts in one window.
    pub count: u32,
    /// The vendor's window.
    #[cfg_attr(feature = "serde", serde(with = "crate::time::human"))]
    pub per: Duration,
}

impl Rate {
    /// `count` per `per`.
    pub const fn new(count: u32, per: Duration) -> Self {
        Self { count, per }
    }

    /// The spacing between two units when the window is stretched by
    /// `headroom`: `(per + headroom) / count`, saturating (a vendor may
    /// announce any window).
    pub fn interval(&self, headroom: Duration) -> Duration {
        self.per.saturating_add(headroom) / self.count.max(1)
    }

    /// The average rate in units per second (a window of zero, which only
    /// a vendor could announce, counts as a nanosecond).
    pub fn per_second(&self) -> f64 {
        f64::from(self.count) / self.per.as_secs_f64().max(1e-9)
    }

    /// How this rate compares with `other` in speed (`Less`: slower),
    /// comparing `count / per` exactly, without division: the one way
    /// rates are ordered in the crate.
    pub(crate) fn cmp_speed(&self, other: &Rate) -> std::cmp::Ordering {
        let this = u128::from(self.count) * other.per.as_nanos();
        let that = u128::from(other.count) * self.per.as_nanos();
        this.cmp(&that)
    }

    /// The longest window a quota may have: vendors count per second,
    /// minute, hour, day or month, and a year bounds every instant a meter
    /// computes from it far from overflow.
    pub const LONGEST_WINDOW: Duration = Duration::from_secs(366 * 86_400);

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.count == 0 {
            return Err(ConfigError::new("count", "must be at least 1"));
        }
        if self.per.is_zero() {
            return Err(ConfigError::new("per", "must be longer than zero"));
        }
        if self.per > Self::LONGEST_WINDOW {
            return Err(ConfigError::new(
                "per",
                format!("{:?} is longer than the longest window, 366 days", self.per),
            ));
        }
        Ok(())
    }
}

/// A GCRA bucket's numbers: its capacity, its interval and the lateness
/// it forgives, in nanoseconds. The same for every gate counting its
/// quota, so a level's terms (`terms.rs`) keep them once, and each gate
/// keeps only its bucket's one stamp (`inline.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) capacity: u64,
    pub(crate) interval: u64,
    pub(crate) forgiven: u64,
}

/// `interval × n`, saturating: the time `n` units take at one per
/// `interval`.
pub(crate) fn spacing(interval: Duration, n: u64) -> Duration {
    interval.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX))
}

/// [`spacing`] in nanoseconds, for an `interval` kept in nanoseconds (by
/// [`nanos`](crate::time::nanos), saturated at 584 years, past which every span means
/// "never"): the GCRA meters count in [`Stamp`]s, integer arithmetic where
/// instants cost a normalisation each.
pub(crate) fn spacing_nanos(interval: u64, n: u64) -> u64 {
    interval.saturating_mul(n.min(u64::from(u32::MAX)))
}

/// Settle a GCRA charge: move `tat` back by the units not used, or forward
/// by the units used beyond the estimate.
pub(crate) fn settle_tat(tat: &mut Stamp, interval: u64, charged: u64, actual: u64) {
    if *tat == Stamp::NONE {
        return;
    }
    *tat = if actual < charged {
        tat.earlier(spacing_nanos(interval, charged - actual))
            .unwrap_or(*tat)
    } else {
        tat.later(spacing_nanos(interval, actual - charged))
    };
}

#[cfg(test)]
mod tests {
    use std::cmp::Ordering;
    use std::time::Duration;

    use super::Rate;

    /// Rates compare by speed exactly, whatever their windows, and the
    /// largest numbers a caller or a vendor can give do not overflow.
    #[test]
    fn rates_compare_by_speed_exactly() {
        let second = Duration::from_secs(1);
        let ten = Rate::new(10, second);
        assert_eq!(ten.cmp_speed(&Rate::new(600, 60 * second)), Ordering::Equal);
        assert_eq!(ten.cmp_speed(&Rate::new(11, second)), Ordering::Less);
        assert_eq!(Rate::new(3, second / 3).cmp_speed(&ten), Ordering::Less);
        let most = Rate::new(u32::MAX, Duration::from_nanos(1));
        let least = Rate::new(1, Duration::MAX);
        assert_eq!(most.cmp_speed(&least), Ordering::Greater);
        assert_eq!(least.cmp_speed(&most), Ordering::Less);
    }
}
