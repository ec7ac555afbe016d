//! The zoo: every test vendor modelled on a real one, each with the lane
//! declared at its true quota. 0 × 429, at least 98 % of the quota the
//! vendor makes available, and never more than it allows.

mod common;

use std::time::Duration;

use callshaper::Quota;
use callshaper::testing::Vendor;
use common::{SECOND, burst, shaper_with};

/// How a vendor makes its quota available: a steady rate, or a burst of
/// `capacity` then a refill of one every `interval`.
enum Supply {
    Steady { interval: Duration },
    Bucket { capacity: usize, interval: Duration },
}

impl Supply {
    /// The least time `n` requests can take at this vendor.
    fn ideal(&self, n: usize) -> Duration {
        match *self {
            Supply::Steady { interval } => interval * (n as u32 - 1),
            Supply::Bucket { capacity, interval } => interval * n.saturating_sub(capacity) as u32,
        }
    }
}

struct Case {
    name: &'static str,
    vendor: Vendor,
    quota: Quota,
    supply: Supply,
    n: usize,
}

fn zoo() -> Vec<Case> {
    let minute = Duration::from_secs(60);
    let steady = |count: u32, per: Duration| Supply::Steady {
        interval: per / count,
    };
    vec![
        Case {
            name: "gateway",
            vendor: Vendor::gateway(10, SECOND),
            quota: Quota::leaky_bucket(10, SECOND),
            supply: steady(10, SECOND),
            n: 60,
        },
        Case {
            name: "github",
            vendor: Vendor::github(10, 2 * SECOND),
            quota: Quota::leaky_bucket(10, 2 * SECOND),
            supply: steady(10, 2 * SECOND),
            n: 60,
        },
        Case {
            name: "openai",
            vendor: Vendor::openai(60),
            quota: Quota::token_bucket(60, 60, minute),
            supply: Supply::Bucket {
                capacity: 60,
                interval: SECOND,
            },
            n: 120,
        },
        Case {
            name: "anthropic",
            vendor: Vendor::anthropic(50),
            quota: Quota::token_bucket(50, 50, minute),
            supply: Supply::Bucket {
                capacity: 50,
                interval: minute / 50,
            },
            n: 100,
        },
        Case {
            name: "ietf",
            vendor: Vendor::ietf(10, SECOND),
            quota: Quota::leaky_bucket(10, SECOND),
            supply: steady(10, SECOND),
            n: 60,
        },
        Case {
            name: "shopify",
            vendor: Vendor::shopify(),
            quota: Quota::token_bucket(40, 2, SECOND),
            supply: Supply::Bucket {
                capacity: 40,
                interval: SECOND / 2,
            },
            n: 100,
        },
        Case {
            name: "discord",
            vendor: Vendor::discord(5, 5 * SECOND),
            quota: Quota::leaky_bucket(5, 5 * SECOND),
            supply: steady(5, 5 * SECOND),
            n: 30,
        },
        Case {
            name: "stripe",
            vendor: Vendor::stripe(25, SECOND),
            quota: Quota::leaky_bucket(25, SECOND),
            supply: steady(25, SECOND),
            n: 100,
        },
    ]
}

#[tokio::test(start_paused = true)]
async fn every_zoo_vendor_at_its_true_quota() {
    for case in zoo() {
        let vendor = case.vendor.start().await;
        let shaper = shaper_with(case.quota.clone()).build().unwrap();
        let started = tokio::time::Instant::now();
        for outcome in burst(&shaper, &vendor.uri(), case.n).await {
            assert!(outcome.unwrap().status().is_success(), "{}", case.name);
        }
        let took = started.elapsed();
        let ideal = case.supply.ideal(case.n);
        let used = ideal.as_secs_f64() / took.as_secs_f64();
        println!(
            "{:<10} {} requests in {:.3} s (ideal {:.3} s): {:.1} % of the quota, {} × 429",
            case.name,
            case.n,
            took.as_secs_f64(),
            ideal.as_secs_f64(),
            used * 100.0,
            vendor.throttled()
        );
        assert_eq!(vendor.throttled(), 0, "{}", case.name);
        assert_eq!(
            vendor.arrivals().len(),
            case.n,
            "{}: each sent once",
            case.name
        );
        assert!(
            used >= 0.98,
            "{}: {:.1} % of the quota",
            case.name,
            used * 100.0
        );
    }
}

