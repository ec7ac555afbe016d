//! The Redis a team actually runs: TLS with a private CA and client
//! certificates, an ACL user allowed only what the fleet needs, two
//! deployments on one Redis under their own key prefixes, and Sentinel.
//! Every server is a real `redis-server` the test starts on a free
//! loopback port; the certificates are made with `openssl` at test time.
//!
//! `scripts/test` also runs the fleet suites (`tests/fleet.rs`,
//! `fleet_outages.rs`, `fleet_faults.rs`, `fleet_vendors.rs`) over TLS
//! (`CALLSHAPER_TEST_REDIS=tls`), with the same bounds.

mod common;

use std::time::{Duration, Instant};

use callshaper::store::{RedisOptions, RedisStore, StoreError, StoreFailure, StoreMode};
use callshaper::testing::{RedisSentinel, RedisServer, RetryAfter, TestCa, Vendor};
use callshaper::{Error, Shaper};
use common::SECOND;

use common::fleet_instance as instance;

/// `total` requests over `shapers` at once; every one served, none
/// refused by the vendor, at most 10 in any second, and at least `floor`
/// of the quota used.
async fn assert_fleet_holds(shapers: &[Shaper], vendor: &Vendor, total: usize, floor: f64) {
    let tasks: Vec<_> = (0..total)
        .map(|i| {
            tokio::spawn(
                shapers[i % shapers.len()]
                    .get(format!("{}/r/{i}", vendor.uri()))
                    .send(),
            )
        })
        .collect();
    for outcome in common::join_all(tasks).await {
        assert_eq!(outcome.expect("every request is served").status(), 200);
    }
    assert_eq!(vendor.throttled(), 0, "no 429 from the vendor");
    assert!(vendor.max_in_any_window(SECOND) <= 10);
    let arrivals = vendor.arrivals();
    let span = arrivals[arrivals.len() - 1].at - arrivals[0].at;
    let used = (arrivals.len() - 1) as f64 / (span.as_secs_f64() * 10.0);
    println!(
        "{} requests in {span:?}: {:.1} % of the quota",
        arrivals.len(),
        used * 100.0
    );
    assert!(used >= floor, "used {used:.3} of the quota");
}

fn lane_mode(shaper: &Shaper) -> Option<StoreMode> {
    shaper.lanes().first().and_then(|lane| lane.store)
}

// --- TLS -----------------------------------------------------------------

/// Three instances over mutual TLS (the server asks every client for a
/// certificate), trusting only the test's own CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_shares_its_quota_over_mutual_tls() {
    let redis = RedisServer::start_tls();
    assert!(redis.url().starts_with("rediss://"));
    let vendor = Vendor::strict(10, SECOND).start().await;
    let mut shapers = Vec::new();
    for _ in 0..3 {
        let store = redis.options().connect(&redis.url()).await.unwrap();
        shapers.push(instance(store, StoreFailure::Closed));
    }
    assert_fleet_holds(&shapers, &vendor, 40, 0.9).await;
    for shaper in &shapers {
        assert_eq!(lane_mode(shaper), Some(StoreMode::Shared));
    }
}

/// A CA the store does not trust, no client certificate where the server
/// asks for one, or TLS asked of a plain URL: each is a `StoreError::Tls`
/// at connect, saying what is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_tls_refuses_is_a_clear_tls_error() {
    let redis = RedisServer::start_tls();
    let ca = redis.tls().unwrap();
    let other = TestCa::new();
    let untrusted = RedisStore::options()
        .ca_roots(other.ca_pem())
        .client_certificate(ca.client_pem(), ca.client_key_pem())
        .connect(&redis.url())
        .await
        .map(|_| ())
        .unwrap_err();
    match &untrusted {
        StoreError::Tls(message) => assert!(
            message.contains("certificate"),
            "the error says it is the certificate: {message}"
        ),
        other => panic!("an untrusted CA: expected StoreError::Tls, got {other:?}"),
    }
    println!("untrusted CA: {untrusted}");

    let no_client_certificate = RedisStore::options()
        .ca_roots(ca.ca_pem())
        .connect(&redis.url())
        .await
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(no_client_certificate, StoreError::Tls(_)),
        "no client certificate: {no_client_certificate:?}"
    );
    println!("no client certificate: {no_client_certificate}");

    let plain = format!("redis://127.0.0.1:{}", redis.port);
    let error = RedisStore::options()
        .ca_roots(ca.ca_pem())
        .connect(&plain)
        .await
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(&error, StoreError::Tls(message) if message.contains("rediss://")),
        "{error:?}"
    );

    let garbage = RedisStore::options()
        .ca_roots(b"not a certificate".to_vec())
        .connect(&redis.url())
        .await
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(&garbage, StoreError::Tls(message) if message.contains("PEM")),
        "{garbage:?}"
    );
}

