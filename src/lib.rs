//! callshaper: outbound rate limiting for reqwest.
//!
//! A vendor grants a quota ("10 requests per second"). callshaper makes
//! exceeding it impossible by construction, and lets the vendor's throttling
//! signals steer every caller at once, so a burst of work never turns into a
//! retry storm.
//!
//! # The one idea
//!
//! Every upstream quota waits in a **lane** ([`lane::Lane`]): a bounded **FIFO
//! queue** drained by one dispatcher, which releases the head when the
//! quota's **meters** allow it (a leaky bucket by default,
//! [`meters::LeakyBucket`]: one release every `(period + headroom) / N`, no
//! burst; or any of the other [`meters`], several at once) and no **pause**
//! holds it back. The vendor's `Retry-After` (and every other dialect in
//! [`signals`]) moves the pause forward, never back. A 429 or 503 pauses the
//! *lane*, not one request: the throttled request goes back to the head of
//! the queue and the lane resumes at its nominal pace when the pause ends,
//! with no catch-up burst. Which statuses throttle, fail or are final is
//! the vendor's [`Answers`].
//!
//! ```text
//! caller ──► Shaper ──► lane(key) ──► FIFO queue ──► turn ──► reqwest ──► vendor
//!                          ▲           (gates: meters + pause)      │
//!                          └──── pause / back to the head ◄── 429, 503, remaining: 0
//! ```
//!
//! Quotas come in levels (the vendor's, per tenant, per route): a request
//! waits in the one lane of its keys and is released when every level's
//! quota allows it at once; lanes under the same vendor share its quota and
//! its pause (see [`route`]).
//!
//! # Guarantees
//!
//! Each is proven by a test against a real wiremock server, with tokio's paused
//! clock (`tests/`).
//!
//! - **Quota.** A lane of N per W never lets more than N arrivals into any
//!   window of W (its releases span at least `W + headroom / 2` for every N + 1
//!   in a row), whatever the number of concurrent callers, retries included.
//!   Releases are *on average* `(W + headroom) / N` apart, but two in a row may
//!   be closer by up to the lateness the meters forgive (`headroom / 2`): a
//!   release whose timer fired late keeps the schedule, which is what lets a
//!   200/s lane use 99 % of its quota on millisecond timers.
//! - **Spacing, when the vendor measures it.** A strict lane
//!   (`Quota::leaky_bucket(10, second).strict()`, `strict = true` in a file)
//!   sends no two requests closer than `(W + headroom) / N`, measured from
//!   when the last one really reached the transport. A strict turn is
//!   released 3 ms early and waits at the door for its instant, so neither
//!   the hand-over to the caller's task nor a timer's tick widens the gap
//!   (on the wire, under load, 1,000 requests at 100/s: smallest gap
//!   10.052-10.058 ms against 10.05 ms, 97-98 % of the quota with both cores
//!   busy; against a counting vendor at 100/s, 99.1 % strict beside 99.4 %
//!   in the default mode). Lateness past the door is never made up. A lane
//!   refused for its spacing (a send sooner than `W / N` after the last, or a
//!   refusal that says nothing at all at a gap about its interval) turns
//!   strict by itself and learns the gap, instead of learning a lower quota:
//!   see "Strict limiters" in [`signals`](signals#what-the-lane-does-with-what-vendors-say).
//! - **FIFO.** A lane releases requests in submission order; a throttled request
//!   keeps its place at the head. A request retried after a failure waits out
//!   its backoff in the queue without holding anyone up, then goes ahead of
//!   everyone submitted after it (when its backoff spans several of the lane's
//!   slots, requests behind it use them meanwhile).
//! - **No storm.** After a 429 or 503 the lane sends nothing until the pause
//!   ends (requests already on the wire may still land), then resumes at its
//!   nominal rate with no catch-up burst.
//! - **Nothing lost.** Every request ends in exactly one outcome: the response,
//!   or a typed `callshaper::Error` (`QueueFull`, `CostTooHigh`,
//!   `WouldExceedMaxWait`, `MaxWaitElapsed`, `PauseTooLong`,
//!   `RetriesExhausted`, `RetryBudgetExhausted`, `Transport`, `NoQuota`,
//!   `InvalidRequest`, `LaneLimit`, `Shutdown`). A caller that drops its future frees its
//!   place and spends no quota.
//! - **No hang.** Waits are bounded by `max_wait` and `max_pause`: a vendor that
//!   says `Retry-After: 99999999` gets `PauseTooLong`, not a stuck task.
//! - **Bad input never panics.** Header parsers take any bytes; garbage falls
//!   back to the exponential pause.
//!
//! # Modules
//!
//! | module | part of the design |
//! |---|---|
//! | [`shaper`] | [`Shaper`], the front door: its builder, one request's options, the transport |
//! | [`lane`] | the FIFO queue, its dispatcher, priorities and concurrency cap |
//! | `gate` | quotas and a pause a release must pass, shared between lanes |
//! | [`meters`] | when the head may go: the five algorithms |
//! | [`route`] | which lane a request waits in: keys, levels, routes |
//! | [`signals`] | what a response says about its limits, in every common dialect |
//! | `adaptive` | pacing for vendors that announce nothing (AIMD, [`lane::Adaptive`]) |
//! | `answers` | what a vendor's statuses and bodies mean, per vendor ([`Answers`]) |
//! | `throttle` | what a response means: final, throttle or failure; which pause, and why |
//! | [`retry`] | which failures are tried again, the backoff, the retry budget |
//! | `observability` | a `tracing` span per request and attempt; `metrics` series (feature `metrics`); see [below](#observability) |
//! | `config` | a shaper declared in TOML or JSON (feature `config`) |
//! | `middleware` | `reqwest_middleware::Middleware` (feature `middleware`) |
//! | `layer` | `ShaperLayer`, a tower `Layer` (feature `tower`) |
//! | `proxy` | the shaper served as a reverse proxy per vendor, for any client that sets a base URL (feature `proxy`) |
//! | `tokens` | an LLM call's tokens, estimated from its body and settled from the usage its answer reports (feature `tokens`) |
//! | [`store`] | where quotas live: this process, or Redis / Redis Cluster for a fleet (feature `redis`) |
//! | `testing` | a vendor with a quota, for wiremock tests; a `redis-server` of its own (feature `testing`) |
//!
//! # A fleet
//!
//! Lanes keep their quotas in memory by default: per process. With
//! [`ShaperBuilder::store`](shaper::ShaperBuilder::store) and a [`store::RedisStore`] (feature `redis`), a
//! fleet shares them: a lane *reserves* slots from one Redis state (Lua,
//! Redis's clock) and sleeps until each locally, a throttle pauses every
//! instance, and a [`StoreFailure`](store::StoreFailure) policy says what a lane does when Redis
//! is down. The queue, FIFO order, retries and signals stay local; the
//! guarantees above then hold for the fleet, up to the jitter between the
//! instances and the vendor, which the headroom absorbs.
//!
//! # Observability
//!
//! What a lane tells the outside: a `tracing` span per request and per
//! attempt, `metrics` series (feature `metrics`), next to the `tracing`
//! events and [`LaneSnapshot`](crate::lane::LaneSnapshot). Nothing here is
//! called by hand: the shaper reports as it works, to whatever `tracing`
//! subscriber and `metrics` recorder the application installed.
//!
//! ## Spans
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
//! ## Metrics
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
//! | `callshaper_lanes` | gauge | none | live lanes: made on a key's first request, gone once quiet for `idle_timeout` (a count they still hold rests, and is not a lane) or for `max_lanes` |
//! | `callshaper_resting_gates` | gauge | none | gates whose lane went while their meters still count (a day's quota partly spent): each rests as its meters until a request wakes it or its count ends |
//!
//! Handles of the hot path are registered once, when the lane is created,
//! so a release pays an atomic add, not a lookup; without the feature, or
//! without a recorder installed, all of it costs nothing.
//!
//! [`ShaperBuilder::metrics_per_lane`]: crate::shaper::ShaperBuilder::metrics_per_lane
//!
//! `cargo run --example prometheus` serves them on `/metrics` with
//! metrics-exporter-prometheus while a burst runs (`-- --serve` keeps it
//! running for a scraper), and `dashboards/callshaper.json` is a Grafana
//! dashboard over them: queue depth, in flight, wait p50/p99 (give
//! `callshaper_wait_seconds` buckets, as the example does), releases per
//! second against the quota, throttles and pauses by cause, refusals by
//! reason, retries and the store mode. `tests/dashboard.rs` checks every query
//! of the dashboard against what the exporter really renders.
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `rustls` | yes | https through rustls (reqwest's own default TLS) |
//! | `http2` | yes | reqwest's HTTP/2 |
//! | `system-proxy` | yes | proxies from the environment and the system settings |
//! | `charset` | yes | `Response::text` decodes the declared charset |
//! | `native-tls` | | https through the platform's TLS instead of rustls |
//! | `json`, `query`, `form`, `multipart` | | reqwest's request helpers of the same names on [`RequestBuilder`](shaper::RequestBuilder) |
//! | `serde` | | serde for the settings types and [`LaneSnapshot`](lane::LaneSnapshot) |
//! | `config` | | `ShaperConfig`: a shaper declared in TOML or JSON (implies `serde` and `tokens`) |
//! | `tokens` | | `tokens::TokenCost`: an LLM call's tokens estimated from its JSON body, settled from the usage in its answer or its stream |
//! | `metrics` | | the series of [observability](#observability) through the `metrics` facade |
//! | `middleware` | | `reqwest_middleware::Middleware` for [`Shaper`] |
//! | `tower` | | `ShaperLayer`: the shaper as a tower `Layer` over hyper's client, reqwest's `Service` or any `http` service |
//! | `redis` | | `store::RedisStore`: a fleet shares its quotas through Redis or Redis Cluster |
//! | `proxy` | | `proxy::Proxy`: the shaper served as a reverse proxy per vendor base URL, on hyper's HTTP/1 server (implies `serde`) |
//! | `testing` | | `testing::Vendor`, a wiremock vendor with a strict quota, and a `redis-server` of the test's own |
//!
//! **TLS.** The client callshaper builds when you give none speaks https
//! through the TLS backend its features choose: rustls by default,
//! `native-tls` with `default-features = false, features = ["native-tls", ...]`.
//! With neither (`default-features = false`), pass your own client with
//! `.client(..)`: callshaper's default client then speaks plain http only.
//! `tests/default-features` checks that a build with the default features only
//! starts a TLS handshake on an `https://` URL.
//!
//! **Rust 1.88 or newer** (`rust-version`): the code uses let-chains. CI holds
//! the code to it with clippy's `incompatible_msrv`, and no dependency asks
//! for more than 1.85.
//!
#![doc = include_str!("benchmarks.md")]
//!
//!
//! # Where the design went
//!
//! Where the code went beyond or away from the original design, its docs say so:
//! the leaky bucket is ours, not governor's (it must read tokio's clock and
//! answer "when" without charging); levels share gates rather than queue one
//! after another; the design's `Throttle` value is `signals::Signals`; in a
//! fleet, keys are hash-tagged by vendor rather than by lane (a lane charges
//! its tenant's, route's and vendor's gates in one script, so they must share a
//! shard).
//!
#![cfg_attr(not(feature = "redis"), doc = "[`store::RedisStore`]: crate#features")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, missing_debug_implementations)]
#![forbid(unsafe_code)]

mod adaptive;
mod answers;
#[cfg(feature = "config")]
pub mod config;
mod error;
mod gate;
pub mod lane;
#[cfg(feature = "tower")]
pub mod layer;
pub mod meters;
#[cfg(feature = "middleware")]
pub mod middleware;
mod observability;
#[cfg(feature = "proxy")]
pub mod proxy;
pub mod retry;
pub mod route;
pub mod shaper;
pub mod signals;
mod spacing;
pub mod store;
mod sync;
#[cfg(feature = "testing")]
pub mod testing;
mod throttle;
mod time;
#[cfg(feature = "tokens")]
pub mod tokens;
mod vendor;

pub use self::answers::Answers;
pub use self::error::{Answer, ConfigError, Error};
pub use self::meters::quota::Quota;
pub use self::meters::rate::Rate;
pub use self::shaper::handle::Shaper;
