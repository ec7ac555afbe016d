//! [`RequestBuilder`]: one request, and what the caller says about it
//! besides the request itself.

use std::fmt;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{IntoUrl, Method, Request, Response, Version};

use super::call::Options;
use super::handle::Shaper;
use crate::error::Error;
use crate::lane::Priority;
use crate::route::Tag;

impl Shaper {
    /// Start a request; `send` queues it on its lanes.
    pub fn request<U: IntoUrl>(&self, method: Method, url: U) -> RequestBuilder {
        RequestBuilder {
            shaper: self.clone(),
            inner: self.inner.client.request(method, url),
            options: Options::default(),
        }
    }

    /// A request built whole, to send as a [`RequestBuilder`]'s: the proxy
    /// moves a client's headers into it rather than copying them one by
    /// one.
    #[cfg(feature = "proxy")]
    pub(crate) fn prepared(&self, request: Request) -> RequestBuilder {
        RequestBuilder {
            shaper: self.clone(),
            inner: reqwest::RequestBuilder::from_parts(self.inner.client.clone(), request),
            options: Options::default(),
        }
    }

    /// Start a GET request.
    pub fn get<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::GET, url)
    }

    /// Start a POST request.
    pub fn post<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::POST, url)
    }

    /// Start a PUT request.
    pub fn put<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::PUT, url)
    }

    /// Start a PATCH request.
    pub fn patch<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::PATCH, url)
    }

    /// Start a DELETE request.
    pub fn delete<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::DELETE, url)
    }

    /// Start a HEAD request.
    pub fn head<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::HEAD, url)
    }
}

/// A request being built; [`send`](Self::send) queues it on its lanes.
///
/// It reads like reqwest's builder, and every method but the shaper's own
/// ([`max_wait`](Self::max_wait), [`cost`](Self::cost),
/// [`priority`](Self::priority), [`tag`](Self::tag)) does what reqwest's
/// does. `json`, `query`, `form` and `multipart` need the features of the
/// same names, as in reqwest.
///
/// ```
/// use std::time::Duration;
/// use callshaper::Shaper;
/// use callshaper::testing::Vendor;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let vendor = Vendor::strict(10, Duration::from_secs(1)).start().await;
/// let shaper = Shaper::builder().rate(10, Duration::from_secs(1)).build()?;
/// let response = shaper
///     .put(format!("{}/items/7", vendor.uri()))
///     .basic_auth("user", Some("secret"))
///     .header("x-request-id", "42")
///     .body("{\"name\":\"seven\"}")
///     .timeout(Duration::from_secs(10))
///     .send()
///     .await?;
/// assert_eq!(response.status(), 200);
/// # Ok(())
/// # }
/// ```
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

    /// Add every header of `headers`, replacing those of the same names.
    pub fn headers(mut self, headers: HeaderMap) -> Self {
        self.inner = self.inner.headers(headers);
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

    /// Add `Authorization: Basic ...` for `username` and `password`.
    pub fn basic_auth<U, P>(mut self, username: U, password: Option<P>) -> Self
    where
        U: fmt::Display,
        P: fmt::Display,
    {
        self.inner = self.inner.basic_auth(username, password);
        self
    }

    /// Send with this HTTP version.
    pub fn version(mut self, version: Version) -> Self {
        self.inner = self.inner.version(version);
        self
    }

    /// Append `query`, serialized as `application/x-www-form-urlencoded`,
    /// to the URL's query (feature `query`).
    #[cfg(feature = "query")]
    pub fn query<T: serde::Serialize + ?Sized>(mut self, query: &T) -> Self {
        self.inner = self.inner.query(query);
        self
    }

    /// Send `form` as an `application/x-www-form-urlencoded` body (feature
    /// `form`).
    #[cfg(feature = "form")]
    pub fn form<T: serde::Serialize + ?Sized>(mut self, form: &T) -> Self {
        self.inner = self.inner.form(form);
        self
    }

    /// Send `json` as an `application/json` body (feature `json`).
    #[cfg(feature = "json")]
    pub fn json<T: serde::Serialize + ?Sized>(mut self, json: &T) -> Self {
        self.inner = self.inner.json(json);
        self
    }

    /// Send a `multipart/form-data` body (feature `multipart`). A
    /// streamed part makes the request unclonable: it is sent once and
    /// never retried.
    #[cfg(feature = "multipart")]
    pub fn multipart(mut self, form: reqwest::multipart::Form) -> Self {
        self.inner = self.inner.multipart(form);
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
    /// tokens); default 1. Correct it after the response with [`Settle`](crate::shaper::Settle).
    pub fn cost(mut self, cost: u64) -> Self {
        self.options.cost = Some(cost);
        self
    }

    /// The class the request waits in (default interactive).
    pub fn priority(mut self, priority: Priority) -> Self {
        self.options.priority = priority;
        self
    }

    /// Hold the lane's in-flight slot ([`max_in_flight`]) until the
    /// response's body ends (read to its last byte, failed, or dropped),
    /// not only until its headers arrive: a streamed answer (server-sent
    /// events, a download) is on the wire until then. Read or drop such a
    /// body promptly: one kept unread holds its slot, and with
    /// `max_in_flight(n)` the lane sends nothing more while `n` are held.
    /// The proxy sets this on every request it forwards.
    ///
    /// [`max_in_flight`]: crate::lane::LanePolicy::max_in_flight
    pub fn in_flight_through_body(mut self) -> Self {
        self.options.in_flight_through_body = true;
        self
    }

    /// Follow at most `hops` redirects of this request, overriding the
    /// shaper's [`redirects`](super::ShaperBuilder::redirects); 0: a
    /// redirect is the answer (the proxy relays them so).
    pub fn redirects(mut self, hops: u32) -> Self {
        self.options.redirects = Some(hops);
        self
    }

    /// A tenant or user, for [`LaneKey::Tag`](crate::route::LaneKey::Tag) levels.
    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.options.tag = Some(Tag(tag.into()));
        self
    }

    /// Each option `options` gives, as its own method would set it.
    pub fn options(mut self, options: &RequestOptions) -> Self {
        if let Some(max_wait) = options.max_wait {
            self = self.max_wait(max_wait);
        }
        if let Some(cost) = options.cost {
            self = self.cost(cost);
        }
        if let Some(tag) = options.tag.as_ref().filter(|t| !t.is_empty()) {
            self = self.tag(tag.clone());
        }
        if let Some(priority) = options.priority {
            self = self.priority(priority);
        }
        self
    }

    /// A copy of this builder, or `None` when its body is a stream.
    pub fn try_clone(&self) -> Option<Self> {
        Some(Self {
            shaper: self.shaper.clone(),
            inner: self.inner.try_clone()?,
            options: self.options.clone(),
        })
    }

    /// The request as it would be sent, without sending it.
    pub fn build(self) -> Result<Request, Error> {
        self.inner.build().map_err(Error::InvalidRequest)
    }

    /// Queue the request on its lanes; resolves to the vendor's response,
    /// once the redirects it follows ([`redirects`](Self::redirects)) have
    /// each taken their turn.
    pub fn send(self) -> impl Future<Output = Result<Response, Error>> + Send + 'static {
        let Self {
            shaper,
            inner,
            options,
        } = self;
        // Built and boxed before the future: it carries only the box.
        let request = inner.build().map(Box::new);
        async move {
            let request = request.map_err(Error::InvalidRequest)?;
            shaper.execute_with(request, options).await
        }
    }
}

