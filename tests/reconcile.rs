//! A vendor's signal is news only where it disagrees with what the lane
//! knows. Against a gateway that sends `x-ratelimit-limit/-remaining/-reset`
//! (whole seconds, rounded up) on every answer, a lane at the vendor's
//! quota uses all of it; when somebody else spends part of the quota, the
//! lane pauses before the vendor has to say 429.

mod common;

use std::time::Duration;

use callshaper::signals::WallClock;
use callshaper::testing::{RetryAfter, Style, TokioWall, Vendor};
use callshaper::{Quota, Shaper};
use common::{SECOND, burst, other_consumer, shaper, shaper_with};
use tokio::time::Instant;

/// A vendor's bucket of `capacity` refilled `rate` a second, speaking
/// `style`, and a lane declared `declared` against it.
async fn against_bucket(
    capacity: usize,
    rate: u32,
    style: Style,
    declared: Quota,
) -> (Vendor, Shaper) {
    let vendor = Vendor::token_bucket(capacity, rate, SECOND)
        .speaking(style)
        .start()
        .await;
    let shaper = shaper_with(declared).build().unwrap();
    (vendor, shaper)
}

/// A lane told a bucket of 15 at 15/s against Anthropic's bucket of 10
/// at 10/s, after `n` requests, all accepted in the end.
async fn told_15_against_anthropic(n: usize) -> (Vendor, Shaper) {
    let declared = Quota::token_bucket(15, 15, SECOND);
    let (vendor, shaper) = against_bucket(10, 10, Style::Anthropic, declared).await;
    for outcome in burst(&shaper, &vendor.uri(), n).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    (vendor, shaper)
}

/// The lane learned the vendor's 10 a second (`what`: which case).
fn assert_learned_ten(shaper: &Shaper, what: &str) {
    let learned = shaper.lanes()[0].learned;
    assert_eq!(learned, Some(callshaper::Rate::new(10, SECOND)), "{what}");
}

/// When the vendor accepted each request, in order.
fn accepted_at(vendor: &Vendor) -> Vec<Duration> {
    vendor
        .arrivals()
        .iter()
        .filter(|a| a.status == 200)
        .map(|a| a.at)
        .collect()
}

/// `n` requests through a lane of `rate`/s against a strict gateway of the
/// same quota: how long they take, and the 429s.
async fn at_full_quota(rate: u32, n: usize, throttle_for: Option<Duration>) -> (Duration, usize) {
    let vendor = Vendor::strict(rate as usize, SECOND).start().await;
    if let Some(period) = throttle_for {
        vendor.throttle_for(period, RetryAfter::Seconds(2));
    }
    let shaper = shaper(rate).build().unwrap();
    let started = Instant::now();
    for outcome in burst(&shaper, &vendor.uri(), n).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    assert!(vendor.max_in_any_window(SECOND) <= rate as usize);
    (started.elapsed(), vendor.throttled())
}

#[tokio::test(start_paused = true)]
async fn a_lane_at_the_vendors_quota_uses_all_of_it() {
    // 60 at 10/s: 59 intervals of 100.5 ms, not a second's pause per window.
    let (took, throttled) = at_full_quota(10, 60, None).await;
    assert_eq!(throttled, 0);
    assert!(took <= Duration::from_millis(6_100), "{took:?}");

    // 1,000 at 200/s.
    let (took, throttled) = at_full_quota(200, 1_000, None).await;
    assert_eq!(throttled, 0);
    assert!(took <= Duration::from_millis(5_050), "{took:?}");
}

#[tokio::test(start_paused = true)]
async fn after_a_throttle_the_lane_resumes_at_full_quota() {
    // 100 at 20/s, the vendor throttling everything for its first 2 s:
    // one pause of 2 s, then 4.95 s of releases.
    let (took, throttled) = at_full_quota(20, 100, Some(Duration::from_millis(10))).await;
    assert_eq!(throttled, 1);
    assert!(took <= Duration::from_millis(7_100), "{took:?}");
}

