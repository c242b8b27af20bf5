//! `[tasks] store_ca_file`, `store_cert_file`, `store_key_file`: how the proxy trusts a
//! `rediss://` task store and, for mutual TLS, how it proves itself to one. The files are named
//! here and read at start-up (and by `check-config`), never at config time.
//!
//! `store_ca_file` *replaces* the public (webpki / Mozilla) roots: a store behind a private CA
//! is trusted only through that CA, so no public CA can vouch for an impostor of it.

use std::path::PathBuf;

use super::error::{invalid, ConfigError};

/// The TLS of a `rediss://` store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreTls {
    /// `store_ca_file`: the PEM certificates of the CAs that sign the store's certificate,
    /// trusted instead of the public roots; `None`: the public roots.
    pub ca_file: Option<PathBuf>,
    /// `store_cert_file` + `store_key_file`: this proxy's certificate (chain) and private key,
    /// for a store that asks its clients for one (`tls-auth-clients yes`).
    pub client: Option<ClientIdentity>,
}

/// A client certificate and its key, as PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// `store_cert_file`
    pub cert_file: PathBuf,
    /// `store_key_file`
    pub key_file: PathBuf,
}

impl StoreTls {
    /// The TLS keys `[store_ca_file, store_cert_file, store_key_file]` as written, for a store
    /// whose URL is `rediss://` when `tls`.
    ///
    /// # Errors
    /// A TLS key with a plain `redis://` URL, a certificate without its key (or a key without
    /// its certificate), an empty path.
    pub(super) fn from_raw(files: [Option<&str>; 3], tls: bool) -> Result<Self, ConfigError> {
        let path = |key: &'static str, v: Option<&str>| match v {
            None => Ok(None),
            Some(_) if !tls => Err(invalid(key, "only with a rediss:// (TLS) store")),
            Some("") => Err(invalid(key, "an empty path")),
            Some(p) => Ok(Some(PathBuf::from(p))),
        };
        let [ca, cert, key] = files;
        let ca_file = path("tasks.store_ca_file", ca)?;
        let cert = path("tasks.store_cert_file", cert)?;
        let key = path("tasks.store_key_file", key)?;
        let client = match (cert, key) {
            (None, None) => None,
            (Some(cert_file), Some(key_file)) => Some(ClientIdentity {
                cert_file,
                key_file,
            }),
            (Some(_), None) => {
                return Err(invalid(
                    "tasks.store_cert_file",
                    "needs store_key_file (the certificate's private key)",
                ))
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "tasks.store_key_file",
                    "needs store_cert_file (the key's certificate)",
                ))
            }
        };
        Ok(Self { ca_file, client })
    }

    /// Whether anything differs from the defaults (public roots, no client certificate).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}
