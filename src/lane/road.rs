//! What the lanes of one route, level and vendor share ([`Road`]).

use std::sync::Arc;

use tokio::sync::Notify;

use super::policy::LanePolicy;
use crate::observability::Series;
use crate::sync::Listing;

/// What the lanes of one route, level and vendor share: the first part of
/// their names, how they behave, their series, and who hears their
/// dispatchers retire. One for all of them: a level keyed per tenant has a
/// lane per tenant, and each kept all four before (40 bytes of every
/// lane).
pub(crate) struct Road {
    /// The first part of a lane's name (a route's name, or a standalone
    /// lane's own), before its gates' keys (see `name.rs`).
    pub(super) prefix: Option<Arc<str>>,
    /// Their vendor, level and route, for spans, and their series.
    pub(super) series: Series,
    pub(super) policy: Arc<LanePolicy>,
    /// Told when a dispatcher retires: its owner's sweep may find the
    /// lane due.
    pub(super) retired: Option<Arc<Notify>>,
    /// Where its owner lists it, to leave the list when dropped.
    _listing: Option<Listing<Road>>,
}

impl Road {
    /// A road whose lanes' names start with `prefix`, counted in `series`
    /// and behaving by `policy`, whose dispatchers tell `retired` as they
    /// retire; listed at `listing` when shared.
    pub(crate) fn new(
        prefix: Option<Arc<str>>,
        series: Series,
        policy: Arc<LanePolicy>,
        (retired, listing): (Option<Arc<Notify>>, Option<Listing<Road>>),
    ) -> Self {
        Self {
            prefix,
            series,
            policy,
            retired,
            _listing: listing,
        }
    }
}