/// Another consumer spends half the quota first, and one more while the
/// lane is busy: the lane's own releases do not explain the vendor's "0
/// left", so it pauses until its own oldest request leaves the window
/// instead of meeting a 429.
#[tokio::test(start_paused = true)]
async fn a_quota_spent_by_someone_else_pauses_the_lane_before_a_429() {
    let (vendor, shaper, calls) = half_spent().await;
    // Our third request goes at 201 ms and hears "2 left"; then the other
    // spends one, and our fourth, at 302 ms, hears "0 left".
    tokio::time::sleep(Duration::from_millis(250)).await;
    spend(&vendor, 1).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let lane = &shaper.lanes()[0];
    assert_eq!(
        lane.pause_cause,
        Some(callshaper::lane::PauseCause::Spent),
        "paused for the quota someone else spent"
    );
    assert_eq!(
        lane.pause_said.as_deref(),
        Some("requests: 0 of 10 left, reset in 1s"),
        "what the vendor said, as it said it"
    );
    for outcome in calls.await.unwrap() {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    assert_eq!(vendor.throttled(), 0);
    assert!(vendor.max_in_any_window(SECOND) <= 10);
    assert!(
        ours_at(&vendor)[4] >= SECOND,
        "the fifth waits for the first to leave the window: {:?}",
        ours_at(&vendor)
    );
}

/// Another consumer spends half the quota: when the vendor says "1 left"
/// and the lane's own releases do not explain the rest spent, the lane
/// leaves that unit to the other consumer (whose next request may come
/// before the lane's) and waits until its own oldest request leaves the
/// window, instead of meeting a 429 and the vendor's whole reset.
#[tokio::test(start_paused = true)]
async fn the_last_unit_of_a_quota_someone_else_spends_is_left_to_them() {
    let (vendor, shaper, calls) = half_spent().await;
    // Our fourth request goes at 302 ms and hears "1 left".
    tokio::time::sleep(Duration::from_millis(350)).await;
    let lane = &shaper.lanes()[0];
    assert_eq!(
        lane.pause_cause,
        Some(callshaper::lane::PauseCause::Contested)
    );
    assert_eq!(
        lane.pause_said.as_deref(),
        Some("requests: 1 of 10 left, reset in 1s")
    );
    // The other takes the unit left to it.
    spend(&vendor, 1).await;
    for outcome in calls.await.unwrap() {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    assert_eq!(vendor.throttled(), 0);
    let ours = ours_at(&vendor);
    assert!(ours[4] >= SECOND, "{ours:?}");
    assert!(
        ours[4] <= Duration::from_millis(1_050),
        "no longer than until the first leaves the window: {ours:?}"
    );
}

/// A 10/s vendor another consumer spent 5 of, and a lane at 10/s sending
/// 20 requests to it (their outcomes, once all are answered).
async fn half_spent() -> (
    Vendor,
    Shaper,
    tokio::task::JoinHandle<Vec<Result<reqwest::Response, callshaper::Error>>>,
) {
    let vendor = Vendor::strict(10, SECOND).start().await;
    spend(&vendor, 5).await;
    let shaper = shaper(10).build().unwrap();
    let calls = tokio::spawn({
        let (shaper, uri) = (shaper.clone(), vendor.uri());
        async move { burst(&shaper, &uri, 20).await }
    });
    (vendor, shaper, calls)
}

/// Another consumer (outside any lane) spends `n` of `vendor`'s quota now.
async fn spend(vendor: &Vendor, n: usize) {
    let other = reqwest::Client::new();
    for _ in 0..n {
        let response = callshaper::testing::hold_clock(other.get(vendor.uri()).send()).await;
        assert_eq!(response.unwrap().status(), 200);
    }
}

/// When the vendor got each of the lane's requests (not the other's).
fn ours_at(vendor: &Vendor) -> Vec<Duration> {
    common::ours(vendor).iter().map(|a| a.at).collect()
}

/// Told 15/s at a vendor that really allows 10/s: the first refusal
/// teaches the lane the real quota, so it loses one window, not one per
/// window. From a gateway stating its limit (the lane keeps to it before
/// any 429), and from a vendor saying nothing but a bare 429 (the lane
/// keeps to what the vendor accepted before refusing). A lone bare 429 at
/// the lane's own interval may be jitter, so the silent vendor's second,
/// at once, is the one that teaches: it sees one request more in that
/// window.
#[tokio::test(start_paused = true)]
async fn a_lane_declared_too_fast_learns_the_real_quota_from_the_first_refusal() {
    for silent in [false, true] {
        let mut vendor = Vendor::strict(10, SECOND);
        if silent {
            vendor = vendor.silent();
        }
        let vendor = vendor.start().await;
        let shaper = shaper(15).build().unwrap();
        for outcome in burst(&shaper, &vendor.uri(), 60).await {
            assert_eq!(outcome.unwrap().status(), 200);
        }
        let accepted = accepted_at(&vendor);
        // After the first window and its pause, 50 requests at 10/s: 49
        // intervals of 100.5 ms; at least 90 % of the quota means at most
        // 5.47 s.
        let rest = accepted[59] - accepted[10];
        let throttled = vendor.throttled();
        assert!(throttled <= 2, "silent: {silent}: {throttled} × 429");
        assert!(
            rest <= Duration::from_millis(5_470),
            "silent: {silent}: {rest:?}"
        );
        let most = 11 + usize::from(silent);
        assert!(vendor.max_in_any_window(SECOND) <= most, "silent: {silent}");
        assert_learned_ten(&shaper, &format!("silent: {silent}"));
    }
}

/// Anthropic writes its bucket's "full again" in whole seconds. At a
/// one-second window a reset read at a refusal is anywhere up to two
/// seconds away, so only with its precision does it still look like the
/// declared window: the lane, told 15/s against 10/s, learns the vendor's
/// 10 from its first "0 left" instead of meeting a refusal per window.
#[tokio::test(start_paused = true)]
async fn a_whole_second_reset_at_a_one_second_window_still_teaches() {
    let (vendor, shaper) = told_15_against_anthropic(60).await;
    let accepted = accepted_at(&vendor);
    let refused = vendor.throttled();
    // After the first window, 50 requests at 10/s: at least 90 % of the
    // quota means at most 5.47 s.
    let rest = accepted[59] - accepted[10];
    println!("{refused} refused, the last 50 in {rest:?}");
    assert!(refused <= 2, "{refused} refused");
    assert!(rest <= Duration::from_millis(5_470), "{rest:?}");
    assert_learned_ten(&shaper, "");
}

/// Sleep until the wall clock the test vendors write their times with
/// (which follows tokio's clock) is `fraction` into its second.
async fn at_wall_phase(fraction: f64) {
    let now = TokioWall
        .now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let wait = (fraction - f64::from(now) / 1e9).rem_euclid(1.0);
    tokio::time::sleep(Duration::from_secs_f64(wait)).await;
}

/// GitHub writes its fixed window's end in whole epoch seconds. Told 15/s
/// against 10/s, the lane hears "0 left" 0.6 s into the first window, when
/// that end reads 0.4 s to 1.4 s away depending on the wall clock's phase
/// at the vendor's start; past 1.1 s it does not look like the declared
/// window, and the lane used to pause to each rounded-up end, every window
/// (at phases 0.05 to 0.25: a gap of 1.1 s to 1.3 s in every window, and
/// nothing learned). The step from one window's end to the next is the
/// window at every phase: the lane learns the vendor's 10 in the second
/// window at the latest, and pauses only until that window, which it saw
/// open, has closed.
///
/// Not at every phase: where the window ends less than the headroom after
/// a whole second, the pause to the rounded-up end plus the headroom
/// outlasts the next window too, every window; the lane sees every other
/// end, two seconds apart, which it cannot tell from a two-second window,
/// and uses half the quota without a refusal. The phases here start 25 ms
/// past the second.
#[tokio::test(start_paused = true)]
async fn a_fixed_windows_whole_second_end_teaches_at_every_phase() {
    for phase in (0..20).map(|i| (f64::from(i) + 0.5) / 20.0) {
        at_wall_phase(phase).await;
        let vendor = Vendor::github(10, SECOND).start().await;
        let shaper = shaper(15).build().unwrap();
        for outcome in burst(&shaper, &vendor.uri(), 40).await {
            assert_eq!(outcome.unwrap().status(), 200, "phase {phase}");
        }
        let accepted = accepted_at(&vendor);
        let refused = vendor.throttled();
        // After the first pause (to an end the lane could not place), no
        // gap between acceptances is as long as the pause to a rounded-up
        // end: at most the rest of a window once 10 went in 0.6 s.
        let gap = accepted[10..]
            .windows(2)
            .map(|pair| pair[1] - pair[0])
            .max()
            .unwrap();
        let all = accepted[39] - accepted[0];
        println!(
            "phase {phase}: {refused} refused, 40 in {all:?}, the longest gap after the first pause {gap:?}"
        );
        assert!(refused <= 2, "phase {phase}: {refused} refused");
        assert!(gap <= Duration::from_millis(700), "phase {phase}: {gap:?}");
        assert_learned_ten(&shaper, &format!("phase {phase}"));
    }
}

/// A quota learned from a bucket vendor (Anthropic: a limit that refills)
/// refills a bucket of the vendor's size rather than spacing every request:
/// after a quiet spell, in which the vendor's bucket filled again, the lane
/// sends what the vendor has at once, then one a refill apart.
#[tokio::test(start_paused = true)]
async fn a_quota_learned_from_a_bucket_vendor_still_bursts_after_a_quiet_spell() {
    let (vendor, shaper) = told_15_against_anthropic(40).await;
    assert_learned_ten(&shaper, "");
    tokio::time::sleep(2 * SECOND).await;
    let quiet = vendor.arrivals().len();
    for outcome in burst(&shaper, &vendor.uri(), 20).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    let after = &accepted_at(&vendor)[quiet..];
    let burst_took = after[9] - after[0];
    println!("after a quiet spell: 10 in {burst_took:?}");
    assert_eq!(vendor.throttled(), 0);
    assert!(
        burst_took <= Duration::from_millis(50),
        "the bucket the quiet spell filled goes at once: {burst_took:?}"
    );
    assert!(vendor.max_in_any_window(SECOND) <= 20);
}

/// A bucket that says its level but not its rate (Shopify's `40/40`),
/// scaled so its constant `Retry-After: 2.0` empties it: a lane told 30/s
/// against 20/s bursts into the full bucket, is refused once, and after
/// the pause keeps to its declared rate without bursts until the levels
/// show the leak; then the leak refills the room the vendor reports.
/// Bursting into the emptied bucket after each pause instead meets a
/// refusal every two seconds.
#[tokio::test(start_paused = true)]
async fn a_bucket_that_hides_its_rate_is_read_after_one_refusal() {
    let declared = Quota::token_bucket(60, 30, SECOND);
    let (vendor, shaper) = against_bucket(40, 20, Style::Shopify, declared).await;
    for outcome in burst(&shaper, &vendor.uri(), 200).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    let accepted = accepted_at(&vendor);
    let refused = vendor.throttled();
    let learned = shaper.lanes()[0].learned.expect("the leak was read");
    // The bucket's 40, then 160 at 20/s: 8 s at the least. The room the
    // pause left is used, not paced away: at least 97 % of that.
    let took = accepted[199];
    println!("{refused} refused, learned {learned:?}, done at {took:?}");
    assert!(refused <= 2, "{refused} refused");
    let per_second = learned.per_second();
    assert!((19.0..=20.0).contains(&per_second), "{learned:?}");
    assert!(took <= Duration::from_millis(8_250), "{took:?}");
}

/// A vendor that throttles everything after a quiet spell (an outage, a
/// forced 429) has not shown its quota: the lane, not busy before, learns
/// nothing and resumes at its declared pace after the pause.
#[tokio::test(start_paused = true)]
async fn a_throttle_after_a_quiet_spell_teaches_nothing() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let shaper = shaper(10).build().unwrap();
    for outcome in burst(&shaper, &vendor.uri(), 5).await {
        outcome.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    vendor.throttle_for(Duration::from_millis(10), RetryAfter::Seconds(2));
    let started = Instant::now();
    for outcome in burst(&shaper, &vendor.uri(), 10).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    assert_eq!(shaper.lanes()[0].learned, None);
    // The 2 s pause, then ten at 10/s.
    assert!(
        started.elapsed() <= Duration::from_millis(3_100),
        "{:?}",
        started.elapsed()
    );
}

/// A quota shared with a consumer we don't control, sending 2, 3 or 5 a
/// second at a 10/s gateway: the lane, declared at the whole quota, uses
/// most of what the other leaves and meets few 429s. "0 left" that the
/// lane's releases don't explain pauses it only until its own oldest
/// request leaves the window, not for the vendor's whole-second reset;
/// "1 left" that they don't explain is left to the other consumer the
/// same way, not taken at the risk of a 429 and a whole reset.
#[tokio::test(start_paused = true)]
async fn a_quota_shared_with_another_consumer_is_used_and_kept() {
    for every in [200u64, 333, 500] {
        let vendor = Vendor::gateway(10, SECOND).start().await;
        let other = other_consumer(vendor.uri(), Duration::from_millis(every), Duration::MAX);
        let shaper = shaper(10).build().unwrap();
        let started = Instant::now();
        for outcome in burst(&shaper, &vendor.uri(), 100).await {
            assert_eq!(outcome.unwrap().status(), 200);
        }
        let took = started.elapsed();
        other.abort();
        let ours_refused = common::ours(&vendor)
            .iter()
            .filter(|a| a.status == 429)
            .count();
        let left = 10.0 - 1_000.0 / every as f64;
        let used = 99.0 / left / took.as_secs_f64();
        println!(
            "other every {every} ms: {:.1} % of what it leaves, {ours_refused} of our 100 refused",
            used * 100.0
        );
        assert!(
            used >= 0.80,
            "other every {every} ms: {:.1} %",
            used * 100.0
        );
        // The last unit left to the other: none (1, 4 and 0 while the
        // lane took it).
        assert_eq!(ours_refused, 0, "other every {every} ms");
    }
}

/// Answers through `client`, the first answer `first` late (paused time),
/// and notes when each request was sent.
struct SlowFirst {
    client: callshaper::testing::HoldClock<reqwest::Client>,
    first: Duration,
    sent: std::sync::Arc<std::sync::Mutex<Vec<Instant>>>,
}

impl callshaper::shaper::Transport for SlowFirst {
    fn send(
        &self,
        request: reqwest::Request,
    ) -> callshaper::shaper::BoxFuture<reqwest::Result<reqwest::Response>> {
        let is_first = {
            let mut sent = self.sent.lock().unwrap();
            sent.push(Instant::now());
            sent.len() == 1
        };
        let delay = if is_first { self.first } else { Duration::ZERO };
        let answer = self.client.send(request);
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            answer.await
        })
    }
}

