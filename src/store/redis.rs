//! The Redis store: connections, the scripts, the pause channel, and each
//! lane's link to its gates' keys ([`SharedStore`] and [`StoreLane`] for
//! Redis and Redis Cluster).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{ErrorKind, FromRedisValue, Script, ServerErrorKind};
use tokio::sync::oneshot;

use super::contract::{FleetBooked, Pending, Reservation, SharedStore, StoreLane, StoreSettings};
use super::handle::Store;
use crate::error::StoreError;
use crate::gate::{Gate, PauseCause};
use crate::meters::{Algorithm, Quota, Unit};
use crate::sync::{lock, shrink};
use crate::time::micros;

static RESERVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("meters.lua"),
        include_str!("reserve.lua")
    ))
});
static PAUSE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("meters.lua"),
        include_str!("pause.lua")
    ))
});
static SETTLE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("meters.lua"),
        include_str!("settle.lua")
    ))
});

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
    prefix: String,
    timeout: Duration,
    batch: usize,
    horizon: Duration,
    probe_every: Duration,
    fleet_size: u32,
    clock: Clock,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            prefix: "callshaper:".to_owned(),
            timeout: Duration::from_millis(250),
            batch: 16,
            horizon: Duration::from_secs(1),
            probe_every: Duration::from_secs(1),
            fleet_size: 1,
            clock: Clock::Redis,
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
    /// down (250 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
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

    /// Connect to one Redis (or Valkey) node, e.g. `redis://127.0.0.1:6379`.
    /// Fails when it cannot be reached now: a wrong URL shows at startup.
    pub async fn connect(self, url: &str) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(url).map_err(failed)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_number_of_retries(1);
        let connecting = ConnectionManager::new_with_config(client.clone(), config);
        let conn = within(self.timeout, connecting).await?;
        RedisStore::start(self, Conn::Single(conn), vec![client]).await
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
            .map(|url| redis::Client::open(url.as_str()).map_err(failed))
            .collect::<Result<Vec<_>, _>>()?;
        let cluster = ClusterClient::builder(urls)
            .connection_timeout(self.timeout)
            .response_timeout(self.timeout)
            .retries(1)
            .build()
            .map_err(failed)?;
        let conn = within(self.timeout, cluster.get_async_connection()).await?;
        RedisStore::start(self, Conn::Cluster(conn), nodes).await
    }
}

/// Lane state in Redis or Redis Cluster, shared by every instance that
/// connects to it. Cheap to clone; give it to
/// [`ShaperBuilder::store`](crate::ShaperBuilder::store).
///
/// ```
/// use std::time::Duration;
/// use callshaper::{Shaper, StoreFailure, store::RedisStore};
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
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    options: RedisOptions,
    channel: String,
    /// Local gates by key, for pauses published by other instances.
    gates: Arc<Registry>,
    round_trips: AtomicU64,
    /// Dropped with the store: stops the pause listener.
    _listening: oneshot::Sender<()>,
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

fn failed(error: redis::RedisError) -> StoreError {
    StoreError::Failed(error.to_string())
}

async fn within<T>(
    timeout: Duration,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, StoreError> {
    answered(timeout, tokio::time::timeout(timeout, call).await)
}

fn answered<T>(
    timeout: Duration,
    answer: Result<redis::RedisResult<T>, tokio::time::error::Elapsed>,
) -> Result<T, StoreError> {
    // The connection's own response timeout (the same length) often fires
    // first: a timeout either way.
    match answer {
        Ok(Err(error)) if error.is_timeout() => Err(StoreError::Timeout(timeout)),
        Ok(answer) => answer.map_err(failed),
        Err(_) => Err(StoreError::Timeout(timeout)),
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

    /// Connect to a cluster with the default options.
    pub async fn cluster<S: AsRef<str>>(
        urls: impl IntoIterator<Item = S>,
    ) -> Result<Self, StoreError> {
        Self::options().cluster(urls).await
    }

    async fn start(
        options: RedisOptions,
        conn: Conn,
        pubsub: Vec<redis::Client>,
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
        let timeout = options.timeout;
        match tokio::time::timeout(timeout, subscribed).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => return Err(error),
            Ok(Err(_)) => return Err(StoreError::Failed("pause listener ended".to_owned())),
            Err(_) => return Err(StoreError::Timeout(timeout)),
        }
        Ok(Self {
            inner: Arc::new(Inner {
                conn,
                options,
                channel,
                gates,
                round_trips: AtomicU64::new(0),
                _listening: stop,
            }),
        })
    }

    /// Round trips to Redis so far (every script call, from every lane).
    pub fn round_trips(&self) -> u64 {
        self.inner.round_trips.load(Ordering::Relaxed)
    }

    fn key(&self, vendor: &str, gate: &str) -> String {
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

    fn now_arg(&self) -> i64 {
        match self.inner.options.clock {
            Clock::Redis => 0,
            Clock::Instances => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(1, |d| micros(d).max(1)),
        }
    }

    async fn invoke<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[String],
        args: &[i64],
        channel: Option<&str>,
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
        self.inner.round_trips.fetch_add(1, Ordering::Relaxed);
        let timeout = self.inner.options.timeout;
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
        }
    }
}

