//! An LLM vendor on wiremock, with a tokens-per-window quota counted as
//! the vendors count it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::runtime::Handle;
use tokio::time::Instant;
use wiremock::{MockServer, Respond, ResponseTemplate};

use super::clock::{now, wall_at};
use super::server::take_down;
use super::style::{go_duration, rfc3339_after, whole_secs_up};

/// An LLM vendor: OpenAI's chat completions or Anthropic's messages, as
/// JSON or as server-sent events (`"stream": true`), under a quota of
/// `tokens` per sliding window of `per`.
///
/// It counts as Anthropic documents it: a request is charged its prompt
/// (a token per 3 characters of its messages, its own tokenizer, not the
/// client's) and its `max_tokens` (4,096 when it names none) when it
/// starts, refused with 429 when that does not fit, and its charge is
/// corrected to what it used when it ends. Every answer carries the
/// vendor's request and token headers (`x-ratelimit-*-requests` and
/// `-tokens`, or `anthropic-ratelimit-requests-*` and `-tokens-*`; 10,000
/// requests a window); an OpenAI stream reports its usage only
/// when asked (`stream_options.include_usage`), in a last chunk with no
/// choices.
///
/// ```
/// use std::time::Duration;
/// use callshaper::testing::LlmVendor;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let vendor = LlmVendor::openai(10_000, Duration::from_secs(60)).start().await;
/// let answer: serde_json::Value = reqwest::Client::new()
///     .post(format!("{}/v1/chat/completions", vendor.uri()))
///     .body(r#"{"max_tokens":100,"messages":[{"role":"user","content":"Hello"}]}"#)
///     .send()
///     .await
///     .unwrap()
///     .json()
///     .await
///     .unwrap();
/// assert_eq!(answer["usage"]["total_tokens"], 2 + 20);
/// # }
/// ```
#[derive(Clone)]
pub struct LlmVendor {
    inner: Arc<Inner>,
    server: Option<Arc<MockServer>>,
}

struct Inner {
    clock: Option<Handle>,
    anthropic: bool,
    limit: u64,
    per: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// What each accepted request used, and when.
    charges: VecDeque<(Instant, u64)>,
    /// Tokens an answer uses past its prompt (at most its `max_tokens`).
    answer: u64,
    /// Answers say nothing of their usage (a server that reports none).
    silent: bool,
    bodies: Vec<Value>,
    throttled: usize,
}

/// What a request with no `max_tokens` is charged for its answer.
const DEFAULT_MAX_TOKENS: u64 = 4_096;

/// The requests a window allows, stated beside the tokens as the vendors
/// state theirs; far above what a test sends, so the tokens decide.
const REQUESTS: u64 = 10_000;

/// The most words an answer's text holds: its usage says what it cost, and
/// a hostile `answering(u64::MAX)` must not fill the memory.
const MOST_WORDS: u64 = 256;

/// Where it listens, once started.
impl std::fmt::Debug for LlmVendor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let uri = self.server.as_ref().map(|server| server.uri());
        f.debug_struct("LlmVendor")
            .field("uri", &uri)
            .finish_non_exhaustive()
    }
}

impl LlmVendor {
    /// OpenAI's chat completions API, `tokens` per `per`.
    pub fn openai(tokens: u64, per: Duration) -> Self {
        Self::new(false, tokens, per)
    }

    /// Anthropic's messages API, `tokens` per `per`.
    pub fn anthropic(tokens: u64, per: Duration) -> Self {
        Self::new(true, tokens, per)
    }

