//! The gate's own tests: its queue of waiting lanes, its rest, its size.

use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::meters::Quota;

pub(super) fn settings(headroom: Duration) -> GateSettings {
    GateSettings {
        headroom,
        max_pause: Duration::from_secs(120),
        hears: true,
    }
}

#[tokio::test(start_paused = true)]
async fn the_lane_that_waited_longest_is_first_and_its_going_wakes_the_rest() {
    let quotas = [Quota::leaky_bucket(10, Duration::from_secs(1))];
    let quotas = std::sync::Arc::from(quotas);
    let level = GateLevel::new("", quotas, settings(Duration::from_millis(5)));
    let gate = Gate::new(Listed::nowhere(std::sync::Arc::new(level)), 1);
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

/// The model of a vendor whose one quota is `quota`: what a resting gate
/// keeps alive.
pub(super) fn vendor(quota: Quota) -> std::sync::Arc<crate::vendor::VendorModel> {
    use crate::retry::{Backoff, RetryBudget};
    let level = GateLevel::new("", std::sync::Arc::from([quota]), settings(Duration::ZERO));
    let gate = std::sync::Arc::new(Gate::new(Listed::nowhere(std::sync::Arc::new(level)), 1));
    let settings = crate::vendor::VendorSettings {
        fallback: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
        adaptive: None,
        budget: RetryBudget::default(),
    };
    std::sync::Arc::new(crate::vendor::VendorModel::new(gate, settings, None))
}

/// A gate whose meters still count rests in its map once its last holder
/// lets go, and the next gate of its key counts on from them; a gate
/// another holder shares stays with it, and one counting nothing goes.
/// Resting meters go once they count nothing, unless the model they keep
/// still counts and nothing else keeps it.
#[tokio::test(start_paused = true)]
async fn a_gate_rests_as_its_meters_and_wakes_with_them() {
    use std::sync::Arc;

    use crate::meters::Meters;

    let window = Duration::from_secs(10);
    let map = Arc::new(GateMap::default());
    let level = Arc::new(GateLevel::new(
        "tenant",
        Arc::from([Quota::fixed_window(2, window)]),
        settings(Duration::ZERO),
    ));
    let gate = || {
        map.gate(
            "acme",
            || level.clone(),
            |listed, rested: Option<Meters>| match rested {
                Some(meters) => Gate::resumed(listed, meters),
                None => Gate::new(listed, 1),
            },
        )
    };
    let hour = Duration::from_secs(3600);
    let model = vendor(Quota::fixed_window(1, hour));
    let keep: Arc<dyn Keep> = model.clone();
    let now = Instant::now();

    let acme = gate();
    acme.meters().commit(1, now);
    let other = acme.clone();
    assert!(!map.rest(acme, &keep, now), "another holder keeps it");
    assert!(Arc::ptr_eq(&gate(), &other));
    assert!(map.rest(other, &keep, now));
    assert_eq!((map.resting(), Arc::strong_count(&keep)), (1, 3));

    let woken = gate();
    assert_eq!((map.resting(), Arc::strong_count(&keep)), (0, 2));
    woken.meters().commit(1, now);
    assert_eq!(
        woken.meters().earliest(1, now),
        now + window,
        "the window's two were spent, one before the rest"
    );
    assert!(map.rest(woken, &keep, now));
    assert!(map.sweep(now + window / 2), "the window still counts");
    assert!(!map.sweep(now + window), "counting nothing, it goes");
    assert_eq!(Arc::strong_count(&keep), 2);
    assert!(!map.rest(gate(), &keep, now + window), "nothing to rest");

    // The vendor's hour is spent, and only a resting gate keeps its model.
    model.gate().meters().commit(1, now);
    let acme = gate();
    acme.meters().commit(1, now + window);
    assert!(map.rest(acme, &keep, now + window));
    drop((keep, model));
    assert!(map.sweep(now + 2 * window), "the model's hour still counts");
    assert!(!map.sweep(now + hour));
}

/// A lane per tenant holds a gate each: a gate keeps its meters' state
/// and its level keeps what their quotas make of them (`meters/terms.rs`),
/// its one bucket in place and anything more in one box
/// (`meters/counts.rs`), so a gate of one bucket quota, its ledger in
/// place, takes 152 bytes of heap with its counts (a block of 160 from
/// the allocator), where it took 248. A field that grows it shows here
/// first.
#[test]
fn a_gate_keeps_its_state_and_no_more() {
    assert!(
        size_of::<crate::meters::Meters>() <= 88,
        "{}",
        size_of::<crate::meters::Meters>()
    );
    assert!(size_of::<Gate>() <= 136, "{}", size_of::<Gate>());
}
