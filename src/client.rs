//! The front door: [`Shaper`] wraps a reqwest client and sends every request
//! through the lanes of its quotas.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderName, HeaderValue};
use reqwest::{IntoUrl, Method, Request, Response};
use tokio::time::Instant;

use crate::adaptive::Adaptive;
use crate::error::{ConfigError, Error};
use crate::gate::{self, Gate, GateMap};
use crate::lane::{Lane, LanePolicy, LaneSnapshot, Priority};
use crate::meters::Quota;
use crate::retry::{self, Backoff, RetryBudget, RetryPolicy, Verdict};
use crate::route::{LaneKey, Level, Route, Tag};
use crate::signals::{Dialect, Signals};
use crate::store::StoreFailure;

/// A boxed, sendable future, as [`Transport::send`] returns.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What actually puts a request on the wire once its lanes release it.
///
/// `reqwest::Client` is the transport unless you give another; a wrapper can
/// add what has to happen per attempt (signing, tracing) underneath the
/// shaper, so that every retry gets it too.
pub trait Transport: Send + Sync + 'static {
    /// Send one attempt.
    fn send(&self, request: Request) -> BoxFuture<reqwest::Result<Response>>;
}

impl Transport for reqwest::Client {
    fn send(&self, request: Request) -> BoxFuture<reqwest::Result<Response>> {
        Box::pin(self.execute(request))
    }
}

/// A per-request limit on the wait for release, also understood as a
/// `reqwest_middleware` extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxWait(pub Duration);

/// Estimates a request's cost when the caller gave none.
type CostFn = dyn Fn(&Request) -> u64 + Send + Sync;

/// What a caller can say about one request besides the request itself.
#[derive(Debug, Clone, Default)]
pub(crate) struct Options {
    pub(crate) max_wait: Option<Duration>,
    pub(crate) cost: Option<u64>,
    pub(crate) priority: Priority,
    pub(crate) tag: Option<Tag>,
}

/// A reqwest client that can't exceed a vendor's quota.
///
/// Every request goes through the lanes of its quotas (by default one lane
/// per origin): FIFO queues released at the quotas' pace. A 429 or 503
/// pauses the lanes for as long as the vendor says; the throttled request
/// keeps its place at the head and goes again when the pause ends. Cloning
/// is cheap, and clones share lanes.
///
/// ```
/// use std::time::Duration;
/// use callshaper::Shaper;
/// use callshaper::testing::Vendor;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // A vendor that allows 10 requests per second and answers 429 beyond.
/// let vendor = Vendor::strict(10, Duration::from_secs(1)).start().await;
///
/// let shaper = Shaper::builder().rate(10, Duration::from_secs(1)).build()?;
///
/// // Ten callers at once: released one every 100 ms, never refused.
/// let started = std::time::Instant::now();
/// let calls: Vec<_> = (0..10)
///     .map(|i| tokio::spawn(shaper.get(format!("{}/items/{i}", vendor.uri())).send()))
///     .collect();
/// for call in calls {
///     assert_eq!(call.await??.status(), 200);
/// }
/// assert!(started.elapsed() >= Duration::from_millis(900));
/// assert_eq!(vendor.throttled(), 0);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Shaper {
    inner: Arc<Inner>,
}

type LaneMap = Mutex<HashMap<String, Arc<Lane>>>;

struct Inner {
    client: reqwest::Client,
    transport: Arc<dyn Transport>,
    /// How every lane behaves (its quotas come from the levels).
    policy: LanePolicy,
    retry: RetryPolicy,
    routes: Vec<Route>,
    /// The shaper-wide levels, the vendor's last.
    levels: Vec<Level>,
    cost: Option<Arc<CostFn>>,
    dialects: Vec<Arc<dyn Dialect>>,
    lanes: Arc<LaneMap>,
    gates: Arc<GateMap>,
    shut: AtomicBool,
    /// Where the gates' quotas live when a fleet shares them.
    #[cfg(feature = "redis")]
    store: Option<crate::store::RedisStore>,
    #[cfg(feature = "redis")]
    store_failure: StoreFailure,
}