/// A quota that allows a burst holds it for the vendor's first answer,
/// which says what is left, but never more than a second: a slow first
/// answer (a long generation) must not hold the burst. A first answer
/// that came while the burst waited, later than the meters' slack, may
/// mean the first request landed that late: the burst is one smaller, and
/// its last goes an interval on.
#[tokio::test(start_paused = true)]
async fn a_burst_waits_for_the_vendors_first_word_at_most_a_second() {
    for (first, burst_at, one_later) in [
        (Duration::from_millis(40), Duration::from_millis(40), true),
        (3 * SECOND, SECOND, false),
    ] {
        let vendor = Vendor::token_bucket(10, 10, SECOND).start().await;
        let sent = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let shaper = callshaper::Shaper::builder()
            .quota(callshaper::Quota::token_bucket(10, 10, SECOND))
            .transport(SlowFirst {
                client: callshaper::testing::HoldClock(reqwest::Client::new()),
                first,
                sent: sent.clone(),
            })
            .build()
            .unwrap();
        let t0 = Instant::now();
        for outcome in burst(&shaper, &vendor.uri(), 10).await {
            assert!(outcome.unwrap().status().is_success());
        }
        let sent = sent.lock().unwrap().clone();
        assert_eq!(sent[0], t0, "the first goes at once");
        let (burst, last) = if one_later {
            (&sent[1..9], &sent[9..])
        } else {
            (&sent[1..], &sent[..0])
        };
        for at in burst {
            let after = *at - t0;
            assert!(
                after >= burst_at && after <= burst_at + Duration::from_millis(5),
                "the burst went {after:?} in, expected {burst_at:?} (first answer {first:?})"
            );
        }
        for at in last {
            let after = *at - t0;
            // One interval (100.5 ms) after the first, less the slack.
            assert!(
                after > burst_at + Duration::from_millis(5) && after <= Duration::from_millis(105),
                "the last of the burst went {after:?} in"
            );
        }
        assert_eq!(vendor.throttled(), 0);
    }
}