/// The server's certificate is rotated to one from a CA the fleet does not
/// trust: the fail-closed lane refuses with the TLS error, the fail-open
/// one serves at its share, and neither hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_the_fleet_does_not_trust_follows_the_failure_policy() {
    let mut redis = RedisServer::start_tls();
    let vendor = Vendor::strict(10, SECOND).start().await;
    let options = || {
        redis
            .options()
            .fleet_size(2)
            .timeout(Duration::from_millis(200))
            .probe_every(Duration::from_millis(200))
    };
    let open = instance(
        options().connect(&redis.url()).await.unwrap(),
        StoreFailure::Open,
    );
    let closed = instance(
        options().connect(&redis.url()).await.unwrap(),
        StoreFailure::Closed,
    );
    for shaper in [&open, &closed] {
        let response = shaper.get(format!("{}/warm", vendor.uri())).send().await;
        assert_eq!(response.unwrap().status(), 200);
    }

    redis.reissue();
    // The first call after the restart meets the dropped connection; the
    // probes after it meet the new certificate, and say so.
    let started = Instant::now();
    let mut causes = Vec::new();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no TLS error within 5 s: {causes:?}"
        );
        match closed.get(format!("{}/closed", vendor.uri())).send().await {
            Ok(response) => assert_eq!(response.status(), 200),
            Err(Error::StoreUnavailable {
                source: StoreError::Tls(message),
                ..
            }) => {
                println!("fail-closed after the rotation: {message}");
                break;
            }
            Err(Error::StoreUnavailable { source, .. }) => causes.push(source),
            Err(other) => panic!("fail-closed: expected StoreUnavailable, got {other}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let tasks: Vec<_> = (0..5)
        .map(|i| tokio::spawn(open.get(format!("{}/open/{i}", vendor.uri())).send()))
        .collect();
    for outcome in common::join_all(tasks).await {
        assert_eq!(outcome.unwrap().status(), 200, "fail-open keeps serving");
    }
    assert_eq!(lane_mode(&open), Some(StoreMode::Fallback));
    assert_eq!(vendor.throttled(), 0);
}

// --- ACL -----------------------------------------------------------------

/// The rule the README gives for a fleet's user on a standalone Redis (a
/// cluster adds `+cluster|slots +readonly +readwrite`), under the default
/// prefix.
const FLEET_RULE: &[&str] = &[
    "resetkeys",
    "~callshaper:*",
    "resetchannels",
    "&callshaper:*",
    "-@all",
    "+evalsha",
    "+script|load",
    "+subscribe",
    "+ping",
    "+exists",
    "+hexists",
    "+hget",
    "+hmget",
    "+hset",
    "+pexpire",
    "+pttl",
    "+publish",
    "+time",
];

/// `user` with password `secret`, allowed the fleet rule less `without`.
fn add_user(redis: &RedisServer, user: &str, without: &[&str]) -> String {
    let mut args = vec!["ACL", "SETUSER", user, "reset", "on", ">secret"];
    args.extend(FLEET_RULE.iter().filter(|rule| !without.contains(rule)));
    let reply = redis.cli(&args);
    assert!(reply.starts_with("OK"), "ACL SETUSER: {reply}");
    format!("redis://{user}:secret@127.0.0.1:{}", redis.port)
}

/// Three instances as a user allowed only the fleet rule: the quota holds,
/// and a 429 one of them sees pauses all (the pause script publishes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_runs_as_a_user_allowed_only_what_it_needs() {
    let redis = RedisServer::start();
    let url = add_user(&redis, "fleet", &[]);
    let vendor = Vendor::strict(10, SECOND).start().await;
    let mut shapers = Vec::new();
    for _ in 0..3 {
        let store = redis.options().connect(&url).await.unwrap();
        shapers.push(instance(store, StoreFailure::Closed));
    }
    let throttle = {
        let vendor = vendor.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            vendor.throttle_for(Duration::from_millis(150), RetryAfter::Seconds(2));
        })
    };
    let tasks: Vec<_> = (0..40)
        .map(|i| tokio::spawn(shapers[i % 3].get(format!("{}/r/{i}", vendor.uri())).send()))
        .collect();
    for outcome in common::join_all(tasks).await {
        assert_eq!(outcome.expect("every request is served").status(), 200);
    }
    throttle.await.unwrap();
    assert_eq!(
        vendor.throttled(),
        1,
        "one instance saw the 429, the pause held the rest"
    );
    assert!(vendor.max_in_any_window(SECOND) <= 10);
    for shaper in &shapers {
        assert_eq!(lane_mode(shaper), Some(StoreMode::Shared));
    }
}