/// What a request asks of the shaper besides itself, each part optional:
/// what [`RequestBuilder::max_wait`], [`cost`](RequestBuilder::cost),
/// [`tag`](RequestBuilder::tag) and [`priority`](RequestBuilder::priority)
/// set, as one value ([`RequestBuilder::options`]). `callshaper-proxy`
/// gives each request a vendor's (`[vendors.NAME] proxy = { max_wait =
/// "5s", priority = "batch" }`) for the `x-callshaper-*` headers its
/// client did not send.
///
/// ```
/// use std::time::Duration;
/// use callshaper::lane::Priority;
/// use callshaper::shaper::RequestOptions;
///
/// let mut batch = RequestOptions::default();
/// batch.priority = Some(Priority::Batch);
/// batch.max_wait = Some(Duration::from_secs(600));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
#[non_exhaustive]
pub struct RequestOptions {
    /// See [`RequestBuilder::max_wait`].
    #[cfg_attr(feature = "serde", serde(default, with = "crate::time::human::option"))]
    pub max_wait: Option<Duration>,
    /// See [`RequestBuilder::cost`].
    pub cost: Option<u64>,
    /// See [`RequestBuilder::tag`]; an empty tag is none.
    pub tag: Option<String>,
    /// See [`RequestBuilder::priority`].
    pub priority: Option<Priority>,
}

impl RequestOptions {
    /// These options, and `defaults`'s where these say nothing.
    pub fn or(self, defaults: &RequestOptions) -> RequestOptions {
        RequestOptions {
            max_wait: self.max_wait.or(defaults.max_wait),
            cost: self.cost.or(defaults.cost),
            tag: self
                .tag
                .filter(|t| !t.is_empty())
                .or_else(|| defaults.tag.clone().filter(|t| !t.is_empty())),
            priority: self.priority.or(defaults.priority),
        }
    }
}
