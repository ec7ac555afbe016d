//! What the vendor says of its own state, read by its model: a bucket's
//! levels (what is left, what leaks), burst room, the ends of a fixed
//! window, and "nothing left" against the lane's own releases.

use std::time::SystemTime;

use tokio::time::Instant;

use super::ledger::{self, Spending};
use super::model::VendorModel;
use super::window::opened;
use crate::meters::Rate;
use crate::sync::lock;

impl VendorModel {
    /// The vendor's bucket said it has `remaining` left, counting the
    /// request released at `released` (see [`Report::said_left`]).
    ///
    /// [`Report::said_left`]: super::report::Report::said_left
    pub(crate) fn said_left(&self, remaining: u64, released: Instant) {
        lock(&self.report).said_left(remaining, released);
    }

    /// What the vendor's bucket has left at `now` by what it last said,
    /// refilled at the pace the gate keeps since, and when the request
    /// that answer counted had been released. `None` without a word, or
    /// without a request pace.
    pub(crate) fn left(&self, now: Instant) -> Option<(u64, Instant)> {
        // Asked at every release of a fleet lane: without a word (every
        // vendor but a bucket), one lock.
        lock(&self.report).left?;
        let rate = self.learned().or_else(|| self.gate.declared())?;
        lock(&self.report).left(now, rate)
    }

    /// A vendor's bucket had `remaining` requests left as it counted the
    /// request released at `released` (`refused`: it refused it). The
    /// meters allow no more than that (`Meters::hold_to`). For a bucket of
    /// `capacity` that does not say its rate (`leaks`: Shopify), the rate
    /// it leaks at is read off its levels ([`Drain`]), and once it has
    /// refused the lane, kept to: the first estimate, then each closer one.
    /// The quota learned, if the pace changed.
    ///
    /// [`Drain`]: super::drain::Drain
    pub(crate) fn bucket(
        &self,
        remaining: u64,
        leaks: Option<u64>,
        released: Instant,
        refused: bool,
    ) -> Option<Rate> {
        let around = {
            let mut meters = self.gate.meters();
            if meters.held_by_remaining() {
                meters.hold_to(remaining, released, Instant::now());
            }
            // Only a bucket that does not say its rate is read off its levels.
            leaks.and_then(|_| meters.releases().map(|releases| releases.around(released)))
        };
        let (capacity, around) = (leaks?, around?);
        let window = self.window(released)?;
        let used = capacity.saturating_sub(remaining);
        // Two declared windows: a level is whole units, so a short span
        // reads a coarse rate.
        let span = window.declared.per.saturating_mul(2);
        let leak = lock(&self.drain).observe(used, around, released, refused, span);
        {
            let mut pace = lock(&self.pace);
            // Refused: paced until the levels show the leak; read: the
            // reading paces from now on.
            let read = leak.is_some() && pace.refused_at.is_some();
            let unread = !read && (pace.unread || refused);
            if unread != pace.unread {
                pace.unread = unread;
                self.repace(&pace);
            }
            // Never refused: the declared quota is not shown too fast.
            pace.refused_at?;
        }
        let leak = leak?;
        // In hundredths of the declared window's count, rounded down.
        let per = window.declared.per.saturating_mul(100);
        let count = (leak * per.as_secs_f64()).floor();
        if !(1.0..f64::from(u32::MAX)).contains(&count) {
            return None;
        }
        let rate = Rate::new(count as u32, per);
        // A reading within 1 % of the pace kept is no news.
        let close = |a: Rate, b: Rate| (a.per_second() / b.per_second() - 1.0).abs() < 0.01;
        if self.learned().is_some_and(|learned| close(learned, rate)) {
            return None;
        }
        // A reading is the vendor's word: not probed.
        self.keep_to(rate, None, Some(capacity)).then_some(rate)
    }

    /// Whether the vendor's "nothing left" on a request released at
    /// `released` is its burst room rather than a spent window (`None`:
    /// a window), learning it once shown. A GCRA with a small tolerance (or a bucket a request
    /// deep) says "0 left" after every request it accepts, with a reset a
    /// unit away that a whole-second header writes as 1 s. Read as a
    /// window, that is another consumer spending the rest, and a pause
    /// until the reset after every request: 1 % of a 100/s quota. It shows
    /// on the first release after a quiet window (on a shared store, the
    /// only slot the fleet booked in it): a window that counts would have
    /// the whole quota less one left, unless another consumer spent all of
    /// it but one in the meantime. That rare case costs one refusal, which
    /// unlearns it ([`refused`](Self::refused)); meanwhile the meters keep
    /// to the quota, and a GCRA's spacing is learned from its refusals as
    /// nginx's is.
    /// True the first time it shows, so the lane can say so once.
    pub(crate) fn burst_room(&self, released: Instant, spending: Spending) -> Option<bool> {
        if lock(&self.report).burst_room {
            return Some(false);
        }
        let window = self.window(released)?;
        let quiet =
            match spending {
                Spending::Own => self.gate.meters().releases().is_some_and(|releases| {
                    opened(releases, Some(released), window.length).is_some()
                }),
                Spending::Fleet(booked) => booked.count <= 1,
                Spending::Unknown => false,
            };
        if quiet {
            lock(&self.report).burst_room = true;
        }
        quiet.then_some(true)
    }

    /// The vendor wrote `end` as the end of its fixed window, in an answer
    /// that came at `at`.
    pub(crate) fn saw_end(&self, end: SystemTime, at: Instant) {
        lock(&self.report).ends.saw(end, at);
    }

    /// When the vendor's fixed window that ends at `end` (as it wrote it)
    /// closes at the latest, if the lane saw it open and the step between
    /// its ends looks like the declared window. (A sliding window written
    /// as instants moves its end with every request: its steps say nothing
    /// of when a unit frees.)
    pub(crate) fn window_closes(&self, end: SystemTime) -> Option<Instant> {
        let length = self.window(Instant::now())?.length;
        let report = lock(&self.report);
        if !report.ends.steps_like(length) {
            return None;
        }
        report.ends.closes(end)
    }

    /// Whether the vendor gate's releases explain the vendor saying `used`
    /// of its `limit` are spent (see [`ledger::explains`]).
    pub(crate) fn explains(
        &self,
        limit: u64,
        used: u64,
        released: Instant,
        spending: Spending,
    ) -> bool {
        ledger::explains(&self.gate, self.learned(), limit, used, released, spending)
    }

    /// When the vendor frees a unit by its gate's releases alone (see
    /// [`ledger::frees_at`]).
    pub(crate) fn frees_at(
        &self,
        limit: u64,
        released: Instant,
        spending: Spending,
    ) -> Option<Instant> {
        ledger::frees_at(&self.gate, self.learned(), limit, released, spending)
    }
}
