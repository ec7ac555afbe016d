//! Admission and accounting: a full queue and an impossible wait answer at
//! once; cancelled callers free their place and spend no quota; every
//! request ends in exactly one outcome.

mod common;

use std::time::Duration;

use callshaper::testing::HoldClock;
use callshaper::testing::{RetryAfter, Vendor};
use callshaper::{Error, Shaper};
use common::{SECOND, burst, join_all, order, shaper};
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn cancelled_callers_free_their_place_and_spend_no_quota() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let shaper = shaper(10).build().unwrap();
    let started = Instant::now();

    let tasks: Vec<_> = (0..50)
        .map(|i| tokio::spawn(shaper.get(format!("{}/r/{i}", vendor.uri())).send()))
        .collect();
    tokio::task::yield_now().await;
    for (i, task) in tasks.iter().enumerate() {
        if i % 2 == 1 {
            task.abort();
        }
    }
    let mut kept = 0;
    for (i, task) in tasks.into_iter().enumerate() {
        match task.await {
            Ok(outcome) => {
                assert_eq!(i % 2, 0);
                assert_eq!(outcome.unwrap().status(), 200);
                kept += 1;
            }
            Err(cancelled) => assert!(cancelled.is_cancelled() && i % 2 == 1),
        }
    }

    assert_eq!(kept, 25);
    let arrivals = vendor.arrivals();
    assert_eq!(order(&arrivals), (0..50).step_by(2).collect::<Vec<_>>());
    // 25 releases take 24 intervals: the cancelled ones cost no slot.
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_millis(24 * 101 + 50),
        "{elapsed:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_refuses_at_once_and_nothing_is_lost() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let shaper = shaper(1).queue_capacity(5).build().unwrap();
    let started = Instant::now();

    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let call = shaper.get(format!("{}/r/{i}", vendor.uri())).send();
            tokio::spawn(async move { (call.await, started.elapsed()) })
        })
        .collect();
    let (mut ok, mut full) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            (Ok(response), _) => {
                assert_eq!(response.status(), 200);
                ok += 1;
            }
            (Err(Error::QueueFull { capacity, .. }), at) => {
                assert_eq!(capacity, 5);
                assert_eq!(at, Duration::ZERO, "refused at once");
                full += 1;
            }
            (Err(other), _) => panic!("unexpected {other}"),
        }
    }
    assert_eq!(ok + full, 20, "exactly one outcome each");
    assert!((5..=6).contains(&ok), "{ok} accepted with a queue of 5");
    assert_eq!(vendor.arrivals().len(), ok);
}

#[tokio::test(start_paused = true)]
async fn a_wait_past_max_wait_is_refused_at_once_with_the_prediction() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let shaper = shaper(1)
        .max_wait(Duration::from_millis(3_500))
        .build()
        .unwrap();
    let started = Instant::now();

    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let call = shaper.get(format!("{}/r/{i}", vendor.uri())).send();
            tokio::spawn(async move { (call.await, started.elapsed()) })
        })
        .collect();
    let (mut ok, mut refused) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            (Ok(response), at) => {
                assert_eq!(response.status(), 200);
                assert!(
                    at <= Duration::from_millis(3_500),
                    "released within max_wait: {at:?}"
                );
                ok += 1;
            }
            (
                Err(Error::WouldExceedMaxWait {
                    predicted,
                    max_wait,
                    ..
                }),
                at,
            ) => {
                assert_eq!(at, Duration::ZERO, "refused at once");
                assert!(predicted > max_wait);
                refused += 1;
            }
            (Err(other), _) => panic!("unexpected {other}"),
        }
    }
    // Releases at 0, 1, 2 and 3 s fit in 3.5 s; the other six don't.
    assert_eq!((ok, refused), (4, 6));
    assert_eq!(vendor.arrivals().len(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_pause_announced_after_admission_ends_waits_at_max_wait() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    vendor.throttle_for(Duration::from_millis(50), RetryAfter::Seconds(5));
    let shaper = shaper(10).max_wait(SECOND).build().unwrap();
    let started = Instant::now();

    let tasks: Vec<_> = (0..5)
        .map(|i| {
            let call = shaper.get(format!("{}/r/{i}", vendor.uri())).send();
            tokio::spawn(async move { (call.await, started.elapsed()) })
        })
        .collect();
    let outcomes: Vec<_> = join_all(tasks).await;

    // The head learns of the 5 s pause and is refused at once; the others
    // give up exactly when their second is over.
    assert!(
        matches!(outcomes[0], (Err(Error::WouldExceedMaxWait { .. }), at) if at == Duration::ZERO)
    );
    for outcome in &outcomes[1..] {
        assert!(
            matches!(outcome, (Err(Error::MaxWaitElapsed { .. }), at) if *at == SECOND),
            "{outcome:?}"
        );
    }
    assert_eq!(vendor.arrivals().len(), 1, "nothing sent during the pause");
}

#[tokio::test(start_paused = true)]
async fn a_per_request_max_wait_overrides_the_lane() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let shaper = shaper(1).build().unwrap();
    let first = shaper.get(vendor.uri()).send();
    let first = tokio::spawn(first);
    tokio::task::yield_now().await;

    let impatient = shaper
        .get(vendor.uri())
        .max_wait(Duration::from_millis(10))
        .send()
        .await;

    assert!(
        matches!(impatient, Err(Error::WouldExceedMaxWait { .. })),
        "{impatient:?}"
    );
    assert_eq!(first.await.unwrap().unwrap().status(), 200);
}

