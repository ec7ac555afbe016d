//! The series of the crate docs' table ("Observability"), through the
//! `metrics` facade; without the feature, the same calls do nothing.

use super::labels::Labels;
use crate::meters::Rate;

#[cfg(feature = "metrics")]
pub(crate) use self::on::{Count, InFlight, LaneMetrics, StoreMetrics};

#[cfg(not(feature = "metrics"))]
pub(crate) use self::off::{Count, InFlight, LaneMetrics, StoreMetrics};

#[cfg(feature = "metrics")]
mod on {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use ::metrics::{
        Counter, Gauge, Histogram, Label, Unit, counter, describe_counter, describe_gauge,
        describe_histogram, gauge, histogram,
    };
    use tokio::time::Instant;

    use super::{Labels, Rate};

    /// Help text and units, sent to the recorder each time a lane starts:
    /// a recorder installed after the first lane still learns them.
    fn describe() {
        describe_counter!(
            "callshaper_released_total",
            Unit::Count,
            "Attempts released to the wire"
        );
        describe_counter!(
            "callshaper_throttles_total",
            Unit::Count,
            "Throttling answers from the vendor, by status and pause cause"
        );
        describe_counter!(
            "callshaper_pauses_total",
            Unit::Count,
            "Pauses the lanes took, by cause"
        );
        describe_counter!(
            "callshaper_retries_total",
            Unit::Count,
            "Failure retries (5xx, transport errors)"
        );
        describe_counter!(
            "callshaper_refused_total",
            Unit::Count,
            "Requests ended with an error instead of the vendor's response, by reason"
        );
        describe_gauge!(
            "callshaper_queue_depth",
            Unit::Count,
            "Requests waiting in the lanes"
        );
        describe_gauge!(
            "callshaper_in_flight",
            Unit::Count,
            "Requests released and not yet answered"
        );
        describe_gauge!(
            "callshaper_pause_end_timestamp_seconds",
            Unit::Seconds,
            "When the latest pause of the lanes ends, in Unix time"
        );
        describe_gauge!(
            "callshaper_quota_rate",
            "Requests per second the lanes' tightest declared quota allows"
        );
        describe_gauge!(
            "callshaper_learned_rate",
            "Requests per second the vendor's answers taught the lanes"
        );
        describe_histogram!(
            "callshaper_wait_seconds",
            Unit::Seconds,
            "Time from submission to first release"
        );
        describe_gauge!(
            "callshaper_store_mode",
            "Where the lanes' quota lives: 1 for the mode in force, 0 for the others"
        );
        describe_gauge!(
            "callshaper_lanes",
            Unit::Count,
            "Live lanes: made on a key's first request, gone once quiet"
        );
        describe_gauge!(
            "callshaper_resting_gates",
            Unit::Count,
            "Gates whose lane went while their meters still count: the counts rest until spent"
        );
    }

    /// A count of every shaper in the process, each moving the gauge by
    /// increments: live lanes, resting gates.
    pub(crate) struct Count(Gauge);

    impl Count {
        pub(crate) fn lanes() -> Self {
            describe();
            Self(gauge!("callshaper_lanes"))
        }

        pub(crate) fn resting_gates() -> Self {
            describe();
            Self(gauge!("callshaper_resting_gates"))
        }

        pub(crate) fn up(&self) {
            self.0.increment(1.0);
        }

        pub(crate) fn down(&self, n: usize) {
            self.0.decrement(n as f64);
        }
    }

    /// `labels`, and `lane` when series per lane were asked for, as the
    /// facade takes them.
    fn labelled(labels: &Labels, lane: Option<&str>) -> Vec<Label> {
        let mut all = vec![
            Label::new("vendor", labels.vendor.clone()),
            Label::new("level", labels.level.clone()),
            Label::new("route", labels.route.clone()),
        ];
        if let Some(lane) = lane {
            all.push(Label::new("lane", lane.to_owned()));
        }
        all
    }

    /// `base` and one label more.
    fn plus(base: &[Label], key: &'static str, value: &str) -> Vec<Label> {
        let mut all = base.to_vec();
        all.push(Label::new(key, value.to_owned()));
        all
    }

    /// A lane's series. Several lanes may share one (the tenants of one
    /// vendor and level), so gauges move by increments, never by `set`,
    /// except where the value is the same for all of them.
    pub(crate) struct LaneMetrics {
        /// Every series' labels: the rare ones add theirs to these.
        labels: Vec<Label>,
        released: Counter,
        retries: Counter,
        queue_depth: Gauge,
        in_flight: Gauge,
        pause_end: Gauge,
        wait: Histogram,
        /// The declared rate last set, as `f64` bits (`u64::MAX`, a NaN:
        /// none yet): every lane of the series declares the same, and a
        /// tenant's new lane need not register the gauge again.
        declared: AtomicU64,
    }

    impl LaneMetrics {
        pub(crate) fn new(labels: &Labels, lane: Option<&str>) -> Self {
            describe();
            let all = labelled(labels, lane);
            Self {
                released: counter!("callshaper_released_total", all.clone()),
                retries: counter!("callshaper_retries_total", all.clone()),
                queue_depth: gauge!("callshaper_queue_depth", all.clone()),
                in_flight: gauge!("callshaper_in_flight", all.clone()),
                pause_end: gauge!("callshaper_pause_end_timestamp_seconds", all.clone()),
                wait: histogram!("callshaper_wait_seconds", all.clone()),
                declared: AtomicU64::new(u64::MAX),
                labels: all,
            }
        }

        pub(crate) fn released(&self) {
            self.released.increment(1);
        }

        /// A request joined the queue.
        pub(crate) fn queued(&self) {
            self.queue_depth.increment(1.0);
        }

