//! [`Store`]: the handle a shaper is given, made from a concrete store,
//! and the link it makes for each lane.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::contract::SharedStore;
use super::policy::StoreFailure;
use super::remote::Remote;
use crate::gate::Gate;
use crate::meters::Quota;
use crate::observability::StoreMetrics;

/// A shared store for [`ShaperBuilder::store`](crate::shaper::ShaperBuilder::store):
/// made from a concrete store, e.g. `RedisStore` (feature `redis`). Cheap
/// to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<dyn SharedStore>,
}

impl Store {
    /// Made by each store's `From` impl; with no store compiled in, unused.
    #[cfg_attr(not(feature = "redis"), expect(dead_code))]
    pub(crate) fn new(store: impl SharedStore) -> Self {
        Self {
            inner: Arc::new(store),
        }
    }

    /// How many instances share the quotas: each one's fallback share.
    pub(crate) fn fleet_size(&self) -> u32 {
        self.inner.settings().fleet_size
    }

    /// The link of a lane whose shared `gates` are named `names` (the
    /// vendor's last) with these `quotas` each.
    pub(crate) fn link(
        &self,
        gates: Vec<Arc<Gate>>,
        names: &[&str],
        quotas: &[Vec<Quota>],
        headroom: Duration,
        failure: StoreFailure,
        metrics: StoreMetrics,
    ) -> Remote {
        // A gate's state matters as long as its longest window, and a
        // second more for the clocks' differences.
        let windows = quotas
            .iter()
            .flatten()
            .map(|q| q.rate().per.saturating_add(headroom));
        let keep = windows
            .max()
            .unwrap_or_default()
            .saturating_add(Duration::from_secs(1));
        let link = self.inner.lane(names, quotas, headroom, keep, &gates);
        Remote::new(link, gates, self.inner.settings(), keep, failure, metrics)
            .with_moves(self.inner.moves())
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}
