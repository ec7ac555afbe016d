//! What a response means for the lane: the one place that decides.
//!
//! Every answer is one of three things ([`Verdict`]): **final** (hand it to
//! the caller), a **throttle** (the vendor says the lane is too fast), or a
//! **failure** of this one request (it may be tried again; see
//! [`retry`](crate::retry)). A throttle, and a final answer whose headers
//! say the quota is spent, pause the lane's gates, and with them every lane
//! under the same vendor (and, on a shared store, the fleet). This module
//! says for how long and why ([`Pause`], [`PauseCause`]); the request's loop
//! (`shaper/call.rs`) applies it.
//!
//! Which statuses are which is the vendor's [`Answers`] (the defaults
//! below; a shaper or a route can say its own).
//!
//! - **Throttles:** 429, 503 and 529, and a 403 that carries `Retry-After` or a
//!   used-up request limit (as GitHub sends). The pause is the vendor's
//!   hint plus the headroom (the vendor's clock and ours are not the same
//!   clock), else the vendor gate's fallback, which grows with each
//!   consecutive throttle. A refusal the ledger reads as the lane's
//!   spacing waits for the gap instead, the first time since a success,
//!   when the hint is within the gap give or take its precision (a GCRA
//!   rounds 10 ms up to `Retry-After: 1`).
//! - **Spent quota:** a final answer saying nothing is left until a reset
//!   pauses the lane until then, before the vendor has to say 429 — unless
//!   the lane's own releases explain it. A vendor's signal is news only
//!   where it disagrees with what the lane knows: at full quota every
//!   window ends with "0 left", and the meters already hold the next
//!   request until the vendor's window lets it in; pausing for the
//!   vendor's whole-second reset as well would waste up to a second per
//!   window (57 % of the quota at 10/s against a gateway that sends its
//!   reset on every answer). "0 left" is news when the vendor's limit is
//!   below the lane's declared quota, or when the lane released fewer
//!   requests in the window than the vendor counts (another consumer
//!   spends the same quota). Nor is it news from a vendor whose
//!   "remaining" is its burst room (a GCRA, a bucket a request deep): it
//!   says "0 left" on the first request after a quiet window, where a
//!   window would have the whole quota less one (`VendorModel::burst_room`).
//! - **Failures:** 500, 502, 504, 408 and transport errors.

use std::time::Duration;

use reqwest::StatusCode;
use tokio::time::Instant;

use crate::answers::Answers;
use crate::error::{Answer, Error};
use crate::gate::Booked;
use crate::lane::{Lane, PauseCause};
use crate::meters::Rate;
use crate::signals::Signals;

/// What to do with the outcome of one send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Hand the outcome to the caller.
    Done,
    /// The vendor throttled the lane.
    Throttled,
    /// This request failed; it may be tried again.
    Failed,
}

/// What to do with a response, from its status, what its headers said,
/// and what the vendor's statuses mean.
pub(crate) fn classify(status: StatusCode, signals: &Signals, answers: &Answers) -> Verdict {
    let throttled_403 = status == StatusCode::FORBIDDEN
        && !answers.is_failure(status)
        && (signals.retry_after.is_some() || signals.requests_exhausted());
    if answers.is_throttle(status) || throttled_403 {
        Verdict::Throttled
    } else if answers.is_failure(status) {
        Verdict::Failed
    } else {
        Verdict::Done
    }
}

/// A pause a response asks of the lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pause {
    /// What the vendor asked for (or the fallback chose).
    pub(crate) asked: Duration,
    /// What the lane pauses: `asked`, plus the headroom when the vendor's
    /// clock set it.
    pub(crate) padded: Duration,
    pub(crate) cause: PauseCause,
}

