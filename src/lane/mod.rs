//! A lane: one upstream quota, one FIFO queue, one dispatcher while anyone
//! waits.
//!
//! A request that finds nobody waiting, no pause and the meters' leave
//! takes its turn at once, charging the meters in place (the fast path,
//! `admission.rs`): a lane that is never waited in is its gates' state and
//! nothing more. Everything else waits in the lane's bounded queue. One
//! dispatcher task, started by the first request that must wait and
//! retired a second after the queue drains, looks at the head and releases
//! it when three things agree:
//!
//! 1. the lane is not paused (`paused_until` only moves forward);
//! 2. a slot under the concurrency cap is free (if there is a cap);
//! 3. every meter says the time has come for the head's cost.
//!
//! Releasing means handing the waiting caller a [`Turn`]; the caller then
//! sends its request itself. A caller that gave up (dropped its future, or
//! its `max_wait` ran out) leaves the count of waiting callers at once, so
//! the queue bound and every wait prediction see only live callers; the
//! dispatcher skips its ticket and charges nothing for it: the meters are
//! charged only once the turn was really handed over.
//!
//! Tickets arrive on one channel and wait in the dispatcher's queue, one
//! front per [`Priority`], ordered by sequence number. A throttled request
//! comes back with its original number, so it keeps its place at the head.
//!
//! | file | what it owns |
//! |---|---|
//! | `handle.rs` | the [`Lane`] handle: a caller's place, its wait, pauses |
//! | `snapshot.rs` | [`LaneSnapshot`]: what a lane is doing, for dashboards |
//! | `shared.rs` | what a lane's handles and its dispatcher share |
//! | `road.rs` | what the lanes of a route, level and vendor share: their name's prefix, policy and series |
//! | `gates.rs` | the gates a lane's releases pass, inline for one or two |
//! | `name.rs` | a lane's name, read off its prefix and its gates' keys |
//! | `policy.rs` | [`LanePolicy`] and [`Priority`] |
//! | `admission.rs` | refusals at the door, the `max_wait` prediction, the fast path |
//! | `leave.rs` | when a shaper's lane may go though its meters count, its gates' meters resting |
//! | `queue.rs` | the FIFO queue per class, sequence numbers, batch's share |
//! | `waiter.rs` | a waiting caller's end of its ticket; who counts it out |
//! | `turn.rs` | the [`Turn`] a released caller holds, and a strict lane's word of when it went |
//! | `tests.rs` | the lane's tests, with a dispatcher but no HTTP |
//! | `dispatcher.rs` | the task that releases the head, while anyone waits; when it starts and retires |
//! | `release/` | the engines that say when the head may go: local meters, or a shared store's reservations |

mod admission;
mod dispatcher;
mod gates;
mod handle;
mod leave;
mod name;
mod policy;
mod queue;
mod release;
mod road;
mod shared;
mod snapshot;
mod turn;
mod waiter;

pub use self::handle::Lane;
pub(crate) use self::handle::Place;
pub(crate) use self::leave::Leaving;
pub(crate) use self::name::JOIN;
pub use self::policy::{LanePolicy, Priority};
pub(crate) use self::road::Road;
pub use self::snapshot::LaneSnapshot;
pub use self::turn::Turn;
pub use crate::adaptive::Adaptive;
pub use crate::gate::PauseCause;

#[cfg(test)]
mod tests;
