//! A fleet's policy when Redis fails under it: a fail-open instance serves
//! from its share of the quota, a fail-closed one refuses with the typed
//! error, a hung Redis is ended by the store's timeout, and both go back
//! to the shared quota once Redis answers again. Against one real Redis
//! and a real Redis Cluster, on the real clock (Redis keeps time); every
//! server is started by the test on a free loopback port.

mod common;

use std::time::{Duration, Instant};

use callshaper::store::{RedisOptions, RedisStore, StoreError};
use callshaper::store::{StoreFailure, StoreMode};
use callshaper::testing::{RedisCluster, RedisServer, Vendor};
use callshaper::{Error, Shaper};
use common::SECOND;
use tokio::task::JoinHandle;

/// An instance at 10/s with this policy for when Redis fails.
fn instance_failing(store: RedisStore, failure: StoreFailure) -> Shaper {
    common::fleet_instance(store, failure)
}

/// The timeout of the outage tests' stores.
const OUTAGE_TIMEOUT: Duration = Duration::from_millis(100);

/// A store for outage tests: a fleet of two, a short timeout, a probe
/// every 200 ms.
fn outage_options(base: RedisOptions) -> RedisOptions {
    base.fleet_size(2)
        .timeout(OUTAGE_TIMEOUT)
        .probe_every(Duration::from_millis(200))
}

/// Which mode the shaper's (only) lane is in.
fn store_mode(shaper: &Shaper) -> Option<StoreMode> {
    shaper.lanes().first().and_then(|lane| lane.store)
}

/// A fail-open and a fail-closed instance on these stores, each with one
/// request behind it, so connections and scripts are warm.
async fn warm_pair(open: RedisStore, closed: RedisStore, vendor: &Vendor) -> (Shaper, Shaper) {
    let open = instance_failing(open, StoreFailure::Open);
    let closed = instance_failing(closed, StoreFailure::Closed);
    for shaper in [&open, &closed] {
        let response = shaper.get(format!("{}/warm", vendor.uri())).send().await;
        assert_eq!(response.unwrap().status(), 200);
    }
    (open, closed)
}

/// One call's end: its outcome, how long it took, when it ended.
type Ended = (Result<reqwest::Response, Error>, Duration, Instant);

/// `n` calls to `{vendor}/{tag}/{i}` through `shaper`, spawned at once,
/// each under a 30 s guard: no call may hang.
fn spawn_calls(shaper: &Shaper, vendor: &Vendor, tag: &str, n: usize) -> Vec<JoinHandle<Ended>> {
    (0..n)
        .map(|i| {
            let request = shaper.get(format!("{}/{tag}/{i}", vendor.uri()));
            tokio::spawn(async move {
                let started = Instant::now();
                let outcome = tokio::time::timeout(Duration::from_secs(30), request.send())
                    .await
                    .expect("no request hangs");
                (outcome, started.elapsed(), Instant::now())
            })
        })
        .collect()
}

