//! [`Shaper`] as a `reqwest_middleware::Middleware`, for an existing
//! middleware stack.
//!
//! Place it so that whatever must run once per attempt (auth signing,
//! tracing) comes after it: the shaper calls the rest of the chain once for
//! every attempt it makes. Per-request settings travel as extensions:
//! [`MaxWait`](crate::shaper::MaxWait), [`Cost`](crate::route::Cost),
//! [`Priority`](crate::lane::Priority) and [`Tag`](crate::route::Tag).
//!
//! Layers that retry go *above* the shaper (`.with(retry).with(shaper)`):
//! each of their tries then passes the lane as the same request, keeps its
//! place, and counts against one `max_attempts` over all layers; the
//! shaper's give-ups are final for them. A retry layer below the shaper,
//! or a `reqwest::Client` whose own retry policy resends throttled
//! answers, sends copies the shaper never sees: unpaced, even during a
//! pause. So does a client that follows redirects: each hop it follows
//! goes without a turn. Build it with
//! `redirect(reqwest::redirect::Policy::none())`, and send a redirect's
//! hop through the stack again.
//!
//! When the shaper ends a request, the chain's error is
//! `reqwest_middleware::Error::Middleware` around a [`crate::Error`];
//! [`shaper_error`] gets it back.

use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};

use crate::Shaper;
use crate::error::Error;
use crate::observability::shown_error;
use crate::shaper::again::{Failure, SendFailure};
use crate::shaper::call::{Logical, Options};

#[async_trait::async_trait]
impl Middleware for Shaper {
    async fn handle(
        &self,
        request: Request,
        extensions: &mut http::Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let mut options = Options::from_extensions(extensions);
        // A retry layer above sends the same extensions again: the marker
        // makes its tries one request to the lane.
        let logical = match extensions.get::<Logical>() {
            Some(logical) => logical.clone(),
            None => {
                let logical = Logical::default();
                extensions.insert(logical.clone());
                logical
            }
        };
        options.logical = Some(logical.clone());
        let shared = extensions.clone();
        let outcome = self
            .drive(request, &options, |attempt| {
                let next = next.clone();
                let mut extensions = shared.clone();
                async move { next.run(attempt, &mut extensions).await }
            })
            .await;
        let max_attempts = self.retry_policy().max_attempts;
        outcome.map_err(|failure| match failure {
            Failure::Shaper(error) => reqwest_middleware::Error::middleware(Ended(error)),
            // The shaper spent the request's attempts: final for the layers
            // above too (reqwest-retry does not retry a middleware error),
            // so a refused connection is not tried again by each of them.
            Failure::Send {
                source: reqwest_middleware::Error::Reqwest(source),
                ..
            } if logical.sends() >= max_attempts => {
                reqwest_middleware::Error::middleware(Ended(Error::Transport {
                    attempts: logical.sends(),
                    source: shown_error(source),
                }))
            }
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

/// The chain's error when the shaper ended a request. The shaper's
/// [`Error`] is its source, not its payload: a layer above that wraps the
/// error transparently (reqwest-retry does) skips the payload when walking
/// the chain, but not the source, so [`shaper_error`] still finds it.
/// Its message names the kind ([`Error::reason`]); the details are the
/// next link, printed once.
#[derive(Debug, thiserror::Error)]
#[error("callshaper ended the request: {}", .0.reason())]
struct Ended(#[source] Error);

/// The shaper's own error inside `error`, when the shaper ended the
/// request (a full queue, a pause past `max_pause`, retries spent…),
/// also behind the wrapping of layers above it such as reqwest-retry;
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
        reqwest_middleware::Error::Middleware(inner) => {
            inner.chain().find_map(|link| link.downcast_ref::<Error>())
        }
        reqwest_middleware::Error::Reqwest(_) => None,
    }
}
