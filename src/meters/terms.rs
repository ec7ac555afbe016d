//! What a gate's meters count by ([`Terms`]): its quotas, and what meters
//! make of them, worked out once for all the gates that count them.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::inline::InlineMeter;
use super::leaky_bucket::LeakyBucket;
use super::quota::{Algorithm, Quota, Unit};
use super::rate::Shape;
use super::releases::{Reach, Releases};
use super::token_bucket::TokenBucket;

/// A set of quotas as meters count them: each quota's bucket numbers
/// ([`Shape`]) and unit, the ledger's window, the strict spacing, the
/// largest cost, and whether they let a burst go. Shared by every gate of
/// a level: a level keyed per tenant has a gate per tenant, each keeping
/// only its meters' state, where every one kept all of this before (64
/// bytes a gate: its buckets' numbers, the ledger's reach, the quotas and
/// the slack).
#[derive(Debug)]
pub(crate) struct Terms {
    quotas: Arc<[Quota]>,
    /// Each quota's bucket numbers (none for a meter kept whole) and unit,
    /// in the quotas' order.
    shapes: Box<[(Shape, Unit)]>,
    headroom: Duration,
    /// How far back the ledger keeps releases, when a quota counts
    /// requests and a vendor answers.
    reach: Option<Reach>,
    strict: Option<Duration>,
    capacity: u64,
    bursts: bool,
    bursts_requests: bool,
    /// A vendor answers the gates counting by these terms (see
    /// [`unheard`](Self::unheard)).
    hears: bool,
}

impl Terms {
    /// `quotas` stretched by `headroom`, as meters made at `now` count
    /// them.
    pub(crate) fn new(quotas: Arc<[Quota]>, headroom: Duration, now: Instant) -> Self {
        let shapes: Box<[(Shape, Unit)]> = quotas
            .iter()
            .map(|quota| (shape(quota, headroom), quota.unit))
            .collect();
        // The largest cost a request may have: the smallest capacity among
        // meters that count cost (a meter counting requests takes one unit
        // of any request, so only a zero capacity, refused by validation,
        // could stop it).
        let capacity = quotas
            .iter()
            .zip(&shapes)
            .filter(|(_, (_, unit))| *unit == Unit::Cost)
            .map(|(quota, (shape, _))| {
                InlineMeter::of(quota, headroom, now).read(shape, |meter| meter.capacity())
            })
            .min()
            .unwrap_or(u64::MAX);
        Self {
            reach: reach(&quotas, headroom),
            strict: strict_spacing(&quotas, headroom),
            bursts: quotas.iter().any(Quota::bursts),
            bursts_requests: quotas.iter().any(bursts_requests),
            hears: true,
            capacity,
            shapes,
            headroom,
            quotas,
        }
    }

    /// The quotas, in the order the meters count them.
    pub(crate) fn quotas(&self) -> &Arc<[Quota]> {
        &self.quotas
    }

    /// Each quota's bucket numbers and unit, in the quotas' order.
    pub(crate) fn shapes(&self) -> &[(Shape, Unit)] {
        &self.shapes
    }

    /// What every quota is stretched by.
    pub(crate) fn headroom(&self) -> Duration {
        self.headroom
    }

    /// Lateness a pace forgives: half the headroom, as the declared
    /// buckets.
    pub(crate) fn slack(&self) -> Duration {
        self.headroom / 2
    }

    /// The same terms for gates no vendor answers (a standalone lane's):
    /// a burst has no first word to wait for, and no count of the
    /// vendor's is read against a ledger, so the meters keep none: writing
    /// it was an eighth of a standalone lane's permit (114 of 839
    /// instructions), for nobody to read.
    pub(crate) fn unheard(mut self) -> Self {
        self.hears = false;
        self.reach = None;
        self
    }

    /// A vendor answers the gates counting by these terms.
    pub(crate) fn hears(&self) -> bool {
        self.hears
    }

    /// A fresh ledger of releases over the request window (`None` when no
    /// quota counts requests, or no vendor answers).
    pub(crate) fn ledger(&self) -> Option<Releases> {
        self.reach.map(|_| Releases::default())
    }

    /// How far back the ledger keeps releases (`None` when no quota counts
    /// requests or no vendor answers, and the meters keep no ledger).
    pub(crate) fn reach(&self) -> Option<&Reach> {
        self.reach.as_ref()
    }

    /// The strict spacing the quotas declare.
    pub(crate) fn strict(&self) -> Option<Duration> {
        self.strict
    }

    /// The largest cost a request may have.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// True when the quotas let more than one request go at once.
    pub(crate) fn bursts(&self) -> bool {
        self.bursts
    }

    /// True when a quota counting requests lets several go at once: what a
    /// vendor's `remaining` holds.
    pub(crate) fn bursts_requests(&self) -> bool {
        self.bursts_requests
    }
}

/// What a level of `quotas` takes of one request at most
/// ([`Terms::capacity`]), known before any gate holds them: a config file
/// and a proxy check a default cost against it.
#[cfg(any(feature = "config", feature = "proxy"))]
pub(crate) fn largest_cost(quotas: &[Quota]) -> u64 {
    Terms::new(quotas.into(), Duration::ZERO, Instant::now()).capacity()
}

/// The numbers of `quota`'s bucket stretched by `headroom`, if its meter
/// is one (none for a meter kept whole).
fn shape(quota: &Quota, headroom: Duration) -> Shape {
    match quota.algorithm {
        Algorithm::LeakyBucket(rate) => LeakyBucket::new(rate, headroom).shape(),
        Algorithm::TokenBucket { capacity, refill } => {
            TokenBucket::new(capacity, refill, headroom).shape()
        }
        _ => Shape::default(),
    }
}

/// True when `quota` counts requests and lets several go at once: what a
/// vendor's `remaining` holds, and a late first word charges (see
/// `Meters::heard`).
pub(crate) fn bursts_requests(quota: &Quota) -> bool {
    quota.counts_requests() && quota.bursts()
}

/// The strict spacing `quotas` declare: the widest interval among the
/// strict ones.
fn strict_spacing(quotas: &[Quota], headroom: Duration) -> Option<Duration> {
    quotas
        .iter()
        .filter(|quota| quota.strict)
        .map(|quota| quota.rate().interval(headroom))
        .max()
}

/// How far back the ledger for `quotas` keeps releases: over the longest
/// window of those that count requests.
fn reach(quotas: &[Quota], headroom: Duration) -> Option<Reach> {
    quotas
        .iter()
        .filter(|q| q.counts_requests())
        .max_by_key(|quota| quota.rate().per)
        .map(|quota| {
            let rate = quota.rate();
            // A bucket lets its burst go on top of a window's refill.
            let burst = match quota.algorithm {
                Algorithm::TokenBucket { capacity, .. } => capacity,
                _ => 0,
            };
            let most = u64::from(rate.count).saturating_add(burst);
            Reach::new(rate.per.saturating_add(headroom), most)
        })
}
