//! What a response said: [`Signals`], its [`Limit`]s and what each
//! counts ([`Dimension`]), and the questions the lane asks of them.

use std::fmt;
use std::time::{Duration, SystemTime};

use crate::meters::Rate;

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
    pub(super) fn next_unit(&self) -> Option<Duration> {
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
    /// What a shaped `response` said, as its extensions carry it (none, for
    /// a response the shaper did not read).
    pub(crate) fn of(response: &reqwest::Response) -> std::borrow::Cow<'_, Self> {
        response
            .extensions()
            .get::<Self>()
            .map_or_else(Default::default, std::borrow::Cow::Borrowed)
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

    /// How finely the vendor wrote [`pause_hint`](Self::pause_hint), in the
    /// `headers` these signals were read from: its `Retry-After`'s
    /// precision, else that of the exhausted limit whose reset it is. Zero
    /// for a hint of the user's own dialect, taken as exact.
    pub(crate) fn hint_precision(&self, headers: &reqwest::header::HeaderMap) -> Duration {
        if self.retry_after.is_some() {
            return super::retry_after::retry_after_precision(headers);
        }
        self.limits
            .iter()
            .filter(|l| l.remaining == Some(0))
            .filter_map(|l| Some((l.next_unit()?, l.precision)))
            .max()
            .map_or(Duration::ZERO, |(_, precision)| precision)
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
