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
//! Each vendor is matched by `host`, or by the host (and port) of its
//! `upstream = "https://api.vendor.example/v1"`, the base URL
//! `callshaper-proxy` serves it at; a request to a host no vendor names
//! goes under `[defaults] quotas`, or, without them, ends with
//! [`Error::NoQuota`](crate::Error::NoQuota). Durations are strings such as
//! `250ms`, `1.5s`, `1m`, `1 minute`, `1h30m`, `1d`. Algorithms:
//! `leaky_bucket`, `token_bucket` (with `capacity`), `fixed_window`,
//! `sliding_log`, `sliding_window`; `unit` is `requests` (default) or
//! `cost`. Keys: `origin`, `shared`, `tag`, or `{ header = "x-api-key" }`.
//! An LLM vendor's `tokens = "openai"` (or `"anthropic"`) costs each
//! request in tokens from its body and settles it from the answer's usage
//! ([`TokenCost`]).
//!
//! A `[store]` table ([`StoreConfig`]) shares the quotas through Redis
//! with every process built from the same file: such a file is built with
//! [`ShaperConfig::connect`], which connects first. A `[proxy]` table
//! ([`ProxyConfig`]) is `callshaper-proxy`'s, and a library shaper ignores
//! it, so one file serves both. A `[client]` table ([`ClientConfig`])
//! gives the client the shaper sends through its timeouts, for the proxy
//! and a library shaper alike.
//!
//! The file is read into the crate's own types ([`Quota`], [`RetryPolicy`],
//! [`Backoff`], [`Adaptive`], [`StoreFailure`], [`LaneKey`]), which are
//! serde types with the `serde` feature: what a file can say is what the
//! builder can, and the two cannot drift apart.
//!
//! Every error names the field at fault and the problem, e.g.
//! `` invalid `vendors.llm.quotas[1].per`: "soon" is not a duration (try "1s", "1.5s", "500ms", "1min") ``.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Method;
use serde::Deserialize;

pub use self::client::ClientConfig;
pub use self::proxy::ProxyConfig;
pub use self::store::StoreConfig;

use crate::Shaper;
use crate::adaptive::Adaptive;
use crate::answers::Answers;
use crate::error::ConfigError;
use crate::lane::LanePolicy;
use crate::meters::Quota;
use crate::retry::{Backoff, RetryPolicy};
use crate::route::{LaneKey, Level, Route, host_name, upstream_base};
use crate::shaper::{RequestOptions, ShaperBuilder};
use crate::store::StoreFailure;
use crate::time::human;
use crate::tokens::TokenCost;

mod client;
mod proxy;
mod store;

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
    /// The store a fleet shares its quotas through; without it, each
    /// process keeps its own.
    pub store: Option<StoreConfig>,
    /// `callshaper-proxy`'s own settings (a library shaper ignores them).
    pub proxy: Option<ProxyConfig>,
    /// The timeouts of the client the shaper sends through.
    pub client: Option<ClientConfig>,
}

