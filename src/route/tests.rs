//! Keys, host and path matching.

use reqwest::header::HeaderName;

use super::matching::normalized;
use super::*;
use crate::lane::JOIN;

fn request(method: Method, url: &str) -> Request {
    Request::new(method, url.parse().unwrap())
}

#[test]
fn routes_match_method_host_and_path_patterns() {
    let route = Route::new("p")
        .method(Method::POST)
        .host("api.example.com")
        .path("/v1/{account}/payments/*");
    let hit = |m: Method, url: &str| route.matches(&request(m, url));
    assert!(hit(
        Method::POST,
        "https://api.example.com/v1/acme/payments"
    ));
    assert!(hit(
        Method::POST,
        "https://api.example.com/v1/acme/payments/42/refund"
    ));
    assert!(!hit(
        Method::GET,
        "https://api.example.com/v1/acme/payments"
    ));
    assert!(!hit(
        Method::POST,
        "https://other.example.com/v1/acme/payments"
    ));
    assert!(!hit(
        Method::POST,
        "https://api.example.com/v1/acme/products"
    ));
    let port = Route::new("p").host("127.0.0.1:8080");
    assert!(port.matches(&request(Method::GET, "http://127.0.0.1:8080/x")));
    assert!(!port.matches(&request(Method::GET, "http://127.0.0.1:8081/x")));
    let exact = Route::new("e").path("/v1/products");
    assert!(exact.matches(&request(Method::GET, "http://h/v1/products/")));
    assert!(!exact.matches(&request(Method::GET, "http://h/v1/products/7")));
}

/// A key in a header is one key however the request spells it: the
/// spaces around a value are HTTP's, and an `Authorization` scheme
/// reads in any case, with any spaces after it. The credential itself
/// keeps its case.
#[test]
fn a_credential_is_one_key_however_it_is_spelled() {
    let key = |name: &'static str, value: &str| {
        let mut req = request(Method::GET, "https://h/");
        let value = reqwest::header::HeaderValue::from_str(value).unwrap();
        req.headers_mut().insert(name, value);
        LaneKey::Header(HeaderName::from_static(name)).of(&req, None)
    };
    let bearer = key("authorization", "Bearer sk-1");
    for spelled in ["bearer sk-1", "BEARER  sk-1", " Bearer\tsk-1 "] {
        assert_eq!(key("authorization", spelled), bearer, "{spelled}");
    }
    for other in ["Bearer sk-2", "Bearer SK-1", "Basic sk-1", "Bearersk-1"] {
        assert_ne!(key("authorization", other), bearer, "{other}");
    }
    assert_eq!(key("x-api-key", " k-1 "), key("x-api-key", "k-1"));
    assert_ne!(key("x-api-key", "K-1"), key("x-api-key", "k-1"));
    assert_ne!(
        key("x-api-key", "bearer k-1"),
        key("x-api-key", "Bearer k-1")
    );
}

/// A path matches in any spelling its vendor reads alike: an escaped
/// letter or `:` decoded, hex digits in either case, `%2F` and `%5C`
/// as a `/`; the pattern is read the same way. Another character, or a
/// letter in another case, is another path.
#[test]
fn a_path_matches_in_every_spelling_its_vendor_reads_alike() {
    let payments = Route::new("p").path("/v1/payments/*");
    let run = Route::new("r").path("/v1/jobs/p:run");
    let encoded = Route::new("e").path("/v1/jobs/p%3arun");
    let hit = |route: &Route, path: &str| {
        route.matches(&request(Method::GET, &format!("https://h{path}")))
    };
    for path in [
        "/v1/%70ayments",
        "/v1/%70%61yments/1",
        "/v1/payments%2F1",
        "/v1%2fpayments",
        "/v1%5Cpayments%5c1",
    ] {
        assert!(hit(&payments, path), "{path}");
    }
    // An escaped `/` kept in its segment, as many vendors keep it.
    let file = Route::new("f").path("/v1/files/{name}");
    assert!(hit(&file, "/v1/files/a%2Fb") && hit(&file, "/v1/files/a%2fb"));
    assert!(!hit(&file, "/v1/files/a/b"));
    // A segment's `;` parameters, which servlet containers drop.
    assert!(hit(&payments, "/v1/payments;jsessionid=1/2"));
    assert!(hit(&payments, "/v1;v=2/%70ayments"));
    for path in ["/v1/PAYMENTS", "/v1/pay%2Dments", "/v1/payments%", "/v1/%7"] {
        assert!(!hit(&payments, path), "{path}");
    }
    for route in [&run, &encoded] {
        assert!(hit(route, "/v1/jobs/p:run"));
        assert!(hit(route, "/v1/jobs/p%3Arun"));
        assert!(hit(route, "/v1/jobs/%70%3arun"));
        assert!(!hit(route, "/v1/jobs/p%3Brun"));
    }
    assert_eq!(normalized("a%2fb%20c%7e%"), "a%2Fb%20c~%");
}

