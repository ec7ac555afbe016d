//! Strict spacing: no two sends closer than an interval, measured from
//! when the last one really went, and the spacing a vendor's refusals
//! teach.
//!
//! Window-counting vendors (a sliding log, a fixed window, a token bucket)
//! count requests; the meters hold that count and forgive timer lateness,
//! so a release that fires late keeps the schedule and the next may follow
//! it sooner than the interval. A vendor that measures *spacing* instead
//! (nginx's `limit_req` without `burst`, a GCRA with a small tolerance)
//! refuses exactly that send: at `10r/s` nginx refuses a request 99 ms
//! after the last one it accepted, on its millisecond clock. A strict lane
//! waits a full interval after the last send ([`Departures`]), and a lane
//! refused for its spacing learns how far apart the vendor wants its
//! sends ([`Learned`]).
//!
//! [`Departures`] (`departures.rs`) keeps when a strict lane's last send
//! went, and when its answer says it got there; [`Learned`]
//! (`learned.rs`) reads a refusal against the lane's ledger and keeps the
//! gap it teaches.

mod departures;
mod learned;
#[cfg(test)]
mod tests;

pub(crate) use departures::Departures;
pub(crate) use learned::{Declared, Learned, Reading};
