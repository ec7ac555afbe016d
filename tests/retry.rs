//! Which failures are retried: throttles for any method, other failures for
//! idempotent methods only, connection failures always; and the limits.

mod common;

use std::time::Duration;

use callshaper::Error;
use common::{SECOND, shaper};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

async fn vendor_failing_first(status: u16, times: u64, verb: &str) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method(verb))
        .and(path("/op"))
        .respond_with(ResponseTemplate::new(status).insert_header("retry-after", "1"))
        .up_to_n_times(times)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method(verb))
        .and(path("/op"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    server
}

/// One POST to `/op`, the vendor's answer whatever it is.
async fn pay(shaper: &callshaper::Shaper, server: &MockServer) -> reqwest::Response {
    shaper
        .post(format!("{}/op", server.uri()))
        .body("pay 10")
        .send()
        .await
        .unwrap()
}

async fn sent(server: &MockServer) -> usize {
    server.received_requests().await.map_or(0, |r| r.len())
}

#[tokio::test(start_paused = true)]
async fn a_post_is_not_retried_after_a_500() {
    let server = vendor_failing_first(500, 1, "POST").await;
    let shaper = shaper(10).build().unwrap();

    let response = pay(&shaper, &server).await;

    assert_eq!(
        response.status(),
        500,
        "the vendor's answer goes back as it is"
    );
    assert_eq!(sent(&server).await, 1);
}

#[tokio::test(start_paused = true)]
async fn a_post_is_retried_after_a_429() {
    let server = vendor_failing_first(429, 1, "POST").await;
    let shaper = shaper(10).build().unwrap();
    let started = tokio::time::Instant::now();

    let response = pay(&shaper, &server).await;

    assert_eq!(response.status(), 200);
    assert_eq!(sent(&server).await, 2);
    assert!(
        started.elapsed() >= SECOND,
        "after the vendor's Retry-After"
    );
}

#[tokio::test(start_paused = true)]
async fn a_post_is_retried_after_a_500_when_the_user_opts_in() {
    let server = vendor_failing_first(500, 1, "POST").await;
    let shaper = shaper(10).retry_non_idempotent(true).build().unwrap();

    let response = pay(&shaper, &server).await;

    assert_eq!(response.status(), 200);
    assert_eq!(sent(&server).await, 2);
}

#[tokio::test(start_paused = true)]
async fn a_get_is_retried_after_5xx_until_max_attempts() {
    let server = vendor_failing_first(502, 2, "GET").await;
    let shaper = shaper(10).build().unwrap();
    let response = shaper
        .get(format!("{}/op", server.uri()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(sent(&server).await, 3);

    let server = vendor_failing_first(500, 100, "GET").await;
    let outcome = shaper.get(format!("{}/op", server.uri())).send().await;
    match outcome {
        Err(Error::RetriesExhausted {
            attempts,
            last_status,
            ..
        }) => {
            assert_eq!((attempts, last_status.as_u16()), (3, 500));
        }
        other => panic!("expected RetriesExhausted, got {other:?}"),
    }
    assert_eq!(sent(&server).await, 3);
}

/// A connection refused is tried again, then reported with reqwest's
/// error, which names the URL without what may carry a key.
#[tokio::test(start_paused = true)]
async fn a_refused_connection_is_retried_then_reported() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = closed.local_addr().unwrap();
    drop(closed);
    let url = format!("http://user:token@{address}/op?key=AIza#top");
    let shaper = shaper(10).build().unwrap();

    let outcome = shaper.post(url).body("never sent").send().await;

    match outcome {
        Err(Error::Transport { attempts, source }) => {
            assert_eq!(
                attempts, 3,
                "a connection never made is safe to retry, even for POST"
            );
            assert!(source.is_connect());
            let shown = format!("http://{address}/op");
            assert_eq!(source.url().map(|url| url.as_str()), Some(shown.as_str()));
            let printed = format!("{source} {source:?}");
            assert!(
                !printed.contains("AIza") && !printed.contains("token"),
                "{printed}"
            );
        }
        other => panic!("expected Transport, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn bad_input_is_a_typed_error() {
    let shaper = shaper(10).build().unwrap();
    let outcome = shaper.get("not a url").send().await;
    assert!(
        matches!(outcome, Err(Error::InvalidRequest(_))),
        "{outcome:?}"
    );

    let missing_rate = callshaper::Shaper::builder().build().unwrap_err();
    assert_eq!(missing_rate.field, "rate");
    let zero = callshaper::Shaper::builder()
        .rate(0, SECOND)
        .build()
        .unwrap_err();
    assert_eq!(zero.field, "quotas[0].count");
    let instant = callshaper::Shaper::builder()
        .rate(1, Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(instant.field, "quotas[0].per");
    let no_queue = callshaper::Shaper::builder()
        .rate(1, SECOND)
        .queue_capacity(0)
        .build();
    assert_eq!(no_queue.unwrap_err().field, "queue_capacity");
}

#[tokio::test(start_paused = true)]
async fn a_503_pauses_the_lane_like_a_429() {
    let server = vendor_failing_first(503, 1, "GET").await;
    let shaper = shaper(10).build().unwrap();
    let started = tokio::time::Instant::now();
    let url = format!("{}/op", server.uri());

    let first = tokio::spawn(shaper.get(&url).send());
    tokio::task::yield_now().await;
    let second = tokio::spawn(shaper.get(&url).send());

    assert_eq!(first.await.unwrap().unwrap().status(), 200);
    assert_eq!(second.await.unwrap().unwrap().status(), 200);
    assert_eq!(sent(&server).await, 3);
    // The second request waited out the 1 s pause behind the first.
    assert!(started.elapsed() >= SECOND + Duration::from_millis(100));
    let lane = &shaper.lanes()[0];
    assert_eq!(lane.throttles, 1);
    assert_eq!(lane.released, 3);
}

/// Real time on purpose: the vendor's delay runs on wiremock's own clock.
/// Only a lower bound is checked, which a loaded machine cannot break.
#[tokio::test]
async fn max_in_flight_caps_requests_on_the_wire() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_millis(150)))
        .mount(&server)
        .await;
    let shaper = callshaper::Shaper::builder()
        .rate(1_000, SECOND)
        .max_in_flight(2)
        .build()
        .unwrap();
    let started = std::time::Instant::now();

    let outcomes = common::burst(&shaper, &server.uri(), 6).await;

    for outcome in outcomes {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    // Three waves of two; uncapped, all six would take one delay.
    assert!(
        started.elapsed() >= Duration::from_millis(450),
        "{:?}",
        started.elapsed()
    );
}

/// A vendor failing requests 0, 5, 10 and 15 once each (502), at 100/s
/// with a backoff that fits in one slot: every retry goes back ahead of
/// everyone after it, so the vendor accepts all twenty in submission order.
#[tokio::test(start_paused = true)]
async fn a_retried_request_keeps_its_place() {
    let server = MockServer::start().await;
    for failing in [0, 5, 10, 15] {
        Mock::given(path(format!("/r/{failing}")))
            .respond_with(ResponseTemplate::new(502))
            .up_to_n_times(1)
            .with_priority(1)
            .mount(&server)
            .await;
    }
    Mock::given(wiremock::matchers::any())
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let mut retry = callshaper::retry::RetryPolicy::default();
    retry.backoff =
        callshaper::retry::Backoff::new(Duration::from_millis(5), Duration::from_millis(5));
    let shaper = shaper(100).retry(retry).build().unwrap();

    for outcome in common::burst(&shaper, &server.uri(), 20).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }

    let received = server.received_requests().await.unwrap();
    let accepted: Vec<usize> = received
        .iter()
        .map(|r| r.url.path().trim_start_matches("/r/").parse().unwrap())
        .collect::<Vec<_>>();
    // The failed attempts are the first arrival of 0, 5, 10 and 15; drop
    // them to read the order the vendor accepted.
    let mut seen = std::collections::HashSet::new();
    let accepted: Vec<usize> = accepted
        .into_iter()
        .filter(|i| ![0, 5, 10, 15].contains(i) || !seen.insert(*i))
        .collect();
    assert_eq!(accepted, (0..20).collect::<Vec<_>>());
}

/// A request backing off after a failure waits in its lane: it counts in
/// the queue, and a shutdown ends it at once instead of after its backoff.
#[tokio::test(start_paused = true)]
async fn a_request_backing_off_waits_in_its_lane() {
    let server = vendor_failing_first(502, 1, "GET").await;
    let mut retry = callshaper::retry::RetryPolicy::default();
    retry.backoff =
        callshaper::retry::Backoff::new(Duration::from_secs(60), Duration::from_secs(60));
    let shaper = shaper(10).retry(retry).build().unwrap();
    let call = tokio::spawn(shaper.get(format!("{}/op", server.uri())).send());
    while sent(&server).await == 0 {
        tokio::task::yield_now().await;
    }
    // Let the 502 come back (from wiremock's own thread) and the request
    // re-enter, without moving the clock past any backoff.
    for _ in 0..100_000 {
        if shaper.lanes()[0].queued == 1 || call.is_finished() {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(shaper.lanes()[0].queued, 1, "backing off in the queue");

    let stopped = tokio::time::Instant::now();
    shaper.shutdown();
    let outcome = call.await.unwrap();
    assert!(matches!(outcome, Err(Error::Shutdown)), "{outcome:?}");
    assert!(
        stopped.elapsed() < Duration::from_millis(10),
        "{:?}",
        stopped.elapsed()
    );
    assert_eq!(sent(&server).await, 1);
}

/// A response asked to hold its lane's in-flight slot until its body ends
/// does (without asking, `max_in_flight_caps_requests_on_the_wire` holds
/// six unread responses under a cap of two): with
/// `max_in_flight(1)` a second request waits while the first's body is
/// unread and goes once it is read; a third goes once the second's
/// response is dropped unread. The held response keeps its URL and length.
/// Real time: each "still waiting" check can only pass late, never fail
/// early, on a loaded machine.
#[tokio::test]
async fn the_in_flight_slot_is_held_until_the_body_ends() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_body_string("hello"))
        .mount(&server)
        .await;
    let shaper = callshaper::Shaper::builder()
        .rate(1_000, SECOND)
        .max_in_flight(1)
        .build()
        .unwrap();
    let arrived = || async { server.received_requests().await.unwrap().len() };
    let send = || {
        let call = shaper
            .get(format!("{}/held", server.uri()))
            .in_flight_through_body();
        tokio::spawn(async move { call.send().await.unwrap() })
    };

    let first = send().await.unwrap();
    assert_eq!(first.url().as_str(), format!("{}/held", server.uri()));
    assert_eq!(first.content_length(), Some(5));
    let second = send();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(arrived().await, 1, "the first body holds the slot");
    assert_eq!(first.text().await.unwrap(), "hello");
    let second = tokio::time::timeout(10 * SECOND, second)
        .await
        .expect("the slot is free once the body is read")
        .unwrap();
    assert_eq!(arrived().await, 2);

    let third = send();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(arrived().await, 2, "the second, unread, holds the slot");
    drop(second);
    let third = tokio::time::timeout(10 * SECOND, third)
        .await
        .expect("the slot is free once the response is dropped")
        .unwrap();
    assert_eq!(third.text().await.unwrap(), "hello");
    assert_eq!(arrived().await, 3);
}
