//! The file's `[store]` table: the Redis a fleet shares its quotas through.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::error::ConfigError;
use crate::time::human;

/// The store a fleet shares its quotas through, as a file declares it:
///
/// ```toml
/// [store]
/// redis = "redis://10.0.0.5:6379"       # one node, or:
/// # cluster = ["redis://10.0.0.5:7000", "redis://10.0.0.6:7000"]
/// # sentinels = ["redis://10.0.0.7:26379"], service = "mymaster"   # feature `redis-sentinel`
/// # master_user = "default", master_password_env = "REDIS_PASSWORD"  # the master's AUTH
/// fleet_size = 3                         # what a fail-open lane divides by
/// prefix = "callshaper:"                 # keys and the pause channel
/// timeout = "250ms"
/// connect_timeout = "2s"
/// # TLS (`rediss://`, feature `redis-tls`): a private CA, mutual TLS.
/// # ca_file = "/etc/redis/ca.crt"
/// # client_cert_file = "/etc/redis/client.crt"
/// # client_key_file = "/etc/redis/client.key"
/// ```
///
/// What a lane does while the store is down is `[defaults]
/// on_store_failure` (and each vendor's own). Each field does what the
/// `RedisOptions` method of the same name does (feature `redis`);
/// `instance_clock = true` is `Clock::Instances`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// One Redis (or Valkey) node.
    pub redis: Option<String>,
    /// A Redis Cluster, through any of its nodes.
    #[serde(default)]
    pub cluster: Vec<String>,
    /// Redis Sentinel: the sentinels that name `service`'s master (feature
    /// `redis-sentinel`).
    #[serde(default)]
    pub sentinels: Vec<String>,
    /// The service (master name) the sentinels watch.
    pub service: Option<String>,
    /// The user a Sentinel's master and replicas want (default `default`,
    /// with `master_password_env`).
    pub master_user: Option<String>,
    /// The environment variable holding the password of a Sentinel's
    /// master and replicas: never the password itself, as files are often
    /// committed.
    pub master_password_env: Option<String>,
    /// How many instances share the quotas (default 1).
    pub fleet_size: Option<u32>,
    /// Prefix of every key and of the pause channel (default `callshaper:`).
    pub prefix: Option<String>,
    /// The longest one Redis call may take (default 250 ms, at most 1 min).
    #[serde(default, with = "human::option")]
    pub timeout: Option<Duration>,
    /// The longest connecting may take at startup (default 2 s, at most
    /// 1 min).
    #[serde(default, with = "human::option")]
    pub connect_timeout: Option<Duration>,
    /// Most slots one round trip reserves (default 16, at most 1,024).
    pub batch: Option<usize>,
    /// No slot is reserved further ahead than this (default 1 s, at most
    /// 1 h).
    #[serde(default, with = "human::option")]
    pub horizon: Option<Duration>,
    /// While Redis is down, how often a lane tries it again (default 1 s,
    /// at most 1 h).
    #[serde(default, with = "human::option")]
    pub probe_every: Option<Duration>,
    /// The scripts read each instance's clock instead of Redis's `TIME`.
    #[serde(default)]
    pub instance_clock: bool,
    /// A PEM file of CA certificates trusted for `rediss://` instead of the
    /// system's roots (feature `redis-tls`).
    pub ca_file: Option<PathBuf>,
    /// A PEM file with the client certificate chain for mutual TLS;
    /// `client_key_file` goes with it (feature `redis-tls`).
    pub client_cert_file: Option<PathBuf>,
    /// The client certificate's private key, PEM (feature `redis-tls`).
    pub client_key_file: Option<PathBuf>,
}

/// Two fields that go together: the first given without the second is
/// refused naming the second (`needs_second`), and the other way round.
fn together(
    (first, has_first): (&str, bool),
    (second, has_second): (&str, bool),
    needs_second: &str,
    needs_first: &str,
) -> Result<(), ConfigError> {
    match (has_first, has_second) {
        (true, false) => Err(ConfigError::new(second, needs_second)),
        (false, true) => Err(ConfigError::new(first, needs_first)),
        _ => Ok(()),
    }
}

/// The largest batch a file may ask for: more slots per round trip than
/// this only reserves ahead what a crash would strand.
const MOST_BATCH: usize = 1024;
const MOST_TIMEOUT: Duration = Duration::from_secs(60);
const MOST_INTERVAL: Duration = Duration::from_secs(3600);

