use std::time::Duration;

use tokio::time::Instant;

use super::departures::Departures;
use super::learned::{Declared, Learned, Reading, Refusal};
use crate::meters::{Rate, Reach, Releases};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// 10 a second with 5 ms of headroom.
fn ten() -> Declared {
    Declared::new(Rate::new(10, Duration::from_secs(1)), ms(5))
}

/// 15 a second with 5 ms of headroom: a 67 ms interval.
fn fifteen() -> Declared {
    Declared::new(Rate::new(15, Duration::from_secs(1)), ms(5))
}

/// A refusal that said nothing (a bare 429, nginx's 503) of the release
/// `gap` after the one at `prior`, with `before` releases in the window
/// before it, on a lane not yet strict, with no accepted gap to read it
/// against, past its first window.
fn silent(gap: Duration, before: u64, prior: Instant) -> Refusal {
    Refusal {
        gap,
        before,
        prior,
        strict: false,
        silent: true,
        accepted: None,
        cold: false,
    }
}

/// Round trips about the usual (0.7-0.9 ms) move the last departure on
/// by their excess over the smoothed one, within that spread (0.2 ms at
/// most); one of 2.7 ms, held up on its way, by nearly 2 ms (nginx saw
/// such a request 2 ms late, and refused the next, sent on time).
#[tokio::test(start_paused = true)]
async fn a_slow_round_trip_moves_the_last_departure_on_by_its_excess() {
    let departures = Departures::default();
    let t0 = Instant::now();
    let us = Duration::from_micros;
    let mut went = t0;
    for took in [700, 900, 800, 700, 900, 800, 700, 900, 800, 800] {
        departures.leave();
        departures.went(Some(went));
        departures.answered(went, went + us(took));
        let moved = departures.last().expect("a departure") - went;
        assert!(moved <= us(200), "{took} µs is usual: moved {moved:?}");
        went += ms(10);
    }
    departures.leave();
    departures.went(Some(went));
    departures.answered(went, went + us(2_700));
    let moved = departures.last().expect("a departure") - went;
    assert!(
        moved > us(1_900) && moved < us(2_000),
        "{moved:?} past the request's own departure"
    );
}

/// A gap learned against nginx's 100r/s (10.55 ms, the interval
/// 10.05 plus the first margin) decays to nginx's 10 ms plus the
/// jitter's half millisecond and stays there: at the interval itself,
/// 0.05 ms past nginx's spacing, jitter refuses a send.
#[tokio::test(start_paused = true)]
async fn a_decayed_gap_keeps_a_margin_for_jitter() {
    let hundred = Declared::new(Rate::new(100, Duration::from_secs(1)), ms(5));
    let mut learned = Learned::default();
    let t0 = Instant::now();
    let sooner = silent(Duration::from_micros(9_900), 40, t0);
    let learned_gap = Duration::from_nanos(10_552_500);
    assert_eq!(
        learned.refused(sooner, hundred, t0, t0),
        Reading::Spacing(learned_gap)
    );
    let t = hundred.interval;
    let mut now = t0;
    let mut gap = learned_gap;
    for _ in 0..4 {
        now += Duration::from_secs(30);
        if let Some(stepped) = learned.decay(t, now) {
            gap = stepped;
        }
    }
    assert_eq!(gap, Duration::from_micros(10_500));
    assert!(!learned.decays(t), "at the least it keeps");
}

