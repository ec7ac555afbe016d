//! LLM calls costed in tokens (`TokenCost`): estimated from the request,
//! settled from the usage the answer reports, in JSON and in streams, in
//! the library and through the proxy, against an LLM vendor on wiremock
//! that charges `max_tokens` up front and corrects it at the end.
//!
//! Each test sends 30 calls, one after another, that ask for up to 1,000
//! tokens and use 20 or so, against 10,000 tokens a minute: settled, they
//! fit in the minute at once; left at their estimate, the tenth waits a
//! minute, past each test's bound.

mod common;

use std::time::Duration;

use callshaper::config::ShaperConfig;
use callshaper::testing::LlmVendor;
use callshaper::tokens::TokenCost;
use callshaper::{Error, Quota, Shaper};
use tokio::net::TcpListener;

const MINUTE: Duration = Duration::from_secs(60);
const CALLS: usize = 30;
/// Long enough for 30 calls on a loaded machine; far short of the minute
/// an unsettled estimate waits.
const BOUND: Duration = Duration::from_secs(20);

fn chat(stream: bool) -> String {
    format!(
        r#"{{"model":"gpt-4o-mini","max_tokens":1000,"stream":{stream},"messages":[{{"role":"user","content":"Say something short."}}]}}"#
    )
}

/// A shaper that keeps to 10,000 tokens a minute, costed by `tokens`.
fn shaper(tokens: TokenCost) -> Shaper {
    Shaper::builder()
        .quota(Quota::sliding_log(10_000, MINUTE).per_cost())
        .tokens(tokens)
        .build()
        .unwrap()
}

/// `CALLS` calls of `body`, one after another, each read to its end;
/// their bodies.
async fn calls(shaper: &Shaper, url: &str, body: &str) -> Vec<String> {
    let all = async {
        let mut answers = Vec::new();
        for _ in 0..CALLS {
            let answer = shaper
                .post(url)
                .header("content-type", "application/json")
                .body(body.to_owned())
                .send()
                .await
                .expect("a call is answered");
            assert_eq!(answer.status(), 200);
            answers.push(answer.text().await.unwrap());
        }
        answers
    };
    tokio::time::timeout(BOUND, all)
        .await
        .expect("settled calls fit the minute: none waits for the estimate to leave")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_answers_settle_the_estimate_to_the_tokens_used() {
    let vendor = LlmVendor::openai(10_000, MINUTE).start().await;
    let shaper = shaper(TokenCost::openai());
    let url = format!("{}/v1/chat/completions", vendor.uri());
    let answers = calls(&shaper, &url, &chat(false)).await;
    let usage: serde_json::Value = serde_json::from_str(&answers[0]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 20);
    assert_eq!(vendor.throttled(), 0);
}

/// Without usage there is nothing to settle from: the estimate (the
/// prompt and `max_tokens`, 1,009 here) stands, and the tenth call would
/// wait for the first to leave the minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_without_usage_keeps_its_estimate() {
    let vendor = LlmVendor::openai(10_000, MINUTE)
        .without_usage()
        .start()
        .await;
    let shaper = shaper(TokenCost::openai());
    let url = format!("{}/v1/chat/completions", vendor.uri());
    for i in 0..10 {
        let sent = shaper
            .post(&url)
            .body(chat(false))
            .max_wait(Duration::from_secs(5))
            .send()
            .await;
        match sent {
            Ok(answer) if i < 9 => {
                answer.text().await.unwrap();
            }
            Err(Error::WouldExceedMaxWait { .. }) if i == 9 => {}
            other => panic!("call {i}: {other:?}"),
        }
    }
    assert_eq!(vendor.throttled(), 0);
}

