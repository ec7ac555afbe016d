//! A throttled lane pauses as a whole, for as long as the vendor says, and
//! every request still ends well and in order.

mod common;

use std::time::Duration;

use callshaper::Error;
use callshaper::testing::{Arrival, RetryAfter, Vendor};
use common::{SECOND, accepted_order, burst, order, shaper};

/// After every 429, nothing arrives for at least `pause`.
fn assert_silent_after_each_throttle(arrivals: &[Arrival], pause: impl Fn(usize) -> Duration) {
    let throttles: Vec<_> = arrivals
        .iter()
        .enumerate()
        .filter(|(_, a)| a.status == 429)
        .collect();
    assert!(!throttles.is_empty(), "the vendor never throttled");
    for (n, (i, throttle)) in throttles.iter().enumerate() {
        if let Some(next) = arrivals.get(i + 1) {
            let gap = next.at - throttle.at;
            assert!(
                gap >= pause(n),
                "throttle {n}: next arrival after {gap:?}: {arrivals:#?}"
            );
        }
    }
}

async fn paused_by(hint: RetryAfter, period: Duration) -> Vec<Arrival> {
    let vendor = Vendor::strict(10, SECOND).start().await;
    vendor.throttle_for(period, hint);
    let shaper = shaper(10).build().unwrap();

    let outcomes = burst(&shaper, &vendor.uri(), 30).await;

    for outcome in outcomes {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    assert_eq!(
        accepted_order(&vendor),
        (0..30).collect::<Vec<_>>(),
        "FIFO, retries in place"
    );
    assert!(vendor.max_in_any_window(SECOND) <= 10);
    vendor.arrivals()
}

#[tokio::test(start_paused = true)]
async fn retry_after_seconds_pauses_the_whole_lane() {
    let arrivals = paused_by(RetryAfter::Seconds(3), Duration::from_secs(5)).await;
    assert_silent_after_each_throttle(&arrivals, |_| Duration::from_secs(3));
    // Throttled at 0 s and 3 s, accepted from 6 s on: two 429s, no storm.
    assert_eq!(arrivals.iter().filter(|a| a.status == 429).count(), 2);
    assert_eq!(order(&arrivals[..3]), [0, 0, 0], "the head keeps its place");
    assert!(arrivals[2].at >= Duration::from_secs(6));
}

#[tokio::test(start_paused = true)]
async fn retry_after_http_date_pauses_the_whole_lane() {
    let arrivals = paused_by(RetryAfter::HttpDate(3), Duration::from_secs(5)).await;
    // The date is whole wall-clock seconds, read a moment after it was
    // written: allow that moment.
    assert_silent_after_each_throttle(&arrivals, |_| Duration::from_millis(2_950));
    assert_eq!(arrivals.iter().filter(|a| a.status == 429).count(), 2);
}

#[tokio::test(start_paused = true)]
async fn retry_after_ms_pauses_the_whole_lane() {
    let arrivals = paused_by(RetryAfter::Millis(2_500), Duration::from_secs(4)).await;
    assert_silent_after_each_throttle(&arrivals, |_| Duration::from_millis(2_500));
    assert_eq!(arrivals.iter().filter(|a| a.status == 429).count(), 2);
}

#[tokio::test(start_paused = true)]
async fn without_a_hint_the_fallback_pause_grows() {
    // Fallback: 1 s doubling, equal jitter: the nth pause is at least
    // 2^n / 2 seconds.
    let arrivals = paused_by(RetryAfter::Omitted, Duration::from_secs(6)).await;
    assert_silent_after_each_throttle(&arrivals, |n| Duration::from_millis(500 << n));
    // 0.5 + 1 + 2 + 4 s of floors: at most four throttles fit in 6 s.
    let throttles = arrivals.iter().filter(|a| a.status == 429).count();
    assert!((2..=4).contains(&throttles), "{throttles} throttles");
}

#[tokio::test(start_paused = true)]
async fn garbage_hint_falls_back_to_the_growing_pause() {
    let arrivals = paused_by(RetryAfter::Raw("soon-ish".into()), Duration::from_secs(3)).await;
    assert_silent_after_each_throttle(&arrivals, |n| Duration::from_millis(500 << n));
}

#[tokio::test(start_paused = true)]
async fn a_pause_past_max_pause_is_a_typed_error_not_a_hang() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    vendor.throttle_for(Duration::from_secs(3600), RetryAfter::Seconds(99_999_999));
    let shaper = shaper(10)
        .max_pause(Duration::from_secs(10))
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();

    let outcomes = burst(&shaper, &vendor.uri(), 3).await;

    for outcome in outcomes {
        match outcome {
            Err(Error::PauseTooLong {
                requested,
                max_pause,
                ..
            }) => {
                assert_eq!(requested, Duration::from_secs(99_999_999));
                assert_eq!(max_pause, Duration::from_secs(10));
            }
            other => panic!("expected PauseTooLong, got {other:?}"),
        }
    }
    // The lane paused max_pause after each refusal, never longer.
    let arrivals = vendor.arrivals();
    assert_eq!(arrivals.len(), 3);
    assert!(arrivals[1].at - arrivals[0].at >= Duration::from_secs(10));
    assert!(started.elapsed() < Duration::from_secs(21));
}

