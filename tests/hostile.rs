//! Every number a caller, a config file or a vendor supplies is hostile:
//! random builder settings and random vendor headers, drawn from extreme
//! values (0, 1, MAX, negative, garbage), never panic, never stall a lane
//! past what its own settings allow, and every request ends in exactly one
//! outcome.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use callshaper::lane::Priority;
use callshaper::retry::{Backoff, RetryBudget, RetryPolicy};
use callshaper::shaper::Settle;
use callshaper::testing::HoldClock;
use callshaper::{Error, Quota, Shaper};
use wiremock::matchers::any;
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

/// Shapers built and run; each sends four requests to a hostile vendor.
const CASES: u64 = 300;

/// Settings drawn and built, without traffic.
const BUILDS: u64 = 5_000;

const DAY: Duration = Duration::from_secs(86_400);

/// Longer than any wait the settings drawn here allow.
const YEARS: Duration = Duration::from_secs(50 * 365 * 86_400);

/// A duration: one time in eight an extreme one.
fn duration(rng: &mut fastrand::Rng) -> Duration {
    let extreme = [
        Duration::ZERO,
        Duration::from_nanos(1),
        DAY,
        Duration::from_secs(u64::MAX),
        Duration::MAX,
    ];
    let usual = [
        Duration::from_millis(1),
        Duration::from_millis(250),
        Duration::from_secs(1),
        Duration::from_secs(60),
    ];
    if rng.u8(0..8) == 0 {
        extreme[rng.usize(..extreme.len())]
    } else {
        usual[rng.usize(..usual.len())]
    }
}

/// A count: one time in eight an extreme one.
fn count(rng: &mut fastrand::Rng) -> u32 {
    if rng.u8(0..8) == 0 {
        [0, 1, u32::MAX][rng.usize(..3)]
    } else {
        [2, 10, 1_000][rng.usize(..3)]
    }
}

fn quota(rng: &mut fastrand::Rng) -> Quota {
    let (n, per) = (count(rng), duration(rng));
    let quota = match rng.u8(0..5) {
        0 => Quota::leaky_bucket(n, per),
        1 => Quota::token_bucket([0, 1, 5, u64::MAX][rng.usize(..4)], n, per),
        2 => Quota::fixed_window(n, per),
        3 => Quota::sliding_log(n, per),
        _ => Quota::sliding_window(n, per),
    };
    if rng.bool() { quota.per_cost() } else { quota }
}

/// A shaper with random settings and its `max_pause`, or the typed error
/// that refused them.
fn random_shaper(
    rng: &mut fastrand::Rng,
    client: &reqwest::Client,
) -> Result<(Shaper, Duration), callshaper::ConfigError> {
    let mut max_pause = Duration::from_secs(120);
    let mut builder = Shaper::builder().transport(HoldClock(client.clone()));
    for _ in 0..rng.usize(1..3) {
        builder = builder.quota(quota(rng));
    }
    if rng.bool() {
        builder = builder.headroom(duration(rng));
    }
    if rng.bool() {
        builder = builder.max_wait(duration(rng));
    }
    if rng.bool() {
        max_pause = duration(rng);
        builder = builder.max_pause(max_pause);
    }
    if rng.bool() {
        builder = builder.fallback_pause(duration(rng), duration(rng));
    }
    if rng.bool() {
        builder = builder.idle_timeout(duration(rng));
    }
    if rng.bool() {
        builder = builder.queue_capacity([0, 1, 3, usize::MAX][rng.usize(..4)]);
    }
    if rng.bool() {
        builder = builder.max_in_flight([0, 1, 3, usize::MAX][rng.usize(..4)]);
    }
    if rng.bool() {
        let ratios = [0.2, 0.2, 0.2, 0.0, -1.0, f64::NAN, f64::INFINITY, f64::MAX];
        let mut retry = RetryPolicy::default();
        retry.max_attempts = count(rng);
        retry.max_throttles = count(rng);
        retry.backoff = Backoff::new(duration(rng), duration(rng));
        retry.retry_non_idempotent = rng.bool();
        retry.budget = RetryBudget {
            ratio: ratios[rng.usize(..ratios.len())],
            min_per_sec: count(rng),
            ttl: duration(rng),
        };
        builder = builder.retry(retry);
    }
    if rng.bool() {
        let decrease = [0.5, 0.5, 0.5, 0.0, 1.0, -1.0, f64::NAN][rng.usize(..7)];
        let floor = [0.05, 0.05, 0.05, 0.0, 1e-300, 1.0, 2.0][rng.usize(..7)];
        builder = builder.adaptive(callshaper::lane::Adaptive {
            decrease,
            increase: [0.05, 0.05, 0.05, 0.0, 1.0, f64::INFINITY][rng.usize(..6)],
            floor,
        });
    }
    Ok((builder.build()?, max_pause))
}

