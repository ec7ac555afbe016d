//! What `Signals` reads from real vendors' headers (every dialect and
//! `Retry-After` form), what a pause cites, the hints it derives, and
//! that no bytes in any header panic.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderValue};

use crate::meters::Rate;

use super::formats::LONGEST;
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
fn reads_every_retry_after_form_and_survives_garbage() {
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
            &[("x-amz-retry-after", b"1500")],
            Some(Duration::from_millis(1500)),
        ),
        (
            &[("grpc-retry-pushback-ms", b"2000")],
            Some(Duration::from_secs(2)),
        ),
        (&[("grpc-retry-pushback-ms", b"-1")], Some(Duration::ZERO)),
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

fn limit(
    dimension: Dimension,
    limit: Option<u64>,
    remaining: Option<u64>,
    reset: Option<Duration>,
) -> Limit {
    Limit {
        dimension,
        limit,
        remaining,
        reset,
        // Most vendors write whole seconds.
        precision: reset.map_or(Duration::ZERO, |_| Duration::from_secs(1)),
        reset_at: None,
        window: None,
        refills: false,
    }
}

/// A limit whose reset the vendor wrote as the instant `epoch` seconds.
fn ending(epoch: f64, limit: Limit) -> Limit {
    Limit {
        reset_at: Some(SystemTime::UNIX_EPOCH + Duration::from_secs_f64(epoch)),
        ..limit
    }
}

/// A limit of a bucket (OpenAI, Anthropic, Shopify).
fn refilling(
    dimension: Dimension,
    limit_: Option<u64>,
    remaining: Option<u64>,
    reset: Option<Duration>,
) -> Limit {
    Limit {
        refills: true,
        ..limit(dimension, limit_, remaining, reset)
    }
}

/// A pause cites what the vendor said, as it said it: the header the
/// hint came from, else each limit with nothing left (or one); a dialect's hint
/// by its value; a hostile value cut short and never a panic.
#[test]
fn a_pause_cites_the_vendor() {
    let now = SystemTime::now();
    let cite_of = |pairs: Pairs<'_>| {
        let headers = headers(pairs);
        cite(&headers, &Signals::parse(&headers, now))
    };
    assert_eq!(
        cite_of(&[("retry-after", b"2"), ("retry-after-ms", b"1500")]).as_deref(),
        Some("retry-after-ms: 1500")
    );
    assert_eq!(
        cite_of(&[("retry-after-ms", b"soon"), ("retry-after", b"2")]).as_deref(),
        Some("retry-after: 2")
    );
    assert_eq!(
        cite_of(&[
            ("x-ratelimit-limit-requests", b"60"),
            ("x-ratelimit-remaining-requests", b"0"),
            ("x-ratelimit-reset-requests", b"1.5s"),
            ("x-ratelimit-remaining-tokens", b"0"),
        ])
        .as_deref(),
        Some("requests: 0 of 60 left, reset in 1.5s; tokens: 0 left")
    );
    assert_eq!(
        cite_of(&[
            ("x-ratelimit-limit-requests", b"60"),
            ("x-ratelimit-remaining-requests", b"1"),
            ("x-ratelimit-remaining-tokens", b"500"),
        ])
        .as_deref(),
        Some("requests: 1 of 60 left"),
        "a unit left to another consumer"
    );
    assert_eq!(cite_of(&[("x-ratelimit-remaining", b"3")]), None);
    let dialect = Signals {
        retry_after: Some(Duration::from_secs(4)),
        limits: Vec::new(),
    };
    assert_eq!(
        cite(&HeaderMap::new(), &dialect).as_deref(),
        Some("retry after 4s")
    );
    let mut long = vec![b'0'; 10_000];
    long.push(b'2');
    let cited = cite_of(&[("retry-after", &long)]).expect("a citation");
    assert_eq!(cited.chars().count(), 200);
    assert!(cited.starts_with("retry-after: 000"), "{cited}");
}

/// A limit whose reset is written to the millisecond.
fn to_the_ms(limit: Limit) -> Limit {
    Limit {
        precision: Duration::from_millis(1),
        ..limit
    }
}