/// Subscribe to the pause channel on one of `nodes` and apply every pause
/// to the local gates of its key; when the connection drops, subscribe again
/// on the next node, until the store goes.
async fn listen(
    nodes: Vec<redis::Client>,
    channel: String,
    gates: Arc<Registry>,
    mut stop: oneshot::Receiver<()>,
    ready: oneshot::Sender<Result<(), StoreError>>,
) {
    let mut ready = Some(ready);
    let mut failed_in_a_row = 0;
    for client in nodes.iter().cycle() {
        // A host that does not answer must not hold the listener forever.
        let subscribed = within(Duration::from_secs(5), async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            redis::RedisResult::Ok(pubsub)
        });
        let pubsub = tokio::select! {
            _ = &mut stop => return,
            subscribed = subscribed => subscribed,
        };
        match pubsub {
            Ok(mut pubsub) => {
                failed_in_a_row = 0;
                if let Some(ready) = ready.take() {
                    let _ = ready.send(Ok(()));
                }
                let mut messages = pubsub.on_message();
                loop {
                    tokio::select! {
                        _ = &mut stop => return,
                        message = messages.next() => match message {
                            Some(message) => apply_pause(&gates, message.get_payload_bytes()),
                            None => break,
                        },
                    }
                }
            }
            Err(error) => {
                failed_in_a_row += 1;
                // At startup, every node gets one try before the store
                // reports the failure.
                if failed_in_a_row >= nodes.len()
                    && let Some(ready) = ready.take()
                {
                    let _ = ready.send(Err(error));
                    return;
                }
            }
        }
        if ready.is_some() {
            continue;
        }
        // Lost: pauses published meanwhile still reach this instance with
        // its next reservation, which starts after them.
        tokio::select! {
            _ = &mut stop => return,
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

/// A pause message: `key\nmicroseconds left`.
fn apply_pause(gates: &Registry, payload: &[u8]) {
    let Ok(text) = std::str::from_utf8(payload) else {
        return;
    };
    let Some((key, left)) = text.rsplit_once('\n') else {
        return;
    };
    let Ok(left) = left.parse::<u64>() else {
        return;
    };
    let local: Vec<Arc<Gate>> = lock(gates)
        .get(key)
        .map(|gates| gates.iter().filter_map(Weak::upgrade).collect())
        .unwrap_or_default();
    for gate in local {
        gate.pause_for(Duration::from_micros(left), PauseCause::Fleet, None);
    }
}

fn duration(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

/// Local gates by key: several shapers of one process may share a store,
/// each with its own gate for a key.
type Registry = Mutex<HashMap<String, Vec<Weak<Gate>>>>;

fn spec(quota: &Quota, headroom: Duration) -> [i64; SPEC] {
    let (algorithm, capacity) = match quota.algorithm {
        Algorithm::LeakyBucket(rate) => (1, u64::from(rate.count)),
        Algorithm::TokenBucket { capacity, .. } => (2, capacity),
        Algorithm::FixedWindow(rate) => (3, u64::from(rate.count)),
        Algorithm::SlidingLog(rate) => (4, u64::from(rate.count)),
        Algorithm::SlidingWindow(rate) => (5, u64::from(rate.count)),
        // `ShaperBuilder::build` refuses a custom meter with a store; were
        // one to come this far, the fleet keeps to its declared rate.
        Algorithm::Custom(ref meter) => (1, u64::from(meter.rate().count)),
    };
    let rate = quota.rate();
    let unit = match quota.unit {
        Unit::Requests => 0,
        Unit::Cost => 1,
    };
    [
        algorithm,
        unit,
        i64::from(rate.count),
        micros(rate.per.saturating_add(headroom)),
        clamp(capacity),
        micros(rate.per),
    ]
}

/// Numbers per meter in a gate's spec (see `meters.lua`).
const SPEC: usize = 6;

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl SharedStore for RedisStore {
    fn settings(&self) -> StoreSettings {
        let options = &self.inner.options;
        StoreSettings {
            batch: options.batch,
            horizon: options.horizon,
            probe_every: options.probe_every,
            fleet_size: options.fleet_size,
        }
    }

    fn lane(
        &self,
        names: &[String],
        quotas: &[Vec<Quota>],
        headroom: Duration,
        keep: Duration,
        gates: &[Arc<Gate>],
    ) -> Box<dyn StoreLane> {
        let vendor = names.last().map_or("", String::as_str);
        let keys: Vec<String> = names.iter().map(|name| self.key(vendor, name)).collect();
        {
            let mut registry = lock(&self.inner.gates);
            for (key, gate) in keys.iter().zip(gates) {
                let same = registry.entry(key.clone()).or_default();
                if !same.iter().any(|known| known.as_ptr() == Arc::as_ptr(gate)) {
                    same.push(Arc::downgrade(gate));
                }
            }
        }
        let specs = quotas
            .iter()
            .map(|quotas| quotas.iter().flat_map(|q| spec(q, headroom)).collect())
            .collect();
        Box::new(RedisLane {
            store: self.clone(),
            keys,
            specs,
            headroom: micros(headroom),
            keep: micros(keep),
            booked: AtomicI64::new(0),
            me: fastrand::i64(1..i64::MAX),
        })
    }
}

impl From<RedisStore> for Store {
    fn from(store: RedisStore) -> Self {
        Store::new(store)
    }
}

/// A lane's gates in Redis: their keys and meters as script arguments.
struct RedisLane {
    store: RedisStore,
    keys: Vec<String>,
    /// Per gate: its meters as script arguments.
    specs: Vec<Vec<i64>>,
    headroom: i64,
    /// How long a gate's state matters once idle (us): every write's TTL.
    keep: i64,
    /// The latest slot this lane reserved, in store time (us; 0: none):
    /// a gate found empty before `booked + keep` lost its state.
    booked: AtomicI64,
    /// This lane's name among the fleet's for the fair share: random.
    me: i64,
}

impl RedisLane {
    /// The gate specs as script arguments, with each gate's pace now.
    fn spec_args(&self, paces: &[Option<Duration>], args: &mut Vec<i64>) {
        for (i, spec) in self.specs.iter().enumerate() {
            let pace = paces.get(i).copied().flatten().map_or(0, micros);
            args.push(pace);
            args.push(i64::try_from(spec.len() / SPEC).unwrap_or(0));
            args.extend_from_slice(spec);
        }
    }

    /// Correct charges, in the background: give back (`mode` 1) or settle
    /// (`mode` 0) `(t, charged, actual)` slots.
    fn correct(
        &self,
        mode: i64,
        slots: Vec<(i64, u64, u64)>,
        seqs: Vec<i64>,
        paces: &[Option<Duration>],
    ) {
        if slots.is_empty() {
            return;
        }
        let mut args = vec![self.store.now_arg(), self.headroom, mode];
        args.extend(seqs);
        args.push(i64::try_from(slots.len()).unwrap_or(0));
        for (t, charged, actual) in slots {
            args.extend([t, clamp(charged), clamp(actual)]);
        }
        self.spec_args(paces, &mut args);
        let store = self.store.clone();
        let keys = self.keys.clone();
        tokio::spawn(async move {
            let done: Result<i64, _> = store.invoke(&SETTLE, &keys, &args, None).await;
            if let Err(error) = done {
                tracing::debug!(%error, "callshaper: a correction did not reach Redis");
            }
        });
    }
}

impl StoreLane for RedisLane {
    fn reserve<'a>(
        &'a self,
        costs: &'a [u64],
        waiting: usize,
        paces: &'a [Option<Duration>],
    ) -> Pending<'a, Result<Reservation, StoreError>> {
        Box::pin(async move {
            let options = &self.store.inner.options;
            let mut args = vec![
                self.store.now_arg(),
                self.headroom,
                micros(options.horizon),
                self.keep,
                self.booked.load(Ordering::Relaxed),
                self.me,
                i64::try_from(waiting).unwrap_or(i64::MAX),
                i64::try_from(costs.len()).unwrap_or(0),
            ];
            args.extend(costs.iter().map(|&c| clamp(c)));
            self.spec_args(paces, &mut args);
            let reply: Vec<i64> = self.store.invoke(&RESERVE, &self.keys, &args, None).await?;
            let malformed = || StoreError::Failed(format!("unexpected reserve reply {reply:?}"));
            let gates = self.keys.len();
            let (head, rest) = reply.split_at_checked(4 + gates).ok_or_else(malformed)?;
            let &[now, hold, paused, lost] = &head[..4] else {
                return Err(malformed());
            };
            // Each slot's wait, then two numbers per slot and gate.
            let per_slot = 1 + 2 * gates;
            if rest.len() % per_slot != 0 {
                return Err(malformed());
            }
            let (waits, booked) = rest.split_at(rest.len() / per_slot);
            let slots: Vec<i64> = waits
                .iter()
                .map(|&w| now.saturating_add(w.max(0)))
                .collect();
            let fleet = booked
                .chunks_exact(2 * gates.max(1))
                .map(|slot| {
                    slot.chunks_exact(2)
                        .map(|pair| {
                            Some(FleetBooked {
                                count: u64::try_from(pair[0]).ok()?,
                                leaves: (pair[1] >= 0).then_some(pair[1]),
                            })
                        })
                        .collect()
                })
                .collect();
            if let Some(&latest) = slots.last() {
                self.booked.fetch_max(latest, Ordering::Relaxed);
            }
            Ok(Reservation {
                now,
                slots,
                hold: (hold > 0).then(|| duration(hold.saturating_sub(now))),
                paused: (paused > now).then(|| duration(paused.saturating_sub(now))),
                lost: lost == 1,
                seqs: head[4..].to_vec(),
                fleet,
            })
        })
    }

    fn give_back(&self, slots: Vec<(i64, u64)>, seqs: Vec<i64>, paces: &[Option<Duration>]) {
        let slots = slots.into_iter().map(|(t, c)| (t, c, 0)).collect();
        self.correct(1, slots, seqs, paces);
    }

    fn forget(&self, slots: Vec<(i64, u64)>, paces: &[Option<Duration>]) {
        let slots = slots.into_iter().map(|(t, c)| (t, c, 0)).collect();
        let seqs = vec![0; self.keys.len()];
        self.correct(2, slots, seqs, paces);
    }

    fn settle(&self, t: i64, charged: u64, actual: u64, paces: &[Option<Duration>]) {
        let seqs = vec![0; self.keys.len()];
        self.correct(0, vec![(t, charged, actual)], seqs, paces);
    }

    fn pause(&self, pause: Duration) {
        let args = [self.store.now_arg(), micros(pause), self.keep];
        let store = self.store.clone();
        let keys = self.keys.clone();
        tokio::spawn(async move {
            let channel = store.inner.channel.clone();
            let done: Result<i64, _> = store.invoke(&PAUSE, &keys, &args, Some(&channel)).await;
            if let Err(error) = done {
                tracing::warn!(%error, "callshaper: a pause did not reach Redis; other instances learn it from their own throttles");
            }
        });
    }
}

impl Drop for RedisLane {
    fn drop(&mut self) {
        // Forget the gates no lane holds any more (ours among them, when
        // ours was the last lane holding it).
        let mut registry = lock(&self.store.inner.gates);
        for key in &self.keys {
            if let Some(same) = registry.get_mut(key) {
                same.retain(|known| known.strong_count() > 0);
                if same.is_empty() {
                    registry.remove(key);
                }
            }
        }
        shrink(&mut registry);
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use crate::testing::RedisServer;

    /// The scripts read the clock they are given, and Redis's `TIME`
    /// otherwise: what `Clock::Instances` relies on.
    #[tokio::test]
    async fn scripts_read_the_instance_clock_when_given_one() {
        let server = RedisServer::start();
        let store = RedisStore::connect(&server.url()).await.unwrap();
        // One leaky-bucket meter of 10 per second, no pace; one slot of cost 1.
        let spec = [0, 1, 1, 0, 10, 1_000_000, 10, 1_000_000];
        // Clock, headroom, horizon, keep, booked, me, waiting, n, its cost.
        let reserve = |now: i64| {
            let mut args = vec![now, 0, 1_000_000, 2_000_000, 0, 7, 1, 1, 1];
            args.extend(spec);
            args
        };
        let keys = ["callshaper:{t}:clock".to_owned()];
        let given = 1_234_567_890_000_000;
        let reply: Vec<i64> = store
            .invoke(&RESERVE, &keys, &reserve(given), None)
            .await
            .unwrap();
        assert_eq!(reply[0], given, "the instance's clock");

        let wall = micros(SystemTime::now().duration_since(UNIX_EPOCH).unwrap());
        let reply: Vec<i64> = store
            .invoke(&RESERVE, &keys, &reserve(0), None)
            .await
            .unwrap();
        assert!(
            (reply[0] - wall).abs() < 5_000_000,
            "Redis TIME: {} vs {wall}",
            reply[0]
        );

        // And each store sends what its option says.
        assert_eq!(store.now_arg(), 0);
        let instances = RedisStore::options()
            .clock(Clock::Instances)
            .connect(&server.url())
            .await
            .unwrap();
        assert!((instances.now_arg() - wall).abs() < 5_000_000);
    }

    /// Each slot comes with what the fleet booked in its window ending at
    /// it, and slots given back leave that count (whether or not the
    /// meters could take them back).
    #[tokio::test]
    async fn each_slot_says_what_the_fleet_booked_in_its_window() {
        let server = RedisServer::start();
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let second = Duration::from_secs(1);
        let lane_of = |name: &str, count| {
            let quotas = [vec![Quota::leaky_bucket(count, second)]];
            store.lane(&[name.to_owned()], &quotas, Duration::ZERO, 2 * second, &[])
        };
        let lane = lane_of("ledger", 10);
        let paces = [None];
        let count = |r: &Reservation| -> Vec<u64> {
            r.fleet
                .iter()
                .map(|gates| gates[0].unwrap().count)
                .collect()
        };
        // A lane's first reservation books one slot, the next the rest.
        let first = lane.reserve(&[1], 5, &paces).await.unwrap();
        assert_eq!(count(&first), [1]);
        let t0 = first.slots[0];
        let leaves = first.fleet[0][0].unwrap().leaves.unwrap();
        let tick = 1_000_000 / 32;
        assert!(
            (t0 + 1_000_000..t0 + 1_000_000 + tick).contains(&leaves),
            "the oldest leaves the window a window after it, within a tick: {}",
            leaves - t0
        );
        let rest = lane.reserve(&[1; 4], 4, &paces).await.unwrap();
        assert_eq!(count(&rest), [2, 3, 4, 5]);

        let mut latest: Vec<(i64, u64)> = rest.slots[2..].iter().map(|&t| (t, 1)).collect();
        latest.reverse();
        lane.give_back(latest, rest.seqs.clone(), &paces);
        // The give-back runs in the background; the next slot is due after
        // slot 2 (given back) or 4 (not) alike.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let again = lane.reserve(&[1], 1, &paces).await.unwrap();
        assert_eq!(count(&again), [4], "slots 0 to 2, and this one");

        // A slot forgotten before one still held (a pause ending between
        // them) leaves the ledger but stays charged: the next slot keeps
        // its interval to the held one.
        let held = lane.reserve(&[1; 2], 2, &paces).await.unwrap();
        assert_eq!(count(&held), [5, 6]);
        lane.forget(vec![(held.slots[0], 1)], &paces);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let next = lane.reserve(&[1], 1, &paces).await.unwrap();
        assert_eq!(count(&next), [6], "the forgotten slot is not counted");
        assert!(
            next.slots[0] - held.slots[1] >= 100_000,
            "the meter kept it: {} us after the held slot",
            next.slots[0] - held.slots[1]
        );

        // At a high rate a reservation's slots share their ticks.
        let fast = lane_of("fast", 1_000_000);
        let first = fast.reserve(&[1], 16, &paces).await.unwrap();
        let rest = fast.reserve(&[1; 15], 15, &paces).await.unwrap();
        let counts: Vec<u64> = count(&first).into_iter().chain(count(&rest)).collect();
        assert_eq!(counts, (1..=16).collect::<Vec<u64>>());
    }
}
