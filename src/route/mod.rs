//! Which lanes a request goes through: keys, levels and routes.
//!
//! A **level** is a family of quotas, one set per key: per origin (the
//! vendor's), per API key, per tenant. A **route** picks requests by method,
//! host and path (`POST /v1/payments`) and gives them levels of their own,
//! ahead of the shaper-wide ones; the vendor's level comes last.
//!
//! A request waits in exactly one lane: the lane of its most specific key
//! (its tenant, its route), whose own gate holds that level's quotas, and
//! which shares the gates of the broader levels (the vendor's) with every
//! other lane under them (see `gate`). It is released when all of them
//! allow it at once, so every level's quota holds at the moment it leaves.
//!
//! # Fairness between tenants
//!
//! Each tenant has its own lane and FIFO queue. When a shared quota frees a
//! slot, every lane waiting for it wakes at that instant and the first to
//! run takes it; tokio runs woken tasks in order, so waiting lanes take
//! turns. A tenant's flood therefore never queues another tenant behind it:
//! each active tenant gets at least its cap, or, when the caps add up to
//! more than the shared quota, roughly an equal share of it.
//!
//! # Several quotas, costs, keys and routes
//!
//! ```
//! # use std::time::Duration;
//! # use callshaper::{Quota, Shaper};
//! # use callshaper::lane::Priority;
//! # use callshaper::route::{LaneKey, Level, Route};
//! # use callshaper::shaper::Settle;
//! # use reqwest::Method;
//! # async fn demo(url: &str) -> Result<(), Box<dyn std::error::Error>> {
//! let minute = Duration::from_secs(60);
//! let shaper = Shaper::builder()
//!     .quota(Quota::leaky_bucket(500, minute))                  // 500 requests a minute
//!     .quota(Quota::sliding_log(90_000, minute).per_cost())     // and 90,000 tokens a minute
//!     .level(Level::new("tenant", LaneKey::Tag, [Quota::leaky_bucket(60, minute)]))  // each tenant 60/min
//!     .route(Route::new("payments").method(Method::POST).path("/v1/payments/*").rate(10, minute))
//!     .build()?;
//! let response = shaper.post(url).cost(1_200).tag("acme").priority(Priority::Batch).send().await?;
//! response.extensions().get::<Settle>().map(|s| s.report(800));   // the real token count
//! # Ok(())
//! # }
//! ```
//!
//! - **Several quotas per lane** are checked together: a request goes when all
//!   allow it, and none is charged unless all are.
//! - **Costs** (tokens) come from `.cost(n)`, a `Cost` extension or a
//!   `.cost(|req| ..)` estimate; a cost no quota can ever hold is refused at
//!   once (`CostTooHigh`); `Settle::report` corrects the estimate up or down.
//! - **Keys and levels**: the vendor's lanes are per origin (or `.vendor_key`:
//!   a header, the request's tag, a function); `Level`s add quotas per tenant
//!   or API key; `Route`s add quotas per method and path. A request waits in
//!   one lane and goes when every level's quota allows it at once, so each
//!   level holds at the moment it leaves. Lanes under one vendor share its
//!   quota and its pause.
//! - **Fairness between tenants**: each tenant has its own FIFO lane; a shared
//!   quota's next slot goes to the lane that has waited longest, so a flood
//!   never queues another tenant behind it (tested: with caps, the other
//!   tenant finishes at its own cap's pace; without, busy tenants alternate).
//! - **Priorities**: interactive before batch, FIFO within each; when both
//!   wait, one release in five goes to batch, so batch never starves.
//! - **Idle lanes are dropped** (`idle_timeout`, 60 s) by one sweeper per
//!   shaper, and never one whose state still matters (someone waiting, a
//!   pause, quota spent): a lane nobody waits in runs no task and weighs
//!   under 700 B resident (480 B at a million tenants after one request,
//!   627 B after eleven, `benches/tenants`); 100,000
//!   keys touched once come back to within a few pages after eviction
//!   (`tests/memory.rs`). `max_lanes(n)` caps them: past it the quietest
//!   idle lane makes room, or the request ends with `LaneLimit`.
//! - **Config file** (feature `config`): `ShaperConfig::from_toml` /
//!   `from_json`, see `examples/vendors.toml` and
//!   `cargo run --example from_config`. The file reads into the crate's own
//!   types, so every builder setting has a key (`[defaults]`: `headroom`,
//!   `max_wait`, `max_pause`, `queue_capacity`, `max_in_flight`,
//!   `idle_timeout`, `fallback_pause`, `adaptive`, `batch_share`, `retry`,
//!   `on_store_failure`). Durations read as people write them: `250ms`,
//!   `1.5s`, `1min`, `1 minute`, `1h30m`. Errors name the field, e.g.
//!   `` invalid `vendors.llm.quotas[1].per`: "soon" is not a duration (try "1s", "1.5s", "500ms", "1min") ``.
//!
//! | file | what it owns |
//! |---|---|
//! | `mod.rs` | [`Level`] and [`Route`]: what a shaper is built of |
//! | `key.rs` | [`LaneKey`], [`Tag`], [`Cost`]: a request's key in a level, as its lane's name holds it (`write_free`) |
//! | `matching.rs` | which requests a route matches: hosts and paths in every spelling a vendor reads alike |