/// A final answer whose headers say nothing is left until a reset, for a
/// request `lane` released at `released`: pause until then, before the
/// vendor has to say 429, unless the lane's own releases explain it (on a
/// shared store, the `fleet`'s, as its store counted them for the slot).
/// Where one unit is left and another consumer spends the rest, the lane
/// leaves that unit to it (see [`contested`]).
fn spent(
    lane: &Lane,
    signals: &Signals,
    released: Instant,
    fleet: Option<&[Option<Booked>]>,
    headroom: Duration,
) -> Option<Pause> {
    let Some(reset) = signals.exhausted_for() else {
        return contested(lane, signals, released, fleet);
    };
    let window_end = signals
        .request_limits()
        .filter(|l| l.remaining == Some(0) && !l.refills)
        .filter_map(|l| Some((l.reset?, l.precision)))
        .max();
    if window_end
        .is_some_and(|(end, precision)| lane.vendor().longer_window(end, precision, released))
    {
        // The vendor's window is longer than declared: the lane's releases
        // in the declared window neither explain nothing left nor say when
        // a unit frees.
        return Some(Pause {
            asked: reset,
            padded: reset.saturating_add(headroom),
            cause: PauseCause::Spent,
        });
    }
    if explained(signals, |limit, used| {
        lane.explains(limit, used, released, fleet)
    }) || (!refills(signals) && lane.burst_room(released, fleet))
    {
        return None;
    }
    // The reset is coarse (whole seconds); the lane's own (the fleet's)
    // oldest release in the window says when a unit frees, and a fixed
    // window the lane saw open says when it closes, if that is sooner.
    let now = Instant::now();
    let by_ledger = signals
        .request_limit()
        .and_then(|limit| lane.frees_at(limit, released, fleet))
        .map(|at| at.saturating_duration_since(now));
    let by_window = signals
        .window_end()
        .and_then(|end| lane.vendor().window_closes(end))
        .map(|at| at.saturating_duration_since(now).saturating_add(headroom));
    let padded = [by_ledger, by_window]
        .into_iter()
        .flatten()
        .fold(reset.saturating_add(headroom), Duration::min);
    Some(Pause {
        asked: reset,
        padded,
        cause: PauseCause::Spent,
    })
}

/// A final answer (`answer`: its status and headers, if the vendor
/// answered) to a request `lane` released at `released`: pause the lane
/// when its headers say the quota is spent or contested (see [`spent`]),
/// citing what they said, and learn from a spent quota as from a refusal.
pub(crate) fn final_answer(
    lane: &Lane,
    signals: &Signals,
    released: Instant,
    fleet: Option<&[Option<Booked>]>,
    answer: Option<(StatusCode, &reqwest::header::HeaderMap)>,
) {
    let headroom = lane.policy().headroom;
    let Some(pause) = spent(lane, signals, released, fleet, headroom) else {
        return;
    };
    let said = answer.and_then(|(_, headers)| crate::signals::cite(headers, signals));
    lane.pause_because(pause.padded, pause.cause, said.as_ref());
    if let (Some((status, _)), PauseCause::Spent) = (answer, pause.cause) {
        refused(lane, status, signals, released);
    }
    if pause.cause == PauseCause::Contested {
        // Every window while another consumer is busy.
        tracing::debug!(
            lane = %lane.name(),
            pause = ?pause.asked,
            said = said.as_deref(),
            "another consumer spends the quota; leaving it the last unit"
        );
    } else {
        tracing::info!(
            lane = %lane.name(),
            reset = ?pause.asked,
            cause = pause.cause.label(),
            said = said.as_deref(),
            "quota used up; pausing until it resets"
        );
    }
}

/// One unit of a request limit is left, and the lane's own releases (the
/// fleet's) do not explain the rest spent: another consumer spends the
/// same quota. Its next request comes, on average, at least as soon as the
/// lane's next (it spends less than the limit, the lane keeps to all of
/// it), so the last unit is a coin toss, and losing it costs a 429 and the
/// vendor's whole reset. The lane leaves the unit to the other and waits
/// only until its own oldest release frees one: a unit later, never a
/// reset. Nothing to wait for (the unit already freed, or the lane does
/// not know when it will): no pause.
fn contested(
    lane: &Lane,
    signals: &Signals,
    released: Instant,
    fleet: Option<&[Option<Booked>]>,
) -> Option<Pause> {
    let limit = signals
        .request_limits()
        .filter(|l| l.remaining == Some(1) && l.reset.is_some())
        .find_map(|l| l.limit)?;
    if lane.explains(limit, limit.saturating_sub(1), released, fleet)
        || (!refills(signals) && lane.burst_room(released, fleet))
    {
        return None;
    }
    let wait = lane
        .frees_at(limit, released, fleet)?
        .saturating_duration_since(Instant::now());
    (!wait.is_zero()).then_some(Pause {
        asked: wait,
        padded: wait,
        cause: PauseCause::Contested,
    })
}

