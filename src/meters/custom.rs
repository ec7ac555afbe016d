//! A meter of the user's own, declared in a [`Quota`] like a built-in one.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::meter::Meter;
use super::rate::Rate;

/// Builds a fresh meter for one gate: from the lane's headroom and the
/// instant the gate is created.
pub type MakeMeter = dyn Fn(Duration, Instant) -> Box<dyn Meter> + Send + Sync;

/// An algorithm of your own: a name, the rate it allows on average (what
/// admission predicts waits from and adaptive pacing starts at), and how to
/// build one meter per gate. It runs in this process only: a shaper with a
/// shared store refuses it at `build()`, since the store's scripts know
/// only the built-in algorithms.
///
/// ```
/// use std::time::Duration;
/// use callshaper::meters::{CustomMeter, LeakyBucket};
/// use callshaper::{Quota, Rate};
///
/// // A leaky bucket stands in here for your own algorithm.
/// let rate = Rate::new(10, Duration::from_secs(1));
/// let quota = Quota::custom(CustomMeter::new("my-bucket", rate, move |headroom, _now| {
///     Box::new(LeakyBucket::new(rate, headroom))
/// }));
/// let shaper = callshaper::Shaper::builder().quota(quota).build()?;
/// # Ok::<(), callshaper::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct CustomMeter {
    name: Arc<str>,
    rate: Rate,
    make: Arc<MakeMeter>,
}

impl CustomMeter {
    /// A meter named `name`, allowing `rate` on average, built by `make`.
    pub fn new(
        name: impl Into<Arc<str>>,
        rate: Rate,
        make: impl Fn(Duration, Instant) -> Box<dyn Meter> + Send + Sync + 'static,
    ) -> Self {
        Self {
            name: name.into(),
            rate,
            make: Arc::new(make),
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rate it allows on average.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    pub(super) fn meter(&self, headroom: Duration, now: Instant) -> Box<dyn Meter> {
        (self.make)(headroom, now)
    }
}

/// Two custom meters are the same when they are built by the same maker.
impl PartialEq for CustomMeter {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.rate == other.rate && Arc::ptr_eq(&self.make, &other.make)
    }
}

impl Eq for CustomMeter {}

impl fmt::Debug for CustomMeter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CustomMeter")
            .field("name", &self.name)
            .field("rate", &self.rate)
            .finish_non_exhaustive()
    }
}
