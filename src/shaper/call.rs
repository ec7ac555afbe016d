//! One request's life: enter its lane, wait for the turn, send, let
//! [`throttle`](crate::throttle) say what the answer means, and go again
//! (keeping its place) or finish with exactly one outcome.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use reqwest::{Request, Response};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tracing::Instrument;

use super::again::{Failure, Next, Retry, SendFailure, failed, throttled};
use super::handle::Shaper;
use super::held;
use super::metering::Metering;
use super::redirect;
use crate::error::Error;
use crate::lane::{Lane, Place, Priority, Turn};
use crate::observability::{RequestSpan, shown_error};
use crate::retry;
use crate::route::Tag;
use crate::signals::Signals;
use crate::throttle::{self, Verdict};

/// What a caller can say about one request besides the request itself.
#[derive(Debug, Clone, Default)]
pub(crate) struct Options {
    pub(crate) max_wait: Option<Duration>,
    pub(crate) cost: Option<u64>,
    pub(crate) priority: Priority,
    pub(crate) tag: Option<Tag>,
    /// The response's body holds the in-flight slot until it ends.
    pub(crate) in_flight_through_body: bool,
    /// The request as a layer above sees it, across that layer's retries.
    pub(crate) logical: Option<Logical>,
    /// The most redirects to follow (none said: the shaper's).
    pub(crate) redirects: Option<u32>,
    /// The request goes through a reqwest client the user built, which
    /// may follow redirects by itself: an answer from another URL than
    /// the one sent says it did (see [`Shaper::followed_by_client`]).
    pub(crate) client_redirects: bool,
}

/// One request as the layers above the shaper see it: a retry middleware
/// sends it again through the shaper with the same extensions, and this,
/// kept there, makes each of its tries the same request to the lane: it
/// keeps its place, and its sends count against one limit.
#[derive(Debug, Clone, Default)]
pub(crate) struct Logical(Arc<LogicalState>);

#[derive(Debug)]
struct LogicalState {
    /// Its place in the lane once it had one (`u64::MAX`: none yet).
    seq: AtomicU64,
    /// Sends over every try.
    sends: AtomicU32,
}

impl Default for LogicalState {
    fn default() -> Self {
        Self {
            seq: AtomicU64::new(u64::MAX),
            sends: AtomicU32::new(0),
        }
    }
}

impl Logical {
    /// How many times the request went on the wire, over every try.
    pub(crate) fn sends(&self) -> u32 {
        self.0.sends.load(Ordering::Acquire)
    }

    /// Its place in the lane, once it had one.
    fn place(&self) -> Option<u64> {
        Some(self.0.seq.load(Ordering::Acquire)).filter(|seq| *seq != u64::MAX)
    }

    fn keep(&self, seq: u64) {
        self.0.seq.store(seq, Ordering::Release);
    }

    fn sent(&self) {
        self.0.sends.fetch_add(1, Ordering::AcqRel);
    }
}

impl Options {
    /// The options a request carries as extensions ([`MaxWait`], [`Cost`],
    /// [`Priority`], [`Tag`]), for the adapters that have no builder.
    #[cfg(any(feature = "middleware", feature = "tower"))]
    pub(crate) fn from_extensions(extensions: &http::Extensions) -> Self {
        use crate::route::Cost;
        Self {
            max_wait: extensions.get::<MaxWait>().map(|m| m.0),
            cost: extensions.get::<Cost>().map(|c| c.0),
            priority: extensions.get::<Priority>().copied().unwrap_or_default(),
            tag: extensions.get::<Tag>().cloned(),
            in_flight_through_body: false,
            logical: None,
            // Their client's layers follow redirects, if any do.
            redirects: None,
            // The layers below may answer by themselves, with a URL of
            // their own (reqwest's placeholder): no URL says a redirect.
            client_redirects: false,
        }
    }
}

/// A request in its lane, before its first turn.
struct Entered {
    lane: Lane,
    place: Place,
    cost: u64,
    /// Sends a layer above already made, counted as failures.
    failures: u32,
    /// What its body said, for a lane that costs tokens.
    metering: Metering,
}

/// What a request's end reports: how far it got.
#[derive(Default)]
struct Tally {
    lane: Option<Lane>,
    queued: Duration,
    attempts: u32,
    throttles: u32,
    /// The request last sent, when its answer was a redirect: the next
    /// hop is made of it.
    redirected: Option<Box<Request>>,
}

