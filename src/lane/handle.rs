//! The [`Lane`] handle: a caller's place and its wait, pauses, the
//! snapshot; what the lane's dispatcher and the shaper ask of a lane.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Semaphore, oneshot};
use tokio::time::{Instant, sleep_until};

use super::dispatcher::Dispatcher;
use super::name::LaneName;
use super::policy::{LanePolicy, Priority};
use super::release::{Local, Reserved};
use super::road::Road;
use super::shared::{Shared, Ties, Waiting};
use super::snapshot::LaneSnapshot;
use super::turn::{Ticket, Turn};
use super::waiter::Waiter;
use crate::error::{ConfigError, Error};
use crate::gate::{Booked, Gate, GateLevel, GateSettings, Listed, PauseCause, Stop};
use crate::meters::{Quota, Rate};
use crate::observability::{InFlight, Labels, Series};
use crate::retry::RetryBudget;
use crate::store::{Remote, StoreMode};
use crate::time::{AtomicTick, Stamp, later};
use crate::vendor::{Spending, VendorModel, explains};

/// One upstream quota: a FIFO queue, meters and a pause, drained by one
/// dispatcher task while anyone waits.
///
/// [`Shaper`](crate::Shaper) creates lanes by itself; a `Lane` can also pace
/// anything else (a gRPC client, a database) on its own:
///
/// ```
/// use std::time::Duration;
/// use callshaper::Quota;
/// use callshaper::lane::{Lane, LanePolicy};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ten_a_second = Quota::leaky_bucket(10, Duration::from_secs(1));
/// let lane = Lane::new("sms", [ten_a_second], LanePolicy::default())?;
/// let start = tokio::time::Instant::now();
/// for _ in 0..3 {
///     let _turn = lane.acquire().await?;
///     // ... call the vendor ...
/// }
/// assert!(start.elapsed() >= Duration::from_millis(200));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Lane {
    pub(super) shared: Arc<Shared>,
}

/// How many times a waiting place outlives a dispatcher that ended
/// without answering it (see [`Lane::wait`]).
const ORPHANED: u32 = 3;