/// A quota learned from a refusal is probed back up. Against a silent
/// vendor (a bare 429, as Stripe's), another consumer takes half of a
/// 10/s quota for the first 12 s: the lane, refused, keeps to what the
/// vendor accepted. The other consumer leaves; 30 windows later the lane
/// raises its pace a step a window, and is back at the declared 10/s.
#[tokio::test(start_paused = true)]
async fn a_quota_learned_from_a_refusal_is_probed_back_up() {
    let vendor = Vendor::stripe(10, SECOND).start().await;
    let other = other_consumer(
        vendor.uri(),
        Duration::from_millis(200),
        Duration::from_secs(12),
    );
    let shaper = shaper(10).build().unwrap();
    let lane = {
        let shaper = shaper.clone();
        let uri = vendor.uri();
        tokio::spawn(async move { burst(&shaper, &uri, 900).await })
    };
    tokio::time::sleep(Duration::from_secs(15)).await;
    let learned = shaper.lanes()[0].learned;
    assert!(
        learned.is_some_and(|rate| rate.count < 10),
        "the refusal taught {learned:?}"
    );
    for outcome in lane.await.unwrap() {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    other.await.unwrap();
    assert_eq!(
        shaper.lanes()[0].learned,
        None,
        "back at the declared quota"
    );
    let ours = common::ours(&vendor);
    let refused = ours.iter().filter(|a| a.status == 429).count();
    let last = ours.last().unwrap().at;
    let late = ours
        .iter()
        .filter(|a| a.status == 200 && a.at + Duration::from_secs(10) > last)
        .count();
    println!(
        "probed back up: taught {learned:?}, {refused} of ours refused, {late} in the last 10 s, done at {last:?}"
    );
    assert!(late >= 95, "{late} in the last 10 s");
    assert!(refused <= 6, "{refused} refused");
}

/// Probing a vendor that really allows what the lane learned costs a
/// refusal after 30 quiet windows, then after 60 more: declared at 15/s
/// against a silent 10/s vendor (bare 429s) for 2 minutes, the refusals
/// that taught the lane (two in a row: a lone one may be jitter), then
/// two, and the lane keeps to 10/s: no window but the first, with those
/// two, sees more than 11. (A vendor
/// that says its limit is heard before it refuses: its probes end in a
/// pause, not a 429.)
#[tokio::test(start_paused = true)]
async fn probing_a_quota_the_vendor_really_has_costs_a_refusal_per_doubling_quiet() {
    let vendor = Vendor::stripe(10, SECOND).start().await;
    let shaper = shaper(15).build().unwrap();
    for outcome in burst(&shaper, &vendor.uri(), 1_200).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    let arrivals = vendor.arrivals();
    let refusals: Vec<Duration> = arrivals
        .iter()
        .filter(|a| a.status == 429)
        .map(|a| a.at)
        .collect();
    println!(
        "probing a real 10/s: refused at {refusals:?}, done at {:?}",
        arrivals.last().unwrap().at
    );
    let probes: Vec<Duration> = refusals
        .iter()
        .copied()
        .filter(|&at| at >= Duration::from_secs(5))
        .collect();
    assert!(refusals.len() - probes.len() <= 2, "{refusals:?}");
    assert_eq!(probes.len(), 2, "{refusals:?}");
    assert!(probes[0] >= Duration::from_secs(30), "{refusals:?}");
    assert!(
        probes[1] >= probes[0] + Duration::from_secs(60),
        "{refusals:?}"
    );
    assert_learned_ten(&shaper, "");
    assert!(vendor.max_in_any_window(SECOND) <= 12);
    let after_the_first = arrivals.iter().map(|a| a.at).filter(|&at| at >= SECOND);
    assert!(callshaper::testing::max_in_any_window(after_the_first, SECOND) <= 11);
}

/// A vendor's whole-second epoch reset (`x-ratelimit-reset`, rounded up,
/// as Flask-Limiter and express-rate-limit write it) overstates the wait by
/// up to a second, by as much as the wall-clock second had run when the
/// vendor's window opened; Flask-Limiter's window opens at the first
/// request after the last one closed, so a lane resuming on a whole second
/// hears every later end about 1.4 s ahead. A lane declared at 1.5x learns
/// the vendor's 10/s wherever in the second the first request lands: for
/// each of ten phases, at most 2 refusals and 90 % of the quota after the
/// first window, against Flask-Limiter's window and against a fixed window
/// from the vendor's start.
#[tokio::test(start_paused = true)]
async fn whole_second_resets_teach_wherever_the_window_opens() {
    for name in ["flask-limiter", "fixed"] {
        let vendor = || match name {
            "flask-limiter" => Vendor::flask_limiter(10, SECOND),
            _ => Vendor::fixed_window(10, SECOND),
        };
        for tenth in 0..10_u32 {
            // Tokio's clock, and the wall clock read off it, on to `tenth`
            // tenths into a wall-clock second: the first request lands there.
            let into = TokioWall
                .now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos();
            let phase = tenth * 100_000_000;
            let ahead = (phase + 1_000_000_000 - into) % 1_000_000_000;
            tokio::time::advance(Duration::from_nanos(u64::from(ahead))).await;
            let vendor = vendor().start().await;
            let shaper = shaper(15).build().unwrap();
            let case = format!("{name}, phase {tenth}/10");
            for outcome in burst(&shaper, &vendor.uri(), 60).await {
                assert_eq!(outcome.unwrap().status(), 200, "{case}");
            }
            let accepted: Vec<Duration> = accepted_at(&vendor)
                .into_iter()
                .filter(|&at| at >= SECOND)
                .collect();
            let span = (*accepted.last().unwrap() - accepted[0]).as_secs_f64();
            let used = (accepted.len() - 1) as f64 / (span * 10.0);
            println!(
                "{case}: {} refused, {:.1} % after the first window, learned {:?}",
                vendor.throttled(),
                used * 100.0,
                shaper.lanes()[0].learned
            );
            assert!(vendor.throttled() <= 2, "{case}");
            assert!(used >= 0.90, "{case}: {:.1} %", used * 100.0);
        }
    }
}

/// A vendor that says nothing is left until an end further away than the
/// declared window has a longer window than declared: a lane declared
/// 10/s against 10 per fixed 3 s (the end in epoch seconds) pauses until
/// that end, never sooner, though its own releases fill only its declared
/// window: no refusal, and each of the vendor's windows gets its 10.
#[tokio::test(start_paused = true)]
async fn a_reset_further_than_the_declared_window_is_the_vendors_window() {
    let window = Duration::from_secs(3);
    let vendor = Vendor::fixed_window(10, window).start().await;
    let shaper = shaper(10).build().unwrap();
    for outcome in burst(&shaper, &vendor.uri(), 40).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    assert_eq!(vendor.throttled(), 0, "no request sent before the end");
    let accepted = accepted_at(&vendor);
    for (n, ten) in accepted.chunks(10).enumerate() {
        let start = window * u32::try_from(n).unwrap();
        assert!(
            ten.iter().all(|&at| at >= start && at < start + window),
            "window {n}: {ten:?}"
        );
    }
}
