//! How a test vendor counts: a sliding window, a fixed window (from the
//! vendor's start, or opening at the first request), a token bucket,
//! nginx's `limit_req` and GCRA, each as the limiter it models
//! computes it, and what each says of its quota.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::style::Said;
use crate::time::later;

/// One quota the vendor enforces.
pub(super) struct Limiter {
    pub(super) limit: u64,
    pub(super) window: Duration,
    pub(super) counting: Counting,
    /// The header a request's cost is read from; `None` counts requests.
    pub(super) cost_header: Option<String>,
}

/// How a quota counts, with its state.
pub(super) enum Counting {
    /// At most `limit` in any window `(t - window, t]`: `(accepted at,
    /// cost)`, oldest first.
    Sliding(VecDeque<(Instant, u64)>),
    /// At most `limit` in each window `[k·window, (k+1)·window)` from the
    /// vendor's start, as GitHub counts per hour: `(k, spent)`.
    Fixed(u128, u64),
    /// At most `limit` in a fixed window that opens at the first request
    /// after the last one closed, as Flask-Limiter's in-memory fixed window
    /// and express-rate-limit's memory store count: `(opened, spent)`.
    Opening(Option<Instant>, u64),
    /// A bucket of `limit` tokens: `(tokens, last refill, refill per
    /// second)`.
    Bucket(f64, Instant, f64),
    /// nginx's `limit_req`, as nginx computes it.
    Nginx(Nginx),
    /// GCRA: a theoretical arrival time `tat`, one request every `limit`th
    /// of the window, and a request refused when it comes sooner than
    /// `tolerance` before `tat`: `(tat, tolerance)`.
    Gcra(Option<Instant>, Duration),
}

/// nginx's `limit_req` state for one key, in its own units: `excess` in
/// thousandths of a request, on a millisecond clock
/// (`ngx_http_limit_req_lookup`). A request `ms` after the last accepted
/// one finds `excess - rate * ms / 1000 + 1000` (at least 0), with `rate`
/// the requests a second times 1000; above `burst` (times 1000) it is
/// refused and changes nothing, else it is accepted, the excess kept, and
/// `last` moved if `ms` is not 0. Without `burst`, any request sooner than
/// `1000 / rate` seconds after the last accepted one is refused: at
/// `10r/s`, 99 ms is too soon.
#[derive(Debug, Clone, Copy)]
pub(super) struct Nginx {
    pub(super) rate: i64,
    pub(super) burst: i64,
    pub(super) nodelay: bool,
    pub(super) excess: i64,
    /// The last accepted request, in whole milliseconds from the start.
    pub(super) last: Option<i64>,
}

impl Nginx {
    /// The excess a request at `now_ms` would leave, whether or not it is
    /// let in.
    fn excess_at(&self, now_ms: i64) -> Option<(i64, i64)> {
        let last = self.last?;
        let ms = (now_ms - last).max(0);
        let drained = self.rate.saturating_mul(ms) / 1000;
        let excess = self
            .excess
            .saturating_sub(drained)
            .saturating_add(1000)
            .max(0);
        Some((excess, ms))
    }
}

impl Limiter {
    /// Whether `cost` fits now; if not, how long until it does.
    pub(super) fn check(&self, cost: u64, now: Instant, start: Instant) -> Result<(), Duration> {
        match &self.counting {
            Counting::Sliding(accepted) => {
                let mut total: u64 = accepted.iter().map(|&(_, c)| c).sum();
                if total + cost <= self.limit {
                    return Ok(());
                }
                for &(at, c) in accepted {
                    total -= c;
                    if total + cost <= self.limit {
                        return Err((at + self.window).saturating_duration_since(now));
                    }
                }
                Err(self.window)
            }
            Counting::Fixed(_, spent) => {
                if spent + cost <= self.limit {
                    Ok(())
                } else {
                    Err(window_end(start, self.window, now) - now)
                }
            }
            Counting::Opening(opened, spent) => match opened {
                Some(opened) if spent + cost > self.limit => {
                    Err(later(*opened, self.window).saturating_duration_since(now))
                }
                _ => Ok(()),
            },
            Counting::Bucket(tokens, _, per_second) => {
                let missing = cost as f64 - tokens;
                if missing <= 0.0 {
                    Ok(())
                } else {
                    Err(Duration::from_secs_f64(missing / per_second))
                }
            }
            Counting::Nginx(nginx) => match nginx.excess_at(millis(start, now)) {
                Some((excess, _)) if excess > nginx.burst => {
                    let over = u64::try_from(excess - nginx.burst).unwrap_or(0);
                    let rate = u64::try_from(nginx.rate).unwrap_or(1).max(1);
                    Err(Duration::from_millis(over.saturating_mul(1000) / rate))
                }
                _ => Ok(()),
            },
            Counting::Gcra(tat, tolerance) => match tat {
                Some(tat) if later(now, *tolerance) < *tat => Err(tat
                    .saturating_duration_since(now)
                    .saturating_sub(*tolerance)),
                _ => Ok(()),
            },
        }
    }

    /// How long nginx holds an accepted request before it passes it on
    /// (a `burst` without `nodelay`): the excess it left, at the rate.
    pub(super) fn delay(&self) -> Duration {
        match &self.counting {
            Counting::Nginx(nginx) if !nginx.nodelay => {
                let excess = u64::try_from(nginx.excess).unwrap_or(0);
                let rate = u64::try_from(nginx.rate).unwrap_or(1).max(1);
                Duration::from_millis(excess.saturating_mul(1000) / rate)
            }
            _ => Duration::ZERO,
        }
    }

    /// The spacing of one request at the quota's rate.
    pub(super) fn emission(&self) -> Duration {
        self.window / u32::try_from(self.limit.max(1)).unwrap_or(u32::MAX)
    }

