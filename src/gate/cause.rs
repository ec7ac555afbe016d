//! Why a gate pauses ([`PauseCause`], [`Paused`]), why it stops
//! ([`Stop`]), and what a fleet booked in its window ([`Booked`]).

use std::sync::Arc;

use tokio::time::Instant;

/// Why a lane is paused, as [`LaneSnapshot`](crate::lane::LaneSnapshot), the
/// `tracing` events and the logs say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum PauseCause {
    /// A final answer said the quota is used up until a reset, and the
    /// lane's own releases did not explain it.
    Spent,
    /// A final answer said one unit is left, and the lane's own releases
    /// did not explain the rest spent: another consumer spends the same
    /// quota and is as likely to take that unit as the lane's next
    /// request. The lane leaves it and waits until its own oldest release
    /// frees one.
    Contested,
    /// A vendor that measures the spacing of requests (nginx's
    /// `limit_req`) refused one for coming too soon after the last: the
    /// lane keeps its sends further apart, strictly, from then on (see
    /// [`LaneSnapshot::spacing`](crate::lane::LaneSnapshot::spacing)), and
    /// waits until that gap after the refused one.
    Spacing,
    /// A throttle said when to come back (`Retry-After` or a reset).
    Hinted,
    /// A throttle said nothing usable: the growing fallback pause.
    Unhinted,
    /// Another instance of the fleet paused the vendor's quota.
    Fleet,
    /// The application called [`Lane::pause_for`](crate::lane::Lane::pause_for).
    Requested,
}

impl PauseCause {
    /// The cause's name, as metrics label it.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Spent => "spent",
            Self::Contested => "contested",
            Self::Spacing => "spacing",
            Self::Hinted => "hinted",
            Self::Unhinted => "unhinted",
            Self::Fleet => "fleet",
            Self::Requested => "requested",
        }
    }
}

/// A pause in force: until when, why, and what the vendor said that asked
/// for it, as it said it (`retry-after: 2`), if it did.
#[derive(Debug, Clone)]
pub(crate) struct Paused {
    pub(crate) until: Instant,
    pub(crate) cause: PauseCause,
    pub(crate) said: Option<Arc<str>>,
}

/// Why a gate refuses everything for a while, as the vendor said it.
#[derive(Debug)]
pub(crate) struct Stop {
    pub(crate) status: u16,
    pub(crate) body: String,
}

/// What a fleet booked in a gate's request window ending at a release, as
/// its shared store counted it: at least `count` slots (the count errs
/// high), the oldest of which leaves the window at `leaves`, if known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Booked {
    pub(crate) count: u64,
    pub(crate) leaves: Option<Instant>,
}
