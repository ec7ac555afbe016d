//! What a lane tells the outside: a `tracing` span per request and per
//! attempt, and `metrics` series (feature `metrics`). The crate docs
//! (`lib.rs`, "Observability") list the spans and series.
//!
//! | file | what it owns |
//! |---|---|
//! | `labels.rs` | the labels: which vendor, level and route a lane belongs to |
//! | `metrics.rs` | the series, described with units, and their handles |
//! | `series.rs` | a lane's labels and series together, shared by the lanes that carry the same labels |
//! | `shown.rs` | what of a request's URL a span, a log line or an error shows (a transport error's too) |
//! | `spans.rs` | the request and attempt spans, and what is recorded on them |

mod labels;
mod metrics;
mod series;
mod shown;
mod spans;

pub(crate) use self::labels::Labels;
pub(crate) use self::metrics::{Count, InFlight, LaneMetrics, StoreMetrics};
pub(crate) use self::series::Series;
pub(crate) use self::shown::{shown_error, shown_url};
pub(crate) use self::spans::RequestSpan;
