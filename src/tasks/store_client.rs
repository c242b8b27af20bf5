//! The client of a Redis / Valkey task store, made at start-up (and by `check-config`) from the
//! URL, the password and, for `rediss://`, the TLS files: the CAs trusted instead of the public
//! roots (`tasks.store_ca_file`) and the client certificate of mutual TLS
//! (`tasks.store_cert_file` + `tasks.store_key_file`). A file that cannot be read or holds no
//! PEM of its kind is named with its key and path, never its contents.

use std::path::Path;
use std::sync::Arc;

use redis::{ClientTlsConfig, TlsCertificates};

use super::addresses::Addresses;
use super::redis_store::RedisStore;
use super::store::{MemoryStore, TaskStore};
use crate::config::{self, StoreTls};
use crate::ops::metrics::Metrics;
use crate::state::TokenCodec;

/// The store's password, read from `store_password_env` or `store_password_file` as at start-up
/// (`None`: none configured).
///
/// # Errors
/// It cannot be read: said under the key that names where it comes from.
pub(crate) fn read_password(settings: &config::RedisStore) -> Result<Option<String>, String> {
    let Some(source) = &settings.password else {
        return Ok(None);
    };
    let key = match source {
        config::SecretSource::Env(_) => "tasks.store_password_env",
        config::SecretSource::File(_) => "tasks.store_password_file",
    };
    crate::auth::read_secret(source)
        .map(Some)
        .map_err(|e| format!("{key}: {}", e.reason()))
}

/// The configured store for instance `owner` (sealing under `tokens`' key set), and with a
/// shared one the replicas' addresses in it.
///
/// # Errors
/// The store's password or TLS files cannot be read (the message names the key), or its URL
/// makes no client.
pub(super) fn open(
    store: &config::Store,
    owner: &str,
    tokens: Arc<TokenCodec>,
    metrics: &Arc<Metrics>,
) -> Result<(Arc<dyn TaskStore>, Option<Addresses>), String> {
    let settings = match store {
        config::Store::Memory => return Ok((Arc::new(MemoryStore::new()), None)),
        config::Store::Redis(settings) => settings,
    };
    let client = store_client(settings, read_password(settings)?)?;
    let redis = RedisStore::new(settings, client, (tokens, Arc::clone(metrics)))
        .map_err(|e| format!("tasks.store: {e}"))?;
    let addresses = Addresses::new(Arc::clone(&redis), owner.to_owned());
    Ok((redis, Some(addresses)))
}

/// PEM labels of a private key rustls takes (PKCS#8, PKCS#1 RSA, SEC1 EC), unencrypted.
const KEY_LABELS: &[&str] = &["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"];

/// A client of the store at `settings.url`, with `password` (as read at start-up) and the TLS
/// files read; it connects when first used.
///
/// # Errors
/// A TLS file cannot be read or holds nothing of its kind (named by key and path), or the URL
/// makes no client (checked at config time already).
pub(crate) fn store_client(
    settings: &config::RedisStore,
    password: Option<String>,
) -> Result<redis::Client, String> {
    let mut info = redis::IntoConnectionInfo::into_connection_info(settings.url.as_str())
        .map_err(|e| format!("tasks.store: {e}"))?;
    if let Some(p) = password {
        let redis = info.redis_settings().clone().set_password(p);
        info = info.set_redis_settings(redis);
    }
    match certificates(&settings.tls)? {
        None => redis::Client::open(info).map_err(|e| format!("tasks.store: {e}")),
        // The PEM was checked above; what rustls still refuses (a certificate that is no
        // X.509) is said without redis-rs's text, which may quote a line of the file.
        Some(certs) => redis::Client::build_with_tls(info, certs).map_err(|_| {
            "tasks.store_ca_file / store_cert_file / store_key_file: a certificate or key \
             does not parse"
                .to_owned()
        }),
    }
}

/// The TLS files read, or `None` when the store uses the defaults (the public roots, no
/// client certificate).
fn certificates(tls: &StoreTls) -> Result<Option<TlsCertificates>, String> {
    if tls.is_default() {
        return Ok(None);
    }
    let root_cert = (tls.ca_file.as_deref())
        .map(|p| read_pem("tasks.store_ca_file", p, &["CERTIFICATE"]))
        .transpose()?;
    let client_tls = match &tls.client {
        None => None,
        Some(c) => Some(ClientTlsConfig {
            client_cert: read_pem("tasks.store_cert_file", &c.cert_file, &["CERTIFICATE"])?,
            client_key: read_pem("tasks.store_key_file", &c.key_file, KEY_LABELS)?,
        }),
    };
    Ok(Some(TlsCertificates {
        client_tls,
        root_cert,
    }))
}

/// The bytes of the PEM file `path` (the value of `key`), which must hold a block labelled one
/// of `labels`.
fn read_pem(key: &str, path: &Path, labels: &[&str]) -> Result<Vec<u8>, String> {
    let shown = path.display();
    let bytes = std::fs::read(path).map_err(|e| format!("{key}: cannot read {shown}: {e}"))?;
    let blocks = pem::parse_many(&bytes).unwrap_or_default();
    if blocks.iter().any(|b| labels.contains(&b.tag())) {
        Ok(bytes)
    } else {
        Err(format!(
            "{key}: {shown} holds no PEM block labelled {}",
            labels.join(" or ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClientIdentity;

    fn settings(tls: StoreTls) -> config::RedisStore {
        config::RedisStore {
            url: "rediss://127.0.0.1:6380/0".into(),
            prefix: "mrtr:".into(),
            password: None,
            timeout: std::time::Duration::from_secs(1),
            lease: std::time::Duration::from_secs(3),
            tls,
        }
    }

    #[test]
    fn an_unreadable_or_wrong_file_is_named_by_key_and_path_never_by_its_contents() {
        let dir = std::env::temp_dir().join(format!("mrtr-store-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = "-----BEGIN SOMETHING-----\nc2VjcmV0LXZhbHVlLTQy\n-----END SOMETHING-----\n";
        let wrong = dir.join("wrong.pem");
        std::fs::write(&wrong, secret).unwrap();
        let missing = dir.join("missing.pem");
        let with_ca = |ca: &Path| StoreTls {
            ca_file: Some(ca.to_owned()),
            client: None,
        };
        let client = ClientIdentity {
            cert_file: wrong.clone(),
            key_file: wrong.clone(),
        };
        let mtls = StoreTls {
            ca_file: None,
            client: Some(client),
        };
        let errors = [with_ca(&missing), with_ca(&wrong), mtls]
            .map(|tls| store_client(&settings(tls), None).unwrap_err());
        assert!(errors[0].starts_with("tasks.store_ca_file: cannot read "));
        assert!(errors[0].contains("missing.pem"), "{}", errors[0]);
        assert!(errors[1].starts_with("tasks.store_ca_file: "));
        assert!(errors[1].contains("wrong.pem"), "{}", errors[1]);
        assert!(errors[2].starts_with("tasks.store_cert_file: "));
        assert!(errors[2].contains("CERTIFICATE"), "{}", errors[2]);
        for e in &errors {
            assert!(!e.contains("c2VjcmV0") && !e.contains("SOMETHING"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
