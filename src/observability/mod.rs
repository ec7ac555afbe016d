//! What a lane tells the outside: a `tracing` span per request and per
//! attempt, `metrics` series (feature `metrics`), next to the `tracing`
//! events and [`LaneSnapshot`](crate::LaneSnapshot). Nothing here is
//! called by hand: the shaper reports as it works, to whatever `tracing`
//! subscriber and `metrics` recorder the application installed.
//!
//! | file | what it owns |
//! |---|---|
//! | `mod.rs` | the labels: which vendor, level and route a lane belongs to |
//! | `metrics.rs` | the series, described with units, and their handles |
//! | `spans.rs` | the request and attempt spans, and what is recorded on them |
//!
//! # Spans
//!
//! Every request runs in a `callshaper.request` span (`lane`, `vendor`,
//! `level`, `route`, `method`, `url` without its query, `cost`,
//! `priority`), on which its end records `queued_ms` (the time it waited
//! in its lane, over all its attempts), `attempts`, `throttles` and
//! `outcome` (`response`, or the error's [`reason`](crate::Error::reason)).
//! Each send is a child `callshaper.attempt` span (`attempt`, then
//! `status` or `error`), so a trace shows the wait in the lane as the gap
//! between the request span's start and its first attempt, and a
//! transport's own spans (reqwest-tracing) nest under the attempt.
//!
//! # Metrics
//!
//! Every series carries `vendor` (the vendor level's key: the origin, or
//! the shared level's name), `level` (the lane's narrowest level: `vendor`,
//! or a level's name such as `tenant`) and `route` (the route's name, or
//! empty). One lane per tenant or API key would make a series per key, so
//! that is opt-in ([`ShaperBuilder::metrics_per_lane`]), which adds a `lane`
//! label; without it, lanes of the same vendor, level and route add up in
//! one series, whose count the shaper's configuration bounds.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `callshaper_released_total` | counter | | attempts released to the wire |
//! | `callshaper_throttles_total` | counter | `status`, `cause` | throttling answers (429, 503, 529, a throttling 403) |
//! | `callshaper_pauses_total` | counter | `cause` | pauses taken (a throttle, a spent quota, the fleet, the application) |
//! | `callshaper_retries_total` | counter | | failure retries (5xx, transport) |
//! | `callshaper_refused_total` | counter | `reason` | requests ended with an error, not the vendor's response, by [`Error::reason`](crate::Error::reason) |
//! | `callshaper_queue_depth` | gauge | | requests waiting in the lanes |
//! | `callshaper_in_flight` | gauge | | requests released and not yet answered |
//! | `callshaper_pause_end_timestamp_seconds` | gauge | | when the latest pause ends, in Unix seconds: `callshaper_pause_end_timestamp_seconds - time()` is the pause left |
//! | `callshaper_quota_rate` | gauge | | requests per second the lane's tightest declared request quota allows |
//! | `callshaper_learned_rate` | gauge | | requests per second the vendor's answers taught the lane (absent until it learned one) |
//! | `callshaper_wait_seconds` | histogram | | time from submission to first release |
//! | `callshaper_store_mode` | gauge, state set | `mode` | with a shared store: 1 for the mode in force (`shared`, `fallback`, `unavailable`), 0 for the others |
//!
//! Handles of the hot path are registered once, when the lane is created,
//! so a release pays an atomic add, not a lookup; without the feature, or
//! without a recorder installed, all of it costs nothing.
//!
//! [`ShaperBuilder::metrics_per_lane`]: crate::ShaperBuilder::metrics_per_lane

mod labels;
mod metrics;
mod spans;

pub(crate) use self::labels::Labels;
pub(crate) use self::metrics::{InFlight, LaneMetrics, StoreMetrics};
pub(crate) use self::spans::RequestSpan;
