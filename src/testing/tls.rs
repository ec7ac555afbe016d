//! Certificates made at test time for a TLS Redis: a CA of its own, a
//! server certificate for `127.0.0.1` signed by it, and a client
//! certificate for mutual TLS. Made with the `openssl` command, which
//! `scripts/test` installs when missing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// A throwaway certificate authority and the certificates it signed,
/// as PEM files in a scratch directory that goes when it is dropped.
///
/// # Panics
///
/// [`new`](Self::new) panics, with what to install, when `openssl` is
/// missing or fails: a TLS test must never pass without TLS.
#[derive(Debug)]
pub struct TestCa {
    dir: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|error| {
            panic!(
                "cannot run openssl ({error}): TLS tests make their certificates with it. \
                 Run scripts/test, which installs it, or `apt-get install openssl`."
            )
        });
    assert!(
        output.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

impl TestCa {
    /// A new CA, with a server certificate (for `127.0.0.1` and
    /// `localhost`, also good as a client one, as Redis's cluster bus and
    /// replication use it) and a client certificate, all P-256, valid two
    /// days.
    pub fn new() -> Self {
        static MADE: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "callshaper-ca-{}-{}",
            std::process::id(),
            MADE.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("a scratch directory for certificates");
        let key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        openssl(
            &dir,
            &[
                &["req", "-x509", "-new", "-nodes"][..],
                &key,
                &["-keyout", "ca.key", "-out", "ca.crt", "-days", "2"],
                &["-subj", "/CN=callshaper test CA"],
            ]
            .concat(),
        );
        for (name, usage) in [
            ("server", "serverAuth,clientAuth"),
            ("client", "clientAuth"),
        ] {
            let extensions =
                format!("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage={usage}\n");
            std::fs::write(dir.join(format!("{name}.ext")), extensions)
                .expect("an extensions file");
            let (csr, crt, pem_key, ext, subject) = (
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.key"),
                format!("{name}.ext"),
                format!("/CN={name}"),
            );
            openssl(
                &dir,
                &[
                    &["req", "-new", "-nodes"][..],
                    &key,
                    &["-keyout", &pem_key, "-out", &csr, "-subj", &subject],
                ]
                .concat(),
            );
            openssl(
                &dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-out",
                    &crt,
                    "-extfile",
                    &ext,
                ],
            );
        }
        Self { dir }
    }

    /// The path of one of its files: `ca.crt`, `server.crt`, `server.key`,
    /// `client.crt`, `client.key`.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    fn read(&self, file: &str) -> Vec<u8> {
        std::fs::read(self.path(file)).expect("a certificate made by TestCa::new")
    }

    /// The CA's certificate, PEM: what a client trusts.
    pub fn ca_pem(&self) -> Vec<u8> {
        self.read("ca.crt")
    }

    /// The client certificate, PEM.
    pub fn client_pem(&self) -> Vec<u8> {
        self.read("client.crt")
    }

    /// The client certificate's private key, PEM.
    pub fn client_key_pem(&self) -> Vec<u8> {
        self.read("client.key")
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
