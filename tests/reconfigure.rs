//! Quotas changed on a running shaper, under load: queues, pauses and
//! order survive, and the next release follows the new quotas with neither
//! a burst nor a gap.

mod common;

use std::time::Duration;

use callshaper::config::ShaperConfig;
use callshaper::testing::{RetryAfter, Vendor};
use callshaper::{Quota, Shaper};
use common::{SECOND, join_all, order, shaper};
use tokio::time::Instant;

/// Spawn `n` GETs to `{base}/r/{i}` in order.
fn spawn_burst(
    shaper: &Shaper,
    base: &str,
    n: usize,
) -> Vec<tokio::task::JoinHandle<Result<reqwest::Response, callshaper::Error>>> {
    (0..n)
        .map(|i| tokio::spawn(shaper.get(format!("{base}/r/{i}")).send()))
        .collect()
}

/// The gaps between consecutive arrivals, from `from` on.
fn gaps(vendor: &Vendor, from: usize) -> Vec<Duration> {
    let arrivals = vendor.arrivals();
    arrivals[from..]
        .windows(2)
        .map(|w| w[1].at - w[0].at)
        .collect()
}

/// 100 queued at 10/s against a vendor allowing 20/s; at 2 s the plan
/// goes to 20/s. The queue drains at the new pace from the next release,
/// in order, without a 429.
#[tokio::test(start_paused = true)]
async fn a_raised_quota_speeds_the_queue_from_the_next_release() {
    let vendor = Vendor::strict(20, SECOND).start().await;
    let shaper = shaper(10).build().unwrap();
    let started = Instant::now();
    let tasks = spawn_burst(&shaper, &vendor.uri(), 100);
    tokio::time::sleep(2 * SECOND).await;
    let before = vendor.arrivals().len();
    assert_eq!(before, 20, "20 at 10/s in the first 2 s");
    shaper
        .set_quotas([Quota::leaky_bucket(20, SECOND)])
        .unwrap();

    for outcome in join_all(tasks).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    assert_eq!(vendor.throttled(), 0);
    assert_eq!(order(&vendor.arrivals()), (0..100).collect::<Vec<_>>());
    let after = gaps(&vendor, before);
    assert!(
        after.iter().all(|gap| *gap >= Duration::from_millis(50)),
        "{after:?}"
    );
    // The first release after the change waits the new interval from the
    // last one before it, not the old: no gap either.
    let first = vendor.arrivals()[before].at - vendor.arrivals()[before - 1].at;
    assert!(first <= Duration::from_millis(100), "{first:?}");
    let took = started.elapsed();
    assert!(
        took <= Duration::from_millis(6_100),
        "80 more at 20/s: {took:?}"
    );
}

/// Lowered under load, and while the vendor's pause is in force: the
/// pause holds, and the queue then drains at the new pace.
#[tokio::test(start_paused = true)]
async fn a_lowered_quota_keeps_the_pause_and_slows_the_queue() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let shaper = shaper(10).build().unwrap();
    let tasks = spawn_burst(&shaper, &vendor.uri(), 30);
    tokio::time::sleep(SECOND).await;
    vendor.throttle_for(Duration::from_millis(50), RetryAfter::Seconds(3));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let paused = shaper.lanes()[0].paused_for.expect("paused by the 429");
    shaper.set_quotas([Quota::leaky_bucket(5, SECOND)]).unwrap();
    let lane = &shaper.lanes()[0];
    assert_eq!(lane.paused_for, Some(paused), "the pause stays as it was");
    // 1 s and 5 ms of headroom, over 5.
    assert_eq!(lane.interval, Duration::from_millis(201));

    for outcome in join_all(tasks).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    let arrivals = vendor.arrivals();
    assert_eq!(vendor.throttled(), 1);
    let throttled = arrivals.iter().position(|a| a.status == 429).unwrap();
    let resumed = arrivals[throttled + 1].at - arrivals[throttled].at;
    assert!(
        resumed >= 3 * SECOND,
        "no request during the pause: {resumed:?}"
    );
    let after = gaps(&vendor, throttled + 1);
    assert!(
        after.iter().all(|gap| *gap >= Duration::from_millis(200)),
        "{after:?}"
    );
    let mut expected: Vec<usize> = (0..30).collect();
    let again = order(&arrivals)[throttled];
    expected.insert(throttled + 1, again);
    assert_eq!(order(&arrivals), expected, "FIFO, the throttled one first");
}

