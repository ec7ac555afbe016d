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

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use reqwest::header::HeaderName;
use reqwest::{Method, Request};

use crate::answers::Answers;
use crate::error::ConfigError;
use crate::lane::write_free;
use crate::meters::Quota;
use crate::store::StoreFailure;

/// A label a request carries for [`LaneKey::Tag`] levels: a tenant, a user.
///
/// Set it with [`RequestBuilder::tag`](crate::shaper::RequestBuilder::tag), or as a
/// `reqwest_middleware` extension.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tag(pub String);

/// A request's cost for quotas that count cost (tokens), as a
/// `reqwest_middleware` extension; see
/// [`RequestBuilder::cost`](crate::shaper::RequestBuilder::cost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost(pub u64);

/// Picks a request's key from the request and its tag.
pub type KeyFn = dyn Fn(&Request, Option<&Tag>) -> String + Send + Sync;

/// Where a level's lane key comes from.
#[derive(Clone)]
pub enum LaneKey {
    /// The request's origin, `scheme://host:port`.
    Origin,
    /// A request header's value (an API key), by its fingerprint (`#` and
    /// 16 hex digits of its SHA-1): the value itself is never in a lane's
    /// name, snapshot, spans, metrics or Redis keys, nor sent on a
    /// redirect to another origin. Requests without the header share one
    /// lane.
    Header(HeaderName),
    /// The request's [`Tag`]; untagged requests share one lane.
    Tag,
    /// One lane for every request of the level.
    Shared,
    /// A function of the request and its tag.
    Custom(Arc<KeyFn>),
}

impl LaneKey {
    #[cfg(test)]
    fn of(&self, request: &Request, tag: Option<&Tag>) -> String {
        let mut key = String::new();
        self.write(request, tag, &mut key);
        key
    }

    /// The key of `request`, written at the end of `out`: every request
    /// names its lane so, and a found lane's name costs no allocation
    /// beyond `out`.
    pub(crate) fn write(&self, request: &Request, tag: Option<&Tag>, out: &mut String) {
        match self {
            Self::Origin => write_origin(request.url(), out),
            Self::Header(name) => {
                if let Some(value) = request.headers().get(name) {
                    write_fingerprint(name, value.as_bytes(), out);
                }
            }
            Self::Tag => write_free(tag.map_or("", |t| t.0.as_str()), out),
            Self::Shared => {}
            Self::Custom(key) => write_free(&key(request, tag), out),
        }
    }
}

/// `url`'s origin as `Origin::ascii_serialization` writes it
/// (`scheme://host[:port]`, the port only when not the scheme's own), with
/// no `Origin` made for it.
fn write_origin(url: &reqwest::Url, out: &mut String) {
    use std::fmt::Write;

    match (url.scheme(), bare_host(url)) {
        (scheme @ ("http" | "https"), Some(host)) => {
            out.push_str(scheme);
            out.push_str("://");
            out.push_str(host);
            // The parser drops a scheme's own port: `port` is any other.
            if let Some(port) = url.port() {
                let _ = write!(out, ":{port}");
            }
        }
        _ => out.push_str(&url.origin().ascii_serialization()),
    }
}

/// A header's value as a lane key. The value is often a secret, and a
/// lane's key travels far (snapshots, logs, metrics, the fleet's Redis):
/// 64 bits of a digest keep keys apart (finding another value with the
/// same fingerprint takes about 2^64 tries) and say nothing of the value.
///
/// The digest is of the credential as its vendor reads it: without the
/// spaces around the value, and in `Authorization` with its scheme in
/// lower case and one space after it (RFC 9110 reads a scheme in any
/// case: `Bearer sk-1` and `bearer  sk-1` are one key). Two spellings of
/// one key were two lanes, each with the key's whole quota.
fn write_fingerprint(name: &HeaderName, value: &[u8], out: &mut String) {
    use std::fmt::Write;

    use reqwest::header::{AUTHORIZATION, PROXY_AUTHORIZATION};

    let value = value.trim_ascii();
    let mut digest = sha1_smol::Sha1::new();
    let scheme = (name == AUTHORIZATION || name == PROXY_AUTHORIZATION)
        .then(|| value.iter().position(|b| matches!(b, b' ' | b'\t')))
        .flatten();
    match scheme {
        Some(at) => {
            let (scheme, credentials) = value.split_at(at);
            for byte in scheme {
                digest.update(&[byte.to_ascii_lowercase()]);
            }
            digest.update(b" ");
            digest.update(credentials.trim_ascii_start());
        }
        None => digest.update(value),
    }
    let digest = digest.digest().bytes();
    out.push('#');
    for byte in &digest[..8] {
        let _ = write!(out, "{byte:02x}");
    }
}

