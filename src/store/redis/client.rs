//! The Redis store itself: its connections (standalone or Cluster), the
//! scripts' calls, and the pause channel that reaches every instance's
//! gates.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{ErrorKind, FromRedisValue, Script, ServerErrorKind};
use tokio::sync::oneshot;

use super::errors::{answered, failed, within};
use super::options::{Clock, RedisOptions};
use super::pauses::{Nodes, Registry, listen};
use super::scripts::PERMISSIONS;
use crate::error::StoreError;
use crate::time::micros;

/// Lane state in Redis or Redis Cluster, shared by every instance that
/// connects to it. Cheap to clone; give it to
/// [`ShaperBuilder::store`](crate::shaper::ShaperBuilder::store).
///
/// ```
/// use std::time::Duration;
/// use callshaper::{Shaper, store::RedisStore};
/// use callshaper::store::StoreFailure;
/// # use callshaper::testing::{RedisServer, Vendor};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = RedisServer::start();
/// # let url = server.url();
/// # let vendor = Vendor::strict(10, Duration::from_secs(1)).start().await;
/// // `url`: "redis://127.0.0.1:6379", say.
/// let redis = RedisStore::options().fleet_size(3).connect(&url).await?;
/// let shaper = Shaper::builder()
///     .rate(10, Duration::from_secs(1))
///     .store(redis)
///     .on_store_failure(StoreFailure::Open)
///     .build()?;
/// let response = shaper.get(vendor.uri()).send().await?;
/// assert_eq!(response.status(), 200);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) conn: Conn,
    pub(super) options: RedisOptions,
    pub(super) channel: String,
    /// Local gates by key, for pauses published by other instances.
    pub(super) gates: Arc<Registry>,
    pub(super) round_trips: AtomicU64,
    /// Dropped with the store: stops the pause listener.
    pub(super) _listening: oneshot::Sender<()>,
}

#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    #[cfg(feature = "redis-sentinel")]
    Sentinel(Arc<super::sentinel::Followed>),
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Options with their defaults.
    pub fn options() -> RedisOptions {
        RedisOptions::default()
    }

    /// Connect to one node with the default options.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::options().connect(url).await
    }

    /// Follow the master `sentinels` name for `service`, with the default
    /// options (feature `redis-sentinel`).
    #[cfg(feature = "redis-sentinel")]
    pub async fn sentinel<S: AsRef<str>>(
        sentinels: impl IntoIterator<Item = S>,
        service: &str,
    ) -> Result<Self, StoreError> {
        Self::options().sentinel(sentinels, service).await
    }

    /// Connect to a cluster with the default options.
    pub async fn cluster<S: AsRef<str>>(
        urls: impl IntoIterator<Item = S>,
    ) -> Result<Self, StoreError> {
        Self::options().cluster(urls).await
    }

    pub(super) async fn start(
        options: RedisOptions,
        conn: Conn,
        pubsub: Nodes,
    ) -> Result<Self, StoreError> {
        let channel = format!("{}pauses", options.prefix);
        let gates = Arc::default();
        let (stop, stopped) = oneshot::channel();
        let (ready, subscribed) = oneshot::channel();
        tokio::spawn(listen(
            pubsub,
            channel.clone(),
            Arc::clone(&gates),
            stopped,
            ready,
        ));
        let timeout = options.connect_timeout;
        match tokio::time::timeout(timeout, subscribed).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => return Err(error),
            Ok(Err(_)) => return Err(StoreError::Failed("pause listener ended".to_owned())),
            Err(_) => return Err(StoreError::Timeout(timeout)),
        }
        let store = Self {
            inner: Arc::new(Inner {
                conn,
                options,
                channel,
                gates,
                round_trips: AtomicU64::new(0),
                _listening: stop,
            }),
        };
        store.check_permissions().await?;
        Ok(store)
    }

    /// Round trips to Redis so far (every script call, from every lane).
    pub fn round_trips(&self) -> u64 {
        self.inner.round_trips.load(Ordering::Relaxed)
    }

    pub(super) fn key(&self, vendor: &str, gate: &str) -> String {
        // The vendor's name is the hash tag: `{` and `}` inside it would end
        // or open another one.
        let tag: String = vendor
            .chars()
            .map(|c| match c {
                '{' => '(',
                '}' => ')',
                c => c,
            })
            .collect();
        let tag = if tag.is_empty() { "_".to_owned() } else { tag };
        format!("{}{{{tag}}}:{gate}", self.inner.options.prefix)
    }

    pub(super) fn now_arg(&self) -> i64 {
        match self.inner.options.clock {
            Clock::Redis => 0,
            Clock::Instances => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(1, |d| micros(d).max(1)),
        }
    }

    /// Run `script` within the store's timeout, counted as a round trip.
    pub(super) async fn invoke<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[String],
        args: &[i64],
        channel: Option<&str>,
    ) -> Result<T, StoreError> {
        self.inner.round_trips.fetch_add(1, Ordering::Relaxed);
        let timeout = self.inner.options.timeout;
        self.run(script, keys, args, channel, timeout).await
    }

    /// The first command of the scripts' the user may not run, as a
    /// [`StoreError::NotPermitted`]: named now, not by a first request's
    /// failure, whose message names none.
    async fn check_permissions(&self) -> Result<(), StoreError> {
        let key = self.key("_", "permissions");
        let channel = self.inner.channel.as_str();
        let timeout = self.inner.options.connect_timeout;
        let refused: Option<String> = self
            .run(&PERMISSIONS, &[key], &[], Some(channel), timeout)
            .await?;
        match refused {
            None => Ok(()),
            Some(command) => Err(StoreError::NotPermitted {
                message: format!(
                    "the ACL of the store's user refuses `{command}` on `{}*` (or the channel \
                     `{channel}`), which the fleet's scripts run",
                    self.inner.options.prefix
                ),
                command,
            }),
        }
    }

    async fn run<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[String],
        args: &[i64],
        channel: Option<&str>,
        timeout: Duration,
    ) -> Result<T, StoreError> {
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(key);
        }
        for arg in args {
            invocation.arg(arg);
        }
        if let Some(channel) = channel {
            invocation.arg(channel);
        }
        match self.inner.conn.clone() {
            Conn::Single(mut conn) => within(timeout, invocation.invoke_async(&mut conn)).await,
            Conn::Cluster(mut conn) => {
                let answer =
                    tokio::time::timeout(timeout, invocation.invoke_async(&mut conn)).await;
                let demoted = matches!(&answer, Ok(Err(error))
                    if error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly));
                if let (true, Some(key)) = (demoted, keys.first()) {
                    // redis-rs sends READONLY on every cluster connection,
                    // so a master demoted to a replica (a failover, the old
                    // master back) runs a script as a read and refuses its
                    // first write, where it would redirect a write to the
                    // new master, and the client never learns the new map.
                    // The script wrote nothing: clear the flag on that
                    // node's connection and run it again, which the
                    // replica now redirects.
                    let route = Route::with_key(key, SlotAddr::Master);
                    let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                    within(timeout, conn.route_command(redis::cmd("READWRITE"), node)).await?;
                    return within(timeout, invocation.invoke_async(&mut conn)).await;
                }
                answered(timeout, answer)
            }
            #[cfg(feature = "redis-sentinel")]
            Conn::Sentinel(followed) => {
                let call = async {
                    let mut master = followed.master().await?;
                    invocation.invoke_async(&mut master).await
                };
                let answer = tokio::time::timeout(timeout, call).await;
                followed.heard(&answer);
                answered(timeout, answer)
            }
        }
    }
}

