//! Admission: whether a request may join the lane's queue, decided at
//! once, and the fast path that releases it without queueing when nobody
//! waits.
//!
//! A request is refused at the door, never after waiting, when its cost can
//! never fit a quota, when the queue is full, or when the wait it would see
//! is past its `max_wait`. The prediction reads the queue depth, the pause
//! and each meter's own shape ([`Meter::eta`](crate::meters::Meter::eta)): a
//! burst-capable meter predicts a burst, a leaky bucket a trickle.

use std::sync::MutexGuard;
use std::time::Duration;

use tokio::time::Instant;

use super::handle::{Lane, Place, Slot};
use super::policy::Priority;
use super::shared::Waiting;
use super::turn::earliest_at;
use super::turn::{Door, Strict, Transit, Turn, departure};
use super::waiter::Waiter;
use crate::error::Error;
use crate::meters::Meters;
use crate::meters::rate::spacing;
use crate::store::StoreMode;
use crate::time::{Stamp, later};

impl Lane {
    /// [`enter_at`](Self::enter_at) the next place.
    #[cfg(test)]
    pub(crate) fn enter(
        &self,
        cost: u64,
        priority: Priority,
        max_wait: Option<Duration>,
    ) -> Result<Place, Error> {
        self.enter_at(None, cost, priority, max_wait)
    }

    /// Join the back of the queue, at the place numbered `seq` when given
    /// (a request a layer above sends again keeps the place it had, ahead
    /// of everything submitted after it, unless it had it in a lane of
    /// this name that went since: see `Shared::seq_for`): refused at once
    /// when the cost can never fit, when the queue is full, or when the
    /// predicted wait is past `max_wait`.
    pub(crate) fn enter_at(
        &self,
        seq: Option<u64>,
        cost: u64,
        priority: Priority,
        max_wait: Option<Duration>,
    ) -> Result<Place, Error> {
        self.admits(cost)?;
        let mut place = self.numbered(seq, cost, priority, max_wait)?;
        match self.turn_now(cost) {
            Some(turn) => place.slot = Slot::Ready(turn),
            None => self.join(&mut place)?,
        }
        Ok(place)
    }

    /// An admitted request's place, numbered `seq` when given and this
    /// lane's (else the next number), not yet in the queue: refused when
    /// its predicted wait is past `max_wait`, which is its deadline.
    pub(super) fn numbered(
        &self,
        seq: Option<u64>,
        cost: u64,
        priority: Priority,
        max_wait: Option<Duration>,
    ) -> Result<Place, Error> {
        let shared = &self.shared;
        // Only a request with a deadline needs the clock here.
        let deadline = match max_wait {
            None => None,
            Some(max_wait) => {
                let now = Instant::now();
                let predicted = self.predicted_wait(cost, now);
                if predicted > max_wait {
                    return Err(Error::WouldExceedMaxWait {
                        lane: shared.name().to_string(),
                        predicted,
                        max_wait,
                    });
                }
                Some(Box::new((later(now, max_wait), max_wait)))
            }
        };
        let seq = shared.seq_for(seq);
        Ok(Place {
            seq,
            cost,
            priority,
            slot: Slot::Taken,
            deadline,
        })
    }

    /// Put `place` in the queue: refused when the queue is full.
    pub(super) fn join(&self, place: &mut Place) -> Result<(), Error> {
        let shared = &self.shared;
        let capacity = shared.road.policy.queue_capacity.min(Waiting::MOST);
        let queued = shared.count_in();
        if queued >= capacity {
            shared.count_out();
            return Err(Error::QueueFull {
                lane: shared.name().to_string(),
                capacity,
            });
        }
        let (ticket, waiter) = Waiter::ticket(shared, place.seq, place.cost, place.priority);
        self.send(ticket, waiter, &mut place.slot)
    }