fn lock(lanes: &LaneMap) -> MutexGuard<'_, HashMap<String, Arc<Lane>>> {
    lanes.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The lane key of a request when none is chosen: its origin
/// (`scheme://host:port`).
pub fn origin_key(request: &Request) -> String {
    LaneKey::Origin.of(request, None)
}

impl Shaper {
    /// Start configuring a shaper; a quota ([`ShaperBuilder::rate`] or
    /// [`ShaperBuilder::quota`]) is the one setting without a default.
    pub fn builder() -> ShaperBuilder {
        ShaperBuilder::default()
    }

    /// Start a request; `send` queues it on its lanes.
    pub fn request<U: IntoUrl>(&self, method: Method, url: U) -> RequestBuilder {
        RequestBuilder {
            shaper: self.clone(),
            inner: self.inner.client.request(method, url),
            options: Options::default(),
        }
    }

    /// Start a GET request.
    pub fn get<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::GET, url)
    }

    /// Start a POST request.
    pub fn post<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::POST, url)
    }

    /// Send `request` through its lanes and return the vendor's response,
    /// or the reason there is none.
    pub async fn execute(&self, request: Request) -> Result<Response, Error> {
        self.execute_with(request, Options::default()).await
    }

    async fn execute_with(&self, request: Request, options: Options) -> Result<Response, Error> {
        let transport = self.inner.transport.clone();
        self.drive(request, options, |r| transport.send(r))
            .await
            .map_err(|failure| match failure {
                Failure::Shaper(error) => error,
                Failure::Send { attempts, source } => Error::Transport { attempts, source },
            })
    }

    /// What the lane `key` is doing, if it exists. Lanes of the default
    /// level are named by their key (the origin); others `level/key`.
    pub fn lane(&self, key: &str) -> Option<LaneSnapshot> {
        lock(&self.inner.lanes).get(key).map(|lane| lane.snapshot())
    }

    /// Every live lane.
    pub fn lanes(&self) -> Vec<LaneSnapshot> {
        lock(&self.inner.lanes)
            .values()
            .map(|lane| lane.snapshot())
            .collect()
    }

    /// Stop: requests that have not been released end with
    /// [`Error::Shutdown`], and so does every later one. Requests already on
    /// the wire finish.
    pub fn shutdown(&self) {
        self.inner.shut.store(true, Ordering::Release);
        for (_, lane) in lock(&self.inner.lanes).drain() {
            lane.close();
        }
    }

    /// The levels `request` goes through: its route's, then the shaper's
    /// (unless the route stands alone).
    fn levels_for(&self, request: &Request) -> impl Iterator<Item = &Level> {
        let route = self.route_for(request);
        let shared = if route.is_some_and(|route| route.alone) {
            &[][..]
        } else {
            &self.inner.levels[..]
        };
        route
            .into_iter()
            .flat_map(|route| &route.levels)
            .chain(shared)
    }

    fn route_for(&self, request: &Request) -> Option<&Route> {
        self.inner
            .routes
            .iter()
            .find(|route| route.matches(request))
    }

    /// The lane of `request`, created on first use: named by its key in
    /// every level, and sharing the gate of each.
    fn lane_for(&self, request: &Request, tag: Option<&Tag>) -> Result<Arc<Lane>, Error> {
        let levels: Vec<&Level> = self.levels_for(request).collect();
        let keys: Vec<String> = levels
            .iter()
            .map(|level| level.lane_name(request, tag))
            .collect();
        if levels.is_empty() {
            return Err(Error::NoQuota {
                url: request.url().to_string(),
            });
        }
        let name = keys.join(" | ");
        let mut lanes = lock(&self.inner.lanes);
        if self.inner.shut.load(Ordering::Acquire) {
            return Err(Error::Shutdown);
        }
        if let Some(lane) = lanes.get(&name) {
            return Ok(lane.clone());
        }
        // Every level's quotas are a shared gate, even when one lane is all
        // that uses it yet: the vendor's quota must be one gate for all.
        let shared: Vec<Arc<Gate>> = levels
            .iter()
            .zip(&keys)
            .map(|(level, key)| self.gate_for(level, key))
            .collect();
        #[cfg(feature = "redis")]
        let remote = self.inner.store.as_ref().map(|store| {
            let failure = self
                .route_for(request)
                .and_then(|route| route.store_failure)
                .unwrap_or(self.inner.store_failure);
            let quotas: Vec<Vec<Quota>> = levels.iter().map(|l| l.quotas.clone()).collect();
            crate::store::Remote::new(
                store.clone(),
                shared.clone(),
                &keys,
                &quotas,
                self.inner.policy.headroom,
                failure,
                &name,
            )
        });
        let policy = LanePolicy {
            quotas: Vec::new(),
            ..self.inner.policy.clone()
        };
        let on_idle = evict_when_idle(Arc::downgrade(&self.inner.lanes), name.clone());
        let lane = Arc::new(Lane::spawn(
            name.clone(),
            policy,
            self.inner.retry.budget,
            shared,
            Some(on_idle),
            #[cfg(feature = "redis")]
            remote,
        ));
        lanes.insert(name, lane.clone());
        Ok(lane)
    }

    /// The shared gate of `level` for `key`, created on first use.
    fn gate_for(&self, level: &Level, key: &str) -> Arc<Gate> {
        let mut gates = gate::lock(&self.inner.gates);
        if let Some(gate) = gates.get(key).and_then(Weak::upgrade) {
            return gate;
        }
        let registry = Some((Arc::downgrade(&self.inner.gates), key.to_owned()));
        #[cfg(feature = "redis")]
        let share = self.inner.store.as_ref().map_or(1, |s| s.fleet_size());
        #[cfg(not(feature = "redis"))]
        let share = 1;
        let gate = Arc::new(Gate::new(
            level.quotas.clone(),
            &self.inner.policy,
            self.inner.retry.budget,
            registry,
            share,
        ));
        gates.insert(key.to_owned(), Arc::downgrade(&gate));
        gate
    }

    /// The loop every request runs: wait for the turns, send, and decide
    /// from the outcome whether to pause the lanes and go again.
    pub(crate) async fn drive<E, F, Fut>(
        &self,
        mut request: Request,
        options: Options,
        mut send: F,
    ) -> Result<Response, Failure<E>>
    where
        E: SendFailure,
        F: FnMut(Request) -> Fut,
        Fut: Future<Output = Result<Response, E>>,
    {
        let lane = self.lane_for(&request, options.tag.as_ref())?;
        let cost = options
            .cost
            .or_else(|| self.inner.cost.as_ref().map(|estimate| estimate(&request)))
            .unwrap_or(1);
        let max_wait = options.max_wait.or(lane.policy().max_wait);
        let submitted = Instant::now();
        let mut place = lane.enter(cost, options.priority, max_wait)?;
        let policy = &self.inner.retry;
        let may_retry_failure =
            policy.retry_non_idempotent || retry::is_idempotent(request.method());
        let (mut attempts, mut failures, mut throttles) = (0u32, 0u32, 0u32);
        loop {
            let turn = lane.wait(&mut place).await?;
            attempts += 1;
            if attempts == 1 {
                lane.deposit();
                lane.waited(submitted.elapsed());
            }
            // A body that can't be cloned (a stream) allows one send only.
            let spare = request.try_clone();
            let mut outcome = send(request).await;
            let charged_at = turn.at();
            drop(turn);

            let signals = match &mut outcome {
                Ok(response) => {
                    let signals = self.read_signals(response.headers());
                    self.learn(&lane, &signals);
                    let extensions = response.extensions_mut();
                    extensions.insert(signals.clone());
                    extensions.insert(Settle::new(lane.clone(), cost, charged_at));
                    signals
                }
                Err(_) => Signals::default(),
            };
            let verdict = match &outcome {
                Ok(response) => retry::classify(response.status(), &signals),
                Err(_) => Verdict::Failed,
            };
            let headroom = lane.policy().headroom;
            match (verdict, outcome) {
                (Verdict::Done, outcome) => {
                    lane.succeeded();
                    if let Some(reset) = signals.exhausted_for() {
                        // Nothing left until `reset`: stop before the vendor
                        // has to say 429.
                        lane.pause_for(reset + headroom);
                        tracing::info!(
                            lane = lane.key(),
                            ?reset,
                            "quota used up; pausing until it resets"
                        );
                    }
                    return outcome.map_err(|source| Failure::Send { attempts, source });
                }
                (Verdict::Throttled, Ok(response)) => {
                    throttles += 1;
                    let hint = signals.pause_hint();
                    let pause = lane.throttled(hint);
                    // A hinted pause gets the headroom too: the vendor's
                    // clock and ours are not the same clock.
                    let padded = if pause.is_zero() || hint.is_none() {
                        pause
                    } else {
                        pause + headroom
                    };
                    lane.pause_for(padded);
                    tracing::warn!(
                        lane = lane.key(),
                        status = response.status().as_u16(),
                        ?pause,
                        hinted = hint.is_some(),
                        "vendor throttled the lane; pausing it"
                    );
                    let max_pause = lane.policy().max_pause;
                    if pause > max_pause {
                        return Err(Error::PauseTooLong {
                            lane: lane.key().to_owned(),
                            requested: pause,
                            max_pause,
                        }
                        .into());
                    }
                    let Some(next) = spare else {
                        return Ok(response);
                    };
                    if throttles >= policy.max_throttles {
                        return Err(Error::RetriesExhausted {
                            attempts,
                            last_status: response.status(),
                        }
                        .into());
                    }
                    request = next;
                }
                (_, outcome) => {
                    failures += 1;
                    let retryable = match &outcome {
                        Ok(_) => may_retry_failure,
                        Err(error) => {
                            error.is_connect() || (may_retry_failure && error.is_transient())
                        }
                    };
                    let next = match spare {
                        Some(next) if retryable => next,
                        _ => return outcome.map_err(|source| Failure::Send { attempts, source }),
                    };
                    let last_status = outcome.as_ref().ok().map(Response::status);
                    if failures >= policy.max_attempts {
                        return match outcome {
                            Ok(response) => Err(Error::RetriesExhausted {
                                attempts,
                                last_status: response.status(),
                            }
                            .into()),
                            Err(source) => Err(Failure::Send { attempts, source }),
                        };
                    }
                    if !lane.withdraw_retry() {
                        return Err(Error::RetryBudgetExhausted {
                            lane: lane.key().to_owned(),
                            attempts,
                            last_status,
                        }
                        .into());
                    }
                    lane.retried();
                    let backoff = policy.backoff.full_jitter(failures - 1);
                    tracing::debug!(
                        lane = lane.key(),
                        attempts,
                        ?backoff,
                        "retrying a failed request"
                    );
                    tokio::time::sleep(backoff).await;
                    request = next;
                }
            }
            lane.reenter(&mut place)?;
        }
    }

    /// Every dialect this shaper reads: the built-in ones, then the user's.
    fn read_signals(&self, headers: &reqwest::header::HeaderMap) -> Signals {
        let now = SystemTime::now();
        let mut signals = Signals::parse(headers, now);
        for dialect in &self.inner.dialects {
            dialect.read(headers, now, &mut signals);
        }
        signals
    }

    /// A vendor announcing a lower quota than the lane's slows the lane.
    fn learn(&self, lane: &Lane, signals: &Signals) {
        if let Some(announced) = signals.announced_rate()
            && lane.learn(announced)
        {
            tracing::warn!(
                lane = lane.key(),
                configured = ?lane.policy().request_rate(),
                ?announced,
                "the vendor announced a lower quota than configured; the lane keeps to it"
            );
        }
    }
}

