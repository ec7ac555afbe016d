//! [`ShaperLayer`]: the shaper as a tower `Layer`, for any HTTP client that
//! is a tower `Service` (feature `tower`).
//!
//! [`Shaped`] serves two kinds of inner service, with the same lanes,
//! signals, pauses and retries as [`Shaper`]'s own requests:
//!
//! - `Service<http::Request<reqwest::Body>>`: hyper's client, or any
//!   client or stack of layers speaking `http`. [`Shaped`] takes
//!   `http::Request<B>` for any `B` reqwest can take as a body (bytes,
//!   `String`, `Vec<u8>`, a `reqwest::Body`) and answers
//!   `http::Response<reqwest::Body>` (the inner body, wrapped).
//! - `Service<reqwest::Request>`: `reqwest::Client` itself, or a stack of
//!   layers over it; [`Shaped`] takes and answers reqwest's types.
//!
//! Put the shaper innermost of the layers that retry or time out a whole
//! call: each of its attempts then passes the lane, and it owns the
//! retries (see [next to other retry layers](crate::retry#next-to-other-retry-layers)).
//! A client below that follows redirects sends each hop without a turn:
//! build it with `redirect(reqwest::redirect::Policy::none())`, and send
//! a redirect's hop through the layer again. Errors are tower's
//! `BoxError`: a [`crate::Error`] when the shaper ended the request (it
//! downcasts), else the inner service's error after the shaper's last
//! attempt. On an `http::Request`, per-request settings travel as its
//! extensions, as with the middleware: [`MaxWait`], [`Cost`](crate::route::Cost),
//! [`Priority`](crate::lane::Priority) and [`Tag`](crate::route::Tag) (reqwest keeps a
//! `reqwest::Request`'s extensions to itself, so those get the lane's
//! defaults, or a cost from [`ShaperBuilder::cost`](crate::shaper::ShaperBuilder::cost)).
//!
//! ```
//! use std::time::Duration;
//! use callshaper::Shaper;
//! use callshaper::layer::ShaperLayer;
//! use callshaper::testing::Vendor;
//! use tower_layer::Layer;
//! use tower_service::Service;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let vendor = Vendor::strict(10, Duration::from_secs(1)).start().await;
//! let shaper = Shaper::builder().rate(10, Duration::from_secs(1)).build()?;
//! // reqwest's own client as a tower service, shaped.
//! let mut client = ShaperLayer::new(shaper).layer(reqwest::Client::new());
//! let request = reqwest::Request::new(reqwest::Method::GET, vendor.uri().parse()?);
//! let response = client.call(request).await?;
//! assert_eq!(response.status(), 200);
//! # Ok(())
//! # }
//! ```
//!
//! [`MaxWait`]: crate::shaper::MaxWait

use std::error::Error as StdError;
use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::{Context, Poll};

use reqwest::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;

use crate::Shaper;
use crate::error::Error;
use crate::shaper::again::{Failure, SendFailure};
use crate::shaper::call::Options;

/// tower's error type: any error, boxed.
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// A boxed, sendable future, as [`Shaped`] answers.
type Answering<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

/// Shapes the services it wraps with one [`Shaper`]'s lanes.
#[derive(Debug, Clone)]
pub struct ShaperLayer {
    shaper: Shaper,
}

impl ShaperLayer {
    /// A layer sending through `shaper`'s lanes. Clones of the shaper, and
    /// every service this layer wraps, share those lanes.
    pub fn new(shaper: Shaper) -> Self {
        Self { shaper }
    }
}

impl<S> Layer<S> for ShaperLayer {
    type Service = Shaped<S>;

    fn layer(&self, inner: S) -> Shaped<S> {
        Shaped {
            shaper: self.shaper.clone(),
            inner,
        }
    }
}

/// A service whose every call waits in its lane and is sent, retried and
/// paused by the shaper; made by [`ShaperLayer`].
///
/// Always ready: a call queues in its lane instead of holding the caller
/// in `poll_ready`, and the inner service is made ready (a clone of it)
/// for each attempt.
#[derive(Debug, Clone)]
pub struct Shaped<S> {
    shaper: Shaper,
    inner: S,
}

impl<S> Shaped<S> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

