//! Serving a [`Proxy`] on a listener: one task per connection, HTTP/1.1,
//! each request through the shaper.

use std::convert::Infallible;
use std::io;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::answer;
use super::body::ProxyBody;
use super::builder::{Proxy, Served};
use super::forward::{controls, end_to_end, target};
use super::upload;

impl Proxy {
    /// Serve clients from `listener` until the returned future is dropped
    /// or the listener fails for good; a connection's own failure (a
    /// client gone, too many open files for a moment) ends only that
    /// connection.
    pub async fn serve(self, listener: TcpListener) -> io::Result<()> {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(error) if passes(&error) => {
                    tracing::warn!(%error, "callshaper proxy: accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                Err(error) => return Err(error),
            };
            // Without it, Nagle's algorithm holds an answer's last small
            // write for the client's delayed ACK: 40 ms a request.
            let _ = stream.set_nodelay(true);
            let served = self.inner.clone();
            tokio::spawn(async move {
                let limits = served.limits;
                let service = service_fn(move |request| {
                    let served = served.clone();
                    async move { Ok::<_, Infallible>(handle(&served, request).await) }
                });
                // A connection that fails (a client gone mid-request, a
                // head too large or too slow) concerns that client alone.
                let _ = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(limits.header_read_timeout)
                    .max_header_size(limits.max_header_bytes)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    }
}

/// An accept error that concerns one connection or passes by itself.
fn passes(error: &io::Error) -> bool {
    // EMFILE and ENFILE: out of file descriptors until some close.
    matches!(error.raw_os_error(), Some(23 | 24))
        || matches!(
            error.kind(),
            io::ErrorKind::ConnectionAborted
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::Interrupted
                | io::ErrorKind::WouldBlock
        )
}

/// One client request: refused, ended by the shaper, or the vendor's
/// answer.
async fn handle(served: &Served, request: Request<Incoming>) -> Response<ProxyBody> {
    let (parts, body) = request.into_parts();
    let url = match target(&parts.method, &parts.uri, &served.upstreams) {
        Ok(url) => url,
        Err(refusal) => {
            let names: Vec<&str> = served.upstreams.keys().map(String::as_str).collect();
            return answer::refused(&refusal, &names);
        }
    };
    let controls = match controls(&parts.headers) {
        Ok(controls) => controls,
        Err(refusal) => return answer::refused(&refusal, &[]),
    };
    let body = match upload::read(body, served.limits.replay_body).await {
        Ok(body) => body,
        Err(_) => return answer::cut_off_body(),
    };
    // The log names the upstream path only: a query, like the headers,
    // often carries a key.
    let (method, path) = (parts.method.clone(), url.path().to_owned());
    let mut send = served
        .shaper
        .request(parts.method, url)
        .headers(end_to_end(&parts.headers))
        .body(body)
        // The body relays to the client as it arrives: on the wire until
        // its last byte, or until the client goes.
        .in_flight_through_body();
    if let Some(max_wait) = controls.max_wait {
        send = send.max_wait(max_wait);
    }
    if let Some(cost) = controls.cost {
        send = send.cost(cost);
    }
    if let Some(tag) = controls.tag {
        send = send.tag(tag);
    }
    if let Some(priority) = controls.priority {
        send = send.priority(priority);
    }
    match send.send().await {
        Ok(response) => {
            tracing::debug!(%method, path, status = response.status().as_u16(), "callshaper proxy: answered");
            answer::vendor(response)
        }
        Err(error) => {
            tracing::debug!(%method, path, %error, "callshaper proxy: ended by the shaper");
            answer::shaper_ended(&error, &served.shaper)
        }
    }
}
