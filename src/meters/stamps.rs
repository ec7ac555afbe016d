//! Where a ledger keeps its release stamps ([`Stamps`]): a few inline,
//! more in a buffer of their own.

use std::collections::VecDeque;

use crate::time::Stamp;

/// Stamps kept inline: a lane per tenant keeps a ledger each, and nearly
/// every tenant releases a few requests a window.
const INLINE: usize = 3;

/// A ledger's release stamps, oldest first. Up to [`INLINE`] are kept in
/// place, in the room a deque's own fields take (a slot holding
/// `Stamp::NONE`, which no release is stamped with, is empty, and the
/// empty ones are last), so a ledger that holds a few costs no
/// allocation. More spill into a deque, grown by half its length at a
/// time rather than doubled: a lane that released eleven requests in its
/// window keeps room for thirteen, not sixteen. Once the window leaves
/// fewer than [`INLINE`], they move back in place and the buffer goes.
#[derive(Debug)]
pub(crate) enum Stamps {
    Inline([Stamp; INLINE]),
    Spilled(VecDeque<Stamp>),
}

impl Default for Stamps {
    fn default() -> Self {
        Self::Inline([Stamp::NONE; INLINE])
    }
}

impl Stamps {
    /// The stamps, oldest first, in at most two runs (a deque's two ends).
    fn runs(&self) -> (&[Stamp], &[Stamp]) {
        match self {
            Self::Inline(at) => (&at[..inline_len(at)], &[]),
            Self::Spilled(deque) => deque.as_slices(),
        }
    }

    /// Every stamp, oldest first (and, reversed, newest first).
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = &Stamp> + '_ {
        let (older, newer) = self.runs();
        older.iter().chain(newer)
    }

    /// Forget the oldest stamps while `forget` says so, given the oldest
    /// and how many are kept; then, when fewer than [`INLINE`] are left,
    /// keep them in place and let the buffer go (one more still fits
    /// without spilling again at once).
    #[inline]
    pub(crate) fn forget_while(&mut self, mut forget: impl FnMut(Stamp, usize) -> bool) {
        match self {
            Self::Inline(at) => {
                let mut len = inline_len(at);
                while len > 0 && forget(at[0], len) {
                    at.copy_within(1.., 0);
                    at[INLINE - 1] = Stamp::NONE;
                    len -= 1;
                }
            }
            Self::Spilled(deque) => {
                while let Some(&oldest) = deque.front() {
                    if !forget(oldest, deque.len()) {
                        break;
                    }
                    deque.pop_front();
                }
                if deque.len() < INLINE {
                    let mut inline = [Stamp::NONE; INLINE];
                    for (slot, &stamp) in inline.iter_mut().zip(deque.iter()) {
                        *slot = stamp;
                    }
                    *self = Self::Inline(inline);
                }
            }
        }
    }

    /// Keep `stamp`, the newest (a release's: never `Stamp::NONE`).
    #[inline]
    pub(crate) fn push_back(&mut self, stamp: Stamp) {
        debug_assert!(stamp != Stamp::NONE, "a release is stamped");
        match self {
            Self::Inline(at) => match at.iter().position(|&slot| slot == Stamp::NONE) {
                Some(free) => at[free] = stamp,
                None => {
                    let mut deque = VecDeque::with_capacity(INLINE * 2);
                    deque.extend(at.iter().copied());
                    deque.push_back(stamp);
                    *self = Self::Spilled(deque);
                }
            },
            Self::Spilled(deque) => {
                if deque.len() == deque.capacity() {
                    deque.reserve_exact((deque.len() / 2).max(INLINE));
                }
                deque.push_back(stamp);
            }
        }
    }
}

/// How many of `at`'s slots hold a stamp.
fn inline_len(at: &[Stamp; INLINE]) -> usize {
    at.iter()
        .position(|&slot| slot == Stamp::NONE)
        .unwrap_or(INLINE)
}

#[cfg(test)]
mod tests {
    use std::mem::size_of;

    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;

    fn stamps(n: u64, t0: Instant) -> Vec<Stamp> {
        (0..n)
            .map(|i| Stamp::of(t0 + Duration::from_millis(i)))
            .collect()
    }

    #[test]
    fn keeps_the_order_in_place_and_spilled() {
        let t0 = Instant::now();
        let all = stamps(20, t0);
        let mut kept = Stamps::default();
        for (i, &stamp) in all.iter().enumerate() {
            kept.push_back(stamp);
            assert_eq!(kept.iter().count(), i + 1);
            assert!(kept.iter().copied().eq(all[..=i].iter().copied()));
            assert!(
                kept.iter()
                    .rev()
                    .copied()
                    .eq(all[..=i].iter().rev().copied())
            );
        }
        assert!(matches!(kept, Stamps::Spilled(_)));
        let mut forgotten = 0;
        kept.forget_while(|oldest, left| {
            assert_eq!((oldest, left), (all[forgotten], 20 - forgotten));
            forgotten += 1;
            forgotten <= 18
        });
        assert!(matches!(kept, Stamps::Inline(_)), "{kept:?}");
        assert_eq!(
            (kept.iter().count(), kept.iter().next().copied()),
            (2, Some(all[18]))
        );
        assert!(kept.iter().copied().eq(all[18..].iter().copied()));
        kept.forget_while(|_, _| true);
        assert_eq!(
            (kept.iter().count(), kept.iter().next().copied()),
            (0, None)
        );
        kept.forget_while(|_, _| panic!("nothing is left to forget"));
    }

    #[test]
    fn three_stamps_take_no_buffer_and_a_spill_grows_by_half() {
        assert_eq!(size_of::<Stamps>(), size_of::<VecDeque<Stamp>>());
        let t0 = Instant::now();
        let mut kept = Stamps::default();
        for stamp in stamps(3, t0) {
            kept.push_back(stamp);
        }
        assert!(matches!(kept, Stamps::Inline(_)));
        assert_eq!(kept.iter().count(), 3);
        for stamp in stamps(8, t0 + Duration::from_secs(1)) {
            kept.push_back(stamp);
        }
        let Stamps::Spilled(deque) = &kept else {
            panic!("eleven spill: {kept:?}");
        };
        assert_eq!(deque.len(), 11);
        assert!(deque.capacity() < 16, "grown by half: {}", deque.capacity());
        // Doubling from its first six would have room for 192 by now.
        for stamp in stamps(89, t0 + Duration::from_secs(2)) {
            kept.push_back(stamp);
        }
        let Stamps::Spilled(deque) = &kept else {
            panic!("a hundred spill: {kept:?}");
        };
        assert_eq!(deque.len(), 100);
        assert!(
            deque.capacity() <= 100 * 3 / 2 + INLINE,
            "grown by half: {}",
            deque.capacity()
        );
    }
}
