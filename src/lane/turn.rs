//! A turn: permission to send one request now (and the ticket a request
//! waits for it with), and, on a strict lane, the word of when it really
//! went and when its answer came ([`Landing`]), which the lane's next
//! release is measured from (see `spacing/departures.rs`).
//!
//! # The door
//!
//! A strict turn is released [`LEAD`] before its send may go and waits at
//! the door ([`Turn::door_opens`]) for the instant itself. The hand-over from
//! the dispatcher to the caller's task, and the timer's tick, then happen
//! before that instant instead of after it: measured from the last send,
//! they would widen every gap by their latency, for good (at 100/s, 1.5 ms
//! of every 10). The gap on the wire is the spacing, within the door's
//! own wake-up (tens of microseconds).

use std::pin::Pin;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use tokio::sync::futures::OwnedNotified;
use tokio::sync::{OwnedSemaphorePermit, oneshot};
use tokio::time::{Instant, sleep_until};

use super::gates::Gates;
use super::policy::Priority;
use crate::error::Error;
use crate::gate::{Booked, Gate};
use crate::meters::Meters;
use crate::time::{Stamp, later};

/// Permission to send one request now. Dropping it frees the lane's
/// in-flight slot, if the lane has a cap.
#[derive(Debug)]
#[must_use = "the turn is the permission to send: send while holding it"]
pub struct Turn {
    pub(super) in_flight: Option<OwnedSemaphorePermit>,
    /// When the meters were charged, to settle the charge later.
    pub(super) at: Instant,
    /// On a shared store, what the fleet had booked in each gate's window
    /// ending at this slot.
    pub(super) fleet: Option<Fleet>,
    /// On a strict lane, what the turn must still do on its way to the
    /// wire. Boxed: a turn that goes at once carries one empty word for
    /// it, and moves and drops as a smaller value.
    pub(super) strict: Option<Box<Strict>>,
}

/// A strict turn's way to the wire.
#[derive(Debug)]
pub(super) struct Strict {
    /// The lane whose next release waits to hear when this one went (see
    /// [`Turn::went`]).
    pub(super) transit: Transit,
    /// Not on the wire before this (the last send plus the spacing; see
    /// the module's docs), unless already open.
    pub(super) door: Option<Instant>,
}

/// What a fleet booked in each of a lane's gates' windows ending at one
/// slot (see `Reserved`), shared by the slot and its turn. Behind one thin
/// pointer: every waiting request's answer has room for a turn.
pub(crate) type Fleet = Arc<Vec<Option<Booked>>>;

/// A strict turn's gates, told when the turn went, or that it never did.
pub(super) struct Transit(Gates);

impl std::fmt::Debug for Transit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Transit").field(&self.0.len()).finish()
    }
}

impl Transit {
    /// The turn is about to be released: its gates wait for its word.
    pub(super) fn leave(gates: &Gates) -> Self {
        for gate in gates.iter() {
            gate.departures().leave();
        }
        Self(gates.clone())
    }

    fn went(self, at: Option<Instant>) -> Gates {
        for gate in self.0.iter() {
            gate.went(at);
        }
        self.0
    }
}

/// A strict turn's request on its way to the vendor: told when its answer
/// came, the lane measures its next send from when the request likely got
/// there (see `Departures::answered`). Dropped unanswered, it says
/// nothing more.
pub(crate) struct Landing {
    gates: Gates,
    went: Instant,
}

impl Landing {
    /// The vendor answered now.
    pub(crate) fn answered(self) {
        let now = Instant::now();
        for gate in self.gates.iter() {
            gate.answered(self.went, now);
        }
    }
}

impl Drop for Turn {
    #[inline]
    fn drop(&mut self) {
        if let Some(strict) = self.strict.take() {
            strict.transit.went(None);
        }
    }
}

pub(super) struct Ticket {
    pub(super) seq: u64,
    pub(super) cost: u64,
    pub(super) priority: Priority,
    /// A retry backing off: filed by its number only then.
    pub(super) not_before: Option<Instant>,
    pub(super) turn: oneshot::Sender<Answer>,
}

/// What the dispatcher hands a waiting request: its turn, or (a
/// fail-closed lane whose store is down) a refusal.
pub(super) type Answer = Result<Turn, Refusal>;

/// The store is down and the lane fails closed: the error, boxed, so an
/// answer is no larger than a turn (and a waiting caller need not keep its
/// lane at hand to build it).
pub(super) type Refusal = Box<Error>;

impl Turn {
    /// Wait until this turn's request may go on the wire: on a strict
    /// lane, its door (see the module's docs); at once on any other.
    pub(crate) async fn door_opens(&mut self) {
        if let Some(door) = self.strict.as_mut().and_then(|strict| strict.door.take()) {
            // Boxed: only a strict lane's turn waits at a door, and every
            // waiting request would otherwise carry room for its timers.
            Box::pin(on_time(door)).await;
        }
    }

    /// The request went on the wire: a strict lane measures its next send
    /// from here. [`Lane::acquire`] says so as it hands the turn over; the
    /// shaper says so once the transport took the request, so no send of
    /// the lane's reaches the transport sooner than the spacing after this.
    /// On a strict lane, what to tell when the answer comes.
    pub(crate) fn went(&mut self) -> Option<Landing> {
        let strict = self.strict.take()?;
        let went = Instant::now();
        let gates = strict.transit.went(Some(went));
        Some(Landing { gates, went })
    }

