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
/// unit, took 48 bytes of it, where its stamp and kind take 16. A meter
/// kept whole is behind one thin pointer (its box boxed), so that an
/// inline meter is two words, and a gate's one meter fits in place with
/// room to tell it from a box of more (`counts.rs`).
#[derive(Debug)]
pub(crate) enum InlineMeter {
    Leaky(Stamp),
    Token(Stamp),
    Whole(Box<Box<dyn Meter>>),
}

impl InlineMeter {
    /// A fresh meter for `quota`.
    pub(crate) fn of(quota: &Quota, headroom: Duration, now: Instant) -> Self {
        match quota.algorithm {
            Algorithm::LeakyBucket(_) => Self::Leaky(Stamp::NONE),
            Algorithm::TokenBucket { .. } => Self::Token(Stamp::NONE),
            _ => Self::Whole(Box::new(quota.meter(headroom, now))),
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
            Self::Whole(meter) => ask(&***meter),
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
            Self::Whole(meter) => change(&mut ***meter),
        }
    }
}
