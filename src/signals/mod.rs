//! Throttle signals: what a vendor's response says about its limits and
//! when to send again, in every common dialect, read into one [`Signals`].
//!
//! Every parser here takes any bytes a vendor (or a broken proxy) can put in
//! a header and never panics: what it cannot read, it ignores, and the lane
//! falls back to its own exponential backoff.
//!
//! | dialect | header(s) | format |
//! |---|---|---|
//! | RFC 9110 | `Retry-After` | delta-seconds, or an HTTP-date |
//! | OpenAI and others | `retry-after-ms` | milliseconds |
//! | AWS | `x-amz-retry-after` | milliseconds |
//! | gRPC | `grpc-retry-pushback-ms` | milliseconds |
//! | GitHub, X, Discord | `x-ratelimit-{limit,remaining,reset,used}`, X's `x-rate-limit-*`, Discord's `x-ratelimit-reset-after` | reset = epoch seconds (a small value is read as seconds from now); reset-after = seconds with milliseconds |
//! | OpenAI | `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` | reset = a duration such as `6m0s`, `1.5s`, `17ms` |
//! | Anthropic | `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}` | reset = RFC 3339 timestamp |
//! | IETF httpapi draft | `RateLimit-Policy: "p";q=100;w=60`, `RateLimit: "p";r=50;t=30`, and the older `RateLimit-Limit/-Remaining/-Reset` | structured fields; `t` = seconds until reset |
//! | Shopify REST | `X-Shopify-Shop-Api-Call-Limit` | `used/capacity`, e.g. `32/40` |
//!
//! A negative value or a time in the past means "now"; a value too large to
//! represent saturates (and is then refused by the lane's `max_pause`).
//! Header names are matched without regard to case, as HTTP requires.
//!
//! A vendor with a dialect of its own needs no fork: give the shaper a
//! [`Dialect`] (any `Fn(&HeaderMap, SystemTime, &mut Signals)` is one).
//!
//! | file | what it owns |
//! |---|---|
//! | `mod.rs` | [`Signals`], [`Limit`], [`Dimension`], the [`Dialect`] and [`WallClock`] traits, [`retry_after`] |
//! | `dialects.rs` | the built-in readers, one per vendor family |
//! | `formats.rs` | the value formats: numbers, dates, Go durations, RFC 3339, structured fields |

mod dialects;
mod formats;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};

use self::dialects::BUILT_IN;
use self::formats::{http_date, number, seconds};
use crate::meters::Rate;

/// The largest pause a header can express here; anything larger saturates
/// to it. A hundred years is far past any sensible `max_pause`, and adding
/// it to an `Instant` cannot overflow.
pub const LONGEST: Duration = crate::time::FAR;

/// Everything a response said about the vendor's limits.
///
/// After a shaped request, the response carries these in its extensions:
///
/// ```
/// # fn f(response: reqwest::Response) {
/// if let Some(signals) = response.extensions().get::<callshaper::signals::Signals>() {
///     println!("{:?} left", signals.remaining(callshaper::signals::Dimension::Requests));
/// }
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Signals {
    /// An explicit "come back after this long".
    pub retry_after: Option<Duration>,
    /// What the vendor said about each of its limits.
    pub limits: Vec<Limit>,
}

