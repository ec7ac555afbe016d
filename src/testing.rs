//! A vendor with a quota, for tests: a wiremock responder that counts like a
//! strict API gateway and records every arrival.
//!
//! [`Vendor`] accepts at most `limit` requests in any sliding window of
//! `window` (the strictest way a vendor counts; or a fixed window, or a
//! token bucket, and optionally a cost quota such as tokens per minute on
//! top) and answers the rest with 429,
//! `Retry-After`, `X-RateLimit-Limit/-Remaining/-Reset` and
//! `Cache-Control: no-store`, like a real gateway. Accepted requests carry
//! `X-RateLimit-Limit/-Remaining/-Reset` too, as gateways send them: the
//! reset in whole seconds, rounded up (seconds until the oldest request
//! leaves a sliding window, or the bucket is full again; the window's end
//! in epoch seconds for a fixed window). It can also be told to
//! throttle everything for a while. Its arrival log answers the question a
//! quota test asks: "were there ever more than N arrivals in a window W?".
//!
//! [`LlmVendor`] is an LLM's API (OpenAI's or Anthropic's JSON, and their
//! streams) under a tokens-per-window quota, charging `max_tokens` when a
//! request starts and what it used when it ends, for the tests of
//! [`TokenCost`](crate::tokens::TokenCost).
//!
//! # Virtual time
//!
//! The vendor reads tokio's clock of the runtime it was created on, so a
//! test under `#[tokio::test(start_paused = true)]` sees arrivals in virtual
//! time. wiremock serves from a thread of its own, though, and tokio's paused
//! clock jumps ahead whenever the test's runtime has nothing to do, which
//! includes the moments a request is on the wire to that thread. Send through
//! [`HoldClock`] in such tests: it keeps the clock still while an attempt is
//! on the wire, so the vendor and the shaper agree on when things happened.
//! The vendor writes its wall-clock times (epoch resets, RFC 3339 instants,
//! HTTP-dates, `Date`) off [`TokioWall`], which moves with tokio's clock;
//! give the shaper the same ([`ShaperBuilder::wall_clock`](crate::shaper::ShaperBuilder::wall_clock))
//! so that it reads them as a real vendor's would be read.
//!
//! # The zoo, and a Redis of the test's own
//!
//! `callshaper::testing` (feature `testing`) gives you `Vendor`: a wiremock
//! responder with a strict sliding-window quota (or fixed windows, or a token
//! bucket) that sends `X-RateLimit-Limit/-Remaining/-Reset` on every answer as
//! gateways do, 429 with `Retry-After`, a forced throttle period, an announced
//! policy, a clock of its own (`clock_off`), and an arrival log
//! (`max_in_any_window`). A zoo of real vendors, each speaking its documented
//! headers with its quirks (`testing::Style`): `Vendor::gateway`, `github`
//! (403 past the limit; `.secondary(limit, window)` adds its secondary limits:
//! a 403 with `retry-after` while the hourly quota has room), `openai` (Go-duration full-refill resets), `anthropic`
//! (RFC 3339), `ietf` (`RateLimit`), `shopify` (`32/40`, `Retry-After: 2.0`),
//! `discord` (`reset-after`), `stripe` (nothing but a bare 429), `flask_limiter`
//! (a fixed window that opens at the first request, its end in epoch seconds),
//! `nginx` (`limit_req` as nginx computes it) and `gcra`. Under `#[tokio::test(start_paused = true)]`, send
//! through `testing::HoldClock(client)`: wiremock serves from its own thread, and
//! tokio's paused clock would otherwise jump ahead while a request is on the
//! wire. The vendors write their wall-clock times (epoch resets, RFC 3339,
//! HTTP-dates, `Date`) off `testing::TokioWall`, a wall clock that moves with
//! tokio's; build the shaper with `.wall_clock(TokioWall)` too, and a paused
//! test reads them as a real vendor's are read.
//!
//! For a fleet, `testing::RedisServer::start()` (features `testing` and `redis`)
//! runs a `redis-server` of its own on a free loopback port, killed when dropped
//! (`kill` and `restart` to test an outage, `freeze` and `thaw` to test a hung
//! host), and `testing::RedisCluster::start()`
//! a three-master Redis Cluster. Redis keeps its own time, so fleet tests run on
//! the real clock.

mod clock;
mod counting;
mod llm;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "redis")]
mod sentinel;
mod server;
mod style;
#[cfg(feature = "redis")]
mod tls;