/// The ledger's accepted gaps leave out the refused releases and the
/// release after each (the vendor measures it from the one before).
#[tokio::test(start_paused = true)]
async fn the_gaps_the_vendor_accepted_are_read_off_the_ledger() {
    let t0 = Instant::now();
    let (reach, mut releases) = (Reach::new(Duration::from_secs(1), 10), Releases::default());
    for at in [0, 67, 150, 300] {
        releases.record(&reach, t0 + ms(at));
    }
    let mut learned = Learned::default();
    let first = learned
        .refusal(&releases, t0, t0 + ms(67), false, true)
        .expect("a release before");
    assert_eq!((first.gap, first.accepted), (ms(67), None));
    learned.refused(first, fifteen(), t0 + ms(67), t0);
    let later = learned
        .refusal(&releases, t0, t0 + ms(300), true, true)
        .expect("a release before");
    // 0 -> 67 and 67 -> 150 touch the refused release; 150 -> 300 is
    // the refused one's own gap.
    assert_eq!(
        (later.gap, later.accepted, later.before),
        (ms(150), None, 3)
    );
    assert!(learned.refusal(&releases, t0, t0, false, true).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_send_sooner_than_the_rate_turns_the_lane_strict_a_millisecond_past_its_interval() {
    let mut learned = Learned::default();
    let now = Instant::now();
    let refusal = silent(Duration::from_micros(99_300), 4, now);
    let reading = learned.refused(refusal, ten(), now, now);
    let margin = Duration::from_millis(1);
    assert_eq!(reading, Reading::Spacing(ten().interval + margin));
}

#[tokio::test(start_paused = true)]
async fn jitter_widens_the_margin_a_fiftieth_at_a_time_then_only_when_refused_often() {
    let mut learned = Learned::default();
    let t0 = Instant::now();
    let refusal = Refusal {
        strict: true,
        accepted: Some(ten().interval),
        ..silent(ten().interval, 9, t0)
    };
    let first = learned.refused(refusal, ten(), t0 + ms(1), t0);
    assert_eq!(first, Reading::Spacing(Duration::from_micros(102_510)));
    let mut last = first;
    for i in 0..4 {
        last = learned.refused(refusal, ten(), t0 + ms(2 + i), t0);
    }
    let tenth = Duration::from_micros(110_550);
    assert_eq!(last, Reading::Spacing(tenth));
    // At the tenth, a refusal more than 50 gaps (`T / step`) after the
    // last is the jitter's tail: the gap stays. One sooner widens it a
    // step.
    let rare = t0 + Duration::from_secs(6);
    assert_eq!(
        learned.refused(refusal, ten(), rare, rare),
        Reading::Spacing(tenth)
    );
    assert_eq!(
        learned.refused(refusal, ten(), rare + ms(500), rare),
        Reading::Spacing(tenth + ten().interval / 50)
    );
}

/// A gap learned past the jitter margin in the lane's first window,
/// and a refusal at it that a closer accepted gap calls jitter (the
/// closer one landed later than it left): the gap grows a step, rather
/// than staying under the vendor's spacing for good.
#[tokio::test(start_paused = true)]
async fn jitter_about_a_learned_gap_still_widens_it() {
    let mut learned = Learned::default();
    let t0 = Instant::now();
    let first = Refusal {
        cold: true,
        ..silent(ms(67), 1, t0)
    };
    learned.refused(first, fifteen(), t0 + ms(67), t0);
    let grown = Refusal {
        gap: learned.gap().expect("a learned gap"),
        prior: t0 + ms(140),
        strict: true,
        ..first
    };
    learned.refused(grown, fifteen(), t0 + ms(210), t0);
    let kept = learned.gap().expect("a grown gap");
    assert!(kept > ms(74), "past the jitter margin: {kept:?}");
    let jitter = Refusal {
        gap: kept,
        prior: t0 + ms(500),
        accepted: Some(kept - ms(1)),
        ..grown
    };
    let Reading::Spacing(widened) = learned.refused(jitter, fifteen(), t0 + ms(600), t0) else {
        panic!("a spacing refusal");
    };
    assert!(widened > kept, "{widened:?} after {kept:?}");
}

/// nginx at 10r/s, the lane declared 15/s: refused at 67 ms, then at
/// 68 ms, then at 85 ms, then kept at 107 ms, above nginx's 100.
#[tokio::test(start_paused = true)]
async fn an_early_refusal_grows_the_gap_by_a_quarter() {
    let declared = fifteen();
    let mut learned = Learned::default();
    let now = Instant::now();
    let early = |gap| Refusal {
        strict: gap > ms(67),
        ..silent(gap, 1, now)
    };
    let first = learned.refused(early(ms(67)), declared, now, now);
    assert_eq!(first, Reading::Spacing(Duration::from_micros(68_340)));
    let second = learned.refused(early(Duration::from_micros(68_340)), declared, now, now);
    assert_eq!(second, Reading::Spacing(Duration::from_micros(85_425)));
    let third = learned.refused(early(Duration::from_micros(85_425)), declared, now, now);
    assert_eq!(
        third,
        Reading::Spacing(Duration::from_nanos(106_781_250)),
        "past nginx's 100 ms"
    );
}

/// nginx at 10r/s, the lane declared 15/s: the gap grown three times
/// by refusals early in the window, to 106.8 ms, the largest refused
/// 85.4 ms.
fn grown_against_nginx(t0: Instant) -> (Learned, Duration) {
    let mut learned = Learned::default();
    let mut gap = ms(67);
    for _ in 0..3 {
        let early = Refusal {
            strict: gap > ms(67),
            ..silent(gap, 1, t0)
        };
        let Reading::Spacing(grown) = learned.refused(early, fifteen(), t0, t0) else {
            panic!("a spacing refusal");
        };
        gap = grown;
    }
    assert_eq!(gap, Duration::from_nanos(106_781_250));
    (learned, gap)
}

/// A refusal of the settled gap, as a vendor refuses a step below its
/// spacing: at once, no gap that close accepted.
fn settle_refused(settled: Duration, at: Instant, accepted: Duration) -> Refusal {
    Refusal {
        strict: true,
        accepted: Some(accepted),
        ..silent(settled, 9, at)
    }
}

/// The grown gap settles after a quiet declared window, three quarters
/// of the way down from the largest refused gap: 101.4 ms. Refused, it
/// goes back, and the spent bracket leaves the slow decay.
#[tokio::test(start_paused = true)]
async fn a_grown_gap_settles_within_its_bracket_once() {
    let t0 = Instant::now();
    let (mut learned, grown) = grown_against_nginx(t0);
    let window = t0 + Duration::from_secs(1);
    assert_eq!(learned.decay(ms(67), window - ms(1)), None);
    let settled = learned.decay(ms(67), window).expect("a settle");
    assert!(
        settled > ms(101) && settled < ms(102),
        "three quarters up from 85.4 to 106.8: {settled:?}"
    );
    let at = window + ms(101);
    let refused = settle_refused(settled, window, grown);
    let back = learned.refused(refused, fifteen(), at, at);
    assert_eq!(
        back,
        Reading::Spacing(grown),
        "the refused settle goes back"
    );
    let later = window + Duration::from_secs(31);
    assert_eq!(learned.decay(ms(67), later), None, "the bracket is spent");
}

/// A refusal of the settled gap after the vendor accepted a gap as
/// close is jitter about it, not its refusal: the lane stays near the
/// settled gap (a step above it) rather than going back to the grown.
#[tokio::test(start_paused = true)]
async fn jitter_about_a_settled_gap_does_not_undo_the_settle() {
    let t0 = Instant::now();
    let (mut learned, grown) = grown_against_nginx(t0);
    let window = t0 + Duration::from_secs(1);
    let settled = learned.decay(ms(67), window).expect("a settle");
    let at = window + Duration::from_millis(900);
    let jitter = settle_refused(settled, at, settled - ms(1));
    let Reading::Spacing(kept) = learned.refused(jitter, fifteen(), at + settled, at) else {
        panic!("a spacing refusal");
    };
    assert!(kept >= settled && kept < grown, "{kept:?}");
}

/// A vendor counting 3 a second with bare 429s, against a lane
/// declared 10. A lone refusal at a gap it accepted before, on the
/// lane's schedule, may be jitter (the send before landed late on the
/// wire): the lane turns strict with a margin. The vendor refuses the
/// next send too, and two in a row at an accepted gap are a count, which
/// the count learning reads: the lane keeps no spacing again. One at a
/// gap under the interval (a release whose lateness the lane forgave)
/// may be jitter too, and one soon after that spacing reading is a
/// count. A refusal that states a limit is a count at once.
#[tokio::test(start_paused = true)]
async fn a_lone_refusal_at_an_accepted_gap_is_jitter_and_the_next_a_count() {
    let mut learned = Learned::default();
    let now = Instant::now();
    let refusal = Refusal {
        accepted: Some(ms(100)),
        ..silent(ten().interval, 3, now + ms(200))
    };
    let margin = Duration::from_micros(102_510);
    assert_eq!(
        learned.refused(refusal, ten(), now + ms(300), now),
        Reading::Spacing(margin),
        "a lone refusal may be jitter"
    );
    let next = Refusal {
        gap: margin,
        strict: true,
        prior: now + ms(300),
        ..refusal
    };
    assert_eq!(
        learned.refused(next, ten(), now + ms(300) + margin, now + ms(400)),
        Reading::Retracted,
        "the send after it was refused too"
    );
    assert_eq!(learned.gap(), None, "the jitter's reading taken back");
    let mut forgiven = Learned::default();
    let sooner = Refusal {
        gap: ms(100),
        ..refusal
    };
    assert_eq!(
        forgiven.refused(sooner, ten(), now + ms(300), now),
        Reading::Spacing(margin),
        "maybe jitter"
    );
    let again = Refusal {
        strict: true,
        prior: now + ms(1200),
        ..sooner
    };
    assert_eq!(
        forgiven.refused(again, ten(), now + ms(1300), now + ms(1300)),
        Reading::Count
    );
    let mut fresh = Learned::default();
    let stating = Refusal {
        silent: false,
        ..refusal
    };
    assert_eq!(
        fresh.refused(stating, ten(), now + ms(300), now),
        Reading::Count
    );
    assert_eq!(fresh.gap(), None);
}

/// After a quiet spell the gap steps down; a refused step goes back and
/// waits twice as long.
#[tokio::test(start_paused = true)]
async fn a_learned_gap_decays_and_a_refused_step_goes_back() {
    let declared = fifteen();
    let mut learned = Learned::default();
    let t0 = Instant::now();
    let refusal = Refusal {
        strict: true,
        ..silent(ms(90), 1, t0)
    };
    let Reading::Spacing(gap) = learned.refused(refusal, declared, t0, t0) else {
        panic!("a spacing refusal");
    };
    assert_eq!(learned.decay(ms(67), t0 + Duration::from_secs(29)), None);
    let stepped = learned
        .decay(ms(67), t0 + Duration::from_secs(30))
        .expect("a step down after 30 windows");
    assert!(stepped < gap);
    let t1 = t0 + Duration::from_secs(31);
    let back = learned.refused(refusal, declared, t1, t1);
    assert_eq!(back, Reading::Spacing(gap), "the refused step goes back");
    assert_eq!(learned.decay(ms(67), t1 + Duration::from_secs(59)), None);
    assert!(
        learned
            .decay(ms(67), t1 + Duration::from_secs(60))
            .is_some()
    );
}
