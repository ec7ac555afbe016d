//! The [`Shaper`] handle, and what it shares with every clone: the
//! client and transport, the retry rules, and the registry of lanes.
//! Each concern extends it where it lives: `builder.rs` (`Shaper::builder`),
//! `request.rs` (`get`, `post`, ...), `call.rs` (`execute`, one request's
//! life).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use reqwest::Request;

use super::registry::Registry;
use super::transport::Transport;
use crate::error::ConfigError;
use crate::lane::LaneSnapshot;
use crate::meters::Quota;
use crate::retry::RetryPolicy;
use crate::signals::{Dialect, WallClock};

/// Estimates a request's cost when the caller gave none.
pub(super) type CostFn = dyn Fn(&Request) -> u64 + Send + Sync;

/// A reqwest client that can't exceed a vendor's quota.
///
/// Every request goes through the lanes of its quotas (by default one lane
/// per origin): FIFO queues released at the quotas' pace. A 429 or 503
/// pauses the lanes for as long as the vendor says; the throttled request
/// keeps its place at the head and goes again when the pause ends. Cloning
/// is cheap, and clones share lanes.
///
/// ```
/// use std::time::Duration;
/// use callshaper::Shaper;
/// use callshaper::testing::Vendor;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // A vendor that allows 10 requests per second and answers 429 beyond.
/// let vendor = Vendor::strict(10, Duration::from_secs(1)).start().await;
///
/// let shaper = Shaper::builder().rate(10, Duration::from_secs(1)).build()?;
///
/// // Ten callers at once: released one every 100 ms, never refused.
/// let started = std::time::Instant::now();
/// let calls: Vec<_> = (0..10)
///     .map(|i| tokio::spawn(shaper.get(format!("{}/items/{i}", vendor.uri())).send()))
///     .collect();
/// for call in calls {
///     assert_eq!(call.await??.status(), 200);
/// }
/// assert!(started.elapsed() >= Duration::from_millis(900));
/// assert_eq!(vendor.throttled(), 0);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Shaper {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) client: reqwest::Client,
    pub(super) transport: Arc<dyn Transport>,
    pub(super) wall: Arc<dyn WallClock>,
    pub(super) retry: RetryPolicy,
    /// The most redirects a request follows, each hop through its lane.
    pub(super) redirects: u32,
    /// Requests go through a reqwest client the user gave, which may
    /// follow redirects by itself.
    pub(super) client_given: bool,
    /// The shaper said once that its client followed a redirect.
    pub(super) warned_redirects: AtomicBool,
    pub(super) cost: Option<Arc<CostFn>>,
    pub(super) dialects: Vec<Arc<dyn Dialect>>,
    pub(super) registry: Registry,
}

impl Shaper {
    /// Change the vendor level's quotas (those of
    /// [`ShaperBuilder::rate`](super::ShaperBuilder::rate) and [`ShaperBuilder::quota`](super::ShaperBuilder::quota)) while the
    /// shaper runs: see [`set_level_quotas`](Self::set_level_quotas).
    pub fn set_quotas(&self, quotas: impl IntoIterator<Item = Quota>) -> Result<(), ConfigError> {
        self.inner
            .registry
            .requote("", quotas.into_iter().collect())
    }

    /// Change the quotas of the level named `level` (every level of that
    /// name, shaper-wide and in routes; a config file's vendor is a level
    /// named after it) while the shaper runs.
    ///
    /// Nothing is lost: queued requests keep their places, a pause and a
    /// quota learned from the vendor stay, and the next release follows
    /// the new quotas. A quota that did not change keeps its meter; a new
    /// one counting requests starts from the lane's own recent releases
    /// (so neither a burst nor a gap follows the change), and a new one
    /// counting cost starts from now. Checked like the builder's, with a
    /// [`ConfigError`] naming the field. In memory only: with a shared
    /// store, every instance must change at once, so it is refused; a new
    /// level, route or vendor, or another policy setting, needs a new
    /// shaper. `ShaperConfig::reload` (feature `config`) applies a config
    /// file's new quotas the same way (a bad file changes nothing).
    ///
    /// `tests/reconfigure.rs` changes quotas under load: raised from 10/s
    /// to 20/s at 2 s, 100 queued requests drain at the new pace from the
    /// next release in order with no 429; lowered during a vendor pause,
    /// the pause holds; a leaky bucket replaced by a sliding log counts the
    /// releases before it (without that, 10 × 429).
    ///
    /// ```
    /// use std::time::Duration;
    /// use callshaper::{Quota, Shaper};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), callshaper::ConfigError> {
    /// let shaper = Shaper::builder().rate(10, Duration::from_secs(1)).build()?;
    /// // The vendor raised the plan to 20 per second.
    /// shaper.set_quotas([Quota::leaky_bucket(20, Duration::from_secs(1))])?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_level_quotas(
        &self,
        level: &str,
        quotas: impl IntoIterator<Item = Quota>,
    ) -> Result<(), ConfigError> {
        self.inner
            .registry
            .requote(level, quotas.into_iter().collect())
    }

    /// The lanes and gates, for a config file's reload and a proxy's
    /// checks.
    #[cfg(any(feature = "config", feature = "proxy"))]
    pub(crate) fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// The retry rules every request follows.
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.inner.retry
    }

    /// What the lane `key` is doing, if it exists. A lane is named by its
    /// key in each of its levels, joined by ` | ` (`tenant/acme |
    /// https://api.vendor.com`): the vendor's level by its key alone (the
    /// origin), others `level/key`, with each `|` of a name or key
    /// doubled. A route whose levels another route or the shaper goes
    /// through too begins its lanes' names with its own (`search |
    /// tenant/acme | …`). [`Lane::key`](crate::lane::Lane::key) and
    /// [`LaneSnapshot::key`](crate::lane::LaneSnapshot::key) read the same.
    pub fn lane(&self, key: &str) -> Option<LaneSnapshot> {
        self.inner.registry.snapshot(key)
    }

    /// How many lanes are live: [`lanes`](Self::lanes)`().len()` without
    /// taking a snapshot of each.
    pub fn live_lanes(&self) -> usize {
        self.inner.registry.live()
    }

    /// Every live lane.
    pub fn lanes(&self) -> Vec<LaneSnapshot> {
        self.inner.registry.snapshots()
    }

    /// Stop: requests that have not been released end with
    /// [`Error::Shutdown`](crate::Error::Shutdown), and so does every later one. Requests already on
    /// the wire finish.
    pub fn shutdown(&self) {
        self.inner.registry.shut_down();
    }
}

impl fmt::Debug for Shaper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shaper")
            .field("registry", &self.inner.registry)
            .field("retry", &self.inner.retry)
            .finish_non_exhaustive()
    }
}
