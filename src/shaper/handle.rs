//! The [`Shaper`] handle: its request API, and what it shares with every
//! clone (settings, the registry of lanes).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use reqwest::{IntoUrl, Method, Request, Response};

use super::builder::ShaperBuilder;
use super::call::{Failure, Options};
use super::registry::Registry;
use super::request::RequestBuilder;
use super::transport::Transport;
use crate::error::{ConfigError, Error};
use crate::lane::{LanePolicy, LaneSnapshot};
use crate::meters::Quota;
use crate::retry::RetryPolicy;
use crate::route::{Level, Route};
use crate::signals::{Dialect, WallClock};
use crate::store::{Store, StoreFailure};
use crate::sync::lock;

/// Estimates a request's cost when the caller gave none.
pub(super) type CostFn = dyn Fn(&Request) -> u64 + Send + Sync;

/// A reqwest client that can't exceed a vendor's quota.
///
/// Every request goes through the lanes of its quotas (by default one lane
/// per origin): FIFO queues released at the quotas' pace. A 429 or 503
/// pauses the lanes for as long as the vendor says; the throttled request
/// keeps its place at the head and goes again when the pause ends. Cloning
/// is cheap, and clones share lanes.
///
/// ```
/// use std::time::Duration;
/// use callshaper::Shaper;
/// use callshaper::testing::Vendor;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // A vendor that allows 10 requests per second and answers 429 beyond.
/// let vendor = Vendor::strict(10, Duration::from_secs(1)).start().await;
///
/// let shaper = Shaper::builder().rate(10, Duration::from_secs(1)).build()?;
///
/// // Ten callers at once: released one every 100 ms, never refused.
/// let started = std::time::Instant::now();
/// let calls: Vec<_> = (0..10)
///     .map(|i| tokio::spawn(shaper.get(format!("{}/items/{i}", vendor.uri())).send()))
///     .collect();
/// for call in calls {
///     assert_eq!(call.await??.status(), 200);
/// }
/// assert!(started.elapsed() >= Duration::from_millis(900));
/// assert_eq!(vendor.throttled(), 0);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Shaper {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) client: reqwest::Client,
    pub(super) transport: Arc<dyn Transport>,
    pub(super) wall: Arc<dyn WallClock>,
    /// How every lane behaves (its quotas come from the levels).
    pub(super) policy: LanePolicy,
    pub(super) retry: RetryPolicy,
    pub(super) routes: Vec<Route>,
    /// The shaper-wide levels, the vendor's last.
    pub(super) levels: Vec<Level>,
    pub(super) cost: Option<Arc<CostFn>>,
    pub(super) dialects: Vec<Arc<dyn Dialect>>,
    pub(super) registry: Registry,
    pub(super) shut: AtomicBool,
    /// Where the gates' quotas live when a fleet shares them.
    pub(super) store: Option<Store>,
    pub(super) store_failure: StoreFailure,
    /// Series labelled by lane too (`ShaperBuilder::metrics_per_lane`).
    pub(super) metrics_per_lane: bool,
}

impl Shaper {
    /// Start configuring a shaper; a quota ([`ShaperBuilder::rate`] or
    /// [`ShaperBuilder::quota`]) is the one setting without a default.
    pub fn builder() -> ShaperBuilder {
        ShaperBuilder::default()
    }

    /// Start a request; `send` queues it on its lanes.
    pub fn request<U: IntoUrl>(&self, method: Method, url: U) -> RequestBuilder {
        RequestBuilder {
            shaper: self.clone(),
            inner: self.inner.client.request(method, url),
            options: Options::default(),
        }
    }