/// What a hostile vendor puts in a header.
fn header_value(rng: &mut fastrand::Rng) -> String {
    let values = [
        "0",
        "1",
        "-1",
        "-99999999999999999999",
        "18446744073709551615",
        "99999999999999999999999999",
        "1e308",
        "NaN",
        "inf",
        "",
        "garbage",
        "1.5",
        "Fri, 31 Dec 9999 23:59:59 GMT",
        "Thu, 01 Jan 1970 00:00:00 GMT",
        "9999-12-31T23:59:59Z",
        "0000-01-01T00:00:00Z",
        "99999999h",
        "6m0s",
        "\"default\";q=1;w=18446744073709551615",
        "\"default\";q=0;w=0",
        "\"d\";q=18446744073709551615;w=1",
        "\"d\";r=0;t=18446744073709551615",
        "40/40",
        "18446744073709551615/0",
    ];
    values[rng.usize(..values.len())].to_owned()
}

const HEADERS: &[&str] = &[
    "date",
    "x-ratelimit-reset-after",
    "retry-after",
    "retry-after-ms",
    "x-amz-retry-after",
    "grpc-retry-pushback-ms",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-ratelimit-reset-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-limit-requests",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-requests-remaining",
    "ratelimit-policy",
    "ratelimit",
    "ratelimit-reset",
    "ratelimit-remaining",
    "x-shopify-shop-api-call-limit",
];

/// A vendor answering each request with a random status and random
/// rate-limit headers.
async fn hostile_vendor(seed: u64) -> MockServer {
    let server = MockServer::start().await;
    let rng = Arc::new(Mutex::new(fastrand::Rng::with_seed(seed)));
    Mock::given(any())
        .respond_with(move |_: &Request| {
            let mut rng = rng.lock().unwrap();
            let status = [200, 200, 429, 503, 500, 403][rng.usize(..6)];
            let mut response = ResponseTemplate::new(status);
            for _ in 0..rng.usize(0..4) {
                let name = HEADERS[rng.usize(..HEADERS.len())];
                response = response.insert_header(name, header_value(&mut rng).as_str());
            }
            response
        })
        .mount(&server)
        .await;
    server
}

/// Settings alone: every draw builds, or is refused with a typed error
/// naming the field, and never panics.
#[tokio::test(start_paused = true)]
async fn hostile_settings_build_or_are_refused() {
    let client = reqwest::Client::new();
    let mut refused = 0;
    for seed in 0..BUILDS {
        let mut rng = fastrand::Rng::with_seed(seed);
        if let Err(error) = random_shaper(&mut rng, &client) {
            assert!(error.to_string().starts_with("invalid `"), "{error}");
            refused += 1;
        }
    }
    eprintln!("{BUILDS} settings drawn: {refused} refused, 0 panics");
    assert!(refused > 0 && refused < BUILDS);
}

#[tokio::test(start_paused = true)]
async fn hostile_settings_and_headers_never_panic_or_stall() {
    let client = reqwest::Client::new();
    let mut sent = 0;
    let mut draws = 0u64;
    for _ in 0..CASES {
        // Draw settings until they build: the traffic runs on each case.
        let (shaper, max_pause, mut rng) = loop {
            let mut rng = fastrand::Rng::with_seed(draws);
            draws += 1;
            if let Ok((shaper, max_pause)) = random_shaper(&mut rng, &client) {
                break (shaper, max_pause, rng);
            }
        };
        let seed = draws - 1;
        let vendor = hostile_vendor(seed).await;
        let started = tokio::time::Instant::now();
        let tasks: Vec<_> = (0..4)
            .map(|i| {
                let mut request = shaper.get(format!("{}/r/{i}", vendor.uri()));
                if rng.bool() {
                    // Costs a quota can take in a finite time (a cost past
                    // every capacity is refused; `lane` tests cover it).
                    request = request.cost([0, 1, 7, 1_000][rng.usize(..4)]);
                }
                if rng.bool() {
                    request = request.max_wait(duration(&mut rng));
                }
                if rng.bool() {
                    request = request.priority(Priority::Batch);
                }
                let report = [None, Some(0), Some(u64::MAX)][rng.usize(..3)];
                tokio::spawn(async move {
                    let outcome = request.send().await;
                    if let (Ok(response), Some(actual)) = (&outcome, report)
                        && let Some(settle) = response.extensions().get::<Settle>()
                    {
                        settle.report(actual);
                    }
                    outcome
                })
            })
            .collect();
        let outcomes: Vec<Result<reqwest::Response, Error>> = common::join_all(tasks).await;
        let answered = outcomes.iter().filter(|o| o.is_ok()).count();
        sent += outcomes.len();
        // Nothing is lost: every answer the caller got was one the vendor
        // gave, and no request is left waiting in a lane.
        let arrived = vendor.received_requests().await.map_or(0, |r| r.len());
        assert!(
            answered <= arrived,
            "seed {seed}: {answered} answers, {arrived} sends"
        );
        for lane in shaper.lanes() {
            assert_eq!(lane.queued, 0, "seed {seed}: {lane:?}");
        }
        // No overflowed or saturated instant leaks into a wait: the
        // longest window here is a day, the largest cost 1,000, a report
        // settles at most a bucket's capacity, which refills within 366
        // days (a build refuses a slower one), so only a `max_pause` the
        // caller set beyond it lets a vendor's hint pause for years.
        let elapsed = started.elapsed();
        if max_pause < YEARS {
            assert!(elapsed < YEARS, "seed {seed}: a stall of {elapsed:?}");
        }
        shaper.shutdown();
    }
    eprintln!("{CASES} shapers with hostile settings and vendors: {sent} requests, 0 panics");
}

