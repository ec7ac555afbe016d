//! How a test vendor speaks: the headers each real vendor puts on its
//! answers, and what its refusal looks like, modelled on its documentation
//! (formats, precision, the meaning of its reset). A vendor's quirks are
//! kept even where they make a client's numbers worse, such as Shopify's
//! constant `Retry-After: 2.0` or GitHub's refusals by 403.

use std::time::{Duration, SystemTime};

use wiremock::ResponseTemplate;

/// How a [`Vendor`](super::Vendor) speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Style {
    /// A generic API gateway: `x-ratelimit-limit/-remaining/-reset` on
    /// every answer, the reset in whole seconds rounded up (seconds until
    /// the oldest request leaves a sliding window, or a fixed window's end
    /// as an epoch second); a 429 with `Retry-After` in whole seconds.
    Gateway,
    /// GitHub: `x-ratelimit-limit/-remaining/-used/-reset/-resource`, the
    /// reset the window's end in epoch seconds; past the primary limit, a
    /// **403** with `remaining: 0` and no `Retry-After`.
    GitHub,
    /// OpenAI: `x-ratelimit-{limit,remaining,reset}-requests`, the reset a
    /// Go duration (`1s`, `6m0s`, `20ms`) until the bucket is *full*
    /// again; a 429 with nothing more.
    OpenAi,
    /// Anthropic: `anthropic-ratelimit-requests-{limit,remaining,reset}`,
    /// the reset an RFC 3339 instant (whole seconds) when the bucket is
    /// full; a 429 with `retry-after` in whole seconds.
    Anthropic,
    /// The IETF draft: `RateLimit-Policy: "default";q=…;w=…` and
    /// `RateLimit: "default";r=…;t=…`, `t` whole seconds until more quota;
    /// a 429 with `Retry-After`.
    Ietf,
    /// Shopify REST: `X-Shopify-Shop-Api-Call-Limit: used/capacity` and no
    /// reset; a 429 with `Retry-After: 2.0`, whatever the real wait.
    Shopify,
    /// Discord: `X-RateLimit-Limit/-Remaining/-Reset/-Reset-After/-Bucket`,
    /// the reset an epoch second and the reset-after seconds, both with
    /// milliseconds; a 429 with `Retry-After`.
    Discord,
    /// Stripe: no rate-limit headers at all, a bare 429.
    Silent,
    /// nginx's `limit_req`: no rate-limit headers, and a refusal with
    /// nginx's own HTML error page: 503 by default, or the status
    /// `limit_req_status` sets ([`Vendor::refusing_with`](super::Vendor::refusing_with)).
    Nginx(u16),
}

/// What the vendor knows of its quota at one answer.
pub(super) struct Said {
    pub(super) limit: u64,
    pub(super) remaining: u64,
    pub(super) window: Duration,
    /// Until the quota is whole again (a fixed window's end, the oldest
    /// request leaving a sliding window, a bucket full).
    pub(super) reset: Duration,
    /// True when `reset` is a fixed window's end.
    pub(super) fixed: bool,
    /// The vendor's wall clock, which absolute times are written on.
    pub(super) wall: SystemTime,
}

impl Said {
    fn used(&self) -> u64 {
        self.limit.saturating_sub(self.remaining)
    }
}

impl Style {
    /// The answer: accepted, or refused with `wait` until the request would
    /// fit.
    pub(super) fn answer(self, said: &Said, refused: Option<Duration>) -> (u16, ResponseTemplate) {
        let status = match (self, refused) {
            (_, None) => 200,
            (Style::GitHub, Some(_)) => 403,
            (Style::Nginx(status), Some(_)) => status,
            (_, Some(_)) => 429,
        };
        if let (Style::Nginx(_), Some(_)) = (self, refused) {
            return (status, nginx_page(status));
        }
        let answer = self
            .headers(said, refused)
            .into_iter()
            .fold(ResponseTemplate::new(status), |answer, (name, value)| {
                answer.insert_header(name, value.as_str())
            });
        (status, answer)
    }

    /// A refusal past a secondary limit while the quota `said` still has
    /// room, `wait` until the limit lets a request in. GitHub's: a 403
    /// with its quota headers (`remaining` above zero), `retry-after` in
    /// whole seconds and its documented message; any other vendor's a 429
    /// with its headers and `retry-after`.
    pub(super) fn secondary(self, said: &Said, wait: Duration) -> (u16, ResponseTemplate) {
        let status = if self == Style::GitHub { 403 } else { 429 };
        let mut headers = self.headers(said, None);
        headers.retain(|(name, _)| *name != "retry-after");
        headers.push(("retry-after", whole_secs_up(wait).max(1).to_string()));
        let body = json_message(
            "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",
        );
        let answer = headers
            .into_iter()
            .fold(ResponseTemplate::new(status), |answer, (name, value)| {
                answer.insert_header(name, value.as_str())
            })
            .set_body_raw(body, "application/json");
        (status, answer)
    }

