//! Adaptive pacing against a vendor that announces nothing: its real quota
//! is 2/3 of what the client was told, and it throttles with a bare 429.
//!
//! ```text
//! cargo bench --bench adaptive
//! ```
//!
//! Runs on tokio's paused clock (real HTTP to wiremock, virtual time), so a
//! minute of traffic takes a moment and the figures don't depend on the
//! machine.

use std::time::Duration;

use callshaper::Shaper;
use callshaper::lane::Adaptive;
use callshaper::testing::{HoldClock, Vendor};

const TOLD: u32 = 15;
const REAL: usize = 10;
const REQUESTS: usize = 600;

fn main() {
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return;
    }
    println!(
        "{REQUESTS} requests; the client is told {TOLD}/s, the vendor really allows {REAL}/s and says nothing but 429"
    );
    println!(
        "  {:<22} {:>8} {:>7} {:>8} {:>14} {:>12} {:>10}",
        "", "ok", "failed", "429s", "amplification", "utilization", "duration"
    );
    for (name, adaptive) in [
        ("fixed-rate lane", None),
        ("adaptive lane (AIMD)", Some(Adaptive::default())),
    ] {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a tokio runtime");
        runtime.block_on(run(name, adaptive));
    }
}

async fn run(name: &str, adaptive: Option<Adaptive>) {
    let vendor = Vendor::strict(REAL, Duration::from_secs(1))
        .silent()
        .start()
        .await;
    let mut builder = Shaper::builder()
        .rate(TOLD, Duration::from_secs(1))
        .transport(HoldClock(reqwest::Client::new()));
    if let Some(knobs) = adaptive {
        builder = builder.adaptive(knobs);
    }
    let shaper = builder.build().expect("a valid shaper");
    let started = tokio::time::Instant::now();
    let calls: Vec<_> = (0..REQUESTS)
        .map(|i| tokio::spawn(shaper.get(format!("{}/r/{i}", vendor.uri())).send()))
        .collect();
    let mut ok = 0;
    for call in calls {
        if matches!(call.await, Ok(Ok(response)) if response.status() == 200) {
            ok += 1;
        }
    }
    let elapsed = started.elapsed();
    let arrivals = vendor.arrivals();
    let throttled = vendor.throttled();
    let accepted = arrivals.len() - throttled;
    let utilization = accepted as f64 / (REAL as f64 * elapsed.as_secs_f64());
    println!(
        "  {name:<22} {ok:>8} {:>7} {throttled:>8} {:>14.3} {:>11.1}% {:>9.1} s",
        REQUESTS - ok,
        arrivals.len() as f64 / REQUESTS as f64,
        utilization * 100.0,
        elapsed.as_secs_f64()
    );
}
