//! What a released permit costs, what a queued request weighs, and how
//! precisely a lane paces: callshaper side by side with what a user would
//! pick instead (governor, leaky-bucket, tower's Buffer + RateLimit).
//!
//! ```text
//! cargo bench --bench permits
//! ```
//!
//! Plain `main` (no criterion) to keep the dependency tree lean; each figure
//! is the best of five runs.

use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Arc;

use std::time::{Duration, Instant};

use callshaper::lane::{Lane, LanePolicy};
use callshaper::testing::Vendor;
use callshaper::{Quota, Shaper};
use tower::{Service, ServiceExt};

// Its heap counting; this benchmark reads no resident set.
#[allow(dead_code)]
#[path = "common/memory.rs"]
mod memory;

/// Weighs a queued request.
#[global_allocator]
static GLOBAL: memory::Counting = memory::Counting;

/// Permits a run releases: twice leaky-bucket's starting balance (a
/// millisecond's worth at [`UNLIMITED`], a million), so that most of what
/// it measures is leaky-bucket refilling, as it does once it has run a
/// while. At 200,000 permits it never refilled and its figure was its
/// starting balance alone: 71-88 ns a permit with 64 tasks on one
/// limiter, 130-167 ns at 2 million (both counted by one heap counter
/// for every thread, before `memory.rs` kept one per thread).
const PERMITS: usize = 2_000_000;
const QUEUED: usize = 10_000;
/// Fast enough that no limiter ever has to wait: what is left is overhead.
const UNLIMITED: u32 = 1_000_000_000;

type Acquire = Arc<dyn Fn() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

struct Contender {
    name: &'static str,
    /// Builds a limiter at `count` per second and returns "acquire one".
    make: fn(u32) -> Acquire,
}

