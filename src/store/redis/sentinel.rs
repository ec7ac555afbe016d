//! Redis Sentinel: the master the sentinels name for a service, followed
//! through a failover (feature `redis-sentinel`).
//!
//! A `ConnectionManager` reconnects to one address; after a failover that
//! address is gone or a replica. So the store keeps a connection to the
//! master it was last told of, forgets it when a call shows it lost (the
//! connection failed, no answer, a demoted master's `READONLY`), and asks
//! the sentinels again on the next call, one caller at a time.

use std::sync::RwLock;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ErrorKind, IntoConnectionInfo, RedisResult, ServerErrorKind, TlsMode};

use crate::error::StoreError;
use crate::sync::{read, write};

use super::errors::failed;
use super::options::RedisOptions;

/// The user and password of a Sentinel's master and replicas.
#[derive(Clone)]
pub(crate) struct MasterAuth {
    pub(super) user: String,
    pub(super) password: String,
}

impl std::fmt::Debug for MasterAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never a password in a log line.
        f.debug_struct("MasterAuth")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// The master of one service, as the sentinels last named it.
pub(crate) struct Followed {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    master: RwLock<Option<ConnectionManager>>,
    config: ConnectionManagerConfig,
}

impl Followed {
    /// Ask `sentinels` for the master of `service`; the first connection is
    /// made by the first call. The sentinels' URLs carry their own
    /// credentials; with `rediss://` ones, the master is reached over TLS
    /// too, with the options' certificates; the master's credentials are
    /// the options' [`master_auth`](RedisOptions::master_auth).
    pub(super) fn new(
        sentinels: &[String],
        service: &str,
        options: &RedisOptions,
        config: ConnectionManagerConfig,
    ) -> Result<Self, StoreError> {
        let first = sentinels
            .first()
            .ok_or_else(|| StoreError::Failed("no sentinel given".to_owned()))?;
        for url in sentinels {
            options.tls.check(url)?;
        }
        let infos = sentinels
            .iter()
            .map(|url| url.as_str().into_connection_info().map_err(failed))
            .collect::<Result<Vec<_>, _>>()?;
        let tls = first.starts_with("rediss://");
        let addrs = infos.iter().map(|info| info.addr().clone());
        let mut builder = SentinelClientBuilder::new(addrs, service, SentinelServerType::Master)
            .map_err(failed)?;
        let own = infos[0].redis_settings();
        if let Some(user) = own.username() {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(password) = own.password() {
            builder = builder.set_client_to_sentinel_password(password);
        }
        if let Some(auth) = &options.master_auth {
            builder = builder
                .set_client_to_redis_username(&auth.user)
                .set_client_to_redis_password(&auth.password);
        }
        if tls {
            builder = builder
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(TlsMode::Secure);
            builder = with_certificates(builder, options);
        }
        let client = builder.build().map_err(failed)?;
        Ok(Self {
            sentinels: tokio::sync::Mutex::new(client),
            master: RwLock::new(None),
            config,
        })
    }

    /// A connection to the master: the one in use, or a new one to the
    /// master the sentinels name now.
    pub(super) async fn master(&self) -> RedisResult<ConnectionManager> {
        if let Some(master) = read(&self.master).clone() {
            return Ok(master);
        }
        let mut sentinels = self.sentinels.lock().await;
        // Another caller may have asked while this one waited.
        if let Some(master) = read(&self.master).clone() {
            return Ok(master);
        }
        let client = sentinels.async_get_client().await?;
        let master = ConnectionManager::new_with_config(client, self.config.clone()).await?;
        *write(&self.master) = Some(master.clone());
        Ok(master)
    }

    /// A client for the master the sentinels name now, for the pause
    /// channel's subscription.
    pub(super) async fn master_client(&self) -> RedisResult<redis::Client> {
        self.sentinels.lock().await.async_get_client().await
    }

    /// After a call's answer: forget the master when the answer shows it
    /// lost, so the next call asks the sentinels.
    pub(super) fn heard<T>(&self, answer: &Result<RedisResult<T>, tokio::time::error::Elapsed>) {
        let lost = match answer {
            Ok(Ok(_)) => false,
            Err(_) => true,
            Ok(Err(error)) => {
                error.is_io_error()
                    || error.is_connection_dropped()
                    || error.is_connection_refusal()
                    || error.is_timeout()
                    || error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
            }
        };
        if lost {
            *write(&self.master) = None;
        }
    }
}

#[cfg(feature = "redis-tls")]
fn with_certificates(
    builder: SentinelClientBuilder,
    options: &RedisOptions,
) -> SentinelClientBuilder {
    match options.tls.redis() {
        Some(certificates) => builder
            .set_client_to_redis_certificates(certificates.clone())
            .set_client_to_sentinel_certificates(certificates),
        None => builder,
    }
}

#[cfg(not(feature = "redis-tls"))]
fn with_certificates(builder: SentinelClientBuilder, _: &RedisOptions) -> SentinelClientBuilder {
    builder
}
