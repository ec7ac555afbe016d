//! Every way a request can end without a response.
//!
//! callshaper promises that each submitted request ends in exactly one
//! outcome: the vendor's response, or one of these errors. None of them is a
//! hang: each is answered at once or within a bound the caller chose.

use std::time::Duration;

use reqwest::header::HeaderMap;
use reqwest::{Response, StatusCode};

/// Why a request ended without a response.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lane's queue already holds `capacity` waiting requests; this one
    /// was refused at once instead of waiting behind them.
    #[error("lane `{lane}` is full: {capacity} requests already waiting")]
    QueueFull {
        /// The lane that refused the request.
        lane: String,
        /// The lane's queue bound.
        capacity: usize,
    },

    /// The request costs more than a quota of the lane can ever allow at
    /// once (e.g. 100,000 tokens against 90,000 per minute): refused at
    /// once instead of waiting forever.
    #[error("lane `{lane}`: a cost of {cost} can never fit in a quota of {capacity}")]
    CostTooHigh {
        /// The lane that refused the request.
        lane: String,
        /// The request's cost.
        cost: u64,
        /// The smallest capacity it exceeds.
        capacity: u64,
    },

    /// At admission, the lane predicted this request could not be released
    /// within its `max_wait` (queue position, pace and current pause).
    #[error(
        "lane `{lane}` would release this request in {predicted:?}, past max_wait {max_wait:?}"
    )]
    WouldExceedMaxWait {
        /// The lane that refused the request.
        lane: String,
        /// How long the lane predicted the request would wait.
        predicted: Duration,
        /// The limit the caller or the lane set.
        max_wait: Duration,
    },

    /// The request waited `max_wait` in total without being released (a
    /// pause announced after it was admitted kept it back).
    #[error("lane `{lane}` did not release this request within max_wait {max_wait:?}")]
    MaxWaitElapsed {
        /// The lane the request waited on.
        lane: String,
        /// The limit the caller or the lane set.
        max_wait: Duration,
    },

    /// The vendor asked the lane to pause for longer than `max_pause`. The
    /// lane pauses for `max_pause`; this request ends here with the vendor's
    /// value so the caller can decide.
    #[error("vendor asked lane `{lane}` to pause {requested:?}, more than max_pause {max_pause:?}")]
    PauseTooLong {
        /// The lane that was throttled.
        lane: String,
        /// The pause the vendor asked for.
        requested: Duration,
        /// The lane's limit.
        max_pause: Duration,
        /// The throttle itself.
        answer: Box<Answer>,
    },

    /// The vendor said the account is out of credit or past a spending cap
    /// (OpenAI's `insufficient_quota`): no pause brings that back. This
    /// request, every one waiting in the vendor's lanes, and every new one
    /// for the next `max_pause` end with this at once; then one request
    /// goes to see whether credit is back.
    #[error("vendor refused lane `{lane}`: out of credit ({status}): {body}")]
    OutOfCredit {
        /// The lane that was refused.
        lane: String,
        /// The vendor's status.
        status: StatusCode,
        /// The vendor's answer, at most its first 4 KiB.
        body: String,
    },

    /// The vendor kept answering with a retryable status until the retry
    /// limits ran out.
    #[error("gave up after {attempts} attempts; last status {last_status}")]
    RetriesExhausted {
        /// How many times the request was sent.
        attempts: u32,
        /// The status of the vendor's last answer.
        last_status: StatusCode,
        /// The vendor's last answer.
        last_answer: Box<Answer>,
    },

    /// A layer above the shaper (a retry middleware) sent again a request
    /// the shaper had already sent `attempts` times, its limit: refused
    /// without another send, so retries stay bounded however many layers
    /// retry.
    #[error(
        "lane `{lane}`: already sent {attempts} times, the retry limit; a layer above tried again"
    )]
    AttemptsSpent {
        /// The lane of the request.
        lane: String,
        /// How many times the request was sent, over every layer's tries.
        attempts: u32,
    },

    /// The lane's retry budget is spent: the vendor is failing many
    /// requests, and retrying each would multiply the load on it.
    #[error("lane `{lane}` has no retry budget left after {attempts} attempts")]
    RetryBudgetExhausted {
        /// The lane whose budget is spent.
        lane: String,
        /// How many times the request was sent.
        attempts: u32,
        /// The status of the vendor's last answer, if it answered.
        last_status: Option<StatusCode>,
        /// The vendor's last answer, if it answered.
        last_answer: Option<Box<Answer>>,
    },

    /// The request could not be sent or its response not read, and it was
    /// not (or no longer) retried.
    // The source is the next link of the error chain: not repeated here.
    #[error("transport error after {attempts} attempts")]
    Transport {
        /// How many times the request was sent.
        attempts: u32,
        /// The underlying reqwest error, its URL without the query,
        /// fragment or credentials (which may carry a key).
        #[source]
        source: reqwest::Error,
    },

    /// No quota covers this request: it matches no route, and the shaper
    /// has no default quota. Refused rather than sent unshaped.
    #[error("no quota covers {url}")]
    NoQuota {
        /// The request's URL, without its query, fragment or credentials
        /// (which may carry a key).
        url: String,
    },

    /// The request could not be built (an invalid URL or header).
    #[error("invalid request")]
    InvalidRequest(#[source] reqwest::Error),

    /// The lane's shared store (Redis) did not answer and the lane fails
    /// closed ([`StoreFailure::Closed`](crate::store::StoreFailure)): the request
    /// was not sent. Answered within the store's timeout, never a hang.
    #[error("lane `{lane}`: the shared store is unavailable")]
    StoreUnavailable {
        /// The lane that refused the request.
        lane: String,
        /// Why the store did not answer.
        #[source]
        source: StoreError,
    },

    /// The request needed a lane of its own, the shaper holds
    /// [`max_lanes`](crate::shaper::ShaperBuilder::max_lanes) already, and
    /// none of them can go: each has someone waiting, a pause, or quota
    /// spent that a new lane would forget. Nothing was sent.
    #[error("lane `{lane}`: {max_lanes} lanes are live, and none is idle to make room")]
    LaneLimit {
        /// The lane the request needed.
        lane: String,
        /// The cap.
        max_lanes: usize,
    },

    /// [`Shaper::shutdown`](crate::Shaper::shutdown) was called before this
    /// request was released.
    #[error("the shaper was shut down")]
    Shutdown,

    /// The request was polled outside a tokio runtime: lanes run their
    /// dispatchers and timers on tokio. Send from within a runtime (e.g.
    /// `#[tokio::main]`).
    #[error("no tokio runtime: send requests from within one")]
    NoRuntime,
}

