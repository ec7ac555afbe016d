//! The front door: [`Shaper`] wraps a reqwest client and sends every request
//! through the lane of its quota.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderName, HeaderValue};
use reqwest::{IntoUrl, Method, Request, Response};

use crate::adaptive::Adaptive;
use crate::error::{ConfigError, Error};
use crate::lane::{Lane, LanePolicy, LaneSnapshot};
use crate::meter::Rate;
use crate::retry::{self, Backoff, RetryBudget, RetryPolicy, Verdict};
use crate::signals::{Dialect, Signals};

/// A boxed, sendable future, as [`Transport::send`] returns.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What actually puts a request on the wire once its lane releases it.
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

/// Picks the lane of a request: one key, one quota.
type LaneKeyFn = dyn Fn(&Request) -> String + Send + Sync;

/// A per-request limit on the wait for release, also understood as a
/// `reqwest_middleware` extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxWait(pub Duration);

/// A reqwest client that can't exceed a vendor's quota.
///
/// Every request goes through the lane of its quota (by default one lane per
/// origin): a FIFO queue released at the quota's fixed pace. A 429 or 503
/// pauses the whole lane for as long as the vendor says; the throttled
/// request keeps its place at the head of the queue and goes again when the
/// pause ends. Cloning is cheap, and clones share lanes.
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
/// // Twelve callers at once; the vendor still sees at most 10 per second.
/// let calls: Vec<_> = (0..12)
///     .map(|i| tokio::spawn(shaper.get(format!("{}/items/{i}", vendor.uri())).send()))
///     .collect();
/// for call in calls {
///     assert_eq!(call.await??.status(), 200);
/// }
/// assert_eq!(vendor.throttled(), 0);
/// assert!(vendor.max_in_any_window(Duration::from_secs(1)) <= 10);
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
    policy: LanePolicy,
    retry: RetryPolicy,
    lane_key: Arc<LaneKeyFn>,
    dialects: Vec<Arc<dyn Dialect>>,
    lanes: Arc<LaneMap>,
    shut: AtomicBool,
}

fn lock(lanes: &LaneMap) -> MutexGuard<'_, HashMap<String, Arc<Lane>>> {
    lanes.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The lane key of a request when none is chosen: its origin
/// (`scheme://host:port`).
pub fn origin_key(request: &Request) -> String {
    request.url().origin().ascii_serialization()
}

impl Shaper {
    /// Start configuring a shaper; [`ShaperBuilder::rate`] is the one
    /// setting without a default.
    pub fn builder() -> ShaperBuilder {
        ShaperBuilder::default()
    }

    /// Start a request; `send` queues it on its lane.
    pub fn request<U: IntoUrl>(&self, method: Method, url: U) -> RequestBuilder {
        RequestBuilder {
            shaper: self.clone(),
            inner: self.inner.client.request(method, url),
            max_wait: None,
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

    /// Send `request` through its lane and return the vendor's response, or
    /// the reason there is none.
    pub async fn execute(&self, request: Request) -> Result<Response, Error> {
        self.execute_within(request, None).await
    }

    async fn execute_within(
        &self,
        request: Request,
        max_wait: Option<Duration>,
    ) -> Result<Response, Error> {
        let transport = self.inner.transport.clone();
        self.drive(request, max_wait, |r| transport.send(r))
            .await
            .map_err(|failure| match failure {
                Failure::Shaper(error) => error,
                Failure::Send { attempts, source } => Error::Transport { attempts, source },
            })
    }

    /// What the lane `key` is doing, if it exists.
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

    /// The lane of `request`, created on first use.
    fn lane_for(&self, request: &Request) -> Result<Arc<Lane>, Error> {
        let key = (self.inner.lane_key)(request);
        let mut lanes = lock(&self.inner.lanes);
        if self.inner.shut.load(Ordering::Acquire) {
            return Err(Error::Shutdown);
        }
        if let Some(lane) = lanes.get(&key) {
            return Ok(lane.clone());
        }
        let on_idle = evict_when_idle(Arc::downgrade(&self.inner.lanes), key.clone());
        let lane = Arc::new(Lane::spawn(
            key.clone(),
            self.inner.policy.clone(),
            self.inner.retry.budget,
            Some(on_idle),
        ));
        lanes.insert(key, lane.clone());
        Ok(lane)
    }

    /// The loop every request runs: wait for the turn, send, and decide
    /// from the outcome whether to pause the lane and go again.
    pub(crate) async fn drive<E, F, Fut>(
        &self,
        mut request: Request,
        max_wait: Option<Duration>,
        mut send: F,
    ) -> Result<Response, Failure<E>>
    where
        E: SendFailure,
        F: FnMut(Request) -> Fut,
        Fut: Future<Output = Result<Response, E>>,
    {
        let lane = self.lane_for(&request)?;
        let max_wait = max_wait.or(lane.policy().max_wait);
        let mut place = lane.enter(max_wait)?;
        let policy = &self.inner.retry;
        let may_retry_failure =
            policy.retry_non_idempotent || retry::is_idempotent(request.method());
        let (mut attempts, mut failures, mut throttles) = (0u32, 0u32, 0u32);
        loop {
            let turn = lane.wait(&mut place).await?;
            attempts += 1;
            if attempts == 1 {
                lane.deposit();
            }
            // A body that can't be cloned (a stream) allows one send only.
            let spare = request.try_clone();
            let mut outcome = send(request).await;
            drop(turn);

            let signals = match &mut outcome {
                Ok(response) => {
                    let signals = self.read_signals(response.headers());
                    self.learn(&lane, &signals);
                    response.extensions_mut().insert(signals.clone());
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
                            "quota used up; pausing the lane until it resets"
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
}

impl Shaper {
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
                configured = ?lane.policy().rate,
                ?announced,
                "the vendor announced a lower quota than configured; the lane keeps to it"
            );
        }
    }
}

impl fmt::Debug for Shaper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shaper")
            .field("policy", &self.inner.policy)
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
        }
    })
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
    /// The one setting without a default; `policy.rate` is a placeholder
    /// until it is set.
    rate: Option<Rate>,
    policy: LanePolicy,
    retry: RetryPolicy,
    client: Option<reqwest::Client>,
    transport: Option<Arc<dyn Transport>>,
    lane_key: Option<Arc<LaneKeyFn>>,
    dialects: Vec<Arc<dyn Dialect>>,
}

