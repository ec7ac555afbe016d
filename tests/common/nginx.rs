//! A real nginx with `limit_req`, on a free loopback port, for the tests
//! of strict limiters: the limiter as nginx itself computes it, not a
//! model of it. Stopped when dropped; a test fails, loudly, without nginx.

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
                "nginx is missing: the strict-limiter tests run against a real nginx. \
                 Run scripts/test, which installs it, or `apt-get install nginx-light`."
            )
        })
        .to_owned()
}

impl Nginx {
    /// Start one and wait until it answers.
    pub fn start(rate: u32, burst: u32) -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("callshaper-nginx-{port}-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("html")).expect("a scratch directory for nginx");
        std::fs::write(dir.join("html/ok"), "ok\n").expect("the page nginx serves");
        let d = dir.display();
        // nginx takes no `burst=0`: without a burst, none.
        let burst = match burst {
            0 => String::new(),
            n => format!(" burst={n} nodelay"),
        };
        // `limit_req` runs in the pre-access phase: a `return` (rewrite
        // phase) would skip it, so the page is a static file.
        let config = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log;\nevents {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  \
             proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  \
             uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  \
             limit_req_zone $binary_remote_addr zone=lane:1m rate={rate}r/s;\n  \
             server {{\n    listen 127.0.0.1:{port};\n    root {d}/html;\n    \
             location / {{ limit_req zone=lane{burst}; limit_req_status 429; }}\n  }}\n}}\n"
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
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
