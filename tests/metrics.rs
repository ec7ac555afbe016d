//! The metrics a lane reports, read back through a recorder of our own:
//! names, labels, units and values.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use callshaper::route::{LaneKey, Level};
use callshaper::testing::{RetryAfter, Vendor};
use callshaper::{Error, Quota, Shaper};
use common::{SECOND, burst, join_all, shaper};
use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

type Labels = BTreeMap<String, String>;

/// Keeps every series by name and labels, and every description.
#[derive(Default)]
struct Seen {
    numbers: Mutex<HashMap<(String, Labels), Arc<AtomicU64>>>,
    samples: Mutex<HashMap<(String, Labels), Arc<Samples>>>,
    units: Mutex<HashMap<String, Option<Unit>>>,
}

#[derive(Default)]
struct Samples(Mutex<Vec<f64>>);

impl HistogramFn for Samples {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

fn series(key: &Key) -> (String, Labels) {
    let labels = key
        .labels()
        .map(|l| (l.key().to_owned(), l.value().to_owned()))
        .collect();
    (key.name().to_owned(), labels)
}

/// True when `labels` has every pair of `wanted`.
fn has(labels: &Labels, wanted: &[(&str, &str)]) -> bool {
    wanted
        .iter()
        .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
}

impl Seen {
    /// Every series of `name`, with its labels and value as counted.
    fn all(&self, name: &str) -> Vec<(Labels, u64)> {
        let numbers = self.numbers.lock().unwrap();
        numbers
            .iter()
            .filter(|((n, _), _)| n == name)
            .map(|((_, labels), v)| (labels.clone(), v.load(Ordering::Relaxed)))
            .collect()
    }

    /// The sum of the counters `name` whose labels have `wanted`.
    fn counter(&self, name: &str, wanted: &[(&str, &str)]) -> u64 {
        self.all(name)
            .into_iter()
            .filter(|(labels, _)| has(labels, wanted))
            .map(|(_, v)| v)
            .sum()
    }

    /// The one gauge `name` whose labels have `wanted`, if registered.
    fn gauge(&self, name: &str, wanted: &[(&str, &str)]) -> Option<f64> {
        let found: Vec<_> = self
            .all(name)
            .into_iter()
            .filter(|(labels, _)| has(labels, wanted))
            .collect();
        assert!(found.len() <= 1, "{name} {wanted:?}: {found:?}");
        found.first().map(|(_, v)| f64::from_bits(*v))
    }

    fn samples(&self, name: &str) -> Vec<f64> {
        let samples = self.samples.lock().unwrap();
        samples
            .iter()
            .filter(|((n, _), _)| n == name)
            .flat_map(|(_, s)| s.0.lock().unwrap().clone())
            .collect()
    }

    fn number(&self, key: &Key) -> Arc<AtomicU64> {
        let mut numbers = self.numbers.lock().unwrap();
        numbers.entry(series(key)).or_default().clone()
    }

    fn described(&self, name: KeyName, unit: Option<Unit>) {
        self.units
            .lock()
            .unwrap()
            .insert(name.as_str().to_owned(), unit);
    }
}

impl Recorder for Seen {
    fn describe_counter(&self, name: KeyName, unit: Option<Unit>, _: SharedString) {
        self.described(name, unit);
    }
    fn describe_gauge(&self, name: KeyName, unit: Option<Unit>, _: SharedString) {
        self.described(name, unit);
    }
    fn describe_histogram(&self, name: KeyName, unit: Option<Unit>, _: SharedString) {
        self.described(name, unit);
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.number(key))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.number(key))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let mut samples = self.samples.lock().unwrap();
        Histogram::from_arc(samples.entry(series(key)).or_default().clone())
    }
}

