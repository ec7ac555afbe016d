//! The bodies the proxy answers with: a whole one it wrote itself, or the
//! vendor's, relayed chunk by chunk as it arrives.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// A body the proxy answers with. An enum, not a boxed body: every
/// answer would otherwise cost an allocation and a virtual call a frame.
pub(super) enum ProxyBody {
    /// Written whole by the proxy (taken as it is polled).
    Full(Option<Bytes>),
    /// The vendor's, relayed (see [`relay`]).
    Relay(reqwest::Body),
}

/// A body written whole.
pub(super) fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    let bytes: Bytes = bytes.into();
    ProxyBody::Full((!bytes.is_empty()).then_some(bytes))
}

/// The vendor's body (its response's own), relayed as it arrives:
/// server-sent events reach the client one by one. hyper polls it as it
/// writes to the client, so nothing is buffered beyond the chunk in hand
/// and a slow client slows the read from the vendor. When the client goes
/// away, even while the vendor is silent, hyper drops it with the
/// connection, and with it the vendor's response: the upstream call ends
/// and frees its in-flight slot.
pub(super) fn relay(body: reqwest::Body) -> ProxyBody {
    ProxyBody::Relay(body)
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match self.get_mut() {
            Self::Full(bytes) => Poll::Ready(bytes.take().map(|bytes| Ok(Frame::data(bytes)))),
            Self::Relay(body) => Pin::new(body).poll_frame(cx).map_err(io::Error::other),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Full(bytes) => bytes.is_none(),
            Self::Relay(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Full(bytes) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            Self::Relay(body) => body.size_hint(),
        }
    }
}
