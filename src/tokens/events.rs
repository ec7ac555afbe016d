//! Server-sent events, scanned for usage as they pass.
//!
//! Each event's `data:` lines are joined and, when they mention `usage`,
//! read as JSON. An event passes on as it came, chunk by chunk, unless the
//! shaper asked the stream for its usage: then each event is held until its
//! blank line, so the usage-only chunk OpenAI adds for it (`choices: []`)
//! can be taken out whole. Vendors send an event per write, so holding to
//! its end delays nothing; an event past [`MAX_EVENT`] is let through as it
//! comes and the filter stops.

use bytes::{Bytes, BytesMut};
use serde_json::Value;

use super::usage::Usage;

/// The longest event (and data) read or held: a chunk of an LLM's stream
/// is a few hundred bytes.
const MAX_EVENT: usize = 1 << 20;

/// A stream of server-sent events being read.
#[derive(Debug)]
pub(crate) struct Events {
    /// The line being read, up to its end.
    line: Vec<u8>,
    /// The current event's data lines, joined by `\n`.
    data: Vec<u8>,
    /// The current event's bytes as they came, while filtering.
    held: BytesMut,
    /// Taking out the usage-only chunk the shaper asked for.
    filter: bool,
    /// The current event went past [`MAX_EVENT`]: not read.
    too_long: bool,
    usage: Usage,
}

impl Events {
    /// A stream to read; `filter` when the shaper asked it for its usage.
    pub(crate) fn new(filter: bool) -> Self {
        Self {
            line: Vec::new(),
            data: Vec::new(),
            held: BytesMut::new(),
            filter,
            too_long: false,
            usage: Usage::default(),
        }
    }

    /// Read the next `chunk`; returns what passes on to the caller.
    pub(crate) fn feed(&mut self, chunk: Bytes) -> Bytes {
        if !self.filter {
            self.scan(&chunk, &mut BytesMut::new());
            return chunk;
        }
        let mut out = BytesMut::new();
        self.scan(&chunk, &mut out);
        if self.held.len() > MAX_EVENT {
            // Too long to hold: pass it on, and hold nothing more.
            self.filter = false;
            out.extend_from_slice(&self.held.split());
        }
        out.freeze()
    }

    /// The stream ended: what is left to pass on (an event with no blank
    /// line after it is read all the same).
    pub(crate) fn finish(&mut self) -> Bytes {
        let mut out = BytesMut::new();
        let line = std::mem::take(&mut self.line);
        if !line.is_empty() {
            self.line_ended(&line, &mut out);
        }
        self.event_ended(&mut out);
        out.freeze()
    }

    /// What the stream's usage says it cost, so far.
    pub(crate) fn tokens(&self) -> Option<u64> {
        self.usage.tokens()
    }

    /// Split `chunk` into lines and read them; complete events that pass
    /// go to `out` while filtering.
    fn scan(&mut self, chunk: &[u8], out: &mut BytesMut) {
        let mut rest = chunk;
        while !rest.is_empty() {
            let (piece, ended) = match rest.iter().position(|b| *b == b'\n') {
                Some(end) => (&rest[..=end], true),
                None => (rest, false),
            };
            rest = &rest[piece.len()..];
            if self.filter {
                self.held.extend_from_slice(piece);
            }
            if self.line.len() + piece.len() > MAX_EVENT {
                self.too_long = true;
            } else {
                self.line.extend_from_slice(piece);
            }
            if ended {
                let line = std::mem::take(&mut self.line);
                self.line_ended(&line, out);
                self.line = line;
                self.line.clear();
            }
        }
    }

    fn line_ended(&mut self, line: &[u8], out: &mut BytesMut) {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            self.event_ended(out);
            return;
        }
        if let Some(value) = line.strip_prefix(b"data:") {
            let value = value.strip_prefix(b" ").unwrap_or(value);
            if self.data.len() + value.len() + 1 > MAX_EVENT {
                self.too_long = true;
                return;
            }
            if !self.data.is_empty() {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(value);
        }
    }

