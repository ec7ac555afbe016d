//! The lane's own ledger: when its gate released requests, over the last
//! window of its request quota. A vendor's `remaining` is news only where
//! these releases do not explain it (see the crate's `throttle` module).

use std::time::Duration;

use tokio::time::Instant;

use super::stamps::Stamps;
use crate::time::{Stamp, nanos};

/// Release instants within the last window of a [`Reach`], at most its
/// cap of them, kept as 8-byte stamps: a lane per tenant keeps a ledger
/// each, and its reach is its level's.
#[derive(Debug)]
pub(crate) struct Releases {
    at: Stamps,
    /// The latest release so forgotten (`Stamp::NONE`: none): counts since
    /// then are "at least".
    lost: Stamp,
    /// Every release ever recorded: a vendor's bucket level is read against
    /// it over spans longer than the window.
    total: u64,
}

/// How far back a ledger keeps releases: its request quota's window, and
/// at most how many. The same for every gate of a level, so a level's
/// terms (`terms.rs`) keep it once, not each ledger (16 bytes of a gate).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reach {
    /// The window in nanoseconds.
    window: u64,
    cap: u32,
    /// The quota is above [`MOST`]: the cap may forget releases still in
    /// the window.
    truncated: bool,
}

/// The most releases a ledger keeps (64 KiB): a quota above it (GitHub's
/// 5,000 an hour) forgets its oldest releases in the window, and then
/// counts "more than it holds", which explains any vendor count, and knows
/// no oldest release: the old behaviour of trusting the meters.
const MOST: usize = 4_096;

impl Reach {
    /// A ledger's reach over `window`, for a quota of `count` requests in
    /// it.
    pub(crate) fn new(window: Duration, count: u64) -> Self {
        Self {
            window: nanos(window),
            cap: u32::try_from(usize::try_from(count).unwrap_or(MOST).clamp(1, MOST))
                .unwrap_or(u32::MAX),
            truncated: usize::try_from(count).map_or(true, |count| count > MOST),
        }
    }
}

impl Default for Releases {
    /// An empty ledger.
    fn default() -> Self {
        Self {
            at: Stamps::default(),
            lost: Stamp::NONE,
            total: 0,
        }
    }
}