mod key;
mod matching;
#[cfg(test)]
mod tests;

use reqwest::{Method, Request};

pub(crate) use self::key::write_free;
pub use self::key::{Cost, KeyFn, LaneKey, Tag};
pub(crate) use self::matching::host_name;
#[cfg(any(feature = "config", feature = "proxy"))]
pub(crate) use self::matching::upstream_base;
use self::matching::{host_matches, path_matches, path_pattern};
use crate::answers::Answers;
use crate::error::ConfigError;
use crate::meters::Quota;
use crate::store::StoreFailure;

/// A family of quotas, one set per key: per tenant, per API key.
#[derive(Debug, Clone)]
pub struct Level {
    pub(crate) name: String,
    pub(crate) key: LaneKey,
    pub(crate) quotas: Vec<Quota>,
}

impl Level {
    /// The largest cost one request may have at this level: a cost past
    /// it is refused at once (`Error::CostTooHigh`).
    #[cfg(any(feature = "config", feature = "proxy"))]
    pub(crate) fn largest_cost(&self) -> u64 {
        crate::meters::largest_cost(&self.quotas)
    }

    /// Quotas named `name/<key>`, one set per key.
    pub fn new(
        name: impl Into<String>,
        key: LaneKey,
        quotas: impl IntoIterator<Item = Quota>,
    ) -> Self {
        Self {
            name: name.into(),
            key,
            quotas: quotas.into_iter().collect(),
        }
    }

    /// The key of `request` in this level, as the shaper names quotas,
    /// written at the end of `out`.
    pub(crate) fn write_lane_name(&self, request: &Request, tag: Option<&Tag>, out: &mut String) {
        if !self.name.is_empty() {
            write_free(&self.name, out);
            out.push('/');
        }
        self.key.write(request, tag, out);
    }
}

/// Requests picked by method, host and path, with quotas of their own on
/// top of the shaper's.
///
/// ```
/// use std::time::Duration;
/// use callshaper::route::Route;
/// // 10 payments a minute; everything else only under the shaper's rate.
/// let payments = Route::new("payments")
///     .method(reqwest::Method::POST)
///     .path("/v1/payments/*")
///     .rate(10, Duration::from_secs(60));
/// ```
#[derive(Debug, Clone)]
pub struct Route {
    pub(crate) name: String,
    method: Option<Method>,
    /// As a request's URL spells it, or why what was given is not a host.
    host: Option<Result<String, String>>,
    /// Its segments as a request's URL spells them, or why what was given
    /// is not a path.
    path: Option<Result<Vec<String>, String>>,
    pub(crate) levels: Vec<Level>,
    pub(crate) alone: bool,
    pub(crate) store_failure: Option<StoreFailure>,
    pub(crate) answers: Option<Answers>,
    #[cfg(feature = "tokens")]
    pub(crate) tokens: Option<crate::tokens::TokenCost>,
}