#[tokio::test(start_paused = true)]
async fn negative_or_past_hints_mean_now_and_end_at_max_throttles() {
    for hint in [
        RetryAfter::Seconds(-5),
        RetryAfter::Raw("Thu, 01 Jan 1970 00:00:00 GMT".into()),
    ] {
        let vendor = Vendor::strict(10, SECOND).start().await;
        vendor.throttle_for(Duration::from_millis(950), hint.clone());
        let shaper = shaper(10).build().unwrap();

        let outcomes = burst(&shaper, &vendor.uri(), 3).await;

        // No pause: the head retries at the lane's pace, ten throttles in
        // 950 ms, then gives up with the vendor's last status.
        match &outcomes[0] {
            Err(Error::RetriesExhausted {
                attempts,
                last_status,
                ..
            }) => {
                assert_eq!((*attempts, last_status.as_u16()), (10, 429), "{hint:?}");
            }
            other => panic!("{hint:?}: expected RetriesExhausted, got {other:?}"),
        }
        for outcome in &outcomes[1..] {
            assert_eq!(outcome.as_ref().unwrap().status(), 200, "{hint:?}");
        }
        let arrivals = vendor.arrivals();
        assert_eq!(arrivals.len(), 12, "{hint:?}");
        assert!(vendor.max_in_any_window(SECOND) <= 10);
    }
}

/// OpenAI's 429 for an account out of credit: no pause brings credit back.
/// The request, everyone queued behind it and every new request end at
/// once with a typed error; after `max_pause`, one request goes to see.
#[tokio::test(start_paused = true)]
async fn an_account_out_of_credit_ends_every_request_at_once() {
    let body = r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
    let server = common::answering_once(
        wiremock::ResponseTemplate::new(429)
            .insert_header("content-type", "application/json")
            .set_body_string(body),
    )
    .await;
    let shaper = shaper(1)
        .max_pause(Duration::from_secs(30))
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();

    let outcomes = burst(&shaper, &server.uri(), 5).await;

    for outcome in &outcomes {
        match outcome {
            Err(Error::OutOfCredit { status, body, .. }) => {
                assert_eq!(status.as_u16(), 429);
                assert!(body.contains("insufficient_quota"));
            }
            other => panic!("expected OutOfCredit, got {other:?}"),
        }
    }
    assert_eq!(started.elapsed(), Duration::ZERO, "all at once");
    let later = shaper.get(server.uri()).send().await;
    assert!(matches!(later, Err(Error::OutOfCredit { .. })), "{later:?}");
    assert_eq!(server.received_requests().await.unwrap().len(), 1);

    tokio::time::sleep(Duration::from_secs(31)).await;
    let after = shaper.get(server.uri()).send().await.unwrap();
    assert_eq!(after.status(), 200, "credit back: served again");
}

