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

impl From<Vec<Arc<Gate>>> for Gates {
    fn from(gates: Vec<Arc<Gate>>) -> Self {
        match <[Arc<Gate>; 2]>::try_from(gates) {
            Ok(two) => Self::Two(two),
            Err(gates) => match <[Arc<Gate>; 1]>::try_from(gates) {
                Ok(one) => Self::One(one),
                Err(gates) => Self::More(gates.into()),
            },
        }
    }
}