impl Route {
    /// A route matching every request, with no levels yet.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            method: None,
            host: None,
            path: None,
            levels: Vec::new(),
            alone: false,
            store_failure: None,
            answers: None,
            #[cfg(feature = "tokens")]
            tokens: None,
        }
    }

    /// The route's levels are all its requests go through: the shaper-wide
    /// ones (the default vendor's) are skipped. For a vendor of its own,
    /// whose last level is its quota.
    pub fn alone(mut self) -> Self {
        self.alone = true;
        self
    }

    /// What this route's lanes do when the shared store fails, instead of
    /// the shaper's choice (e.g. fail-open for checkout, fail-closed for a
    /// vendor that bans keys).
    pub fn on_store_failure(mut self, failure: StoreFailure) -> Self {
        self.store_failure = Some(failure);
        self
    }

    /// What this route's answers mean, instead of the shaper's (see
    /// [`Answers`]): for a vendor that throttles or fails in its own way.
    /// A route's lanes are its own (under the same gates): where another
    /// route, or the shaper, goes through levels of the same names, its
    /// lanes' names begin with its name, so its settings never reach
    /// other requests.
    pub fn answers(mut self, answers: Answers) -> Self {
        self.answers = Some(answers);
        self
    }

    /// How this route's requests cost tokens, instead of the shaper's
    /// choice (see [`TokenCost`](crate::tokens::TokenCost); feature
    /// `tokens`): an LLM vendor's requests are estimated from their body
    /// and settled from the usage their answers report.
    #[cfg(feature = "tokens")]
    pub fn tokens(mut self, tokens: crate::tokens::TokenCost) -> Self {
        self.tokens = Some(tokens);
        self
    }

    /// Only requests with this method.
    pub fn method(mut self, method: Method) -> Self {
        self.method = Some(method);
        self
    }

    /// Only requests to this host (`api.example.com`), or to this host and
    /// port (`127.0.0.1:8080`), matched as a URL spells its host: in any
    /// case (`API.Example.com` is `api.example.com`), a name in Unicode by
    /// its ASCII form. Anything else (a URL, a path, an empty string) is
    /// refused when the shaper is built: a route whose host no request
    /// can have would leave its vendor's quota unkept.
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.host = Some(host_name(&host.into()));
        self
    }

    /// Refused when what it was given to match is not a host or a path:
    /// no request could match it.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if let Some(Err(problem)) = &self.host {
            return Err(ConfigError::new("host", problem.clone()));
        }
        if let Some(Err(problem)) = &self.path {
            return Err(ConfigError::new("path", problem.clone()));
        }
        Ok(())
    }

    /// Only paths matching `pattern`, segment by segment: `*` or `{name}`
    /// match any one segment, and a last `*` matches the rest of the path
    /// (`/v1/payments/*` matches `/v1/payments` and below). Written as a
    /// person writes a path (`/v1/files/my report`, `/v1/café`): each
    /// segment matches the request's as its URL spells it, percent-encoded,
    /// and in every spelling a vendor reads alike (`%70ayments` is
    /// `payments`, `%3a` is `:`, `%2F` either divides segments as `/` does
    /// or stays in its own, and `payments;jsessionid=1` is `payments` as
    /// well), so no spelling of a route's path escapes its quota.
    /// A query or fragment (`/search?q=*`), or a `.` or `..` segment, is
    /// refused when the shaper is built: a path pattern matches the path
    /// alone, and a request's path has no dot segments.
    pub fn path(mut self, pattern: &str) -> Self {
        self.path = Some(path_pattern(pattern));
        self
    }

    /// A quota shared by every request of the route.
    pub fn quota(mut self, quota: Quota) -> Self {
        match self
            .levels
            .iter_mut()
            .find(|l| l.name == self.name && matches!(l.key, LaneKey::Shared))
        {
            Some(level) => level.quotas.push(quota),
            None => {
                let level = Level::new(self.name.clone(), LaneKey::Shared, [quota]);
                self.levels.push(level);
            }
        }
        self
    }

    /// `count` requests per `per` for the whole route, a leaky bucket.
    pub fn rate(self, count: u32, per: std::time::Duration) -> Self {
        self.quota(Quota::leaky_bucket(count, per))
    }

    /// Add a level (e.g. per API key within the route).
    pub fn level(mut self, level: Level) -> Self {
        self.levels.push(level);
        self
    }

    pub(crate) fn matches(&self, request: &Request) -> bool {
        self.method.as_ref().is_none_or(|m| m == request.method())
            && self.host.as_ref().is_none_or(|host| {
                host.as_ref()
                    .is_ok_and(|host| host_matches(host, request.url()))
            })
            && self.path.as_ref().is_none_or(|pattern| {
                pattern
                    .as_ref()
                    .is_ok_and(|pattern| path_matches(pattern, request.url().path()))
            })
    }
}

impl Route {
    /// Whether a request to `url`'s scheme, host and port may match the
    /// route, whatever its method and path; and whether every one does.
    #[cfg(feature = "proxy")]
    pub(crate) fn reaches(&self, url: &reqwest::Url) -> (bool, bool) {
        let host = match &self.host {
            None => true,
            Some(host) => host.as_ref().is_ok_and(|host| host_matches(host, url)),
        };
        (host, host && self.method.is_none() && self.path.is_none())
    }
}
