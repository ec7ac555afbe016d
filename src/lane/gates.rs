//! The gates a lane's releases pass ([`Gates`]).

use std::sync::Arc;

use crate::gate::Gate;

/// The gates a lane's releases pass, narrowest level first: the two that
/// nearly every lane of a shaper has (a tenant's and the vendor's) in
/// place, so a lane per tenant carries no list of its own; any other
/// number in a list behind one thin pointer. Two forms in 16 bytes, where
/// a third (one gate in place) took 24: the list's pointer sits beside
/// the first gate's, which is never null.
#[derive(Clone)]
pub(super) enum Gates {
    Two([Arc<Gate>; 2]),
    Other(Arc<Box<[Arc<Gate>]>>),
}

impl std::ops::Deref for Gates {
    type Target = [Arc<Gate>];

    fn deref(&self) -> &[Arc<Gate>] {
        match self {
            Self::Two(gates) => gates,
            Self::Other(gates) => gates,
        }
    }
}

impl FromIterator<Arc<Gate>> for Gates {
    fn from_iter<I: IntoIterator<Item = Arc<Gate>>>(gates: I) -> Self {
        // Two, taken one by one: a new tenant's lane collects no list.
        let mut gates = gates.into_iter();
        match (gates.next(), gates.next(), gates.next()) {
            (Some(one), Some(two), None) => Self::Two([one, two]),
            (one, two, three) => {
                let all = one.into_iter().chain(two).chain(three).chain(gates);
                Self::Other(Arc::new(all.collect()))
            }
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
            hears: true,
        };
        (0..n)
            .map(|_| {
                let level = Arc::new(GateLevel::new("", Arc::clone(&quotas), settings));
                Arc::new(Gate::new(Listed::nowhere(level), 1))
            })
            .collect()
    }

    /// Two gates are kept in place, any other number in a list; each in
    /// order, in 16 bytes.
    #[test]
    fn keeps_two_in_place_and_any_other_number_in_a_list() {
        assert_eq!(size_of::<Gates>(), 16);
        for n in 0..5 {
            let made = gates(n);
            let kept: Gates = made.iter().cloned().collect();
            match (&kept, n) {
                (Gates::Two(_), 2) => {}
                (Gates::Other(_), n) if n != 2 => {}
                _ => panic!("{n} gates kept in the wrong form"),
            }
            assert_eq!(kept.len(), n);
            assert!(kept.iter().zip(&made).all(|(a, b)| Arc::ptr_eq(a, b)));
        }
    }
}
