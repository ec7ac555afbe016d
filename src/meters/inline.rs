//! A quota's meter as a lane's meters keep it ([`InlineMeter`]).

use std::time::Duration;

use tokio::time::Instant;

use super::leaky_bucket::LeakyBucket;
use super::meter::Meter;
use super::quota::{Algorithm, Quota, Unit};
use super::token_bucket::TokenBucket;
use crate::time::Stamp;

/// A quota's meter, kept in the lane's meters: the buckets (the default
/// leaky one, and the token bucket of nearly every tenant quota) inline
/// and asked in stamps, with no call through a pointer and no instant
/// arithmetic on a release; the window meters and an algorithm of the
/// user's own boxed, behind [`Meter`].
#[derive(Debug)]
pub(crate) enum InlineMeter {
    Leaky(LeakyBucket),
    Token(TokenBucket),
    Boxed(Box<dyn Meter>),
}

impl InlineMeter {
    /// A fresh meter for `quota`.
    pub(crate) fn of(quota: &Quota, headroom: Duration, now: Instant) -> Self {
        match quota.algorithm {
            Algorithm::LeakyBucket(rate) => Self::Leaky(LeakyBucket::new(rate, headroom)),
            Algorithm::TokenBucket { capacity, refill } => {
                Self::Token(TokenBucket::new(capacity, refill, headroom))
            }
            _ => Self::Boxed(quota.meter(headroom, now)),
        }
    }

    /// [`Meter::earliest`] at `now`, whose stamp is `at`.
    pub(crate) fn earliest_at(&self, cost: u64, now: Instant, at: Stamp) -> Stamp {
        match self {
            Self::Leaky(bucket) => bucket.earliest_at(at),
            Self::Token(bucket) => bucket.earliest_at(cost, at),
            Self::Boxed(meter) => Stamp::of(meter.earliest(cost, now)),
        }
    }

    /// [`Meter::commit`] at `now`, whose stamp is `at`.
    pub(crate) fn commit_at(&mut self, cost: u64, now: Instant, at: Stamp) {
        match self {
            Self::Leaky(bucket) => bucket.commit_at(cost, at),
            Self::Token(bucket) => bucket.commit_at(cost, at),
            Self::Boxed(meter) => meter.commit(cost, now),
        }
    }

    fn meter(&self) -> &dyn Meter {
        match self {
            Self::Leaky(bucket) => bucket,
            Self::Token(bucket) => bucket,
            Self::Boxed(meter) => meter.as_ref(),
        }
    }

    fn meter_mut(&mut self) -> &mut dyn Meter {
        match self {
            Self::Leaky(bucket) => bucket,
            Self::Token(bucket) => bucket,
            Self::Boxed(meter) => meter.as_mut(),
        }
    }
}

/// The questions asked off the release path (predictions, settling, a
/// vendor's word), through the meter itself.
impl Meter for InlineMeter {
    fn capacity(&self) -> u64 {
        self.meter().capacity()
    }

    fn earliest(&self, cost: u64, now: Instant) -> Instant {
        self.meter().earliest(cost, now)
    }

    fn commit(&mut self, cost: u64, now: Instant) {
        self.meter_mut().commit(cost, now);
    }

    fn settle(&mut self, charged: u64, actual: u64, at: Instant) {
        self.meter_mut().settle(charged, actual, at);
    }

    fn is_idle(&self, now: Instant) -> bool {
        self.meter().is_idle(now)
    }

    fn interval(&self) -> Duration {
        self.meter().interval()
    }

    fn eta(&self, ahead: u64, cost: u64, now: Instant) -> Instant {
        self.meter().eta(ahead, cost, now)
    }
}

/// A meter and the unit it counts (requests, or each request's cost).
pub(crate) type Counting = (InlineMeter, Unit);

/// A gate's meters, in the order of its quotas: the one nearly every gate
/// counts kept inline, more in a box. A lane per tenant holds a gate
/// each, and a box of one meter cost an allocation of 56 bytes (64 with
/// the allocator's own) and a pointer to follow on every release.
#[derive(Debug)]
pub(crate) enum Counts {
    One([Counting; 1]),
    Many(Box<[Counting]>),
}

impl Counts {
    pub(crate) fn into_vec(self) -> Vec<Counting> {
        match self {
            Self::One(one) => one.into(),
            Self::Many(many) => many.into_vec(),
        }
    }
}

impl Default for Counts {
    fn default() -> Self {
        Self::Many(Box::default())
    }
}

impl FromIterator<Counting> for Counts {
    fn from_iter<I: IntoIterator<Item = Counting>>(meters: I) -> Self {
        let mut meters = meters.into_iter();
        match (meters.next(), meters.next()) {
            (None, _) => Self::default(),
            (Some(one), None) => Self::One([one]),
            (Some(first), Some(second)) => {
                Self::Many([first, second].into_iter().chain(meters).collect())
            }
        }
    }
}

impl std::ops::Deref for Counts {
    type Target = [Counting];

    fn deref(&self) -> &[Counting] {
        match self {
            Self::One(one) => one,
            Self::Many(many) => many,
        }
    }
}

impl std::ops::DerefMut for Counts {
    fn deref_mut(&mut self) -> &mut [Counting] {
        match self {
            Self::One(one) => one,
            Self::Many(many) => many,
        }
    }
}
