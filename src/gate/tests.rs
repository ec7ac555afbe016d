//! The gate's own tests: its queue, and the vendor's numbers read
//! against its releases.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::window::WindowEnds;
use super::*;
use crate::meters::Quota;
use crate::retry::{Backoff, RetryBudget};

fn settings(headroom: Duration) -> GateSettings {
    GateSettings {
        headroom,
        max_pause: Duration::from_secs(120),
        fallback: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
        adaptive: None,
        budget: RetryBudget::default(),
    }
}

#[tokio::test(start_paused = true)]
async fn the_lane_that_waited_longest_is_first_and_its_going_wakes_the_rest() {
    let quotas = [Quota::leaky_bucket(10, Duration::from_secs(1))];
    let gate = Gate::new("", &quotas, settings(Duration::from_millis(5)), None, 1);
    let t0 = Instant::now();
    let (older, newer) = ((t0, 7), (t0 + Duration::from_millis(5), 3));
    assert!(!gate.has_queue());
    gate.enlist(newer);
    gate.enlist(older);
    gate.enlist(older);
    assert!(gate.is_first(older) && !gate.is_first(newer));
    let woken = gate.next_turn();
    gate.delist(older);
    assert!(gate.is_first(newer));
    tokio::time::timeout(Duration::from_millis(1), woken)
        .await
        .expect("the next lane is woken");
    gate.delist(newer);
    assert!(!gate.has_queue());
}

/// A vendor's limit is read against the declared quota: as a count in
/// its window, or as a declared bucket's capacity, which a bucket
/// vendor says as its limit (5 for a burst of 5 at 10/s).
#[tokio::test(start_paused = true)]
async fn a_limit_the_size_of_the_declared_bucket_is_its_capacity() {
    let second = Duration::from_secs(1);
    let bucket = [Quota::token_bucket(5, 10, second)];
    let window = [Quota::sliding_log(10, second)];
    for (quotas, limit, explained) in [
        (&bucket, 5, true),
        (&bucket, 4, false),
        (&bucket, 10, true),
        (&window, 5, false),
        (&window, 10, true),
    ] {
        let gate = Gate::new("", quotas, settings(Duration::ZERO), None, 1);
        let t0 = Instant::now();
        for _ in 0..limit {
            gate.meters().commit(1, t0);
        }
        assert_eq!(
            gate.explains(limit, limit, t0, Spending::Own),
            explained,
            "{quotas:?}, {limit} spent"
        );
    }
}

/// "0 left" on the first release after a quiet window is burst room,
/// learned once; on a release with another in its window it is not
/// shown; a refusal unlearns it; a fleet shows it by booking one slot.
#[tokio::test(start_paused = true)]
async fn nothing_left_after_a_quiet_window_is_burst_room() {
    let second = Duration::from_secs(1);
    let quotas = [Quota::leaky_bucket(10, second)];
    let gate = Gate::new("", &quotas, settings(Duration::ZERO), None, 1);
    let t0 = Instant::now();
    gate.meters().commit(1, t0);
    let t1 = t0 + Duration::from_millis(100);
    gate.meters().commit(1, t1);
    assert_eq!(
        gate.burst_room(t1, Spending::Own),
        None,
        "one in its window"
    );
    assert_eq!(gate.burst_room(t0, Spending::Own), Some(true), "shown");
    assert_eq!(gate.burst_room(t1, Spending::Own), Some(false), "known");
    gate.refused(Some(10), None, t1, None);
    assert_eq!(gate.burst_room(t1, Spending::Own), None, "unlearned");
    let fleet = |count| {
        Spending::Fleet(Booked {
            count,
            leaves: None,
        })
    };
    assert_eq!(gate.burst_room(t1, fleet(2)), None);
    assert_eq!(gate.burst_room(t1, Spending::Unknown), None);
    assert_eq!(gate.burst_room(t1, fleet(1)), Some(true));
}

/// A stated limit counts requests only if the vendor accepted no more of
/// the lane's releases in the window before the one it answered (less
/// those refused for their spacing), and never when it is one: a GCRA
/// states its burst plus one.
#[tokio::test(start_paused = true)]
async fn a_limit_below_what_the_vendor_accepted_is_no_count() {
    let second = Duration::from_secs(1);
    let quotas = [Quota::leaky_bucket(10, second)];
    let gate = Gate::new("", &quotas, settings(Duration::ZERO), None, 1);
    let t0 = Instant::now();
    for i in 0..5 {
        gate.meters().commit(1, t0 + Duration::from_millis(100 * i));
    }
    let answered = t0 + Duration::from_millis(500);
    gate.meters().commit(1, answered);
    assert_eq!(gate.counted_limit(Some(5), answered), Some(5));
    assert_eq!(gate.counted_limit(Some(4), answered), None, "5 accepted");
    assert_eq!(gate.counted_limit(Some(1), t0), None, "one at a time");
    assert_eq!(gate.counted_limit(None, answered), None);
    assert_eq!(gate.counted_limit(Some(u64::MAX), answered), Some(u64::MAX));
    // A year later nothing of the lane's is in the vendor's window.
    let later = answered + 365 * 86_400 * second;
    gate.meters().commit(1, later);
    assert_eq!(gate.counted_limit(Some(2), later), Some(2));
}

