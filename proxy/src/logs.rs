//! Logs on stderr through `tracing`, filtered by `CALLSHAPER_LOG`.
//!
//! What is logged never holds a secret: the library's spans carry a URL
//! without its query or credentials and no header, and the proxy logs the
//! upstream path only.

use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Install the subscriber: `CALLSHAPER_LOG` is a level (`info`, the
/// default) or targets with levels (`warn,callshaper=debug`).
pub(crate) fn init() -> Result<(), String> {
    let filter = std::env::var("CALLSHAPER_LOG").unwrap_or_else(|_| "info".to_owned());
    let targets: Targets = filter
        .parse()
        .map_err(|e| format!("CALLSHAPER_LOG={filter:?} is not a log filter: {e}"))?;
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with(targets)
        .try_init()
        .map_err(|e| format!("cannot install the log: {e}"))
}
