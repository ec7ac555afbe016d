//! A lane's gates in Redis ([`SharedStore`] and [`StoreLane`] for
//! Redis): their keys and meters as script arguments.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use super::client::{RedisStore, duration};
use super::scripts::{PAUSE, RESERVE, SETTLE};
use crate::error::StoreError;
use crate::gate::Gate;
use crate::meters::{Algorithm, Quota, Unit};
use crate::store::contract::{
    FleetBooked, Moves, Pending, Reservation, SharedStore, StoreLane, StoreSettings,
};
use crate::store::handle::Store;
use crate::sync::{lock, shrink};
use crate::time::micros;

pub(super) fn spec(quota: &Quota, headroom: Duration) -> [i64; SPEC] {
    let (algorithm, capacity) = match quota.algorithm {
        Algorithm::LeakyBucket(rate) => (1, u64::from(rate.count)),
        Algorithm::TokenBucket { capacity, .. } => (2, capacity),
        Algorithm::FixedWindow(rate) => (3, u64::from(rate.count)),
        Algorithm::SlidingLog(rate) => (4, u64::from(rate.count)),
        Algorithm::SlidingWindow(rate) => (5, u64::from(rate.count)),
        // `ShaperBuilder::build` refuses a custom meter with a store; were
        // one to come this far, the fleet keeps to its declared rate.
        Algorithm::Custom(ref meter) => (1, u64::from(meter.rate().count)),
    };
    let rate = quota.rate();
    let unit = match quota.unit {
        Unit::Requests => 0,
        Unit::Cost => 1,
    };
    [
        algorithm,
        unit,
        i64::from(rate.count),
        micros(rate.per.saturating_add(headroom)),
        clamp(capacity),
        micros(rate.per),
    ]
}

/// Numbers per meter in a gate's spec (see `meters.lua`).
pub(super) const SPEC: usize = 6;

pub(super) fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl SharedStore for RedisStore {
    fn settings(&self) -> StoreSettings {
        let options = &self.inner.options;
        StoreSettings {
            batch: options.batch,
            horizon: options.horizon,
            probe_every: options.probe_every,
            fleet_size: options.fleet_size,
        }
    }

    fn moves(&self) -> Option<Moves> {
        match &self.inner.conn {
            #[cfg(feature = "redis-sentinel")]
            super::client::Conn::Sentinel(followed) => Some(followed.moves()),
            _ => None,
        }
    }

    fn lane(
        &self,
        names: &[&str],
        quotas: &[Vec<Quota>],
        headroom: Duration,
        keep: Duration,
        gates: &[Arc<Gate>],
    ) -> Box<dyn StoreLane> {
        let vendor = names.last().copied().unwrap_or("");
        let keys: Vec<String> = names.iter().map(|name| self.key(vendor, name)).collect();
        {
            let mut registry = lock(&self.inner.gates);
            for (key, gate) in keys.iter().zip(gates) {
                let same = registry.entry(key.clone()).or_default();
                if !same.iter().any(|known| known.as_ptr() == Arc::as_ptr(gate)) {
                    same.push(Arc::downgrade(gate));
                }
            }
        }
        let specs = quotas
            .iter()
            .map(|quotas| quotas.iter().flat_map(|q| spec(q, headroom)).collect())
            .collect();
        Box::new(RedisLane {
            store: self.clone(),
            keys,
            specs,
            headroom: micros(headroom),
            keep: micros(keep),
            booked: AtomicI64::new(0),
            me: fastrand::i64(1..i64::MAX),
        })
    }
}

impl From<RedisStore> for Store {
    fn from(store: RedisStore) -> Self {
        Store::new(store)
    }
}

/// A lane's gates in Redis: their keys and meters as script arguments.
pub(super) struct RedisLane {
    pub(super) store: RedisStore,
    pub(super) keys: Vec<String>,
    /// Per gate: its meters as script arguments.
    pub(super) specs: Vec<Vec<i64>>,
    pub(super) headroom: i64,
    /// How long a gate's state matters once idle (us): every write's TTL.
    pub(super) keep: i64,
    /// The latest slot this lane reserved, in store time (us; 0: none):
    /// a gate found empty before `booked + keep` lost its state.
    pub(super) booked: AtomicI64,
    /// This lane's name among the fleet's for the fair share: random.
    pub(super) me: i64,
}

impl RedisLane {
    /// The gate specs as script arguments, with each gate's pace now.
    pub(super) fn spec_args(&self, paces: &[Option<Duration>], args: &mut Vec<i64>) {
        for (i, spec) in self.specs.iter().enumerate() {
            let pace = paces.get(i).copied().flatten().map_or(0, micros);
            args.push(pace);
            args.push(i64::try_from(spec.len() / SPEC).unwrap_or(0));
            args.extend_from_slice(spec);
        }
    }