impl fmt::Debug for Shaper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shaper")
            .field("levels", &self.inner.levels)
            .field("routes", &self.inner.routes)
            .field("retry", &self.inner.retry)
            .field("lanes", &lock(&self.inner.lanes).len())
            .finish_non_exhaustive()
    }
}

/// Drop an idle lane, unless somebody still holds it: the map's lock is
/// also taken to hand a lane out, so nobody can pick it up meanwhile.
fn evict_when_idle(lanes: Weak<LaneMap>, key: String) -> crate::lane::OnIdle {
    Box::new(move || {
        let Some(lanes) = lanes.upgrade() else { return };
        let mut lanes = lock(&lanes);
        if lanes
            .get(&key)
            .is_some_and(|lane| Arc::strong_count(lane) == 1 && lane.is_idle())
        {
            lanes.remove(&key);
            shrink(&mut lanes);
        }
    })
}

/// Report what a request really cost, once the response says (e.g. the
/// tokens an LLM call used): the lanes' cost-counting quotas are corrected
/// up or down. Found in the response's extensions.
///
/// ```
/// # async fn f(shaper: callshaper::Shaper) -> Result<(), callshaper::Error> {
/// let response = shaper.post("https://api.example.com/v1/chat").cost(1_000).send().await?;
/// // ... read the usage from the body ...
/// if let Some(settle) = response.extensions().get::<callshaper::Settle>() {
///     settle.report(200); // 800 tokens come back to the quota
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Settle {
    inner: Arc<SettleInner>,
}