/// How every lane behaves: each field is optional and, when given, does
/// what the [`ShaperBuilder`] method of the same name does.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    /// Quotas for hosts no vendor names (none: such requests are refused).
    #[serde(default)]
    pub quotas: Vec<Quota>,
    /// See [`LanePolicy::headroom`](crate::lane::LanePolicy::headroom).
    #[serde(default, with = "human::option")]
    pub headroom: Option<Duration>,
    /// See [`LanePolicy::max_wait`](crate::lane::LanePolicy::max_wait).
    #[serde(default, with = "human::option")]
    pub max_wait: Option<Duration>,
    /// See [`LanePolicy::max_pause`](crate::lane::LanePolicy::max_pause).
    #[serde(default, with = "human::option")]
    pub max_pause: Option<Duration>,
    /// See [`LanePolicy::queue_capacity`](crate::lane::LanePolicy::queue_capacity).
    pub queue_capacity: Option<usize>,
    /// See [`LanePolicy::max_in_flight`](crate::lane::LanePolicy::max_in_flight).
    pub max_in_flight: Option<usize>,
    /// See [`LanePolicy::idle_timeout`](crate::lane::LanePolicy::idle_timeout).
    #[serde(default, with = "human::option")]
    pub idle_timeout: Option<Duration>,
    /// The pause after a throttle that says nothing usable, e.g.
    /// `{ base = "1s", cap = "1m" }`; see
    /// [`LanePolicy::fallback`](crate::lane::LanePolicy::fallback).
    pub fallback_pause: Option<Backoff>,
    /// Adaptive pacing: `{}` for the defaults, or e.g. `{ decrease = 0.5 }`;
    /// see [`LanePolicy::adaptive`](crate::lane::LanePolicy::adaptive).
    pub adaptive: Option<Adaptive>,
    /// See [`LanePolicy::batch_share`](crate::lane::LanePolicy::batch_share).
    pub batch_share: Option<u32>,
    /// What answers mean, e.g. `{ throttles = [429, 420] }`; see
    /// [`Answers`].
    pub answers: Option<Answers>,
    /// How requests cost tokens, `"openai"` or `"anthropic"`, or e.g.
    /// `{ style = "openai", default_output = 1024 }`; see [`TokenCost`].
    pub tokens: Option<TokenCost>,
    /// Retry limits, backoff and budget; fields left out keep
    /// [`RetryPolicy`]'s defaults.
    pub retry: Option<RetryPolicy>,
    /// With a shared store: `"open"` or `"closed"` (the default); see
    /// [`StoreFailure`].
    pub on_store_failure: Option<StoreFailure>,
    /// See [`ShaperBuilder::metrics_per_lane`].
    #[serde(default)]
    pub metrics_per_lane: bool,
    /// See [`ShaperBuilder::max_lanes`].
    pub max_lanes: Option<usize>,
    /// The most redirects a request follows, each hop through its lane;
    /// see [`ShaperBuilder::redirects`].
    pub redirects: Option<u32>,
}

/// One vendor.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VendorConfig {
    /// Requests to this host (`name` or `name:port`, in any case) are
    /// this vendor's; a URL or a path here is an error naming the field.
    pub host: Option<String>,
    /// The vendor's base URL, in place of `host`: requests to its host
    /// (and port) are this vendor's, and `callshaper-proxy` serves it at
    /// `/NAME/`.
    pub upstream: Option<String>,
    /// The vendor's quotas, per key (one lane per origin unless `key` says
    /// otherwise).
    pub quotas: Vec<Quota>,
    /// Where the vendor lane's key comes from (default `origin`).
    #[serde(default)]
    pub key: Option<LaneKey>,
    /// Quotas per tenant or API key, under the vendor's.
    #[serde(default)]
    pub levels: Vec<LevelConfig>,
    /// Endpoints with quotas of their own, under the vendor's.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// This vendor's choice when the shared store fails.
    pub on_store_failure: Option<StoreFailure>,
    /// What this vendor's answers mean, instead of `[defaults] answers`.
    pub answers: Option<Answers>,
    /// How this vendor's requests cost tokens, instead of `[defaults]
    /// tokens`: `"openai"`, `"anthropic"`, or a table (see [`TokenCost`]).
    pub tokens: Option<TokenCost>,
    /// What `callshaper-proxy` gives this vendor's requests for the
    /// `x-callshaper-*` headers their clients did not send, e.g.
    /// `{ max_wait = "10m", priority = "batch" }` (needs `upstream`). A
    /// `cost` past what the vendor's quotas take of one request is an
    /// error: every request given it would be refused.
    pub proxy: Option<RequestOptions>,
}

/// A family of quotas, one set per key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LevelConfig {
    /// Names the level's lanes.
    pub name: String,
    /// Where the key comes from.
    pub key: LaneKey,
    /// The quotas of each key.
    pub quotas: Vec<Quota>,
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
    pub quotas: Vec<Quota>,
    /// This endpoint's choice when the shared store fails.
    pub on_store_failure: Option<StoreFailure>,
}

