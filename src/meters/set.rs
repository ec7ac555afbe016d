//! A lane's meters, checked together ([`Meters`]): the declared quotas,
//! and what slows them (a learned pace, a vendor's leak, strict spacing),
//! charged all or none.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::counts::{Counts, Nanos, Slowed};
use super::inline::InlineMeter;
use super::leaky_bucket::LeakyBucket;
use super::meter::Meter;
use super::quota::{Quota, Unit};
use super::releases::{Reach, Releases};
use super::terms::{Terms, bursts_requests};
use super::token_bucket::TokenBucket;
use crate::time::{Stamp, later, nanos};

/// A lane's meters, checked together: a request goes when every meter
/// allows it, and none is charged unless all are, so waiting on one
/// dimension never leaks capacity from another.
#[derive(Debug)]
pub(crate) struct Meters {
    /// The meters of the quotas, and what slows them while anything
    /// does.
    meters: Counts,
    /// The last release, so a new pace counts from it.
    last: Stamp,
    /// Releases over the request quota's window, when there is one.
    releases: Option<Releases>,
    /// The quotas the meters count, in the same order, and what the
    /// meters make of them: shared by the gates of a level.
    terms: Arc<Terms>,
    /// The first release (`NONE`: none yet), or `MARK` once the vendor
    /// has answered: a burst waits for the vendor's first word (see
    /// [`FIRST_WORD`]). One stamp for both, not a flag beside it: a lane
    /// per tenant holds a gate each, and the flag took 8 bytes of it.
    first: Stamp,
}

/// How long a lane whose quotas allow a burst waits, after its first
/// release, for the vendor's first answer before it sends the rest: that
/// answer says what the vendor really has left (a bucket declared half as
/// large again as the vendor's would otherwise send its whole excess
/// before any answer could stop it). Bounded, as a slow first answer (a
/// long generation) must not hold a burst for long; one interval of a
/// quota at a request a second.
pub(crate) const FIRST_WORD: Duration = Duration::from_secs(1);

/// How many units `meter` lets go at once at `now` (a binary search on
/// `earliest`, which only says "when").
fn room(meter: &dyn Meter, now: Instant) -> u64 {
    let (mut fits, mut over) = (0, meter.capacity().saturating_add(1));
    while over - fits > 1 {
        let mid = fits + (over - fits) / 2;
        if meter.earliest(mid, now) <= now {
            fits = mid;
        } else {
            over = mid;
        }
    }
    fits
}

impl Meters {
    /// Fresh meters counting by `terms`, made at `now`.
    pub(crate) fn new(terms: Arc<Terms>, now: Instant) -> Self {
        let mut meters = Self {
            meters: Counts::of(
                terms
                    .quotas()
                    .iter()
                    .map(|quota| InlineMeter::of(quota, terms.headroom(), now)),
                None,
            ),
            last: Stamp::NONE,
            releases: terms.ledger(),
            // Nobody to hear from: as if the vendor had answered.
            first: if terms.hears() {
                Stamp::NONE
            } else {
                Stamp::MARK
            },
            terms,
        };
        meters.set_strict(meters.terms.strict());
        meters
    }

    /// Count by `quotas` from now on, keeping what is known. A meter whose
    /// quota is unchanged keeps its state. A new meter counting requests
    /// is charged with the releases of the ledger (the old request
    /// window's), so the new pace counts from the lane's own last
    /// releases, with no burst and no gap; a new meter counting cost
    /// starts from now (the ledger has no costs). The pace (learned,
    /// adaptive) stays.
    pub(crate) fn requote(&mut self, terms: Arc<Terms>, now: Instant) {
        let past: Vec<Instant> = self
            .releases
            .as_ref()
            .map(|releases| releases.instants().collect())
            .unwrap_or_default();
        let (meters, slowed) = self.meters.take();
        let mut old: Vec<(Quota, InlineMeter)> =
            self.terms.quotas().iter().cloned().zip(meters).collect();
        let meters: Vec<InlineMeter> = terms
            .quotas()
            .iter()
            .zip(terms.shapes())
            .map(|(quota, (shape, _))| {
                if let Some(at) = old.iter().position(|(was, _)| was == quota) {
                    return old.swap_remove(at).1;
                }
                let first = past.first().copied().unwrap_or(now).min(now);
                let mut meter = InlineMeter::of(quota, terms.headroom(), first);
                if quota.counts_requests() {
                    for &at in &past {
                        meter.change(shape, |meter| meter.commit(1, at));
                    }
                }
                meter
            })
            .collect();
        self.meters = Counts::of(meters, slowed);
        self.releases = terms.reach().map(|reach| {
            let mut releases = Releases::default();
            for &at in &past {
                releases.record(reach, at);
            }
            releases
        });
        self.set_strict(terms.strict());
        self.terms = terms;
    }

