//! What a lane does when its store cannot answer ([`StoreFailure`]), and
//! which state its releases come from ([`StoreMode`]).

/// What a lane does when its shared store (Redis) cannot answer.
///
/// Pick per endpoint ([`Route::on_store_failure`](crate::route::Route::on_store_failure)):
/// fail-open for calls whose loss costs more than a few 429s (a checkout),
/// fail-closed where going over the quota is worse than not calling (a
/// vendor that bans keys, an API billed per overage).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum StoreFailure {
    /// Keep serving from a local lane at the quota divided by the fleet's
    /// size ([`RedisOptions::fleet_size`]): one instance's share when the
    /// whole fleet falls back at once. It starts one horizon
    /// ([`RedisOptions::horizon`]) after the failure, when every slot other
    /// instances booked before it has gone.
    ///
    #[cfg_attr(
        not(feature = "redis"),
        doc = "[`RedisOptions::fleet_size`]: crate#features\n[`RedisOptions::horizon`]: crate#features"
    )]
    #[cfg_attr(
        feature = "redis",
        doc = "[`RedisOptions::fleet_size`]: crate::store::RedisOptions::fleet_size\n[`RedisOptions::horizon`]: crate::store::RedisOptions::horizon"
    )]
    Open,
    /// End waiting and new requests at once with
    /// [`Error::StoreUnavailable`](crate::Error::StoreUnavailable): the
    /// quota is never at risk. The default, because it cannot go over.
    #[default]
    Closed,
}

/// Which state a lane's releases come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum StoreMode {
    /// The shared store: the fleet's quota.
    Shared,
    /// The store failed; a fail-open lane serves from its local fallback.
    Fallback,
    /// The store failed; a fail-closed lane refuses until it is back.
    Unavailable,
}

impl StoreMode {
    /// Every mode: the `callshaper_store_mode` state set.
    pub(crate) const ALL: [Self; 3] = [Self::Shared, Self::Fallback, Self::Unavailable];

    /// The mode's name in the `callshaper_store_mode` state set.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Shared => "shared",
            Self::Fallback => "fallback",
            Self::Unavailable => "unavailable",
        }
    }
}
