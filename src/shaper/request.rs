//! [`RequestBuilder`]: one request, and what the caller says about it
//! besides the request itself.

use std::fmt;
use std::time::Duration;

use reqwest::Response;
use reqwest::header::{HeaderName, HeaderValue};

use super::{Options, Shaper};
use crate::error::Error;
use crate::lane::Priority;
use crate::route::Tag;

/// A request being built; [`send`](Self::send) queues it on its lanes.
#[must_use = "a request does nothing until it is sent"]
#[derive(Debug)]
pub struct RequestBuilder {
    pub(super) shaper: Shaper,
    pub(super) inner: reqwest::RequestBuilder,
    pub(super) options: Options,
}

impl RequestBuilder {
    /// Add a header.
    pub fn header<K, V>(mut self, key: K, value: V) -> Self
    where
        HeaderName: TryFrom<K>,
        <HeaderName as TryFrom<K>>::Error: Into<http::Error>,
        HeaderValue: TryFrom<V>,
        <HeaderValue as TryFrom<V>>::Error: Into<http::Error>,
    {
        self.inner = self.inner.header(key, value);
        self
    }

    /// Set the body.
    pub fn body(mut self, body: impl Into<reqwest::Body>) -> Self {
        self.inner = self.inner.body(body);
        self
    }

    /// Add `Authorization: Bearer <token>`.
    pub fn bearer_auth(mut self, token: impl fmt::Display) -> Self {
        self.inner = self.inner.bearer_auth(token);
        self
    }

    /// Time limit for each attempt on the wire (not for the wait in the
    /// lane; see [`max_wait`](Self::max_wait)).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.inner = self.inner.timeout(timeout);
        self
    }

    /// Anything else reqwest's builder can do.
    pub fn with(
        mut self,
        edit: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> Self {
        self.inner = edit(self.inner);
        self
    }

    /// The longest this request may wait for release, overriding the lane's.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.options.max_wait = Some(max_wait);
        self
    }

    /// What this request costs for quotas that count cost (e.g. estimated
    /// tokens); default 1. Correct it after the response with [`Settle`](crate::Settle).
    pub fn cost(mut self, cost: u64) -> Self {
        self.options.cost = Some(cost);
        self
    }

    /// The class the request waits in (default interactive).
    pub fn priority(mut self, priority: Priority) -> Self {
        self.options.priority = priority;
        self
    }

    /// A tenant or user, for [`LaneKey::Tag`](crate::LaneKey::Tag) levels.
    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.options.tag = Some(Tag(tag.into()));
        self
    }

    /// Queue the request on its lanes; resolves to the vendor's response.
    pub async fn send(self) -> Result<Response, Error> {
        let request = self.inner.build().map_err(Error::InvalidRequest)?;
        self.shaper.execute_with(request, self.options).await
    }
}
