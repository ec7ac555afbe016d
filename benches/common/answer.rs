//! The headers a real vendor answers every request with, for the
//! benchmarks' origins: OpenAI's rate-limit headers (with limits far above
//! any benchmark's load) and a request id. A bare answer would let the
//! shaper skip reading its signals, which no real vendor's answer does.

/// Each header's name and value, as OpenAI sends them on every answer.
pub const VENDOR_HEADERS: [(&str, &str); 7] = [
    ("x-ratelimit-limit-requests", "100000000"),
    ("x-ratelimit-remaining-requests", "99999999"),
    ("x-ratelimit-reset-requests", "1ms"),
    ("x-ratelimit-limit-tokens", "2000000000"),
    ("x-ratelimit-remaining-tokens", "1999999999"),
    ("x-ratelimit-reset-tokens", "1ms"),
    ("x-request-id", "req_0123456789abcdef0123456789abcdef"),
];

/// `response` with [`VENDOR_HEADERS`].
pub fn as_a_vendor<B>(mut response: http::Response<B>) -> http::Response<B> {
    for (name, value) in VENDOR_HEADERS {
        response.headers_mut().insert(
            http::HeaderName::from_static(name),
            http::HeaderValue::from_static(value),
        );
    }
    response
}
