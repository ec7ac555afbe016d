//! A lane's link to its shared store, whatever the store: reservations,
//! corrections and pauses go through the store's [`StoreLane`]; this file
//! owns what a lane does when the store fails (fail-open, fail-closed),
//! probing it again, and the probation after it comes back.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::{StoreError, StoreFailure, StoreLane, StoreMode, StoreSettings};
use crate::gate::Gate;
use crate::observability::StoreMetrics;
use crate::sync::lock;
use crate::time::later;

/// Where a lane's next release comes from.
pub(crate) enum Source {
    /// Reserve in the store.
    Store,
    /// The local fallback (fail-open, store down).
    Fallback,
    /// Nowhere: refuse (fail-closed, store down).
    Refuse,
}

/// A lane's link to the store: its gates there, and which mode it is in.
pub(crate) struct Remote {
    /// Declared before `link`, so dropped first: the link can tell whether
    /// any lane still holds its gates.
    gates: Vec<Arc<Gate>>,
    link: Box<dyn StoreLane>,
    settings: StoreSettings,
    /// How long a gate's state matters once idle: its longest window.
    keep: Duration,
    failure: StoreFailure,
    state: Mutex<State>,
    metrics: StoreMetrics,
}

struct State {
    mode: StoreMode,
    /// When to try the store again, while it is down.
    probe_at: Instant,
    last_error: Option<StoreError>,
    /// Back from an outage: until then, keep to the local share too.
    probation: Option<Instant>,
    clock: StoreClock,
}

/// Slots reserved in one round trip, on this instance's clock.
pub(crate) struct Schedule {
    /// Each slot: when to release it here, and its store time (us).
    pub(crate) slots: Vec<(Instant, i64)>,
    /// No slot was within the horizon: ask again then.
    pub(crate) ask_again: Option<Instant>,
    /// A pause in force for this long.
    pub(crate) paused: Option<Duration>,
    /// Each gate's reservation count after these: the give-back guard.
    pub(crate) seqs: Vec<i64>,
}

/// How the store's time (us) and this instance's clock map onto each
/// other, learnt from the replies: each was computed at a store time `now`
/// somewhere between its send and its receipt.
#[derive(Debug, Default, Clone, Copy)]
struct StoreClock {
    /// The latest reply's send, and the store's time then: a local instant
    /// maps to a store time no later than it was (settling looks for the
    /// nearest charge anyway).
    sent: Option<(Instant, i64)>,
    /// The slowest reply seen: its receipt, and the store's time then. A
    /// slot is released no earlier than its own reply allows, and on this
    /// mapping: a slow reply (the first, which opens connections and loads
    /// scripts) releases its slots late, and the slots of a later, faster
    /// reply must not close up on them. The lane's schedule shifts once by
    /// its slowest reply, and every gap the store reserved is kept.
    received: Option<(Instant, i64)>,
}

impl StoreClock {
    /// A reply computed at store time `now` was sent at `sent` and came
    /// back at `received`.
    fn reply(&mut self, sent: Instant, received: Instant, now: i64) {
        self.sent = Some((sent, now));
        let slower = self.received.is_none_or(|(local, store)| {
            micros(received.saturating_duration_since(local)) > now.saturating_sub(store)
        });
        if slower {
            self.received = Some((received, now));
        }
    }

    /// The store time of local instant `at`.
    fn store_time(&self, at: Instant) -> Option<i64> {
        let (local, store) = self.sent?;
        let offset = if at >= local {
            micros(at - local)
        } else {
            -micros(local - at)
        };
        Some(store.saturating_add(offset))
    }

    /// When store time `t` comes on this instance's clock (never before the
    /// slowest mapping's receipt).
    fn local_time(&self, t: i64) -> Option<Instant> {
        let (local, store) = self.received?;
        let after = u64::try_from(t.saturating_sub(store)).unwrap_or(0);
        Some(later(local, Duration::from_micros(after)))
    }
}