    /// Refused at the door whatever the wait: a gate stopped by the
    /// vendor, or a cost no quota can ever hold.
    pub(super) fn admits(&self, cost: u64) -> Result<(), Error> {
        let shared = &self.shared;
        if let Some(stop) = shared.stopped() {
            return Err(shared.out_of_credit(&stop));
        }
        let too_costly = shared.gates.iter().filter_map(|g| g.too_costly(cost)).min();
        if let Some(capacity) = too_costly {
            return Err(Error::CostTooHigh {
                lane: shared.name().to_string(),
                cost,
                capacity,
            });
        }
        Ok(())
    }

    /// The fast path: when nobody waits, the lane is not paused and the
    /// meters allow it now, take the turn without a trip through the
    /// dispatcher. FIFO holds: "nobody waits" is checked again under the
    /// meters' lock, which the dispatcher also holds from its check to its
    /// charge, so no two releases can share a slot.
    ///
    /// A gate with anything to say at the door (stopped, or a cost past
    /// its quotas) sends the request the slow way, where
    /// [`admits`](Self::admits) says it: a request that goes at once asks
    /// each gate one question, not two passes over the gates.
    pub(super) fn turn_now(&self, cost: u64) -> Option<Turn> {
        let shared = &self.shared;
        if !shared.waiting.none_and_open() {
            return None;
        }
        // Its rare ties, read once: with a shared store every release needs
        // a reservation, which only the dispatcher makes.
        let ties = shared.ties.get();
        if ties.is_some_and(|ties| ties.remote.is_some()) {
            return None;
        }
        let clear = shared
            .gates
            .iter()
            .all(|gate| gate.admits_at_once(cost) && !(shared.is_shared(gate) && gate.has_queue()));
        if !clear {
            return None;
        }
        let permit = match ties.and_then(|ties| ties.in_flight.as_ref()) {
            None => None,
            Some(slots) => Some(slots.clone().try_acquire_owned().ok()?),
        };
        // The clock is read under the lock: an instant read before it may
        // predate the charge of whoever held it, and would send this caller
        // to the queue for nothing (and everyone after it, behind it).
        let (charged_at, stamp, strict) = shared.with_meters(|meters| {
            let now = Instant::now();
            let at = Stamp::of(now);
            let waiting = shared.waiting.count() != 0;
            if waiting || shared.is_paused(now) || earliest_at(meters, cost, now, at) > at {
                return None;
            }
            // Strict: not before the last send's word, released no sooner
            // than its door allows, charged at it (see `lane/turn.rs`).
            // Nearly every lane is not: asked first, of the meters alone.
            let door = if meters.iter().any(|meters| meters.spacing().is_some()) {
                departure(&shared.gates, meters, cost, now).ok()?
            } else {
                None
            };
            if door.is_some_and(|door| door.release() > now) {
                return None;
            }
            let charged = door.map_or(now, Door::at);
            let charged_stamp = if charged == now {
                at
            } else {
                Stamp::of(charged)
            };
            for meter in meters.iter_mut() {
                meter.commit_at(cost, charged, charged_stamp);
            }
            let strict = door.map(|door| {
                Box::new(Strict {
                    transit: Transit::leave(&shared.gates),
                    door: door.shut(now),
                })
            });
            shared.count_release();
            // Stamped once, by the first gate's meters, for the lane too.
            let stamp = meters.first().map(|m| m.last_release());
            Some((charged, stamp, strict))
        })?;
        shared.active(stamp.unwrap_or_else(|| Stamp::of(charged_at)));
        shared.metrics().released();
        Some(Turn {
            in_flight: permit,
            at: charged_at,
            fleet: None,
            strict,
        })
    }

