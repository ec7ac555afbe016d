//! The Redis store: connections, the scripts, the pause channel, and each
//! lane's link to its gates' keys ([`SharedStore`] and [`StoreLane`] for
//! Redis and Redis Cluster).
//!
//! | file | what it owns |
//! |---|---|
//! | `options.rs` | [`RedisOptions`], [`Clock`] |
//! | `client.rs` | [`RedisStore`]: connecting, calling the scripts, the pause channel |
//! | `lane.rs` | a lane's keys and meters as script arguments (`SharedStore`, `StoreLane`) |
//! | `scripts.rs` | the Lua scripts, `meters.lua` before each |

mod client;
mod lane;
mod options;
mod scripts;

pub use self::client::RedisStore;
pub use self::options::{Clock, RedisOptions};

#[cfg(all(test, feature = "testing"))]
mod tests;