/// One limit as a vendor announced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// What the limit counts.
    pub dimension: Dimension,
    /// The quota.
    pub limit: Option<u64>,
    /// What is left of it.
    pub remaining: Option<u64>,
    /// Time until the quota is whole again.
    pub reset: Option<Duration>,
    /// How finely the vendor writes its reset: the true reset is within
    /// this of `reset`, either way, since a vendor may round up or down
    /// (1 s for whole seconds, 1 ms for milliseconds). Zero when the
    /// dialect does not say, and the reset is taken as exact.
    pub precision: Duration,
    /// The reset as the instant the vendor wrote, on its own clock, when it
    /// wrote one (an epoch second: GitHub, X, Discord; an RFC 3339 time:
    /// Anthropic); `None` for a delta. A fixed window's end stays put
    /// through the window, so the step from one end to the next is the
    /// vendor's window, exactly, wherever the lane stands in it.
    pub reset_at: Option<SystemTime>,
    /// The window the quota is counted over, when the vendor says so.
    pub window: Option<Duration>,
    /// The limit is a bucket that refills (or leaks) unit by unit, and its
    /// reset, if any, is when it is *whole* again (OpenAI, Anthropic; and
    /// Shopify, which sends no reset). With nothing left, the next unit
    /// comes after about `reset / limit`, not `reset`. False when the
    /// reset is a window's end or the next unit (GitHub, gateways, IETF
    /// `t`).
    pub refills: bool,
}

impl Limit {
    fn new(dimension: Dimension) -> Self {
        Self {
            dimension,
            limit: None,
            remaining: None,
            reset: None,
            precision: Duration::ZERO,
            reset_at: None,
            window: None,
            refills: false,
        }
    }

    /// True when it counts requests (an IETF policy counts them too), not
    /// tokens.
    pub(crate) fn counts_requests(&self) -> bool {
        matches!(self.dimension, Dimension::Requests | Dimension::Policy(_))
    }

    /// How long until the vendor accepts again, with nothing left: the
    /// reset, or one unit's share of it for a limit that refills.
    fn next_unit(&self) -> Option<Duration> {
        let reset = self.reset?;
        match self.limit.filter(|&limit| self.refills && limit > 1) {
            Some(limit) => Some(reset / u32::try_from(limit).unwrap_or(u32::MAX)),
            None => Some(reset),
        }
    }
}

/// What a limit counts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Dimension {
    /// Requests.
    Requests,
    /// Tokens (input and output together).
    Tokens,
    /// Input (prompt) tokens.
    InputTokens,
    /// Output (completion) tokens.
    OutputTokens,
    /// A named IETF `RateLimit-Policy`, counted in the vendor's units.
    Policy(String),
}

impl fmt::Display for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Requests => f.write_str("requests"),
            Self::Tokens => f.write_str("tokens"),
            Self::InputTokens => f.write_str("input tokens"),
            Self::OutputTokens => f.write_str("output tokens"),
            Self::Policy(name) => write!(f, "policy {name}"),
        }
    }
}

impl Signals {
    /// Read every dialect this module knows from `headers`; `now` is the
    /// wall clock, for the dialects that send dates.
    pub fn parse(headers: &HeaderMap, now: SystemTime) -> Self {
        let mut signals = Self::default();
        for dialect in BUILT_IN {
            dialect(headers, now, &mut signals);
        }
        signals
    }

    /// True when nothing was understood.
    pub fn is_empty(&self) -> bool {
        self.retry_after.is_none() && self.limits.is_empty()
    }

    /// The limit of `dimension`, creating it if this is its first mention.
    pub fn limit_mut(&mut self, dimension: Dimension) -> &mut Limit {
        match self.limits.iter().position(|l| l.dimension == dimension) {
            Some(i) => &mut self.limits[i],
            None => {
                self.limits.push(Limit::new(dimension));
                let last = self.limits.len() - 1;
                &mut self.limits[last]
            }
        }
    }

    /// What is left of `dimension`, if the vendor said.
    pub fn remaining(&self, dimension: Dimension) -> Option<u64> {
        self.limits
            .iter()
            .find(|l| l.dimension == dimension)
            .and_then(|l| l.remaining)
    }

    /// How long the vendor will refuse us, whatever the status of this
    /// response: the longest wait among limits with nothing left, each the
    /// reset, or for a limit that [`refills`](Limit::refills), one unit's
    /// share of it (OpenAI's "6m0s" token reset does not mean six idle
    /// minutes).
    pub fn exhausted_for(&self) -> Option<Duration> {
        self.limits
            .iter()
            .filter(|l| l.remaining == Some(0))
            .filter_map(Limit::next_unit)
            .max()
    }

