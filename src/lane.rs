//! A lane: one upstream quota, one FIFO queue, one dispatcher.
//!
//! Everything that sends to a vendor under one quota waits in the lane's
//! bounded queue. A single dispatcher task looks at the head and releases it
//! when three things agree:
//!
//! 1. the lane is not paused (`paused_until` only moves forward);
//! 2. a slot under the concurrency cap is free (if there is a cap);
//! 3. every meter says the time has come for the head's cost.
//!
//! Releasing means handing the waiting caller a [`Turn`]; the caller then
//! sends its request itself. A caller that gave up (dropped its future, or
//! its `max_wait` ran out) is skipped and charged nothing: the meters are
//! charged only once the turn was really handed over.
//!
//! Tickets arrive on one channel and wait in the dispatcher's fronts, one
//! per [`Priority`], ordered by sequence number. A throttled request comes
//! back with its original number, so it keeps its place at the head.
//! Interactive requests go first; when both classes wait, every
//! `batch_share`-th release goes to the oldest batch request, so batch work
//! keeps at least `1 / batch_share` of a busy lane and never starves.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use std::pin::Pin;

use tokio::sync::futures::OwnedNotified;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::time::{Instant, sleep, sleep_until};

use crate::adaptive::Adaptive;
use crate::error::{ConfigError, Error};
use crate::gate::{self, Gate, lock};
use crate::meters::{Meters, Quota, Rate};
use crate::observability::LaneMetrics;
use crate::retry::{Backoff, RetryBudget};

/// How one lane behaves.
#[derive(Debug, Clone, PartialEq)]
pub struct LanePolicy {
    /// The vendor's quotas, all enforced together (e.g. requests **and**
    /// tokens per minute). At least one.
    pub quotas: Vec<Quota>,
    /// Added to the vendor's window before dividing it into release slots, so
    /// that timer lateness and network jitter cannot push a strict vendor
    /// over. Default 5 ms.
    pub headroom: Duration,
    /// How many requests may wait; one more is refused with
    /// [`Error::QueueFull`]. Default 10,000.
    pub queue_capacity: usize,
    /// The longest a request may wait to be released (queue and pauses, not
    /// time on the wire). `None` (the default) waits as long as it takes.
    pub max_wait: Option<Duration>,
    /// Requests of this lane on the wire at once. `None` (the default): no
    /// cap beyond the rate.
    pub max_in_flight: Option<usize>,
    /// The longest pause a vendor may impose. A longer `Retry-After` pauses
    /// the lane this long and ends the request with
    /// [`Error::PauseTooLong`]. Default 120 s.
    pub max_pause: Duration,
    /// The pause after a throttle that says nothing usable about when to
    /// come back; grows with consecutive throttles (equal jitter) and
    /// resets on success. Default 1 s doubling up to 60 s.
    pub fallback: Backoff,
    /// An idle lane (nothing queued, not paused, meters rested) is dropped
    /// after this long. Default 60 s.
    pub idle_timeout: Duration,
    /// Opt-in adaptive pacing for vendors that announce nothing: throttles
    /// without a header cut the lane's request rate, successes grow it back,
    /// never above the first request quota (see [`crate::adaptive`]).
    /// Default off.
    pub adaptive: Option<Adaptive>,
    /// When interactive and batch requests both wait, one release in this
    /// many goes to batch. Default 5 (batch keeps 20% of a busy lane).
    pub batch_share: u32,
}

impl LanePolicy {
    /// A policy with one leaky-bucket quota at `rate` and the defaults above.
    pub fn new(rate: Rate) -> Self {
        Self::with_quotas([Quota::leaky_bucket(rate.count, rate.per)])
    }

    /// A policy enforcing all of `quotas`, with the defaults above.
    pub fn with_quotas(quotas: impl IntoIterator<Item = Quota>) -> Self {
        Self {
            quotas: quotas.into_iter().collect(),
            headroom: Duration::from_millis(5),
            queue_capacity: 10_000,
            max_wait: None,
            max_in_flight: None,
            max_pause: Duration::from_secs(120),
            fallback: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
            idle_timeout: Duration::from_secs(60),
            adaptive: None,
            batch_share: 5,
        }
    }

    /// The lane's request rate: the slowest quota counting requests.
    pub fn request_rate(&self) -> Option<Rate> {
        gate::request_rate(&self.quotas)
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.quotas.is_empty() {
            return Err(ConfigError::new(
                "quotas",
                "a lane needs at least one quota",
            ));
        }
        for (i, quota) in self.quotas.iter().enumerate() {
            quota
                .validate()
                .map_err(|e| e.within(&format!("quotas[{i}]")))?;
        }
        if self.queue_capacity == 0 {
            return Err(ConfigError::new("queue_capacity", "must be at least 1"));
        }
        if self.max_in_flight == Some(0) {
            return Err(ConfigError::new("max_in_flight", "must be at least 1"));
        }
        if self.batch_share == 0 {
            return Err(ConfigError::new("batch_share", "must be at least 1"));
        }
        if let Some(adaptive) = &self.adaptive {
            adaptive.validate()?;
            if self.request_rate().is_none() {
                return Err(ConfigError::new(
                    "adaptive",
                    "needs a quota counting requests, to be its ceiling",
                ));
            }
        }
        if self.fallback.base.is_zero() || self.fallback.cap < self.fallback.base {
            return Err(ConfigError::new(
                "fallback",
                "base must be above zero and cap at least base",
            ));
        }
        Ok(())
    }
}

/// Which class a request waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Priority {
    /// Someone is waiting for the answer: goes first.
    #[default]
    Interactive,
    /// Background work: goes when no interactive request waits, and at least
    /// one release in `batch_share` when they do.
    Batch,
}

/// Permission to send one request now. Dropping it frees the lane's
/// in-flight slot, if the lane has a cap.
#[derive(Debug)]
pub struct Turn {
    _in_flight: Option<OwnedSemaphorePermit>,
    /// When the meters were charged, to settle the charge later.
    at: Instant,
}

