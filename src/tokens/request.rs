//! Reading a request's JSON body: what it may cost, and asking a stream
//! for its usage.

use reqwest::Request;
use reqwest::header::{ACCEPT_ENCODING, CONTENT_LENGTH, HeaderValue};
use serde_json::Value;

use super::cost::{Style, TokenCost};

/// Keys whose strings are data, not text: base64 images, audio and files
/// (`image_url` holds a URL or a `data:` URL). They are tokens of another
/// kind, which the answer's usage settles.
const DATA_KEYS: [&str; 5] = ["data", "file_data", "image_url", "input_audio", "b64_json"];

/// The most choices a request may ask for (OpenAI's `n` stops at 128).
const MAX_CHOICES: u64 = 128;

/// What reading a request's body found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Prepared {
    /// What the request may cost, when its body says.
    pub(crate) estimate: Option<u64>,
    /// The request was asked for its usage on its caller's behalf: the
    /// usage-only chunk of its stream is the shaper's, not the caller's.
    pub(crate) asked_usage: bool,
}

impl TokenCost {
    /// Read `request`'s body for its cost, and ask a streaming OpenAI-style
    /// request for its usage when it does not say. A body that is not a
    /// JSON object in memory (a stream, a form) has no estimate.
    ///
    /// The answer is asked to come unencoded: usage in a compressed body
    /// could not be read (reqwest decodes only with its own features, and
    /// then takes the `Accept-Encoding` header on itself).
    pub(crate) fn prepare(&self, request: &mut Request) -> Prepared {
        let Some(body) = request.body().and_then(reqwest::Body::as_bytes) else {
            return Prepared::default();
        };
        let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(body) else {
            return Prepared::default();
        };
        let estimate = self.estimate(&fields);
        let asked = self.asks_usage(&fields).then(|| ask_usage(body)).flatten();
        let asked_usage = asked.is_some();
        if let Some(body) = asked {
            *request.body_mut() = Some(body.into());
            // The body grew: the length is reqwest's to set again.
            request.headers_mut().remove(CONTENT_LENGTH);
        }
        if request.headers().contains_key(ACCEPT_ENCODING) {
            request
                .headers_mut()
                .insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        }
        Prepared {
            estimate: Some(estimate),
            asked_usage,
        }
    }

    /// The prompt's tokens and the longest answer the request allows, for
    /// each choice it asks for; every number saturates.
    fn estimate(&self, fields: &serde_json::Map<String, Value>) -> u64 {
        let output = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
            .iter()
            .find_map(|key| fields.get(*key).and_then(count))
            .unwrap_or(self.default_output);
        let choices = fields
            .get("n")
            .and_then(count)
            .unwrap_or(1)
            .clamp(1, MAX_CHOICES);
        let prompt = fields
            .iter()
            .map(|(key, value)| text_tokens(key, value))
            .fold(0, u64::saturating_add);
        prompt.saturating_add(output.saturating_mul(choices))
    }

    /// A streaming chat or completions request that says nothing of its
    /// usage, to a vendor whose streams report it only when asked. The
    /// Responses API (`input`) reports it unasked and refuses the option.
    fn asks_usage(&self, fields: &serde_json::Map<String, Value>) -> bool {
        self.style == Style::OpenAi
            && self.include_usage
            && fields.get("stream") == Some(&Value::Bool(true))
            && !fields.contains_key("stream_options")
            && (fields.contains_key("messages") || fields.contains_key("prompt"))
    }
}

/// A count a caller wrote: a whole number, or a positive fraction rounded
/// up; anything else (negative, text, null) says nothing.
fn count(value: &Value) -> Option<u64> {
    value.as_u64().or_else(|| {
        let n = value.as_f64()?;
        // `as` saturates: 1e300 is u64::MAX.
        (n.is_finite() && n >= 0.0).then(|| n.ceil() as u64)
    })
}

/// The tokens of the text under `key`: a token per 4 ASCII characters
/// (English and code), one per other character (CJK runs close to one a
/// character; fewer would let a prompt in Chinese be charged a quarter of
/// what it costs).
fn text_tokens(key: &str, value: &Value) -> u64 {
    if DATA_KEYS.contains(&key) {
        return 0;
    }
    match value {
        Value::String(text) if text.starts_with("data:") => 0,
        Value::String(text) => {
            let ascii = text.bytes().filter(u8::is_ascii).count() as u64;
            let other = text.chars().filter(|c| !c.is_ascii()).count() as u64;
            ascii.div_ceil(4).saturating_add(other)
        }
        Value::Array(items) => items
            .iter()
            .map(|item| text_tokens("", item))
            .fold(0, u64::saturating_add),
        Value::Object(fields) => fields
            .iter()
            .map(|(key, value)| text_tokens(key, value))
            .fold(0, u64::saturating_add),
        Value::Null | Value::Bool(_) | Value::Number(_) => 0,
    }
}

