//! A vendor's model: what the answers of one vendor taught its lanes,
//! read against their own releases, and how that slows the vendor's gate
//! below its declared quotas.
//!
//! A gate (`gate/`) is a level's quotas, pause and queue: it knows
//! nothing of vendors. The vendor's gate, the broadest level's, has a
//! model beside it, one per vendor key, shared by every lane under it: a
//! refusal one tenant's request met slows every tenant's. The model reads
//! what a vendor says against the gate's releases (is "nothing left" the
//! lane's own spending? is a refusal a count or a spacing?) and hands the
//! gate's meters what follows: a learned quota, probed back up
//! (`pace.rs`); a spacing (`spacing/learned.rs`); a bucket's leak (`drain.rs`);
//! adaptive pacing. It also keeps the throttle streak behind
//! the fallback backoff and the vendor's retry allowance.
//!
//! | file | what it decides |
//! |---|---|
//! | `model.rs` | the model's state, pacing the gate, throttle streak, retry allowance |
//! | `refusal.rs` | what a refusal teaches: a count, a spacing, or nothing |
//! | `levels.rs` | what the vendor says of its state: a bucket's levels, burst room, window ends |
//! | `ledger.rs` | "nothing left" against a gate's own releases, for any level |
//! | `pace.rs`, `report.rs`, `window.rs`, `drain.rs` | the plain state each reads, with its arithmetic |

mod drain;
mod ledger;
mod levels;
mod model;
mod pace;
mod refusal;
mod report;
mod window;

pub(crate) use self::ledger::{Spending, explains};
pub(crate) use self::model::{VendorMap, VendorModel, VendorSettings};

#[cfg(test)]
mod tests;