/// The vendor refused a request the lane released at `released`: a 429
/// (or GitHub's throttling 403), or a final answer with nothing left that
/// the lane's releases don't explain. The lane learns the quota the vendor
/// really allows (see `VendorModel::refused`), so one refusal, not one per
/// window, tells a lane declared too fast.
pub(crate) fn refused(lane: &Lane, status: StatusCode, signals: &Signals, released: Instant) {
    if lane.policy().answers.is_overload(status) {
        return;
    }
    if status.is_success() && signals.request_limit().is_none() {
        // "Nothing left" without a limit: somebody else may have spent it;
        // the pause answers it, and only a refusal teaches.
        return;
    }
    // A reset with its precision: `VendorModel::refused` reads a bucket's as its
    // whole window, a window's end from where the window opened.
    let reset = signals
        .request_limits()
        .filter_map(|l| Some((l.reset?, l.precision)))
        .max();
    let limit = signals.request_limit();
    let bucket = signals.bucket().and_then(|l| l.limit);
    if let Some(learned) = lane.refused(limit, reset, released, bucket) {
        slowed(
            lane,
            learned,
            "the vendor refused the lane below its declared quota",
        );
    }
}

/// A throttle answered `status` (with `headers`, read as `signals`) to
/// the request the lane released at `released`: the pause it asks, applied
/// to the lane, and what the lane learns from it. A refusal the lane's
/// ledger shows was its spacing (see [`spacing`]) teaches a gap and pauses
/// until that gap after the refused send (nothing more is needed against
/// a vendor measuring spacing), or for the vendor's hint if it gave one;
/// any other throttle pauses for its hint or the growing fallback
/// ([`throttled`]) and teaches the quota the vendor really allows
/// ([`refused`]).
pub(crate) fn refusal(
    lane: &Lane,
    status: StatusCode,
    headers: &reqwest::header::HeaderMap,
    signals: &Signals,
    released: Instant,
) -> Pause {
    let headroom = lane.policy().headroom;
    let gap = spacing(lane, status, signals, released);
    let pause = match (gap, signals.pause_hint()) {
        (Some(gap), Some(hint)) => {
            let precision = signals.hint_precision(headers);
            spaced_with_hint(lane, hint, precision, spacing_wait(released, gap), headroom)
        }
        (Some(gap), None) => spaced(spacing_wait(released, gap)),
        (None, _) => throttled(lane, status, signals, headroom),
    };
    let said = crate::signals::cite(headers, signals);
    // A spacing refusal's gap may have passed already.
    if !(pause.cause == PauseCause::Spacing && pause.padded.is_zero()) {
        lane.pause_because(pause.padded, pause.cause, said.as_ref());
    }
    if gap.is_none() {
        refused(lane, status, signals, released);
    }
    tracing::warn!(
        lane = %lane.name(),
        status = status.as_u16(),
        pause = ?pause.asked,
        cause = pause.cause.label(),
        said = said.as_deref(),
        "vendor throttled the lane; pausing it"
    );
    pause
}

/// If the lane's ledger says the request released at `released` was
/// refused for its spacing (see `spacing/learned.rs`), the gap the lane keeps its
/// sends apart from now on (the throttle counted). A refusal that says
/// nothing at all (no limit, no hint: a bare 429, nginx's 503) is read as
/// spacing by a lane not yet strict, and by a strict fleet lane once
/// between successes; a vendor that says when to come back is taken at
/// its word, and an overload teaches nothing.
fn spacing(
    lane: &Lane,
    status: StatusCode,
    signals: &Signals,
    released: Instant,
) -> Option<Duration> {
    if lane.policy().answers.is_overload(status) {
        return None;
    }
    let silent = signals.limits.is_empty() && signals.pause_hint().is_none();
    let status = status.as_u16();
    let gap = silent
        .then(|| lane.fleet_spacing_refused(status))
        .flatten()
        .or_else(|| lane.spacing_refused(signals.request_limit(), silent, released, status))?;
    tracing::warn!(
        lane = %lane.name(),
        status,
        ?gap,
        "the vendor refused a send for its spacing; the lane keeps its sends this far apart"
    );
    Some(gap)
}

