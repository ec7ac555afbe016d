//! The front door: [`Shaper`](crate::Shaper) wraps a reqwest client and
//! sends every request through the lanes of its quotas. This module holds
//! what comes with it: its builder, one request's options, and the
//! transport underneath.
//!
//! | file | what it owns |
//! |---|---|
//! | `handle.rs` | the `Shaper` handle, what its clones share, live quota changes and snapshots |
//! | `builder.rs` | [`ShaperBuilder`] (`Shaper::builder`): settings, checked at `build()` |
//! | `request.rs` | [`RequestBuilder`]: one request and its options; `Shaper::get`, `post` and the rest |
//! | `transport.rs` | [`Transport`]: what puts an attempt on the wire |
//! | `registry.rs` | the `Registry`: lanes and gates by key, created on first use, evicted when idle, and live quota changes |
//! | `call.rs` | one request's life (`Shaper::execute`): wait, send, let the crate's `throttle` module judge the answer, go again or finish; the options a request carries ([`MaxWait`]) |
//! | `again.rs` | a send that did not end its request: go again after the lane's pause or a backoff, or end, and with what |
//! | `heard.rs` | what a vendor's answer said: its signals, a quota it announced, the verdict, a client's own redirects |
//! | `redirect.rs` | the next hop of a redirect the shaper follows, through the lane of its URL |
//! | `settle.rs` | [`Settle`]: a request's real cost, reported after the answer |
//! | `body.rs` | a response with its body wrapped: the one place that takes a reqwest response apart, for the two below |
//! | `held.rs` | a response that holds its lane's in-flight slot until its body ends |
//! | `usage.rs` | a response that settles its cost from the usage it reports (feature `tokens`) |
//! | `metering.rs` | what a lane that costs tokens adds to a request's life, and nothing without the feature |
//! | `lanes.rs` | the registry's sharded map of lanes, its sweeper, `max_lanes` |

pub(crate) mod again;
mod body;
mod builder;
pub(crate) mod call;
pub(crate) mod handle;
mod heard;
mod held;
mod lanes;
mod metering;
mod redirect;
mod registry;
mod request;
mod settle;
mod transport;
#[cfg(feature = "tokens")]
mod usage;

pub use self::builder::ShaperBuilder;
#[cfg(feature = "config")]
pub(crate) use self::builder::own_client;
pub use self::call::MaxWait;
pub use self::request::{RequestBuilder, RequestOptions};
pub use self::settle::Settle;
pub use self::transport::{BoxFuture, Transport};
