//! A shaper declared in a file: vendors, their quotas, routes and per-key
//! levels, and how lanes behave (feature `config`).
//!
//! ```toml
//! [defaults]                 # how every lane behaves (all optional)
//! headroom = "5ms"
//! max_wait = "30s"
//! max_pause = "2m"
//!
//! [vendors.llm]
//! host = "api.llm.example"
//! quotas = [
//!   { algorithm = "leaky_bucket", count = 500, per = "1m" },
//!   { algorithm = "sliding_log", count = 90000, per = "1m", unit = "cost" },
//! ]
//!
//! [[vendors.payments.routes]]
//! method = "POST"
//! path = "/v1/payments/*"
//! quotas = [{ algorithm = "fixed_window", count = 10, per = "1m" }]
//! ```
//!
//! Each vendor is matched by `host`; a request to a host no vendor names
//! goes under `[defaults] quotas`, or, without them, ends with
//! [`Error::NoQuota`](crate::Error::NoQuota). Durations are strings such as
//! `250ms`, `1s`, `1m`, `1h30m`, `1d`. Algorithms: `leaky_bucket`,
//! `token_bucket` (with `capacity`), `fixed_window`, `sliding_log`,
//! `sliding_window`; `unit` is `requests` (default) or `cost`. Keys:
//! `origin`, `shared`, `tag`, or `{ header = "x-api-key" }`.
//!
//! Every error names the field at fault and the problem, e.g.
//! `` invalid `vendors.llm.quotas[1].per`: "1 minute" is not a duration (try "1s", "500ms", "1m") ``.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Method;
use reqwest::header::HeaderName;
use serde::Deserialize;

use crate::error::ConfigError;
use crate::meters::{Algorithm, Quota, Rate, Unit};
use crate::route::{LaneKey, Level, Route};
use crate::shaper::ShaperBuilder;
use crate::{RetryPolicy, Shaper};

/// A whole shaper, as a file declares it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShaperConfig {
    /// How every lane behaves, and the quotas of hosts no vendor names.
    #[serde(default)]
    pub defaults: Defaults,
    /// The vendors, by name.
    #[serde(default)]
    pub vendors: BTreeMap<String, VendorConfig>,
}

/// How every lane behaves.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    /// Quotas for hosts no vendor names (none: such requests are refused).
    #[serde(default)]
    pub quotas: Vec<QuotaConfig>,
    /// See [`LanePolicy::headroom`](crate::LanePolicy::headroom).
    pub headroom: Option<Dur>,
    /// See [`LanePolicy::max_wait`](crate::LanePolicy::max_wait).
    pub max_wait: Option<Dur>,
    /// See [`LanePolicy::max_pause`](crate::LanePolicy::max_pause).
    pub max_pause: Option<Dur>,
    /// See [`LanePolicy::queue_capacity`](crate::LanePolicy::queue_capacity).
    pub queue_capacity: Option<usize>,
    /// See [`LanePolicy::max_in_flight`](crate::LanePolicy::max_in_flight).
    pub max_in_flight: Option<usize>,
    /// See [`LanePolicy::idle_timeout`](crate::LanePolicy::idle_timeout).
    pub idle_timeout: Option<Dur>,
    /// Retry limits.
    pub retry: Option<RetryConfig>,
    /// With a shared store: `"open"` or `"closed"` (the default); see
    /// [`StoreFailure`](crate::StoreFailure).
    pub on_store_failure: Option<FailureConfig>,
}

/// What lanes do when the shared store fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureConfig {
    /// Serve from a local share of the quota.
    Open,
    /// Refuse with a typed error.
    Closed,
}

impl From<FailureConfig> for crate::StoreFailure {
    fn from(failure: FailureConfig) -> Self {
        match failure {
            FailureConfig::Open => Self::Open,
            FailureConfig::Closed => Self::Closed,
        }
    }
}

/// Retry limits; see [`RetryPolicy`].
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    /// Sends per failing request, the first included.
    pub max_attempts: Option<u32>,
    /// Throttled answers one request may receive.
    pub max_throttles: Option<u32>,
    /// Retry failures of POST and PATCH too.
    pub retry_non_idempotent: Option<bool>,
}

/// One vendor.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VendorConfig {
    /// Requests to this host are this vendor's.
    pub host: String,
    /// The vendor's quotas, per key (one lane per origin unless `key` says
    /// otherwise).
    pub quotas: Vec<QuotaConfig>,
    /// Where the vendor lane's key comes from (default `origin`).
    #[serde(default)]
    pub key: Option<KeyConfig>,
    /// Quotas per tenant or API key, under the vendor's.
    #[serde(default)]
    pub levels: Vec<LevelConfig>,
    /// Endpoints with quotas of their own, under the vendor's.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// This vendor's choice when the shared store fails.
    pub on_store_failure: Option<FailureConfig>,
}

