//! A fleet of three sharing a strict 10/s vendor through a real Redis,
//! while Redis fails under it: restarted, or its state lost. The vendor
//! must never see more than 10 in any second, nor send a 429, and every
//! request must end in a response. Real clock: Redis keeps time.

mod common;

use std::time::Duration;

use callshaper::Shaper;
use callshaper::store::RedisOptions;
use callshaper::store::{StoreFailure, StoreMode};
use callshaper::testing::{RedisCluster, RedisServer, Vendor};
use common::SECOND;
use tokio::task::JoinHandle;

/// As in `tests/fleet.rs`: the jitter of a loaded two-core machine.
const HEADROOM: Duration = Duration::from_millis(30);

/// `size` fail-open instances at 10/s on `redis`, each warmed with one
/// request to `vendor` (connections open, scripts loaded), so the run
/// measures the fleet, not its first round trips.
async fn fleet(redis: &RedisServer, vendor: &Vendor, size: u32) -> Vec<Shaper> {
    fleet_on(redis.options(), &[redis.url()], false, vendor, size).await
}

/// As [`fleet`], on a Redis Cluster when `cluster`.
async fn fleet_on(
    base: RedisOptions,
    urls: &[String],
    cluster: bool,
    vendor: &Vendor,
    size: u32,
) -> Vec<Shaper> {
    let mut shapers = Vec::new();
    for _ in 0..size {
        let options = base
            .clone()
            .fleet_size(size)
            .timeout(Duration::from_millis(100))
            .probe_every(Duration::from_millis(200));
        let store = if cluster {
            options.cluster(urls).await
        } else {
            options.connect(&urls[0]).await
        };
        let shaper = Shaper::builder()
            .rate(10, SECOND)
            .headroom(HEADROOM)
            .store(store.unwrap())
            .on_store_failure(StoreFailure::Open)
            .build()
            .unwrap();
        let warm = shaper.get(format!("{}/warm", vendor.uri())).send().await;
        assert_eq!(warm.unwrap().status(), 200);
        shapers.push(shaper);
    }
    shapers
}

/// `per` requests on each instance, all submitted now.
fn backlog(
    shapers: &[Shaper],
    vendor: &Vendor,
    per: usize,
) -> Vec<JoinHandle<Result<reqwest::Response, callshaper::Error>>> {
    let mut tasks = Vec::new();
    for i in 0..per {
        for (n, shaper) in shapers.iter().enumerate() {
            let request = shaper.get(format!("{}/{n}/{i}", vendor.uri()));
            tasks.push(tokio::spawn(request.send()));
        }
    }
    tasks
}

async fn assert_all_served(tasks: Vec<JoinHandle<Result<reqwest::Response, callshaper::Error>>>) {
    let outcomes = tokio::time::timeout(Duration::from_secs(60), common::join_all(tasks))
        .await
        .expect("no request hangs");
    for outcome in outcomes {
        assert_eq!(
            outcome.expect("every request gets a response").status(),
            200
        );
    }
}

/// Print what the vendor saw; the most in any second.
fn busiest(vendor: &Vendor, what: &str) -> usize {
    let busiest = vendor.max_in_any_window(SECOND);
    println!(
        "{what}: {} arrivals, at most {busiest} in any second, {} x 429",
        vendor.arrivals().len(),
        vendor.throttled()
    );
    busiest
}

fn assert_quota_held(vendor: &Vendor, what: &str) {
    let busiest = busiest(vendor, what);
    assert!(busiest <= 10, "{what}: {busiest} requests in one second");
    assert_eq!(vendor.throttled(), 0, "{what}: no 429");
}

/// True when one of `shaper`'s lanes is off the shared store.
fn off_store(shaper: &Shaper) -> bool {
    shaper
        .lanes()
        .iter()
        .any(|lane| lane.store != Some(StoreMode::Shared))
}

