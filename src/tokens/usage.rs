//! Reading `usage`, however a vendor spells it and wherever it puts it.
//!
//! | vendor | where | fields |
//! |---|---|---|
//! | OpenAI chat, completions | the body; a stream's last chunk | `prompt_tokens`, `completion_tokens`, `total_tokens` |
//! | OpenAI Responses | the body; `response.completed`'s `response` | `input_tokens`, `output_tokens`, `total_tokens` |
//! | Anthropic Messages | the body; `message_start`'s `message`, then each `message_delta` | `input_tokens`, `output_tokens`, `cache_creation_input_tokens` |
//!
//! A stream's counts are running totals (Anthropic's `message_delta`
//! repeats the output so far), so each field keeps the largest seen.

use serde_json::Value;

/// The most of a JSON answer kept to read its usage: an LLM's answer is a
/// few kilobytes; past this the estimate stands.
const MAX_JSON: usize = 4 << 20;

/// An answer's usage, field by field, over every document that carried it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    total: Option<u64>,
    input: Option<u64>,
    output: Option<u64>,
    cache_writes: Option<u64>,
}

impl Usage {
    /// Take in one document (a body, or an event's data): its `usage`, or
    /// that of its `message` (Anthropic's stream) or `response` (OpenAI's
    /// Responses stream). Counts that are not whole numbers are ignored.
    pub(crate) fn read(&mut self, document: &Value) {
        let usage = [
            document.get("usage"),
            document.get("message").and_then(|m| m.get("usage")),
            document.get("response").and_then(|r| r.get("usage")),
        ];
        for usage in usage.into_iter().flatten().filter(|u| u.is_object()) {
            let field = |names: &[&str]| names.iter().find_map(|n| usage.get(*n)?.as_u64());
            keep_largest(&mut self.total, field(&["total_tokens"]));
            keep_largest(&mut self.input, field(&["input_tokens", "prompt_tokens"]));
            keep_largest(
                &mut self.output,
                field(&["output_tokens", "completion_tokens"]),
            );
            keep_largest(
                &mut self.cache_writes,
                field(&["cache_creation_input_tokens"]),
            );
        }
    }

    /// What the request cost: the total the vendor gave, else the sum of
    /// its parts; `None` when it said nothing.
    pub(crate) fn tokens(&self) -> Option<u64> {
        self.total.or_else(|| {
            [self.input, self.output, self.cache_writes]
                .into_iter()
                .flatten()
                .reduce(u64::saturating_add)
        })
    }
}

fn keep_largest(kept: &mut Option<u64>, seen: Option<u64>) {
    if let Some(seen) = seen {
        *kept = Some(kept.map_or(seen, |k| k.max(seen)));
    }
}

/// A JSON answer, kept as it passes (up to [`MAX_JSON`]) and read at its
/// end.
#[derive(Debug, Default)]
pub(crate) struct Json {
    bytes: Vec<u8>,
    too_long: bool,
}

impl Json {
    /// The next piece of the body.
    pub(crate) fn feed(&mut self, chunk: &[u8]) {
        if self.too_long || self.bytes.len() + chunk.len() > MAX_JSON {
            self.too_long = true;
            self.bytes = Vec::new();
            return;
        }
        self.bytes.extend_from_slice(chunk);
    }

    /// The body ended: what its usage says it cost.
    pub(crate) fn tokens(&self) -> Option<u64> {
        if self.too_long {
            return None;
        }
        let document = serde_json::from_slice::<Value>(&self.bytes).ok()?;
        let mut usage = Usage::default();
        usage.read(&document);
        usage.tokens()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(documents: &[&str]) -> Option<u64> {
        let mut usage = Usage::default();
        for document in documents {
            usage.read(&serde_json::from_str(document).unwrap());
        }
        usage.tokens()
    }

    #[test]
    fn each_vendor_s_spelling_is_read() {
        let openai = r#"{"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}"#;
        assert_eq!(tokens(&[openai]), Some(21));
        let responses = r#"{"type":"response.completed","response":{"usage":{"input_tokens":5,"output_tokens":7,"total_tokens":12}}}"#;
        assert_eq!(tokens(&[responses]), Some(12));
        // Cache reads do not count toward Anthropic's input limits.
        let anthropic = r#"{"usage":{"input_tokens":10,"cache_creation_input_tokens":200,"cache_read_input_tokens":5000,"output_tokens":30}}"#;
        assert_eq!(tokens(&[anthropic]), Some(240));
    }

    #[test]
    fn a_stream_s_running_totals_keep_the_largest() {
        let start =
            r#"{"type":"message_start","message":{"usage":{"input_tokens":25,"output_tokens":1}}}"#;
        let delta =
            |n: u64| format!(r#"{{"type":"message_delta","usage":{{"output_tokens":{n}}}}}"#);
        assert_eq!(tokens(&[start, &delta(8), &delta(15)]), Some(40));
    }

    #[test]
    fn nothing_usable_says_nothing() {
        assert_eq!(tokens(&[r#"{"usage":null}"#, r#"{"choices":[]}"#]), None);
        assert_eq!(
            tokens(&[r#"{"usage":{"total_tokens":-3,"input_tokens":"many","output_tokens":1.5}}"#]),
            None
        );
        let huge = r#"{"usage":{"input_tokens":18446744073709551615,"output_tokens":9}}"#;
        assert_eq!(tokens(&[huge]), Some(u64::MAX));
    }

    #[test]
    fn a_json_answer_is_read_whole_and_only_within_its_bound() {
        let mut json = Json::default();
        for piece in [r#"{"id":"x","usage":{"total_"#, r#"tokens":42}}"#] {
            json.feed(piece.as_bytes());
        }
        assert_eq!(json.tokens(), Some(42));
        let mut long = Json::default();
        long.feed(br#"{"usage":{"total_tokens":42},"pad":""#);
        long.feed(&vec![b'a'; MAX_JSON]);
        long.feed(br#""}"#);
        assert_eq!(long.tokens(), None);
        let mut cut = Json::default();
        cut.feed(br#"{"usage":{"total_tokens":42}"#);
        assert_eq!(cut.tokens(), None);
    }
}