fn contenders() -> Vec<Contender> {
    vec![
        Contender {
            name: "callshaper Lane",
            make: |count| {
                let mut policy = LanePolicy::default();
                policy.headroom = Duration::ZERO;
                policy.queue_capacity = 1_000_000;
                let quota = Quota::leaky_bucket(count, Duration::from_secs(1));
                let lane = Arc::new(Lane::new("bench", [quota], policy).expect("a valid policy"));
                Arc::new(move || {
                    let lane = lane.clone();
                    Box::pin(async move {
                        drop(lane.acquire().await.expect("the lane is open"));
                    })
                })
            },
        },
        Contender {
            name: "governor until_ready",
            make: |count| {
                let quota = governor::Quota::per_second(NonZeroU32::new(count).expect("count > 0"));
                let limiter = Arc::new(governor::RateLimiter::direct(quota));
                Arc::new(move || {
                    let limiter = limiter.clone();
                    Box::pin(async move { limiter.until_ready().await })
                })
            },
        },
        Contender {
            name: "leaky-bucket (fair)",
            make: |count| {
                let per_ms = (count / 1000).max(1) as usize;
                let limiter = Arc::new(
                    leaky_bucket::RateLimiter::builder()
                        .initial(per_ms)
                        .max(per_ms)
                        .refill(per_ms)
                        .interval(Duration::from_millis(1))
                        .fair(true)
                        .build(),
                );
                Arc::new(move || {
                    let limiter = limiter.clone();
                    Box::pin(async move { limiter.acquire_one().await })
                })
            },
        },
        Contender {
            name: "tower Buffer+RateLimit",
            make: |count| {
                let service = tower::ServiceBuilder::new()
                    .buffer(1024)
                    .rate_limit(u64::from(count), Duration::from_secs(1))
                    .service(tower::service_fn(|()| async {
                        Ok::<(), std::convert::Infallible>(())
                    }));
                Arc::new(move || {
                    let mut service = service.clone();
                    Box::pin(async move {
                        let ready = service.ready().await.expect("the buffer is open");
                        ready.call(()).await.expect("infallible");
                    })
                })
            },
        },
    ]
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Nanoseconds per released permit with `tasks` tasks acquiring in a
/// loop, on one limiter, or on one each (`apart`: a lane per tenant).
fn cost_per_permit(make: fn(u32) -> Acquire, tasks: usize, apart: bool) -> f64 {
    let rt = runtime();
    rt.block_on(async {
        let shared = make(UNLIMITED);
        let per_task = PERMITS / tasks;
        let acquires: Vec<Acquire> = (0..tasks)
            .map(|_| {
                if apart {
                    make(UNLIMITED)
                } else {
                    shared.clone()
                }
            })
            .collect();
        let started = Instant::now();
        let handles: Vec<_> = acquires
            .into_iter()
            .map(|acquire| {
                tokio::spawn(async move {
                    for _ in 0..per_task {
                        acquire().await;
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.await.expect("a bench task panicked");
        }
        started.elapsed().as_nanos() as f64 / (per_task * tasks) as f64
    })
}

/// Heap bytes per request waiting in the limiter (task and future
/// included), and the same minus a task parked on an empty future.
fn bytes_per_queued(make: fn(u32) -> Acquire) -> (f64, f64) {
    let rt = runtime();
    rt.block_on(async {
        // One per hour: after the first, every acquire waits.
        let acquire = make(1);
        acquire().await;
        let baseline = weigh(|| Box::pin(std::future::pending::<()>())).await;
        let queued = weigh(move || acquire()).await;
        (queued, queued - baseline)
    })
}

async fn weigh(make: impl Fn() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>) -> f64 {
    let before = memory::heap();
    let handles: Vec<_> = (0..QUEUED).map(|_| tokio::spawn(make())).collect();
    // Let every task reach its wait.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = memory::heap();
    for handle in &handles {
        handle.abort();
    }
    for handle in handles {
        let _ = handle.await;
    }
    (after - before) as f64 / QUEUED as f64
}

fn best_of<T: PartialOrd + Copy>(runs: usize, mut measure: impl FnMut() -> T) -> T {
    let mut best = measure();
    for _ in 1..runs {
        let next = measure();
        if next < best {
            best = next;
        }
    }
    best
}

/// 1,000 requests through a 200/s lane at a strict 200/s vendor, real HTTP.
fn precision() {
    const N: usize = 1_000;
    const RATE: u32 = 200;
    let rt = runtime();
    rt.block_on(async {
        let ideal = Duration::from_secs_f64((N - 1) as f64 / f64::from(RATE));
        println!("\nPacing precision: {N} requests, {RATE}/s lane, strict {RATE}/s vendor, real HTTP on loopback");
        println!("  ideal (first to last arrival): {:.3} s", ideal.as_secs_f64());

        // The default lane, then strict spacing (each send a full interval
        // after the last that went): what strict costs where the vendor
        // counts.
        let per_second = Quota::leaky_bucket(RATE, Duration::from_secs(1));
        for (name, quota) in [
            ("callshaper Shaper", per_second.clone()),
            ("callshaper, strict", per_second.strict()),
        ] {
            let vendor = Vendor::strict(RATE as usize, Duration::from_secs(1)).start().await;
            let shaper = Shaper::builder()
                .quota(quota)
                .build()
                .expect("a valid shaper");
            let handles: Vec<_> = (0..N)
                .map(|i| tokio::spawn(shaper.get(format!("{}/r/{i}", vendor.uri())).send()))
                .collect();
            for handle in handles {
                handle.await.expect("a caller panicked").expect("a response");
            }
            report(name, &vendor, ideal);
        }

        // The naive pacer: sleep one interval between releases.
        let vendor = Vendor::strict(RATE as usize, Duration::from_secs(1)).start().await;
        let client = reqwest::Client::new();
        let mut calls = Vec::with_capacity(N);
        for i in 0..N {
            calls.push(tokio::spawn(client.get(format!("{}/r/{i}", vendor.uri())).send()));
            tokio::time::sleep(Duration::from_secs(1) / RATE).await;
        }
        for call in calls {
            call.await.expect("a caller panicked").expect("a response");
        }
        report("sleep per release", &vendor, ideal);

        // governor at the same quota, no burst, as a pacer.
        let vendor = Vendor::strict(RATE as usize, Duration::from_secs(1)).start().await;
        let quota = governor::Quota::per_second(NonZeroU32::new(RATE).expect("rate > 0"))
            .allow_burst(NonZeroU32::MIN);
        let limiter = governor::RateLimiter::direct(quota);
        let mut calls = Vec::with_capacity(N);
        for i in 0..N {
            limiter.until_ready().await;
            calls.push(tokio::spawn(client.get(format!("{}/r/{i}", vendor.uri())).send()));
        }
        for call in calls {
            call.await.expect("a caller panicked").expect("a response");
        }
        report("governor until_ready", &vendor, ideal);
    });
}

fn report(name: &str, vendor: &Vendor, ideal: Duration) {
    let arrivals = vendor.arrivals();
    let span = match (arrivals.first(), arrivals.last()) {
        (Some(first), Some(last)) => last.at - first.at,
        _ => Duration::ZERO,
    };
    println!(
        "  {name:<24} {:.3} s ({:+.2}% of ideal, {:.1}% of quota), 429s: {}, max in any 1 s: {}",
        span.as_secs_f64(),
        (span.as_secs_f64() / ideal.as_secs_f64() - 1.0) * 100.0,
        ideal.as_secs_f64() / span.as_secs_f64() * 100.0,
        vendor.throttled(),
        vendor.max_in_any_window(Duration::from_secs(1)),
    );
}

fn main() {
    // `cargo test --benches` runs this too: keep that quick.
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return;
    }
    println!(
        "Cost per released permit, no HTTP ({PERMITS} permits, multi-thread runtime, {} cores)",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "  {:<24} {:>12} {:>16} {:>22}",
        "", "1 task", "64 tasks", "64 tasks, a lane each"
    );
    for contender in contenders() {
        let one = best_of(5, || cost_per_permit(contender.make, 1, false));
        let many = best_of(5, || cost_per_permit(contender.make, 64, false));
        let apart = best_of(5, || cost_per_permit(contender.make, 64, true));
        println!(
            "  {:<24} {:>9.0} ns {:>13.0} ns {:>19.0} ns",
            contender.name, one, many, apart
        );
    }

    println!("\nMemory per queued request ({QUEUED} waiting, one task each)");
    println!(
        "  {:<24} {:>14} {:>22}",
        "", "with its task", "beyond an idle task"
    );
    for contender in contenders() {
        let (total, own) = bytes_per_queued(contender.make);
        println!("  {:<24} {:>11.0} B {:>19.0} B", contender.name, total, own);
    }

    precision();
}