use self::clock::{now, wall_at};
use self::counting::{Counting, Limiter, Nginx};
pub use self::llm::LlmVendor;
#[cfg(feature = "redis")]
pub use self::redis::{RedisCluster, RedisServer, TRANSPORT_VARIABLE};
#[cfg(feature = "redis")]
pub use self::sentinel::RedisSentinel;
use self::server::take_down;
pub use self::style::Style;
use self::style::epoch_secs_after;
#[cfg(feature = "redis")]
pub use self::tls::TestCa;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use reqwest::{Request, Response};
use tokio::runtime::Handle;
use tokio::time::Instant;
use wiremock::matchers::any;
use wiremock::{Mock, MockServer, Respond, ResponseTemplate};

use crate::shaper::{BoxFuture, Transport};
use crate::signals::WallClock;

/// How a throttled answer says when to come back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryAfter {
    /// `Retry-After: <seconds>` (may be negative, to test clients).
    Seconds(i64),
    /// `Retry-After: <HTTP-date>`, this many seconds ahead of the wall clock.
    HttpDate(u64),
    /// `retry-after-ms: <milliseconds>`.
    Millis(u64),
    /// `Retry-After` with these exact bytes (garbage, to test clients).
    Raw(String),
    /// No hint at all.
    Omitted,
}

/// One request as the vendor saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    /// When it arrived, since the vendor was created.
    pub at: Duration,
    /// The request's method.
    pub method: String,
    /// The request's path and query.
    pub path: String,
    /// The status the vendor answered.
    pub status: u16,
    /// What it counted for the vendor's cost quota (see
    /// [`Vendor::also_cost`]); 1 without one.
    pub cost: u64,
}

/// A vendor that allows `limit` requests in any window of `window`.
///
/// ```
/// use std::time::Duration;
/// use callshaper::testing::Vendor;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let vendor = Vendor::strict(2, Duration::from_secs(1)).start().await;
/// let client = reqwest::Client::new();
/// let mut statuses = Vec::new();
/// for _ in 0..3 {
///     statuses.push(client.get(vendor.uri()).send().await.unwrap().status().as_u16());
/// }
/// assert_eq!(statuses, [200, 200, 429]);
/// assert_eq!(vendor.throttled(), 1);
/// # }
/// ```
#[derive(Clone)]
pub struct Vendor {
    inner: Arc<Inner>,
    server: Option<Arc<MockServer>>,
}

struct Inner {
    clock: Option<Handle>,
    start: Instant,
    state: Mutex<State>,
}

struct State {
    quotas: Vec<Limiter>,
    log: Vec<Arrival>,
    forced: Option<(Instant, RetryAfter)>,
    announce_policy: bool,
    style: Style,
    /// How far the vendor's wall clock is from ours, ahead when positive.
    clock_offset: i64,
    /// A limit past the quotas (GitHub's secondary limits): refused with
    /// `Retry-After` while the quotas still have room.
    secondary: Option<Limiter>,
}

impl Drop for Vendor {
    fn drop(&mut self) {
        take_down(&mut self.server);
    }
}

/// Where it listens, once started.
impl std::fmt::Debug for Vendor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let uri = self.server.as_ref().map(|server| server.uri());
        f.debug_struct("Vendor")
            .field("uri", &uri)
            .finish_non_exhaustive()
    }
}

impl Vendor {
    /// A vendor that accepts at most `limit` requests in any sliding window
    /// of `window` and answers 429 beyond.
    pub fn strict(limit: usize, window: Duration) -> Self {
        Self::with(limit, window, |_| Counting::Sliding(VecDeque::new()))
    }

    /// A vendor that counts like GitHub: at most `limit` in each fixed
    /// window from its start, and every answer carries
    /// `x-ratelimit-limit/-remaining/-reset`, the reset in epoch seconds.
    pub fn fixed_window(limit: usize, window: Duration) -> Self {
        Self::with(limit, window, |_| Counting::Fixed(0, 0))
    }

    /// A vendor that counts like Flask-Limiter's fixed window (and
    /// express-rate-limit's memory store): at most `limit` in a window of
    /// `window` that opens at the first request after the last one closed,
    /// and every answer carries `x-ratelimit-limit/-remaining/-reset`, the
    /// reset the window's end in epoch seconds, rounded up. Where in the
    /// wall-clock second a window opens decides how much the reset
    /// overstates the wait: up to a second.
    pub fn flask_limiter(limit: usize, window: Duration) -> Self {
        Self::with(limit, window, |_| Counting::Opening(None, 0))
    }