    fn set_strict(&mut self, strict: Option<Duration>) {
        self.meters.slow(strict.is_none(), |slowed| {
            slowed.strict = Nanos::or_none(strict);
        });
    }

    /// The strict spacing in force (see `spacing/`): no request less than
    /// this after the last one, released or sent; `None`: the meters
    /// alone decide.
    pub(crate) fn spacing(&self) -> Option<Duration> {
        let slowed = self.meters.slowed()?;
        slowed.strict.max(slowed.learned_spacing).get()
    }

    /// Keep requests at least `gap` apart on the wire, as a vendor's
    /// spacing refusals taught.
    pub(crate) fn set_spacing(&mut self, gap: Option<Duration>) {
        self.meters.slow(gap.is_none(), |slowed| {
            slowed.learned_spacing = Nanos::or_none(gap);
        });
    }

    /// Forget the ledger's releases its window left behind at `now` (see
    /// [`Releases::forget_stale`]).
    pub(crate) fn forget_stale(&mut self, now: Instant) {
        if let Some((releases, reach)) = self.ledger_mut() {
            releases.forget_stale(reach, now);
        }
    }

    /// The ledger and how far back it keeps releases: both or neither,
    /// made from the same terms.
    fn ledger_mut(&mut self) -> Option<(&mut Releases, &Reach)> {
        Some((self.releases.as_mut()?, self.terms.reach()?))
    }

    /// The ledger of releases over the request window (`None` when no
    /// quota counts requests, or no vendor answers: see
    /// `Terms::unheard`).
    pub(crate) fn releases(&self) -> Option<&Releases> {
        self.releases.as_ref()
    }

    fn units(unit: Unit, cost: u64) -> u64 {
        match unit {
            Unit::Requests => 1,
            Unit::Cost => cost,
        }
    }

    /// The largest cost a request may have (see [`Terms::capacity`]).
    pub(crate) fn capacity(&self) -> u64 {
        self.terms.capacity()
    }

    pub(crate) fn earliest(&self, cost: u64, now: Instant) -> Instant {
        Stamp::answer(now, |at| self.earliest_at(cost, now, at))
    }

    /// [`earliest`](Self::earliest) at `now`, whose stamp is `at`: asked
    /// on every release, so in stamps, and a loop, not a chain of
    /// iterators (the chain's fold cost as much as the meters' answers).
    pub(crate) fn earliest_at(&self, cost: u64, now: Instant, at: Stamp) -> Stamp {
        let mut earliest = at;
        for (meter, (shape, unit)) in self.meters.iter().zip(self.terms.shapes()) {
            let units = Self::units(*unit, cost);
            earliest = earliest.max(meter.earliest_at(shape, units, now, at));
        }
        if let Some(slowed) = self.meters.slowed() {
            earliest = earliest.max(slowed.earliest_at(at));
        }
        // Strict spacing is measured from the last send, not the last
        // release: the lane's departures keep it (`lane/turn.rs`).
        earliest.max(self.first_word_at())
    }

    /// Until when a burst waits for the vendor's first answer, if it does.
    pub(crate) fn first_word(&self) -> Option<Instant> {
        self.first_word_at().get()
    }

    /// [`first_word`](Self::first_word) as a stamp, `Stamp::NONE` for
    /// none.
    fn first_word_at(&self) -> Stamp {
        // Asked on every release: the marks first (nothing released yet,
        // or heard: the two earliest stamps), the quotas only then.
        if self.first <= Stamp::MARK || !self.bursts() {
            return Stamp::NONE;
        }
        self.first.later(nanos(FIRST_WORD))
    }

    /// True when the quotas let more than one request go at once.
    pub(crate) fn bursts(&self) -> bool {
        self.terms.bursts()
    }

