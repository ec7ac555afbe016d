//! A client's request as the upstream gets it: which upstream its prefix
//! names, the URL there, the headers without hop-by-hop ones, and the
//! controls it carried for the shaper.

use std::borrow::Cow;
use std::collections::BTreeMap;

use http::header::{self, HeaderMap, HeaderName};
use http::{Method, Uri};
use reqwest::Url;

use crate::lane::Priority;
use crate::shaper::RequestOptions;
use crate::time::human;

/// The headers a client sets for the shaper, never forwarded.
pub(super) const MAX_WAIT: &str = "x-callshaper-max-wait";
pub(super) const COST: &str = "x-callshaper-cost";
pub(super) const TAG: &str = "x-callshaper-tag";
pub(super) const PRIORITY: &str = "x-callshaper-priority";
/// The proxy's client token, when it has one.
pub(super) const TOKEN: &str = "x-callshaper-token";
const CONTROL_PREFIX: &str = "x-callshaper-";

/// The longest tag a client may send: a level keyed by tag keeps a lane
/// per tag, with the tag in its name, so a client sending long ones
/// would make each lane as large as a request head allows (64 KiB).
const LONGEST_TAG: usize = 256;

/// Why a request is not forwarded, as the client is told.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Absolute-form targets and `CONNECT`: not an open proxy.
    NotAProxy,
    /// No upstream of that name.
    Unknown(String),
    /// A path that would climb out of the upstream's base.
    DotSegment,
    /// A control header that does not parse: its name and why.
    Control(&'static str, String),
    /// The proxy has a client token, and the request did not carry it.
    Unauthorized,
}

/// The request carries the proxy's client `token`, if it has one. The
/// comparison takes as long whatever the bytes, so timing tells a client
/// nothing of how much of a guess was right.
pub(super) fn admitted(headers: &HeaderMap, token: Option<&str>) -> Result<(), Refusal> {
    let Some(token) = token else {
        return Ok(());
    };
    let given = headers.get(TOKEN).map_or(&[][..], |v| v.as_bytes());
    let differs = given.len() != token.len()
        || given
            .iter()
            .zip(token.as_bytes())
            .fold(0, |acc, (a, b)| acc | (a ^ b))
            != 0;
    if differs {
        return Err(Refusal::Unauthorized);
    }
    Ok(())
}

/// The upstream a request to `uri` (origin-form: `/NAME/rest?q`) names
/// (its name and base), and its URL there, by the `upstreams` it may go
/// to.
pub(super) fn target<'a>(
    method: &Method,
    uri: &Uri,
    upstreams: &'a BTreeMap<String, Url>,
) -> Result<((&'a str, &'a Url), Url), Refusal> {
    if method == Method::CONNECT || uri.scheme().is_some() || uri.authority().is_some() {
        return Err(Refusal::NotAProxy);
    }
    let path = uri.path().strip_prefix('/').unwrap_or(uri.path());
    let (name, rest) = path.split_once('/').unwrap_or((path, ""));
    let Some((name, base)) = upstreams.get_key_value(name) else {
        return Err(Refusal::Unknown(name.to_owned()));
    };
    if climbs(rest) {
        return Err(Refusal::DotSegment);
    }
    // A backslash goes as the client wrote it, encoded: a URL parser
    // would make it a `/`, another path than the client asked for.
    let rest = if rest.contains('\\') {
        Cow::Owned(rest.replace('\\', "%5C"))
    } else {
        Cow::Borrowed(rest)
    };
    let mut url = base.clone();
    let prefix = base.path().trim_end_matches('/');
    url.set_path(&format!("{prefix}/{rest}"));
    url.set_query(uri.query());
    Ok(((name, base), url))
}

/// Where a vendor's `Location` (from its answer to `answered`) sends the
/// client, as the client must follow it to stay shaped: a URL under the
/// upstream's `base` becomes the same path under the proxy's `/{name}`
/// (as nginx's `proxy_redirect default` does); one elsewhere stays as the
/// vendor wrote it (`None`).
pub(super) fn relocated(location: &str, answered: &Url, name: &str, base: &Url) -> Option<String> {
    let to = answered.join(location).ok()?;
    let same_origin = to.scheme() == base.scheme()
        && to.host_str() == base.host_str()
        && to.port_or_known_default() == base.port_or_known_default();
    let rest = to.path().strip_prefix(base.path().trim_end_matches('/'))?;
    if !same_origin || !(rest.is_empty() || rest.starts_with('/')) {
        return None;
    }
    let mut relocated = format!("/{name}{rest}");
    if let Some(query) = to.query() {
        relocated.push('?');
        relocated.push_str(query);
    }
    if let Some(fragment) = to.fragment() {
        relocated.push('#');
        relocated.push_str(fragment);
    }
    Some(relocated)
}

