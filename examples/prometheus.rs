//! callshaper's metrics on a Prometheus `/metrics` endpoint, served with
//! metrics-exporter-prometheus while a burst runs against an embedded
//! vendor (10 per second, strict; it throttles once with `Retry-After: 1`).
//!
//! ```text
//! cargo run --example prometheus             # one burst, then print /metrics
//! cargo run --example prometheus -- --serve  # bursts until Ctrl-C: scrape it
//! ```
//!
//! `dashboards/callshaper.json` is a Grafana dashboard over these series.

use std::time::Duration;

use callshaper::Shaper;
use callshaper::testing::{RetryAfter, Vendor};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const QUOTA: u32 = 10;
const BURST: usize = 40;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let serve = std::env::args().any(|arg| arg == "--serve");
    // Buckets, not the exporter's default summaries: buckets add up across
    // instances, so the dashboard's p50/p99 are the fleet's.
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("callshaper_wait_seconds".to_owned()),
            &[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0],
        )?
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)?;

    // Prometheus's usual exporter port, else any free one.
    let listener = match TcpListener::bind("127.0.0.1:9000").await {
        Ok(listener) => listener,
        Err(_) => TcpListener::bind("127.0.0.1:0").await?,
    };
    let address = listener.local_addr()?;
    tokio::spawn(serve_metrics(listener, handle.clone()));
    println!("serving http://{address}/metrics");

    let vendor = Vendor::strict(QUOTA as usize, Duration::from_secs(1))
        .start()
        .await;
    let shaper = Shaper::builder()
        .rate(QUOTA, Duration::from_secs(1))
        .build()?;
    loop {
        vendor.throttle_for(Duration::from_millis(50), RetryAfter::Seconds(1));
        let calls: Vec<_> = (0..BURST)
            .map(|i| tokio::spawn(shaper.get(format!("{}/items/{i}", vendor.uri())).send()))
            .collect();
        for call in calls {
            call.await??;
        }
        if !serve {
            break;
        }
    }

    // What a scrape sees: fetched from the endpoint like Prometheus would.
    let scraped = reqwest::get(format!("http://{address}/metrics"))
        .await?
        .text()
        .await?;
    for line in scraped.lines().filter(|line| {
        !line.starts_with("callshaper_wait_seconds_bucket") && line.contains("callshaper_")
    }) {
        println!("{line}");
    }
    Ok(())
}

/// A minimal HTTP/1.1 server: every request gets the current rendering.
async fn serve_metrics(listener: TcpListener, handle: PrometheusHandle) {
    while let Ok((mut stream, _)) = listener.accept().await {
        let handle = handle.clone();
        tokio::spawn(async move {
            let mut request = [0u8; 1024];
            // The request itself does not matter: every path is /metrics.
            if stream.read(&mut request).await.is_err() {
                return;
            }
            let body = handle.render();
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
        });
    }
}