/// How long from now until `gap` after the refused release at `released`.
fn spacing_wait(released: Instant, gap: Duration) -> Duration {
    crate::time::later(released, gap).saturating_duration_since(Instant::now())
}

/// A pause of `wait` for the lane's spacing.
fn spaced(wait: Duration) -> Pause {
    Pause {
        asked: wait,
        padded: wait,
        cause: PauseCause::Spacing,
    }
}

/// A refusal the ledger read as spacing (the lane waits `wait` for its
/// gap) that also says when to come back, `hint`, written to `precision`.
/// The vendor rounds its wait up: a GCRA that wants one more interval (10
/// ms at 100/s) says `Retry-After: 1`, so the wait it means is anywhere
/// above `hint - precision`. Taken at its word, every jitter refusal cost a
/// second's pause, 100 sends at 100/s (57 % of a GCRA's quota, where
/// governor's pace met no refusal); the first such refusal since a success
/// waits for the gap alone when `hint - precision` is within it. A hint
/// beyond the gap, or a second refusal before any success, is taken at its
/// word: the vendor meant it.
fn spaced_with_hint(
    lane: &Lane,
    hint: Duration,
    precision: Duration,
    wait: Duration,
    headroom: Duration,
) -> Pause {
    let again = lane.vendor().refused_again();
    if again || hint.saturating_sub(precision) > wait {
        hinted(hint, headroom)
    } else {
        spaced(wait)
    }
}

/// The lane keeps to `learned`, below its declared quota, because `why`.
fn slowed(lane: &Lane, learned: Rate, why: &str) {
    tracing::warn!(
        lane = %lane.name(),
        declared = ?lane.declared(),
        ?learned,
        "{why}; the lane keeps to what the vendor allows"
    );
}

/// Every answer to a request the lane released at `released`: a burst
/// waiting for the vendor's first word goes, and a vendor's bucket (a
/// request limit that [`refills`](crate::signals::Limit::refills)) holds
/// the lane to what it says is left, so a lane declared larger than the
/// vendor's bucket sends no more than the vendor has. A bucket that does
/// not say its rate (no reset: Shopify) teaches it by its levels once it
/// has refused the lane. A fixed window's end, where the vendor writes it
/// as an instant (GitHub), teaches the window's length (`VendorModel::saw_end`).
pub(crate) fn answered(lane: &Lane, verdict: Verdict, signals: &Signals, released: Instant) {
    if let Some(end) = signals.window_end() {
        lane.vendor().saw_end(end, Instant::now());
    }
    let bucket = signals
        .bucket()
        .and_then(|l| Some((l.remaining?, l.limit.filter(|_| l.reset.is_none()))));
    let refused = verdict == Verdict::Throttled;
    if let Some(learned) = lane.answered(bucket, released, refused) {
        slowed(
            lane,
            learned,
            "the vendor's bucket leaks slower than the lane's declared quota",
        );
    }
}

/// A throttle (or 402) whose body says the account is out of credit (see
/// [`Answers`]): pausing and retrying would only repeat it for hours.
/// Stops the vendor's lanes for `max_pause` (every waiting and new request
/// ends at once) and gives the error this request ends with.
pub(crate) fn out_of_credit(lane: &Lane, answer: &Answer) -> Option<Error> {
    let status = answer.status;
    let answers = &lane.policy().answers;
    if !answers.may_be_out_of_credit(status) || !answers.says_out_of_credit(&answer.body) {
        return None;
    }
    tracing::error!(
        lane = %lane.name(),
        status = status.as_u16(),
        "the vendor says the account is out of credit; ending the vendor's requests for max_pause"
    );
    Some(lane.stop(status.as_u16(), answer.body.chars().take(4096).collect()))
}

/// True when every exhausted limit counts requests, says its size, and
/// `explains(limit, used)` (the lane's ledger) accounts for it. A token
/// limit is always news: the lane's cost is an estimate until settled.
fn explained(signals: &Signals, explains: impl Fn(u64, u64) -> bool) -> bool {
    let mut exhausted = signals
        .limits
        .iter()
        .filter(|l| l.remaining == Some(0) && l.reset.is_some())
        .peekable();
    exhausted.peek().is_some()
        && exhausted
            .all(|l| l.counts_requests() && l.limit.is_some_and(|limit| explains(limit, limit)))
}