impl Tally {
    /// A turn came at `now`, to a wait begun at `since`: the wait counts
    /// as queued, and the attempt it starts is counted. Its number.
    fn turned(&mut self, since: Instant, now: Instant) -> u32 {
        self.queued = self
            .queued
            .saturating_add(now.saturating_duration_since(since));
        self.attempts = self.attempts.saturating_add(1);
        self.attempts
    }
}

/// A per-request limit on the wait for release, also understood as a
/// `reqwest_middleware` extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxWait(pub Duration);

impl Shaper {
    /// Send `request` through its lanes and return the vendor's response,
    /// or the reason there is none. A redirect is followed, each hop
    /// through its own lane (see [`ShaperBuilder::redirects`](super::ShaperBuilder::redirects)).
    pub fn execute(
        &self,
        request: Request,
    ) -> impl Future<Output = Result<Response, Error>> + Send + '_ {
        self.execute_with(Box::new(request), Options::default())
    }

    /// The life of a request, as its caller's future carries it: a few
    /// hundred bytes. The request is boxed where it starts, once: each
    /// layer keeps it (and its spare, and a redirect's next) across an
    /// await, a quarter of a kilobyte a copy. What waits and sends is
    /// boxed in its turn ([`hop`](Self::hop)): every move of the caller's
    /// future (into its task, a `join`) would otherwise copy it.
    pub(super) fn execute_with(
        &self,
        mut request: Box<Request>,
        mut options: Options,
    ) -> impl Future<Output = Result<Response, Error>> + Send + '_ {
        options.client_redirects = self.inner.client_given;
        async move {
            let transport = self.inner.transport.clone();
            let mut hops = options.redirects.unwrap_or(self.inner.redirects);
            loop {
                let (outcome, sent) = self.hop(request, &options, |r| transport.send(r)).await;
                let response = outcome.map_err(|failure| match failure {
                    Failure::Shaper(error) => error,
                    Failure::Send { attempts, source } => Error::Transport {
                        attempts,
                        source: shown_error(source),
                    },
                })?;
                // Each hop waits for its own turn, in the lane of its URL.
                let next = sent.filter(|_| hops > 0).and_then(|sent| {
                    redirect::next(sent, &response, self.inner.registry.key_headers())
                });
                let Some(next) = next else {
                    return Ok(response);
                };
                hops -= 1;
                request = next;
            }
        }
    }
}

impl Shaper {
    /// [`hop`](Self::hop) for the adapters, whose client's layers follow
    /// redirects if any do.
    #[cfg(any(feature = "middleware", feature = "tower"))]
    pub(crate) async fn drive<E, F, Fut>(
        &self,
        request: Request,
        options: &Options,
        send: F,
    ) -> Result<Response, Failure<E>>
    where
        E: SendFailure,
        F: FnMut(Request) -> Fut,
        Fut: Future<Output = Result<Response, E>>,
    {
        self.hop(Box::new(request), options, send).await.0
    }

    /// The life of one request, in its span: [`run`](Self::run), then its
    /// outcome recorded once on the span and the lane's series; with the
    /// request last sent when its answer is a redirect (see `redirect.rs`).
    async fn hop<E, F, Fut>(
        &self,
        request: Box<Request>,
        options: &Options,
        send: F,
    ) -> (Result<Response, Failure<E>>, Option<Box<Request>>)
    where
        E: SendFailure,
        F: FnMut(Request) -> Fut,
        Fut: Future<Output = Result<Response, E>>,
    {
        if tokio::runtime::Handle::try_current().is_err() {
            return (Err(Error::NoRuntime.into()), None);
        }
        let span = RequestSpan::new(&request);
        let mut tally = Tally::default();
        // Boxed (see `execute_with`). Through the shaper's transport, it
        // fits the blocks an allocator keeps per thread for reuse (glibc's
        // keeps them up to a kilobyte): a block past that costs a request
        // about a thousand instructions to take and give back.
        let run = Box::pin(self.run(request, options, send, &span, &mut tally));
        let outcome = run.instrument(span.span().clone()).await;
        let reason = match &outcome {
            Ok(_) => "response",
            Err(Failure::Shaper(error)) => error.reason(),
            Err(Failure::Send { .. }) => "transport",
        };
        span.ended(tally.queued, tally.attempts, tally.throttles, reason);
        if let Err(failure) = &outcome {
            if let Failure::Shaper(error) = failure {
                tracing::debug!(parent: span.span(), reason, %error, "callshaper: request refused");
            }
            if let Some(lane) = &tally.lane {
                lane.ended(reason);
            }
        }
        (outcome, tally.redirected)
    }

