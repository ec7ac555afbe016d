//! A shaper is not tied to the runtime that first used it: lanes whose
//! dispatcher ended with its runtime are rebuilt on next use, and outside
//! any runtime a request ends with a typed error, not a panic.

use std::future::Future;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use callshaper::lane::{Lane, LanePolicy};
use callshaper::testing::Vendor;
use callshaper::{Error, Quota, Shaper};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

#[test]
fn a_shaper_outlives_the_runtimes_that_used_it() {
    // The vendor lives on a runtime of its own, for the whole test.
    let vendor_runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let vendor = vendor_runtime.block_on(Vendor::strict(10, Duration::from_secs(1)).start());
    let shaper = Shaper::builder()
        .rate(10, Duration::from_secs(1))
        .build()
        .unwrap();

    // Each test of a suite has its own runtime, and a service may rebuild
    // its runtime after a panic: the shaper serves every one of them.
    for round in 0..3 {
        let outcome = runtime().block_on(async {
            let mut statuses = Vec::new();
            for _ in 0..3 {
                statuses.push(shaper.get(vendor.uri()).send().await?.status());
            }
            Ok::<_, Error>(statuses)
        });
        let statuses = outcome.unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert!(
            statuses.iter().all(|s| *s == 200),
            "round {round}: {statuses:?}"
        );
    }
    assert_eq!(vendor.arrivals().len(), 9);
    assert_eq!(
        vendor.throttled(),
        0,
        "the quota carried over between runtimes"
    );
}

#[test]
fn outside_a_runtime_a_request_ends_with_a_typed_error() {
    let shaper = Shaper::builder()
        .rate(10, Duration::from_secs(1))
        .build()
        .unwrap();
    let send = shaper.get("http://127.0.0.1:9/").send();
    let mut send = std::pin::pin!(send);
    let mut context = Context::from_waker(Waker::noop());
    match send.as_mut().poll(&mut context) {
        Poll::Ready(Err(Error::NoRuntime)) => {}
        Poll::Ready(other) => panic!("expected NoRuntime, got {other:?}"),
        Poll::Pending => panic!("expected NoRuntime at once"),
    }

    let one = Quota::leaky_bucket(1, Duration::from_secs(1));
    let lane = Lane::new("sms", [one], LanePolicy::default());
    let refused = lane.expect_err("no runtime to run its dispatcher on");
    assert_eq!(refused.field, "runtime");
}
