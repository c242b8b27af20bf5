//! `[tasks] store_ca_file`, `store_cert_file`, `store_key_file`: how the proxy trusts a
//! `rediss://` task store and, for mutual TLS, how it proves itself to one. The files are named
//! here and read at start-up (and by `check-config`), never at config time.
//!
//! `store_ca_file` *replaces* the public (webpki / Mozilla) roots: a store behind a private CA
//! is trusted only through that CA, so no public CA can vouch for an impostor of it.

use std::path::PathBuf;

use super::error::{invalid, ConfigError};
use super::tasks::RawTasks;

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
    /// The TLS keys of `raw`, for a store at `url` (`tls`: whether it is `rediss://`).
    ///
    /// # Errors
    /// A TLS key with a plain `redis://` URL, a certificate without its key (or a key without
    /// its certificate), an empty path, or `#insecure` (certificate checks off).
    pub(super) fn from_raw(raw: &RawTasks, tls: bool, insecure: bool) -> Result<Self, ConfigError> {
        if insecure {
            return Err(invalid(
                "tasks.store",
                "`#insecure` turns off the store's certificate check (anyone on the path could \
                 read and forge task records): give store_ca_file for a private CA instead",
            ));
        }
        let path = |key: &'static str, v: &Option<String>| match v.as_deref() {
            None => Ok(None),
            Some(_) if !tls => Err(invalid(key, "only with a rediss:// (TLS) store")),
            Some("") => Err(invalid(key, "an empty path")),
            Some(p) => Ok(Some(PathBuf::from(p))),
        };
        let ca_file = path("tasks.store_ca_file", &raw.store_ca_file)?;
        let cert = path("tasks.store_cert_file", &raw.store_cert_file)?;
        let key = path("tasks.store_key_file", &raw.store_key_file)?;
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

#[cfg(test)]
mod tests {
    use super::super::tasks::{Store, Tasks};
    use super::*;

    fn tls(toml: &str) -> Result<StoreTls, String> {
        let tasks = Tasks::from_raw(toml::from_str(toml).map_err(|e| e.to_string())?);
        match tasks.map_err(|e| e.to_string())?.store {
            Store::Redis(r) => Ok(r.tls),
            Store::Memory => Err("memory".into()),
        }
    }

    #[test]
    fn a_rediss_store_takes_a_ca_and_a_client_certificate_with_its_key() {
        let t = tls("store = \"rediss://cache:6380/0\"").unwrap();
        assert!(t.is_default(), "the public roots, no client certificate");
        let t = tls(
            "store = \"rediss://cache:6380/0\"\nstore_ca_file = \"/etc/ca.pem\"\n\
                     store_cert_file = \"/etc/c.pem\"\nstore_key_file = \"/etc/c.key\"",
        )
        .unwrap();
        assert_eq!(t.ca_file, Some(PathBuf::from("/etc/ca.pem")));
        let client = t.client.unwrap();
        assert_eq!(
            (client.cert_file.to_str(), client.key_file.to_str()),
            (Some("/etc/c.pem"), Some("/etc/c.key"))
        );
    }

    #[test]
    fn tls_keys_on_a_plain_store_a_lone_cert_or_key_and_insecure_are_refused_by_name() {
        for (toml, key) in [
            (
                "store = \"redis://h/0\"\nstore_ca_file = \"/ca\"",
                "tasks.store_ca_file",
            ),
            (
                "store = \"redis://h/0\"\nstore_cert_file = \"/c\"",
                "tasks.store_cert_file",
            ),
            (
                "store = \"redis://h/0\"\nstore_key_file = \"/k\"",
                "tasks.store_key_file",
            ),
            (
                "store = \"rediss://h/0\"\nstore_cert_file = \"/c\"",
                "tasks.store_cert_file",
            ),
            (
                "store = \"rediss://h/0\"\nstore_key_file = \"/k\"",
                "tasks.store_key_file",
            ),
            (
                "store = \"rediss://h/0\"\nstore_ca_file = \"\"",
                "tasks.store_ca_file",
            ),
            ("store = \"rediss://h/#insecure\"", "tasks.store"),
        ] {
            let e = tls(toml).unwrap_err();
            assert!(e.contains(&format!("`{key}`")), "{toml}: {e}");
        }
        let e = tls("store = \"rediss://h/#insecure\"").unwrap_err();
        assert!(e.contains("store_ca_file"), "says what to do instead: {e}");
    }
}
