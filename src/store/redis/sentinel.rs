//! Redis Sentinel: the master the sentinels name for a service, followed
//! through a failover (feature `redis-sentinel`).
//!
//! A `ConnectionManager` reconnects to one address; after a failover that
//! address is gone or a replica. So the store keeps a connection to the
//! master it was last told of, forgets it when a call shows it lost (the
//! connection failed, no answer, a demoted master's `READONLY`), and asks
//! the sentinels again on the next call, one caller at a time. It also
//! listens for the sentinels' `+switch-master`: then it forgets the master
//! at once and tells the lanes off the store (`Moves`) to try again now,
//! not at their next probe.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{Notify, watch};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ErrorKind, IntoConnectionInfo, RedisResult, ServerErrorKind, TlsMode};

use crate::error::StoreError;

use super::errors::{failed, within};
use super::options::RedisOptions;
use crate::store::contract::{MasterMoves, Moves};

/// What the store knows of the master.
#[derive(Clone)]
enum Master {
    /// Nothing yet, or forgotten: the next call asks.
    Unknown,
    /// Being asked of the sentinels and connected to, by a task of its own:
    /// a call that gives up at its timeout does not undo the handshakes.
    Asking,
    Known(ConnectionManager),
    /// The last asking failed; the next call asks again.
    Failed(redis::RedisError),
}

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
    service: String,
    master: watch::Sender<Master>,
    config: ConnectionManagerConfig,
    /// The longest one asking and connecting may take.
    connect_timeout: Duration,
    /// Counts the master's moves the sentinels announced, and the
    /// connections made.
    moves: watch::Sender<MasterMoves>,
    /// Told when this goes: the announcements' listener ends.
    gone: Arc<Notify>,
}

impl Drop for Followed {
    fn drop(&mut self) {
        // A permit, not a wake-up: the listener may be between waits.
        self.gone.notify_one();
    }
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
            service: service.to_owned(),
            master: watch::Sender::new(Master::Unknown),
            config,
            connect_timeout: options.connect_timeout,
            moves: watch::Sender::new(MasterMoves::default()),
            gone: Arc::new(Notify::new()),
        })
    }

    /// Start listening for the sentinels' announcements of a new master.
    pub(super) fn listen(self: &Arc<Self>) {
        tokio::spawn(announcements(Arc::downgrade(self), Arc::clone(&self.gone)));
    }

    /// Where the lanes hear that the master moved.
    pub(super) fn moves(&self) -> Moves {
        self.moves.subscribe()
    }

    /// The sentinels announced `payload` (`name old-ip old-port new-ip
    /// new-port`): for this service, the next call asks them again.
    fn announced(&self, payload: &str) {
        if payload.split(' ').next() == Some(self.service.as_str()) {
            self.forget();
            self.moves
                .send_modify(|moves| moves.announced = moves.announced.wrapping_add(1));
        }
    }

    /// A connection to the master: the one in use, or a new one to the
    /// master the sentinels name now (asked once, however many call).
    pub(super) async fn master(self: &Arc<Self>) -> RedisResult<ConnectionManager> {
        let mut master = self.master.subscribe();
        let mut asked = false;
        loop {
            let now = master.borrow_and_update().clone();
            match now {
                Master::Known(master) => return Ok(master),
                Master::Failed(error) if asked => return Err(error),
                Master::Unknown | Master::Failed(_) => {
                    self.ask();
                    asked = true;
                }
                Master::Asking => asked = true,
            }
            if master.changed().await.is_err() {
                return Err((ErrorKind::Io, "the store was dropped").into());
            }
        }
    }

    /// Ask the sentinels for the master and connect to it, in a task, unless
    /// that is under way.
    fn ask(self: &Arc<Self>) {
        let started = self.master.send_if_modified(|master| {
            let idle = !matches!(master, Master::Asking);
            if idle {
                *master = Master::Asking;
            }
            idle
        });
        if !started {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let asking = async {
                let client = this.sentinels.lock().await.async_get_client().await?;
                ConnectionManager::new_with_config(client, this.config.clone()).await
            };
            let outcome = match tokio::time::timeout(this.connect_timeout, asking).await {
                Ok(Ok(master)) => {
                    // A lane that gave up waiting for this tries again now.
                    this.moves
                        .send_modify(|moves| moves.connected = moves.connected.wrapping_add(1));
                    Master::Known(master)
                }
                Ok(Err(error)) => Master::Failed(error),
                Err(_) => Master::Failed(
                    std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no master within the connect timeout",
                    )
                    .into(),
                ),
            };
            this.master.send_replace(outcome);
        });
    }

    /// Forget a known master: the next call asks again.
    fn forget(&self) {
        self.master.send_if_modified(|master| {
            let known = matches!(master, Master::Known(_));
            if known {
                *master = Master::Unknown;
            }
            known
        });
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
            self.forget();
        }
    }
}

/// Subscribe to `+switch-master` on one of the sentinels and pass each
/// announcement on, subscribing again (on the first sentinel that answers)
/// when the connection drops, until the store goes.
async fn announcements(followed: Weak<Followed>, gone: Arc<Notify>) {
    loop {
        let Some(strong) = followed.upgrade() else {
            return;
        };
        let subscribed = within(Duration::from_secs(5), async {
            let client = strong
                .sentinels
                .lock()
                .await
                .async_get_sentinel_client()
                .await?;
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe("+switch-master").await?;
            RedisResult::Ok(pubsub)
        });
        let subscribed = tokio::select! {
            () = gone.notified() => return,
            subscribed = subscribed => subscribed,
        };
        drop(strong);
        if let Ok(mut pubsub) = subscribed {
            let mut messages = pubsub.on_message();
            loop {
                let message = tokio::select! {
                    () = gone.notified() => return,
                    message = messages.next() => message,
                };
                let Some(message) = message else { break };
                let Some(strong) = followed.upgrade() else {
                    return;
                };
                if let Ok(payload) = std::str::from_utf8(message.get_payload_bytes()) {
                    strong.announced(payload);
                }
            }
        }
        tokio::select! {
            () = gone.notified() => return,
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
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