    /// A vendor running a token bucket: bursts up to `capacity`, refilled
    /// `count` per `per`.
    pub fn token_bucket(capacity: usize, count: u32, per: Duration) -> Self {
        let per_second = f64::from(count) / per.as_secs_f64().max(f64::EPSILON);
        Self::with(capacity, per, |start| {
            Counting::Bucket(capacity as f64, start, per_second)
        })
    }

    /// A generic API gateway: a strict sliding window, speaking
    /// [`Style::Gateway`] (the same as [`strict`](Self::strict)).
    pub fn gateway(limit: usize, window: Duration) -> Self {
        Self::strict(limit, window)
    }

    /// GitHub's REST API: `limit` per fixed `window` (5,000 an hour for a
    /// user), refused with a 403 ([`Style::GitHub`]).
    pub fn github(limit: usize, window: Duration) -> Self {
        Self::fixed_window(limit, window).speaking(Style::GitHub)
    }

    /// OpenAI: `rpm` requests a minute, replenished continuously (a bucket
    /// of `rpm` refilled `rpm` a minute), speaking [`Style::OpenAi`].
    pub fn openai(rpm: u32) -> Self {
        let minute = Duration::from_secs(60);
        Self::token_bucket(rpm as usize, rpm, minute).speaking(Style::OpenAi)
    }

    /// Anthropic: `rpm` requests a minute as a token bucket, speaking
    /// [`Style::Anthropic`].
    pub fn anthropic(rpm: u32) -> Self {
        let minute = Duration::from_secs(60);
        Self::token_bucket(rpm as usize, rpm, minute).speaking(Style::Anthropic)
    }

    /// A vendor following the IETF draft: `limit` per fixed `window`,
    /// speaking [`Style::Ietf`].
    pub fn ietf(limit: usize, window: Duration) -> Self {
        Self::fixed_window(limit, window).speaking(Style::Ietf)
    }

    /// Shopify's REST Admin API: a leaky bucket of 40 leaking 2 a second,
    /// speaking [`Style::Shopify`].
    pub fn shopify() -> Self {
        Self::token_bucket(40, 2, Duration::from_secs(1)).speaking(Style::Shopify)
    }

    /// Discord: `limit` per fixed `window` per bucket, speaking
    /// [`Style::Discord`].
    pub fn discord(limit: usize, window: Duration) -> Self {
        Self::fixed_window(limit, window).speaking(Style::Discord)
    }

    /// Stripe: a strict sliding window that says nothing, a bare 429
    /// ([`Style::Silent`]).
    pub fn stripe(limit: usize, window: Duration) -> Self {
        Self::strict(limit, window).silent()
    }

    /// nginx's `limit_req zone=... rate=<per_second>r/s burst=<burst>`
    /// (`burst` 0: none), as nginx's `ngx_http_limit_req_lookup` computes
    /// it (an excess in thousandths of a request, on a whole-millisecond
    /// clock): no rate-limit headers, a refusal 503 with nginx's error page (set
    /// another with [`refusing_with`](Self::refusing_with), as
    /// `limit_req_status` does), and requests within the burst held until
    /// the excess drains, unless [`nodelay`](Self::nodelay). nginx counts
    /// the *spacing* of requests: without a burst, one sooner than
    /// `1 / rate` after the last accepted one is refused.
    pub fn nginx(per_second: u32, burst: u32) -> Self {
        Self::with(
            usize::try_from(burst)
                .unwrap_or(usize::MAX)
                .saturating_add(1),
            Duration::from_secs(1) / per_second.max(1) * burst.saturating_add(1),
            |_| {
                Counting::Nginx(Nginx {
                    rate: i64::from(per_second).saturating_mul(1000),
                    burst: i64::from(burst).saturating_mul(1000),
                    nodelay: false,
                    excess: 0,
                    last: None,
                })
            },
        )
        .speaking(Style::Nginx(503))
    }

    /// An nginx vendor's `limit_req ... nodelay`: requests within the
    /// burst pass at once.
    pub fn nodelay(self) -> Self {
        if let Some(Limiter {
            counting: Counting::Nginx(nginx),
            ..
        }) = self.state().quotas.first_mut()
        {
            nginx.nodelay = true;
        }
        self
    }