/// After an outage: the fail-closed lane serves again within `within`, and
/// the fail-open one is back on the store within a few probes of it.
async fn assert_back_on_the_store(
    open: &Shaper,
    closed: &Shaper,
    vendor: &Vendor,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    while closed
        .get(format!("{}/probe", vendor.uri()))
        .send()
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "the fail-closed lane never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The fail-open lane tries the store only with a request, and its
    // first call after the restart may meet the connection the crash
    // dropped (redis-rs reconnects behind it): it serves from its share
    // and tries again at its next probe (200 ms). Every request is served
    // meanwhile; five probes are the bound.
    let back = Instant::now() + Duration::from_millis(1_000);
    loop {
        let response = open.get(format!("{}/back", vendor.uri())).send().await;
        assert_eq!(response.unwrap().status(), 200, "fail-open keeps serving");
        if store_mode(open) == Some(StoreMode::Shared) {
            break;
        }
        assert!(
            Instant::now() < back,
            "the fail-open lane was not back on the store within five probes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for shaper in [open, closed] {
        assert_eq!(store_mode(shaper), Some(StoreMode::Shared));
    }
}

/// The cluster node that holds the vendor's keys dies mid-run (no
/// replica takes over): the lanes follow their policy as with one Redis,
/// and return once the node is back in the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_a_cluster_node_dies_lanes_follow_their_policy_and_come_back() {
    let mut cluster = RedisCluster::start();
    let vendor = Vendor::strict(10, SECOND).start().await;
    let (open, closed) = warm_pair(
        outage_options(cluster.options())
            .cluster(cluster.urls())
            .await
            .unwrap(),
        outage_options(cluster.options())
            .cluster(cluster.urls())
            .await
            .unwrap(),
        &vendor,
    )
    .await;
    // SCAN on a cluster node lists only the keys it holds.
    let owner = cluster
        .nodes
        .iter()
        .position(|node| {
            node.cli(&["--scan", "--pattern", "callshaper:*"])
                .contains("callshaper:")
        })
        .expect("one node holds the vendor's keys");

    // 20 each: 4 s of the shared quota, more than one horizon (1 s) of
    // booked slots, so part of the fail-closed queue outlives the node.
    let open_run = spawn_calls(&open, &vendor, "open", 20);
    let closed_run = spawn_calls(&closed, &vendor, "closed", 20);
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.nodes[owner].kill();
    for (outcome, ..) in common::join_all(open_run).await {
        assert_eq!(outcome.unwrap().status(), 200, "fail-open keeps serving");
    }
    let mut refused = 0;
    for (outcome, ..) in common::join_all(closed_run).await {
        match outcome {
            Ok(response) => assert_eq!(response.status(), 200),
            Err(Error::StoreUnavailable { .. }) => refused += 1,
            Err(other) => panic!("fail-closed: expected StoreUnavailable, got {other}"),
        }
    }
    assert!(refused > 0, "the fail-closed queue outlived its node");
    assert_eq!(store_mode(&open), Some(StoreMode::Fallback));
    assert_eq!(store_mode(&closed), Some(StoreMode::Unavailable));

    cluster.nodes[owner].restart();
    // Back in the cluster once the others see it again (node timeout 2 s).
    assert_back_on_the_store(&open, &closed, &vendor, Duration::from_secs(30)).await;
    assert_eq!(vendor.throttled(), 0, "{:#?}", vendor.arrivals());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_redis_dies_lanes_follow_their_policy_and_come_back() {
    let mut redis = RedisServer::start();
    let vendor = Vendor::strict(10, SECOND).start().await;
    let open_store = outage_options(redis.options())
        .connect(&redis.url())
        .await
        .unwrap();
    let closed_store = outage_options(redis.options())
        .connect(&redis.url())
        .await
        .unwrap();
    let open = instance_failing(open_store.clone(), StoreFailure::Open);
    let closed = instance_failing(closed_store.clone(), StoreFailure::Closed);

    // Mid-run: both instances have queues (20 each, 4 s of the shared
    // quota) when Redis dies after one second.
    let open_run = spawn_calls(&open, &vendor, "open", 20);
    let closed_run = spawn_calls(&closed, &vendor, "closed", 20);
    tokio::time::sleep(SECOND).await;
    assert_eq!(store_mode(&open), Some(StoreMode::Shared));
    redis.kill();
    let killed = Instant::now();
    for (outcome, ..) in common::join_all(open_run).await {
        assert_eq!(outcome.unwrap().status(), 200, "fail-open keeps serving");
    }
    let mut refused = 0;
    for (outcome, _, ended) in common::join_all(closed_run).await {
        match outcome {
            Ok(response) => assert_eq!(response.status(), 200),
            Err(Error::StoreUnavailable { .. }) => {
                refused += 1;
                // Slots booked before the crash are still honoured (at most
                // a horizon, 1 s); then one call fails within the timeout
                // and everyone waiting hears it at once.
                let after = ended.saturating_duration_since(killed);
                assert!(
                    after <= Duration::from_millis(1_600),
                    "refused {after:?} after the crash"
                );
            }
            Err(other) => panic!("fail-closed: expected StoreUnavailable, got {other}"),
        }
    }
    assert!(refused > 0, "the fail-closed queue outlived Redis");
    assert_eq!(store_mode(&open), Some(StoreMode::Fallback));
    assert_eq!(store_mode(&closed), Some(StoreMode::Unavailable));

    // Still down: the fail-open instance serves at its share (5/s), the
    // fail-closed one refuses new requests at once, with the typed error.
    let down_started = vendor.arrivals().len();
    let open_down = spawn_calls(&open, &vendor, "down-open", 10);
    let closed_down = spawn_calls(&closed, &vendor, "down-closed", 10);
    for (outcome, ..) in common::join_all(open_down).await {
        assert_eq!(outcome.unwrap().status(), 200, "fail-open keeps serving");
    }
    for (outcome, took, _) in common::join_all(closed_down).await {
        match outcome {
            Err(Error::StoreUnavailable { .. }) => {}
            other => panic!("fail-closed: expected StoreUnavailable, got {other:?}"),
        }
        // The lane already knows: no call, no timeout to wait for.
        assert!(took <= Duration::from_millis(100), "refused after {took:?}");
    }
    let during: Vec<_> = vendor.arrivals()[down_started..].to_vec();
    assert!(during.iter().all(|a| a.path.starts_with("/down-open/")));
    let at_share = callshaper::testing::max_in_any_window(during.iter().map(|a| a.at), SECOND);
    assert!(
        at_share <= 5,
        "{at_share} in one second from the fallback at 5/s"
    );

    // Back: the lanes find Redis again by themselves.
    redis.restart();
    assert_back_on_the_store(&open, &closed, &vendor, Duration::from_secs(10)).await;
    let trips_before = open_store.round_trips();
    let back = spawn_calls(&open, &vendor, "back-open", 5);
    for (outcome, ..) in common::join_all(back).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    assert!(
        open_store.round_trips() > trips_before,
        "served through Redis again"
    );
    assert_eq!(vendor.throttled(), 0, "{:#?}", vendor.arrivals());
    assert!(vendor.max_in_any_window(SECOND) <= 10);
}

/// A hung Redis (stopped, connections open, no answer) is the case only a
/// timeout ends: fail-closed callers hear `Timeout` once the timeout has
/// passed, fail-open ones are served, and both go back once it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_ends_calls_at_the_timeout() {
    let redis = RedisServer::start();
    let vendor = Vendor::strict(10, SECOND).start().await;
    let (open, closed) = warm_pair(
        outage_options(redis.options())
            .connect(&redis.url())
            .await
            .unwrap(),
        outage_options(redis.options())
            .connect(&redis.url())
            .await
            .unwrap(),
        &vendor,
    )
    .await;

    redis.freeze();
    let closed_calls = spawn_calls(&closed, &vendor, "closed", 5);
    let open_calls = spawn_calls(&open, &vendor, "open", 5);
    for (outcome, took, _) in common::join_all(closed_calls).await {
        match outcome {
            Err(Error::StoreUnavailable {
                source: StoreError::Timeout(waited),
                ..
            }) => assert_eq!(waited, OUTAGE_TIMEOUT),
            other => panic!("fail-closed on a hung Redis: {other:?}"),
        }
        // One call waited out the timeout; everyone queued behind it heard
        // at once. Scheduling on two loaded cores gets the rest.
        assert!(
            took >= OUTAGE_TIMEOUT && took <= OUTAGE_TIMEOUT + Duration::from_millis(150),
            "refused after {took:?}"
        );
    }
    for (outcome, ..) in common::join_all(open_calls).await {
        assert_eq!(outcome.unwrap().status(), 200, "fail-open keeps serving");
    }
    assert_eq!(store_mode(&closed), Some(StoreMode::Unavailable));
    assert_eq!(store_mode(&open), Some(StoreMode::Fallback));

    redis.thaw();
    assert_back_on_the_store(&open, &closed, &vendor, Duration::from_secs(10)).await;
    assert_eq!(vendor.throttled(), 0);
}
