//! The lane steered by what vendors announce: proactive pauses, GitHub's
//! 403, a lower announced quota, a user's own dialect, the retry budget,
//! and the signals handed back to the caller.

mod common;

use std::time::{Duration, SystemTime};

use callshaper::retry::RetryBudget;
use callshaper::signals::{Dimension, Signals};
use callshaper::testing::Vendor;
use callshaper::{Error, Rate};
use common::{SECOND, burst, order, shaper};
use reqwest::header::HeaderMap;
use wiremock::matchers::any;
use wiremock::{Mock, MockServer, ResponseTemplate};

#[tokio::test(start_paused = true)]
async fn remaining_zero_pauses_the_lane_until_the_reset_without_a_429() {
    // GitHub-like: 3 per fixed 2 s window, reset in epoch seconds.
    let vendor = Vendor::fixed_window(3, Duration::from_secs(2))
        .start()
        .await;
    let shaper = shaper(10).build().unwrap();

    let outcomes = burst(&shaper, &vendor.uri(), 9).await;

    for outcome in outcomes {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    assert_eq!(
        vendor.throttled(),
        0,
        "the lane stopped before the vendor had to say 429"
    );
    let arrivals = vendor.arrivals();
    assert_eq!(order(&arrivals), (0..9).collect::<Vec<_>>());
    // Three in each window, and nothing between a window's third request
    // and the next window.
    for (window, three) in arrivals.chunks(3).enumerate() {
        let start = Duration::from_secs(2 * window as u64);
        assert!(
            three
                .iter()
                .all(|a| a.at >= start && a.at < start + 2 * SECOND),
            "{arrivals:#?}"
        );
    }
}

async fn github_forbidden(headers: &[(&str, &str)]) -> MockServer {
    let mut forbidden = ResponseTemplate::new(403);
    for (name, value) in headers {
        forbidden = forbidden.insert_header(*name, *value);
    }
    common::answering_once(forbidden).await
}

#[tokio::test(start_paused = true)]
async fn a_github_secondary_limit_403_pauses_then_succeeds() {
    let server = github_forbidden(&[("retry-after", "3")]).await;
    let shaper = shaper(10).build().unwrap();
    let started = tokio::time::Instant::now();

    let outcomes = burst(&shaper, &server.uri(), 2).await;

    for outcome in outcomes {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    assert!(started.elapsed() >= Duration::from_secs(3));
    assert_eq!(server.received_requests().await.unwrap().len(), 3);

    // The primary limit: 403 with x-ratelimit-remaining: 0 and a reset.
    let reset = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 2;
    let reset = reset.to_string();
    let server = github_forbidden(&[
        ("x-ratelimit-remaining", "0"),
        ("x-ratelimit-reset", &reset),
    ])
    .await;
    let started = tokio::time::Instant::now();
    let response = shaper.get(server.uri()).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(started.elapsed() >= SECOND, "{:?}", started.elapsed());
}

#[tokio::test(start_paused = true)]
async fn a_plain_403_goes_back_to_the_caller_at_once() {
    let server = github_forbidden(&[]).await;
    let shaper = shaper(10).build().unwrap();
    let started = tokio::time::Instant::now();

    let response = shaper.get(server.uri()).send().await.unwrap();

    assert_eq!(response.status(), 403);
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_announced_lower_quota_slows_the_lane() {
    // A vendor that says nothing of its quota refuses 10/s at 5/s...
    let quiet = Vendor::strict(5, SECOND).silent().start().await;
    let shaper_quiet = shaper(10).build().unwrap();
    burst(&shaper_quiet, &quiet.uri(), 30).await;
    assert!(
        quiet.throttled() > 0,
        "the test needs a vendor that would refuse"
    );

    // ... one announcing its policy is kept to, from the first response.
    let vendor = Vendor::strict(5, SECOND).announcing_policy().start().await;
    let shaper = shaper(10).build().unwrap();

    let outcomes = burst(&shaper, &vendor.uri(), 30).await;

    for outcome in outcomes {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    assert_eq!(vendor.throttled(), 0);
    assert!(vendor.max_in_any_window(SECOND) <= 5);
    let lane = &shaper.lanes()[0];
    assert_eq!(lane.learned, Some(Rate::new(5, SECOND)));
    assert!(lane.interval >= Duration::from_millis(200));
}

#[tokio::test(start_paused = true)]
async fn an_announced_higher_quota_never_speeds_the_lane_up() {
    let vendor = Vendor::strict(50, SECOND).announcing_policy().start().await;
    let shaper = shaper(10).build().unwrap();
    burst(&shaper, &vendor.uri(), 5).await;
    let lane = &shaper.lanes()[0];
    assert_eq!(lane.learned, None);
    assert_eq!(lane.interval, Duration::from_micros(100_500));
}

#[tokio::test(start_paused = true)]
async fn a_users_own_dialect_steers_the_lane() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("x-quota-left", "0")
                .insert_header("x-quota-back-in", "4"),
        )
        .mount(&server)
        .await;
    let dialect = |headers: &HeaderMap, _now: SystemTime, signals: &mut Signals| {
        let read = |name: &str| headers.get(name)?.to_str().ok()?.parse::<u64>().ok();
        if let (Some(left), Some(back)) = (read("x-quota-left"), read("x-quota-back-in")) {
            let limit = signals.limit_mut(Dimension::Requests);
            limit.remaining = Some(left);
            limit.reset = Some(Duration::from_secs(back));
        }
    };
    let shaper = shaper(10).dialect(dialect).build().unwrap();
    let started = tokio::time::Instant::now();

    let outcomes = burst(&shaper, &server.uri(), 2).await;

    let first = outcomes[0].as_ref().unwrap();
    let signals = first
        .extensions()
        .get::<Signals>()
        .expect("signals on the response");
    assert_eq!(signals.remaining(Dimension::Requests), Some(0));
    assert!(outcomes[1].is_ok());
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn responses_carry_the_parsed_signals() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let shaper = shaper(10).build().unwrap();
    let response = shaper.get(vendor.uri()).send().await.unwrap();
    let signals = response.extensions().get::<Signals>().unwrap();
    assert_eq!(signals.remaining(Dimension::Requests), Some(9));
    assert_eq!(signals.limits[0].limit, Some(10));
}

/// A vendor down for everything: 200 requests, each allowed 3 attempts,
/// would send 600. The budget (20% of requests + 1/s over 10 s) bounds the
/// retries to 0.2 × 200 + 10 = 50: at most 250 attempts.
#[tokio::test(start_paused = true)]
async fn the_retry_budget_bounds_the_load_on_a_failing_vendor() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(500))
        .mount(&server)
        .await;
    let budget = RetryBudget {
        ratio: 0.2,
        min_per_sec: 1,
        ttl: Duration::from_secs(10),
    };
    let shaper = shaper(100).retry_budget(budget).build().unwrap();

    let outcomes = burst(&shaper, &server.uri(), 200).await;

    let mut budget_refusals = 0;
    for outcome in &outcomes {
        match outcome {
            Err(Error::RetriesExhausted { last_status, .. }) => {
                assert_eq!(last_status.as_u16(), 500)
            }
            Err(Error::RetryBudgetExhausted { last_status, .. }) => {
                assert_eq!(last_status.map(|s| s.as_u16()), Some(500));
                budget_refusals += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(outcomes.len(), 200, "every request ended");
    assert!(budget_refusals > 100, "{budget_refusals}");
    let attempts = server.received_requests().await.unwrap().len();
    assert!((200..=250).contains(&attempts), "{attempts} attempts");
}

/// A vendor that says nothing but a bare 429 and really allows 2/3 of
/// what the client was told: the first refusal teaches the lane what the
/// vendor accepted, with or without adaptive pacing, so 300 requests meet
/// one or two 429s, not one per window.
#[tokio::test(start_paused = true)]
async fn a_silent_vendor_costs_one_refusal_with_or_without_adaptive_pacing() {
    let mut throttles = Vec::new();
    for adaptive in [false, true] {
        let vendor = Vendor::strict(10, SECOND).silent().start().await;
        let mut builder = shaper(15);
        if adaptive {
            builder = builder.adaptive(callshaper::lane::Adaptive::default());
        }
        let shaper = builder.build().unwrap();
        for outcome in burst(&shaper, &vendor.uri(), 300).await {
            assert_eq!(outcome.unwrap().status(), 200);
        }
        throttles.push(vendor.throttled());
    }
    let (fixed, adaptive) = (throttles[0], throttles[1]);
    assert!(
        fixed <= 2 && adaptive <= 2,
        "fixed-rate lane: {fixed} 429s, adaptive: {adaptive}"
    );
}

/// A vendor announcing one request a day (or a window no clock can hold)
/// does not hold the lane for a day: the learned pace is capped at
/// `max_pause`, and nothing overflows.
#[tokio::test(start_paused = true)]
async fn an_announced_pace_slower_than_max_pause_is_capped() {
    for window in ["86400", "18446744073709551615"] {
        let server = MockServer::start().await;
        let policy = format!("\"default\";q=1;w={window}");
        Mock::given(any())
            .respond_with(ResponseTemplate::new(200).insert_header("ratelimit-policy", policy))
            .mount(&server)
            .await;
        let shaper = shaper(10)
            .max_pause(Duration::from_secs(30))
            .build()
            .unwrap();
        let started = tokio::time::Instant::now();
        for _ in 0..3 {
            let response = shaper.get(server.uri()).send().await.unwrap();
            assert_eq!(response.status(), 200);
        }
        let lane = &shaper.lanes()[0];
        assert!(lane.learned.is_some(), "w={window}: the pace was learned");
        assert!(
            lane.interval <= Duration::from_secs(30),
            "w={window}: {lane:?}"
        );
        // Three requests: the first at once, then two at most 30 s apart.
        let elapsed = started.elapsed();
        assert!(
            elapsed >= Duration::from_secs(59) && elapsed <= Duration::from_secs(61),
            "w={window}: {elapsed:?}"
        );
    }
}