/// True when a request limit with little or nothing left is a bucket
/// that says it refills: its "0 left" already waits one unit
/// ([`Signals::exhausted_for`]), and its level is what it has, so it needs
/// no reading as burst room.
fn refills(signals: &Signals) -> bool {
    signals
        .bucket()
        .is_some_and(|l| l.remaining.is_some_and(|r| r <= 1))
}

/// A throttle answered `status`: the vendor's hint, else the vendor
/// gate's growing fallback (which also counts the throttle for the lane).
fn throttled(lane: &Lane, status: StatusCode, signals: &Signals, headroom: Duration) -> Pause {
    let hint = signals.pause_hint();
    let cause = match hint {
        Some(_) => PauseCause::Hinted,
        None => PauseCause::Unhinted,
    };
    let asked = lane.throttled(hint, status.as_u16(), cause);
    match hint {
        Some(_) => hinted(asked, headroom),
        None => Pause {
            asked,
            padded: asked,
            cause,
        },
    }
}

/// The vendor said to come back after `hint`: padded by the headroom, as
/// the vendor's clock and ours are not the same clock (a hint of "now"
/// stays now).
fn hinted(hint: Duration, headroom: Duration) -> Pause {
    let padded = if hint.is_zero() {
        hint
    } else {
        hint.saturating_add(headroom)
    };
    Pause {
        asked: hint,
        padded,
        cause: PauseCause::Hinted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::Dimension;

    #[test]
    fn throttles_failures_and_the_rest() {
        let none = Signals::default();
        let answers = Answers::default();
        let verdict = |status| classify(status, &none, &answers);
        assert_eq!(verdict(StatusCode::TOO_MANY_REQUESTS), Verdict::Throttled);
        assert_eq!(verdict(StatusCode::SERVICE_UNAVAILABLE), Verdict::Throttled);
        let overloaded = StatusCode::from_u16(529).unwrap();
        assert_eq!(
            verdict(overloaded),
            Verdict::Throttled,
            "Anthropic's overload"
        );
        assert_eq!(verdict(StatusCode::BAD_GATEWAY), Verdict::Failed);
        assert_eq!(verdict(StatusCode::NOT_IMPLEMENTED), Verdict::Done);
        assert_eq!(verdict(StatusCode::FORBIDDEN), Verdict::Done, "a plain 403");
        let hinted = Signals {
            retry_after: Some(Duration::from_secs(3)),
            ..Signals::default()
        };
        assert_eq!(
            classify(StatusCode::FORBIDDEN, &hinted, &answers),
            Verdict::Throttled
        );
        let mut spent = Signals::default();
        spent
            .limit_mut(crate::signals::Dimension::Requests)
            .remaining = Some(0);
        assert_eq!(
            classify(StatusCode::FORBIDDEN, &spent, &answers),
            Verdict::Throttled
        );
        for tokens in [
            Dimension::Tokens,
            Dimension::InputTokens,
            Dimension::OutputTokens,
        ] {
            let mut spent = Signals::default();
            spent.limit_mut(tokens.clone()).remaining = Some(0);
            assert_eq!(
                classify(StatusCode::FORBIDDEN, &spent, &answers),
                Verdict::Done,
                "a 403 beside spent {tokens} is no throttle"
            );
        }
        // A vendor's own meanings: 420 throttles, 503 fails one request, a
        // 403 it calls a failure is one even with a Retry-After.
        let own = Answers::default()
            .throttle(StatusCode::from_u16(420).unwrap())
            .failure(StatusCode::SERVICE_UNAVAILABLE)
            .failure(StatusCode::FORBIDDEN)
            .final_answer(StatusCode::BAD_GATEWAY);
        let verdict = |status, signals| classify(status, signals, &own);
        assert_eq!(
            verdict(StatusCode::from_u16(420).unwrap(), &none),
            Verdict::Throttled
        );
        assert_eq!(
            verdict(StatusCode::SERVICE_UNAVAILABLE, &none),
            Verdict::Failed
        );
        assert_eq!(verdict(StatusCode::FORBIDDEN, &hinted), Verdict::Failed);
        assert_eq!(verdict(StatusCode::BAD_GATEWAY, &none), Verdict::Done);
    }

    #[tokio::test(start_paused = true)]
    async fn a_spent_quota_pauses_until_its_reset_plus_the_headroom() {
        let ten = crate::Quota::leaky_bucket(10, Duration::from_secs(1));
        let lane = Lane::new("t", [ten], crate::lane::LanePolicy::default()).unwrap();
        let headroom = Duration::from_millis(5);
        let now = Instant::now();
        assert_eq!(spent(&lane, &Signals::default(), now, None, headroom), None);
        let mut signals = Signals::default();
        let requests = signals.limit_mut(Dimension::Requests);
        requests.remaining = Some(0);
        requests.reset = Some(Duration::from_secs(2));
        let pause =
            spent(&lane, &signals, now, None, headroom).expect("nothing left until the reset");
        assert_eq!(pause.asked, Duration::from_secs(2));
        assert_eq!(pause.padded, Duration::from_millis(2005));
        assert_eq!(pause.cause, PauseCause::Spent);
    }

    /// The reconciliation table: what the vendor says is left, against what
    /// the lane's ledger says it released in the vendor's window.
    #[test]
    fn a_spent_window_the_lane_explains_is_no_news() {
        let reset = Some(Duration::from_secs(1));
        let limit = |dimension, limit, remaining| {
            let mut signals = Signals::default();
            let entry = signals.limit_mut(dimension);
            entry.limit = limit;
            entry.remaining = remaining;
            entry.reset = reset;
            signals
        };
        // (vendor's limit, our releases in its window) → explained?
        let ledger = |declared: u64, ours: u64| {
            move |limit: u64, used: u64| limit >= declared && ours >= used
        };
        let cases = [
            (
                "our own ten of ten",
                limit(Dimension::Requests, Some(10), Some(0)),
                ledger(10, 10),
                true,
            ),
            (
                "another consumer spent some",
                limit(Dimension::Requests, Some(10), Some(0)),
                ledger(10, 7),
                false,
            ),
            (
                "the vendor allows less than declared",
                limit(Dimension::Requests, Some(3), Some(0)),
                ledger(10, 10),
                false,
            ),
            (
                "an IETF policy of requests",
                limit(Dimension::Policy("p".into()), Some(10), Some(0)),
                ledger(10, 10),
                true,
            ),
            (
                "no limit given",
                limit(Dimension::Requests, None, Some(0)),
                ledger(10, 10),
                false,
            ),
            (
                "tokens are news",
                limit(Dimension::Tokens, Some(10), Some(0)),
                ledger(0, u64::MAX),
                false,
            ),
            (
                "something left",
                limit(Dimension::Requests, Some(10), Some(1)),
                ledger(10, 10),
                false,
            ),
        ];
        for (case, signals, explains, expected) in cases {
            assert_eq!(explained(&signals, explains), expected, "{case}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hinted_throttle_is_padded_and_an_unhinted_one_falls_back() {
        let ten = crate::Quota::leaky_bucket(10, Duration::from_secs(1));
        let lane = Lane::new("t", [ten], crate::lane::LanePolicy::default()).unwrap();
        let headroom = Duration::from_millis(5);
        let hinted = Signals {
            retry_after: Some(Duration::from_secs(3)),
            ..Signals::default()
        };
        let pause = throttled(&lane, StatusCode::TOO_MANY_REQUESTS, &hinted, headroom);
        assert_eq!(pause.asked, Duration::from_secs(3));
        assert_eq!(pause.padded, Duration::from_millis(3005));
        assert_eq!(pause.cause, PauseCause::Hinted);
        let pause = throttled(
            &lane,
            StatusCode::TOO_MANY_REQUESTS,
            &Signals::default(),
            headroom,
        );
        assert_eq!(pause.cause, PauseCause::Unhinted);
        assert_eq!(
            pause.asked, pause.padded,
            "the fallback is ours: no padding"
        );
        assert!(
            pause.asked >= Duration::from_secs(1),
            "the second throttle in a row"
        );
    }
}