struct SettleInner {
    lane: Arc<Lane>,
    charged: u64,
    at: Instant,
    reported: AtomicBool,
}

impl Settle {
    fn new(lane: Arc<Lane>, charged: u64, at: Instant) -> Self {
        Self {
            inner: Arc::new(SettleInner {
                lane,
                charged,
                at,
                reported: AtomicBool::new(false),
            }),
        }
    }

    /// What the request was charged.
    pub fn charged(&self) -> u64 {
        self.inner.charged
    }

    /// The request really cost `actual`. Only the first report counts.
    pub fn report(&self, actual: u64) {
        if self.inner.reported.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = &self.inner;
        inner.lane.settle(inner.charged, actual, inner.at);
    }
}

impl fmt::Debug for Settle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settle")
            .field("charged", &self.inner.charged)
            .finish_non_exhaustive()
    }
}

/// Give memory back once a map is mostly empty (after a burst of keys),
/// at a cost amortized over the removals that emptied it.
pub(crate) fn shrink<V>(map: &mut HashMap<String, V>) {
    if map.capacity() > 64 && map.len() < map.capacity() / 4 {
        map.shrink_to(map.len() * 2);
    }
}

/// How a request ended without a response: the shaper's reason, or the
/// transport's error after its last attempt.
pub(crate) enum Failure<E> {
    Shaper(Error),
    Send { attempts: u32, source: E },
}