/// Three instances with `per` requests each; 1.5 s into the run, `fault`
/// is done to Redis; then every request must be served and the quota
/// held.
async fn survives(what: &str, per: usize, fault: impl AsyncFnOnce(&mut RedisServer)) {
    let mut redis = RedisServer::start();
    let vendor = Vendor::strict(10, SECOND).start().await;
    let shapers = fleet(&redis, &vendor, 3).await;
    let tasks = backlog(&shapers, &vendor, per);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    fault(&mut redis).await;
    // Watch 2 s: no lane stays off Redis longer than a probe interval
    // (200 ms) and a window (1 s).
    let mut off_since: Vec<Option<std::time::Instant>> = vec![None; shapers.len()];
    let mut longest = Duration::ZERO;
    let watch = std::time::Instant::now();
    while watch.elapsed() < 2 * SECOND {
        for (shaper, since) in shapers.iter().zip(&mut off_since) {
            match (off_store(shaper), *since) {
                (true, None) => *since = Some(std::time::Instant::now()),
                (false, Some(at)) => {
                    longest = longest.max(at.elapsed());
                    *since = None;
                }
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for at in off_since.into_iter().flatten() {
        longest = longest.max(at.elapsed());
    }
    println!("{what}: the longest a lane was off Redis: {longest:?}");
    assert!(
        longest <= Duration::from_millis(1_200),
        "{what}: off Redis for {longest:?}"
    );
    assert_all_served(tasks).await;
    assert_quota_held(&vendor, what);
}

/// Redis restarted mid-run (empty, as after a crash without persistence):
/// the lanes fall back to their share, come back, and nothing late goes
/// out at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_redis_never_lets_the_fleet_bunch() {
    survives("restart", 20, async |redis| redis.restart()).await;
}

/// Redis loses the fleet's state mid-run (`FLUSHALL`; the same as a
/// failover to a replica that missed the writes): slots already booked
/// must not be handed out again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_state_does_not_double_book() {
    survives("flushall", 15, async |redis| {
        redis.cli(&["flushall"]);
    })
    .await;
}

/// Redis stalls for 400 ms mid-run (stopped: connections open, no
/// answer, as a hung host or a long `DEBUG SLEEP` looks), longer than the
/// stores' 100 ms timeout, and then answers everything sent meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_never_lets_the_fleet_bunch() {
    survives("stall", 15, async |redis| {
        redis.freeze();
        tokio::time::sleep(Duration::from_millis(400)).await;
        redis.thaw();
    })
    .await;
}

/// Every instance's connection is killed mid-run (`CLIENT KILL`): they
/// reconnect, and the state in Redis is intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_never_let_the_fleet_bunch() {
    survives("client kill", 15, async |redis| {
        let killed = redis.cli(&["client", "kill", "type", "normal", "skipme", "yes"]);
        let killed: u32 = killed.trim().parse().unwrap();
        assert!(killed >= 3, "{killed} connections killed");
    })
    .await;
}

/// A number from `INFO`.
fn info(redis: &RedisServer, section: &str, field: &str) -> u64 {
    redis
        .cli(&["info", section])
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("INFO {section} has no {field}"))
}

/// Redis evicts the fleet's keys under memory pressure: `maxmemory` with
/// `volatile-ttl` (only keys with a TTL go, and callshaper's are the only
/// ones), then junk written until it evicts, then the junk deleted. An
/// evicted gate is detected as lost while its lanes are busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_state_does_not_double_book() {
    survives("eviction", 15, async |redis| {
        redis.cli(&["config", "set", "maxmemory-policy", "volatile-ttl"]);
        let limit = info(redis, "memory", "used_memory") + 200_000;
        redis.cli(&["config", "set", "maxmemory", &limit.to_string()]);
        // 64 KiB values: past the limit within a few, and every write
        // evicts.
        let junk = "x".repeat(64 * 1024);
        for i in 0..40 {
            redis.cli(&["set", &format!("junk:{i}"), &junk]);
        }
        let evicted = info(redis, "stats", "evicted_keys");
        assert!(evicted > 0, "Redis evicted none of the fleet's keys");
        for i in 0..40 {
            redis.cli(&["del", &format!("junk:{i}")]);
        }
    })
    .await;
}

/// Equal backlogs on three instances, request ids spread round robin over
/// them and submitted together (within 120 ms, 12 of the quota's 100 ms
/// intervals): the instances take turns, finish close together, and the
/// vendor serves the ids close to their order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_backlogs_share_the_quota_fairly() {
    let redis = RedisServer::start();
    let vendor = Vendor::strict(10, SECOND).start().await;
    let shapers = fleet(&redis, &vendor, 3).await;
    let started = std::time::Instant::now();
    let total = 60;
    // 2 ms apart: tasks spawned at once on a multi-thread runtime reach
    // their lanes in any order, and the test measures the fleet's order,
    // not the runtime's.
    let mut tasks = Vec::new();
    for i in 0..total {
        let request = shapers[i % 3].get(format!("{}/r/{i}", vendor.uri()));
        tasks.push(tokio::spawn(async move {
            let outcome = request.send().await;
            (i % 3, outcome, started.elapsed())
        }));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut finished = [Duration::ZERO; 3];
    for (instance, outcome, at) in common::join_all(tasks).await {
        assert_eq!(outcome.unwrap().status(), 200);
        finished[instance] = finished[instance].max(at);
    }
    assert_quota_held(&vendor, "fairness");
    let order = common::order(&vendor.arrivals());
    let inverted: usize = order
        .iter()
        .enumerate()
        .map(|(a, &first)| {
            order[a + 1..]
                .iter()
                .filter(|&&later| later < first)
                .count()
        })
        .sum();
    let pairs = total * (total - 1) / 2;
    let fraction = inverted as f64 / pairs as f64;
    let first = finished.iter().min().unwrap().as_secs_f64();
    let last = finished.iter().max().unwrap().as_secs_f64();
    println!(
        "fairness: instances finished at {finished:?}; {inverted} of {pairs} pairs out of order ({fraction:.3})"
    );
    assert!(last <= first * 1.10, "finished {finished:?}");
    assert!(fraction <= 0.05, "{fraction:.3} of pairs out of order");
}

