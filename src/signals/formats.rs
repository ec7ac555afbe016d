//! The value formats vendors use in rate-limit headers: numbers, HTTP
//! dates, epoch seconds, Go durations, RFC 3339 timestamps and structured
//! field lists. Every parser takes any bytes and never panics; what it
//! cannot read is `None`, and a value too large saturates at
//! [`LONGEST`].

use std::time::{Duration, SystemTime};

use reqwest::header::HeaderValue;

/// Epoch seconds below this are read as "seconds from now": some vendors
/// send a delta in `x-ratelimit-reset`, and no epoch second this small is a
/// real reset time (it is in 1973).
/// The largest pause a header can express here; anything larger saturates
/// to it. A hundred years is far past any sensible `max_pause`, and adding
/// it to an `Instant` cannot overflow.
pub(crate) const LONGEST: Duration = crate::time::FAR;

const EPOCH_FLOOR: u64 = 100_000_000;

/// An RFC 8941 list, simplified to what rate-limit headers use: comma
/// separated members, each a string or token followed by `;key=value`
/// parameters. Members that don't fit are skipped.
pub(super) fn sf_list(value: &HeaderValue) -> Vec<(String, Vec<(&str, &str)>)> {
    let Ok(text) = value.to_str() else {
        return Vec::new();
    };
    let mut members = Vec::new();
    for member in split_outside_quotes(text, ',') {
        let mut parts = split_outside_quotes(member, ';').into_iter();
        let Some(name) = parts.next().map(str::trim) else {
            continue;
        };
        let name = name
            .strip_prefix('"')
            .and_then(|n| n.strip_suffix('"'))
            .unwrap_or(name);
        if name.is_empty() {
            continue;
        }
        let params = parts
            .filter_map(|p| {
                let (key, val) = p.split_once('=')?;
                Some((key.trim(), val.trim()))
            })
            .collect();
        members.push((name.to_owned(), params));
    }
    members
}

