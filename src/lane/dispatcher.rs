//! The dispatcher: a task per lane, while anyone waits in it, that files
//! arriving tickets in the queue and releases the head when the lane may
//! go, through its release engine.
//!
//! A step looks at the head and asks, in order: is its caller still there;
//! is the lane paused; is an in-flight slot free; then the engine: may the
//! head go now? Whatever holds it back, the dispatcher waits for that *or*
//! a new ticket, since a returning request may belong before the head.
//!
//! A lane nobody waits in needs no task: its state is its gates' meters
//! and pause, which the fast path reads and charges in place. The first
//! request that must wait starts a dispatcher (`Lane::send`); once the
//! queue has drained and [`LINGER`] passed with no ticket, it retires
//! under the lane's door lock, so a ticket goes either to it or to its
//! successor, never to one that is leaving.

use std::future::Future;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use tokio::time::{Instant, sleep, sleep_until};

use super::queue::{Costed, Queue};
use super::release::{Blocked, Ready, Release, Step, Waiting};
use super::shared::Shared;
use super::turn::Ticket;

/// How long a dispatcher stays once its queue drained: a lane busy in
/// bursts does not start one a burst. A lane on a shared store stays its
/// `idle_timeout`, since its engine's reading of the vendor's bucket
/// (`Burst`) lives in the task.
const LINGER: Duration = Duration::from_secs(1);

pub(super) struct Dispatcher<R: Release> {
    shared: Arc<Shared>,
    tickets: async_channel::Receiver<Ticket>,
    queue: Queue<Waiting>,
    engine: R,
}

/// A dispatcher dropped before it ran out (its runtime ended under it)
/// leaves the queues of the shared gates it waited at: a place left there
/// would hold every other lane under those gates behind a waiter that no
/// longer exists, on every runtime after. It shuts its lane's door as it
/// goes, as one that retires does: a door left open to it would have the
/// sweeper take the lane for busy, and keep it, until a request came back
/// to it.
impl<R: Release> Drop for Dispatcher<R> {
    fn drop(&mut self) {
        self.engine.step_aside(&self.shared);
        self.tickets.close();
        let door = self.shared.door();
        // Its own door, not a successor's.
        if door.as_ref().is_some_and(async_channel::Sender::is_closed) {
            self.shut(door);
        }
    }
}

impl<R: Release> Dispatcher<R> {
    /// Run a dispatcher of `shared`'s lane on the current runtime, until
    /// the lane is closed, or it has had nothing to do for a while.
    pub(super) fn spawn(shared: Arc<Shared>, tickets: async_channel::Receiver<Ticket>, engine: R) {
        let queue = Queue::new(shared.road.policy.batch_share);
        let dispatcher = Self {
            shared,
            tickets,
            queue,
            engine,
        };
        tokio::spawn(dispatcher.run());
    }

    async fn run(mut self) {
        while self.step().await {}
        self.engine.stand_down(&self.shared);
        // Closed: whoever still waits learns it at once. Those in the queue
        // do as it drops with `self`; tickets still in the channel would
        // stay there as long as a handle to the lane lives.
        while self.tickets.try_recv().is_ok() {}
    }

    fn file(&mut self, ticket: Ticket) {
        let waiting = Waiting::new(ticket.cost, ticket.turn);
        match ticket.not_before {
            Some(until) => self
                .queue
                .defer(until, ticket.priority, ticket.seq, waiting),
            None => self.queue.insert(ticket.priority, ticket.seq, waiting),
        }
    }