/// The algorithm itself changes under load (a leaky bucket becomes a
/// sliding log of the same 10/s): the new meter counts the lane's own
/// releases of the last second, so it allows no burst at the change.
#[tokio::test(start_paused = true)]
async fn a_new_algorithm_counts_the_releases_before_it() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let shaper = shaper(10).build().unwrap();
    let tasks = spawn_burst(&shaper, &vendor.uri(), 40);
    tokio::time::sleep(Duration::from_millis(1_550)).await;
    shaper.set_quotas([Quota::sliding_log(10, SECOND)]).unwrap();
    for outcome in join_all(tasks).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    assert_eq!(vendor.throttled(), 0);
    assert!(vendor.max_in_any_window(SECOND) <= 10);
}

/// The largest cost a request may have follows a live change, in the
/// lane made before it and in a lane made after: raised, a request the
/// old quota refused at the door goes; lowered again, it is refused.
#[tokio::test(start_paused = true)]
async fn the_largest_cost_follows_a_live_change() {
    use callshaper::Error;
    use callshaper::route::{LaneKey, Level};

    let vendor = Vendor::strict(10, SECOND).start().await;
    let quotas = |tokens| {
        let per_minute = Quota::sliding_log(tokens, 60 * SECOND).per_cost();
        [Quota::leaky_bucket(10, SECOND), per_minute]
    };
    let [requests, tokens] = quotas(100);
    let shaper = Shaper::builder()
        .quota(requests)
        .quota(tokens)
        .level(Level::new(
            "tenant",
            LaneKey::Tag,
            [Quota::leaky_bucket(5, SECOND)],
        ))
        .build()
        .unwrap();
    let send = |tenant: &str| shaper.get(vendor.uri()).tag(tenant).cost(150).send();
    let refused = |sent: Result<reqwest::Response, Error>| match sent {
        Err(Error::CostTooHigh { cost, capacity, .. }) => (cost, capacity) == (150, 100),
        _ => false,
    };
    assert!(
        refused(send("before").await),
        "over the 100 tokens a minute"
    );
    shaper.set_quotas(quotas(200)).unwrap();
    for tenant in ["before", "after"] {
        let sent = send(tenant).await.expect("within 200 tokens a minute");
        assert_eq!(sent.status(), 200, "{tenant}");
    }
    shaper.set_quotas(quotas(100)).unwrap();
    for tenant in ["before", "after", "later"] {
        assert!(refused(send(tenant).await), "{tenant}: over 100 again");
    }
    assert_eq!(vendor.arrivals().len(), 2);
}

/// Bad changes are refused with the field named, and change nothing.
#[tokio::test(start_paused = true)]
async fn a_bad_change_is_refused_and_changes_nothing() {
    let shaper = shaper(10).build().unwrap();
    let unknown = shaper.set_level_quotas("tenant", [Quota::leaky_bucket(1, SECOND)]);
    assert_eq!(unknown.unwrap_err().field, "levels.tenant");
    let zero = shaper.set_quotas([Quota::leaky_bucket(0, SECOND)]);
    assert_eq!(zero.unwrap_err().field, "levels.vendor.quotas[0].count");
    let none = shaper.set_quotas([]);
    assert_eq!(none.unwrap_err().field, "levels.vendor.quotas");
    let vendor = Vendor::strict(10, SECOND).start().await;
    assert_eq!(shaper.get(vendor.uri()).send().await.unwrap().status(), 200);
    assert_eq!(shaper.lanes()[0].interval, Duration::from_micros(100_500));
}

