//! The gates a lane's releases pass ([`Gates`]).

use std::sync::Arc;

use crate::gate::Gate;

/// The gates a lane's releases pass, narrowest level first: inline for
/// the one or two levels nearly every lane has (a tenant's and the
/// vendor's), so a lane per tenant carries no list of its own.
#[derive(Clone)]
pub(super) enum Gates {
    One([Arc<Gate>; 1]),
    Two([Arc<Gate>; 2]),
    More(Arc<[Arc<Gate>]>),
}

impl std::ops::Deref for Gates {
    type Target = [Arc<Gate>];

    fn deref(&self) -> &[Arc<Gate>] {
        match self {
            Self::One(gates) => gates,
            Self::Two(gates) => gates,
            Self::More(gates) => gates,
        }
    }
}

impl FromIterator<Arc<Gate>> for Gates {
    fn from_iter<I: IntoIterator<Item = Arc<Gate>>>(gates: I) -> Self {
        let mut gates = gates.into_iter();
        match (gates.next(), gates.next()) {
            (Some(one), None) => Self::One([one]),
            (Some(one), Some(two)) => match gates.next() {
                None => Self::Two([one, two]),
                Some(three) => Self::More([one, two, three].into_iter().chain(gates).collect()),
            },
            (None, _) => Self::More(Arc::new([])),
        }
    }
}
