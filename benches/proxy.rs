//! What the shaper and the proxy add: latency and throughput through a
//! `Shaper` in process and through `callshaper::proxy`, side by side with
//! direct reqwest and nginx `proxy_pass` (the anchor for a proxy on this
//! machine), against a loopback origin that answers at once (with OpenAI's rate-limit
//! headers, as a real vendor does), with a quota
//! far above the load; and the proxy's memory with 10,000 open client
//! connections.
//!
//! ```text
//! cargo bench --bench proxy
//! ```
//!
//! Each side runs alike for all: the origin on a runtime thread of
//! its own, the client on the main thread, and each proxy in a process of
//! its own on one thread (the library's `Proxy`, the code the
//! `callshaper-proxy` binary serves, in a child of this benchmark; nginx
//! with one worker). Needs nginx (`scripts/test` installs it).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use callshaper::Shaper;
use callshaper::proxy::Proxy;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[path = "common/answer.rs"]
mod answer;
// Its resident-set reading; this benchmark counts no heap.
#[allow(dead_code)]
#[path = "common/memory.rs"]
mod memory;
// The tests' nginx, whose limit_req page this benchmark does not use.
#[allow(dead_code)]
#[path = "../tests/common/nginx.rs"]
mod nginx;
use nginx::Nginx;

const SEQUENTIAL: usize = 5_000;
const CONCURRENT: usize = 64;
const THROUGHPUT_FOR: Duration = Duration::from_secs(3);
const CONNECTIONS: usize = 10_000;

/// Set in the child that serves the proxy: the origin's address.
const SERVE_PROXY: &str = "CALLSHAPER_BENCH_PROXY_OF";
const ROUNDS: usize = 3;

fn main() {
    if let Ok(origin) = std::env::var(SERVE_PROXY) {
        return serve_proxy(origin.parse().expect("the origin's address"));
    }
    let origin = on_own_thread(origin);
    let proxy = ProxyProcess::start(origin);
    // One worker, like the proxy's one thread, to the origin over
    // kept-alive connections.
    let nginx = Nginx::serving(|port, _| {
        format!(
            "upstream origin {{ server {origin}; keepalive 128; }}\n  \
             server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://origin; \
             proxy_http_version 1.1; proxy_set_header Connection \"\"; }} }}"
        )
    });
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let targets = [
        (
            "direct reqwest",
            format!("http://{origin}/ok"),
            Via::Reqwest,
        ),
        (
            "callshaper Shaper, in process",
            format!("http://{origin}/ok"),
            Via::Shaper,
        ),
        (
            "callshaper proxy",
            format!("http://{}/origin/ok", proxy.address),
            Via::Reqwest,
        ),
        (
            "nginx proxy_pass",
            format!("http://127.0.0.1:{}/ok", nginx.port),
            Via::Reqwest,
        ),
    ];
    client.block_on(async {
        println!(
            "loopback origin answering at once; quota 10,000,000/s; \
             median of {ROUNDS} rounds; each path's latency measured beside \
             direct reqwest's, the two in turn request by request\n"
        );
        let mut rows: Vec<Vec<Row>> = vec![Vec::new(); targets.len()];
        let paths: Vec<_> = targets
            .iter()
            .map(|(_, url, via)| (url.as_str(), *via))
            .collect();
        for _ in 0..ROUNDS {
            let mut rates = Vec::new();
            for (url, via) in &paths {
                rates.push(throughput(url, *via).await);
            }
            for (i, path) in paths.iter().enumerate().skip(1) {
                let [direct, this] = beside(paths[0], *path).await;
                rows[0].push(Row::of(direct, direct, rates[0]));
                rows[i].push(Row::of(this, direct, rates[i]));
            }
        }
        println!(
            "| path | p50 | p99 | direct beside it, p50 | added p50 | added p99 | \
             {CONCURRENT} clients, req/s |"
        );
        println!("|---|---|---|---|---|---|---|");
        for (i, (name, ..)) in targets.iter().enumerate() {
            let median = |column: fn(&Row) -> f64| {
                let mut all: Vec<f64> = rows[i].iter().map(column).collect();
                all.sort_by(f64::total_cmp);
                all[all.len() / 2]
            };
            println!(
                "| {name} | {:.0} µs | {:.0} µs | {:.0} µs | {:+.0} µs | {:+.0} µs | {:.0} |",
                median(|r| r.p50),
                median(|r| r.p99),
                median(|r| r.direct50),
                median(|r| r.p50 - r.direct50),
                median(|r| r.p99 - r.direct99),
                median(|r| r.rate),
            );
        }
        println!();
        connections(
            "callshaper proxy",
            proxy.address,
            proxy.child.id(),
            "/origin/ok",
        )
        .await;
        let nginx_address = SocketAddr::from(([127, 0, 0, 1], nginx.port));
        connections("nginx", nginx_address, nginx.pid(), "/ok").await;
    });
}

