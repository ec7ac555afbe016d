//! How a lane behaves ([`LanePolicy`]) and the classes its requests wait
//! in ([`Priority`]).

use std::time::Duration;

use crate::adaptive::Adaptive;
use crate::answers::Answers;
use crate::error::ConfigError;
use crate::gate::GateSettings;
use crate::meters::{Quota, Requests};
use crate::retry::{Backoff, RetryBudget};
use crate::vendor::VendorSettings;

/// The most headroom a lane may add to each window.
const MAX_HEADROOM: Duration = Duration::from_secs(3600);

/// How one lane behaves: its queue, waits, pauses and what the vendor's
/// answers mean. The quotas are not part of it: they belong to the levels
/// a lane waits on ([`ShaperBuilder::rate`](crate::shaper::ShaperBuilder::rate),
/// [`Level`](crate::route::Level)), or are given to [`Lane::new`](super::Lane::new).
///
/// Start from the defaults and change what differs; new settings may be
/// added in a minor release, each with a default:
///
/// ```
/// use std::time::Duration;
/// use callshaper::lane::LanePolicy;
///
/// let mut policy = LanePolicy::default();
/// policy.max_wait = Some(Duration::from_secs(30));
/// policy.queue_capacity = 500;
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LanePolicy {
    /// Added to the vendor's window before dividing it into release slots, so
    /// that timer lateness and network jitter cannot push a strict vendor
    /// over. Default 5 ms; more than an hour is refused.
    pub headroom: Duration,
    /// How many requests may wait; one more is refused with
    /// [`Error::QueueFull`](crate::Error::QueueFull). Default 10,000.
    pub queue_capacity: usize,
    /// The longest a request may wait to be released (queue and pauses, not
    /// time on the wire). `None` (the default) waits as long as it takes.
    pub max_wait: Option<Duration>,
    /// Requests of this lane on the wire at once. `None` (the default): no
    /// cap beyond the rate. A request holds its slot until its response's
    /// headers arrive, or with
    /// [`in_flight_through_body`](crate::shaper::RequestBuilder::in_flight_through_body)
    /// until its body ends. Values past tokio's semaphore limit
    /// (`usize::MAX >> 3`) are capped there.
    pub max_in_flight: Option<usize>,
    /// The longest pause a vendor may impose. A longer `Retry-After` pauses
    /// the lane this long and ends the request with
    /// [`Error::PauseTooLong`](crate::Error::PauseTooLong). Default 120 s.
    pub max_pause: Duration,
    /// The pause after a throttle that says nothing usable about when to
    /// come back; grows with consecutive throttles (equal jitter) and
    /// resets on success. Default 1 s doubling up to 60 s.
    pub fallback: Backoff,
    /// A shaper's lane quiet this long goes, unless it holds more than
    /// meters (someone waiting, a pause, strict spacing in flight). Meters
    /// of its own that still count (a daily quota partly spent) rest until
    /// they count nothing, and the key's next lane counts on from them.
    /// Default 60 s; zero is refused; a shaper lets a lane go after 20
    /// days at most.
    pub idle_timeout: Duration,
    /// Opt-in adaptive pacing for vendors that announce nothing: throttles
    /// without a header cut the lane's request rate, successes grow it back,
    /// never above the first request quota (see [`Adaptive`](crate::lane::Adaptive)).
    /// Default off.
    pub adaptive: Option<Adaptive>,
    /// When interactive and batch requests both wait, one release in this
    /// many goes to batch. Default 5 (batch keeps 20% of a busy lane).
    pub batch_share: u32,
    /// What the vendor's answers mean: which statuses throttle the lane,
    /// which fail one request, which bodies say the account is out of
    /// credit. Default: [`Answers::default`].
    pub answers: Answers,
    /// How the lane's requests cost tokens (feature `tokens`): estimated
    /// from each request's body and settled from the usage its answer
    /// reports. Default none: a request costs what its caller, or else the
    /// shaper's estimate, says.
    #[cfg(feature = "tokens")]
    pub tokens: Option<crate::tokens::TokenCost>,
}

impl Default for LanePolicy {
    /// The defaults named on each field.
    fn default() -> Self {
        Self {
            headroom: Duration::from_millis(5),
            queue_capacity: 10_000,
            max_wait: None,
            max_in_flight: None,
            max_pause: Duration::from_secs(120),
            fallback: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
            idle_timeout: Duration::from_secs(60),
            adaptive: None,
            batch_share: 5,
            answers: Answers::default(),
            #[cfg(feature = "tokens")]
            tokens: None,
        }
    }
}

impl LanePolicy {
    /// What the lane's gates need of this policy.
    pub(crate) fn gate_settings(&self) -> GateSettings {
        GateSettings {
            headroom: self.headroom,
            max_pause: self.max_pause,
            hears: true,
        }
    }

    /// What the vendor's model needs of this policy, with the retry
    /// `budget`.
    pub(crate) fn vendor_settings(&self, budget: RetryBudget) -> VendorSettings {
        VendorSettings {
            fallback: self.fallback,
            adaptive: self.adaptive,
            budget,
        }
    }

    /// Check this policy for lanes that keep to `quotas`: each setting, the
    /// quotas themselves, and what the two need of each other.
    pub(crate) fn validate(&self, quotas: &[Quota]) -> Result<(), ConfigError> {
        if quotas.is_empty() {
            return Err(ConfigError::new(
                "quotas",
                "a lane needs at least one quota",
            ));
        }
        for (i, quota) in quotas.iter().enumerate() {
            quota
                .validate()
                .map_err(|e| e.within(&format!("quotas[{i}]")))?;
        }
        self.answers.validate()?;
        if self.headroom > MAX_HEADROOM {
            return Err(ConfigError::new(
                "headroom",
                format!(
                    "{:?} is more than an hour: headroom pads timer lateness and network jitter",
                    self.headroom
                ),
            ));
        }
        if self.idle_timeout.is_zero() {
            return Err(ConfigError::new("idle_timeout", "must be longer than zero"));
        }
        if self.queue_capacity == 0 {
            return Err(ConfigError::new("queue_capacity", "must be at least 1"));
        }
        if self.max_in_flight == Some(0) {
            return Err(ConfigError::new("max_in_flight", "must be at least 1"));
        }
        if self.batch_share == 0 {
            return Err(ConfigError::new("batch_share", "must be at least 1"));
        }
        if let Some(adaptive) = &self.adaptive {
            adaptive.validate()?;
            if Requests::of(quotas).rate.is_none() {
                return Err(ConfigError::new(
                    "adaptive",
                    "needs a quota counting requests, to be its ceiling",
                ));
            }
        }
        if self.fallback.base.is_zero() || self.fallback.cap < self.fallback.base {
            return Err(ConfigError::new(
                "fallback",
                "base must be above zero and cap at least base",
            ));
        }
        Ok(())
    }
}

/// Which class a request waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Priority {
    /// Someone is waiting for the answer: goes first.
    #[default]
    Interactive,
    /// Background work: goes when no interactive request waits, and at least
    /// one release in `batch_share` when they do.
    Batch,
}

impl Priority {
    /// The class's name, as spans show it.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Interactive => "interactive",
            Self::Batch => "batch",
        }
    }
}
