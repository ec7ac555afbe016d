//! A waiting caller's end of its ticket, and who counts it out.
//!
//! The lane counts the callers waiting for a turn (`Shared::waiting`): the
//! queue bound, the `max_wait` prediction and the fast path all read it.
//! Exactly one side counts a ticket out, whichever ends it first:
//!
//! - the dispatcher, when its answer (a turn, or a refusal) reaches the
//!   ticket's channel;
//! - the caller, when it leaves unanswered (its future dropped, its
//!   `max_wait` ran out) or learns that the lane closed.
//!
//! So a caller who gives up frees its place at once, not when the
//! dispatcher reaches its dead ticket at the head of the queue. A caller
//! leaving closes its channel before it looks for an answer: from then on
//! no answer can arrive, so the two sides never both count it out.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use tokio::sync::oneshot;
use tokio::sync::oneshot::error::TryRecvError;

use super::policy::Priority;
use super::shared::Shared;
use super::turn::{Answer, Ticket, Turn};
use crate::error::Error;

/// The caller's end of a ticket the dispatcher holds.
pub(super) struct Waiter {
    answer: oneshot::Receiver<Answer>,
    /// Whose count this ticket is in; `None` once counted out.
    lane: Option<Arc<Shared>>,
}

impl Waiter {
    /// A ticket for the dispatcher and the caller's end of it. The caller
    /// has already counted it in.
    pub(super) fn ticket(
        shared: &Arc<Shared>,
        seq: u64,
        cost: u64,
        priority: Priority,
    ) -> (Ticket, Self) {
        let (tx, rx) = oneshot::channel();
        let ticket = Ticket {
            seq,
            cost,
            priority,
            not_before: None,
            turn: tx,
        };
        let waiter = Self {
            answer: rx,
            lane: Some(shared.clone()),
        };
        (ticket, waiter)
    }

    /// The answer if it has come: `Ok(None)` when it has not, `Err` when
    /// the lane closed without one.
    pub(super) fn try_answer(&mut self) -> Result<Option<Turn>, Error> {
        match self.answer.try_recv() {
            Ok(answer) => {
                self.ended(true);
                answered(Some(answer)).map(Some)
            }
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Closed) => {
                self.ended(false);
                Err(Error::Shutdown)
            }
        }
    }

    /// Leave the queue. An answer that came just before is still taken.
    pub(super) fn leave(&mut self) -> Option<Result<Turn, Error>> {
        // Counted out already: nothing to leave.
        self.lane.as_ref()?;
        // No answer can arrive once the channel is closed.
        self.answer.close();
        let answer = self.answer.try_recv().ok();
        self.ended(answer.is_some());
        answer.map(|answer| answered(Some(answer)))
    }

    /// The ticket ended; the dispatcher counted it out if it `answered`.
    fn ended(&mut self, answered: bool) {
        if let Some(lane) = self.lane.take()
            && !answered
        {
            lane.count_out();
        }
    }
}

/// Waiting for the dispatcher's answer. A plain future rather than an
/// `async fn`: every queued request holds one, so it stays one pointer.
impl Future for Waiter {
    type Output = Result<Turn, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let answer = ready!(Pin::new(&mut self.answer).poll(cx));
        self.ended(answer.is_ok());
        Poll::Ready(answered(answer.ok()))
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        // A turn that came just before is dropped with it, freeing its
        // in-flight slot.
        drop(self.leave());
    }
}

/// The dispatcher's answer as the caller's outcome; `None` when the lane
/// closed without one.
fn answered(answer: Option<Answer>) -> Result<Turn, Error> {
    match answer {
        Some(Ok(turn)) => Ok(turn),
        Some(Err(refusal)) => Err(*refusal),
        None => Err(Error::Shutdown),
    }
}
