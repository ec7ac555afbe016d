//! A shaper declared in `examples/vendors.toml`, run against three embedded
//! vendors that count like the real ones would.
//!
//! ```text
//! cargo run --example from_config
//! ```

use std::time::{Duration, Instant};

use callshaper::Error;
use callshaper::config::ShaperConfig;
use callshaper::testing::Vendor;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let minute = Duration::from_secs(60);
    let llm = Vendor::strict(500, minute)
        .also_cost(90_000, minute, "x-tokens")
        .start()
        .await;
    let payments = Vendor::strict(100, Duration::from_secs(1)).start().await;
    let sms = Vendor::strict(10, Duration::from_secs(1)).start().await;

    let mut config = ShaperConfig::from_toml(include_str!("vendors.toml"))?;
    for (name, vendor) in [("llm", &llm), ("payments", &payments), ("sms", &sms)] {
        if let Some(declared) = config.vendors.get_mut(name) {
            let host = vendor.uri().trim_start_matches("http://").to_owned();
            let was = declared.host.replace(host).unwrap_or_default();
            println!("{name:>9}: {was} -> {}", vendor.uri());
        }
    }
    let shaper = config.build()?;
    let started = Instant::now();

    println!("\nsms: 30 messages from 30 tasks, one API key, 10/s");
    let calls: Vec<_> = (0..30)
        .map(|i| {
            tokio::spawn(
                shaper
                    .post(format!("{}/send/{i}", sms.uri()))
                    .header("x-api-key", "k1")
                    .send(),
            )
        })
        .collect();
    for call in calls {
        call.await??;
    }
    println!(
        "  done in {:.2} s, 429s: {}, max in any 1 s: {}",
        started.elapsed().as_secs_f64(),
        sms.throttled(),
        sms.max_in_any_window(Duration::from_secs(1))
    );

    println!("\npayments: 11 payments, at most 10 a minute (each may wait 5 s at most)");
    let calls: Vec<_> = (0..11)
        .map(|i| {
            let call = shaper
                .post(format!("{}/v1/payments", payments.uri()))
                .body(format!("{{\"n\":{i}}}"));
            tokio::spawn(call.max_wait(Duration::from_secs(5)).send())
        })
        .collect();
    for call in calls {
        report(call.await?);
    }

    println!("\nllm: four chats of 30,000 tokens each, 90,000 tokens a minute (each may wait 5 s)");
    let calls: Vec<_> = (0..4)
        .map(|i| {
            let call = shaper
                .post(format!("{}/v1/chat", llm.uri()))
                .header("x-tokens", "30000")
                .cost(30_000)
                .tag(format!("customer-{i}"))
                .max_wait(Duration::from_secs(5));
            tokio::spawn(call.send())
        })
        .collect();
    for call in calls {
        report(call.await?);
    }

    println!("\nunknown host:");
    report(shaper.get("http://127.0.0.1:9/elsewhere").send().await);
    println!(
        "\nvendors saw: llm {} requests, payments {}, sms {}; 429s in all: {}",
        llm.arrivals().len(),
        payments.arrivals().len(),
        sms.arrivals().len(),
        llm.throttled() + payments.throttled() + sms.throttled()
    );
    Ok(())
}

fn report(outcome: Result<reqwest::Response, Error>) {
    match outcome {
        Ok(response) => println!("  {}", response.status()),
        Err(error) => println!("  {error}"),
    }
}
