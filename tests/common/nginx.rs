//! A real nginx on a free loopback port: with `limit_req` for the tests
//! of strict limiters (the limiter as nginx itself computes it, not a
//! model of it), or as the proxy benchmark's `proxy_pass` anchor. Stopped
//! when dropped; a test fails, loudly, without nginx.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// nginx serving `/ok` under `limit_req zone=... rate=<rate>r/s`
/// (`burst=<burst> nodelay` when there is one) and `limit_req_status 429`, at `http://127.0.0.1:{port}`.
pub struct Nginx {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    listener.local_addr().expect("its address").port()
}

/// Where nginx is: on the PATH, or where Debian puts it (outside a
/// non-root PATH).
fn binary() -> String {
    ["nginx", "/usr/sbin/nginx"]
        .into_iter()
        .find(|candidate| {
            Command::new(candidate)
                .arg("-v")
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|status| status.success())
        })
        .unwrap_or_else(|| {
            panic!(
                "nginx is missing: the strict-limiter tests and the proxy benchmark run a \
                 real nginx. Run scripts/test, which installs it, or `apt-get install nginx-light`."
            )
        })
        .to_owned()
}

impl Nginx {
    /// One serving `/ok` under `limit_req`, started, once it answers.
    pub fn start(rate: u32, burst: u32) -> Self {
        // nginx takes no `burst=0`: without a burst, none.
        let burst = match burst {
            0 => String::new(),
            n => format!(" burst={n} nodelay"),
        };
        // `limit_req` runs in the pre-access phase: a `return` (rewrite
        // phase) would skip it, so the page is a static file.
        Self::serving(|port, dir| {
            std::fs::create_dir_all(dir.join("html")).expect("a scratch directory for nginx");
            std::fs::write(dir.join("html/ok"), "ok\n").expect("the page nginx serves");
            format!(
                "limit_req_zone $binary_remote_addr zone=lane:1m rate={rate}r/s;\n  \
                 server {{\n    listen 127.0.0.1:{port};\n    root {}/html;\n    \
                 location / {{ limit_req zone=lane{burst}; limit_req_status 429; }}\n  }}",
                dir.display()
            )
        })
    }

    /// One worker serving what `http(port, dir)` writes inside its `http`
    /// block (its `server` listening on `127.0.0.1:{port}`, its files under
    /// the scratch directory `dir`), started, once it answers.
    pub fn serving(http: impl FnOnce(u16, &std::path::Path) -> String) -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("callshaper-nginx-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory for nginx");
        let served = http(port, &dir);
        let d = dir.display();
        let config = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log;\nevents {{ worker_connections 16384; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  \
             proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  \
             uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  {served}\n}}\n"
        );
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, config).expect("nginx.conf");
        let child = Command::new(binary())
            .arg("-p")
            .arg(&dir)
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("nginx starts");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "nginx on {port} did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { child, port, dir }
    }

    /// The limited page.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/ok", self.port)
    }

    /// nginx's process, to read its memory.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
