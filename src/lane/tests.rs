//! The lane's own tests: pauses, the fallback, priorities, admission's
//! predictions, extreme values, and the queue depth under random drops.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::{Lane, LanePolicy, Priority};
use crate::error::Error;
use crate::gate::PauseCause;
use crate::meters::{Quota, Rate};
use crate::sync::lock;

fn ten() -> [Quota; 1] {
    [Quota::leaky_bucket(10, Duration::from_secs(1))]
}

fn policy() -> LanePolicy {
    LanePolicy::default()
}

#[tokio::test(start_paused = true)]
async fn pauses_only_move_forward_and_are_clamped() {
    let lane = Lane::new(
        "t",
        ten(),
        LanePolicy {
            max_pause: Duration::from_secs(5),
            ..policy()
        },
    )
    .unwrap();
    let now = Instant::now();
    assert_eq!(
        lane.pause_for(Duration::from_secs(3)),
        now + Duration::from_secs(3)
    );
    assert_eq!(
        lane.pause_for(Duration::from_secs(1)),
        now + Duration::from_secs(3)
    );
    assert_eq!(
        lane.pause_for(Duration::from_secs(60)),
        now + Duration::from_secs(5)
    );
    assert_eq!(lane.snapshot().paused_for, Some(Duration::from_secs(5)));
    assert_eq!(lane.snapshot().pause_cause, Some(PauseCause::Requested));
}

#[tokio::test(start_paused = true)]
async fn the_fallback_grows_per_throttle_and_resets_on_success() {
    let lane = Lane::new("t", ten(), policy()).unwrap();
    let floors: Vec<_> = (0..4)
        .map(|_| lane.throttled(None, 429, PauseCause::Unhinted))
        .collect();
    for (n, pause) in floors.iter().enumerate() {
        let ceiling = Duration::from_secs(1 << n);
        assert!(
            *pause >= ceiling / 2 && *pause <= ceiling,
            "throttle {n}: {pause:?}"
        );
    }
    lane.vendor().succeeded();
    assert!(lane.throttled(None, 429, PauseCause::Unhinted) <= Duration::from_secs(1));
    assert_eq!(
        lane.throttled(Some(Duration::from_secs(7)), 429, PauseCause::Hinted),
        Duration::from_secs(7)
    );
    assert_eq!(lane.snapshot().throttles, 6);
}