/// A vendor's usage, or a caller's report, of `u64::MAX` settles at the
/// bucket's capacity, and a build refuses a bucket that takes longer than
/// the longest window (366 days) to refill: each request settled so puts
/// the lane at most one refill in debt. A bucket of `u64::MAX` refilled 2
/// a second was built, and two such reports held its lane 68 years.
#[tokio::test(start_paused = true)]
async fn a_cost_settled_past_every_bound_costs_at_most_a_refill() {
    let refused = Shaper::builder()
        .quota(Quota::token_bucket(u64::MAX, 2, Duration::from_secs(1)).per_cost())
        .build()
        .expect_err("a bucket that refills in 292 billion years");
    assert!(refused.to_string().contains("capacity"), "{refused}");

    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let shaper = Shaper::builder()
        .quota(Quota::token_bucket(366, 1, DAY).per_cost())
        .transport(HoldClock(reqwest::Client::new()))
        .build()
        .unwrap();
    for _ in 0..2 {
        let response = shaper.get(server.uri()).cost(1).send().await.unwrap();
        let settle = response.extensions().get::<Settle>().unwrap();
        settle.report(u64::MAX);
    }
    let started = tokio::time::Instant::now();
    let response = shaper.get(server.uri()).cost(1).send().await.unwrap();
    assert_eq!(response.status(), 200);
    // Each settle charged 365 days more: two refills in debt, less the
    // bucket's burst of 366 days, is 367 days.
    let waited = started.elapsed();
    assert!(
        waited > 366 * DAY && waited < 368 * DAY,
        "waited {} days",
        waited.as_secs() / 86_400
    );
}

/// The meters are public (`Quota::meter`, each algorithm's `new`) and
/// unvalidated there: a caller may build one from any numbers a quota
/// refuses at build. Every built-in meter takes any of them, and any cost
/// and instant after, without a panic: a sliding window counter's
/// `Duration::MAX` window overflowed the instant it computed, and a
/// sliding log summed its costs past `u64::MAX` to predict a wait.
#[tokio::test(start_paused = true)]
async fn every_built_in_meter_takes_any_numbers() {
    let counts = [0, 1, 7, u32::MAX];
    let pers = [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_secs(1),
        Duration::from_secs(400 * 86_400),
        Duration::MAX,
    ];
    let now = tokio::time::Instant::now();
    let instants = [
        now - Duration::from_secs(1_000),
        now,
        now + Duration::from_nanos(1),
        now + Duration::from_secs(1),
        now + Duration::from_secs(200 * 365 * 86_400),
    ];
    let mut cases = 0;
    for count in counts {
        for per in pers {
            for headroom in [Duration::ZERO, Duration::from_millis(5), Duration::MAX] {
                let mut quotas = vec![
                    Quota::leaky_bucket(count, per),
                    Quota::fixed_window(count, per),
                    Quota::sliding_log(count, per),
                    Quota::sliding_window(count, per),
                ];
                for capacity in [0, 1, 1_000, u64::MAX] {
                    quotas.push(Quota::token_bucket(capacity, count, per));
                }
                for quota in quotas {
                    let _ = (quota.rate().interval(headroom), quota.rate().per_second());
                    let mut meter = quota.meter(headroom, now);
                    let capacity = meter.capacity();
                    let costs = [0, 1, 2, capacity, u64::MAX];
                    let mut rng = fastrand::Rng::with_seed(cases);
                    for _ in 0..200 {
                        let at = instants[rng.usize(..instants.len())];
                        let cost = costs[rng.usize(..costs.len())];
                        match rng.u8(..6) {
                            0 => {
                                let _ = meter.earliest(cost, at);
                            }
                            1 => meter.commit(cost, at),
                            2 => meter.settle(cost, costs[rng.usize(..costs.len())], at),
                            3 => {
                                let _ = meter.eta(rng.u64(..), cost, at);
                            }
                            4 => {
                                let _ = meter.eta(u64::MAX, cost, at);
                            }
                            _ => {
                                let _ = (meter.is_idle(at), meter.interval());
                            }
                        }
                    }
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, 4 * 5 * 3 * 8);
}
