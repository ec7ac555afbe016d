//! [`Proxy`] and [`ProxyBuilder`]: which upstreams a shaper serves, by
//! name, and the limits a client is held to.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use reqwest::Url;

use crate::error::ConfigError;
use crate::route::upstream_base;
use crate::shaper::RequestOptions;
use crate::shaper::handle::Shaper;

/// A shaper served as a reverse proxy; see the [module docs](super).
#[derive(Clone)]
pub struct Proxy {
    pub(super) inner: Arc<Served>,
}

/// What every connection of a [`Proxy`] shares.
pub(super) struct Served {
    pub(super) shaper: Shaper,
    /// Upstream base URLs by name, without a trailing `/`.
    pub(super) upstreams: BTreeMap<String, Url>,
    /// What an upstream's requests carry when their client does not say.
    pub(super) defaults: BTreeMap<String, RequestOptions>,
    /// What a client must send in `x-callshaper-token`, if anything.
    pub(super) client_token: Option<String>,
    pub(super) limits: Limits,
}

/// What a client is held to.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub(super) replay_body: usize,
    pub(super) max_header_bytes: usize,
    pub(super) header_read_timeout: Duration,
    pub(super) body_read_timeout: Duration,
    pub(super) send_timeout: Duration,
    pub(super) max_connections: usize,
}

/// The largest request body kept whole by default, to be sent again.
const REPLAY_BODY: usize = 4 << 20;
/// The longest a client may be given to send a request's head, to leave
/// its body silent, or to take nothing of its answer.
const MOST_READ_TIMEOUT: Duration = Duration::from_secs(3600);
/// The shortest: a timer's tick (a shorter one cuts every client off).
const LEAST_READ_TIMEOUT: Duration = Duration::from_millis(1);
/// hyper's least buffer for a request's head.
const LEAST_HEADER_BYTES: usize = 8192;

/// Configures a [`Proxy`]: start with [`Proxy::builder`].
pub struct ProxyBuilder {
    shaper: Shaper,
    upstreams: Vec<(String, String)>,
    defaults: BTreeMap<String, RequestOptions>,
    client_token: Option<String>,
    limits: Limits,
    /// A setting found wrong before `build` (the file's), reported there.
    refused: Option<ConfigError>,
}

/// The client token stays out of logs: the output says only whether one
/// is set.
impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let served = &self.inner;
        let upstreams: BTreeMap<&str, &str> = served
            .upstreams
            .iter()
            .map(|(name, base)| (name.as_str(), base.as_str()))
            .collect();
        f.debug_struct("Proxy")
            .field("upstreams", &upstreams)
            .field("defaults", &served.defaults)
            .field("client_token", &served.client_token.is_some())
            .field("limits", &served.limits)
            .finish_non_exhaustive()
    }
}

/// As [`Proxy`]'s: the client token stays out of logs.
impl std::fmt::Debug for ProxyBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyBuilder")
            .field("upstreams", &self.upstreams)
            .field("defaults", &self.defaults)
            .field("client_token", &self.client_token.is_some())
            .field("limits", &self.limits)
            .field("refused", &self.refused)
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// A proxy sending through `shaper`; name its upstreams with
    /// [`ProxyBuilder::upstream`].
    pub fn builder(shaper: Shaper) -> ProxyBuilder {
        ProxyBuilder {
            shaper,
            upstreams: Vec::new(),
            defaults: BTreeMap::new(),
            client_token: None,
            refused: None,
            limits: Limits {
                replay_body: REPLAY_BODY,
                max_header_bytes: 64 << 10,
                header_read_timeout: Duration::from_secs(10),
                body_read_timeout: Duration::from_secs(60),
                send_timeout: Duration::from_secs(60),
                max_connections: 10_000,
            },
        }
    }

    /// The shaper the proxy sends through: its lanes and snapshots are
    /// the proxy's.
    pub fn shaper(&self) -> &Shaper {
        &self.inner.shaper
    }
}

