//! What the vendor said about when to come back, as it said it, for a
//! pause to cite (`LaneSnapshot::pause_said`).

use std::sync::Arc;
use std::time::SystemTime;

use reqwest::header::HeaderMap;

use super::retry_after::read_retry_after;
use super::said::Signals;

/// The most of a vendor's words a pause cites: the values are the
/// vendor's.
const CITED: usize = 200;

/// What the vendor said about when to come back, as it said it, for a
/// pause to cite: the header its hint came from (`retry-after: 2`), else
/// each limit with nothing left (`requests: 0 of 10 left, reset in 1s`),
/// or, with none, each with one left (a unit left to another consumer).
/// At most [`CITED`] characters.
pub(crate) fn cite(headers: &HeaderMap, signals: &Signals) -> Option<Arc<str>> {
    let hint = signals.retry_after.map(|hint| {
        match read_retry_after(headers, SystemTime::now()) {
            Some((name, value, _)) => {
                let value = &value.as_bytes()[..value.len().min(CITED)];
                format!("{name}: {}", String::from_utf8_lossy(value))
            }
            // A dialect of the user's said it.
            None => format!("retry after {hint:?}"),
        }
    });
    let text = hint.or_else(|| {
        let least = signals
            .limits
            .iter()
            .filter_map(|l| l.remaining)
            .min()
            .filter(|&least| least <= 1)?;
        let spent: Vec<String> = signals
            .limits
            .iter()
            .filter(|l| l.remaining == Some(least))
            .map(|l| {
                let of = l
                    .limit
                    .map(|limit| format!(" of {limit}"))
                    .unwrap_or_default();
                let reset = l
                    .reset
                    .map(|reset| format!(", reset in {reset:?}"))
                    .unwrap_or_default();
                format!("{}: {least}{of} left{reset}", l.dimension)
            })
            .collect();
        Some(spent.join("; "))
    })?;
    Some(text.chars().take(CITED).collect::<String>().into())
}
