//! A fleet of shapers sharing one vendor quota through a real Redis (and a
//! real Redis Cluster), against a strict vendor on real wiremock HTTP.
//!
//! Redis keeps time with its own clock, so these tests run on the real
//! clock: each shaper is one instance, with its own Redis connections.
//! Every server is started by the test on a free loopback port.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use callshaper::store::{RedisStore, StoreFailure};
use callshaper::testing::{RedisCluster, RedisServer, RetryAfter, Vendor};
use callshaper::{Error, Quota, Shaper};
use common::SECOND;

const HEADROOM: Duration = common::FLEET_HEADROOM;

fn instance(store: RedisStore) -> Shaper {
    common::fleet_instance(store, StoreFailure::default())
}

/// The quota is held fleet-wide, and at least `floor` of it used.
fn assert_quota_held_and_used(vendor: &Vendor, total: usize, floor: f64) {
    assert_eq!(vendor.throttled(), 0, "no 429 from the vendor");
    let busiest = vendor.max_in_any_window(SECOND);
    assert!(busiest <= 10, "{busiest} requests in one second");
    let arrivals = vendor.arrivals();
    assert_eq!(arrivals.len(), total, "each request sent once");
    let span = arrivals[total - 1].at - arrivals[0].at;
    // `total` requests at 10/s need (total - 1) intervals of 100 ms.
    let utilization = (total - 1) as f64 / (span.as_secs_f64() * 10.0);
    println!(
        "{total} requests in {span:?}: {:.1} % of the quota",
        utilization * 100.0
    );
    assert!(utilization >= floor, "fleet utilization {utilization:.3}");
}