    /// An nginx vendor refuses with `status` (`limit_req_status 429;`).
    pub fn refusing_with(self, status: u16) -> Self {
        self.speaking(Style::Nginx(status))
    }

    /// A GCRA limiter (as `redis-cell` and the `throttled` libraries
    /// run): one request every `window / limit`, a request let in up to
    /// `tolerance` before its theoretical time, and a refusal 429 with
    /// `x-ratelimit-*` and `Retry-After` in whole seconds, rounded up
    /// ([`Style::Gateway`]). Its `X-RateLimit-Limit` is what those
    /// libraries state: the burst the tolerance allows plus one (1 for a
    /// tolerance under one interval), not `limit`; `remaining` is what
    /// fits within the tolerance now, and the reset is when the bucket is
    /// empty again. A small tolerance measures spacing, as nginx does.
    pub fn gcra(limit: usize, window: Duration, tolerance: Duration) -> Self {
        Self::with(limit, window, |_| Counting::Gcra(None, tolerance))
    }

    /// A vendor with one quota, counting as `counting` (given the vendor's
    /// start) says.
    fn with(limit: usize, window: Duration, counting: impl FnOnce(Instant) -> Counting) -> Self {
        let clock = Handle::try_current().ok();
        let start = now(clock.as_ref());
        let counting = counting(start);
        let quota = Limiter {
            limit: limit as u64,
            window: window.max(Duration::from_nanos(1)),
            counting,
            cost_header: None,
        };
        Self {
            inner: Arc::new(Inner {
                clock,
                start,
                state: Mutex::new(State {
                    quotas: vec![quota],
                    log: Vec::new(),
                    forced: None,
                    announce_policy: false,
                    style: Style::Gateway,
                    clock_offset: 0,
                    secondary: None,
                }),
            }),
            server: None,
        }
    }

    /// Also enforce a cost quota: at most `limit` units (tokens) in any
    /// sliding window of `window`, each request counting the number in its
    /// `header` (1 without it). A request goes only if both quotas allow it.
    pub fn also_cost(self, limit: u64, window: Duration, header: &str) -> Self {
        self.state().quotas.push(Limiter {
            limit,
            window: window.max(Duration::from_nanos(1)),
            counting: Counting::Sliding(VecDeque::new()),
            cost_header: Some(header.to_ascii_lowercase()),
        });
        self
    }

    /// A secondary limit, as GitHub enforces beside its hourly quota (80
    /// content-creating requests a minute, 900 points a minute per
    /// endpoint): past `limit` in any sliding `window`, a request is
    /// refused while the quota still has room, with `Retry-After` in whole
    /// seconds and a message saying so; a GitHub vendor refuses with 403,
    /// any other with 429.
    pub fn secondary(self, limit: usize, window: Duration) -> Self {
        self.state().secondary = Some(Limiter {
            limit: limit as u64,
            window: window.max(Duration::from_nanos(1)),
            counting: Counting::Sliding(VecDeque::new()),
            cost_header: None,
        });
        self
    }

    /// Also announce the quota on every answer, as the IETF draft does:
    /// `RateLimit-Policy: "default";q=<limit>;w=<window in seconds>`.
    pub fn announcing_policy(self) -> Self {
        self.state().announce_policy = true;
        self
    }

    /// Say nothing about the quota, as Stripe does: no rate-limit headers
    /// on any answer, and a bare 429 without `Retry-After`.
    pub fn silent(self) -> Self {
        self.speaking(Style::Silent)
    }

    /// A vendor whose wall clock is `seconds` ahead of ours (behind when
    /// negative): its `Date` header and every absolute time it sends (an
    /// HTTP-date `Retry-After`, an epoch reset) are on that clock.
    pub fn clock_off(self, seconds: i64) -> Self {
        self.state().clock_offset = seconds;
        self
    }

    /// Speak like `style` (by default a [`Style::Gateway`]).
    pub fn speaking(self, style: Style) -> Self {
        self.state().style = style;
        self
    }

    /// Start a wiremock server on loopback that answers every request like
    /// this vendor.
    pub async fn start(mut self) -> Self {
        let server = MockServer::start().await;
        self.mount(&server).await;
        self.server = Some(Arc::new(server));
        self
    }