/// A config file reloaded on the running shaper: the new quotas apply; a
/// file with a vendor the shaper does not have changes nothing.
#[tokio::test(start_paused = true)]
async fn a_config_file_reloads_its_quotas() {
    let vendor = Vendor::strict(20, SECOND).start().await;
    let host = vendor.uri().replace("http://", "");
    let file = |count: u32, extra: &str| {
        format!(
            "[vendors.api]\nhost = \"{host}\"\nquotas = [{{ algorithm = \"leaky_bucket\", count = {count}, per = \"1s\" }}]\n{extra}"
        )
    };
    let shaper = ShaperConfig::from_toml(&file(10, ""))
        .unwrap()
        .builder()
        .unwrap()
        .transport(callshaper::testing::HoldClock(reqwest::Client::new()))
        .build()
        .unwrap();
    assert_eq!(shaper.get(vendor.uri()).send().await.unwrap().status(), 200);
    let interval = || shaper.lanes()[0].interval;
    assert_eq!(interval(), Duration::from_micros(100_500));

    ShaperConfig::from_toml(&file(20, ""))
        .unwrap()
        .reload(&shaper)
        .unwrap();
    assert_eq!(interval(), Duration::from_micros(50_250));

    let grown = file(
        5,
        "[vendors.other]\nhost = \"other.example\"\nquotas = [{ algorithm = \"leaky_bucket\", count = 1, per = \"1s\" }]\n",
    );
    let refused = ShaperConfig::from_toml(&grown).unwrap().reload(&shaper);
    assert_eq!(refused.unwrap_err().field, "vendors.other");
    assert_eq!(interval(), Duration::from_micros(50_250), "nothing changed");
}

/// A reload's refusal names the file's path, not the running shaper's
/// level: a vendor's level is `vendors.llm.levels[0]`, which the user can
/// find in the file; `levels.llm.tenant` is nowhere in it.
#[tokio::test(start_paused = true)]
async fn a_reload_names_the_files_path() {
    let file = |levels: &str| {
        format!(
            "[vendors.llm]\nhost = \"llm.example\"\nquotas = [{{ algorithm = \"leaky_bucket\", count = 10, per = \"1s\" }}]\n{levels}"
        )
    };
    let tenant = "[[vendors.llm.levels]]\nname = \"tenant\"\nkey = \"tag\"\nquotas = [{ algorithm = \"leaky_bucket\", count = 2, per = \"1s\" }]\n";
    let shaper = ShaperConfig::from_toml(&file("")).unwrap().build().unwrap();
    let refused = ShaperConfig::from_toml(&file(tenant))
        .unwrap()
        .reload(&shaper)
        .unwrap_err();
    assert_eq!(refused.field, "vendors.llm.levels[0]", "{refused}");
    assert!(refused.problem.contains("no such level"), "{refused}");

    let shaper = ShaperConfig::from_toml(&file(tenant))
        .unwrap()
        .build()
        .unwrap();
    let defaults =
        "[defaults]\nquotas = [{ algorithm = \"leaky_bucket\", count = 5, per = \"1s\" }]\n";
    let refused = ShaperConfig::from_toml(&format!("{defaults}{}", file(tenant)))
        .unwrap()
        .reload(&shaper)
        .unwrap_err();
    assert_eq!(refused.field, "defaults", "{refused}");
    ShaperConfig::from_toml(&file(tenant))
        .unwrap()
        .reload(&shaper)
        .unwrap();
}

/// With a shared store the quotas live in it for the whole fleet: a live
/// change on one instance is refused.
#[tokio::test]
async fn a_shared_store_refuses_a_live_change() {
    use callshaper::testing::RedisServer;

    let redis = RedisServer::start();
    let store = redis.options().connect(&redis.url()).await.unwrap();
    let shaper = Shaper::builder()
        .rate(10, SECOND)
        .store(store)
        .build()
        .unwrap();
    let refused = shaper.set_quotas([Quota::leaky_bucket(20, SECOND)]);
    assert_eq!(refused.unwrap_err().field, "levels.vendor.quotas");
}

/// Adaptive pacing's ceiling follows a live quota change: a lane slowed
/// by a bare 429 to a share of 10/s keeps that share of 20/s once raised,
/// so its pace halves (it would stay where it was if the vendor's model
/// kept the old ceiling).
#[tokio::test(start_paused = true)]
async fn a_raised_quota_raises_adaptive_pacings_ceiling() {
    let server = common::answering_once(wiremock::ResponseTemplate::new(429)).await;
    let shaper = shaper(10)
        .adaptive(callshaper::lane::Adaptive::default())
        .build()
        .unwrap();
    let response = shaper.get(server.uri()).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let slowed = shaper.lanes()[0].interval;
    assert!(
        slowed > SECOND / 10,
        "{slowed:?}: cut below the declared 10/s"
    );
    shaper
        .set_quotas([Quota::leaky_bucket(20, SECOND)])
        .unwrap();
    let raised = shaper.lanes()[0].interval;
    let ratio = raised.as_secs_f64() / slowed.as_secs_f64();
    assert!((0.45..0.55).contains(&ratio), "{slowed:?} then {raised:?}");
}
