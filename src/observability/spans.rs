//! The `callshaper.request` span of a request and the `callshaper.attempt`
//! span of each send (fields: see the module above).

use std::time::Duration;

use reqwest::Request;
use tracing::Span;
use tracing::field::Empty;

use super::labels::Labels;
use super::shown::shown_url;

/// A request's span, from submission to its one outcome.
pub(crate) struct RequestSpan(Span);

impl RequestSpan {
    /// The span of `request`, before it has a lane. Its URL loses the
    /// query, the fragment and any credentials: they are often secrets.
    pub(crate) fn new(request: &Request) -> Self {
        let span = tracing::info_span!(
            "callshaper.request",
            method = %request.method(),
            url = Empty,
            lane = Empty,
            vendor = Empty,
            level = Empty,
            route = Empty,
            cost = Empty,
            priority = Empty,
            queued_ms = Empty,
            attempts = Empty,
            throttles = Empty,
            outcome = Empty,
        );
        // Nobody listening: no copy of the URL either.
        if !span.is_disabled() {
            span.record("url", shown_url(request.url()));
        }
        Self(span)
    }

    /// The span itself, to run the request's future in.
    pub(crate) fn span(&self) -> &Span {
        &self.0
    }

    /// The request joined `lane`.
    pub(crate) fn entered(
        &self,
        lane: impl std::fmt::Display,
        labels: &Labels,
        cost: u64,
        priority: &str,
    ) {
        let span = &self.0;
        span.record("lane", tracing::field::display(lane));
        span.record("vendor", labels.vendor.as_str());
        span.record("level", labels.level.as_str());
        span.record("route", labels.route.as_str());
        span.record("cost", cost);
        span.record("priority", priority);
    }

    /// The request ended with `outcome` (`response` or an error's reason).
    pub(crate) fn ended(&self, queued: Duration, attempts: u32, throttles: u32, outcome: &str) {
        let span = &self.0;
        span.record(
            "queued_ms",
            u64::try_from(queued.as_millis()).unwrap_or(u64::MAX),
        );
        span.record("attempts", attempts);
        span.record("throttles", throttles);
        span.record("outcome", outcome);
    }

    /// The span of send number `attempt`, a child of the request's.
    pub(crate) fn attempt(&self, attempt: u32) -> Attempt {
        Attempt(tracing::info_span!(
            parent: &self.0,
            "callshaper.attempt",
            attempt,
            status = Empty,
            error = Empty,
        ))
    }
}

/// One send's span.
pub(crate) struct Attempt(Span);

impl Attempt {
    /// The span itself, to run the send in.
    pub(crate) fn span(&self) -> &Span {
        &self.0
    }

    /// The vendor answered `status`.
    pub(crate) fn answered(&self, status: u16) {
        self.0.record("status", status);
    }

    /// The send failed with `error`.
    pub(crate) fn failed(&self, error: &dyn std::fmt::Display) {
        self.0.record("error", tracing::field::display(error));
    }
}
