//! The shared-store engine: slots reserved for a fleet, released when
//! their time comes.
//!
//! A lane asks the store for a slot for its head and for those behind it
//! (one round trip for a batch), then sleeps until each. A lane whose
//! slots all come due at once (a quota far above its demand) asks for the
//! next batches while it uses them, so it does not wait a round trip per
//! batch. The store's failure policy ([`Remote`]) says where a release
//! comes from when the store is down: the [`Local`] engine at the fallback
//! share (fail-open), or nowhere, refusing everyone waiting at once
//! (fail-closed).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::engine::{Blocked, Release, Step};
use super::local::Local;
use super::ready::Ready;
use crate::error::{Error, StoreError};
use crate::gate::{Gate, PauseCause};
use crate::lane::queue::Head;
use crate::lane::shared::Shared;
use crate::lane::turn::Fleet;
use crate::lane::turn::LEAD;
use crate::meters::FIRST_WORD;
use crate::store::{Remote, Schedule, Source, StoreMode};
use crate::time::later;

/// The least lateness a slot may have and still be used: timers fire a
/// little late even on an idle machine, and a lane with no headroom must
/// not drop every slot for it.
const LATE_MIN: Duration = Duration::from_millis(2);

/// The most a slot may go before its time: tokio's timer tick. A wait
/// shorter than that would sleep a whole tick.
const EARLY_MAX: Duration = Duration::from_millis(1);

/// The most reservations a lane keeps on their way: enough to keep the
/// store and the lane both busy, few enough that a pause gives back little.
const AHEAD_MAX: usize = 4;

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
    /// The next batches, asked for while the slots held are used, oldest
    /// first.
    ahead: VecDeque<Ahead>,
    /// The vendor's bucket, as far as this lane sees it (see `Burst`).
    burst: Burst,
}

/// A burst of slots on a vendor's bucket, held to what the bucket has, as
/// in memory (see `Meters::first_word` and `Meters::hold_to`). Without
/// it a fleet's burst goes whole into a vendor bucket that may hold less:
/// one declared larger than the vendor's, or one another deploy spent.
///
/// Slots booked within half the vendor's interval of the one before are a
/// burst (a fleet's come one a round trip apart, each due at once; the
/// store's pace books them an interval apart, and they go as booked). The
/// rest of a burst waits for the vendor's first answer (at most
/// [`FIRST_WORD`] after its first slot went), then goes at once, one slot
/// fewer when it goes later than the lateness forgiven (the slots after
/// the burst keep their times, and must not come closer to it than
/// booked). No slot of a burst goes past what the vendor's bucket last
/// said it had left (plus what the lane's pace refilled since), less what
/// this lane sent since the request that answer counted; those slots are
/// wasted, never sent.
#[derive(Default)]
struct Burst {
    /// The time the last slot handed was booked for.
    at: Option<Instant>,
    /// The first slot went before the vendor had answered: when.
    unheard: Option<Instant>,
    /// When this lane handed its recent slots, oldest first.
    handed: VecDeque<Instant>,
}

/// The most recent hand-outs a lane remembers to hold a burst to the
/// vendor's bucket: more than any burst a vendor's answer can trail.
const HANDED_MAX: usize = 1_024;

impl Burst {
    /// Whether a slot booked for `at` is in the burst of one booked for
    /// `after`, at the vendor gate's `reach` (half its interval).
    fn follows(at: Instant, after: Option<Instant>, reach: Duration) -> bool {
        after.is_some_and(|after| at <= later(after, reach))
    }

    fn holds(&self, slot: &Booking, reach: Duration) -> bool {
        Self::follows(slot.at, self.at, reach)
    }

    /// How many slots this lane handed after `counted`. The vendor's word
    /// only moves forward (see `VendorModel::said_left`): those handed before it
    /// are forgotten, so a lane on a bucket vendor remembers only what is
    /// on its way.
    fn sent_since(&mut self, counted: Instant) -> u64 {
        while self.handed.front().is_some_and(|&at| at <= counted) {
            self.handed.pop_front();
        }
        self.handed.len() as u64
    }

    fn handed(&mut self, slot: &Booking, now: Instant, heard: bool) {
        self.at = Some(slot.at);
        if !heard && self.unheard.is_none() {
            self.unheard = Some(now);
        }
        if self.handed.len() == HANDED_MAX {
            self.handed.pop_front();
        }
        self.handed.push_back(now);
    }
}

