//! The client's request body on its way to the vendor: kept whole when it
//! fits in [`ProxyBuilder::replay_body`](super::ProxyBuilder::replay_body),
//! so that a throttled request is sent again from the copy; a larger one
//! streams to the vendor as it arrives (after what was read of it) and is
//! sent once, whatever the vendor answers. Either way a client that
//! leaves its body silent for the body read timeout is cut off
//! ([`Cut::Stalled`]), as nginx's `client_body_timeout` does: it would
//! hold its connection, and a streaming call its in-flight slot, for
//! good.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::stall::Stall;

/// Why a client's body did not reach its end.
#[derive(Debug, thiserror::Error)]
pub(super) enum Cut {
    /// The body failed: the client went, or sent less than it said.
    #[error("the request body ended before its end: {0}")]
    Failed(#[from] hyper::Error),
    /// The client sent nothing of it for this long.
    #[error("the client sent nothing of its request body for {0:?}")]
    Stalled(Duration),
}

impl Cut {
    /// The cut that failed a vendor call, if one did: `error`'s chain
    /// holds it (the call failed as its streaming body did).
    pub(super) fn in_chain<'e>(error: &'e (dyn std::error::Error + 'static)) -> Option<&'e Self> {
        let mut link = Some(error);
        while let Some(error) = link {
            if let Some(cut) = error.downcast_ref::<Self>() {
                return Some(cut);
            }
            link = error.source();
        }
        None
    }
}

/// The body to send: reusable when whole, streamed past `keep` bytes,
/// the client given `idle` between two reads. An error is the client's
/// body cut before `keep` bytes.
pub(super) async fn read(
    mut body: Incoming,
    keep: usize,
    idle: Duration,
) -> Result<reqwest::Body, Cut> {
    let mut kept = Vec::new();
    let mut size = 0usize;
    loop {
        let frame = tokio::time::timeout(idle, body.frame())
            .await
            .map_err(|_| Cut::Stalled(idle))?;
        let Some(frame) = frame else {
            break;
        };
        // Trailers do not cross: HTTP/1.1 to the vendor has no way to
        // send them after a body it frames itself.
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        size = size.saturating_add(data.len());
        kept.push(data);
        if size > keep {
            return Ok(reqwest::Body::wrap(Streamed {
                read: kept.into(),
                rest: body,
                stall: Stall::new(idle),
            }));
        }
    }
    Ok(reqwest::Body::from(whole(kept, size)))
}

fn whole(mut kept: Vec<Bytes>, size: usize) -> Bytes {
    if kept.len() <= 1 {
        return kept.pop().unwrap_or_default();
    }
    let mut all = Vec::with_capacity(size);
    for chunk in kept {
        all.extend_from_slice(&chunk);
    }
    all.into()
}

/// What was read of a large body, then the rest as the client sends it,
/// cut when the client leaves it silent for the body read timeout.
struct Streamed {
    read: VecDeque<Bytes>,
    rest: Incoming,
    stall: Stall,
}

impl Body for Streamed {
    type Data = Bytes;
    type Error = Cut;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Cut>>> {
        if let Some(chunk) = self.read.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        let polled = loop {
            match Pin::new(&mut self.rest).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) if !frame.is_data() => continue,
                polled => break polled,
            }
        };
        self.stall.wait(cx, polled).map(|waited| match waited {
            Ok(frame) => frame.map(|frame| frame.map_err(Cut::Failed)),
            Err(idle) => Some(Err(Cut::Stalled(idle))),
        })
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_empty() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let read: u64 = self.read.iter().map(|c| c.len() as u64).sum();
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(read));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(read));
        }
        hint
    }
}