/// `body` with `"stream_options":{"include_usage":true}` as its first
/// field, spliced in so the caller's bytes stay as they were (no key
/// reordered, no number reformatted).
fn ask_usage(body: &[u8]) -> Option<Vec<u8>> {
    let open = body.iter().position(|b| !b.is_ascii_whitespace())?;
    if body[open] != b'{' {
        return None;
    }
    const FIELD: &[u8] = br#""stream_options":{"include_usage":true},"#;
    let mut spliced = Vec::with_capacity(body.len() + FIELD.len());
    spliced.extend_from_slice(&body[..=open]);
    spliced.extend_from_slice(FIELD);
    spliced.extend_from_slice(&body[open + 1..]);
    Some(spliced)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: &str) -> Request {
        let mut request = Request::new(
            reqwest::Method::POST,
            "http://api.test/v1/chat/completions".parse().unwrap(),
        );
        *request.body_mut() = Some(body.to_owned().into());
        request
    }

    fn body(request: &Request) -> Value {
        serde_json::from_slice(request.body().unwrap().as_bytes().unwrap()).unwrap()
    }

    #[test]
    fn the_estimate_is_the_prompt_and_the_longest_answer_for_each_choice() {
        // "Hello there" is 11 ASCII characters (3 tokens), "user" and
        // "gpt-4o" 1 and 2; 100 tokens for each of 2 choices.
        let mut r = request(
            r#"{"model":"gpt-4o","n":2,"max_tokens":100,"messages":[{"role":"user","content":"Hello there"}]}"#,
        );
        let prepared = TokenCost::openai().prepare(&mut r);
        assert_eq!(prepared.estimate, Some(3 + 1 + 2 + 200));
        assert!(!prepared.asked_usage);
    }

    #[test]
    fn text_outside_ascii_counts_a_token_a_character() {
        let mut r = request(r#"{"max_tokens":1,"prompt":"日本語のテキスト"}"#);
        assert_eq!(TokenCost::openai().prepare(&mut r).estimate, Some(8 + 1));
    }

    #[test]
    fn images_and_files_are_left_to_the_usage() {
        let image = "A".repeat(40_000);
        let mut r = request(&format!(
            r#"{{"max_tokens":10,"messages":[{{"role":"user","content":[
              {{"type":"image_url","image_url":{{"url":"data:image/png;base64,{image}"}}}},
              {{"type":"image","source":{{"type":"base64","data":"{image}"}}}}]}}]}}"#
        ));
        let estimate = TokenCost::anthropic().prepare(&mut r).estimate.unwrap();
        assert!(estimate < 50, "{estimate}");
    }

    #[test]
    fn hostile_numbers_saturate_or_fall_back_to_the_default() {
        let cost = TokenCost::openai().default_output(7);
        for (said, output) in [
            (r#""max_tokens":18446744073709551615,"n":3"#, u64::MAX),
            (r#""max_tokens":1e300"#, u64::MAX),
            (r#""max_tokens":-5"#, 7),
            // "lots" is a token of prompt, and no limit.
            (r#""max_tokens":"lots""#, 1 + 7),
            (r#""max_tokens":null,"n":-1"#, 7),
            (r#""max_completion_tokens":2.5"#, 3),
            (r#""max_output_tokens":0,"n":1000000"#, 0),
        ] {
            let mut r = request(&format!("{{{said}}}"));
            assert_eq!(cost.prepare(&mut r).estimate, Some(output), "{said}");
        }
    }

    #[test]
    fn a_body_that_is_not_a_json_object_has_no_estimate() {
        for text in ["", "[1,2]", "max_tokens=5", "{\"max_tokens\":", "\"text\""] {
            let mut r = request(text);
            assert_eq!(
                TokenCost::openai().prepare(&mut r),
                Prepared::default(),
                "{text}"
            );
        }
        let mut streamed = request("{}");
        *streamed.body_mut() = Some(reqwest::Body::wrap(Streamed));
        assert_eq!(
            TokenCost::openai().prepare(&mut streamed),
            Prepared::default()
        );
    }

    /// A body that is not in memory.
    struct Streamed;

    impl http_body::Body for Streamed {
        type Data = bytes::Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, std::io::Error>>>
        {
            std::task::Poll::Ready(None)
        }
    }

    #[test]
    fn a_stream_that_says_nothing_is_asked_for_its_usage_and_keeps_its_bytes() {
        let text =
            r#" {"stream":true,"temperature":0.70,"messages":[{"role":"user","content":"hi"}]}"#;
        let mut r = request(text);
        r.headers_mut()
            .insert(CONTENT_LENGTH, HeaderValue::from(text.len()));
        r.headers_mut()
            .insert(ACCEPT_ENCODING, HeaderValue::from_static("gzip, br"));
        assert!(TokenCost::openai().prepare(&mut r).asked_usage);
        let sent = std::str::from_utf8(r.body().unwrap().as_bytes().unwrap()).unwrap();
        assert_eq!(
            sent,
            r#" {"stream_options":{"include_usage":true},"stream":true,"temperature":0.70,"messages":[{"role":"user","content":"hi"}]}"#
        );
        assert_eq!(body(&r)["stream_options"]["include_usage"], true);
        assert!(r.headers().get(CONTENT_LENGTH).is_none());
        assert_eq!(r.headers()[ACCEPT_ENCODING], "identity");
    }

    #[test]
    fn only_an_openai_stream_that_says_nothing_is_asked() {
        let asked = |cost: TokenCost, text: &str| cost.prepare(&mut request(text)).asked_usage;
        let chat = r#"{"stream":true,"messages":[]}"#;
        assert!(asked(TokenCost::openai(), chat));
        assert!(!asked(TokenCost::openai().include_usage(false), chat));
        assert!(!asked(TokenCost::anthropic().include_usage(true), chat));
        assert!(!asked(
            TokenCost::openai(),
            r#"{"stream":false,"messages":[]}"#
        ));
        assert!(!asked(
            TokenCost::openai(),
            r#"{"stream":true,"stream_options":{"include_usage":false},"messages":[]}"#
        ));
        // The Responses API reports usage unasked, and refuses the option.
        assert!(!asked(
            TokenCost::openai(),
            r#"{"stream":true,"input":"hi"}"#
        ));
    }
}
