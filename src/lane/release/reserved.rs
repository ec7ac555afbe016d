//! The shared-store engine: slots reserved for a fleet, released when
//! their time comes.
//!
//! A lane asks the store for a slot for its head and for those behind it
//! (one round trip for a batch), then sleeps until each. The store's
//! failure policy ([`Remote`]) says where a release comes from when the
//! store is down: the [`Local`] engine at the fallback share (fail-open),
//! or nowhere, refusing everyone waiting at once (fail-closed).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::{Blocked, Local, Release, Step};
use crate::error::Error;
use crate::gate::PauseCause;
use crate::lane::Shared;
use crate::lane::dispatcher::Ready;
use crate::lane::queue::Head;
use crate::store::{Remote, Source, StoreMode};

/// The least lateness a slot may have and still be used: timers fire a
/// little late even on an idle machine, and a lane with no headroom must
/// not drop every slot for it.
const LATE_MIN: Duration = Duration::from_millis(2);

/// The most a slot may go before its time: tokio's timer tick. A wait
/// shorter than that would sleep a whole tick.
const EARLY_MAX: Duration = Duration::from_millis(1);

/// Releases by slots reserved in a shared store.
pub(in crate::lane) struct Reserved {
    remote: Arc<Remote>,
    /// The fail-open fallback, and the local share kept on probation.
    local: Local,
    /// Reserved slots not yet used, earliest first.
    slots: VecDeque<Booking>,
    /// The gates' reservation counts after the last batch: a give-back is
    /// only safe if nobody reserved since.
    seqs: Vec<i64>,
    /// The next slot is beyond the store's horizon: ask again then.
    hold: Option<Instant>,
}

struct Booking {
    /// When to release, on this instance's clock.
    at: Instant,
    cost: u64,
    /// The slot in the store's time (us).
    t: i64,
}

impl Reserved {
    pub(in crate::lane) fn new(remote: Arc<Remote>) -> Self {
        Self {
            remote,
            local: Local::default(),
            slots: VecDeque::new(),
            seqs: Vec::new(),
            hold: None,
        }
    }

    /// Release the head at its booked slot, or wait for it.
    ///
    /// A slot whose time passed longer ago than half the lane's headroom
    /// (the lane stalled, paused, or kept to its local share on probation)
    /// is dropped, not used: used now, it would go out closer to the slots
    /// after it than the store allowed, and several late ones would go out
    /// at once. Half, as the local meters forgive lateness: the other half
    /// covers the network's jitter. A dropped slot is quota wasted, never
    /// exceeded.
    ///
    /// A slot due within a quarter of the headroom (at most [`EARLY_MAX`])
    /// goes now: a shorter sleep costs a whole timer tick, and the slot's
    /// time is already late by its reply's round trip (see
    /// `store/clock.rs`).
    fn use_slot(&mut self, ready: &mut Ready<'_>, head: Head, now: Instant) -> Option<Step> {
        let headroom = ready.shared.policy.headroom;
        let late = (headroom / 2).max(LATE_MIN);
        while self
            .slots
            .front()
            .is_some_and(|slot| now.saturating_duration_since(slot.at) > late)
        {
            self.slots.pop_front();
        }
        let at = self.slots.front()?.at;
        if at.saturating_duration_since(now) > (headroom / 4).min(EARLY_MAX) {
            return Some(Step::Wait(Blocked::Until(at)));
        }
        if self.remote.on_probation(now) {
            // Back from an outage: other instances may still serve from
            // their fallback share, so keep to ours as well until every one
            // of them has found the store again.
            return Some(match self.local.release_now(ready, head, now) {
                Ok(handed) => {
                    if handed && let Some(slot) = self.slots.pop_front() {
                        self.remote.used(now, slot.t, late);
                    }
                    Step::Done
                }
                Err(blocked) => Step::Wait(blocked),
            });
        }
        let slot = self.slots.pop_front()?;
        if !ready.hand(head, now) {
            // Its caller left just now: the slot serves the next.
            self.slots.push_front(slot);
            return Some(Step::Done);
        }
        self.remote.used(now, slot.t, late);
        if slot.cost != head.cost {
            // Reserved for another cost (a retried request came back
            // ahead): correct the meters that count cost.
            self.remote.settle_at(slot.cost, head.cost, slot.t);
        }
        Some(Step::Done)
    }

    /// Reserve slots for the head and those behind it, in one round trip.
    async fn reserve(&mut self, ready: &mut Ready<'_>, head: Head, now: Instant) -> Step {
        let remote = self.remote.clone();
        let shared = ready.shared;
        let costs = ready.queue.costs(head.class, remote.batch());
        let waiting = shared.waiting.load(Ordering::SeqCst);
        match remote.reserve(&costs, waiting).await {
            Ok(schedule) => {
                remote.recovered(&shared.key);
                if let Some(paused) = schedule.paused {
                    shared.vendor().pause_for(paused, PauseCause::Fleet);
                }
                let slots = schedule.slots.into_iter().zip(costs);
                self.slots
                    .extend(slots.map(|((at, t), cost)| Booking { at, cost, t }));
                self.seqs = schedule.seqs;
                self.hold = schedule.ask_again;
                Step::Done
            }
            Err(error) => match remote.failed(error, &shared.key) {
                StoreMode::Unavailable => {
                    self.refuse_all(ready);
                    Step::Done
                }
                _ => self.fallback(ready, head, now),
            },
        }
    }

    /// Release from the local fallback share. Its next release may be a
    /// horizon away (see `Remote::failed`): the lane wakes for the next
    /// probe before that, so it is back on the store within a probe
    /// interval of the store's return.
    fn fallback(&mut self, ready: &mut Ready<'_>, head: Head, now: Instant) -> Step {
        match self.local.step(ready, head, now) {
            Step::Wait(Blocked::Until(at)) => {
                Step::Wait(Blocked::Until(at.min(self.remote.probe_at())))
            }
            step => step,
        }
    }

    /// A fail-closed lane whose store is down: everyone waiting learns it
    /// now, not after a timeout each.
    fn refuse_all(&mut self, ready: &mut Ready<'_>) {
        let shared = ready.shared;
        self.stand_down(shared);
        let remote = &self.remote;
        ready.refuse_all(|| Error::StoreUnavailable {
            lane: shared.key.clone(),
            source: remote.last_error(),
        });
    }

    /// Give back the slots this lane reserved and will not use.
    fn give_back(&mut self) {
        self.hold = None;
        if self.slots.is_empty() {
            return;
        }
        let slots = self.slots.drain(..).rev().map(|b| (b.t, b.cost)).collect();
        self.remote.give_back(slots, std::mem::take(&mut self.seqs));
    }
}

impl Release for Reserved {
    async fn release(&mut self, ready: &mut Ready<'_>, head: Head, now: Instant) -> Step {
        match self.remote.source(now) {
            Source::Store => {}
            Source::Fallback => return self.fallback(ready, head, now),
            Source::Refuse => {
                self.refuse_all(ready);
                return Step::Done;
            }
        }
        if let Some(step) = self.use_slot(ready, head, now) {
            return step;
        }
        if let Some(hold) = self.hold {
            if hold > now {
                return Step::Wait(Blocked::Until(hold));
            }
            self.hold = None;
        }
        self.reserve(ready, head, now).await
    }

    fn step_aside(&mut self, shared: &Shared) {
        self.local.step_aside(shared);
    }

    /// Slots reserved before a pause or for callers who left are of no use
    /// now: they go back to the fleet.
    fn stand_down(&mut self, shared: &Shared) {
        self.local.step_aside(shared);
        self.give_back();
    }
}
