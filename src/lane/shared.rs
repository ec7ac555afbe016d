//! A lane's state, shared by its handle, its dispatcher and its engines:
//! the gates a release passes, the count of who waits, the in-flight cap,
//! the store link; what a fleet booked for a turn; when it was last
//! active.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use once_cell::race::OnceBox;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::gates::Gates;
use super::name::LaneName;
use super::road::Road;
use super::turn::{Fleet, Ticket};
use crate::error::Error;
use crate::gate::{Gate, Stop};
use crate::meters::{Meters, Rate};
use crate::observability::LaneMetrics;
use crate::store::Remote;
use crate::sync::lock;
use crate::time::{AtomicTick, Stamp};
use crate::vendor::VendorModel;

/// The counters places in lanes' queues are numbered from, each on a
/// cache line of its own, a lane drawing from the one its address picks:
/// a lane needs its numbers in the order its requests came, not a
/// counter of its own (8 bytes of every tenant's lane), and lanes on
/// other cores seldom draw from the same one. A number carries its
/// counter's index in its low bits ([`COUNTER_BITS`]), so numbers from
/// two counters never meet.
static NUMBERS: [Numbers; 64] = [const { Numbers(AtomicU64::new(0)) }; 64];

/// The low bits of a place's number that name its counter: all of an
/// index, as the counters are a power of two.
const COUNTER_BITS: u32 = NUMBERS.len().trailing_zeros();
const _: () = assert!(NUMBERS.len().is_power_of_two());

/// The counter a place's number came from.
fn counter_of(seq: u64) -> usize {
    (seq & ((1 << COUNTER_BITS) - 1)) as usize
}

#[repr(align(64))]
struct Numbers(AtomicU64);

/// Where tickets go while a dispatcher runs; `None` while none does.
/// Tickets are sent, and a dispatcher starts and retires, under its lock,
/// so none is sent to one that is leaving. A mutex, not a read-write lock:
/// a send holds it for one `try_send`, and it is 8 bytes smaller.
pub(super) type Door = std::sync::Mutex<Option<async_channel::Sender<Ticket>>>;

pub(super) struct Shared {
    /// Its name's prefix, policy and series, and who hears its dispatcher
    /// retire: shared with the lanes of its route, level and vendor.
    pub(super) road: Arc<Road>,
    /// The gates a release must pass, narrowest level first; the last one
    /// is the vendor's. A standalone [`Lane`] has one of its own; a
    /// shaper's lane holds the shared gate of each of its levels.
    pub(super) gates: Gates,
    /// Its name's hash in its owner's map of lanes, which places it again
    /// by it as its table grows: kept here, where the map's slot would
    /// take 8 bytes more (0 for a standalone lane, which no map holds).
    pub(super) listed: u64,
    /// Turns released: counted by [`count_release`](Self::count_release)
    /// alone.
    pub(super) released: AtomicU64,
    /// Who waits, and whether the lane is closed: 32 bits, which pack
    /// with `active_at`.
    pub(super) waiting: Waiting,
    /// When the lane last released a turn, to the millisecond: how long it
    /// has been idle, for its owner's sweep. Each release stored its
    /// instant, and two cores releasing from one lane kept the lane's line
    /// moving between them: 64 tasks on one lane took 171-242 ns a permit,
    /// 114-128 ns once it was stored once a millisecond at most (a load
    /// leaves the line shared). A sweep, which lets a lane go after its
    /// idle timeout, is up to 2 ms late, never early.
    pub(super) active_at: AtomicTick,
    /// What few lanes have: its in-flight cap and its store, the door to
    /// its dispatcher, and its count of throttles, made with the lane when
    /// it has a cap or a store, else the first time a request waits in it
    /// or a throttle comes, and kept for the lane's life, as a gate keeps
    /// its `Cold`. A lane per tenant that never queues carries one pointer
    /// for the four.
    pub(super) ties: OnceBox<Ties>,
}