#[tokio::test(start_paused = true)]
async fn interactive_goes_first_and_batch_keeps_its_share() {
    let lane = Lane::new("t", ten(), policy()).unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, priority) in (0..12).map(|i| {
        (
            i,
            if i < 6 {
                Priority::Batch
            } else {
                Priority::Interactive
            },
        )
    }) {
        let mut place = lane.enter(1, priority, None).unwrap();
        let (lane, order) = (lane.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let _turn = lane.wait(&mut place).await.unwrap();
            lock(&order).push(i);
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    // 0 went on the fast path; then interactive 6..12 first, with every
    // fifth release given to the oldest batch request.
    assert_eq!(*lock(&order), [0, 6, 7, 8, 9, 1, 10, 11, 2, 3, 4, 5]);
}

#[tokio::test(start_paused = true)]
async fn a_cost_beyond_every_capacity_is_refused_at_once() {
    let quotas = [
        Quota::leaky_bucket(10, Duration::from_secs(1)),
        Quota::sliding_log(1000, Duration::from_secs(60)).per_cost(),
    ];
    let lane = Lane::new("t", quotas, policy()).unwrap();
    assert!(lane.enter(1000, Priority::Interactive, None).is_ok());
    match lane.enter(1001, Priority::Interactive, None) {
        Err(Error::CostTooHigh { cost, capacity, .. }) => {
            assert_eq!((cost, capacity), (1001, 1000))
        }
        Err(other) => panic!("expected CostTooHigh, got {other}"),
        Ok(_) => panic!("expected CostTooHigh"),
    }
}

/// A standalone lane hears no vendor: the burst its quota allows goes at
/// once, not after the second a shaper's lane gives a vendor's first
/// answer (every permit after the first came a second late), and the
/// next goes when the quota refills.
#[tokio::test(start_paused = true)]
async fn a_standalone_lane_lets_its_burst_go_at_once() {
    let second = Duration::from_secs(1);
    for quota in [
        Quota::token_bucket(5, 5, second),
        Quota::fixed_window(5, second),
        Quota::sliding_log(5, second),
        Quota::sliding_window(5, second),
    ] {
        let policy = LanePolicy {
            headroom: Duration::ZERO,
            ..policy()
        };
        let lane = Lane::new("t", [quota.clone()], policy).unwrap();
        let start = Instant::now();
        for _ in 0..5 {
            drop(lane.acquire().await.unwrap());
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "{quota:?}");
        drop(lane.acquire().await.unwrap());
        let sixth = start.elapsed();
        // Within two windows: a sliding window counter weighs the last
        // window's five until 1.2 s.
        assert!(
            sixth > Duration::ZERO && sixth <= 2 * second,
            "{quota:?}: the sixth at {sixth:?}"
        );
    }
}

/// Burst-capable meters predict a burst, not a trickle: a fixed window
/// of 10 a minute admits ten at once and tells the eleventh a minute.
#[tokio::test(start_paused = true)]
async fn admission_predicts_waits_from_each_meters_shape() {
    let minute = Duration::from_secs(60);
    for quota in [
        Quota::fixed_window(10, minute),
        Quota::token_bucket(10, 10, minute),
        Quota::sliding_log(10, minute),
    ] {
        let policy = LanePolicy {
            headroom: Duration::ZERO,
            ..policy()
        };
        let lane = Lane::new("t", [quota.clone()], policy).unwrap();
        let max_wait = Some(Duration::from_secs(5));
        let mut places = Vec::new();
        for _ in 0..10 {
            places.push(
                lane.enter(1, Priority::Interactive, max_wait)
                    .expect("fits the burst"),
            );
        }
        match lane.enter(1, Priority::Interactive, max_wait) {
            Err(Error::WouldExceedMaxWait { predicted, .. }) => {
                assert!(
                    predicted >= Duration::from_secs(6),
                    "{quota:?}: {predicted:?}"
                );
            }
            Err(other) => panic!("{quota:?}: {other}"),
            Ok(_) => panic!("{quota:?}: the eleventh fits no window"),
        }
    }
}

/// A caller's `max_wait` and `max_pause` at `Duration::MAX`: the
/// instants built from them saturate instead of overflowing.
#[tokio::test(start_paused = true)]
async fn extreme_waits_and_pauses_do_not_panic() {
    let day = Duration::from_secs(24 * 3600);
    let policy = LanePolicy {
        max_pause: Duration::MAX,
        ..policy()
    };
    let lane = Lane::new("t", [Quota::leaky_bucket(1, day)], policy).unwrap();
    let mut place = lane
        .enter(1, Priority::Interactive, Some(Duration::MAX))
        .expect("a wait without limit admits");
    let _turn = lane.wait(&mut place).await.unwrap();
    let resumes = lane.pause_for(Duration::MAX);
    assert!(resumes > Instant::now() + 50 * 365 * day);
    assert!(lane.snapshot().paused_for.is_some());
}

/// Callers join (some with a `max_wait`), give up, get their turns and
/// the lane pauses, at random; after each step the queue depth is the
/// number of callers still waiting.
#[tokio::test(start_paused = true)]
async fn queue_depth_is_always_the_live_callers() {
    const CASES: u64 = 300;
    for seed in 0..CASES {
        let mut rng = fastrand::Rng::with_seed(seed);
        let rate = Rate::new(rng.u32(1..20), Duration::from_millis(rng.u64(1..2_000)));
        let policy = LanePolicy {
            queue_capacity: 10_000,
            ..policy()
        };
        let quota = Quota::leaky_bucket(rate.count, rate.per);
        let lane = Lane::new("t", [quota], policy).unwrap();
        let mut callers: Vec<tokio::task::JoinHandle<()>> = Vec::new();
        for step in 0..80 {
            match rng.u8(0..10) {
                0..=3 => {
                    let priority = if rng.bool() {
                        Priority::Batch
                    } else {
                        Priority::Interactive
                    };
                    let max_wait = rng.bool().then(|| Duration::from_millis(rng.u64(0..3_000)));
                    if let Ok(mut place) = lane.enter(1, priority, max_wait) {
                        let lane = lane.clone();
                        callers.push(tokio::spawn(async move {
                            let _ = lane.wait(&mut place).await;
                        }));
                    }
                }
                4..=6 if !callers.is_empty() => {
                    callers[rng.usize(..callers.len())].abort();
                }
                7 => {
                    lane.pause_for(Duration::from_millis(rng.u64(0..500)));
                }
                _ => tokio::time::advance(Duration::from_millis(rng.u64(0..300))).await,
            }
            // Let the dispatcher and the callers run; the clock stands.
            let live = || callers.iter().filter(|c| !c.is_finished()).count();
            for _ in 0..50 {
                if lane.snapshot().queued == live() {
                    break;
                }
                tokio::task::yield_now().await;
            }
            assert_eq!(lane.snapshot().queued, live(), "seed {seed}, step {step}");
        }
        lane.close();
    }
}

#[tokio::test(start_paused = true)]
async fn a_paused_lane_releases_nothing_until_the_pause_ends() {
    let lane = Lane::new("t", ten(), policy()).unwrap();
    lane.pause_for(Duration::from_secs(2));
    let start = Instant::now();
    let _turn = lane.acquire().await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(2));
}

