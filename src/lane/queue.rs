//! The lane's FIFO queue: one front per [`Priority`], ordered by sequence
//! number, and the rule that picks which class goes next.
//!
//! Tickets almost always arrive in sequence order, so they queue in a ring;
//! only a request coming back with its old number (it was throttled) goes
//! to an ordered map. The head of a class is the lower of the two. That
//! keeps the common push and pop O(1) and still lets a returning request go
//! before everyone who came after it.
//!
//! Interactive requests go first; when both classes wait, every
//! `batch_share`-th release goes to the oldest batch request, so batch work
//! keeps at least `1 / batch_share` of a busy lane and never starves.
//!
//! A request retried after a failure waits out its backoff *in* the queue,
//! set aside until its time: it counts as waiting all along (queue bound,
//! predictions, shutdown), blocks nobody meanwhile, and when its backoff
//! ends it is filed by its old number, ahead of everyone who came after it.

use std::collections::{BTreeMap, VecDeque};

use tokio::time::Instant;

use super::policy::Priority;

/// The waiting requests of one lane, by class and sequence number. `T` is
/// what a waiting request holds (the dispatcher's answer channel); the
/// queue knows only its cost.
pub(super) struct Queue<T> {
    interactive: Front<T>,
    batch: Front<T>,
    /// Retries backing off, by the end of their backoff and number.
    deferred: BTreeMap<(Instant, u64), (Priority, T)>,
    /// Interactive releases since the last batch one, while batch waited.
    since_batch: u32,
    batch_share: u32,
}

/// A request at the head of its class, about to be released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Head {
    pub(super) class: Priority,
    pub(super) seq: u64,
    pub(super) cost: u64,
}

/// A request taken out of the queue, and what the batch share needs to
/// count it.
pub(super) struct Taken<T> {
    pub(super) waiting: T,
    pub(super) class: Priority,
    pub(super) batch_waited: bool,
}

/// Anything that waits in a queue has a cost, and may have left.
pub(super) trait Costed {
    fn cost(&self) -> u64;
    /// False once its caller left: it is skipped when costs are counted
    /// ahead (a store books no slot for it).
    fn is_live(&self) -> bool {
        true
    }
}

impl<T: Costed> Queue<T> {
    /// An empty queue where one release in `batch_share` goes to batch
    /// when both classes wait.
    pub(super) fn new(batch_share: u32) -> Self {
        Self {
            interactive: Front::default(),
            batch: Front::default(),
            deferred: BTreeMap::new(),
            since_batch: 0,
            batch_share,
        }
    }

    /// File a request under its class and number.
    pub(super) fn insert(&mut self, class: Priority, seq: u64, waiting: T) {
        self.front_mut(class).insert(seq, waiting);
    }

    /// Set a request aside until `until`, then file it under its class and
    /// number.
    pub(super) fn defer(&mut self, until: Instant, class: Priority, seq: u64, waiting: T) {
        self.deferred.insert((until, seq), (class, waiting));
    }

    /// File every request whose backoff has ended by `now`; the end of the
    /// next backoff, if one is left.
    pub(super) fn promote(&mut self, now: Instant) -> Option<Instant> {
        while let Some(entry) = self.deferred.first_entry() {
            let &(until, seq) = entry.key();
            if until > now {
                return Some(until);
            }
            let (class, waiting) = entry.remove();
            self.insert(class, seq, waiting);
        }
        None
    }

    /// The request that goes next, if any.
    pub(super) fn head(&self) -> Option<(Head, &T)> {
        let class = self.next_class()?;
        let (seq, waiting) = self.front(class).first()?;
        let head = Head {
            class,
            seq,
            cost: waiting.cost(),
        };
        Some((head, waiting))
    }

    /// Take `head` out. Batch's share counts it only once it is
    /// [`handed`](Self::handed) over: a caller who left just then used no
    /// release.
    pub(super) fn take(&mut self, head: Head) -> Option<Taken<T>> {
        let batch_waited = !self.batch.is_empty();
        let waiting = self.front_mut(head.class).remove(head.seq)?;
        Some(Taken {
            waiting,
            class: head.class,
            batch_waited,
        })
    }

    /// A request taken out was handed its turn.
    pub(super) fn handed(&mut self, class: Priority, batch_waited: bool) {
        self.since_batch = match class {
            Priority::Batch => 0,
            Priority::Interactive if batch_waited => self.since_batch + 1,
            Priority::Interactive => 0,
        };
    }