    /// Answer every request `server` receives like this vendor.
    pub async fn mount(&self, server: &MockServer) {
        Mock::given(any())
            .respond_with(self.clone())
            .mount(server)
            .await;
    }

    /// The base URL of the server [`start`](Self::start) launched.
    ///
    /// # Panics
    ///
    /// If the vendor was not started with [`start`](Self::start).
    pub fn uri(&self) -> String {
        self.server
            .as_ref()
            .map(|server| server.uri())
            .expect("Vendor::uri needs Vendor::start")
    }

    /// From now on, for `period`, answer every request 429 with this hint.
    pub fn throttle_for(&self, period: Duration, retry_after: RetryAfter) {
        let until = now(self.inner.clock.as_ref()) + period;
        self.state().forced = Some((until, retry_after));
    }

    /// Every request so far, in arrival order.
    pub fn arrivals(&self) -> Vec<Arrival> {
        self.state().log.clone()
    }

    /// How many requests the vendor refused: its 429s, and a GitHub
    /// vendor's 403s (the only 403s a test vendor answers).
    pub fn throttled(&self) -> usize {
        self.state()
            .log
            .iter()
            .filter(|a| a.status == 429 || a.status == 403)
            .count()
    }

    /// The most arrivals (any status) in any window `(t - window, t]`.
    pub fn max_in_any_window(&self, window: Duration) -> usize {
        max_in_any_window(self.state().log.iter().map(|a| a.at), window)
    }