impl ProxyBuilder {
    /// Serve `base` (an `http` or `https` URL, with a path prefix if the
    /// vendor's API has one) at `/name/`: a request to `/name/rest?query`
    /// goes to `base/rest?query`.
    pub fn upstream(mut self, name: impl Into<String>, base: impl Into<String>) -> Self {
        self.upstreams.push((name.into(), base.into()));
        self
    }

    /// What requests to the upstream `name` carry when their client sends
    /// no `x-callshaper-*` header of the kind: e.g. a batch vendor's
    /// requests wait as batch, and give up after ten minutes.
    pub fn defaults(mut self, name: impl Into<String>, options: RequestOptions) -> Self {
        self.defaults.insert(name.into(), options);
        self
    }

    /// Admit only requests that carry `token` in `x-callshaper-token`
    /// (never forwarded); any other gets 401, before its upstream is even
    /// looked up. For a proxy other hosts can reach: without it, anyone
    /// who reaches the listener spends the quota (the vendor's key is the
    /// client's, or the proxy adds none). An empty token is refused.
    pub fn client_token(mut self, token: impl Into<String>) -> Self {
        self.client_token = Some(token.into());
        self
    }

    /// Make `build` fail with `error`: the file's settings are read before
    /// it, into this builder.
    #[cfg(feature = "config")]
    pub(crate) fn refuse(mut self, error: ConfigError) -> Self {
        self.refused.get_or_insert(error);
        self
    }

    /// The largest request body kept whole, in bytes (default 4 MiB), so
    /// that a throttled request can be sent again. A larger body streams
    /// to the vendor as the client sends it, and is sent once.
    pub fn replay_body(mut self, bytes: usize) -> Self {
        self.limits.replay_body = bytes;
        self
    }

    /// The largest request head (request line and headers), in bytes
    /// (default 64 KiB, at least 8 KiB); a larger one gets 431 and the
    /// connection closes.
    pub fn max_header_bytes(mut self, bytes: usize) -> Self {
        self.limits.max_header_bytes = bytes;
        self
    }