impl Error {
    /// The vendor's last answer, when the shaper gave up on one: its
    /// status, headers and body, for the error message a vendor put there.
    pub fn answer(&self) -> Option<&Answer> {
        match self {
            Self::PauseTooLong { answer, .. }
            | Self::RetriesExhausted {
                last_answer: answer,
                ..
            } => Some(answer),
            Self::RetryBudgetExhausted { last_answer, .. } => last_answer.as_deref(),
            _ => None,
        }
    }

    /// The lane that ended the request, when a lane did: its key, as
    /// [`Shaper::lane`](crate::Shaper::lane) finds its snapshot.
    pub fn lane(&self) -> Option<&str> {
        match self {
            Self::QueueFull { lane, .. }
            | Self::CostTooHigh { lane, .. }
            | Self::WouldExceedMaxWait { lane, .. }
            | Self::MaxWaitElapsed { lane, .. }
            | Self::PauseTooLong { lane, .. }
            | Self::OutOfCredit { lane, .. }
            | Self::AttemptsSpent { lane, .. }
            | Self::RetryBudgetExhausted { lane, .. }
            | Self::StoreUnavailable { lane, .. }
            | Self::LaneLimit { lane, .. } => Some(lane),
            _ => None,
        }
    }

    /// A stable `snake_case` name for the error's kind: the `reason` label
    /// of `callshaper_refused_total` and the `outcome` of a request's span.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::QueueFull { .. } => "queue_full",
            Self::CostTooHigh { .. } => "cost_too_high",
            Self::WouldExceedMaxWait { .. } => "would_exceed_max_wait",
            Self::MaxWaitElapsed { .. } => "max_wait_elapsed",
            Self::PauseTooLong { .. } => "pause_too_long",
            Self::OutOfCredit { .. } => "out_of_credit",
            Self::RetriesExhausted { .. } => "retries_exhausted",
            Self::AttemptsSpent { .. } => "attempts_spent",
            Self::RetryBudgetExhausted { .. } => "retry_budget_exhausted",
            Self::Transport { .. } => "transport",
            Self::NoQuota { .. } => "no_quota",
            Self::InvalidRequest(_) => "invalid_request",
            Self::StoreUnavailable { .. } => "store_unavailable",
            Self::LaneLimit { .. } => "lane_limit",
            Self::Shutdown => "shutdown",
            Self::NoRuntime => "no_runtime",
        }
    }
}

