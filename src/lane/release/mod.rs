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

mod engine;
mod local;
mod ready;
mod reserved;

pub(super) use self::engine::{Blocked, Release, Step};
pub(super) use self::local::Local;
pub(super) use self::ready::{Ready, Waiting};
pub(super) use self::reserved::Reserved;
