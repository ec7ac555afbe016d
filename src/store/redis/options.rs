//! How a Redis store is set up: [`RedisOptions`], and whose clock its
//! scripts read ([`Clock`]).

use std::time::Duration;

use super::tls::Certificates;

/// Whose clock the scripts read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Clock {
    /// Redis's `TIME`, read inside each script: one clock for the fleet.
    /// Needs Redis 5 or later (scripts replicated by effects), as every
    /// supported Redis and Valkey is.
    #[default]
    Redis,
    /// Each instance sends its own wall clock with every call, for
    /// deployments that refuse `TIME` in scripts. What it costs: clock skew
    /// between instances becomes quota error. Two instances 5 ms apart can
    /// place two requests 5 ms closer than the quota allows, which the
    /// lane's headroom (5 ms by default) absorbs; keep instances on NTP and
    /// raise the headroom above their worst skew.
    Instances,
}

/// How to reach Redis and how to use it; [`connect`](Self::connect) or
/// [`cluster`](Self::cluster) finishes.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    pub(super) prefix: String,
    pub(super) timeout: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) batch: usize,
    pub(super) horizon: Duration,
    pub(super) probe_every: Duration,
    pub(super) fleet_size: u32,
    pub(super) clock: Clock,
    pub(super) tls: Certificates,
    #[cfg(feature = "redis-sentinel")]
    pub(super) master_auth: Option<super::sentinel::MasterAuth>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            prefix: "callshaper:".to_owned(),
            timeout: Duration::from_millis(250),
            connect_timeout: Duration::from_secs(2),
            batch: 16,
            horizon: Duration::from_secs(1),
            probe_every: Duration::from_secs(1),
            fleet_size: 1,
            clock: Clock::Redis,
            tls: Certificates::default(),
            #[cfg(feature = "redis-sentinel")]
            master_auth: None,
        }
    }
}

impl RedisOptions {
    /// Prefix of every key and of the pause channel (`callshaper:`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The longest any Redis call may take before the lane treats Redis as
    /// down (250 ms; at least 1 ms, tokio's timer tick).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The longest connecting may take when the store starts (2 s): TCP,
    /// the TLS handshakes, `AUTH`, a cluster's slot map and the pause
    /// channel's subscription. Longer than one call's
    /// [`timeout`](Self::timeout), since a TLS cluster makes a handshake
    /// per node before its first answer. At least 1 ms.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Most slots one round trip reserves for a lane's waiting requests
    /// (16); 1 turns batching off.
    pub fn batch(mut self, slots: usize) -> Self {
        self.batch = slots.max(1);
        self
    }

    /// No slot is reserved further ahead than this (1 s).
    pub fn horizon(mut self, horizon: Duration) -> Self {
        self.horizon = horizon;
        self
    }

    /// While Redis is down, how often a lane tries it again (1 s).
    pub fn probe_every(mut self, every: Duration) -> Self {
        self.probe_every = every.max(Duration::from_millis(1));
        self
    }

    /// How many instances share the quotas: a fail-open lane falls back to
    /// its quotas divided by this (1).
    pub fn fleet_size(mut self, instances: u32) -> Self {
        self.fleet_size = instances.max(1);
        self
    }

    /// Whose clock the scripts read ([`Clock::Redis`]).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The user and password a Sentinel's master and replicas want (their
    /// `requirepass`: user `default`, or an ACL user); a sentinel's own
    /// credentials go in its URL, as a node's do.
    #[cfg(feature = "redis-sentinel")]
    pub fn master_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.master_auth = Some(super::sentinel::MasterAuth {
            user: user.into(),
            password: password.into(),
        });
        self
    }

    /// Trust these CA certificates (PEM, one or more) for `rediss://`
    /// instead of the system's roots: a private CA, as managed Redis and
    /// self-hosted TLS often use. Checked when the store connects.
    ///
    /// ```
    /// use callshaper::store::RedisStore;
    /// # use callshaper::testing::RedisServer;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = RedisServer::start_tls();
    /// # let ca = server.tls().unwrap();
    /// # let (ca_pem, chain_pem, key_pem) = (ca.ca_pem(), ca.client_pem(), ca.client_key_pem());
    /// # let url = server.url();
    /// // `url`: "rediss://redis.internal:6380", say; the PEM files' bytes,
    /// // as `std::fs::read("/etc/callshaper/redis-ca.pem")?` gives them.
    /// let redis = RedisStore::options()
    ///     .ca_roots(ca_pem)
    ///     .client_certificate(chain_pem, key_pem)
    ///     .connect(&url)
    ///     .await?;
    /// # drop(redis);
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis-tls")]
    pub fn ca_roots(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.roots = Some(pem.into());
        self
    }

    /// Present this client certificate chain and its private key (both
    /// PEM) to a Redis that asks for one (mutual TLS, `tls-auth-clients
    /// yes`). Checked when the store connects.
    #[cfg(feature = "redis-tls")]
    pub fn client_certificate(
        mut self,
        chain_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((chain_pem.into(), key_pem.into()));
        self
    }
}
