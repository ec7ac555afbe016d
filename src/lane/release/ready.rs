//! The hand-over between the dispatcher and a release engine: a waiting
//! ticket as the queue holds it, and [`Ready`], what an engine needs to
//! hand the head its turn (or end everyone waiting).

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, oneshot};
use tokio::time::Instant;

use crate::error::Error;
use crate::lane::queue::{Costed, Head, Queue};
use crate::lane::shared::Shared;
use crate::lane::turn::Fleet;
use crate::lane::turn::{Answer, Strict, Transit, Turn};
use crate::time::Stamp;

/// A waiting ticket, as the dispatcher's queue holds it.
pub(in crate::lane) struct Waiting {
    cost: u64,
    turn: oneshot::Sender<Answer>,
}

impl Waiting {
    /// A ticket of `cost` whose turn goes to `turn`.
    pub(in crate::lane) fn new(cost: u64, turn: oneshot::Sender<Answer>) -> Self {
        Self { cost, turn }
    }
}

impl Costed for Waiting {
    fn cost(&self) -> u64 {
        self.cost
    }

    fn is_live(&self) -> bool {
        !self.turn.is_closed()
    }
}

/// A lane whose head may go but for its engine: what the engine needs to
/// hand the head its turn.
pub(in crate::lane) struct Ready<'a> {
    pub(in crate::lane) shared: &'a Arc<Shared>,
    pub(in crate::lane) queue: &'a mut Queue<Waiting>,
    permit: Option<OwnedSemaphorePermit>,
}

impl<'a> Ready<'a> {
    /// The lane of `shared`, whose `queue` has a head that may go, holding
    /// the in-flight slot its turn takes (if the lane caps them).
    pub(in crate::lane) fn new(
        shared: &'a Arc<Shared>,
        queue: &'a mut Queue<Waiting>,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Self {
        Self {
            shared,
            queue,
            permit,
        }
    }

    /// End everyone waiting with `error`, at once.
    pub(in crate::lane) fn refuse_all(&mut self, error: impl Fn() -> Error) {
        let shared = self.shared;
        for waiting in self.queue.drain() {
            // Counted out by whoever ended it: here if the refusal reached
            // its caller, else by the caller as it left.
            if waiting.turn.send(Err(Box::new(error()))).is_ok() {
                shared.count_out();
            }
        }
    }

    /// Hand `head` its turn, charged at `now`, and count it; false if its
    /// caller left (its ticket is gone either way). `strict`: the lane
    /// keeps strict spacing, and its next release waits for this turn's
    /// word of when it went; `door`: not on the wire before then.
    pub(in crate::lane) fn hand(
        &mut self,
        head: Head,
        now: Instant,
        fleet: Option<Fleet>,
        strict: bool,
        door: Option<Instant>,
    ) -> bool {
        let Some(taken) = self.queue.take(head) else {
            return false;
        };
        if let Some(fleet) = &fleet {
            self.shared.handed_fleet(fleet);
        }
        let turn = Turn {
            in_flight: self.permit.take(),
            at: now,
            fleet,
            strict: strict.then(|| {
                Box::new(Strict {
                    transit: Transit::leave(&self.shared.gates),
                    door,
                })
            }),
        };
        // Sent, the turn is counted out here; unsent, its caller counted
        // itself out as it left.
        let handed = taken.waiting.turn.send(Ok(turn)).is_ok();
        let shared = self.shared;
        if handed {
            shared.count_out();
            shared.count_release();
            shared.active(Stamp::of(now));
            shared.metrics().released();
            self.queue.handed(taken.class, taken.batch_waited);
        }
        handed
    }
}
