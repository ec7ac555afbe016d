//! A gate's pace: what it keeps to besides its declared quotas (a
//! learned quota and its probe, adaptive pacing, a bucket's leak), as
//! plain state.

use std::time::Duration;

use tokio::time::Instant;

use super::window::WindowEnds;
use crate::adaptive::Aimd;
use crate::meters::Rate;

/// What slows a gate below its quotas.
pub(super) struct Pace {
    /// The slowest of the gate's quotas that count requests: the ceiling a
    /// learned quota or adaptive pacing is measured against.
    pub(super) declared: Option<Rate>,
    /// The smallest token bucket among them, if one is (see
    /// `Window::allows`).
    pub(super) bucket: Option<u64>,
    /// A lower quota the vendor announced.
    pub(super) learned: Option<Rate>,
    /// Adaptive pacing's share of the request rate.
    pub(super) aimd: Option<Aimd>,
    /// When the last refused request had been released: releases before
    /// it were not all accepted.
    pub(super) refused_at: Option<Instant>,
    /// How a quota learned from a refusal is probed back up.
    pub(super) probe: Option<Probe>,
    /// The capacity of the vendor's bucket, when `learned` is its rate (a
    /// leak read off its levels, or a quota a bucket vendor taught by a
    /// refusal): then the lane may use the room the vendor reports, and
    /// the learned rate refills it (`Meters::set_leak`) rather than
    /// spacing every request.
    pub(super) leak: Option<u64>,
    /// A bucket that does not say its rate refused the lane, and its levels
    /// have not shown the rate yet: the lane keeps to its declared rate
    /// without bursts, so the bucket neither fills at once (another
    /// refusal) nor runs empty, and its levels show what leaks.
    pub(super) unread: bool,
    /// The ends of the vendor's fixed window, as it wrote them.
    pub(super) ends: WindowEnds,
    /// What the vendor's bucket last said it had left, and when the request
    /// it counted last had been released (for a lane on a shared store,
    /// whose bursts keep within it).
    pub(super) left: Option<(u64, Instant)>,
    /// The vendor's "remaining" is its burst room, not what is left of a
    /// window (see [`Gate::burst_room`]).
    pub(super) burst_room: bool,
}

/// Probing a quota learned from a refusal back up towards the declared
/// one, slowly: a refusal may have come from a consumer since gone, or an
/// outage, and a lane must not keep a low pace for ever.
///
/// After `quiet` without a refusal ([`PROBE_QUIET`] declared windows at
/// first), the pace rises by a twentieth (at least one request) per
/// declared window, up to the declared quota, where probing ends. A
/// refusal while raised puts the pace back where it was and doubles
/// `quiet`: against a vendor that really allows the learned quota, probing
/// costs one refusal after 30 windows, then after 60, 120, ... (at most 2
/// in the first 60 windows, 7 in 3,600).
#[derive(Debug, Clone, Copy)]
pub(super) struct Probe {
    /// When the pace next rises.
    pub(super) at: Instant,
    pub(super) quiet: Duration,
    /// The quota the refusal taught, which a refused probe returns to.
    pub(super) base: Rate,
    /// True once the pace rose above `base`.
    pub(super) raised: bool,
}

/// Declared windows without a refusal before a learned quota is probed.
pub(super) const PROBE_QUIET: u32 = 30;
