//! Where a gate's meters keep their state ([`Counts`]): the one meter
//! nearly every gate counts, in place; anything more (several quotas,
//! what slows them) in one box.

use std::time::Duration;

use super::inline::InlineMeter;
use super::leaky_bucket::LeakyBucket;
use super::meter::Meter;
use super::token_bucket::TokenBucket;
use crate::time::{Stamp, nanos};

/// A gate's meters, in the order of its quotas, and what slows them: the
/// one meter nearly every gate counts kept in place while nothing slows
/// it, else all of it in one box ([`More`]). A lane per tenant holds a
/// gate each: 16 bytes, where its meters (24) and a pointer to what slows
/// them (8) took 32. A gate with several quotas keeps them in a box of
/// their own inside that one (16 bytes more of heap than a box of them
/// alone, as many fewer in the gate).
#[derive(Debug)]
pub(super) enum Counts {
    One([InlineMeter; 1]),
    More(Box<More>),
}

/// What a gate keeps when one meter in place is not all: its meters, and
/// what slows them, if anything does.
#[derive(Debug, Default)]
pub(super) struct More {
    meters: Box<[InlineMeter]>,
    slowed: Option<Box<Slowed>>,
}

impl Counts {
    /// `meters`, slowed by `slowed`.
    pub(super) fn of(
        meters: impl IntoIterator<Item = InlineMeter>,
        slowed: Option<Box<Slowed>>,
    ) -> Self {
        let mut meters = meters.into_iter();
        match (meters.next(), meters.next(), slowed) {
            (Some(one), None, None) => Self::One([one]),
            (first, second, slowed) => Self::More(Box::new(More {
                meters: first.into_iter().chain(second).chain(meters).collect(),
                slowed,
            })),
        }
    }

    /// Its meters and what slows them, taken apart (the meters' state
    /// moves to new terms).
    pub(super) fn take(&mut self) -> (Vec<InlineMeter>, Option<Box<Slowed>>) {
        let placeholder = Self::One([InlineMeter::Leaky(Stamp::NONE)]);
        match std::mem::replace(self, placeholder) {
            Self::One(one) => (one.into(), None),
            Self::More(more) => (more.meters.into_vec(), more.slowed),
        }
    }

    /// What slows the meters, if anything does.
    pub(super) fn slowed(&self) -> Option<&Slowed> {
        match self {
            Self::One(_) => None,
            Self::More(more) => more.slowed.as_deref(),
        }
    }

    /// What slows the meters, to change in place, if anything does.
    pub(super) fn slowed_mut(&mut self) -> Option<&mut Slowed> {
        match self {
            Self::One(_) => None,
            Self::More(more) => more.slowed.as_deref_mut(),
        }
    }

    /// Change what slows the meters: its box is made when first needed
    /// (never for a change that only `clears`, where nothing slows), and
    /// let go once nothing slows them, the one meter back in place.
    pub(super) fn slow(&mut self, clears: bool, change: impl FnOnce(&mut Slowed)) {
        match self {
            Self::More(more) => {
                if clears && more.slowed.is_none() {
                    return;
                }
                change(more.slowed.get_or_insert_with(Box::default));
                if more.slowed.as_ref().is_some_and(|slowed| slowed.is_empty()) {
                    more.slowed = None;
                    if more.meters.len() == 1 {
                        let (meters, _) = self.take();
                        *self = Self::of(meters, None);
                    }
                }
            }
            Self::One(_) => {
                if clears {
                    return;
                }
                let mut slowed = Box::<Slowed>::default();
                change(&mut slowed);
                if !slowed.is_empty() {
                    let (meters, _) = self.take();
                    *self = Self::of(meters, Some(slowed));
                }
            }
        }
    }
}

impl std::ops::Deref for Counts {
    type Target = [InlineMeter];

    fn deref(&self) -> &[InlineMeter] {
        match self {
            Self::One(one) => one,
            Self::More(more) => &more.meters,
        }
    }
}

impl std::ops::DerefMut for Counts {
    fn deref_mut(&mut self) -> &mut [InlineMeter] {
        match self {
            Self::One(one) => one,
            Self::More(more) => &mut more.meters,
        }
    }
}

/// What slows a gate's declared quotas: a pace, a vendor's leak, strict
/// spacing. Boxed together: most gates never have any of it, and a lane
/// per tenant holds a gate each.
#[derive(Debug, Default)]
pub(super) struct Slowed {
    /// A slower pace than declared (a quota the vendor announced, or
    /// adaptive pacing), counting requests.
    pub(super) pace: Option<LeakyBucket>,
    /// A vendor's bucket whose leak its levels showed (Shopify): its
    /// capacity, refilled at that rate, and held to what it says is left
    /// as the declared buckets are, so the lane uses the room the vendor
    /// reports and paces at the leak only when the bucket is full.
    pub(super) leak: Option<TokenBucket>,
    /// Strict spacing declared ([`Quota::strict`]): the widest interval
    /// among the strict quotas.
    pub(super) strict: Nanos,
    /// Strict spacing a vendor's refusals taught (`spacing/learned.rs`).
    pub(super) learned_spacing: Nanos,
}

impl Slowed {
    pub(super) fn is_empty(&self) -> bool {
        self.pace.is_none()
            && self.leak.is_none()
            && self.strict == Nanos::NONE
            && self.learned_spacing == Nanos::NONE
    }

    /// When the pace and the leak let a request go, at the stamp `at`.
    pub(super) fn earliest_at(&self, at: Stamp) -> Stamp {
        let pace = self.pace.as_ref().map_or(at, |pace| pace.earliest_at(at));
        let leak = self
            .leak
            .as_ref()
            .map_or(at, |leak| leak.earliest_at(1, at));
        pace.max(leak)
    }

    /// Charge the pace and the leak one request at the stamp `at`.
    pub(super) fn commit_at(&mut self, at: Stamp) {
        if let Some(pace) = &mut self.pace {
            pace.commit_at(1, at);
        }
        if let Some(leak) = &mut self.leak {
            leak.commit_at(1, at);
        }
    }

    /// The pace and the leak, as meters counting requests.
    pub(super) fn paces(&self) -> impl Iterator<Item = &dyn Meter> {
        let pace = self.pace.as_ref().map(|pace| pace as &dyn Meter);
        let leak = self.leak.as_ref().map(|leak| leak as &dyn Meter);
        pace.into_iter().chain(leak)
    }
}

/// A duration in nanoseconds (saturated at 584 years), 0 for none: half
/// the room of a `Duration` (a third of an `Option<Duration>`), in every
/// gate's meters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Nanos(u64);

impl Nanos {
    pub(super) const NONE: Self = Self(0);

    fn of(duration: Duration) -> Self {
        Self(nanos(duration))
    }

    pub(super) fn or_none(duration: Option<Duration>) -> Self {
        duration.map_or(Self::NONE, Self::of)
    }

    fn duration(self) -> Duration {
        Duration::from_nanos(self.0)
    }

    pub(super) fn get(self) -> Option<Duration> {
        (self.0 > 0).then(|| self.duration())
    }
}
