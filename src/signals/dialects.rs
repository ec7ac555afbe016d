//! The built-in dialects: each reads one vendor family's headers into
//! [`Signals`], ignoring whatever it cannot read.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use smallvec::SmallVec;

use super::clock::AnswerClock;
use super::formats::{
    epoch, epoch_or_delta, go_duration, integer, number, rfc3339, seconds, sf_list, step, until,
};
use super::retry_after::{RETRY_AFTER_MS, retry_after};
use super::said::{Dimension, Limit, Signals};

pub(super) type Reader = fn(&HeaderMap, &Spoken<'_>, &AnswerClock<'_>, &mut Signals);

/// One limit's headers. Named once, not formatted per response: every
/// answer is read by every dialect.
struct Trio<T = HeaderName> {
    limit: T,
    remaining: T,
    reset: T,
}

impl Trio {
    const fn new(limit: &'static str, remaining: &'static str, reset: &'static str) -> Self {
        Self {
            limit: HeaderName::from_static(limit),
            remaining: HeaderName::from_static(remaining),
            reset: HeaderName::from_static(reset),
        }
    }

    /// The first value of each of the trio's names, in one pass over the
    /// few headers the answer speaks in the dialects' families (see
    /// [`Spoken`]): a lookup hashes its name (a quarter of an OpenAI
    /// answer's reading went to that), a compare of names mostly stops at
    /// their lengths.
    fn values<'h>(&self, spoken: &Spoken<'h>) -> Trio<Option<&'h HeaderValue>> {
        let mut found = Trio {
            limit: None,
            remaining: None,
            reset: None,
        };
        for &(name, value) in &spoken.headers {
            let slot = if *name == self.limit {
                &mut found.limit
            } else if *name == self.remaining {
                &mut found.remaining
            } else if *name == self.reset {
                &mut found.reset
            } else {
                continue;
            };
            slot.get_or_insert(value);
        }
        found
    }
}

impl Trio<Option<&HeaderValue>> {
    /// The limit and remaining, as integers.
    fn counts(&self) -> (Option<u64>, Option<u64>) {
        (
            self.limit.and_then(integer),
            self.remaining.and_then(integer),
        )
    }
}

/// GitHub's names, then X's; each with Discord's `reset-after`.
static GITHUB: [(Trio, HeaderName); 2] = [
    (
        Trio::new(
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ),
        HeaderName::from_static("x-ratelimit-reset-after"),
    ),
    (
        Trio::new(
            "x-rate-limit-limit",
            "x-rate-limit-remaining",
            "x-rate-limit-reset",
        ),
        HeaderName::from_static("x-rate-limit-reset-after"),
    ),
];

/// Requests, then tokens.
static OPENAI: [Trio; 2] = [
    Trio::new(
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
    ),
    Trio::new(
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    ),
];

/// Requests, tokens, input tokens, output tokens.
static ANTHROPIC: [Trio; 4] = [
    Trio::new(
        "anthropic-ratelimit-requests-limit",
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-requests-reset",
    ),
    Trio::new(
        "anthropic-ratelimit-tokens-limit",
        "anthropic-ratelimit-tokens-remaining",
        "anthropic-ratelimit-tokens-reset",
    ),
    Trio::new(
        "anthropic-ratelimit-input-tokens-limit",
        "anthropic-ratelimit-input-tokens-remaining",
        "anthropic-ratelimit-input-tokens-reset",
    ),
    Trio::new(
        "anthropic-ratelimit-output-tokens-limit",
        "anthropic-ratelimit-output-tokens-remaining",
        "anthropic-ratelimit-output-tokens-reset",
    ),
];

/// The IETF draft's older trio.
static IETF: Trio = Trio::new("ratelimit-limit", "ratelimit-remaining", "ratelimit-reset");

/// The headers the IETF draft's dialect and Shopify's read besides their
/// trios.
const RATELIMIT_POLICY: &str = "ratelimit-policy";
const RATELIMIT: &str = "ratelimit";
const SHOPIFY: &str = "x-shopify-shop-api-call-limit";