impl StoreConfig {
    /// Every field that cannot work, as the first [`ConfigError`] (under
    /// `store.`): neither or both of `redis` and `cluster`, a zero or
    /// outsized duration or batch, a zero fleet.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        let within = |e: ConfigError| e.within("store");
        let shapes = [
            self.redis.is_some(),
            !self.cluster.is_empty(),
            !self.sentinels.is_empty(),
        ];
        match shapes.iter().filter(|&&given| given).count() {
            0 => Err(ConfigError::new(
                "redis",
                "a store needs `redis = \"redis://…\"`, `cluster = [\"redis://…\", …]` or `sentinels`",
            )),
            1 => Ok(()),
            _ => Err(ConfigError::new(
                "cluster",
                "give one of `redis` (one node), `cluster` and `sentinels`",
            )),
        }
        .map_err(within)?;
        if self.sentinels.is_empty()
            && let Some(field) = [
                ("master_user", self.master_user.is_some()),
                ("master_password_env", self.master_password_env.is_some()),
            ]
            .into_iter()
            .find_map(|(field, given)| given.then_some(field))
        {
            return Err(within(ConfigError::new(
                field,
                "is for a Sentinel's master: a node's URL carries its own credentials",
            )));
        }
        together(
            ("sentinels", !self.sentinels.is_empty()),
            ("service", self.service.is_some()),
            "sentinels need the `service` (master name) they watch",
            "`service` is the master name of `sentinels`",
        )
        .map_err(within)?;
        together(
            ("client_cert_file", self.client_cert_file.is_some()),
            ("client_key_file", self.client_key_file.is_some()),
            "a client certificate needs its key",
            "a client key needs its certificate",
        )
        .map_err(within)?;
        if self.fleet_size == Some(0) {
            return Err(within(ConfigError::new(
                "fleet_size",
                "a fleet has at least one instance",
            )));
        }
        if let Some(batch) = self.batch
            && !(1..=MOST_BATCH).contains(&batch)
        {
            return Err(within(ConfigError::new(
                "batch",
                format!("{batch} is not between 1 and {MOST_BATCH}"),
            )));
        }
        let durations = [
            ("timeout", self.timeout, MOST_TIMEOUT),
            ("connect_timeout", self.connect_timeout, MOST_TIMEOUT),
            ("horizon", self.horizon, MOST_INTERVAL),
            ("probe_every", self.probe_every, MOST_INTERVAL),
        ];
        for (field, duration, most) in durations {
            if let Some(duration) = duration
                && (duration.is_zero() || duration > most)
            {
                return Err(within(ConfigError::new(
                    field,
                    format!(
                        "must be longer than zero and at most {}, not {}",
                        human::format(most),
                        human::format(duration)
                    ),
                )));
            }
        }
        Ok(())
    }

    /// Connect to the store the table declares; a node that cannot be
    /// reached now fails here, naming the field.
    #[cfg(feature = "redis")]
    pub(super) async fn connect(&self) -> Result<crate::store::Store, ConfigError> {
        use crate::store::{Clock, RedisStore};

        self.check()?;
        let mut options = RedisStore::options();
        if let Some(size) = self.fleet_size {
            options = options.fleet_size(size);
        }
        if let Some(prefix) = &self.prefix {
            options = options.prefix(prefix.clone());
        }
        if let Some(timeout) = self.timeout {
            options = options.timeout(timeout);
        }
        if let Some(timeout) = self.connect_timeout {
            options = options.connect_timeout(timeout);
        }
        if let Some(batch) = self.batch {
            options = options.batch(batch);
        }
        if let Some(horizon) = self.horizon {
            options = options.horizon(horizon);
        }
        if let Some(every) = self.probe_every {
            options = options.probe_every(every);
        }
        if self.instance_clock {
            options = options.clock(Clock::Instances);
        }
        options = self.with_certificates(options)?;
        let (field, connected) = match (&self.redis, &self.service) {
            (Some(url), _) => ("store.redis", options.connect(url).await),
            (None, Some(service)) => ("store.sentinels", self.sentinel(options, service).await?),
            (None, None) => ("store.cluster", options.cluster(&self.cluster).await),
        };
        connected
            .map(Into::into)
            .map_err(|e| ConfigError::new(field, format!("cannot connect: {e}")))
    }

    #[cfg(feature = "redis-sentinel")]
    async fn sentinel(
        &self,
        mut options: crate::store::RedisOptions,
        service: &str,
    ) -> Result<Result<crate::store::RedisStore, crate::store::StoreError>, ConfigError> {
        if let Some(variable) = &self.master_password_env {
            let password = std::env::var(variable)
                .ok()
                .filter(|password| !password.is_empty())
                .ok_or_else(|| {
                    ConfigError::new(
                        "master_password_env",
                        format!("`{variable}` is not set, or empty"),
                    )
                    .within("store")
                })?;
            let user = self.master_user.as_deref().unwrap_or("default");
            options = options.master_auth(user, password);
        } else if self.master_user.is_some() {
            return Err(ConfigError::new(
                "master_password_env",
                "`master_user` needs the variable that holds its password",
            )
            .within("store"));
        }
        Ok(options.sentinel(&self.sentinels, service).await)
    }

    #[cfg(all(feature = "redis", not(feature = "redis-sentinel")))]
    async fn sentinel(
        &self,
        _: crate::store::RedisOptions,
        _: &str,
    ) -> Result<Result<crate::store::RedisStore, crate::store::StoreError>, ConfigError> {
        Err(ConfigError::new(
            "sentinels",
            "Sentinel needs callshaper's `redis-sentinel` feature",
        )
        .within("store"))
    }

    /// The options with the TLS files' certificates, read now.
    #[cfg(feature = "redis-tls")]
    fn with_certificates(
        &self,
        mut options: crate::store::RedisOptions,
    ) -> Result<crate::store::RedisOptions, ConfigError> {
        let read = |field: &str, path: &PathBuf| {
            std::fs::read(path).map_err(|e| {
                ConfigError::new(field, format!("cannot read {}: {e}", path.display()))
                    .within("store")
            })
        };
        if let Some(path) = &self.ca_file {
            options = options.ca_roots(read("ca_file", path)?);
        }
        if let (Some(cert), Some(key)) = (&self.client_cert_file, &self.client_key_file) {
            options = options.client_certificate(
                read("client_cert_file", cert)?,
                read("client_key_file", key)?,
            );
        }
        Ok(options)
    }

    /// Without the `redis-tls` feature, a TLS file is refused.
    #[cfg(all(feature = "redis", not(feature = "redis-tls")))]
    fn with_certificates(
        &self,
        options: crate::store::RedisOptions,
    ) -> Result<crate::store::RedisOptions, ConfigError> {
        let given = [
            ("ca_file", &self.ca_file),
            ("client_cert_file", &self.client_cert_file),
        ];
        match given.into_iter().find(|(_, path)| path.is_some()) {
            Some((field, _)) => Err(ConfigError::new(
                field,
                "TLS files need callshaper's `redis-tls` feature",
            )
            .within("store")),
            None => Ok(options),
        }
    }
}
