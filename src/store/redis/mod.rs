//! The Redis store: connections, the scripts, the pause channel, and each
//! lane's link to its gates' keys ([`SharedStore`] and [`StoreLane`] for
//! Redis and Redis Cluster).
//!
//! | file | what it owns |
//! |---|---|
//! | `options.rs` | [`RedisOptions`], [`Clock`] |
//! | `tls.rs` | the CA roots and client certificate of `rediss://` connections |
//! | `errors.rs` | what Redis's errors mean: timeout, TLS, an ACL's refusal |
//! | `client.rs` | [`RedisStore`]: connecting (one node, a cluster, a Sentinel's master), calling the scripts |
//! | `pauses.rs` | the pause channel every instance listens on |
//! | `sentinel.rs` | the master a Sentinel names, followed through failovers |
//! | `lane.rs` | a lane's keys and meters as script arguments (`SharedStore`, `StoreLane`) |
//! | `scripts.rs` | the Lua scripts, `meters.lua` before each |

mod client;
mod errors;
mod lane;
mod options;
mod pauses;
mod scripts;
#[cfg(feature = "redis-sentinel")]
mod sentinel;
mod tls;

pub use self::client::RedisStore;
pub use self::options::{Clock, RedisOptions};

#[cfg(all(test, feature = "testing"))]
mod tests;
