//! Meters decide *when* the head of a lane's queue may go.
//!
//! The lane asks each meter two questions: "when could a request of this
//! cost go?" ([`Meter::earliest`], which spends nothing) and, once the
//! request has really been handed to its caller, "charge it"
//! ([`Meter::commit`]). Keeping the two apart is what lets a cancelled caller
//! spend no quota, lets a lane with several meters charge none of them
//! until all agree, and lets admission predict a wait without reserving
//! anything.
//!
//! | algorithm | `Quota::` | shape | state | against a vendor counting a strict sliding window of `per` |
//! |---|---|---|---|---|
//! | [`LeakyBucket`] (default) | `leaky_bucket(n, per)` | smooth, no burst | one instant | holds |
//! | [`TokenBucket`] | `token_bucket(capacity, n, per)` | bursts up to `capacity` (the last of a full burst half the headroom later, so a burst landing late cannot crowd the refill) | one instant | up to capacity + n: pair it with a token-bucket vendor |
//! | [`FixedWindow`] | `fixed_window(n, per)` | "1000 per day" | two numbers | up to 2n around a window boundary (tested) |
//! | [`SlidingLog`] | `sliding_log(n, per)` | exact | one entry per release in the window | holds, weighted too |
//! | [`SlidingWindow`] | `sliding_window(n, per)` | near-exact | three numbers | holds under a steady backlog; can exceed if the previous window was bunched at its end |
//!
//! A [`Quota`] declares one: an algorithm and what it counts ([`Unit`]:
//! requests, or each request's cost, such as tokens). An algorithm of your
//! own is a [`Meter`] implementation, declared with [`Quota::custom`] and
//! used like the built-in ones (in memory; a shared store knows only the
//! built-in ones).

//! | file | what it owns |
//! |---|---|
//! | `rate.rs` | [`Rate`], and the arithmetic of time at a rate (GCRA) |
//! | `meter.rs` | the [`Meter`] trait every algorithm implements |
//! | `quota.rs` | [`Quota`]: an algorithm, what it counts, how strictly |
//! | `leaky_bucket.rs`, `token_bucket.rs`, `fixed_window.rs`, `sliding_log.rs`, `sliding_window.rs` | the five algorithms, each with its guarantee beside its arithmetic |
//! | `custom.rs` | [`CustomMeter`]: an algorithm of your own |
//! | `windows.rs` | windows counted from an origin (the window meters) |
//! | `releases.rs` | a lane's ledger of its own releases |
//! | `stamps.rs` | where a ledger keeps its stamps: a few in place, more in a buffer |
//! | `terms.rs` | what a gate's meters count by: the quotas, each bucket's numbers, the ledger's window; one for every gate of a level |
//! | `inline.rs` | a quota's meter as a gate keeps it: a bucket as its one stamp, asked with its level's numbers |
//! | `counts.rs` | where a gate's meters keep their state: one bucket in place, anything more (several quotas, what slows them) in one box |
//! | `set.rs` | a gate's meters checked together, charged all or none |
//! | `declared.rs` | a quota as a config file declares it (feature `serde`) |

mod counts;
mod custom;
#[cfg(feature = "serde")]
mod declared;
mod fixed_window;
mod inline;
mod leaky_bucket;
mod meter;
pub(crate) mod quota;
pub(crate) mod rate;
mod releases;
mod requests;
mod set;
mod sliding_log;
mod sliding_window;
mod stamps;
mod terms;
mod token_bucket;
mod windows;

pub use self::custom::{CustomMeter, MakeMeter};
pub use self::fixed_window::FixedWindow;
pub use self::leaky_bucket::LeakyBucket;
pub use self::meter::Meter;
pub(crate) use self::quota::Quota;
pub use self::quota::{Algorithm, Unit};
pub(crate) use self::rate::Rate;
#[cfg(test)]
pub(crate) use self::releases::Reach;
pub(crate) use self::releases::Releases;
pub(crate) use self::requests::Requests;
pub(crate) use self::set::{FIRST_WORD, Meters};
pub use self::sliding_log::SlidingLog;
pub use self::sliding_window::SlidingWindow;
pub(crate) use self::terms::Terms;
#[cfg(any(feature = "config", feature = "proxy"))]
pub(crate) use self::terms::largest_cost;
pub use self::token_bucket::TokenBucket;
