//! A turn: permission to send one request now, and, on a strict lane, the
//! word of when it really went, which the lane's next release is measured
//! from (see `spacing.rs`).

use std::pin::Pin;
use std::sync::{Arc, MutexGuard};

use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::futures::OwnedNotified;
use tokio::time::Instant;

use super::Shared;
use crate::gate::Booked;
use crate::meters::Meters;
use crate::time::later;

/// Permission to send one request now. Dropping it frees the lane's
/// in-flight slot, if the lane has a cap.
#[derive(Debug)]
pub struct Turn {
    pub(super) _in_flight: Option<OwnedSemaphorePermit>,
    /// When the meters were charged, to settle the charge later.
    pub(super) at: Instant,
    /// On a shared store, what the fleet had booked in each gate's window
    /// ending at this slot.
    pub(super) fleet: Option<Fleet>,
    /// On a strict lane: the lane whose next release waits to hear when
    /// this one went (see [`Turn::went`]).
    pub(super) transit: Option<Transit>,
}

/// A strict turn's lane, told when the turn went, or that it never did.
pub(super) struct Transit(Arc<Shared>);

impl std::fmt::Debug for Transit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Transit").field(&self.0.key).finish()
    }
}

impl Transit {
    /// The turn is about to be released: its gates wait for its word.
    pub(super) fn leave(shared: &Arc<Shared>) -> Self {
        for gate in &shared.gates {
            gate.departures().leave();
        }
        Self(shared.clone())
    }

    fn went(self, at: Option<Instant>) {
        for gate in &self.0.gates {
            gate.went(at);
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(transit) = self.transit.take() {
            transit.went(None);
        }
    }
}

/// What a fleet booked in each of a lane's gates' windows ending at one
/// slot (see `Reserved`), shared by the slot and its turn. Behind one thin
/// pointer: every waiting request's answer has room for a turn.
pub(crate) type Fleet = Arc<Vec<Option<Booked>>>;

impl Turn {
    /// The request goes on the wire now: a strict lane measures its next
    /// send from here. [`Lane::acquire`] says it as it hands the turn over;
    /// the shaper says it as the transport takes the request.
    pub(crate) fn went(&mut self) {
        if let Some(transit) = self.transit.take() {
            transit.went(Some(Instant::now()));
        }
    }

    /// When the lane's meters were charged for this turn.
    pub(crate) fn at(&self) -> Instant {
        self.at
    }

    /// What the fleet had booked in each gate's window ending at this
    /// turn's slot; `None` in memory, and for a turn off the store.
    pub(crate) fn fleet(&self) -> Option<Fleet> {
        self.fleet.clone()
    }
}

/// Strict spacing, for a lane whose meters keep it (see `spacing.rs`):
/// `Ok(Some(at))` when the last request that really went lets the next go
/// at `at`, `Ok(None)` when no send holds it (not strict, or nothing went
/// yet), and `Err` with a wake-up while a turn released before is still on
/// its way to the wire: its word says when it went, which the next is
/// measured from.
pub(super) fn departure(
    shared: &Shared,
    meters: &[MutexGuard<'_, Meters>],
) -> Result<Option<Instant>, Pin<Box<OwnedNotified>>> {
    let mut at = None;
    for (meters, gate) in meters.iter().zip(&shared.gates) {
        let Some(gap) = meters.spacing() else {
            continue;
        };
        let departures = gate.departures();
        if departures.in_transit() {
            // Enabled, then checked again: a word in between is not missed.
            let wake = gate.next_turn();
            if departures.in_transit() {
                return Err(wake);
            }
        }
        at = at.max(departures.last().map(|last| later(last, gap)));
    }
    Ok(at)
}

/// True when one of `meters` keeps strict spacing.
pub(super) fn is_strict(meters: &[MutexGuard<'_, Meters>]) -> bool {
    meters.iter().any(|meters| meters.spacing().is_some())
}
