//! Tokio's clock, and the wall time read off it, for the test vendors.

use std::sync::LazyLock;
use std::time::SystemTime;

use tokio::runtime::Handle;
use tokio::time::Instant;

/// The wall time at `at` on tokio's clock (see `TokioWall`).
pub(super) fn wall_at(at: Instant) -> SystemTime {
    static ANCHOR: LazyLock<(SystemTime, std::time::Instant)> =
        LazyLock::new(|| (SystemTime::now(), std::time::Instant::now()));
    let (wall, anchor) = *ANCHOR;
    let at = at.into_std();
    match at.checked_duration_since(anchor) {
        Some(since) => wall.checked_add(since),
        None => wall.checked_sub(anchor.saturating_duration_since(at)),
    }
    .unwrap_or(wall)
}

/// Tokio's clock of `runtime` (virtual under a paused test clock), or the
/// real one.
pub(super) fn now(runtime: Option<&Handle>) -> Instant {
    let _entered = runtime.map(Handle::enter);
    Instant::now()
}