        /// A request left the queue (released, refused or gone).
        pub(crate) fn dequeued(&self) {
            self.queue_depth.decrement(1.0);
        }

        /// Rare paths register their series as they happen: a label value
        /// (a status, a reason) is only known then, and a series that
        /// never happened is not reported as zero.
        pub(crate) fn throttled(&self, status: u16, cause: &'static str) {
            let status = plus(&self.labels, "status", &status.to_string());
            let all = plus(&status, "cause", cause);
            counter!("callshaper_throttles_total", all).increment(1);
        }

        /// A pause until `until` began (or was extended).
        pub(crate) fn paused(&self, until: Instant, cause: &'static str) {
            let all = plus(&self.labels, "cause", cause);
            counter!("callshaper_pauses_total", all).increment(1);
            let left = until.saturating_duration_since(Instant::now());
            let end = SystemTime::now()
                .checked_add(left)
                .and_then(|end| end.duration_since(UNIX_EPOCH).ok())
                .unwrap_or(Duration::ZERO);
            self.pause_end.set(end.as_secs_f64());
        }

        pub(crate) fn retried(&self) {
            self.retries.increment(1);
        }

        pub(crate) fn refused(&self, reason: &'static str) {
            let all = plus(&self.labels, "reason", reason);
            counter!("callshaper_refused_total", all).increment(1);
        }

        /// The lane's quota allows `rate`, reported in requests per second.
        pub(crate) fn declared(&self, rate: Rate) {
            let per_second = rate.per_second();
            if self.declared.swap(per_second.to_bits(), Ordering::Relaxed) == per_second.to_bits() {
                return;
            }
            gauge!("callshaper_quota_rate", self.labels.clone()).set(per_second);
        }

        /// [`declared`](Self::declared), the rate `read` gives, unless the
        /// series has a rate already: every lane of a series declares the
        /// same, so a tenant's new lane reads no quota for it (each behind
        /// its level's lock, which every lane of the level takes), and a
        /// lane reads none with metrics off.
        pub(crate) fn declared_first(&self, read: impl FnOnce() -> Option<Rate>) {
            if self.declared.load(Ordering::Relaxed) != u64::MAX {
                return;
            }
            if let Some(rate) = read() {
                self.declared(rate);
            }
        }

        /// The lane now keeps to `rate`, reported in requests per second.
        pub(crate) fn learned(&self, rate: Rate) {
            gauge!("callshaper_learned_rate", self.labels.clone()).set(rate.per_second());
        }

        pub(crate) fn waited(&self, wait: Duration) {
            self.wait.record(wait.as_secs_f64());
        }

        /// A request is on the wire until the guard drops.
        pub(crate) fn sending(&self) -> InFlight {
            self.in_flight.increment(1.0);
            InFlight(self.in_flight.clone())
        }
    }

    /// A request on the wire: counted out of `callshaper_in_flight` when
    /// dropped, however the send ends (an answer, an error, a caller that
    /// gave up).
    pub(crate) struct InFlight(Gauge);

    impl Drop for InFlight {
        fn drop(&mut self) {
            self.0.decrement(1.0);
        }
    }

    /// A lane's store mode, as an OpenMetrics state set: one series per
    /// mode, 1 for the one in force.
    pub(crate) struct StoreMetrics {
        modes: Vec<(&'static str, Gauge)>,
    }

    impl StoreMetrics {
        /// The state set of `modes`, by name.
        pub(crate) fn new(labels: &Labels, lane: Option<&str>, modes: &[&'static str]) -> Self {
            let base = labelled(labels, lane);
            let of = |mode: &'static str| {
                let all = plus(&base, "mode", mode);
                (mode, gauge!("callshaper_store_mode", all))
            };
            Self {
                modes: modes.iter().map(|mode| of(mode)).collect(),
            }
        }

        pub(crate) fn mode(&self, now: &str) {
            for (mode, gauge) in &self.modes {
                gauge.set(if *mode == now { 1.0 } else { 0.0 });
            }
        }
    }
}

/// Without the feature: nothing to hold, nothing to do.
#[cfg(not(feature = "metrics"))]
mod off {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::{Labels, Rate};

    pub(crate) struct LaneMetrics;

    impl LaneMetrics {
        pub(crate) fn new(_labels: &Labels, _lane: Option<&str>) -> Self {
            Self
        }

        pub(crate) fn released(&self) {}

        pub(crate) fn queued(&self) {}

        pub(crate) fn dequeued(&self) {}

        pub(crate) fn throttled(&self, _status: u16, _cause: &'static str) {}

        pub(crate) fn paused(&self, _until: Instant, _cause: &'static str) {}

        pub(crate) fn retried(&self) {}

        pub(crate) fn refused(&self, _reason: &'static str) {}

        pub(crate) fn declared(&self, _rate: Rate) {}

        pub(crate) fn declared_first(&self, _read: impl FnOnce() -> Option<Rate>) {}

        pub(crate) fn learned(&self, _rate: Rate) {}

        pub(crate) fn waited(&self, _wait: Duration) {}

        pub(crate) fn sending(&self) -> InFlight {
            InFlight
        }
    }

    pub(crate) struct InFlight;

    pub(crate) struct Count;

    impl Count {
        pub(crate) fn lanes() -> Self {
            Self
        }

        pub(crate) fn resting_gates() -> Self {
            Self
        }

        pub(crate) fn up(&self) {}

        pub(crate) fn down(&self, _n: usize) {}
    }

    pub(crate) struct StoreMetrics;

    impl StoreMetrics {
        pub(crate) fn new(_labels: &Labels, _lane: Option<&str>, _modes: &[&'static str]) -> Self {
            Self
        }

        pub(crate) fn mode(&self, _now: &str) {}
    }
}