impl Releases {
    /// Every release it holds, oldest first.
    pub(crate) fn instants(&self) -> impl Iterator<Item = Instant> + '_ {
        self.at.iter().map(|stamp| stamp.instant())
    }

    /// A release at `now`, kept as far back as `reach`.
    pub(crate) fn record(&mut self, reach: &Reach, now: Instant) {
        self.record_stamp(reach, Stamp::of(now));
    }

    /// [`record`](Self::record), for a release already stamped.
    pub(crate) fn record_stamp(&mut self, reach: &Reach, now: Stamp) {
        let (window, cap, truncated) = (reach.window, reach.cap as usize, reach.truncated);
        let lost = &mut self.lost;
        self.at.forget_while(|oldest, kept| {
            if oldest.plus_nanos(window) > now {
                if kept < cap {
                    return false;
                }
                // Within its quota, a release past the cap is the lateness
                // the meters forgive: the cap is still the count.
                if truncated {
                    *lost = oldest;
                }
            }
            true
        });
        self.at.push_back(now);
        self.total = self.total.saturating_add(1);
    }

    /// Forget the releases the window left behind at `now`, and the
    /// buffer they took: a ledger at rest keeps what its window holds, as
    /// a busy one does after each release.
    pub(crate) fn forget_stale(&mut self, reach: &Reach, now: Instant) {
        let (now, window) = (Stamp::of(now), reach.window);
        self.at
            .forget_while(|oldest, _| oldest.plus_nanos(window) <= now);
    }

    /// How many releases were recorded before `at`, and how many at it
    /// (a release still within the window).
    pub(crate) fn around(&self, at: Instant) -> (u64, u64) {
        let at = Stamp::of(at);
        let (mut after, mut together) = (0_u64, 0_u64);
        for &t in self.at.iter().rev().take_while(|&&t| t >= at) {
            if t > at {
                after += 1;
            } else {
                together += 1;
            }
        }
        (
            self.total.saturating_sub(after).saturating_sub(together),
            together,
        )
    }

    /// The last release before `at`, if the ledger still holds it.
    pub(crate) fn before(&self, at: Instant) -> Option<Instant> {
        let at = Stamp::of(at);
        self.at.iter().rev().find(|&&t| t < at).map(|t| t.instant())
    }

    /// Releases at or after `since` and before `until`, and the first of
    /// them.
    pub(crate) fn between(&self, since: Instant, until: Instant) -> (u64, Option<Instant>) {
        let (since, until) = (Stamp::of(since), Stamp::of(until));
        let mut inside = self.at.iter().filter(|&&at| at >= since && at < until);
        let first = inside.next().map(|t| t.instant());
        let count = u64::try_from(inside.count()).unwrap_or(u64::MAX);
        (count + u64::from(first.is_some()), first)
    }

    /// The longest gap between consecutive releases from `since` up to
    /// `until` (which counts as the last): how far the lane was from busy.
    pub(crate) fn longest_gap(&self, since: Instant, until: Instant) -> Duration {
        let mut previous = None;
        let mut longest = Duration::ZERO;
        let (from, to) = (Stamp::of(since), Stamp::of(until));
        let inside = self
            .at
            .iter()
            .filter(|&&at| at >= from && at < to)
            .map(|at| at.instant());
        for at in inside.chain(std::iter::once(until)) {
            if let Some(before) = previous {
                longest = longest.max(at.saturating_duration_since(before));
            }
            previous = Some(at);
        }
        longest
    }

    /// The first release at or after `since`; `None` when one since then
    /// was forgotten for the cap.
    pub(crate) fn first_since(&self, since: Instant) -> Option<Instant> {
        if self.forgot_since(since) {
            return None;
        }
        let since = Stamp::of(since);
        self.at
            .iter()
            .find(|&&at| at >= since)
            .map(|at| at.instant())
    }

    /// Releases at or after `since`; `u64::MAX` ("more than it holds")
    /// when one of them was forgotten for the cap.
    pub(crate) fn since(&self, since: Instant) -> u64 {
        if self.forgot_since(since) {
            return u64::MAX;
        }
        let since = Stamp::of(since);
        let counted = self.at.iter().rev().take_while(|&&at| at >= since).count();
        u64::try_from(counted).unwrap_or(u64::MAX)
    }

    fn forgot_since(&self, since: Instant) -> bool {
        // `NONE` is earlier than any instant's stamp.
        self.lost >= Stamp::of(since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A ledger's reach over a second, for ten.
    fn second() -> Reach {
        Reach::new(Duration::from_secs(1), 10)
    }

    /// A ledger over a second, for ten, with `n` releases 100 ms apart
    /// from `t0`.
    fn every_100ms(n: u64, t0: Instant) -> Releases {
        let mut releases = Releases::default();
        for i in 0..n {
            releases.record(&second(), t0 + ms(100 * i));
        }
        releases
    }

    #[test]
    fn counts_releases_in_the_window_and_forgets_older_ones() {
        let t0 = Instant::now();
        let mut releases = every_100ms(5, t0);
        assert_eq!(releases.since(t0), 5);
        assert_eq!(releases.since(t0 + ms(250)), 2);
        assert_eq!(
            releases.between(t0 + ms(50), t0 + ms(400)),
            (3, Some(t0 + ms(100)))
        );
        assert_eq!(releases.between(t0 + ms(450), t0 + ms(900)), (0, None));
        assert_eq!(releases.longest_gap(t0, t0 + ms(450)), ms(100));
        assert_eq!(releases.first_since(t0 + ms(150)), Some(t0 + ms(200)));
        assert_eq!(releases.longest_gap(t0, t0 + ms(900)), ms(500));
        assert_eq!(releases.around(t0 + ms(200)), (2, 1));
        releases.record(&second(), t0 + ms(1_150));
        // The first two left the window; the rest still count.
        assert_eq!(releases.since(t0), 4);
        assert_eq!(
            releases.around(t0 + ms(1_150)),
            (5, 1),
            "the total keeps them"
        );
    }

    /// At rest a ledger keeps only what its window still holds.
    #[test]
    fn forgets_what_the_window_left_behind() {
        let t0 = Instant::now();
        let mut releases = every_100ms(8, t0);
        releases.forget_stale(&second(), t0 + ms(1_000));
        assert_eq!(releases.instants().count(), 7, "the first left the window");
        releases.forget_stale(&second(), t0 + ms(1_650));
        assert_eq!(
            releases.instants().collect::<Vec<_>>(),
            [t0 + ms(700)],
            "one is left"
        );
        assert_eq!(
            releases.around(t0 + ms(700)),
            (7, 1),
            "the total keeps them"
        );
        releases.forget_stale(&second(), t0 + ms(1_700));
        assert_eq!(releases.instants().count(), 0);
    }

    /// Within its quota the cap is the count: more in the window is the
    /// lateness the meters forgive.
    #[test]
    fn holds_at_most_its_quota() {
        let t0 = Instant::now();
        let (reach, mut releases) = (Reach::new(Duration::from_secs(1), 3), Releases::default());
        for i in 0..10 {
            releases.record(&reach, t0 + Duration::from_millis(i));
        }
        assert_eq!(releases.since(t0), 3);
        assert_eq!(
            releases.first_since(t0),
            Some(t0 + Duration::from_millis(7))
        );
    }

    /// A quota above what a ledger holds (GitHub's 5,000 an hour) counts
    /// "more than it holds" over a span it forgot, and knows no oldest.
    #[test]
    fn a_quota_above_its_cap_counts_more_than_it_holds() {
        let t0 = Instant::now();
        let micros = Duration::from_micros;
        let reach = Reach::new(Duration::from_secs(1), MOST as u64 + 1);
        let mut releases = Releases::default();
        for i in 0..MOST as u64 + 10 {
            releases.record(&reach, t0 + micros(i));
        }
        assert_eq!(releases.instants().count(), MOST);
        assert_eq!(releases.since(t0), u64::MAX, "more than it holds");
        assert_eq!(releases.first_since(t0), None, "its oldest forgotten");
        assert_eq!(
            releases.since(t0 + micros(MOST as u64 + 8)),
            2,
            "after the last one forgotten, exactly"
        );
    }
}
