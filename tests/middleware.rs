//! The shaper inside a reqwest-middleware stack.

mod common;

use std::time::Duration;

use callshaper::Shaper;
use callshaper::shaper::MaxWait;
use callshaper::testing::{RetryAfter, Vendor, hold_clock};
use common::SECOND;
use reqwest_middleware::{Middleware, Next};

/// Below the shaper: keeps the paused test clock still on the wire.
struct HoldClock;

#[async_trait::async_trait]
impl Middleware for HoldClock {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut http::Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        hold_clock(next.run(request, extensions)).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_middleware_stack_is_paced_and_paused_by_the_shaper() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    vendor.throttle_for(Duration::from_millis(10), RetryAfter::Seconds(2));
    let shaper = Shaper::builder().rate(10, SECOND).build().unwrap();
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(shaper.clone())
        .with(HoldClock)
        .build();
    let started = tokio::time::Instant::now();

    let response = client.get(vendor.uri()).send().await.unwrap();

    assert_eq!(response.status(), 200);
    assert_eq!(
        vendor
            .arrivals()
            .iter()
            .map(|a| a.status)
            .collect::<Vec<_>>(),
        [429, 200]
    );
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "paused for the vendor's 2 s"
    );

    // A per-request limit travels as an extension: once the lane has
    // rested a zero wait is fine; right after, the next slot is 100 ms away.
    tokio::time::sleep(SECOND).await;
    let quick = client
        .get(vendor.uri())
        .with_extension(MaxWait(Duration::ZERO))
        .send()
        .await;
    assert_eq!(quick.unwrap().status(), 200);
    let refused = client
        .get(vendor.uri())
        .with_extension(MaxWait(Duration::ZERO))
        .send()
        .await;
    let error = refused.unwrap_err();
    assert!(
        error.to_string().contains("would_exceed_max_wait"),
        "{error}"
    );
    let ours = callshaper::middleware::shaper_error(&error).expect("the shaper's");
    assert!(ours.to_string().contains("past max_wait"), "{ours}");
    assert_eq!(vendor.arrivals().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn cost_and_tag_travel_as_extensions() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let per_tenant = callshaper::route::Level::new(
        "tenant",
        callshaper::route::LaneKey::Tag,
        [callshaper::Quota::leaky_bucket(5, SECOND)],
    );
    let shaper = Shaper::builder()
        .rate(10, SECOND)
        .quota(callshaper::Quota::sliding_log(1_000, SECOND).per_cost())
        .level(per_tenant)
        .build()
        .unwrap();
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(shaper.clone())
        .with(HoldClock)
        .build();

    let ok = client
        .get(vendor.uri())
        .with_extension(callshaper::route::Cost(600))
        .with_extension(callshaper::route::Tag("acme".into()))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert!(
        shaper
            .lanes()
            .iter()
            .any(|lane| lane.key.starts_with("tenant/acme | ")),
        "{:?}",
        shaper.lanes()
    );

    let too_costly = client
        .get(vendor.uri())
        .with_extension(callshaper::route::Cost(1_001))
        .send()
        .await;
    let error = too_costly.unwrap_err();
    assert!(error.to_string().contains("cost_too_high"), "{error}");
    let ours = callshaper::middleware::shaper_error(&error);
    assert!(
        matches!(
            ours,
            Some(callshaper::Error::CostTooHigh { cost: 1_001, .. })
        ),
        "{ours:?}"
    );
    assert_eq!(vendor.arrivals().len(), 1);
}
