//! When a shaper's lane may go although its meters still count, and what
//! it leaves behind: its own gates' meters, resting in the shaper's gate
//! map with what keeps its vendor's model alive (see `gate/map.rs`).

use std::sync::Arc;

use tokio::time::Instant;

use super::handle::Lane;
use crate::gate::{GateMap, Keep};
use crate::sync::Going;

/// What may stay behind when a lane goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leaving {
    /// Its own gates' meters, resting while they count: the sweeper lets a
    /// lane quiet for its idle timeout go so.
    Resting,
    /// Nothing of its own: the cap evicts only lanes whose own gates count
    /// nothing (resting meters are not lanes, and the cap does not bound
    /// them).
    Bare,
}

impl Lane {
    /// True when the lane can go at `now` and lose nothing: nobody holds
    /// or waits in it, it is on no store, each gate of its own counts
    /// nothing (or, `Resting`, can rest), and the vendor's counts nothing
    /// or lives on without it (see [`vendor_lives_on`](Self::vendor_lives_on),
    /// or while a gate of this one that rests holds its model). `going`:
    /// the lanes that go with it (a sweep's, still held until they go,
    /// counted by [`goes`](Self::goes)), whose hold is no word that the
    /// model lives on.
    pub(crate) fn can_leave(&self, now: Instant, leaving: Leaving, going: &Going) -> bool {
        let shared = &self.shared;
        if !self.held_alone() || self.queued() != 0 {
            return false;
        }
        let Some((vendor, own)) = shared.gates.split_last() else {
            return false;
        };
        if shared.remote().is_some() {
            // On a store, as before there was resting: every gate rested.
            return shared.gates.iter().all(|gate| gate.is_idle(now));
        }
        // Each gate of its own is read once (its meters' lock).
        let mut rests = false;
        for gate in own {
            if gate.is_idle(now) {
                continue;
            }
            if leaving == Leaving::Bare || !gate.can_rest(now) {
                return false;
            }
            rests = true;
        }
        // A gate of its own that rests keeps the model alive.
        rests || self.vendor_lives_on(going) || vendor.is_idle(now)
    }

    /// True when its vendor's model lives on without this lane and those
    /// `going`: its road does, held by another of its lanes that stays, or
    /// the model is held by more than its road (another road, a resting
    /// gate) and not only by roads going whole.
    fn vendor_lives_on(&self, going: &Going) -> bool {
        let road = &self.shared.road;
        let model = self.shared.vendor();
        Arc::strong_count(road) > 1 + going.on(&**road)
            || Arc::strong_count(model) > 1 + going.on(&**model)
    }

    /// Count this lane in `going`, as a sweep lets it go: a hold on its
    /// road, and, when the road's last lane goes, the road's hold on its
    /// vendor's model.
    pub(crate) fn goes(&self, going: &mut Going) {
        let road = &self.shared.road;
        going.add(&**road);
        if going.on(&**road) >= Arc::strong_count(road) {
            going.add(&**self.shared.vendor());
        }
    }

    /// Go, after [`can_leave`](Self::can_leave) said so at `now`
    /// (`Resting`) and the lane left its owner's map: each gate of its own
    /// that still counts and that no other lane took up meanwhile rests in
    /// `map`, keeping the vendor's model alive.
    pub(crate) fn leave(self, map: &GateMap, now: Instant) {
        let own: Vec<_> = match self.shared.gates.split_last() {
            Some((_, own)) => own.to_vec(),
            None => Vec::new(),
        };
        let keep: Arc<dyn Keep> = self.shared.vendor().clone();
        // The lane's hold goes first: a gate only it held is then the
        // map's to rest.
        drop(self);
        for gate in own {
            map.rest(gate, &keep, now);
        }
    }
}
