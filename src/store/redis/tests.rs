//! The scripts against a real Redis: their clock, and what they keep.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::scripts::RESERVE;
use super::*;
use crate::meters::Quota;
use crate::store::contract::{Reservation, SharedStore};
use crate::testing::RedisServer;
use crate::time::micros;

/// The scripts read the clock they are given, and Redis's `TIME`
/// otherwise: what `Clock::Instances` relies on.
#[tokio::test]
async fn scripts_read_the_instance_clock_when_given_one() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    // One leaky-bucket meter of 10 per second, no pace; one slot of cost 1.
    let spec = [0, 1, 1, 0, 10, 1_000_000, 10, 1_000_000];
    // Clock, headroom, horizon, keep, booked, me, waiting, n, its cost.
    let reserve = |now: i64| {
        let mut args = vec![now, 0, 1_000_000, 2_000_000, 0, 7, 1, 1, 1];
        args.extend(spec);
        args
    };
    let keys = ["callshaper:{t}:clock".to_owned()];
    let given = 1_234_567_890_000_000;
    let reply: Vec<i64> = store
        .invoke(&RESERVE, &keys, &reserve(given), None)
        .await
        .unwrap();
    assert_eq!(reply[0], given, "the instance's clock");

    let wall = micros(SystemTime::now().duration_since(UNIX_EPOCH).unwrap());
    let reply: Vec<i64> = store
        .invoke(&RESERVE, &keys, &reserve(0), None)
        .await
        .unwrap();
    assert!(
        (reply[0] - wall).abs() < 5_000_000,
        "Redis TIME: {} vs {wall}",
        reply[0]
    );

    // And each store sends what its option says.
    assert_eq!(store.now_arg(), 0);
    let instances = RedisStore::options()
        .clock(Clock::Instances)
        .connect(&server.url())
        .await
        .unwrap();
    assert!((instances.now_arg() - wall).abs() < 5_000_000);
}

/// Each slot comes with what the fleet booked in its window ending at
/// it, and slots given back leave that count (whether or not the
/// meters could take them back).
#[tokio::test]
async fn each_slot_says_what_the_fleet_booked_in_its_window() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let second = Duration::from_secs(1);
    let lane_of = |name: &str, count| {
        let quotas = [vec![Quota::leaky_bucket(count, second)]];
        store.lane(&[name], &quotas, Duration::ZERO, 2 * second, &[])
    };
    let lane = lane_of("ledger", 10);
    let paces = [None];
    let count = |r: &Reservation| -> Vec<u64> {
        r.fleet
            .iter()
            .map(|gates| gates[0].unwrap().count)
            .collect()
    };
    // A lane's first reservation books one slot, the next the rest.
    let first = lane.reserve(&[1], 5, &paces).await.unwrap();
    assert_eq!(count(&first), [1]);
    let t0 = first.slots[0];
    let leaves = first.fleet[0][0].unwrap().leaves.unwrap();
    let tick = 1_000_000 / 32;
    assert!(
        (t0 + 1_000_000..t0 + 1_000_000 + tick).contains(&leaves),
        "the oldest leaves the window a window after it, within a tick: {}",
        leaves - t0
    );
    let rest = lane.reserve(&[1; 4], 4, &paces).await.unwrap();
    assert_eq!(count(&rest), [2, 3, 4, 5]);

    let mut latest: Vec<(i64, u64)> = rest.slots[2..].iter().map(|&t| (t, 1)).collect();
    latest.reverse();
    lane.give_back(latest, rest.seqs.clone(), &paces);
    // The give-back runs in the background; the next slot is due after
    // slot 2 (given back) or 4 (not) alike.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let again = lane.reserve(&[1], 1, &paces).await.unwrap();
    assert_eq!(count(&again), [4], "slots 0 to 2, and this one");

    // A slot forgotten before one still held (a pause ending between
    // them) leaves the ledger but stays charged: the next slot keeps
    // its interval to the held one.
    let held = lane.reserve(&[1; 2], 2, &paces).await.unwrap();
    assert_eq!(count(&held), [5, 6]);
    lane.forget(vec![(held.slots[0], 1)], &paces);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let next = lane.reserve(&[1], 1, &paces).await.unwrap();
    assert_eq!(count(&next), [6], "the forgotten slot is not counted");
    assert!(
        next.slots[0] - held.slots[1] >= 100_000,
        "the meter kept it: {} us after the held slot",
        next.slots[0] - held.slots[1]
    );

    // At a high rate a reservation's slots share their ticks.
    let fast = lane_of("fast", 1_000_000);
    let first = fast.reserve(&[1], 16, &paces).await.unwrap();
    let rest = fast.reserve(&[1; 15], 15, &paces).await.unwrap();
    let counts: Vec<u64> = count(&first).into_iter().chain(count(&rest)).collect();
    assert_eq!(counts, (1..=16).collect::<Vec<u64>>());
}