/// In a file: `"origin"`, `"shared"`, `"tag"`, or `{ header = "x-api-key" }`
/// (a [`Custom`](LaneKey::Custom) key is code, not data).
#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for LaneKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "snake_case", deny_unknown_fields)]
        enum Declared {
            Origin,
            Shared,
            Tag,
            Header(String),
        }
        Ok(match Declared::deserialize(deserializer)? {
            Declared::Origin => Self::Origin,
            Declared::Shared => Self::Shared,
            Declared::Tag => Self::Tag,
            Declared::Header(name) => {
                Self::Header(HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                    serde::de::Error::custom(format!("{name:?} is not a header name"))
                })?)
            }
        })
    }
}

impl fmt::Debug for LaneKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Origin => f.write_str("Origin"),
            Self::Header(name) => f.debug_tuple("Header").field(name).finish(),
            Self::Tag => f.write_str("Tag"),
            Self::Shared => f.write_str("Shared"),
            Self::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

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
    /// `payments`, `%3a` is `:`, and `%2F` either divides segments as `/`
    /// does or stays in its own), so no spelling of a route's path escapes
    /// its quota.
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

/// `base` as a vendor's base URL, the one rule for the file's `upstream`
/// and the proxy's upstreams: an `http(s)` URL with a host, without query,
/// fragment or credentials, its path without a trailing `/`.
#[cfg(any(feature = "config", feature = "proxy"))]
pub(crate) fn upstream_base(base: &str) -> Result<reqwest::Url, String> {
    let mut url = reqwest::Url::parse(base)
        .map_err(|e| format!("{base:?} is not an http or https URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(format!("{base:?} is not an http or https URL with a host"));
    }
    let credentials = !url.username().is_empty() || url.password().is_some();
    if url.query().is_some() || url.fragment().is_some() || credentials {
        return Err(format!(
            "{base:?} has a query, fragment or user: a base is scheme, host and path"
        ));
    }
    let path = url.path().trim_end_matches('/').to_owned();
    url.set_path(&path);
    Ok(url)
}

/// `host` as a request's URL spells it: lowercase, a Unicode name by its
/// ASCII form, and its port when one is given, even its scheme's own (a
/// route on `:443` is not a route on every port); or why it is not a host.
pub(crate) fn host_name(host: &str) -> Result<String, String> {
    let refused = || {
        format!(
            "{host:?} is not a host: write the host alone, as `api.example.com` or `127.0.0.1:8080`"
        )
    };
    // A URL's parser drops line breaks and outer spaces, which no host
    // has.
    if host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(refused());
    }
    // Each scheme drops its own default port: read as both, a port given
    // is in one of them.
    let parse = |scheme: &str| reqwest::Url::parse(&format!("{scheme}://{host}/")).ok();
    let (Some(http), Some(https)) = (parse("http"), parse("https")) else {
        return Err(refused());
    };
    let alone = http.path() == "/"
        && http.query().is_none()
        && http.fragment().is_none()
        && http.username().is_empty()
        && http.password().is_none();
    match bare_host(&http) {
        Some(name) if alone && !name.is_empty() => Ok(match http.port().or(https.port()) {
            Some(port) => format!("{name}:{port}"),
            None => name.to_owned(),
        }),
        _ => Err(refused()),
    }
}

fn host_matches(host: &str, url: &reqwest::Url) -> bool {
    match host.rsplit_once(':') {
        Some((name, port)) if !name.is_empty() && !name.ends_with(':') => {
            bare_host(url) == Some(name)
                && url
                    .port_or_known_default()
                    .is_some_and(|p| p.to_string() == port)
        }
        _ => bare_host(url) == Some(host),
    }
}

/// `url`'s host as routes and lanes know it: a name's one final `.` (the
/// DNS root, `api.example.com.`) dropped, since it names the same host and
/// the same vendor. Kept, it made a lane of its own with the vendor's
/// whole quota, and matched no route of the host.
fn bare_host(url: &reqwest::Url) -> Option<&str> {
    url.host_str()
        .map(|host| host.strip_suffix('.').unwrap_or(host))
}

