//! A real Redis Sentinel deployment for tests: a master, a replica, and
//! one or three `redis-server --sentinel` processes watching them.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::redis::{LAUNCHES, RedisServer, came_up, free_port, redis_cli};
use super::tls::TestCa;
use crate::store::RedisOptions;

/// The service name the sentinels watch.
const SERVICE: &str = "callshaper";

/// A master and its replica on free loopback ports, watched by sentinels
/// that fail over one second after the master stops answering
/// (`down-after-milliseconds 1000`): over plain TCP without passwords
/// ([`start`](Self::start)), or with every process speaking mutual TLS and
/// the data nodes asking for a password ([`secured`](Self::secured)).
/// Every process is killed when dropped.
///
/// # Panics
///
/// [`start`](Self::start) panics when `redis-server` is missing, or the
/// sentinels do not see the replica and each other within 20 s.
#[derive(Debug)]
pub struct RedisSentinel {
    /// The data nodes: the first master first, then its replica.
    pub nodes: Vec<RedisServer>,
    sentinels: Vec<(Child, u16)>,
    dir: PathBuf,
    tls: Option<Arc<TestCa>>,
    password: Option<String>,
}

impl RedisSentinel {
    /// Start a master, a replica in sync with it, and `sentinels` sentinels
    /// (a quorum of a majority of them).
    pub fn start(sentinels: usize) -> Self {
        Self::launch(sentinels, None, None)
    }

    /// As [`start`](Self::start), with every process on mutual TLS (a
    /// [`TestCa`] of its own) and the master and replica asking for the
    /// password `password` (user `default`).
    pub fn secured(sentinels: usize, password: &str) -> Self {
        Self::launch(sentinels, Some(Arc::new(TestCa::new())), Some(password))
    }

    fn launch(sentinels: usize, tls: Option<Arc<TestCa>>, password: Option<&str>) -> Self {
        let master = RedisServer::secured(tls.clone(), password);
        let replica = RedisServer::replica_of(&master);
        let dir = std::env::temp_dir().join(format!(
            "callshaper-sentinel-{}-{}",
            master.port,
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("a scratch directory for the sentinels");
        let quorum = sentinels / 2 + 1;
        let mut deployment = Self {
            nodes: vec![master, replica],
            sentinels: Vec::new(),
            dir,
            tls,
            password: password.map(str::to_owned),
        };
        for _ in 0..sentinels {
            let sentinel = deployment.sentinel(quorum);
            deployment.sentinels.push(sentinel);
        }
        deployment.wait_until_ready(sentinels);
        deployment
    }

    /// A sentinel of this deployment, answering on a free port: one whose
    /// port was taken before it bound it (it ends at once) starts again on
    /// another, [`LAUNCHES`] ports at most.
    fn sentinel(&self, quorum: usize) -> (Child, u16) {
        for _ in 0..LAUNCHES {
            let port = free_port();
            let mut child = self.spawn_sentinel(port, quorum);
            if came_up(&mut child, port, || {
                self.sentinel_cli(port, &["info", "server"])
            }) {
                return (child, port);
            }
        }
        panic!("no sentinel started on any of {LAUNCHES} free ports");
    }

    /// Start a sentinel on `port`, watching the first master, one of
    /// `quorum` that must agree on a failover.
    fn spawn_sentinel(&self, port: u16, quorum: usize) -> Child {
        let conf = self.dir.join(format!("sentinel-{port}.conf"));
        let mut text = match &self.tls {
            None => format!("port {port}\n"),
            Some(ca) => format!(
                "port 0\ntls-port {port}\ntls-cert-file {}\ntls-key-file {}\n\
                 tls-ca-cert-file {}\ntls-auth-clients yes\ntls-replication yes\n",
                ca.path("server.crt").display(),
                ca.path("server.key").display(),
                ca.path("ca.crt").display(),
            ),
        };
        text.push_str(&format!(
            "bind 127.0.0.1\ndir {}\n\
             sentinel monitor {SERVICE} 127.0.0.1 {} {quorum}\n\
             sentinel down-after-milliseconds {SERVICE} 1000\n\
             sentinel failover-timeout {SERVICE} 5000\n",
            self.dir.display(),
            self.nodes[0].port,
        ));
        if let Some(password) = &self.password {
            text.push_str(&format!("sentinel auth-pass {SERVICE} {password}\n"));
        }
        std::fs::write(&conf, text).expect("a sentinel's configuration");
        Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("redis-server, to run as a sentinel")
    }

    fn wait_until_ready(&self, sentinels: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let replica = self.nodes[1].port.to_string();
        for &(_, port) in &self.sentinels {
            let ready = || {
                let replicas = self.sentinel_cli(port, &["sentinel", "replicas", SERVICE]);
                let known = self.sentinel_cli(port, &["sentinel", "sentinels", SERVICE]);
                let synced = self.nodes[1]
                    .cli(&["info", "replication"])
                    .contains("master_link_status:up");
                replicas.contains(&replica)
                    && synced
                    && known.matches("\nip\n").count() + 1 >= sentinels
            };
            while !ready() {
                assert!(
                    Instant::now() < deadline,
                    "the sentinel on {port} did not see the replica and the other sentinels"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Every sentinel's URL: `rediss://` when [`secured`](Self::secured).
    pub fn urls(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        self.sentinels
            .iter()
            .map(|(_, port)| format!("{scheme}://127.0.0.1:{port}"))
            .collect()
    }

    /// The default store options, with this deployment's CA, client
    /// certificate and the master's password when
    /// [`secured`](Self::secured).
    ///
    /// # Panics
    ///
    /// When secured without the `redis-tls` and `redis-sentinel` features.
    pub fn options(&self) -> RedisOptions {
        secure(self.nodes[0].options(), self.password.as_deref())
    }

    /// The service the sentinels watch: the name to give
    /// `RedisStore::sentinel`.
    pub fn service(&self) -> &str {
        SERVICE
    }

    /// The index in [`nodes`](Self::nodes) of the master the sentinels
    /// name now.
    pub fn master(&self) -> Option<usize> {
        let &(_, port) = self.sentinels.first()?;
        let reply = self.sentinel_cli(port, &["sentinel", "get-master-addr-by-name", SERVICE]);
        let master: u16 = reply.lines().nth(1)?.trim().parse().ok()?;
        self.nodes.iter().position(|node| node.port == master)
    }
}

impl RedisSentinel {
    /// Ask the first sentinel for a failover now (`SENTINEL FAILOVER`),
    /// without agreement from the others: its reply.
    pub fn failover(&self) -> String {
        let Some(&(_, port)) = self.sentinels.first() else {
            return String::new();
        };
        self.sentinel_cli(port, &["sentinel", "failover", SERVICE])
    }

    fn sentinel_cli(&self, port: u16, args: &[&str]) -> String {
        redis_cli(port, self.tls.as_deref(), None, args)
    }
}

#[cfg(feature = "redis-sentinel")]
fn secure(options: RedisOptions, password: Option<&str>) -> RedisOptions {
    match password {
        Some(password) => options.master_auth("default", password),
        None => options,
    }
}

#[cfg(not(feature = "redis-sentinel"))]
fn secure(options: RedisOptions, password: Option<&str>) -> RedisOptions {
    assert!(
        password.is_none(),
        "a master's password needs the `redis-sentinel` feature"
    );
    options
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        for (child, _) in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
