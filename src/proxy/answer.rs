//! What the client is answered: the vendor's response as it came, or the
//! proxy's own when the shaper ended the request or the proxy refused it,
//! with a `Retry-After` computed from the lane.

use std::time::Duration;

use http::header::{self, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};
use reqwest::Url;

use super::body::{ProxyBody, full, relay};
use super::forward::{Refusal, end_to_end, relocated};
use crate::error::Error;
use crate::lane::LaneSnapshot;
use crate::shaper::handle::Shaper;

/// The header naming why the proxy answered by itself.
pub(super) const REASON: &str = "x-callshaper-reason";

/// The vendor's answer from the upstream `name` at `base`, hop-by-hop
/// headers aside, a redirect under the base kept under the proxy (see
/// [`relocated`]), its body relayed. A `101 Switching Protocols` is 502:
/// the proxy asks for no upgrade (`Upgrade` is hop-by-hop), so a vendor
/// switching anyway answered what no client can follow, and relayed it
/// would leave the client's connection in a protocol neither side speaks.
pub(super) fn vendor(response: reqwest::Response, name: &str, base: &Url) -> Response<ProxyBody> {
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        return own(
            StatusCode::BAD_GATEWAY,
            "vendor_switched_protocols",
            "the vendor answered 101 Switching Protocols to a request that asked for no upgrade",
            None,
        );
    }
    let location = response
        .headers()
        .get(header::LOCATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|location| relocated(location, response.url(), name, base))
        .and_then(|location| HeaderValue::try_from(location).ok());
    let (parts, body) = http::Response::<reqwest::Body>::from(response).into_parts();
    // Status and headers only: the version is the client's connection's.
    let mut answer = Response::new(relay(body));
    *answer.status_mut() = parts.status;
    *answer.headers_mut() = end_to_end(parts.headers);
    if let Some(location) = location {
        answer.headers_mut().insert(header::LOCATION, location);
    }
    answer
}