    /// The most cost (accepted requests only) in any window `(t - window, t]`.
    pub fn max_cost_in_any_window(&self, window: Duration) -> u64 {
        let accepted: Vec<_> = self
            .state()
            .log
            .iter()
            .filter(|a| a.status == 200)
            .map(|a| (a.at, a.cost))
            .collect();
        let (mut first, mut sum, mut most) = (0, 0, 0);
        for &(at, cost) in &accepted {
            sum += cost;
            while accepted[first].0 + window <= at {
                sum -= accepted[first].1;
                first += 1;
            }
            most = most.max(sum);
        }
        most
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The most instants (sorted ascending) in any window `(t - window, t]`.
pub fn max_in_any_window(sorted: impl IntoIterator<Item = Duration>, window: Duration) -> usize {
    let times: Vec<Duration> = sorted.into_iter().collect();
    let mut first = 0;
    let mut most = 0;
    for (last, &t) in times.iter().enumerate() {
        while times[first] + window <= t {
            first += 1;
        }
        most = most.max(last + 1 - first);
    }
    most
}

/// A wall clock that moves with tokio's clock: the system's time when this
/// process first read it, plus however far tokio's clock has gone since.
///
/// Under `start_paused` the system's clock stands still while tokio's runs
/// ahead, so a vendor writing its window's end in epoch seconds off one and
/// a shaper reading it off the other would disagree by every second the
/// test skipped, and an end that stays put through a real window would move
/// within a paused one. The zoo's vendors write their times (epoch resets,
/// RFC 3339 instants, HTTP-dates, `Date`) off this clock; give it to the
/// shaper too ([`ShaperBuilder::wall_clock`](crate::shaper::ShaperBuilder::wall_clock)).
/// Outside a paused clock it is the system's clock, give or take the
/// adjustments made to that since.
///
/// ```
/// use std::time::Duration;
/// use callshaper::{Shaper, testing::TokioWall};
///
/// let shaper = Shaper::builder()
///     .rate(10, Duration::from_secs(1))
///     .wall_clock(TokioWall)
///     .build()?;
/// # Ok::<(), callshaper::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioWall;

impl WallClock for TokioWall {
    fn now(&self) -> SystemTime {
        wall_at(Instant::now())
    }
}

impl Respond for Vendor {
    fn respond(&self, request: &wiremock::Request) -> ResponseTemplate {
        let start = self.inner.start;
        let now = now(self.inner.clock.as_ref());
        let mut state = self.state();
        for quota in &mut state.quotas {
            quota.age(now, start);
        }
        let forced = match &state.forced {
            Some((until, hint)) if now < *until => Some(hint.clone()),
            _ => None,
        };
        let costs: Vec<u64> = state.quotas.iter().map(|q| q.cost_of(request)).collect();
        let cost = state
            .quotas
            .iter()
            .zip(&costs)
            .find(|(q, _)| q.cost_header.is_some())
            .map_or(1, |(_, &c)| c);
        let refused = state
            .quotas
            .iter()
            .zip(&costs)
            .filter_map(|(q, &c)| q.check(c, now, start).err())
            .max();
        if let Some(secondary) = &mut state.secondary {
            secondary.age(now, start);
        }
        let secondary = match &state.secondary {
            Some(limit) if refused.is_none() => limit.check(1, now, start).err(),
            _ => None,
        };
        let offset = Duration::from_secs(state.clock_offset.unsigned_abs());
        // An offset no clock can hold leaves the vendor on ours.
        let now_wall = wall_at(now);
        let wall = if state.clock_offset >= 0 {
            now_wall.checked_add(offset)
        } else {
            now_wall.checked_sub(offset)
        }
        .unwrap_or(now_wall);
        let (status, mut template) = match (forced, refused) {
            (Some(hint), _) => (429, with_hint(ResponseTemplate::new(429), &hint, wall)),
            (None, None) if let Some(wait) = secondary => {
                let said = state.quotas[0].said(now, start, wall);
                state.style.secondary(&said, wait)
            }
            (None, refused) => {
                let mut delay = Duration::ZERO;
                if refused.is_none() {
                    for (quota, &c) in state.quotas.iter_mut().zip(&costs) {
                        quota.charge(c, now, start);
                        delay = delay.max(quota.delay());
                    }
                    if let Some(secondary) = &mut state.secondary {
                        secondary.charge(1, now, start);
                    }
                }
                let said = state.quotas[0].said(now, start, wall);
                let (status, answer) = state.style.answer(&said, refused);
                (status, answer.set_delay(delay))
            }
        };
        // Its own clock's, as every vendor's is (else the server would
        // write the system's, which a paused test clock leaves behind).
        template = template.insert_header("date", httpdate::fmt_http_date(wall).as_str());
        if state.announce_policy {
            let first = &state.quotas[0];
            let policy = format!(
                "\"default\";q={};w={}",
                first.limit,
                first.window.as_secs().max(1)
            );
            template = template.insert_header("ratelimit-policy", policy);
        }
        let path = match request.url.query() {
            Some(query) => format!("{}?{query}", request.url.path()),
            None => request.url.path().to_owned(),
        };
        state.log.push(Arrival {
            at: now - start,
            method: request.method.to_string(),
            path,
            status,
            cost,
        });
        template.insert_header("cache-control", "no-store")
    }
}

fn with_hint(template: ResponseTemplate, hint: &RetryAfter, wall: SystemTime) -> ResponseTemplate {
    match hint {
        RetryAfter::Seconds(secs) => template.insert_header("retry-after", secs.to_string()),
        RetryAfter::HttpDate(ahead) => {
            // HTTP-dates have whole seconds: round up, so that a client
            // waiting until the date waits at least `ahead`.
            let date = epoch_secs_after(wall, Duration::from_secs(*ahead));
            let date = SystemTime::UNIX_EPOCH + Duration::from_secs(date);
            template.insert_header("retry-after", httpdate::fmt_http_date(date))
        }
        RetryAfter::Millis(ms) => template.insert_header("retry-after-ms", ms.to_string()),
        RetryAfter::Raw(raw) => template.insert_header("retry-after", raw.as_str()),
        RetryAfter::Omitted => template,
    }
}

/// A [`Transport`] that keeps tokio's paused test clock still while an
/// attempt is on the wire (see the module docs for why).
///
/// It holds a `spawn_blocking` task for the length of each attempt: tokio
/// does not auto-advance a paused clock while blocking work is running.
/// Outside a paused clock it changes nothing but costs a blocking task per
/// attempt, so it belongs in tests only.
#[derive(Debug, Clone)]
pub struct HoldClock<T>(pub T);

impl<T: Transport> Transport for HoldClock<T> {
    fn send(&self, request: Request) -> BoxFuture<reqwest::Result<Response>> {
        Box::pin(hold_clock(self.0.send(request)))
    }
}

/// Run `work` with tokio's paused clock held still, as [`HoldClock`] does
/// for each attempt; for other layers, such as a `reqwest_middleware` stack.
pub async fn hold_clock<F: std::future::Future>(work: F) -> F::Output {
    let (release, held) = std::sync::mpsc::channel::<()>();
    let hold = tokio::task::spawn_blocking(move || held.recv());
    let outcome = work.await;
    drop(release);
    // A hold that failed to run changes no outcome.
    let _ = hold.await;
    outcome
}
