//! The metrics a lane reports, read back through a recorder of our own.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use callshaper::testing::{RetryAfter, Vendor};
use common::{SECOND, burst, shaper};
use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

/// Keeps every series by name and lane.
#[derive(Default)]
struct Seen {
    numbers: Mutex<HashMap<String, Arc<AtomicU64>>>,
    samples: Mutex<HashMap<String, Arc<Samples>>>,
}

#[derive(Default)]
struct Samples(Mutex<Vec<f64>>);

impl HistogramFn for Samples {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

fn series(key: &Key) -> String {
    let labels: Vec<_> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl Seen {
    fn number(&self, key: &Key) -> Arc<AtomicU64> {
        self.numbers
            .lock()
            .unwrap()
            .entry(series(key))
            .or_default()
            .clone()
    }

    fn counter(&self, name: &str) -> u64 {
        let numbers = self.numbers.lock().unwrap();
        numbers
            .iter()
            .filter(|(k, _)| k.starts_with(name))
            .map(|(_, v)| v.load(Ordering::Relaxed))
            .sum()
    }

    fn gauge(&self, name: &str) -> Option<f64> {
        let numbers = self.numbers.lock().unwrap();
        let (_, value) = numbers.iter().find(|(k, _)| k.starts_with(name))?;
        Some(f64::from_bits(value.load(Ordering::Relaxed)))
    }

    fn samples(&self, name: &str) -> Vec<f64> {
        let samples = self.samples.lock().unwrap();
        samples
            .iter()
            .filter(|(k, _)| k.starts_with(name))
            .flat_map(|(_, s)| s.0.lock().unwrap().clone())
            .collect()
    }
}

impl Recorder for Seen {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.number(key))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.number(key))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let samples = self
            .samples
            .lock()
            .unwrap()
            .entry(series(key))
            .or_default()
            .clone();
        Histogram::from_arc(samples)
    }
}

#[tokio::test(start_paused = true)]
async fn a_lane_counts_releases_throttles_refusals_and_waits() {
    let seen = Seen::default();
    let _recording = metrics::set_default_local_recorder(&seen);
    let vendor = Vendor::strict(5, SECOND).announcing_policy().start().await;
    vendor.throttle_for(Duration::from_millis(10), RetryAfter::Seconds(1));
    let shaper = shaper(10).queue_capacity(20).build().unwrap();

    let outcomes = burst(&shaper, &vendor.uri(), 22).await;

    let refused = outcomes.iter().filter(|o| o.is_err()).count();
    assert_eq!(
        refused, 1,
        "the first went at once; 20 queued; one past them"
    );
    assert_eq!(
        seen.counter("callshaper_released_total"),
        vendor.arrivals().len() as u64
    );
    assert_eq!(seen.counter("callshaper_throttles_total"), 1);
    assert_eq!(seen.counter("callshaper_refused_total"), 1);
    assert_eq!(seen.gauge("callshaper_learned_rate"), Some(5.0));
    assert_eq!(seen.gauge("callshaper_queue_depth"), Some(0.0), "drained");
    let waits = seen.samples("callshaper_wait_seconds");
    assert_eq!(waits.len(), 21);
    // The last of 21 waited out the 1 s pause and 19 slots at 5/s.
    let longest = waits.iter().copied().fold(0.0, f64::max);
    assert!(longest > 4.0 && longest < 5.5, "{longest}");
}

/// On a shared store, the lane's mode gauge follows Redis: 0 shared, 1 on
/// the fail-open fallback once Redis is gone. Real clock: Redis keeps time.
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
        .on_store_failure(callshaper::StoreFailure::Open)
        .build()
        .unwrap();
    assert_eq!(shaper.get(vendor.uri()).send().await.unwrap().status(), 200);
    assert_eq!(seen.gauge("callshaper_store_mode"), Some(0.0));
    redis.kill();
    assert_eq!(shaper.get(vendor.uri()).send().await.unwrap().status(), 200);
    assert_eq!(seen.gauge("callshaper_store_mode"), Some(1.0), "fallback");
}
