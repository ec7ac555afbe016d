//! The engine's side of a release: the [`Release`] trait every engine
//! implements, and what one attempt comes to ([`Step`], [`Blocked`]).

use std::future::Future;
use std::pin::Pin;

use tokio::time::Instant;

use super::ready::Ready;
use crate::lane::queue::Head;
use crate::lane::shared::Shared;

/// How a lane's head gets released.
pub(in crate::lane) trait Release: Send + 'static {
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
pub(in crate::lane) enum Step {
    /// The head got its turn, or left, or was refused: look again.
    Done,
    /// The head can't go yet.
    Wait(Blocked),
}

/// Why the head can't go yet.
pub(in crate::lane) enum Blocked {
    /// A meter (or a reserved slot) allows it then.
    Until(Instant),
    /// Another lane is first in a gate's queue, or a gate waits for the
    /// vendor's first word: wait for it.
    Turn(Pin<Box<dyn Future<Output = ()> + Send>>),
}
