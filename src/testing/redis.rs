//! Real `redis-server` processes for tests, examples and benchmarks of a
//! fleet: each on a free loopback port, empty, stopped when dropped.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::tls::TestCa;
use crate::store::{RedisOptions, RedisStore};

/// The variable that runs every fleet test over TLS: with
/// `CALLSHAPER_TEST_REDIS=tls`, [`RedisServer::start`] and
/// [`RedisCluster::start`] start TLS servers (mutual TLS, a CA made for
/// them), and their [`options`](RedisServer::options) trust it.
/// `scripts/test` runs the fleet suites both ways.
pub const TRANSPORT_VARIABLE: &str = "CALLSHAPER_TEST_REDIS";

/// True when [`TRANSPORT_VARIABLE`] asks for TLS.
///
/// # Panics
///
/// When it holds anything but `tcp` or `tls`: a typo must not quietly run
/// the suite over plain TCP.
fn tls_asked() -> bool {
    match std::env::var(TRANSPORT_VARIABLE).as_deref() {
        Err(_) | Ok("" | "tcp") => false,
        Ok("tls") => true,
        Ok(other) => panic!("{TRANSPORT_VARIABLE}={other}: use `tcp` or `tls`"),
    }
}

fn transport() -> Option<Arc<TestCa>> {
    tls_asked().then(|| Arc::new(TestCa::new()))
}

/// A `redis-server` of its own on a free loopback port, no persistence,
/// killed when dropped.
///
/// # Panics
///
/// [`start`](Self::start) panics, with what to install, when
/// `redis-server` is missing or does not answer: a fleet test must never
/// pass without Redis.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
    dir: PathBuf,
    cluster: bool,
    tls: Option<Arc<TestCa>>,
    /// More `redis-server` arguments (a replica's `--replicaof`).
    extra: Vec<String>,
    /// Its `requirepass` (and `masterauth`), when it has one.
    password: Option<String>,
}

pub(super) fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    listener.local_addr().expect("its address").port()
}

/// Where a cluster node's bus listens: 10,000 above its port.
const BUS_OFFSET: u16 = 10_000;

/// A port for a cluster node whose bus port ([`BUS_OFFSET`] above) is
/// free too, both below the range the kernel hands out for `bind(0)` and
/// outgoing connections (32768 and up on Linux): there another test's
/// server or connection could take the bus port between the choice and
/// the node's own bind, and a port above 55535 has no bus port at all.
fn free_cluster_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    const FIRST: u16 = 20_000;
    const SPAN: u64 = 2_768;
    for _ in 0..1_000 {
        // A random start: tests in parallel, each forming a cluster, do
        // not walk the same ports in the same order.
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let port = FIRST + u16::try_from(random % SPAN).unwrap_or(0);
        let free = |port: u16| TcpListener::bind(("127.0.0.1", port)).is_ok();
        if free(port) && free(port + BUS_OFFSET) {
            return port;
        }
    }
    panic!("no free loopback port pair for a cluster node in 20000-22767 and 30000-32767");
}

