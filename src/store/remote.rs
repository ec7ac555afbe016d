//! A lane's link to its shared store, whatever the store: reservations,
//! corrections and pauses go through the store's [`StoreLane`]; this file
//! owns what a lane does when the store fails (fail-open, fail-closed),
//! probing it again, and the probation after it comes back.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::clock::StoreClock;
use super::contract::{MasterMoves, Moves, StoreLane, StoreSettings};
use super::policy::{StoreFailure, StoreMode};
use crate::error::StoreError;
use crate::gate::{Booked, Gate};
use crate::observability::StoreMetrics;
use crate::sync::lock;
use crate::time::later;

/// Where a lane's next release comes from.
pub(crate) enum Source {
    /// Reserve in the store.
    Store,
    /// The local fallback (fail-open, store down).
    Fallback,
    /// Nowhere: refuse (fail-closed, store down).
    Refuse,
}

/// A lane's link to the store: its gates there, and which mode it is in.
pub(crate) struct Remote {
    /// Declared before `link`, so dropped first: the link can tell whether
    /// any lane still holds its gates.
    gates: Vec<Arc<Gate>>,
    link: Box<dyn StoreLane>,
    settings: StoreSettings,
    /// How long a gate's state matters once idle: its longest window.
    keep: Duration,
    failure: StoreFailure,
    state: Mutex<State>,
    metrics: StoreMetrics,
    /// Where the store says its master moved, if it can move.
    moves: Option<Moves>,
    /// What the store counted for the latest turn handed out (see
    /// `Lane::spending`): kept here, as only a lane on a store has one.
    latest_fleet: Mutex<Option<Arc<Vec<Option<Booked>>>>>,
}

struct State {
    mode: StoreMode,
    /// When to try the store again, while it is down.
    probe_at: Instant,
    last_error: Option<StoreError>,
    /// Back from an outage: until then, keep to the local share too.
    probation: Option<Instant>,
    clock: StoreClock,
    /// The master's moves when the store last failed.
    moves_seen: MasterMoves,
    /// The announced moves the lane has kept its share for.
    announced_seen: u64,
}

/// Slots reserved in one round trip, on this instance's clock.
pub(crate) struct Schedule {
    /// Each slot: when to release it here, and its store time (us).
    pub(crate) slots: Vec<(Instant, i64)>,
    /// Each slot: what the fleet booked in each gate's window ending at it.
    pub(crate) fleet: Vec<Arc<Vec<Option<Booked>>>>,
    /// No slot was within the horizon: ask again then.
    pub(crate) ask_again: Option<Instant>,
    /// A pause in force for this long.
    pub(crate) paused: Option<Duration>,
    /// Each gate's reservation count after these: the give-back guard.
    pub(crate) seqs: Vec<i64>,
}

impl Remote {
    /// The link of a lane whose shared `gates` are reached through `link`.
    pub(crate) fn new(
        link: Box<dyn StoreLane>,
        gates: Vec<Arc<Gate>>,
        settings: StoreSettings,
        keep: Duration,
        failure: StoreFailure,
        metrics: StoreMetrics,
    ) -> Self {
        metrics.mode(StoreMode::Shared.label());
        Self {
            gates,
            link,
            settings,
            keep,
            failure,
            state: Mutex::new(State {
                mode: StoreMode::Shared,
                probe_at: Instant::now(),
                last_error: None,
                probation: None,
                clock: StoreClock::new(keep),
                moves_seen: MasterMoves::default(),
                announced_seen: 0,
            }),
            metrics,
            moves: None,
            latest_fleet: Mutex::new(None),
        }
    }

    /// Where the store says its master moved (Sentinel), counted from now.
    pub(super) fn with_moves(mut self, moves: Option<Moves>) -> Self {
        if let Some(moves) = &moves {
            let now = *moves.borrow();
            let state = self
                .state
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            state.moves_seen = now;
            state.announced_seen = now.announced;
        }
        self.moves = moves;
        self
    }

    /// Each gate's pace now (a learned quota, a vendor bucket's leak, or
    /// adaptive pacing), which the store's meters keep to as well.
    fn paces(&self) -> Vec<Option<Duration>> {
        self.gates
            .iter()
            .map(|gate| gate.meters().store_pace())
            .collect()
    }

