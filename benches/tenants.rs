//! A million tenants: N tenants, a lane each, one request each and then
//! ten each, beside governor's keyed limiter: what a live, idle lane
//! weighs (resident memory and heap, per lane) and what a request costs,
//! and what it weighs once it served its ten more (a lane that served
//! traffic holds its releases in its quota's window).
//! The `resting` row gives each tenant a day's quota and lets its lane go
//! a second after it goes quiet: what a tenant weighs once only its count
//! rests, and what one more request costs, waking it. The `request` row
//! is the same requests without a shaper.
//!
//! ```text
//! cargo bench --bench tenants            # N = 10^4, 10^5, 10^6
//! cargo bench --bench tenants -- 100000  # one N
//! ```
//!
//! The transport answers at once, without a socket, so what is measured is
//! the shaper's own work: finding (or making) the tenant's lane, charging
//! its quota and the vendor's, handing over the turn. Each N runs in a
//! process of its own (the bench runs itself again), so one N's freed
//! memory does not flatter the next one's resident figure.

use std::num::NonZeroU32;
use std::process::Command;

use std::time::{Duration, Instant};

use callshaper::route::{LaneKey, Level};
use callshaper::shaper::{BoxFuture, Transport};
use callshaper::{Quota, Shaper};
use reqwest::{Request, Response};

#[path = "common/answer.rs"]
mod answer;
#[path = "common/memory.rs"]
mod memory;

/// Counts live heap bytes beside the resident set.
#[global_allocator]
static GLOBAL: memory::Counting = memory::Counting;

/// Answers every attempt at once with an empty 200 and a vendor's headers.
struct AtOnce;

impl Transport for AtOnce {
    fn send(&self, _request: Request) -> BoxFuture<reqwest::Result<Response>> {
        Box::pin(async { Ok(Response::from(answer::as_a_vendor(http::Response::new("")))) })
    }
}

fn rss() -> u64 {
    memory::resident("self")
}

fn heap() -> i64 {
    memory::heap() as i64
}

/// What each of `n` tenants grew memory by, from `before` to `after`
/// (resident, heap).
fn grown(n: usize, before: (u64, i64), after: (u64, i64)) -> (f64, f64) {
    (
        after.0.saturating_sub(before.0) as f64 / n as f64,
        (after.1 - before.1) as f64 / n as f64,
    )
}

/// What one run measured.
struct Figures {
    rss_per: f64,
    heap_per: f64,
    /// The same once each tenant made its ten more requests (`None`: no
    /// tenant keeps anything): a lane that served traffic holds its
    /// releases in its quota's window.
    used: Option<(f64, f64)>,
    first: Duration,
    again: Duration,
}

impl Figures {
    /// What each of `n` tenants grew memory by, from `before` to `after`,
    /// and the times per request.
    fn per_tenant(
        n: usize,
        before: (u64, i64),
        after: (u64, i64),
        (first, again): (Duration, Duration),
    ) -> Self {
        let (rss_per, heap_per) = grown(n, before, after);
        Self {
            rss_per,
            heap_per,
            used: None,
            first,
            again,
        }
    }

    /// With what `n` tenants grew memory by from `before`, measured once
    /// they made their ten more requests.
    fn used(mut self, n: usize, before: (u64, i64), used: (u64, i64)) -> Self {
        self.used = Some(grown(n, before, used));
        self
    }

    fn print(&self, name: &str, n: usize) {
        let used = self.used.map_or_else(
            || "| | |".to_owned(),
            |(rss, heap)| format!("| {rss:.0} B | {heap:.0} B |"),
        );
        println!(
            "| {name} | {n} | {:.0} B | {:.0} B | {:.2} µs | {:.2} µs {used}",
            self.rss_per,
            self.heap_per,
            self.first.as_secs_f64() * 1e6,
            self.again.as_secs_f64() * 1e6,
        );
    }
}

/// One request of tenant `name`, answered.
async fn call(shaper: &Shaper, name: &str) {
    let sent = shaper.get("http://vendor.test/").tag(name).send().await;
    drop(sent.expect("answered"));
}

fn tenant(i: usize) -> String {
    format!("tenant-{i:07}")
}

/// One request of each tenant, in turn: the time per request.
async fn each_once(shaper: &Shaper, names: &[String]) -> Duration {
    let started = Instant::now();
    for name in names {
        call(shaper, name).await;
    }
    started.elapsed() / u32::try_from(names.len().max(1)).unwrap_or(u32::MAX)
}

/// A shaper with a lane per tenant at `quota`, going `idle` after it goes
/// quiet, under one vendor quota far above the load, after one request
/// (so the shaper's own start-up is not counted).
async fn warmed_up(quota: Quota, idle: Duration) -> Shaper {
    let shaper = Shaper::builder()
        .quota(Quota::leaky_bucket(1_000_000_000, Duration::from_secs(1)))
        .level(Level::new("tenant", LaneKey::Tag, [quota]))
        .idle_timeout(idle)
        .transport(AtOnce)
        .build()
        .expect("a valid shaper");
    call(&shaper, "warm-up").await;
    shaper
}