    /// The headers of an answer, accepted or refused after `refused`.
    fn headers(self, said: &Said, refused: Option<Duration>) -> Vec<(&'static str, String)> {
        let mut headers: Vec<(&str, String)> = Vec::new();
        let mut header = |name, value| headers.push((name, value));
        let limit = said.limit.to_string();
        let remaining = said.remaining.to_string();
        match self {
            Style::Gateway => {
                header("x-ratelimit-limit", limit);
                header("x-ratelimit-remaining", remaining);
                let reset = match refused {
                    Some(wait) => epoch_secs_after(said.wall, wait),
                    None if said.fixed => epoch_secs_after(said.wall, said.reset),
                    None => whole_secs_up(said.reset),
                };
                header("x-ratelimit-reset", reset.to_string());
                if let Some(wait) = refused {
                    header("retry-after", whole_secs_up(wait).to_string());
                }
            }
            Style::GitHub => {
                header("x-ratelimit-limit", limit);
                header("x-ratelimit-remaining", remaining);
                header("x-ratelimit-used", said.used().to_string());
                header(
                    "x-ratelimit-reset",
                    epoch_secs_after(said.wall, said.reset).to_string(),
                );
                header("x-ratelimit-resource", "core".to_owned());
            }
            Style::OpenAi => {
                header("x-ratelimit-limit-requests", limit);
                header("x-ratelimit-remaining-requests", remaining);
                header("x-ratelimit-reset-requests", go_duration(said.reset));
            }
            Style::Anthropic => {
                header("anthropic-ratelimit-requests-limit", limit);
                header("anthropic-ratelimit-requests-remaining", remaining);
                header(
                    "anthropic-ratelimit-requests-reset",
                    rfc3339_after(said.wall, said.reset),
                );
                if let Some(wait) = refused {
                    header("retry-after", whole_secs_up(wait).to_string());
                }
            }
            Style::Ietf => {
                let window = whole_secs_up(said.window).max(1);
                header(
                    "ratelimit-policy",
                    format!("\"default\";q={limit};w={window}"),
                );
                let next = refused.unwrap_or(said.reset);
                let t = whole_secs_up(next);
                header("ratelimit", format!("\"default\";r={remaining};t={t}"));
                if let Some(wait) = refused {
                    header("retry-after", whole_secs_up(wait).to_string());
                }
            }
            Style::Shopify => {
                let used = said.used();
                header("x-shopify-shop-api-call-limit", format!("{used}/{limit}"));
                if refused.is_some() {
                    header("retry-after", "2.0".to_owned());
                }
            }
            Style::Discord => {
                let after = refused.unwrap_or(said.reset);
                header("x-ratelimit-limit", limit);
                header("x-ratelimit-remaining", remaining);
                header("x-ratelimit-reset", epoch_millis_after(said.wall, after));
                header(
                    "x-ratelimit-reset-after",
                    format!("{:.3}", after.as_secs_f64()),
                );
                header("x-ratelimit-bucket", "d1f9a5".to_owned());
                if let Some(wait) = refused {
                    header("retry-after", whole_secs_up(wait).to_string());
                }
            }
            Style::Silent | Style::Nginx(_) => {}
        }
        headers
    }
}

/// nginx's built-in error page for `status`, as it serves it.
fn nginx_page(status: u16) -> ResponseTemplate {
    let reason = match status {
        503 => "Service Temporarily Unavailable",
        429 => "Too Many Requests",
        _ => "Error",
    };
    let body = format!(
        "<html>\r\n<head><title>{status} {reason}</title></head>\r\n<body>\r\n\
         <center><h1>{status} {reason}</h1></center>\r\n<hr><center>nginx</center>\r\n\
         </body>\r\n</html>\r\n"
    );
    ResponseTemplate::new(status)
        .insert_header("server", "nginx")
        .set_body_raw(body, "text/html")
}

/// `{"message": ...}`, as GitHub's error bodies are.
fn json_message(message: &str) -> String {
    format!("{{\"message\":\"{message}\"}}")
}

/// Whole seconds, rounded up, as most vendors send a delta.
pub(super) fn whole_secs_up(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// The epoch second `after` from `wall` (rounded up), as GitHub's
/// `x-ratelimit-reset` gives it.
pub(super) fn epoch_secs_after(wall: SystemTime, after: Duration) -> u64 {
    let reset = wall.checked_add(after).unwrap_or(wall);
    reset
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, whole_secs_up)
}

/// Discord's epoch with milliseconds, e.g. `1470173023.123`.
fn epoch_millis_after(wall: SystemTime, after: Duration) -> String {
    let reset = (wall.checked_add(after).unwrap_or(wall))
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let millis = reset.as_millis() + u128::from(!reset.subsec_nanos().is_multiple_of(1_000_000));
    format!("{}.{:03}", millis / 1_000, millis % 1_000)
}

/// A Go duration as OpenAI writes it: `20ms`, `1s`, `1.5s`, `6m0s`.
pub(super) fn go_duration(d: Duration) -> String {
    let millis = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    if millis < 1_000 {
        return format!("{millis}ms");
    }
    let (minutes, millis) = (millis / 60_000, millis % 60_000);
    let seconds = if millis % 1_000 == 0 {
        format!("{}s", millis / 1_000)
    } else {
        let text = format!("{}.{:03}", millis / 1_000, millis % 1_000);
        format!("{}s", text.trim_end_matches('0'))
    };
    if minutes == 0 {
        seconds
    } else {
        format!("{minutes}m{seconds}")
    }
}

/// An RFC 3339 instant `after` from now, in whole seconds (rounded up) and
/// UTC, as Anthropic sends its resets.
pub(super) fn rfc3339_after(wall: SystemTime, after: Duration) -> String {
    let secs = epoch_secs_after(wall, after);
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rest = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60
    )
}

/// Days since 1970-01-01 as a calendar date (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let month = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    (era * 400 + yoe + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_read_back_by_the_dialects() {
        assert_eq!(go_duration(Duration::from_millis(20)), "20ms");
        assert_eq!(go_duration(Duration::from_secs(1)), "1s");
        assert_eq!(go_duration(Duration::from_millis(1_500)), "1.5s");
        assert_eq!(go_duration(Duration::from_secs(360)), "6m0s");
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
