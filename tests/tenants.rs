//! Many tenants: a lane per key, found on a sharded map, dropped by one
//! sweeper when idle, and held to `max_lanes`, without ever forgetting a
//! quota a key has spent. The transport answers at once, without a
//! socket, so tokio's paused clock measures the lanes alone.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use callshaper::route::{LaneKey, Level};
use callshaper::shaper::{BoxFuture, Transport};
use callshaper::{Error, Quota, Shaper};
use reqwest::{Request, Response};
use tokio::time::Instant;

/// Answers every attempt at once, and notes when each tenant's went.
#[derive(Clone, Default)]
struct Recording(Arc<Mutex<HashMap<String, Vec<Instant>>>>);

impl Transport for Recording {
    fn send(&self, request: Request) -> BoxFuture<reqwest::Result<Response>> {
        let tenant = request.url().path().trim_start_matches('/').to_owned();
        self.0
            .lock()
            .unwrap()
            .entry(tenant)
            .or_default()
            .push(Instant::now());
        Box::pin(async { Ok(Response::from(http::Response::new(""))) })
    }
}

/// A shaper with a lane per tenant (`tag`), each at `per_tenant`, under a
/// vendor quota far above the load.
fn tenants(per_tenant: Quota, transport: Recording) -> callshaper::shaper::ShaperBuilder {
    Shaper::builder()
        .quota(Quota::leaky_bucket(1_000_000_000, Duration::from_secs(1)))
        .level(Level::new("tenant", LaneKey::Tag, [per_tenant]))
        .transport(transport)
}

async fn call(shaper: &Shaper, tenant: &str) -> Result<Response, Error> {
    shaper
        .get(format!("http://vendor.test/{tenant}"))
        .tag(tenant)
        .send()
        .await
}

/// A call of `tenant` that may wait a second at most, which a spent quota
/// refuses at once.
async fn refused_within_a_second(shaper: &Shaper, tenant: &str) {
    let answer = shaper
        .get(format!("http://vendor.test/{tenant}"))
        .tag(tenant)
        .max_wait(Duration::from_secs(1))
        .send()
        .await;
    assert!(
        matches!(answer, Err(Error::WouldExceedMaxWait { .. })),
        "{answer:?}"
    );
}

/// A shaper whose tenants, each at `per_tenant`, go a second after they go
/// quiet.
fn quickly_quiet(per_tenant: Quota) -> Shaper {
    tenants(per_tenant, Recording::default())
        .idle_timeout(Duration::from_secs(1))
        .build()
        .unwrap()
}

/// An idle timeout past 20 days (a lane tells its quiet within 24.8 days:
/// its last release is kept to the millisecond in 32 bits) lets its lanes
/// go after 20 days, not never (and within an eighth more, the sweeper's
/// least wait); a lane that goes loses nothing.
#[tokio::test(start_paused = true)]
async fn an_idle_timeout_past_20_days_lets_lanes_go_after_20_days() {
    let shaper = tenants(
        Quota::leaky_bucket(10, Duration::from_secs(1)),
        Recording::default(),
    )
    .idle_timeout(Duration::MAX)
    .build()
    .unwrap();
    call(&shaper, "a").await.unwrap();
    let longest = Duration::from_secs(20 * 86_400);
    tokio::time::sleep(longest - Duration::from_secs(1)).await;
    assert_eq!(shaper.live_lanes(), 1);
    tokio::time::sleep(longest / 8 + Duration::from_secs(2)).await;
    assert_eq!(shaper.live_lanes(), 0);
    call(&shaper, "a").await.unwrap();
}