#[tokio::test(start_paused = true)]
async fn a_lane_counts_releases_throttles_refusals_and_waits() {
    let seen = Seen::default();
    let _recording = metrics::set_default_local_recorder(&seen);
    let vendor = Vendor::strict(5, SECOND).announcing_policy().start().await;
    vendor.throttle_for(Duration::from_millis(10), RetryAfter::Seconds(1));
    let shaper = shaper(10).queue_capacity(20).build().unwrap();
    let origin = vendor.uri();
    let ours = [
        ("vendor", origin.as_str()),
        ("level", "vendor"),
        ("route", ""),
    ];

    let outcomes = burst(&shaper, &origin, 22).await;

    let refused: Vec<_> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    assert!(
        matches!(refused[..], [Error::QueueFull { .. }]),
        "the first went at once; 20 queued; one past them: {refused:?}"
    );
    assert_eq!(
        seen.counter("callshaper_released_total", &ours),
        vendor.arrivals().len() as u64
    );
    assert_eq!(
        seen.counter(
            "callshaper_throttles_total",
            &[("status", "429"), ("cause", "hinted"), ("vendor", &origin)]
        ),
        1
    );
    assert_eq!(
        seen.counter("callshaper_pauses_total", &[("cause", "hinted")]),
        1
    );
    assert_eq!(
        seen.counter("callshaper_refused_total", &[("reason", "queue_full")]),
        1
    );
    assert_eq!(seen.all("callshaper_refused_total").len(), 1, "one reason");
    assert_eq!(seen.gauge("callshaper_learned_rate", &ours), Some(5.0));
    assert_eq!(
        seen.gauge("callshaper_queue_depth", &ours),
        Some(0.0),
        "drained"
    );
    assert_eq!(
        seen.gauge("callshaper_in_flight", &ours),
        Some(0.0),
        "answered"
    );
    // The pause's end, in Unix seconds. The test clock is paused, so the
    // wall clock moved only milliseconds during the run: the end is the
    // pause's length (1 s and the headroom) after the wall time of the
    // throttle, still ahead of the wall clock now.
    let end = seen
        .gauge("callshaper_pause_end_timestamp_seconds", &ours)
        .unwrap();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let ahead = end - now.as_secs_f64();
    assert!(ahead > 0.0 && ahead <= 1.1, "{end}: {ahead} s ahead");
    let waits = seen.samples("callshaper_wait_seconds");
    assert_eq!(waits.len(), 21);
    // The last of 21 waited out the 1 s pause and 19 slots at 5/s.
    let longest = waits.iter().copied().fold(0.0, f64::max);
    assert!(longest > 4.0 && longest < 5.5, "{longest}");

    let units = seen.units.lock().unwrap();
    assert_eq!(units["callshaper_wait_seconds"], Some(Unit::Seconds));
    assert_eq!(units["callshaper_released_total"], Some(Unit::Count));
    assert_eq!(
        units["callshaper_pause_end_timestamp_seconds"],
        Some(Unit::Seconds)
    );
    assert!(units.contains_key("callshaper_store_mode"));
}

/// Reads the in-flight gauge as each attempt goes on the wire.
struct Peek {
    seen: Arc<Seen>,
    in_flight: Arc<Mutex<Vec<f64>>>,
}

impl callshaper::shaper::Transport for Peek {
    fn send(
        &self,
        request: reqwest::Request,
    ) -> callshaper::shaper::BoxFuture<reqwest::Result<reqwest::Response>> {
        let now = self.seen.gauge("callshaper_in_flight", &[]).unwrap_or(-1.0);
        self.in_flight.lock().unwrap().push(now);
        callshaper::testing::HoldClock(reqwest::Client::new()).send(request)
    }
}

/// Each attempt is counted in flight while it is on the wire, and out
/// once answered, one at a time at a pace of 10/s.
#[tokio::test(start_paused = true)]
async fn an_attempt_is_in_flight_until_answered() {
    let seen = Arc::new(Seen::default());
    let _recording = metrics::set_default_local_recorder(&*seen);
    let vendor = Vendor::strict(10, SECOND).start().await;
    let in_flight = Arc::new(Mutex::new(Vec::new()));
    let peek = Peek {
        seen: seen.clone(),
        in_flight: in_flight.clone(),
    };
    let shaper = Shaper::builder()
        .rate(10, SECOND)
        .transport(peek)
        .build()
        .unwrap();
    for outcome in burst(&shaper, &vendor.uri(), 3).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    assert_eq!(*in_flight.lock().unwrap(), [1.0, 1.0, 1.0]);
    assert_eq!(seen.gauge("callshaper_in_flight", &[]), Some(0.0));
}

