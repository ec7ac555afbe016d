//! Per-route limits, per-tenant lanes under a shared vendor quota, and the
//! fairness rule between tenants.

mod common;

use std::time::Duration;

use callshaper::Quota;
use callshaper::lane::Priority;
use callshaper::route::{LaneKey, Level, Route};
use callshaper::testing::Vendor;
use common::{SECOND, join_all, shaper};
use reqwest::Method;
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn a_route_keeps_its_own_limit_under_the_vendors() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let payments = Route::new("payments")
        .method(Method::POST)
        .path("/v1/payments/*")
        .rate(2, SECOND);
    let shaper = shaper(10).route(payments).build().unwrap();
    let base = vendor.uri();

    let mut tasks = Vec::new();
    for i in 0..6 {
        tasks.push(tokio::spawn(
            shaper.post(format!("{base}/v1/payments/{i}")).send(),
        ));
    }
    for i in 0..20 {
        tasks.push(tokio::spawn(
            shaper.get(format!("{base}/v1/products/{i}")).send(),
        ));
    }
    for outcome in join_all(tasks).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }

    assert_eq!(vendor.throttled(), 0);
    assert!(
        vendor.max_in_any_window(SECOND) <= 10,
        "the vendor-wide 10/s holds"
    );
    let arrivals = vendor.arrivals();
    let payments: Vec<_> = arrivals
        .iter()
        .filter(|a| a.path.starts_with("/v1/payments"))
        .map(|a| a.at)
        .collect();
    assert_eq!(
        callshaper::testing::max_in_any_window(payments.iter().copied(), SECOND),
        2
    );
    let last_product = arrivals
        .iter()
        .filter(|a| a.path.starts_with("/v1/products"))
        .map(|a| a.at)
        .max()
        .unwrap();
    // 26 requests at 10/s: the products are not held behind the slow route.
    assert!(
        last_product < Duration::from_millis(2_700),
        "{last_product:?}"
    );
    assert!(
        *payments.last().unwrap() >= Duration::from_millis(2_500),
        "payments at 2/s"
    );
    assert!(
        shaper
            .lanes()
            .iter()
            .any(|l| l.key.starts_with("payments/ | ")),
        "{:?}",
        shaper.lanes()
    );
}

/// A route whose host is not a host (a URL, here) is refused at build,
/// naming the route: no request could match it, and its quota would go
/// unkept.
#[tokio::test(start_paused = true)]
async fn a_route_whose_host_is_a_url_is_refused_at_build() {
    let payments = Route::new("payments")
        .host("https://api.example.com")
        .rate(2, SECOND);
    let error = shaper(10)
        .route(payments)
        .build()
        .expect_err("a URL is not a host");
    assert_eq!(error.field, "routes.payments.host");
    assert!(error.problem.contains("is not a host"), "{error}");
}

/// A route's quota holds a request however it spells the route's path,
/// as its vendor reads them alike: `/v1/%70ayments/2` and
/// `/v1/payments%2F3` went past the route's 2 a second as other paths.
#[tokio::test(start_paused = true)]
async fn a_route_holds_every_spelling_of_its_path() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let payments = Route::new("payments")
        .path("/v1/payments/*")
        .rate(2, SECOND);
    let shaper = shaper(10).route(payments).build().unwrap();
    let base = vendor.uri();
    let spellings = [
        "payments/1",
        "%70ayments/2",
        "payments%2F3",
        "%70aym%65nts%2f4",
    ];
    let tasks = spellings
        .iter()
        .cycle()
        .take(8)
        .map(|path| tokio::spawn(shaper.post(format!("{base}/v1/{path}")).send()));
    for outcome in join_all(tasks.collect()).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    let arrivals = vendor.arrivals();
    assert_eq!(arrivals.len(), 8);
    let at = arrivals.iter().map(|arrival| arrival.at);
    assert_eq!(callshaper::testing::max_in_any_window(at, SECOND), 2);
}

/// Two routes of one name are refused at build: a route's name labels
/// its series, and begins its lanes' names where another route goes
/// through the same levels.
#[tokio::test(start_paused = true)]
async fn two_routes_of_one_name_are_refused_at_build() {
    let error = shaper(10)
        .route(Route::new("search").path("/v1/search").rate(2, SECOND))
        .route(Route::new("search").path("/v2/search").rate(5, SECOND))
        .build()
        .expect_err("one name, two routes");
    assert_eq!(error.field, "routes.search");
    assert!(
        error.problem.contains("another route has this name"),
        "{error}"
    );
}

