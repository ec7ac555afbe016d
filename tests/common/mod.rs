//! Shared set-up for the integration tests: a strict vendor on real
//! wiremock HTTP, and shapers whose attempts hold tokio's paused clock.
#![allow(dead_code)]

pub mod nginx;
pub mod proxy;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use callshaper::shaper::ShaperBuilder;
use callshaper::testing::{HoldClock, TokioWall};
use callshaper::{Error, Quota, Shaper};

pub const SECOND: Duration = Duration::from_secs(1);

/// Jitter between instances and the vendor (timers, two cores, HTTP) is
/// what the headroom absorbs. With the fleet tests running at once on two
/// cores, 20 ms let one 429 through in about one run in five, and 15 ms
/// (the 3- and 8-instance fleets, for 98.5 % of the quota) in one run of
/// about twelve; 30 ms keeps the loaded machine inside the quota and still
/// uses 97 % of it.
pub const FLEET_HEADROOM: Duration = Duration::from_millis(30);

/// One instance of a fleet at 10/s on `store`, with [`FLEET_HEADROOM`],
/// and this policy for when Redis fails.
pub fn fleet_instance(
    store: callshaper::store::RedisStore,
    failure: callshaper::store::StoreFailure,
) -> Shaper {
    Shaper::builder()
        .rate(10, SECOND)
        .headroom(FLEET_HEADROOM)
        .store(store)
        .on_store_failure(failure)
        .build()
        .unwrap()
}

/// `total` requests spread over `shapers`, all submitted at once; checks
/// every one succeeded, and returns the vendor.
pub async fn run_fleet(shapers: &[Shaper], vendor: &callshaper::testing::Vendor, total: usize) {
    let tasks: Vec<_> = (0..total)
        .map(|i| {
            let request = shapers[i % shapers.len()].get(format!("{}/r/{i}", vendor.uri()));
            tokio::spawn(request.send())
        })
        .collect();
    for outcome in join_all(tasks).await {
        assert_eq!(
            outcome.expect("every request ends in a response").status(),
            200
        );
    }
}

/// [`run_fleet`] while a consumer outside the fleet sends to `vendor`
/// every 333 ms, leaving 7 a second of a 10/s quota: how long the fleet
/// took, and the share of what the other left that it used.
pub async fn run_fleet_beside_another(
    shapers: &[Shaper],
    vendor: &callshaper::testing::Vendor,
    total: usize,
) -> (Duration, f64) {
    let other = other_consumer(vendor.uri(), Duration::from_millis(333), Duration::MAX);
    let started = std::time::Instant::now();
    run_fleet(shapers, vendor, total).await;
    let took = started.elapsed();
    other.abort();
    (took, total as f64 / 7.0 / took.as_secs_f64())
}

/// A client that follows no redirects, as the shaper's own: the shaper
/// follows them, each hop through its lane.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// A shaper builder at `count` per second whose attempts keep the paused
/// test clock still while on the wire, and which reads the vendor's wall
/// clock times off the wall clock the test vendors write them with.
pub fn shaper(count: u32) -> ShaperBuilder {
    Shaper::builder()
        .rate(count, SECOND)
        .transport(HoldClock(client()))
        .wall_clock(TokioWall)
}

/// A shaper builder like [`shaper`], keeping to `quota` instead of a
/// request rate.
pub fn shaper_with(quota: Quota) -> ShaperBuilder {
    Shaper::builder()
        .quota(quota)
        .transport(HoldClock(client()))
        .wall_clock(TokioWall)
}

/// A wiremock vendor that answers its first request with `first`, and
/// every later one with 200.
pub async fn answering_once(first: wiremock::ResponseTemplate) -> wiremock::MockServer {
    use wiremock::matchers::any;
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(first)
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    server
}

/// Send `n` GETs to `{base}/r/{i}` from `n` tasks, spawned in order, and
/// collect their outcomes in the same order.
pub async fn burst(shaper: &Shaper, base: &str, n: usize) -> Vec<Result<reqwest::Response, Error>> {
    let tasks = (0..n)
        .map(|i| tokio::spawn(shaper.get(format!("{base}/r/{i}")).send()))
        .collect();
    join_all(tasks).await
}

/// A consumer of the vendor's quota that the lane does not know of: a GET
/// to `{uri}/other` every `every` (after each answer), for `lasting`.
pub fn other_consumer(
    uri: String,
    every: Duration,
    lasting: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        let started = tokio::time::Instant::now();
        while started.elapsed() < lasting {
            let sent = callshaper::testing::hold_clock(client.get(format!("{uri}/other")).send());
            let _ = sent.await;
            tokio::time::sleep(every).await;
        }
    })
}

/// What `vendor` saw of the lane's own requests (sent by [`burst`], to
/// `/r/{i}`), not another consumer's.
pub fn ours(vendor: &callshaper::testing::Vendor) -> Vec<callshaper::testing::Arrival> {
    let arrivals = vendor.arrivals().into_iter();
    arrivals.filter(|a| a.path.starts_with("/r/")).collect()
}

/// Await every task, in order, then yield once.
///
/// Awaiting many finished tasks in one poll spends the test task's
/// cooperative budget; a bare `wiremock::MockServer` dropped in that same
/// poll then blocks on a tokio lock that answers "not yet" forever (the
/// hang `testing::Vendor`'s drop avoids on a thread of its own). The yield
/// hands the rest of the test a fresh budget.
pub async fn join_all<T: Send + 'static>(tasks: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        out.push(task.await.expect("a caller task panicked"));
    }
    tokio::task::yield_now().await;
    out
}

/// The index `i` of a request to `{base}/r/{i}` (see [`burst`]).
fn index(arrival: &callshaper::testing::Arrival) -> Option<usize> {
    arrival.path.strip_prefix("/r/")?.parse().ok()
}

