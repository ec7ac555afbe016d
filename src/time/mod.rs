//! Instant arithmetic that cannot panic.
//!
//! Durations reach the crate from callers (`max_wait`, `max_pause`, store
//! options), from vendors (`Retry-After`, resets) and from a store's
//! replies. `Instant + Duration` panics on overflow, so every instant built
//! from such a value goes through [`later`].

#[cfg(feature = "serde")]
pub(crate) mod human;

use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Far enough to mean "never" for a wait, near enough that every platform's
/// clock can hold it past now: 100 years. Also the longest pause a vendor's
/// header can ask for (`signals::LONGEST`).
pub(crate) const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `at + by`, saturating at `FAR` from `at` instead of panicking. (Only a
/// clock that cannot hold a century past `at` gets `at` itself back.)
pub(crate) fn later(at: Instant, by: Duration) -> Instant {
    at.checked_add(by.min(FAR)).unwrap_or(at)
}

/// A duration in microseconds (the stores' unit), saturating.
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A duration in nanoseconds, saturated at 584 years: half the room of a
/// `Duration`, for state every tenant's lane keeps.
pub(crate) fn nanos(d: Duration) -> u64 {
    // In 64 bits, not through `as_nanos`'s 128: a release's stamp is one.
    d.as_secs()
        .checked_mul(1_000_000_000)
        .and_then(|n| n.checked_add(u64::from(d.subsec_nanos())))
        .unwrap_or(u64::MAX)
}

/// An instant as signed nanoseconds from a process-wide epoch: 8 bytes
/// where an `Instant` takes 16, for ledgers that keep many. Instants from
/// any runtime (a paused test clock too) compare as the instants do, over
/// ±292 years around the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Stamp(i64);

static EPOCH: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

impl Stamp {
    pub(crate) fn of(at: Instant) -> Self {
        let epoch = *EPOCH;
        let signed = |d: Duration| i64::try_from(nanos(d)).unwrap_or(i64::MAX);
        match at.checked_duration_since(epoch) {
            Some(after) => Self(signed(after)),
            // Never `NONE` nor `MARK`, the two earliest stamps.
            None => Self((-signed(epoch.saturating_duration_since(at))).max(Self::MARK.0 + 1)),
        }
    }

    pub(crate) fn instant(self) -> Instant {
        let epoch = *EPOCH;
        let by = Duration::from_nanos(self.0.unsigned_abs());
        if self.0 >= 0 {
            later(epoch, by)
        } else {
            epoch.checked_sub(by).unwrap_or(epoch)
        }
    }

    /// No instant: what an optional stamp holds when it holds none (the
    /// earliest stamp, 292 years before the epoch, which no clock reads).
    pub(crate) const NONE: Self = Self(i64::MIN);

    /// A second stamp no clock reads, after [`NONE`](Self::NONE): what a
    /// field that keeps a stamp marks when it holds neither an instant nor
    /// none (the meters' first word, heard).
    pub(crate) const MARK: Self = Self(i64::MIN + 1);

    /// The instant, unless this is [`NONE`](Self::NONE) or
    /// [`MARK`](Self::MARK), which hold none.
    pub(crate) fn get(self) -> Option<Instant> {
        (self.0 > Self::MARK.0).then(|| self.instant())
    }

    /// This stamp `nanos` nanoseconds later (a span kept by [`nanos`]),
    /// saturating.
    pub(crate) fn plus_nanos(self, nanos: u64) -> Self {
        Self(self.0.saturating_add_unsigned(nanos))
    }

    /// This stamp `nanos` nanoseconds later, at most [`FAR`] later: what
    /// [`later`] is to an instant, for the meters that count in stamps.
    pub(crate) fn later(self, nanos: u64) -> Self {
        self.plus_nanos(nanos.min(FAR_NANOS))
    }

    /// This stamp `nanos` nanoseconds earlier, or `None` past the earliest
    /// stamp a clock can read.
    pub(crate) fn earlier(self, nanos: u64) -> Option<Self> {
        self.0
            .checked_sub_unsigned(nanos)
            .filter(|&at| at > Self::MARK.0)
            .map(Self)
    }

    /// A question asked at `now` and answered in stamps (`ask` gets the
    /// stamp of `now`), as an instant: `now` itself when the answer is
    /// now, so a meter that lets a request go at once answers with the
    /// caller's own instant.
    pub(crate) fn answer(now: Instant, ask: impl FnOnce(Stamp) -> Stamp) -> Instant {
        let at = Self::of(now);
        let answered = ask(at);
        if answered == at {
            now
        } else {
            answered.instant()
        }
    }
}

/// [`FAR`] in nanoseconds.
const FAR_NANOS: u64 = FAR.as_secs() * 1_000_000_000;

/// A [`Stamp`] threads move on without a lock: when a strict gate's last
/// request went.
#[derive(Debug)]
pub(crate) struct AtomicStamp(AtomicI64);

impl Default for AtomicStamp {
    /// Holding no instant ([`Stamp::NONE`]).
    fn default() -> Self {
        Self(AtomicI64::new(Stamp::NONE.0))
    }
}

impl AtomicStamp {
    /// Move on to `at`, unless it holds a later instant already (reports
    /// may come in any order); `NONE` is earlier than any.
    pub(crate) fn raise(&self, at: Instant) {
        self.0.fetch_max(Stamp::of(at).0, Ordering::AcqRel);
    }

    pub(crate) fn load(&self) -> Stamp {
        Stamp(self.0.load(Ordering::Acquire))
    }
}

/// An instant to the millisecond in 32 bits, which threads move on
/// without a lock: when a lane last released (4 bytes of every tenant's
/// lane, where a [`Stamp`] took 8). It wraps every 49.7 days, and tells
/// how long ago for spans within [`REACH`](Self::REACH), half of that:
/// the other half is an instant noted after the one it is asked at.
#[derive(Debug)]
pub(crate) struct AtomicTick(AtomicU32);

impl AtomicTick {
    /// The longest span it tells: half the wrap, 24.8 days.
    pub(crate) const REACH: Duration = Duration::from_millis(i32::MAX as u64);

    pub(crate) fn new(at: Stamp) -> Self {
        Self(AtomicU32::new(tick(at)))
    }

    /// Move on to `at`'s millisecond, unless it holds it, or one up to
    /// [`STALE`] later: a release that read its clock before another noted
    /// a later instant keeps that later one (a store would take it back,
    /// and the quiet read would be longer than it is). Asked on every
    /// release of a lane, from every core: a write each time kept the
    /// lane's line moving between the cores releasing from it, where a
    /// load leaves it shared, so it writes once a millisecond at most.
    pub(crate) fn move_on(&self, at: Stamp) {
        let tick = tick(at);
        let later = |held: u32| (!(0..=STALE).contains(&held.wrapping_sub(tick))).then_some(tick);
        if later(self.0.load(Ordering::Relaxed)).is_some() {
            let _ = self
                .0
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, later);
        }
    }

    /// How long since the instant it holds, at `now`, or up to two
    /// milliseconds less, never more (each end is known to its
    /// millisecond), for spans within [`REACH`](Self::REACH). An instant
    /// noted after `now` (a release while a sweep that read the clock
    /// before it looks) reads as none, and so does a span past the reach:
    /// never more than it is.
    pub(crate) fn since(&self, now: Stamp) -> Duration {
        // Signed: a difference past half the wrap is an instant ahead.
        let ticks = tick(now).wrapping_sub(self.0.load(Ordering::Relaxed)) as i32;
        let ticks = u64::try_from(ticks).unwrap_or(0);
        Duration::from_millis(ticks.saturating_sub(1))
    }
}

