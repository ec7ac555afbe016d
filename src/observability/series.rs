//! A lane's labels and series together, shared by every lane that carries
//! the same labels: the lanes of one tenant level are one set of series,
//! registered once, not a copy a tenant.

use super::labels::Labels;
use super::metrics::LaneMetrics;

/// The labels a lane's spans and series carry, and its series' handles.
pub(crate) struct Series {
    pub(crate) labels: Labels,
    pub(crate) metrics: LaneMetrics,
}

impl Series {
    /// The series of `labels`, and `lane` too when series per lane were
    /// asked for.
    pub(crate) fn new(labels: Labels, lane: Option<&str>) -> Self {
        let metrics = LaneMetrics::new(&labels, lane);
        Self { labels, metrics }
    }
}
