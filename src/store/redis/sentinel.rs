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
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{ErrorKind, RedisResult, ServerErrorKind};

use crate::error::StoreError;
use crate::sync::{read, write};

use super::errors::failed;

/// The master of one service, as the sentinels last named it.
pub(crate) struct Followed {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    master: RwLock<Option<ConnectionManager>>,
    config: ConnectionManagerConfig,
}

impl Followed {
    /// Ask `sentinels` for the master of `service`; the first connection is
    /// made by the first call.
    pub(super) fn new(
        sentinels: Vec<String>,
        service: String,
        config: ConnectionManagerConfig,
    ) -> Result<Self, StoreError> {
        if sentinels.is_empty() {
            return Err(StoreError::Failed("no sentinel given".to_owned()));
        }
        let client = SentinelClient::build(sentinels, service, None, SentinelServerType::Master)
            .map_err(failed)?;
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