/// What a lane is doing right now.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LaneSnapshot {
    /// The lane's key.
    pub key: String,
    /// Requests waiting to be released (throttled ones included).
    pub queued: usize,
    /// Time left in the current pause, if any.
    pub paused_for: Option<Duration>,
    /// Turns handed out so far.
    pub released: u64,
    /// Throttled answers (429, 503) seen so far.
    pub throttles: u64,
    /// The spacing between two requests now (slower than the policy's when
    /// the vendor announced a lower quota or adaptive pacing cut it).
    pub interval: Duration,
    /// A quota lower than the configured one that the vendor announced, and
    /// the lane now keeps to.
    pub learned: Option<Rate>,
    /// With a shared store: whether the lane is on it, on its local
    /// fallback, or refusing. `None` in memory.
    pub store: Option<crate::store::StoreMode>,
}

struct Ticket {
    seq: u64,
    cost: u64,
    priority: Priority,
    turn: oneshot::Sender<Answer>,
}

/// What the dispatcher hands a waiting request: its turn, or (a
/// fail-closed lane whose store is down) a refusal.
type Answer = Result<Turn, Refusal>;

/// The store is down and the lane fails closed: the error, boxed, so an
/// answer is no larger than a turn (and a waiting caller need not keep its
/// lane at hand to build it).
#[cfg(feature = "redis")]
type Refusal = Box<Error>;

/// Without a shared store nothing is refused this way.
#[cfg(not(feature = "redis"))]
type Refusal = std::convert::Infallible;

/// The dispatcher's answer as the caller's outcome.
fn answered(answer: Result<Answer, oneshot::error::RecvError>) -> Result<Turn, Error> {
    match answer {
        Ok(Ok(turn)) => Ok(turn),
        #[cfg(feature = "redis")]
        Ok(Err(refusal)) => Err(*refusal),
        #[cfg(not(feature = "redis"))]
        Ok(Err(refusal)) => match refusal {},
        Err(_) => Err(Error::Shutdown),
    }
}

/// Called by the dispatcher when its lane has been idle for the policy's
/// `idle_timeout`; the owner may then drop the lane.
pub(crate) type OnIdle = Box<dyn Fn() + Send + Sync>;

/// One upstream quota: a FIFO queue, meters and a pause, drained by one
/// dispatcher task.
///
/// [`Shaper`](crate::Shaper) creates lanes by itself; a `Lane` can also pace
/// anything else (a gRPC client, a database) on its own:
///
/// ```
/// use std::time::Duration;
/// use callshaper::{Lane, LanePolicy, Rate};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let lane = Lane::new("sms", LanePolicy::new(Rate::new(10, Duration::from_secs(1))))?;
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
    tickets: async_channel::Sender<Ticket>,
    shared: Arc<Shared>,
}

struct Shared {
    /// Tells lanes apart in a gate's queue.
    id: u64,
    key: String,
    policy: LanePolicy,
    /// The lane's own gate first, then the shared gates of broader levels;
    /// the last one is the vendor's.
    gates: Vec<Arc<Gate>>,
    in_flight: Option<Arc<Semaphore>>,
    next_seq: AtomicU64,
    released: AtomicU64,
    throttles: AtomicU64,
    /// Requests waiting for a turn, in the channel or held by the
    /// dispatcher. Raised before a ticket is sent, lowered when the
    /// dispatcher lets it go, so "zero" really means nobody is ahead; also
    /// what the queue bound counts.
    waiting: AtomicUsize,
    metrics: LaneMetrics,
    /// The link to a shared store: the gates' quotas live there.
    #[cfg(feature = "redis")]
    remote: Option<crate::store::Remote>,
}

impl Shared {
    /// The vendor's gate: the broadest level's.
    fn vendor(&self) -> &Gate {
        self.gates.last().map_or(&self.gates[0], |gate| gate)
    }

    /// The latest pause in force at `now` among the lane's gates.
    fn paused_until(&self, now: Instant) -> Option<Instant> {
        self.gates
            .iter()
            .filter_map(|gate| gate.paused_until(now))
            .max()
    }

