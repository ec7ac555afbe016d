//! The labels a lane's series and its requests' spans carry.

/// Which vendor, level and route a lane belongs to: the labels of its
/// series and the fields of its requests' spans.
#[derive(Debug, Clone, Default)]
pub(crate) struct Labels {
    /// The vendor level's key: the origin, or a shared level's name.
    pub(crate) vendor: String,
    /// The lane's narrowest level: `vendor`, or the level's name.
    pub(crate) level: String,
    /// The route that picked the request, or empty.
    pub(crate) route: String,
}

impl Labels {
    /// A lane of its own (`Lane::new`): it is its own vendor.
    pub(crate) fn standalone(key: &str) -> Self {
        Self {
            vendor: key.to_owned(),
            level: "vendor".to_owned(),
            route: String::new(),
        }
    }
}