    /// The costs of the first `n` live requests of `class`, in order.
    pub(super) fn costs(&self, class: Priority, n: usize) -> Vec<u64> {
        self.front(class).costs(n)
    }

    /// Take every request out, oldest first within each class, interactive
    /// first, then those backing off.
    pub(super) fn drain(&mut self) -> Vec<T> {
        let mut all = self.interactive.drain();
        all.extend(self.batch.drain());
        all.extend(
            std::mem::take(&mut self.deferred)
                .into_values()
                .map(|(_, w)| w),
        );
        all
    }

    /// True when nobody waits, backing off included.
    pub(super) fn is_empty(&self) -> bool {
        self.interactive.is_empty() && self.batch.is_empty() && self.deferred.is_empty()
    }

    /// The class whose oldest request goes next.
    fn next_class(&self) -> Option<Priority> {
        match (self.interactive.is_empty(), self.batch.is_empty()) {
            (true, true) => None,
            (false, true) => Some(Priority::Interactive),
            (true, false) => Some(Priority::Batch),
            (false, false) if self.since_batch + 1 >= self.batch_share => Some(Priority::Batch),
            (false, false) => Some(Priority::Interactive),
        }
    }

    fn front(&self, class: Priority) -> &Front<T> {
        match class {
            Priority::Interactive => &self.interactive,
            Priority::Batch => &self.batch,
        }
    }

    fn front_mut(&mut self, class: Priority) -> &mut Front<T> {
        match class {
            Priority::Interactive => &mut self.interactive,
            Priority::Batch => &mut self.batch,
        }
    }
}

/// One class's waiting requests, oldest first.
struct Front<T> {
    fresh: VecDeque<(u64, T)>,
    returned: BTreeMap<u64, T>,
}

impl<T> Default for Front<T> {
    fn default() -> Self {
        Self {
            fresh: VecDeque::new(),
            returned: BTreeMap::new(),
        }
    }
}

impl<T: Costed> Front<T> {
    fn insert(&mut self, seq: u64, waiting: T) {
        if self.fresh.back().is_none_or(|&(last, _)| last < seq) {
            self.fresh.push_back((seq, waiting));
        } else {
            self.returned.insert(seq, waiting);
        }
    }