/// An inner service's error, as the retry rules read it: no connection
/// (`ConnectionRefused` anywhere in its chain, or reqwest's connect
/// error), or a transient failure worth another try (a timeout, a reset).
struct ServiceError(BoxError);

impl ServiceError {
    /// Every error in the chain, this one first.
    fn chain(&self) -> impl Iterator<Item = &(dyn StdError + 'static)> {
        let first: &(dyn StdError + 'static) = &*self.0;
        std::iter::successors(Some(first), |error: &&(dyn StdError + 'static)| {
            (*error).source()
        })
    }

    fn io_kind(&self) -> Option<std::io::ErrorKind> {
        self.chain()
            .find_map(|error| error.downcast_ref::<std::io::Error>())
            .map(std::io::Error::kind)
    }
}

impl fmt::Display for ServiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl SendFailure for ServiceError {
    fn is_connect(&self) -> bool {
        use std::io::ErrorKind::ConnectionRefused;
        self.chain().any(|error| {
            error
                .downcast_ref::<reqwest::Error>()
                .is_some_and(reqwest::Error::is_connect)
        }) || self.io_kind() == Some(ConnectionRefused)
    }

    fn is_transient(&self) -> bool {
        use std::io::ErrorKind::{
            BrokenPipe, ConnectionAborted, ConnectionReset, TimedOut, UnexpectedEof,
        };
        let reqwest = self
            .chain()
            .find_map(|e| e.downcast_ref::<reqwest::Error>());
        if let Some(error) = reqwest {
            return SendFailure::is_transient(error);
        }
        matches!(
            self.io_kind(),
            Some(TimedOut | ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof)
        )
    }
}

/// Send one attempt through a ready clone of `inner`.
async fn attempt<S, Req>(mut inner: S, request: Req) -> Result<S::Response, ServiceError>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    poll_fn(|cx| inner.poll_ready(cx))
        .await
        .map_err(|error| ServiceError(error.into()))?;
    inner
        .call(request)
        .await
        .map_err(|error| ServiceError(error.into()))
}

/// The shaper's end of a call, as tower's error.
fn boxed(failure: Failure<ServiceError>) -> BoxError {
    match failure {
        Failure::Shaper(error) => Box::new(error),
        Failure::Send { source, .. } => source.0,
    }
}

/// `http` clients: the request is converted to reqwest's for the lane and
/// back for each attempt; the response's body is wrapped in a
/// `reqwest::Body`, so signals, settling and the kept answer work alike.
impl<S, B, RB> Service<http::Request<B>> for Shaped<S>
where
    S: Service<http::Request<reqwest::Body>, Response = http::Response<RB>>
        + Clone
        + Send
        + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    B: Into<reqwest::Body>,
    RB: http_body::Body + Send + Sync + 'static,
    RB::Data: Into<bytes::Bytes>,
    RB::Error: Into<BoxError>,
{
    type Response = http::Response<reqwest::Body>;
    type Error = BoxError;
    type Future = Answering<Self::Response>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let shaper = self.shaper.clone();
        let inner = self.inner.clone();
        let options = Options::from_extensions(request.extensions());
        let request = Request::try_from(request).map_err(Error::InvalidRequest);
        Box::pin(async move {
            let request = request?;
            let sent = shaper.drive(request, &options, move |request: Request| {
                let inner = inner.clone();
                async move {
                    let request = http::Request::try_from(request)
                        .map_err(|error| ServiceError(Box::new(error)))?;
                    let response = attempt(inner, request).await?;
                    Ok(Response::from(response.map(reqwest::Body::wrap)))
                }
            });
            sent.await.map(http::Response::from).map_err(boxed)
        })
    }
}

/// reqwest's own client as a tower service (or layers over it).
impl<S> Service<Request> for Shaped<S>
where
    S: Service<Request, Response = Response> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
{
    type Response = Response;
    type Error = BoxError;
    type Future = Answering<Response>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let shaper = self.shaper.clone();
        let inner = self.inner.clone();
        Box::pin(async move {
            // reqwest keeps a request's extensions to itself: this path has
            // the shaper's defaults only.
            let options = Options::default();
            let send = move |request| attempt(inner.clone(), request);
            shaper.drive(request, &options, send).await.map_err(boxed)
        })
    }
}
