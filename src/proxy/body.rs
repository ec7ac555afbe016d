//! The bodies the proxy answers with: a whole one it wrote itself, or the
//! vendor's, relayed chunk by chunk as it arrives.

use std::io;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};

/// A body the proxy answers with.
pub(super) type ProxyBody = BoxBody<Bytes, io::Error>;

/// A body written whole.
pub(super) fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// The vendor's body (its response's own), relayed as it arrives: server-sent events reach
/// the client one by one. hyper polls it as it writes to the client, so
/// nothing is buffered beyond the chunk in hand and a slow client slows
/// the read from the vendor. When the client goes away, even while the
/// vendor is silent, hyper drops it with the connection, and with it the
/// vendor's response: the upstream call ends and frees its in-flight
/// slot.
pub(super) fn relay(body: reqwest::Body) -> ProxyBody {
    body.map_err(io::Error::other).boxed()
}