/// Nothing learned, nothing reported: no `learned_rate` series at all,
/// and no refusal series for reasons that never happened.
#[tokio::test(start_paused = true)]
async fn a_series_appears_only_once_it_has_something_to_say() {
    let seen = Seen::default();
    let _recording = metrics::set_default_local_recorder(&seen);
    let vendor = Vendor::strict(10, SECOND).start().await;
    let shaper = shaper(10).build().unwrap();
    for outcome in burst(&shaper, &vendor.uri(), 5).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    assert!(seen.all("callshaper_learned_rate").is_empty());
    assert!(seen.all("callshaper_refused_total").is_empty());
    assert!(seen.all("callshaper_throttles_total").is_empty());
    assert!(seen.all("callshaper_store_mode").is_empty(), "no store");
    assert_eq!(seen.counter("callshaper_released_total", &[]), 5);
}

/// A lane per tenant adds up in one series per level, unless series per
/// lane are asked for; the queue gauge is right for the sum either way.
#[tokio::test(start_paused = true)]
async fn tenants_share_a_series_unless_each_lane_is_asked_for() {
    for per_lane in [false, true] {
        let seen = Seen::default();
        let _recording = metrics::set_default_local_recorder(&seen);
        let vendor = Vendor::strict(10, SECOND).start().await;
        let per_tenant = Level::new("tenant", LaneKey::Tag, [Quota::leaky_bucket(2, SECOND)]);
        let shaper = shaper(10)
            .level(per_tenant)
            .metrics_per_lane(per_lane)
            .build()
            .unwrap();
        let tasks: Vec<_> = (0..12)
            .map(|i| {
                let request = shaper.get(vendor.uri()).tag(format!("t{}", i % 3));
                tokio::spawn(request.send())
            })
            .collect();
        // One went at once; the vendor's 10/s spaces the other eleven.
        tokio::time::sleep(Duration::from_millis(1)).await;
        let queued: f64 = seen
            .all("callshaper_queue_depth")
            .iter()
            .map(|(_, v)| f64::from_bits(*v))
            .sum();
        assert_eq!(queued, 11.0, "per lane: {per_lane}");
        for outcome in join_all(tasks).await {
            assert_eq!(outcome.unwrap().status(), 200);
        }
        let released = seen.all("callshaper_released_total");
        let tenant: Vec<_> = released
            .iter()
            .filter(|(labels, _)| has(labels, &[("level", "tenant")]))
            .collect();
        if per_lane {
            assert_eq!(tenant.len(), 3, "{released:?}");
            assert!(
                tenant
                    .iter()
                    .all(|(labels, v)| { *v == 4 && labels["lane"].starts_with("tenant/t") })
            );
        } else {
            assert_eq!(tenant.len(), 1, "{released:?}");
            assert_eq!(tenant[0].1, 12);
            assert!(!tenant[0].0.contains_key("lane"));
        }
        // Each series declares its lanes' tightest quota, the tenant's
        // 2/s, read by its first lane.
        let declared: Vec<f64> = seen
            .all("callshaper_quota_rate")
            .into_iter()
            .filter(|(labels, _)| has(labels, &[("level", "tenant")]))
            .map(|(_, v)| f64::from_bits(v))
            .collect();
        assert_eq!(declared, vec![2.0; tenant.len()], "per lane: {per_lane}");
    }
}

