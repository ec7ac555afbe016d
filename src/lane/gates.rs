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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::gate::{GateLevel, GateSettings, Listed};
    use crate::meters::Quota;

    fn gates(n: usize) -> Vec<Arc<Gate>> {
        let quotas = Arc::from([Quota::leaky_bucket(10, Duration::from_secs(1))]);
        let settings = GateSettings {
            headroom: Duration::ZERO,
            max_pause: Duration::from_secs(60),
        };
        (0..n)
            .map(|_| {
                let level = Arc::new(GateLevel::new("", Arc::clone(&quotas), settings));
                Arc::new(Gate::new(Listed::nowhere(level), 1))
            })
            .collect()
    }

    /// One or two gates are kept inline, more in a list; each in order.
    #[test]
    fn keeps_one_or_two_inline_and_more_in_a_list() {
        for n in 0..5 {
            let made = gates(n);
            let kept: Gates = made.iter().cloned().collect();
            match (&kept, n) {
                (Gates::One(_), 1) | (Gates::Two(_), 2) => {}
                (Gates::More(_), n) if n != 1 && n != 2 => {}
                _ => panic!("{n} gates kept in the wrong form"),
            }
            assert_eq!(kept.len(), n);
            assert!(kept.iter().zip(&made).all(|(a, b)| Arc::ptr_eq(a, b)));
        }
    }
}
