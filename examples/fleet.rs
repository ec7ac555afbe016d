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

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use callshaper::Shaper;
use callshaper::store::RedisStore;
use callshaper::testing::{Arrival, Vendor};

const QUOTA: u32 = 10;
const INSTANCES: usize = 3;
const CALLS: usize = 60;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = redis()?;
    println!(
        "{INSTANCES} instances, {CALLS} calls, one vendor allowing {QUOTA} per second (Redis at {url})\n"
    );

    let shared = run(Some(&url)).await?;
    let alone = run(None).await?;

    println!(
        "{:<28}{:>22}{:>22}",
        "", "through Redis", "in memory (each alone)"
    );
    let rows = [
        (
            "attempts the vendor saw",
            shared.attempts.to_string(),
            alone.attempts.to_string(),
        ),
        (
            "429s",
            shared.throttled.to_string(),
            alone.throttled.to_string(),
        ),
        (
            "busiest second",
            shared.busiest.to_string(),
            alone.busiest.to_string(),
        ),
        (
            "calls that failed",
            shared.failed.to_string(),
            alone.failed.to_string(),
        ),
        (
            "time for all calls",
            format!("{:.2} s", shared.elapsed.as_secs_f64()),
            format!("{:.2} s", alone.elapsed.as_secs_f64()),
        ),
    ];
    for (name, a, b) in rows {
        println!("{name:<28}{a:>22}{b:>22}");
    }
    println!("\nattempts per second (# = accepted, x = 429):");
    let seconds = shared.chart.len().max(alone.chart.len());
    for s in 0..seconds {
        let bar = |chart: &[(usize, usize)]| {
            let (ok, throttled) = chart.get(s).copied().unwrap_or_default();
            format!("{}{}", "#".repeat(ok), "x".repeat(throttled))
        };
        println!(
            "  {s:>2} s  {:<34}{}",
            bar(&shared.chart),
            bar(&alone.chart)
        );
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

/// The calls from three instances, through `redis` or each alone.
async fn run(redis: Option<&str>) -> Result<Outcome, Box<dyn std::error::Error>> {
    let vendor = Vendor::strict(QUOTA as usize, Duration::from_secs(1))
        .start()
        .await;
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

/// `REDIS_URL`, or a redis-server of our own (stopped when dropped).
fn redis() -> Result<(String, Option<Server>), Box<dyn std::error::Error>> {
    if let Ok(url) = std::env::var("REDIS_URL") {
        return Ok((url, None));
    }
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start redis-server ({e}); install it or set REDIS_URL"))?;
    let server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err("redis-server did not start".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((format!("redis://127.0.0.1:{port}"), Some(server)))
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