impl ShaperConfig {
    /// Read a config from TOML.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let deserializer = toml::de::Deserializer::parse(text)
            .map_err(|e| ConfigError::new("(file)", e.to_string().trim().to_owned()))?;
        serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let field = e.path().to_string();
            ConfigError::at(&field, e.into_inner().message())
        })
    }

    /// Read a config from JSON.
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
            let field = e.path().to_string();
            ConfigError::at(&field, &e.into_inner().to_string())
        })
    }

    /// A builder with everything the file says; add a client or transport,
    /// then build. A file that declares quotas is checked here, its errors
    /// named by its fields; one without is settings for the quotas its
    /// caller adds, checked with them when built. A file with a `[store]` needs [`connect`](Self::connect)
    /// instead: it is an error here, since a fleet member that quietly
    /// kept its own quotas would spend the fleet's N times over.
    pub fn builder(&self) -> Result<ShaperBuilder, ConfigError> {
        if self.store.is_some() {
            return Err(ConfigError::new(
                "store",
                "a file with a `[store]` is built with `ShaperConfig::connect`, which connects it first",
            ));
        }
        self.local_builder()
    }

    /// [`builder`](Self::builder) with the file's `[store]` connected (or
    /// without a store, the same builder): a store that cannot be reached
    /// now fails here, naming the field. Connecting needs the `redis`
    /// feature.
    pub async fn connect(&self) -> Result<ShaperBuilder, ConfigError> {
        let builder = self.local_builder()?;
        let Some(store) = &self.store else {
            return Ok(builder);
        };
        #[cfg(feature = "redis")]
        return Ok(builder.store(store.connect().await?));
        #[cfg(not(feature = "redis"))]
        {
            store.check()?;
            Err(ConfigError::new(
                "store",
                "a shared store needs callshaper's `redis` feature",
            ))
        }
    }

    /// Everything but the store.
    fn local_builder(&self) -> Result<ShaperBuilder, ConfigError> {
        let d = &self.defaults;
        let mut builder = Shaper::builder()
            .policy(d.policy())
            .metrics_per_lane(d.metrics_per_lane);
        for quota in &d.quotas {
            builder = builder.quota(quota.clone());
        }
        if let Some(n) = d.max_lanes {
            builder = builder.max_lanes(n);
        }
        if let Some(hops) = d.redirects {
            builder = builder.redirects(hops);
        }
        if let Some(failure) = d.on_store_failure {
            builder = builder.on_store_failure(failure);
        }
        if let Some(retry) = &d.retry {
            builder = builder.retry(retry.clone());
        }
        if let Some(client) = &self.client {
            builder = builder.file_client(client.client()?);
        }
        for (name, vendor) in &self.vendors {
            for route in vendor
                .routes(name)
                .map_err(|e| e.within(&format!("vendors.{name}")))?
            {
                builder = builder.route(route);
            }
        }
        // A file that declares quotas is a shaper, checked now and named
        // by its fields; one that declares none is settings for quotas its
        // caller adds (a meter of their own, which no file can hold), and
        // the build checks them together.
        if !d.quotas.is_empty() || !self.vendors.is_empty() {
            builder.check().map_err(in_file)?;
        }
        Ok(builder)
    }

    /// The shaper the file declares, with a default reqwest client.
    pub fn build(&self) -> Result<Shaper, ConfigError> {
        self.builder()?.build()
    }

    /// Apply the file's quotas to `shaper`, a shaper built from an earlier
    /// version of it, while it runs (see [`Shaper::set_level_quotas`]):
    /// queues, pauses and learned quotas stay. Every quota is checked
    /// first, so a bad file changes nothing. Quotas only: a new vendor,
    /// level or route, or another `[defaults]` setting, needs a new
    /// shaper, and a vendor or level the file no longer names keeps its
    /// quotas.
    pub fn reload(&self, shaper: &Shaper) -> Result<(), ConfigError> {
        // Each level's new quotas, and where the file holds them: the
        // running shaper names its levels, a refusal names the file's path.
        let mut changes: Vec<(String, Vec<Quota>, String)> = Vec::new();
        if !self.defaults.quotas.is_empty() {
            changes.push((
                String::new(),
                self.defaults.quotas.clone(),
                "defaults".into(),
            ));
        }
        for (name, vendor) in &self.vendors {
            let path = format!("vendors.{name}");
            let routes = vendor.routes(name).map_err(|e| e.within(&path))?;
            // A vendor's own levels are in each of its routes: once each.
            for level in routes.into_iter().flat_map(|route| route.levels) {
                if changes.iter().any(|(seen, ..)| *seen == level.name) {
                    continue;
                }
                let at = (vendor.levels.iter())
                    .position(|own| level.name == format!("{name}.{}", own.name));
                let path = at.map_or_else(|| path.clone(), |i| format!("{path}.levels[{i}]"));
                changes.push((level.name, level.quotas, path));
            }
        }
        for (level, quotas, path) in &changes {
            shaper
                .registry()
                .check_quotas(level, quotas)
                .map_err(|error| in_reload(error, level, path))?;
        }
        for (level, quotas, _) in changes {
            shaper.registry().apply_quotas(&level, quotas);
        }
        Ok(())
    }
}

