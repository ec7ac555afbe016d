//! A send that did not end its request: go again, after how long, or
//! end with which outcome ([`Next`]). A throttle goes again after the
//! lane's pause; a failure after a backoff while its attempts, the
//! vendor's retry budget and its body last.

use std::time::Duration;

use reqwest::{Request, Response};
use tokio::time::Instant;

use crate::error::{Answer, Error};
use crate::lane::Lane;
use crate::retry::RetryPolicy;
use crate::signals::Signals;
use crate::throttle;

/// How a request ended without a response: the shaper's reason, or the
/// transport's error after its last attempt.
pub(crate) enum Failure<E> {
    Shaper(Error),
    Send { attempts: u32, source: E },
}

impl<E> From<Error> for Failure<E> {
    fn from(error: Error) -> Self {
        Self::Shaper(error)
    }
}

/// What the retry rules need to know about a transport error (shown on
/// the attempt's span).
pub(crate) trait SendFailure: std::fmt::Display {
    /// No connection was made: the vendor never saw the request.
    fn is_connect(&self) -> bool;
    /// Worth another try for an idempotent request (timeouts, resets).
    fn is_transient(&self) -> bool;
}

impl SendFailure for reqwest::Error {
    fn is_connect(&self) -> bool {
        reqwest::Error::is_connect(self)
    }

    fn is_transient(&self) -> bool {
        self.is_timeout() || self.is_request()
    }
}

/// Where a request stands after a failed send, for its retry.
#[derive(Debug, Clone, Copy)]
pub(super) struct Retry {
    /// Failed sends so far, this one included.
    pub(super) failures: u32,
    /// Sends so far.
    pub(super) attempts: u32,
    /// The request may be sent again after an answer that failed it.
    pub(super) may_retry_failure: bool,
}

/// What a request does after a send that did not end it.
pub(super) enum Next<E> {
    /// Go again as this request, after this wait in its lane.
    Again(Box<Request>, Duration),
    /// End with this outcome.
    End(Result<Response, Failure<E>>),
}

/// The vendor throttled the request: the lane pauses (see
/// [`throttle::refusal`]), and the request goes again after the pause as
/// `spare`, unless the pause is longer than `max_pause`, the account is
/// out of credit, the throttles are spent, or its body could not be kept.
pub(super) async fn throttled<E>(
    lane: &Lane,
    policy: &RetryPolicy,
    response: Response,
    charged_at: Instant,
    spare: Option<Box<Request>>,
    (attempts, throttles): (u32, u32),
) -> Next<E> {
    // Copied out: the response goes on to the caller or is dropped.
    let signals = Signals::of(&response).into_owned();
    let pause = throttle::refusal(
        lane,
        response.status(),
        response.headers(),
        &signals,
        charged_at,
    );
    let max_pause = lane.policy().max_pause;
    if pause.asked > max_pause {
        return Next::End(Err(Error::PauseTooLong {
            lane: lane.key(),
            requested: pause.asked,
            max_pause,
            answer: Box::new(Answer::read(response).await),
        }
        .into()));
    }
    let Some(next) = spare else {
        return Next::End(Ok(response));
    };
    let status = response.status();
    let give_up = throttles >= policy.max_throttles;
    // Going again: the answer's body is ours to read.
    if give_up || lane.policy().answers.may_be_out_of_credit(status) {
        let answer = Answer::read(response).await;
        if let Some(error) = throttle::out_of_credit(lane, &answer) {
            return Next::End(Err(error.into()));
        }
        if give_up {
            return Next::End(Err(Error::RetriesExhausted {
                attempts,
                last_status: status,
                last_answer: Box::new(answer),
            }
            .into()));
        }
    }
    // The lane's pause is the wait.
    Next::Again(next, Duration::ZERO)
}

