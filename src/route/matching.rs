//! Which requests a route matches: hosts and paths as URLs, and the
//! vendors they reach, spell them.

use std::borrow::Cow;

/// `base` as a vendor's base URL, the one rule for the file's `upstream`
/// and the proxy's upstreams: an `http(s)` URL with a host, without query,
/// fragment or credentials, its path without a trailing `/`.
#[cfg(any(feature = "config", feature = "proxy"))]
pub(crate) fn upstream_base(base: &str) -> Result<reqwest::Url, String> {
    let mut url = reqwest::Url::parse(base)
        .map_err(|e| format!("{base:?} is not an http or https URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(format!("{base:?} is not an http or https URL with a host"));
    }
    let credentials = !url.username().is_empty() || url.password().is_some();
    if url.query().is_some() || url.fragment().is_some() || credentials {
        return Err(format!(
            "{base:?} has a query, fragment or user: a base is scheme, host and path"
        ));
    }
    let path = url.path().trim_end_matches('/').to_owned();
    url.set_path(&path);
    Ok(url)
}

/// `host` as a request's URL spells it: lowercase, a Unicode name by its
/// ASCII form, and its port when one is given, even its scheme's own (a
/// route on `:443` is not a route on every port); or why it is not a host.
pub(crate) fn host_name(host: &str) -> Result<String, String> {
    let refused = || {
        format!(
            "{host:?} is not a host: write the host alone, as `api.example.com` or `127.0.0.1:8080`"
        )
    };
    // A URL's parser drops line breaks and outer spaces, which no host
    // has.
    if host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(refused());
    }
    // Each scheme drops its own default port: read as both, a port given
    // is in one of them.
    let parse = |scheme: &str| reqwest::Url::parse(&format!("{scheme}://{host}/")).ok();
    let (Some(http), Some(https)) = (parse("http"), parse("https")) else {
        return Err(refused());
    };
    let alone = http.path() == "/"
        && http.query().is_none()
        && http.fragment().is_none()
        && http.username().is_empty()
        && http.password().is_none();
    match bare_host(&http) {
        Some(name) if alone && !name.is_empty() => Ok(match http.port().or(https.port()) {
            Some(port) => format!("{name}:{port}"),
            None => name.to_owned(),
        }),
        _ => Err(refused()),
    }
}

pub(super) fn host_matches(host: &str, url: &reqwest::Url) -> bool {
    match host.rsplit_once(':') {
        Some((name, port)) if !name.is_empty() && !name.ends_with(':') => {
            bare_host(url) == Some(name)
                && url
                    .port_or_known_default()
                    .is_some_and(|p| p.to_string() == port)
        }
        _ => bare_host(url) == Some(host),
    }
}

/// `url`'s host as routes and lanes know it: a name's one final `.` (the
/// DNS root, `api.example.com.`) dropped, since it names the same host and
/// the same vendor. Kept, it made a lane of its own with the vendor's
/// whole quota, and matched no route of the host.
pub(super) fn bare_host(url: &reqwest::Url) -> Option<&str> {
    url.host_str()
        .map(|host| host.strip_suffix('.').unwrap_or(host))
}

/// `pattern`'s segments as a request's URL spells them (`*` and `{name}`
/// as they are), or why it is not a path.
pub(super) fn path_pattern(pattern: &str) -> Result<Vec<String>, String> {
    if pattern.contains(['?', '#']) {
        return Err(format!(
            "{pattern:?} has a query or fragment: a path pattern matches the path alone"
        ));
    }
    segments(pattern)
        .map(|segment| {
            if segment == "*" || (segment.starts_with('{') && segment.ends_with('}')) {
                return Ok(segment.to_owned());
            }
            // As the URL of a request naming it spells it. A URL reads `\`
            // as `/`, and `.` and `..` away.
            let url = reqwest::Url::parse(&format!("http://h/{segment}")).ok();
            match url.as_ref().and_then(|url| url.path().strip_prefix('/')) {
                Some(spelled) if !spelled.is_empty() && !spelled.contains('/') => {
                    Ok(normalized(spelled).into_owned())
                }
                _ => Err(format!(
                    "{segment:?} in {pattern:?} is not a path segment a request can have"
                )),
            }
        })
        .collect()
}