pub(super) fn duration(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

impl RedisOptions {
    /// Connect to one Redis (or Valkey) node, e.g. `redis://127.0.0.1:6379`.
    /// Fails when it cannot be reached now: a wrong URL shows at startup.
    pub async fn connect(self, url: &str) -> Result<RedisStore, StoreError> {
        let client = self.tls.client(url)?;
        let connecting = ConnectionManager::new_with_config(client.clone(), self.manager());
        let conn = within(self.connect_timeout, connecting).await?;
        RedisStore::start(self, Conn::Single(conn), Nodes::Listed(vec![client])).await
    }

    /// Connect to a Redis Cluster through any of its nodes.
    pub async fn cluster<S: AsRef<str>>(
        self,
        urls: impl IntoIterator<Item = S>,
    ) -> Result<RedisStore, StoreError> {
        let urls: Vec<String> = urls.into_iter().map(|u| u.as_ref().to_owned()).collect();
        if urls.is_empty() {
            return Err(StoreError::Failed("no cluster node given".to_owned()));
        }
        // Pause messages: in a cluster, PUBLISH reaches subscribers on every
        // node, so any one node's channel is enough; the listener moves to
        // the next node when its node fails.
        let nodes = urls
            .iter()
            .map(|url| self.tls.client(url))
            .collect::<Result<Vec<_>, _>>()?;
        let cluster = ClusterClient::builder(urls)
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.timeout)
            .retries(1);
        #[cfg(feature = "redis-tls")]
        let cluster = match self.tls.redis() {
            Some(certificates) => cluster.certs(certificates),
            None => cluster,
        };
        let cluster = cluster.build().map_err(failed)?;
        let conn = within(self.connect_timeout, cluster.get_async_connection()).await?;
        RedisStore::start(self, Conn::Cluster(conn), Nodes::Listed(nodes)).await
    }

    /// Follow the master `sentinels` name for `service` (a Redis Sentinel
    /// deployment), through every failover: each of `sentinels` is a URL
    /// such as `redis://10.0.0.7:26379`. Fails when no sentinel names a
    /// master now, or the master cannot be reached.
    ///
    /// ```
    /// use callshaper::store::RedisStore;
    /// # use callshaper::testing::RedisSentinel;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let deployment = RedisSentinel::start(1);
    /// # let sentinels = deployment.urls();
    /// // `sentinels`: ["redis://10.0.0.7:26379", …], say.
    /// let redis = RedisStore::options()
    ///     .fleet_size(3)
    ///     .sentinel(&sentinels, "callshaper")
    ///     .await?;
    /// # drop(redis);
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis-sentinel")]
    pub async fn sentinel<S: AsRef<str>>(
        self,
        sentinels: impl IntoIterator<Item = S>,
        service: &str,
    ) -> Result<RedisStore, StoreError> {
        let sentinels: Vec<String> = sentinels
            .into_iter()
            .map(|u| u.as_ref().to_owned())
            .collect();
        let followed = Arc::new(super::sentinel::Followed::new(
            &sentinels,
            service,
            &self,
            self.manager(),
        )?);
        within(self.connect_timeout, followed.master()).await?;
        followed.listen();
        let nodes = Nodes::Sentinel(Arc::clone(&followed));
        RedisStore::start(self, Conn::Sentinel(followed), nodes).await
    }

    /// How a connection to one node is kept: reconnect once within a call,
    /// bounded by the timeouts.
    fn manager(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.timeout))
            .set_number_of_retries(1)
    }
}