/// The families of header names the built-in dialects read, as bits: an
/// answer is read only by the dialects whose family it holds a name of,
/// found in one pass over its own few names (most answers, from most
/// vendors, hold none), not with a lookup for each of the forty-odd
/// headers the dialects know. An OpenAI answer is not looked up for
/// Anthropic's twelve names.
mod family {
    /// `Retry-After` and the millisecond headers read ahead of it.
    pub(super) const RETRY: u8 = 1;
    /// `x-ratelimit-*` and `x-rate-limit-*`: GitHub's, X's, Discord's.
    pub(super) const X_RATELIMIT: u8 = 1 << 1;
    /// `x-ratelimit-*-requests` and `x-ratelimit-*-tokens`: OpenAI's.
    pub(super) const OPENAI: u8 = 1 << 5;
    /// `anthropic-ratelimit-*`.
    pub(super) const ANTHROPIC: u8 = 1 << 2;
    /// `ratelimit*`: the IETF draft's fields and its older trio.
    pub(super) const IETF: u8 = 1 << 3;
    /// Shopify's call limit.
    pub(super) const SHOPIFY: u8 = 1 << 4;
}

/// How the names of each family begin.
const FAMILIES: [(&str, u8); 6] = [
    ("x-ratelimit-", family::X_RATELIMIT),
    ("x-rate-limit-", family::X_RATELIMIT),
    ("anthropic-ratelimit-", family::ANTHROPIC),
    (RATELIMIT, family::IETF),
    ("retry-after", family::RETRY),
    (SHOPIFY, family::SHOPIFY),
];

/// Whether a name beginning with each byte may be in a family: most of a
/// real answer's names (`date`, `content-type`, `server`, `cf-ray`,
/// `set-cookie`, the vendor's own) are told apart by their first byte,
/// with no prefix compared.
const MAY_BE_READ: [bool; 256] = first_bytes();

/// The first bytes of [`FAMILIES`]' prefixes and of [`RETRY_AFTER_MS`].
const fn first_bytes() -> [bool; 256] {
    let mut table = [false; 256];
    let mut i = 0;
    while i < FAMILIES.len() {
        table[FAMILIES[i].0.as_bytes()[0] as usize] = true;
        i += 1;
    }
    let mut i = 0;
    while i < RETRY_AFTER_MS.len() {
        table[RETRY_AFTER_MS[i].as_bytes()[0] as usize] = true;
        i += 1;
    }
    table
}

/// The family of the header `name`, if a built-in dialect reads its kind
/// (see [`FAMILIES`]); 0 if none does.
fn family_of(name: &HeaderName) -> u8 {
    let name = name.as_str();
    let first = name.as_bytes().first();
    if first.is_none_or(|&byte| !MAY_BE_READ[usize::from(byte)]) {
        return 0;
    }
    if RETRY_AFTER_MS.contains(&name) {
        return family::RETRY;
    }
    let family = FAMILIES
        .iter()
        .find(|(prefix, _)| name.starts_with(prefix))
        .map_or(0, |&(_, family)| family);
    if family == family::X_RATELIMIT && (name.ends_with("-requests") || name.ends_with("-tokens")) {
        return family::OPENAI;
    }
    family
}

/// A built-in dialect and the families of the names it reads.
struct BuiltIn {
    read: Reader,
    families: u8,
}

/// Every built-in dialect, in the order they read a response.
const BUILT_IN: &[BuiltIn] = &[
    BuiltIn {
        read: retry_after_dialects,
        families: family::RETRY,
    },
    BuiltIn {
        read: github,
        families: family::X_RATELIMIT,
    },
    BuiltIn {
        read: openai,
        families: family::OPENAI,
    },
    BuiltIn {
        read: anthropic,
        families: family::ANTHROPIC,
    },
    BuiltIn {
        read: ietf,
        families: family::IETF,
    },
    BuiltIn {
        read: shopify,
        families: family::SHOPIFY,
    },
];

fn retry_after_dialects(
    headers: &HeaderMap,
    _: &Spoken<'_>,
    clock: &AnswerClock<'_>,
    signals: &mut Signals,
) {
    if let Some(pause) = retry_after(headers, clock.now()) {
        signals.retry_after = Some(pause);
    }
}