/// The instant the dialect cases are read at (their epoch resets and
/// dates are written against it).
fn dialect_now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_372_700_000)
}

/// The `x-ratelimit-*` family (GitHub, X, a delta reset, Discord), as each
/// vendor's documentation shows it.
#[test]
fn reads_the_x_ratelimit_dialects() {
    let now = dialect_now();
    let secs = Duration::from_secs;
    let cases: Vec<(&str, Pairs<'_>, Signals)> = vec![
        (
            "GitHub",
            &[
                ("x-ratelimit-limit", b"60"),
                ("x-ratelimit-remaining", b"56"),
                ("x-ratelimit-used", b"4"),
                ("x-ratelimit-reset", b"1372700873"),
                ("x-ratelimit-resource", b"core"),
            ],
            Signals {
                retry_after: None,
                limits: vec![ending(
                    1_372_700_873.0,
                    limit(Dimension::Requests, Some(60), Some(56), Some(secs(873))),
                )],
            },
        ),
        (
            "GitHub, reset in the past and upper case",
            &[
                ("X-RateLimit-Remaining", b" 0 "),
                ("X-RateLimit-Reset", b"1372699000"),
            ],
            Signals {
                retry_after: None,
                limits: vec![ending(
                    1_372_699_000.0,
                    limit(Dimension::Requests, None, Some(0), Some(Duration::ZERO)),
                )],
            },
        ),
        (
            "X",
            &[
                ("x-rate-limit-limit", b"900"),
                ("x-rate-limit-remaining", b"899"),
                ("x-rate-limit-reset", b"1372700900"),
            ],
            Signals {
                retry_after: None,
                limits: vec![ending(
                    1_372_700_900.0,
                    limit(Dimension::Requests, Some(900), Some(899), Some(secs(900))),
                )],
            },
        ),
        (
            "a delta in x-ratelimit-reset",
            &[
                ("x-ratelimit-remaining", b"0"),
                ("x-ratelimit-reset", b"30"),
            ],
            Signals {
                retry_after: None,
                limits: vec![limit(Dimension::Requests, None, Some(0), Some(secs(30)))],
            },
        ),
        (
            "Discord: reset-after wins over the epoch, to the millisecond",
            &[
                ("x-ratelimit-limit", b"5"),
                ("x-ratelimit-remaining", b"0"),
                ("x-ratelimit-reset", b"1372700001.250"),
                ("x-ratelimit-reset-after", b"0.857"),
                ("x-ratelimit-bucket", b"d1f9a5"),
            ],
            Signals {
                retry_after: None,
                limits: vec![ending(
                    1_372_700_001.25,
                    to_the_ms(limit(
                        Dimension::Requests,
                        Some(5),
                        Some(0),
                        Some(Duration::from_millis(857)),
                    )),
                )],
            },
        ),
    ];
    assert_reads(&cases, now);
}

/// OpenAI's headers, as its documentation shows them.
#[test]
fn reads_the_openai_dialect() {
    let now = dialect_now();
    let secs = Duration::from_secs;
    let cases: Vec<(&str, Pairs<'_>, Signals)> = vec![
        (
            "OpenAI",
            &[
                ("x-ratelimit-limit-requests", b"60"),
                ("x-ratelimit-limit-tokens", b"150000"),
                ("x-ratelimit-remaining-requests", b"59"),
                ("x-ratelimit-remaining-tokens", b"149984"),
                ("x-ratelimit-reset-requests", b"1s"),
                ("x-ratelimit-reset-tokens", b"6m0s"),
            ],
            Signals {
                retry_after: None,
                limits: vec![
                    to_the_ms(refilling(
                        Dimension::Requests,
                        Some(60),
                        Some(59),
                        Some(secs(1)),
                    )),
                    to_the_ms(refilling(
                        Dimension::Tokens,
                        Some(150_000),
                        Some(149_984),
                        Some(secs(360)),
                    )),
                ],
            },
        ),
        (
            "OpenAI, fractions and milliseconds",
            &[
                ("x-ratelimit-remaining-requests", b"0"),
                ("x-ratelimit-reset-requests", b"1.5s"),
                ("x-ratelimit-reset-tokens", b"17ms"),
                ("retry-after-ms", b"1500"),
            ],
            Signals {
                retry_after: Some(Duration::from_millis(1500)),
                limits: vec![
                    to_the_ms(refilling(
                        Dimension::Requests,
                        None,
                        Some(0),
                        Some(Duration::from_millis(1500)),
                    )),
                    to_the_ms(refilling(
                        Dimension::Tokens,
                        None,
                        None,
                        Some(Duration::from_millis(17)),
                    )),
                ],
            },
        ),
    ];
    assert_reads(&cases, now);
}

