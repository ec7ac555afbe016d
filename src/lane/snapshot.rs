//! [`LaneSnapshot`]: what a lane is doing right now, for dashboards.

use std::time::Duration;

use crate::gate::PauseCause;
use crate::meters::Rate;

/// What a lane is doing right now. With the `serde` feature it serializes
/// (durations as text like `"1.5s"`), to serve it as JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct LaneSnapshot {
    /// The lane's key.
    pub key: String,
    /// Requests waiting to be released (throttled ones included).
    pub queued: usize,
    /// Time left in the current pause, if any.
    #[cfg_attr(feature = "serde", serde(with = "crate::time::human::option"))]
    pub paused_for: Option<Duration>,
    /// Why the lane is paused, if it is.
    pub pause_cause: Option<PauseCause>,
    /// What the vendor said that paused the lane, as it said it: the header
    /// that gave the hint (`retry-after: 2`), else each limit with nothing
    /// left (`requests: 0 of 10 left, reset in 1s`). `None` when the vendor
    /// said nothing usable, and for a fleet's or an application's pause.
    pub pause_said: Option<String>,
    /// Turns handed out so far.
    pub released: u64,
    /// Throttled answers (429, 503) seen so far.
    pub throttles: u64,
    /// The spacing between two requests now (slower than the policy's when
    /// the vendor announced a lower quota or adaptive pacing cut it).
    #[cfg_attr(feature = "serde", serde(with = "crate::time::human"))]
    pub interval: Duration,
    /// A quota lower than the configured one that the vendor announced, and
    /// the lane now keeps to.
    pub learned: Option<Rate>,
    /// Strict spacing in force (declared with [`Quota::strict`](crate::Quota::strict),
    /// or learned from a vendor's spacing refusals): no two sends closer
    /// than this, measured from when the last one went. `None`: the meters
    /// hold the count and forgive timer lateness.
    #[cfg_attr(feature = "serde", serde(with = "crate::time::human::option"))]
    pub spacing: Option<Duration>,
    /// With a shared store: whether the lane is on it, on its local
    /// fallback, or refusing. `None` in memory.
    pub store: Option<crate::store::StoreMode>,
}
