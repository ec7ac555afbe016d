//! A vendor with a quota, for tests: a wiremock responder that counts like a
//! strict API gateway and records every arrival.
//!
//! [`Vendor`] accepts at most `limit` requests in any sliding window of
//! `window` (the strictest way a vendor counts) and answers the rest with 429,
//! `Retry-After`, `X-RateLimit-Limit/-Remaining/-Reset` and
//! `Cache-Control: no-store`, like a real gateway. Accepted requests carry
//! `X-RateLimit-Limit/-Remaining` but no reset: in a sliding window "reset"
//! is only "when the oldest request leaves", and whole epoch seconds would
//! make a client that honors `remaining: 0` wait up to a second too long. It can also be told to
//! throttle everything for a while. Its arrival log answers the question a
//! quota test asks: "were there ever more than N arrivals in a window W?".
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

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use reqwest::{Request, Response};
use tokio::runtime::Handle;
use tokio::time::Instant;
use wiremock::matchers::any;
use wiremock::{Mock, MockServer, Respond, ResponseTemplate};

use crate::client::{BoxFuture, Transport};

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
    limit: usize,
    window: Duration,
    counting: Counting,
    clock: Option<Handle>,
    start: Instant,
    state: Mutex<State>,
}

/// How the vendor counts its quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counting {
    /// At most `limit` in any window `(t - window, t]`.
    Sliding,
    /// At most `limit` in each window `[k·window, (k+1)·window)` from the
    /// vendor's start, as GitHub counts per hour.
    Fixed,
}

#[derive(Default)]
struct State {
    /// Sliding: when each request in the window was accepted.
    accepted: VecDeque<Instant>,
    /// Fixed: the current window's index and count.
    fixed: (u128, usize),
    log: Vec<Arrival>,
    forced: Option<(Instant, RetryAfter)>,
    announce_policy: bool,
    silent: bool,
}

impl Vendor {
    /// A vendor that accepts at most `limit` requests in any sliding window
    /// of `window` and answers 429 beyond.
    pub fn strict(limit: usize, window: Duration) -> Self {
        Self::counting(limit, window, Counting::Sliding)
    }

    /// A vendor that counts like GitHub: at most `limit` in each fixed
    /// window from its start, and every answer carries
    /// `x-ratelimit-limit/-remaining/-reset`, the reset in epoch seconds.
    pub fn fixed_window(limit: usize, window: Duration) -> Self {
        Self::counting(limit, window, Counting::Fixed)
    }

    fn counting(limit: usize, window: Duration, counting: Counting) -> Self {
        let clock = Handle::try_current().ok();
        let start = now(clock.as_ref());
        Self {
            inner: Arc::new(Inner {
                limit,
                window: window.max(Duration::from_nanos(1)),
                counting,
                clock,
                start,
                state: Mutex::default(),
            }),
            server: None,
        }
    }

    /// Also announce the quota on every answer, as the IETF draft does:
    /// `RateLimit-Policy: "default";q=<limit>;w=<window in seconds>`.
    pub fn announcing_policy(self) -> Self {
        self.state().announce_policy = true;
        self
    }