/// A lane alone at its gate queues at none: the vendor's model holds the
/// vendor's gate too, and is no lane. (Counted as one, every lane took a
/// shared gate's slow path: 1.6 times the cost per permit, 64 tasks.)
#[tokio::test(start_paused = true)]
async fn a_lane_alone_does_not_share_its_gate_with_its_vendor_model() {
    use super::road::Road;
    use crate::observability::{Labels, Series};

    let lane = Lane::new("alone", ten(), policy()).unwrap();
    let shared = &lane.shared;
    assert!(!shared.is_shared(&shared.gates[0]));
    let series = Series::new(Labels::standalone("twin"), None);
    let behaves = (Arc::new(policy()), shared.vendor().clone());
    let road = Road::new(Some("twin".into()), series, behaves, (None, None));
    let twin = Lane::open(Arc::new(road), shared.gates.to_vec(), None, 0);
    assert!(shared.is_shared(&shared.gates[0]));
    assert!(twin.shared.is_shared(&twin.shared.gates[0]));
}

/// A lane may go while its vendor's count lives on without it: while
/// another lane of its road stays, or another road holds the vendor's
/// model. Lanes a sweep lets go hold their road until they go, and a road
/// whose lanes all go, its model: neither is word that the count lives on.
#[tokio::test(start_paused = true)]
async fn a_lane_goes_while_another_road_or_lane_keeps_its_vendors_count() {
    use super::leave::Leaving;
    use super::road::Road;
    use crate::observability::{Labels, Series};
    use crate::sync::Going;

    let hour = Duration::from_secs(3600);
    let a = Lane::new("a", [Quota::fixed_window(10, hour)], policy()).unwrap();
    drop(a.acquire().await.unwrap());
    let gates = || a.shared.gates.to_vec();
    let behaves = (Arc::new(policy()), a.shared.vendor().clone());
    let series = Series::new(Labels::standalone("b"), None);
    let other = Arc::new(Road::new(Some("b".into()), series, behaves, (None, None)));
    let b = Lane::open(other, gates(), None, 0);
    let now = Instant::now();
    let leaves = |lane: &Lane, going: &Going| lane.can_leave(now, Leaving::Resting, going);

    // One lane a road: each may go while the other stays, not both.
    let mut going = Going::default();
    assert!(leaves(&a, &going) && leaves(&b, &going));
    a.goes(&mut going);
    assert!(!leaves(&b, &going), "the vendor's hour would be lost");

    // A second lane on a's road: a goes while it stays; once both go, the
    // other road alone keeps the count.
    let twin = Lane::open(a.shared.road.clone(), gates(), None, 0);
    let mut going = Going::default();
    assert!(leaves(&a, &going));
    a.goes(&mut going);
    assert!(leaves(&twin, &going) && leaves(&b, &going));
    twin.goes(&mut going);
    assert!(!leaves(&b, &going), "the vendor's hour would be lost");
}

