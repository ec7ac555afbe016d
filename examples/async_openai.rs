//! A Rust SDK that builds its own HTTP client, shaped with no sidecar:
//! async-openai pointed at callshaper's in-process proxy by its base URL
//! (`OpenAIConfig::with_api_base`), against a local OpenAI-like vendor
//! with a tokens-per-minute quota.
//!
//! ```text
//! cargo run --example async_openai --features proxy,config,testing
//! ```
//!
//! Twenty concurrent calls, each allowed up to 500 tokens, go at the
//! quota's 5 a second (about 3.8 s) under 6,000 tokens a minute: each is
//! charged its 500 and a prompt until its answer's `usage` settles it to
//! what it used, so the twelfth does not wait a minute for the first to
//! leave the window.

use std::time::{Duration, Instant};

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequestArgs,
};
use callshaper::config::ShaperConfig;
use callshaper::testing::LlmVendor;
use tokio::net::TcpListener;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Stands in for api.openai.com: 6,000 tokens a minute, charging each
    // call its max_tokens until it ends.
    let vendor = LlmVendor::openai(6_000, Duration::from_secs(60))
        .start()
        .await;
    let file = format!(
        r#"
        [vendors.openai]
        upstream = "{}/v1"
        tokens = "openai"
        quotas = [
          {{ algorithm = "leaky_bucket", count = 5, per = "1s" }},
          {{ algorithm = "sliding_log", count = 6000, per = "1m", unit = "cost" }},
        ]
        "#,
        vendor.uri()
    );
    let config = ShaperConfig::from_toml(&file)?;
    let shaper = config.build()?;
    let proxy = config.proxy(shaper.clone()).build()?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}/openai", listener.local_addr()?);
    tokio::spawn(proxy.serve(listener));

    // The one change to the SDK: its base URL.
    let client = Client::with_config(
        OpenAIConfig::new()
            .with_api_key("sk-local")
            .with_api_base(&base),
    );
    let started = Instant::now();
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let request = CreateChatCompletionRequestArgs::default()
                    .model("gpt-4o-mini")
                    .max_tokens(500u32)
                    .messages([ChatCompletionRequestUserMessageArgs::default()
                        .content(format!("Say hello to caller {i}."))
                        .build()?
                        .into()])
                    .build()?;
                client.chat().create(request).await
            })
        })
        .collect();
    for (i, call) in calls.into_iter().enumerate() {
        let answer = call.await??;
        let used = answer.usage.map_or(0, |u| u.total_tokens);
        println!("call {i:2}: {used} tokens used");
    }
    println!(
        "20 calls in {:.2?}, {} refused by the vendor",
        started.elapsed(),
        vendor.throttled()
    );
    for lane in shaper.lanes() {
        println!("lane {}: {} released", lane.key, lane.released);
    }
    Ok(())
}