/// 64 tasks over 100,000 keys while idle lanes are swept away a few
/// milliseconds after they go quiet and the cap evicts more: a key's lane
/// is never taken from under a request about to use it, nor dropped while
/// its quota is still spent, so no tenant ever sends two requests closer
/// than its quota's interval. Each task calls a key, waits a little (past
/// the idle timeout, often within the interval), and calls it again: a
/// sweep or a cap that forgot a spent quota lets that second call go at
/// once.
#[tokio::test(start_paused = true)]
async fn eviction_never_forgets_a_quota_in_use() {
    let recording = Recording::default();
    let interval = Duration::from_millis(20);
    let shaper = tenants(Quota::leaky_bucket(1, interval), recording.clone())
        .headroom(Duration::ZERO)
        .idle_timeout(Duration::from_millis(4))
        .max_lanes(2_000)
        .build()
        .unwrap();
    let tasks: Vec<_> = (0..64u64)
        .map(|task| {
            let shaper = shaper.clone();
            tokio::spawn(async move {
                let mut rng = fastrand::Rng::with_seed(task);
                for _ in 0..100 {
                    // Half the keys hot (shared by the tasks, so their
                    // lanes hand over between the fast path and the
                    // dispatcher), the rest anywhere.
                    let key = if rng.bool() {
                        rng.usize(..500)
                    } else {
                        rng.usize(..100_000)
                    };
                    let key = format!("t{key}");
                    for _ in 0..2 {
                        let answer = call(&shaper, &key).await;
                        assert_eq!(answer.expect("every call is answered").status(), 200);
                        tokio::time::sleep(Duration::from_millis(rng.u64(1..30))).await;
                    }
                }
            })
        })
        .collect();
    common::join_all(tasks).await;
    let sent = recording.0.lock().unwrap().clone();
    assert_eq!(sent.values().map(Vec::len).sum::<usize>(), 64 * 200);
    for (tenant, times) in &sent {
        for pair in times.windows(2) {
            assert!(
                pair[1] - pair[0] >= interval,
                "{tenant}: two sends {:?} apart",
                pair[1] - pair[0]
            );
        }
    }
    // Everything quiet for the idle timeout is gone.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(shaper.live_lanes(), 0, "{:?}", shaper.lanes().first());
}

/// Past `max_lanes`, a new key evicts the least recently used idle lane;
/// when every lane still holds quota spent (a minute's, here), the new
/// key's request ends with `LaneLimit`, naming the lane and the cap, and
/// nothing is sent. Once the minute is over there is room again, taken
/// from the quietest lane first.
#[tokio::test(start_paused = true)]
async fn the_cap_evicts_the_quietest_idle_lane_or_refuses_naming_it() {
    let recording = Recording::default();
    let minute = Duration::from_secs(60);
    // The sweeper stays out of it (a lane quiet for its idle timeout goes,
    // its spent window resting): only the cap evicts here.
    let shaper = tenants(Quota::fixed_window(5, minute), recording.clone())
        .max_lanes(3)
        .idle_timeout(Duration::from_secs(3600))
        .build()
        .unwrap();
    for tenant in ["a", "b", "c"] {
        call(&shaper, tenant).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    match call(&shaper, "d").await {
        Err(Error::LaneLimit { lane, max_lanes }) => {
            assert_eq!(max_lanes, 3);
            assert!(lane.starts_with("tenant/d |"), "{lane}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!recording.0.lock().unwrap().contains_key("d"));
    assert_eq!(shaper.live_lanes(), 3);

    // Each tenant's window has closed: all three are idle, and a, the
    // quietest, makes room first, then b.
    tokio::time::sleep(minute).await;
    call(&shaper, "d").await.unwrap();
    call(&shaper, "e").await.unwrap();
    let mut keys: Vec<String> = shaper
        .lanes()
        .into_iter()
        .map(|lane| lane.key.split(" |").next().unwrap_or_default().to_owned())
        .collect();
    keys.sort();
    assert_eq!(keys, ["tenant/c", "tenant/d", "tenant/e"]);
}

/// Zero lanes can serve nothing: refused when the shaper is built.
#[test]
fn a_cap_of_zero_is_refused() {
    let error = Shaper::builder()
        .rate(1, Duration::from_secs(1))
        .max_lanes(0)
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("max_lanes"), "{error}");
}

/// A shaper whose tenants, each at `per_tenant`, go a millisecond after
/// they go quiet, on whatever threads the test runs.
fn swept_at_once(per_tenant: Quota) -> Shaper {
    tenants(per_tenant, Recording::default())
        .idle_timeout(Duration::from_millis(1))
        .build()
        .unwrap()
}

/// Wait until every lane went, two seconds at most. Not a sleep between
/// looks: the caller's next lane is made within microseconds of the last
/// one going, as the sweeper decides whether to retire.
async fn every_lane_goes(shaper: &Shaper, round: usize) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while shaper.live_lanes() > 0 {
        assert!(
            Instant::now() < deadline,
            "round {round}: a lane was never swept: {:?}",
            shaper.lanes()
        );
        tokio::task::yield_now().await;
    }
}

/// A lane made just as the last one goes is still swept. The sweeper,
/// finding no lane due, waited for a busy lane's nudge alone; a lane made
/// after it read its shard and before it looked whether to retire kept
/// it from retiring, had no dispatcher to nudge it, and stayed live for
/// good (round 1 or 2, most runs). Two threads, three hundred rounds,
/// each making its lane within microseconds of the last one going: every
/// lane must go within two seconds of going quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_made_as_the_last_one_goes_is_still_swept() {
    let shaper = swept_at_once(Quota::leaky_bucket(1_000, Duration::from_secs(1)));
    for round in 0..300 {
        call(&shaper, &format!("t{round}")).await.unwrap();
        every_lane_goes(&shaper, round).await;
    }
}

/// A tenant's day's quota holds while its lane goes, rests and wakes on two
/// threads, each wake made within microseconds of the lane going: no
/// tenant ever gets more than its two requests a day, and every lane goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_quota_holds_while_lanes_rest_and_wake_on_two_threads() {
    let shaper = swept_at_once(Quota::fixed_window(2, Duration::from_secs(86_400)));
    let mut went: HashMap<String, u32> = HashMap::new();
    for round in 0..400 {
        let tenant = format!("t{}", round % 7);
        let answer = shaper
            .get(format!("http://vendor.test/{tenant}"))
            .tag(&tenant)
            .max_wait(Duration::from_millis(50))
            .send()
            .await;
        // The answer holds its lane until it is dropped.
        match answer {
            Ok(answer) => {
                drop(answer);
                *went.entry(tenant).or_default() += 1;
            }
            Err(Error::WouldExceedMaxWait { .. }) => {}
            Err(other) => panic!("round {round}: {other}"),
        }
        every_lane_goes(&shaper, round).await;
    }
    for (tenant, n) in &went {
        assert_eq!(*n, 2, "{tenant} went {n} times in its day");
    }
    assert_eq!(went.len(), 7);
}