    /// A blank line: read the event's data, and pass the event on unless
    /// it is the usage-only chunk the shaper asked for.
    fn event_ended(&mut self, out: &mut BytesMut) {
        let data = std::mem::take(&mut self.data);
        let mut ours = false;
        if !self.too_long
            && mentions_usage(&data)
            && let Ok(document) = serde_json::from_slice::<Value>(&data)
        {
            self.usage.read(&document);
            ours = self.filter && usage_only(&document);
        }
        self.too_long = false;
        self.data = data;
        self.data.clear();
        let event = self.held.split();
        if !ours {
            out.extend_from_slice(&event);
        }
    }
}

fn mentions_usage(data: &[u8]) -> bool {
    data.windows(7).any(|w| w == b"\"usage\"")
}

/// OpenAI's chunk for `include_usage`: no choices, only the usage.
fn usage_only(document: &Value) -> bool {
    document
        .get("choices")
        .and_then(Value::as_array)
        .is_some_and(Vec::is_empty)
        && document.get("usage").is_some_and(Value::is_object)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPENAI: &str = concat!(
        "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n",
        "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n",
        "data: [DONE]\n\n",
    );

    /// The stream fed in pieces of `size` bytes: what passed, and the cost.
    fn read(stream: &str, size: usize, filter: bool) -> (String, Option<u64>) {
        let mut events = Events::new(filter);
        let mut passed = Vec::new();
        for piece in stream.as_bytes().chunks(size) {
            passed.extend_from_slice(&events.feed(Bytes::copy_from_slice(piece)));
        }
        passed.extend_from_slice(&events.finish());
        (String::from_utf8(passed).unwrap(), events.tokens())
    }

    #[test]
    fn usage_is_read_however_the_stream_is_cut() {
        for size in [1, 2, 7, 64, 4096] {
            assert_eq!(
                read(OPENAI, size, false),
                (OPENAI.to_owned(), Some(11)),
                "{size}"
            );
        }
    }

    #[test]
    fn the_usage_chunk_the_shaper_asked_for_is_taken_out() {
        let without = OPENAI.replace(
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n",
            "",
        );
        for size in [1, 5, 4096] {
            assert_eq!(
                read(OPENAI, size, true),
                (without.clone(), Some(11)),
                "{size}"
            );
        }
    }

    #[test]
    fn anthropic_s_events_with_crlf_and_split_data() {
        let stream = concat!(
            "event: message_start\r\n",
            "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\r\n\r\n",
            ": a comment\r\n\r\n",
            "event: message_delta\r\n",
            "data: {\"type\":\"message_delta\",\r\n",
            "data: \"usage\":{\"output_tokens\":15}}\r\n\r\n",
            "event: message_stop\r\n",
            "data: {\"type\":\"message_stop\"}",
        );
        assert_eq!(read(stream, 3, false), (stream.to_owned(), Some(40)));
        assert_eq!(read(stream, 3, true), (stream.to_owned(), Some(40)));
    }

    #[test]
    fn an_event_too_long_to_hold_passes_and_is_not_read() {
        let long = format!(
            "data: {{\"usage\":{{\"total_tokens\":5}},\"pad\":\"{}\"}}",
            "x".repeat(MAX_EVENT)
        );
        let rest = format!("\n\n{OPENAI}");
        let mut events = Events::new(true);
        let mut passed = events.feed(Bytes::from(long.clone())).to_vec();
        // Held past its bound: passed on before its end, and the filter
        // stopped.
        assert_eq!(passed.len(), long.len());
        passed.extend_from_slice(&events.feed(Bytes::from(rest.clone())));
        passed.extend_from_slice(&events.finish());
        let stream = format!("{long}{rest}");
        assert!(
            passed == stream.as_bytes(),
            "{} bytes passed of {}",
            passed.len(),
            stream.len()
        );
        assert_eq!(events.tokens(), Some(11));
    }

    #[test]
    fn garbage_says_nothing_and_passes() {
        let stream = "data: {\"usage\": oops\n\ndata: \"usage\"\n\n\n\n\u{0}\u{ff}";
        assert_eq!(read(stream, 4, true), (stream.to_owned(), None));
    }
}