/// An OpenAI stream reports its usage only when asked: the shaper asks,
/// settles from the last chunk, and takes that chunk out again, so the
/// caller's stream is the one it asked for. A caller that asked itself
/// keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_asked_for_its_usage_and_its_caller_sees_what_it_asked_for() {
    let vendor = LlmVendor::openai(10_000, MINUTE).start().await;
    let shaper = shaper(TokenCost::openai());
    let url = format!("{}/v1/chat/completions", vendor.uri());
    for events in calls(&shaper, &url, &chat(true)).await {
        assert!(events.ends_with("data: [DONE]\n\n"), "{events}");
        assert!(events.contains("\"finish_reason\":\"stop\""), "{events}");
        assert!(!events.contains("\"choices\":[]"), "{events}");
    }
    let bodies = vendor.bodies();
    assert!(
        bodies
            .iter()
            .all(|b| b["stream_options"]["include_usage"] == true),
        "{bodies:?}"
    );
    assert_eq!(vendor.throttled(), 0);

    let asked = chat(true).replacen('{', r#"{"stream_options":{"include_usage":true},"#, 1);
    let events = shaper.post(&url).body(asked).send().await.unwrap();
    let events = events.text().await.unwrap();
    assert!(events.contains("\"choices\":[]"), "{events}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_streams_settle_from_their_message_events() {
    let vendor = LlmVendor::anthropic(10_000, MINUTE).start().await;
    let shaper = shaper(TokenCost::anthropic());
    let url = format!("{}/v1/messages", vendor.uri());
    for events in calls(&shaper, &url, &chat(true)).await {
        assert!(events.contains("event: message_delta"), "{events}");
        assert!(events.ends_with("data: {\"type\":\"message_stop\"}\n\n"));
    }
    let bodies = vendor.bodies();
    assert!(bodies.iter().all(|b| b.get("stream_options").is_none()));
    assert_eq!(vendor.throttled(), 0);
}

/// Through `callshaper-proxy`'s file and the in-process proxy: a client
/// that knows nothing of tokens, JSON and streams alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_settles_what_its_clients_use() {
    let vendor = LlmVendor::openai(10_000, MINUTE).start().await;
    let file = format!(
        r#"
        [vendors.llm]
        upstream = "{}"
        tokens = "openai"
        quotas = [{{ algorithm = "sliding_log", count = 10000, per = "1m", unit = "cost" }}]
        "#,
        vendor.uri()
    );
    let config = ShaperConfig::from_toml(&file).unwrap();
    let shaper = config.build().unwrap();
    let proxy = config.proxy(shaper).build().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/llm/v1/chat/completions",
        listener.local_addr().unwrap()
    );
    tokio::spawn(proxy.serve(listener));
    let client = reqwest::Client::new();
    let all = async {
        for i in 0..CALLS {
            let answer = client
                .post(&url)
                .header("content-type", "application/json")
                .body(chat(i % 2 == 1))
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), 200);
            let text = answer.text().await.unwrap();
            if i % 2 == 1 {
                assert!(text.ends_with("data: [DONE]\n\n") && !text.contains("\"choices\":[]"));
            } else {
                assert!(text.contains("\"total_tokens\""), "{text}");
            }
        }
    };
    tokio::time::timeout(BOUND, all)
        .await
        .expect("settled calls fit the minute");
    assert_eq!(vendor.throttled(), 0);
}

/// A file's `tokens` is checked when it is read, naming the field.
#[test]
fn a_bad_token_rule_is_refused_naming_the_field() {
    for (rule, says) in [
        (r#""gemini""#, "\"openai\", \"anthropic\""),
        (
            r#"{ style = "openai", default_output = -1 }"#,
            "\"openai\", \"anthropic\"",
        ),
        (r#"{ default_output = 10 }"#, "\"openai\", \"anthropic\""),
    ] {
        let file = format!(
            r#"
            [vendors.llm]
            host = "api.llm.example"
            tokens = {rule}
            quotas = [{{ algorithm = "leaky_bucket", count = 1, per = "1s" }}]
            "#
        );
        let error = ShaperConfig::from_toml(&file).unwrap_err().to_string();
        assert!(error.contains("vendors.llm.tokens"), "{error}");
        assert!(error.contains(says), "{rule}: {error}");
    }
    let file = r#"
        [defaults]
        tokens = { style = "anthropic", default_output = 512 }
        quotas = [{ algorithm = "leaky_bucket", count = 1, per = "1s" }]
    "#;
    assert!(ShaperConfig::from_toml(file).unwrap().build().is_ok());
}

/// The test vendor takes hostile numbers as a real one would: a window of
/// `Duration::MAX`, answers of `u64::MAX` tokens, a `max_tokens` of
/// `u64::MAX`; it refuses or answers, and never panics or fills memory.
#[tokio::test]
async fn the_llm_vendor_takes_hostile_numbers() {
    let vendor = LlmVendor::openai(u64::MAX, Duration::MAX)
        .answering(u64::MAX)
        .start()
        .await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", vendor.uri());
    for max in ["18446744073709551615", "5", "-1", "\"lots\""] {
        let body =
            format!(r#"{{"max_tokens":{max},"messages":[{{"role":"user","content":"hi"}}]}}"#);
        let answer = client.post(&url).body(body).send().await.unwrap();
        let status = answer.status().as_u16();
        let text = answer.text().await.unwrap();
        assert!(status == 200 || status == 429, "{max}: {status}");
        assert!(text.len() < 64 << 10, "{max}: {} bytes", text.len());
    }
}