/// Anthropic's headers, as its documentation shows them.
#[test]
fn reads_the_anthropic_dialect() {
    let now = dialect_now();
    let secs = Duration::from_secs;
    let cases: Vec<(&str, Pairs<'_>, Signals)> = vec![(
        "Anthropic",
        &[
            ("retry-after", b"20"),
            ("anthropic-ratelimit-requests-limit", b"50"),
            ("anthropic-ratelimit-requests-remaining", b"0"),
            (
                "anthropic-ratelimit-requests-reset",
                b"2013-07-01T17:47:00Z",
            ),
            ("anthropic-ratelimit-input-tokens-limit", b"40000"),
            ("anthropic-ratelimit-input-tokens-remaining", b"39000"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                b"2013-07-01T19:33:20.5+02:00",
            ),
            (
                "anthropic-ratelimit-output-tokens-reset",
                b"2013-07-01T00:00:00Z",
            ),
        ],
        Signals {
            retry_after: Some(secs(20)),
            limits: vec![
                ending(
                    1_372_700_820.0,
                    refilling(Dimension::Requests, Some(50), Some(0), Some(secs(820))),
                ),
                ending(
                    1_372_700_000.5,
                    Limit {
                        precision: Duration::from_millis(100),
                        ..refilling(
                            Dimension::InputTokens,
                            Some(40_000),
                            Some(39_000),
                            Some(Duration::from_millis(500)),
                        )
                    },
                ),
                ending(
                    1_372_636_800.0,
                    refilling(Dimension::OutputTokens, None, None, Some(Duration::ZERO)),
                ),
            ],
        },
    )];
    assert_reads(&cases, now);
}

/// The IETF draft's fields and Shopify's call limit, as documented, and
/// garbage in every dialect's headers.
#[test]
fn reads_the_ietf_and_shopify_dialects_and_survives_garbage() {
    let now = dialect_now();
    let secs = Duration::from_secs;
    let cases: Vec<(&str, Pairs<'_>, Signals)> = vec![
        (
            "IETF, several policies",
            &[
                (
                    "ratelimit-policy",
                    b"\"burst\";q=100;w=60, \"daily\";q=1000;w=86400",
                ),
                ("ratelimit", b"\"burst\";r=0;t=30"),
            ],
            Signals {
                retry_after: None,
                limits: vec![
                    Limit {
                        window: Some(secs(60)),
                        ..limit(
                            Dimension::Policy("burst".into()),
                            Some(100),
                            Some(0),
                            Some(secs(30)),
                        )
                    },
                    Limit {
                        window: Some(secs(86_400)),
                        ..limit(Dimension::Policy("daily".into()), Some(1000), None, None)
                    },
                ],
            },
        ),
        (
            "IETF, the older trio",
            &[
                ("RateLimit-Limit", b"100"),
                ("RateLimit-Remaining", b"50"),
                ("RateLimit-Reset", b"30"),
            ],
            Signals {
                retry_after: None,
                limits: vec![limit(
                    Dimension::Requests,
                    Some(100),
                    Some(50),
                    Some(secs(30)),
                )],
            },
        ),
        (
            "Shopify",
            &[("X-Shopify-Shop-Api-Call-Limit", b"32/40")],
            Signals {
                retry_after: None,
                limits: vec![refilling(Dimension::Requests, Some(40), Some(8), None)],
            },
        ),
        (
            "missing pieces and garbage",
            &[
                ("x-ratelimit-remaining", b"lots"),
                ("x-ratelimit-reset-tokens", b"6 minutes"),
                (
                    "anthropic-ratelimit-requests-reset",
                    b"2013-13-01T00:00:00Z",
                ),
                ("ratelimit-policy", b";;,\"\";q=;w=x"),
                ("x-shopify-shop-api-call-limit", b"40"),
                ("x-ratelimit-reset", b"caf\xc3\xa9"),
            ],
            Signals::default(),
        ),
    ];
    assert_reads(&cases, now);
}

