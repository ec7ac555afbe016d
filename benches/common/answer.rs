//! The headers a real vendor answers every request with, for the
//! benchmarks' origins: an OpenAI chat completion's, as its edge sends
//! them (rate-limit headers with limits far above any benchmark's load,
//! its own, its proxy's and the HTTP date). A bare answer would let the
//! shaper skip reading its signals, and a short one would make reading
//! them look cheaper than any real answer does.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

/// Each header's name and value, as OpenAI sends them on every answer
/// (cookie values shortened), besides `date`.
pub const VENDOR_HEADERS: [(&str, &str); 22] = [
    ("content-type", "application/json"),
    ("access-control-expose-headers", "X-Request-ID"),
    ("openai-organization", "user-0123456789abcdef01234567"),
    ("openai-processing-ms", "345"),
    ("openai-project", "proj_0123456789abcdef01234567"),
    ("openai-version", "2020-10-01"),
    ("x-envoy-upstream-service-time", "350"),
    ("x-ratelimit-limit-requests", "100000000"),
    ("x-ratelimit-limit-tokens", "2000000000"),
    ("x-ratelimit-remaining-requests", "99999999"),
    ("x-ratelimit-remaining-tokens", "1999999999"),
    ("x-ratelimit-reset-requests", "1ms"),
    ("x-ratelimit-reset-tokens", "1ms"),
    ("x-request-id", "req_0123456789abcdef0123456789abcdef"),
    (
        "strict-transport-security",
        "max-age=31536000; includeSubDomains; preload",
    ),
    ("cf-cache-status", "DYNAMIC"),
    (
        "set-cookie",
        "__cf_bm=0123456789abcdef; path=/; domain=.api.openai.com; HttpOnly; Secure; SameSite=None",
    ),
    (
        "set-cookie",
        "_cfuvid=0123456789abcdef; path=/; domain=.api.openai.com; HttpOnly; Secure; SameSite=None",
    ),
    ("x-content-type-options", "nosniff"),
    ("server", "cloudflare"),
    ("cf-ray", "8f1a2b3c4d5e6f70-SJC"),
    ("alt-svc", "h3=\":443\"; ma=86400"),
];

thread_local! {
    /// The date header of the current second, made once a second, as an
    /// HTTP server keeps it (hyper does).
    static DATE: RefCell<(u64, http::HeaderValue)> =
        const { RefCell::new((0, http::HeaderValue::from_static(""))) };
}

/// The `date` header now.
fn date() -> http::HeaderValue {
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with(|date| {
        let mut date = date.borrow_mut();
        if date.0 != second {
            let text = httpdate::fmt_http_date(now);
            *date = (second, http::HeaderValue::from_str(&text).expect("a date"));
        }
        date.1.clone()
    })
}

/// `response` with the `date` and [`VENDOR_HEADERS`].
pub fn as_a_vendor<B>(mut response: http::Response<B>) -> http::Response<B> {
    let headers = response.headers_mut();
    headers.insert(http::header::DATE, date());
    for (name, value) in VENDOR_HEADERS {
        headers.append(
            http::HeaderName::from_static(name),
            http::HeaderValue::from_static(value),
        );
    }
    response
}