    /// The vendor answered, at `now`. True when this was its first word,
    /// which a burst may have waited for.
    ///
    /// The meters count a bucket's refill from each release, and forgive a
    /// release landing up to `slack` late. The first request may land later
    /// than that: its connection is cold (7 ms on loopback on a busy
    /// machine, against 2.5 ms of slack), and the vendor's bucket then
    /// refills from later than the meters think, so the unit after the
    /// burst would go early, into a 429. When the first answer comes later
    /// than the slack, each bursting request meter is charged one unit: the
    /// burst is one smaller. Only one: an answer can be slow for other
    /// reasons (a model generating for seconds), which say nothing of when
    /// the request landed.
    pub(crate) fn heard(&mut self, now: Instant) -> bool {
        let first = std::mem::replace(&mut self.first, Stamp::MARK);
        if first == Stamp::MARK {
            return false;
        }
        // Heard before anything went: nothing to hold back.
        let Some(first) = first.get() else {
            return false;
        };
        if now.saturating_duration_since(first) > self.terms.slack() {
            self.each_bursting(|meter| meter.commit(1, now));
        }
        true
    }

    /// True when a meter lets a burst go (a bucket, or the vendor's leak):
    /// only such a meter does a vendor's `remaining` hold (see
    /// [`hold_to`](Self::hold_to)). Most gates have none (a vendor's quota
    /// that never bursts): their ledger is not read, nor the clock, on
    /// every answer.
    pub(crate) fn held_by_remaining(&self) -> bool {
        self.leak().is_some() || self.terms.bursts_requests()
    }

    /// A vendor's bucket has `remaining` requests left as it counted the
    /// request released at `released`: let no request meter allow more
    /// now than that, less the releases since (on their way to it), plus
    /// what the meter refills in the time since. A meter that allows more
    /// is charged the difference, as if it had gone; one allowing less
    /// keeps its own count (the vendor's word never makes a lane faster).
    pub(crate) fn hold_to(&mut self, remaining: u64, released: Instant, now: Instant) {
        if !self.held_by_remaining() {
            return;
        }
        let since = self.releases.as_ref().map_or(0, |releases| {
            releases.since(later(released, Duration::from_nanos(1)))
        });
        let elapsed = now.saturating_duration_since(released);
        let hold = |meter: &mut dyn Meter| {
            let refilled = elapsed.as_nanos() / meter.interval().as_nanos().max(1);
            let allowed = remaining
                .saturating_sub(since)
                .saturating_add(u64::try_from(refilled).unwrap_or(u64::MAX));
            if allowed >= meter.capacity() {
                // The vendor leaves more than the meter ever allows.
                return;
            }
            let room = room(meter, now);
            if room > allowed {
                meter.commit(room - allowed, now);
            }
        };
        self.each_bursting(hold);
        if let Some(leak) = self
            .meters
            .slowed_mut()
            .and_then(|slowed| slowed.leak.as_mut())
        {
            hold(leak);
        }
    }

    pub(crate) fn commit(&mut self, cost: u64, now: Instant) {
        self.commit_at(cost, now, Stamp::of(now));
    }

    /// [`commit`](Self::commit) at `now`, whose stamp is `at`: one stamp
    /// for every meter, the ledger and the last release, as reading a
    /// stamp off an instant costs a subtraction of instants.
    pub(crate) fn commit_at(&mut self, cost: u64, now: Instant, at: Stamp) {
        for (meter, (shape, unit)) in self.meters.iter_mut().zip(self.terms.shapes()) {
            meter.commit_at(shape, Self::units(*unit, cost), now, at);
        }
        if let Some(slowed) = self.meters.slowed_mut() {
            slowed.commit_at(at);
        }
        if let Some((releases, reach)) = self.ledger_mut() {
            releases.record_stamp(reach, at);
        }
        self.last = at;
        if self.first == Stamp::NONE {
            self.first = at;
        }
    }

    /// What the meters count by.
    pub(crate) fn terms(&self) -> &Arc<Terms> {
        &self.terms
    }

    /// When the last release was charged, as [`commit`](Self::commit)
    /// stamped it (`Stamp::NONE`: never).
    pub(crate) fn last_release(&self) -> Stamp {
        self.last
    }

    pub(crate) fn settle(&mut self, charged: u64, actual: u64, at: Instant) {
        for (meter, (shape, unit)) in self.meters.iter_mut().zip(self.terms.shapes()) {
            if *unit == Unit::Cost {
                meter.change(shape, |meter| meter.settle(charged, actual, at));
            }
        }
    }

