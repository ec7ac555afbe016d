//! A level's keys ([`LaneKey`]), and the request's parts they read: its
//! tag, its origin, a header's credential.

use std::fmt;
use std::sync::Arc;

use reqwest::Request;
use reqwest::header::HeaderName;

use super::matching::bare_host;

/// A label a request carries for [`LaneKey::Tag`] levels: a tenant, a user.
///
/// Set it with [`RequestBuilder::tag`](crate::shaper::RequestBuilder::tag), or as a
/// `reqwest_middleware` extension.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tag(pub String);

/// A request's cost for quotas that count cost (tokens), as a
/// `reqwest_middleware` extension; see
/// [`RequestBuilder::cost`](crate::shaper::RequestBuilder::cost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost(pub u64);

/// Picks a request's key from the request and its tag.
pub type KeyFn = dyn Fn(&Request, Option<&Tag>) -> String + Send + Sync;

/// Where a level's lane key comes from.
#[derive(Clone)]
pub enum LaneKey {
    /// The request's origin, `scheme://host:port`.
    Origin,
    /// A request header's value (an API key), by its fingerprint (`#` and
    /// 16 hex digits of its SHA-1): the value itself is never in a lane's
    /// name, snapshot, spans, metrics or Redis keys, nor sent on a
    /// redirect to another origin. Requests without the header share one
    /// lane.
    Header(HeaderName),
    /// The request's [`Tag`]; untagged requests share one lane.
    Tag,
    /// One lane for every request of the level.
    Shared,
    /// A function of the request and its tag.
    Custom(Arc<KeyFn>),
}

impl LaneKey {
    #[cfg(test)]
    pub(super) fn of(&self, request: &Request, tag: Option<&Tag>) -> String {
        let mut key = String::new();
        self.write(request, tag, &mut key);
        key
    }

    /// The key of `request`, written at the end of `out`: every request
    /// names its lane so, and a found lane's name costs no allocation
    /// beyond `out`.
    pub(crate) fn write(&self, request: &Request, tag: Option<&Tag>, out: &mut String) {
        match self {
            Self::Origin => write_origin(request.url(), out),
            Self::Header(name) => {
                if let Some(value) = request.headers().get(name) {
                    write_fingerprint(name, value.as_bytes(), out);
                }
            }
            Self::Tag => write_free(tag.map_or("", |t| t.0.as_str()), out),
            Self::Shared => {}
            Self::Custom(key) => write_free(&key(request, tag), out),
        }
    }
}

/// `url`'s origin as `Origin::ascii_serialization` writes it
/// (`scheme://host[:port]`, the port only when not the scheme's own), with
/// no `Origin` made for it.
fn write_origin(url: &reqwest::Url, out: &mut String) {
    use std::fmt::Write;

    match (url.scheme(), bare_host(url)) {
        (scheme @ ("http" | "https"), Some(host)) => {
            out.push_str(scheme);
            out.push_str("://");
            out.push_str(host);
            // The parser drops a scheme's own port: `port` is any other.
            if let Some(port) = url.port() {
                let _ = write!(out, ":{port}");
            }
        }
        _ => out.push_str(&url.origin().ascii_serialization()),
    }
}

/// A header's value as a lane key. The value is often a secret, and a
/// lane's key travels far (snapshots, logs, metrics, the fleet's Redis):
/// 64 bits of a digest keep keys apart (finding another value with the
/// same fingerprint takes about 2^64 tries) and say nothing of the value.
///
/// The digest is of the credential as its vendor reads it: without the
/// spaces around the value, and in `Authorization` with its scheme in
/// lower case and one space after it (RFC 9110 reads a scheme in any
/// case: `Bearer sk-1` and `bearer  sk-1` are one key). Two spellings of
/// one key were two lanes, each with the key's whole quota.
fn write_fingerprint(name: &HeaderName, value: &[u8], out: &mut String) {
    use std::fmt::Write;

    use reqwest::header::{AUTHORIZATION, PROXY_AUTHORIZATION};

    let value = value.trim_ascii();
    let mut digest = sha1_smol::Sha1::new();
    let scheme = (name == AUTHORIZATION || name == PROXY_AUTHORIZATION)
        .then(|| value.iter().position(|b| matches!(b, b' ' | b'\t')))
        .flatten();
    match scheme {
        Some(at) => {
            let (scheme, credentials) = value.split_at(at);
            for byte in scheme {
                digest.update(&[byte.to_ascii_lowercase()]);
            }
            digest.update(b" ");
            digest.update(credentials.trim_ascii_start());
        }
        None => digest.update(value),
    }
    let digest = digest.digest().bytes();
    out.push('#');
    for byte in &digest[..8] {
        let _ = write!(out, "{byte:02x}");
    }
}

/// In a file: `"origin"`, `"shared"`, `"tag"`, or `{ header = "x-api-key" }`
/// (a [`Custom`](LaneKey::Custom) key is code, not data).
#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for LaneKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "snake_case", deny_unknown_fields)]
        enum Declared {
            Origin,
            Shared,
            Tag,
            Header(String),
        }
        Ok(match Declared::deserialize(deserializer)? {
            Declared::Origin => Self::Origin,
            Declared::Shared => Self::Shared,
            Declared::Tag => Self::Tag,
            Declared::Header(name) => {
                Self::Header(HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                    serde::de::Error::custom(format!("{name:?} is not a header name"))
                })?)
            }
        })
    }
}

impl fmt::Debug for LaneKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Origin => f.write_str("Origin"),
            Self::Header(name) => f.debug_tuple("Header").field(name).finish(),
            Self::Tag => f.write_str("Tag"),
            Self::Shared => f.write_str("Shared"),
            Self::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

/// Text of any kind in a lane's name (a tag, a custom key, a level's or a
/// route's name), each `|` doubled: the lone `|` of ` | ` (`lane/name.rs`)
/// joins the name's parts, so no text can end one part and begin another.
/// Two tenants'
/// keys on two levels (`a | project/x` and `y`, against `a` and
/// `x | project/y`) wrote one name, and a request of one took the
/// other's lane and gates.
pub(crate) fn write_free(text: &str, out: &mut String) {
    // Every request writes a level's name and key so: nearly all hold no
    // `|`, and a byte search is all they cost.
    if !text.as_bytes().contains(&b'|') {
        out.push_str(text);
        return;
    }
    let mut pieces = text.split('|');
    out.push_str(pieces.next().unwrap_or_default());
    for piece in pieces {
        out.push_str("||");
        out.push_str(piece);
    }
}