fn split_outside_quotes(text: &str, separator: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut quoted = false;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            c if c == separator && !quoted => {
                parts.push(&text[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// A decimal number (`3`, `1.5`, `-2`), with surrounding whitespace.
/// Rejects what `f64::from_str` would accept but no vendor means, such as
/// `inf`, `NaN` or `1e9`.
pub(super) fn number(value: &HeaderValue) -> Option<f64> {
    let text = value.to_str().ok()?.trim();
    let digits = text.strip_prefix('-').unwrap_or(text);
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !all_digits(whole) || !all_digits(fraction) {
        return None;
    }
    text.parse().ok()
}

/// How finely a number or a timestamp is written: a tenth of a second for
/// each digit after its point (`0.857` and `1470173023.123`: 1 ms;
/// `…T12:40:59.5Z`: 100 ms), a second without one.
pub(super) fn step(value: &HeaderValue) -> Duration {
    let Some((_, fraction)) = value.to_str().ok().and_then(|text| text.split_once('.')) else {
        return Duration::from_secs(1);
    };
    let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
    match u32::try_from(digits.min(9)) {
        Ok(0) | Err(_) => Duration::from_secs(1),
        Ok(digits) => Duration::from_nanos(10u64.pow(9 - digits)),
    }
}

pub(super) fn integer(value: &HeaderValue) -> Option<u64> {
    // Nearly every vendor writes bare digits, read here at once; anything
    // else (spaces, a sign, 20 digits) the slow way.
    digits(value.as_bytes()).or_else(|| value.to_str().ok()?.trim().parse().ok())
}

/// 1 to 19 ASCII digits (never past `u64::MAX`) as their number, in one
/// pass: every answer carries a few.
fn digits(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || bytes.len() > 19 {
        return None;
    }
    let mut number = 0;
    for &byte in bytes {
        let digit = byte.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        number = number * 10 + u64::from(digit);
    }
    Some(number)
}

pub(super) fn seconds(secs: f64) -> Duration {
    if secs <= 0.0 {
        Duration::ZERO
    } else {
        Duration::try_from_secs_f64(secs).map_or(LONGEST, |d| d.min(LONGEST))
    }
}

pub(super) fn until(at: SystemTime, now: SystemTime) -> Duration {
    at.duration_since(now)
        .unwrap_or(Duration::ZERO)
        .min(LONGEST)
}

pub(super) fn http_date(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let date = httpdate::parse_http_date(value.to_str().ok()?.trim()).ok()?;
    Some(until(date, now))
}

/// Epoch seconds (GitHub, X), or seconds from now when the value is too
/// small to be an epoch second.
pub(super) fn epoch_or_delta(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    match epoch(value) {
        Some(at) => Some(until(at, now)),
        None => Some(seconds(number(value)?)),
    }
}

/// The instant an epoch-seconds value names; `None` for a value too small
/// to be one (a delta) or not a number.
pub(super) fn epoch(value: &HeaderValue) -> Option<SystemTime> {
    let secs = number(value)?;
    if secs < EPOCH_FLOOR as f64 {
        return None;
    }
    SystemTime::UNIX_EPOCH.checked_add(seconds(secs))
}

/// A Go duration as OpenAI sends it: `6m0s`, `1.5s`, `17ms`, `1h2m3.5s`.
pub(super) fn go_duration(value: &HeaderValue) -> Option<Duration> {
    // Whole amounts ("1ms", "6m0s") are read in integers, at once; a
    // fraction ("59.989s") in floating point.
    whole_go_duration(value.as_bytes().trim_ascii()).or_else(|| fractional_go_duration(value))
}

/// A Go duration of whole amounts in nanoseconds, saturating; `None` for
/// anything else (a fraction, an unknown unit, nothing), which
/// [`fractional_go_duration`] reads or refuses.
pub(super) fn whole_go_duration(mut rest: &[u8]) -> Option<Duration> {
    if rest.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let split = rest.iter().position(|b| !b.is_ascii_digit())?;
        let amount = digits(&rest[..split])?;
        rest = &rest[split..];
        let unit_end = rest
            .iter()
            .position(u8::is_ascii_digit)
            .unwrap_or(rest.len());
        let nanos_per = go_unit(&rest[..unit_end])?;
        total = total.saturating_add(amount.saturating_mul(nanos_per));
        rest = &rest[unit_end..];
    }
    Some(Duration::from_nanos(total).min(LONGEST))
}

/// The nanoseconds in one of a Go duration's units, for both readings.
fn go_unit(unit: &[u8]) -> Option<u64> {
    Some(match unit {
        b"h" => 3_600_000_000_000,
        b"m" => 60_000_000_000,
        b"s" => 1_000_000_000,
        b"ms" => 1_000_000,
        b"us" => 1_000,
        b"ns" => 1,
        _ => return None,
    })
}

/// [`go_duration`] in floating point, for amounts with a fraction.
pub(super) fn fractional_go_duration(value: &HeaderValue) -> Option<Duration> {
    let mut rest = value.to_str().ok()?.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0f64;
    while !rest.is_empty() {
        let split = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (amount, tail) = rest.split_at(split);
        // A whole amount ("17ms", "6m0s") is exact as an integer.
        let amount = match digits(amount.as_bytes()) {
            Some(whole) => whole as f64,
            None => amount.parse().ok()?,
        };
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        // Each scale the nearest double to its seconds, as a literal is.
        let scale = go_unit(unit.as_bytes())? as f64 / 1e9;
        total += amount * scale;
        rest = tail;
    }
    Some(seconds(total))
}

/// An RFC 3339 timestamp (`2024-06-10T12:00:30Z`, `...30.5+02:00`), as a
/// time from `now`.
pub(super) fn rfc3339(value: &HeaderValue) -> Option<SystemTime> {
    let text = value.to_str().ok()?.trim();
    let bytes = text.as_bytes();
    if bytes.len() < 20 || !bytes.is_ascii() {
        return None;
    }
    let field = |range: std::ops::Range<usize>| -> Option<i64> {
        let s = text.get(range)?;
        s.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    let (year, month, day) = (field(0..4)?, field(5..7)?, field(8..10)?);
    let (hour, minute, second) = (field(11..13)?, field(14..16)?, field(17..19)?);
    if bytes[4] != b'-' || bytes[7] != b'-' || !matches!(bytes[10], b'T' | b't' | b' ') {
        return None;
    }
    if bytes[13] != b':' || bytes[16] != b':' {
        return None;
    }
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut rest = &text[19..];
    let mut fraction = 0.0;
    if let Some(after_dot) = rest.strip_prefix('.') {
        let digits = after_dot
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(after_dot.len());
        if digits == 0 {
            return None;
        }
        fraction = format!("0.{}", &after_dot[..digits]).parse().ok()?;
        rest = &after_dot[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            if rest.len() != 6 || rest.as_bytes()[3] != b':' {
                return None;
            }
            let h: i64 = rest[1..3].parse().ok()?;
            let m: i64 = rest[4..6].parse().ok()?;
            sign * (h * 3600 + m * 60)
        }
    };
    let epoch =
        days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second - offset;
    let at = if epoch >= 0 {
        SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(epoch as u64))?
    } else {
        SystemTime::UNIX_EPOCH.checked_sub(Duration::from_secs(epoch.unsigned_abs()))?
    };
    at.checked_add(Duration::from_secs_f64(fraction))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_index = (month + 9) % 12;
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}