/// Requests the shaper ends are counted by reason, once each.
#[tokio::test(start_paused = true)]
async fn refusals_are_counted_by_reason() {
    let seen = Seen::default();
    let _recording = metrics::set_default_local_recorder(&seen);
    let vendor = Vendor::strict(1, SECOND).start().await;
    let shaper = Shaper::builder()
        .quota(Quota::sliding_log(1, SECOND).per_cost())
        .transport(callshaper::testing::HoldClock(reqwest::Client::new()))
        .build()
        .unwrap();
    let too_costly = shaper.get(vendor.uri()).cost(5).send().await;
    assert!(matches!(too_costly, Err(Error::CostTooHigh { .. })));
    let first = shaper.get(vendor.uri()).send().await.unwrap();
    assert_eq!(first.status(), 200);
    let impatient = shaper
        .get(vendor.uri())
        .max_wait(Duration::from_millis(10))
        .send()
        .await;
    assert!(matches!(impatient, Err(Error::WouldExceedMaxWait { .. })));
    assert_eq!(
        seen.counter("callshaper_refused_total", &[("reason", "cost_too_high")]),
        1
    );
    assert_eq!(
        seen.counter(
            "callshaper_refused_total",
            &[("reason", "would_exceed_max_wait")]
        ),
        1
    );
    assert_eq!(seen.counter("callshaper_refused_total", &[]), 2);
}

/// On a shared store, the lane's mode is a state set that follows Redis:
/// `shared` until Redis is gone, then `fallback` (fail-open). Real clock:
/// Redis keeps time.
#[tokio::test]
async fn a_lane_on_a_shared_store_reports_its_mode() {
    use callshaper::store::RedisStore;
    use callshaper::testing::RedisServer;

    let seen = Seen::default();
    let _recording = metrics::set_default_local_recorder(&seen);
    let mut redis = RedisServer::start();
    let vendor = Vendor::strict(10, SECOND).start().await;
    let store = RedisStore::options()
        .timeout(Duration::from_millis(100))
        .connect(&redis.url())
        .await
        .unwrap();
    let shaper = callshaper::Shaper::builder()
        .rate(10, SECOND)
        .store(store)
        .on_store_failure(callshaper::store::StoreFailure::Open)
        .build()
        .unwrap();
    let mode = |mode| seen.gauge("callshaper_store_mode", &[("mode", mode)]);
    assert_eq!(shaper.get(vendor.uri()).send().await.unwrap().status(), 200);
    assert_eq!(
        [mode("shared"), mode("fallback"), mode("unavailable")],
        [Some(1.0), Some(0.0), Some(0.0)]
    );
    redis.kill();
    assert_eq!(shaper.get(vendor.uri()).send().await.unwrap().status(), 200);
    assert_eq!(
        [mode("shared"), mode("fallback"), mode("unavailable")],
        [Some(0.0), Some(1.0), Some(0.0)]
    );
}

/// A lane that went while its own quota still counted rests as its
/// meters: a gauge counts them, and they leave it as a request wakes them
/// or their count ends.
#[tokio::test(start_paused = true)]
async fn resting_gates_are_counted() {
    let seen = Seen::default();
    let _recording = metrics::set_default_local_recorder(&seen);
    let vendor = Vendor::strict(100, SECOND).start().await;
    let minute = Duration::from_secs(60);
    let shaper = shaper(100)
        .level(Level::new(
            "tenant",
            LaneKey::Tag,
            [Quota::fixed_window(5, minute)],
        ))
        .idle_timeout(SECOND)
        .build()
        .unwrap();
    let call = |tenant: &'static str| shaper.get(vendor.uri()).tag(tenant).send();
    for tenant in ["a", "b"] {
        call(tenant).await.unwrap();
    }
    tokio::time::sleep(2 * SECOND).await;
    assert_eq!(shaper.live_lanes(), 0);
    assert_eq!(seen.gauge("callshaper_resting_gates", &[]), Some(2.0));
    call("a").await.unwrap();
    assert_eq!(seen.gauge("callshaper_resting_gates", &[]), Some(1.0));
    tokio::time::sleep(2 * minute).await;
    assert_eq!(seen.gauge("callshaper_resting_gates", &[]), Some(0.0));
}
