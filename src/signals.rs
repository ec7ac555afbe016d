//! Throttle signals: what a vendor's response says about when to send again.
//!
//! Every parser here takes any bytes a vendor (or a broken proxy) can put in
//! a header and never panics: what it cannot read, it ignores, and the lane
//! falls back to its own exponential backoff.
//!
//! Understood today:
//!
//! | header | format |
//! |---|---|
//! | `retry-after-ms` (OpenAI and others) | milliseconds |
//! | `Retry-After` (RFC 9110) | delta-seconds, or an HTTP-date |
//!
//! A negative value or a date in the past means "now"; a value too large to
//! represent saturates (and is then refused by the lane's `max_pause`).

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};

/// The largest pause a header can express here; anything larger saturates
/// to it. A hundred years is far past any sensible `max_pause`, and adding
/// it to an `Instant` cannot overflow.
const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How long the vendor asked us to wait, if it said so in a form we read.
///
/// `now` is the wall clock, used for the HTTP-date form only.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use reqwest::header::{HeaderMap, HeaderValue};
///
/// let mut headers = HeaderMap::new();
/// headers.insert("retry-after", HeaderValue::from_static("3"));
/// assert_eq!(
///     callshaper::signals::retry_after(&headers, SystemTime::now()),
///     Some(Duration::from_secs(3))
/// );
/// ```
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    if let Some(ms) = headers.get("retry-after-ms").and_then(parse_number) {
        return Some(seconds(ms / 1000.0));
    }
    let value = headers.get(RETRY_AFTER)?;
    if let Some(secs) = parse_number(value) {
        return Some(seconds(secs));
    }
    let date = httpdate::parse_http_date(value.to_str().ok()?.trim()).ok()?;
    Some(
        date.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(LONGEST),
    )
}

/// A decimal number (`3`, `1.5`, `-2`), with surrounding whitespace.
/// Rejects what `f64::from_str` would accept but no vendor means, such as
/// `inf`, `NaN` or `1e9`.
fn parse_number(value: &HeaderValue) -> Option<f64> {
    let text = value.to_str().ok()?.trim();
    let digits = text.strip_prefix('-').unwrap_or(text);
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !all_digits(whole) || !all_digits(fraction) {
        return None;
    }
    text.parse().ok()
}

fn seconds(secs: f64) -> Duration {
    if secs <= 0.0 {
        Duration::ZERO
    } else {
        Duration::try_from_secs_f64(secs).map_or(LONGEST, |d| d.min(LONGEST))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Pairs<'a> = &'a [(&'static str, &'a [u8])];

    fn headers(pairs: Pairs<'_>) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_bytes(value).unwrap());
        }
        map
    }

    #[test]
    fn reads_every_form_and_survives_garbage() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let ahead = httpdate::fmt_http_date(now + Duration::from_secs(7));
        let behind = httpdate::fmt_http_date(now - Duration::from_secs(7));
        let cases: &[(Pairs<'_>, Option<Duration>)] = &[
            (&[("retry-after", b"3")], Some(Duration::from_secs(3))),
            (&[("Retry-After", b" 3 ")], Some(Duration::from_secs(3))),
            (
                &[("retry-after", b"1.5")],
                Some(Duration::from_millis(1500)),
            ),
            (&[("retry-after", b"0")], Some(Duration::ZERO)),
            (&[("retry-after", b"-5")], Some(Duration::ZERO)),
            (
                &[("retry-after", ahead.as_bytes())],
                Some(Duration::from_secs(7)),
            ),
            (&[("retry-after", behind.as_bytes())], Some(Duration::ZERO)),
            (
                &[("retry-after", b"99999999")],
                Some(Duration::from_secs(99_999_999)),
            ),
            (
                &[("retry-after", b"999999999999999999999999")],
                Some(LONGEST),
            ),
            (
                &[("retry-after-ms", b"250")],
                Some(Duration::from_millis(250)),
            ),
            (
                &[("retry-after-ms", b"250"), ("retry-after", b"9")],
                Some(Duration::from_millis(250)),
            ),
            (
                &[("retry-after-ms", b"soon"), ("retry-after", b"9")],
                Some(Duration::from_secs(9)),
            ),
            (&[("retry-after", b"soon")], None),
            (&[("retry-after", b"inf")], None),
            (&[("retry-after", b"NaN")], None),
            (&[("retry-after", b"1e9")], None),
            (&[("retry-after", b"")], None),
            (&[("retry-after", b"-")], None),
            (&[("retry-after", b".5")], None),
            (&[("retry-after", b"\xff\xfe")], None),
            (&[], None),
        ];
        for (pairs, expected) in cases {
            assert_eq!(retry_after(&headers(pairs), now), *expected, "{pairs:?}");
        }
    }

    #[test]
    fn any_bytes_never_panic() {
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..20_000 {
            let len = rng.usize(0..24);
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    *rng.choice(b"0123456789.-+ eE:GMTinfa,\t\xff".iter())
                        .unwrap()
                })
                .collect();
            if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                let mut map = HeaderMap::new();
                map.insert(RETRY_AFTER, value.clone());
                map.insert("retry-after-ms", value);
                let _ = retry_after(&map, SystemTime::now());
            }
        }
    }
}
