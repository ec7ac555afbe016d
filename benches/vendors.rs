//! The zoo bench: every test vendor modelled on a real one, with the client
//! declared at the vendor's true quota and at 1.5 times it, callshaper
//! beside what a user would write instead: governor as the pacer and a
//! retry loop that honours `Retry-After` (else backs off from 100 ms).
//!
//! ```text
//! cargo bench --bench vendors
//! ```
//!
//! Real HTTP on loopback and real time (governor keeps its own clock), so
//! the vendors are scaled to about 100 requests a second. Columns: 429s
//! (and 403s) the vendor answered, attempts per request, the share of the
//! quota the vendor made available that was used over the whole run and
//! after the first window (its burst, and for a client declared too fast,
//! the refusal that teaches it), and the most requests in any window of
//! the vendor's against its limit (a bucket's limit is its burst plus a
//! window's refill).

use std::num::NonZeroU32;
use std::time::Duration;

use callshaper::testing::Vendor;
use callshaper::{LanePolicy, Quota, Shaper};
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
    ]
}

/// `quota` half as large again (count and burst).
fn overstated(quota: &Quota) -> Quota {
    let rate = quota.rate();
    match quota.algorithm {
        callshaper::Algorithm::TokenBucket { capacity, .. } => {
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
        "  {:<10} {:<7} {:<22} {:>5} {:>9} {:>8} {:>8} {:>12}",
        "vendor", "declared", "client", "429s", "attempts", "quota", "after", "max/window"
    );
    for case in zoo() {
        for (declared, quota) in [
            ("true", case.quota.clone()),
            ("1.5x", overstated(&case.quota)),
        ] {
            let callshaper = rt.block_on(with_callshaper(&case, quota.clone()));
            print_row(&case, declared, "callshaper", callshaper);
            let governor = rt.block_on(with_governor(&case, &quota));
            print_row(&case, declared, "governor + retry loop", governor);
        }
    }
    rt.block_on(shared_quota());
}

/// A gateway of 100/s shared with a consumer we don't control, sending
/// 30/s on its own: the lane, declared at the whole quota, should use what
/// the other leaves (70/s) and meet few 429s.
async fn shared_quota() {
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
        .rate(100, SECOND)
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
        "\n  shared quota (a gateway of 100/s, another consumer at 30/s): callshaper declared 100/s sent {OURS} in {:.2} s, {:.1} % of the 70/s left; 429s: ours {our_429} ({:.1} % of our requests), the other's {their_429}",
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
    let ideal = case.interval * case.n.saturating_sub(case.burst) as u32;
    let used = ideal.as_secs_f64() / run.took.as_secs_f64();
    let accepted: Vec<Duration> = arrivals
        .iter()
        .filter(|a| a.status == 200)
        .map(|a| a.at)
        .collect();
    // The first window: a bucket's burst, else a window's limit.
    let first_window = if case.burst > 1 {
        case.burst
    } else {
        case.limit
    };
    let rest = &accepted[first_window.min(accepted.len())..];
    let after = match (rest.first(), rest.last()) {
        (Some(first), Some(last)) if last > first => {
            (case.interval * (rest.len() as u32 - 1)).as_secs_f64() / (*last - *first).as_secs_f64()
        }
        _ => 0.0,
    };
    println!(
        "  {:<10} {:<7} {:<22} {:>5} {:>9.2} {:>7.1}% {:>7.1}% {:>7}/{:<4}",
        case.name,
        declared,
        client,
        refused,
        arrivals.len() as f64 / case.n as f64,
        used * 100.0,
        after * 100.0,
        run.vendor.max_in_any_window(case.window),
        case.limit,
    );
}

async fn with_callshaper(case: &Case, quota: Quota) -> Run {
    let vendor = (case.vendor)().start().await;
    let shaper = Shaper::builder()
        .policy(LanePolicy::with_quotas([quota]))
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

/// What a user writes without callshaper: governor at the declared quota
/// (its burst as the bucket's capacity), and on a 429 or 403, wait the
/// `Retry-After` (else 100 ms doubling) and go through governor again.
async fn with_governor(case: &Case, quota: &Quota) -> Run {
    let vendor = (case.vendor)().start().await;
    let rate = quota.rate();
    let burst = match quota.algorithm {
        callshaper::Algorithm::TokenBucket { capacity, .. } => capacity as u32,
        _ => 1,
    };
    let period = rate.per / rate.count;
    let limiter = std::sync::Arc::new(governor::RateLimiter::direct(
        governor::Quota::with_period(period)
            .expect("a period")
            .allow_burst(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN)),
    ));
    let client = reqwest::Client::new();
    let started = Instant::now();
    let calls: Vec<_> = (0..case.n)
        .map(|i| {
            let (limiter, client) = (limiter.clone(), client.clone());
            let url = format!("{}/r/{i}", vendor.uri());
            tokio::spawn(async move {
                let mut backoff = Duration::from_millis(100);
                loop {
                    limiter.until_ready().await;
                    let response = client.get(&url).send().await.expect("a response");
                    let status = response.status().as_u16();
                    if status != 429 && status != 403 {
                        return;
                    }
                    let hint = response
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok()?.parse::<f64>().ok())
                        .map(Duration::from_secs_f64);
                    tokio::time::sleep(hint.unwrap_or(backoff)).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
            })
        })
        .collect();
    for call in calls {
        call.await.expect("a caller panicked");
    }
    Run {
        vendor,
        took: started.elapsed(),
    }
}
