//! Where lanes keep their quota state: in this process (the default), or in
//! Redis, shared by a fleet (feature `redis`).
//!
//! In memory, a lane checks its meters and charges them at the instant it
//! releases a request: nothing can come between, so the check is exact.
//! A fleet has no such instant. Three instances at "10 per second" each send
//! 10 per second, 30 in all. With a [`RedisStore`] the meters of a shared
//! quota live in one Redis hash per gate, and a lane asks Redis for a
//! **reservation** instead of checking locally: one Lua script (atomic,
//! Redis's own clock) finds the first instant every meter of every gate of
//! the lane allows the request, charges them all for that instant, and
//! answers "yours is in 140 ms". The instance keeps its own FIFO queue and
//! sleeps until then: the vendor sees one stream at the quota's pace, made
//! of every instance's requests, and nobody polls.
//!
//! - **Batches.** With several requests waiting, one round trip reserves a
//!   slot for each (up to [`RedisOptions::batch`]). A lane whose slots come
//!   due faster than a timer tick (a quota far above its demand) reserves
//!   the next full batches (up to four) while it uses the slots it holds.
//! - **Horizon.** No slot is reserved further ahead than
//!   [`RedisOptions::horizon`] (1 s by default). A lane whose next slot is
//!   later is told when, without being charged, and asks again then: a
//!   tenant held back by its own cap must not book the vendor's slots
//!   (which would hold every other tenant behind it), and a pause can
//!   spoil at most a horizon of reservations.
//! - **Give-back.** Slots a lane no longer needs (its callers gave up, or a
//!   pause came) are given back, when nobody reserved after them: the
//!   script undoes exactly its own charges or nothing.
//! - **Pauses.** A throttle seen by one instance moves the gates'
//!   `paused_until` forward in Redis and publishes it; every instance pauses
//!   its lanes at once, and every later reservation starts after the pause.
//! - **The fleet's ledger.** Each slot comes back with what the fleet
//!   booked in each gate's request window ending at it (counted in ticks of
//!   a 32nd of the window, so it errs high; slots given back leave it). A
//!   vendor's "0 left" on that slot's request is read against it, as a
//!   lane in memory reads its own releases: a fleet sharing the vendor
//!   with a consumer outside it pauses before a 429.
//! - **Failures.** Every call has a timeout ([`RedisOptions::timeout`]). When
//!   Redis fails, a lane follows its [`StoreFailure`]: fail-open serves
//!   from a local fallback at the quota divided by the expected number of
//!   instances; fail-closed ends waiting requests at once with
//!   [`Error::StoreUnavailable`](crate::Error::StoreUnavailable). Either way
//!   the lane tries Redis again every [`RedisOptions::probe_every`] and
//!   returns to it by itself. [`LaneSnapshot::store`](crate::lane::LaneSnapshot)
//!   and the `callshaper_store_mode` gauge say which mode a lane is in.
//!   A call that timed out on a hung Redis may still run when Redis wakes
//!   up: the slots it booked then go unused, which wastes quota but never
//!   exceeds it.
//! - **Expiry.** Every write sets a TTL: a gate's key lives as long as its
//!   reservations and windows matter, then Redis forgets it.
//!
//! Keys are `{prefix}{{vendor}}:{gate}`: the vendor's name is the Redis
//! Cluster hash tag, so all the gates a lane charges together (its tenant's,
//! its route's, the vendor's) live on one shard and one script can charge
//! them atomically.
//!
#![cfg_attr(
    not(feature = "redis"),
    doc = "[`RedisStore`]: crate#features\n[`RedisOptions::batch`]: crate#features\n[`RedisOptions::horizon`]: crate#features\n[`RedisOptions::timeout`]: crate#features\n[`RedisOptions::probe_every`]: crate#features\n[`RedisOptions::fleet_size`]: crate#features"
)]
#![cfg_attr(feature = "redis", doc = include_str!("fleet.md"))]
//!
//! # Adding a store
//!
//! Stores are added in this crate, not by its users: the contract is
//! crate-internal because every store shares the machinery around it. A
//! store is a module beside `redis/` (plus its scripts): implement
//! `SharedStore` (settings, and a link per lane) and `StoreLane`
//! (reserve, give back, settle, pause), and `impl From<YourStore> for
//! Store`. Everything a store does *not* decide, failure policy, probing,
//! probation and the release of booked slots, lives in `remote.rs` and
//! the lane's `Reserved` engine, the same for every store.

mod clock;
mod contract;
mod handle;
mod policy;
#[cfg(feature = "redis")]
mod redis;
mod remote;

pub use self::handle::Store;
pub use self::policy::{StoreFailure, StoreMode};
#[cfg(feature = "redis")]
pub use self::redis::{Clock, RedisOptions, RedisStore};
pub(crate) use self::remote::{Remote, Schedule, Source};
pub use crate::error::StoreError;