/// A lane's snapshot holds no gate's meters while it reads the store's
/// state: a store failing takes its state, then the meters (to count the
/// other instances' slots), so a snapshot holding the meters while it
/// waited for the state deadlocked with it (`shaper.lanes()` hung while
/// Redis failed). With the state held as a failing store holds it, the
/// meters stay free while the snapshot waits.
#[cfg(all(feature = "testing", feature = "redis"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_holds_no_meters_while_it_waits_for_the_store() {
    use super::road::Road;
    use crate::observability::{Labels, Series, StoreMetrics};
    use crate::store::{RedisStore, Store, StoreFailure};
    use crate::testing::RedisServer;

    let redis = RedisServer::start();
    let store: Store = RedisStore::options()
        .fleet_size(2)
        .connect(&redis.url())
        .await
        .unwrap()
        .into();
    let lane = Lane::new("vendor", ten(), policy()).unwrap();
    let gate = lane.shared.gates[0].clone();
    let metrics = StoreMetrics::new(&Labels::standalone("vendor"), None, &[]);
    let remote = Arc::new(store.link(
        vec![gate.clone()],
        &["vendor"],
        &[ten().to_vec()],
        Duration::ZERO,
        StoreFailure::Open,
        metrics,
    ));
    let series = Series::new(Labels::standalone("vendor"), None);
    let behaves = (Arc::new(policy()), lane.shared.vendor().clone());
    let road = Road::new(None, series, behaves, (None, None));
    let linked = Lane::open(Arc::new(road), [gate.clone()], Some(remote.clone()), 0);

    let state = remote.hold_state();
    let snapshot = std::thread::spawn(move || linked.snapshot().store);
    // Time for the snapshot to reach the state and wait there.
    std::thread::sleep(Duration::from_millis(200));
    let (took, meters) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(gate.meters());
        let _ = took.send(());
    });
    let free = meters.recv_timeout(Duration::from_secs(2)).is_ok();
    drop(state);
    assert!(
        free,
        "the snapshot held the meters while it waited for the state"
    );
    assert!(snapshot.join().unwrap().is_some());
}

/// A lane nobody waits in runs no task: the first request that must wait
/// starts its dispatcher, which retires a second after the queue drained;
/// the next burst starts another. Through bursts that cross between the
/// fast path and the dispatcher both ways, with random gaps and callers
/// who give up, every caller that stays gets exactly one turn, in the
/// order it came, and no two turns are closer than the quota's interval
/// (less the lateness the meters forgive).
#[tokio::test(start_paused = true)]
async fn dispatchers_start_when_someone_waits_and_retire_when_none_does() {
    let lane = Lane::new("t", ten(), policy()).unwrap();
    drop(lane.acquire().await.unwrap());
    assert!(!lane.is_busy(), "a turn on the fast path starts no task");

    let mut rng = fastrand::Rng::with_seed(27);
    let turns = Arc::new(Mutex::new(Vec::new()));
    let mut seq = 0usize;
    for round in 0..40 {
        let mut callers = Vec::new();
        for _ in 0..rng.usize(1..6) {
            let lane = lane.clone();
            let turns = turns.clone();
            let me = seq;
            seq += 1;
            let leaves = rng.u8(..10) == 0;
            let mut place = lane.enter(1, Priority::Interactive, None).unwrap();
            callers.push(tokio::spawn(async move {
                if leaves {
                    // Gives up before its turn; drops its place.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    return;
                }
                let turn = lane.wait(&mut place).await.unwrap();
                lock(&turns).push((me, Instant::now()));
                drop(turn);
            }));
        }
        for caller in callers {
            caller.await.unwrap();
        }
        // Sometimes long enough for the dispatcher to retire, sometimes not.
        let gap = [0, 50, 300, 900, 1_100, 2_500][rng.usize(..6)];
        tokio::time::sleep(Duration::from_millis(gap)).await;
        if gap >= 1_100 {
            assert!(!lane.is_busy(), "round {round}: retired after {gap} ms");
        }
        assert_eq!(lane.snapshot().queued, 0, "round {round}");
    }
    let turns = lock(&turns).clone();
    assert!(turns.len() > 40, "{} turns", turns.len());
    for pair in turns.windows(2) {
        let ((a, at_a), (b, at_b)) = (pair[0], pair[1]);
        assert!(a < b, "FIFO: {a} before {b}");
        // 100.5 ms a release, less half the headroom the meters forgive.
        assert!(
            at_b - at_a >= Duration::from_millis(98),
            "{a} and {b}: {:?} apart",
            at_b - at_a
        );
    }
}