/// True when `path` has a `.` or `..` segment, however it is spelled,
/// which would move it out of the upstream's base. A URL parser resolves
/// `%2e` as `.`, and takes `\` for `/` in an `http` URL (HTTP lets a
/// client send it raw: `/llm/..\admin` went to
/// `https://api.llm.example/admin`); a vendor that decodes `%2f` or `%5c`
/// before it routes takes those for `/` too, and one on a servlet
/// container reads `..;x` as `..` (a segment's parameters go). A name
/// with dots in it (`v1.2`, `...`) is no climb.
fn climbs(path: &str) -> bool {
    if !path.contains('.') && !path.contains("%2") {
        return false;
    }
    let decoded = path
        .to_ascii_lowercase()
        .replace("%2e", ".")
        .replace('\\', "/")
        .replace("%2f", "/")
        .replace("%5c", "/")
        .replace("%3b", ";");
    decoded.split('/').any(|segment| {
        let name = segment.split_once(';').map_or(segment, |(name, _)| name);
        name == "." || name == ".."
    })
}

/// What the client asked of the shaper in `headers`, each control checked.
pub(super) fn controls(headers: &HeaderMap) -> Result<RequestOptions, Refusal> {
    let text = |name: &'static str| -> Result<Option<&str>, Refusal> {
        headers
            .get(name)
            .map(|value| {
                value
                    .to_str()
                    .map(str::trim)
                    .map_err(|_| Refusal::Control(name, "is not visible ASCII".to_owned()))
            })
            .transpose()
    };
    let max_wait = text(MAX_WAIT)?
        .map(|value| {
            human::parse(value).ok_or_else(|| {
                Refusal::Control(
                    MAX_WAIT,
                    format!("{value:?} is not a duration (try \"5s\", \"250ms\")"),
                )
            })
        })
        .transpose()?;
    let cost = text(COST)?
        .map(|value| {
            value.parse::<u64>().map_err(|_| {
                Refusal::Control(COST, format!("{value:?} is not a whole number of units"))
            })
        })
        .transpose()?;
    let tag = text(TAG)?.filter(|tag| !tag.is_empty());
    if let Some(tag) = tag
        && tag.len() > LONGEST_TAG
    {
        return Err(Refusal::Control(
            TAG,
            format!("is {} bytes; at most {LONGEST_TAG}", tag.len()),
        ));
    }
    let tag = tag.map(str::to_owned);
    let priority = text(PRIORITY)?
        .map(|value| match value {
            "interactive" => Ok(Priority::Interactive),
            "batch" => Ok(Priority::Batch),
            other => Err(Refusal::Control(
                PRIORITY,
                format!("{other:?} is neither \"interactive\" nor \"batch\""),
            )),
        })
        .transpose()?;
    Ok(RequestOptions {
        max_wait,
        cost,
        tag,
        priority,
    })
}

