//! The leak rate of a vendor's bucket that states its level but not its
//! rate (Shopify's `32/40`), read off the lane's own releases.
//!
//! # The arithmetic
//!
//! A bucket's level after a request is the level after an earlier one, plus
//! the requests it accepted in between, less what leaked:
//!
//! ```text
//! used₁ = used₀ + accepted − leak · (t₁ − t₀)
//! leak  = (used₀ + accepted − used₁) / (t₁ − t₀)
//! ```
//!
//! with `t` the lane's release instants (the network's delay is the same on
//! both ends and cancels) and `accepted` the lane's releases in between
//! less the refusals among them (a refused request never enters the
//! bucket). This holds while the bucket never ran empty in the span: an
//! empty bucket leaks nothing, so the span starts again whenever the
//! vendor says its level is down to this one request.
//!
//! Requests released at one instant reach the vendor, and come back, in
//! any order: an instant is read once all of it is answered, by the
//! highest level said for it, which follows them all; the span starts from
//! such a level too.
//!
//! # The guarantee
//!
//! A level is read only once every request of the span has been answered
//! (one still on its way may be a refusal, which never entered). The
//! levels are whole units, so one unit is taken off what leaked: the
//! estimate errs slow, by one unit over the span, and the span grows as
//! long as the lane stays busy, so the estimate closes in on the true rate
//! from below.

use std::time::Duration;

use tokio::time::Instant;

/// Where the span started: a release instant, the vendor's highest level
/// after it, and the lane's release count through it.
#[derive(Debug, Clone, Copy)]
struct Mark {
    at: Instant,
    used: u64,
    through: u64,
    /// Answers to requests released after `at`, and the refusals among
    /// them.
    answers: u64,
    refused: u64,
}

/// A vendor bucket's level, watched over a span of the lane's releases.
#[derive(Debug, Default)]
pub(crate) struct Drain {
    mark: Option<Mark>,
    /// The highest level the vendor said for the latest release instant.
    level: Option<(Instant, u64)>,
}

