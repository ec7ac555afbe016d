//! What a lane that costs tokens adds to a request's life: the body read
//! for an estimate before the request queues, and the answer's body
//! wrapped to settle from its usage. Without the `tokens` feature the same
//! calls read nothing and wrap nothing, so `call.rs` has one path.

use reqwest::{Request, Response};

use crate::lane::Lane;

/// What the request's body said, for a lane that costs tokens (nothing,
/// without the feature).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Metering(#[cfg(feature = "tokens")] Option<crate::tokens::Prepared>);

impl Metering {
    /// Read (and perhaps add to) `request`'s body, if `lane` costs tokens.
    #[cfg(feature = "tokens")]
    pub(super) fn read(lane: &Lane, request: &mut Request) -> Self {
        Self(lane.policy().tokens.map(|tokens| tokens.prepare(request)))
    }

    #[cfg(not(feature = "tokens"))]
    pub(super) fn read(_lane: &Lane, _request: &mut Request) -> Self {
        Self()
    }

    /// The cost the body gave, if any.
    pub(super) fn estimate(&self) -> Option<u64> {
        #[cfg(feature = "tokens")]
        return self.0.and_then(|prepared| prepared.estimate);
        #[cfg(not(feature = "tokens"))]
        None
    }

    /// `response`, its body settling the request's cost from the usage it
    /// reports.
    pub(super) fn settling(self, response: Response) -> Response {
        #[cfg(feature = "tokens")]
        if let Some(prepared) = self.0 {
            return super::usage::settle_from_usage(response, prepared);
        }
        response
    }
}