/// Tenant A floods 60 requests, then B sends 10, each tenant capped at
/// `cap` per second under a vendor at 10/s. Returns when B's last request
/// was done, after checking every request succeeded within the vendor's
/// quota, and the vendor that saw them.
async fn flood_then_other(cap: u32) -> (Duration, Vendor) {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let tenant = Level::new("tenant", LaneKey::Tag, [Quota::leaky_bucket(cap, SECOND)]);
    let shaper = shaper(10).level(tenant).build().unwrap();
    let started = Instant::now();
    let send = |tenant: &'static str, i: usize| {
        let call = shaper
            .get(format!("{}/{tenant}/{i}", vendor.uri()))
            .tag(tenant)
            .send();
        tokio::spawn(async move { (call.await, started.elapsed()) })
    };

    let flood: Vec<_> = (0..60).map(|i| send("a", i)).collect();
    tokio::task::yield_now().await;
    let other: Vec<_> = (0..10).map(|i| send("b", i)).collect();

    let mut b_last = Duration::ZERO;
    for (outcome, at) in join_all(other).await {
        assert_eq!(outcome.unwrap().status(), 200);
        b_last = b_last.max(at);
    }
    for (outcome, _) in join_all(flood).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    assert_eq!(vendor.throttled(), 0);
    assert!(vendor.max_in_any_window(SECOND) <= 10);
    (b_last, vendor)
}

/// The fairness rule (see `callshaper::route`): each tenant waits in its
/// own lane, so a flood never queues another tenant behind it. With caps
/// of 5/s, B's 10 are done as soon as its own cap allows (2 s), not after
/// A's 60; and A keeps to its cap.
#[tokio::test(start_paused = true)]
async fn a_tenants_flood_does_not_starve_another_tenant() {
    let (b_last, vendor) = flood_then_other(5).await;
    assert!(
        b_last <= Duration::from_millis(2_100),
        "tenant b finished at {b_last:?}"
    );
    let a_in_first_second = vendor
        .arrivals()
        .iter()
        .filter(|a| a.path.starts_with("/a/") && a.at < SECOND)
        .count();
    assert!(
        a_in_first_second <= 5,
        "tenant a kept to its cap: {a_in_first_second}"
    );
}

/// When the tenants' caps (100/s) add up to more than the shared quota
/// (10/s), the shared gate serves the lane that has waited longest: the
/// two busy tenants take turns, and B is done in about 2 s instead of
/// waiting out A's 6 s.
#[tokio::test(start_paused = true)]
async fn busy_tenants_take_turns_at_the_shared_quota() {
    let (b_last, _) = flood_then_other(100).await;
    assert!(
        b_last <= Duration::from_millis(2_200),
        "tenant b finished at {b_last:?}"
    );
}

/// Interactive requests go first; batch work keeps one release in five
/// when both wait, so it never starves.
#[tokio::test(start_paused = true)]
async fn interactive_requests_overtake_batch_work_without_starving_it() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let shaper = shaper(10).build().unwrap();
    let mut tasks = Vec::new();
    for i in 0..10 {
        let call = shaper
            .get(format!("{}/batch/{i}", vendor.uri()))
            .priority(Priority::Batch);
        tasks.push(tokio::spawn(call.send()));
    }
    for i in 0..10 {
        tasks.push(tokio::spawn(
            shaper.get(format!("{}/now/{i}", vendor.uri())).send(),
        ));
    }
    for outcome in join_all(tasks).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    let order: Vec<_> = vendor
        .arrivals()
        .iter()
        .map(|a| a.path.split('/').nth(1).unwrap().to_owned())
        .collect();
    // The first batch request found the lane empty and went at once; then
    // four interactive, one batch, and so on.
    let expected: Vec<&str> = [
        "batch", "now", "now", "now", "now", "batch", "now", "now", "now", "now", "batch", "now",
        "now", "batch",
    ]
    .into_iter()
    .chain(std::iter::repeat_n("batch", 6))
    .collect();
    assert_eq!(order, expected);
}