/// The proxy's answer to a request the shaper ended with `error`: 429
/// when waiting longer would not help the client (its queue is full, its
/// deadline too near), 503 when the lane cannot serve now (a store down,
/// a shutdown, a pause past `max_pause`), the vendor's status when it is
/// out of credit, and for a request that can never fit its quota, 413.
pub(super) fn shaper_ended(error: &Error, shaper: &Shaper) -> Response<ProxyBody> {
    let status = match error {
        Error::QueueFull { .. }
        | Error::WouldExceedMaxWait { .. }
        | Error::MaxWaitElapsed { .. }
        | Error::RetryBudgetExhausted { .. }
        | Error::AttemptsSpent { .. } => StatusCode::TOO_MANY_REQUESTS,
        Error::CostTooHigh { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        Error::OutOfCredit { status, .. } => *status,
        Error::RetriesExhausted { last_status, .. } => *last_status,
        Error::Transport { .. } => StatusCode::BAD_GATEWAY,
        Error::InvalidRequest(_) => StatusCode::BAD_REQUEST,
        Error::NoQuota { .. } => StatusCode::NOT_FOUND,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    let retry_after = retry_after(error, shaper);
    own(status, error.reason(), &error.to_string(), retry_after)
}

/// The proxy's answer to a request it would not forward.
pub(super) fn refused(refusal: &Refusal, upstreams: &[&str]) -> Response<ProxyBody> {
    match refusal {
        Refusal::NotAProxy => own(
            StatusCode::METHOD_NOT_ALLOWED,
            "not_a_proxy",
            "only origin-form requests to a configured upstream are forwarded: /NAME/path",
            None,
        ),
        Refusal::Unknown(name) => own(
            StatusCode::NOT_FOUND,
            "unknown_upstream",
            &format!("no upstream {name:?}; configured: {}", upstreams.join(", ")),
            None,
        ),
        Refusal::DotSegment => own(
            StatusCode::BAD_REQUEST,
            "dot_segment",
            "a path with `.` or `..` segments would leave the upstream's base",
            None,
        ),
        Refusal::Control(name, problem) => own(
            StatusCode::BAD_REQUEST,
            "bad_control",
            &format!("{name}: {problem}"),
            None,
        ),
        Refusal::Unauthorized => {
            let mut answer = own(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this proxy admits requests with its client token in x-callshaper-token",
                None,
            );
            answer.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("x-callshaper-token"),
            );
            answer
        }
    }
}

/// A request body that ended before its end: a body kept whole was never
/// sent; a streaming one was cut at the vendor where it ended.
pub(super) fn cut_off_body() -> Response<ProxyBody> {
    own(
        StatusCode::BAD_REQUEST,
        "body_cut_off",
        "the request body ended before its end",
        None,
    )
}

/// A request body the client left silent for `idle`: 408, and the
/// connection closes (the rest of the body is never read).
pub(super) fn body_stalled(idle: Duration) -> Response<ProxyBody> {
    let mut answer = own(
        StatusCode::REQUEST_TIMEOUT,
        "body_stalled",
        &format!("the client sent nothing of its request body for {idle:?}"),
        None,
    );
    answer
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    answer
}

/// An answer of the proxy's own: `status`, `x-callshaper-reason`, a
/// `Retry-After` in whole seconds (rounded up) when given, and a JSON
/// body saying the same.
fn own(
    status: StatusCode,
    reason: &str,
    message: &str,
    retry_after: Option<Duration>,
) -> Response<ProxyBody> {
    let seconds = retry_after.map(|wait| {
        wait.as_secs()
            .saturating_add(u64::from(wait.subsec_nanos() > 0))
    });
    let mut said = serde_json::json!({ "reason": reason, "message": message });
    if let Some(seconds) = seconds {
        said["retry_after_seconds"] = seconds.into();
    }
    let body = serde_json::json!({ "error": said }).to_string();
    let mut answer = Response::new(full(body));
    *answer.status_mut() = status;
    let headers = answer.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Ok(reason) = HeaderValue::from_str(reason) {
        headers.insert(REASON, reason);
    }
    if let Some(seconds) = seconds {
        headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    answer
}

/// When trying again may succeed: the wait the lane predicted, the pause
/// the vendor asked for, else the lane's pause and queue at its pace; at
/// least a second. `None` where no wait helps (a request that can never
/// fit, a bad request).
fn retry_after(error: &Error, shaper: &Shaper) -> Option<Duration> {
    let least = Duration::from_secs(1);
    let wait = match error {
        Error::WouldExceedMaxWait { predicted, .. } => *predicted,
        Error::PauseTooLong { requested, .. } => *requested,
        Error::CostTooHigh { .. } | Error::InvalidRequest(_) | Error::NoQuota { .. } => {
            return None;
        }
        _ => error
            .lane()
            .and_then(|lane| shaper.lane(lane))
            .map(|lane| eta(&lane))
            .unwrap_or(least),
    };
    Some(wait.max(least))
}

/// When a request joining `lane` now would go, as far as its snapshot
/// says: after its pause and everyone queued, at its pace.
fn eta(lane: &LaneSnapshot) -> Duration {
    let queued = u32::try_from(lane.queued).unwrap_or(u32::MAX);
    let pause = lane.paused_for.unwrap_or_default();
    pause.saturating_add(lane.interval.saturating_mul(queued))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The proxy's own answers are JSON whatever the message holds, and
    /// `Retry-After` is whole seconds rounded up.
    #[tokio::test]
    async fn own_answers_are_json_with_whole_seconds() {
        use http_body_util::BodyExt;

        let answer = own(
            StatusCode::TOO_MANY_REQUESTS,
            "queue_full",
            "lane \"a\\b\"\n",
            Some(Duration::from_millis(1_001)),
        );
        assert_eq!(answer.headers()[RETRY_AFTER], "2");
        assert_eq!(answer.headers()[REASON], "queue_full");
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        let said: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(said["error"]["message"], "lane \"a\\b\"\n");
        assert_eq!(said["error"]["retry_after_seconds"], 2);
        let far = own(
            StatusCode::SERVICE_UNAVAILABLE,
            "x",
            "",
            Some(Duration::MAX),
        );
        assert_eq!(far.headers()[RETRY_AFTER], u64::MAX.to_string().as_str());
    }
}
