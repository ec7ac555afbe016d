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
//!
#![cfg_attr(
    not(feature = "redis"),
    doc = "[`RedisStore`]: crate#features\n[`RedisOptions::batch`]: crate#features\n[`RedisOptions::horizon`]: crate#features\n[`RedisOptions::timeout`]: crate#features\n[`RedisOptions::probe_every`]: crate#features\n[`RedisOptions::fleet_size`]: crate#features"
)]

//!
//! # Adding a store
//!
//! A store is one file beside `redis.rs` (plus its scripts): implement
//! `SharedStore` (settings, and a link per lane) and `StoreLane`
//! (reserve, give back, settle, pause), and `impl From<YourStore> for
//! Store`. Everything a store does *not* decide, failure policy, probing,
//! probation and the release of booked slots, lives in `remote.rs` and
//! the lane's `Reserved` engine, the same for every store.

mod clock;
#[cfg(feature = "redis")]
mod redis;
mod remote;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "redis")]
pub use self::redis::{Clock, RedisOptions, RedisStore};
pub(crate) use self::remote::{Remote, Schedule, Source};
pub use crate::error::StoreError;
use crate::gate::Gate;
use crate::meters::Quota;
use crate::observability::StoreMetrics;

/// A shared store for [`ShaperBuilder::store`](crate::ShaperBuilder::store):
/// made from a concrete store, e.g. `RedisStore` (feature `redis`). Cheap
/// to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<dyn SharedStore>,
}

impl Store {
    /// Made by each store's `From` impl; with no store compiled in, unused.
    #[cfg_attr(not(feature = "redis"), expect(dead_code))]
    pub(crate) fn new(store: impl SharedStore) -> Self {
        Self {
            inner: Arc::new(store),
        }
    }

    /// How many instances share the quotas: each one's fallback share.
    pub(crate) fn fleet_size(&self) -> u32 {
        self.inner.settings().fleet_size
    }

    /// The link of a lane whose shared `gates` are named `names` (the
    /// vendor's last) with these `quotas` each.
    pub(crate) fn link(
        &self,
        gates: Vec<Arc<Gate>>,
        names: &[String],
        quotas: &[Vec<Quota>],
        headroom: Duration,
        failure: StoreFailure,
        metrics: StoreMetrics,
    ) -> Remote {
        // A gate's state matters as long as its longest window, and a
        // second more for the clocks' differences.
        let windows = quotas
            .iter()
            .flatten()
            .map(|q| q.rate().per.saturating_add(headroom));
        let keep = windows
            .max()
            .unwrap_or_default()
            .saturating_add(Duration::from_secs(1));
        let link = self.inner.lane(names, quotas, headroom, keep, &gates);
        Remote::new(link, gates, self.inner.settings(), keep, failure, metrics)
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

/// A boxed future a store's link returns.
pub(crate) type Pending<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where a fleet's quota state lives: the store-specific half of a shared
/// quota (the other half, the failure policy, is [`Remote`]).
pub(crate) trait SharedStore: Send + Sync + fmt::Debug + 'static {
    /// The store's batching, horizon, probing and fleet size.
    fn settings(&self) -> StoreSettings;

    /// A lane's link to its gates in the store: `names` (the vendor's
    /// last), their `quotas` and `headroom`; state is kept `keep` past its
    /// last use. `gates` are this process's gates of those names, which a
    /// pause published by another instance must reach.
    fn lane(
        &self,
        names: &[String],
        quotas: &[Vec<Quota>],
        headroom: Duration,
        keep: Duration,
        gates: &[Arc<Gate>],
    ) -> Box<dyn StoreLane>;
}

/// One lane's gates in a store. Times are the store's clock in
/// microseconds; each call charges or corrects every gate of the lane at
/// once, atomically.
pub(crate) trait StoreLane: Send + Sync + 'static {
    /// Reserve a slot for each of `costs`, in order (or fewer: one while
    /// other instances wait too, for a fair share), with each gate kept to
    /// its local `paces` too; `waiting` requests wait in the lane.
    fn reserve<'a>(
        &'a self,
        costs: &'a [u64],
        waiting: usize,
        paces: &'a [Option<Duration>],
    ) -> Pending<'a, Result<Reservation, StoreError>>;

    /// Give back unused `(time, cost)` slots, latest first, if nobody
    /// reserved since `seqs` (in the background).
    fn give_back(&self, slots: Vec<(i64, u64)>, seqs: Vec<i64>, paces: &[Option<Duration>]);

    /// `(time, cost)` slots that will not be sent, before slots the lane
    /// still holds: the fleet's ledger forgets them, and the meters keep
    /// them charged, as a give-back would bring the held slots closer
    /// than the meters allow (in the background).
    fn forget(&self, slots: Vec<(i64, u64)>, paces: &[Option<Duration>]);

    /// A slot at time `t` charged `charged` really cost `actual` (in the
    /// background).
    fn settle(&self, t: i64, charged: u64, actual: u64, paces: &[Option<Duration>]);

    /// Pause every gate fleet-wide for `pause` from now, and tell every
    /// instance (in the background).
    fn pause(&self, pause: Duration);
}