impl<E> From<Error> for Failure<E> {
    fn from(error: Error) -> Self {
        Self::Shaper(error)
    }
}

/// What the retry rules need to know about a transport error.
pub(crate) trait SendFailure {
    /// No connection was made: the vendor never saw the request.
    fn is_connect(&self) -> bool;
    /// Worth another try for an idempotent request (timeouts, resets).
    fn is_transient(&self) -> bool;
}

impl SendFailure for reqwest::Error {
    fn is_connect(&self) -> bool {
        reqwest::Error::is_connect(self)
    }

    fn is_transient(&self) -> bool {
        self.is_timeout() || self.is_request()
    }
}

/// Configures a [`Shaper`].
#[must_use]
pub struct ShaperBuilder {
    /// The vendor level's quotas; its other settings live in `policy`.
    quotas: Vec<Quota>,
    policy: LanePolicy,
    vendor_key: LaneKey,
    levels: Vec<Level>,
    routes: Vec<Route>,
    retry: RetryPolicy,
    client: Option<reqwest::Client>,
    transport: Option<Arc<dyn Transport>>,
    cost: Option<Arc<CostFn>>,
    dialects: Vec<Arc<dyn Dialect>>,
    #[cfg(feature = "redis")]
    store: Option<crate::store::RedisStore>,
    store_failure: StoreFailure,
}

impl Default for ShaperBuilder {
    fn default() -> Self {
        Self {
            quotas: Vec::new(),
            policy: LanePolicy::with_quotas([]),
            vendor_key: LaneKey::Origin,
            levels: Vec::new(),
            routes: Vec::new(),
            retry: RetryPolicy::default(),
            client: None,
            transport: None,
            cost: None,
            dialects: Vec::new(),
            #[cfg(feature = "redis")]
            store: None,
            store_failure: StoreFailure::default(),
        }
    }
}

