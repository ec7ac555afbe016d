//! 100,000 distinct keys touched once: every lane is dropped when idle, and
//! the memory they took comes back. Measured with a counting allocator, not
//! guessed.
//!
//! Real time on purpose (a multi-thread runtime and real idle timers):
//! the only waits are bounds with a wide margin.
//!
//! Only allocations on this test's own threads count: wiremock serves from
//! a thread of its own and keeps a copy of every request it matched, which
//! is its memory, not ours.

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use callshaper::Shaper;
use callshaper::route::LaneKey;
use wiremock::matchers::any;
use wiremock::{Mock, MockServer, ResponseTemplate};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

thread_local! {
    /// Set on the threads whose allocations count.
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

fn counted() -> bool {
    COUNTED.try_with(Cell::get).unwrap_or(false)
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counter is only bookkeeping. Measuring memory needs a global allocator,
// and that needs `unsafe`; it lives in this test binary only.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if counted() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if counted() {
            LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const KEYS: usize = 100_000;
const IDLE: Duration = Duration::from_secs(2);

async fn touch(shaper: &Shaper, base: &str, keys: std::ops::Range<usize>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(256));
    let mut tasks = Vec::with_capacity(keys.len());
    for key in keys {
        let permit = slots.clone().acquire_owned().await.expect("open");
        let call = shaper.get(base).tag(format!("tenant-{key}")).send();
        tasks.push(tokio::spawn(async move {
            let outcome = call.await;
            drop(permit);
            outcome
        }));
    }
    for task in tasks {
        assert_eq!(
            task.await
                .expect("a caller panicked")
                .expect("a response")
                .status(),
            200
        );
    }
}

async fn settle_down(shaper: &Shaper) -> isize {
    // Every lane's idle timer fires after IDLE; give it a wide margin.
    for _ in 0..20 {
        tokio::time::sleep(IDLE).await;
        if shaper.lanes().is_empty() {
            break;
        }
    }
    tokio::time::sleep(IDLE).await;
    LIVE.load(Ordering::Relaxed)
}

#[test]
fn a_hundred_thousand_keys_come_and_go_without_a_trace() {
    COUNTED.set(true);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(|| COUNTED.set(true))
        .build()
        .unwrap();
    runtime.block_on(hundred_thousand_keys());
}

async fn hundred_thousand_keys() {
    let server = MockServer::builder()
        .disable_request_recording()
        .start()
        .await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    // Pooled connections would be counted as ours: let them go quickly.
    let client = reqwest::Client::builder()
        .pool_idle_timeout(IDLE / 2)
        .build()
        .unwrap();
    let shaper = Shaper::builder()
        .client(client)
        .rate(1_000, Duration::from_secs(1))
        .headroom(Duration::ZERO)
        .vendor_key(LaneKey::Tag)
        .idle_timeout(IDLE)
        .build()
        .unwrap();
    let base = server.uri();

    // Warm up connections, pools and timers, then take the baseline.
    touch(&shaper, &base, 0..1_000).await;
    let baseline = settle_down(&shaper).await;

    touch(&shaper, &base, 1_000..1_000 + KEYS).await;
    let lanes = shaper.lanes().len();
    let busy = LIVE.load(Ordering::Relaxed);
    let after = settle_down(&shaper).await;

    let per_lane = (busy - baseline) as f64 / lanes.max(1) as f64;
    eprintln!(
        "baseline {baseline} B; {lanes} lanes alive after the burst: +{} B ({per_lane:.0} B per idle lane); after eviction {after} B ({:+} B)",
        busy - baseline,
        after - baseline
    );
    // Lanes idle for IDLE go while the burst is still on; the last IDLE's
    // worth are left (thousands a second here).
    assert!(lanes >= 1_000, "the burst left lanes to evict: {lanes}");
    assert!(
        shaper.lanes().is_empty(),
        "{} lanes left",
        shaper.lanes().len()
    );
    assert!(
        after - baseline < 256 * 1024,
        "{} B not given back",
        after - baseline
    );
}