/// What few lanes have: a cap on requests in flight, a link to a shared
/// store, a dispatcher's door, throttles seen. Boxed together: a lane per
/// tenant holds a box's pointer, not four.
#[derive(Default)]
pub(super) struct Ties {
    pub(super) in_flight: Option<Arc<Semaphore>>,
    /// The gates' quotas live there.
    pub(super) remote: Option<Arc<Remote>>,
    door: Door,
    /// Throttles seen, saturating.
    throttles: AtomicU32,
}

impl Ties {
    /// Made now when there is a cap or a store; else made the first time
    /// a request waits.
    pub(super) fn of(
        in_flight: Option<Arc<Semaphore>>,
        remote: Option<Arc<Remote>>,
    ) -> OnceBox<Self> {
        if in_flight.is_none() && remote.is_none() {
            return OnceBox::new();
        }
        OnceBox::with_value(Box::new(Self {
            in_flight,
            remote,
            ..Self::default()
        }))
    }
}

/// Requests waiting for a turn, in the channel or held by the dispatcher,
/// and whether the lane is closed for good (every request then ends with
/// `Error::Shutdown`): one word, so the fast path asks both in one load,
/// and 32 bits, which pack with when the lane last released.
///
/// A request is counted in before its ticket is sent and out when the
/// dispatcher lets it go, so "none" really means nobody is ahead; it is
/// also what the queue's bound counts.
#[derive(Default)]
pub(super) struct Waiting(AtomicU32);

/// The closed flag: the word's top bit. The count below it never reaches
/// it: admission refuses past [`Waiting::MOST`], and a request that
/// enters again (a retry) was admitted.
const CLOSED: u32 = 1 << 31;

impl Waiting {
    /// The most requests a lane lets wait, whatever its queue's capacity.
    pub(super) const MOST: usize = (CLOSED - 1) as usize;

    /// One more waits; how many waited before it.
    fn count_in(&self) -> usize {
        (self.0.fetch_add(1, Ordering::SeqCst) & !CLOSED) as usize
    }

    fn count_out(&self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }

    /// How many wait.
    pub(super) fn count(&self) -> usize {
        (self.0.load(Ordering::SeqCst) & !CLOSED) as usize
    }

    /// Nobody waits and the lane is open: the fast path's question.
    pub(super) fn none_and_open(&self) -> bool {
        self.0.load(Ordering::SeqCst) == 0
    }

    pub(super) fn is_closed(&self) -> bool {
        self.0.load(Ordering::SeqCst) & CLOSED != 0
    }

    pub(super) fn close(&self) {
        self.0.fetch_or(CLOSED, Ordering::SeqCst);
    }
}

impl Shared {
    /// Its cap on requests in flight, if it has one.
    pub(super) fn in_flight(&self) -> Option<&Arc<Semaphore>> {
        self.ties.get()?.in_flight.as_ref()
    }

    /// Its link to a shared store, if it has one.
    pub(super) fn remote(&self) -> Option<&Arc<Remote>> {
        self.ties.get()?.remote.as_ref()
    }