/// Each case's headers read at `now` as its expected signals.
fn assert_reads(cases: &[(&str, Pairs<'_>, Signals)], now: SystemTime) {
    for (name, pairs, expected) in cases {
        assert_eq!(Signals::parse(&headers(pairs), now), *expected, "{name}");
    }
}

#[test]
fn pause_hints_and_announced_rates() {
    let now = SystemTime::now();
    let signals = Signals::parse(
        &headers(&[
            (
                "ratelimit-policy",
                b"\"minute\";q=120;w=60, \"second\";q=5;w=1",
            ),
            ("x-ratelimit-remaining-tokens", b"0"),
            ("x-ratelimit-reset-tokens", b"2s"),
        ]),
        now,
    );
    // 120 a minute is the slower of the two: 2/s satisfies both.
    assert_eq!(
        signals.announced_rate(),
        Some(Rate::new(120, Duration::from_secs(60)))
    );
    assert_eq!(signals.exhausted_for(), Some(Duration::from_secs(2)));
    assert_eq!(signals.pause_hint(), Some(Duration::from_secs(2)));
    assert!(!signals.requests_exhausted(), "only tokens ran out");
}

/// Anthropic at 50 RPM with nothing left and its bucket full again in
/// 60 s: the next request goes in 1.2 s, not 60 s.
#[test]
fn a_refilling_limit_waits_for_one_unit_not_the_full_reset() {
    let signals = Signals {
        retry_after: None,
        limits: vec![refilling(
            Dimension::Requests,
            Some(50),
            Some(0),
            Some(Duration::from_secs(60)),
        )],
    };
    assert_eq!(signals.exhausted_for(), Some(Duration::from_millis(1_200)));
    let window_end = Signals {
        retry_after: None,
        limits: vec![limit(
            Dimension::Requests,
            Some(50),
            Some(0),
            Some(Duration::from_secs(60)),
        )],
    };
    assert_eq!(window_end.exhausted_for(), Some(Duration::from_secs(60)));
}

#[test]
fn any_bytes_in_any_header_never_panic() {
    const NAMES: &[&str] = &[
        "retry-after",
        "retry-after-ms",
        "x-amz-retry-after",
        "grpc-retry-pushback-ms",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "x-rate-limit-reset",
        "x-ratelimit-reset-requests",
        "x-ratelimit-reset-tokens",
        "anthropic-ratelimit-requests-reset",
        "anthropic-ratelimit-tokens-remaining",
        "ratelimit-policy",
        "ratelimit",
        "ratelimit-reset",
        "x-shopify-shop-api-call-limit",
    ];
    let alphabet = b"0123456789.-+ eE:;,=/\"TZzqwrtmshu\xc2\xb5GMTinfa\t\xff";
    let mut rng = fastrand::Rng::with_seed(7);
    for _ in 0..50_000 {
        let mut map = HeaderMap::new();
        for name in NAMES {
            let len = rng.usize(0..32);
            let bytes: Vec<u8> = (0..len)
                .map(|_| alphabet[rng.usize(..alphabet.len())])
                .collect();
            if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                map.insert(*name, value);
            }
        }
        let signals = Signals::parse(&map, SystemTime::now());
        let _ = (
            signals.pause_hint(),
            signals.announced_rate(),
            signals.requests_exhausted(),
        );
    }
}

/// A hint is read to the precision the vendor wrote it in: a GCRA's
/// `Retry-After: 1` may mean a few milliseconds.
#[test]
fn a_hint_knows_how_finely_it_was_written() {
    let now = SystemTime::now();
    let date = httpdate::fmt_http_date(now + Duration::from_secs(7));
    let ms = Duration::from_millis;
    let cases: &[(Pairs<'_>, Duration)] = &[
        (&[("retry-after", b"1")], Duration::from_secs(1)),
        (&[("retry-after", b"0.25")], ms(10)),
        (&[("retry-after", date.as_bytes())], Duration::from_secs(1)),
        (&[("retry-after-ms", b"250"), ("retry-after", b"1")], ms(1)),
        (&[("retry-after", b"soon")], Duration::ZERO),
        (
            &[("x-ratelimit-remaining", b"0"), ("x-ratelimit-reset", b"2")],
            Duration::from_secs(1),
        ),
        (&[("x-ratelimit-remaining", b"3")], Duration::ZERO),
    ];
    for (pairs, precision) in cases {
        let headers = headers(pairs);
        let signals = Signals::parse(&headers, now);
        assert_eq!(signals.hint_precision(&headers), *precision, "{pairs:?}");
    }
}

/// Bare digits are read at once, and everything else as before: spaces
/// and a sign the slow way, 20 digits only when they fit.
#[test]
fn counts_read_fast_agree_with_the_slow_reading() {
    let remaining = |value: &[u8]| {
        let answer = headers(&[("x-ratelimit-remaining", value)]);
        Signals::parse(&answer, dialect_now())
            .limits
            .first()
            .and_then(|limit| limit.remaining)
    };
    assert_eq!(remaining(b"0"), Some(0));
    assert_eq!(
        remaining(b"9999999999999999999"),
        Some(9_999_999_999_999_999_999)
    );
    assert_eq!(remaining(b"18446744073709551615"), Some(u64::MAX));
    assert_eq!(remaining(b"18446744073709551616"), None);
    assert_eq!(remaining(b" 42 "), Some(42));
    assert_eq!(remaining(b"+7"), Some(7));
    assert_eq!(remaining(b"-1"), None);
    assert_eq!(remaining(b"4 2"), None);
    assert_eq!(remaining(b""), None);
}

/// Go durations: whole amounts are read in integers, exactly as the
/// floating-point reading of a fraction gives them; fractions, garbage and
/// amounts past any clock read as before.
#[test]
fn go_durations_read_whole_amounts_exactly() {
    use super::formats::go_duration;
    let ms = Duration::from_millis;
    let read = |text: &[u8]| go_duration(&HeaderValue::from_bytes(text).unwrap());
    for (text, expected) in [
        (&b"1ms"[..], Some(ms(1))),
        (b"17ms", Some(ms(17))),
        (b"6m0s", Some(Duration::from_secs(360))),
        (b"1h2m3s", Some(Duration::from_secs(3723))),
        (b" 59s ", Some(Duration::from_secs(59))),
        (b"20ns", Some(Duration::from_nanos(20))),
        (b"3us", Some(Duration::from_micros(3))),
        (b"0s", Some(Duration::ZERO)),
        (b"1.5s", Some(ms(1500))),
        (b"59.989s", Some(ms(59_989))),
        (b"1h2m3.5s", Some(ms(3_723_500))),
        (b"99999999999999999999h", Some(LONGEST)),
        (b"9999999999999999999h", Some(LONGEST)),
        (b"", None),
        (b"s", None),
        (b"12", None),
        (b"-1s", None),
        (b"5d", None),
        (b"1ms2", None),
    ] {
        assert_eq!(read(text), expected, "{}", String::from_utf8_lossy(text));
    }
    // The integer reading is the one taken for whole amounts, and gives
    // what the floating-point reading gives.
    for text in [
        "1ms", "17ms", "6m0s", "1h2m3s", "20ns", "3us", "1s1ms", "999999ns",
    ] {
        let value = HeaderValue::from_static(text);
        let whole = super::formats::whole_go_duration(value.as_bytes());
        assert!(whole.is_some(), "{text} is read in integers");
        assert_eq!(
            whole,
            super::formats::fractional_go_duration(&value),
            "{text}"
        );
    }
}
