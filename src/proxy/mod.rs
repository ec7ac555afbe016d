//! A [`Shaper`](crate::Shaper) served as an HTTP reverse proxy, one prefix
//! per vendor (feature `proxy`): any client that can set a base URL (a
//! Python service, a Rust SDK that builds its own `reqwest::Client`) is
//! shaped by the same lanes, store and metrics as the library's callers.
//!
//! `http://LISTEN/NAME/rest?query` goes to `UPSTREAM/rest?query` for the
//! upstream configured as `NAME`, through the shaper exactly as
//! [`Shaper::execute`](crate::Shaper::execute) would send it: queued in
//! FIFO order, released at the vendor's pace, paused by its throttles.
//!
//! ```no_run
//! use std::time::Duration;
//! use callshaper::proxy::Proxy;
//! use callshaper::{Quota, Shaper};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let shaper = Shaper::builder()
//!     .quota(Quota::leaky_bucket(10, Duration::from_secs(1)))
//!     .build()?;
//! let proxy = Proxy::builder(shaper)
//!     .upstream("vendor", "https://api.vendor.example")
//!     .build()?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7777").await?;
//! // A client now calls http://127.0.0.1:7777/vendor/v1/things.
//! proxy.serve(listener).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # What it forwards, and what it answers itself
//!
//! - **Only to configured upstreams.** An unknown prefix gets 404 with a
//!   JSON body naming the configured ones; an absolute-form target
//!   (`GET http://elsewhere/`) or `CONNECT` gets 405, and a path with a
//!   `.` or `..` segment, however spelled (`%2e`, after `\`, `%2f` or
//!   `%5c`, `..;x`), 400. Nothing is ever sent anywhere else, nor out of
//!   an upstream's base path: it is not an open proxy.
//! - **Hop-by-hop headers** (RFC 9110 §7.6.1: `Connection` and the headers
//!   it names, `Keep-Alive`, `TE`, `Trailer`, `Transfer-Encoding`,
//!   `Upgrade`, `Proxy-*`) are dropped both ways, and `Host` is the
//!   upstream's.
//! - **Per-request controls** travel as headers and are never forwarded:
//!   `x-callshaper-max-wait: 5s`, `x-callshaper-cost: 1200`,
//!   `x-callshaper-tag: acme`, `x-callshaper-priority: batch`. A value that
//!   does not parse gets 400 naming the header, and so does a tag longer
//!   than 256 bytes: a level keyed by tag keeps a lane for each, with its
//!   tag in it. An upstream's
//!   [`defaults`](ProxyBuilder::defaults) stand in for those a client does
//!   not send.
//! - **A client token**, when the proxy has one
//!   ([`ProxyBuilder::client_token`]): a request without it in
//!   `x-callshaper-token` gets 401 before its upstream is even looked up.
//! - **Tokens.** A vendor whose lanes cost tokens
//!   ([`TokenCost`](crate::tokens::TokenCost)) is charged what its clients'
//!   calls use, read from the answers as they pass, streams included.
//! - **The vendor's answer** reaches the client as the vendor sent it
//!   (status, headers, body), hop-by-hop headers aside (a `101 Switching
//!   Protocols` no request asked for is a 502: the proxy forwards no
//!   upgrade); the body streams chunk by chunk as it arrives, so
//!   server-sent events pass through one by one. A request holds its
//!   lane's `max_in_flight` slot until that body's last byte, and a client
//!   that goes away mid-stream ends the upstream call and frees the slot,
//!   even while the vendor is silent; one that hangs up while its request
//!   waits in the lane takes it out, so the vendor never gets it and the
//!   next one waiting takes its turn.
//! - **A redirect** is relayed, not followed: the client follows it, and
//!   that hop takes its turn like any request. A `Location` under the
//!   upstream's base (absolute or relative) becomes the same path under
//!   the proxy's prefix (`/NAME/...`), as nginx's `proxy_redirect
//!   default` does, so a client that follows it stays shaped; one
//!   elsewhere (a download host) stays as the vendor wrote it.
//! - **When the shaper ends a request** the proxy answers by itself: 429
//!   when the queue is full or the wait would pass the client's deadline,
//!   503 for a store down under a closed policy, a shutdown, or a pause
//!   longer than `max_pause`, and the vendor's own status when it said it
//!   is out of credit. Each carries a `Retry-After` computed from the lane
//!   (the wait it predicted, the pause it was asked for, or its queue at
//!   its pace) and `x-callshaper-reason` ([`Error::reason`]), with a JSON
//!   body saying the same.
//! - **Request bodies** up to [`ProxyBuilder::replay_body`] (4 MiB by
//!   default) are read whole before the request queues, so a throttled
//!   request is sent again from the copy. A larger body streams to the
//!   vendor as the client sends it and is **sent once**: a throttle or a
//!   failure on it reaches the client as the vendor answered.
//! - **Hostile clients:** a head over [`ProxyBuilder::max_header_bytes`]
//!   gets 431, a body that stops half-way 400, a head not sent within
//!   [`ProxyBuilder::header_read_timeout`] a closed connection, and a body
//!   left silent for [`ProxyBuilder::body_read_timeout`] 408 (a streaming
//!   one is cut at the vendor too, freeing its in-flight slot); a client
//!   that takes nothing of its answer for [`ProxyBuilder::send_timeout`]
//!   is disconnected, and its vendor call ends. Nothing is forwarded for
//!   them, and every other connection is served as before. A kept-alive
//!   connection that sends no next request within `header_read_timeout`
//!   closes, and past [`ProxyBuilder::max_connections`] (10,000) open at
//!   once, the proxy accepts no client until one closes.
//! - **The vendor's timeouts** are those of the shaper's client. With
//!   none (reqwest's default) a vendor that never answers holds its call,
//!   and its in-flight slot, until the client goes: give the shaper a
//!   client with `connect_timeout` and `read_timeout` (in a file, the
//!   `[client]` table), longer than the vendor's slowest answer.
//! - **A client that goes away** ends its request where it is: one queued
//!   leaves its lane, a vendor call ends. Closing only its sending side is
//!   going away too (hyper reads it so): such a client gets no answer, and
//!   spends no quota once it is gone.
//! - **Stopping:** [`Proxy::serve_until`] closes the listener and lets each
//!   connection finish the request it serves; bound it, then shut the
//!   shaper down for what still waits.
//!
//! # Not yet
//!
//! The proxy serves HTTP/1.1 to its clients, and sends no request
//! trailers on.
//!
//! [`Error::reason`]: crate::Error::reason

mod answer;
mod body;
mod builder;
mod client;
mod forward;
mod server;
mod stall;
mod upload;

pub use self::builder::{Proxy, ProxyBuilder};
