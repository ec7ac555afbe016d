//! callshaper: outbound rate limiting for reqwest.
//!
//! A vendor grants a quota ("10 requests per second"). callshaper makes
//! exceeding it impossible by construction, and lets the vendor's throttling
//! signals steer every caller at once, so a burst of work never turns into a
//! retry storm.
//!
//! # The one idea
//!
//! Every upstream quota is a **lane** ([`Lane`]). A lane owns a bounded
//! **FIFO queue**, a **meter** that says when the head may go (a leaky
//! bucket by default, [`meters::LeakyBucket`]: one release every `(period +
//! headroom) / N`, no burst; or any of the other [`meters`], several at once), and a **pause** that the vendor's `Retry-After` moves forward,
//! never back. A 429 or 503 pauses the *lane*, not one request: the
//! throttled request goes back to the head of the queue and the lane resumes
//! at its nominal pace when the pause ends, with no catch-up burst.
//!
//! ```text
//! caller ──► Shaper ──► lane(key) ──► FIFO queue ──► turn ──► reqwest ──► vendor
//!                          ▲              (meter + pause)          │
//!                          └──── pause / back to the head ◄── 429, 503
//! ```
//!
//! # Guarantees
//!
//! - **Quota:** with a lane of N per W, releases are at least `(W +
//!   headroom) / N` apart, so the vendor never sees more than N arrivals in
//!   any window W, retries included, whatever the number of callers.
//! - **FIFO:** a lane releases requests in submission order; a retried
//!   request keeps its place.
//! - **No storm:** after a throttle the lane releases nothing until the pause
//!   ends.
//! - **Nothing lost:** every request ends in exactly one outcome, a response
//!   or an [`Error`]; a caller that drops its future frees its place and
//!   spends no quota.
//! - **No hang:** waits are bounded by `max_wait` and `max_pause`; a vendor
//!   asking for a longer pause gets [`Error::PauseTooLong`].
//!
//! # Modules
//!
//! | module | part of the design |
//! |---|---|
//! | [`client`] | [`Shaper`], the front door |
//! | [`lane`] | the FIFO queue, its dispatcher, pause and concurrency cap |
//! | [`meters`] | when the head may go: the five algorithms |
//! | [`route`] | which lanes a request goes through: keys, levels, routes |
//! | [`signals`] | what a response says about its limits, in every common dialect |
//! | [`adaptive`] | pacing for vendors that announce nothing (AIMD) |
//! | [`retry`] | which outcomes are tried again, and the backoff |
//! | `config` | a shaper declared in TOML or JSON (feature `config`) |
//! | `middleware` | `reqwest_middleware::Middleware` (feature `middleware`) |
//! | `testing` | a vendor with a quota, for wiremock tests (feature `testing`) |
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod adaptive;
pub mod client;
#[cfg(feature = "config")]
pub mod config;
pub mod error;
mod gate;
pub mod lane;
pub mod meters;
#[cfg(feature = "middleware")]
pub mod middleware;
pub mod retry;
pub mod route;
pub mod signals;
#[cfg(feature = "testing")]
pub mod testing;

pub use adaptive::Adaptive;
pub use client::{MaxWait, RequestBuilder, Settle, Shaper, ShaperBuilder, Transport};
#[cfg(feature = "config")]
pub use config::ShaperConfig;
pub use error::{ConfigError, Error};
pub use lane::{Lane, LanePolicy, LaneSnapshot, Priority, Turn};
pub use meters::{Algorithm, Meter, Quota, Rate, Unit};
pub use retry::{Backoff, RetryBudget, RetryPolicy};
pub use route::{Cost, LaneKey, Level, Route, Tag};
pub use signals::{Dialect, Signals};