fn segments(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|s| !s.is_empty())
}

/// Whether a request's `path` matches `pattern` as its vendor may read
/// the path: a segment in any of its spellings (see [`normalized`]), and
/// `%2F` or `%5C` either kept in their segment (`/v1/files/{name}` and
/// `a%2Fb`) or as the `/` a vendor may decode them to before it routes.
/// Either reading that matches counts the request under the route: one
/// counted there needlessly waits, one missed goes past the route's quota
/// (`/v1/%70ayments` did).
pub(super) fn path_matches(pattern: &[String], path: &str) -> bool {
    match separated(path) {
        Cow::Owned(divided) => segments_match(pattern, path) || segments_match(pattern, &divided),
        Cow::Borrowed(_) => segments_match(pattern, path),
    }
}

fn segments_match(pattern: &[String], path: &str) -> bool {
    let mut path = segments(path);
    for (i, want) in pattern.iter().enumerate() {
        let last = i + 1 == pattern.len();
        if last && want == "*" {
            return true;
        }
        match path.next() {
            Some(_) if want == "*" || (want.starts_with('{') && want.ends_with('}')) => {}
            Some(segment) if segment_is(segment, want) => {}
            _ => return false,
        }
    }
    path.next().is_none()
}

/// Whether a request's `segment` is the pattern's `want`: in any spelling
/// (see [`normalized`]), and with or without its `;` parameters, which a
/// servlet container drops before it routes (`payments;jsessionid=1` is
/// its `payments`), unless the pattern names them.
fn segment_is(segment: &str, want: &str) -> bool {
    if normalized(segment) == want {
        return true;
    }
    match segment.split_once(';') {
        Some((bare, _)) if !want.contains(';') => normalized(bare) == want,
        _ => false,
    }
}

/// `path` with each `%2F` and `%5C` (any case) as a `/`.
fn separated(path: &str) -> Cow<'_, str> {
    let escaped = |at: usize| {
        path.get(at + 1..at + 3)
            .is_some_and(|hex| hex.eq_ignore_ascii_case("2F") || hex.eq_ignore_ascii_case("5C"))
    };
    let mut out = String::new();
    // Where the path is still to be copied from: past the last escape read
    // as a `/`, and 0 while there was none.
    let mut rest = 0;
    for (at, _) in path.match_indices('%') {
        if at >= rest && escaped(at) {
            out.push_str(&path[rest..at]);
            out.push('/');
            rest = at + 3;
        }
    }
    if rest == 0 {
        return Cow::Borrowed(path);
    }
    out.push_str(&path[rest..]);
    Cow::Owned(out)
}

/// A path segment as one of its spellings a vendor reads alike: an
/// escaped character a segment may hold as it is (RFC 3986's `pchar`: a
/// letter, a digit, `-._~!$&'()*+,;=:@`) decoded, any other escape's hex
/// digits in upper case. Patterns and requests are both read so.
pub(super) fn normalized(segment: &str) -> Cow<'_, str> {
    use std::fmt::Write;

    if !segment.contains('%') {
        return Cow::Borrowed(segment);
    }
    let mut out = String::with_capacity(segment.len());
    let mut rest = segment;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let escape = &rest[at..];
        let byte = escape
            .get(1..3)
            .filter(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match byte {
            Some(byte) if byte.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@".contains(&byte) => {
                out.push(char::from(byte));
            }
            Some(byte) => {
                let _ = write!(out, "%{byte:02X}");
            }
            None => {
                out.push('%');
                rest = &escape[1..];
                continue;
            }
        }
        rest = &escape[3..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}