/// A replica promoted after missing its master's last writes (stopped for
/// 300 ms, then its master killed): the lanes fall back to their share
/// while the cluster fails over (its node timeout, 2 s), then come back to
/// the promoted replica, whose state is 300 ms behind the fleet's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_promoted_after_missing_writes_never_lets_the_fleet_bunch() {
    let vendor = promoted("promoted replica", false).await;
    assert_quota_held(&vendor, "promoted replica");
}

/// The worst case of a lost-writes failover, which no marker can detect:
/// the replica that missed 300 ms of the fleet's writes takes over at once
/// (`CLUSTER FAILOVER TAKEOVER`), while the slots booked in what it missed
/// are still ahead. The store docs' bound ("Lost state"): at most one window of excess.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_taking_over_at_once_exceeds_by_one_window_at_most() {
    let vendor = promoted("takeover", true).await;
    let busiest = busiest(&vendor, "takeover");
    assert!(busiest <= 20, "takeover: {busiest} requests in one second");
}

/// Three instances with 25 requests each on a cluster with replicas; 1.5 s
/// in, the replica of the master holding the vendor's keys misses 300 ms of
/// writes and is promoted: after its master is killed, or at once
/// (`takeover`). Every request is served, and every lane is back on the
/// store within a probe and a window of the promotion, and stays there.
///
/// The fault is staged again (a fresh cluster, a fresh fleet), up to three
/// times, when the replica caught up before its promotion: on two busy
/// cores it can reconnect to its master as it wakes, ahead of the
/// takeover queued for it, and then nothing was lost to test.
async fn promoted(what: &str, takeover: bool) -> Vendor {
    for _ in 0..3 {
        if let Some(vendor) = staged(what, takeover).await {
            return vendor;
        }
        println!("{what}: the replica caught up before its promotion; staged again");
    }
    panic!("{what}: the replica caught up before its promotion in three tries");
}

/// One staging of [`promoted`]'s fault; `None` when the replica missed
/// nothing.
async fn staged(what: &str, takeover: bool) -> Option<Vendor> {
    let mut cluster = RedisCluster::with_replicas();
    let vendor = Vendor::strict(10, SECOND).start().await;
    let shapers = fleet_on(cluster.options(), &cluster.urls(), true, &vendor, 3).await;
    let tasks = backlog(&shapers, &vendor, 25);
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    // SCAN on a cluster node lists only the keys it holds (a replica too).
    let master = (0..cluster.nodes.len())
        .find(|&node| {
            cluster.is_master(node)
                && cluster.nodes[node]
                    .cli(&["--scan", "--pattern", "callshaper:*"])
                    .contains("callshaper:")
        })
        .expect("one master holds the vendor's keys");
    let replica = cluster
        .replica_of(master)
        .expect("the master has a replica");
    // The replica is stopped and its link cut, so it can neither receive
    // nor reconnect: what the fleet writes for the next 300 ms reaches the
    // master only.
    cluster.nodes[replica].freeze();
    let cut = cluster.nodes[master].cli(&["client", "kill", "type", "replica"]);
    assert_eq!(cut.trim(), "1", "the replica's link is cut");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let written = info(&cluster.nodes[master], "replication", "master_repl_offset");
    if takeover {
        // Asked while it is stopped, the takeover runs as it wakes, before
        // it reconnects to its master and catches up.
        std::thread::scope(|scope| {
            let node = &cluster.nodes[replica];
            let reply = scope.spawn(|| node.cli(&["cluster", "failover", "takeover"]));
            std::thread::sleep(Duration::from_millis(50));
            node.thaw();
            let reply = reply.join().expect("redis-cli");
            assert_eq!(reply.trim(), "OK", "{what}: CLUSTER FAILOVER TAKEOVER");
        });
    } else {
        cluster.nodes[master].kill();
        cluster.nodes[replica].thaw();
    }
    let fault = std::time::Instant::now();
    let kept = info(&cluster.nodes[replica], "replication", "master_repl_offset");
    println!(
        "{what}: {} bytes of the fleet's writes lost",
        written.saturating_sub(kept)
    );
    if kept >= written {
        for task in &tasks {
            task.abort();
        }
        return None;
    }
    let off = || shapers.iter().any(off_store);
    let mut left = false;
    while !cluster.is_master(replica) {
        assert!(
            fault.elapsed() < 15 * SECOND,
            "{what}: the replica was never promoted"
        );
        left |= off();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let promoted = fault.elapsed();
    assert!(
        takeover || left,
        "{what}: no lane noticed its master was gone"
    );
    // Back, and staying back: a lane whose calls keep failing on the
    // promoted cluster is off again at each probe.
    let mut back = Duration::ZERO;
    while fault.elapsed() < promoted + 3 * SECOND {
        if off() {
            back = fault.elapsed() - promoted;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        back <= Duration::from_millis(1_200),
        "{what}: a lane was off the store {back:?} after the promotion"
    );
    println!(
        "{what}: promoted {promoted:?} after the fault, every lane on the store {back:?} later"
    );
    assert_all_served(tasks).await;
    Some(vendor)
}