    /// The lane's in-flight slot, for the response to hold until its body
    /// ends (`None` on a lane without a cap); the turn no longer frees it.
    pub(crate) fn keep_in_flight(&mut self) -> Option<OwnedSemaphorePermit> {
        self.in_flight.take()
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

/// How far ahead of its door a strict turn is released (see the module's
/// docs): tokio's timers tick in milliseconds and round a deadline up to
/// the next tick, and the hand-over takes a few hundred microseconds more
/// on a busy machine.
pub(super) const LEAD: Duration = Duration::from_millis(3);

/// How far ahead of the door the caller's timer wakes; the last of it is
/// slept on the OS's timer and yielded through on the real clock (see
/// [`on_time`]).
const EARLY: Duration = Duration::from_millis(2);

/// What a sleep on the blocking pool takes to hand back to the caller's
/// task, on a busy machine: yielded through rather than slept.
const HANDOFF: Duration = Duration::from_micros(250);

/// Strict spacing, for a lane whose meters keep it (see `spacing/`):
/// `Ok(Some(door))` with the instant the lane's next request of `cost`
/// may go on the wire (a full gap after the last that really went, and
/// when its meters allow it), `Ok(None)` on a lane that is not strict, and
/// `Err` with a wake-up while a turn released before is still on its way
/// to the wire: its word says when it went, which the next is measured
/// from.
pub(super) fn departure(
    gates: &[Arc<Gate>],
    meters: &[MutexGuard<'_, Meters>],
    cost: u64,
    now: Instant,
) -> Result<Option<Door>, Pin<Box<OwnedNotified>>> {
    let mut strict = false;
    let mut at = now;
    for (meters, gate) in meters.iter().zip(gates) {
        let Some(gap) = meters.spacing() else {
            continue;
        };
        strict = true;
        let departures = gate.departures();
        if departures.in_transit() {
            // Enabled, then checked again: a word in between is not missed.
            let wake = gate.next_turn();
            if departures.in_transit() {
                return Err(wake);
            }
        }
        if let Some(last) = departures.last() {
            at = at.max(later(last, gap));
        }
    }
    Ok(strict.then(|| Door(earliest(meters, cost, at).max(at))))
}

/// When a strict lane's next request goes on the wire: the turn is
/// released [`LEAD`] before, its meters are charged at this instant (the
/// ledger a refusal is read against holds sends, not hand-overs), and it
/// waits at the door for it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Door(Instant);

impl Door {
    /// When the turn may be released: [`LEAD`] before the door.
    pub(super) fn release(self) -> Instant {
        self.0.checked_sub(LEAD).unwrap_or(self.0)
    }

    /// When the request goes, and the meters are charged.
    pub(super) fn at(self) -> Instant {
        self.0
    }

    /// The door a turn released at `now` waits at, if it is still shut.
    pub(super) fn shut(self, now: Instant) -> Option<Instant> {
        (self.0 > now).then_some(self.0)
    }
}

/// Wake at `at`, not a tick later: the timer wakes [`EARLY`], the OS's own
/// timer (a thread of the blocking pool in `nanosleep`) sleeps all but the
/// last [`HANDOFF`] of the rest, and the task yields through that last bit
/// until the real clock reaches `at`. Yielding through all of [`EARLY`]
/// kept a core busy: 11 % of one for a strict lane at 100/s, 23 % at
/// 200/s, against 4 % and 8 % so. A paused test clock, whose instants run
/// ahead of the real one, is never waited for: the sleep to `at` races the
/// OS's, so the clock advances to `at` and no further meanwhile. (A sleep
/// to an instant already past still waits for the timer's next tick: a
/// millisecond, on every gap.)
async fn on_time(at: Instant) {
    if Instant::now() < at {
        sleep_until(at.checked_sub(EARLY).unwrap_or(at)).await;
    }
    let left = at.saturating_duration_since(Instant::now()).min(EARLY);
    let real = std::time::Instant::now() + left;
    if let Some(nap) = left.checked_sub(HANDOFF).filter(|nap| !nap.is_zero()) {
        // A runtime shutting down ends the nap early: the yield below
        // still keeps the send from going before `at`.
        let os = tokio::task::spawn_blocking(move || std::thread::sleep(nap));
        tokio::select! {
            biased;
            _ = os => {}
            () = sleep_until(at) => {}
        }
    }
    while std::time::Instant::now() < real {
        tokio::task::yield_now().await;
    }
    if Instant::now() < at {
        sleep_until(at).await;
    }
}

/// When every meter of `meters` allows a request of `cost`.
pub(super) fn earliest(meters: &[MutexGuard<'_, Meters>], cost: u64, now: Instant) -> Instant {
    Stamp::answer(now, |at| earliest_at(meters, cost, now, at))
}

/// [`earliest`] at `now`, whose stamp is `at`: the fast path's question,
/// answered in stamps.
#[inline]
pub(super) fn earliest_at(
    meters: &[MutexGuard<'_, Meters>],
    cost: u64,
    now: Instant,
    at: Stamp,
) -> Stamp {
    let mut earliest = at;
    for meters in meters {
        earliest = earliest.max(meters.earliest_at(cost, now, at));
    }
    earliest
}
