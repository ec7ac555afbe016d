//! Serving a [`Proxy`] on a listener: one task per connection, HTTP/1.1,
//! each request through the shaper.

use std::convert::Infallible;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::answer;
use super::body::ProxyBody;
use super::builder::{Proxy, Served};
use super::client::Client;
use super::forward::{admitted, controls, end_to_end, target};
use super::upload::{self, Cut};

impl Proxy {
    /// Serve clients from `listener` until the returned future is dropped
    /// or the listener fails for good; a connection's own failure (a
    /// client gone, too many open files for a moment) ends only that
    /// connection.
    pub async fn serve(self, listener: TcpListener) -> io::Result<()> {
        self.serve_until(listener, std::future::pending()).await
    }

    /// [`serve`](Self::serve) until `stop` completes, then drain: the
    /// listener closes, so no new client connects (a load balancer moves
    /// them on), and each connection finishes the request it is serving,
    /// its answer's last byte included, then closes; idle ones close at
    /// once. Returns when the last has closed. Bound the drain with a
    /// timeout of your own, then [`Shaper::shutdown`](crate::Shaper::shutdown)
    /// ends what still waits in the lanes.
    pub async fn serve_until(
        self,
        listener: TcpListener,
        stop: impl Future<Output = ()>,
    ) -> io::Result<()> {
        let connections = GracefulShutdown::new();
        // A connection holds one until it closes: past the cap, the next
        // client waits in the listener's backlog.
        let room = Arc::new(Semaphore::new(
            self.inner
                .limits
                .max_connections
                .min(Semaphore::MAX_PERMITS),
        ));
        tokio::pin!(stop);
        loop {
            let held = tokio::select! {
                held = room.clone().acquire_owned() => held,
                () = &mut stop => break,
            };
            // Never closed: a failed acquire cannot happen, and would end
            // the loop as a stop does.
            let Ok(held) = held else { break };
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = &mut stop => break,
            };
            let stream = match accepted {
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
            let limits = served.limits;
            let service = service_fn(move |request| {
                let served = served.clone();
                // Boxed: hyper moves the future it is given, and one
                // request's (the lanes' wait, the upstream call) is a few
                // kilobytes, copied on each move.
                Box::pin(async move { Ok::<_, Infallible>(handle(&served, request).await) })
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .max_header_size(limits.max_header_bytes)
                .serve_connection(
                    TokioIo::new(Client::new(stream, limits.send_timeout)),
                    service,
                );
            let connection = connections.watch(connection);
            // A connection that fails (a client gone mid-request, a head
            // too large or too slow) concerns that client alone.
            tokio::spawn(async move {
                let _ = connection.await;
                drop(held);
            });
        }
        drop(listener);
        connections.shutdown().await;
        Ok(())
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
    if let Err(refusal) = admitted(&parts.headers, served.client_token.as_deref()) {
        return answer::refused(&refusal, &[]);
    }
    let ((name, base), url) = match target(&parts.method, &parts.uri, &served.upstreams) {
        Ok(target) => target,
        Err(refusal) => {
            let names: Vec<&str> = served.upstreams.keys().map(String::as_str).collect();
            return answer::refused(&refusal, &names);
        }
    };
    let options = match controls(&parts.headers) {
        Ok(asked) => match served.defaults.get(name) {
            Some(defaults) => asked.or(defaults),
            None => asked,
        },
        Err(refusal) => return answer::refused(&refusal, &[]),
    };
    let limits = &served.limits;
    let body = match upload::read(body, limits.replay_body, limits.body_read_timeout).await {
        Ok(body) => body,
        Err(Cut::Stalled(idle)) => return answer::body_stalled(idle),
        Err(Cut::Failed(_)) => return answer::cut_off_body(),
    };
    // The log names the upstream path only: a query, like the headers,
    // often carries a key. Copied only when it is logged.
    let logged = tracing::enabled!(tracing::Level::DEBUG)
        .then(|| (parts.method.clone(), url.path().to_owned()));
    let mut request = reqwest::Request::new(parts.method, url);
    *request.headers_mut() = end_to_end(parts.headers);
    *request.body_mut() = Some(body);
    let send = served
        .shaper
        .prepared(request)
        .options(&options)
        // A redirect is the client's to follow, through the proxy again
        // (see `answer::vendor`): each hop then takes its turn.
        .redirects(0)
        // The body relays to the client as it arrives: on the wire until
        // its last byte, or until the client goes.
        .in_flight_through_body();
    match send.send().await {
        Ok(response) => {
            if let Some((method, path)) = &logged {
                tracing::debug!(%method, path, status = response.status().as_u16(), "callshaper proxy: answered");
            }
            answer::vendor(response, name, base)
        }
        Err(error) => {
            if let Some((method, path)) = &logged {
                tracing::debug!(%method, path, %error, "callshaper proxy: ended by the shaper");
            }
            // A vendor call that failed as its streaming body did is the
            // client's doing, not the vendor's.
            match Cut::in_chain(&error) {
                Some(Cut::Stalled(idle)) => answer::body_stalled(*idle),
                Some(Cut::Failed(_)) => answer::cut_off_body(),
                None => answer::shaper_ended(&error, &served.shaper),
            }
        }
    }
}