    /// Reserve a slot for each of `costs`, in order.
    pub(crate) async fn reserve(
        &self,
        costs: &[u64],
        waiting: usize,
    ) -> Result<Schedule, StoreError> {
        let paces = self.paces();
        let sent = Instant::now();
        let reservation = self.link.reserve(costs, waiting, &paces).await?;
        let received = Instant::now();
        if reservation.lost {
            tracing::warn!(
                "callshaper: the shared store had lost the fleet's state (a flush, a failover \
                 to a replica that missed writes, an eviction); it starts over as if full for \
                 a horizon, so no slot is handed out twice"
            );
        }
        let mut state = lock(&self.state);
        state.clock.reply(sent, received, reservation.now);
        let clock = state.clock;
        drop(state);
        let slots = reservation
            .slots
            .iter()
            .map(|&t| (clock.local_time(t).unwrap_or(received), t))
            .collect();
        let fleet = reservation
            .fleet
            .into_iter()
            .map(|gates| {
                gates
                    .into_iter()
                    .map(|booked| {
                        booked.map(|b| Booked {
                            count: b.count,
                            leaves: b.leaves.and_then(|t| clock.local_time(t)),
                        })
                    })
                    .collect::<Vec<_>>()
                    .into()
            })
            .collect();
        // Ask again once the next slot is within the horizon.
        let ask_again = reservation
            .hold
            .map(|hold| later(received, hold.saturating_sub(self.settings.horizon)));
        Ok(Schedule {
            slots,
            fleet,
            ask_again,
            paused: reservation.paused,
            seqs: reservation.seqs,
        })
    }

    /// A turn the store counted `fleet` for is being handed out.
    pub(crate) fn handed(&self, fleet: &Arc<Vec<Option<Booked>>>) {
        *lock(&self.latest_fleet) = Some(fleet.clone());
    }

    /// What the store counted for the latest turn handed out.
    pub(crate) fn latest_fleet(&self) -> Option<Arc<Vec<Option<Booked>>>> {
        lock(&self.latest_fleet).clone()
    }

    /// Give back slots nobody used, latest first: `(store time, cost)`.
    pub(crate) fn give_back(&self, slots: Vec<(i64, u64)>, seqs: Vec<i64>) {
        if !slots.is_empty() {
            self.link.give_back(slots, seqs, &self.paces());
        }
    }

    /// Slots that will not be sent, before others the lane still holds
    /// (see [`StoreLane::forget`]).
    pub(crate) fn forget(&self, slots: Vec<(i64, u64)>) {
        if !slots.is_empty() {
            self.link.forget(slots, &self.paces());
        }
    }

    /// A slot reserved at store time `t` for `charged` went to a request
    /// of cost `actual`.
    pub(crate) fn settle_at(&self, charged: u64, actual: u64, t: i64) {
        self.link.settle(t, charged, actual, &self.paces());
    }

    /// A request released at `at` cost `actual`, not the `charged`.
    pub(crate) fn settle(&self, charged: u64, actual: u64, at: Instant) {
        if let Some(t) = self.store_time(at) {
            self.settle_at(charged, actual, t);
        }
    }

    fn store_time(&self, at: Instant) -> Option<i64> {
        lock(&self.state).clock.store_time(at)
    }

    /// The slot reserved at store time `t` was used at `at`; the lateness
    /// the meters forgive is `late`. Later slots keep their gap to it.
    pub(crate) fn used(&self, at: Instant, t: i64, late: Duration) {
        lock(&self.state).clock.used(at, t, late);
    }

    /// Pause every gate of the lane fleet-wide for `pause` from now.
    pub(crate) fn pause(&self, pause: Duration) {
        self.link.pause(pause);
    }

    pub(crate) fn batch(&self) -> usize {
        self.settings.batch
    }

    pub(crate) fn mode(&self) -> StoreMode {
        lock(&self.state).mode
    }