/// The lane declared at 1.5 times each vendor's quota: a bucket's burst
/// waits for the vendor's first answer and sends no more than it says is
/// left, the first refusal teaches the lane the real quota (for Shopify,
/// whose bucket never says its rate, its levels do), so the vendor answers
/// at most two 429s in a minute, and the lane uses at least 90 % of the
/// quota after its first window.
#[tokio::test(start_paused = true)]
async fn every_zoo_vendor_with_the_lane_declared_too_fast() {
    for case in zoo() {
        let faster = overstated(&case.quota);
        let vendor = case.vendor.start().await;
        let shaper = shaper_with(faster.clone()).build().unwrap();
        for outcome in burst(&shaper, &vendor.uri(), case.n).await {
            assert!(outcome.unwrap().status().is_success(), "{}", case.name);
        }
        let arrivals = vendor.arrivals();
        let refused = arrivals.iter().filter(|a| a.status != 200).count();
        let accepted: Vec<Duration> = arrivals
            .iter()
            .filter(|a| a.status == 200)
            .map(|a| a.at)
            .collect();
        // After the first window (the vendor's first burst, and the pause
        // that teaches the lane): what a perfect client could have done
        // from there, at the vendor's steady rate.
        let rest = &accepted[first_window(&case.quota)..];
        let steady = match case.supply {
            Supply::Steady { interval } | Supply::Bucket { interval, .. } => interval,
        };
        let ideal = steady * (rest.len() as u32 - 1);
        let took = *rest.last().unwrap() - rest[0];
        let used = ideal.as_secs_f64() / took.as_secs_f64();
        println!(
            "{:<10} at 1.5×: {refused} refused, then {:.1} % of the quota ({} in {:.3} s)",
            case.name,
            used * 100.0,
            rest.len(),
            took.as_secs_f64(),
        );
        // A lane declared with a larger burst waits for the vendor's first
        // answer before it, and sends no more than the vendor says is left.
        assert!(refused <= 2, "{}: {refused} refused", case.name);
        assert!(
            used >= 0.90,
            "{}: {:.1} % after the first window",
            case.name,
            used * 100.0
        );
    }
}

/// How many requests the vendor takes in its first window: a window's
/// count, or a bucket's capacity.
fn first_window(quota: &Quota) -> usize {
    match quota.algorithm {
        callshaper::meters::Algorithm::TokenBucket { capacity, .. } => capacity as usize,
        _ => quota.rate().count as usize,
    }
}

/// `quota` with its count (and a bucket's capacity) half as large again.
fn overstated(quota: &Quota) -> Quota {
    let rate = quota.rate();
    let count = rate.count * 3 / 2;
    match quota.algorithm {
        callshaper::meters::Algorithm::TokenBucket { capacity, .. } => {
            Quota::token_bucket(capacity * 3 / 2, count, rate.per)
        }
        _ => Quota::leaky_bucket(count, rate.per),
    }
}

/// A vendor dropped by a task that has spent its cooperative budget (a
/// test that awaited many ready results in one go) goes away. wiremock's
/// server checks itself on drop with a blocking executor, and inside such
/// a task tokio's locks answer "not yet" and wake at once: it spun
/// forever (`tests/fleet.rs` hung in CI once, at the end of a fleet run).
#[test]
fn a_vendor_dropped_by_a_task_that_spent_its_budget_goes_away() {
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let vendor = Vendor::strict(10, SECOND).start().await;
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            for i in 0..1_000 {
                tx.send(i).unwrap();
            }
            while tokio::task::coop::has_budget_remaining() {
                rx.recv().await;
            }
            drop(vendor);
        });
        let _ = done.send(());
    });
    ended
        .recv_timeout(Duration::from_secs(10))
        .expect("the vendor went away");
}