/// A 429 seen by one tenant's request pauses the vendor's shared quota:
/// no tenant sends anything until the pause ends.
#[tokio::test(start_paused = true)]
async fn a_throttle_seen_by_one_tenant_pauses_every_tenant() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    vendor.throttle_for(
        Duration::from_millis(50),
        callshaper::testing::RetryAfter::Seconds(2),
    );
    let tenant = Level::new("tenant", LaneKey::Tag, [Quota::leaky_bucket(5, SECOND)]);
    let shaper = shaper(10).level(tenant).build().unwrap();

    let first = tokio::spawn(shaper.get(format!("{}/a/0", vendor.uri())).tag("a").send());
    tokio::time::sleep(Duration::from_millis(10)).await;
    let others: Vec<_> = (0..5)
        .map(|i| {
            tokio::spawn(
                shaper
                    .get(format!("{}/b/{i}", vendor.uri()))
                    .tag("b")
                    .send(),
            )
        })
        .collect();
    assert_eq!(first.await.unwrap().unwrap().status(), 200);
    for outcome in join_all(others).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }

    let arrivals = vendor.arrivals();
    assert_eq!(arrivals[0].status, 429);
    let after = arrivals[1].at - arrivals[0].at;
    assert!(
        after >= 2 * SECOND,
        "tenant b sent {after:?} after a's 429: {arrivals:#?}"
    );
}

/// Two routes through a level of one name (a tenant's, on two of a
/// vendor's endpoints) keep their own settings: a request of one never
/// takes a lane the other made. Both wrote `tenant/t | origin`, and route
/// `a`'s request took the lane route `b` had made, with `b`'s answers: a
/// 418 that `a` says throttles came back as an answer.
#[tokio::test(start_paused = true)]
async fn routes_through_one_level_keep_their_own_settings() {
    use wiremock::matchers::any;
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let vendor = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(418))
        .mount(&vendor)
        .await;
    let tenant = || Level::new("tenant", LaneKey::Tag, [Quota::fixed_window(100, SECOND)]);
    let teapot = callshaper::Answers::default().throttle(reqwest::StatusCode::IM_A_TEAPOT);
    let shaper = shaper(100)
        .route(Route::new("a").path("/a").level(tenant()).answers(teapot))
        .route(Route::new("b").path("/b").level(tenant()))
        .max_wait(SECOND)
        .build()
        .unwrap();
    let base = vendor.uri();
    let b = shaper.get(format!("{base}/b")).tag("t").send().await;
    assert_eq!(
        b.unwrap().status(),
        418,
        "b's answers do not throttle at 418"
    );
    let a = shaper.get(format!("{base}/a")).tag("t").send().await;
    assert!(a.is_err(), "a's answers throttle at 418: {a:?}");
    let origin = base.trim_end_matches('/');
    let throttles = |name: &str| shaper.lane(name).map(|lane| lane.throttles);
    assert_eq!(throttles(&format!("tenant/t | {origin}")), Some(0));
    assert!(throttles(&format!("a | tenant/t | {origin}")) > Some(0));
}

/// Two levels keyed by text a caller gives (a tag, a custom key) never
/// write one lane name for two tenants: `a | project/x` then `y`, and
/// `a` then `x | project/y`, read `tenant/a | project/x | project/y`
/// alike, and tenant `a` went past its quota in the lane of tenant
/// `a | project/x`.
#[tokio::test(start_paused = true)]
async fn keys_never_read_as_another_tenants() {
    let vendor = Vendor::strict(100, SECOND).start().await;
    let project = LaneKey::Custom(std::sync::Arc::new(|request: &reqwest::Request, _| {
        let project = request.headers().get("x-project");
        project
            .and_then(|value| value.to_str().ok())
            .unwrap_or("")
            .to_owned()
    }));
    let minute = Duration::from_secs(60);
    let shaper = shaper(100)
        .level(Level::new(
            "tenant",
            LaneKey::Tag,
            [Quota::fixed_window(2, minute)],
        ))
        .level(Level::new(
            "project",
            project,
            [Quota::fixed_window(100, minute)],
        ))
        .max_wait(SECOND)
        .build()
        .unwrap();
    let send = |tag: &str, project: &str| {
        shaper
            .get(vendor.uri())
            .tag(tag)
            .header("x-project", project)
            .send()
    };
    assert!(send("a", "p").await.is_ok());
    assert!(send("a", "q").await.is_ok());
    assert!(send("a | project/x", "y").await.is_ok());
    match send("a", "x | project/y").await {
        Err(callshaper::Error::WouldExceedMaxWait { .. }) => {}
        other => panic!("tenant a had spent its 2 a minute: {other:?}"),
    }
    assert_eq!(vendor.arrivals().len(), 3);
    assert_eq!(shaper.live_lanes(), 4);
}