    /// The link's state, held until the value returned drops: where a
    /// store failing stands before it takes the gates' meters (see
    /// [`failed`](Self::failed)), for tests of the lock order.
    #[cfg(test)]
    pub(crate) fn hold_state(&self) -> impl Sized + '_ {
        lock(&self.state)
    }

    pub(crate) fn last_error(&self) -> StoreError {
        lock(&self.state)
            .last_error
            .clone()
            .unwrap_or_else(|| StoreError::Failed("unavailable".to_owned()))
    }

    /// True while a lane back from an outage, or on a master that just
    /// moved, also keeps to its local share.
    pub(crate) fn on_probation(&self, now: Instant) -> bool {
        let mut state = lock(&self.state);
        if let Some(moves) = &self.moves
            && moves.borrow().announced != state.announced_seen
        {
            // Replication is asynchronous: the new master may lack the
            // slots the old one booked last, which a lane would then be
            // handed again. Until every instance is on the new master and
            // those slots have left their window, the share holds too.
            state.announced_seen = moves.borrow().announced;
            let settle = self.settings.probe_every.saturating_add(self.keep);
            state.probation = Some(later(now, settle));
        }
        match state.probation {
            Some(until) if until > now => true,
            Some(_) => {
                state.probation = None;
                false
            }
            None => false,
        }
    }

    /// Where the next release comes from: the store while it works (or
    /// when it is time to try it again), else the lane's policy.
    pub(crate) fn source(&self, now: Instant) -> Source {
        let state = lock(&self.state);
        match state.mode {
            StoreMode::Shared => Source::Store,
            _ if now >= state.probe_at || self.moved_since(&state) => Source::Store,
            StoreMode::Fallback => Source::Fallback,
            StoreMode::Unavailable => Source::Refuse,
        }
    }

    /// When a lane off the store tries it again, at the latest.
    pub(crate) fn probe_at(&self) -> Instant {
        lock(&self.state).probe_at
    }

    fn moved_since(&self, state: &State) -> bool {
        self.moves
            .as_ref()
            .is_some_and(|moves| *moves.borrow() != state.moves_seen)
    }

    /// Ends when the store's master moves after the last failure: a lane
    /// off the store waits for this beside its next probe. `None` when the
    /// store's master cannot move.
    pub(crate) fn master_moved(&self) -> Option<impl Future<Output = ()> + Send + 'static> {
        let mut moves = self.moves.clone()?;
        let seen = lock(&self.state).moves_seen;
        Some(async move {
            if moves.wait_for(|&count| count != seen).await.is_err() {
                // The store is gone: only the probe is left.
                std::future::pending::<()>().await;
            }
        })
    }

    /// A call failed: fall back or close, per the lane's policy; try again
    /// after `probe_every`. Returns the new mode.
    pub(crate) fn failed(&self, error: StoreError, lane: impl std::fmt::Display) -> StoreMode {
        let mode = match self.failure {
            StoreFailure::Open => StoreMode::Fallback,
            StoreFailure::Closed => StoreMode::Unavailable,
        };
        let mut state = lock(&self.state);
        if state.mode != mode {
            tracing::warn!(%lane, %error, mode = mode.label(), "callshaper: the shared store failed; the lane leaves the shared quota");
            self.metrics.mode(mode.label());
            if mode == StoreMode::Fallback && state.mode == StoreMode::Shared {
                // Other instances may still hold slots booked before the
                // failure, up to a horizon ahead, and will use them. Count
                // one release at the end of that horizon: the fallback's
                // first request comes a share's interval after every slot
                // booked in the store (a windowed meter then still allows
                // the rest of its share at once; see the store docs, "When Redis fails").
                let after = later(Instant::now(), self.settings.horizon);
                for gate in &self.gates {
                    gate.meters().commit(1, after);
                }
            }
        }
        state.mode = mode;
        state.probe_at = later(Instant::now(), self.settings.probe_every);
        state.last_error = Some(error);
        if let Some(moves) = &self.moves {
            state.moves_seen = *moves.borrow();
        }
        mode
    }

    /// A call succeeded: back on the shared quota.
    pub(crate) fn recovered(&self, lane: impl std::fmt::Display) {
        let mut state = lock(&self.state);
        if state.mode != StoreMode::Shared {
            tracing::info!(
                %lane,
                "callshaper: the shared store is back; the lane is on the shared quota again"
            );
            self.metrics.mode(StoreMode::Shared.label());
            // Every other instance finds the store within a probe interval;
            // a window later, what they sent on their own has left the
            // vendor's window too. Until then the share still applies.
            let back = self.settings.probe_every.saturating_add(self.keep);
            state.probation = Some(later(Instant::now(), back));
        }
        state.mode = StoreMode::Shared;
        state.last_error = None;
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use crate::gate::{GateLevel, GateSettings, Listed};
    use crate::meters::Quota;
    use crate::observability::Labels;
    use crate::store::{RedisStore, Store};
    use crate::testing::RedisServer;

    const PROBE: Duration = Duration::from_millis(200);
    const HORIZON: Duration = Duration::from_millis(500);

    /// A lane's link on a real Redis, one gate of 10/s, with `failure`.
    async fn remote(redis: &RedisServer, failure: StoreFailure) -> (Remote, Arc<Gate>) {
        let store: Store = RedisStore::options()
            .fleet_size(2)
            .probe_every(PROBE)
            .horizon(HORIZON)
            .connect(&redis.url())
            .await
            .unwrap()
            .into();
        let quotas = vec![Quota::leaky_bucket(10, Duration::from_secs(1))];
        let settings = GateSettings {
            headroom: Duration::ZERO,
            max_pause: Duration::from_secs(60),
            hears: true,
        };
        let level = GateLevel::new("vendor", Arc::from(quotas.as_slice()), settings);
        let gate = Arc::new(Gate::new(Listed::nowhere(Arc::new(level)), 2));
        let metrics = StoreMetrics::new(&Labels::standalone("vendor"), None, &[]);
        let remote = store.link(
            vec![gate.clone()],
            &["vendor"],
            &[quotas],
            Duration::ZERO,
            failure,
            metrics,
        );
        (remote, gate)
    }

    fn down() -> StoreError {
        StoreError::Failed("down".to_owned())
    }

    /// Fail-open: the lane serves from its local share, no sooner than a
    /// horizon after the failure (every slot booked before it has gone),
    /// tries the store again each probe interval, and once back keeps to
    /// its share too until every other instance found the store again.
    #[tokio::test]
    async fn fail_open_falls_back_after_a_horizon_probes_and_serves_probation() {
        let redis = RedisServer::start();
        let (remote, gate) = remote(&redis, StoreFailure::Open).await;
        let failed_at = Instant::now();
        assert!(matches!(remote.source(failed_at), Source::Store));
        assert_eq!(remote.failed(down(), "vendor"), StoreMode::Fallback);
        assert_eq!(remote.mode(), StoreMode::Fallback);
        assert!(matches!(remote.source(Instant::now()), Source::Fallback));
        let first = gate.meters().earliest(1, Instant::now());
        assert!(
            first >= failed_at + HORIZON,
            "the fallback's first request {:?} after the failure",
            first - failed_at
        );
        assert!(matches!(remote.source(remote.probe_at()), Source::Store));
        assert!(remote.probe_at() >= failed_at + PROBE);
        assert_eq!(remote.last_error(), down());
        let back = Instant::now();
        remote.recovered("vendor");
        assert_eq!(remote.mode(), StoreMode::Shared);
        let until = back + PROBE + remote.keep;
        assert!(remote.on_probation(until - Duration::from_millis(1)));
        assert!(!remote.on_probation(until + Duration::from_millis(50)));
    }

    /// Fail-closed: nothing is released while the store is down, and the
    /// lane's local meters are left as they were.
    #[tokio::test]
    async fn fail_closed_refuses_until_the_store_is_back() {
        let redis = RedisServer::start();
        let (remote, gate) = remote(&redis, StoreFailure::Closed).await;
        let now = Instant::now();
        assert_eq!(remote.failed(down(), "vendor"), StoreMode::Unavailable);
        assert!(matches!(remote.source(Instant::now()), Source::Refuse));
        assert!(gate.meters().earliest(1, now) <= now + Duration::from_millis(1));
        assert!(matches!(remote.source(remote.probe_at()), Source::Store));
        remote.recovered("vendor");
        assert_eq!(remote.mode(), StoreMode::Shared);
        assert!(matches!(remote.source(Instant::now()), Source::Store));
    }
}
