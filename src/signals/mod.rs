//! Throttle signals: what a vendor's response says about its limits and
//! when to send again, in every common dialect, read into one [`Signals`].
//!
//! Every parser here takes any bytes a vendor (or a broken proxy) can put in
//! a header and never panics: what it cannot read, it ignores, and the lane
//! falls back to its own exponential backoff.
//!
//! | dialect | header(s) | format |
//! |---|---|---|
//! | RFC 9110 | `Retry-After` | delta-seconds, or an HTTP-date |
//! | OpenAI and others | `retry-after-ms` | milliseconds |
//! | AWS | `x-amz-retry-after` | milliseconds |
//! | gRPC | `grpc-retry-pushback-ms` | milliseconds |
//! | GitHub, X, Discord | `x-ratelimit-{limit,remaining,reset,used}`, X's `x-rate-limit-*`, Discord's `x-ratelimit-reset-after` | reset = epoch seconds (a small value is read as seconds from now); reset-after = seconds with milliseconds |
//! | OpenAI | `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` | reset = a duration such as `6m0s`, `1.5s`, `17ms` |
//! | Anthropic | `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}` | reset = RFC 3339 timestamp |
//! | IETF httpapi draft | `RateLimit-Policy: "p";q=100;w=60`, `RateLimit: "p";r=50;t=30`, and the older `RateLimit-Limit/-Remaining/-Reset` | structured fields; `t` = seconds until reset |
//! | Shopify REST | `X-Shopify-Shop-Api-Call-Limit` | `used/capacity`, e.g. `32/40` |
//!
//! A negative value or a time in the past means "now"; a value too large to
//! represent saturates (and is then refused by the lane's `max_pause`).
//! Header names are matched without regard to case, as HTTP requires.
//!
//! A vendor with a dialect of its own needs no fork: give the shaper a
//! [`Dialect`] (any `Fn(&HeaderMap, SystemTime, &mut Signals)` is one).
//!
//! | file | what it owns |
//! |---|---|
//! | `said.rs` | [`Signals`], [`Limit`], [`Dimension`]: what a response said, and what the lane asks of it |
//! | `dialects.rs` | the [`Dialect`] trait and the built-in readers, one per vendor family ([`Signals::parse`]) |
//! | `formats.rs` | the value formats: numbers, dates, Go durations, RFC 3339, structured fields; `LONGEST`, the longest wait a header can ask for |
//! | `retry_after.rs` | [`retry_after`]: `Retry-After` and the millisecond headers ahead of it |
//! | `clock.rs` | the [`WallClock`] trait, [`SystemClock`], [`vendor_clock`], and an answer's clock, read only when a dialect needs it |
//! | `cite.rs` | what a pause cites of the vendor's words |
#![doc = include_str!("lane.md")]

mod cite;
mod clock;
mod dialects;
mod formats;
mod retry_after;
mod said;

pub(crate) use self::cite::cite;
pub(crate) use self::clock::AnswerClock;
pub use self::clock::{SystemClock, WallClock, vendor_clock};
pub use self::dialects::Dialect;
pub(crate) use self::dialects::Spoken;
pub use self::retry_after::retry_after;
pub use self::said::{Dimension, Limit, Signals};

#[cfg(test)]
mod tests;