/// The request indices in the order the vendor saw them.
pub fn order(arrivals: &[callshaper::testing::Arrival]) -> Vec<usize> {
    arrivals.iter().filter_map(index).collect()
}

/// The request indices of the accepted (200) arrivals, in arrival order.
pub fn accepted_order(vendor: &callshaper::testing::Vendor) -> Vec<usize> {
    let accepted: Vec<_> = vendor
        .arrivals()
        .into_iter()
        .filter(|a| a.status == 200)
        .collect();
    order(&accepted)
}

/// Requests `0..n` were each accepted once, and none reached the vendor
/// before one submitted ahead of it: FIFO. A burst's requests go at the
/// same instant, and their order on the wire is the network's, so equal
/// times may come in any order.
pub fn assert_fifo(vendor: &callshaper::testing::Vendor, n: usize) {
    let mut accepted: Vec<(usize, Duration)> = vendor
        .arrivals()
        .into_iter()
        .filter(|a| a.status == 200)
        .filter_map(|a| Some((index(&a)?, a.at)))
        .collect();
    accepted.sort_by_key(|&(i, _)| i);
    let indices: Vec<usize> = accepted.iter().map(|&(i, _)| i).collect();
    assert_eq!(indices, (0..n).collect::<Vec<_>>(), "each accepted once");
    assert!(
        accepted.windows(2).all(|w| w[0].1 <= w[1].1),
        "FIFO: {accepted:?}"
    );
}

/// Two rounds of two requests against a vendor allowing 1,000 tokens a
/// second, through `shaper`'s tokens quota: the first request is estimated
/// at 1,000 and uses 200, the second uses 800. In the first round the
/// first is settled (and `lands` is how long that takes to reach the
/// store): the second must go within `quick`. In the second round it is
/// not: the estimate holds a whole window.
pub async fn settle_then_not(
    shaper: &Shaper,
    vendor: &callshaper::testing::Vendor,
    lands: Duration,
    quick: Duration,
) {
    for settle in [true, false] {
        let started = tokio::time::Instant::now();
        let first = shaper
            .get(vendor.uri())
            .header("x-tokens", "200")
            .cost(1_000)
            .send()
            .await
            .unwrap();
        if settle {
            first
                .extensions()
                .get::<callshaper::shaper::Settle>()
                .unwrap()
                .report(200);
            tokio::time::sleep(lands).await;
        }
        let second = shaper
            .get(vendor.uri())
            .header("x-tokens", "800")
            .cost(800)
            .send()
            .await
            .unwrap();
        assert_eq!(second.status(), 200);
        let waited = started.elapsed();
        if settle {
            assert!(waited < quick, "800 freed at once: {waited:?}");
        } else {
            assert!(
                waited >= SECOND,
                "without settling, the estimate holds: {waited:?}"
            );
        }
        tokio::time::sleep(2 * SECOND).await;
    }
    assert_eq!(vendor.throttled(), 0);
}

/// A transport that records, on the real clock, when each attempt reached
/// it and what it was answered (0: no answer): the sends as the wire sees
/// them.
#[derive(Clone, Default)]
pub struct Wire {
    client: reqwest::Client,
    sends: Arc<Mutex<Vec<(std::time::Instant, u16)>>>,
}

impl Wire {
    /// Every send so far, in the order they reached the transport.
    pub fn sends(&self) -> Vec<(std::time::Instant, u16)> {
        let mut sends = self.sends.lock().unwrap().clone();
        sends.sort_by_key(|(at, _)| *at);
        sends
    }

    /// How many were refused with `status`.
    pub fn refused(&self, status: u16) -> usize {
        self.sends().iter().filter(|(_, s)| *s == status).count()
    }

    /// The smallest gap between two consecutive sends.
    pub fn smallest_gap(&self) -> Duration {
        let sends = self.sends();
        sends
            .windows(2)
            .map(|pair| pair[1].0 - pair[0].0)
            .min()
            .unwrap_or(Duration::MAX)
    }

    /// The share of `per_second` the accepted sends at or after `from`
    /// (from the first send) used, between the first and the last of them.
    pub fn used(&self, per_second: f64, from: Duration) -> f64 {
        let sends = self.sends();
        let Some(&(first, _)) = sends.first() else {
            return 0.0;
        };
        let accepted: Vec<_> = sends
            .iter()
            .filter(|(at, status)| *status == 200 && *at - first >= from)
            .map(|(at, _)| *at)
            .collect();
        let (Some(start), Some(end)) = (accepted.first(), accepted.last()) else {
            return 0.0;
        };
        let span = (*end - *start).as_secs_f64();
        (accepted.len() - 1) as f64 / (span * per_second)
    }
}

impl callshaper::shaper::Transport for Wire {
    fn send(
        &self,
        request: reqwest::Request,
    ) -> callshaper::shaper::BoxFuture<reqwest::Result<reqwest::Response>> {
        let at = std::time::Instant::now();
        let (client, sends) = (self.client.clone(), self.sends.clone());
        Box::pin(async move {
            let outcome = client.execute(request).await;
            let status = outcome.as_ref().map_or(0, |r| r.status().as_u16());
            sends.lock().unwrap().push((at, status));
            outcome
        })
    }
}

/// Both cores kept busy until dropped: what a loaded machine does to
/// timers.
pub struct Busy(
    Arc<std::sync::atomic::AtomicBool>,
    Vec<std::thread::JoinHandle<()>>,
);

impl Busy {
    pub fn cores(n: usize) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0_u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                    }
                })
            })
            .collect();
        Self(stop, threads)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        for thread in self.1.drain(..) {
            let _ = thread.join();
        }
    }
}
