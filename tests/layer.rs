//! `ShaperLayer` over tower services: hyper's client and reqwest's own,
//! against the strict vendor. The quota test: 100 callers at 10/s, no 429,
//! at most 10 in any second, served in submission order.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use callshaper::layer::{Shaped, ShaperLayer};
use callshaper::testing::{RetryAfter, Vendor, hold_clock};
use callshaper::{Error, Shaper};
use common::{SECOND, join_all, order};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use tower::{Layer, Service, ServiceExt};

/// Holds tokio's paused clock still while a call is on the wire (the
/// vendor answers from wiremock's own thread).
#[derive(Clone)]
struct Held<S>(S);

impl<S, R> Service<R> for Held<S>
where
    S: Service<R>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        Box::pin(hold_clock(self.0.call(request)))
    }
}

fn shaper() -> Shaper {
    Shaper::builder().rate(10, SECOND).build().unwrap()
}

/// The vendor saw every request, none refused, at most 10 in any second,
/// in submission order.
fn assert_quota_kept(vendor: &Vendor, n: usize) {
    let arrivals = vendor.arrivals();
    assert_eq!(arrivals.len(), n);
    assert_eq!(vendor.throttled(), 0);
    assert!(vendor.max_in_any_window(SECOND) <= 10);
    assert_eq!(order(&arrivals), (0..n).collect::<Vec<_>>(), "FIFO");
}

/// hyper's client, shaped, with the clock held while on the wire.
type ShapedHyper =
    Shaped<Held<HyperClient<hyper_util::client::legacy::connect::HttpConnector, reqwest::Body>>>;

fn shaped_hyper() -> ShapedHyper {
    let hyper = HyperClient::builder(TokioExecutor::new()).build_http::<reqwest::Body>();
    ShaperLayer::new(shaper()).layer(Held(hyper))
}

/// A GET of `url` as an `http` request.
fn get(url: &str) -> http::Request<String> {
    http::Request::get(url).body(String::new()).unwrap()
}

/// GETs of `{base}/r/{i}` for `i` in `0..n` through `client`, spawned in
/// order; every one must answer 200.
async fn all_ok(client: &ShapedHyper, base: &str, n: usize) {
    let tasks = (0..n)
        .map(|i| tokio::spawn(client.clone().oneshot(get(&format!("{base}/r/{i}")))))
        .collect();
    for outcome in join_all(tasks).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
}

#[tokio::test(start_paused = true)]
async fn a_hyper_client_keeps_the_quota() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    all_ok(&shaped_hyper(), &vendor.uri(), 100).await;
    assert_quota_kept(&vendor, 100);
}

#[tokio::test(start_paused = true)]
async fn reqwests_own_service_keeps_the_quota() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let client = ShaperLayer::new(shaper()).layer(Held(reqwest::Client::new()));
    let tasks = (0..100)
        .map(|i| {
            let url = format!("{}/r/{i}", vendor.uri()).parse().unwrap();
            let request = reqwest::Request::new(reqwest::Method::GET, url);
            tokio::spawn(client.clone().oneshot(request))
        })
        .collect();
    for outcome in join_all(tasks).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    assert_quota_kept(&vendor, 100);
}

/// Through hyper, a throttle pauses the lane and the throttled request
/// goes again after it, keeping its place; per-request settings travel as
/// extensions, and the shaper's own errors downcast.
#[tokio::test(start_paused = true)]
async fn a_throttle_pauses_the_lane_and_settings_travel_as_extensions() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    vendor.throttle_for(Duration::from_millis(10), RetryAfter::Seconds(2));
    let client = shaped_hyper();
    all_ok(&client, &vendor.uri(), 3).await;
    let arrivals = vendor.arrivals();
    let statuses: Vec<_> = arrivals.iter().map(|a| a.status).collect();
    assert_eq!(statuses, [429, 200, 200, 200]);
    assert!(arrivals[1].at - arrivals[0].at >= 2 * SECOND, "paused");
    assert_eq!(order(&arrivals), [0, 0, 1, 2], "the throttled one first");

    // Waiting behind the lane's pace would take 100 ms: refused at once.
    client.clone().oneshot(get(&vendor.uri())).await.unwrap();
    let mut impatient = get(&vendor.uri());
    impatient
        .extensions_mut()
        .insert(callshaper::shaper::MaxWait(Duration::from_millis(10)));
    let error = client.clone().oneshot(impatient).await.unwrap_err();
    let ours = error.downcast_ref::<Error>();
    assert!(
        matches!(ours, Some(Error::WouldExceedMaxWait { .. })),
        "{error}"
    );
}

/// A refused connection is the inner service's error, retried by the
/// shaper's rules (a connect error: never reached the vendor) until its
/// attempts run out, then handed up as it was.
#[tokio::test(start_paused = true)]
async fn a_refused_connection_is_retried_then_handed_up() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let hyper = HyperClient::builder(TokioExecutor::new()).build_http::<reqwest::Body>();
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = {
        let calls = calls.clone();
        tower::service_fn(move |request: http::Request<reqwest::Body>| {
            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut hyper = hyper.clone();
            async move { hyper.call(request).await }
        })
    };
    let client = ShaperLayer::new(shaper()).layer(Held(counted));
    let error = client
        .oneshot(get(&format!("http://{closed}/")))
        .await
        .unwrap_err();
    assert!(
        error.downcast_ref::<Error>().is_none(),
        "the transport's: {error}"
    );
    let max_attempts = callshaper::retry::RetryPolicy::default().max_attempts as usize;
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::Relaxed),
        max_attempts
    );
}