    /// Start a GET request.
    pub fn get<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::GET, url)
    }

    /// Start a POST request.
    pub fn post<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::POST, url)
    }

    /// Start a PUT request.
    pub fn put<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::PUT, url)
    }

    /// Start a PATCH request.
    pub fn patch<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::PATCH, url)
    }

    /// Start a DELETE request.
    pub fn delete<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::DELETE, url)
    }

    /// Start a HEAD request.
    pub fn head<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::HEAD, url)
    }

    /// Send `request` through its lanes and return the vendor's response,
    /// or the reason there is none.
    pub async fn execute(&self, request: Request) -> Result<Response, Error> {
        self.execute_with(request, Options::default()).await
    }

    pub(super) async fn execute_with(
        &self,
        request: Request,
        options: Options,
    ) -> Result<Response, Error> {
        let transport = self.inner.transport.clone();
        self.drive(request, options, |r| transport.send(r))
            .await
            .map_err(|failure| match failure {
                Failure::Shaper(error) => error,
                Failure::Send { attempts, source } => Error::Transport { attempts, source },
            })
    }

    /// Change the vendor level's quotas (those of
    /// [`ShaperBuilder::rate`] and [`ShaperBuilder::quota`]) while the
    /// shaper runs: see [`set_level_quotas`](Self::set_level_quotas).
    pub fn set_quotas(&self, quotas: impl IntoIterator<Item = Quota>) -> Result<(), ConfigError> {
        self.requote("", quotas.into_iter().collect())
    }

    /// Change the quotas of the level named `level` (every level of that
    /// name, shaper-wide and in routes; a config file's vendor is a level
    /// named after it) while the shaper runs.
    ///
    /// Nothing is lost: queued requests keep their places, a pause and a
    /// quota learned from the vendor stay, and the next release follows
    /// the new quotas. A quota that did not change keeps its meter; a new
    /// one counting requests starts from the lane's own recent releases
    /// (so neither a burst nor a gap follows the change), and a new one
    /// counting cost starts from now. Checked like the builder's, with a
    /// [`ConfigError`] naming the field. In memory only: with a shared
    /// store, every instance must change at once, so it is refused; a new
    /// level, route or vendor, or another policy setting, needs a new
    /// shaper. `ShaperConfig::reload` (feature `config`) applies a config
    /// file's new quotas the same way (a bad file changes nothing).
    ///
    /// `tests/reconfigure.rs` changes quotas under load: raised from 10/s
    /// to 20/s at 2 s, 100 queued requests drain at the new pace from the
    /// next release in order with no 429; lowered during a vendor pause,
    /// the pause holds; a leaky bucket replaced by a sliding log counts the
    /// releases before it (without that, 10 × 429).
    ///
    /// ```
    /// use std::time::Duration;
    /// use callshaper::{Quota, Shaper};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), callshaper::ConfigError> {
    /// let shaper = Shaper::builder().rate(10, Duration::from_secs(1)).build()?;
    /// // The vendor raised the plan to 20 per second.
    /// shaper.set_quotas([Quota::leaky_bucket(20, Duration::from_secs(1))])?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_level_quotas(
        &self,
        level: &str,
        quotas: impl IntoIterator<Item = Quota>,
    ) -> Result<(), ConfigError> {
        self.requote(level, quotas.into_iter().collect())
    }

    /// The retry rules every request follows.
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.inner.retry
    }

    /// What the lane `key` is doing, if it exists. Lanes of the default
    /// level are named by their key (the origin); others `level/key`.
    pub fn lane(&self, key: &str) -> Option<LaneSnapshot> {
        lock(&self.inner.registry.lanes)
            .get(key)
            .map(|lane| lane.snapshot())
    }

    /// Every live lane.
    pub fn lanes(&self) -> Vec<LaneSnapshot> {
        lock(&self.inner.registry.lanes)
            .values()
            .map(|lane| lane.snapshot())
            .collect()
    }

    /// Stop: requests that have not been released end with
    /// [`Error::Shutdown`], and so does every later one. Requests already on
    /// the wire finish.
    pub fn shutdown(&self) {
        self.inner.shut.store(true, Ordering::Release);
        for (_, lane) in lock(&self.inner.registry.lanes).drain() {
            lane.close();
        }
    }
}

impl fmt::Debug for Shaper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shaper")
            .field("levels", &self.inner.levels)
            .field("routes", &self.inner.routes)
            .field("retry", &self.inner.retry)
            .field("lanes", &lock(&self.inner.registry.lanes).len())
            .finish_non_exhaustive()
    }
}
