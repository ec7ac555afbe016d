//! The in-memory engine: a lane's gates' meters, in this process.
//!
//! Check and charge happen under the meters' locks, so nothing can come
//! between them: the check is exact, and the fast path
//! ([`Lane::enter`](crate::lane)) can take a turn under the same locks
//! without a trip through the dispatcher.
//!
//! **Fair sharing.** A lane ready but for one shared gate joins that
//! gate's queue and keeps its place there until it goes, so when a slot
//! frees, the lane that has waited longest takes it, whichever lane's timer
//! fires first. A lane held back by another gate (its own tenant cap)
//! leaves the queue, so it never blocks a gate it could not use anyway.

use std::sync::MutexGuard;

use tokio::time::Instant;

use super::engine::{Blocked, Release, Step};
use super::ready::Ready;
use crate::lane::queue::Head;
use crate::lane::shared::Shared;
use crate::lane::turn::earliest;
use crate::lane::turn::{Door, departure};
use crate::meters::Meters;

/// Releases by the gates' meters in this process.
#[derive(Default)]
pub(in crate::lane) struct Local {
    /// Since when this lane has been ready but for a shared gate: its place
    /// in those gates' queues.
    since: Option<Instant>,
}

impl Release for Local {
    async fn release(&mut self, ready: &mut Ready<'_>, head: Head, now: Instant) -> Step {
        self.step(ready, head, now)
    }

    fn step_aside(&mut self, shared: &Shared) {
        if let Some(since) = self.since.take() {
            for gate in shared.gates.iter() {
                gate.delist((since, shared.id()));
            }
        }
    }
}

/// When what holds the head until `at` is a gate waiting for the vendor's
/// first answer: wait for that answer (any lane's), at most until `at`.
/// Enabled while the meters are locked, so an answer after this is not
/// missed.
fn first_word(shared: &Shared, meters: &[MutexGuard<'_, Meters>], at: Instant) -> Option<Blocked> {
    let (_, gate) = meters
        .iter()
        .zip(shared.gates.iter())
        .find(|(meters, _)| meters.first_word() == Some(at))?;
    let answer = gate.next_turn();
    Some(Blocked::Turn(Box::pin(async move {
        // Past `at` the burst goes anyway.
        let _ = tokio::time::timeout_at(at, answer).await;
    })))
}

impl Local {
    /// [`release_now`](Self::release_now) as a dispatcher step.
    pub(super) fn step(&mut self, ready: &mut Ready<'_>, head: Head, now: Instant) -> Step {
        match self.release_now(ready, head, now) {
            Ok(_) => Step::Done,
            Err(blocked) => Step::Wait(blocked),
        }
    }

    /// Hand the head its turn if every meter allows it now and no lane
    /// that waited longer is first in a shared gate's queue, or say what to
    /// wait for. `Ok(true)` when the head got its turn, `Ok(false)` when
    /// its caller had left.
    pub(super) fn release_now(
        &mut self,
        ready: &mut Ready<'_>,
        head: Head,
        now: Instant,
    ) -> Result<bool, Blocked> {
        let cost = head.cost;
        let shared = ready.shared;
        let handed = shared.with_meters(|meters| {
            // Strict: released ahead of its door, charged at it (see
            // `lane/turn.rs`).
            let door =
                departure(&shared.gates, meters, cost, now).map_err(|word| Blocked::Turn(word))?;
            let at = door.map_or_else(|| earliest(meters, cost, now), Door::release);
            if let Some(blocked) = self.queue_up(shared, meters, cost, now) {
                return Err(blocked);
            }
            if at > now {
                let blocked = first_word(shared, meters, at);
                return Err(blocked.unwrap_or(Blocked::Until(at)));
            }
            let charged = door.map_or(now, Door::at);
            let handed = ready.hand(
                head,
                charged,
                None,
                door.is_some(),
                door.and_then(|door| door.shut(now)),
            );
            if handed {
                for meter in meters.iter_mut() {
                    meter.commit(cost, charged);
                }
            }
            Ok(handed)
        });
        if matches!(handed, Ok(true)) {
            self.step_aside(shared);
        }
        handed
    }

    /// Take or keep this lane's place in the queue of each shared gate that
    /// alone holds it back; leave the queues of gates it could not use
    /// anyway. `Some` when another lane is first at a gate that would let
    /// this one go now.
    fn queue_up(
        &mut self,
        shared: &Shared,
        meters: &[MutexGuard<'_, Meters>],
        cost: u64,
        now: Instant,
    ) -> Option<Blocked> {
        if !shared.gates.iter().any(|gate| shared.is_shared(gate)) {
            return None;
        }
        let times: Vec<Instant> = meters.iter().map(|m| m.earliest(cost, now)).collect();
        let me = (*self.since.get_or_insert(now), shared.id());
        let mut held_by = None;
        for (i, gate) in shared
            .gates
            .iter()
            .enumerate()
            .filter(|(_, gate)| shared.is_shared(gate))
        {
            let others_allow = times.iter().enumerate().all(|(j, &at)| j == i || at <= now);
            if !others_allow {
                gate.delist(me);
                continue;
            }
            gate.enlist(me);
            if times[i] <= now && !gate.is_first(me) {
                held_by = Some(gate);
            }
        }
        let at = times.iter().copied().max().unwrap_or(now);
        let gate = held_by.filter(|_| at <= now)?;
        // Enabled while the meters are locked: the lane ahead can only go,
        // and wake us, after we let go of them.
        Some(Blocked::Turn(gate.next_turn()))
    }
}