    /// Queue depth, the meters and the pause give the wait a new request
    /// would see. An estimate when costs vary: it takes everyone ahead to
    /// cost as much as this request, and ignores other lanes sharing a
    /// quota, which is why `max_wait` is also enforced while waiting.
    fn predicted_wait(&self, cost: u64, now: Instant) -> Duration {
        let shared = &self.shared;
        // During a pause nothing goes: the queue drains from its end.
        let from = shared.paused_until(now).unwrap_or(now);
        let ahead = u64::try_from(self.queued()).unwrap_or(u64::MAX);
        // On a shared store the local meters are the fallback's share; the
        // fleet's state is in the store. Predict from this lane's queue at
        // the declared pace (other instances' queues are unknown here).
        if let Some(remote) = shared.remote()
            && remote.mode() == StoreMode::Shared
        {
            let interval = shared
                .gates
                .iter()
                .filter_map(|g| g.request_interval())
                .max();
            return at_declared_pace(interval, ahead, from, now);
        }
        by_meters(&shared.meters(), ahead, cost, from, now)
    }
}

/// When `ahead` requests and then one of `cost` have gone through `meters`,
/// starting at `from`: the wait from `now`.
fn by_meters(
    meters: &[MutexGuard<'_, Meters>],
    ahead: u64,
    cost: u64,
    from: Instant,
    now: Instant,
) -> Duration {
    let eta = meters
        .iter()
        .map(|m| m.eta(ahead, cost, from))
        .max()
        .unwrap_or(from);
    eta - now
}

/// The wait behind `ahead` requests at the declared request `interval`,
/// starting at `from`.
fn at_declared_pace(
    interval: Option<Duration>,
    ahead: u64,
    from: Instant,
    now: Instant,
) -> Duration {
    later(from, spacing(interval.unwrap_or_default(), ahead)) - now
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::meters::Quota;

    const SECOND: Duration = Duration::from_secs(1);

    fn meters(quota: Quota, now: Instant) -> Mutex<Meters> {
        let quotas = std::sync::Arc::from([quota]);
        let terms = crate::meters::Terms::new(quotas, Duration::ZERO, now);
        Mutex::new(Meters::new(std::sync::Arc::new(terms), now))
    }

    #[tokio::test(start_paused = true)]
    async fn a_leaky_bucket_predicts_one_interval_per_request_ahead() {
        let now = Instant::now();
        let bucket = meters(Quota::leaky_bucket(10, SECOND), now);
        let locked = [crate::sync::lock(&bucket)];
        assert_eq!(by_meters(&locked, 0, 1, now, now), Duration::ZERO);
        assert_eq!(
            by_meters(&locked, 5, 1, now, now),
            Duration::from_millis(500)
        );
        // A pause of 2 s: the queue drains from its end.
        let paused = now + 2 * SECOND;
        assert_eq!(
            by_meters(&locked, 5, 1, paused, now),
            Duration::from_millis(2500)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_fixed_window_predicts_a_burst_then_the_next_window() {
        let now = Instant::now();
        let window = meters(Quota::fixed_window(10, 60 * SECOND), now);
        let locked = [crate::sync::lock(&window)];
        assert_eq!(by_meters(&locked, 9, 1, now, now), Duration::ZERO);
        assert_eq!(by_meters(&locked, 10, 1, now, now), 60 * SECOND);
    }

    #[tokio::test(start_paused = true)]
    async fn several_meters_predict_the_slowest() {
        let now = Instant::now();
        let requests = meters(Quota::leaky_bucket(10, SECOND), now);
        let tokens = meters(Quota::sliding_log(100, SECOND).per_cost(), now);
        let locked = [crate::sync::lock(&requests), crate::sync::lock(&tokens)];
        // Two requests of 60 tokens ahead: the third must wait for the
        // tokens' window, not the requests' pace.
        assert!(by_meters(&locked, 2, 60, now, now) >= SECOND);
    }

    #[tokio::test(start_paused = true)]
    async fn on_a_shared_store_the_declared_pace_predicts() {
        let now = Instant::now();
        let interval = Some(Duration::from_millis(100));
        assert_eq!(at_declared_pace(interval, 0, now, now), Duration::ZERO);
        assert_eq!(at_declared_pace(interval, 30, now, now), 3 * SECOND);
        assert_eq!(at_declared_pace(None, 30, now, now), Duration::ZERO);
    }
}
