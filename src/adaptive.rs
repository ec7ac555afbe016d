//! [`Adaptive`]: pacing for vendors that announce nothing (AIMD).

/// Adaptive pacing for vendors that announce nothing: find the real quota
/// from throttles alone, in the spirit of the AWS SDKs' adaptive retry mode.
///
/// # AIMD, and why
///
/// The controller keeps a rate `r` between a floor and the configured
/// ceiling `C` (it never goes above what the user declared):
///
/// - a throttle without a usable header cuts it: `r = max(floor, β · r)`
///   with `β = 0.7` (multiplicative decrease, as TCP and the AWS SDKs do);
/// - each success adds `α · C / r` to the rate (in requests per second):
///   successes arrive `r` times a second, so the rate grows by `α · C` per
///   second whatever it is (additive increase in time, not per request; per
///   request it would grow exponentially).
///
/// With `α = 0.05` the lane climbs back from a cut in a few seconds and
/// probes the real quota about once per cycle, so it spends a throttle every
/// few seconds instead of a stream of them. CUBIC would climb faster near a
/// known ceiling; AIMD is simpler to reason about and its cost (one 429 per
/// cycle) is already small next to a fixed-rate lane that keeps probing at
/// the declared rate.
///
/// These are its knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
pub struct Adaptive {
    /// Multiplicative decrease per throttle (0 < β < 1). Default 0.7.
    pub decrease: f64,
    /// Additive increase per second, as a fraction of the ceiling. Default
    /// 0.05.
    pub increase: f64,
    /// The lowest rate, as a fraction of the ceiling. Default 0.05.
    pub floor: f64,
}

impl Default for Adaptive {
    fn default() -> Self {
        Self {
            decrease: 0.7,
            increase: 0.05,
            floor: 0.05,
        }
    }
}

impl Adaptive {
    pub(crate) fn validate(&self) -> Result<(), crate::ConfigError> {
        let within = |v: f64| v > 0.0 && v < 1.0;
        if !within(self.decrease) {
            return Err(crate::ConfigError::new(
                "adaptive.decrease",
                "must be between 0 and 1",
            ));
        }
        if !within(self.increase) {
            return Err(crate::ConfigError::new(
                "adaptive.increase",
                "must be between 0 and 1",
            ));
        }
        if !(self.floor > 0.0 && self.floor <= 1.0) {
            return Err(crate::ConfigError::new(
                "adaptive.floor",
                "must be above 0 and at most 1",
            ));
        }
        Ok(())
    }
}

/// The controller's state: the current rate as a fraction of the ceiling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Aimd {
    knobs: Adaptive,
    share: f64,
    /// The ceiling in requests per second.
    ceiling: f64,
}

impl Aimd {
    /// The declared rate changed: the share now applies to `ceiling`.
    pub(crate) fn set_ceiling(&mut self, ceiling: crate::Rate) {
        self.ceiling = ceiling.per_second();
    }

    pub(crate) fn new(knobs: Adaptive, ceiling: crate::Rate) -> Self {
        let ceiling = ceiling.per_second();
        Self {
            knobs,
            share: 1.0,
            ceiling,
        }
    }

    /// The current rate as a fraction of the ceiling, in `floor..=1`.
    pub(crate) fn share(&self) -> f64 {
        self.share
    }

    pub(crate) fn throttled(&mut self) {
        self.share = (self.share * self.knobs.decrease).max(self.knobs.floor);
    }

    pub(crate) fn succeeded(&mut self) {
        // α·C/r requests per second, over C to stay in shares: α / (share·C).
        let step = self.knobs.increase / (self.share * self.ceiling);
        self.share = (self.share + step).min(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_on_throttle_grows_on_success_within_bounds() {
        let ten_per_second = crate::Rate::new(10, std::time::Duration::from_secs(1));
        let mut aimd = Aimd::new(Adaptive::default(), ten_per_second);
        aimd.throttled();
        assert!((aimd.share() - 0.7).abs() < 1e-9);
        for _ in 0..100 {
            aimd.throttled();
        }
        assert!((aimd.share() - 0.05).abs() < 1e-9, "never below the floor");
        // Two seconds of successes at the current rate add about 2α.
        for share in [0.05, 0.7] {
            let mut aimd = Aimd::new(Adaptive::default(), ten_per_second);
            aimd.share = share;
            for _ in 0..(share * 20.0).round() as usize {
                aimd.succeeded();
            }
            let grown = aimd.share() - share;
            assert!(grown > 0.085 && grown < 0.105, "from {share}: {grown}");
        }
        for _ in 0..1000 {
            aimd.succeeded();
        }
        assert!((aimd.share() - 1.0).abs() < 1e-9, "capped at the ceiling");
    }
}
