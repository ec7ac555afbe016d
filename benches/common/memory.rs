//! How much memory a benchmark's subject holds: live heap bytes (a
//! counting allocator) and a process's resident set.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

/// Counts live heap bytes.
pub struct Counting;

/// A counter on a cache line of its own.
#[repr(align(64))]
struct Slot(AtomicIsize);

/// Live heap bytes, in a counter per thread (threads past [`SLOTS`]
/// share them): one counter for all took a cache line that every
/// allocation on every core wrote, and a benchmark that allocates on two
/// cores at once measured that line moving between them as much as its
/// subject. A block freed on another thread than the one that made it
/// leaves one counter high and the other low; their sum is the heap.
static LIVE: [Slot; SLOTS] = [const { Slot(AtomicIsize::new(0)) }; SLOTS];
const SLOTS: usize = 64;

/// The next thread's counter.
static NEXT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's counter (`usize::MAX`: none yet). A `Cell` made in
    /// place, with nothing to drop: the allocator may read it at any
    /// time, a thread's first allocation and its last included.
    static MINE: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// This thread's counter.
fn mine() -> &'static AtomicIsize {
    let slot = MINE
        .try_with(|mine| {
            if mine.get() == usize::MAX {
                mine.set(NEXT.fetch_add(1, Ordering::Relaxed) % SLOTS);
            }
            mine.get()
        })
        // A thread's storage already gone: the first counter.
        .unwrap_or(0);
    &LIVE[slot].0
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counter is only bookkeeping. Measuring memory needs a global allocator,
// and that needs `unsafe`; it lives in the benchmarks only.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        mine().fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        mine().fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Live heap bytes, with [`Counting`] as the global allocator.
pub fn heap() -> isize {
    LIVE.iter().map(|slot| slot.0.load(Ordering::Relaxed)).sum()
}

/// The resident memory of process `pid` (`"self"` for this one), in bytes.
pub fn resident(pid: &str) -> u64 {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}