/// A user missing a command the scripts run, or the pause channel, cannot
/// connect, and the error names what is missing; a permission taken away
/// after connecting fails the request with the typed error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_missing_a_permission_is_told_which() {
    let redis = RedisServer::start();
    let vendor = Vendor::strict(10, SECOND).start().await;

    for (user, missing, command) in [
        ("no-hset", "+hset", "hset"),
        ("no-publish", "+publish", "publish"),
        ("no-time", "+time", "time"),
        ("no-evalsha", "+evalsha", "evalsha"),
    ] {
        let url = add_user(&redis, user, &[missing]);
        match redis.options().connect(&url).await.map(|_| ()) {
            Err(StoreError::NotPermitted {
                command: named,
                message,
            }) => {
                assert_eq!(named, command, "{message}");
                println!("without {missing}: {message}");
            }
            other => panic!("without {missing}: expected NotPermitted, got {other:?}"),
        }
    }

    // A wrong password is refused as such.
    let url = add_user(&redis, "fleet", &[]).replace(":secret@", ":wrong@");
    match redis.options().connect(&url).await.map(|_| ()) {
        Err(StoreError::Auth(message)) => println!("a wrong password: {message}"),
        other => panic!("a wrong password: expected StoreError::Auth, got {other:?}"),
    }

    // Taken away after the store connected: the request fails with the
    // typed error, on the fail-closed lane.
    let url = add_user(&redis, "revoked", &[]);
    let store = redis.options().connect(&url).await.unwrap();
    let shaper = instance(store, StoreFailure::Closed);
    let reply = redis.cli(&["ACL", "SETUSER", "revoked", "-hset"]);
    assert!(reply.starts_with("OK"), "{reply}");
    match shaper.get(vendor.uri()).send().await {
        Err(Error::StoreUnavailable {
            source: StoreError::NotPermitted { command, message },
            ..
        }) => {
            println!("revoked: `{command}`: {message}");
        }
        other => panic!("revoked: expected NotPermitted, got {other:?}"),
    }

    let url = add_user(&redis, "no-channel", &["&callshaper:*"]);
    match redis.options().connect(&url).await.map(|_| ()) {
        Err(StoreError::NotPermitted { command, message }) => {
            // The check runs the scripts' `PUBLISH` on the channel.
            assert_eq!(command, "publish", "{message}");
            assert!(message.contains("callshaper:pauses"), "{message}");
            println!("without the channel: {message}");
        }
        other => panic!("expected NotPermitted, got {other:?}"),
    }
    assert!(vendor.arrivals().is_empty(), "nothing was sent unshaped");
}

// --- Key prefix ----------------------------------------------------------

/// Two deployments on one Redis, each with its own prefix and its own
/// vendor account at 10/s: each uses its own quota in full, each one's
/// keys are under its prefix, and none is under the default. (The two
/// vendors are on different ports, so their lanes' keys differ anyway:
/// the scan of the keys is what fails if a prefix is ignored.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_under_their_own_prefix_keep_their_own_quotas() {
    let redis = RedisServer::start();
    let deploy = |prefix: &'static str| {
        let options: RedisOptions = redis.options().prefix(prefix);
        let url = redis.url();
        async move {
            let vendor = Vendor::strict(10, SECOND).start().await;
            let store = options.connect(&url).await.unwrap();
            let shapers = [
                instance(store.clone(), StoreFailure::Closed),
                instance(store, StoreFailure::Closed),
            ];
            assert_fleet_holds(&shapers, &vendor, 30, 0.9).await;
        }
    };
    let staging = tokio::spawn(deploy("staging:"));
    let production = tokio::spawn(deploy("production:"));
    staging.await.unwrap();
    production.await.unwrap();
    for prefix in ["staging:", "production:"] {
        let keys = redis.cli(&["--scan", "--pattern", &format!("{prefix}*")]);
        assert!(!keys.trim().is_empty(), "no key under {prefix}");
    }
    let default = redis.cli(&["--scan", "--pattern", "callshaper:*"]);
    assert!(
        default.trim().is_empty(),
        "keys outside the prefixes: {default}"
    );
}