    /// Correct charges, in the background: give back (`mode` 1) or settle
    /// (`mode` 0) `(t, charged, actual)` slots.
    pub(super) fn correct(
        &self,
        mode: i64,
        slots: Vec<(i64, u64, u64)>,
        seqs: Vec<i64>,
        paces: &[Option<Duration>],
    ) {
        if slots.is_empty() {
            return;
        }
        let mut args = vec![self.store.now_arg(), self.headroom, mode];
        args.extend(seqs);
        args.push(i64::try_from(slots.len()).unwrap_or(0));
        for (t, charged, actual) in slots {
            args.extend([t, clamp(charged), clamp(actual)]);
        }
        self.spec_args(paces, &mut args);
        let store = self.store.clone();
        let keys = self.keys.clone();
        tokio::spawn(async move {
            let done: Result<i64, _> = store.invoke(&SETTLE, &keys, &args, None).await;
            if let Err(error) = done {
                tracing::debug!(%error, "callshaper: a correction did not reach Redis");
            }
        });
    }
}

impl StoreLane for RedisLane {
    fn reserve<'a>(
        &'a self,
        costs: &'a [u64],
        waiting: usize,
        paces: &'a [Option<Duration>],
    ) -> Pending<'a, Result<Reservation, StoreError>> {
        Box::pin(async move {
            let options = &self.store.inner.options;
            let mut args = vec![
                self.store.now_arg(),
                self.headroom,
                micros(options.horizon),
                self.keep,
                self.booked.load(Ordering::Relaxed),
                self.me,
                i64::try_from(waiting).unwrap_or(i64::MAX),
                i64::try_from(costs.len()).unwrap_or(0),
            ];
            args.extend(costs.iter().map(|&c| clamp(c)));
            self.spec_args(paces, &mut args);
            let reply: Vec<i64> = self.store.invoke(&RESERVE, &self.keys, &args, None).await?;
            let malformed = || StoreError::Failed(format!("unexpected reserve reply {reply:?}"));
            let gates = self.keys.len();
            let (head, rest) = reply.split_at_checked(4 + gates).ok_or_else(malformed)?;
            let &[now, hold, paused, lost] = &head[..4] else {
                return Err(malformed());
            };
            // Each slot's wait, then two numbers per slot and gate.
            let per_slot = 1 + 2 * gates;
            if rest.len() % per_slot != 0 {
                return Err(malformed());
            }
            let (waits, booked) = rest.split_at(rest.len() / per_slot);
            let slots: Vec<i64> = waits
                .iter()
                .map(|&w| now.saturating_add(w.max(0)))
                .collect();
            let fleet = booked
                .chunks_exact(2 * gates.max(1))
                .map(|slot| {
                    slot.chunks_exact(2)
                        .map(|pair| {
                            Some(FleetBooked {
                                count: u64::try_from(pair[0]).ok()?,
                                leaves: (pair[1] >= 0).then_some(pair[1]),
                            })
                        })
                        .collect()
                })
                .collect();
            if let Some(&latest) = slots.last() {
                self.booked.fetch_max(latest, Ordering::Relaxed);
            }
            Ok(Reservation {
                now,
                slots,
                hold: (hold > 0).then(|| duration(hold.saturating_sub(now))),
                paused: (paused > now).then(|| duration(paused.saturating_sub(now))),
                lost: lost == 1,
                seqs: head[4..].to_vec(),
                fleet,
            })
        })
    }

    fn give_back(&self, slots: Vec<(i64, u64)>, seqs: Vec<i64>, paces: &[Option<Duration>]) {
        let slots = slots.into_iter().map(|(t, c)| (t, c, 0)).collect();
        self.correct(1, slots, seqs, paces);
    }

    fn forget(&self, slots: Vec<(i64, u64)>, paces: &[Option<Duration>]) {
        let slots = slots.into_iter().map(|(t, c)| (t, c, 0)).collect();
        let seqs = vec![0; self.keys.len()];
        self.correct(2, slots, seqs, paces);
    }

    fn settle(&self, t: i64, charged: u64, actual: u64, paces: &[Option<Duration>]) {
        let seqs = vec![0; self.keys.len()];
        self.correct(0, vec![(t, charged, actual)], seqs, paces);
    }

    fn pause(&self, pause: Duration) {
        let args = [self.store.now_arg(), micros(pause), self.keep];
        let store = self.store.clone();
        let keys = self.keys.clone();
        tokio::spawn(async move {
            let channel = store.inner.channel.clone();
            let done: Result<i64, _> = store.invoke(&PAUSE, &keys, &args, Some(&channel)).await;
            if let Err(error) = done {
                tracing::warn!(%error, "callshaper: a pause did not reach Redis; other instances learn it from their own throttles");
            }
        });
    }
}

impl Drop for RedisLane {
    fn drop(&mut self) {
        // Forget the gates no lane holds any more (ours among them, when
        // ours was the last lane holding it).
        let mut registry = lock(&self.store.inner.gates);
        for key in &self.keys {
            if let Some(same) = registry.get_mut(key) {
                same.retain(|known| known.strong_count() > 0);
                if same.is_empty() {
                    registry.remove(key);
                }
            }
        }
        shrink(&mut registry);
    }
}