/// GitHub (`x-ratelimit-*`) and X (`x-rate-limit-*`): reset in epoch
/// seconds. Discord adds `x-ratelimit-reset-after` (seconds with
/// milliseconds), which needs no clock of ours and wins.
fn github(_: &HeaderMap, spoken: &Spoken<'_>, clock: &AnswerClock<'_>, signals: &mut Signals) {
    for (names, reset_after) in &GITHUB {
        let values = names.values(spoken);
        let (limit, remaining) = values.counts();
        let reset = spoken
            .get(reset_after)
            .and_then(|v| Some((seconds(number(v)?), step(v))))
            .or_else(|| {
                let reset = values.reset?;
                Some((epoch_or_delta(reset, clock.now())?, step(reset)))
            });
        if let Some(filled) = fill(signals, Dimension::Requests, limit, remaining, reset) {
            filled.reset_at = values.reset.and_then(epoch);
        }
    }
}

/// OpenAI: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`.
fn openai(_: &HeaderMap, spoken: &Spoken<'_>, _: &AnswerClock<'_>, signals: &mut Signals) {
    for (names, dimension) in OPENAI.iter().zip([Dimension::Requests, Dimension::Tokens]) {
        let values = names.values(spoken);
        let (limit, remaining) = values.counts();
        // Go durations, written to the millisecond ("17ms", "59.989s").
        let reset = values
            .reset
            .and_then(go_duration)
            .map(|reset| (reset, Duration::from_millis(1)));
        if let Some(filled) = fill(signals, dimension, limit, remaining, reset) {
            // A token bucket: its reset is when it is full again.
            filled.refills = true;
        }
    }
}

/// Anthropic: `anthropic-ratelimit-<dimension>-{limit,remaining,reset}`,
/// reset as an RFC 3339 timestamp.
fn anthropic(_: &HeaderMap, spoken: &Spoken<'_>, clock: &AnswerClock<'_>, signals: &mut Signals) {
    let dimensions = [
        Dimension::Requests,
        Dimension::Tokens,
        Dimension::InputTokens,
        Dimension::OutputTokens,
    ];
    for (names, dimension) in ANTHROPIC.iter().zip(dimensions) {
        let values = names.values(spoken);
        let (limit, remaining) = values.counts();
        let at = values.reset.and_then(rfc3339);
        let reset = values
            .reset
            .and_then(|v| Some((until(at?, clock.now()), step(v))));
        if let Some(filled) = fill(signals, dimension, limit, remaining, reset) {
            filled.refills = true;
            filled.reset_at = at;
        }
    }
}