    /// Forget what no longer counts at `now`.
    pub(super) fn age(&mut self, now: Instant, start: Instant) {
        let window = self.window;
        let limit = self.limit as f64;
        match &mut self.counting {
            Counting::Sliding(accepted) => {
                while accepted.front().is_some_and(|&(at, _)| at + window <= now) {
                    accepted.pop_front();
                }
            }
            Counting::Fixed(index, spent) => {
                let current = (now - start).as_nanos() / window.as_nanos();
                if *index != current {
                    *index = current;
                    *spent = 0;
                }
            }
            Counting::Opening(opened, spent) => {
                if opened.is_some_and(|at| later(at, window) <= now) {
                    *opened = None;
                    *spent = 0;
                }
            }
            Counting::Bucket(tokens, last, per_second) => {
                *tokens = (*tokens + (now - *last).as_secs_f64() * *per_second).min(limit);
                *last = now;
            }
            Counting::Nginx(_) | Counting::Gcra(..) => {}
        }
    }

    pub(super) fn charge(&mut self, cost: u64, now: Instant, start: Instant) {
        let emission = self.emission();
        match &mut self.counting {
            Counting::Sliding(accepted) => accepted.push_back((now, cost)),
            Counting::Fixed(_, spent) => *spent += cost,
            Counting::Opening(opened, spent) => {
                opened.get_or_insert(now);
                *spent += cost;
            }
            Counting::Bucket(tokens, _, _) => *tokens -= cost as f64,
            Counting::Nginx(nginx) => {
                let now_ms = millis(start, now);
                match nginx.excess_at(now_ms) {
                    None => {
                        nginx.excess = 0;
                        nginx.last = Some(now_ms);
                    }
                    Some((excess, ms)) => {
                        nginx.excess = excess;
                        if ms != 0 {
                            nginx.last = Some(now_ms);
                        }
                    }
                }
            }
            Counting::Gcra(tat, _) => {
                let from = tat.map_or(now, |tat| tat.max(now));
                *tat = Some(later(from, emission));
            }
        }
    }

    /// What the vendor says of this quota: until the oldest request
    /// leaves the sliding window, the fixed window ends, or the bucket is
    /// full again.
    pub(super) fn said(&self, now: Instant, start: Instant, wall: SystemTime) -> Said {
        let reset = match &self.counting {
            Counting::Sliding(accepted) => accepted.front().map_or(Duration::ZERO, |&(at, _)| {
                (at + self.window).saturating_duration_since(now)
            }),
            Counting::Fixed(..) => window_end(start, self.window, now) - now,
            Counting::Opening(opened, _) => opened.map_or(self.window, |opened| {
                later(opened, self.window).saturating_duration_since(now)
            }),
            Counting::Bucket(tokens, _, per_second) => {
                let missing = (self.limit as f64 - tokens).max(0.0);
                Duration::from_secs_f64(missing / per_second)
            }
            // Until the bucket is empty again.
            Counting::Gcra(tat, _) => {
                tat.map_or(Duration::ZERO, |tat| tat.saturating_duration_since(now))
            }
            Counting::Nginx(_) => Duration::ZERO,
        };
        let remaining = match &self.counting {
            // What fits within the tolerance now, as GCRA libraries say it.
            Counting::Gcra(tat, tolerance) => {
                let behind = tat.map_or(Duration::ZERO, |tat| tat.saturating_duration_since(now));
                let room = tolerance
                    .saturating_add(self.emission())
                    .saturating_sub(behind);
                u64::try_from(room.as_nanos() / self.emission().as_nanos().max(1)).unwrap_or(0)
            }
            _ => self.remaining(),
        };
        let limit = match &self.counting {
            // What goes at once, as redis-cell and `throttled` state it:
            // the burst the tolerance allows, plus one.
            Counting::Gcra(_, tolerance) => {
                let burst = tolerance.as_nanos() / self.emission().as_nanos().max(1);
                u64::try_from(burst).unwrap_or(u64::MAX).saturating_add(1)
            }
            _ => self.limit,
        };
        Said {
            limit,
            remaining,
            window: self.window,
            reset,
            fixed: matches!(self.counting, Counting::Fixed(..) | Counting::Opening(..)),
            wall,
        }
    }

    pub(super) fn remaining(&self) -> u64 {
        match &self.counting {
            Counting::Sliding(accepted) => self
                .limit
                .saturating_sub(accepted.iter().map(|&(_, c)| c).sum()),
            Counting::Fixed(_, spent) | Counting::Opening(_, spent) => {
                self.limit.saturating_sub(*spent)
            }
            Counting::Bucket(tokens, _, _) => tokens.max(0.0) as u64,
            // Read at an instant: see `said`.
            Counting::Gcra(..) | Counting::Nginx(_) => 0,
        }
    }

    pub(super) fn cost_of(&self, request: &wiremock::Request) -> u64 {
        self.cost_header.as_ref().map_or(1, |name| {
            request
                .headers
                .get(name.as_str())
                .and_then(|v| v.to_str().ok()?.trim().parse().ok())
                .unwrap_or(1)
        })
    }
}

/// Whole milliseconds from `start` to `now`, as nginx's clock reads them.
fn millis(start: Instant, now: Instant) -> i64 {
    i64::try_from((now - start).as_millis()).unwrap_or(i64::MAX)
}

/// The end of the fixed window of length `window` from `start` that `now`
/// falls in.
pub(super) fn window_end(start: Instant, window: Duration, now: Instant) -> Instant {
    let elapsed = (now - start).as_nanos();
    let window = window.as_nanos();
    let end = (elapsed / window + 1) * window;
    start + Duration::from_nanos(u64::try_from(end).unwrap_or(u64::MAX))
}
