//! A response with its body wrapped, for the wrappers that watch a body to
//! its end (`held.rs`, `usage.rs`): the one place that takes a reqwest
//! response apart and puts it back together.

use reqwest::ResponseBuilderExt;

/// `response` with its body passed through `wrap`; status, headers,
/// extensions and URL as they were.
pub(super) fn wrap_body(
    response: reqwest::Response,
    wrap: impl FnOnce(reqwest::Body) -> reqwest::Body,
) -> reqwest::Response {
    let url = response.url().clone();
    let (mut parts, body) = http::Response::<reqwest::Body>::from(response).into_parts();
    // reqwest keeps a response's URL in an extension only its builder
    // sets, and the conversion above leaves it behind.
    if let Ok(carrier) = http::Response::builder().url(url).body(()) {
        parts.extensions.extend(carrier.into_parts().0.extensions);
    }
    reqwest::Response::from(http::Response::from_parts(parts, wrap(body)))
}
