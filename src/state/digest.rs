//! The digests a requestState binds (the principal, the request) and the random ids it names
//! (instances, calls, tokens). Tokens carry these from one instance and one version to
//! another, so they are pinned.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use sha2::{Digest, Sha256};

/// Seconds since the epoch (0 before it).
pub(crate) fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A random URL-safe id of `bytes` random bytes.
pub(crate) fn random_id(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    // getrandom only fails when the OS has no entropy source at all; a zeroed id would then be
    // guessable, so fall back to a time-derived hash rather than panic on the request path.
    if getrandom::getrandom(&mut buf).is_err() {
        let seed = format!("{:?}{:?}", SystemTime::now(), std::thread::current().id());
        buf = Sha256::digest(seed.as_bytes())[..bytes.min(32)].to_vec();
    }
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(buf)
}

/// Hex digest of the principal header value (`None` → the anonymous principal, computed once:
/// it is asked for on every request that carries no principal header).
pub(crate) fn principal_digest(value: Option<&[u8]>) -> String {
    static ANONYMOUS: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    match value {
        None => ANONYMOUS.get_or_init(|| digest_principal(None)).clone(),
        v => digest_principal(v),
    }
}

fn digest_principal(value: Option<&[u8]>) -> String {
    let mut h = Sha256::new();
    h.update(b"principal\0");
    match value {
        Some(v) => {
            h.update(b"1");
            h.update(v);
        }
        None => h.update(b"0"),
    }
    hex::encode(&h.finalize()[..16])
}

/// Hex digest of a request: method, target (tool/prompt name or resource uri) and the canonical
/// (key-sorted) arguments.
pub(crate) fn request_digest(method: &str, target: &str, arguments: &serde_json::Value) -> String {
    let mut h = Sha256::new();
    for part in [
        method.as_bytes(),
        target.as_bytes(),
        canonical_json(arguments).as_bytes(),
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    hex::encode(&h.finalize()[..16])
}

/// Key-sorted compact JSON (serde_json's map is ordered by key without `preserve_order`).
fn canonical_json(v: &serde_json::Value) -> String {
    crate::jsonrpc::text(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_canonical() {
        let a: serde_json::Value = serde_json::from_str(r#"{"b":1,"a":{"y":2,"x":1}}"#).unwrap();
        let b: serde_json::Value = serde_json::from_str(r#"{"a":{"x":1,"y":2},"b":1}"#).unwrap();
        assert_eq!(
            request_digest("tools/call", "t", &a),
            request_digest("tools/call", "t", &b)
        );
        assert_ne!(
            request_digest("tools/call", "t", &a),
            request_digest("tools/call", "u", &a)
        );
        assert_ne!(
            request_digest("tools/call", "t", &a),
            request_digest("prompts/get", "t", &a)
        );
        assert_ne!(principal_digest(None), principal_digest(Some(b"")));
        assert_ne!(random_id(16), random_id(16));
    }

    #[test]
    fn digests_are_pinned() {
        // Tokens carry these from one instance (and version) to another.
        let anonymous = "d16e4f6c5613a9ae30b30441e9da786f";
        assert_eq!(principal_digest(None), anonymous);
        assert_eq!(principal_digest(None), anonymous);
        assert_eq!(
            principal_digest(Some(b"alice")),
            "f96699f8c5a77a6b5b66d179796b1d74"
        );
        assert_eq!(
            request_digest("tools/call", "echo", &serde_json::json!({"b": "x", "a": 1})),
            "d1d6a3624f04f8b246639bb7ea80463e"
        );
    }
}