// --- Sentinel --------------------------------------------------------------

/// The master is killed: the sentinel promotes the replica a second or two
/// later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_after_a_crash_keeps_the_quota() {
    failover_under_load(RedisSentinel::start(1), true).await;
}

/// Three sentinels, a quorum of two: they agree on the master's death and
/// elect one of them to promote the replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_agreed_by_three_sentinels_keeps_the_quota() {
    let deployment = RedisSentinel::start(3);
    assert_eq!(deployment.urls().len(), 3);
    failover_under_load(deployment, true).await;
}

/// The same over mutual TLS, every process, with a password on the master
/// and its replica: the store reaches the new master with the same
/// certificates and password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_over_tls_with_a_password_keeps_the_quota() {
    let deployment = RedisSentinel::secured(1, "sentinel-test-secret");
    assert!(deployment.urls()[0].starts_with("rediss://"));
    // Without the password the master refuses the store.
    let refused = RedisStore::options()
        .sentinel(deployment.urls(), deployment.service())
        .await
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(refused, StoreError::Tls(_)), "{refused:?}");
    let no_password = deployment.nodes[0]
        .options()
        .sentinel(deployment.urls(), deployment.service())
        .await
        .map(|_| ())
        .unwrap_err();
    println!("without the password: {no_password}");
    assert!(
        matches!(&no_password, StoreError::Auth(message) if message.contains("NOAUTH")),
        "{no_password:?}"
    );
    failover_under_load(deployment, true).await;
}

/// An operator's `SENTINEL FAILOVER`: the old master keeps running as a
/// replica, so the fleet's connections to it stay open and meet
/// `READONLY`, not a closed socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_switchover_keeps_the_quota() {
    failover_under_load(RedisSentinel::start(1), false).await;
}

/// Three fail-open instances follow the master a Sentinel names, with 25
/// requests each; 1.5 s in, the master is killed (`crash`) or demoted by
/// `SENTINEL FAILOVER`. Every request is served, the vendor sees at most
/// 10 in any second and no 429, and no lane is off the store for longer
/// than a probe interval and a call after the new master is announced
/// (twice that, for a loaded machine's late timers).
async fn failover_under_load(mut deployment: RedisSentinel, crash: bool) {
    assert_eq!(deployment.master(), Some(0));
    let vendor = Vendor::strict(10, SECOND).start().await;
    let probe = Duration::from_millis(200);
    let timeout = Duration::from_millis(100);
    let mut shapers = Vec::new();
    for _ in 0..3 {
        let store = deployment
            .options()
            .fleet_size(3)
            .timeout(timeout)
            .probe_every(probe)
            .sentinel(deployment.urls(), deployment.service())
            .await
            .unwrap();
        let shaper = instance(store, StoreFailure::Open);
        let warm = shaper.get(format!("{}/warm", vendor.uri())).send().await;
        assert_eq!(warm.unwrap().status(), 200);
        shapers.push(shaper);
    }
    let tasks: Vec<_> = (0..75)
        .map(|i| tokio::spawn(shapers[i % 3].get(format!("{}/r/{i}", vendor.uri())).send()))
        .collect();
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    if crash {
        deployment.nodes[0].kill();
    } else {
        let reply = deployment.failover();
        assert!(reply.starts_with("OK"), "SENTINEL FAILOVER: {reply}");
    }
    let killed = Instant::now();
    let off = || {
        shapers
            .iter()
            .any(|s| lane_mode(s) != Some(StoreMode::Shared))
    };
    let mut left = false;
    while deployment.master() != Some(1) {
        assert!(
            killed.elapsed() < 15 * SECOND,
            "the sentinel never promoted the replica"
        );
        left |= off();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let announced = killed.elapsed();
    assert!(!crash || left, "no lane noticed its master was gone");
    let mut back = Duration::ZERO;
    while killed.elapsed() < announced + 3 * SECOND {
        if off() {
            back = killed.elapsed() - announced;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "{}: promoted {announced:?} after the fault, every lane on the store {back:?} later",
        if crash { "crash" } else { "switchover" }
    );
    assert!(
        back <= 2 * (probe + timeout),
        "a lane was off the store {back:?} after the new master was announced"
    );
    let outcomes = tokio::time::timeout(Duration::from_secs(60), common::join_all(tasks))
        .await
        .expect("no request hangs");
    for outcome in outcomes {
        assert_eq!(outcome.expect("every request is served").status(), 200);
    }
    let busiest = vendor.max_in_any_window(SECOND);
    println!(
        "{} arrivals, at most {busiest} in any second, {} x 429",
        vendor.arrivals().len(),
        vendor.throttled()
    );
    assert!(busiest <= 10, "{busiest} in one second");
    assert_eq!(vendor.throttled(), 0);
}

/// On a Redis Cluster, the rule and `+cluster|slots +readonly +readwrite`
/// (the slot map, and the flags redis-rs sets on each connection): the
/// fleet holds the quota as that user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_on_a_cluster_runs_as_that_user_too() {
    let cluster = callshaper::testing::RedisCluster::start();
    let mut urls = Vec::new();
    for node in &cluster.nodes {
        let url = add_user(node, "fleet", &[]);
        let reply = node.cli(&[
            "ACL",
            "SETUSER",
            "fleet",
            "+cluster|slots",
            "+readonly",
            "+readwrite",
        ]);
        assert!(reply.starts_with("OK"), "{reply}");
        urls.push(url.replacen("redis://", &format!("{}://", scheme(&node.url())), 1));
    }
    let vendor = Vendor::strict(10, SECOND).start().await;
    let mut shapers = Vec::new();
    for _ in 0..2 {
        let store = cluster.options().cluster(&urls).await.unwrap();
        shapers.push(instance(store, StoreFailure::Closed));
    }
    assert_fleet_holds(&shapers, &vendor, 30, 0.9).await;
}

fn scheme(url: &str) -> &str {
    url.split_once("://").map_or("redis", |(scheme, _)| scheme)
}

/// `[store] sentinels` and `service` in a file reach the same store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_file_follows_a_sentinel_too() {
    let deployment = RedisSentinel::start(1);
    let vendor = Vendor::strict(10, SECOND).start().await;
    let sentinels: Vec<String> = deployment
        .urls()
        .iter()
        .map(|url| format!("\"{url}\""))
        .collect();
    let file = format!(
        "[defaults]\nquotas = [{{ algorithm = \"leaky_bucket\", count = 10, per = \"1s\" }}]\n\
         [store]\nsentinels = [{}]\nservice = \"{}\"\n",
        sentinels.join(", "),
        deployment.service()
    );
    let config = callshaper::config::ShaperConfig::from_toml(&file).unwrap();
    let shaper = config.connect().await.unwrap().build().unwrap();
    let response = shaper.get(vendor.uri()).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(lane_mode(&shaper), Some(StoreMode::Shared));
}