    /// The door to its dispatcher, locked: made now if no request waited
    /// in the lane before.
    pub(super) fn door(&self) -> MutexGuard<'_, Option<async_channel::Sender<Ticket>>> {
        lock(&self.ties.get_or_init(Box::default).door)
    }

    /// The door to its dispatcher, locked, if a request ever waited in the
    /// lane: one that never did has nothing behind it.
    pub(super) fn door_if_made(
        &self,
    ) -> Option<MutexGuard<'_, Option<async_channel::Sender<Ticket>>>> {
        self.ties.get().map(|ties| lock(&ties.door))
    }

    /// Tells lanes apart in a gate's queue: its address, which no other
    /// live lane has, and a lane waiting at a gate is live (its dispatcher
    /// holds it, and leaves the gate's queue as it goes).
    pub(super) fn id(&self) -> u64 {
        std::ptr::from_ref(self).addr() as u64
    }

    /// The next number of a place in its queue: higher than every number
    /// it gave before (2⁵⁸ of them from each counter: nine years of a
    /// billion numbers a second from one counter).
    pub(super) fn next_seq(&self) -> u64 {
        let at = self.counter();
        let drawn = NUMBERS[at].0.fetch_add(1, Ordering::Relaxed);
        (drawn << COUNTER_BITS) | at as u64
    }

    /// `kept`, the number a request sent again had, where this lane's
    /// counter gave it; else the next number. A number from another
    /// counter came from a lane of the same name that went meanwhile: in
    /// this queue it would sit at random among this lane's numbers, ahead
    /// of or behind every one, so the request takes its place at the back.
    pub(super) fn seq_for(&self, kept: Option<u64>) -> u64 {
        match kept {
            Some(seq) if counter_of(seq) == self.counter() => seq,
            _ => self.next_seq(),
        }
    }

    /// The index of the counter this lane draws its numbers from.
    fn counter(&self) -> usize {
        // A lane's block is 16-byte aligned; its lowest bits say nothing.
        (self.id() >> 4) as usize % NUMBERS.len()
    }

    /// Its name: its owner's map of lanes finds it by it, and keeps no
    /// copy.
    pub(super) fn name(&self) -> LaneName<'_> {
        LaneName::new(self.road.prefix.as_deref(), &self.gates)
    }

    /// The series the lane counts in, its road's.
    pub(super) fn metrics(&self) -> &LaneMetrics {
        &self.road.series.metrics
    }

    /// One more throttle seen.
    pub(super) fn throttled(&self) {
        let ties = self.ties.get_or_init(Box::default);
        let _ = ties
            .throttles
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_add(1));
    }

    /// Throttles seen, saturating.
    pub(super) fn throttles(&self) -> u32 {
        self.ties
            .get()
            .map_or(0, |ties| ties.throttles.load(Ordering::Relaxed))
    }

    /// One more turn released. Called only with the lane's meters locked
    /// (the fast path, a local dispatcher), or by the one dispatcher of a
    /// lane on a store, which has no fast path. Its releases are counted
    /// one at a time, so a load and a store count them, where a locked
    /// add took about 4 ns of a permit's 72 (a plain loop on one task).
    pub(super) fn count_release(&self) {
        let released = self.released.load(Ordering::Relaxed);
        self.released
            .store(released.saturating_add(1), Ordering::Relaxed);
    }

    /// A turn was released at `at`: noted when it is in a later
    /// millisecond than the last one noted.
    pub(super) fn active(&self, at: Stamp) {
        self.active_at.move_on(at);
    }

    /// How long the lane has released nothing, at `now`, or up to 2 ms
    /// less (never more), within [`AtomicTick::REACH`]: a lane is let go
    /// that much after its idle timeout at most, never before.
    pub(super) fn quiet_for(&self, now: Instant) -> Duration {
        self.active_at.since(Stamp::of(now))
    }
}

impl Shared {
    /// The tightest request quota declared by the lane's gates (each read
    /// under its level's lock, which every lane of the level takes).
    fn declared(&self) -> Option<Rate> {
        self.gates
            .iter()
            .filter_map(|gate| gate.declared())
            .min_by(|a, b| a.cmp_speed(b))
    }

    /// Report the tightest request quota declared by the lane's gates: they
    /// changed.
    pub(super) fn report_quota(&self) {
        if let Some(rate) = self.declared() {
            self.metrics().declared(rate);
        }
    }

    /// Report it for a new lane, unless its series has a quota already: a
    /// tenant's new lane shares its series with its road's other lanes,
    /// whose levels are its own (see `LaneMetrics::declared_first`).
    pub(super) fn report_first_quota(&self) {
        self.metrics().declared_first(|| self.declared());
    }

    /// A request joins the waiting; returns how many waited before it.
    pub(super) fn count_in(&self) -> usize {
        self.metrics().queued();
        self.waiting.count_in()
    }

