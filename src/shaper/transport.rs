//! [`Transport`]: what puts an attempt on the wire, under the shaper.

use std::future::Future;
use std::pin::Pin;

use reqwest::{Request, Response};

/// A boxed, sendable future, as [`Transport::send`] returns.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What actually puts a request on the wire once its lanes release it.
///
/// `reqwest::Client` is the transport unless you give another; a wrapper can
/// add what has to happen per attempt (signing, tracing) underneath the
/// shaper, so that every retry gets it too.
pub trait Transport: Send + Sync + 'static {
    /// Send one attempt.
    fn send(&self, request: Request) -> BoxFuture<reqwest::Result<Response>>;
}

impl Transport for reqwest::Client {
    fn send(&self, request: Request) -> BoxFuture<reqwest::Result<Response>> {
        Box::pin(self.execute(request))
    }
}
