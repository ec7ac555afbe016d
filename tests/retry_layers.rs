//! reqwest-retry above the shaper, as the README says to stack them: each
//! of its tries is the same request to the lane, every send is paced, no
//! request is sent more than `max_attempts` times in all, and nothing
//! reaches a vendor during its pause.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use callshaper::middleware::shaper_error;
use callshaper::testing::{RetryAfter, Vendor, hold_clock};
use callshaper::{Error, Shaper};
use common::{SECOND, join_all};
use reqwest_middleware::{ClientWithMiddleware, Middleware, Next};
use reqwest_retry::RetryTransientMiddleware;
use reqwest_retry::policies::ExponentialBackoff;
use tokio::time::Instant;
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

/// The wire, below the shaper: when each send left, and to where. Holds
/// the paused clock still while the send is out.
#[derive(Clone, Default)]
struct Wire(Arc<Mutex<Vec<(Instant, String)>>>);

impl Wire {
    fn sends(&self) -> Vec<(Instant, String)> {
        self.0.lock().unwrap().clone()
    }

    /// Sends per URL, the most of any.
    fn most_sends_of_one(&self) -> usize {
        let sends = self.sends();
        let mut urls: Vec<_> = sends.iter().map(|(_, url)| url.clone()).collect();
        urls.sort();
        urls.dedup();
        urls.iter()
            .map(|url| sends.iter().filter(|(_, u)| u == url).count())
            .max()
            .unwrap_or(0)
    }

    /// The shortest time between two sends.
    fn closest(&self) -> Duration {
        let sends = self.sends();
        sends
            .windows(2)
            .map(|pair| pair[1].0 - pair[0].0)
            .min()
            .unwrap_or(Duration::MAX)
    }
}

#[async_trait::async_trait]
impl Middleware for Wire {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut http::Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        self.0
            .lock()
            .unwrap()
            .push((Instant::now(), request.url().to_string()));
        hold_clock(next.run(request, extensions)).await
    }
}

/// reqwest-retry (3 retries) above the shaper (10/s), the wire below.
fn stack(shaper: &Shaper, wire: &Wire) -> ClientWithMiddleware {
    let retries = ExponentialBackoff::builder().build_with_max_retries(3);
    reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryTransientMiddleware::new_with_policy(retries))
        .with(shaper.clone())
        .with(wire.clone())
        .build()
}

fn shaper() -> Shaper {
    Shaper::builder().rate(10, SECOND).build().unwrap()
}

fn max_attempts() -> usize {
    callshaper::retry::RetryPolicy::default().max_attempts as usize
}

/// A vendor answering 500 to everything: the shaper retries each GET up
/// to its limit and gives up with the vendor's answer; reqwest-retry takes
/// that as final.
#[tokio::test(start_paused = true)]
async fn a_failing_vendor_gets_max_attempts_per_request_all_paced() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(500).set_body_string("down"))
        .mount(&server)
        .await;
    let (shaper, wire) = (shaper(), Wire::default());
    let client = stack(&shaper, &wire);
    let tasks = (0..5)
        .map(|i| tokio::spawn(client.get(format!("{}/r/{i}", server.uri())).send()))
        .collect();
    for outcome in join_all(tasks).await {
        let error = outcome.unwrap_err();
        let ours = shaper_error(&error);
        assert!(
            matches!(ours, Some(Error::RetriesExhausted { .. })),
            "{error:?}"
        );
        assert_eq!(ours.and_then(Error::answer).unwrap().body, "down");
    }
    assert_eq!(wire.most_sends_of_one(), max_attempts());
    assert_eq!(wire.sends().len(), 5 * max_attempts());
    assert!(wire.closest() >= Duration::from_millis(100), "paced");
}

/// A vendor throttling with `Retry-After: 2`: the shaper pauses the lane
/// and sends the throttled request again after it; reqwest-retry never
/// sees the 429, and nothing reaches the vendor during the pause.
#[tokio::test(start_paused = true)]
async fn a_throttling_vendor_sees_no_request_during_the_pause() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    vendor.throttle_for(Duration::from_millis(10), RetryAfter::Seconds(2));
    let (shaper, wire) = (shaper(), Wire::default());
    let client = stack(&shaper, &wire);
    let tasks = (0..10)
        .map(|i| tokio::spawn(client.get(format!("{}/r/{i}", vendor.uri())).send()))
        .collect();
    for outcome in join_all(tasks).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    let arrivals = vendor.arrivals();
    assert_eq!(vendor.throttled(), 1, "the one that found the throttle");
    assert!(
        arrivals[1].at - arrivals[0].at >= 2 * SECOND,
        "nothing during the pause"
    );
    assert_eq!(arrivals.len(), 11);
    assert!(wire.most_sends_of_one() <= max_attempts());
    assert!(wire.closest() >= Duration::from_millis(100), "paced");
}

/// A closed port: the shaper tries the connection `max_attempts` times,
/// then its give-up is final for reqwest-retry, which would otherwise try
/// three more times, each multiplied by the shaper's own attempts.
#[tokio::test(start_paused = true)]
async fn a_closed_port_is_tried_max_attempts_times_in_all() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let (shaper, wire) = (shaper(), Wire::default());
    let client = stack(&shaper, &wire);
    let error = client
        .get(format!("http://{closed}/"))
        .send()
        .await
        .unwrap_err();
    let ours = shaper_error(&error);
    assert!(matches!(ours, Some(Error::Transport { .. })), "{error:?}");
    assert_eq!(wire.sends().len(), max_attempts());
    assert!(wire.closest() >= Duration::from_millis(100), "paced");
}

/// A POST the shaper does not retry (not idempotent) comes back with its
/// 500, and reqwest-retry sends it again: each try keeps the request's
/// place and counts against one limit, after which the shaper refuses.
#[tokio::test(start_paused = true)]
async fn tries_of_a_layer_above_count_against_one_limit() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(500))
        .mount(&server)
        .await;
    let (shaper, wire) = (shaper(), Wire::default());
    let client = stack(&shaper, &wire);
    let error = client
        .post(format!("{}/pay", server.uri()))
        .body("pay 10")
        .send()
        .await
        .unwrap_err();
    let ours = shaper_error(&error);
    assert!(
        matches!(ours, Some(Error::AttemptsSpent { attempts: 3, .. })),
        "{error:?}"
    );
    assert_eq!(wire.sends().len(), max_attempts());
}
