//! The quota and FIFO invariants against a strict vendor over real HTTP.

mod common;

use std::time::Duration;

use callshaper::testing::Vendor;
use common::{SECOND, burst, order, shaper};

#[tokio::test(start_paused = true)]
async fn a_hundred_concurrent_callers_stay_within_ten_per_second_in_order() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let shaper = shaper(10).build().unwrap();
    let started = tokio::time::Instant::now();

    let outcomes = burst(&shaper, &vendor.uri(), 100).await;

    for outcome in &outcomes {
        assert_eq!(outcome.as_ref().unwrap().status(), 200);
    }
    assert_eq!(vendor.throttled(), 0);
    assert!(vendor.max_in_any_window(SECOND) <= 10);
    let arrivals = vendor.arrivals();
    assert_eq!(order(&arrivals), (0..100).collect::<Vec<_>>());
    // Paced, not trickled: 99 gaps of (1 s + 5 ms headroom) / 10.
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(9_900), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(10_100), "{elapsed:?}");
    // The meter's bound: any 11 consecutive arrivals span at least
    // 1 s + headroom / 2.
    for eleven in arrivals.windows(11) {
        let span = eleven[10].at - eleven[0].at;
        assert!(span >= Duration::from_micros(1_002_500), "{span:?}");
    }
}
