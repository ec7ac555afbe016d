//! A quota's meter as a gate's meters keep it ([`InlineMeter`]).

use std::time::Duration;

use tokio::time::Instant;

use super::leaky_bucket::LeakyBucket;
use super::meter::Meter;
use super::quota::{Algorithm, Quota};
use super::rate::Shape;
use super::token_bucket::TokenBucket;
use crate::time::Stamp;

/// A quota's meter as a gate keeps it: a bucket (the default leaky one,
/// and the token bucket of nearly every tenant quota) as its one stamp,
/// asked in stamps with its level's [`Shape`], with no call through a
/// pointer and no instant arithmetic on a release; the window meters and
/// an algorithm of the user's own whole, boxed, behind [`Meter`]. A lane
/// per tenant holds a gate each: a token bucket kept whole, with its
/// unit, took 48 bytes of it, where its stamp and kind take 24.
#[derive(Debug)]
pub(crate) enum InlineMeter {
    Leaky(Stamp),
    Token(Stamp),
    Whole(Box<dyn Meter>),
}

impl InlineMeter {
    /// A fresh meter for `quota`.
    pub(crate) fn of(quota: &Quota, headroom: Duration, now: Instant) -> Self {
        match quota.algorithm {
            Algorithm::LeakyBucket(_) => Self::Leaky(Stamp::NONE),
            Algorithm::TokenBucket { .. } => Self::Token(Stamp::NONE),
            _ => Self::Whole(quota.meter(headroom, now)),
        }
    }

    /// [`Meter::earliest`] at `now`, whose stamp is `at`, for a bucket of
    /// `shape`.
    pub(crate) fn earliest_at(&self, shape: &Shape, cost: u64, now: Instant, at: Stamp) -> Stamp {
        match self {
            Self::Leaky(tat) => LeakyBucket::shaped(shape, *tat).earliest_at(at),
            Self::Token(tat) => TokenBucket::shaped(shape, *tat).earliest_at(cost, at),
            Self::Whole(meter) => Stamp::of(meter.earliest(cost, now)),
        }
    }

    /// [`Meter::commit`] at `now`, whose stamp is `at`, for a bucket of
    /// `shape`.
    pub(crate) fn commit_at(&mut self, shape: &Shape, cost: u64, now: Instant, at: Stamp) {
        match self {
            Self::Leaky(tat) => {
                let mut bucket = LeakyBucket::shaped(shape, *tat);
                bucket.commit_at(cost, at);
                *tat = bucket.tat();
            }
            Self::Token(tat) => {
                let mut bucket = TokenBucket::shaped(shape, *tat);
                bucket.commit_at(cost, at);
                *tat = bucket.tat();
            }
            Self::Whole(meter) => meter.commit(cost, now),
        }
    }

    /// Ask the meter, whole (a bucket of `shape`), what `ask` asks: the
    /// questions off the release path (predictions, idleness, capacity).
    pub(crate) fn read<R>(&self, shape: &Shape, ask: impl FnOnce(&dyn Meter) -> R) -> R {
        match self {
            Self::Leaky(tat) => ask(&LeakyBucket::shaped(shape, *tat)),
            Self::Token(tat) => ask(&TokenBucket::shaped(shape, *tat)),
            Self::Whole(meter) => ask(meter.as_ref()),
        }
    }

    /// Change the meter, whole (a bucket of `shape`), as `change` does:
    /// settling, a vendor's word, a requote's history.
    pub(crate) fn change<R>(
        &mut self,
        shape: &Shape,
        change: impl FnOnce(&mut dyn Meter) -> R,
    ) -> R {
        match self {
            Self::Leaky(tat) => {
                let mut bucket = LeakyBucket::shaped(shape, *tat);
                let answer = change(&mut bucket);
                *tat = bucket.tat();
                answer
            }
            Self::Token(tat) => {
                let mut bucket = TokenBucket::shaped(shape, *tat);
                let answer = change(&mut bucket);
                *tat = bucket.tat();
                answer
            }
            Self::Whole(meter) => change(meter.as_mut()),
        }
    }
}

/// A gate's meters, in the order of its quotas: the one nearly every gate
/// counts kept inline, more in a box. A lane per tenant holds a gate
/// each, and a box of one meter cost an allocation of 56 bytes (64 with
/// the allocator's own) and a pointer to follow on every release.
#[derive(Debug)]
pub(crate) enum Counts {
    One([InlineMeter; 1]),
    Many(Box<[InlineMeter]>),
}

impl Counts {
    pub(crate) fn into_vec(self) -> Vec<InlineMeter> {
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

impl FromIterator<InlineMeter> for Counts {
    fn from_iter<I: IntoIterator<Item = InlineMeter>>(meters: I) -> Self {
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
    type Target = [InlineMeter];

    fn deref(&self) -> &[InlineMeter] {
        match self {
            Self::One(one) => one,
            Self::Many(many) => many,
        }
    }
}

impl std::ops::DerefMut for Counts {
    fn deref_mut(&mut self) -> &mut [InlineMeter] {
        match self {
            Self::One(one) => one,
            Self::Many(many) => many,
        }
    }
}