/// Every pause says why: a vendor's hint, quoted as the vendor wrote it,
/// or the fallback when it gave none.
#[tokio::test(start_paused = true)]
async fn a_lanes_snapshot_says_why_it_is_paused() {
    for (hint, cause, said) in [
        (
            RetryAfter::Seconds(5),
            callshaper::lane::PauseCause::Hinted,
            Some("retry-after: 5"),
        ),
        (
            RetryAfter::Millis(1_500),
            callshaper::lane::PauseCause::Hinted,
            Some("retry-after-ms: 1500"),
        ),
        (
            RetryAfter::Omitted,
            callshaper::lane::PauseCause::Unhinted,
            None,
        ),
    ] {
        let vendor = Vendor::strict(10, SECOND).start().await;
        vendor.throttle_for(Duration::from_millis(1), hint);
        let shaper = shaper(10).build().unwrap();
        let call = tokio::spawn(shaper.get(vendor.uri()).send());
        for _ in 0..100_000 {
            if shaper
                .lanes()
                .first()
                .is_some_and(|l| l.paused_for.is_some())
            {
                break;
            }
            tokio::task::yield_now().await;
        }
        let lane = &shaper.lanes()[0];
        assert_eq!(lane.pause_cause, Some(cause), "{lane:?}");
        assert_eq!(lane.pause_said.as_deref(), said, "{lane:?}");
        assert_eq!(call.await.unwrap().unwrap().status(), 200);
        assert_eq!(shaper.lanes()[0].pause_cause, None, "the pause is over");
        assert_eq!(shaper.lanes()[0].pause_said, None, "the pause is over");
    }
}

/// A vendor whose clock is 2 s off sends its `Retry-After` as an HTTP-date
/// on that clock: read against its `Date` header, the lane waits the 3 s
/// it asked for, neither 5 s (ahead) nor 1 s and another 429 (behind).
#[tokio::test(start_paused = true)]
async fn a_vendor_with_a_skewed_clock_is_read_on_its_own_clock() {
    for offset in [2, -2] {
        let vendor = Vendor::strict(10, SECOND).clock_off(offset).start().await;
        vendor.throttle_for(Duration::from_millis(1), RetryAfter::HttpDate(3));
        let shaper = shaper(10).build().unwrap();
        let response = shaper.get(vendor.uri()).send().await.unwrap();
        assert_eq!(response.status(), 200, "offset {offset}");
        let arrivals = vendor.arrivals();
        assert_eq!(vendor.throttled(), 1, "offset {offset}: {arrivals:?}");
        let waited = arrivals[1].at - arrivals[0].at;
        // Whole seconds on the vendor's side: 3 s, up to a second more.
        assert!(
            waited >= Duration::from_millis(2_950) && waited <= Duration::from_millis(4_100),
            "offset {offset}: waited {waited:?}"
        );
    }
}

/// Answer each of `first` once, in order, then 200 with `then_ok`, else
/// the last of `first` for ever.
async fn answers_then(
    server: &wiremock::MockServer,
    first: &[wiremock::ResponseTemplate],
    then_ok: bool,
) {
    use wiremock::matchers::any;
    use wiremock::{Mock, ResponseTemplate};

    server.reset().await;
    for (i, answer) in first.iter().enumerate() {
        let mock = Mock::given(any()).respond_with(answer.clone());
        let last = i + 1 == first.len() && !then_ok;
        let mock = if last { mock } else { mock.up_to_n_times(1) };
        mock.mount(server).await;
    }
    if then_ok {
        Mock::given(any())
            .respond_with(ResponseTemplate::new(200))
            .mount(server)
            .await;
    }
}