impl Remote {
    /// The link of a lane whose shared `gates` are reached through `link`.
    pub(crate) fn new(
        link: Box<dyn StoreLane>,
        gates: Vec<Arc<Gate>>,
        settings: StoreSettings,
        keep: Duration,
        failure: StoreFailure,
        metrics: StoreMetrics,
    ) -> Self {
        metrics.mode(StoreMode::Shared.label());
        Self {
            gates,
            link,
            settings,
            keep,
            failure,
            state: Mutex::new(State {
                mode: StoreMode::Shared,
                probe_at: Instant::now(),
                last_error: None,
                probation: None,
                clock: StoreClock::default(),
            }),
            metrics,
        }
    }

    /// Each gate's pace now (a learned quota or adaptive pacing), which the
    /// store's meters keep to as well.
    fn paces(&self) -> Vec<Option<Duration>> {
        self.gates.iter().map(|gate| gate.meters().pace()).collect()
    }

    /// Reserve a slot for each of `costs`, in order.
    pub(crate) async fn reserve(
        &self,
        costs: &[u64],
        waiting: usize,
    ) -> Result<Schedule, StoreError> {
        let paces = self.paces();
        let sent = Instant::now();
        let reservation = self.link.reserve(costs, waiting, &paces).await?;
        let received = Instant::now();
        if reservation.lost {
            tracing::warn!(
                "callshaper: the shared store had lost the fleet's state (a flush, a failover \
                 to a replica that missed writes, an eviction); it starts over as if full for \
                 a horizon, so no slot is handed out twice"
            );
        }
        let mut state = lock(&self.state);
        state.clock.reply(sent, received, reservation.now);
        let clock = state.clock;
        drop(state);
        let slots = reservation
            .slots
            .iter()
            .map(|&t| (clock.local_time(t).unwrap_or(received), t))
            .collect();
        // Ask again once the next slot is within the horizon.
        let ask_again = reservation
            .hold
            .map(|hold| later(received, hold.saturating_sub(self.settings.horizon)));
        Ok(Schedule {
            slots,
            ask_again,
            paused: reservation.paused,
            seqs: reservation.seqs,
        })
    }

    /// Give back slots nobody used, latest first: `(store time, cost)`.
    pub(crate) fn give_back(&self, slots: Vec<(i64, u64)>, seqs: Vec<i64>) {
        if !slots.is_empty() {
            self.link.give_back(slots, seqs, &self.paces());
        }
    }

    /// A slot reserved at store time `t` for `charged` went to a request
    /// of cost `actual`.
    pub(crate) fn settle_at(&self, charged: u64, actual: u64, t: i64) {
        self.link.settle(t, charged, actual, &self.paces());
    }

    /// A request released at `at` cost `actual`, not the `charged`.
    pub(crate) fn settle(&self, charged: u64, actual: u64, at: Instant) {
        if let Some(t) = self.store_time(at) {
            self.settle_at(charged, actual, t);
        }
    }

    fn store_time(&self, at: Instant) -> Option<i64> {
        lock(&self.state).clock.store_time(at)
    }

    /// Pause every gate of the lane fleet-wide for `pause` from now.
    pub(crate) fn pause(&self, pause: Duration) {
        self.link.pause(pause);
    }

    pub(crate) fn batch(&self) -> usize {
        self.settings.batch
    }

    pub(crate) fn mode(&self) -> StoreMode {
        lock(&self.state).mode
    }

    pub(crate) fn last_error(&self) -> StoreError {
        lock(&self.state)
            .last_error
            .clone()
            .unwrap_or_else(|| StoreError::Failed("unavailable".to_owned()))
    }

    /// True while a lane back from an outage also keeps to its local share.
    pub(crate) fn on_probation(&self, now: Instant) -> bool {
        let mut state = lock(&self.state);
        match state.probation {
            Some(until) if until > now => true,
            Some(_) => {
                state.probation = None;
                false
            }
            None => false,
        }
    }

    /// Where the next release comes from: the store while it works (or
    /// when it is time to try it again), else the lane's policy.
    pub(crate) fn source(&self, now: Instant) -> Source {
        let state = lock(&self.state);
        match state.mode {
            StoreMode::Shared => Source::Store,
            _ if now >= state.probe_at => Source::Store,
            StoreMode::Fallback => Source::Fallback,
            StoreMode::Unavailable => Source::Refuse,
        }
    }

    /// When a lane off the store tries it again.
    pub(crate) fn probe_at(&self) -> Instant {
        lock(&self.state).probe_at
    }