/// The send failed (a failing status, a transport error): the request goes
/// again after a backoff while it may be retried (see [`retry`]), its
/// attempts and the lane's retry budget last, and its body could be kept;
/// else it ends with the failure.
pub(super) async fn failed<E: SendFailure>(
    lane: &Lane,
    policy: &RetryPolicy,
    outcome: Result<Response, E>,
    spare: Option<Box<Request>>,
    retry: Retry,
) -> Next<E> {
    let Retry {
        failures,
        attempts,
        may_retry_failure,
    } = retry;
    let retryable = match &outcome {
        Ok(_) => may_retry_failure,
        Err(error) => error.is_connect() || (may_retry_failure && error.is_transient()),
    };
    let next = match spare {
        Some(next) if retryable => next,
        _ => return Next::End(outcome.map_err(|source| Failure::Send { attempts, source })),
    };
    if failures >= policy.max_attempts {
        return Next::End(match outcome {
            Ok(response) => Err(Error::RetriesExhausted {
                attempts,
                last_status: response.status(),
                last_answer: Box::new(Answer::read(response).await),
            }
            .into()),
            Err(source) => Err(Failure::Send { attempts, source }),
        });
    }
    if !lane.vendor().withdraw_retry() {
        let last_answer = match outcome {
            Ok(response) => Some(Box::new(Answer::read(response).await)),
            Err(_) => None,
        };
        return Next::End(Err(Error::RetryBudgetExhausted {
            lane: lane.key(),
            attempts,
            last_status: last_answer.as_ref().map(|answer| answer.status),
            last_answer,
        }
        .into()));
    }
    lane.retried();
    // No wait of the shaper's is longer than `max_pause`.
    let backoff = policy
        .backoff
        .full_jitter(failures - 1)
        .min(lane.policy().max_pause);
    tracing::debug!(
        lane = %lane.name(),
        attempts,
        ?backoff,
        "retrying a failed request"
    );
    Next::Again(next, backoff)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use reqwest::StatusCode;

    use super::*;
    use crate::lane::LanePolicy;
    use crate::meters::Quota;

    fn lane(max_pause: Duration) -> Lane {
        let policy = LanePolicy {
            max_pause,
            ..LanePolicy::default()
        };
        Lane::new(
            "call",
            [Quota::leaky_bucket(10, Duration::from_secs(1))],
            policy,
        )
        .unwrap()
    }

    fn answer(status: u16, headers: &[(&str, &str)]) -> Response {
        let mut builder = http::Response::builder().status(status);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        Response::from(builder.body("body").unwrap())
    }

    fn request() -> Box<Request> {
        Box::new(Request::new(
            reqwest::Method::GET,
            "http://vendor.test/".parse().unwrap(),
        ))
    }

    fn retry(failures: u32, may_retry_failure: bool) -> Retry {
        Retry {
            failures,
            attempts: failures,
            may_retry_failure,
        }
    }

    /// A failing answer goes again after a backoff while attempts last;
    /// then it ends with the last answer; a request that may not be sent
    /// again (not idempotent) gets the failing answer itself.
    #[tokio::test(start_paused = true)]
    async fn a_failed_send_goes_again_until_its_attempts_are_spent() {
        let lane = lane(Duration::from_secs(60));
        let policy = RetryPolicy::default();
        let failed = |failures, may| {
            failed::<reqwest::Error>(
                &lane,
                &policy,
                Ok(answer(500, &[])),
                Some(request()),
                retry(failures, may),
            )
        };
        match failed(1, true).await {
            Next::Again(_, backoff) => assert!(backoff <= Duration::from_secs(10)),
            Next::End(_) => panic!("a first failure goes again"),
        }
        match failed(policy.max_attempts, true).await {
            Next::End(Err(Failure::Shaper(Error::RetriesExhausted {
                attempts,
                last_status,
                ..
            }))) => {
                assert_eq!(
                    (attempts, last_status),
                    (3, StatusCode::INTERNAL_SERVER_ERROR)
                );
            }
            _ => panic!("the last attempt ends with the last answer"),
        }
        match failed(1, false).await {
            Next::End(Ok(response)) => assert_eq!(response.status(), 500),
            _ => panic!("a request that may not go again gets its answer"),
        }
    }

    /// A throttle pauses the lane and goes again after the pause; a hint
    /// past `max_pause` ends the request with the vendor's answer, and so
    /// does a body that could not be kept for another send.
    #[tokio::test(start_paused = true)]
    async fn a_throttle_goes_again_after_the_pause_it_asks() {
        let lane = lane(Duration::from_secs(60));
        let throttle = |headers: &'static [(&'static str, &'static str)], spare: bool| {
            let lane = lane.clone();
            async move {
                let mut answer = answer(429, headers);
                // As the shaper hears it: its signals in its extensions.
                let signals = Signals::parse(answer.headers(), std::time::SystemTime::now());
                answer.extensions_mut().insert(signals);
                let spare = spare.then(request);
                let policy = RetryPolicy::default();
                throttled::<reqwest::Error>(&lane, &policy, answer, Instant::now(), spare, (1, 1))
                    .await
            }
        };
        match throttle(&[("retry-after", "2")], true).await {
            Next::Again(_, wait) => {
                assert_eq!(wait, Duration::ZERO, "the lane's pause is the wait")
            }
            Next::End(_) => panic!("a throttle goes again"),
        }
        assert!(
            lane.snapshot()
                .paused_for
                .is_some_and(|p| p >= Duration::from_secs(2))
        );
        match throttle(&[("retry-after", "3600")], true).await {
            Next::End(Err(Failure::Shaper(Error::PauseTooLong { requested, .. }))) => {
                assert_eq!(requested, Duration::from_secs(3600));
            }
            _ => panic!("a pause past max_pause ends the request"),
        }
        match throttle(&[], false).await {
            Next::End(Ok(response)) => assert_eq!(response.status(), 429),
            _ => panic!("a body that cannot be sent again ends with the answer"),
        }
    }
}
