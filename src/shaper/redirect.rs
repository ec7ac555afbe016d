//! Redirects, followed by the shaper: each hop is a request of its own
//! through its lane. A client that follows redirects itself puts every
//! hop on the wire without a turn, past the quota the lane keeps (a
//! vendor's `307` to a regional host, a `301` for a renamed resource).
//! So the shaper's default client follows none, and the shaper follows
//! them as `tower-http`'s `FollowRedirect` (reqwest's) would.

use reqwest::header::{self, HeaderMap, HeaderName};
use reqwest::{Method, Request, Response, StatusCode, Url};

/// How many redirects a request follows unless told otherwise: reqwest's
/// own limit.
pub(crate) const DEFAULT_REDIRECTS: u32 = 10;

/// The request that `response` to `sent` redirects to, if it is one to
/// follow: a `301`, `302`, `303`, `307` or `308` whose `Location`
/// resolves, against the request's URL, to an http or https URL.
///
/// As browsers and `tower-http` do: a `303` turns any method but `HEAD`
/// into a `GET` without a body, a `301` or `302` does so to a `POST`, and
/// a `307` or `308` sends the same method and body again. A hop to
/// another origin carries none of the request's credentials: those of
/// [`CREDENTIALS`], and the `keys` its levels are keyed by.
pub(super) fn next<'a>(
    mut sent: Box<Request>,
    response: &Response,
    keys: impl IntoIterator<Item = &'a HeaderName>,
) -> Option<Box<Request>> {
    let status = response.status();
    let to_get = match status {
        StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND => sent.method() == Method::POST,
        StatusCode::SEE_OTHER => sent.method() != Method::HEAD,
        StatusCode::TEMPORARY_REDIRECT | StatusCode::PERMANENT_REDIRECT => false,
        _ => return None,
    };
    let location = response.headers().get(header::LOCATION)?.to_str().ok()?;
    let url = sent.url().join(location).ok()?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return None;
    }
    if to_get {
        *sent.method_mut() = Method::GET;
        *sent.body_mut() = None;
        remove(sent.headers_mut(), BODY_HEADERS);
    }
    if !same_origin(sent.url(), &url) {
        remove(sent.headers_mut(), &CREDENTIALS);
        remove(sent.headers_mut(), keys);
    }
    *sent.url_mut() = url;
    Some(sent)
}

/// What describes a body that a hop no longer has.
const BODY_HEADERS: &[HeaderName] = &[
    header::CONTENT_TYPE,
    header::CONTENT_LENGTH,
    header::CONTENT_ENCODING,
    header::TRANSFER_ENCODING,
];

/// What proves who the caller is, to the origin it was meant for only:
/// the headers reqwest's own redirects drop, and the API keys vendors
/// read in headers of their own (Anthropic's `x-api-key`, which many
/// others read too, Azure OpenAI's `api-key`, Google's `x-goog-api-key`),
/// which reqwest would send on.
static CREDENTIALS: [HeaderName; 7] = [
    header::AUTHORIZATION,
    header::COOKIE,
    header::PROXY_AUTHORIZATION,
    header::WWW_AUTHENTICATE,
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("api-key"),
    HeaderName::from_static("x-goog-api-key"),
];

fn remove<'a>(headers: &mut HeaderMap, names: impl IntoIterator<Item = &'a HeaderName>) {
    for name in names {
        headers.remove(name);
    }
}

fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, location: &str) -> Response {
        let response = http::Response::builder()
            .status(status)
            .header(header::LOCATION, location)
            .body("")
            .expect("a response");
        Response::from(response)
    }

    fn request(method: Method, url: &str) -> Box<Request> {
        let mut request = Request::new(method, Url::parse(url).expect("a URL"));
        let headers = request.headers_mut();
        headers.insert(header::AUTHORIZATION, "Bearer k".parse().expect("a value"));
        headers.insert(header::CONTENT_TYPE, "text/plain".parse().expect("a value"));
        *request.body_mut() = Some("body".into());
        Box::new(request)
    }

    /// A `303` after a `POST` is a `GET` without the body or what
    /// described it; the caller's credentials stay on the same origin.
    #[test]
    fn see_other_turns_a_post_into_a_get() {
        let sent = request(Method::POST, "https://api.test/v1/jobs");
        let next = next(sent, &answer(303, "/v1/jobs/7"), &[]).expect("followed");
        assert_eq!(next.method(), Method::GET);
        assert_eq!(next.url().as_str(), "https://api.test/v1/jobs/7");
        assert!(next.body().is_none());
        assert!(next.headers().get(header::CONTENT_TYPE).is_none());
        assert!(next.headers().get(header::AUTHORIZATION).is_some());
    }

    /// A `307` sends the same method and body again; to another origin it
    /// carries no credentials: no standard one, no vendor's API key, no
    /// header a level is keyed by. The same origin gets them all.
    #[test]
    fn temporary_redirect_keeps_method_and_body_but_not_credentials_abroad() {
        let keyed = [HeaderName::from_static("x-tenant-key")];
        let with_keys = |url| {
            let mut sent = request(Method::PUT, url);
            for name in ["x-api-key", "api-key", "x-goog-api-key", "x-tenant-key"] {
                sent.headers_mut()
                    .insert(name, "k".parse().expect("a value"));
            }
            sent
        };
        let abroad = answer(307, "https://eu.api.test/v1/a");
        let next = next(with_keys("https://api.test/v1/a"), &abroad, &keyed).expect("followed");
        assert_eq!(next.method(), Method::PUT);
        let body = next.body().and_then(reqwest::Body::as_bytes);
        assert_eq!(body, Some(&b"body"[..]));
        let names: Vec<&str> = next.headers().keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["content-type"]);
        let home = answer(307, "/v1/b");
        let next =
            super::next(with_keys("https://api.test/v1/a"), &home, &keyed).expect("followed");
        assert_eq!(next.headers().len(), 6, "{:?}", next.headers());
    }

    /// Another port is another origin.
    #[test]
    fn another_port_is_another_origin() {
        let sent = request(Method::GET, "http://api.test/a");
        let next = next(sent, &answer(302, "http://api.test:8080/a"), &[]).expect("followed");
        assert!(next.headers().get(header::AUTHORIZATION).is_none());
        assert_eq!(next.method(), Method::GET);
    }

    /// What is not a redirect to an http(s) URL is the answer.
    #[test]
    fn only_real_redirects_are_followed() {
        let get = || request(Method::GET, "https://api.test/a");
        assert!(next(get(), &answer(200, "/b"), &[]).is_none());
        assert!(next(get(), &answer(304, "/b"), &[]).is_none());
        assert!(next(get(), &answer(300, "/b"), &[]).is_none());
        assert!(next(get(), &answer(301, "ftp://files.test/b"), &[]).is_none());
        assert!(next(get(), &answer(301, "http://[::1"), &[]).is_none());
        let bare = Response::from(http::Response::builder().status(302).body("").expect("ok"));
        assert!(next(get(), &bare, &[]).is_none());
    }
}
