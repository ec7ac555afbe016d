//! Each algorithm against a vendor that counts the same way, several
//! quotas at once, costs, and settling a cost after the response.

mod common;

use std::time::Duration;

use callshaper::testing::Vendor;
use callshaper::{Error, Quota};
use common::{SECOND, assert_fifo, burst, join_all, order, shaper, shaper_with};

async fn run(quota: Quota, vendor: Vendor, n: usize) -> Vendor {
    let vendor = vendor.start().await;
    let shaper = shaper_with(quota).build().unwrap();
    for outcome in burst(&shaper, &vendor.uri(), n).await {
        outcome.unwrap();
    }
    assert_fifo(&vendor, n);
    vendor
}

#[tokio::test(start_paused = true)]
async fn leaky_bucket_holds_a_strict_window_smoothly() {
    let vendor = run(
        Quota::leaky_bucket(10, SECOND),
        Vendor::strict(10, SECOND),
        40,
    )
    .await;
    assert_eq!(vendor.throttled(), 0);
    assert!(vendor.max_in_any_window(SECOND) <= 10);
    assert!(
        vendor.max_in_any_window(Duration::from_millis(100)) <= 1,
        "no burst"
    );
}

#[tokio::test(start_paused = true)]
async fn token_bucket_bursts_as_the_vendors_bucket_allows() {
    let vendor = run(
        Quota::token_bucket(5, 10, SECOND),
        Vendor::token_bucket(5, 10, SECOND),
        40,
    )
    .await;
    assert_eq!(vendor.throttled(), 0);
    let arrivals = vendor.arrivals();
    // Four at once, the fifth half the 5 ms headroom later, so that a burst
    // landing late cannot crowd the refill (token_bucket.rs).
    assert!(
        arrivals[..4].iter().all(|a| a.at == Duration::ZERO),
        "a burst: {arrivals:?}"
    );
    assert!(arrivals[4].at <= Duration::from_millis(3), "{arrivals:?}");
    assert!(arrivals[5].at >= arrivals[4].at + Duration::from_millis(100));
    // Then the refill, one each 100.5 ms: the vendor's "0 of 5 left" after
    // the burst is the declared bucket's capacity spent, no lower rate and
    // no reason to pause (it read as 5 a second cost half the quota).
    let last = arrivals[39].at;
    assert!(last <= Duration::from_millis(3_560), "done at {last:?}");
}

#[tokio::test(start_paused = true)]
async fn sliding_log_is_exact_against_a_strict_window() {
    let vendor = run(
        Quota::sliding_log(10, SECOND),
        Vendor::strict(10, SECOND),
        40,
    )
    .await;
    assert_eq!(vendor.throttled(), 0);
    assert_eq!(
        vendor.max_in_any_window(SECOND),
        10,
        "the full quota, not less"
    );
}

#[tokio::test(start_paused = true)]
async fn sliding_window_counter_holds_a_strict_window_under_a_backlog() {
    let vendor = run(
        Quota::sliding_window(10, SECOND),
        Vendor::strict(10, SECOND),
        40,
    )
    .await;
    assert_eq!(vendor.throttled(), 0);
    assert!(vendor.max_in_any_window(SECOND) <= 10);
    // Unlike a fixed window, the first window's burst weighs on the next:
    // its releases are spread (one per ~100 ms), not bunched at its start.
    let arrivals = vendor.arrivals();
    for pair in arrivals[10..20].windows(2) {
        assert!(
            pair[1].at - pair[0].at >= Duration::from_millis(90),
            "{arrivals:#?}"
        );
    }
}

/// The documented weakness: a fixed window lets a full window's worth go at
/// the end of one window and again at the start of the next.
#[tokio::test(start_paused = true)]
async fn fixed_window_can_double_its_quota_across_a_boundary() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let shaper = shaper_with(Quota::fixed_window(10, SECOND))
        .headroom(Duration::ZERO)
        .build()
        .unwrap();
    // Create the lane (its windows start now), then come back late in an
    // unused window.
    shaper.get(vendor.uri()).send().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_900)).await;

    for outcome in burst(&shaper, &vendor.uri(), 20).await {
        outcome.unwrap();
    }

    // 10 at 1.9 s, 10 at 2.0 s: 20 within 100 ms, twice the quota.
    assert_eq!(vendor.max_in_any_window(Duration::from_millis(101)), 20);
    assert!(
        vendor.throttled() > 0,
        "a strict vendor refuses the second half"
    );
}

