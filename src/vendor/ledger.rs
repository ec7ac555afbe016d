//! A vendor's numbers read against a gate's own releases ([`Spending`]:
//! whose they are): whether they explain "nothing left", and when the
//! vendor frees a unit by them alone. Any level's gate is read so, not
//! only the vendor's: a tenant's releases may explain what its key's
//! vendor says.

use tokio::time::Instant;

use super::window::Window;
use crate::gate::{Booked, Gate};
use crate::meters::Rate;
use crate::time::later;

/// Whose releases a vendor's signal is read against.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Spending {
    /// This process's own: the lane is the quota's only user here.
    Own,
    /// A fleet's, as the shared store's ledger counted them.
    Fleet(Booked),
    /// A fleet's, which the store did not say.
    Unknown,
}

/// Whether `gate`'s own releases explain a vendor saying `used` of its
/// `limit` are spent, for a request released at `released` (`learned`:
/// the pace the gate keeps, if the vendor taught one): the vendor allows
/// at least what the gate keeps to (so the meters keep the lane within
/// it), and the gate released at least `used` in the window that ends
/// with that request. Then "nothing left" is the lane at full quota,
/// which its meters already pace; otherwise somebody else spends the
/// quota, or the vendor counts less than declared.
///
/// A fleet's releases are what its store counted booked in that window as
/// it booked the slot (`store/meters.lua`, `ledger_count`); where the
/// store did not say (a turn from the local fallback), the first
/// condition alone decides, as the store's meters keep the fleet within
/// the quota.
pub(crate) fn explains(
    gate: &Gate,
    learned: Option<Rate>,
    limit: u64,
    used: u64,
    released: Instant,
    spending: Spending,
) -> bool {
    let Some(window) = Window::of(gate, learned, released).filter(|w| w.allows(limit)) else {
        return false;
    };
    match spending {
        Spending::Own => gate
            .meters()
            .releases()
            .is_some_and(|releases| releases.since(window.since) >= used),
        Spending::Fleet(booked) => booked.count >= used,
        Spending::Unknown => true,
    }
}

/// When the vendor frees a unit by `gate`'s releases alone: its oldest
/// release in the window that ends with the request released at
/// `released`, one window on. Only for a vendor allowing at least what
/// the gate keeps to, whose window is then taken as the declared one: a
/// vendor sending whole-second resets ("1") would otherwise hold the lane
/// a second each time another consumer fills the window, when the lane's
/// own oldest request leaves it a few milliseconds later.
///
/// A fleet's ledger says when its oldest slot leaves the window, which is
/// the same instant.
pub(crate) fn frees_at(
    gate: &Gate,
    learned: Option<Rate>,
    limit: u64,
    released: Instant,
    spending: Spending,
) -> Option<Instant> {
    let window = Window::of(gate, learned, released).filter(|w| w.allows(limit))?;
    match spending {
        Spending::Own => {
            let oldest = gate.meters().releases()?.first_since(window.since)?;
            Some(later(oldest, window.length))
        }
        Spending::Fleet(booked) => booked.leaves,
        Spending::Unknown => None,
    }
}