    /// True when a request limit is used up: with a 403, GitHub's way of
    /// saying "rate limited". Token limits (Anthropic's input and output
    /// tokens among them) are not request limits: a 403 beside a spent
    /// token limit is the vendor's refusal of the request, not a throttle.
    pub fn requests_exhausted(&self) -> bool {
        self.request_limits().any(|l| l.remaining == Some(0))
    }

    /// The smallest request limit the vendor stated, if any (a token
    /// limit is not one).
    pub fn request_limit(&self) -> Option<u64> {
        self.request_limits().filter_map(|l| l.limit).min()
    }

    /// The longest reset of a request limit, as the vendor stated it (a
    /// window's end, or a bucket full again).
    pub fn request_reset(&self) -> Option<Duration> {
        self.request_limits().filter_map(|l| l.reset).max()
    }

    /// The limits that count requests (an IETF policy counts them too).
    pub(crate) fn request_limits(&self) -> impl Iterator<Item = &Limit> {
        self.limits.iter().filter(|l| l.counts_requests())
    }

    /// The vendor's bucket: the request limit that
    /// [`refills`](Limit::refills), if one does.
    pub(crate) fn bucket(&self) -> Option<&Limit> {
        self.request_limits().find(|l| l.refills)
    }

    /// The end of the vendor's fixed window, where it wrote it as an
    /// instant: the [`reset_at`](Limit::reset_at) of a request limit that
    /// does not refill.
    pub(crate) fn window_end(&self) -> Option<SystemTime> {
        self.request_limits()
            .filter(|l| !l.refills)
            .find_map(|l| l.reset_at)
    }

    /// When to come back: the explicit hint, else the reset of an exhausted
    /// limit.
    pub fn pause_hint(&self) -> Option<Duration> {
        self.retry_after.or_else(|| self.exhausted_for())
    }

    /// The slowest request rate the vendor announced with a window (IETF
    /// `RateLimit-Policy`), if any.
    pub fn announced_rate(&self) -> Option<Rate> {
        self.limits
            .iter()
            .filter(|l| {
                !matches!(
                    l.dimension,
                    Dimension::Tokens | Dimension::InputTokens | Dimension::OutputTokens
                )
            })
            .filter_map(|l| {
                let count = u32::try_from(l.limit?).ok().filter(|&c| c > 0)?;
                let window = l.window.filter(|w| !w.is_zero())?;
                Some(Rate::new(count, window))
            })
            .min_by(|a, b| {
                // Compare count/per without division: a.count * b.per vs b.count * a.per.
                let left = a.per.as_nanos() * u128::from(b.count);
                let right = b.per.as_nanos() * u128::from(a.count);
                right.cmp(&left)
            })
    }
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

/// Where a shaper reads the wall clock, against which it reads the
/// absolute times vendors write (an epoch reset, an HTTP-date
/// `Retry-After`, an RFC 3339 instant). [`SystemClock`] unless the builder
/// is given another ([`ShaperBuilder::wall_clock`](crate::ShaperBuilder::wall_clock)):
/// tests under tokio's paused clock give one that moves with it
/// (`testing::TokioWall`, feature `testing`), as governor's tests give
/// its fake clock.
pub trait WallClock: Send + Sync + fmt::Debug + 'static {
    /// The time now.
    fn now(&self) -> SystemTime;
}

