//! Reloading the quotas while the proxy serves: on `SIGHUP`, and when the
//! file's bytes change (read every second).
//!
//! A reload goes through `ShaperConfig::reload`: every quota is checked
//! before any applies, so a bad file changes nothing and the log says
//! why. Quotas only: a new vendor, upstream, `[proxy]` or `[store]`
//! setting needs a restart.

use std::path::PathBuf;
use std::time::Duration;

use callshaper::Shaper;

use crate::file;

/// How often the file is read for a change.
const POLL: Duration = Duration::from_secs(1);

/// Watch `path` (whose bytes were `last` when the shaper was built) until
/// the process stops.
pub(crate) async fn watch(path: PathBuf, mut last: Vec<u8>, shaper: Shaper) {
    let mut hangups = hangups();
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // An editor that replaces the file leaves it missing for a moment:
    // that is said once, not every second.
    let mut unreadable = false;
    loop {
        let asked = tokio::select! {
            _ = tick.tick() => false,
            () = hangup(&mut hangups) => true,
        };
        let text = match file::bytes(&path).await {
            Ok(text) => text,
            Err(problem) => {
                if asked || !unreadable {
                    tracing::warn!(
                        "callshaper-proxy: not reloaded, the settings in use stay: {problem}"
                    );
                }
                unreadable = true;
                continue;
            }
        };
        unreadable = false;
        if !asked && text == last {
            continue;
        }
        let reloaded = file::parse(&path, &text).and_then(|config| {
            config
                .reload(&shaper)
                .map_err(|e| format!("{}: {e}", path.display()))
        });
        last = text;
        match reloaded {
            Ok(()) => tracing::info!(file = %path.display(), "callshaper-proxy: quotas reloaded"),
            Err(problem) => {
                tracing::warn!(
                    "callshaper-proxy: not reloaded, the settings in use stay: {problem}"
                );
            }
        }
    }
}

#[cfg(unix)]
type Hangups = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangups = Option<std::convert::Infallible>;

fn hangups() -> Hangups {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::hangup()) {
            Ok(signal) => return Some(signal),
            Err(error) => {
                tracing::warn!(%error, "callshaper-proxy: SIGHUP cannot reload; the file is still watched")
            }
        }
    }
    None
}

/// The next SIGHUP; never, where there are none.
async fn hangup(hangups: &mut Hangups) {
    #[cfg(unix)]
    if let Some(signal) = hangups
        && signal.recv().await.is_some()
    {
        return;
    }
    let _ = hangups;
    std::future::pending::<()>().await;
}
