//! The client's request body on its way to the vendor: kept whole when it
//! fits in [`ProxyBuilder::replay_body`](super::ProxyBuilder::replay_body),
//! so that a throttled request is sent again from the copy; a larger one
//! streams to the vendor as it arrives (after what was read of it) and is
//! sent once, whatever the vendor answers.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;

/// The body to send: reusable when whole, streamed past `keep` bytes. An
/// error is the client's body failing before `keep` bytes (cut off).
pub(super) async fn read(mut body: Incoming, keep: usize) -> Result<reqwest::Body, hyper::Error> {
    let mut kept = Vec::new();
    let mut size = 0usize;
    while let Some(frame) = body.frame().await {
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

/// What was read of a large body, then the rest as the client sends it.
struct Streamed {
    read: VecDeque<Bytes>,
    rest: Incoming,
}

impl Body for Streamed {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(chunk) = self.read.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        loop {
            match Pin::new(&mut self.rest).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) if !frame.is_data() => continue,
                polled => return polled,
            }
        }
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
