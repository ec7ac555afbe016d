//! What a lane tells the outside: `metrics` counters, gauges and a
//! histogram (feature `metrics`), next to the `tracing` events and
//! [`LaneSnapshot`](crate::LaneSnapshot).
//!
//! Every series carries a `lane` label. Handles are registered once, when
//! the lane is created, so the hot path pays an atomic add, not a lookup;
//! without the feature, or without a recorder installed, all of it costs
//! nothing.
//!
//! | name | kind | meaning |
//! |---|---|---|
//! | `callshaper_released_total` | counter | turns handed out (attempts sent) |
//! | `callshaper_throttles_total` | counter | 429/503 (and throttling 403) answers |
//! | `callshaper_retries_total` | counter | failure retries (5xx, transport) |
//! | `callshaper_refused_total` | counter | requests ended without a send (queue full, max_wait, budget…) |
//! | `callshaper_queue_depth` | gauge | requests waiting |
//! | `callshaper_learned_rate` | gauge | a lower quota the vendor announced, per second |
//! | `callshaper_wait_seconds` | histogram | time from submission to release |
//! | `callshaper_store_mode` | gauge | with a shared store: 0 shared, 1 fallback (fail-open), 2 unavailable (fail-closed) |

use std::time::Duration;

#[cfg(feature = "metrics")]
pub(crate) struct LaneMetrics {
    released: ::metrics::Counter,
    throttles: ::metrics::Counter,
    retries: ::metrics::Counter,
    refused: ::metrics::Counter,
    queue_depth: ::metrics::Gauge,
    learned_rate: ::metrics::Gauge,
    wait: ::metrics::Histogram,
}

#[cfg(feature = "metrics")]
impl LaneMetrics {
    pub(crate) fn new(lane: &str) -> Self {
        let lane = lane.to_owned();
        Self {
            released: ::metrics::counter!("callshaper_released_total", "lane" => lane.clone()),
            throttles: ::metrics::counter!("callshaper_throttles_total", "lane" => lane.clone()),
            retries: ::metrics::counter!("callshaper_retries_total", "lane" => lane.clone()),
            refused: ::metrics::counter!("callshaper_refused_total", "lane" => lane.clone()),
            queue_depth: ::metrics::gauge!("callshaper_queue_depth", "lane" => lane.clone()),
            learned_rate: ::metrics::gauge!("callshaper_learned_rate", "lane" => lane.clone()),
            wait: ::metrics::histogram!("callshaper_wait_seconds", "lane" => lane),
        }
    }

    pub(crate) fn released(&self, queued: usize) {
        self.released.increment(1);
        self.queue_depth.set(queued as f64);
    }

    pub(crate) fn throttled(&self) {
        self.throttles.increment(1);
    }

    pub(crate) fn retried(&self) {
        self.retries.increment(1);
    }

    pub(crate) fn refused(&self) {
        self.refused.increment(1);
    }

    pub(crate) fn queued(&self, queued: usize) {
        self.queue_depth.set(queued as f64);
    }

    /// The lane now keeps to `rate`, reported in requests per second.
    pub(crate) fn learned(&self, rate: crate::meters::Rate) {
        self.learned_rate
            .set(f64::from(rate.count) / rate.per.as_secs_f64());
    }

    pub(crate) fn waited(&self, wait: Duration) {
        self.wait.record(wait.as_secs_f64());
    }
}

/// Without the feature: nothing to hold, nothing to do.
#[cfg(not(feature = "metrics"))]
pub(crate) struct LaneMetrics;

#[cfg(not(feature = "metrics"))]
impl LaneMetrics {
    pub(crate) fn new(_lane: &str) -> Self {
        Self
    }

    pub(crate) fn released(&self, _queued: usize) {}

    pub(crate) fn throttled(&self) {}

    pub(crate) fn retried(&self) {}

    pub(crate) fn refused(&self) {}

    pub(crate) fn queued(&self, _queued: usize) {}

    pub(crate) fn learned(&self, _rate: crate::meters::Rate) {}

    pub(crate) fn waited(&self, _wait: Duration) {}
}

/// The mode gauge of a lane on a shared store.
#[cfg(feature = "metrics")]
pub(crate) struct StoreMetrics {
    mode: ::metrics::Gauge,
}

#[cfg(feature = "metrics")]
impl StoreMetrics {
    pub(crate) fn new(lane: &str) -> Self {
        Self {
            mode: ::metrics::gauge!("callshaper_store_mode", "lane" => lane.to_owned()),
        }
    }

    /// The mode as the gauge's value (`StoreMode::gauge`).
    pub(crate) fn mode(&self, value: f64) {
        self.mode.set(value);
    }
}

#[cfg(not(feature = "metrics"))]
pub(crate) struct StoreMetrics;

#[cfg(not(feature = "metrics"))]
impl StoreMetrics {
    pub(crate) fn new(_lane: &str) -> Self {
        Self
    }

    pub(crate) fn mode(&self, _value: f64) {}
}