impl Default for ShaperBuilder {
    fn default() -> Self {
        Self {
            rate: None,
            policy: LanePolicy::new(Rate::new(1, Duration::from_secs(1))),
            retry: RetryPolicy::default(),
            client: None,
            transport: None,
            lane_key: None,
            dialects: Vec::new(),
        }
    }
}

impl ShaperBuilder {
    /// The vendor's quota: `count` requests per `per`, for every lane.
    pub fn rate(mut self, count: u32, per: Duration) -> Self {
        self.rate = Some(Rate::new(count, per));
        self
    }

    /// A whole lane policy at once (its rate included).
    pub fn policy(mut self, policy: LanePolicy) -> Self {
        self.rate = Some(policy.rate);
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
    /// above `rate`. See [`crate::adaptive`].
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

    /// Use this reqwest client (default: `reqwest::Client::new()`).
    pub fn client(mut self, client: reqwest::Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Send attempts through `transport` instead of the client.
    pub fn transport(mut self, transport: impl Transport) -> Self {
        self.transport = Some(Arc::new(transport));
        self
    }

    /// Pick each request's lane (default: [`origin_key`]). Requests with the
    /// same key share one queue and one quota.
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
        self.lane_key = Some(Arc::new(key));
        self
    }

    /// Check the settings and build the shaper.
    pub fn build(self) -> Result<Shaper, ConfigError> {
        let rate = self.rate.ok_or_else(|| {
            ConfigError::new(
                "rate",
                "not set: call .rate(count, per) with the vendor's quota",
            )
        })?;
        let policy = LanePolicy {
            rate,
            ..self.policy
        };
        policy.validate()?;
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
        let client = self.client.unwrap_or_default();
        let transport = self
            .transport
            .unwrap_or_else(|| Arc::new(client.clone()) as Arc<dyn Transport>);
        Ok(Shaper {
            inner: Arc::new(Inner {
                client,
                transport,
                policy,
                retry: self.retry,
                lane_key: self.lane_key.unwrap_or_else(|| Arc::new(origin_key)),
                dialects: self.dialects,
                lanes: Arc::default(),
                shut: AtomicBool::new(false),
            }),
        })
    }
}

impl fmt::Debug for ShaperBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShaperBuilder")
            .field("rate", &self.rate)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

/// A request being built; [`send`](Self::send) queues it on its lane.
#[must_use = "a request does nothing until it is sent"]
#[derive(Debug)]
pub struct RequestBuilder {
    shaper: Shaper,
    inner: reqwest::RequestBuilder,
    max_wait: Option<Duration>,
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
        self.max_wait = Some(max_wait);
        self
    }

    /// Queue the request on its lane; resolves to the vendor's response.
    pub async fn send(self) -> Result<Response, Error> {
        let request = self.inner.build().map_err(Error::InvalidRequest)?;
        self.shaper.execute_within(request, self.max_wait).await
    }
}