/// N tenants through one shaper: a lane per tenant (10 a second each, in
/// bursts of 20, so eleven calls in a row need no wait) under one vendor
/// quota far above the load.
async fn callshaper(n: usize) -> Figures {
    let quota = Quota::token_bucket(20, 10, Duration::from_secs(1));
    let shaper = warmed_up(quota, Duration::from_secs(3600)).await;
    let names: Vec<String> = (0..n).map(tenant).collect();
    let (rss0, heap0) = (rss(), heap());
    let first = each_once(&shaper, &names).await;
    let (rss1, heap1) = (rss(), heap());
    assert_eq!(shaper.live_lanes(), n + 1, "every tenant's lane is live");
    // Ten more each from 64 tasks: a lane found, not made.
    let started = Instant::now();
    let rounds: Vec<_> = names
        .chunks(names.len().div_ceil(64))
        .map(|chunk| {
            let (shaper, chunk) = (shaper.clone(), chunk.to_vec());
            tokio::spawn(async move {
                for _ in 0..10 {
                    for name in &chunk {
                        call(&shaper, name).await;
                    }
                }
            })
        })
        .collect();
    for round in rounds {
        round.await.expect("a round ran");
    }
    let again = started.elapsed() / (n as u32 * 10);
    Figures::per_tenant(n, (rss0, heap0), (rss1, heap1), (first, again)).used(
        n,
        (rss0, heap0),
        (rss(), heap()),
    )
}

/// N tenants with a day's quota each, whose lanes go a second after they
/// go quiet, leaving their count resting: memory once every lane went
/// (the meters resting, nothing else), and one more request each, every
/// one waking its tenant's meters into a new lane.
async fn resting(n: usize) -> Figures {
    let day = Quota::fixed_window(1_000, Duration::from_secs(86_400));
    let shaper = warmed_up(day, Duration::from_secs(1)).await;
    let names: Vec<String> = (0..n).map(tenant).collect();
    let gone = || async {
        let deadline = Instant::now() + Duration::from_secs(120);
        while shaper.live_lanes() > 0 {
            assert!(Instant::now() < deadline, "every lane goes");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    gone().await;
    let (rss0, heap0) = (rss(), heap());
    let first = each_once(&shaper, &names).await;
    gone().await;
    let (rss1, heap1) = (rss(), heap());
    let woken = each_once(&shaper, &names).await;
    Figures::per_tenant(n, (rss0, heap0), (rss1, heap1), (first, woken))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The same requests built by reqwest and answered by the same transport,
/// with no shaper: what a request costs before the shaper adds its part
/// (its row's memory is what nothing keeps per tenant).
async fn request_alone(n: usize) -> Figures {
    let client = reqwest::Client::new();
    let send = |client: &reqwest::Client| {
        let request = client.get("http://vendor.test/").build();
        let answer = AtOnce.send(request.expect("a valid request"));
        async move { drop(answer.await.expect("answered")) }
    };
    let (rss0, heap0) = (rss(), heap());
    let started = Instant::now();
    for _ in 0..n {
        send(&client).await;
    }
    let first = started.elapsed() / n as u32;
    let (rss1, heap1) = (rss(), heap());
    let started = Instant::now();
    let rounds: Vec<_> = (0..64)
        .map(|_| {
            let client = client.clone();
            let per_task = (n * 10).div_ceil(64);
            tokio::spawn(async move {
                for _ in 0..per_task {
                    send(&client).await;
                }
            })
        })
        .collect();
    for round in rounds {
        round.await.expect("a round ran");
    }
    let again = started.elapsed() / (n.div_ceil(64) as u32 * 64 * 10);
    Figures::per_tenant(n, (rss0, heap0), (rss1, heap1), (first, again))
}

/// governor's keyed limiter, the same tenants and quota: a check per
/// request.
fn governor(n: usize) -> Figures {
    use governor::{Quota as GQuota, RateLimiter};
    let quota = GQuota::per_second(NonZeroU32::new(10).expect("ten"))
        .allow_burst(NonZeroU32::new(20).expect("twenty"));
    let limiter = RateLimiter::keyed(quota);
    let names: Vec<String> = (0..n).map(tenant).collect();
    let (rss0, heap0) = (rss(), heap());
    let started = Instant::now();
    for name in &names {
        assert!(limiter.check_key(name).is_ok());
    }
    let first = started.elapsed() / n as u32;
    let (rss1, heap1) = (rss(), heap());
    let started = Instant::now();
    for _ in 0..10 {
        for name in &names {
            assert!(limiter.check_key(name).is_ok());
        }
    }
    let again = started.elapsed() / (n as u32 * 10);
    Figures::per_tenant(n, (rss0, heap0), (rss1, heap1), (first, again)).used(
        n,
        (rss0, heap0),
        (rss(), heap()),
    )
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if let [which, n] = &args[..] {
        let n: usize = n.parse().expect("a count");
        let figures = match which.as_str() {
            "callshaper" => runtime().block_on(callshaper(n)),
            "resting" => runtime().block_on(resting(n)),
            "request" => runtime().block_on(request_alone(n)),
            _ => governor(n),
        };
        figures.print(which, n);
        return;
    }
    let counts: Vec<usize> = match args.first() {
        Some(n) => vec![n.parse().expect("a count")],
        None => vec![10_000, 100_000, 1_000_000],
    };
    let me = std::env::current_exe().expect("the bench's path");
    println!(
        "| limiter | tenants | resident per lane | heap per lane | first request | each of ten more | resident after ten more | heap after ten more |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for n in counts {
        for which in ["callshaper", "resting", "request", "governor"] {
            let status = Command::new(&me)
                .args([which, &n.to_string()])
                .status()
                .expect("the bench runs itself");
            assert!(status.success(), "{which} at {n}");
        }
    }
}
