//! The file's `[proxy]` table: where `callshaper-proxy` listens, and the
//! limits its clients are held to.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use crate::time::human;

/// The proxy's own settings, as a file declares them; a library shaper
/// built from the same file ignores them. Each upstream is a vendor's
/// `upstream = "https://…"`.
///
/// ```toml
/// [proxy]
/// listen = "127.0.0.1:7777"      # clients call http://LISTEN/VENDOR/…
/// admin = "127.0.0.1:7778"       # /metrics, /lanes, /healthz
/// replay_body = 4194304          # bytes kept whole to send again
/// max_header_bytes = 65536
/// header_read_timeout = "10s"
/// body_read_timeout = "60s"      # a request body silent this long: 408
/// send_timeout = "60s"           # a client taking nothing of its answer this long: cut off
/// max_connections = 10000        # client connections open at once
/// client_token_env = "CALLSHAPER_CLIENT_TOKEN"  # clients send it in x-callshaper-token
/// drain = "30s"                  # on SIGTERM, how long requests may finish
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyConfig {
    /// Where clients connect (default `127.0.0.1:7777`).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Where the admin endpoints are served (default `127.0.0.1:7778`).
    #[serde(default = "default_admin")]
    pub admin: SocketAddr,
    /// See `ProxyBuilder::replay_body` (feature `proxy`).
    pub replay_body: Option<usize>,
    /// See `ProxyBuilder::max_header_bytes`.
    pub max_header_bytes: Option<usize>,
    /// See `ProxyBuilder::header_read_timeout`.
    #[serde(default, with = "human::option")]
    pub header_read_timeout: Option<Duration>,
    /// See `ProxyBuilder::body_read_timeout`.
    #[serde(default, with = "human::option")]
    pub body_read_timeout: Option<Duration>,
    /// See `ProxyBuilder::send_timeout`.
    #[serde(default, with = "human::option")]
    pub send_timeout: Option<Duration>,
    /// See `ProxyBuilder::max_connections`.
    pub max_connections: Option<usize>,
    /// The environment variable holding the client token (see
    /// `ProxyBuilder::client_token`): a secret stays out of the file, which
    /// is often committed or world-readable. Unset, or empty, when the
    /// proxy starts: the start fails, naming this field.
    pub client_token_env: Option<String>,
    /// On SIGTERM, how long the requests already taken may take to finish
    /// before the rest end with 503 (default 30 s, at most 1 h): the
    /// listener closes first, so a load balancer moves new clients on.
    #[serde(default, with = "human::option")]
    pub drain: Option<Duration>,
}

/// The longest a drain may be given.
const MOST_DRAIN: Duration = Duration::from_secs(3600);

impl ProxyConfig {
    /// How long a stop may drain: the file's `drain`, or 30 s; over an
    /// hour is an error naming the field.
    pub fn drain(&self) -> Result<Duration, crate::ConfigError> {
        match self.drain {
            None => Ok(Duration::from_secs(30)),
            Some(drain) if drain <= MOST_DRAIN => Ok(drain),
            Some(drain) => Err(crate::ConfigError::new(
                "proxy.drain",
                format!("{drain:?} is more than an hour"),
            )),
        }
    }
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            admin: default_admin(),
            replay_body: None,
            max_header_bytes: None,
            header_read_timeout: None,
            body_read_timeout: None,
            send_timeout: None,
            max_connections: None,
            client_token_env: None,
            drain: None,
        }
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7777))
}

fn default_admin() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7778))
}

#[cfg(feature = "proxy")]
impl super::ShaperConfig {
    /// A [`ProxyBuilder`](crate::proxy::ProxyBuilder) sending through
    /// `shaper` (built from this file) to every vendor with an
    /// `upstream`, held to the `[proxy]` table's limits.
    /// Its [`build`](crate::proxy::ProxyBuilder::build) checks them.
    pub fn proxy(&self, shaper: crate::Shaper) -> crate::proxy::ProxyBuilder {
        let mut builder = crate::proxy::Proxy::builder(shaper);
        for (name, vendor) in &self.vendors {
            if let Some(upstream) = &vendor.upstream {
                builder = builder.upstream(name, upstream);
            }
            if let Some(defaults) = &vendor.proxy {
                builder = builder.defaults(name, defaults.clone());
            }
        }
        let settings = self.proxy.clone().unwrap_or_default();
        if let Some(bytes) = settings.replay_body {
            builder = builder.replay_body(bytes);
        }
        if let Some(bytes) = settings.max_header_bytes {
            builder = builder.max_header_bytes(bytes);
        }
        if let Some(timeout) = settings.header_read_timeout {
            builder = builder.header_read_timeout(timeout);
        }
        if let Some(timeout) = settings.body_read_timeout {
            builder = builder.body_read_timeout(timeout);
        }
        if let Some(timeout) = settings.send_timeout {
            builder = builder.send_timeout(timeout);
        }
        if let Some(connections) = settings.max_connections {
            builder = builder.max_connections(connections);
        }
        if let Err(error) = builder.check_limits() {
            builder = builder.refuse(error.within("proxy"));
        }
        if let Some(name) = &settings.client_token_env {
            builder = match std::env::var(name) {
                Ok(token) if !token.is_empty() => builder.client_token(token),
                _ => builder.refuse(crate::ConfigError::new(
                    "proxy.client_token_env",
                    format!("the environment variable {name} is not set, or empty"),
                )),
            };
        }
        builder
    }
}
