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

/// A lane waiting at its vendor's gate when its runtime ends leaves that
/// gate's queue with it: the next runtime's lanes under the same vendor
/// are not held behind a waiter that no longer exists. (Each runtime
/// here runs on the real clock, as a service's do; the vendor's interval
/// is long enough that a loaded machine's round trips fit well inside
/// it.)
#[test]
fn a_lane_whose_runtime_ended_leaves_its_vendors_queue() {
    use callshaper::route::{LaneKey, Level};

    let vendor_runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let vendor = vendor_runtime.block_on(Vendor::strict(10, Duration::from_secs(1)).start());
    let every = Duration::from_secs(2);
    let tenants = Level::new(
        "tenant",
        LaneKey::Tag,
        [Quota::leaky_bucket(10, Duration::from_secs(1))],
    );
    let shaper = Shaper::builder()
        .quota(Quota::leaky_bucket(1, every))
        .headroom(Duration::ZERO)
        .level(tenants)
        .build()
        .unwrap();
    let send = |tenant: &'static str| shaper.get(vendor.uri()).tag(tenant).send();

    // Both tenants' lanes live, and hold the vendor's gate: one spends the
    // vendor's interval, the other then waits at its gate (its own allows
    // it), and its runtime ends under it.
    let first = runtime();
    first.block_on(async {
        assert_eq!(send("spender").await.unwrap().status(), 200);
        let waiting = tokio::time::timeout(every / 5, send("waiter")).await;
        assert!(waiting.is_err(), "the vendor's interval holds it");
        // Its caller gone, the lane's dispatcher waits on at the gate.
        let again = tokio::spawn(send("waiter"));
        tokio::time::sleep(every / 5).await;
        assert!(!again.is_finished(), "still waiting at the vendor's gate");
    });
    drop(first);

    let second = runtime();
    second.block_on(async {
        tokio::time::sleep(every).await;
        let sent = tokio::time::timeout(2 * every, send("spender")).await;
        let sent = sent.expect("not held behind the ended runtime's waiter");
        assert_eq!(sent.unwrap().status(), 200);
        // The waiter's own lane serves on this runtime too, one vendor
        // interval later, and counts nobody waiting once it has.
        let sent = tokio::time::timeout(2 * every, send("waiter")).await;
        assert_eq!(sent.expect("served again").unwrap().status(), 200);
        let lanes = shaper.lanes();
        assert!(lanes.iter().all(|lane| lane.queued == 0), "{lanes:?}");
    });
    let arrivals = vendor.arrivals();
    assert_eq!(arrivals.len(), 3, "the ended runtime's waiter never went");
    assert!(arrivals[2].at - arrivals[1].at >= every - Duration::from_millis(50));
}

/// A lane whose dispatcher ended with its runtime, and which no request
/// comes back to, still goes once quiet: it is not taken for one whose
/// dispatcher is busy forever. Here a new tenant's lane starts the next
/// runtime's sweeper.
#[test]
fn a_lane_whose_runtime_ended_goes_when_quiet() {
    quiet_after_its_runtime_ended(false);
}

/// The sweeper ended with that runtime too: a request that finds its lane
/// on the next runtime starts another, with no new lane made.
#[test]
fn a_found_lane_starts_a_sweeper_where_the_last_one_ended() {
    quiet_after_its_runtime_ended(true);
}

/// A lane waits at its vendor's gate as its runtime ends (and with it the
/// sweeper); on the next runtime one request is sent, by a lane found
/// (one of another vendor's, used just before the runtime ended) or by a
/// new one, and the lane left waiting must then go within ten
/// `idle_timeout`s.
fn quiet_after_its_runtime_ended(found: bool) {
    use callshaper::route::{LaneKey, Level};

    let vendor_runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let start = || vendor_runtime.block_on(Vendor::strict(10, Duration::from_secs(1)).start());
    let (vendor, other) = (start(), start());
    let every = Duration::from_secs(2);
    let tenants = Level::new(
        "tenant",
        LaneKey::Tag,
        [Quota::leaky_bucket(10, Duration::from_secs(1))],
    );
    let idle = Duration::from_millis(200);
    let shaper = Shaper::builder()
        .quota(Quota::leaky_bucket(1, every))
        .headroom(Duration::ZERO)
        .level(tenants)
        .idle_timeout(idle)
        .build()
        .unwrap();
    let send = |tenant: &'static str| shaper.get(vendor.uri()).tag(tenant).send();
    let elsewhere = || shaper.get(other.uri()).tag("regular").send();
    let first = runtime();
    first.block_on(async {
        assert_eq!(send("spender").await.unwrap().status(), 200);
        let waiter = tokio::spawn(send("waiter"));
        tokio::time::sleep(every / 5).await;
        assert!(!waiter.is_finished(), "waiting at the vendor's gate");
        assert_eq!(elsewhere().await.unwrap().status(), 200);
    });
    drop(first);

    let named = |tenant: &str| {
        let lanes = shaper.lanes();
        lanes.iter().any(|lane| lane.key.contains(tenant))
    };
    assert!(named("tenant/waiter"), "live as its runtime ended");
    assert!(named("tenant/regular"), "live as its runtime ended");
    runtime().block_on(async {
        let sent = if found {
            elsewhere().await
        } else {
            tokio::time::sleep(every).await;
            send("newcomer").await
        };
        assert_eq!(sent.unwrap().status(), 200);
        tokio::time::sleep(10 * idle).await;
    });
    assert!(!named("tenant/waiter"), "gone once quiet");
}

/// Two runtimes share a lane, and the one its dispatcher runs on ends
/// while a request from the other waits in it: that request is not told
/// the shaper shut down; it waits on, in a dispatcher on its own runtime,
/// and goes in its turn.
#[test]
fn a_request_waiting_from_another_runtime_outlives_the_dispatchers() {
    let vendor_runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let vendor = vendor_runtime.block_on(Vendor::strict(10, Duration::from_secs(1)).start());
    let every = Duration::from_secs(1);
    let shaper = Shaper::builder()
        .quota(Quota::leaky_bucket(1, every))
        .headroom(Duration::ZERO)
        .build()
        .unwrap();
    let (started, dispatching) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::scope(|scope| {
        // The first runtime: one request goes, the next waits, and its
        // dispatcher runs here until this runtime ends.
        scope.spawn(|| {
            runtime().block_on(async {
                assert_eq!(shaper.get(vendor.uri()).send().await.unwrap().status(), 200);
                let _waiting = tokio::spawn(shaper.get(vendor.uri()).send());
                tokio::time::sleep(every / 5).await;
                started.send(()).unwrap();
                let _ = stopped.await;
            });
        });
        dispatching.recv().unwrap();
        runtime().block_on(async {
            let waiting = tokio::spawn(shaper.get(vendor.uri()).send());
            tokio::time::sleep(every / 5).await;
            assert!(!waiting.is_finished(), "queued behind the first runtime's");
            stop.send(()).unwrap();
            let sent = tokio::time::timeout(4 * every, waiting).await;
            let sent = sent.expect("goes in its turn").unwrap();
            assert_eq!(sent.unwrap().status(), 200);
        });
    });
    assert_eq!(
        vendor.arrivals().len(),
        2,
        "the ended runtime's waiter never went"
    );
}
