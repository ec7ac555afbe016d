//! How long a client has kept the proxy waiting ([`Stall`]): on its
//! request body, or to take its answer.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Sleep;

/// A client's silence, timed: it starts as a read or a write first
/// waits on the client, starts afresh as one goes through, and is out
/// after `limit`. Only the waits on the client count: the time the vendor
/// takes to accept or send a chunk passes between polls.
pub(super) struct Stall {
    limit: Duration,
    /// When the silence runs out, while a read or write waits.
    out_at: Option<Pin<Box<Sleep>>>,
}

impl Stall {
    pub(super) fn new(limit: Duration) -> Self {
        Self {
            limit,
            out_at: None,
        }
    }

    /// `polled` when it is ready; while it waits, `Err(limit)` once the
    /// client has been silent that long (the task is woken then).
    pub(super) fn wait<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<T>,
    ) -> Poll<Result<T, Duration>> {
        if let Poll::Ready(ready) = polled {
            self.out_at = None;
            return Poll::Ready(Ok(ready));
        }
        let limit = self.limit;
        let out_at = self
            .out_at
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        out_at.as_mut().poll(cx).map(|()| Err(limit))
    }
}