#[tokio::test(start_paused = true)]
async fn shutdown_ends_waiting_and_later_requests_with_a_typed_error() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let shaper = shaper(1).build().unwrap();
    let tasks: Vec<_> = (0..3)
        .map(|i| tokio::spawn(shaper.get(format!("{}/r/{i}", vendor.uri())).send()))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;

    shaper.shutdown();

    let outcomes = join_all(tasks).await;
    assert_eq!(
        outcomes[0].as_ref().unwrap().status(),
        200,
        "released before shutdown"
    );
    for outcome in &outcomes[1..] {
        assert!(matches!(outcome, Err(Error::Shutdown)), "{outcome:?}");
    }
    let later = shaper.get(vendor.uri()).send().await;
    assert!(matches!(later, Err(Error::Shutdown)));
    assert_eq!(vendor.arrivals().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn idle_lanes_are_dropped_and_come_back_on_use() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let shaper = shaper(10)
        .idle_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    for outcome in burst(&shaper, &vendor.uri(), 3).await {
        outcome.unwrap();
    }
    assert_eq!(shaper.lanes().len(), 1);

    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        shaper.lanes().is_empty(),
        "idle lane kept: {:?}",
        shaper.lanes()
    );

    for outcome in burst(&shaper, &vendor.uri(), 3).await {
        assert_eq!(outcome.unwrap().status(), 200);
    }
    assert_eq!(shaper.lanes().len(), 1);
}

/// Callers who wrap `send()` in their own timeout and give up leave the
/// queue at once: a newcomer is not refused as if they still waited.
#[tokio::test(start_paused = true)]
async fn callers_who_time_out_free_their_place_at_once() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let minute = Duration::from_secs(60);
    let shaper = Shaper::builder()
        .rate(1, minute)
        .queue_capacity(5)
        .transport(HoldClock(reqwest::Client::new()))
        .build()
        .unwrap();
    // The first goes at once; five more fill the queue, then give up.
    shaper.get(vendor.uri()).send().await.unwrap();
    let impatient: Vec<_> = (0..5)
        .map(|_| {
            let call = shaper.get(vendor.uri()).send();
            tokio::spawn(tokio::time::timeout(Duration::from_millis(100), call))
        })
        .collect();
    for outcome in join_all(impatient).await {
        assert!(outcome.is_err(), "the caller's own timeout ended it");
    }
    assert_eq!(shaper.lanes()[0].queued, 0);

    let started = Instant::now();
    let newcomer = shaper.get(vendor.uri()).send().await;
    assert_eq!(newcomer.unwrap().status(), 200, "admitted, not QueueFull");
    // It waits for the quota's next minute, and for nobody who left.
    assert!(started.elapsed() < minute, "{:?}", started.elapsed());
    assert_eq!(vendor.arrivals().len(), 2);
}

/// Aborted callers count in no `max_wait` prediction: a newcomer whose
/// wait fits is admitted at once and served within it.
#[tokio::test(start_paused = true)]
async fn aborted_callers_count_in_no_prediction() {
    let vendor = Vendor::strict(10, SECOND).start().await;
    let shaper = shaper(10).build().unwrap();
    let aborted: Vec<_> = (0..50)
        .map(|i| tokio::spawn(shaper.get(format!("{}/r/{i}", vendor.uri())).send()))
        .collect();
    tokio::task::yield_now().await;
    for task in &aborted {
        task.abort();
    }
    for task in aborted {
        let _ = task.await;
    }
    let sent_before = vendor.arrivals().len();

    let started = Instant::now();
    let newcomer = shaper
        .get(format!("{}/r/new", vendor.uri()))
        .max_wait(SECOND)
        .send()
        .await;
    assert_eq!(newcomer.unwrap().status(), 200, "admitted within 1 s");
    assert!(
        started.elapsed() <= Duration::from_millis(101),
        "{:?}",
        started.elapsed()
    );
    assert!(sent_before <= 1, "only the first went before the aborts");
}