impl ShaperBuilder {
    /// Keep the quotas in Redis, shared by every instance connected to it,
    /// instead of in this process: see [`store`](crate::store).
    #[cfg(feature = "redis")]
    pub fn store(mut self, store: crate::store::RedisStore) -> Self {
        self.store = Some(store);
        self
    }

    /// What lanes do when the shared store fails ([`StoreFailure::Closed`]
    /// unless set); a route can choose its own
    /// ([`Route::on_store_failure`]). Without a store, nothing.
    pub fn on_store_failure(mut self, failure: StoreFailure) -> Self {
        self.store_failure = failure;
        self
    }

    /// The vendor's quota: `count` requests per `per`, a leaky bucket, for
    /// every vendor lane. Replaces quotas set before.
    pub fn rate(mut self, count: u32, per: Duration) -> Self {
        self.quotas = vec![Quota::leaky_bucket(count, per)];
        self
    }

    /// Add a quota to the vendor lanes (e.g. tokens per minute beside
    /// requests per minute); all are enforced together.
    pub fn quota(mut self, quota: Quota) -> Self {
        self.quotas.push(quota);
        self
    }

    /// A whole vendor lane policy at once (its quotas included).
    pub fn policy(mut self, policy: LanePolicy) -> Self {
        self.quotas = policy.quotas.clone();
        self.policy = policy;
        self
    }

    fn edit(mut self, edit: impl FnOnce(&mut LanePolicy)) -> Self {
        edit(&mut self.policy);
        self
    }

    /// Safety margin added to the vendor's window (default 5 ms).
    pub fn headroom(self, headroom: Duration) -> Self {
        self.edit(move |p| p.headroom = headroom)
    }

    /// How many requests may wait per lane (default 10,000).
    pub fn queue_capacity(self, capacity: usize) -> Self {
        self.edit(move |p| p.queue_capacity = capacity)
    }

    /// The longest a request may wait for release (default: no limit).
    pub fn max_wait(self, max_wait: Duration) -> Self {
        self.edit(move |p| p.max_wait = Some(max_wait))
    }

    /// At most `n` requests of one lane on the wire at once.
    pub fn max_in_flight(self, n: usize) -> Self {
        self.edit(move |p| p.max_in_flight = Some(n))
    }

    /// The longest pause a vendor may impose (default 120 s).
    pub fn max_pause(self, max_pause: Duration) -> Self {
        self.edit(move |p| p.max_pause = max_pause)
    }

    /// The pause after a throttle without a usable header (default 1 s,
    /// doubling up to 60 s).
    pub fn fallback_pause(self, base: Duration, cap: Duration) -> Self {
        self.edit(move |p| p.fallback = Backoff::new(base, cap))
    }

    /// Drop a lane after it has been idle this long (default 60 s).
    pub fn idle_timeout(self, idle: Duration) -> Self {
        self.edit(move |p| p.idle_timeout = idle)
    }

    /// Adaptive pacing for a vendor that announces nothing: throttles
    /// without a header cut the lane's rate, successes grow it back, never
    /// above the declared rate. See [`crate::adaptive`].
    pub fn adaptive(self, knobs: Adaptive) -> Self {
        self.edit(move |p| p.adaptive = Some(knobs))
    }

    /// Read a vendor's own header dialect too (see [`Dialect`]).
    pub fn dialect(mut self, dialect: impl Dialect) -> Self {
        self.dialects.push(Arc::new(dialect));
        self
    }

    /// How many failure retries a lane may spend (default: 20% of its
    /// requests plus 10 a second, over 10 s).
    pub fn retry_budget(mut self, budget: RetryBudget) -> Self {
        self.retry.budget = budget;
        self
    }

