//! The [`Meter`] trait: what every algorithm answers.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::time::later;

/// One rate-limiting algorithm's state.
///
/// Implement it for an algorithm of your own; the lane calls it under a
/// lock, with tokio's clock.
pub trait Meter: Send + fmt::Debug {
    /// The largest cost one request may have; a larger one could never go.
    fn capacity(&self) -> u64;
    /// When a request of `cost` (at most [`capacity`](Self::capacity))
    /// could go. Spends nothing.
    fn earliest(&self, cost: u64, now: Instant) -> Instant;
    /// Charge `cost` at `now`.
    fn commit(&mut self, cost: u64, now: Instant);
    /// A charge of `charged` made at `at` really cost `actual`.
    fn settle(&mut self, charged: u64, actual: u64, at: Instant);
    /// True when forgetting this meter would let nothing go sooner than it
    /// may.
    fn is_idle(&self, now: Instant) -> bool;
    /// The average spacing between single units, for wait predictions.
    fn interval(&self) -> Duration;

    /// When a request of `cost` could go if `ahead` units go first: the
    /// wait a newcomer is told at admission. The default spaces them
    /// `interval` apart, exact for a leaky bucket; meters that allow bursts
    /// know better.
    fn eta(&self, ahead: u64, cost: u64, now: Instant) -> Instant {
        let spacing = self
            .interval()
            .saturating_mul(u32::try_from(ahead).unwrap_or(u32::MAX));
        later(self.earliest(cost, now), spacing)
    }
}