    fn new(anthropic: bool, limit: u64, per: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                clock: Handle::try_current().ok(),
                anthropic,
                limit,
                per: per.max(Duration::from_nanos(1)),
                state: Mutex::new(State {
                    answer: 20,
                    ..State::default()
                }),
            }),
            server: None,
        }
    }

    /// Each answer uses `tokens` (default 20), or its `max_tokens` if less.
    pub fn answering(self, tokens: u64) -> Self {
        self.state().answer = tokens;
        self
    }

    /// Answers carry no usage at all, as some OpenAI-compatible servers.
    pub fn without_usage(self) -> Self {
        self.state().silent = true;
        self
    }

    /// Serve on a wiremock server of its own.
    pub async fn start(mut self) -> Self {
        let server = MockServer::start().await;
        wiremock::Mock::given(wiremock::matchers::any())
            .respond_with(self.clone())
            .mount(&server)
            .await;
        self.server = Some(Arc::new(server));
        self
    }

    /// The base URL of the server [`start`](Self::start) launched.
    ///
    /// # Panics
    ///
    /// If the vendor was not started with [`start`](Self::start).
    pub fn uri(&self) -> String {
        self.server.as_ref().expect("LlmVendor::start first").uri()
    }

    /// Every request body as the vendor read it, in arrival order (`null`
    /// for one that was not JSON).
    pub fn bodies(&self) -> Vec<Value> {
        self.state().bodies.clone()
    }

    /// How many requests it refused with 429.
    pub fn throttled(&self) -> usize {
        self.state().throttled
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for LlmVendor {
    fn drop(&mut self) {
        take_down(&mut self.server);
    }
}

impl Respond for LlmVendor {
    fn respond(&self, request: &wiremock::Request) -> ResponseTemplate {
        let inner = &self.inner;
        let now = now(inner.clock.as_ref());
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let mut state = self.state();
        state.bodies.push(body.clone());
        while state
            .charges
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= inner.per)
        {
            state.charges.pop_front();
        }
        let used = state
            .charges
            .iter()
            .map(|(_, n)| *n)
            .fold(0, u64::saturating_add);
        let prompt = prompt_tokens(&body);
        let max = body
            .get("max_tokens")
            .or_else(|| body.get("max_completion_tokens"))
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_MAX_TOKENS);
        let fits = used.saturating_add(prompt).saturating_add(max) <= inner.limit;
        let output = state.answer.min(max);
        if fits {
            state
                .charges
                .push_back((now, prompt.saturating_add(output)));
        } else {
            state.throttled += 1;
        }
        let used = state
            .charges
            .iter()
            .map(|(_, n)| *n)
            .fold(0, u64::saturating_add);
        // Full again when the newest charge leaves the window.
        let full_in = state.charges.back().map_or(Duration::ZERO, |(at, _)| {
            inner.per.saturating_sub(now.saturating_duration_since(*at))
        });
        let remaining = inner.limit.saturating_sub(used);
        let requests_left = REQUESTS.saturating_sub(state.charges.len() as u64);
        let template = if fits {
            let stream = body.get("stream") == Some(&Value::Bool(true));
            let usage = !state.silent;
            let model = body["model"].as_str().unwrap_or("gpt-4o-mini");
            match (inner.anthropic, stream) {
                (false, false) => ResponseTemplate::new(200).set_body_raw(
                    openai_json(model, prompt, output, usage),
                    "application/json",
                ),
                (false, true) => {
                    let asked = body["stream_options"]["include_usage"] == Value::Bool(true);
                    ResponseTemplate::new(200).set_body_raw(
                        openai_events(model, prompt, output, usage && asked),
                        "text/event-stream",
                    )
                }
                (true, false) => ResponseTemplate::new(200)
                    .set_body_raw(anthropic_json(prompt, output, usage), "application/json"),
                (true, true) => ResponseTemplate::new(200)
                    .set_body_raw(anthropic_events(prompt, output, usage), "text/event-stream"),
            }
        } else {
            let error = json!({"error": {
                "message": format!("Rate limit reached for tokens per min: Limit {}, Used {used}, Requested {}.", inner.limit, prompt.saturating_add(max)),
                "type": "tokens", "code": "rate_limit_exceeded"}});
            ResponseTemplate::new(429).set_body_raw(error.to_string(), "application/json")
        };
        let said = Said {
            requests_left,
            tokens_left: remaining,
            full_in,
            refused: !fits,
        };
        inner.headers(template, &said, now)
    }
}

/// What an answer says of the quota.
struct Said {
    requests_left: u64,
    tokens_left: u64,
    /// Until the window is empty again.
    full_in: Duration,
    refused: bool,
}