    /// Release at most one turn; false once the lane is closed.
    async fn step(&mut self) -> bool {
        if self.tickets.is_closed() {
            return false;
        }
        while let Ok(ticket) = self.tickets.try_recv() {
            self.file(ticket);
        }
        if !self.queue.is_empty()
            && let Some(stop) = self.shared.stopped()
        {
            // The vendor said no pause helps: nobody waits for it.
            self.engine.stand_down(&self.shared);
            let shared = &self.shared;
            let mut ready = Ready::new(shared, &mut self.queue, None);
            ready.refuse_all(|| shared.out_of_credit(&stop));
            return true;
        }
        // Retries whose backoff is over are filed by their old numbers. A
        // head held back is held back for them too, so only an otherwise
        // empty queue waits for the next backoff to end.
        let backoff_ends = self.queue.promote(Instant::now());
        let Some((head, waiting)) = self.queue.head() else {
            self.engine.stand_down(&self.shared);
            return match backoff_ends {
                Some(at) => self.or_new_ticket(sleep_until(at)).await,
                None => self.wait_for_work().await,
            };
        };
        if !waiting.is_live() {
            // Its caller left, and counted itself out then.
            self.queue.take(head);
            return true;
        }

        let now = Instant::now();
        if let Some(until) = self.shared.paused_until(now) {
            // Whatever the engine held for a release before then is of no
            // use.
            self.engine.pause_until(&self.shared, until);
            return self.or_new_ticket(sleep_until(until)).await;
        }

        let permit = match self.shared.in_flight().cloned() {
            None => None,
            Some(slots) => match slots.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    self.engine.step_aside(&self.shared);
                    // Only the dispatcher takes slots: once one is free it
                    // is still free on the next step.
                    return self
                        .or_new_ticket(async move { drop(slots.acquire().await) })
                        .await;
                }
            },
        };

        let mut ready = Ready::new(&self.shared, &mut self.queue, permit);
        match self.engine.release(&mut ready, head, now).await {
            Step::Done => true,
            Step::Wait(Blocked::Until(at)) => self.or_new_ticket(sleep_until(at)).await,
            Step::Wait(Blocked::Turn(turn)) => self.or_new_ticket(turn).await,
        }
    }

    /// Nothing to release: wait for a request; false once the lane is
    /// closed or this dispatcher retired.
    async fn wait_for_work(&mut self) -> bool {
        let idle = self.shared.road.policy.idle_timeout;
        let linger = match self.shared.remote() {
            None => LINGER.min(idle),
            Some(_) => idle,
        };
        let mut lingered = false;
        let open = self
            .or_new_ticket(async {
                sleep(linger).await;
                lingered = true
            })
            .await;
        open && !(lingered && self.retire())
    }

    /// Leave the lane, unless a ticket came meanwhile: under the door's
    /// lock, which every ticket is sent under, so the next one starts a
    /// successor.
    fn retire(&self) -> bool {
        let door = self.shared.door();
        if !self.tickets.is_empty() || !self.queue.is_empty() {
            return false;
        }
        self.shut(door);
        true
    }

    /// Shut the lane's `door` (held locked): the next ticket starts a
    /// successor; the lane's owner is told it may be due.
    fn shut(&self, mut door: MutexGuard<'_, Option<async_channel::Sender<Ticket>>>) {
        *door = None;
        drop(door);
        if let Some(retired) = &self.shared.road.retired {
            retired.notify_one();
        }
    }

    /// Wait for `until`, but come back early when a ticket arrives: a
    /// returning request may belong before the current head (and a lane
    /// told to stop is woken by a ticket nobody waits for).
    async fn or_new_ticket(&mut self, until: impl Future<Output = ()>) -> bool {
        tokio::select! {
            biased;
            ticket = self.tickets.recv() => match ticket {
                Ok(ticket) => {
                    self.file(ticket);
                    true
                }
                Err(_) => false,
            },
            () = until => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use crate::lane::{Lane, LanePolicy, Priority};
    use crate::meters::Quota;

    /// A lane of 10 a second, 100 ms between releases.
    fn lane() -> Lane {
        let ten = Quota::leaky_bucket(10, Duration::from_secs(1));
        Lane::new("dispatcher", [ten], LanePolicy::default()).unwrap()
    }

    /// A request back from its backoff is filed by its old number: it goes
    /// before the requests that arrived while it was away, not after them
    /// (a retry keeps its place, and a burst's retries never jump FIFO).
    #[tokio::test(start_paused = true)]
    async fn a_request_back_from_its_backoff_goes_by_its_old_number() {
        let lane = lane();
        let mut first = lane.enter(1, Priority::Interactive, None).unwrap();
        drop(lane.wait(&mut first).await.unwrap());
        let order = std::sync::Arc::new(Mutex::new(Vec::new()));
        let later: Vec<_> = ["second", "third"]
            .into_iter()
            .map(|name| {
                let (lane, order) = (lane.clone(), order.clone());
                let mut place = lane.enter(1, Priority::Interactive, None).unwrap();
                tokio::spawn(async move {
                    drop(lane.wait(&mut place).await.unwrap());
                    order.lock().unwrap().push(name);
                })
            })
            .collect();
        tokio::task::yield_now().await;
        lane.reenter(&mut first, Duration::from_millis(50)).unwrap();
        drop(lane.wait(&mut first).await.unwrap());
        order.lock().unwrap().push("first");
        for task in later {
            task.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["first", "second", "third"]);
    }

    /// A caller who left is skipped, and the queue counts only those still
    /// waiting: the next in line goes at the next release, not a release
    /// later.
    #[tokio::test(start_paused = true)]
    async fn a_caller_who_left_is_skipped_at_once() {
        let lane = lane();
        drop(lane.acquire().await.unwrap());
        let start = tokio::time::Instant::now();
        let gone = lane.enter(1, Priority::Interactive, None).unwrap();
        let mut next = lane.enter(1, Priority::Interactive, None).unwrap();
        assert_eq!(lane.snapshot().queued, 2);
        drop(gone);
        assert_eq!(lane.snapshot().queued, 1);
        drop(lane.wait(&mut next).await.unwrap());
        assert!(
            start.elapsed() <= Duration::from_millis(101),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(lane.snapshot().queued, 0);
    }
}