/// A reservation on its way, for the requests behind the slots held.
struct Ahead {
    costs: Vec<u64>,
    reply: JoinHandle<Result<Schedule, StoreError>>,
}

struct Booking {
    /// When to release, on this instance's clock.
    at: Instant,
    cost: u64,
    /// The slot in the store's time (us).
    t: i64,
    /// What the fleet booked in each gate's window ending at the slot: a
    /// vendor's answer to its request is read against it.
    fleet: Fleet,
}

impl Reserved {
    pub(in crate::lane) fn new(remote: Arc<Remote>) -> Self {
        Self {
            remote,
            local: Local::default(),
            slots: VecDeque::new(),
            seqs: Vec::new(),
            hold: None,
            ahead: VecDeque::new(),
            burst: Burst::default(),
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
    ///
    /// A strict lane's slot never goes early, nor a tick late: its turn is
    /// released [`LEAD`] ahead and waits at the door for the slot's
    /// instant (`lane/turn.rs`), so the fleet's sends keep the store's
    /// spacing on the wire, within the mapping of each instance's clock to
    /// the store's, which the headroom absorbs.
    fn use_slot(&mut self, ready: &mut Ready<'_>, head: Head, now: Instant) -> Option<Step> {
        let headroom = ready.shared.road.policy.headroom;
        let late = late(headroom);
        let strict = ready
            .shared
            .gates
            .iter()
            .any(|gate| gate.spacing().is_some());
        let timing = Timing::new(strict, headroom);
        let vendor = ready.shared.vendor();
        let reach = vendor.gate().request_interval().unwrap_or_default() / 2;
        if let Some(wait) = self.first_word(vendor.gate(), now, reach, late) {
            return Some(Step::Wait(wait));
        }
        while self
            .slots
            .front()
            .is_some_and(|slot| now.saturating_duration_since(slot.at) > late)
        {
            self.slots.pop_front();
        }
        if let Some((left, counted)) = vendor.left(now) {
            let sent = self.burst.sent_since(counted);
            while self
                .slots
                .front()
                .is_some_and(|slot| self.burst.holds(slot, reach) && sent >= left)
            {
                self.slots.pop_front();
            }
        }
        if let Some(release) = timing.wait(self.slots.front()?.at, now) {
            return Some(Step::Wait(Blocked::Until(release)));
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
        let (charged, door) = timing.hand(slot.at, now);
        if !ready.hand(head, charged, Some(slot.fleet.clone()), strict, door) {
            // Its caller left just now: the slot serves the next.
            self.slots.push_front(slot);
            return Some(Step::Done);
        }
        self.burst.handed(&slot, now, vendor.gate().has_heard());
        self.remote.used(now, slot.t, late);
        if slot.cost != head.cost {
            // Reserved for another cost (a retried request came back
            // ahead): correct the meters that count cost.
            self.remote.settle_at(slot.cost, head.cost, slot.t);
        }
        self.ask_ahead(ready, head, later(slot.at, timing.early));
        Some(Step::Done)
    }

    /// The rest of a burst waits for the vendor's first answer (see
    /// [`Burst`]); once it came, or [`FIRST_WORD`] passed, the slots held
    /// for it are due now.
    fn first_word(
        &mut self,
        vendor: &Gate,
        now: Instant,
        reach: Duration,
        late: Duration,
    ) -> Option<Blocked> {
        let sent = self.burst.unheard?;
        // A fleet's slots come a reservation at a time: none held yet is
        // no sign the burst is over.
        let slot = self.slots.front()?;
        if !self.burst.holds(slot, reach) {
            self.burst.unheard = None;
            return None;
        }
        let until = later(sent, FIRST_WORD);
        if !vendor.has_heard() && now < until {
            let answer = vendor.next_turn();
            if !vendor.has_heard() {
                return Some(Blocked::Turn(Box::pin(async move {
                    // Past `until` the burst goes anyway.
                    let _ = tokio::time::timeout_at(until, answer).await;
                })));
            }
        }
        self.burst.unheard = None;
        if now.saturating_duration_since(slot.at) > late {
            self.slots.pop_front();
        }
        let mut after = self.burst.at;
        for slot in &mut self.slots {
            if !Burst::follows(slot.at, after, reach) {
                break;
            }
            after = Some(slot.at);
            // Held late for the word, never sent before its time.
            slot.at = slot.at.max(now);
        }
        self.burst.at = Some(now);
        None
    }

    /// Reserve for the requests behind the slots held while those are
    /// used, when the lane holds slots and every one is due by `due` (the
    /// slot just used, and the early tolerance): the store hands out slots
    /// faster than the lane uses them, and the lane will need the next
    /// batches before any timer fires. A lane paced by its quota holds
    /// slots further apart than that, and asks when they run out.
    fn ask_ahead(&mut self, ready: &mut Ready<'_>, head: Head, due: Instant) {
        let room = AHEAD_MAX - self.ahead.len().min(AHEAD_MAX);
        if room == 0 || self.hold.is_some() || self.slots.back().is_none_or(|s| s.at > due) {
            return;
        }
        let batch = self.remote.batch().max(1);
        let asked = self.slots.len() + self.ahead.iter().map(|a| a.costs.len()).sum::<usize>();
        let waiting = ready.shared.waiting.count();
        // Full batches only: the rest wait for the slots held to run out,
        // and ask then for whoever waits, as a lane does.
        let batches = (waiting.saturating_sub(asked) / batch).min(room);
        if batches == 0 {
            return;
        }
        let costs = ready.queue.costs(head.class, asked + batches * batch);
        for costs in costs.get(asked..).unwrap_or_default().chunks_exact(batch) {
            let remote = self.remote.clone();
            let booked = costs.to_vec();
            let reply = tokio::spawn(async move { remote.reserve(&booked, waiting).await });
            self.ahead.push_back(Ahead {
                costs: costs.to_vec(),
                reply,
            });
        }
    }

    /// Reserve slots for the head and those behind it, in one round trip.
    async fn reserve(&mut self, ready: &mut Ready<'_>, head: Head, now: Instant) -> Step {
        let costs = ready.queue.costs(head.class, self.remote.batch());
        let waiting = ready.shared.waiting.count();
        let reply = self.remote.reserve(&costs, waiting).await;
        self.absorb(ready, head, now, costs, reply)
    }

    /// Take a reservation's slots for `costs`, or follow the store's
    /// failure policy.
    fn absorb(
        &mut self,
        ready: &mut Ready<'_>,
        head: Head,
        now: Instant,
        costs: Vec<u64>,
        reply: Result<Schedule, StoreError>,
    ) -> Step {
        let shared = ready.shared;
        match reply {
            Ok(schedule) => {
                self.remote.recovered(shared.name());
                if let Some(paused) = schedule.paused {
                    shared
                        .vendor_gate()
                        .pause_for(paused, PauseCause::Fleet, None);
                }
                let slots = schedule.slots.into_iter().zip(schedule.fleet).zip(costs);
                self.slots
                    .extend(slots.map(|(((at, t), fleet), cost)| Booking { at, cost, t, fleet }));
                self.seqs = schedule.seqs;
                self.hold = schedule.ask_again;
                Step::Done
            }
            Err(error) => {
                // Slots held from before are of no use off the store: the
                // fallback keeps its own count.
                self.slots.clear();
                match self.remote.failed(error, shared.name()) {
                    StoreMode::Unavailable => {
                        self.refuse_all(ready);
                        Step::Done
                    }
                    _ => self.fallback(ready, head, now),
                }
            }
        }
    }

    /// Release from the local fallback share. Its next release may be a
    /// horizon away (see `Remote::failed`): the lane wakes for the next
    /// probe before that, so it is back on the store within a probe
    /// interval of the store's return, or at once when the store says its
    /// master moved (Sentinel).
    fn fallback(&mut self, ready: &mut Ready<'_>, head: Head, now: Instant) -> Step {
        match self.local.step(ready, head, now) {
            Step::Wait(Blocked::Until(at)) => {
                let at = at.min(self.remote.probe_at());
                match self.remote.master_moved() {
                    None => Step::Wait(Blocked::Until(at)),
                    Some(moved) => Step::Wait(Blocked::Turn(Box::pin(async move {
                        tokio::select! {
                            () = tokio::time::sleep_until(at) => {}
                            () = moved => {}
                        }
                    }))),
                }
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
            lane: shared.name().to_string(),
            source: remote.last_error(),
        });
    }

    /// Give back the slots this lane reserved and will not use, latest
    /// first; a reservation still on its way was made after them, and goes
    /// back with them once it arrives.
    fn give_back(&mut self) {
        self.hold = None;
        let mut slots: Vec<(i64, u64)> = self.slots.drain(..).map(|b| (b.t, b.cost)).collect();
        let seqs = std::mem::take(&mut self.seqs);
        let remote = self.remote.clone();
        if self.ahead.is_empty() {
            slots.reverse();
            remote.give_back(slots, seqs);
            return;
        }
        let ahead = std::mem::take(&mut self.ahead);
        tokio::spawn(async move {
            let mut seqs = seqs;
            for ahead in ahead {
                // One that failed booked nothing, or nobody knows what: the
                // count then refuses the give-back, which wastes the slots
                // but never hands them out twice.
                if let Ok(Ok(schedule)) = ahead.reply.await {
                    let times = schedule.slots.iter().map(|&(_, t)| t);
                    slots.extend(times.zip(ahead.costs));
                    seqs = schedule.seqs;
                }
            }
            slots.reverse();
            remote.give_back(slots, seqs);
        });
    }
}

/// How late a slot may still be used: half the headroom, as the local
/// meters forgive lateness, so the other half still covers the network's
/// jitter.
fn late(headroom: Duration) -> Duration {
    (headroom / 2).max(LATE_MIN)
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
        let arrived = self
            .ahead
            .front()
            .is_some_and(|ahead| self.slots.is_empty() || ahead.reply.is_finished());
        if arrived && let Some(ahead) = self.ahead.pop_front() {
            let reply = ahead.reply.await.unwrap_or_else(|ended| {
                Err(StoreError::Failed(format!(
                    "the reservation ended: {ended}"
                )))
            });
            return self.absorb(ready, head, now, ahead.costs, reply);
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

    /// Slots reserved for callers who left are of no use now: they go
    /// back to the fleet.
    fn stand_down(&mut self, shared: &Shared) {
        self.local.step_aside(shared);
        self.give_back();
    }

    /// Slots inside the pause are of no use; those after it, or late by
    /// no more than a slot may be (see `use_slot`) when it ends, are still
    /// the lane's, as the store books none inside a fleet's pause. A short
    /// pause (a spent window, a contested last unit: one a window while
    /// another consumer is busy) then costs neither a new reservation nor
    /// slots given back that the meters could not take (the slots after
    /// them are held) and that would push the next booking out. Those
    /// inside only leave the fleet's ledger. With a reservation still on
    /// its way, whose slots are not known yet, everything goes back.
    fn pause_until(&mut self, shared: &Shared, until: Instant) {
        if !self.ahead.is_empty() {
            return self.stand_down(shared);
        }
        self.local.step_aside(shared);
        let late = late(shared.road.policy.headroom);
        let inside = self
            .slots
            .partition_point(|slot| later(slot.at, late) < until);
        if inside == self.slots.len() {
            return self.give_back();
        }
        let mut slots: Vec<(i64, u64)> =
            self.slots.drain(..inside).map(|b| (b.t, b.cost)).collect();
        slots.reverse();
        self.remote.forget(slots);
    }
}

/// When a slot goes, in the default mode or a strict lane's (see
/// [`Reserved::use_slot`]).
#[derive(Debug, Clone, Copy)]
struct Timing {
    strict: bool,
    /// How early a default slot may go rather than sleep: a quarter of
    /// the headroom, at most [`EARLY_MAX`]; none for a strict lane.
    early: Duration,
}

impl Timing {
    fn new(strict: bool, headroom: Duration) -> Self {
        let early = if strict {
            Duration::ZERO
        } else {
            (headroom / 4).min(EARLY_MAX)
        };
        Self { strict, early }
    }

    /// Until when a slot booked for `at` waits, at `now`: a strict turn
    /// is released [`LEAD`] ahead of its slot, a default one at it, or now
    /// if it is due within the early margin. `None`: it goes now.
    fn wait(&self, at: Instant, now: Instant) -> Option<Instant> {
        let release = if self.strict {
            at.checked_sub(LEAD).unwrap_or(at)
        } else {
            at
        };
        (release > now && at.saturating_duration_since(now) > self.early).then_some(release)
    }

    /// A slot booked for `at`, handed out at `now`: when the meters are
    /// charged, and the door its caller waits at before sending. A strict
    /// turn is charged at its slot and waits for it; a default one goes
    /// now.
    fn hand(&self, at: Instant, now: Instant) -> (Instant, Option<Instant>) {
        if self.strict {
            (at.max(now), (at > now).then_some(at))
        } else {
            (now, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::{Booking, Burst, EARLY_MAX, HANDED_MAX, LATE_MIN, Timing, late};
    use crate::lane::turn::LEAD;

    fn slot(at: Instant) -> Booking {
        Booking {
            at,
            cost: 1,
            t: 0,
            fleet: Arc::new(Vec::new()),
        }
    }

    /// A slot is in a burst when it is booked within the reach (half the
    /// vendor's interval) of the last one handed; the first handed before
    /// the vendor answered starts the wait for its word.
    #[tokio::test(start_paused = true)]
    async fn a_burst_is_the_slots_within_reach_of_the_last_handed() {
        let reach = Duration::from_millis(50);
        let t0 = Instant::now();
        let mut burst = Burst::default();
        assert!(!burst.holds(&slot(t0), reach), "nothing handed yet");
        burst.handed(&slot(t0), t0, false);
        assert_eq!(burst.unheard, Some(t0));
        assert!(burst.holds(&slot(t0 + reach), reach));
        assert!(!burst.holds(&slot(t0 + reach + Duration::from_micros(1)), reach));
        burst.handed(&slot(t0 + reach), t0 + reach, true);
        assert_eq!(burst.unheard, Some(t0), "the first unheard hand-out stays");
    }

    /// What the lane sent since the request a vendor's word counted: those
    /// handed before it are forgotten, and the memory is bounded.
    #[tokio::test(start_paused = true)]
    async fn what_was_sent_since_the_vendors_word_is_counted() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut burst = Burst::default();
        for i in 0..5 {
            burst.handed(&slot(t0), t0 + ms(i), true);
        }
        assert_eq!(burst.sent_since(t0 + ms(1)), 3);
        assert_eq!(burst.sent_since(t0 + ms(4)), 0);
        for i in 0..HANDED_MAX + 10 {
            burst.handed(
                &slot(t0),
                t0 + ms(10) + Duration::from_micros(i as u64),
                true,
            );
        }
        assert_eq!(burst.handed.len(), HANDED_MAX);
    }

    /// A slot may be used up to half the headroom late, never less than
    /// the timers' own lateness.
    #[test]
    fn a_slot_is_late_past_half_the_headroom() {
        assert_eq!(late(Duration::from_millis(30)), Duration::from_millis(15));
        assert_eq!(late(Duration::ZERO), LATE_MIN);
        assert_eq!(late(Duration::MAX), Duration::MAX / 2);
    }

    /// A default slot due within a quarter of the headroom (at most a
    /// millisecond) goes now and is charged now; a later one waits for
    /// its instant. A strict one is released [`LEAD`] ahead, charged at its
    /// slot and held at the door until it, and never goes early.
    #[tokio::test(start_paused = true)]
    async fn a_strict_slot_goes_at_its_instant_and_a_default_one_may_go_early() {
        let now = Instant::now();
        let us = Duration::from_micros;
        let default = Timing::new(false, Duration::from_millis(2));
        assert_eq!(default.wait(now + us(500), now), None);
        assert_eq!(default.hand(now + us(500), now), (now, None));
        assert_eq!(default.wait(now + us(501), now), Some(now + us(501)));
        let wide = Timing::new(false, Duration::from_secs(60));
        assert_eq!(wide.early, EARLY_MAX, "capped");
        assert_eq!(wide.wait(now + us(1_001), now), Some(now + us(1_001)));

        let strict = Timing::new(true, Duration::from_secs(60));
        assert_eq!(strict.early, Duration::ZERO);
        let at = now + LEAD + us(500);
        assert_eq!(strict.wait(at, now), Some(now + us(500)));
        let soon = now + us(500);
        assert_eq!(strict.wait(soon, now), None, "within the lead");
        assert_eq!(strict.hand(soon, now), (soon, Some(soon)));
        let past = now.checked_sub(us(500)).unwrap_or(now);
        assert_eq!(strict.hand(past, now), (now, None), "late: goes now");
    }
}