impl Lane {
    /// A lane named `key` that keeps to all of `quotas` at once (e.g.
    /// requests **and** tokens per minute; at least one), under `policy`.
    /// Its dispatcher runs on the tokio runtime of the first request that
    /// must wait, while any does; outside a runtime, a [`ConfigError`] for
    /// `runtime`.
    pub fn new(
        key: impl Into<String>,
        quotas: impl IntoIterator<Item = Quota>,
        policy: LanePolicy,
    ) -> Result<Self, ConfigError> {
        let quotas: Vec<Quota> = quotas.into_iter().collect();
        policy.validate(&quotas)?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(ConfigError::new(
                "runtime",
                "a lane runs its dispatcher on tokio: create it within a runtime",
            ));
        }
        // No vendor answers a standalone lane's releases: a burst goes at
        // once, with no first word to wait for.
        let settings = GateSettings {
            hears: false,
            ..policy.gate_settings()
        };
        let level = GateLevel::new("", Arc::from(quotas.as_slice()), settings);
        let own = Arc::new(Gate::new(Listed::nowhere(Arc::new(level)), 1));
        let settings = policy.vendor_settings(RetryBudget::default());
        let vendor = Arc::new(VendorModel::new(own.clone(), settings, None));
        let key: Arc<str> = key.into().into();
        let series = Series::new(Labels::standalone(&key), None);
        let road = Road::new(Some(key), series, (Arc::new(policy), vendor), (None, None));
        Ok(Self::open(Arc::new(road), [own], None, 0))
    }

    /// A lane on `road` (its policy already validated), named by the
    /// road's prefix and its gates' keys, releasing through `gates`
    /// (narrowest first, the vendor's last, whose model is the road's), by
    /// the store's reservations when it has a `remote`, else by the gates'
    /// meters; `listed` in its owner's map of lanes under that hash of its
    /// name. No task runs for it until a request must wait; the road
    /// hears each one stop.
    pub(crate) fn open(
        road: Arc<Road>,
        gates: impl IntoIterator<Item = Arc<Gate>>,
        remote: Option<Arc<Remote>>,
        listed: u64,
    ) -> Self {
        let shared = Arc::new(Shared {
            gates: gates.into_iter().collect(),
            ties: Ties::of(
                road.policy
                    .max_in_flight
                    .map(|n| Arc::new(Semaphore::new(n.min(Semaphore::MAX_PERMITS)))),
                remote,
            ),
            listed,
            released: AtomicU64::new(0),
            waiting: Waiting::default(),
            road,
            active_at: AtomicTick::new(Stamp::of(Instant::now())),
        });
        shared.report_first_quota();
        Self { shared }
    }

    /// The lane's key: a standalone lane's name, or a shaper's lane's
    /// key in each of its levels (`tenant/acme | https://api.vendor.com`).
    /// Written out on each call: a lane keeps no copy of it.
    pub fn key(&self) -> String {
        self.name().to_string()
    }

    /// The lane's key, read where its parts are kept: written out only
    /// where it is shown.
    pub(crate) fn name(&self) -> LaneName<'_> {
        self.shared.name()
    }

    /// The hash of its name it was made with, for its owner's map of lanes.
    pub(crate) fn listed(&self) -> u64 {
        self.shared.listed
    }

    /// The lane's policy.
    pub fn policy(&self) -> &LanePolicy {
        &self.shared.road.policy
    }

    /// The request quota declared for the lane's vendor: a shaper's lanes
    /// hold their quotas in their gates, not in their policy.
    pub(crate) fn declared(&self) -> Option<Rate> {
        self.shared.vendor_gate().declared()
    }

    /// Wait for this caller's turn, in FIFO order, under the policy's
    /// `max_wait`, for a request of cost 1.
    pub async fn acquire(&self) -> Result<Turn, Error> {
        let mut place = match self.turn_now(1) {
            // Taken at the door, with no strict door to wait at: nothing
            // to await.
            Some(turn) if turn.strict.is_none() => return Ok(turn),
            Some(turn) => Place::ready(turn),
            None => self
                .take_place()
                .inspect_err(|error| self.ended(error.reason()))?,
        };
        let mut turn = self
            .wait(&mut place)
            .await
            .inspect_err(|error| self.ended(error.reason()))?;
        // The caller sends now: a strict lane measures its next from here.
        turn.door_opens().await;
        // The caller's answer never comes back through the lane.
        drop(turn.went());
        Ok(turn)
    }

    /// [`acquire`](Self::acquire)'s place in the queue, when its turn was
    /// not free at once. A turn taken at once needs no place: nothing
    /// sends its request again, so nothing keeps its number. One that
    /// queues is not tried at once a second time, as `enter_at` would.
    fn take_place(&self) -> Result<Place, Error> {
        self.admits(1)?;
        let max_wait = self.shared.road.policy.max_wait;
        let mut place = self.numbered(None, 1, Priority::Interactive, max_wait)?;
        self.join(&mut place)?;
        Ok(place)
    }

    /// Hand the dispatcher a ticket already counted in `waiting`, starting
    /// one if none runs (or the one that ran ended with its runtime); the
    /// caller's end goes to `slot`.
    pub(super) fn send(
        &self,
        ticket: Ticket,
        waiter: Waiter,
        slot: &mut Slot,
    ) -> Result<(), Error> {
        // Unsent, the ticket is dropped with its sender: the waiter
        // counts itself out as it drops.
        let shared = &self.shared;
        let mut door = shared.door();
        let ticket = match door.as_ref() {
            Some(tickets) => match tickets.try_send(ticket) {
                Ok(()) => None,
                // Closed: by a shutdown, or with the runtime it ran on.
                Err(refused) => Some(refused.into_inner()),
            },
            None => Some(ticket),
        };
        if let Some(ticket) = ticket {
            if shared.waiting.is_closed() {
                return Err(Error::Shutdown);
            }
            if door.as_ref().is_none_or(async_channel::Sender::is_closed) {
                *door = Some(self.start_dispatcher());
            }
            if door
                .as_ref()
                .is_none_or(|tickets| tickets.try_send(ticket).is_err())
            {
                return Err(Error::Shutdown);
            }
        }
        drop(door);
        *slot = Slot::Waiting(waiter);
        Ok(())
    }

    /// A dispatcher for this lane on the current runtime, and its door.
    /// One engine per dispatcher: the dispatcher is generic over it, so
    /// the in-memory path pays nothing for the store's.
    fn start_dispatcher(&self) -> async_channel::Sender<Ticket> {
        let (tickets, tickets_rx) = async_channel::unbounded();
        let lane = self.shared.clone();
        match self.shared.remote().cloned() {
            None => Dispatcher::spawn(lane, tickets_rx, Local::default()),
            Some(remote) => Dispatcher::spawn(lane, tickets_rx, Reserved::new(remote)),
        }
        tickets
    }

    /// Put a released request back in the queue with its old number, so it
    /// goes before everything that came after it; after a failure, not
    /// before its `backoff` is over, which it waits out in the queue (see
    /// `queue.rs`).
    pub(crate) fn reenter(&self, place: &mut Place, backoff: Duration) -> Result<(), Error> {
        let now = Instant::now();
        let not_before = (!backoff.is_zero()).then(|| later(now, backoff));
        if let Some(&(deadline, max_wait)) = place.deadline.as_deref() {
            let paused = self.paused_until().unwrap_or(now);
            let release = paused.max(not_before.unwrap_or(now));
            if release > deadline {
                return Err(Error::WouldExceedMaxWait {
                    lane: self.shared.name().to_string(),
                    predicted: release.saturating_duration_since(now),
                    max_wait,
                });
            }
        }
        self.shared.count_in();
        let (mut ticket, waiter) =
            Waiter::ticket(&self.shared, place.seq, place.cost, place.priority);
        ticket.not_before = not_before;
        self.send(ticket, waiter, &mut place.slot)
    }

    /// Wait until the dispatcher hands this place its turn. A dispatcher
    /// that ended with its runtime, the lane still open, answers nobody:
    /// the place waits on, by its number, in one on this caller's runtime
    /// (a shaper serves several runtimes at once, and outlives them), up
    /// to [`ORPHANED`] times (a dispatcher that failed, not its runtime,
    /// would fail each one).
    pub(crate) async fn wait(&self, place: &mut Place) -> Result<Turn, Error> {
        let mut orphaned = 0;
        loop {
            let waited = matches!(place.slot, Slot::Waiting(_));
            let outcome = self.wait_once(place).await;
            // Its dispatcher gone, though nothing closed the lane.
            let unanswered = waited
                && matches!(outcome, Err(Error::Shutdown))
                && !self.shared.waiting.is_closed();
            if !unanswered || orphaned == ORPHANED {
                return outcome;
            }
            orphaned += 1;
            self.reenter(place, Duration::ZERO)?;
        }
    }

    /// [`wait`](Self::wait) for one dispatcher's answer.
    async fn wait_once(&self, place: &mut Place) -> Result<Turn, Error> {
        // The waiter stays in the place while it waits: a caller who gives
        // up drops its place, and the waiter with it frees the place then.
        let waiter = match &mut place.slot {
            Slot::Waiting(waiter) => waiter,
            slot => {
                return match std::mem::replace(slot, Slot::Taken) {
                    Slot::Ready(turn) => Ok(turn),
                    // Nothing to wait for, and nothing to wait again for.
                    _ => Err(Error::Shutdown),
                };
            }
        };
        let outcome = match place.deadline.as_deref().copied() {
            None => waiter.await,
            // Boxed: a timer is large, and most requests have no deadline;
            // this keeps every queued request without one small.
            Some((deadline, max_wait)) => {
                Box::pin(self.wait_until(waiter, deadline, max_wait)).await
            }
        };
        place.slot = Slot::Taken;
        outcome
    }

    async fn wait_until(
        &self,
        waiter: &mut Waiter,
        deadline: Instant,
        max_wait: Duration,
    ) -> Result<Turn, Error> {
        tokio::select! {
            biased;
            turn = &mut *waiter => return turn,
            () = sleep_until(deadline) => {}
        }
        // A release due at the deadline itself is woken in the same tick:
        // let the dispatcher run once before giving up.
        tokio::task::yield_now().await;
        if let Some(turn) = waiter.try_answer().transpose() {
            return turn;
        }
        if let Some(turn) = waiter.leave() {
            return turn;
        }
        Err(Error::MaxWaitElapsed {
            lane: self.shared.name().to_string(),
            max_wait,
        })
    }

    /// A request released at `turn` cost `actual`, not the `charged` it
    /// was estimated at: correct the meters that count cost. An `actual`
    /// past the largest cost one request may have counts as that: one
    /// report holds the lane for at most the time a full quota takes to
    /// come back, never for ever.
    pub(crate) fn settle(&self, charged: u64, actual: u64, at: Instant) {
        let capacity = self.shared.meters().iter().map(|m| m.capacity()).min();
        let actual = actual.min(capacity.unwrap_or(u64::MAX));
        if let Some(remote) = self.shared.remote()
            && remote.mode() != StoreMode::Fallback
        {
            remote.settle(charged, actual, at);
            return;
        }
        for gate in self.shared.gates.iter() {
            gate.meters().settle(charged, actual, at);
        }
    }

    /// Pause the whole lane, and the shared quotas above it (so every lane
    /// sharing the vendor's quota stops too), for `pause` from now, clamped
    /// to `max_pause`. A pause only ever moves forward: a shorter one than
    /// the current leaves it as it is. Returns the instant the lane resumes.
    pub fn pause_for(&self, pause: Duration) -> Instant {
        self.pause_because(pause, PauseCause::Requested, None)
    }

    /// [`pause_for`](Self::pause_for), saying why, and what the vendor
    /// `said` that asked for it.
    pub(crate) fn pause_because(
        &self,
        pause: Duration,
        cause: PauseCause,
        said: Option<&Arc<str>>,
    ) -> Instant {
        if let Some(remote) = self.shared.remote() {
            remote.pause(pause.min(self.shared.road.policy.max_pause));
        }
        let gates = &self.shared.gates;
        let until = gates
            .iter()
            .map(|gate| gate.pause_for(pause, cause, said))
            .max()
            .unwrap_or_else(Instant::now);
        self.shared.metrics().paused(until, cause.label());
        until
    }

    /// The lane was throttled with `status`: the pause to take (the
    /// vendor's hint, else the vendor model's growing fallback).
    pub(crate) fn throttled(
        &self,
        hint: Option<Duration>,
        status: u16,
        cause: PauseCause,
    ) -> Duration {
        self.shared.throttled();
        self.shared.metrics().throttled(status, cause.label());
        self.shared.vendor().throttled(hint)
    }

    /// The vendor refused the request released at `released` (saying its
    /// limit is `limit`, if it did; `silent`: nothing of its quota) for the
    /// lane's spacing, by its ledger
    /// (see [`VendorModel::spacing_refused`]): the gap the lane keeps from now on,
    /// if so, with the refusal counted.
    pub(crate) fn spacing_refused(
        &self,
        limit: Option<u64>,
        silent: bool,
        released: Instant,
        status: u16,
    ) -> Option<Duration> {
        let gap = self
            .shared
            .vendor()
            .spacing_refused(limit, silent, released)?;
        Some(self.spaced(status, gap))
    }

    /// A refusal read as spacing, kept `gap` apart from now on: counted as
    /// the throttle it was.
    fn spaced(&self, status: u16, gap: Duration) -> Duration {
        self.shared.throttled();
        self.shared
            .metrics()
            .throttled(status, PauseCause::Spacing.label());
        gap
    }

    /// On a shared store, a strict lane refused without a word: the gap
    /// to keep before the next send, once (see
    /// `VendorModel::fleet_spacing_refused`), the throttle counted.
    pub(crate) fn fleet_spacing_refused(&self, status: u16) -> Option<Duration> {
        self.shared.remote()?;
        let gap = self.shared.vendor().fleet_spacing_refused()?;
        Some(self.spaced(status, gap))
    }

    /// Whose releases gate `i` reads the vendor's signals against: the
    /// lane's own in memory, else the `fleet`'s, as the store counted them
    /// for the answered request's slot. The vendor may also have counted
    /// requests the lane handed out after that one, which reached it first
    /// (a burst's requests overtake each other): the store's count for the
    /// latest turn handed out includes them, and the higher count is read,
    /// so the fleet's own burst is never taken for another consumer.
    fn spending(&self, i: usize, fleet: Option<&[Option<Booked>]>) -> Spending {
        if self.shared.remote().is_none() {
            return Spending::Own;
        }
        let of = |fleet: Option<&[Option<Booked>]>| fleet.and_then(|f| f.get(i).copied().flatten());
        let Some(booked) = of(fleet) else {
            return Spending::Unknown;
        };
        let latest_fleet = self.shared.remote().and_then(|r| r.latest_fleet());
        let latest = of(latest_fleet.as_deref().map(Vec::as_slice));
        let count = latest.map_or(booked.count, |latest| latest.count.max(booked.count));
        Spending::Fleet(Booked { count, ..booked })
    }

    /// Whether the lane's own releases (on a shared store, the `fleet`'s)
    /// explain a vendor saying `used` of its `limit` are spent, at any of
    /// its levels (see `vendor::explains`).
    pub(crate) fn explains(
        &self,
        limit: u64,
        used: u64,
        released: Instant,
        fleet: Option<&[Option<Booked>]>,
    ) -> bool {
        let vendor = self.shared.gates.len().saturating_sub(1);
        let mut levels = self.shared.gates[..vendor].iter().enumerate();
        levels.any(|(i, gate)| explains(gate, None, limit, used, released, self.spending(i, fleet)))
            || self
                .shared
                .vendor()
                .explains(limit, used, released, self.spending(vendor, fleet))
    }

    /// Whether the vendor's "nothing left" on the request released at
    /// `released` is its burst room, not a spent window (see
    /// [`VendorModel::burst_room`]).
    pub(crate) fn burst_room(&self, released: Instant, fleet: Option<&[Option<Booked>]>) -> bool {
        let spending = self.spending(self.shared.gates.len().saturating_sub(1), fleet);
        let room = self.shared.vendor().burst_room(released, spending);
        if room == Some(true) {
            tracing::info!(
                lane = %self.name(),
                "the vendor said nothing is left after the lane's first request in a window: \
                 that is its burst room, not a spent window; the meters keep to its quota"
            );
        }
        room.is_some()
    }

    /// When the vendor's quota frees a unit by this lane's own releases
    /// (on a shared store, the `fleet`'s) alone (see
    /// [`VendorModel::frees_at`]).
    pub(crate) fn frees_at(
        &self,
        limit: u64,
        released: Instant,
        fleet: Option<&[Option<Booked>]>,
    ) -> Option<Instant> {
        let spending = self.spending(self.shared.gates.len().saturating_sub(1), fleet);
        self.shared.vendor().frees_at(limit, released, spending)
    }

    /// The vendor announced its quota; see [`VendorModel::learn`]. True
    /// when this changed the pace.
    pub(crate) fn learn(&self, announced: Rate) -> bool {
        let learned = self.shared.vendor().learn(announced);
        if learned {
            self.shared.metrics().learned(announced);
        }
        learned
    }

    /// The vendor said no pause helps (out of credit): end every request
    /// of the vendor's lanes at once for `max_pause`, then let one through
    /// to see.
    pub(crate) fn stop(&self, status: u16, body: String) -> Error {
        let stop = Stop { status, body };
        let error = self.shared.out_of_credit(&stop);
        self.shared
            .vendor_gate()
            .stop_for(self.shared.road.policy.max_pause, stop);
        self.wake();
        error
    }

    /// Wake this lane's dispatcher now, with a ticket nobody waits for (it
    /// is skipped, and counted nowhere): a stop ends its queue within the
    /// round trip that said so. The vendor's other lanes see the stop at
    /// their next step, at the latest when the pause that came with it
    /// ends.
    pub(crate) fn wake(&self) {
        // A closed lane, or one nobody waits in, has nothing to wake (a
        // tenant's first answer wakes its new lane: no channel is made
        // for it, nor a door).
        let Some(door) = self.shared.door_if_made() else {
            return;
        };
        if let Some(tickets) = &*door {
            let (turn, _) = oneshot::channel();
            let seq = self.shared.next_seq();
            let _ = tickets.try_send(Ticket {
                seq,
                cost: 0,
                priority: Priority::Interactive,
                not_before: None,
                turn,
            });
        }
    }

    /// The vendor refused a request released at `released`; see
    /// [`VendorModel::refused`] (`reset`: with its precision; `bucket`: the
    /// capacity of a limit that refills). The quota learned, if the pace
    /// changed.
    pub(crate) fn refused(
        &self,
        limit: Option<u64>,
        reset: Option<(Duration, Duration)>,
        released: Instant,
        bucket: Option<u64>,
    ) -> Option<Rate> {
        let learned = self
            .shared
            .vendor()
            .refused(limit, reset, released, bucket)?;
        self.shared.metrics().learned(learned);
        Some(learned)
    }

    /// The vendor answered a request released at `released`: a burst
    /// waiting for its first word goes now, and a bucket's `remaining`
    /// (see [`VendorModel::bucket`]; `leaks`: its capacity, when it does not say
    /// its rate) holds the vendor gate's meters to it. On a shared store
    /// the local meters are only the fallback share: the store's count is
    /// the fleet's, and the bucket's `remaining` holds the lane's bursts
    /// of slots instead (see [`VendorModel::said_left`]). The quota learned, if
    /// the pace changed.
    pub(crate) fn answered(
        &self,
        bucket: Option<(u64, Option<u64>)>,
        released: Instant,
        refused: bool,
    ) -> Option<Rate> {
        if let (Some((remaining, _)), Some(_)) = (bucket, self.shared.remote()) {
            // Before the lanes waiting for the first word wake to read it.
            self.shared.vendor().said_left(remaining, released);
        }
        // Every gate hears it (`|`, not `||`): each may hold a burst.
        let first = self
            .shared
            .gates
            .iter()
            .fold(false, |first, gate| gate.heard() | first);
        if first {
            self.wake();
        }
        if self.shared.remote().is_some() {
            return None;
        }
        let (remaining, leaks) = bucket?;
        let learned = self
            .shared
            .vendor()
            .bucket(remaining, leaks, released, refused)?;
        self.shared.metrics().learned(learned);
        Some(learned)
    }

    /// A failed request is tried again.
    pub(crate) fn retried(&self) {
        self.shared.metrics().retried();
    }

    /// A request waited `wait` from submission to its first release.
    pub(crate) fn waited(&self, wait: Duration) {
        self.shared.metrics().waited(wait);
    }

    /// A released request goes on the wire until the guard drops.
    pub(crate) fn sending(&self) -> InFlight {
        self.shared.metrics().sending()
    }

    /// A request of this lane ended with an error of `reason` (see
    /// [`Error::reason`]), not a response.
    pub(crate) fn ended(&self, reason: &'static str) {
        self.shared.metrics().refused(reason);
    }

    /// Its gates' quotas changed: report the new declared rate, and wake
    /// the dispatcher so the next release follows them.
    pub(crate) fn requoted(&self) {
        self.shared.report_quota();
        self.wake();
    }

    /// True when one of the lane's gates holds the quotas of `level`.
    pub(crate) fn holds_level(&self, level: &str) -> bool {
        self.shared.gates.iter().any(|gate| gate.level() == level)
    }

    /// The lane's vendor, level and route.
    pub(crate) fn labels(&self) -> &Labels {
        &self.shared.road.series.labels
    }

    /// The model of the lane's vendor: what its answers taught, its
    /// throttle streak and retry allowance.
    pub(crate) fn vendor(&self) -> &VendorModel {
        self.shared.vendor()
    }

    fn paused_until(&self) -> Option<Instant> {
        self.shared.paused_until(Instant::now())
    }

    pub(super) fn queued(&self) -> usize {
        self.shared.waiting.count()
    }

    /// True when no other handle holds the lane: no caller, waiter or
    /// dispatcher, only its owner's map.
    pub(crate) fn held_alone(&self) -> bool {
        Arc::strong_count(&self.shared) == 1
    }

    /// How long the lane has released nothing.
    pub(crate) fn quiet_for(&self) -> Duration {
        self.quiet_at(Instant::now())
    }

    /// How long the lane has released nothing, at `now` (one reading of
    /// the clock for a sweep over every lane).
    pub(crate) fn quiet_at(&self, now: Instant) -> Duration {
        self.shared.quiet_for(now)
    }

    /// True while a dispatcher runs for the lane: someone waits, or did
    /// within its linger.
    pub(crate) fn is_busy(&self) -> bool {
        let door = self.shared.door_if_made();
        door.is_some_and(|door| door.is_some())
    }

    /// Refuse new requests and end every waiting one with
    /// [`Error::Shutdown`].
    pub(crate) fn close(&self) {
        // Made if it was not: a request about to wait for the first time
        // sends its ticket under this lock, so it sees the lane closed.
        let mut door = self.shared.door();
        self.shared.waiting.close();
        if let Some(tickets) = door.take() {
            tickets.close();
        }
    }

    /// What the lane is doing right now.
    pub fn snapshot(&self) -> LaneSnapshot {
        let now = Instant::now();
        // The latest pause among the gates, and its cause.
        let pause = self
            .shared
            .gates
            .iter()
            .filter_map(|gate| gate.pause(now))
            .max_by_key(|pause| pause.until);
        // Each read on its own, before the literal: a temporary in one of
        // its fields lives to the literal's end, and the meters' locks held
        // there while the store's state was taken for `store` deadlocked
        // with a store failing, which takes its state and then the meters.
        let spacing = self.shared.gates.iter().filter_map(|g| g.spacing()).max();
        let interval = self
            .shared
            .meters()
            .iter()
            .map(|m| m.interval())
            .max()
            .unwrap_or_default();
        LaneSnapshot {
            key: self.shared.name().to_string(),
            queued: self.queued(),
            paused_for: pause.as_ref().map(|pause| pause.until - now),
            pause_cause: pause.as_ref().map(|pause| pause.cause),
            pause_said: pause.and_then(|pause| pause.said.as_deref().map(str::to_owned)),
            released: self.shared.released.load(Ordering::Relaxed),
            throttles: u64::from(self.shared.throttles()),
            interval,
            learned: self.shared.vendor().learned(),
            spacing,
            store: self.shared.remote().map(|remote| remote.mode()),
        }
    }
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane")
            .field("key", &self.shared.name())
            .finish_non_exhaustive()
    }
}

/// A caller's place in a lane: its sequence number and cost (kept across
/// retries) and its next turn.
pub(crate) struct Place {
    pub(super) seq: u64,
    pub(super) cost: u64,
    pub(super) priority: Priority,
    pub(super) slot: Slot,
    /// Boxed: most requests have none, and every waiting one carries this.
    pub(super) deadline: Option<Box<(Instant, Duration)>>,
}

impl Place {
    /// A place whose turn came at once, and whose request is never sent
    /// again (no number, no deadline).
    fn ready(turn: Turn) -> Self {
        Self {
            seq: 0,
            cost: 1,
            priority: Priority::Interactive,
            slot: Slot::Ready(turn),
            deadline: None,
        }
    }

    /// The place's number in its lane's order.
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }
}

pub(super) enum Slot {
    /// Taken on the fast path.
    Ready(Turn),
    /// Arrives from the dispatcher.
    Waiting(Waiter),
    /// Handed out already.
    Taken,
}
