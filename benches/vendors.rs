//! The zoo bench: every test vendor modelled on a real one, with the client
//! declared at the vendor's true quota and at 1.5 times it, callshaper
//! beside what a user would write instead:
//!
//! - governor, leaky-bucket or tower's `RateLimit` as the pacer, each
//!   with a retry loop that honours `Retry-After` (else backs off from
//!   100 ms) and goes through the pacer again;
//! - reqwest-retry alone: no pacer, its exponential backoff (1 s, then
//!   doubling, 3 retries) on every 429, 5xx or 408 (it does not read
//!   `Retry-After`).
//!
//! ```text
//! cargo bench --bench vendors
//! cargo bench --bench vendors -- github shopify   # those vendors only
//! ```
//!
//! Real HTTP on loopback and real time (governor keeps its own clock), so
//! the vendors are scaled to about 100 requests a second. Columns: 429s
//! (and 403s) the vendor answered, attempts per request, the share of the
//! quota the vendor made available that its accepted requests used over the whole run and
//! after the first window (its burst, and for a client declared too fast,
//! the refusal that teaches it; what a bucket still held then counts as
//! made available), and the most requests in any window of
//! the vendor's against its limit (a bucket's limit is its burst plus a
//! window's refill), and the requests that never got a 200 (a retry
//! policy that gave up, or a run cut off after a minute).

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use callshaper::testing::Vendor;
use callshaper::{Quota, Shaper};
use tokio::time::Instant;

const SECOND: Duration = Duration::from_secs(1);

struct Case {
    name: &'static str,
    vendor: fn() -> Vendor,
    /// The vendor's true quota, as the client declares it.
    quota: Quota,
    /// A burst the vendor takes at once, then one every `interval`.
    burst: usize,
    interval: Duration,
    /// The vendor's window and limit, to check the most in any window.
    window: Duration,
    limit: usize,
    n: usize,
}

fn zoo() -> Vec<Case> {
    let steady = |name, vendor, n| Case {
        name,
        vendor,
        quota: Quota::leaky_bucket(100, SECOND),
        burst: 1,
        interval: SECOND / 100,
        window: SECOND,
        limit: 100,
        n,
    };
    // OpenAI's and Anthropic's limit is both the bucket and the count per
    // window ("60 RPM": 60 at once, refilled 60 a minute).
    let bucket = |name, vendor| Case {
        name,
        vendor,
        quota: Quota::token_bucket(100, 100, SECOND),
        burst: 100,
        interval: SECOND / 100,
        window: SECOND,
        limit: 200,
        n: 500,
    };
    vec![
        steady("gateway", || Vendor::gateway(100, SECOND), 300),
        steady("github", || Vendor::github(100, SECOND), 300),
        bucket("openai", || {
            Vendor::token_bucket(100, 100, SECOND).speaking(callshaper::testing::Style::OpenAi)
        }),
        bucket("anthropic", || {
            Vendor::token_bucket(100, 100, SECOND).speaking(callshaper::testing::Style::Anthropic)
        }),
        steady("ietf", || Vendor::ietf(100, SECOND), 300),
        Case {
            name: "shopify",
            vendor: || {
                Vendor::token_bucket(40, 20, SECOND).speaking(callshaper::testing::Style::Shopify)
            },
            quota: Quota::token_bucket(40, 20, SECOND),
            burst: 40,
            interval: SECOND / 20,
            window: SECOND,
            limit: 60,
            n: 160,
        },
        steady("discord", || Vendor::discord(100, SECOND), 300),
        steady("stripe", || Vendor::stripe(100, SECOND), 300),
        // nginx's `limit_req` without burst, `limit_req_status 429`, and a
        // GCRA with a hundredth of its interval as tolerance: both measure
        // the spacing of requests, not a count per window.
        steady("nginx", || Vendor::nginx(100, 0).refusing_with(429), 300),
        steady(
            "gcra",
            || Vendor::gcra(100, SECOND, Duration::from_micros(100)),
            300,
        ),
    ]
}

/// `quota` half as large again (count and burst).
fn overstated(quota: &Quota) -> Quota {
    let rate = quota.rate();
    match quota.algorithm {
        callshaper::meters::Algorithm::TokenBucket { capacity, .. } => {
            Quota::token_bucket(capacity * 3 / 2, rate.count * 3 / 2, rate.per)
        }
        _ => Quota::leaky_bucket(rate.count * 3 / 2, rate.per),
    }
}

