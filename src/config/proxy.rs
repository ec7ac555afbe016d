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
/// ```
#[derive(Debug, Clone, Copy, Deserialize)]
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
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            admin: default_admin(),
            replay_body: None,
            max_header_bytes: None,
            header_read_timeout: None,
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
        }
        let settings = self.proxy.unwrap_or_default();
        if let Some(bytes) = settings.replay_body {
            builder = builder.replay_body(bytes);
        }
        if let Some(bytes) = settings.max_header_bytes {
            builder = builder.max_header_bytes(bytes);
        }
        if let Some(timeout) = settings.header_read_timeout {
            builder = builder.header_read_timeout(timeout);
        }
        builder
    }
}
