//! A response that holds its lane's in-flight slot until its body ends:
//! `max_in_flight` caps requests on the wire, and a streamed answer
//! (server-sent events, a download) is on the wire until its last byte.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::OwnedSemaphorePermit;

use super::body::wrap_body;

/// `response`, its body holding `slot` until it ends, fails or is dropped.
pub(super) fn until_body_ends(
    response: reqwest::Response,
    slot: OwnedSemaphorePermit,
) -> reqwest::Response {
    wrap_body(response, |body| {
        reqwest::Body::wrap(Holding {
            body,
            slot: Some(slot),
        })
    })
}

/// A body and the slot it holds.
struct Holding {
    body: reqwest::Body,
    slot: Option<OwnedSemaphorePermit>,
}

impl Body for Holding {
    type Data = Bytes;
    type Error = reqwest::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, reqwest::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        // The last frame, the end or an error: off the wire. A reader that
        // stops at the last frame's `is_end_stream` frees it too.
        let ended = match &polled {
            Poll::Ready(None | Some(Err(_))) => true,
            Poll::Ready(Some(Ok(_))) => self.body.is_end_stream(),
            Poll::Pending => false,
        };
        if ended {
            self.slot = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
