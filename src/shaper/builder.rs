//! [`ShaperBuilder`]: every setting of a shaper, checked at `build()`.

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use reqwest::Request;

use super::handle::{CostFn, Inner, Shaper};
use super::redirect::DEFAULT_REDIRECTS;
use super::registry::{Plan, Registry};
use super::transport::Transport;
use crate::adaptive::Adaptive;
use crate::answers::Answers;
use crate::error::ConfigError;
use crate::lane::LanePolicy;
use crate::meters::Quota;
use crate::retry::{Backoff, RetryBudget, RetryPolicy};
use crate::route::{LaneKey, Level, Route};
use crate::signals::{Dialect, SystemClock, WallClock};
use crate::store::{Store, StoreFailure};

/// A change a builder setter made to the lane policy.
type Edit = Box<dyn Fn(&mut LanePolicy) + Send + Sync>;

/// Configures a [`Shaper`]: one quota is required, everything else has a
/// default.
///
/// | builder method | default | what it does |
/// |---|---|---|
/// | `rate(n, per)` | required (or `quota`) | the vendor's quota, per lane |
/// | `headroom(d)` | 5 ms | added to the window: absorbs timer lateness and network jitter |
/// | `queue_capacity(n)` | 10,000 | waiting requests per lane; beyond: `QueueFull` at once |
/// | `max_wait(d)` | none | longest wait for release; predicted longer: `WouldExceedMaxWait` at once |
/// | `max_in_flight(n)` | none | requests of one lane on the wire at once |
/// | `max_pause(d)` | 120 s | longest pause a vendor may impose; longer: `PauseTooLong` |
/// | `fallback_pause(base, cap)` | 1 s .. 60 s | pause after a throttle with no usable header; doubles per throttle (equal jitter), resets on success |
/// | `max_attempts(n)` | 3 | sends per request failing with 500/502/504/408 or a transport error |
/// | `retry(RetryPolicy)` | | also `max_throttles` (10) and the per-request backoff (100 ms .. 10 s, full jitter) |
/// | `retry_non_idempotent(true)` | off | retry failures of POST/PATCH too (429s always are; a refused connection always is) |
/// | `lane_key(fn)` | origin | which requests share a lane (per API key, tenant, ...) |
/// | `idle_timeout(d)` | 60 s | a lane quiet this long (20 days at most) goes; what its own quota counted rests until spent |
/// | `max_lanes(n)` | none | the most lanes live at once; past it an idle lane makes room, or the request ends with `LaneLimit` |
/// | `transport(t)` | the client | what sends each attempt |
/// | `quota(Quota)` | | another quota, checked with the others |
/// | `level(Level)` / `route(Route)` | | quotas per key, per endpoint |
/// | `vendor_key(LaneKey)` | origin | what the vendor's lanes are keyed by |
/// | `cost(fn)` | 1 | estimate a request's cost when it carries none |
/// | `adaptive(Adaptive)` | off | AIMD pacing for vendors that announce nothing |
/// | `retry_budget(RetryBudget)` | 20% + 10/s over 10 s | failure retries a lane may spend |
/// | `dialect(fn)` | | read a vendor's own headers too |
/// | `store(RedisStore)` | in memory | share the quotas with a fleet through Redis (feature `redis`; see Running a fleet) |
/// | `on_store_failure(StoreFailure)` | `Closed` | what lanes do while Redis is down; per route too |
///
/// Per request: `.max_wait(d)`, `.cost(n)`, `.tag(t)`, `.priority(p)` on the
/// request builder, or the `MaxWait`, `Cost`, `Tag`, `Priority` extensions in a
/// middleware stack.
#[must_use]
pub struct ShaperBuilder {
    /// The vendor level's quotas; its other settings live in `policy`.
    quotas: Vec<Quota>,
    policy: LanePolicy,
    /// What the builder's own setters changed in `policy`, applied again
    /// over a whole policy given later, so they win whatever their order.
    edits: Vec<Edit>,
    vendor_key: LaneKey,
    levels: Vec<Level>,
    routes: Vec<Route>,
    retry: RetryPolicy,
    redirects: u32,
    client: Option<reqwest::Client>,
    transport: Option<Arc<dyn Transport>>,
    /// The client a config file's `[client]` table made, sent through in
    /// place of the default one; an error beside a caller's own.
    #[cfg(feature = "config")]
    file_client: Option<reqwest::Client>,
    wall: Arc<dyn WallClock>,
    cost: Option<Arc<CostFn>>,
    dialects: Vec<Arc<dyn Dialect>>,
    store: Option<Store>,
    store_failure: StoreFailure,
    metrics_per_lane: bool,
    max_lanes: Option<usize>,
}

