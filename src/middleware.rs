//! [`Shaper`] as a `reqwest_middleware::Middleware`, for an existing
//! middleware stack.
//!
//! Place it so that whatever must run once per attempt (auth signing,
//! tracing) comes after it: the shaper calls the rest of the chain once for
//! every attempt it makes. Per-request settings travel as extensions:
//! [`MaxWait`](crate::MaxWait), [`Cost`](crate::Cost),
//! [`Priority`](crate::Priority) and [`Tag`](crate::Tag).
//!
//! When the shaper ends a request, the chain's error is
//! `reqwest_middleware::Error::Middleware` around a [`crate::Error`];
//! [`shaper_error`] gets it back.

use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};

use crate::error::Error;
use crate::shaper::call::SendFailure;
use crate::shaper::{Failure, Options, Shaper};

#[async_trait::async_trait]
impl Middleware for Shaper {
    async fn handle(
        &self,
        request: Request,
        extensions: &mut http::Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let options = Options::from_extensions(extensions);
        let shared = extensions.clone();
        let outcome = self
            .drive(request, options, |attempt| {
                let next = next.clone();
                let mut extensions = shared.clone();
                async move { next.run(attempt, &mut extensions).await }
            })
            .await;
        outcome.map_err(|failure| match failure {
            Failure::Shaper(error) => reqwest_middleware::Error::middleware(error),
            Failure::Send { source, .. } => source,
        })
    }
}

impl SendFailure for reqwest_middleware::Error {
    fn is_connect(&self) -> bool {
        match self {
            Self::Reqwest(error) => error.is_connect(),
            Self::Middleware(_) => false,
        }
    }

    fn is_transient(&self) -> bool {
        match self {
            Self::Reqwest(error) => SendFailure::is_transient(error),
            Self::Middleware(_) => false,
        }
    }
}

/// The shaper's own error inside `error`, when the shaper ended the
/// request (a full queue, a pause past `max_pause`, retries spent…);
/// `None` when the error is the transport's.
///
/// ```
/// # fn f(error: reqwest_middleware::Error) {
/// if let Some(callshaper::Error::QueueFull { lane, .. }) = callshaper::middleware::shaper_error(&error) {
///     eprintln!("lane {lane} is full: shed this request");
/// }
/// # }
/// ```
pub fn shaper_error(error: &reqwest_middleware::Error) -> Option<&Error> {
    match error {
        reqwest_middleware::Error::Middleware(inner) => inner.downcast_ref::<Error>(),
        reqwest_middleware::Error::Reqwest(_) => None,
    }
}