/// The system's wall clock: [`SystemTime::now`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl WallClock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// The vendor's clock, read from its `Date` header when it differs from
/// ours (`now`) by more than the header's one-second precision; else ours.
/// Absolute times a vendor sends (an HTTP-date `Retry-After`, an epoch
/// reset, an RFC 3339 instant) are on its clock: read against ours, a
/// vendor 2 s ahead would hold the lane 2 s too long, and one 2 s behind
/// would let it go 2 s early, into another 429. The header is truncated to
/// the second, so a corrected wait errs long, by less than a second.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use reqwest::header::{HeaderMap, HeaderValue};
///
/// let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
/// let mut headers = HeaderMap::new();
/// let ahead = httpdate::fmt_http_date(now + Duration::from_secs(2));
/// headers.insert("date", HeaderValue::from_str(&ahead).unwrap());
/// let vendor = callshaper::signals::vendor_clock(&headers, now);
/// assert_eq!(vendor, now + Duration::from_secs(2));
/// ```
pub fn vendor_clock(headers: &HeaderMap, now: SystemTime) -> SystemTime {
    let Some(date) = headers
        .get(reqwest::header::DATE)
        .and_then(|v| v.to_str().ok())
        .and_then(|text| httpdate::parse_http_date(text).ok())
    else {
        return now;
    };
    let skew = match date.duration_since(now) {
        Ok(ahead) => ahead,
        Err(behind) => behind.duration(),
    };
    if skew > Duration::from_secs(1) {
        date
    } else {
        now
    }
}

/// How long the vendor asked us to wait, if it said so in a form we read.
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
    read_retry_after(headers, now).map(|(_, _, wait)| wait)
}

/// Headers of milliseconds that say when to come back, ahead of
/// `Retry-After`.
const RETRY_AFTER_MS: [&str; 3] = [
    "retry-after-ms",
    "x-amz-retry-after",
    "grpc-retry-pushback-ms",
];

/// The header [`retry_after`] reads, its value, and the wait it says.
fn read_retry_after(
    headers: &HeaderMap,
    now: SystemTime,
) -> Option<(&'static str, &HeaderValue, Duration)> {
    for name in RETRY_AFTER_MS {
        if let Some(value) = headers.get(name)
            && let Some(ms) = number(value)
        {
            return Some((name, value, seconds(ms / 1000.0)));
        }
    }
    let value = headers.get(RETRY_AFTER)?;
    let wait = number(value)
        .map(seconds)
        .or_else(|| http_date(value, now))?;
    Some((RETRY_AFTER.as_str(), value, wait))
}

/// The most of a vendor's words a pause cites: the values are the
/// vendor's.
const CITED: usize = 200;

/// What the vendor said about when to come back, as it said it, for a
/// pause to cite: the header its hint came from (`retry-after: 2`), else
/// each limit with nothing left (`requests: 0 of 10 left, reset in 1s`),
/// or, with none, each with one left (a unit left to another consumer).
/// At most [`CITED`] characters.
pub(crate) fn cite(headers: &HeaderMap, signals: &Signals) -> Option<Arc<str>> {
    let hint = signals.retry_after.map(|hint| {
        match read_retry_after(headers, SystemTime::now()) {
            Some((name, value, _)) => {
                let value = &value.as_bytes()[..value.len().min(CITED)];
                format!("{name}: {}", String::from_utf8_lossy(value))
            }
            // A dialect of the user's said it.
            None => format!("retry after {hint:?}"),
        }
    });
    let text = hint.or_else(|| {
        let least = signals
            .limits
            .iter()
            .filter_map(|l| l.remaining)
            .min()
            .filter(|&least| least <= 1)?;
        let spent: Vec<String> = signals
            .limits
            .iter()
            .filter(|l| l.remaining == Some(least))
            .map(|l| {
                let of = l
                    .limit
                    .map(|limit| format!(" of {limit}"))
                    .unwrap_or_default();
                let reset = l
                    .reset
                    .map(|reset| format!(", reset in {reset:?}"))
                    .unwrap_or_default();
                format!("{}: {least}{of} left{reset}", l.dimension)
            })
            .collect();
        Some(spent.join("; "))
    })?;
    Some(text.chars().take(CITED).collect::<String>().into())
}

#[cfg(test)]
mod tests;