/// `pattern`'s segments as a request's URL spells them (`*` and `{name}`
/// as they are), or why it is not a path.
fn path_pattern(pattern: &str) -> Result<Vec<String>, String> {
    if pattern.contains(['?', '#']) {
        return Err(format!(
            "{pattern:?} has a query or fragment: a path pattern matches the path alone"
        ));
    }
    segments(pattern)
        .map(|segment| {
            if segment == "*" || (segment.starts_with('{') && segment.ends_with('}')) {
                return Ok(segment.to_owned());
            }
            // As the URL of a request naming it spells it. A URL reads `\`
            // as `/`, and `.` and `..` away.
            let url = reqwest::Url::parse(&format!("http://h/{segment}")).ok();
            match url.as_ref().and_then(|url| url.path().strip_prefix('/')) {
                Some(spelled) if !spelled.is_empty() && !spelled.contains('/') => {
                    Ok(normalized(spelled).into_owned())
                }
                _ => Err(format!(
                    "{segment:?} in {pattern:?} is not a path segment a request can have"
                )),
            }
        })
        .collect()
}

fn segments(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|s| !s.is_empty())
}

/// Whether a request's `path` matches `pattern` as its vendor may read
/// the path: a segment in any of its spellings (see [`normalized`]), and
/// `%2F` or `%5C` either kept in their segment (`/v1/files/{name}` and
/// `a%2Fb`) or as the `/` a vendor may decode them to before it routes.
/// Either reading that matches counts the request under the route: one
/// counted there needlessly waits, one missed goes past the route's quota
/// (`/v1/%70ayments` did).
fn path_matches(pattern: &[String], path: &str) -> bool {
    match separated(path) {
        Cow::Owned(divided) => segments_match(pattern, path) || segments_match(pattern, &divided),
        Cow::Borrowed(_) => segments_match(pattern, path),
    }
}

fn segments_match(pattern: &[String], path: &str) -> bool {
    let mut path = segments(path);
    for (i, want) in pattern.iter().enumerate() {
        let last = i + 1 == pattern.len();
        if last && want == "*" {
            return true;
        }
        match path.next() {
            Some(_) if want == "*" || (want.starts_with('{') && want.ends_with('}')) => {}
            Some(segment) if normalized(segment) == want.as_str() => {}
            _ => return false,
        }
    }
    path.next().is_none()
}

/// `path` with each `%2F` and `%5C` (any case) as a `/`.
fn separated(path: &str) -> Cow<'_, str> {
    let escaped = |at: usize| {
        let hex = path.get(at + 1..at + 3).map(str::to_ascii_uppercase);
        matches!(hex.as_deref(), Some("2F" | "5C"))
    };
    if !path.match_indices('%').any(|(at, _)| escaped(at)) {
        return Cow::Borrowed(path);
    }
    let mut out = String::with_capacity(path.len());
    let mut rest = 0;
    for (at, _) in path.match_indices('%').filter(|&(at, _)| escaped(at)) {
        if at >= rest {
            out.push_str(&path[rest..at]);
            out.push('/');
            rest = at + 3;
        }
    }
    out.push_str(&path[rest..]);
    Cow::Owned(out)
}