/// Wait until `child`, started on `port`, answers there as itself (`info`
/// reads what the server on the port says of itself, `INFO server`): a
/// server of another test that took the port first answers too, with its
/// own process id. False when `child` ended first.
///
/// # Panics
///
/// When it does neither within ten seconds (killed first).
pub(super) fn came_up(child: &mut Child, port: u16, info: impl Fn() -> String) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if is_process(&info(), child.id()) {
            return true;
        }
        if child.try_wait().is_ok_and(|status| status.is_some()) {
            return false;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("redis-server on {port} did not answer within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `info`, what a server says of itself (`INFO server`), is the
/// process `pid`'s.
fn is_process(info: &str, pid: u32) -> bool {
    let itself = format!("process_id:{pid}");
    info.lines().any(|line| line.trim_end() == itself)
}

/// How many ports a first launch tries: a port chosen free may be taken
/// before the server binds it, by another test's server or connection.
pub(super) const LAUNCHES: usize = 5;

/// Send one inline command and read the first reply chunk.
fn command(port: u16, line: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(format!("{line}\r\n").as_bytes()).ok()?;
    let mut buf = [0u8; 4096];
    let n = stream.read(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

impl RedisServer {
    /// Start one and wait until it answers `PING`: over plain TCP, or
    /// over TLS when [`TRANSPORT_VARIABLE`] says `tls`.
    pub fn start() -> Self {
        Self::launch(free_port(), false, transport())
    }

    /// Start one that speaks only TLS and asks every client for a
    /// certificate (`tls-auth-clients yes`), with a [`TestCa`] of its own.
    pub fn start_tls() -> Self {
        Self::launch(free_port(), false, Some(Arc::new(TestCa::new())))
    }

    /// A master for a Sentinel deployment: over TLS with `tls`, asking for
    /// `password` when given (also as its `masterauth`, for when it is
    /// demoted).
    pub(super) fn secured(tls: Option<Arc<TestCa>>, password: Option<&str>) -> Self {
        let mut server = Self::new(free_port(), false, tls);
        server.protect(password);
        server.spawn_free();
        server
    }

    /// A replica of `master`, on a free port, over the same transport and
    /// with the same password.
    pub(super) fn replica_of(master: &RedisServer) -> Self {
        let mut replica = Self::new(free_port(), false, master.tls.clone());
        replica.extra = vec![
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            master.port.to_string(),
        ];
        replica.protect(master.password.as_deref());
        replica.spawn_free();
        replica
    }

    fn protect(&mut self, password: Option<&str>) {
        if let Some(password) = password {
            self.extra
                .extend(["--requirepass", password, "--masterauth", password].map(str::to_owned));
            self.password = Some(password.to_owned());
        }
    }

    fn launch(port: u16, cluster: bool, tls: Option<Arc<TestCa>>) -> Self {
        let mut server = Self::new(port, cluster, tls);
        server.spawn_free();
        server
    }

    fn new(port: u16, cluster: bool, tls: Option<Arc<TestCa>>) -> Self {
        let dir =
            std::env::temp_dir().join(format!("callshaper-redis-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory for redis-server");
        Self {
            child: None,
            port,
            dir,
            cluster,
            tls,
            extra: Vec::new(),
            password: None,
        }
    }

    /// Start it on its port, or, when the server ends before it answers
    /// (its port, or a cluster node's bus port, taken meanwhile), on
    /// another free one: [`LAUNCHES`] ports at most.
    fn spawn_free(&mut self) {
        for _ in 1..LAUNCHES {
            if self.try_spawn().is_ok() {
                return;
            }
            self.port = if self.cluster {
                free_cluster_port()
            } else {
                free_port()
            };
        }
        self.spawn();
    }

    /// Start it again on its own port (a restart keeps its address).
    fn spawn(&mut self) {
        if let Err(why) = self.try_spawn() {
            panic!("redis-server on {} did not answer PING: {why}", self.port);
        }
    }

    /// Start it, and wait until it answers as itself ([`came_up`]): `Err`
    /// with what it logged when it ended first.
    ///
    /// # Panics
    ///
    /// When `redis-server` is missing, or runs but does not answer
    /// within ten seconds.
    fn try_spawn(&mut self) -> Result<(), String> {
        let port = self.port.to_string();
        let files = self.tls.as_ref().map(|ca| {
            ["server.crt", "server.key", "ca.crt"]
                .map(|f| ca.path(f).to_string_lossy().into_owned())
        });
        let mut args = match &files {
            None => vec!["--port", &port],
            Some([cert, key, ca]) => vec![
                "--port",
                "0",
                "--tls-port",
                &port,
                "--tls-cert-file",
                cert,
                "--tls-key-file",
                key,
                "--tls-ca-cert-file",
                ca,
                "--tls-auth-clients",
                "yes",
                "--tls-replication",
                "yes",
                "--tls-cluster",
                "yes",
            ],
        };
        args.extend(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]);
        let dir = self.dir.to_string_lossy().into_owned();
        args.extend(["--dir", &dir]);
        if self.cluster {
            args.extend(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"]);
        }
        args.extend(self.extra.iter().map(String::as_str));
        // Its log, to say why when it ends at once.
        let log_path = self.dir.join(format!("redis-{port}.log"));
        let log = std::fs::File::create(&log_path).expect("a log file for redis-server");
        let mut child = Command::new("redis-server")
            .args(&args)
            .stdout(log)
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|error| {
                panic!(
                    "cannot start redis-server ({error}): a fleet needs a real Redis. \
                     Run scripts/test, which installs it, or `apt-get install redis-server`."
                )
            });
        if !came_up(&mut child, self.port, || self.info()) {
            let logged = std::fs::read_to_string(&log_path).unwrap_or_default();
            return Err(logged.lines().last().unwrap_or("no log").to_owned());
        }
        self.child = Some(child);
        Ok(())
    }

    /// What the server on its port says of itself (`INFO server`).
    fn info(&self) -> String {
        match (&self.tls, &self.password) {
            (None, None) => command(self.port, "INFO server").unwrap_or_default(),
            _ => self.cli(&["INFO", "server"]),
        }
    }

    /// `redis://127.0.0.1:{port}`, or `rediss://` over TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The CA its certificate comes from, when it speaks TLS.
    pub fn tls(&self) -> Option<&TestCa> {
        self.tls.as_deref()
    }

    /// The default store options, trusting this server's CA and carrying
    /// its client certificate when it speaks TLS.
    ///
    /// # Panics
    ///
    /// Over TLS without the `redis-tls` feature.
    pub fn options(&self) -> RedisOptions {
        with_certificates(RedisStore::options(), self.tls.as_deref())
    }

    /// Start it again on the same port with a certificate from a new CA,
    /// as a rotation to a CA its clients do not trust looks to them.
    ///
    /// # Panics
    ///
    /// When it does not speak TLS.
    pub fn reissue(&mut self) {
        assert!(
            self.tls.is_some(),
            "reissue: this server does not speak TLS"
        );
        self.kill();
        self.tls = Some(Arc::new(TestCa::new()));
        self.spawn();
    }

    /// Kill it as a crash would (SIGKILL): no goodbye to clients.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stop it without closing anything (SIGSTOP), as a hung host or a
    /// network partition looks to clients: connections stay open and no
    /// answer comes, so only a timeout ends a call.
    ///
    /// # Panics
    ///
    /// When the signal cannot be sent.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Let a [`freeze`](Self::freeze)d server run again (SIGCONT); it
    /// answers what was sent to it meanwhile.
    ///
    /// # Panics
    ///
    /// As [`freeze`](Self::freeze).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let Some(child) = &self.child else { return };
        // The shell's own `kill`: every system has `sh`, not every one
        // has the `kill` program.
        let status = Command::new("sh")
            .args(["-c", &format!("kill {signal} {}", child.id())])
            .status()
            .expect("sh, to signal redis-server");
        assert!(status.success(), "kill {signal} redis-server failed");
    }

    /// Start it again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Run a command with `redis-cli` against this server; its output.
    ///
    /// # Panics
    ///
    /// When `redis-cli` is missing.
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(
            self.port,
            self.tls.as_deref(),
            self.password.as_deref(),
            args,
        )
    }
}

/// Run `redis-cli` against the server (or sentinel) on `port`, over TLS
/// with `tls`'s client certificate, authenticated with `password`; its
/// output.
///
/// # Panics
///
/// When `redis-cli` is missing.
pub(super) fn redis_cli(
    port: u16,
    tls: Option<&TestCa>,
    password: Option<&str>,
    args: &[&str],
) -> String {
    let output = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(tls_args(tls))
        .args(password.iter().flat_map(|p| ["--no-auth-warning", "-a", p]))
        .args(args)
        .output()
        .expect("redis-cli (Debian: apt-get install redis-tools)");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[cfg(feature = "redis-tls")]
fn with_certificates(options: RedisOptions, tls: Option<&TestCa>) -> RedisOptions {
    match tls {
        Some(ca) => options
            .ca_roots(ca.ca_pem())
            .client_certificate(ca.client_pem(), ca.client_key_pem()),
        None => options,
    }
}

#[cfg(not(feature = "redis-tls"))]
fn with_certificates(options: RedisOptions, tls: Option<&TestCa>) -> RedisOptions {
    assert!(tls.is_none(), "a TLS Redis needs the `redis-tls` feature");
    options
}

/// `redis-cli`'s arguments for a server's TLS.
fn tls_args(tls: Option<&TestCa>) -> Vec<String> {
    let Some(ca) = tls else { return Vec::new() };
    let file = |f: &str| ca.path(f).to_string_lossy().into_owned();
    vec![
        "--tls".to_owned(),
        "--cacert".to_owned(),
        file("ca.crt"),
        "--cert".to_owned(),
        file("client.crt"),
        "--key".to_owned(),
        file("client.key"),
    ]
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A real Redis Cluster: three masters (each with a replica, from
/// [`with_replicas`](Self::with_replicas)), slots spread by `redis-cli
/// --cluster create`, a node timeout of 2 s.
#[derive(Debug)]
pub struct RedisCluster {
    /// Its nodes: the masters first as created, then their replicas.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Start three cluster-enabled servers, join them with `redis-cli
    /// --cluster create`, and wait until every node says `cluster_state:ok`.
    ///
    /// # Panics
    ///
    /// When `redis-server` or `redis-cli` is missing, or the cluster does
    /// not form.
    pub fn start() -> Self {
        Self::form(0)
    }

    /// Start three masters and a replica of each (six servers), and wait
    /// until every replica is in sync: a master killed then fails over to
    /// its replica after the node timeout.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn with_replicas() -> Self {
        Self::form(1)
    }

    fn form(replicas: usize) -> Self {
        let tls = transport();
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| RedisServer::launch(free_cluster_port(), true, tls.clone()))
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .args(tls_args(tls.as_deref()))
            .output()
            .expect("redis-cli (Debian: apt-get install redis-tools)");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let cluster = Self { nodes };
        let deadline = Instant::now() + Duration::from_secs(20);
        for (index, node) in cluster.nodes.iter().enumerate() {
            let ready = || {
                node.cli(&["cluster", "info"]).contains("cluster_state:ok")
                    && (cluster.master_of(index).is_none()
                        || node
                            .cli(&["info", "replication"])
                            .contains("master_link_status:up"))
            };
            while !ready() {
                assert!(Instant::now() < deadline, "the cluster did not become ok");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        cluster
    }

    /// Every node's URL.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The default store options, with the nodes' CA and client
    /// certificate when they speak TLS.
    ///
    /// # Panics
    ///
    /// As [`RedisServer::options`].
    pub fn options(&self) -> RedisOptions {
        with_certificates(
            RedisStore::options(),
            self.nodes.first().and_then(RedisServer::tls),
        )
    }

    /// The index of the node that node `index` replicates, if it is a
    /// replica of a node of this cluster that is still running.
    pub fn master_of(&self, index: usize) -> Option<usize> {
        let info = self.nodes.get(index)?.cli(&["info", "replication"]);
        if !info.contains("role:slave") {
            return None;
        }
        let port: u16 = info
            .lines()
            .find_map(|line| line.strip_prefix("master_port:"))?
            .trim()
            .parse()
            .ok()?;
        self.nodes
            .iter()
            .position(|node| node.port == port && node.child.is_some())
    }

    /// The index of a replica of node `index`.
    pub fn replica_of(&self, index: usize) -> Option<usize> {
        (0..self.nodes.len()).find(|&other| self.master_of(other) == Some(index))
    }

    /// True when node `index` serves as a master.
    pub fn is_master(&self, index: usize) -> bool {
        self.nodes
            .get(index)
            .is_some_and(|node| node.cli(&["role"]).starts_with("master"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port chosen free and taken before the server binds it (here, by a
    /// listener that never answers) costs a retry on another, not the
    /// test: the server that answers is this one, on its new port.
    #[test]
    fn a_server_whose_port_was_taken_starts_on_another() {
        let taken = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = taken.local_addr().expect("its address").port();
        let server = RedisServer::launch(port, false, None);
        assert_ne!(server.port, port);
        let pid = server.child.as_ref().expect("running").id();
        assert!(is_process(&server.info(), pid));
    }

    /// A cluster node's port leaves room for its bus port, 10,000 above,
    /// and both are below the kernel's range for ports it hands out.
    #[test]
    fn a_cluster_port_has_its_bus_port_free_below_the_ephemeral_range() {
        let port = free_cluster_port();
        assert!((20_000..22_768).contains(&port), "{port}");
        assert!(TcpListener::bind(("127.0.0.1", port + BUS_OFFSET)).is_ok());
    }
}