    fn first(&self) -> Option<(u64, &T)> {
        let fresh = self.fresh.front().map(|(seq, w)| (*seq, w));
        let returned = self.returned.first_key_value().map(|(seq, w)| (*seq, w));
        match (fresh, returned) {
            (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    fn remove(&mut self, seq: u64) -> Option<T> {
        if self.fresh.front().is_some_and(|&(first, _)| first == seq) {
            let waiting = self.fresh.pop_front().map(|(_, w)| w);
            if self.fresh.is_empty() && self.fresh.capacity() > 64 {
                // A burst is over: give its room back.
                self.fresh = VecDeque::new();
            }
            return waiting;
        }
        self.returned.remove(&seq)
    }

    fn is_empty(&self) -> bool {
        self.fresh.is_empty() && self.returned.is_empty()
    }

    fn costs(&self, n: usize) -> Vec<u64> {
        let mut fresh = self
            .fresh
            .iter()
            .filter(|(_, w)| w.is_live())
            .map(|(seq, w)| (*seq, w.cost()))
            .peekable();
        let mut returned = self
            .returned
            .iter()
            .filter(|(_, w)| w.is_live())
            .map(|(seq, w)| (*seq, w.cost()))
            .peekable();
        let mut costs = Vec::with_capacity(n);
        while costs.len() < n {
            let next = match (fresh.peek(), returned.peek()) {
                (Some(a), Some(b)) if b.0 < a.0 => returned.next(),
                (Some(_), _) => fresh.next(),
                (None, _) => returned.next(),
            };
            let Some((_, cost)) = next else { break };
            costs.push(cost);
        }
        costs
    }

    fn drain(&mut self) -> Vec<T> {
        let mut all: Vec<(u64, T)> = self.fresh.drain(..).collect();
        all.extend(std::mem::take(&mut self.returned));
        all.sort_by_key(|(seq, _)| *seq);
        all.into_iter().map(|(_, w)| w).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Costed for u64 {
        fn cost(&self) -> u64 {
            *self
        }
    }

    /// Release everything, recording the sequence numbers in release order.
    fn release_all(queue: &mut Queue<u64>) -> Vec<u64> {
        let mut order = Vec::new();
        while let Some((head, _)) = queue.head() {
            let taken = queue.take(head).expect("the head is in the queue");
            queue.handed(taken.class, taken.batch_waited);
            order.push(head.seq);
        }
        order
    }

    #[test]
    fn a_returning_request_goes_before_everyone_after_it() {
        let mut queue = Queue::new(5);
        for seq in [3, 4, 5] {
            queue.insert(Priority::Interactive, seq, 1);
        }
        // 1 was released, throttled, and comes back with its number.
        queue.insert(Priority::Interactive, 1, 7);
        let (head, cost) = queue.head().unwrap();
        assert_eq!((head.seq, *cost), (1, 7));
        assert_eq!(queue.costs(Priority::Interactive, 3), [7, 1, 1]);
        assert_eq!(release_all(&mut queue), [1, 3, 4, 5]);
        assert!(queue.head().is_none());
    }

    #[test]
    fn interactive_first_and_batch_keeps_one_in_batch_share() {
        let mut queue = Queue::new(3);
        for seq in 0..4 {
            queue.insert(Priority::Batch, seq, 1);
        }
        for seq in 4..10 {
            queue.insert(Priority::Interactive, seq, 1);
        }
        assert_eq!(release_all(&mut queue), [4, 5, 0, 6, 7, 1, 8, 9, 2, 3]);
    }

    #[test]
    fn a_discarded_head_does_not_count_for_the_batch_share() {
        let mut queue = Queue::new(2);
        queue.insert(Priority::Batch, 0, 1);
        for seq in 1..4 {
            queue.insert(Priority::Interactive, seq, 1);
        }
        let (head, _) = queue.head().unwrap();
        assert_eq!(head.seq, 1);
        queue.take(head);
        // Nothing was handed over: interactive still goes first.
        assert_eq!(queue.head().unwrap().0.seq, 2);
        assert_eq!(release_all(&mut queue), [2, 0, 3]);
    }

    /// A request as `(cost, live)`.
    struct Caller(u64, bool);

    impl Costed for Caller {
        fn cost(&self) -> u64 {
            self.0
        }

        fn is_live(&self) -> bool {
            self.1
        }
    }

    #[test]
    fn callers_who_left_are_not_counted_ahead() {
        let mut queue = Queue::new(5);
        for (seq, live) in [(1, true), (2, false), (3, true), (4, false), (5, true)] {
            queue.insert(Priority::Interactive, seq, Caller(seq, live));
        }
        queue.insert(Priority::Interactive, 0, Caller(0, false));
        assert_eq!(queue.costs(Priority::Interactive, 3), [1, 3, 5]);
    }

    #[test]
    fn a_retry_backs_off_aside_then_goes_before_everyone_after_it() {
        let t0 = Instant::now();
        let later = t0 + std::time::Duration::from_millis(30);
        let mut queue = Queue::new(5);
        for seq in [2, 3] {
            queue.insert(Priority::Interactive, seq, seq);
        }
        // 1 failed and backs off until `later`: the others go meanwhile.
        queue.defer(later, Priority::Interactive, 1, 1);
        assert_eq!(queue.promote(t0), Some(later));
        let (head, _) = queue.head().unwrap();
        assert_eq!(head.seq, 2);
        queue.take(head);
        queue.insert(Priority::Interactive, 4, 4);
        // Its backoff over, it is first again.
        assert_eq!(queue.promote(later), None);
        assert_eq!(release_all(&mut queue), [1, 3, 4]);
    }

    #[test]
    fn drain_takes_everyone_oldest_first() {
        let mut queue = Queue::new(5);
        // Each request's cost is its number, to tell them apart.
        for (class, seq) in [
            (Priority::Batch, 2),
            (Priority::Interactive, 5),
            (Priority::Interactive, 3),
            (Priority::Interactive, 4),
        ] {
            queue.insert(class, seq, seq);
        }
        queue.defer(Instant::now(), Priority::Interactive, 1, 1);
        assert_eq!(queue.drain(), [3, 4, 5, 2, 1]);
        assert!(queue.head().is_none());
    }
}