/// A path segment as one of its spellings a vendor reads alike: an
/// escaped character a segment may hold as it is (RFC 3986's `pchar`: a
/// letter, a digit, `-._~!$&'()*+,;=:@`) decoded, any other escape's hex
/// digits in upper case. Patterns and requests are both read so.
fn normalized(segment: &str) -> Cow<'_, str> {
    use std::fmt::Write;

    if !segment.contains('%') {
        return Cow::Borrowed(segment);
    }
    let mut out = String::with_capacity(segment.len());
    let mut rest = segment;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let escape = &rest[at..];
        let byte = escape
            .get(1..3)
            .filter(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match byte {
            Some(byte) if byte.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@".contains(&byte) => {
                out.push(char::from(byte));
            }
            Some(byte) => {
                let _ = write!(out, "%{byte:02X}");
            }
            None => {
                out.push('%');
                rest = &escape[1..];
                continue;
            }
        }
        rest = &escape[3..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, url: &str) -> Request {
        Request::new(method, url.parse().unwrap())
    }

    #[test]
    fn routes_match_method_host_and_path_patterns() {
        let route = Route::new("p")
            .method(Method::POST)
            .host("api.example.com")
            .path("/v1/{account}/payments/*");
        let hit = |m: Method, url: &str| route.matches(&request(m, url));
        assert!(hit(
            Method::POST,
            "https://api.example.com/v1/acme/payments"
        ));
        assert!(hit(
            Method::POST,
            "https://api.example.com/v1/acme/payments/42/refund"
        ));
        assert!(!hit(
            Method::GET,
            "https://api.example.com/v1/acme/payments"
        ));
        assert!(!hit(
            Method::POST,
            "https://other.example.com/v1/acme/payments"
        ));
        assert!(!hit(
            Method::POST,
            "https://api.example.com/v1/acme/products"
        ));
        let port = Route::new("p").host("127.0.0.1:8080");
        assert!(port.matches(&request(Method::GET, "http://127.0.0.1:8080/x")));
        assert!(!port.matches(&request(Method::GET, "http://127.0.0.1:8081/x")));
        let exact = Route::new("e").path("/v1/products");
        assert!(exact.matches(&request(Method::GET, "http://h/v1/products/")));
        assert!(!exact.matches(&request(Method::GET, "http://h/v1/products/7")));
    }

    /// A key in a header is one key however the request spells it: the
    /// spaces around a value are HTTP's, and an `Authorization` scheme
    /// reads in any case, with any spaces after it. The credential itself
    /// keeps its case.
    #[test]
    fn a_credential_is_one_key_however_it_is_spelled() {
        let key = |name: &'static str, value: &str| {
            let mut req = request(Method::GET, "https://h/");
            let value = reqwest::header::HeaderValue::from_str(value).unwrap();
            req.headers_mut().insert(name, value);
            LaneKey::Header(HeaderName::from_static(name)).of(&req, None)
        };
        let bearer = key("authorization", "Bearer sk-1");
        for spelled in ["bearer sk-1", "BEARER  sk-1", " Bearer\tsk-1 "] {
            assert_eq!(key("authorization", spelled), bearer, "{spelled}");
        }
        for other in ["Bearer sk-2", "Bearer SK-1", "Basic sk-1", "Bearersk-1"] {
            assert_ne!(key("authorization", other), bearer, "{other}");
        }
        assert_eq!(key("x-api-key", " k-1 "), key("x-api-key", "k-1"));
        assert_ne!(key("x-api-key", "K-1"), key("x-api-key", "k-1"));
        assert_ne!(
            key("x-api-key", "bearer k-1"),
            key("x-api-key", "Bearer k-1")
        );
    }

    /// A path matches in any spelling its vendor reads alike: an escaped
    /// letter or `:` decoded, hex digits in either case, `%2F` and `%5C`
    /// as a `/`; the pattern is read the same way. Another character, or a
    /// letter in another case, is another path.
    #[test]
    fn a_path_matches_in_every_spelling_its_vendor_reads_alike() {
        let payments = Route::new("p").path("/v1/payments/*");
        let run = Route::new("r").path("/v1/jobs/p:run");
        let encoded = Route::new("e").path("/v1/jobs/p%3arun");
        let hit = |route: &Route, path: &str| {
            route.matches(&request(Method::GET, &format!("https://h{path}")))
        };
        for path in [
            "/v1/%70ayments",
            "/v1/%70%61yments/1",
            "/v1/payments%2F1",
            "/v1%2fpayments",
            "/v1%5Cpayments%5c1",
        ] {
            assert!(hit(&payments, path), "{path}");
        }
        // An escaped `/` kept in its segment, as many vendors keep it.
        let file = Route::new("f").path("/v1/files/{name}");
        assert!(hit(&file, "/v1/files/a%2Fb") && hit(&file, "/v1/files/a%2fb"));
        assert!(!hit(&file, "/v1/files/a/b"));
        for path in ["/v1/PAYMENTS", "/v1/pay%2Dments", "/v1/payments%", "/v1/%7"] {
            assert!(!hit(&payments, path), "{path}");
        }
        for route in [&run, &encoded] {
            assert!(hit(route, "/v1/jobs/p:run"));
            assert!(hit(route, "/v1/jobs/p%3Arun"));
            assert!(hit(route, "/v1/jobs/%70%3arun"));
            assert!(!hit(route, "/v1/jobs/p%3Brun"));
        }
        assert_eq!(normalized("a%2fb%20c%7e%"), "a%2Fb%20c~%");
    }

    /// A route's host matches as a URL spells its host, whatever its case
    /// or script, and keeps an explicit port, even its scheme's own; what
    /// is not a host is refused, naming it.
    #[test]
    fn a_host_matches_as_urls_spell_it_and_a_non_host_is_refused() {
        for (given, url) in [
            ("API.Example.com", "https://api.example.com/x"),
            ("bücher.example", "https://bücher.example/"),
            ("[::1]:8080", "http://[::1]:8080/"),
            ("api.example.com:443", "https://api.example.com/"),
            // A name's final dot (the DNS root) names the same host.
            ("api.example.com", "https://api.example.com./x"),
            ("api.example.com.", "https://API.example.com/x"),
            ("api.example.com:8443", "https://api.example.com.:8443/x"),
        ] {
            let route = Route::new("r").host(given);
            assert!(route.check().is_ok(), "{given}");
            assert!(route.matches(&request(Method::GET, url)), "{given} {url}");
        }
        let on_443 = Route::new("r").host("api.example.com:443");
        assert!(!on_443.matches(&request(Method::GET, "http://api.example.com/")));
        for given in [
            "",
            "/",
            "https://api.example.com",
            "api.example.com/v1",
            "key@api.example.com",
            "api.example.com?x",
            "api .example.com",
            "api.example.com\n",
            "http://[::1",
            "api.example.com:99999",
        ] {
            let route = Route::new("r").host(given);
            let error = route.check().expect_err(given);
            assert_eq!(error.field, "host");
            assert!(error.problem.contains("is not a host"), "{error}");
            assert!(!route.matches(&request(Method::GET, "https://api.example.com/v1")));
        }
    }

    /// A path pattern matches a request's path as its URL spells it,
    /// percent-encoded; a query, a fragment or a segment no request's
    /// path can have is refused, naming it.
    #[test]
    fn a_path_matches_as_urls_spell_it_and_a_non_path_is_refused() {
        for (pattern, url) in [
            ("/v1/café/*", "https://h/v1/café/x"),
            ("/v1/files/my report", "https://h/v1/files/my%20report"),
            ("/v1/caf%C3%A9", "https://h/v1/café"),
            ("/v1/{id}/x", "https://h/v1/é/x"),
        ] {
            let route = Route::new("r").path(pattern);
            assert!(route.check().is_ok(), "{pattern}");
            assert!(route.matches(&request(Method::GET, url)), "{pattern} {url}");
        }
        for pattern in [
            "/search?q=*",
            "/v1#top",
            "/v1/../admin",
            "/v1/./x",
            "/v1/%2e%2e/x",
            "/v1/a\\b",
        ] {
            let route = Route::new("r").path(pattern);
            let error = route.check().expect_err(pattern);
            assert_eq!(error.field, "path");
            assert!(!route.matches(&request(Method::GET, "https://h/v1/x")));
        }
    }

    #[test]
    fn keys_come_from_origin_headers_and_tags() {
        let mut req = request(Method::GET, "https://api.example.com:8443/x");
        req.headers_mut().insert("x-api-key", "k1".parse().unwrap());
        let tag = Tag("acme".into());
        assert_eq!(
            LaneKey::Origin.of(&req, None),
            "https://api.example.com:8443"
        );
        // SHA-1("k1") begins a2ab1959c1c3bfa2.
        let by_header = LaneKey::Header(HeaderName::from_static("x-api-key")).of(&req, None);
        assert_eq!(by_header, "#a2ab1959c1c3bfa2");
        assert_eq!(LaneKey::Tag.of(&req, Some(&tag)), "acme");
        assert_eq!(LaneKey::Tag.of(&req, None), "");
        let quota = Quota::leaky_bucket(1, std::time::Duration::from_secs(1));
        let mut name = String::new();
        Level::new("tenant", LaneKey::Tag, [quota]).write_lane_name(&req, Some(&tag), &mut name);
        assert_eq!(name, "tenant/acme");
    }

    /// The origin key is written as the `url` crate serializes an origin,
    /// whatever the host's kind and the port.
    #[test]
    fn an_origin_key_is_the_origins_serialization() {
        for url in [
            "http://api.example.com/x",
            "https://API.Example.com:443/x?q",
            "https://api.example.com:8443/",
            "http://api.example.com:443/",
            "http://127.0.0.1:80/",
            "http://127.0.0.1:9000/v1",
            "http://[::1]:8080/",
            "https://[2001:db8::1]/",
            "https://bücher.example/",
            "http://h:0/",
        ] {
            let req = request(Method::GET, url);
            let origin = req.url().origin().ascii_serialization();
            assert_eq!(LaneKey::Origin.of(&req, None), origin, "{url}");
        }
        // One host, one lane: a name's final dot is the DNS root's.
        for url in [
            "https://api.example.com./x",
            "https://API.example.COM.:443/",
        ] {
            let req = request(Method::GET, url);
            assert_eq!(LaneKey::Origin.of(&req, None), "https://api.example.com");
        }
    }
}