    /// Sends per failing request, the first included (default 3).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.retry.max_attempts = attempts;
        self
    }

    /// The whole retry policy at once.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Retry failures (5xx, timeouts) of POST and PATCH too. Only do this
    /// when the vendor deduplicates, e.g. with idempotency keys.
    pub fn retry_non_idempotent(mut self, yes: bool) -> Self {
        self.retry.retry_non_idempotent = yes;
        self
    }

    /// Use this reqwest client (default: reqwest's defaults, with https
    /// through the TLS backend of callshaper's features: rustls unless you
    /// chose `native-tls`).
    pub fn client(mut self, client: reqwest::Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Send attempts through `transport` instead of the client.
    pub fn transport(mut self, transport: impl Transport) -> Self {
        self.transport = Some(Arc::new(transport));
        self
    }

    /// Pick each request's vendor lane (default: [`origin_key`]). Requests
    /// with the same key share one queue and one quota.
    ///
    /// ```
    /// # use std::time::Duration;
    /// // One lane per API key, whatever the host.
    /// let shaper = callshaper::Shaper::builder()
    ///     .rate(10, Duration::from_secs(1))
    ///     .lane_key(|request| {
    ///         let key = request.headers().get("x-api-key");
    ///         String::from_utf8_lossy(key.map_or(&b""[..], |v| v.as_bytes())).into_owned()
    ///     })
    ///     .build()?;
    /// # Ok::<(), callshaper::ConfigError>(())
    /// ```
    pub fn lane_key(mut self, key: impl Fn(&Request) -> String + Send + Sync + 'static) -> Self {
        self.vendor_key = LaneKey::Custom(Arc::new(move |request, _| key(request)));
        self
    }

    /// Where the vendor lanes' keys come from (default [`LaneKey::Origin`]).
    pub fn vendor_key(mut self, key: LaneKey) -> Self {
        self.vendor_key = key;
        self
    }

    /// Quotas per tenant, per API key, on top of the vendor's: each key
    /// gets a lane of its own under the vendor's shared quota.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use callshaper::{LaneKey, Level, Quota};
    /// // Each tenant at most 5/s, all of them together 10/s.
    /// let per_tenant = Level::new("tenant", LaneKey::Tag, [Quota::leaky_bucket(5, Duration::from_secs(1))]);
    /// let shaper = callshaper::Shaper::builder()
    ///     .rate(10, Duration::from_secs(1))
    ///     .level(per_tenant)
    ///     .build()?;
    /// # Ok::<(), callshaper::ConfigError>(())
    /// ```
    pub fn level(mut self, level: Level) -> Self {
        self.levels.push(level);
        self
    }

    /// Requests matching `route` go through its levels first. Routes are
    /// tried in the order given; the first match wins.
    pub fn route(mut self, route: Route) -> Self {
        self.routes.push(route);
        self
    }

    /// Estimate each request's cost (tokens) when the caller gave none
    /// (default 1).
    pub fn cost(mut self, estimate: impl Fn(&Request) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Some(Arc::new(estimate));
        self
    }

    /// Check the settings and build the shaper.
    pub fn build(self) -> Result<Shaper, ConfigError> {
        if self.quotas.is_empty() && self.routes.is_empty() {
            return Err(ConfigError::new(
                "rate",
                "not set: call .rate(count, per) or .quota(..) with the vendor's quota",
            ));
        }
        let mut levels = self.levels;
        if !self.quotas.is_empty() {
            levels.push(Level::new("", self.vendor_key, self.quotas.clone()));
        }
        // Lane behaviour is checked against some quotas: the shaper's, or
        // the first route's.
        let probe = levels
            .iter()
            .chain(self.routes.iter().flat_map(|r| &r.levels))
            .next()
            .map(|level| level.quotas.clone())
            .unwrap_or_default();
        let policy = LanePolicy {
            quotas: probe,
            ..self.policy
        };
        policy.validate()?;
        for level in levels
            .iter()
            .chain(self.routes.iter().flat_map(|r| &r.levels))
        {
            let name = if level.name.is_empty() {
                "vendor"
            } else {
                &level.name
            };
            LanePolicy {
                quotas: level.quotas.clone(),
                ..policy.clone()
            }
            .validate()
            .map_err(|e| e.within(&format!("levels.{name}")))?;
        }
        if self.retry.max_attempts == 0 {
            return Err(ConfigError::new("max_attempts", "must be at least 1"));
        }
        if self.retry.max_throttles == 0 {
            return Err(ConfigError::new("max_throttles", "must be at least 1"));
        }
        let budget = self.retry.budget;
        if !(budget.ratio >= 0.0 && budget.ratio.is_finite()) {
            return Err(ConfigError::new(
                "retry_budget.ratio",
                "must be zero or more",
            ));
        }
        if budget.ttl.is_zero() {
            return Err(ConfigError::new(
                "retry_budget.ttl",
                "must be longer than zero",
            ));
        }
        let client = match self.client {
            Some(client) => client,
            // reqwest's own defaults, with the TLS backend our features
            // chose; a TLS backend that cannot start is a typed error here,
            // not a panic in `Client::new`.
            None => reqwest::Client::builder()
                .build()
                .map_err(|e| ConfigError::new("client", e.to_string()))?,
        };
        let transport = self
            .transport
            .unwrap_or_else(|| Arc::new(client.clone()) as Arc<dyn Transport>);
        Ok(Shaper {
            inner: Arc::new(Inner {
                client,
                transport,
                policy,
                retry: self.retry,
                routes: self.routes,
                levels,
                cost: self.cost,
                dialects: self.dialects,
                lanes: Arc::default(),
                gates: Arc::default(),
                shut: AtomicBool::new(false),
                #[cfg(feature = "redis")]
                store: self.store,
                #[cfg(feature = "redis")]
                store_failure: self.store_failure,
            }),
        })
    }
}