/// A family of quotas, one set per key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LevelConfig {
    /// Names the level's lanes.
    pub name: String,
    /// Where the key comes from.
    pub key: KeyConfig,
    /// The quotas of each key.
    pub quotas: Vec<QuotaConfig>,
}

/// An endpoint with quotas of its own.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Names the route's lane (default: method and path).
    pub name: Option<String>,
    /// Only this method.
    pub method: Option<String>,
    /// Only paths matching this pattern (see [`Route::path`]).
    pub path: Option<String>,
    /// The route's quotas.
    pub quotas: Vec<QuotaConfig>,
    /// This endpoint's choice when the shared store fails.
    pub on_store_failure: Option<FailureConfig>,
}

/// Where a key comes from.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum KeyConfig {
    /// `origin`: scheme, host and port.
    Origin,
    /// `shared`: one for all.
    Shared,
    /// `tag`: the request's [`Tag`](crate::Tag).
    Tag,
    /// `{ header = "x-api-key" }`: a header's value.
    Header(String),
}

/// One quota.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaConfig {
    /// The algorithm.
    pub algorithm: AlgorithmName,
    /// How many per `per` (for a token bucket: the refill).
    pub count: u32,
    /// The window.
    pub per: Dur,
    /// A token bucket's burst.
    pub capacity: Option<u64>,
    /// What it counts.
    #[serde(default)]
    pub unit: UnitName,
}

/// An algorithm's name in a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum AlgorithmName {
    LeakyBucket,
    TokenBucket,
    FixedWindow,
    SlidingLog,
    SlidingWindow,
}

/// A unit's name in a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum UnitName {
    #[default]
    Requests,
    Cost,
}

/// A duration written like `250ms`, `1s`, `1m`, `1h30m`, `1d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse_duration(&text).map(Dur).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{text:?} is not a duration (try \"1s\", \"500ms\", \"1m\")"
            ))
        })
    }
}

fn parse_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let amount: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let scale = match &rest[..unit] {
            "ms" => Duration::from_millis(1),
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            "d" => Duration::from_secs(86_400),
            _ => return None,
        };
        total = total.checked_add(scale.checked_mul(u32::try_from(amount).ok()?)?)?;
        rest = &rest[unit..];
    }
    Some(total)
}

impl ShaperConfig {
    /// Read a config from TOML.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let deserializer = toml::de::Deserializer::parse(text)
            .map_err(|e| ConfigError::new("(file)", e.to_string().trim().to_owned()))?;
        serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let field = e.path().to_string();
            ConfigError::new(field, e.into_inner().message().to_owned())
        })
    }

    /// Read a config from JSON.
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
            let field = e.path().to_string();
            ConfigError::new(field, e.into_inner().to_string())
        })
    }

    /// A builder with everything the file says; add a client or transport,
    /// then build.
    pub fn builder(&self) -> Result<ShaperBuilder, ConfigError> {
        let d = &self.defaults;
        let mut builder = Shaper::builder();
        for (i, quota) in d.quotas.iter().enumerate() {
            builder = builder.quota(
                quota
                    .quota()
                    .map_err(|e| e.within(&format!("defaults.quotas[{i}]")))?,
            );
        }
        if let Some(Dur(headroom)) = d.headroom {
            builder = builder.headroom(headroom);
        }
        if let Some(Dur(max_wait)) = d.max_wait {
            builder = builder.max_wait(max_wait);
        }
        if let Some(Dur(max_pause)) = d.max_pause {
            builder = builder.max_pause(max_pause);
        }
        if let Some(capacity) = d.queue_capacity {
            builder = builder.queue_capacity(capacity);
        }
        if let Some(n) = d.max_in_flight {
            builder = builder.max_in_flight(n);
        }
        if let Some(Dur(idle)) = d.idle_timeout {
            builder = builder.idle_timeout(idle);
        }
        if let Some(failure) = d.on_store_failure {
            builder = builder.on_store_failure(failure.into());
        }
        if let Some(retry) = &d.retry {
            let defaults = RetryPolicy::default();
            builder = builder.retry(RetryPolicy {
                max_attempts: retry.max_attempts.unwrap_or(defaults.max_attempts),
                max_throttles: retry.max_throttles.unwrap_or(defaults.max_throttles),
                retry_non_idempotent: retry.retry_non_idempotent.unwrap_or(false),
                ..defaults
            });
        }
        for (name, vendor) in &self.vendors {
            for route in vendor
                .routes(name)
                .map_err(|e| e.within(&format!("vendors.{name}")))?
            {
                builder = builder.route(route);
            }
        }
        Ok(builder)
    }

    /// The shaper the file declares, with a default reqwest client.
    pub fn build(&self) -> Result<Shaper, ConfigError> {
        self.builder()?.build()
    }
}

