//! The vendor model's tests: the vendor's numbers read against the
//! vendor gate's releases.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::ledger::{Spending, explains, frees_at};
use super::model::{VendorModel, VendorSettings};
use crate::gate::{Booked, Gate, GateLevel, GateSettings, Listed};
use crate::meters::Quota;
use crate::retry::{Backoff, RetryBudget};

/// The model of a vendor gate holding `quotas`, without headroom.
fn model(quotas: &[Quota]) -> VendorModel {
    model_with(quotas, Duration::ZERO)
}

/// The model of a vendor gate holding `quotas`, with `headroom`.
fn model_with(quotas: &[Quota], headroom: Duration) -> VendorModel {
    let settings = GateSettings {
        headroom,
        max_pause: Duration::from_secs(120),
        hears: true,
    };
    let level = Arc::new(GateLevel::new("", Arc::from(quotas), settings));
    let gate = Arc::new(Gate::new(Listed::nowhere(level), 1));
    let settings = VendorSettings {
        fallback: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
        adaptive: None,
        budget: RetryBudget::default(),
    };
    VendorModel::new(gate, settings, None)
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
        let vendor = model(quotas);
        let gate = vendor.gate();
        let t0 = Instant::now();
        for _ in 0..limit {
            gate.meters().commit(1, t0);
        }
        assert_eq!(
            vendor.explains(limit, limit, t0, Spending::Own),
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
    let vendor = model(&quotas);
    let gate = vendor.gate();
    let t0 = Instant::now();
    gate.meters().commit(1, t0);
    let t1 = t0 + Duration::from_millis(100);
    gate.meters().commit(1, t1);
    assert_eq!(
        vendor.burst_room(t1, Spending::Own),
        None,
        "one in its window"
    );
    assert_eq!(vendor.burst_room(t0, Spending::Own), Some(true), "shown");
    assert_eq!(vendor.burst_room(t1, Spending::Own), Some(false), "known");
    vendor.refused(Some(10), None, t1, None);
    assert_eq!(vendor.burst_room(t1, Spending::Own), None, "unlearned");
    let fleet = |count| {
        Spending::Fleet(Booked {
            count,
            leaves: None,
        })
    };
    assert_eq!(vendor.burst_room(t1, fleet(2)), None);
    assert_eq!(vendor.burst_room(t1, Spending::Unknown), None);
    assert_eq!(vendor.burst_room(t1, fleet(1)), Some(true));
}

/// A stated limit counts requests only if the vendor accepted no more of
/// the lane's releases in the window before the one it answered (less
/// those refused for their spacing), and never when it is one: a GCRA
/// states its burst plus one.
#[tokio::test(start_paused = true)]
async fn a_limit_below_what_the_vendor_accepted_is_no_count() {
    let second = Duration::from_secs(1);
    let quotas = [Quota::leaky_bucket(10, second)];
    let vendor = model(&quotas);
    let gate = vendor.gate();
    let t0 = Instant::now();
    for i in 0..5 {
        gate.meters().commit(1, t0 + Duration::from_millis(100 * i));
    }
    let answered = t0 + Duration::from_millis(500);
    gate.meters().commit(1, answered);
    assert_eq!(vendor.counted_limit(Some(5), answered), Some(5));
    assert_eq!(vendor.counted_limit(Some(4), answered), None, "5 accepted");
    assert_eq!(vendor.counted_limit(Some(1), t0), None, "one at a time");
    assert_eq!(vendor.counted_limit(None, answered), None);
    assert_eq!(
        vendor.counted_limit(Some(u64::MAX), answered),
        Some(u64::MAX)
    );
    // A year later nothing of the lane's is in the vendor's window.
    let later = answered + 365 * 86_400 * second;
    gate.meters().commit(1, later);
    assert_eq!(vendor.counted_limit(Some(2), later), Some(2));
}

/// A strict gate refused without a word reads the first such refusal
/// since a success as jitter (its gap), and a second before any success
/// as a count: the fallback's, from its first step (1 s, half of it
/// jitter), as if the jitter's reading had not been; a gate that is not
/// strict never does.
/// Against a real nginx at 10r/s, a fleet of three strict instances with
/// the default 5 ms headroom met 1-2 refusals and used 91.9-95.9 % in
/// three runs, 2-8 and 46.5-83.7 % without this reading (on a loaded
/// machine, 5 refusals and 64 % with it: the wire's jitter then brings
/// refusals in a row).
#[tokio::test(start_paused = true)]
async fn a_strict_gates_lone_bare_refusal_is_jitter() {
    let second = Duration::from_secs(1);
    let strict = [Quota::leaky_bucket(10, second).strict()];
    let vendor = model(&strict);
    let gap = Some(Duration::from_millis(100));
    assert_eq!(vendor.fleet_spacing_refused(), gap);
    assert_eq!(
        vendor.fleet_spacing_refused(),
        None,
        "again before a success"
    );
    let fallback = vendor.throttled(None);
    assert!(
        fallback <= second,
        "the fallback's first step: {fallback:?}"
    );
    vendor.succeeded();
    assert_eq!(vendor.fleet_spacing_refused(), gap);
    let counting = [Quota::leaky_bucket(10, second)];
    let vendor = model(&counting);
    assert_eq!(vendor.fleet_spacing_refused(), None);
}

/// On a shared store the fleet's count, as the store booked the slot,
/// stands for the lane's own releases, at any level's gate; where the store did not say, a
/// limit the gate keeps within is the fleet's own spending.
#[tokio::test(start_paused = true)]
async fn a_fleets_count_is_read_as_a_lanes_own_releases() {
    let second = Duration::from_secs(1);
    let quotas = [Quota::sliding_log(10, second)];
    let gate = model(&quotas).gate().clone();
    let t0 = Instant::now();
    let leaves = t0 + Duration::from_millis(400);
    let full = Booked {
        count: 10,
        leaves: Some(leaves),
    };
    let short = Booked { count: 7, ..full };
    assert!(explains(&gate, None, 10, 10, t0, Spending::Fleet(full)));
    assert!(!explains(&gate, None, 10, 10, t0, Spending::Fleet(short)));
    assert!(explains(&gate, None, 10, 10, t0, Spending::Unknown));
    assert!(
        !explains(&gate, None, 3, 3, t0, Spending::Unknown),
        "a lower limit"
    );
    assert_eq!(
        frees_at(&gate, None, 10, t0, Spending::Fleet(short)),
        Some(leaves),
        "when the fleet's oldest leaves"
    );
    assert_eq!(frees_at(&gate, None, 10, t0, Spending::Unknown), None);
}

/// A window's end written to the second, read from where the window
/// opened: a lane declared 10 a second that sent three at 0, 100 and
/// 200 ms hears "none left" with the end 1.8 s on, rounded up to the
/// second. Rounded up by 3 ms, under the default 5 ms headroom, the
/// window spans 2.003 s: twice the declared one, the vendor's 3 per 2 s,
/// which no pace should be learned from (the pause until its end is the
/// answer); it was read as 3 per second, and the lane paced into a 429 in
/// the next window. A window that ends 0.803 s on spans 1.003 s: the
/// declared one, whose count is learned.
#[tokio::test(start_paused = true)]
async fn a_window_twice_the_declared_one_teaches_no_pace_however_its_end_rounds() {
    let second = Duration::from_secs(1);
    let precision = second;
    for (reset, learned) in [
        (Duration::from_millis(1_803), None),
        (Duration::from_millis(2_799), None),
        (Duration::from_millis(803), Some(3)),
    ] {
        let vendor = model_with(&[Quota::leaky_bucket(10, second)], Duration::from_millis(5));
        let t0 = Instant::now();
        for at in [0, 100, 200] {
            vendor
                .gate()
                .meters()
                .commit(1, t0 + Duration::from_millis(at));
        }
        tokio::time::advance(Duration::from_millis(200)).await;
        let released = t0 + Duration::from_millis(200);
        let rate = vendor.refused(Some(3), Some((reset, precision)), released, None);
        assert_eq!(rate.map(|rate| rate.count), learned, "the end {reset:?} on");
    }
}