/// A strict gate refused without a word reads the first such refusal
/// since a success as jitter (its gap), and a second before any success
/// as a count (the fallback's); a gate that is not strict never does.
/// Against a real nginx at 10r/s, a fleet of three strict instances with
/// the default 5 ms headroom met 1-2 refusals and used 91.9-95.9 % in
/// three runs, 2-8 and 46.5-83.7 % without this reading (on a loaded
/// machine, 5 refusals and 64 % with it: the wire's jitter then brings
/// refusals in a row).
#[tokio::test(start_paused = true)]
async fn a_strict_gates_lone_bare_refusal_is_jitter() {
    let second = Duration::from_secs(1);
    let strict = [Quota::leaky_bucket(10, second).strict()];
    let gate = Gate::new("", &strict, settings(Duration::ZERO), None, 1);
    let gap = Some(Duration::from_millis(100));
    assert_eq!(gate.fleet_spacing_refused(), gap);
    assert_eq!(gate.fleet_spacing_refused(), None, "again before a success");
    gate.succeeded();
    assert_eq!(gate.fleet_spacing_refused(), gap);
    let counting = [Quota::leaky_bucket(10, second)];
    let gate = Gate::new("", &counting, settings(Duration::ZERO), None, 1);
    assert_eq!(gate.fleet_spacing_refused(), None);
}

/// On a shared store the fleet's count, as the store booked the slot,
/// stands for the lane's own releases; where the store did not say, a
/// limit the gate keeps within is the fleet's own spending.
#[tokio::test(start_paused = true)]
async fn a_fleets_count_is_read_as_a_lanes_own_releases() {
    let second = Duration::from_secs(1);
    let quotas = [Quota::sliding_log(10, second)];
    let gate = Gate::new("", &quotas, settings(Duration::ZERO), None, 1);
    let t0 = Instant::now();
    let leaves = t0 + Duration::from_millis(400);
    let full = Booked {
        count: 10,
        leaves: Some(leaves),
    };
    let short = Booked { count: 7, ..full };
    assert!(gate.explains(10, 10, t0, Spending::Fleet(full)));
    assert!(!gate.explains(10, 10, t0, Spending::Fleet(short)));
    assert!(gate.explains(10, 10, t0, Spending::Unknown));
    assert!(!gate.explains(3, 3, t0, Spending::Unknown), "a lower limit");
    assert_eq!(
        gate.frees_at(10, t0, Spending::Fleet(short)),
        Some(leaves),
        "when the fleet's oldest leaves"
    );
    assert_eq!(gate.frees_at(10, t0, Spending::Unknown), None);
}

/// What a vendor's bucket has left: its latest word (not one about an
/// earlier request), plus what the gate's pace refilled since.
#[tokio::test(start_paused = true)]
async fn what_the_vendor_said_is_left_refills_at_the_gates_pace() {
    let quotas = [Quota::token_bucket(10, 10, Duration::from_secs(1))];
    let gate = Gate::new("", &quotas, settings(Duration::ZERO), None, 1);
    let t0 = Instant::now();
    assert_eq!(gate.left(t0), None);
    gate.said_left(3, t0);
    gate.said_left(7, t0 - Duration::from_millis(1));
    assert_eq!(gate.left(t0), Some((3, t0)), "an older word loses");
    let later = t0 + Duration::from_millis(250);
    assert_eq!(gate.left(later), Some((5, t0)), "2.5 refilled at 10/s");
    let quiet = t0 + Duration::from_secs(3_600);
    assert_eq!(gate.left(quiet), Some((36_003, t0)));
}

/// A fixed window's end read again says nothing; the next end gives
/// the step, and the window it ends closes a step after it was first
/// heard. An end that goes back (an answer that overtook another)
/// places no window until the next step.
#[test]
fn the_step_between_window_ends_is_the_window() {
    let second = Duration::from_secs(1);
    let end = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let t0 = Instant::now();
    let mut ends = WindowEnds::default();
    ends.saw(end, t0);
    ends.saw(end, t0 + second / 2);
    assert_eq!((ends.step, ends.closes(end)), (None, None));
    ends.saw(end + second, t0 + second);
    ends.saw(end + second, t0 + second * 3 / 2);
    assert_eq!(ends.step, Some(second));
    assert_eq!(ends.closes(end + second), Some(t0 + 2 * second));
    assert_eq!(ends.closes(end), None, "not the window heard last");
    ends.saw(end, t0 + second * 3 / 2);
    assert_eq!(ends.closes(end), None, "an end that went back");
    ends.saw(end + 4 * second, t0 + 4 * second);
    assert_eq!(ends.step, Some(4 * second), "an idle window in between");
    assert_eq!(ends.closes(end + 4 * second), Some(t0 + 8 * second));
}