/// How many milliseconds behind what an [`AtomicTick`] holds a release
/// may note itself and be taken for one that read its clock before the
/// one noted (by far less): a minute. One further behind is a release
/// after the tick wrapped.
const STALE: u32 = 60_000;

/// `at`'s millisecond, wrapped to 32 bits.
fn tick(at: Stamp) -> u32 {
    // Truncated on purpose: the tick wraps, and only differences are read.
    at.0.div_euclid(1_000_000) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_durations_saturate_instead_of_panicking() {
        let now = Instant::now();
        assert_eq!(
            later(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        assert_eq!(later(now, Duration::MAX), now + FAR);
        assert!(later(now, Duration::MAX) > now + Duration::from_secs(3600 * 24 * 365));
    }

    #[test]
    fn stamps_keep_order_and_instants_on_both_sides_of_the_epoch() {
        let now = Instant::now();
        let hour = Duration::from_secs(3600);
        let before = now.checked_sub(hour).unwrap_or(now);
        for at in [before, now, now + hour] {
            assert_eq!(Stamp::of(at).instant(), at);
        }
        assert!(Stamp::of(before) < Stamp::of(now));
        assert_eq!(
            Stamp::of(now).plus_nanos(nanos(hour)),
            Stamp::of(now + hour)
        );
        assert_eq!(Stamp::of(now).plus_nanos(u64::MAX).0, i64::MAX);
        let latest = AtomicStamp::default();
        assert_eq!(latest.load(), Stamp::NONE);
        latest.raise(now);
        latest.raise(before);
        assert_eq!(latest.load().get(), Some(now));
    }

    /// A tick tells how long ago to two milliseconds less at most, never
    /// more, across its wrap and from either side of the epoch; an instant
    /// noted later than the one asked at, or a span past its reach, reads
    /// as none.
    #[test]
    fn a_tick_tells_how_long_ago_within_its_reach() {
        let ms = |n: i64| Stamp(n * 1_000_000);
        let wrap = 1_i64 << 32;
        for at in [
            ms(0),
            Stamp(1),
            ms(wrap - 1),
            ms(-5).plus_nanos(1),
            ms(wrap * 3 + 7),
        ] {
            let tick = AtomicTick::new(at);
            for after in [0, 1, 999_999, 1_000_000, 2_500_000, 86_400_000_000_000] {
                let since = tick.since(at.plus_nanos(after));
                let real = Duration::from_nanos(after);
                assert!(
                    since <= real && real < since + Duration::from_millis(2),
                    "{at:?} + {real:?}: {since:?}"
                );
            }
            tick.move_on(at.plus_nanos(3_000_000));
            assert_eq!(tick.since(at.plus_nanos(3_000_000)), Duration::ZERO);
            // Noted after the instant asked at: none.
            assert_eq!(tick.since(at), Duration::ZERO);
            // A release that read its clock before keeps the later one.
            tick.move_on(at.plus_nanos(1_000_000));
            assert_eq!(tick.since(at.plus_nanos(3_000_000)), Duration::ZERO);
        }
        let reach = AtomicTick::REACH.as_millis() as i64;
        let since = |span: i64| AtomicTick::new(ms(0)).since(ms(span));
        assert_eq!(since(reach), AtomicTick::REACH - Duration::from_millis(1));
        assert_eq!(since(reach + 1), Duration::ZERO, "past the reach: none");
    }
}