impl Defaults {
    /// The lane policy: the defaults, with what the file says over them.
    fn policy(&self) -> LanePolicy {
        let mut policy = LanePolicy::default();
        // Exhaustive on purpose: a new `LanePolicy` field does not compile
        // here until the file format has it too.
        let LanePolicy {
            headroom,
            queue_capacity,
            max_wait,
            max_in_flight,
            max_pause,
            fallback,
            idle_timeout,
            adaptive,
            batch_share,
            answers,
            tokens,
        } = &mut policy;
        *headroom = self.headroom.unwrap_or(*headroom);
        *queue_capacity = self.queue_capacity.unwrap_or(*queue_capacity);
        *max_wait = self.max_wait.or(*max_wait);
        *max_in_flight = self.max_in_flight.or(*max_in_flight);
        *max_pause = self.max_pause.unwrap_or(*max_pause);
        *fallback = self.fallback_pause.unwrap_or(*fallback);
        *idle_timeout = self.idle_timeout.unwrap_or(*idle_timeout);
        *adaptive = self.adaptive.or(*adaptive);
        *batch_share = self.batch_share.unwrap_or(*batch_share);
        if let Some(read) = &self.answers {
            answers.clone_from(read);
        }
        *tokens = self.tokens.or(*tokens);
        policy
    }
}

impl VendorConfig {
    /// The vendor as routes: one per endpoint, then one for the rest of
    /// the host; each goes through the endpoint's quotas (if any), the
    /// levels, then the vendor's quotas, and nothing shaper-wide.
    fn routes(&self, name: &str) -> Result<Vec<Route>, ConfigError> {
        let host = self.host()?;
        if self.proxy.is_some() && self.upstream.is_none() {
            return Err(ConfigError::new(
                "proxy",
                "the proxy's defaults for a vendor it serves: give the vendor an `upstream`",
            ));
        }
        let quotas = quotas_of(&self.quotas)?;
        if let Some(answers) = &self.answers {
            answers.validate()?;
        }
        let key = self.key.clone().unwrap_or(LaneKey::Origin);
        let mut levels = Vec::with_capacity(self.levels.len() + 1);
        for (i, level) in self.levels.iter().enumerate() {
            let level_quotas =
                quotas_of(&level.quotas).map_err(|e| e.within(&format!("levels[{i}]")))?;
            levels.push(Level::new(
                format!("{name}.{}", level.name),
                level.key.clone(),
                level_quotas,
            ));
        }
        levels.push(Level::new(name, key, quotas));
        // Every request of the vendor goes through these levels: a default
        // cost past what one of them takes would end each request it is
        // given, at once.
        if let Some(cost) = self.proxy.as_ref().and_then(|options| options.cost)
            && let Some(most) = levels.iter().map(Level::largest_cost).min()
            && cost > most
        {
            return Err(ConfigError::new(
                "proxy.cost",
                format!("{cost} is more than the vendor's quotas take of one request, {most}"),
            ));
        }

        let mut routes: Vec<Route> = Vec::with_capacity(self.routes.len() + 1);
        for (i, route) in self.routes.iter().enumerate() {
            let within = |e: ConfigError| e.within(&format!("routes[{i}]"));
            let label = route.name.clone().unwrap_or_else(|| {
                format!(
                    "{} {}",
                    route.method.as_deref().unwrap_or("*"),
                    route.path.as_deref().unwrap_or("*")
                )
            });
            // One route per name, as the builder refuses two of one name;
            // refused here first, so the error names the file's field.
            let full = format!("{name}.{label}");
            if let Some(at) = routes.iter().position(|other| other.name == full) {
                return Err(within(ConfigError::new(
                    "name",
                    format!("{label:?} names routes[{at}] too: give each route a name of its own"),
                )));
            }
            let mut shaped = Route::new(full).host(&host).alone();
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
                shaped.check().map_err(within)?;
            }
            for quota in quotas_of(&route.quotas).map_err(within)? {
                shaped = shaped.quota(quota);
            }
            if let Some(failure) = route.on_store_failure.or(self.on_store_failure) {
                shaped = shaped.on_store_failure(failure);
            }
            if let Some(answers) = &self.answers {
                shaped = shaped.answers(answers.clone());
            }
            if let Some(tokens) = self.tokens {
                shaped = shaped.tokens(tokens);
            }
            routes.push(levels.iter().cloned().fold(shaped, Route::level));
        }
        let mut rest = Route::new(name).host(&host).alone();
        if let Some(failure) = self.on_store_failure {
            rest = rest.on_store_failure(failure);
        }
        if let Some(answers) = &self.answers {
            rest = rest.answers(answers.clone());
        }
        if let Some(tokens) = self.tokens {
            rest = rest.tokens(tokens);
        }
        routes.push(levels.into_iter().fold(rest, Route::level));
        Ok(routes)
    }

    /// The host its requests go to: `host`, or `upstream`'s host and
    /// explicit port.
    fn host(&self) -> Result<String, ConfigError> {
        match (&self.host, &self.upstream) {
            (Some(host), None) => {
                host_name(host).map_err(|problem| ConfigError::new("host", problem))
            }
            (None, Some(upstream)) => {
                let url = upstream_base(upstream).map_err(|e| ConfigError::new("upstream", e))?;
                // `upstream_base` keeps only URLs with a host.
                let host = url.host_str().unwrap_or_default();
                Ok(match url.port() {
                    Some(port) => format!("{host}:{port}"),
                    None => host.to_owned(),
                })
            }
            (Some(_), Some(_)) => Err(ConfigError::new(
                "upstream",
                "give `host` or `upstream`, not both: `upstream` names the host",
            )),
            (None, None) => Err(ConfigError::new(
                "host",
                "a vendor needs `host = \"api.vendor.example\"` or `upstream = \"https://…\"`",
            )),
        }
    }
}

