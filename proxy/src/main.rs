//! `callshaper-proxy`: callshaper's lanes as an egress proxy, one prefix
//! per vendor base URL, for any language or SDK that can set a base URL.
//!
//! ```text
//! callshaper-proxy --config vendors.toml
//! ```
//!
//! The file is a `ShaperConfig` (TOML, or JSON when it ends in `.json`):
//! each `[vendors.NAME]` with `upstream = "https://…"` is served at
//! `http://LISTEN/NAME/`, `[proxy]` says where it listens, and `[store]`
//! shares the quotas with every proxy and library instance on the same
//! Redis. The admin listener serves `/metrics`, `/lanes` and `/healthz`;
//! `SIGHUP`, or a change to the file, reloads the quotas; `SIGTERM` or
//! `SIGINT` closes the listener and lets the requests taken finish for
//! `[proxy] drain` (a second signal ends the drain at once).

mod admin;
mod file;
mod logs;
mod reload;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use tokio::net::TcpListener;

const USAGE: &str = "\
usage: callshaper-proxy --config FILE

  --config FILE   the shaper, its vendors' upstreams, [proxy] and [store]
                  (TOML, or JSON when FILE ends in .json)
  --help          this text
  --version       the version

environment:
  CALLSHAPER_LOG  what to log, e.g. `info` (default) or
                  `warn,callshaper=debug`";

#[tokio::main]
async fn main() -> ExitCode {
    let config = match config_path(std::env::args().skip(1)) {
        Ok(Some(path)) => path,
        Ok(None) => return ExitCode::SUCCESS,
        Err(problem) => {
            eprintln!("callshaper-proxy: {problem}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let Err(problem) = logs::init() {
        eprintln!("callshaper-proxy: {problem}");
        return ExitCode::from(2);
    }
    match run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure { code, message }) => {
            tracing::error!("callshaper-proxy: {message}");
            ExitCode::from(code)
        }
    }
}

/// The `--config` path, or `None` when the arguments asked for help or the
/// version (printed here).
fn config_path(mut args: impl Iterator<Item = String>) -> Result<Option<PathBuf>, String> {
    let mut config = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--help" | "-h" => {
                println!("{USAGE}");
                return Ok(None);
            }
            "--version" | "-V" => {
                println!("callshaper-proxy {}", env!("CARGO_PKG_VERSION"));
                return Ok(None);
            }
            "--config" | "-c" => {
                let path = args.next().ok_or("`--config` needs a file")?;
                config = Some(PathBuf::from(path));
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    config
        .map(Some)
        .ok_or_else(|| "`--config FILE` is needed".to_owned())
}

/// Why the proxy stopped, and its exit code: 2 for a file that cannot
/// work, 1 for anything else.
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn config(message: impl std::fmt::Display) -> Self {
        Self {
            code: 2,
            message: message.to_string(),
        }
    }

    fn io(message: impl std::fmt::Display) -> Self {
        Self {
            code: 1,
            message: message.to_string(),
        }
    }
}

/// Serve until a stop signal, or until the listener fails for good.
async fn run(path: PathBuf) -> Result<(), Failure> {
    let (config, text) = file::read(&path).await.map_err(Failure::config)?;
    let named = |e: callshaper::ConfigError| Failure::config(format!("{}: {e}", path.display()));
    let metrics = admin::install_recorder().map_err(Failure::io)?;
    let shaper = config
        .connect()
        .await
        .map_err(named)?
        .build()
        .map_err(named)?;
    let proxy = config.proxy(shaper.clone()).build().map_err(named)?;
    let settings = config.proxy.clone().unwrap_or_default();
    let drain = settings.drain().map_err(named)?;
    let listener = bind(settings.listen, "listen").await?;
    let admin = bind(settings.admin, "admin").await?;
    for (name, vendor) in &config.vendors {
        if let Some(upstream) = &vendor.upstream {
            tracing::info!(vendor = %name, %upstream, "callshaper-proxy: upstream");
        }
    }
    let address = |l: &TcpListener| l.local_addr().map_err(Failure::io);
    tracing::info!(
        listen = %address(&listener)?,
        admin = %address(&admin)?,
        store = config.store.is_some(),
        "callshaper-proxy: serving"
    );
    tokio::spawn(admin::serve(admin, shaper.clone(), metrics));
    tokio::spawn(reload::watch(path, text, shaper.clone()));
    let (stopping, stopped) = tokio::sync::oneshot::channel();
    let stop = async move {
        let signal = stop_signal().await;
        tracing::info!(
            %signal,
            ?drain,
            "callshaper-proxy: stopping; the listener is closed and the requests taken may finish"
        );
        let _ = stopping.send(());
    };
    let serving = proxy.serve_until(listener, stop);
    tokio::pin!(serving);
    let drained = tokio::select! {
        served = &mut serving => Some(served),
        () = async {
            let _ = stopped.await;
            tokio::select! {
                () = tokio::time::sleep(drain) => {}
                signal = stop_signal() => tracing::info!(%signal, "callshaper-proxy: asked again; not draining"),
            }
        } => {
            tracing::info!("callshaper-proxy: the drain is over; requests still waiting end with 503");
            None
        }
    };
    shaper.shutdown();
    let served = match drained {
        Some(served) => served,
        // The requests the shutdown ended are answered before the process
        // goes.
        None => tokio::time::timeout(Duration::from_secs(1), serving)
            .await
            .unwrap_or(Ok(())),
    };
    served.map_err(|e| Failure::io(format!("serving failed: {e}")))
}

async fn bind(address: SocketAddr, what: &str) -> Result<TcpListener, Failure> {
    TcpListener::bind(address)
        .await
        .map_err(|e| Failure::io(format!("cannot listen on {address} (`proxy.{what}`): {e}")))
}

/// The first of SIGINT and SIGTERM.
async fn stop_signal() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut terminate) = signal(SignalKind::terminate()) {
            return tokio::select! {
                () = interrupt() => "SIGINT",
                _ = terminate.recv() => "SIGTERM",
            };
        }
    }
    interrupt().await;
    "SIGINT"
}

/// Ctrl-C; never, where signals cannot be listened to.
async fn interrupt() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}