    /// A call failed: fall back or close, per the lane's policy; try again
    /// after `probe_every`. Returns the new mode.
    pub(crate) fn failed(&self, error: StoreError, lane: &str) -> StoreMode {
        let mode = match self.failure {
            StoreFailure::Open => StoreMode::Fallback,
            StoreFailure::Closed => StoreMode::Unavailable,
        };
        let mut state = lock(&self.state);
        if state.mode != mode {
            tracing::warn!(lane, %error, mode = mode.label(), "callshaper: the shared store failed; the lane leaves the shared quota");
            self.metrics.mode(mode.label());
            if mode == StoreMode::Fallback && state.mode == StoreMode::Shared {
                // Other instances may still hold slots booked before the
                // failure, up to a horizon ahead, and will use them. Count
                // one release at the end of that horizon: the fallback's
                // first request comes a share's interval after every slot
                // booked in the store (a windowed meter then still allows
                // the rest of its share at once; see the README).
                let after = later(Instant::now(), self.settings.horizon);
                for gate in &self.gates {
                    gate.meters().commit(1, after);
                }
            }
        }
        state.mode = mode;
        state.probe_at = later(Instant::now(), self.settings.probe_every);
        state.last_error = Some(error);
        mode
    }

    /// A call succeeded: back on the shared quota.
    pub(crate) fn recovered(&self, lane: &str) {
        let mut state = lock(&self.state);
        if state.mode != StoreMode::Shared {
            tracing::info!(
                lane,
                "callshaper: the shared store is back; the lane is on the shared quota again"
            );
            self.metrics.mode(StoreMode::Shared.label());
            // Every other instance finds the store within a probe interval;
            // a window later, what they sent on their own has left the
            // vendor's window too. Until then the share still applies.
            let back = self.settings.probe_every.saturating_add(self.keep);
            state.probation = Some(later(Instant::now(), back));
        }
        state.mode = StoreMode::Shared;
        state.last_error = None;
    }
}

/// A duration in microseconds, the stores' unit, saturating.
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test(start_paused = true)]
    async fn slots_of_a_fast_reply_keep_their_gap_to_a_slow_ones() {
        let mut clock = StoreClock::default();
        let t0 = Instant::now();
        // A slow first reply: computed at store time 1_000_000 us, received
        // 80 ms after it was sent; its first slot goes when it arrives.
        clock.reply(t0, t0 + 80 * MS, 1_000_000);
        let first = clock.local_time(1_000_000).unwrap();
        assert_eq!(first, t0 + 80 * MS);
        // The slow reply was computed early (5 ms in) and came back late.
        // A fast reply sent 100 ms in is computed at 1_096_000: mapped by
        // its own receipt, its slot at 1_100_000 would go at 105 ms, 25 ms
        // after the burst the vendor saw at 80 ms. It must keep the 100 ms
        // the store reserved between them.
        clock.reply(t0 + 100 * MS, t0 + 101 * MS, 1_096_000);
        let second = clock.local_time(1_100_000).unwrap();
        assert_eq!(second - first, 100 * MS);
        // Never before the reply itself allows: a slot at the reply's own
        // time is not due before the reply came back.
        assert!(clock.local_time(1_096_000).unwrap() >= t0 + 101 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slower_reply_moves_the_mapping_later() {
        let mut clock = StoreClock::default();
        let t0 = Instant::now();
        clock.reply(t0, t0 + MS, 1_000_000);
        clock.reply(t0 + 10 * MS, t0 + 60 * MS, 1_010_000);
        // Store time 1_010_000 is due at the second reply's receipt, 50 ms
        // after the first mapping would have put it.
        assert_eq!(clock.local_time(1_010_000).unwrap(), t0 + 60 * MS);
        // Settling maps a local instant by the latest send.
        assert_eq!(clock.store_time(t0 + 20 * MS), Some(1_020_000));
    }

    #[tokio::test(start_paused = true)]
    async fn hostile_store_times_saturate() {
        let mut clock = StoreClock::default();
        let t0 = Instant::now();
        clock.reply(t0, t0, i64::MIN);
        assert!(clock.local_time(i64::MAX).unwrap() > t0);
        clock.reply(t0, t0, i64::MAX);
        assert_eq!(clock.local_time(i64::MIN), Some(t0));
        assert!(clock.store_time(t0 + MS).is_some());
    }
}
