//! Durations as people write them in config files: `250ms`, `1.5s`,
//! `1min`, `1 minute`, `1h30m`, `2 days` (feature `serde`).
//!
//! A duration is one or more parts, each a number (fractions allowed) and
//! a unit: `ns`, `us`/`µs`, `ms`, `s`/`sec`/`second`, `m`/`min`/`minute`,
//! `h`/`hr`/`hour`, `d`/`day` (plurals too), with or without a space.
//! A bare number is refused: "30" could mean seconds or milliseconds.
//! Negative, empty or out-of-range values are refused, never wrapped.
//!
//! Written back, a duration is its shortest exact form (`1h30m`, `250ms`,
//! `1.5s`), which reads back to the same value.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// Read a duration written like `1.5s` or `1 minute`.
pub(crate) fn parse(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let amount = &rest[..digits];
        if amount.is_empty() || amount.starts_with('.') || amount.ends_with('.') {
            return None;
        }
        let amount: f64 = amount.parse().ok()?;
        rest = rest[digits..].trim_start();
        let unit_len = rest
            .find(|c: char| !c.is_alphabetic())
            .unwrap_or(rest.len());
        let nanos_per = unit_nanos(&rest[..unit_len])?;
        rest = rest[unit_len..].trim_start();
        let nanos = amount * nanos_per;
        if !nanos.is_finite() || nanos >= Duration::MAX.as_nanos() as f64 {
            return None;
        }
        let part = Duration::new(
            (nanos / 1e9).trunc() as u64,
            (nanos % 1e9).round().min(999_999_999.0) as u32,
        );
        total = total.checked_add(part)?;
    }
    Some(total)
}

fn unit_nanos(unit: &str) -> Option<f64> {
    Some(match unit {
        "ns" | "nanosecond" | "nanoseconds" => 1.0,
        "us" | "µs" | "microsecond" | "microseconds" => 1e3,
        "ms" | "millisecond" | "milliseconds" => 1e6,
        "s" | "sec" | "secs" | "second" | "seconds" => 1e9,
        "m" | "min" | "mins" | "minute" | "minutes" => 60e9,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3_600e9,
        "d" | "day" | "days" => 86_400e9,
        _ => return None,
    })
}

/// The shortest exact way to write `d`.
pub(crate) fn format(d: Duration) -> String {
    if d.is_zero() {
        return "0s".to_owned();
    }
    if d.subsec_nanos() != 0 {
        // In the largest unit it has at least one of, with the exact
        // decimal fraction: `100.5ms`, `1.5s`, `7ns`.
        let nanos = d.as_nanos();
        let (unit, size, digits) = match nanos {
            n if n >= 1_000_000_000 => ("s", 1_000_000_000, 9),
            n if n >= 1_000_000 => ("ms", 1_000_000, 6),
            n if n >= 1_000 => ("us", 1_000, 3),
            _ => ("ns", 1, 0),
        };
        let (whole, fraction) = (nanos / size, nanos % size);
        if fraction == 0 {
            return format!("{whole}{unit}");
        }
        let fraction = format!("{fraction:0digits$}");
        return format!("{whole}.{}{unit}", fraction.trim_end_matches('0'));
    }
    let mut secs = d.as_secs();
    let mut text = String::new();
    for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
        if secs >= size {
            text.push_str(&format!("{}{unit}", secs / size));
            secs %= size;
        }
    }
    text
}

/// `#[serde(with = "crate::time::human")]` for a `Duration`.
pub(crate) fn serialize<S: Serializer>(d: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format(*d))
}

/// `#[serde(with = "crate::time::human")]` for a `Duration`.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse(&text).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "{text:?} is not a duration (try \"1s\", \"1.5s\", \"500ms\", \"1min\")"
        ))
    })
}

/// `#[serde(with = "crate::time::human::option")]` for an
/// `Option<Duration>`.
pub(crate) mod option {
    use std::time::Duration;

    use serde::Serializer;

    pub(crate) fn serialize<S: Serializer>(
        d: &Option<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::serialize(d, serializer),
            None => serializer.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        use serde::Deserialize;

        #[derive(Deserialize)]
        struct Human(#[serde(with = "super")] Duration);
        Ok(Option::<Human>::deserialize(deserializer)?.map(|Human(d)| d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_people_write_them() {
        let ms = Duration::from_millis;
        let secs = Duration::from_secs;
        for (text, expected) in [
            ("250ms", ms(250)),
            ("1.5s", ms(1_500)),
            ("1 s", secs(1)),
            ("1min", secs(60)),
            ("1 minute", secs(60)),
            ("2 minutes", secs(120)),
            ("1h30m", secs(5_400)),
            ("1h 30m", secs(5_400)),
            ("1d", secs(86_400)),
            ("0.5 days", secs(43_200)),
            ("10us", Duration::from_micros(10)),
            ("7ns", Duration::from_nanos(7)),
            ("0s", Duration::ZERO),
        ] {
            assert_eq!(parse(text), Some(expected), "{text}");
        }
        for bad in [
            "",
            "1",
            "30",
            "m",
            "1.",
            ".5s",
            "-1s",
            "1 fortnight",
            "1e3s",
            "NaN s",
            "1..5s",
            "99999999999999999999999d",
            "s1",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn written_back_reads_back_the_same() {
        for d in [
            Duration::ZERO,
            Duration::from_nanos(7),
            Duration::from_micros(10),
            Duration::from_millis(250),
            Duration::from_millis(1_500),
            Duration::from_secs(60),
            Duration::from_secs(5_400),
            Duration::from_secs(86_400 + 1),
            Duration::new(3, 5),
        ] {
            let text = format(d);
            assert_eq!(parse(&text), Some(d), "{d:?} as {text}");
        }
        assert_eq!(format(Duration::from_secs(5_400)), "1h30m");
        assert_eq!(format(Duration::from_millis(1_500)), "1.5s");
        assert_eq!(format(Duration::from_micros(100_500)), "100.5ms");
        assert_eq!(format(Duration::new(3, 5)), "3.000000005s");
    }
}