impl Drain {
    /// The vendor counted `used` units of its bucket as it answered a
    /// request released at `at`, after `before` releases of the lane and
    /// with `together` released at that instant; `refused` when it
    /// refused that request. The leak rate in units a second, once the
    /// span reaches `span` and every request in it has been answered.
    pub(crate) fn observe(
        &mut self,
        used: u64,
        (before, together): (u64, u64),
        at: Instant,
        refused: bool,
        span: Duration,
    ) -> Option<f64> {
        let through = before.saturating_add(together);
        match &mut self.mark {
            Some(mark) if at > mark.at && (used > 1 || refused) => {}
            Some(mark) if at == mark.at => {
                // Released together, answered in any order: the vendor had
                // counted them all by the highest level it said.
                if !refused && used > mark.used {
                    mark.used = used;
                }
                mark.through = mark.through.max(through);
                return None;
            }
            // An answer from before the span: not in it.
            Some(mark) if at < mark.at => return None,
            // No span yet, or an empty bucket (only this request in it):
            // a new span starts here.
            _ if !refused => {
                self.mark = Some(Mark {
                    at,
                    used,
                    through,
                    answers: 0,
                    refused: 0,
                });
                return None;
            }
            _ => return None,
        }
        let mark = self.mark.as_mut()?;
        mark.answers = mark.answers.saturating_add(1);
        if refused {
            mark.refused = mark.refused.saturating_add(1);
        } else {
            self.level = match self.level {
                Some((t, level)) if t == at => Some((at, level.max(used))),
                _ => Some((at, used)),
            };
        }
        // The highest level said for this instant, once all of it is in.
        let (_, level) = self.level.filter(|(t, _)| *t == at)?;
        let released = through.saturating_sub(mark.through);
        let elapsed = at.saturating_duration_since(mark.at);
        if elapsed < span || mark.answers < released {
            // Too short to read, or a request of the span still on its way
            // back (it may be a refusal, which never entered).
            return None;
        }
        let accepted = released.saturating_sub(mark.refused);
        let leaked = mark
            .used
            .saturating_add(accepted)
            .saturating_sub(level)
            .saturating_sub(1);
        Some(leaked as f64 / elapsed.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// A bucket of 40 leaking 2 a second, filled at 3 a second from a
    /// level of 1, each request answered before the next: a unit short
    /// over each span, never more.
    #[tokio::test(start_paused = true)]
    async fn reads_the_leak_off_the_levels_from_below() {
        let t0 = Instant::now();
        let mut drain = Drain::default();
        assert_eq!(drain.observe(1, (0, 1), t0, false, 2 * S), None);
        let mut last = 0.0;
        for second in 1..=39_u32 {
            // Three sent in each second, two leaked: one more a second.
            let mut estimate = None;
            for k in 1..=3_u32 {
                let sent = 3 * (second - 1) + k;
                let at = t0 + S * (second - 1) + S * k / 3;
                let used = 1 + u64::from(sent) - 2 * u64::from(sent) / 3;
                estimate = drain.observe(used, (u64::from(sent), 1), at, false, 2 * S);
            }
            if second < 2 {
                assert_eq!(estimate, None, "shorter than the span");
                continue;
            }
            let estimate = estimate.expect("past the span");
            let floor = 2.0 - 1.0 / f64::from(second) - 1e-9;
            assert!(
                estimate < 2.0 && estimate >= floor,
                "{estimate} at {second} s"
            );
            assert!(estimate >= last, "closes in as the span grows");
            last = estimate;
        }
    }

    /// Refused requests never entered the bucket, and a level of one (the
    /// bucket ran empty) starts the span again.
    #[tokio::test(start_paused = true)]
    async fn refusals_are_not_accepted_and_an_empty_bucket_starts_again() {
        let t0 = Instant::now();
        let mut drain = Drain::default();
        drain.observe(40, (9, 1), t0, false, S);
        // 10 more in 5 s, 4 of them refused: 6 entered, 10 leaked. A
        // refusal's level is not read.
        for i in 0..4 {
            let refusal = drain.observe(40, (10 + i, 1), t0 + S + S * i as u32, true, S);
            assert_eq!(refusal, None);
        }
        for i in 4..9 {
            drain.observe(40, (10 + i, 1), t0 + 4 * S + S * i as u32 / 10, false, S);
        }
        let estimate = drain.observe(36, (19, 1), t0 + 5 * S, false, S);
        assert_eq!(estimate, Some(9.0 / 5.0));
        assert_eq!(drain.observe(1, (20, 1), t0 + 20 * S, false, S), None);
        assert_eq!(drain.observe(2, (21, 1), t0 + 21 * S, false, S), Some(0.0));
    }

    /// A burst released at one instant is answered in any order: its
    /// highest level is the one its release count goes with.
    #[tokio::test(start_paused = true)]
    async fn a_burst_answered_out_of_order_is_read_by_its_highest_level() {
        let t0 = Instant::now();
        let mut drain = Drain::default();
        for used in [2, 40, 30, 39] {
            assert_eq!(drain.observe(used, (0, 40), t0, false, S), None);
        }
        // Three released together 10 s on, answered out of order: read
        // once all three are in, by the highest level. 43 in, 12 leaked,
        // less the unit taken off.
        for used in [37, 39] {
            assert_eq!(drain.observe(used, (40, 3), t0 + 10 * S, false, S), None);
        }
        let estimate = drain.observe(38, (40, 3), t0 + 10 * S, false, S);
        assert_eq!(estimate, Some(3.0 / 10.0));
    }

    /// Two requests released, the later answered first: the earlier may be
    /// a refusal still on its way, so the level is not read until it is in.
    #[tokio::test(start_paused = true)]
    async fn a_level_waits_for_every_answer_of_its_span() {
        let t0 = Instant::now();
        let mut drain = Drain::default();
        drain.observe(40, (0, 1), t0, false, S);
        assert_eq!(drain.observe(38, (2, 1), t0 + 3 * S, false, S), None);
        drain.observe(40, (1, 1), t0 + 2 * S, true, S);
        assert_eq!(
            drain.observe(39, (3, 1), t0 + 4 * S, false, S),
            Some(2.0 / 4.0)
        );
    }
}
