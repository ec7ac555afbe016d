//! A [`Quota`] as a file declares it: one flat table,
//! `{ algorithm = "token_bucket", capacity = 10, count = 1, per = "1s", unit = "cost" }`
//! (`strict = true` for [`Quota::strict`]),
//! checked as it is read (feature `serde`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::quota::{Algorithm, Quota, Unit};
use super::rate::Rate;
use crate::error::ConfigError;

/// The flat form of a [`Quota`].
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Declared {
    algorithm: Name,
    /// How many per `per` (for a token bucket: the refill).
    count: u32,
    #[serde(with = "crate::time::human")]
    per: Duration,
    /// A token bucket's burst.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    capacity: Option<u64>,
    #[serde(default)]
    unit: Unit,
    /// Requests at least an interval apart on the wire ([`Quota::strict`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    strict: bool,
}

#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Name {
    LeakyBucket,
    TokenBucket,
    FixedWindow,
    SlidingLog,
    SlidingWindow,
}

impl TryFrom<Declared> for Quota {
    type Error = ConfigError;

    fn try_from(declared: Declared) -> Result<Self, ConfigError> {
        let rate = Rate::new(declared.count, declared.per);
        let algorithm = match (declared.algorithm, declared.capacity) {
            (Name::TokenBucket, Some(capacity)) => Algorithm::TokenBucket {
                capacity,
                refill: rate,
            },
            (Name::TokenBucket, None) => {
                return Err(ConfigError::new(
                    "capacity",
                    "a token bucket needs its burst capacity",
                ));
            }
            (_, Some(_)) => {
                return Err(ConfigError::new(
                    "capacity",
                    "only a token bucket has a capacity",
                ));
            }
            (Name::LeakyBucket, None) => Algorithm::LeakyBucket(rate),
            (Name::FixedWindow, None) => Algorithm::FixedWindow(rate),
            (Name::SlidingLog, None) => Algorithm::SlidingLog(rate),
            (Name::SlidingWindow, None) => Algorithm::SlidingWindow(rate),
        };
        let quota = Quota {
            algorithm,
            unit: declared.unit,
            strict: declared.strict,
        };
        quota.validate()?;
        Ok(quota)
    }
}

impl TryFrom<&Quota> for Declared {
    type Error = ConfigError;

    fn try_from(quota: &Quota) -> Result<Self, ConfigError> {
        let rate = quota.rate();
        let (algorithm, capacity) = match quota.algorithm {
            Algorithm::LeakyBucket(_) => (Name::LeakyBucket, None),
            Algorithm::TokenBucket { capacity, .. } => (Name::TokenBucket, Some(capacity)),
            Algorithm::FixedWindow(_) => (Name::FixedWindow, None),
            Algorithm::SlidingLog(_) => (Name::SlidingLog, None),
            Algorithm::SlidingWindow(_) => (Name::SlidingWindow, None),
            Algorithm::Custom(ref meter) => {
                return Err(ConfigError::new(
                    "algorithm",
                    format!("`{}` is a custom meter: code, not data", meter.name()),
                ));
            }
        };
        Ok(Self {
            algorithm,
            count: rate.count,
            per: rate.per,
            capacity,
            unit: quota.unit,
            strict: quota.strict,
        })
    }
}

/// A built-in quota writes as its flat table; a custom meter is refused.
impl Serialize for Quota {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Declared::try_from(self)
            .map_err(serde::ser::Error::custom)?
            .serialize(serializer)
    }
}