    /// Find `request`'s lane and take a place in it: the lane, the place,
    /// the request's cost, and the failures a layer above already spent.
    /// A lane that costs tokens reads (and may add to) the request's body.
    fn enter(
        &self,
        request: &mut Request,
        options: &Options,
        span: &RequestSpan,
        tally: &mut Tally,
    ) -> Result<Entered, Error> {
        let lane = self
            .inner
            .registry
            .lane_for(request, options.tag.as_ref())?;
        tally.lane = Some(lane.clone());
        // Only a request a layer above may send again has one: a plain
        // request allocates nothing for it.
        let logical = options.logical.as_ref();
        // A try of a layer above: every send so far counts as a failure.
        let failures = logical.map_or(0, Logical::sends);
        if failures >= self.inner.retry.max_attempts {
            return Err(attempts_spent(&lane, failures));
        }
        let metering = Metering::read(&lane, request);
        let cost = self.cost_of(request, options.cost.or(metering.estimate()));
        span.entered(lane.name(), lane.labels(), cost, options.priority.label());
        let max_wait = options.max_wait.or(lane.policy().max_wait);
        let kept = logical.and_then(Logical::place);
        let place = lane.enter_at(kept, cost, options.priority, max_wait)?;
        if let Some(logical) = logical {
            logical.keep(place.seq());
        }
        Ok(Entered {
            lane,
            place,
            cost,
            failures,
            metering,
        })
    }

    /// The loop every request runs: wait for the turns, send, and decide
    /// from the outcome whether to pause the lanes and go again.
    async fn run<E, F, Fut>(
        &self,
        mut request: Box<Request>,
        options: &Options,
        mut send: F,
        span: &RequestSpan,
        tally: &mut Tally,
    ) -> Result<Response, Failure<E>>
    where
        E: SendFailure,
        F: FnMut(Request) -> Fut,
        Fut: Future<Output = Result<Response, E>>,
    {
        let submitted = Instant::now();
        let Entered {
            lane,
            mut place,
            cost,
            mut failures,
            metering,
        } = self.enter(&mut request, options, span, tally)?;
        let policy = &self.inner.retry;
        let logical = options.logical.as_ref();
        let may_retry_failure =
            policy.retry_non_idempotent || retry::is_idempotent(request.method());
        let mut waiting_since = submitted;
        loop {
            let mut turn = lane.wait(&mut place).await?;
            // One reading of the clock for all that a turn ends: each is
            // a call into the kernel's clock, a request reads several.
            let now = Instant::now();
            let attempts = tally.turned(waiting_since, now);
            if attempts == 1 {
                lane.vendor().deposit(now);
                lane.waited(now.saturating_duration_since(submitted));
            }
            // A body that can't be cloned (a stream) allows one send only.
            let spare = request.try_clone().map(Box::new);
            if let Some(logical) = logical {
                logical.sent();
            }
            let attempt = span.attempt(attempts);
            let mut outcome =
                on_the_wire(&lane, &mut turn, || send(*request), attempt.span()).await;
            match &outcome {
                Ok(response) => attempt.answered(response.status().as_u16()),
                Err(error) => attempt.failed(error),
            }
            let charged_at = turn.at();
            let fleet = turn.fleet();
            let slot = turn
                .keep_in_flight()
                .filter(|_| options.in_flight_through_body);
            drop(turn);

            let sent = spare.as_deref().filter(|_| options.client_redirects);
            let verdict = self.heard(&lane, &mut outcome, cost, charged_at, sent);
            // The rare ends (a throttle, a failure) are boxed where taken:
            // each holds a response or a request across its awaits, which
            // would widen every request's future by a kilobyte.
            let next = match (verdict, outcome) {
                (Verdict::Done, outcome) => {
                    lane.vendor().succeeded();
                    let fleet = fleet.as_deref().map(Vec::as_slice);
                    if let Ok(response) = &outcome
                        && final_answer(&lane, response, charged_at, fleet)
                    {
                        tally.redirected = spare;
                    }
                    return outcome
                        .map(|response| delivered(response, metering, slot))
                        .map_err(|source| Failure::Send { attempts, source });
                }
                (Verdict::Throttled, Ok(response)) => {
                    tally.throttles = tally.throttles.saturating_add(1);
                    let spent = (tally.attempts, tally.throttles);
                    Box::pin(throttled(&lane, policy, response, charged_at, spare, spent)).await
                }
                (_, outcome) => {
                    failures += 1;
                    let retry = Retry {
                        failures,
                        attempts,
                        may_retry_failure,
                    };
                    Box::pin(failed(&lane, policy, outcome, spare, retry)).await
                }
            };
            let backoff = match next {
                Next::Again(next, backoff) => {
                    request = next;
                    backoff
                }
                Next::End(outcome) => return outcome,
            };
            lane.reenter(&mut place, backoff)?;
            waiting_since = Instant::now();
        }
    }