/// A vendor that throttles with 420 (as Twitter did) and whose 503 is one
/// failed request: told so, the lane pauses for the 420's `Retry-After`
/// and retries the 503 at once; left to the defaults, the 420 is the
/// caller's answer; a route's own answers hold for its requests only.
#[tokio::test(start_paused = true)]
async fn a_vendor_says_what_its_statuses_mean() {
    use wiremock::{MockServer, ResponseTemplate};

    let server = MockServer::start().await;
    let enhance = reqwest::StatusCode::from_u16(420).unwrap();
    let calm_down = ResponseTemplate::new(420).insert_header("retry-after", "2");
    let unavailable = ResponseTemplate::new(503);

    answers_then(&server, &[calm_down.clone(), unavailable], true).await;
    let told = shaper(10)
        .answers(
            callshaper::Answers::default()
                .throttle(enhance)
                .failure(reqwest::StatusCode::SERVICE_UNAVAILABLE),
        )
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let response = told.get(server.uri()).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "paused for the 420's Retry-After"
    );
    let sends = server.received_requests().await.unwrap().len();
    assert_eq!(sends, 3, "420, then 503, then 200");

    answers_then(&server, std::slice::from_ref(&calm_down), false).await;
    let plain = shaper(10).build().unwrap();
    let response = plain.get(server.uri()).send().await.unwrap();
    assert_eq!(response.status(), enhance, "a 420 is final by default");
    assert_eq!(server.received_requests().await.unwrap().len(), 1);

    // A route's own answers win over the shaper's, for its lanes only.
    answers_then(&server, std::slice::from_ref(&calm_down), true).await;
    let routed = shaper(10)
        .route(
            callshaper::route::Route::new("enhance")
                .path("/calm/*")
                .answers(callshaper::Answers::default().throttle(enhance)),
        )
        .build()
        .unwrap();
    let calm = routed.get(format!("{}/calm/1", server.uri())).send().await;
    assert_eq!(calm.unwrap().status(), 200, "the route pauses for its 420");
    assert_eq!(server.received_requests().await.unwrap().len(), 2);
    answers_then(&server, &[calm_down], false).await;
    let other = routed.get(format!("{}/other", server.uri())).send().await;
    assert_eq!(
        other.unwrap().status(),
        enhance,
        "elsewhere the default holds"
    );
}

/// GitHub's secondary limit (here 60 a minute, beside 5,000 an hour): past
/// it, a 403 with `retry-after` while the hourly quota still has room. The
/// lane pauses for it as a whole, nothing arrives before it ends, and every
/// request ends in a 200, not the 403.
#[tokio::test(start_paused = true)]
async fn githubs_secondary_limit_pauses_the_lane_for_its_retry_after() {
    let minute = Duration::from_secs(60);
    let vendor = Vendor::github(5_000, Duration::from_secs(3_600))
        .secondary(60, minute)
        .start()
        .await;
    let shaper = shaper(2).build().unwrap();
    let outcomes = burst(&shaper, &vendor.uri(), 120).await;
    for outcome in outcomes {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    let arrivals = vendor.arrivals();
    let refusals: Vec<_> = arrivals
        .iter()
        .enumerate()
        .filter(|(_, a)| a.status == 403)
        .collect();
    println!(
        "secondary limit: {} refused, 120 served in {:?}",
        refusals.len(),
        arrivals.last().unwrap().at
    );
    assert!(
        !refusals.is_empty(),
        "the secondary limit was never reached"
    );
    assert!(refusals.len() <= 2, "{} refusals", refusals.len());
    assert_eq!(vendor.throttled(), refusals.len(), "a 403 is a refusal");
    assert!(vendor.max_in_any_window(minute) <= 60 + refusals.len());
    for &(i, refusal) in &refusals {
        // The vendor said to come back when the oldest of the minute's 60
        // leaves it: 30 s after a minute's 60 at 2/s.
        if let Some(next) = arrivals.get(i + 1) {
            assert!(
                next.at - refusal.at >= Duration::from_secs(29),
                "{:?} after a secondary 403",
                next.at - refusal.at
            );
        }
    }
}