/// A route's host matches as a URL spells its host, whatever its case
/// or script, and keeps an explicit port, even its scheme's own; what
/// is not a host is refused, naming it.
#[test]
fn a_host_matches_as_urls_spell_it_and_a_non_host_is_refused() {
    for (given, url) in [
        ("API.Example.com", "https://api.example.com/x"),
        ("bücher.example", "https://bücher.example/"),
        ("[::1]:8080", "http://[::1]:8080/"),
        ("api.example.com:443", "https://api.example.com/"),
        // A name's final dot (the DNS root) names the same host.
        ("api.example.com", "https://api.example.com./x"),
        ("api.example.com.", "https://API.example.com/x"),
        ("api.example.com:8443", "https://api.example.com.:8443/x"),
    ] {
        let route = Route::new("r").host(given);
        assert!(route.check().is_ok(), "{given}");
        assert!(route.matches(&request(Method::GET, url)), "{given} {url}");
    }
    let on_443 = Route::new("r").host("api.example.com:443");
    assert!(!on_443.matches(&request(Method::GET, "http://api.example.com/")));
    for given in [
        "",
        "/",
        "https://api.example.com",
        "api.example.com/v1",
        "key@api.example.com",
        "api.example.com?x",
        "api .example.com",
        "api.example.com\n",
        "http://[::1",
        "api.example.com:99999",
    ] {
        let route = Route::new("r").host(given);
        let error = route.check().expect_err(given);
        assert_eq!(error.field, "host");
        assert!(error.problem.contains("is not a host"), "{error}");
        assert!(!route.matches(&request(Method::GET, "https://api.example.com/v1")));
    }
}

/// A path pattern matches a request's path as its URL spells it,
/// percent-encoded; a query, a fragment or a segment no request's
/// path can have is refused, naming it.
#[test]
fn a_path_matches_as_urls_spell_it_and_a_non_path_is_refused() {
    for (pattern, url) in [
        ("/v1/café/*", "https://h/v1/café/x"),
        ("/v1/files/my report", "https://h/v1/files/my%20report"),
        ("/v1/caf%C3%A9", "https://h/v1/café"),
        ("/v1/{id}/x", "https://h/v1/é/x"),
    ] {
        let route = Route::new("r").path(pattern);
        assert!(route.check().is_ok(), "{pattern}");
        assert!(route.matches(&request(Method::GET, url)), "{pattern} {url}");
    }
    for pattern in [
        "/search?q=*",
        "/v1#top",
        "/v1/../admin",
        "/v1/./x",
        "/v1/%2e%2e/x",
        "/v1/a\\b",
    ] {
        let route = Route::new("r").path(pattern);
        let error = route.check().expect_err(pattern);
        assert_eq!(error.field, "path");
        assert!(!route.matches(&request(Method::GET, "https://h/v1/x")));
    }
}

#[test]
fn keys_come_from_origin_headers_and_tags() {
    let mut req = request(Method::GET, "https://api.example.com:8443/x");
    req.headers_mut().insert("x-api-key", "k1".parse().unwrap());
    let tag = Tag("acme".into());
    assert_eq!(
        LaneKey::Origin.of(&req, None),
        "https://api.example.com:8443"
    );
    // SHA-1("k1") begins a2ab1959c1c3bfa2.
    let by_header = LaneKey::Header(HeaderName::from_static("x-api-key")).of(&req, None);
    assert_eq!(by_header, "#a2ab1959c1c3bfa2");
    assert_eq!(LaneKey::Tag.of(&req, Some(&tag)), "acme");
    assert_eq!(LaneKey::Tag.of(&req, None), "");
    let quota = Quota::leaky_bucket(1, std::time::Duration::from_secs(1));
    let mut name = String::new();
    Level::new("tenant", LaneKey::Tag, [quota]).write_lane_name(&req, Some(&tag), &mut name);
    assert_eq!(name, "tenant/acme");
}

/// The origin key is written as the `url` crate serializes an origin,
/// whatever the host's kind and the port.
#[test]
fn an_origin_key_is_the_origins_serialization() {
    for url in [
        "http://api.example.com/x",
        "https://API.Example.com:443/x?q",
        "https://api.example.com:8443/",
        "http://api.example.com:443/",
        "http://127.0.0.1:80/",
        "http://127.0.0.1:9000/v1",
        "http://[::1]:8080/",
        "https://[2001:db8::1]/",
        "https://bücher.example/",
        "http://h:0/",
    ] {
        let req = request(Method::GET, url);
        let origin = req.url().origin().ascii_serialization();
        assert_eq!(LaneKey::Origin.of(&req, None), origin, "{url}");
    }
    // One host, one lane: a name's final dot is the DNS root's.
    for url in [
        "https://api.example.com./x",
        "https://API.example.COM.:443/",
    ] {
        let req = request(Method::GET, url);
        assert_eq!(LaneKey::Origin.of(&req, None), "https://api.example.com");
    }
}

/// Text doubles each `|`, so a lone `|` in a name is only ever the
/// join's: two keys that read as one name joined read apart.
#[test]
fn text_doubles_each_bar() {
    let free = |text: &str| {
        let mut out = String::new();
        write_free(text, &mut out);
        out
    };
    assert_eq!(free("acme"), "acme");
    assert_eq!(free(""), "");
    assert_eq!(free("|"), "||");
    assert_eq!(free("a | b||c"), "a || b||||c");
    let name = |keys: [&str; 2]| keys.map(free).join(JOIN);
    assert_ne!(name(["a | x", "y"]), name(["a", "x | y"]));
}