impl Default for ShaperBuilder {
    fn default() -> Self {
        Self {
            quotas: Vec::new(),
            policy: LanePolicy::default(),
            edits: Vec::new(),
            vendor_key: LaneKey::Origin,
            levels: Vec::new(),
            routes: Vec::new(),
            retry: RetryPolicy::default(),
            redirects: DEFAULT_REDIRECTS,
            client: None,
            transport: None,
            #[cfg(feature = "config")]
            file_client: None,
            wall: Arc::new(SystemClock),
            cost: None,
            dialects: Vec::new(),
            store: None,
            store_failure: StoreFailure::default(),
            metrics_per_lane: false,
            max_lanes: None,
        }
    }
}

impl ShaperBuilder {
    /// Keep the quotas in a shared store (a `RedisStore`, feature `redis`),
    /// shared by every instance connected to it, instead of in this
    /// process: see [`store`](crate::store).
    pub fn store(mut self, store: impl Into<Store>) -> Self {
        self.store = Some(store.into());
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

    /// How every lane behaves, at once; the quotas are set apart
    /// ([`rate`](Self::rate), [`quota`](Self::quota), levels). The
    /// builder's own settings ([`headroom`](Self::headroom),
    /// [`max_wait`](Self::max_wait) and the rest) win over it, whether
    /// they come before or after it.
    pub fn policy(mut self, policy: LanePolicy) -> Self {
        self.policy = policy;
        for edit in &self.edits {
            edit(&mut self.policy);
        }
        self
    }

    fn edit(mut self, edit: impl Fn(&mut LanePolicy) + Send + Sync + 'static) -> Self {
        edit(&mut self.policy);
        self.edits.push(Box::new(edit));
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

    /// A lane quiet this long goes (default 60 s): its task, queue and
    /// gate go, and what its own quota still counts (a day's requests
    /// partly spent) rests as meters alone, a few hundred bytes, which the
    /// key's next request wakes. A lane someone waits in, or paused, stays.
    pub fn idle_timeout(self, idle: Duration) -> Self {
        self.edit(move |p| p.idle_timeout = idle)
    }

    /// Adaptive pacing for a vendor that announces nothing: throttles
    /// without a header cut the lane's rate, successes grow it back, never
    /// above the declared rate. See [`Adaptive`](crate::lane::Adaptive).
    pub fn adaptive(self, knobs: Adaptive) -> Self {
        self.edit(move |p| p.adaptive = Some(knobs))
    }

    /// When interactive and batch requests both wait, one release in `n`
    /// goes to batch (default 5).
    pub fn batch_share(self, n: u32) -> Self {
        self.edit(move |p| p.batch_share = n)
    }

    /// What the vendor's answers mean (which statuses throttle, which fail
    /// one request, which bodies say out of credit); a route can say its
    /// own ([`Route::answers`]).
    pub fn answers(self, answers: Answers) -> Self {
        self.edit(move |p| p.answers = answers.clone())
    }

    /// How every lane's requests cost tokens (see
    /// [`TokenCost`](crate::tokens::TokenCost); feature `tokens`); a route
    /// can say its own ([`Route::tokens`]).
    #[cfg(feature = "tokens")]
    pub fn tokens(self, tokens: crate::tokens::TokenCost) -> Self {
        self.edit(move |p| p.tokens = Some(tokens))
    }

    /// Label every metric series with its lane as well (`lane`), besides
    /// its vendor, level and route. Off by default: with a lane per tenant
    /// or API key, that is a series per key, and the series outlive their
    /// lanes in most recorders.
    pub fn metrics_per_lane(mut self, per_lane: bool) -> Self {
        self.metrics_per_lane = per_lane;
        self
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

    /// Follow at most `hops` redirects (`301`, `302`, `303`, `307`,
    /// `308`) of a request sent by [`Shaper::execute`] or
    /// [`RequestBuilder::send`](super::RequestBuilder::send), each hop a
    /// request of its own that waits for its turn in the lane of its URL,
    /// under the request's options (its `max_wait` bounds each hop's wait)
    /// (default 10, reqwest's limit; 0: a redirect is the answer). Past the
    /// limit, the last redirect is the answer. A hop to another origin
    /// carries no `Authorization` or `Cookie`, no vendor API-key header
    /// (`x-api-key`, `api-key`, `x-goog-api-key`) and no header a level is
    /// keyed by ([`LaneKey::Header`](crate::route::LaneKey::Header)); a
    /// request whose body is a stream is not sent again, so its redirect
    /// is the answer.
    ///
    /// The shaper follows them, not its client: a client that follows
    /// redirects itself sends each hop without a turn. The default client
    /// follows none; build one you give [`client`](Self::client) with
    /// `redirect(reqwest::redirect::Policy::none())` too.
    pub fn redirects(mut self, hops: u32) -> Self {
        self.redirects = hops;
        self
    }

    /// Use this reqwest client (default: reqwest's defaults, with https
    /// through the TLS backend of callshaper's features, rustls unless you
    /// chose `native-tls`, and no redirects followed, which the shaper
    /// does itself (see [`redirects`](Self::redirects)); one client per
    /// process, shared by every shaper built without one).
    ///
    /// Build the client with `redirect(reqwest::redirect::Policy::none())`:
    /// one that follows redirects by itself sends each hop without a turn.
    /// reqwest does not say how many hops it took, so the shaper cannot
    /// count them; when an answer comes from another URL than the one
    /// sent, it warns once (`tracing`, with the lane and both URLs'
    /// paths).
    pub fn client(mut self, client: reqwest::Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Send through `client` (a config file's `[client]` table's) unless
    /// the caller gives a client or transport of their own, which `build`
    /// then refuses: the file's timeouts would be silently dropped.
    #[cfg(feature = "config")]
    pub(crate) fn file_client(mut self, client: reqwest::Client) -> Self {
        self.file_client = Some(client);
        self
    }

    /// Send attempts through `transport` instead of the client.
    pub fn transport(mut self, transport: impl Transport) -> Self {
        self.transport = Some(Arc::new(transport));
        self
    }

    /// Read vendors' absolute times (epoch resets, HTTP-dates) against
    /// `clock` (default: [`SystemClock`]); see [`WallClock`].
    pub fn wall_clock(mut self, clock: impl WallClock) -> Self {
        self.wall = Arc::new(clock);
        self
    }

    /// Pick each request's vendor lane (default: [`LaneKey::Origin`], the
    /// request's `scheme://host:port`). Requests
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
    /// use callshaper::Quota;
    /// use callshaper::route::{LaneKey, Level};
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

    /// The most lanes live at once (default: no cap). A lane per tenant or
    /// API key is a lane per key; past the cap, a new key's lane first
    /// evicts an idle one (nobody waiting, no pause, its own meters rested:
    /// it loses nothing), and when none is idle the request ends with
    /// [`Error::LaneLimit`](crate::Error::LaneLimit). Meters resting after
    /// [`idle_timeout`](Self::idle_timeout) are not lanes, and the cap does
    /// not count them. Zero is refused.
    pub fn max_lanes(mut self, n: usize) -> Self {
        self.max_lanes = Some(n);
        self
    }

    /// Estimate each request's cost (tokens) when the caller gave none
    /// (default 1).
    pub fn cost(mut self, estimate: impl Fn(&Request) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Some(Arc::new(estimate));
        self
    }

    /// Every check [`build`](Self::build) makes of the settings, without
    /// building: a config file names what it finds by the file's fields.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.max_lanes == Some(0) {
            return Err(ConfigError::new(
                "max_lanes",
                "must be at least 1: every request needs a lane",
            ));
        }
        if self.quotas.is_empty() && self.routes.is_empty() {
            return Err(ConfigError::new(
                "rate",
                "not set: call .rate(count, per) or .quota(..) with the vendor's quota",
            ));
        }
        let vendor = (!self.quotas.is_empty())
            .then(|| Level::new("", self.vendor_key.clone(), self.quotas.clone()));
        let levels = || {
            self.levels
                .iter()
                .chain(&vendor)
                .chain(self.routes.iter().flat_map(|r| &r.levels))
        };
        // Lane behaviour is checked against some quotas: the shaper's, or
        // the first route's.
        let probe = levels()
            .next()
            .map(|level| level.quotas.clone())
            .unwrap_or_default();
        let policy = &self.policy;
        policy.validate(&probe)?;
        for (at, route) in self.routes.iter().enumerate() {
            // A route's name labels its series, and begins its lanes' names
            // where another route goes through the same levels.
            if self.routes[..at]
                .iter()
                .any(|other| other.name == route.name)
            {
                return Err(ConfigError::new(
                    format!("routes.{}", route.name),
                    "another route has this name: each route's series and lanes are named by it",
                ));
            }
            route
                .check()
                .map_err(|e| e.within(&format!("routes.{}", route.name)))?;
            if let Some(answers) = &route.answers {
                answers
                    .validate()
                    .map_err(|e| e.within(&format!("routes.{}", route.name)))?;
            }
        }
        for level in levels() {
            let name = if level.name.is_empty() {
                "vendor"
            } else {
                &level.name
            };
            policy
                .validate(&level.quotas)
                .map_err(|e| e.within(&format!("levels.{name}")))?;
            let in_memory = level.quotas.iter().find_map(Quota::in_memory_only);
            if let (Some(_), Some(why)) = (&self.store, in_memory) {
                return Err(ConfigError::new(format!("levels.{name}.quotas"), why));
            }
        }
        check_retry(&self.retry)
    }

    /// Check the settings and build the shaper.
    pub fn build(self) -> Result<Shaper, ConfigError> {
        self.check()?;
        let mut levels = self.levels;
        if !self.quotas.is_empty() {
            levels.push(Level::new("", self.vendor_key, self.quotas.clone()));
        }
        let policy = self.policy;
        // A client given, not a transport: it may follow redirects itself.
        let client_given = self.client.is_some() && self.transport.is_none();
        #[cfg(feature = "config")]
        let file_client = match self.file_client {
            Some(_) if self.client.is_some() || self.transport.is_some() => {
                return Err(ConfigError::new(
                    "client",
                    "the file's [client] timeouts are for the client it makes: \
                     set them on the client or transport given instead",
                ));
            }
            file_client => file_client,
        };
        #[cfg(not(feature = "config"))]
        let file_client = None;
        let client = match self.client.or(file_client) {
            Some(client) => client,
            None => default_client()?,
        };
        let transport = self
            .transport
            .unwrap_or_else(|| Arc::new(client.clone()) as Arc<dyn Transport>);
        Ok(Shaper {
            inner: Arc::new(Inner {
                client,
                client_given,
                warned_redirects: AtomicBool::new(false),
                transport,
                wall: self.wall,
                cost: self.cost,
                dialects: self.dialects,
                registry: Registry::new(Plan {
                    policy,
                    budget: self.retry.budget,
                    routes: self.routes,
                    levels,
                    store: self.store,
                    store_failure: self.store_failure,
                    metrics_per_lane: self.metrics_per_lane,
                    max_lanes: self.max_lanes,
                }),
                retry: self.retry,
                redirects: self.redirects,
            }),
        })
    }
}

impl Shaper {
    /// Start configuring a shaper; a quota ([`ShaperBuilder::rate`] or
    /// [`ShaperBuilder::quota`]) is the one setting without a default.
    pub fn builder() -> ShaperBuilder {
        ShaperBuilder::default()
    }
}

/// The retry policy's numbers, checked: at least one attempt and one
/// throttle, and a budget that is a finite share over a real span.
fn check_retry(retry: &RetryPolicy) -> Result<(), ConfigError> {
    if retry.max_attempts == 0 {
        return Err(ConfigError::new("max_attempts", "must be at least 1"));
    }
    if retry.max_throttles == 0 {
        return Err(ConfigError::new("max_throttles", "must be at least 1"));
    }
    let budget = retry.budget;
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
    Ok(())
}

/// reqwest's own defaults, with the TLS backend our features chose, built
/// once per process and shared (clones share one connection pool). Building
/// a TLS client loads the platform's roots, which blocks its thread for a
/// while: every shaper paying that again stalls the requests of the others
/// on the same runtime. A TLS backend that cannot start is a typed error,
/// not a panic in `Client::new`.
fn default_client() -> Result<reqwest::Client, ConfigError> {
    static DEFAULT: OnceLock<Result<reqwest::Client, String>> = OnceLock::new();
    DEFAULT
        .get_or_init(|| own_client().build().map_err(|e| e.to_string()))
        .clone()
        .map_err(|problem| ConfigError::new("client", problem))
}

/// A client the shaper makes for itself (its default one, a config
/// file's): reqwest's defaults, but for redirects, which the shaper
/// follows itself so that each hop takes a turn.
pub(crate) fn own_client() -> reqwest::ClientBuilder {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none())
}

impl fmt::Debug for ShaperBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShaperBuilder")
            .field("quotas", &self.quotas)
            .field("policy", &self.policy)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The builder's own settings win over a whole policy, before it or
    /// after it; the policy's own settings stay where no setter spoke, and
    /// the quotas, which are no part of a policy, stay as set.
    #[test]
    fn setters_win_over_a_whole_policy_in_any_order() {
        let policy = LanePolicy {
            max_pause: Duration::from_secs(7),
            ..LanePolicy::default()
        };
        let headroom = Duration::from_millis(40);
        let second = Duration::from_secs(1);
        let before = Shaper::builder()
            .rate(10, second)
            .headroom(headroom)
            .policy(policy.clone());
        let after = Shaper::builder()
            .policy(policy)
            .headroom(headroom)
            .rate(10, second);
        for builder in [before, after] {
            assert_eq!(builder.policy.headroom, headroom);
            assert_eq!(builder.policy.max_pause, Duration::from_secs(7));
            assert_eq!(builder.quotas.len(), 1);
        }
    }
}