/// The IETF httpapi draft: `RateLimit-Policy` and `RateLimit` structured
/// fields (several named policies), and the older
/// `RateLimit-Limit/-Remaining/-Reset` trio.
fn ietf(_: &HeaderMap, spoken: &Spoken<'_>, _: &AnswerClock<'_>, signals: &mut Signals) {
    for value in spoken.get_all(RATELIMIT_POLICY) {
        for (name, params) in sf_list(value) {
            let entry = signals.limit_mut(Dimension::Policy(name));
            for (key, val) in params {
                match key {
                    "q" => entry.limit = val.parse().ok().or(entry.limit),
                    "w" => {
                        entry.window = val.parse().ok().map(Duration::from_secs).or(entry.window)
                    }
                    _ => {}
                }
            }
        }
    }
    for value in spoken.get_all(RATELIMIT) {
        for (name, params) in sf_list(value) {
            let entry = signals.limit_mut(Dimension::Policy(name));
            for (key, val) in params {
                match key {
                    "r" => entry.remaining = val.parse().ok().or(entry.remaining),
                    "t" => {
                        if let Ok(t) = val.parse() {
                            // Delta seconds: "sub-second precision is not supported".
                            entry.reset = Some(Duration::from_secs(t));
                            entry.precision = Duration::from_secs(1);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    let values = IETF.values(spoken);
    let (limit, remaining) = values.counts();
    let reset = values
        .reset
        .and_then(integer)
        .map(|t| (Duration::from_secs(t), Duration::from_secs(1)));
    fill(signals, Dimension::Requests, limit, remaining, reset);
}

/// Shopify REST: `X-Shopify-Shop-Api-Call-Limit: used/capacity`.
fn shopify(_: &HeaderMap, spoken: &Spoken<'_>, _: &AnswerClock<'_>, signals: &mut Signals) {
    let Some(text) = spoken.get(SHOPIFY).and_then(|v| v.to_str().ok()) else {
        return;
    };
    let Some((used, capacity)) = text.trim().split_once('/') else {
        return;
    };
    let (Ok(used), Ok(capacity)) = (used.trim().parse::<u64>(), capacity.trim().parse::<u64>())
    else {
        return;
    };
    let entry = signals.limit_mut(Dimension::Requests);
    entry.limit = Some(capacity);
    entry.remaining = Some(capacity.saturating_sub(used));
    // A leaky bucket: it frees a unit at a time, at a rate it never says.
    entry.refills = true;
}

/// Merge what a dialect read of one limit (its reset with its precision),
/// and give the limit for what else the dialect knows of it; `None` when
/// it read nothing.
fn fill(
    signals: &mut Signals,
    dimension: Dimension,
    limit: Option<u64>,
    remaining: Option<u64>,
    reset: Option<(Duration, Duration)>,
) -> Option<&mut Limit> {
    if limit.is_none() && remaining.is_none() && reset.is_none() {
        return None;
    }
    let entry = signals.limit_mut(dimension);
    entry.limit = limit.or(entry.limit);
    entry.remaining = remaining.or(entry.remaining);
    if let Some((reset, precision)) = reset {
        entry.reset = Some(reset);
        entry.precision = precision;
    }
    Some(entry)
}

/// A header dialect: reads what it understands into `signals`.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use callshaper::signals::{Dimension, Signals};
/// use reqwest::header::HeaderMap;
///
/// // A vendor that sends `x-quota-left: 12`.
/// let dialect = |headers: &HeaderMap, _now: SystemTime, signals: &mut Signals| {
///     if let Some(left) = headers.get("x-quota-left").and_then(|v| v.to_str().ok()?.parse().ok()) {
///         signals.limit_mut(Dimension::Requests).remaining = Some(left);
///     }
/// };
/// let shaper = callshaper::Shaper::builder()
///     .rate(10, Duration::from_secs(1))
///     .dialect(dialect)
///     .build()?;
/// # Ok::<(), callshaper::ConfigError>(())
/// ```
pub trait Dialect: Send + Sync + 'static {
    /// Read `headers` into `signals`.
    fn read(&self, headers: &HeaderMap, now: SystemTime, signals: &mut Signals);
}

impl<F> Dialect for F
where
    F: Fn(&HeaderMap, SystemTime, &mut Signals) + Send + Sync + 'static,
{
    fn read(&self, headers: &HeaderMap, now: SystemTime, signals: &mut Signals) {
        self(headers, now, signals);
    }
}

impl Signals {
    /// Read every dialect this module knows from `headers`; `now` is the
    /// wall clock, for the dialects that send dates.
    pub fn parse(headers: &HeaderMap, now: SystemTime) -> Self {
        let now = || now;
        Self::parse_spoken(headers, &AnswerClock::new(&now), &Spoken::of(headers))
    }

    /// [`parse`](Self::parse), with the families `headers` speak already
    /// found (one pass over an answer's names, not two), and its clock
    /// read only if a dialect needs it.
    pub(crate) fn parse_spoken(
        headers: &HeaderMap,
        clock: &AnswerClock<'_>,
        spoken: &Spoken<'_>,
    ) -> Self {
        let mut signals = Self::default();
        for dialect in BUILT_IN
            .iter()
            .filter(|d| d.families & spoken.families != 0)
        {
            (dialect.read)(headers, spoken, clock, &mut signals);
        }
        signals
    }
}

/// What of an answer the built-in dialects read: the families its names
/// belong to, and those headers, found in one pass over the answer before
/// any dialect reads it. A real answer has a score of headers, a few of
/// them rate limits (OpenAI sends 23, six of them its own); each dialect
/// then looks through those few, not all of them.
#[derive(Debug)]
pub(crate) struct Spoken<'h> {
    families: u8,
    /// Every value of a name in a family, in the answer's order.
    headers: SmallVec<[(&'h HeaderName, &'h HeaderValue); 12]>,
}

impl<'h> Spoken<'h> {
    /// The families of the names in `headers`, and their headers.
    pub(crate) fn of(headers: &'h HeaderMap) -> Self {
        let mut spoken = Self {
            families: 0,
            headers: SmallVec::new(),
        };
        for (name, value) in headers {
            let family = family_of(name);
            if family != 0 {
                spoken.families |= family;
                spoken.headers.push((name, value));
            }
        }
        spoken
    }

    /// No built-in dialect reads any of them: [`Signals::parse`] would find
    /// nothing, and needs no clock.
    pub(crate) fn is_none(&self) -> bool {
        self.families == 0
    }

    /// The first value of `name`, if the answer has one.
    fn get(&self, name: impl PartialEq<HeaderName>) -> Option<&'h HeaderValue> {
        self.get_all(name).next()
    }

    /// Every value of `name`, in order.
    fn get_all<'a>(
        &'a self,
        name: impl PartialEq<HeaderName> + 'a,
    ) -> impl Iterator<Item = &'h HeaderValue> + 'a {
        self.headers
            .iter()
            .filter(move |(named, _)| name == **named)
            .map(|&(_, value)| value)
    }
}

#[cfg(test)]
mod tests {
    use reqwest::header::RETRY_AFTER;

    use super::*;

    /// The one pass over an answer's names finds every header a dialect
    /// reads, in that dialect's family: a name outside it would be skipped
    /// unread.
    #[test]
    fn the_first_pass_knows_every_header_a_dialect_reads() {
        let trios = |trios: &[&Trio]| -> Vec<HeaderName> {
            trios
                .iter()
                .flat_map(|t| [t.limit.clone(), t.remaining.clone(), t.reset.clone()])
                .collect()
        };
        let named = |names: &[&'static str]| -> Vec<HeaderName> {
            names.iter().map(|n| HeaderName::from_static(n)).collect()
        };
        let mut x_ratelimit = trios(&GITHUB.iter().map(|(trio, _)| trio).collect::<Vec<_>>());
        x_ratelimit.extend(GITHUB.iter().map(|(_, after)| after.clone()));
        let mut ietf = trios(&[&IETF]);
        ietf.extend(named(&[RATELIMIT_POLICY, RATELIMIT]));
        let mut retry = named(&RETRY_AFTER_MS);
        retry.push(RETRY_AFTER);
        let read = [
            (retry, family::RETRY),
            (x_ratelimit, family::X_RATELIMIT),
            (trios(&OPENAI.iter().collect::<Vec<_>>()), family::OPENAI),
            (
                trios(&ANTHROPIC.iter().collect::<Vec<_>>()),
                family::ANTHROPIC,
            ),
            (ietf, family::IETF),
            (named(&[SHOPIFY]), family::SHOPIFY),
        ];
        for (names, family) in &read {
            for name in names {
                assert_eq!(family_of(name), *family, "{name} would be skipped");
            }
        }
        for name in ["date", "content-type", "x-request-id", "ratel"] {
            assert_eq!(family_of(&HeaderName::from_static(name)), 0, "{name}");
        }
    }

    /// An answer whose resets are all relative is read without its clock:
    /// no reading of the wall clock, no parse of its `Date`. One with an
    /// absolute reset reads it once, however many dialects ask.
    #[test]
    fn the_clock_is_read_only_for_an_absolute_time() {
        let reads = std::cell::Cell::new(0);
        let now = || {
            reads.set(reads.get() + 1);
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
        };
        // An answer with these headers besides its date, read.
        let read = |headers: &[(&'static str, &'static str)]| -> Signals {
            let date = ("date", "Tue, 14 Nov 2023 22:13:20 GMT");
            let answer: HeaderMap = std::iter::once(&date)
                .chain(headers)
                .map(|&(name, value)| {
                    let name = HeaderName::from_static(name);
                    (name, HeaderValue::from_static(value))
                })
                .collect();
            Signals::parse_spoken(&answer, &AnswerClock::new(&now), &Spoken::of(&answer))
        };
        let openai = read(&[
            ("x-ratelimit-limit-requests", "500"),
            ("x-ratelimit-remaining-requests", "499"),
            ("x-ratelimit-reset-requests", "120ms"),
        ]);
        assert_eq!(reads.get(), 0);
        assert_eq!(openai.request_reset(), Some(Duration::from_millis(120)));
        let github = read(&[
            ("x-ratelimit-limit", "5000"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "1700000030"),
            ("retry-after", "Tue, 14 Nov 2023 22:13:50 GMT"),
        ]);
        assert_eq!(reads.get(), 1);
        assert_eq!(github.request_reset(), Some(Duration::from_secs(30)));
        assert_eq!(github.retry_after, Some(Duration::from_secs(30)));
    }
}