/// Hostile numbers in the options: `Duration::MAX` timeouts connect and
/// serve (no overflow inside redis-rs or tokio), `u32::MAX` instances and
/// a zero batch are held to what works, and zero timeouts (held to 1 ms,
/// a timer tick) end in a typed outcome at once, never a hang: served, or
/// refused with `Timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_store_options_saturate_or_fail_typed() {
    let redis = RedisServer::start();
    let vendor = Vendor::strict(10, SECOND).start().await;
    let huge = redis
        .options()
        .timeout(Duration::MAX)
        .connect_timeout(Duration::MAX)
        .probe_every(Duration::MAX)
        .horizon(Duration::MAX)
        .fleet_size(u32::MAX)
        .batch(0)
        .connect(&redis.url())
        .await
        .unwrap();
    let shaper = instance(huge, StoreFailure::Closed);
    let response = shaper.get(vendor.uri()).send().await.unwrap();
    assert_eq!(response.status(), 200);

    let started = Instant::now();
    let connected = redis
        .options()
        .connect_timeout(Duration::ZERO)
        .timeout(Duration::ZERO)
        .connect(&redis.url())
        .await;
    assert!(started.elapsed() < SECOND, "{:?}", started.elapsed());
    match connected {
        Err(StoreError::Timeout(_)) => {}
        Err(other) => panic!("a zero connect timeout: expected Timeout, got {other:?}"),
        Ok(store) => {
            let shaper = instance(store, StoreFailure::Closed);
            let outcome = tokio::time::timeout(5 * SECOND, shaper.get(vendor.uri()).send())
                .await
                .expect("a zero timeout never hangs");
            match outcome {
                Ok(response) => assert_eq!(response.status(), 200),
                Err(Error::StoreUnavailable {
                    source: StoreError::Timeout(_),
                    ..
                }) => {}
                Err(other) => panic!("a zero call timeout: expected Timeout, got {other}"),
            }
        }
    }
    assert_eq!(vendor.throttled(), 0);
}