/// How a path's requests are sent: by reqwest alone, or through a
/// `Shaper` in this process (its lanes, under a quota far above the load).
#[derive(Clone, Copy)]
enum Via {
    Reqwest,
    Shaper,
}

/// A client of `via`'s kind.
#[derive(Clone)]
enum Client {
    Reqwest(reqwest::Client),
    Shaper(Shaper),
}

impl Client {
    fn new(via: Via) -> Self {
        match via {
            Via::Reqwest => Self::Reqwest(reqwest::Client::new()),
            Via::Shaper => Self::Shaper(
                Shaper::builder()
                    .rate(10_000_000, Duration::from_secs(1))
                    .build()
                    .unwrap(),
            ),
        }
    }
}

/// One path's round: its p50 and p99 in µs, and direct reqwest's measured
/// beside it (its own, for direct reqwest's row); its rate from
/// [`CONCURRENT`] clients.
#[derive(Clone, Copy)]
struct Row {
    p50: f64,
    p99: f64,
    direct50: f64,
    direct99: f64,
    rate: f64,
}

impl Row {
    fn of((p50, p99): (f64, f64), (direct50, direct99): (f64, f64), rate: f64) -> Self {
        Self {
            p50,
            p99,
            direct50,
            direct99,
            rate,
        }
    }
}

/// p50 and p99 in µs of two paths' requests, one at a time, the two
/// taken in turn request by request, first one then the other first: a
/// path and the one it is set against are measured over the same
/// milliseconds, so what the machine does meanwhile (a timer, another
/// process) falls on both alike. Measured a path after another, 5,000
/// requests each, the shaper's added p50 moved between +1 and +20 µs
/// from run to run.
async fn beside(one: (&str, Via), other: (&str, Via)) -> [(f64, f64); 2] {
    let paths = [one, other];
    let clients = paths.map(|(_, via)| Client::new(via));
    let mut took = [(); 2].map(|()| Vec::with_capacity(SEQUENTIAL));
    for round in 0..500 + SEQUENTIAL {
        for at in [round % 2, 1 - round % 2] {
            let started = Instant::now();
            send(&clients[at], paths[at].0).await;
            if round >= 500 {
                took[at].push(started.elapsed());
            }
        }
    }
    took.map(|mut took| {
        took.sort();
        let micros = |d: Duration| d.as_secs_f64() * 1e6;
        (
            micros(took[SEQUENTIAL / 2]),
            micros(took[SEQUENTIAL * 99 / 100]),
        )
    })
}

/// Requests a second from `CONCURRENT` clients sending back to back.
async fn throughput(url: &str, via: Via) -> f64 {
    let client = Client::new(via);
    let started = Instant::now();
    let workers: Vec<_> = (0..CONCURRENT)
        .map(|_| {
            let (client, url) = (client.clone(), url.to_owned());
            tokio::spawn(async move {
                let mut done = 0u64;
                while started.elapsed() < THROUGHPUT_FOR {
                    send(&client, &url).await;
                    done += 1;
                }
                done
            })
        })
        .collect();
    let mut done = 0;
    for worker in workers {
        done += worker.await.unwrap();
    }
    done as f64 / started.elapsed().as_secs_f64()
}

