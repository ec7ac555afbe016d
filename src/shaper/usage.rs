//! A response whose body settles its request's cost from the usage it
//! reports, as it passes: a [`TokenCost`](crate::tokens::TokenCost) lane's
//! answers (a JSON body read at its end, or server-sent events read one by
//! one), for the library's callers and the proxy's alike.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use reqwest::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE};

use super::body::wrap_body;
use super::settle::Settle;
use crate::tokens::{Events, Json, Prepared};

/// `response`, its body reporting its usage to its [`Settle`] when it
/// ends. An answer that failed, is encoded, or is neither JSON nor events
/// is left as it is: its estimate stands.
pub(super) fn settle_from_usage(
    response: reqwest::Response,
    prepared: Prepared,
) -> reqwest::Response {
    let Some(settle) = response.extensions().get::<Settle>().cloned() else {
        return response;
    };
    let Some(reader) = reader_for(&response, prepared) else {
        return response;
    };
    let mut response = response;
    if prepared.asked_usage {
        // The chunk taken out shortens the body: a length would be a lie
        // (and the proxy's client would wait for the bytes).
        response.headers_mut().remove(CONTENT_LENGTH);
    }
    wrap_body(response, |body| {
        reqwest::Body::wrap(Metered {
            body,
            reader,
            settle: Some(settle),
        })
    })
}

/// How the answer's usage is read, from its headers.
fn reader_for(response: &reqwest::Response, prepared: Prepared) -> Option<Reader> {
    if !response.status().is_success() {
        return None;
    }
    let headers = response.headers();
    if headers
        .get(CONTENT_ENCODING)
        .is_some_and(|e| !e.as_bytes().eq_ignore_ascii_case(b"identity"))
    {
        return None;
    }
    let kind = headers.get(CONTENT_TYPE)?.to_str().ok()?;
    let essence = kind.split(';').next()?.trim().to_ascii_lowercase();
    if essence == "text/event-stream" {
        Some(Reader::Events(Events::new(prepared.asked_usage)))
    } else if essence == "application/json" || essence.ends_with("+json") {
        Some(Reader::Json(Json::default()))
    } else {
        None
    }
}

enum Reader {
    Json(Json),
    Events(Events),
}

impl Reader {
    /// Read `chunk`; what passes on to the caller.
    fn feed(&mut self, chunk: Bytes) -> Bytes {
        match self {
            Self::Json(json) => {
                json.feed(&chunk);
                chunk
            }
            Self::Events(events) => events.feed(chunk),
        }
    }

    /// The body ended: what is left to pass on.
    fn finish(&mut self) -> Bytes {
        match self {
            Self::Json(_) => Bytes::new(),
            Self::Events(events) => events.finish(),
        }
    }

    /// The usage, once the body ended.
    fn tokens(&self) -> Option<u64> {
        match self {
            Self::Json(json) => json.tokens(),
            Self::Events(events) => events.tokens(),
        }
    }

    /// The usage of a body its reader dropped before its end: a stream's
    /// usage may come before its last bytes (`[DONE]`); a JSON document
    /// read in part says nothing.
    fn tokens_so_far(&self) -> Option<u64> {
        match self {
            Self::Json(_) => None,
            Self::Events(events) => events.tokens(),
        }
    }
}

/// A body and the reader of its usage.
struct Metered {
    body: reqwest::Body,
    reader: Reader,
    /// Until reported.
    settle: Option<Settle>,
}

impl Metered {
    /// The body ended: report what it cost; returns what is left to pass.
    fn ended(&mut self) -> Bytes {
        let rest = self.reader.finish();
        if let (Some(settle), Some(tokens)) = (self.settle.take(), self.reader.tokens()) {
            settle.report(tokens);
        }
        rest
    }

    /// The last frame: `passed` and what the reader still held, once.
    fn last(&mut self, passed: Bytes) -> Option<Result<Frame<Bytes>, reqwest::Error>> {
        let rest = if self.settle.is_some() {
            self.ended()
        } else {
            Bytes::new()
        };
        let last = join(passed, rest);
        (!last.is_empty()).then(|| Ok(Frame::data(last)))
    }
}

impl Body for Metered {
    type Data = Bytes;
    type Error = reqwest::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, reqwest::Error>>> {
        loop {
            let frame = match std::task::ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(error)) => {
                    // Cut short: the estimate stands.
                    self.settle = None;
                    return Poll::Ready(Some(Err(error)));
                }
                None => return Poll::Ready(self.last(Bytes::new())),
            };
            let chunk = match frame.into_data() {
                Ok(chunk) => chunk,
                Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
            };
            let passed = self.reader.feed(chunk);
            if self.body.is_end_stream() {
                return Poll::Ready(self.last(passed));
            }
            // An empty piece is an event held until it ends.
            if !passed.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(passed))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.settle.is_none() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match self.reader {
            // Events may be taken out: no exact length.
            Reader::Events(_) => SizeHint::new(),
            Reader::Json(_) => self.body.size_hint(),
        }
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        if let (Some(settle), Some(tokens)) = (self.settle.take(), self.reader.tokens_so_far()) {
            settle.report(tokens);
        }
    }
}

fn join(first: Bytes, second: Bytes) -> Bytes {
    match (first.is_empty(), second.is_empty()) {
        (_, true) => first,
        (true, false) => second,
        (false, false) => [first, second].concat().into(),
    }
}