impl fmt::Debug for ShaperBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShaperBuilder")
            .field("quotas", &self.quotas)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

/// A request being built; [`send`](Self::send) queues it on its lanes.
#[must_use = "a request does nothing until it is sent"]
#[derive(Debug)]
pub struct RequestBuilder {
    shaper: Shaper,
    inner: reqwest::RequestBuilder,
    options: Options,
}

impl RequestBuilder {
    /// Add a header.
    pub fn header<K, V>(mut self, key: K, value: V) -> Self
    where
        HeaderName: TryFrom<K>,
        <HeaderName as TryFrom<K>>::Error: Into<http::Error>,
        HeaderValue: TryFrom<V>,
        <HeaderValue as TryFrom<V>>::Error: Into<http::Error>,
    {
        self.inner = self.inner.header(key, value);
        self
    }

    /// Set the body.
    pub fn body(mut self, body: impl Into<reqwest::Body>) -> Self {
        self.inner = self.inner.body(body);
        self
    }

    /// Add `Authorization: Bearer <token>`.
    pub fn bearer_auth(mut self, token: impl fmt::Display) -> Self {
        self.inner = self.inner.bearer_auth(token);
        self
    }

    /// Time limit for each attempt on the wire (not for the wait in the
    /// lane; see [`max_wait`](Self::max_wait)).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.inner = self.inner.timeout(timeout);
        self
    }

    /// Anything else reqwest's builder can do.
    pub fn with(
        mut self,
        edit: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> Self {
        self.inner = edit(self.inner);
        self
    }

    /// The longest this request may wait for release, overriding the lane's.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.options.max_wait = Some(max_wait);
        self
    }

    /// What this request costs for quotas that count cost (e.g. estimated
    /// tokens); default 1. Correct it after the response with [`Settle`].
    pub fn cost(mut self, cost: u64) -> Self {
        self.options.cost = Some(cost);
        self
    }

    /// The class the request waits in (default interactive).
    pub fn priority(mut self, priority: Priority) -> Self {
        self.options.priority = priority;
        self
    }

    /// A tenant or user, for [`LaneKey::Tag`] levels.
    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.options.tag = Some(Tag(tag.into()));
        self
    }

    /// Queue the request on its lanes; resolves to the vendor's response.
    pub async fn send(self) -> Result<Response, Error> {
        let request = self.inner.build().map_err(Error::InvalidRequest)?;
        self.shaper.execute_with(request, self.options).await
    }
}