    /// What a request costs: what its caller (or its lane's
    /// [`TokenCost`](crate::tokens::TokenCost)) said, else the shaper's
    /// estimate, else one unit.
    fn cost_of(&self, request: &Request, said: Option<u64>) -> u64 {
        said.or_else(|| self.inner.cost.as_ref().map(|estimate| estimate(request)))
            .unwrap_or(1)
    }
}

/// Send the request `sending` makes once `turn`'s door opens, in the
/// attempt's `span`: a strict lane hears when it went, and when its answer
/// came (`spacing/departures.rs`).
async fn on_the_wire<E, Fut>(
    lane: &Lane,
    turn: &mut Turn,
    sending: impl FnOnce() -> Fut,
    span: &tracing::Span,
) -> Result<Response, E>
where
    Fut: Future<Output = Result<Response, E>>,
{
    let _on_the_wire = lane.sending();
    turn.door_opens().await;
    let sending = sending();
    let landing = turn.went();
    let outcome = sending.instrument(span.clone()).await;
    if let (Some(landing), Ok(_)) = (landing, &outcome) {
        landing.answered();
    }
    outcome
}

/// The final answer as its caller gets it: its body settling the request's
/// cost from the usage it reports (a lane that costs tokens), and holding
/// the lane's in-flight slot until it ends (when asked).
fn delivered(
    response: Response,
    metering: Metering,
    slot: Option<OwnedSemaphorePermit>,
) -> Response {
    let response = metering.settling(response);
    match slot {
        Some(slot) => held::until_body_ends(response, slot),
        None => response,
    }
}

/// A final `response` to a send the lane charged at `charged_at`: a spent
/// quota it reports pauses the lane (see [`throttle::final_answer`]). True
/// for a redirect, whose request the next hop is made of.
fn final_answer(
    lane: &Lane,
    response: &Response,
    charged_at: Instant,
    fleet: Option<&[Option<crate::gate::Booked>]>,
) -> bool {
    let headers = Some((response.status(), response.headers()));
    throttle::final_answer(lane, &Signals::of(response), charged_at, fleet, headers);
    response.status().is_redirection()
}

/// A layer above sent again a request the shaper already gave up on,
/// after `attempts` sends.
fn attempts_spent(lane: &Lane, attempts: u32) -> Error {
    tracing::warn!(
        lane = %lane.name(),
        attempts,
        "a layer above sent again a request the shaper gave up on; \
         put retry layers above the shaper and let it own the retries"
    );
    Error::AttemptsSpent {
        lane: lane.key(),
        attempts,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn request() -> Box<Request> {
        Box::new(Request::new(
            reqwest::Method::GET,
            "http://vendor.test/".parse().unwrap(),
        ))
    }

    /// What a request's future weighs in its caller's, and the part boxed
    /// apart: carried across every await, copied on every move; the boxed
    /// part small enough for an allocator's per-thread cache (see `hop`).
    #[tokio::test]
    async fn a_request_carries_a_few_hundred_bytes_and_boxes_under_a_kilobyte() {
        let shaper = crate::Shaper::builder()
            .rate(10, Duration::from_secs(1))
            .build()
            .unwrap();
        let request = request();
        let span = RequestSpan::new(&request);
        let mut tally = Tally::default();
        let options = Options::default();
        let transport = shaper.inner.transport.clone();
        let send = |r| transport.send(r);
        let boxed = shaper.run(request, &options, send, &span, &mut tally);
        assert!(std::mem::size_of_val(&boxed) <= 1024);
        drop(boxed);
        let carried = shaper.execute(*self::request());
        assert!(std::mem::size_of_val(&carried) <= 320);
        let carried = shaper.get("http://vendor.test/").send();
        assert!(std::mem::size_of_val(&carried) <= 480);
    }
}
