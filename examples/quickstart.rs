//! The main job: a burst of 50 calls at a vendor that allows 10 per second,
//! then a vendor that throttles everything for 2 s.
//!
//! ```text
//! cargo run --release -p quickstart   # only what it needs (examples/quickstart/Cargo.toml)
//! ```
//!
//! The vendor is embedded (callshaper's `testing::Vendor` on a loopback
//! wiremock server): strict sliding window, 429 beyond the quota.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use callshaper::Shaper;
use callshaper::testing::{Arrival, RetryAfter, Vendor};

const QUOTA: u32 = 10;
const BURST: usize = 50;

// One thread: tasks are first polled in the order they were spawned, so
// the calls join the lane's FIFO queue in the order of their numbers, and
// the vendor's log shows them in that order. On several threads they join
// in whatever order the threads reach them, FIFO all the same.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!(
        "callshaper quickstart: {BURST} calls from {BURST} tasks at a vendor allowing {QUOTA} per second\n"
    );
    let vendor = Vendor::strict(QUOTA as usize, Duration::from_secs(1))
        .start()
        .await;
    let shaper = Shaper::builder()
        .rate(QUOTA, Duration::from_secs(1))
        .build()?;

    // Part one: the burst.
    let started = Instant::now();
    let waits = fire(&shaper, &vendor.uri(), BURST).await?;
    let elapsed = started.elapsed();
    let arrivals = vendor.arrivals();
    summary(&arrivals, &waits, elapsed);
    chart(&arrivals);

    // Part two: the vendor throttles everything for 2 s.
    println!("\nPart two: the vendor answers 429 `Retry-After: 2` to everything for 2 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = vendor.arrivals().len();
    vendor.throttle_for(Duration::from_secs(2), RetryAfter::Seconds(2));
    fire(&shaper, &vendor.uri(), 10).await?;
    let during: Vec<Arrival> = vendor.arrivals().into_iter().skip(before).collect();
    let first = during.first().map_or(Duration::ZERO, |a| a.at);
    for arrival in &during {
        let mark = if arrival.status == 429 {
            "  <- 429: lane paused"
        } else {
            ""
        };
        println!(
            "  +{:>6.3} s  {} {}  {}{mark}",
            (arrival.at - first).as_secs_f64(),
            arrival.method,
            arrival.path,
            arrival.status
        );
    }
    let throttled: Vec<_> = during.iter().filter(|a| a.status == 429).collect();
    if let (Some(last_429), Some(next)) = (
        throttled.last(),
        during
            .iter()
            .find(|a| a.at > throttled.last().map_or(Duration::ZERO, |t| t.at)),
    ) {
        println!(
            "\n  {} throttled attempt(s); after the last 429 the lane sent nothing for {:.2} s, then resumed at {QUOTA}/s",
            throttled.len(),
            (next.at - last_429.at).as_secs_f64()
        );
    }
    let ok = during.iter().filter(|a| a.status == 200).count();
    println!(
        "  all {ok} calls succeeded; max in any 1 s window: {}",
        vendor.max_in_any_window(Duration::from_secs(1))
    );
    Ok(())
}

/// Send `n` calls from `n` tasks, with a live progress bar; returns each
/// call's wait (submission to response).
async fn fire(shaper: &Shaper, base: &str, n: usize) -> Result<Vec<Duration>, callshaper::Error> {
    let done = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let call = shaper.get(format!("{base}/items/{i}")).send();
            let done = done.clone();
            tokio::spawn(async move {
                let submitted = Instant::now();
                let outcome = call.await;
                done.fetch_add(1, Ordering::Relaxed);
                outcome.map(|_| submitted.elapsed())
            })
        })
        .collect();
    let progress = tokio::spawn(progress_bar(done.clone(), n));
    let mut waits = Vec::with_capacity(n);
    for task in tasks {
        match task.await {
            Ok(outcome) => waits.push(outcome?),
            Err(panicked) => panic!("a caller task failed: {panicked}"),
        }
    }
    progress.abort();
    draw(n, n);
    println!();
    Ok(waits)
}

async fn progress_bar(done: Arc<AtomicUsize>, total: usize) {
    loop {
        draw(done.load(Ordering::Relaxed), total);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn draw(done: usize, total: usize) {
    const WIDTH: usize = 40;
    let filled = done * WIDTH / total.max(1);
    print!(
        "\r  [{}{}] {done}/{total}",
        "#".repeat(filled),
        ".".repeat(WIDTH - filled)
    );
    // A progress bar that can't be drawn is no reason to stop.
    let _ = std::io::stdout().flush();
}

fn summary(arrivals: &[Arrival], waits: &[Duration], elapsed: Duration) {
    let mut sorted = waits.to_vec();
    sorted.sort();
    let pick = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    let throttled = arrivals.iter().filter(|a| a.status == 429).count();
    let span = match (arrivals.first(), arrivals.last()) {
        (Some(first), Some(last)) => last.at - first.at,
        _ => Duration::ZERO,
    };
    let rate = (arrivals.len().saturating_sub(1)) as f64 / span.as_secs_f64().max(f64::EPSILON);
    println!("\n  requests                   {}", waits.len());
    println!("  429s received              {throttled}");
    println!(
        "  achieved rate              {rate:.2}/s (quota {QUOTA}/s), {:.2} s in all",
        elapsed.as_secs_f64()
    );
    println!(
        "  max arrivals in any 1 s    {}",
        callshaper::testing::max_in_any_window(
            arrivals.iter().map(|a| a.at),
            Duration::from_secs(1)
        )
    );
    println!(
        "  wait p50 / p99             {:.2} s / {:.2} s",
        pick(0.5).as_secs_f64(),
        pick(0.99).as_secs_f64()
    );
}

fn chart(arrivals: &[Arrival]) {
    println!("\n  arrivals at the vendor, per second:");
    let Some(first) = arrivals.first() else {
        return;
    };
    let seconds = arrivals
        .last()
        .map_or(0, |a| (a.at - first.at).as_secs() as usize)
        + 1;
    let mut buckets = vec![0usize; seconds];
    for arrival in arrivals {
        buckets[(arrival.at - first.at).as_secs() as usize] += 1;
    }
    for (second, count) in buckets.iter().enumerate() {
        println!("  {second:>3}s |{:<12}| {count}", "█".repeat(*count));
    }
}