    /// A turn the store counted `fleet` for is being handed out. Recorded
    /// whether or not its caller is still there: a slot whose caller left
    /// serves the next, with the same count.
    pub(super) fn handed_fleet(&self, fleet: &Fleet) {
        if let Some(remote) = self.remote() {
            remote.handed(fleet);
        }
    }

    /// A request stops waiting: released, refused or gone.
    pub(super) fn count_out(&self) {
        self.metrics().dequeued();
        self.waiting.count_out();
    }

    /// The model of the vendor whose gate is the last of `gates`: its
    /// road's.
    pub(super) fn vendor(&self) -> &Arc<VendorModel> {
        &self.road.vendor
    }

    /// The vendor's gate: the broadest level's.
    pub(super) fn vendor_gate(&self) -> &Gate {
        self.vendor().gate()
    }

    /// True when another lane holds `gate` too: only then do lanes queue
    /// for it. The vendor's model holds its gate as well, and is no lane.
    pub(super) fn is_shared(&self, gate: &Arc<Gate>) -> bool {
        let model = usize::from(Arc::ptr_eq(gate, self.vendor().gate()));
        Arc::strong_count(gate) > 1 + model
    }

    /// Why the lane's gates refuse everything now, if one does.
    pub(super) fn stopped(&self) -> Option<Arc<Stop>> {
        self.gates.iter().find_map(|gate| gate.stopped())
    }

    /// The error a stopped gate ends requests with.
    pub(super) fn out_of_credit(&self, stop: &Stop) -> Error {
        Error::OutOfCredit {
            lane: self.name().to_string(),
            status: reqwest::StatusCode::from_u16(stop.status)
                .unwrap_or(reqwest::StatusCode::TOO_MANY_REQUESTS),
            body: stop.body.clone(),
        }
    }

    /// True when a pause is in force at `now` in any of the lane's gates:
    /// the fast path's question, which needs no instant back.
    pub(super) fn is_paused(&self, now: Instant) -> bool {
        self.gates
            .iter()
            .any(|gate| gate.paused_until(now).is_some())
    }

    /// The latest pause in force at `now` among the lane's gates.
    pub(super) fn paused_until(&self, now: Instant) -> Option<Instant> {
        self.gates
            .iter()
            .filter_map(|gate| gate.paused_until(now))
            .max()
    }

    /// Every gate's meters, locked in level order (the same order in every
    /// lane, so lanes sharing gates cannot deadlock).
    pub(super) fn meters(&self) -> Vec<MutexGuard<'_, Meters>> {
        self.gates.iter().map(|gate| gate.meters()).collect()
    }

    /// Run `f` with every gate's meters locked, narrowest first (the order
    /// every holder takes them in); a lane with one or two gates (a
    /// tenant's and the vendor's: nearly all) allocates nothing for it,
    /// which shows on the hot path.
    pub(super) fn with_meters<R>(&self, f: impl FnOnce(&mut [MutexGuard<'_, Meters>]) -> R) -> R {
        match &self.gates[..] {
            [gate] => f(std::slice::from_mut(&mut gate.meters())),
            [narrow, broad] => {
                let narrow = narrow.meters();
                f(&mut [narrow, broad.meters()])
            }
            _ => f(&mut self.meters()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Waiting;

    /// The count and the flag share a word and never read as each other:
    /// a closed lane with nobody waiting is not "nobody waits and open",
    /// and its waiters still count as they come and go.
    #[test]
    fn the_waiting_count_and_the_closed_flag_read_apart() {
        let waiting = Waiting::default();
        assert!(waiting.none_and_open());
        assert_eq!(waiting.count_in(), 0);
        assert_eq!(waiting.count_in(), 1);
        assert!(!waiting.none_and_open());
        waiting.close();
        assert!(waiting.is_closed());
        assert_eq!(waiting.count(), 2);
        assert_eq!(waiting.count_in(), 2);
        waiting.count_out();
        waiting.count_out();
        waiting.count_out();
        assert_eq!(waiting.count(), 0);
        assert!(waiting.is_closed());
        assert!(!waiting.none_and_open());
    }
}