/// `[defaults]`'s fields, as [`in_file`] names them (a test holds the
/// list to `Defaults`).
const DEFAULTS: [&str; 17] = [
    "quotas",
    "headroom",
    "max_wait",
    "max_pause",
    "queue_capacity",
    "max_in_flight",
    "idle_timeout",
    "fallback_pause",
    "adaptive",
    "batch_share",
    "answers",
    "tokens",
    "retry",
    "on_store_failure",
    "metrics_per_lane",
    "max_lanes",
    "redirects",
];

/// A builder's error about a `[defaults]` setting, named as the file
/// spells it (`defaults.retry.budget.ratio`, where the builder's method is
/// `retry_budget`): the builder names its methods. One about a vendor's
/// level or route keeps the builder's name, which names the level.
fn in_file(error: ConfigError) -> ConfigError {
    /// The builder's name, and the file's, where they differ.
    const RENAMED: [(&str, &str); 5] = [
        ("max_attempts", "retry.max_attempts"),
        ("max_throttles", "retry.max_throttles"),
        ("retry_budget", "retry.budget"),
        ("fallback", "fallback_pause"),
        ("rate", "quotas"),
    ];
    let at = error.field.find(['.', '[']).unwrap_or(error.field.len());
    let (head, rest) = error.field.split_at(at);
    let head = match RENAMED.iter().find(|(builder, _)| *builder == head) {
        Some((_, file)) => file,
        None if DEFAULTS.contains(&head) => head,
        None => return error,
    };
    ConfigError::new(format!("defaults.{head}{rest}"), &error.problem)
}

/// A refusal of the running shaper's, named by its level `level`
/// (`levels.llm.chat.quotas[0]`), named by `path`, where the file holds
/// that level (`vendors.llm.levels[0].quotas[0]`).
fn in_reload(error: ConfigError, level: &str, path: &str) -> ConfigError {
    let named = format!("levels.{}", if level.is_empty() { "vendor" } else { level });
    let field = match error.field.strip_prefix(&named) {
        Some(rest) if rest.is_empty() || rest.starts_with(['.', '[']) => format!("{path}{rest}"),
        _ => return error,
    };
    ConfigError::new(field, &error.problem)
}

/// A level's quotas: at least one (each was checked as it was read).
fn quotas_of(quotas: &[Quota]) -> Result<Vec<Quota>, ConfigError> {
    if quotas.is_empty() {
        return Err(ConfigError::new("quotas", "at least one quota is needed"));
    }
    Ok(quotas.to_vec())
}

#[cfg(test)]
mod tests {
    /// Every `[defaults]` field is one `in_file` knows: serde lists them
    /// all when it meets one it does not know.
    #[test]
    fn in_file_knows_every_defaults_field() {
        let error = super::ShaperConfig::from_toml("[defaults]\nnone_such = 1").unwrap_err();
        // "unknown field `none_such`, expected one of `quotas`, ..."
        let fields: Vec<&str> = error.problem.split('`').skip(3).step_by(2).collect();
        assert_eq!(fields.len(), super::DEFAULTS.len(), "{error}");
        for field in fields {
            assert!(super::DEFAULTS.contains(&field), "{field}");
        }
    }
}