/// A vendor's answer the shaper gave up on (see [`Error::answer`]): what
/// the response said, kept after the response itself is gone.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Answer {
    /// Its status.
    pub status: StatusCode,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body: at most the first [`Answer::BODY_LIMIT`] bytes, decoded
    /// as UTF-8 (invalid sequences replaced).
    pub body: String,
}

impl Answer {
    /// The most of a body an answer keeps: enough for any vendor's error
    /// message, and a bound on what a hostile vendor can make us buffer.
    pub const BODY_LIMIT: usize = 64 * 1024;

    /// Read `response`, up to [`BODY_LIMIT`](Self::BODY_LIMIT) of its body.
    /// A body that fails midway keeps what arrived.
    pub(crate) async fn read(mut response: Response) -> Self {
        let status = response.status();
        let headers = std::mem::take(response.headers_mut());
        let mut body = Vec::new();
        while body.len() < Self::BODY_LIMIT {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    let room = Self::BODY_LIMIT - body.len();
                    body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                }
                _ => break,
            }
        }
        Self {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }
}

/// A builder setting that cannot work, named by field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid `{field}`: {problem}")]
pub struct ConfigError {
    /// The setting at fault, e.g. `quota.count`, or in a config file its
    /// path, e.g. `vendors.openai.quotas[1].per`.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

impl ConfigError {
    pub(crate) fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// A problem serde found at `path`. A value checked as it was read
    /// (a [`Quota`](crate::Quota)) reports its own field, which goes under
    /// the path: `vendors.llm.quotas[0]` and "invalid `capacity`: ..."
    /// make `vendors.llm.quotas[0].capacity`.
    #[cfg(feature = "config")]
    pub(crate) fn at(path: &str, message: &str) -> Self {
        let nested = message
            .strip_prefix("invalid `")
            .and_then(|rest| rest.split_once("`: "));
        match nested {
            Some((field, problem)) => Self::new(field, problem).within(path),
            None => Self::new(path, message),
        }
    }

    /// The same problem, with the field's path under `prefix`.
    pub(crate) fn within(self, prefix: &str) -> Self {
        Self {
            field: format!("{prefix}.{}", self.field),
            ..self
        }
    }
}

/// Why the shared store did not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No answer within the store's timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The store answered with an error, or the connection failed.
    #[error("{0}")]
    Failed(String),
    /// TLS with the store failed: a certificate its CA roots do not trust,
    /// a name the certificate does not match, a client certificate the
    /// server refused, or a `rediss://` URL without the `redis-tls` feature.
    #[error("TLS with Redis failed: {0}")]
    Tls(String),
    /// Redis refused the store's credentials: a wrong password or user
    /// (`WRONGPASS`), or none where one is needed (`NOAUTH`).
    #[error("Redis refused the store's credentials: {0}")]
    Auth(String),
    /// The store's user may not run a command the fleet needs: its Redis
    /// ACL lacks the command, the key pattern or the pause channel. The
    /// README's "Running a fleet" has the rule that grants what is needed.
    #[error("the Redis user may not run `{command}`: {message}")]
    NotPermitted {
        /// The command refused, as Redis names it (`hset`, `subscribe`).
        command: String,
        /// What Redis said.
        message: String,
    },
}