/// An LLM vendor: 10 requests and 1,000 tokens per second (a minute scaled
/// down), each request sending its tokens in `x-tokens`.
#[tokio::test(start_paused = true)]
async fn requests_and_tokens_are_both_held_and_the_queue_stays_fifo() {
    let vendor = Vendor::strict(10, SECOND)
        .also_cost(1_000, SECOND, "x-tokens")
        .start()
        .await;
    let shaper = shaper(10)
        .quota(Quota::sliding_log(1_000, SECOND).per_cost())
        .build()
        .unwrap();
    let costs: Vec<u64> = (0..40).map(|i| if i % 3 == 0 { 400 } else { 10 }).collect();

    let tasks = costs
        .iter()
        .enumerate()
        .map(|(i, &cost)| {
            let call = shaper
                .get(format!("{}/r/{i}", vendor.uri()))
                .header("x-tokens", cost.to_string())
                .cost(cost)
                .send();
            tokio::spawn(call)
        })
        .collect();
    for outcome in join_all(tasks).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }

    assert_eq!(vendor.throttled(), 0);
    assert!(
        vendor.max_in_any_window(SECOND) <= 10,
        "requests per second held"
    );
    assert!(
        vendor.max_cost_in_any_window(SECOND) <= 1_000,
        "tokens per second held"
    );
    assert_eq!(
        order(&vendor.arrivals()),
        (0..40).collect::<Vec<_>>(),
        "one FIFO queue"
    );

    let too_big = shaper.get(vendor.uri()).cost(1_001).send().await;
    match too_big {
        Err(Error::CostTooHigh { cost, capacity, .. }) => {
            assert_eq!((cost, capacity), (1_001, 1_000))
        }
        other => panic!("expected CostTooHigh, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn settling_a_cost_gives_the_unused_part_back() {
    let vendor = Vendor::strict(100, SECOND)
        .also_cost(1_000, SECOND, "x-tokens")
        .start()
        .await;
    let tokens = Quota::sliding_log(1_000, SECOND).per_cost();

    let shaper = shaper(100).quota(tokens).build().unwrap();
    // Settled: one request interval (10 ms at 100/s), not the token window.
    common::settle_then_not(&shaper, &vendor, Duration::ZERO, Duration::from_millis(20)).await;
}

/// A meter of the user's own: at least `gap` between two releases, and
/// nothing else. Written here as a user would, against the public trait.
#[derive(Debug)]
struct Spaced {
    gap: Duration,
    last: Option<tokio::time::Instant>,
}

impl callshaper::meters::Meter for Spaced {
    fn capacity(&self) -> u64 {
        1
    }

    fn earliest(&self, _cost: u64, now: tokio::time::Instant) -> tokio::time::Instant {
        self.last.map_or(now, |last| now.max(last + self.gap))
    }

    fn commit(&mut self, _cost: u64, now: tokio::time::Instant) {
        self.last = Some(now);
    }

    fn settle(&mut self, _charged: u64, _actual: u64, _at: tokio::time::Instant) {}

    fn is_idle(&self, now: tokio::time::Instant) -> bool {
        self.last.is_none_or(|last| now >= last + self.gap)
    }

    fn interval(&self) -> Duration {
        self.gap
    }
}

fn spaced(gap: Duration) -> Quota {
    // Declared faster than the meter allows, so only the meter itself can
    // explain the gaps the vendor sees.
    let rate = callshaper::Rate::new(100, SECOND);
    Quota::custom(callshaper::meters::CustomMeter::new(
        "spaced",
        rate,
        move |_headroom, _now| Box::new(Spaced { gap, last: None }),
    ))
}

/// A user's own meter paces the lane as the built-in ones do, next to a
/// built-in quota counting tokens.
#[tokio::test(start_paused = true)]
async fn a_users_own_meter_paces_the_lane() {
    let gap = Duration::from_millis(250);
    let vendor = run(spaced(gap), Vendor::strict(100, SECOND), 12).await;
    assert_eq!(vendor.throttled(), 0);
    let arrivals: Vec<_> = vendor.arrivals().iter().map(|a| a.at).collect();
    for pair in arrivals.windows(2) {
        assert!(pair[1] - pair[0] >= gap, "{arrivals:?}");
    }
    assert!(*arrivals.last().unwrap() < 11 * gap + Duration::from_millis(50));

    // Beside a tokens quota, each is enforced: the custom gap, and 100
    // tokens a second.
    let vendor = Vendor::strict(100, SECOND)
        .also_cost(100, SECOND, "x-tokens")
        .start()
        .await;
    let shaper = shaper_with(spaced(Duration::from_millis(100)))
        .quota(Quota::sliding_log(100, SECOND).per_cost())
        .build()
        .unwrap();
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let call = shaper
                .get(format!("{}/r/{i}", vendor.uri()))
                .header("x-tokens", "50")
                .cost(50)
                .send();
            tokio::spawn(call)
        })
        .collect();
    for outcome in join_all(tasks).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    let at: Vec<_> = vendor.arrivals().iter().map(|a| a.at).collect();
    assert!(
        at[1] - at[0] >= Duration::from_millis(100),
        "the gap: {at:?}"
    );
    assert!(at[2] >= SECOND, "the tokens' window: {at:?}");
    assert_eq!(vendor.throttled(), 0);
}