impl VendorConfig {
    /// The vendor as routes: one per endpoint, then one for the rest of
    /// the host; each goes through the endpoint's quotas (if any), the
    /// levels, then the vendor's quotas, and nothing shaper-wide.
    fn routes(&self, name: &str) -> Result<Vec<Route>, ConfigError> {
        let quotas = quotas_of(&self.quotas)?;
        let key = match &self.key {
            Some(key) => key.key().map_err(|e| e.within("key"))?,
            None => LaneKey::Origin,
        };
        let mut levels = Vec::with_capacity(self.levels.len() + 1);
        for (i, level) in self.levels.iter().enumerate() {
            let within = |e: ConfigError| e.within(&format!("levels[{i}]"));
            let level_key = level.key.key().map_err(|e| within(e.within("key")))?;
            let level_quotas = quotas_of(&level.quotas).map_err(within)?;
            levels.push(Level::new(
                format!("{name}.{}", level.name),
                level_key,
                level_quotas,
            ));
        }
        levels.push(Level::new(name, key, quotas));

        let mut routes = Vec::with_capacity(self.routes.len() + 1);
        for (i, route) in self.routes.iter().enumerate() {
            let within = |e: ConfigError| e.within(&format!("routes[{i}]"));
            let label = route.name.clone().unwrap_or_else(|| {
                format!(
                    "{} {}",
                    route.method.as_deref().unwrap_or("*"),
                    route.path.as_deref().unwrap_or("*")
                )
            });
            let mut shaped = Route::new(format!("{name}.{label}"))
                .host(&self.host)
                .alone();
            if let Some(method) = &route.method {
                let method =
                    Method::from_bytes(method.to_ascii_uppercase().as_bytes()).map_err(|_| {
                        within(ConfigError::new(
                            "method",
                            format!("{method:?} is not an HTTP method"),
                        ))
                    })?;
                shaped = shaped.method(method);
            }
            if let Some(path) = &route.path {
                shaped = shaped.path(path);
            }
            for quota in quotas_of(&route.quotas).map_err(within)? {
                shaped = shaped.quota(quota);
            }
            if let Some(failure) = route.on_store_failure.or(self.on_store_failure) {
                shaped = shaped.on_store_failure(failure.into());
            }
            routes.push(levels.iter().cloned().fold(shaped, Route::level));
        }
        let mut rest = Route::new(name).host(&self.host).alone();
        if let Some(failure) = self.on_store_failure {
            rest = rest.on_store_failure(failure.into());
        }
        routes.push(levels.into_iter().fold(rest, Route::level));
        Ok(routes)
    }
}

fn quotas_of(configs: &[QuotaConfig]) -> Result<Vec<Quota>, ConfigError> {
    if configs.is_empty() {
        return Err(ConfigError::new("quotas", "at least one quota is needed"));
    }
    configs
        .iter()
        .enumerate()
        .map(|(i, quota)| quota.quota().map_err(|e| e.within(&format!("quotas[{i}]"))))
        .collect()
}

impl QuotaConfig {
    fn quota(&self) -> Result<Quota, ConfigError> {
        let rate = Rate::new(self.count, self.per.0);
        let algorithm = match (self.algorithm, self.capacity) {
            (AlgorithmName::TokenBucket, Some(capacity)) => Algorithm::TokenBucket {
                capacity,
                refill: rate,
            },
            (AlgorithmName::TokenBucket, None) => {
                return Err(ConfigError::new(
                    "capacity",
                    "a token bucket needs its burst capacity",
                ));
            }
            (_, Some(_)) => {
                return Err(ConfigError::new(
                    "capacity",
                    "only a token bucket has a capacity",
                ));
            }
            (AlgorithmName::LeakyBucket, None) => Algorithm::LeakyBucket(rate),
            (AlgorithmName::FixedWindow, None) => Algorithm::FixedWindow(rate),
            (AlgorithmName::SlidingLog, None) => Algorithm::SlidingLog(rate),
            (AlgorithmName::SlidingWindow, None) => Algorithm::SlidingWindow(rate),
        };
        let unit = match self.unit {
            UnitName::Requests => Unit::Requests,
            UnitName::Cost => Unit::Cost,
        };
        let quota = Quota { algorithm, unit };
        quota.validate()?;
        Ok(quota)
    }
}

impl KeyConfig {
    fn key(&self) -> Result<LaneKey, ConfigError> {
        Ok(match self {
            Self::Origin => LaneKey::Origin,
            Self::Shared => LaneKey::Shared,
            Self::Tag => LaneKey::Tag,
            Self::Header(name) => {
                LaneKey::Header(HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                    ConfigError::new("header", format!("{name:?} is not a header name"))
                })?)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_people_write_them() {
        let d = |s| parse_duration(s);
        assert_eq!(d("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(d("1m"), Some(Duration::from_secs(60)));
        assert_eq!(d("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(d("1d"), Some(Duration::from_secs(86_400)));
        for bad in ["", "1", "1 minute", "m", "1.5s", "-1s", "99999999999h"] {
            assert_eq!(d(bad), None, "{bad}");
        }
    }
}
