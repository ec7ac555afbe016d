//! Three instances, one vendor quota: 10 requests per second.
//!
//! ```text
//! cargo run --release --example fleet
//! ```
//!
//! Three shapers stand for three replicas behind a load balancer; each gets
//! a third of 60 calls. First they share the quota through Redis, then each
//! keeps its own in-memory lanes, as replicas without a store do. The vendor
//! is embedded (`testing::Vendor`: a strict sliding window, 429 beyond it).
//!
//! Redis: `REDIS_URL` if set; otherwise the example starts a `redis-server`
//! of its own on a free loopback port (Debian: `apt-get install
//! redis-server`).

use std::time::{Duration, Instant};

use callshaper::Shaper;
use callshaper::store::RedisStore;
use callshaper::testing::{Arrival, RedisServer, Vendor};

const QUOTA: u32 = 10;
const INSTANCES: usize = 3;
const CALLS: usize = 60;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `REDIS_URL`, or a redis-server of our own, stopped at the end.
    let server = std::env::var("REDIS_URL").is_err().then(RedisServer::start);
    let url = server.as_ref().map_or_else(
        || std::env::var("REDIS_URL").unwrap_or_default(),
        RedisServer::url,
    );
    println!(
        "{INSTANCES} instances, {CALLS} calls, one vendor allowing {QUOTA} per second (Redis at {url})\n"
    );

    let shared = run(Some(&url), QUOTA as usize).await?;
    let alone = run(None, QUOTA as usize).await?;
    // What the replicas offer, seen by a vendor that refuses nothing.
    let offered = run(None, usize::MAX).await?;

    println!(
        "{:<26}{:>16}{:>16}{:>22}",
        "", "through Redis", "in memory", "in memory, no 429s"
    );
    let runs = [&shared, &alone, &offered];
    let row = |name: &str, cell: &dyn Fn(&Outcome) -> String| {
        let [a, b, c] = runs.map(cell);
        println!("{name:<26}{a:>16}{b:>16}{c:>22}");
    };
    row("attempts the vendor saw", &|o| o.attempts.to_string());
    row("429s", &|o| o.throttled.to_string());
    row("busiest second", &|o| o.busiest.to_string());
    row("calls that failed", &|o| o.failed.to_string());
    row("time for all calls", &|o| {
        format!("{:.2} s", o.elapsed.as_secs_f64())
    });
    println!("\nattempts per second (# = accepted, x = 429):");
    let seconds = runs.iter().map(|o| o.chart.len()).max().unwrap_or(0);
    for s in 0..seconds {
        let [a, b, c] = runs.map(|o| {
            let (ok, throttled) = o.chart.get(s).copied().unwrap_or_default();
            format!("{}{}", "#".repeat(ok), "x".repeat(throttled))
        });
        println!("  {s:>2} s  {a:<14}{b:<16}{c}");
    }
    Ok(())
}

struct Outcome {
    attempts: usize,
    throttled: usize,
    busiest: usize,
    failed: usize,
    elapsed: Duration,
    /// Per second: (accepted, throttled).
    chart: Vec<(usize, usize)>,
}

/// The calls from three instances, through `redis` or each alone, at a
/// vendor allowing `limit` per second.
async fn run(redis: Option<&str>, limit: usize) -> Result<Outcome, Box<dyn std::error::Error>> {
    let vendor = Vendor::strict(limit, Duration::from_secs(1)).start().await;
    let mut instances = Vec::new();
    for _ in 0..INSTANCES {
        let mut builder = Shaper::builder().rate(QUOTA, Duration::from_secs(1));
        if let Some(url) = redis {
            // Each instance has its own connection, as separate processes would.
            builder = builder.store(RedisStore::options().fleet_size(3).connect(url).await?);
        }
        instances.push(builder.build()?);
    }
    let started = Instant::now();
    let calls: Vec<_> = (0..CALLS)
        .map(|i| {
            let call = instances[i % INSTANCES].get(format!("{}/call/{i}", vendor.uri()));
            tokio::spawn(call.send())
        })
        .collect();
    let mut failed = 0;
    for call in calls {
        if !matches!(call.await?, Ok(response) if response.status().is_success()) {
            failed += 1;
        }
    }
    let arrivals = vendor.arrivals();
    Ok(Outcome {
        attempts: arrivals.len(),
        throttled: vendor.throttled(),
        busiest: vendor.max_in_any_window(Duration::from_secs(1)),
        failed,
        elapsed: started.elapsed(),
        chart: chart(&arrivals),
    })
}

fn chart(arrivals: &[Arrival]) -> Vec<(usize, usize)> {
    let mut seconds: Vec<(usize, usize)> = Vec::new();
    let first = arrivals.first().map_or(Duration::ZERO, |a| a.at);
    for arrival in arrivals {
        let s = (arrival.at - first).as_secs() as usize;
        if seconds.len() <= s {
            seconds.resize(s + 1, (0, 0));
        }
        if arrival.status == 429 {
            seconds[s].1 += 1;
        } else {
            seconds[s].0 += 1;
        }
    }
    seconds
}
