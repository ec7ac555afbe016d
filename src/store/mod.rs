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
//!   slot for each (up to [`RedisOptions::batch`]).
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
//! - **Failures.** Every call has a timeout ([`RedisOptions::timeout`]). When
//!   Redis fails, a lane follows its [`StoreFailure`]: fail-open serves
//!   from a local fallback at the quota divided by the expected number of
//!   instances; fail-closed ends waiting requests at once with
//!   [`Error::StoreUnavailable`](crate::Error::StoreUnavailable). Either way
//!   the lane tries Redis again every [`RedisOptions::probe_every`] and
//!   returns to it by itself. [`LaneSnapshot::store`](crate::LaneSnapshot)
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

#[cfg(feature = "redis")]
mod redis;

use std::time::Duration;

#[cfg(feature = "redis")]
pub use self::redis::{Clock, RedisOptions, RedisStore};
#[cfg(feature = "redis")]
pub(crate) use self::redis::{Remote, Source};

/// What a lane does when its shared store (Redis) cannot answer.
///
/// Pick per endpoint ([`Route::on_store_failure`](crate::Route::on_store_failure)):
/// fail-open for calls whose loss costs more than a few 429s (a checkout),
/// fail-closed where going over the quota is worse than not calling (a
/// vendor that bans keys, an API billed per overage).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StoreFailure {
    /// Keep serving from a local lane at the quota divided by the fleet's
    /// size ([`RedisOptions::fleet_size`]): one instance's share when the
    /// whole fleet falls back at once. It starts one horizon
    /// ([`RedisOptions::horizon`]) after the failure, when every slot other
    /// instances booked before it has gone.
    Open,
    /// End waiting and new requests at once with
    /// [`Error::StoreUnavailable`](crate::Error::StoreUnavailable): the
    /// quota is never at risk. The default, because it cannot go over.
    #[default]
    Closed,
}

/// Which state a lane's releases come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreMode {
    /// The shared store: the fleet's quota.
    Shared,
    /// The store failed; a fail-open lane serves from its local fallback.
    Fallback,
    /// The store failed; a fail-closed lane refuses until it is back.
    Unavailable,
}

impl StoreMode {
    /// The value of the `callshaper_store_mode` gauge.
    #[cfg(feature = "metrics")]
    pub(crate) fn gauge(self) -> f64 {
        match self {
            Self::Shared => 0.0,
            Self::Fallback => 1.0,
            Self::Unavailable => 2.0,
        }
    }
}

/// Why the shared store did not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No answer within the store's timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The store answered with an error, or the connection failed.
    #[error("{0}")]
    Failed(String),
}