async fn fleet_of(size: usize) {
    let redis = RedisServer::start();
    let vendor = Vendor::strict(10, SECOND).start().await;
    let mut shapers = Vec::new();
    let mut stores = Vec::new();
    for _ in 0..size {
        let store = redis.options().connect(&redis.url()).await.unwrap();
        stores.push(store.clone());
        shapers.push(
            Shaper::builder()
                .rate(10, SECOND)
                .headroom(HEADROOM)
                .store(store)
                .build()
                .unwrap(),
        );
    }
    common::run_fleet(&shapers, &vendor, 200).await;
    // 30 ms of headroom leaves 97.1 % of the quota, measured alone; under
    // the whole suite's load an instance's late call to Redis leaves a
    // slot of the 200 unused now and then (96.1 % once).
    assert_quota_held_and_used(&vendor, 200, 0.955);
    let trips: u64 = stores.iter().map(RedisStore::round_trips).sum();
    println!("{size} instances: {trips} Redis round trips for 200 requests");

    // Idle state expires: every key carries a TTL no longer than its
    // window (1 s + headroom) and a second.
    let keys = redis.cli(&["--scan", "--pattern", "callshaper:*"]);
    let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
    assert!(!keys.is_empty(), "the gate lives in Redis");
    for key in keys {
        let ttl: i64 = redis.cli(&["pttl", key]).trim().parse().unwrap();
        assert!(ttl > 0 && ttl <= 2_100, "{key} expires in {ttl} ms");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_ten_per_second() {
    fleet_of(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_instances_share_ten_per_second() {
    fleet_of(8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_shares_the_quota_too() {
    let cluster = RedisCluster::start();
    let vendor = Vendor::strict(10, SECOND).start().await;
    // The seed list outlives a node: its first entry is down, and every
    // instance connects, and hears pauses, through the others.
    let gone = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let urls = cluster.urls();
        let scheme = urls[0]
            .split_once("://")
            .map_or("redis", |(scheme, _)| scheme);
        format!("{scheme}://{}", listener.local_addr().unwrap())
    };
    let seeds: Vec<String> = std::iter::once(gone).chain(cluster.urls()).collect();
    let mut shapers = Vec::new();
    for _ in 0..3 {
        let store = cluster.options().cluster(&seeds).await.unwrap();
        shapers.push(instance(store));
    }
    common::run_fleet(&shapers, &vendor, 200).await;
    assert_quota_held_and_used(&vendor, 200, 0.95);

    // The pause reaches every instance through the cluster too.
    let vendor = Vendor::strict(10, SECOND).start().await;
    assert_one_throttle_pauses_all(&shapers, &vendor).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttle_seen_by_one_instance_pauses_the_fleet() {
    let redis = RedisServer::start();
    let vendor = Vendor::strict(10, SECOND).start().await;
    // Two shapers of one process share a connection; the third is alone.
    let shared = redis.options().connect(&redis.url()).await.unwrap();
    let shapers = [
        instance(shared.clone()),
        instance(shared),
        instance(redis.options().connect(&redis.url()).await.unwrap()),
    ];
    assert_one_throttle_pauses_all(&shapers, &vendor).await;
}

/// 50 requests over the fleet; 1.5 s in, the vendor answers 429
/// `Retry-After: 2` for 150 ms: one instance sees it, and nobody sends
/// anything for the next 2 s.
async fn assert_one_throttle_pauses_all(shapers: &[Shaper], vendor: &Vendor) {
    let throttle = {
        let vendor = vendor.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            // Long enough to catch one request of the fleet's 10/s stream;
            // the pause must keep a second one from arriving.
            vendor.throttle_for(Duration::from_millis(150), RetryAfter::Seconds(2));
        })
    };
    common::run_fleet(shapers, vendor, 50).await;
    throttle.await.unwrap();

    assert_eq!(
        vendor.throttled(),
        1,
        "one instance saw the 429, nobody else"
    );
    let arrivals = vendor.arrivals();
    let throttled = arrivals.iter().find(|a| a.status == 429).unwrap().at;
    let during: Vec<_> = arrivals
        .iter()
        .filter(|a| a.at > throttled && a.at < throttled + Duration::from_secs(2))
        .collect();
    assert!(
        during.is_empty(),
        "sent during the fleet-wide pause: {during:?}"
    );
    assert!(vendor.max_in_any_window(SECOND) <= 10);
}

/// The five algorithms on both stores, same quota, same load: the vendor
/// sees the same schedule (within timer jitter) and no 429s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_meter_behaves_the_same_in_memory_and_on_redis() {
    let redis = RedisServer::start();
    type Table = [(&'static str, Quota, fn() -> Vendor); 5];
    let table: Table = [
        ("leaky bucket", Quota::leaky_bucket(10, SECOND), || {
            Vendor::strict(10, SECOND)
        }),
        ("token bucket", Quota::token_bucket(5, 10, SECOND), || {
            Vendor::token_bucket(5, 10, SECOND)
        }),
        // It can send 2 × 10 across a window boundary (see algorithms.rs):
        // the same on both stores.
        ("fixed window", Quota::fixed_window(10, SECOND), || {
            Vendor::strict(20, SECOND)
        }),
        ("sliding log", Quota::sliding_log(10, SECOND), || {
            Vendor::strict(10, SECOND)
        }),
        ("sliding window", Quota::sliding_window(10, SECOND), || {
            Vendor::strict(10, SECOND)
        }),
    ];
    // One algorithm at a time, both stores at once: ten runs together on
    // two cores made a first answer late on one store and not the other,
    // and a burst whose first answer comes later than the lateness
    // forgiven goes one smaller (`Meters::heard`, `Reserved::first_word`),
    // which moved its tail by a whole interval on that store alone.
    for (name, quota, vendor) in table {
        let mut runs = Vec::new();
        for on_redis in [false, true] {
            let url = redis.url();
            let redis_options = redis.options();
            let quota = quota.clone();
            runs.push(tokio::spawn(async move {
                let vendor = vendor().start().await;
                // A burst opens new connections and lands late; what comes
                // after it is on time: a bit more headroom than the fleet
                // tests for this jitter, on both stores alike.
                let mut builder = Shaper::builder()
                    .quota(quota)
                    .headroom(Duration::from_millis(50));
                if on_redis {
                    // wiremock reuses its servers' ports: a lane of the
                    // algorithm before had the same key.
                    let store = redis_options.clone().prefix(format!("{name}:"));
                    builder = builder.store(store.connect(&url).await.unwrap());
                }
                let shaper = builder.build().unwrap();
                let tasks: Vec<_> = (0..25)
                    .map(|i| tokio::spawn(shaper.get(format!("{}/r/{i}", vendor.uri())).send()))
                    .collect();
                for outcome in common::join_all(tasks).await {
                    assert_eq!(outcome.unwrap().status(), 200, "{name}");
                }
                assert_eq!(
                    vendor.throttled(),
                    0,
                    "{name} on redis: {on_redis}: {:?}",
                    vendor.arrivals()
                );
                let first = vendor.arrivals()[0].at;
                let offsets: Vec<Duration> =
                    vendor.arrivals().iter().map(|a| a.at - first).collect();
                offsets
            }));
        }
        let [memory, redis] = <[_; 2]>::try_from(common::join_all(runs).await)
            .unwrap_or_else(|_| unreachable!("two runs"));
        assert_eq!(memory.len(), redis.len());
        for (i, (m, r)) in memory.iter().zip(&redis).enumerate() {
            let gap = if m > r { *m - *r } else { *r - *m };
            assert!(
                gap <= Duration::from_millis(60),
                "{name}: request {i} at {m:?} in memory, {r:?} on Redis"
            );
        }
    }
}

/// A deploy that changes the quota's algorithm reads none of the old
/// meter's state. The old sliding log's instants, read as a sliding
/// window's index, put the next slot centuries ahead: the new lane sent
/// nothing until the old state expired, the gate's longest window and a
/// second after the old lane's last call (as long as an old instance kept
/// writing it, in a rolling deploy). An hourly quota beside the changed
/// one, as vendors state them, keeps the gate an hour: the bug then waits
/// far past the bound even when the sleep overslept. A Redis call is given
/// seconds, not the default 250 ms, since a lane that timed out on a slow
/// machine waits out `probe_every` (1 s) too. The bound is a window and a
/// half: on a loaded machine the new lane's burst hears its first answer
/// late and gives up a slot (`lane/release/reserved.rs`), and the request
/// left over waits for the window's next one, up to a second (988 ms and
/// 1,009 ms in 2 of 8 runs with both cores kept busy, against 800 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_changed_by_a_deploy_starts_its_meter_afresh() {
    let redis = RedisServer::start();
    let vendor = Vendor::strict(10, SECOND).start().await;
    let options = redis.options();
    let deploy = |quota: Quota| {
        let url = redis.url();
        let options = options.clone();
        async move {
            let store = options
                .timeout(Duration::from_secs(5))
                .connect(&url)
                .await
                .unwrap();
            Shaper::builder()
                .quota(quota)
                .quota(Quota::fixed_window(36_000, Duration::from_secs(3600)))
                .store(store)
                .build()
                .unwrap()
        }
    };
    common::run_fleet(&[deploy(Quota::sliding_log(10, SECOND)).await], &vendor, 10).await;
    // The old log's window has passed: the new meter may send at once.
    tokio::time::sleep(SECOND + Duration::from_millis(100)).await;
    let started = Instant::now();
    let new_deploy = async {
        let shaper = deploy(Quota::sliding_window(10, SECOND)).await;
        common::run_fleet(&[shaper], &vendor, 10).await;
    };
    tokio::time::timeout(Duration::from_secs(5), new_deploy)
        .await
        .expect("the new deploy's lane sends");
    assert!(
        started.elapsed() < Duration::from_millis(1_500),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(vendor.throttled(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_of_callers_who_gave_up_go_back_to_the_fleet() {
    let redis = RedisServer::start();
    let vendor = Vendor::strict(10, SECOND).start().await;
    let a = instance(redis.options().connect(&redis.url()).await.unwrap());
    let b = instance(redis.options().connect(&redis.url()).await.unwrap());

    // A books a second of slots for ten callers, then nine of them leave.
    let callers: Vec<_> = (0..10)
        .map(|i| tokio::spawn(a.get(format!("{}/a/{i}", vendor.uri())).send()))
        .collect();
    tokio::time::sleep(Duration::from_millis(30)).await;
    for caller in &callers[1..] {
        caller.abort();
    }
    // A's lane notices at its next slot (100 ms) and gives the rest back.
    tokio::time::sleep(Duration::from_millis(150)).await;

    let started = Instant::now();
    let response = b.get(format!("{}/b/0", vendor.uri())).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_millis(100),
        "B waited {waited:?} behind slots nobody uses"
    );
    assert_eq!(vendor.throttled(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costs_are_reserved_and_settled_in_redis() {
    let redis = RedisServer::start();
    let vendor = Vendor::strict(100, SECOND)
        .also_cost(1_000, SECOND, "x-tokens")
        .start()
        .await;
    let shaper = Shaper::builder()
        .rate(100, SECOND)
        .quota(Quota::sliding_log(1_000, SECOND).per_cost())
        .headroom(HEADROOM)
        .store(redis.options().connect(&redis.url()).await.unwrap())
        .build()
        .unwrap();
    // A correction is one script call on its way to Redis: give it 20 ms.
    common::settle_then_not(
        &shaper,
        &vendor,
        Duration::from_millis(20),
        Duration::from_millis(300),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_clocks_work_where_scripts_may_not_read_time() {
    let redis = RedisServer::start();
    let vendor = Vendor::strict(10, SECOND).start().await;
    let mut shapers = Vec::new();
    for _ in 0..2 {
        let store = redis
            .options()
            .clock(callshaper::store::Clock::Instances)
            .connect(&redis.url())
            .await
            .unwrap();
        shapers.push(instance(store));
    }
    common::run_fleet(&shapers, &vendor, 40).await;
    // 97.1 % of the quota, measured alone; under the whole suite's load
    // (the TLS run, beside the other fleet tests) a slot of the 40 went
    // unused once: 94.7 %. A slot is 2.4 % of so few; this allows one.
    assert_quota_held_and_used(&vendor, 40, 0.92);
}

/// Tenants under one vendor, on two instances: A (capped at 2/s) floods 20
/// requests, B sends 6. A's lane books vendor slots no further than the
/// horizon, so B is done as soon as its own cap allows after A's slot
/// booked ahead (about 3.2 s), not after A's flood (10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_tenant_does_not_book_the_vendors_quota_away() {
    let redis = RedisServer::start();
    let vendor = Vendor::strict(10, SECOND).start().await;
    let tenant = callshaper::route::Level::new(
        "tenant",
        callshaper::route::LaneKey::Tag,
        [Quota::leaky_bucket(2, SECOND)],
    );
    let mut shapers = Vec::new();
    for _ in 0..2 {
        let store = redis.options().connect(&redis.url()).await.unwrap();
        let shaper = Shaper::builder()
            .rate(10, SECOND)
            .level(tenant.clone())
            .headroom(HEADROOM)
            .store(store)
            .build()
            .unwrap();
        shapers.push(shaper);
    }
    let started = Instant::now();
    let send = |shaper: &Shaper, tenant: &'static str, i: usize| {
        let call = shaper
            .get(format!("{}/{tenant}/{i}", vendor.uri()))
            .tag(tenant)
            .send();
        tokio::spawn(async move { (call.await, started.elapsed()) })
    };
    let flood: Vec<_> = (0..20).map(|i| send(&shapers[0], "a", i)).collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let other: Vec<_> = (0..6).map(|i| send(&shapers[1], "b", i)).collect();

    let mut b_last = Duration::ZERO;
    for (outcome, at) in common::join_all(other).await {
        assert_eq!(outcome.unwrap().status(), 200);
        b_last = b_last.max(at);
    }
    // B's first vendor slot comes after A's latest, booked a tenant
    // interval (515 ms) ahead, within the horizon: at about 0.62 s, then
    // B's own cap, 5 x 515 ms: 3.2 s (3.198-3.199 s measured), where A's
    // flood would take 10 s. The bound leaves 100 ms for a loaded machine.
    println!("tenant b finished at {b_last:?}");
    assert!(
        b_last <= Duration::from_millis(3_300),
        "tenant b finished at {b_last:?}"
    );
    for (outcome, _) in common::join_all(flood).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    assert_eq!(vendor.throttled(), 0);
    let a_busiest = callshaper::testing::max_in_any_window(
        vendor
            .arrivals()
            .iter()
            .filter(|a| a.path.starts_with("/a/"))
            .map(|a| a.at),
        SECOND,
    );
    assert!(a_busiest <= 2, "tenant a kept to its cap: {a_busiest}");
}

/// Admission on a shared store predicts from the declared pace, not from
/// the fallback's share: 8 queued at 10/s fit a 1 s `max_wait` even with a
/// fleet of 3 (whose share would be 3/s, or 2.6 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_on_a_shared_store_predicts_the_fleets_pace() {
    let redis = RedisServer::start();
    let vendor = Vendor::strict(10, SECOND).start().await;
    let store = redis
        .options()
        .fleet_size(3)
        .connect(&redis.url())
        .await
        .unwrap();
    let shaper = Shaper::builder()
        .rate(10, SECOND)
        .headroom(HEADROOM)
        .max_wait(SECOND)
        .store(store)
        .build()
        .unwrap();
    let calls: Vec<_> = (0..8)
        .map(|i| tokio::spawn(shaper.get(format!("{}/r/{i}", vendor.uri())).send()))
        .collect();
    for outcome in common::join_all(calls).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    // The 12th in line would wait past 1 s: refused at once.
    let calls: Vec<_> = (0..12)
        .map(|i| tokio::spawn(shaper.get(format!("{}/s/{i}", vendor.uri())).send()))
        .collect();
    let refused = common::join_all(calls)
        .await
        .into_iter()
        .filter(|o| matches!(o, Err(Error::WouldExceedMaxWait { .. })))
        .count();
    assert!(refused >= 1, "a wait past max_wait is refused");
    assert_eq!(vendor.throttled(), 0);
}

/// A custom meter runs in one process: with a shared store, `build()`
/// refuses it with a typed error instead of leaving it unenforced.
#[tokio::test]
async fn a_custom_meter_is_refused_with_a_store() {
    let redis = RedisServer::start();
    let store = redis.options().connect(&redis.url()).await.unwrap();
    let rate = callshaper::Rate::new(10, SECOND);
    let custom = Quota::custom(callshaper::meters::CustomMeter::new(
        "mine",
        rate,
        move |headroom, _| Box::new(callshaper::meters::LeakyBucket::new(rate, headroom)),
    ));
    let refused = Shaper::builder()
        .quota(custom)
        .store(store)
        .build()
        .expect_err("a custom meter cannot live in Redis");
    assert_eq!(refused.field, "levels.vendor.quotas", "{refused}");
}

/// Answers 200 at once and notes when each request went: a lane this fast
/// outruns any HTTP server on two cores, and what is tested is its store.
struct Sends(Arc<Mutex<Vec<Instant>>>);

impl callshaper::shaper::Transport for Sends {
    fn send(
        &self,
        _request: reqwest::Request,
    ) -> callshaper::shaper::BoxFuture<reqwest::Result<reqwest::Response>> {
        self.0.lock().unwrap().push(Instant::now());
        Box::pin(async {
            Ok(reqwest::Response::from(http::Response::new(
                reqwest::Body::from(""),
            )))
        })
    }
}

/// A lane whose slots come faster than a timer tick (so it reserves the
/// next batches while it uses the slots it holds) still books full batches
/// only, releases each request once, and never more than the quota in any
/// window. (Asking ahead itself shows in `cargo bench --bench store`: it
/// takes 64 waiters from about 100 k to 150 k releases a second.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_reserving_ahead_holds_the_quota_in_full_batches() {
    let redis = RedisServer::start();
    let store = redis.options().connect(&redis.url()).await.unwrap();
    let window = Duration::from_millis(100);
    let sends = Arc::new(Mutex::new(Vec::new()));
    let shaper = Shaper::builder()
        .rate(4_000, window)
        .headroom(HEADROOM)
        .store(store.clone())
        .transport(Sends(sends.clone()))
        .build()
        .unwrap();
    let (callers, each) = (64, 100);
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let shaper = shaper.clone();
            tokio::spawn(async move {
                for _ in 0..each {
                    let response = shaper.get("http://vendor.invalid/x").send().await;
                    assert_eq!(response.unwrap().status(), 200);
                }
            })
        })
        .collect();
    common::join_all(tasks).await;

    let mut sends = sends.lock().unwrap().clone();
    sends.sort();
    assert_eq!(sends.len(), callers * each, "each request sent once");
    let busiest = (0..sends.len())
        .map(|i| sends[i..].partition_point(|&at| at < sends[i] + window))
        .max()
        .unwrap();
    assert!(busiest <= 4_000, "{busiest} sends in one window of 4,000");
    // 6,400 requests need more than a window and a half.
    let span = sends[sends.len() - 1] - sends[0];
    assert!(span >= window * 3 / 2, "6,400 requests in {span:?}");
    let trips = store.round_trips() as f64 / (callers * each) as f64;
    println!(
        "reserving ahead: {busiest} in the busiest window, {trips:.3} round trips per request, {span:?}"
    );
    assert!(
        trips < 0.07,
        "{trips:.3} round trips per request: batches not full"
    );
}
