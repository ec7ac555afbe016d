//! A vendor's signal is news only where it disagrees with what the lane
//! knows. Against a gateway that sends `x-ratelimit-limit/-remaining/-reset`
//! (whole seconds, rounded up) on every answer, a lane at the vendor's
//! quota uses all of it; when somebody else spends part of the quota, the
//! lane pauses before the vendor has to say 429.

mod common;

use std::time::Duration;

use callshaper::testing::{RetryAfter, Vendor};
use common::{SECOND, burst, shaper};
use tokio::time::Instant;

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

/// Another consumer spends half the quota first: the lane's own releases
/// do not explain the vendor's "0 left", so it pauses until the reset
/// instead of meeting a 429.
#[tokio::test(start_paused = true)]
async fn a_quota_spent_by_someone_else_pauses_the_lane_before_a_429() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let other = reqwest::Client::new();
    for _ in 0..5 {
        let response = callshaper::testing::hold_clock(other.get(vendor.uri()).send()).await;
        assert_eq!(response.unwrap().status(), 200);
    }
    let shaper = shaper(10).build().unwrap();
    let calls = tokio::spawn({
        let (shaper, uri) = (shaper.clone(), vendor.uri());
        async move { burst(&shaper, &uri, 20).await }
    });
    // Our fifth request goes at 402 ms and hears "0 left".
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(
        shaper.lanes()[0].pause_cause,
        Some(callshaper::PauseCause::Spent),
        "paused for the quota someone else spent"
    );
    for outcome in calls.await.unwrap() {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    assert_eq!(vendor.throttled(), 0);
    assert!(vendor.max_in_any_window(SECOND) <= 10);
}

/// Told 15/s at a vendor that really allows 10/s: the first refusal
/// teaches the lane the real quota, so it loses one window, not one per
/// window. From a gateway stating its limit (the lane keeps to it before
/// any 429), and from a vendor saying nothing but a bare 429 (the lane
/// keeps to what the vendor accepted before refusing).
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
        let accepted: Vec<Duration> = vendor
            .arrivals()
            .iter()
            .filter(|a| a.status == 200)
            .map(|a| a.at)
            .collect();
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
        assert!(vendor.max_in_any_window(SECOND) <= 11, "silent: {silent}");
        assert_eq!(
            shaper.lanes()[0].learned,
            Some(callshaper::Rate::new(10, SECOND)),
            "silent: {silent}"
        );
    }
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
/// request leaves the window (and one interval more), not for the
/// vendor's whole-second reset.
#[tokio::test(start_paused = true)]
async fn a_quota_shared_with_another_consumer_is_used_and_kept() {
    for every in [200u64, 333, 500] {
        let vendor = Vendor::gateway(10, SECOND).start().await;
        let uri = vendor.uri();
        let other = tokio::spawn(async move {
            let client = reqwest::Client::new();
            loop {
                let sent =
                    callshaper::testing::hold_clock(client.get(format!("{uri}/other")).send());
                let _ = sent.await;
                tokio::time::sleep(Duration::from_millis(every)).await;
            }
        });
        let shaper = shaper(10).build().unwrap();
        let started = Instant::now();
        for outcome in burst(&shaper, &vendor.uri(), 100).await {
            assert_eq!(outcome.unwrap().status(), 200);
        }
        let took = started.elapsed();
        other.abort();
        let ours_refused = vendor
            .arrivals()
            .iter()
            .filter(|a| a.status == 429 && a.path.starts_with("/r/"))
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
        assert!(
            ours_refused <= 5,
            "other every {every} ms: {ours_refused} refused"
        );
    }
}

/// Answers through `client`, the first answer `first` late (paused time),
/// and notes when each request was sent.
struct SlowFirst {
    client: callshaper::testing::HoldClock<reqwest::Client>,
    first: Duration,
    sent: std::sync::Arc<std::sync::Mutex<Vec<Instant>>>,
}

impl callshaper::Transport for SlowFirst {
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
/// answer (a long generation) must not hold the burst.
#[tokio::test(start_paused = true)]
async fn a_burst_waits_for_the_vendors_first_word_at_most_a_second() {
    for (first, burst_at) in [
        (Duration::from_millis(40), Duration::from_millis(40)),
        (3 * SECOND, SECOND),
    ] {
        let vendor = Vendor::token_bucket(10, 10, SECOND).start().await;
        let sent = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let shaper = callshaper::Shaper::builder()
            .policy(callshaper::LanePolicy::with_quotas([
                callshaper::Quota::token_bucket(10, 10, SECOND),
            ]))
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
        for at in &sent[1..] {
            let after = *at - t0;
            assert!(
                after >= burst_at && after <= burst_at + Duration::from_millis(5),
                "the burst went {after:?} in, expected {burst_at:?} (first answer {first:?})"
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
    let uri = vendor.uri();
    let other = tokio::spawn(async move {
        let client = reqwest::Client::new();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(12) {
            let sent = callshaper::testing::hold_clock(client.get(format!("{uri}/other")).send());
            let _ = sent.await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
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
    let ours: Vec<_> = vendor
        .arrivals()
        .into_iter()
        .filter(|a| a.path.starts_with("/r/"))
        .collect();
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
/// that taught the lane, then two, and the lane keeps to 10/s. (A vendor
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
    assert_eq!(
        shaper.lanes()[0].learned,
        Some(callshaper::Rate::new(10, SECOND))
    );
    assert!(vendor.max_in_any_window(SECOND) <= 11);
}