/// `headers` without the hop-by-hop ones (RFC 9110 §7.6.1: `Connection`
/// and those it names, `Keep-Alive`, `TE`, `Trailer`,
/// `Transfer-Encoding`, `Upgrade`, `Proxy-*`), `Host` and the shaper's
/// controls: what may cross the proxy either way. Removed in place: the
/// rest are moved on, not copied.
pub(super) fn end_to_end(mut headers: HeaderMap) -> HeaderMap {
    let mut hop: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    hop.extend(
        headers
            .keys()
            .filter(|name| {
                matches!(
                    **name,
                    header::CONNECTION
                        | header::TE
                        | header::TRAILER
                        | header::TRANSFER_ENCODING
                        | header::UPGRADE
                        | header::HOST
                ) || name.as_str() == "keep-alive"
                    || name.as_str().starts_with("proxy-")
                    || name.as_str().starts_with(CONTROL_PREFIX)
            })
            .cloned(),
    );
    for name in &hop {
        headers.remove(name);
    }
    headers
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::HeaderValue;

    use super::*;

    fn upstreams() -> BTreeMap<String, Url> {
        let base = |url: &str| Url::parse(url).unwrap();
        BTreeMap::from([
            ("llm".to_owned(), base("https://api.llm.example/v1")),
            ("pay".to_owned(), base("http://127.0.0.1:9000/")),
        ])
    }

    /// A redirect under the upstream's base, absolute or not, stays under
    /// the proxy's prefix; one elsewhere, or beside the base's path, is
    /// the vendor's as written.
    #[test]
    fn a_location_under_the_base_stays_under_the_proxy() {
        let upstreams = upstreams();
        let llm = &upstreams["llm"];
        let answered = Url::parse("https://api.llm.example/v1/chat?x=1").unwrap();
        let relocate = |location| relocated(location, &answered, "llm", llm);
        assert_eq!(
            relocate("https://api.llm.example/v1/jobs/7?page=2#top").as_deref(),
            Some("/llm/jobs/7?page=2#top")
        );
        assert_eq!(relocate("/v1/jobs/8").as_deref(), Some("/llm/jobs/8"));
        assert_eq!(relocate("jobs/9").as_deref(), Some("/llm/jobs/9"));
        assert_eq!(
            relocate("https://api.llm.example/v1").as_deref(),
            Some("/llm")
        );
        assert_eq!(relocate("https://api.llm.example/v10/x"), None);
        assert_eq!(relocate("/v2/jobs"), None);
        assert_eq!(relocate("http://api.llm.example/v1/jobs"), None);
        assert_eq!(relocate("https://files.example/v1/blob"), None);
        let pay = &upstreams["pay"];
        let answered = Url::parse("http://127.0.0.1:9000/charges").unwrap();
        let relocated = relocated("/charges/ch_1", &answered, "pay", pay);
        assert_eq!(relocated.as_deref(), Some("/pay/charges/ch_1"));
    }

    fn target_of(method: Method, uri: &str) -> Result<String, Refusal> {
        let uri: Uri = uri.parse().unwrap();
        target(&method, &uri, &upstreams()).map(|(_, url)| String::from(url))
    }

    /// The first segment names the upstream; the rest and the query go
    /// under its base, percent-encoding kept.
    #[test]
    fn a_prefix_names_the_upstream_and_the_rest_goes_under_its_base() {
        let get = |uri| target_of(Method::GET, uri);
        assert_eq!(
            get("/llm/chat/completions?stream=true"),
            Ok("https://api.llm.example/v1/chat/completions?stream=true".to_owned())
        );
        assert_eq!(get("/pay"), Ok("http://127.0.0.1:9000/".to_owned()));
        assert_eq!(
            get("/pay/a%2Fb"),
            Ok("http://127.0.0.1:9000/a%2Fb".to_owned())
        );
        assert_eq!(get("/nope/x"), Err(Refusal::Unknown("nope".to_owned())));
        assert_eq!(get("/"), Err(Refusal::Unknown(String::new())));
    }

    /// Nothing leaves for anywhere but a configured upstream's base: no
    /// absolute-form target, no `CONNECT`, no dot segment.
    #[test]
    fn nothing_is_sent_elsewhere() {
        let get = |uri| target_of(Method::GET, uri);
        assert_eq!(get("http://evil.example/x"), Err(Refusal::NotAProxy));
        let connect: Uri = "evil.example:443".parse().unwrap();
        let upstreams = upstreams();
        let refused = target(&Method::CONNECT, &connect, &upstreams);
        assert_eq!(refused, Err(Refusal::NotAProxy));
        for climb in [
            "/llm/../admin",
            "/llm/a/%2e%2E/b",
            "/llm/.%2e",
            "/llm/./x",
            "/llm/..\\admin",
            "/llm/a\\..\\..\\admin",
            "/llm/%2E%2e\\admin",
            "/llm/..%2Fadmin",
            "/llm/x/..%5c..%5Cadmin",
            "/llm/..",
            "/llm/..;x=1/admin",
            "/llm/.%2E%3b/admin",
        ] {
            assert_eq!(get(climb), Err(Refusal::DotSegment), "{climb}");
        }
        // Dots in a name climb nowhere; a backslash goes as written.
        assert_eq!(
            get("/llm/v1.2/.../a.b"),
            Ok("https://api.llm.example/v1/v1.2/.../a.b".to_owned())
        );
        assert_eq!(
            get("/llm/a\\b%2Fc"),
            Ok("https://api.llm.example/v1/a%5Cb%2Fc".to_owned())
        );
        assert_eq!(
            get("/llm//evil.example/x"),
            Ok("https://api.llm.example/v1//evil.example/x".to_owned())
        );
    }

    /// Paths of every piece a climb is spelled with, at random: whatever
    /// the URL parser makes of one, it either is refused or stays under
    /// the upstream's base (the parser is the judge, not `climbs`).
    #[test]
    fn no_spelling_of_a_path_leaves_the_base() {
        const PIECES: [&str; 14] = [
            ".", "..", "%2e", "%2E", "/", "\\", "%2f", "%5C", ";", "a", "%3b", "v1", "x.", "%",
        ];
        let upstreams = upstreams();
        let mut rng = fastrand::Rng::with_seed(27);
        let (mut refused, mut sent) = (0, 0);
        for _ in 0..20_000 {
            let mut path = String::from("/llm/");
            for _ in 0..rng.usize(1..8) {
                path.push_str(PIECES[rng.usize(..PIECES.len())]);
            }
            let Ok(uri) = path.parse::<Uri>() else {
                continue;
            };
            match target(&Method::GET, &uri, &upstreams) {
                Err(Refusal::DotSegment) => refused += 1,
                Ok((_, url)) => {
                    sent += 1;
                    assert!(url.path().starts_with("/v1/"), "{path} went to {url}");
                    assert_eq!(url.host_str(), Some("api.llm.example"), "{path}");
                }
                Err(other) => panic!("{path}: {other:?}"),
            }
        }
        assert!(
            refused > 1_000 && sent > 1_000,
            "{refused} refused, {sent} sent"
        );
    }

    /// Controls parse or name the header at fault.
    #[test]
    fn controls_parse_or_name_the_header() {
        let mut headers = HeaderMap::new();
        assert_eq!(controls(&headers), Ok(RequestOptions::default()));
        headers.insert(MAX_WAIT, HeaderValue::from_static("1.5s"));
        headers.insert(COST, HeaderValue::from_static("18446744073709551615"));
        headers.insert(TAG, HeaderValue::from_static("acme"));
        headers.insert(PRIORITY, HeaderValue::from_static("batch"));
        let parsed = controls(&headers).unwrap();
        assert_eq!(parsed.max_wait, Some(Duration::from_millis(1500)));
        assert_eq!(parsed.cost, Some(u64::MAX));
        assert_eq!(parsed.tag.as_deref(), Some("acme"));
        assert_eq!(parsed.priority, Some(Priority::Batch));
        let longest = "t".repeat(LONGEST_TAG);
        headers.insert(TAG, HeaderValue::from_str(&longest).unwrap());
        assert_eq!(controls(&headers).unwrap().tag, Some(longest));
        let too_long = "t".repeat(LONGEST_TAG + 1);
        for (name, bad) in [
            (MAX_WAIT, "soon"),
            (COST, "-1"),
            (COST, "18446744073709551616"),
            (PRIORITY, "urgent"),
            (TAG, too_long.as_str()),
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(name, HeaderValue::from_str(bad).unwrap());
            assert!(
                matches!(controls(&headers), Err(Refusal::Control(n, _)) if n == name),
                "{name}: {bad}"
            );
        }
    }

    #[test]
    fn only_the_client_token_admits() {
        let with = |token: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(TOKEN, HeaderValue::from_static(token));
            headers
        };
        assert_eq!(admitted(&HeaderMap::new(), None), Ok(()));
        assert_eq!(admitted(&with("anything"), None), Ok(()));
        assert_eq!(admitted(&with("s3cret"), Some("s3cret")), Ok(()));
        for wrong in [
            with("s3cre"),
            with("s3cret!"),
            with("S3cret"),
            HeaderMap::new(),
        ] {
            assert_eq!(admitted(&wrong, Some("s3cret")), Err(Refusal::Unauthorized));
        }
    }

    /// Hop-by-hop headers, those `Connection` names, `Host` and the
    /// controls stay behind; the rest crosses, repeated ones too.
    #[test]
    fn hop_by_hop_headers_stay_behind() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "keep-alive, x-secret-hop"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("proxy-authorization", "Basic Zm9v"),
            ("host", "127.0.0.1:7777"),
            ("x-secret-hop", "1"),
            ("x-callshaper-cost", "3"),
            ("authorization", "Bearer key"),
            ("accept", "text/event-stream"),
        ] {
            headers.append(name, HeaderValue::from_static(value));
        }
        headers.append("accept", HeaderValue::from_static("application/json"));
        let kept = end_to_end(headers.clone());
        let names: Vec<&str> = kept.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["authorization", "accept"]);
        assert_eq!(kept.get_all("accept").iter().count(), 2);
    }
}
