//! A request's real cost, reported once the answer says.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::time::Instant;

use crate::lane::Lane;

/// Report what a request really cost, once the response says (e.g. the
/// tokens an LLM call used): the lanes' cost-counting quotas are corrected
/// up or down. Found in the response's extensions.
///
/// ```
/// # async fn f(shaper: callshaper::Shaper) -> Result<(), callshaper::Error> {
/// let response = shaper.post("https://api.example.com/v1/chat").cost(1_000).send().await?;
/// // ... read the usage from the body ...
/// if let Some(settle) = response.extensions().get::<callshaper::shaper::Settle>() {
///     settle.report(200); // 800 tokens come back to the quota
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Settle {
    inner: Arc<SettleInner>,
}

struct SettleInner {
    lane: Lane,
    charged: u64,
    at: Instant,
    reported: AtomicBool,
}

impl Settle {
    pub(super) fn new(lane: Lane, charged: u64, at: Instant) -> Self {
        Self {
            inner: Arc::new(SettleInner {
                lane,
                charged,
                at,
                reported: AtomicBool::new(false),
            }),
        }
    }

    /// What the request was charged.
    pub fn charged(&self) -> u64 {
        self.inner.charged
    }

    /// The request really cost `actual`. Only the first report counts. An
    /// `actual` past the largest cost one request may have (the smallest
    /// capacity among the lane's cost quotas) counts as that capacity.
    pub fn report(&self, actual: u64) {
        if self.inner.reported.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = &self.inner;
        inner.lane.settle(inner.charged, actual, inner.at);
    }
}

impl fmt::Debug for Settle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settle")
            .field("charged", &self.inner.charged)
            .finish_non_exhaustive()
    }
}
