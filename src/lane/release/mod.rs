//! Release engines: what decides that the head of a lane's queue may go
//! now, and charges the quota for it.
//!
//! The dispatcher does everything that is the same for every engine (the
//! queue, pauses, the in-flight cap, callers who left); an engine answers
//! only "may the head go now, and if not, what to wait for". Two engines,
//! chosen once per lane:
//!
//! - [`Local`]: the gates' meters in this process, checked and charged
//!   under their locks at the instant of release.
//! - [`Reserved`]: slots reserved in a shared store for a fleet, released
//!   when their time comes, with the store's failure policy (and `Local`
//!   as the fail-open fallback).
//!
//! A new engine is one file here implementing [`Release`], and one arm
//! where [`Lane::spawn`](super::Lane) picks it.

mod local;
mod ready;
mod reserved;

use std::future::Future;
use std::pin::Pin;

use tokio::time::Instant;

pub(super) use self::local::Local;
pub(super) use self::ready::{Ready, Waiting};
pub(super) use self::reserved::Reserved;
use super::Shared;
use super::queue::Head;

/// How a lane's head gets released.
pub(super) trait Release: Send + 'static {
    /// Hand the head its turn if it may go now (through
    /// [`Ready::hand`]), or say what to wait for.
    fn release(
        &mut self,
        ready: &mut Ready<'_>,
        head: Head,
        now: Instant,
    ) -> impl Future<Output = Step> + Send;

    /// The head is held back by the lane itself (its in-flight cap): give up
    /// any place in a shared gate's queue, so it blocks no other lane.
    fn step_aside(&mut self, shared: &Shared);

    /// The lane has nothing to release for now (empty, paused, closing):
    /// also let go of what was held for future releases.
    fn stand_down(&mut self, shared: &Shared) {
        self.step_aside(shared);
    }

    /// The lane is paused until `until`: let go of what is of no use
    /// before then. What a pause ends before is still good after it.
    fn pause_until(&mut self, shared: &Shared, _until: Instant) {
        self.stand_down(shared);
    }
}

/// What came of one release attempt.
pub(super) enum Step {
    /// The head got its turn, or left, or was refused: look again.
    Done,
    /// The head can't go yet.
    Wait(Blocked),
}

/// Why the head can't go yet.
pub(super) enum Blocked {
    /// A meter (or a reserved slot) allows it then.
    Until(Instant),
    /// Another lane is first in a gate's queue, or a gate waits for the
    /// vendor's first word: wait for it.
    Turn(Pin<Box<dyn Future<Output = ()> + Send>>),
}