    pub(crate) fn is_idle(&self, now: Instant) -> bool {
        self.meters
            .iter()
            .zip(self.terms.shapes())
            .all(|(meter, (shape, _))| meter.read(shape, |meter| meter.is_idle(now)))
            && self.paces().all(|pace| pace.is_idle(now))
    }

    /// When a request of `cost` could go behind `ahead` requests, taking
    /// each of them to cost as much as this one.
    pub(crate) fn eta(&self, ahead: u64, cost: u64, now: Instant) -> Instant {
        let declared = self
            .meters
            .iter()
            .zip(self.terms.shapes())
            .map(|(meter, (shape, unit))| {
                let units = Self::units(*unit, cost);
                meter.read(shape, |meter| {
                    meter.eta(ahead.saturating_mul(units), units, now)
                })
            });
        let pace = self.paces().map(|pace| pace.eta(ahead, 1, now));
        declared.chain(pace).max().unwrap_or(now)
    }

    /// The spacing between requests, for predictions: the slowest
    /// request-counting meter, or the pace.
    pub(crate) fn interval(&self) -> Duration {
        let declared = self
            .meters
            .iter()
            .zip(self.terms.shapes())
            .filter(|(_, (_, unit))| *unit == Unit::Requests)
            .map(|(meter, (shape, _))| meter.read(shape, |meter| meter.interval()));
        declared
            .chain(self.paces().map(Meter::interval))
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// Keep requests at least `interval` apart (`None`: as declared).
    pub(crate) fn set_pace(&mut self, interval: Option<Duration>) {
        let (slack, last) = (self.terms.slack(), self.last);
        self.meters.slow(interval.is_none(), |slowed| {
            match (interval, &mut slowed.pace) {
                (None, pace) => *pace = None,
                (Some(interval), Some(pace)) => pace.set_interval(interval),
                (Some(interval), pace @ None) => {
                    let mut bucket = LeakyBucket::with_interval(interval, slack);
                    if last != Stamp::NONE {
                        bucket.commit_at(1, last);
                    }
                    *pace = Some(bucket);
                }
            }
        });
    }

    /// The pace now in force, if slower than declared.
    pub(crate) fn pace(&self) -> Option<Duration> {
        let pace = self.meters.slowed()?.pace.as_ref()?;
        Some(pace.interval())
    }

    /// The vendor's bucket the meters keep to, if its leak was read.
    fn leak(&self) -> Option<&TokenBucket> {
        self.meters.slowed()?.leak.as_ref()
    }

    /// The spacing a shared store keeps to for these meters: the pace, or
    /// a vendor bucket's leak, which the store spaces (it holds no bucket of
    /// the vendor's), whichever is slower.
    pub(crate) fn store_pace(&self) -> Option<Duration> {
        self.paces().map(Meter::interval).max()
    }

    /// Keep to a vendor's bucket of `capacity` leaking one request every
    /// `interval` (`None`: no such bucket). A new one starts with the room
    /// the declared request meters allow now, which the vendor's last
    /// `remaining` holds.
    pub(crate) fn set_leak(&mut self, leak: Option<(u64, Duration)>, now: Instant) {
        let kept = self.leak().map(|b| (b.capacity(), b.interval()));
        if kept == leak {
            return;
        }
        let leak = leak.map(|(capacity, interval)| {
            let mut bucket = TokenBucket::with_interval(capacity, interval, self.terms.slack());
            let allowed = self
                .meters
                .iter()
                .zip(self.terms.shapes())
                .filter(|(_, (_, unit))| *unit == Unit::Requests)
                .map(|(meter, (shape, _))| meter.read(shape, |meter| room(meter, now)))
                .min()
                .unwrap_or(capacity);
            let full = room(&bucket, now);
            if full > allowed {
                bucket.commit(full - allowed, now);
            }
            bucket
        });
        self.meters
            .slow(leak.is_none(), |slowed| slowed.leak = leak);
    }

    /// Change each declared meter that counts requests and lets several
    /// go at once, which a vendor's word about its bucket holds, as
    /// `change` does.
    fn each_bursting(&mut self, mut change: impl FnMut(&mut dyn Meter)) {
        let terms = &*self.terms;
        let declared = terms.quotas().iter().zip(terms.shapes());
        for (meter, (quota, (shape, _))) in self.meters.iter_mut().zip(declared) {
            if bursts_requests(quota) {
                meter.change(shape, &mut change);
            }
        }
    }

    /// The meters set at run time that count requests: the pace and a
    /// vendor bucket's leak.
    fn paces(&self) -> impl Iterator<Item = &dyn Meter> {
        self.meters.slowed().into_iter().flat_map(Slowed::paces)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fresh meters counting `quota` stretched by `headroom`, at `now`.
    fn counting(quota: Quota, headroom: Duration, now: Instant) -> Meters {
        Meters::new(Arc::new(Terms::new(Arc::from([quota]), headroom, now)), now)
    }

    /// What slows the meters lives beside them (`counts.rs`): a pace
    /// survives a change of quotas, the one meter goes back in place once
    /// nothing slows it, and a gate of several quotas keeps them all.
    #[tokio::test(start_paused = true)]
    async fn a_pace_outlives_a_change_of_quotas_and_leaves_the_meter_in_place() {
        let now = Instant::now();
        let ten = Quota::leaky_bucket(10, Duration::from_secs(1));
        let mut meters = counting(ten.clone(), Duration::ZERO, now);
        assert!(matches!(meters.meters, Counts::One(_)));
        let pace = Duration::from_millis(250);
        meters.set_pace(Some(pace));
        assert!(matches!(meters.meters, Counts::More(_)));
        let twenty = Quota::leaky_bucket(20, Duration::from_secs(1));
        let terms = Terms::new(Arc::from([twenty, ten]), Duration::ZERO, now);
        meters.requote(Arc::new(terms), now);
        assert_eq!(meters.pace(), Some(pace), "the pace stays");
        assert_eq!(meters.meters.len(), 2);
        meters.set_pace(None);
        assert_eq!(meters.pace(), None);
        assert_eq!(meters.meters.len(), 2, "several quotas stay in their box");
        let terms = Terms::new(
            Arc::from([Quota::leaky_bucket(5, Duration::from_secs(1))]),
            Duration::ZERO,
            now,
        );
        meters.requote(Arc::new(terms), now);
        assert!(
            matches!(meters.meters, Counts::One(_)),
            "one meter, in place again"
        );
        meters.set_pace(Some(pace));
        meters.set_pace(None);
        assert!(matches!(meters.meters, Counts::One(_)), "and after a pace");
    }

    /// A first answer later than the slack may mean the first request
    /// landed that late: the burst is one smaller, and only one, however
    /// slow the answer.
    #[tokio::test(start_paused = true)]
    async fn a_late_first_answer_takes_one_unit_off_the_burst() {
        let quota = Quota::token_bucket(10, 10, Duration::from_secs(1));
        // No headroom, so no slack: any later answer is late. (answered
        // after, room then): a full bucket again after 5 s, less one unit.
        let headroom = Duration::ZERO;
        for (after, expected) in [(0, 9), (7, 8), (5_000, 9)] {
            let t0 = Instant::now();
            let mut meters = counting(quota.clone(), headroom, t0);
            meters.commit(1, t0);
            let heard = t0 + Duration::from_millis(after);
            assert!(meters.heard(heard), "the first word");
            assert!(!meters.heard(heard), "heard once");
            let shape = &meters.terms.shapes()[0].0;
            let room = meters.meters[0].read(shape, |meter| room(meter, heard));
            assert_eq!(room, expected, "answered after {after} ms");
        }
    }

    /// A vendor's bucket read at 20/s: the room the vendor reports goes at
    /// once, then one request a leak apart, though the declared bucket
    /// would allow 30/s.
    #[tokio::test(start_paused = true)]
    async fn a_read_leak_lets_the_reported_room_go_then_refills_at_its_rate() {
        let now = Instant::now();
        let quota = Quota::token_bucket(60, 30, Duration::from_secs(1));
        let mut meters = counting(quota, Duration::ZERO, now);
        meters.heard(now);
        meters.hold_to(10, now, now);
        meters.set_leak(Some((40, Duration::from_millis(50))), now);
        for _ in 0..10 {
            assert_eq!(meters.earliest(1, now), now);
            meters.commit(1, now);
        }
        assert_eq!(meters.earliest(1, now), now + Duration::from_millis(50));
        // The vendor says 5 left of what the meters allow: held to it.
        let later = now + Duration::from_secs(1);
        meters.hold_to(5, later, later);
        for _ in 0..5 {
            assert_eq!(meters.earliest(1, later), later);
            meters.commit(1, later);
        }
        assert!(meters.earliest(1, later) > later);
    }
}