/// Many tasks racing a lane whose dispatcher keeps retiring: none of
/// their tickets is lost to a dispatcher on its way out (each caller is
/// answered), and the lane's queue is empty at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_ticket_is_lost_to_a_retiring_dispatcher() {
    let fast = [Quota::leaky_bucket(20_000, Duration::from_secs(1))];
    let lane = Lane::new("t", fast, policy()).unwrap();
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let lane = lane.clone();
            tokio::spawn(async move {
                for n in 0..50u64 {
                    drop(lane.acquire().await.unwrap());
                    if (n + i) % 25 == 0 {
                        // Quiet long enough, now and then, for the
                        // dispatcher to retire under the others.
                        tokio::time::sleep(Duration::from_millis(1_050)).await;
                    }
                }
            })
        })
        .collect();
    let all = async {
        for task in tasks {
            task.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("every caller got its turns");
    assert_eq!(lane.snapshot().queued, 0);
    assert_eq!(lane.snapshot().released, 64 * 50);
}

/// A request sent again keeps its number where its lane's counter gave
/// it, and only there: a number from another counter (a lane of its name
/// that went meanwhile) could equal one of this lane's, or sit ahead of
/// all of them, so it takes a new one, from this lane's counter, higher
/// than any before.
#[tokio::test]
async fn a_kept_number_stays_only_in_the_lane_that_gave_it() {
    let lane = Lane::new("t", ten(), policy()).unwrap();
    let own = lane.shared.next_seq();
    assert_eq!(lane.shared.seq_for(Some(own)), own, "its own: kept");
    // The same count from the next counter over.
    let other = own ^ 1;
    let renumbered = lane.shared.seq_for(Some(other));
    assert!(renumbered > own, "{renumbered} after {own}");
    assert_eq!(renumbered % 64, own % 64, "from this lane's counter");
    // Other tests' lanes may draw from the same counter meanwhile.
    let next = lane.shared.seq_for(None);
    assert!(next > renumbered && next % 64 == own % 64, "{next}");
}

/// A lane per tenant: its own state is what its requests need of it, and
/// what the lanes of its route share is their road's, its vendor's model
/// too (`lane/road.rs`), its name its gates' keys (`lane/name.rs`), its
/// two gates in place in 16 bytes (`lane/gates.rs`), its rare ties, its
/// dispatcher's door and its throttles in one box made when first
/// needed, its waiting count and closed flag in one word, beside its last
/// release to the millisecond, its identity its address, its places
/// numbered from counters lanes share, and its name's hash kept for its
/// owner's map of lanes, whose slot is then 8 bytes, not 16
/// (`lane/shared.rs`): 56 bytes, where it took 152 and a name of its own
/// (a block of 80 bytes from the allocator with its counts, 96 at 72
/// bytes). A field that grows it shows here first.
#[test]
fn a_lane_keeps_its_own_state_and_no_more() {
    let size = size_of::<super::shared::Shared>();
    assert!(size <= 56, "{size}");
}

/// A lane whose requests all went at once never made its dispatcher's
/// door (a lane per tenant carries a pointer for it, not the door); the
/// first request that must wait makes it, and waits its turn behind it.
#[tokio::test(start_paused = true)]
async fn a_lane_nobody_waited_in_makes_no_door() {
    let lane = Lane::new("t", ten(), policy()).unwrap();
    drop(lane.acquire().await.unwrap());
    tokio::time::advance(Duration::from_secs(1)).await;
    let place = lane.enter(1, Priority::Interactive, None).unwrap();
    assert!(lane.shared.ties.get().is_none(), "went at once: no door");
    drop(place);
    let started = Instant::now();
    drop(lane.acquire().await.unwrap());
    assert!(lane.shared.ties.get().is_some(), "waited: a door");
    assert!(started.elapsed() >= Duration::from_millis(100));
}

/// A lane notes its releases to the millisecond, not each one (a store on
/// every release kept its line moving between the cores releasing from
/// it): how long it has been quiet is never more than the time since its
/// last release, so its sweep is never early, and at most 2 ms less, so
/// it is never late by more.
#[tokio::test(start_paused = true)]
async fn a_lane_is_quiet_for_no_longer_than_since_its_last_release() {
    let lane = Lane::new(
        "quiet",
        [Quota::leaky_bucket(1_000_000, Duration::from_secs(1))],
        LanePolicy {
            headroom: Duration::ZERO,
            ..policy()
        },
    )
    .unwrap();
    let grain = Duration::from_millis(2);
    let mut last = Instant::now();
    for _ in 0..12 {
        drop(lane.acquire().await.unwrap());
        last = Instant::now();
        tokio::time::advance(Duration::from_micros(300)).await;
    }
    for after in [0, 1, 2, 5_000, 86_400_000] {
        let now = last + Duration::from_millis(after);
        let quiet = lane.quiet_at(now);
        let since = now - last;
        assert!(quiet <= since, "{quiet:?} quiet, {since:?} since the last");
        assert!(
            quiet + grain >= since,
            "{quiet:?} quiet, {since:?} since the last"
        );
    }
}
