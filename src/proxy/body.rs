//! The bodies the proxy answers with: a whole one it wrote itself, or the
//! vendor's, relayed chunk by chunk as it arrives.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use tokio::sync::mpsc;

/// A body the proxy answers with.
pub(super) type ProxyBody = BoxBody<Bytes, io::Error>;

/// A body written whole.
pub(super) fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// The vendor's body, relayed as it arrives: server-sent events reach
/// the client one by one. A task reads the vendor's response and hands
/// each chunk over; when the client goes away, even while the vendor is
/// silent, the task ends and drops the response, which ends the upstream
/// call and frees its in-flight slot. One chunk is buffered: a slow
/// client slows the read from the vendor.
pub(super) fn relay(mut response: reqwest::Response) -> ProxyBody {
    let (chunks, relay) = mpsc::channel(1);
    tokio::spawn(async move {
        loop {
            let read = tokio::select! {
                read = response.chunk() => read,
                () = chunks.closed() => break,
            };
            let chunk = match read {
                Ok(Some(chunk)) => Ok(chunk),
                Ok(None) => break,
                Err(error) => Err(io::Error::other(error)),
            };
            let failed = chunk.is_err();
            if chunks.send(chunk).await.is_err() || failed {
                break;
            }
        }
    });
    Relay { chunks: relay }.boxed()
}

/// The client's side of [`relay`].
struct Relay {
    chunks: mpsc::Receiver<io::Result<Bytes>>,
}

impl Body for Relay {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.chunks
            .poll_recv(cx)
            .map(|chunk| chunk.map(|chunk| chunk.map(Frame::data)))
    }
}
