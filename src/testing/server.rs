//! A test vendor's wiremock server, taken down safely.

use std::sync::Arc;

use wiremock::MockServer;

/// The last handle to a test vendor takes its server down on a thread of
/// its own. wiremock's server checks itself on drop with a blocking
/// executor; inside a tokio task that has spent its cooperative budget
/// (one that awaited many ready results in one go), tokio's locks answer
/// "not yet" and wake at once, and that executor spins forever. Outside
/// any runtime the budget does not apply.
pub(super) fn take_down(server: &mut Option<Arc<MockServer>>) {
    if let Some(server) = server.take().and_then(Arc::into_inner) {
        let _ = std::thread::spawn(move || drop(server)).join();
    }
}