/// A lane quiet for its idle timeout goes though its day's quota is partly
/// spent: the spent part rests, and the tenant's next lane counts on from
/// it.
#[tokio::test(start_paused = true)]
async fn a_quiet_lane_goes_and_its_spent_quota_rests() {
    let shaper = quickly_quiet(Quota::fixed_window(2, Duration::from_secs(86_400)));
    call(&shaper, "a").await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(shaper.live_lanes(), 0, "{:?}", shaper.lanes().first());
    call(&shaper, "a").await.unwrap();
    refused_within_a_second(&shaper, "a").await;
}

/// The vendor's count outlives its lanes: while another lane holds the
/// vendor, a quiet lane counting nothing of its own goes; the last one
/// stays while the vendor's hour counts, unless a gate of its own rests,
/// which keeps the vendor with it. A new tenant still finds the hour
/// spent. A thousand tenants: lanes that go in one sweep from one shard
/// (of 64) hold the vendor until they go, and the last of them is no
/// word that another lane holds it.
#[tokio::test(start_paused = true)]
async fn the_vendors_count_outlives_the_lanes_that_go() {
    const TENANTS: u32 = 1_000;
    let hour = Duration::from_secs(3600);
    let shaper = |vendor: u32, tenant: Quota| {
        Shaper::builder()
            .quota(Quota::fixed_window(vendor, hour))
            .level(Level::new("tenant", LaneKey::Tag, [tenant]))
            .idle_timeout(Duration::from_secs(1))
            .transport(Recording::default())
            .build()
            .unwrap()
    };

    // The tenants' own buckets fill again at once: nothing of theirs rests.
    let fast = shaper(
        TENANTS + 1,
        Quota::token_bucket(10, 1_000, Duration::from_secs(1)),
    );
    for tenant in 0..TENANTS {
        call(&fast, &format!("t{tenant}")).await.unwrap();
    }
    call(&fast, "t0").await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(fast.live_lanes(), 1, "the last holder of the vendor stays");
    refused_within_a_second(&fast, "c").await;

    // A tenant's own hour rests, and keeps the vendor's with it.
    let slow = shaper(3, Quota::fixed_window(10, hour));
    for _ in 0..3 {
        call(&slow, "a").await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(slow.live_lanes(), 0);
    refused_within_a_second(&slow, "b").await;
}

/// Resting counts that go in one sweep hold the vendor's model until they
/// go: the last of them is no word that something else keeps it. A
/// thousand tenants' own two-second windows rest once their lanes go, and
/// go once they end; the vendor's hour stays spent.
#[tokio::test(start_paused = true)]
async fn resting_counts_that_go_together_keep_the_vendors_hour() {
    const TENANTS: u32 = 1_000;
    let shaper = Shaper::builder()
        .quota(Quota::fixed_window(TENANTS, Duration::from_secs(3600)))
        .level(Level::new(
            "tenant",
            LaneKey::Tag,
            [Quota::fixed_window(1, Duration::from_secs(2))],
        ))
        .idle_timeout(Duration::from_secs(1))
        .transport(Recording::default())
        .build()
        .unwrap();
    for tenant in 0..TENANTS {
        call(&shaper, &format!("t{tenant}")).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(shaper.live_lanes(), 0, "every lane went");
    refused_within_a_second(&shaper, "new").await;
}

/// However lanes and resting counts come and go, the vendor's quota
/// holds. Rounds of calls from 16 tasks over 400 tenants, each at
/// `tenant`, each round followed by a quiet spell of a random length:
/// every lane goes quiet and goes after its idle timeout, and no ten
/// seconds on the wire ever hold more than the vendor's fifty.
async fn vendor_holds_through_churn(tenant: Quota) {
    const VENDOR: usize = 50;
    const ROUNDS: usize = 30;
    let window = Duration::from_secs(10);
    let recording = Recording::default();
    let shaper = Shaper::builder()
        .quota(Quota::sliding_log(VENDOR as u32, window))
        .level(Level::new("tenant", LaneKey::Tag, [tenant]))
        .headroom(Duration::ZERO)
        .idle_timeout(Duration::from_millis(200))
        .transport(recording.clone())
        .build()
        .unwrap();
    let mut rng = fastrand::Rng::with_seed(7);
    for _ in 0..ROUNDS {
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (shaper, seed) = (shaper.clone(), rng.u64(..));
                tokio::spawn(async move {
                    let mut rng = fastrand::Rng::with_seed(seed);
                    for _ in 0..3 {
                        let tenant = format!("t{}", rng.usize(..400));
                        call(&shaper, &tenant).await.expect("answered");
                    }
                })
            })
            .collect();
        common::join_all(tasks).await;
        tokio::time::sleep(Duration::from_millis(rng.u64(100..4_000))).await;
    }
    let mut sent: Vec<Instant> = recording
        .0
        .lock()
        .unwrap()
        .values()
        .flatten()
        .copied()
        .collect();
    sent.sort();
    assert_eq!(sent.len(), ROUNDS * 16 * 3);
    for (first, last) in sent.iter().zip(&sent[VENDOR..]) {
        assert!(
            *last - *first >= window,
            "{} sends within {:?}",
            VENDOR + 1,
            *last - *first
        );
    }
}

/// Each tenant's spent second rests when its lane goes, and the rests end
/// in turn, many in one sweep.
#[tokio::test(start_paused = true)]
async fn the_vendors_quota_holds_while_tenants_rest_and_wake() {
    vendor_holds_through_churn(Quota::fixed_window(2, Duration::from_secs(1))).await;
}

/// Each tenant's bucket is full again before its lane goes: lanes go with
/// nothing of their own, many from one shard in one sweep.
#[tokio::test(start_paused = true)]
async fn the_vendors_quota_holds_while_bare_lanes_go() {
    vendor_holds_through_churn(Quota::token_bucket(3, 30, Duration::from_secs(1))).await;
}

/// A level's quotas changed while a tenant's meters rest: its next lane
/// counts by the new ones, charged with what the tenant spent.
#[tokio::test(start_paused = true)]
async fn resting_meters_wake_to_the_levels_quotas_now() {
    let day = Duration::from_secs(86_400);
    let shaper = quickly_quiet(Quota::fixed_window(2, day));
    call(&shaper, "a").await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(shaper.live_lanes(), 0);
    shaper
        .set_level_quotas("tenant", vec![Quota::fixed_window(1, day)])
        .unwrap();
    refused_within_a_second(&shaper, "a").await;
}
