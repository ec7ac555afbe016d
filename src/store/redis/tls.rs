//! TLS to Redis (`rediss://`): the CA roots a store trusts and the client
//! certificate it presents, and the connection details each node's client
//! is built from.

use crate::error::StoreError;

use super::errors::failed;

/// The certificates a store's connections use beyond the system's roots.
/// PEM bytes, checked when the store connects.
#[derive(Clone, Default)]
pub(super) struct Certificates {
    /// CA certificates trusted instead of the system's roots.
    pub(super) roots: Option<Vec<u8>>,
    /// A client certificate chain and its key, for mutual TLS.
    pub(super) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for Certificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never a key's bytes in a log line.
        f.debug_struct("Certificates")
            .field("roots", &self.roots.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl Certificates {
    fn is_empty(&self) -> bool {
        self.roots.is_none() && self.client.is_none()
    }

    /// A client for the node at `url`, with these certificates when it is
    /// a `rediss://` URL.
    pub(super) fn client(&self, url: &str) -> Result<redis::Client, StoreError> {
        self.check(url)?;
        self.tls_client(url)
    }

    /// Whether these certificates can serve `url`: PEM where PEM is given,
    /// TLS only on a `rediss://` URL, and the feature for it.
    pub(super) fn check(&self, url: &str) -> Result<(), StoreError> {
        let tls = url.starts_with("rediss://");
        if tls && !cfg!(feature = "redis-tls") {
            return Err(StoreError::Tls(format!(
                "`{}` needs callshaper's `redis-tls` feature",
                redact(url)
            )));
        }
        let pem = |bytes: &[u8], what: &str| {
            if bytes.windows(11).any(|w| w == b"-----BEGIN ") {
                Ok(())
            } else {
                Err(StoreError::Tls(format!("the {what} hold no PEM block")))
            }
        };
        if let Some(roots) = &self.roots {
            pem(roots, "CA roots")?;
        }
        if let Some((chain, key)) = &self.client {
            pem(chain, "client certificate's bytes")?;
            pem(key, "client key's bytes")?;
        }
        if !tls && !self.is_empty() {
            return Err(StoreError::Tls(format!(
                "CA roots or a client certificate were given for `{}`: TLS needs a `rediss://` URL",
                redact(url)
            )));
        }
        Ok(())
    }

    #[cfg(feature = "redis-tls")]
    fn tls_client(&self, url: &str) -> Result<redis::Client, StoreError> {
        match self.redis() {
            Some(certificates) => redis::Client::build_with_tls(url, certificates).map_err(failed),
            None => redis::Client::open(url).map_err(failed),
        }
    }

    #[cfg(not(feature = "redis-tls"))]
    fn tls_client(&self, url: &str) -> Result<redis::Client, StoreError> {
        redis::Client::open(url).map_err(failed)
    }

    /// The certificates as redis-rs takes them, when any were given.
    #[cfg(feature = "redis-tls")]
    pub(super) fn redis(&self) -> Option<redis::TlsCertificates> {
        if self.is_empty() {
            return None;
        }
        Some(redis::TlsCertificates {
            client_tls: self.client.clone().map(|(client_cert, client_key)| {
                redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                }
            }),
            root_cert: self.roots.clone(),
        })
    }
}

/// `url` without its password, for an error message.
fn redact(url: &str) -> String {
    match (url.split_once("://"), url.rsplit_once('@')) {
        (Some((scheme, _)), Some((_, host))) => format!("{scheme}://…@{host}"),
        _ => url.to_owned(),
    }
}