/// What a fleet booked in a gate's request window ending at a slot, as the
/// store counted it when it booked the slot: at least `count` slots (a
/// store may count high, never low), the oldest of which leaves the window
/// at `leaves` (store time, us), if known. A vendor's "0 left" is read
/// against it, as a lane in memory reads its own releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FleetBooked {
    pub(crate) count: u64,
    pub(crate) leaves: Option<i64>,
}

/// A store's settings that the store-independent half needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoreSettings {
    /// Most slots one round trip reserves.
    pub(crate) batch: usize,
    /// No slot is reserved further ahead than this.
    pub(crate) horizon: Duration,
    /// While the store is down, how often a lane tries it again.
    pub(crate) probe_every: Duration,
    /// How many instances share the quotas.
    pub(crate) fleet_size: u32,
}

/// Slots reserved in one round trip, in the store's time (us).
#[derive(Debug)]
pub(crate) struct Reservation {
    /// The store's time of the reply.
    pub(crate) now: i64,
    /// Each slot's time.
    pub(crate) slots: Vec<i64>,
    /// The next slot is this far ahead, past the horizon: ask again then.
    pub(crate) hold: Option<Duration>,
    /// A pause in force for this long.
    pub(crate) paused: Option<Duration>,
    /// The store had lost a gate's state, and started it over as full up
    /// to a horizon ahead.
    pub(crate) lost: bool,
    /// Each gate's reservation count after these: the give-back guard.
    pub(crate) seqs: Vec<i64>,
    /// For each slot, what the fleet booked on each gate in its window
    /// ending at the slot (`None`: the gate counts no requests).
    pub(crate) fleet: Vec<Vec<Option<FleetBooked>>>,
}

/// What a lane does when its shared store (Redis) cannot answer.
///
/// Pick per endpoint ([`Route::on_store_failure`](crate::Route::on_store_failure)):
/// fail-open for calls whose loss costs more than a few 429s (a checkout),
/// fail-closed where going over the quota is worse than not calling (a
/// vendor that bans keys, an API billed per overage).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum StoreFailure {
    /// Keep serving from a local lane at the quota divided by the fleet's
    /// size ([`RedisOptions::fleet_size`]): one instance's share when the
    /// whole fleet falls back at once. It starts one horizon
    /// ([`RedisOptions::horizon`]) after the failure, when every slot other
    /// instances booked before it has gone.
    ///
    #[cfg_attr(
        not(feature = "redis"),
        doc = "[`RedisOptions::fleet_size`]: crate#features\n[`RedisOptions::horizon`]: crate#features"
    )]
    Open,
    /// End waiting and new requests at once with
    /// [`Error::StoreUnavailable`](crate::Error::StoreUnavailable): the
    /// quota is never at risk. The default, because it cannot go over.
    #[default]
    Closed,
}

/// Which state a lane's releases come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "snake_case")
)]
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
    /// Every mode: the `callshaper_store_mode` state set.
    pub(crate) const ALL: [Self; 3] = [Self::Shared, Self::Fallback, Self::Unavailable];

    /// The mode's name in the `callshaper_store_mode` state set.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Shared => "shared",
            Self::Fallback => "fallback",
            Self::Unavailable => "unavailable",
        }
    }
}