    /// Throttle without saying anything: a bare 429, no `Retry-After`, no
    /// rate-limit headers, as some vendors do.
    pub fn silent(self) -> Self {
        self.state().silent = true;
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

    /// How many 429s the vendor answered.
    pub fn throttled(&self) -> usize {
        self.state().log.iter().filter(|a| a.status == 429).count()
    }

    /// The most arrivals (any status) in any window `(t - window, t]`.
    pub fn max_in_any_window(&self, window: Duration) -> usize {
        max_in_any_window(self.state().log.iter().map(|a| a.at), window)
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

/// Tokio's clock of `runtime` (virtual under a paused test clock), or the
/// real one.
fn now(runtime: Option<&Handle>) -> Instant {
    let _entered = runtime.map(Handle::enter);
    Instant::now()
}

impl Vendor {
    /// Count one arrival: `Ok(remaining)` if accepted, else `Err(wait)`
    /// until a slot frees.
    fn admit(&self, state: &mut State, now: Instant) -> Result<usize, Duration> {
        let inner = &self.inner;
        match inner.counting {
            Counting::Sliding => {
                if let Some(floor) = now.checked_sub(inner.window) {
                    while state.accepted.front().is_some_and(|&t| t <= floor) {
                        state.accepted.pop_front();
                    }
                }
                if state.accepted.len() >= inner.limit {
                    // The oldest accepted request leaves the window then.
                    let free = state.accepted.front().map_or(now, |&t| t + inner.window);
                    return Err(free - now);
                }
                state.accepted.push_back(now);
                Ok(inner.limit - state.accepted.len())
            }
            Counting::Fixed => {
                let index = (now - inner.start).as_nanos() / inner.window.as_nanos();
                if state.fixed.0 != index {
                    state.fixed = (index, 0);
                }
                if state.fixed.1 >= inner.limit {
                    return Err(self.window_end(now) - now);
                }
                state.fixed.1 += 1;
                Ok(inner.limit - state.fixed.1)
            }
        }
    }

    /// The end of the fixed window `now` falls in.
    fn window_end(&self, now: Instant) -> Instant {
        let inner = &self.inner;
        let elapsed = (now - inner.start).as_nanos();
        let window = inner.window.as_nanos();
        let end = (elapsed / window + 1) * window;
        inner.start + Duration::from_nanos(u64::try_from(end).unwrap_or(u64::MAX))
    }
}

impl Respond for Vendor {
    fn respond(&self, request: &wiremock::Request) -> ResponseTemplate {
        let inner = &self.inner;
        let now = now(inner.clock.as_ref());
        let mut state = self.state();
        let forced = match &state.forced {
            Some((until, hint)) if now < *until => Some(hint.clone()),
            _ => None,
        };
        let limit = inner.limit.to_string();
        let (status, mut template) = if let Some(hint) = forced {
            (429, with_hint(ResponseTemplate::new(429), &hint))
        } else {
            match self.admit(&mut state, now) {
                Ok(remaining) => {
                    let mut template = ResponseTemplate::new(200)
                        .insert_header("x-ratelimit-limit", limit)
                        .insert_header("x-ratelimit-remaining", remaining.to_string());
                    if inner.counting == Counting::Fixed {
                        let reset = self.window_end(now) - now;
                        let reset = epoch_secs_after(reset).to_string();
                        template = template.insert_header("x-ratelimit-reset", reset);
                    }
                    (200, template)
                }
                Err(_) if state.silent => (429, ResponseTemplate::new(429)),
                Err(wait) => {
                    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                    let template = ResponseTemplate::new(429)
                        .insert_header("retry-after", secs.to_string())
                        .insert_header("x-ratelimit-limit", limit)
                        .insert_header("x-ratelimit-remaining", "0")
                        .insert_header("x-ratelimit-reset", epoch_secs_after(wait).to_string());
                    (429, template)
                }
            }
        };
        if state.announce_policy {
            let policy = format!(
                "\"default\";q={};w={}",
                inner.limit,
                inner.window.as_secs().max(1)
            );
            template = template.insert_header("ratelimit-policy", policy);
        }
        let path = match request.url.query() {
            Some(query) => format!("{}?{query}", request.url.path()),
            None => request.url.path().to_owned(),
        };
        state.log.push(Arrival {
            at: now - inner.start,
            method: request.method.to_string(),
            path,
            status,
        });
        template.insert_header("cache-control", "no-store")
    }
}

fn with_hint(template: ResponseTemplate, hint: &RetryAfter) -> ResponseTemplate {
    match hint {
        RetryAfter::Seconds(secs) => template.insert_header("retry-after", secs.to_string()),
        RetryAfter::HttpDate(ahead) => {
            // HTTP-dates have whole seconds: round up, so that a client
            // waiting until the date waits at least `ahead`.
            let date = epoch_secs_after(Duration::from_secs(*ahead));
            let date = SystemTime::UNIX_EPOCH + Duration::from_secs(date);
            template.insert_header("retry-after", httpdate::fmt_http_date(date))
        }
        RetryAfter::Millis(ms) => template.insert_header("retry-after-ms", ms.to_string()),
        RetryAfter::Raw(raw) => template.insert_header("retry-after", raw.as_str()),
        RetryAfter::Omitted => template,
    }
}

/// The wall-clock epoch second `after` from now (rounded up), as GitHub's
/// `x-ratelimit-reset` gives it.
fn epoch_secs_after(after: Duration) -> u64 {
    let reset = SystemTime::now() + after;
    reset
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() + u64::from(d.subsec_nanos() > 0))
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