    /// How long a client may take to send a request's head (default
    /// 10 s; from 1 ms to 1 h): a slower one is disconnected, and holds
    /// nothing meanwhile. A kept-alive connection waits that long for its
    /// next request, then closes, letting go of its buffers (15 KiB).
    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.limits.header_read_timeout = timeout;
        self
    }

    /// How long a client may leave its request body silent, between two
    /// reads (default 60 s, as nginx's `client_body_timeout`; from 1 ms
    /// to 1 h). A client that stalls mid-body gets 408 and its connection
    /// closes; a body streaming to the vendor is cut there, so the vendor
    /// call ends and frees its in-flight slot. The time the vendor takes
    /// to accept what was read does not count.
    pub fn body_read_timeout(mut self, timeout: Duration) -> Self {
        self.limits.body_read_timeout = timeout;
        self
    }

    /// How long a client may take nothing of its answer, between two
    /// writes (default 60 s, as nginx's `send_timeout`; from 1 ms to 1 h): a
    /// client that stops reading is disconnected there, and its vendor
    /// call ends, freeing its in-flight slot. An answer is read from the
    /// vendor only as fast as the client takes it, so such a client would
    /// otherwise hold both for as long as it keeps the connection.
    pub fn send_timeout(mut self, timeout: Duration) -> Self {
        self.limits.send_timeout = timeout;
        self
    }

    /// The most client connections open at once (default 10,000): past
    /// it the proxy accepts none until one closes, and a new client waits
    /// in the system's queue of connections (its backlog), as nginx does
    /// past its `worker_connections`. An idle connection holds about
    /// 15 KiB of buffers, so the default bounds idle clients to 150 MB;
    /// a kept-alive connection that sends nothing closes after
    /// [`header_read_timeout`](Self::header_read_timeout), which makes
    /// room. At least 1; a number past what a semaphore holds (2⁶¹ − 1)
    /// is taken as that.
    pub fn max_connections(mut self, connections: usize) -> Self {
        self.limits.max_connections = connections;
        self
    }

    /// The limits' checks, which [`build`](Self::build) makes: a file's
    /// `[proxy]` table names its fields by them before.
    pub(crate) fn check_limits(&self) -> Result<(), ConfigError> {
        for (field, timeout) in [
            ("header_read_timeout", self.limits.header_read_timeout),
            ("body_read_timeout", self.limits.body_read_timeout),
            ("send_timeout", self.limits.send_timeout),
        ] {
            // A timer adds the timeout to the clock's now: a bound keeps
            // that sum from overflowing.
            if !(LEAST_READ_TIMEOUT..=MOST_READ_TIMEOUT).contains(&timeout) {
                return Err(ConfigError::new(
                    field,
                    format!("{timeout:?} is not between 1ms and 1h"),
                ));
            }
        }
        if self.limits.max_header_bytes < LEAST_HEADER_BYTES {
            return Err(ConfigError::new(
                "max_header_bytes",
                format!("must be at least {LEAST_HEADER_BYTES}"),
            ));
        }
        if self.limits.max_connections == 0 {
            return Err(ConfigError::new("max_connections", "must be at least 1"));
        }
        Ok(())
    }

    /// The proxy, or the first setting that cannot work: no upstream, a
    /// name that is empty or has a `/`, a name given twice, defaults for a
    /// name no upstream has, a default cost more than the shaper's quotas
    /// take of one request to its upstream, a base that is
    /// not an `http(s)` URL with a host (or has a query or fragment), a
    /// timeout under 1 ms or over 1 h, a head limit under 8 KiB, or no
    /// connection allowed.
    pub fn build(self) -> Result<Proxy, ConfigError> {
        if let Some(error) = self.refused {
            return Err(error);
        }
        if self.upstreams.is_empty() {
            return Err(ConfigError::new(
                "upstream",
                "a proxy needs at least one upstream",
            ));
        }
        self.check_limits()?;
        let mut upstreams = BTreeMap::new();
        for (name, base) in self.upstreams {
            let field = format!("upstream.{name}");
            if name.is_empty() || name.contains('/') || name.contains('%') {
                return Err(ConfigError::new(
                    field,
                    "a name is one path segment: not empty, without `/` or `%`",
                ));
            }
            let url = upstream_base(&base).map_err(|problem| ConfigError::new(&field, problem))?;
            if upstreams.insert(name, url).is_some() {
                return Err(ConfigError::new(field, "named twice"));
            }
        }
        if let Some(name) = self.defaults.keys().find(|n| !upstreams.contains_key(*n)) {
            return Err(ConfigError::new(
                format!("defaults.{name}"),
                "names no upstream",
            ));
        }
        // A default cost no quota on the upstream's way can take would
        // end every request it is given, at once.
        for (name, options) in &self.defaults {
            let base = &upstreams[name];
            if let Some(cost) = options.cost
                && let Some(most) = self.shaper.registry().largest_cost_at(base)
                && cost > most
            {
                return Err(ConfigError::new(
                    format!("defaults.{name}.cost"),
                    format!(
                        "{cost} is more than the quotas a request to {} goes through take of one request, {most}",
                        base.host_str().unwrap_or_default()
                    ),
                ));
            }
        }
        if self
            .client_token
            .as_deref()
            .is_some_and(|t| t.is_empty() || http::HeaderValue::from_str(t).is_err())
        {
            return Err(ConfigError::new(
                "client_token",
                "must be visible ASCII and not empty",
            ));
        }
        Ok(Proxy {
            inner: Arc::new(Served {
                shaper: self.shaper,
                upstreams,
                defaults: self.defaults,
                client_token: self.client_token,
                limits: self.limits,
            }),
        })
    }
}