fn main() {
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    println!(
        "  {:<10} {:<7} {:<26} {:>5} {:>9} {:>8} {:>8} {:>12} {:>7}",
        "vendor",
        "declared",
        "client",
        "429s",
        "attempts",
        "quota",
        "after",
        "max/window",
        "failed"
    );
    // Vendor names on the command line pick those; none: every vendor.
    let picked: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    for case in zoo()
        .into_iter()
        .filter(|case| picked.is_empty() || picked.iter().any(|p| p == case.name))
    {
        for (declared, quota) in [
            ("true", case.quota.clone()),
            ("1.5x", overstated(&case.quota)),
        ] {
            let callshaper = rt.block_on(with_callshaper(&case, quota.clone()));
            print_row(&case, declared, "callshaper", callshaper);
            let governor = rt.block_on(with_pacer(&case, governor(&quota)));
            print_row(&case, declared, "governor + retry loop", governor);
            let bucket = rt.block_on(with_pacer(&case, leaky_bucket(&quota)));
            print_row(&case, declared, "leaky-bucket + retry loop", bucket);
            let tower = rt.block_on(with_tower(&case, &quota));
            print_row(&case, declared, "tower rate_limit + retry", tower);
            let retry = rt.block_on(with_reqwest_retry(&case));
            print_row(&case, declared, "reqwest-retry", retry);
        }
        // What strict spacing costs where the vendor counts, and what it
        // saves where it measures spacing.
        if case.burst == 1 {
            let strict = case.quota.clone().strict();
            let callshaper = rt.block_on(with_callshaper(&case, strict));
            print_row(&case, "strict", "callshaper", callshaper);
        }
    }
    if picked.is_empty() || picked.iter().any(|p| p == "shared") {
        rt.block_on(shared_quota(100));
        rt.block_on(shared_quota(150));
    }
}

/// A gateway of 100/s shared with a consumer we don't control, sending
/// 30/s on its own: the lane, declared at the whole quota (`declared`
/// 100) or half again above it (150), should use what the other leaves
/// (70/s) and meet few 429s.
async fn shared_quota(declared: u32) {
    const OURS: usize = 350;
    let vendor = Vendor::gateway(100, SECOND).start().await;
    let other = {
        let uri = vendor.uri();
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut every = tokio::time::interval(SECOND / 30);
            loop {
                every.tick().await;
                let _ = client.get(format!("{uri}/other")).send().await;
            }
        })
    };
    tokio::time::sleep(SECOND).await;
    let shaper = Shaper::builder()
        .rate(declared, SECOND)
        .build()
        .expect("a valid shaper");
    let started = Instant::now();
    let calls: Vec<_> = (0..OURS)
        .map(|i| tokio::spawn(shaper.get(format!("{}/r/{i}", vendor.uri())).send()))
        .collect();
    for call in calls {
        let response = call.await.expect("a caller panicked").expect("a response");
        assert!(response.status().is_success());
    }
    let took = started.elapsed();
    other.abort();
    let arrivals = vendor.arrivals();
    let ours = |a: &&callshaper::testing::Arrival| a.path.starts_with("/r/");
    let our_429 = arrivals
        .iter()
        .filter(ours)
        .filter(|a| a.status == 429)
        .count();
    let their_429 = arrivals
        .iter()
        .filter(|a| !a.path.starts_with("/r/") && a.status == 429)
        .count();
    let left = (OURS - 1) as f64 / 70.0;
    println!(
        "\n  shared quota (a gateway of 100/s, another consumer at 30/s): callshaper declared {declared}/s sent {OURS} in {:.2} s, {:.1} % of the 70/s left; 429s: ours {our_429} ({:.1} % of our requests), the other's {their_429}",
        took.as_secs_f64(),
        left / took.as_secs_f64() * 100.0,
        our_429 as f64 * 100.0 / OURS as f64,
    );
}

struct Run {
    vendor: Vendor,
    took: Duration,
}