    /// Every gate's meters, locked in level order (the same order in every
    /// lane, so lanes sharing gates cannot deadlock).
    fn meters(&self) -> Vec<MutexGuard<'_, Meters>> {
        self.gates.iter().map(|gate| lock(&gate.meters)).collect()
    }

    /// Run `f` with every gate's meters locked; a lane with one gate (the
    /// common case) allocates nothing for it, which shows on the hot path.
    fn with_meters<R>(&self, f: impl FnOnce(&mut [MutexGuard<'_, Meters>]) -> R) -> R {
        match &self.gates[..] {
            [gate] => f(std::slice::from_mut(&mut lock(&gate.meters))),
            _ => f(&mut self.meters()),
        }
    }
}

/// True when more than one lane holds `gate`: only then do lanes queue
/// for it.
fn is_shared(gate: &Arc<Gate>) -> bool {
    Arc::strong_count(gate) > 1
}

/// When every meter of `meters` allows a request of `cost`.
fn earliest(meters: &[MutexGuard<'_, Meters>], cost: u64, now: Instant) -> Instant {
    meters
        .iter()
        .map(|m| m.earliest(cost, now))
        .max()
        .unwrap_or(now)
}

impl Lane {
    /// A lane named `key` under `policy`; its dispatcher runs on the current
    /// tokio runtime until every handle to the lane is dropped.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, like `tokio::spawn`.
    pub fn new(key: impl Into<String>, policy: LanePolicy) -> Result<Self, ConfigError> {
        policy.validate()?;
        Ok(Self::spawn(
            key.into(),
            policy,
            RetryBudget::default(),
            Vec::new(),
            None,
            #[cfg(feature = "redis")]
            None,
        ))
    }

    /// Start the dispatcher of a lane whose policy is already validated;
    /// `shared` are the gates of broader levels, the vendor's last.
    pub(crate) fn spawn(
        key: String,
        policy: LanePolicy,
        budget: RetryBudget,
        shared: Vec<Arc<Gate>>,
        on_idle: Option<OnIdle>,
        #[cfg(feature = "redis")] remote: Option<crate::store::Remote>,
    ) -> Self {
        let (tickets, tickets_rx) = async_channel::unbounded();
        let own = Arc::new(Gate::new(policy.quotas.clone(), &policy, budget, None, 1));
        let gates = std::iter::once(own).chain(shared).collect();
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        let shared = Arc::new(Shared {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            metrics: LaneMetrics::new(&key),
            key,
            gates,
            in_flight: policy.max_in_flight.map(|n| Arc::new(Semaphore::new(n))),
            next_seq: AtomicU64::new(0),
            released: AtomicU64::new(0),
            throttles: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
            policy,
            #[cfg(feature = "redis")]
            remote,
        });
        let dispatcher = Dispatcher {
            shared: shared.clone(),
            tickets: tickets_rx,
            interactive: Front::default(),
            batch: Front::default(),
            since_batch: 0,
            since: None,
            on_idle,
            #[cfg(feature = "redis")]
            booked: Booked::default(),
        };
        tokio::spawn(dispatcher.run());
        Self { tickets, shared }
    }

    /// The lane's key.
    pub fn key(&self) -> &str {
        &self.shared.key
    }

    /// The lane's policy.
    pub fn policy(&self) -> &LanePolicy {
        &self.shared.policy
    }

    /// Wait for this caller's turn, in FIFO order, under the policy's
    /// `max_wait`, for a request of cost 1.
    pub async fn acquire(&self) -> Result<Turn, Error> {
        let max_wait = self.shared.policy.max_wait;
        let mut place = self.enter(1, Priority::Interactive, max_wait)?;
        self.wait(&mut place).await
    }

    /// Join the back of the queue: refused at once when the cost can never
    /// fit, when the queue is full, or when the predicted wait is past
    /// `max_wait`.
    pub(crate) fn enter(
        &self,
        cost: u64,
        priority: Priority,
        max_wait: Option<Duration>,
    ) -> Result<Place, Error> {
        let shared = &self.shared;
        let too_costly = shared.gates.iter().filter_map(|g| g.too_costly(cost)).min();
        if let Some(capacity) = too_costly {
            shared.metrics.refused();
            return Err(Error::CostTooHigh {
                lane: shared.key.clone(),
                cost,
                capacity,
            });
        }
        // Only a request with a deadline needs the clock here.
        let deadline = match max_wait {
            None => None,
            Some(max_wait) => {
                let now = Instant::now();
                let predicted = self.predicted_wait(cost, now);
                if predicted > max_wait {
                    shared.metrics.refused();
                    return Err(Error::WouldExceedMaxWait {
                        lane: shared.key.clone(),
                        predicted,
                        max_wait,
                    });
                }
                Some(Box::new((now + max_wait, max_wait)))
            }
        };
        let seq = shared.next_seq.fetch_add(1, Ordering::Relaxed);
        let place = |slot| Place {
            seq,
            cost,
            priority,
            slot,
            deadline,
        };
        if let Some(turn) = self.turn_now(cost) {
            return Ok(place(Slot::Ready(turn)));
        }
        let capacity = shared.policy.queue_capacity;
        let queued = shared.waiting.fetch_add(1, Ordering::SeqCst);
        if queued >= capacity {
            shared.waiting.fetch_sub(1, Ordering::SeqCst);
            shared.metrics.refused();
            return Err(Error::QueueFull {
                lane: shared.key.clone(),
                capacity,
            });
        }
        let (tx, rx) = oneshot::channel();
        self.send(Ticket {
            seq,
            cost,
            priority,
            turn: tx,
        })?;
        shared.metrics.queued(queued + 1);
        Ok(place(Slot::Waiting(rx)))
    }

    /// Hand the dispatcher a ticket already counted in `waiting`.
    fn send(&self, ticket: Ticket) -> Result<(), Error> {
        self.tickets.try_send(ticket).map_err(|_| {
            self.shared.waiting.fetch_sub(1, Ordering::SeqCst);
            Error::Shutdown
        })
    }

    /// The fast path: when nobody waits, the lane is not paused and the
    /// meters allow it now, take the turn without a trip through the
    /// dispatcher. FIFO holds: "nobody waits" is checked again under the
    /// meters' lock, which the dispatcher also holds from its check to its
    /// charge, so no two releases can share a slot.
    fn turn_now(&self, cost: u64) -> Option<Turn> {
        let shared = &self.shared;
        if shared.waiting.load(Ordering::SeqCst) != 0 || self.tickets.is_closed() {
            return None;
        }
        // With a shared store every release needs a reservation, which only
        // the dispatcher makes.
        #[cfg(feature = "redis")]
        if shared.remote.is_some() {
            return None;
        }
        let queued_elsewhere = shared
            .gates
            .iter()
            .any(|gate| is_shared(gate) && gate.has_queue());
        if queued_elsewhere {
            return None;
        }
        let permit = match &shared.in_flight {
            None => None,
            Some(slots) => Some(slots.clone().try_acquire_owned().ok()?),
        };
        // The clock is read under the lock: an instant read before it may
        // predate the charge of whoever held it, and would send this caller
        // to the queue for nothing (and everyone after it, behind it).
        let charged_at = shared.with_meters(|meters| {
            let now = Instant::now();
            let waiting = shared.waiting.load(Ordering::SeqCst) != 0;
            if waiting || shared.paused_until(now).is_some() || earliest(meters, cost, now) > now {
                return None;
            }
            for meter in meters {
                meter.commit(cost, now);
            }
            Some(now)
        })?;
        shared.released.fetch_add(1, Ordering::Relaxed);
        shared.metrics.released(0);
        Some(Turn {
            _in_flight: permit,
            at: charged_at,
        })
    }

    /// Put a released request back in the queue with its old number, so it
    /// goes before everything that came after it.
    pub(crate) fn reenter(&self, place: &mut Place) -> Result<(), Error> {
        if let Some(&(deadline, max_wait)) = place.deadline.as_deref() {
            let release = self.paused_until().unwrap_or_else(Instant::now);
            if release > deadline {
                return Err(Error::WouldExceedMaxWait {
                    lane: self.shared.key.clone(),
                    predicted: release.saturating_duration_since(Instant::now()),
                    max_wait,
                });
            }
        }
        let (tx, rx) = oneshot::channel();
        place.slot = Slot::Waiting(rx);
        self.shared.waiting.fetch_add(1, Ordering::SeqCst);
        self.send(Ticket {
            seq: place.seq,
            cost: place.cost,
            priority: place.priority,
            turn: tx,
        })
    }

    /// Wait until the dispatcher hands this place its turn.
    pub(crate) async fn wait(&self, place: &mut Place) -> Result<Turn, Error> {
        let rx = match std::mem::replace(&mut place.slot, Slot::Taken) {
            Slot::Ready(turn) => return Ok(turn),
            Slot::Waiting(rx) => rx,
            Slot::Taken => return Err(Error::Shutdown),
        };
        match place.deadline.as_deref().copied() {
            None => answered(rx.await),
            // Boxed: a timer is large, and most requests have no deadline;
            // this keeps every queued request without one small.
            Some((deadline, max_wait)) => Box::pin(self.wait_until(rx, deadline, max_wait)).await,
        }
    }

    async fn wait_until(
        &self,
        mut rx: oneshot::Receiver<Answer>,
        deadline: Instant,
        max_wait: Duration,
    ) -> Result<Turn, Error> {
        tokio::select! {
            biased;
            turn = &mut rx => return answered(turn),
            () = sleep_until(deadline) => {}
        }
        // A release due at the deadline itself is woken in the same tick:
        // let the dispatcher run once before giving up.
        tokio::task::yield_now().await;
        match rx.try_recv() {
            Ok(answer) => answered(Ok(answer)),
            Err(oneshot::error::TryRecvError::Closed) => Err(Error::Shutdown),
            Err(oneshot::error::TryRecvError::Empty) => {
                self.shared.metrics.refused();
                Err(Error::MaxWaitElapsed {
                    lane: self.shared.key.clone(),
                    max_wait,
                })
            }
        }
    }

    /// A request released at `turn` cost `actual`, not the `charged` it
    /// was estimated at: correct the meters that count cost.
    pub(crate) fn settle(&self, charged: u64, actual: u64, at: Instant) {
        #[cfg(feature = "redis")]
        if let Some(remote) = &self.shared.remote
            && remote.mode() != crate::store::StoreMode::Fallback
        {
            remote.settle(charged, actual, at);
            return;
        }
        for gate in &self.shared.gates {
            lock(&gate.meters).settle(charged, actual, at);
        }
    }

    /// Pause the whole lane, and the shared quotas above it (so every lane
    /// sharing the vendor's quota stops too), for `pause` from now, clamped
    /// to `max_pause`. A pause only ever moves forward: a shorter one than
    /// the current leaves it as it is. Returns the instant the lane resumes.
    pub fn pause_for(&self, pause: Duration) -> Instant {
        #[cfg(feature = "redis")]
        if let Some(remote) = &self.shared.remote {
            remote.pause(pause.min(self.shared.policy.max_pause));
        }
        let gates = &self.shared.gates;
        gates
            .iter()
            .map(|gate| gate.pause_for(pause))
            .max()
            .unwrap_or_else(Instant::now)
    }

    /// The lane was throttled: the pause to take (the vendor's hint, else
    /// the vendor gate's growing fallback).
    pub(crate) fn throttled(&self, hint: Option<Duration>) -> Duration {
        self.shared.throttles.fetch_add(1, Ordering::Relaxed);
        self.shared.metrics.throttled();
        self.shared.vendor().throttled(hint)
    }

    /// The vendor accepted a request.
    pub(crate) fn succeeded(&self) {
        self.shared.vendor().succeeded();
    }

    /// The vendor announced its quota; see [`Gate::learn`]. True when this
    /// changed the pace.
    pub(crate) fn learn(&self, announced: Rate) -> bool {
        let learned = self.shared.vendor().learn(announced);
        if learned {
            let per_second = f64::from(announced.count) / announced.per.as_secs_f64();
            self.shared.metrics.learned(per_second);
        }
        learned
    }

    /// A failed request is tried again.
    pub(crate) fn retried(&self) {
        self.shared.metrics.retried();
    }

    /// A request waited `wait` from submission to its first release.
    pub(crate) fn waited(&self, wait: Duration) {
        self.shared.metrics.waited(wait);
    }

    /// A request's first attempt: it earns the vendor's retry budget some.
    pub(crate) fn deposit(&self) {
        self.shared.vendor().deposit();
    }

    /// Spend one failure retry from the vendor's budget, if any is left.
    pub(crate) fn withdraw_retry(&self) -> bool {
        self.shared.vendor().withdraw_retry()
    }

    fn paused_until(&self) -> Option<Instant> {
        self.shared.paused_until(Instant::now())
    }

    /// Queue depth, the meters and the pause give the wait a new request
    /// would see. An estimate when costs vary: it takes everyone ahead to
    /// cost as much as this request, and ignores other lanes sharing a
    /// quota, which is why `max_wait` is also enforced while waiting.
    fn predicted_wait(&self, cost: u64, now: Instant) -> Duration {
        // During a pause nothing goes: the queue drains from its end.
        let from = self.paused_until().unwrap_or(now);
        let ahead = u64::try_from(self.queued()).unwrap_or(u64::MAX);
        // On a shared store the local meters are the fallback's share; the
        // fleet's state is in Redis. Predict from this lane's queue at the
        // declared pace (other instances' queues are unknown here).
        #[cfg(feature = "redis")]
        if let Some(remote) = &self.shared.remote
            && remote.mode() == crate::store::StoreMode::Shared
        {
            let interval = self
                .shared
                .gates
                .iter()
                .filter_map(|g| g.request_interval())
                .max();
            let spacing = crate::meters::spacing(interval.unwrap_or_default(), ahead);
            return (from + spacing) - now;
        }
        let meters = self.shared.meters();
        let eta = meters
            .iter()
            .map(|m| m.eta(ahead, cost, from))
            .max()
            .unwrap_or(from);
        eta - now
    }

    fn queued(&self) -> usize {
        self.shared.waiting.load(Ordering::SeqCst)
    }

    /// True when forgetting this lane loses nothing: nobody waiting, no
    /// pause, the meters rested.
    pub(crate) fn is_idle(&self) -> bool {
        let now = Instant::now();
        self.queued() == 0 && self.shared.gates.iter().all(|gate| gate.is_idle(now))
    }

    /// Refuse new requests and end every waiting one with
    /// [`Error::Shutdown`].
    pub(crate) fn close(&self) {
        self.tickets.close();
    }

    /// What the lane is doing right now.
    pub fn snapshot(&self) -> LaneSnapshot {
        let now = Instant::now();
        LaneSnapshot {
            key: self.shared.key.clone(),
            queued: self.queued(),
            paused_for: self.paused_until().map(|until| until - now),
            released: self.shared.released.load(Ordering::Relaxed),
            throttles: self.shared.throttles.load(Ordering::Relaxed),
            interval: self
                .shared
                .meters()
                .iter()
                .map(|m| m.interval())
                .max()
                .unwrap_or_default(),
            learned: self.shared.vendor().learned(),
            #[cfg(feature = "redis")]
            store: self.shared.remote.as_ref().map(crate::store::Remote::mode),
            #[cfg(not(feature = "redis"))]
            store: None,
        }
    }
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane")
            .field("key", &self.shared.key)
            .finish_non_exhaustive()
    }
}

/// A caller's place in a lane: its sequence number and cost (kept across
/// retries) and its next turn.
pub(crate) struct Place {
    seq: u64,
    cost: u64,
    priority: Priority,
    slot: Slot,
    /// Boxed: most requests have none, and every waiting one carries this.
    deadline: Option<Box<(Instant, Duration)>>,
}

impl Turn {
    /// When the lane's meters were charged for this turn.
    pub(crate) fn at(&self) -> Instant {
        self.at
    }
}

enum Slot {
    /// Taken on the fast path.
    Ready(Turn),
    /// Arrives from the dispatcher.
    Waiting(oneshot::Receiver<Answer>),
    /// Handed out already.
    Taken,
}

/// One class's waiting tickets, oldest first. Tickets almost always arrive
/// in sequence order, so they queue in a ring; only a throttled request
/// coming back with its old number goes to the ordered map. The head is the
/// lower of the two.
#[derive(Default)]
struct Front {
    fresh: VecDeque<(u64, Waiting)>,
    returned: BTreeMap<u64, Waiting>,
}

impl Front {
    fn insert(&mut self, seq: u64, waiting: Waiting) {
        if self.fresh.back().is_none_or(|&(last, _)| last < seq) {
            self.fresh.push_back((seq, waiting));
        } else {
            self.returned.insert(seq, waiting);
        }
    }

    fn first(&self) -> Option<(u64, &Waiting)> {
        let fresh = self.fresh.front().map(|(seq, w)| (*seq, w));
        let returned = self.returned.first_key_value().map(|(seq, w)| (*seq, w));
        match (fresh, returned) {
            (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    fn remove(&mut self, seq: u64) -> Option<Waiting> {
        if self.fresh.front().is_some_and(|&(first, _)| first == seq) {
            let waiting = self.fresh.pop_front().map(|(_, w)| w);
            if self.fresh.is_empty() && self.fresh.capacity() > 64 {
                // A burst is over: give its room back.
                self.fresh = VecDeque::new();
            }
            return waiting;
        }
        self.returned.remove(&seq)
    }

    fn is_empty(&self) -> bool {
        self.fresh.is_empty() && self.returned.is_empty()
    }

    /// The costs of the first `n` tickets, in order.
    #[cfg(feature = "redis")]
    fn costs(&self, n: usize) -> Vec<u64> {
        let mut fresh = self.fresh.iter().map(|(seq, w)| (*seq, w.cost)).peekable();
        let mut returned = self
            .returned
            .iter()
            .map(|(seq, w)| (*seq, w.cost))
            .peekable();
        let mut costs = Vec::with_capacity(n);
        while costs.len() < n {
            let next = match (fresh.peek(), returned.peek()) {
                (Some(a), Some(b)) if b.0 < a.0 => returned.next(),
                (Some(_), _) => fresh.next(),
                (None, _) => returned.next(),
            };
            let Some((_, cost)) = next else { break };
            costs.push(cost);
        }
        costs
    }

    /// Take every ticket out, oldest first.
    #[cfg(feature = "redis")]
    fn drain(&mut self) -> Vec<Waiting> {
        let mut all: Vec<(u64, Waiting)> = self.fresh.drain(..).collect();
        all.extend(std::mem::take(&mut self.returned));
        all.sort_by_key(|(seq, _)| *seq);
        all.into_iter().map(|(_, w)| w).collect()
    }

    fn clear(&mut self) {
        self.fresh.clear();
        self.returned.clear();
    }
}

/// A waiting ticket, as the dispatcher holds it.
struct Waiting {
    cost: u64,
    turn: oneshot::Sender<Answer>,
}

struct Dispatcher {
    shared: Arc<Shared>,
    tickets: async_channel::Receiver<Ticket>,
    /// Waiting tickets by class, by sequence number.
    interactive: Front,
    batch: Front,
    /// Interactive releases since the last batch one, while batch waited.
    since_batch: u32,
    /// Since when this lane has been ready but for a shared gate: its place
    /// in those gates' queues.
    since: Option<Instant>,
    on_idle: Option<OnIdle>,
    /// Slots reserved in the shared store, not yet used.
    #[cfg(feature = "redis")]
    booked: Booked,
}

/// Reserved slots of a lane on a shared store, earliest first.
#[cfg(feature = "redis")]
#[derive(Default)]
struct Booked {
    slots: VecDeque<Booking>,
    /// The gates' reservation counts after the last batch: a give-back is
    /// only safe if nobody reserved since.
    seqs: Vec<i64>,
    /// The next slot is beyond the store's horizon: ask again then.
    hold: Option<Instant>,
}

#[cfg(feature = "redis")]
struct Booking {
    /// When to release, on this instance's clock.
    at: Instant,
    cost: u64,
    /// The slot in Redis time (us).
    t: i64,
}

/// The ticket at the head of the queue, about to be released.
#[derive(Clone, Copy)]
struct Head {
    class: Priority,
    seq: u64,
    cost: u64,
}

/// Why the head can't go yet.
enum Blocked {
    /// A meter allows it then.
    Until(Instant),
    /// Another lane is first in a gate's queue; wait for it to go.
    Turn(Pin<Box<OwnedNotified>>),
}

impl Dispatcher {
    async fn run(mut self) {
        while self.step().await {}
        self.leave_queues();
        #[cfg(feature = "redis")]
        self.give_back();
        // Closed: whoever still waits learns it at once.
        self.interactive.clear();
        self.batch.clear();
        while self.tickets.try_recv().is_ok() {}
    }

    fn file(&mut self, ticket: Ticket) {
        let front = match ticket.priority {
            Priority::Interactive => &mut self.interactive,
            Priority::Batch => &mut self.batch,
        };
        let waiting = Waiting {
            cost: ticket.cost,
            turn: ticket.turn,
        };
        front.insert(ticket.seq, waiting);
    }

    /// The class whose oldest ticket goes next.
    fn next_class(&self) -> Option<Priority> {
        match (self.interactive.is_empty(), self.batch.is_empty()) {
            (true, true) => None,
            (false, true) => Some(Priority::Interactive),
            (true, false) => Some(Priority::Batch),
            (false, false) if self.since_batch + 1 >= self.shared.policy.batch_share => {
                Some(Priority::Batch)
            }
            (false, false) => Some(Priority::Interactive),
        }
    }

    fn front(&mut self, class: Priority) -> &mut Front {
        match class {
            Priority::Interactive => &mut self.interactive,
            Priority::Batch => &mut self.batch,
        }
    }

    /// Release at most one turn; false once the lane is closed.
    async fn step(&mut self) -> bool {
        if self.tickets.is_closed() {
            return false;
        }
        while let Ok(ticket) = self.tickets.try_recv() {
            self.file(ticket);
        }
        let Some(class) = self.next_class() else {
            self.leave_queues();
            #[cfg(feature = "redis")]
            self.give_back();
            return self.wait_for_work().await;
        };
        let Some((seq, head)) = self.front(class).first() else {
            return true;
        };
        let cost = head.cost;
        if head.turn.is_closed() {
            self.front(class).remove(seq);
            self.shared.waiting.fetch_sub(1, Ordering::SeqCst);
            return true;
        }

        let now = Instant::now();
        if let Some(until) = self.shared.paused_until(now) {
            self.leave_queues();
            // Slots reserved before the pause are of no use now.
            #[cfg(feature = "redis")]
            self.give_back();
            return self.or_new_ticket(sleep_until(until)).await;
        }

        let permit = match self.shared.in_flight.clone() {
            None => None,
            Some(slots) => match slots.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    self.leave_queues();
                    // Only the dispatcher takes slots: once one is free it
                    // is still free on the next step.
                    let free = slots.clone();
                    return self
                        .or_new_ticket(async move { drop(free.acquire().await) })
                        .await;
                }
            },
        };

        let head = Head { class, seq, cost };
        #[cfg(feature = "redis")]
        if self.shared.remote.is_some() {
            return self.step_remote(head, now, permit).await;
        }
        self.release_local(head, now, permit).await
    }

    /// Release the head by this process's meters, or wait for them.
    async fn release_local(
        &mut self,
        head: Head,
        now: Instant,
        permit: Option<OwnedSemaphorePermit>,
    ) -> bool {
        match self.release(head, now, permit) {
            Ok(_) => true,
            Err(blocked) => self.wait_for(blocked).await,
        }
    }

    /// Wait for what holds the head back, or for a new ticket.
    async fn wait_for(&mut self, blocked: Blocked) -> bool {
        match blocked {
            Blocked::Until(at) => self.or_new_ticket(sleep_until(at)).await,
            Blocked::Turn(turn) => self.or_new_ticket(turn).await,
        }
    }

    /// Release the head on a shared store: at its reserved slot; without
    /// one, reserve slots for it and those behind it first. When the store
    /// fails, the lane's policy decides: the local fallback, or refusing
    /// everyone waiting.
    #[cfg(feature = "redis")]
    async fn step_remote(
        &mut self,
        head: Head,
        now: Instant,
        permit: Option<OwnedSemaphorePermit>,
    ) -> bool {
        use crate::store::{Source, StoreMode};
        let cost = head.cost;
        let shared = self.shared.clone();
        let Some(remote) = shared.remote.as_ref() else {
            return self.release_local(head, now, permit).await;
        };
        match remote.source(now) {
            Source::Store => {}
            Source::Fallback => return self.release_local(head, now, permit).await,
            Source::Refuse => {
                self.refuse_all();
                return true;
            }
        }
        if let Some(slot) = self.booked.slots.front() {
            if slot.at > now {
                let at = slot.at;
                return self.or_new_ticket(sleep_until(at)).await;
            }
            if remote.on_probation(now) {
                // Back from an outage: other instances may still serve
                // from their fallback share, so keep to ours as well until
                // every one of them has found the store again.
                return match self.release(head, now, permit) {
                    Ok(handed) => {
                        if handed {
                            self.booked.slots.pop_front();
                        }
                        true
                    }
                    Err(blocked) => self.wait_for(blocked).await,
                };
            }
            if let Some(slot) = self.booked.slots.pop_front() {
                if !self.hand(head, now, permit) {
                    // Its caller left just now: the slot serves the next.
                    self.booked.slots.push_front(slot);
                } else if slot.cost != cost {
                    // Reserved for another cost (a retried request came
                    // back ahead): correct the meters that count cost.
                    remote.settle_at(slot.cost, cost, slot.t);
                }
            }
            return true;
        }
        if let Some(hold) = self.booked.hold {
            if hold > now {
                return self.or_new_ticket(sleep_until(hold)).await;
            }
            self.booked.hold = None;
        }
        let costs = self.front(head.class).costs(remote.batch());
        match remote.reserve(&costs).await {
            Ok(reservation) => {
                remote.recovered(&shared.key);
                let received = Instant::now();
                if let Some(paused) = reservation.paused {
                    shared.vendor().pause_for(paused);
                }
                for (wait, cost) in reservation.waits.iter().zip(costs) {
                    self.booked.slots.push_back(Booking {
                        at: received + *wait,
                        cost,
                        t: reservation.now + i64::try_from(wait.as_micros()).unwrap_or(i64::MAX),
                    });
                }
                self.booked.seqs = reservation.seqs;
                // Ask again once the next slot is within the horizon.
                self.booked.hold = reservation
                    .hold
                    .map(|hold| received + hold.saturating_sub(remote.horizon()));
                true
            }
            Err(error) => {
                match remote.failed(error, &shared.key) {
                    StoreMode::Unavailable => self.refuse_all(),
                    _ => return self.release_local(head, now, permit).await,
                }
                true
            }
        }
    }

    /// A fail-closed lane whose store is down: everyone waiting learns it
    /// now, not after a timeout each.
    #[cfg(feature = "redis")]
    fn refuse_all(&mut self) {
        self.give_back();
        let shared = &self.shared;
        let Some(remote) = &shared.remote else {
            return;
        };
        for front in [&mut self.interactive, &mut self.batch] {
            for waiting in front.drain() {
                shared.waiting.fetch_sub(1, Ordering::SeqCst);
                shared.metrics.refused();
                let error = Error::StoreUnavailable {
                    lane: shared.key.clone(),
                    source: remote.last_error(),
                };
                let _ = waiting.turn.send(Err(Box::new(error)));
            }
        }
    }

    /// Give back the slots this lane reserved and will not use.
    #[cfg(feature = "redis")]
    fn give_back(&mut self) {
        self.booked.hold = None;
        if self.booked.slots.is_empty() {
            return;
        }
        let slots = self.booked.slots.drain(..).rev().map(|b| (b.t, b.cost));
        if let Some(remote) = &self.shared.remote {
            remote.give_back(slots.collect(), std::mem::take(&mut self.booked.seqs));
        }
    }

    /// This lane is no longer ready: give up its places in gate queues.
    fn leave_queues(&mut self) {
        if let Some(since) = self.since.take() {
            for gate in &self.shared.gates {
                gate.delist((since, self.shared.id));
            }
        }
    }

    /// Hand the head its turn if every meter allows it now and no lane
    /// that waited longer is first in a shared gate's queue, or say what to
    /// wait for. Check and charge happen under the meters' locks, as on the
    /// fast path. `Ok(true)` when the head got its turn, `Ok(false)` when
    /// its caller had left.
    ///
    /// Fair sharing: a lane ready but for one gate joins that gate's queue
    /// and keeps its place there until it goes, so when a slot frees, the
    /// lane that has waited longest takes it, whichever lane's timer fires
    /// first. A lane held back by another gate (its own tenant cap) leaves
    /// the queue, so it never blocks a gate it could not use anyway.
    fn release(
        &mut self,
        head: Head,
        now: Instant,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Result<bool, Blocked> {
        let cost = head.cost;
        let shared = self.shared.clone();
        shared.with_meters(|meters| {
            let at = earliest(meters, cost, now);
            if let Some(blocked) = self.queue_up(meters, cost, now) {
                return Err(blocked);
            }
            if at > now {
                return Err(Blocked::Until(at));
            }
            let handed = self.hand(head, now, permit);
            if handed {
                for meter in meters.iter_mut() {
                    meter.commit(cost, now);
                }
            }
            Ok(handed)
        })
    }

    /// Hand the head its turn and count it; false if its caller left (its
    /// ticket is gone either way).
    fn hand(
        &mut self,
        Head { class, seq, .. }: Head,
        now: Instant,
        permit: Option<OwnedSemaphorePermit>,
    ) -> bool {
        let batch_waited = !self.batch.is_empty();
        let Some(head) = self.front(class).remove(seq) else {
            return false;
        };
        let turn = Turn {
            _in_flight: permit,
            at: now,
        };
        let handed = head.turn.send(Ok(turn)).is_ok();
        let shared = &self.shared;
        if handed {
            shared.released.fetch_add(1, Ordering::Relaxed);
            let queued = shared.waiting.load(Ordering::Relaxed).saturating_sub(1);
            shared.metrics.released(queued);
            self.since_batch = match class {
                Priority::Batch => 0,
                Priority::Interactive if batch_waited => self.since_batch + 1,
                Priority::Interactive => 0,
            };
            self.leave_queues();
        }
        self.shared.waiting.fetch_sub(1, Ordering::SeqCst);
        handed
    }

    /// Take or keep this lane's place in the queue of each shared gate that
    /// alone holds it back; leave the queues of gates it could not use
    /// anyway. `Some` when another lane is first at a gate that would let
    /// this one go now.
    fn queue_up(
        &mut self,
        meters: &[MutexGuard<'_, Meters>],
        cost: u64,
        now: Instant,
    ) -> Option<Blocked> {
        let shared = self.shared.clone();
        if !shared.gates.iter().any(is_shared) {
            return None;
        }
        let times: Vec<Instant> = meters.iter().map(|m| m.earliest(cost, now)).collect();
        let me = (*self.since.get_or_insert(now), shared.id);
        let mut held_by = None;
        for (i, gate) in shared
            .gates
            .iter()
            .enumerate()
            .filter(|(_, gate)| is_shared(gate))
        {
            let others_allow = times.iter().enumerate().all(|(j, &at)| j == i || at <= now);
            if !others_allow {
                gate.delist(me);
                continue;
            }
            gate.enlist(me);
            if times[i] <= now && !gate.is_first(me) {
                held_by = Some(gate);
            }
        }
        let at = times.iter().copied().max().unwrap_or(now);
        let gate = held_by.filter(|_| at <= now)?;
        // Enabled while the meters are locked: the lane ahead can only go,
        // and wake us, after we let go of them.
        let mut turn = Box::pin(gate.turn.clone().notified_owned());
        turn.as_mut().enable();
        Some(Blocked::Turn(turn))
    }

    /// Nothing to release: wait for a request, or report idleness.
    async fn wait_for_work(&mut self) -> bool {
        let idle = self.shared.policy.idle_timeout;
        let mut idled = false;
        let open = self
            .or_new_ticket(async {
                sleep(idle).await;
                idled = true
            })
            .await;
        if idled && let Some(on_idle) = &self.on_idle {
            on_idle();
        }
        open
    }

    /// Wait for `until`, but come back early when a ticket arrives: a
    /// returning request may belong before the current head.
    async fn or_new_ticket(&mut self, until: impl Future<Output = ()>) -> bool {
        tokio::select! {
            biased;
            ticket = self.tickets.recv() => match ticket {
                Ok(ticket) => {
                    self.file(ticket);
                    true
                }
                Err(_) => false,
            },
            () = until => true,
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn policy() -> LanePolicy {
        LanePolicy::new(Rate::new(10, Duration::from_secs(1)))
    }

    #[tokio::test(start_paused = true)]
    async fn pauses_only_move_forward_and_are_clamped() {
        let lane = Lane::new(
            "t",
            LanePolicy {
                max_pause: Duration::from_secs(5),
                ..policy()
            },
        )
        .unwrap();
        let now = Instant::now();
        assert_eq!(
            lane.pause_for(Duration::from_secs(3)),
            now + Duration::from_secs(3)
        );
        assert_eq!(
            lane.pause_for(Duration::from_secs(1)),
            now + Duration::from_secs(3)
        );
        assert_eq!(
            lane.pause_for(Duration::from_secs(60)),
            now + Duration::from_secs(5)
        );
        assert_eq!(lane.snapshot().paused_for, Some(Duration::from_secs(5)));
    }

    #[tokio::test(start_paused = true)]
    async fn the_fallback_grows_per_throttle_and_resets_on_success() {
        let lane = Lane::new("t", policy()).unwrap();
        let floors: Vec<_> = (0..4).map(|_| lane.throttled(None)).collect();
        for (n, pause) in floors.iter().enumerate() {
            let ceiling = Duration::from_secs(1 << n);
            assert!(
                *pause >= ceiling / 2 && *pause <= ceiling,
                "throttle {n}: {pause:?}"
            );
        }
        lane.succeeded();
        assert!(lane.throttled(None) <= Duration::from_secs(1));
        assert_eq!(
            lane.throttled(Some(Duration::from_secs(7))),
            Duration::from_secs(7)
        );
        assert_eq!(lane.snapshot().throttles, 6);
    }

    #[tokio::test(start_paused = true)]
    async fn interactive_goes_first_and_batch_keeps_its_share() {
        let lane = Lane::new("t", policy()).unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (i, priority) in (0..12).map(|i| {
            (
                i,
                if i < 6 {
                    Priority::Batch
                } else {
                    Priority::Interactive
                },
            )
        }) {
            let mut place = lane.enter(1, priority, None).unwrap();
            let (lane, order) = (lane.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _turn = lane.wait(&mut place).await.unwrap();
                lock(&order).push(i);
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        // 0 went on the fast path; then interactive 6..12 first, with every
        // fifth release given to the oldest batch request.
        assert_eq!(*lock(&order), [0, 6, 7, 8, 9, 1, 10, 11, 2, 3, 4, 5]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cost_beyond_every_capacity_is_refused_at_once() {
        let policy = LanePolicy::with_quotas([
            Quota::leaky_bucket(10, Duration::from_secs(1)),
            Quota::sliding_log(1000, Duration::from_secs(60)).per_cost(),
        ]);
        let lane = Lane::new("t", policy).unwrap();
        assert!(lane.enter(1000, Priority::Interactive, None).is_ok());
        match lane.enter(1001, Priority::Interactive, None) {
            Err(Error::CostTooHigh { cost, capacity, .. }) => {
                assert_eq!((cost, capacity), (1001, 1000))
            }
            Err(other) => panic!("expected CostTooHigh, got {other}"),
            Ok(_) => panic!("expected CostTooHigh"),
        }
    }

    /// Burst-capable meters predict a burst, not a trickle: a fixed window
    /// of 10 a minute admits ten at once and tells the eleventh a minute.
    #[tokio::test(start_paused = true)]
    async fn admission_predicts_waits_from_each_meters_shape() {
        let minute = Duration::from_secs(60);
        for quota in [
            Quota::fixed_window(10, minute),
            Quota::token_bucket(10, 10, minute),
            Quota::sliding_log(10, minute),
        ] {
            let policy = LanePolicy {
                headroom: Duration::ZERO,
                ..LanePolicy::with_quotas([quota])
            };
            let lane = Lane::new("t", policy).unwrap();
            let max_wait = Some(Duration::from_secs(5));
            let mut places = Vec::new();
            for _ in 0..10 {
                places.push(
                    lane.enter(1, Priority::Interactive, max_wait)
                        .expect("fits the burst"),
                );
            }
            match lane.enter(1, Priority::Interactive, max_wait) {
                Err(Error::WouldExceedMaxWait { predicted, .. }) => {
                    assert!(
                        predicted >= Duration::from_secs(6),
                        "{quota:?}: {predicted:?}"
                    );
                }
                Err(other) => panic!("{quota:?}: {other}"),
                Ok(_) => panic!("{quota:?}: the eleventh fits no window"),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_paused_lane_releases_nothing_until_the_pause_ends() {
        let lane = Lane::new("t", policy()).unwrap();
        lane.pause_for(Duration::from_secs(2));
        let start = Instant::now();
        let _turn = lane.acquire().await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }
}