impl Inner {
    /// `template` with the headers the vendor sends on every answer: its
    /// requests and tokens left, and when they are full again.
    fn headers(&self, template: ResponseTemplate, said: &Said, now: Instant) -> ResponseTemplate {
        let (requests, tokens) = (said.requests_left.to_string(), said.tokens_left.to_string());
        if !self.anthropic {
            let reset = go_duration(said.full_in);
            return template
                .insert_header("x-ratelimit-limit-requests", REQUESTS.to_string())
                .insert_header("x-ratelimit-remaining-requests", requests)
                .insert_header("x-ratelimit-reset-requests", reset.as_str())
                .insert_header("x-ratelimit-limit-tokens", self.limit.to_string())
                .insert_header("x-ratelimit-remaining-tokens", tokens)
                .insert_header("x-ratelimit-reset-tokens", reset.as_str());
        }
        let reset = rfc3339_after(wall_at(now), said.full_in);
        let template = template
            .insert_header("anthropic-ratelimit-requests-limit", REQUESTS.to_string())
            .insert_header("anthropic-ratelimit-requests-remaining", requests)
            .insert_header("anthropic-ratelimit-requests-reset", reset.as_str())
            .insert_header("anthropic-ratelimit-tokens-limit", self.limit.to_string())
            .insert_header("anthropic-ratelimit-tokens-remaining", tokens)
            .insert_header("anthropic-ratelimit-tokens-reset", reset.as_str());
        if said.refused {
            return template.insert_header("retry-after", whole_secs_up(said.full_in).to_string());
        }
        template
    }
}

/// The vendor's own count of a prompt: a token per 3 characters of each
/// message's text, the system prompt and a bare prompt.
fn prompt_tokens(body: &Value) -> u64 {
    fn text(value: &Value) -> u64 {
        match value {
            Value::String(s) => (s.chars().count() as u64).div_ceil(3),
            Value::Array(items) => items.iter().map(text).sum(),
            Value::Object(fields) => fields.get("text").map_or(0, text),
            _ => 0,
        }
    }
    let messages = body["messages"].as_array().map_or(0, |messages| {
        messages.iter().map(|m| text(&m["content"])).sum()
    });
    messages + text(&body["system"]) + text(&body["prompt"])
}

/// When the vendor says its answers were made (Unix seconds).
const CREATED: u64 = 1_764_633_600;

fn openai_json(model: &str, prompt: u64, output: u64, usage: bool) -> String {
    let mut answer = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": CREATED, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "word ".repeat(output.min(MOST_WORDS) as usize)}, "finish_reason": "stop"}],
    });
    if usage {
        answer["usage"] = json!({"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt.saturating_add(output)});
    }
    answer.to_string()
}

fn openai_events(model: &str, prompt: u64, output: u64, usage: bool) -> String {
    let chunk = |choices: Value| {
        let mut chunk = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk",
            "created": CREATED, "model": model, "choices": choices});
        if usage {
            chunk["usage"] = Value::Null;
        }
        format!("data: {chunk}\n\n")
    };
    let mut events = chunk(json!([{"index": 0, "delta": {"role": "assistant", "content": ""}}]));
    for _ in 0..output.min(3) {
        events += &chunk(json!([{"index": 0, "delta": {"content": "word "}}]));
    }
    events += &chunk(json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]));
    if usage {
        let last = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk",
            "created": CREATED, "model": model, "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt.saturating_add(output)}});
        events += &format!("data: {last}\n\n");
    }
    events + "data: [DONE]\n\n"
}

fn anthropic_json(prompt: u64, output: u64, usage: bool) -> String {
    let mut answer = json!({
        "id": "msg_1", "type": "message", "role": "assistant",
        "content": [{"type": "text", "text": "word ".repeat(output.min(MOST_WORDS) as usize)}], "stop_reason": "end_turn",
    });
    if usage {
        answer["usage"] = json!({"input_tokens": prompt, "output_tokens": output});
    }
    answer.to_string()
}

fn anthropic_events(prompt: u64, output: u64, usage: bool) -> String {
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let mut start = json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": []}});
    let mut delta = json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}});
    if usage {
        start["message"]["usage"] = json!({"input_tokens": prompt, "output_tokens": 1});
        delta["usage"] = json!({"output_tokens": output});
    }
    let mut events = event("message_start", start);
    events += &event(
        "content_block_start",
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    );
    events += &event(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "word"}}),
    );
    events += &event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    );
    events += &event("message_delta", delta);
    events + &event("message_stop", json!({"type": "message_stop"}))
}