fn print_row(case: &Case, declared: &str, client: &str, run: Run) {
    let arrivals = run.vendor.arrivals();
    let refused = arrivals.iter().filter(|a| a.status != 200).count();
    let accepted: Vec<Duration> = arrivals
        .iter()
        .filter(|a| a.status == 200)
        .map(|a| a.at)
        .collect();
    // Only what the vendor accepted counts as quota used: a request that
    // ended on a refusal used nothing.
    let ideal = case.interval * accepted.len().saturating_sub(case.burst) as u32;
    let used = ideal.as_secs_f64() / run.took.as_secs_f64();
    // The first window: a bucket's burst, else a window's limit.
    let first_window = if case.burst > 1 {
        case.burst
    } else {
        case.limit
    };
    let from = first_window.min(accepted.len());
    let rest = &accepted[from..];
    let after = match (rest.first(), rest.last()) {
        // A bucket may still hold units when the rest begins: they were
        // made available too (else a lane that spread its first burst
        // would show more than the refill rate).
        (Some(first), Some(last)) if case.burst > 1 && last > first => {
            let held = bucket_level(case, &accepted[..from], *first);
            let refilled = (*last - *first).as_secs_f64() / case.interval.as_secs_f64();
            rest.len() as f64 / (held + refilled)
        }
        (Some(first), Some(last)) if last > first => {
            (case.interval * (rest.len() as u32 - 1)).as_secs_f64() / (*last - *first).as_secs_f64()
        }
        _ => 0.0,
    };
    println!(
        "  {:<10} {:<7} {:<26} {:>5} {:>9.2} {:>7.1}% {:>7.1}% {:>7}/{:<4} {:>7}",
        case.name,
        declared,
        client,
        refused,
        arrivals.len() as f64 / case.n as f64,
        used * 100.0,
        after * 100.0,
        run.vendor.max_in_any_window(case.window),
        case.limit,
        case.n.saturating_sub(accepted.len()),
    );
}

/// The units a bucket vendor held at `at`, full at the start, after the
/// `accepted` requests before it and one unit refilled every interval.
fn bucket_level(case: &Case, accepted: &[Duration], at: Duration) -> f64 {
    let capacity = case.burst as f64;
    let refill = |from: Duration, to: Duration| {
        to.saturating_sub(from).as_secs_f64() / case.interval.as_secs_f64()
    };
    let (mut level, mut then) = (capacity, Duration::ZERO);
    for &arrival in accepted {
        level = (level + refill(then, arrival)).min(capacity) - 1.0;
        then = arrival;
    }
    (level + refill(then, at)).min(capacity)
}

async fn with_callshaper(case: &Case, quota: Quota) -> Run {
    let vendor = (case.vendor)().start().await;
    let shaper = Shaper::builder()
        .quota(quota)
        .build()
        .expect("a valid shaper");
    let started = Instant::now();
    let calls: Vec<_> = (0..case.n)
        .map(|i| tokio::spawn(shaper.get(format!("{}/r/{i}", vendor.uri())).send()))
        .collect();
    for call in calls {
        let response = call.await.expect("a caller panicked").expect("a response");
        assert!(response.status().is_success(), "{}", case.name);
    }
    Run {
        vendor,
        took: started.elapsed(),
    }
}

/// A pacer a user would reach for: waits until the next request may go.
type Pacer = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A quota's burst (a token bucket's capacity, else 1) and the spacing of
/// its rate.
fn burst_and_period(quota: &Quota) -> (u32, Duration) {
    let rate = quota.rate();
    let burst = match quota.algorithm {
        callshaper::meters::Algorithm::TokenBucket { capacity, .. } => {
            u32::try_from(capacity).unwrap_or(u32::MAX)
        }
        _ => 1,
    };
    (burst.max(1), rate.per / rate.count)
}

/// governor at the declared quota, its burst the bucket's capacity.
fn governor(quota: &Quota) -> Pacer {
    let (burst, period) = burst_and_period(quota);
    let limiter = Arc::new(governor::RateLimiter::direct(
        governor::Quota::with_period(period)
            .expect("a period")
            .allow_burst(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN)),
    ));
    Arc::new(move || {
        let limiter = limiter.clone();
        Box::pin(async move { limiter.until_ready().await })
    })
}

/// The leaky-bucket crate at the declared quota: a bucket of the burst,
/// full at the start, refilled one at a time.
fn leaky_bucket(quota: &Quota) -> Pacer {
    let (burst, period) = burst_and_period(quota);
    let limiter = Arc::new(
        leaky_bucket::RateLimiter::builder()
            .max(burst as usize)
            .initial(burst as usize)
            .refill(1)
            .interval(period)
            .build(),
    );
    Arc::new(move || {
        let limiter = limiter.clone();
        Box::pin(async move { limiter.acquire_one().await })
    })
}

