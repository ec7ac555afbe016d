//! Releases per second through one local Redis, over plain TCP and over
//! mutual TLS, with 1, 8 and 64 callers waiting at once, batched
//! reservations (16 slots per round trip) and not (1), and the Redis round
//! trips each release costs; side by side with the in-memory lane.
//!
//! ```text
//! cargo bench --bench store
//! ```
//!
//! The quota is set far above what either can release (1,000,000 per
//! second), so the figures are the machinery's ceiling, not the quota's.
//! Requests are answered by a transport that never touches the network:
//! what is measured is the lane and the store. Each Redis run is sized to
//! last about two seconds. Redis: `REDIS_URL`, or a `redis-server` the
//! benchmark starts on a free loopback port; the TLS one is always its own
//! (certificates made with `openssl`).

use std::time::{Duration, Instant};

use callshaper::Shaper;
use callshaper::shaper::BoxFuture;
use callshaper::shaper::Transport;
use callshaper::store::{RedisOptions, RedisStore};
use callshaper::testing::RedisServer;

/// Answers 200 at once.
struct Instant200;

impl Transport for Instant200 {
    fn send(&self, _request: reqwest::Request) -> BoxFuture<reqwest::Result<reqwest::Response>> {
        Box::pin(async {
            Ok(reqwest::Response::from(http::Response::new(
                reqwest::Body::from(""),
            )))
        })
    }
}

fn shaper(store: Option<RedisStore>) -> Shaper {
    let mut builder = Shaper::builder()
        .rate(1_000_000, Duration::from_secs(1))
        .transport(Instant200);
    if let Some(store) = store {
        builder = builder.store(store);
    }
    builder.build().expect("a valid shaper")
}

/// `waiters` tasks each sending until `total` requests are through;
/// returns releases per second.
async fn run(shaper: &Shaper, waiters: usize, total: usize) -> f64 {
    let per_task = total / waiters;
    let started = Instant::now();
    let tasks: Vec<_> = (0..waiters)
        .map(|_| {
            let shaper = shaper.clone();
            tokio::spawn(async move {
                for _ in 0..per_task {
                    shaper
                        .get("http://vendor.invalid/x")
                        .send()
                        .await
                        .expect("released");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a caller task");
    }
    (per_task * waiters) as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `REDIS_URL`, or a redis-server of our own, stopped at the end.
    let server = std::env::var("REDIS_URL").is_err().then(RedisServer::start);
    let url = server.as_ref().map_or_else(
        || std::env::var("REDIS_URL").unwrap_or_default(),
        RedisServer::url,
    );
    let tls = RedisServer::start_tls();
    let targets = [
        (RedisStore::options(), url.clone()),
        (tls.options(), tls.url()),
    ];
    println!(
        "releases per second (round trips per release), one lane, Redis at {url} and {}\n",
        tls.url()
    );
    println!(
        "{:>8}  {:>10}  {:>22}  {:>22}  {:>22}  {:>22}",
        "waiters", "in memory", "TCP, batch 16", "TCP, batch 1", "TLS, batch 16", "TLS, batch 1"
    );
    for waiters in [1, 8, 64] {
        let memory = run(&shaper(None), waiters, 200_000).await;
        let mut cells = vec![format!("{memory:>10.0}")];
        for (options, url) in &targets {
            for batch in [16, 1] {
                cells.push(through(options.clone().batch(batch), url, waiters).await?);
            }
        }
        println!("{waiters:>8}  {}", cells.join("  "));
    }
    Ok(())
}

/// One cell: releases per second through the store `options` connect to
/// at `url`, and round trips per release.
async fn through(
    options: RedisOptions,
    url: &str,
    waiters: usize,
) -> Result<String, Box<dyn std::error::Error>> {
    let store = options.connect(url).await?;
    let shaper = shaper(Some(store.clone()));
    // Warm up (connection, script load), and size the run to last about
    // two seconds: a short one swings with the scheduler.
    run(&shaper, waiters, 64).await;
    let guess = run(&shaper, waiters, 2_048).await;
    let total = ((guess * 2.0) as usize).clamp(2_048, 1_000_000);
    let before = store.round_trips();
    let rate = run(&shaper, waiters, total).await;
    let trips = (store.round_trips() - before) as f64 / (total / waiters * waiters) as f64;
    Ok(format!("{rate:>14.0} ({trips:.3})"))
}
