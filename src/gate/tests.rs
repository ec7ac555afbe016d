//! The gate's own tests: its queue of waiting lanes.

use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::meters::Quota;

fn settings(headroom: Duration) -> GateSettings {
    GateSettings {
        headroom,
        max_pause: Duration::from_secs(120),
    }
}

#[tokio::test(start_paused = true)]
async fn the_lane_that_waited_longest_is_first_and_its_going_wakes_the_rest() {
    let quotas = [Quota::leaky_bucket(10, Duration::from_secs(1))];
    let quotas = std::sync::Arc::from(quotas);
    let level = GateLevel::new("", quotas, settings(Duration::from_millis(5)));
    let gate = Gate::new(std::sync::Arc::new(level), None, 1);
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