/// After a 429 or 403: how long to wait, the `Retry-After` if it parses,
/// else `backoff`, which doubles for next time.
fn wait_after(response: &reqwest::Response, backoff: &mut Duration) -> Option<Duration> {
    let status = response.status().as_u16();
    if status != 429 && status != 403 {
        return None;
    }
    let hint = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse::<f64>().ok())
        .and_then(|s| Duration::try_from_secs_f64(s).ok());
    let wait = hint.unwrap_or(*backoff);
    *backoff = (*backoff * 2).min(Duration::from_secs(10));
    Some(wait)
}

/// What a user writes without callshaper: a pacer at the declared quota,
/// and on a 429 or 403, wait the `Retry-After` (else 100 ms doubling) and
/// go through the pacer again.
async fn with_pacer(case: &Case, pacer: Pacer) -> Run {
    let vendor = (case.vendor)().start().await;
    let client = reqwest::Client::new();
    let started = Instant::now();
    let calls: Vec<_> = (0..case.n)
        .map(|i| {
            let (pacer, client) = (pacer.clone(), client.clone());
            let url = format!("{}/r/{i}", vendor.uri());
            tokio::spawn(async move {
                let mut backoff = Duration::from_millis(100);
                loop {
                    pacer().await;
                    let response = client.get(&url).send().await.expect("a response");
                    match wait_after(&response, &mut backoff) {
                        Some(wait) => tokio::time::sleep(wait).await,
                        None => return,
                    }
                }
            })
        })
        .collect();
    finish(vendor, started, calls).await
}

/// tower's `RateLimit` (a fixed window of the quota's count per its
/// period) behind a `Buffer` shared by every caller, with the same retry
/// loop as `with_pacer` around it.
async fn with_tower(case: &Case, quota: &Quota) -> Run {
    use tower::{Service, ServiceExt};
    let vendor = (case.vendor)().start().await;
    let client = reqwest::Client::new();
    let rate = quota.rate();
    let service = tower::ServiceBuilder::new()
        .buffer(case.n)
        .rate_limit(u64::from(rate.count), rate.per)
        .service_fn(move |request: reqwest::Request| client.execute(request));
    let started = Instant::now();
    let calls: Vec<_> = (0..case.n)
        .map(|i| {
            let mut service = service.clone();
            let url: reqwest::Url = format!("{}/r/{i}", vendor.uri()).parse().expect("a url");
            tokio::spawn(async move {
                let mut backoff = Duration::from_millis(100);
                loop {
                    let request = reqwest::Request::new(reqwest::Method::GET, url.clone());
                    let ready = service.ready().await.expect("the buffer");
                    let response = ready.call(request).await.expect("a response");
                    match wait_after(&response, &mut backoff) {
                        Some(wait) => tokio::time::sleep(wait).await,
                        None => return,
                    }
                }
            })
        })
        .collect();
    finish(vendor, started, calls).await
}

/// reqwest-retry as its docs show it, and no pacer: every request at
/// once, a 429 retried after its exponential backoff (from 1 s, 3 times).
async fn with_reqwest_retry(case: &Case) -> Run {
    use reqwest_retry::policies::ExponentialBackoff;
    let vendor = (case.vendor)().start().await;
    let policy = ExponentialBackoff::builder().build_with_max_retries(3);
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(reqwest_retry::RetryTransientMiddleware::new_with_policy(
            policy,
        ))
        .build();
    let started = Instant::now();
    let calls: Vec<_> = (0..case.n)
        .map(|i| {
            let client = client.clone();
            let url = format!("{}/r/{i}", vendor.uri());
            // A request that ends on its last 429 is counted as failed.
            tokio::spawn(async move {
                client.get(&url).send().await.expect("a response");
            })
        })
        .collect();
    finish(vendor, started, calls).await
}

/// The longest a run may take: a client that would need longer (tower's
/// bursts against nginx, one accepted per window) is cut off there, and
/// its requests without a 200 count as failed.
const LONGEST: Duration = Duration::from_secs(60);

/// Wait for every caller of a run started at `started`, until [`LONGEST`].
async fn finish(vendor: Vendor, started: Instant, calls: Vec<tokio::task::JoinHandle<()>>) -> Run {
    for call in calls {
        let abort = call.abort_handle();
        match tokio::time::timeout_at(started + LONGEST, call).await {
            Ok(joined) => joined.expect("a caller panicked"),
            Err(_) => abort.abort(),
        }
    }
    Run {
        vendor,
        took: started.elapsed(),
    }
}
