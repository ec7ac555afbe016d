//! A gate: quotas and a pause that a release must pass.
//!
//! A lane holds a gate of its own (the quotas of a standalone `Lane`,
//! its own pause) and, in a shaper, one shared gate per level: the route's
//! or tenant's quotas for its key, and the vendor's, which every lane under
//! that vendor holds at once. A lane releases its head only when every gate
//! it holds allows it, at the same instant, and charges them all together.
//! That is what keeps every level's quota exact
//! at the moment a request leaves, whatever the queueing: a request never
//! waits in one level after another (which would bunch up the pace the
//! first level set), it waits once, in its own lane, for all of them.
//!
//! A pause belongs to a gate too: a 429 seen by one tenant's request
//! pauses the vendor's gate, and so every lane that shares it. What the
//! vendor's answers teach (a learned quota, spacing, adaptive pacing) is
//! the vendor's model (`vendor/`), which paces the vendor gate's meters.

mod cause;
mod level;
mod map;

pub use self::cause::PauseCause;
pub(crate) use self::cause::{Booked, Stop};
pub(crate) use self::level::{Gate, GateLevel, GateSettings, Listed};
pub(crate) use self::map::{GateMap, Keep};

#[cfg(test)]
mod tests;
