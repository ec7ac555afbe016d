//! What the lanes of one route, level and vendor share ([`Road`]).

use std::sync::Arc;

use tokio::sync::Notify;

use super::policy::LanePolicy;
use crate::observability::Series;
use crate::sync::Listing;
use crate::vendor::VendorModel;

/// What the lanes of one route, level and vendor share: the first part of
/// their names, how they behave, their series, their vendor's model, and
/// who hears their dispatchers retire. One for all of them: a level keyed
/// per tenant has a lane per tenant, and each kept all five before (48
/// bytes of every lane).
pub(crate) struct Road {
    /// The first part of a lane's name (a route's name, or a standalone
    /// lane's own), before its gates' keys (see `name.rs`).
    pub(super) prefix: Option<Arc<str>>,
    /// Their vendor, level and route, for spans, and their series.
    pub(super) series: Series,
    pub(super) policy: Arc<LanePolicy>,
    /// The model of the vendor whose gate is the last of each lane's: one
    /// vendor's key is part of the road's, so all its lanes have one.
    pub(super) vendor: Arc<VendorModel>,
    /// Told when a dispatcher retires: its owner's sweep may find the
    /// lane due.
    pub(super) retired: Option<Arc<Notify>>,
    /// Where its owner lists it, to leave the list when dropped.
    _listing: Option<Listing<Road>>,
}

impl Road {
    /// The model of its lanes' vendor.
    pub(crate) fn vendor(&self) -> &Arc<VendorModel> {
        &self.vendor
    }

    /// A road whose lanes' names start with `prefix`, counted in `series`
    /// and behaving by `policy`, under the vendor `vendor` models, whose
    /// dispatchers tell `retired` as they retire; listed at `listing` when
    /// shared.
    pub(crate) fn new(
        prefix: Option<Arc<str>>,
        series: Series,
        (policy, vendor): (Arc<LanePolicy>, Arc<VendorModel>),
        (retired, listing): (Option<Arc<Notify>>, Option<Listing<Road>>),
    ) -> Self {
        Self {
            prefix,
            series,
            policy,
            vendor,
            retired,
            _listing: listing,
        }
    }
}
