//! The clocks a vendor's absolute times are read against: ours
//! ([`WallClock`], [`SystemClock`]) and the vendor's own, from its `Date`
//! header ([`vendor_clock`]).

use std::cell::OnceCell;
use std::fmt;
use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;

/// Where a shaper reads the wall clock, against which it reads the
/// absolute times vendors write (an epoch reset, an HTTP-date
/// `Retry-After`, an RFC 3339 instant). [`SystemClock`] unless the builder
/// is given another ([`ShaperBuilder::wall_clock`](crate::shaper::ShaperBuilder::wall_clock)):
/// tests under tokio's paused clock give one that moves with it
/// (`testing::TokioWall`, feature `testing`), as governor's tests give
/// its fake clock.
pub trait WallClock: Send + Sync + fmt::Debug + 'static {
    /// The time now.
    fn now(&self) -> SystemTime;
}

/// The system's wall clock: [`SystemTime::now`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl WallClock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// The vendor's clock, read from its `Date` header when it differs from
/// ours (`now`) by more than the header's one-second precision; else ours.
/// Absolute times a vendor sends (an HTTP-date `Retry-After`, an epoch
/// reset, an RFC 3339 instant) are on its clock: read against ours, a
/// vendor 2 s ahead would hold the lane 2 s too long, and one 2 s behind
/// would let it go 2 s early, into another 429. The header is truncated to
/// the second, so a corrected wait errs long, by less than a second.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use reqwest::header::{HeaderMap, HeaderValue};
///
/// let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
/// let mut headers = HeaderMap::new();
/// let ahead = httpdate::fmt_http_date(now + Duration::from_secs(2));
/// headers.insert("date", HeaderValue::from_str(&ahead).unwrap());
/// let vendor = callshaper::signals::vendor_clock(&headers, now);
/// assert_eq!(vendor, now + Duration::from_secs(2));
/// ```
pub fn vendor_clock(headers: &HeaderMap, now: SystemTime) -> SystemTime {
    let Some(date) = headers
        .get(reqwest::header::DATE)
        .and_then(|v| v.to_str().ok())
        .and_then(|text| httpdate::parse_http_date(text).ok())
    else {
        return now;
    };
    let skew = match date.duration_since(now) {
        Ok(ahead) => ahead,
        Err(behind) => behind.duration(),
    };
    if skew > Duration::from_secs(1) {
        date
    } else {
        now
    }
}

/// One answer's clock for its absolute times, read the first time a
/// dialect asks: an answer whose resets are all relative (OpenAI's Go
/// durations, Discord's `reset-after`, the IETF draft's seconds) costs
/// neither a reading of the wall clock nor a parse of its `Date`, which
/// every real vendor sends. An answer with a `Retry-After`, which may be
/// a date, reads it.
pub(crate) struct AnswerClock<'a> {
    read: &'a dyn Fn() -> SystemTime,
    now: OnceCell<SystemTime>,
}

impl<'a> AnswerClock<'a> {
    /// A clock `read` reads, once, when first asked.
    pub(crate) fn new(read: &'a dyn Fn() -> SystemTime) -> Self {
        Self {
            read,
            now: OnceCell::new(),
        }
    }

    /// The time now, on the clock the answer's absolute times are read
    /// against.
    pub(crate) fn now(&self) -> SystemTime {
        *self.now.get_or_init(self.read)
    }
}