async fn send(client: &Client, url: &str) {
    let response = match client {
        Client::Reqwest(client) => client.get(url).send().await.expect("a request"),
        Client::Shaper(shaper) => shaper.get(url).send().await.expect("a request"),
    };
    assert!(
        response.status().is_success(),
        "{url}: {}",
        response.status()
    );
    response.bytes().await.expect("a body");
}

/// A process's resident memory.
fn rss(pid: u32) -> u64 {
    memory::resident(&pid.to_string())
}

/// Open `CONNECTIONS` connections to the proxy at `address` (process
/// `pid`), one request for `path` each (kept alive, then idle), and read
/// what its process grew by.
async fn connections(name: &str, address: SocketAddr, pid: u32, path: &str) {
    let before = rss(pid);
    let request = format!("GET {path} HTTP/1.1\r\nhost: proxy\r\n\r\n");
    let mut open = Vec::with_capacity(CONNECTIONS);
    let mut buf = vec![0u8; 4096];
    for i in 0..CONNECTIONS {
        let mut stream = match TcpStream::connect(address).await {
            Ok(stream) => stream,
            Err(error) => {
                println!("connection {i}: {error} (raise `ulimit -n` above {CONNECTIONS})");
                return;
            }
        };
        stream.write_all(request.as_bytes()).await.unwrap();
        let n = stream.read(&mut buf).await.unwrap();
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 200"),
            "{:?}",
            String::from_utf8_lossy(&buf[..n])
        );
        open.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss(pid);
    let grew = after.saturating_sub(before);
    drop(open);
    println!(
        "{name}: {:.1} MiB resident before, {:.1} MiB with {CONNECTIONS} open client \
         connections (one request each, then idle): {:.1} KiB a connection",
        before as f64 / (1 << 20) as f64,
        after as f64 / (1 << 20) as f64,
        grew as f64 / 1024.0 / CONNECTIONS as f64
    );
}

/// Bind a loopback listener on a thread and runtime of its own, and
/// `serve` it there; its address.
fn on_own_thread<F, Fut>(serve: F) -> SocketAddr
where
    F: FnOnce(TcpListener) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let (bound, address) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            bound.send(listener.local_addr().unwrap()).unwrap();
            serve(listener).await;
        });
    });
    address.recv().unwrap()
}

/// A loopback origin: `200 ok` at once, keep-alive.
async fn origin(listener: TcpListener) {
    loop {
        let (stream, _) = listener.accept().await.unwrap();
        tokio::spawn(async move {
            let service = service_fn(|_| async {
                let ok = hyper::Response::new(Full::new(Bytes::from_static(b"ok")));
                Ok::<_, Infallible>(answer::as_a_vendor(ok))
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The child's job: the proxy in front of `origin` on one runtime
/// thread, with a quota far above the load; its address on stdout.
fn serve_proxy(origin: SocketAddr) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let shaper = Shaper::builder()
            .rate(10_000_000, Duration::from_secs(1))
            .build()
            .unwrap();
        // Room for the idle connections the memory figure opens, beside
        // the clients the rounds before it left open (the default cap is
        // the same 10,000).
        let proxy = Proxy::builder(shaper)
            .upstream("origin", format!("http://{origin}"))
            .max_connections(2 * CONNECTIONS)
            .build()
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("{}", listener.local_addr().unwrap());
        proxy.serve(listener).await.unwrap();
    });
}

/// This benchmark again, serving the proxy (a process of its own, as
/// nginx is); killed when dropped.
struct ProxyProcess {
    child: Child,
    address: SocketAddr,
}

impl ProxyProcess {
    fn start(origin: SocketAddr) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(SERVE_PROXY, origin.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the proxy process starts");
        let mut line = String::new();
        let stdout = child.stdout.take().unwrap();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
        let address = line.trim().parse().expect("the proxy's address");
        Self { child, address }
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
