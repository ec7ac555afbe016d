//! What a store implements: [`SharedStore`] (a store) and [`StoreLane`]
//! (one lane's gates in it), and what they trade in.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::error::StoreError;
use crate::gate::Gate;
use crate::meters::Quota;

/// Changes each time the store's master moves (a Sentinel names a new
/// one) and each time a connection to a master is made: a lane off the
/// store tries it again then, not at its next probe.
pub(crate) type Moves = tokio::sync::watch::Receiver<MasterMoves>;

/// What [`Moves`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct MasterMoves {
    /// New masters announced: the new one may lack the old one's last
    /// writes.
    pub(crate) announced: u64,
    /// Connections made to a master.
    pub(crate) connected: u64,
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
        names: &[&str],
        quotas: &[Vec<Quota>],
        headroom: Duration,
        keep: Duration,
        gates: &[Arc<Gate>],
    ) -> Box<dyn StoreLane>;

    /// Where to hear that the store's master moved, for a store whose
    /// master can move under one address book (Sentinel); `None` for one
    /// whose lanes find out by calling.
    fn moves(&self) -> Option<Moves> {
        None
    }
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
