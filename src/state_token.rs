//! `requestState` tokens: compact HS256 JWTs naming a parked call, bound to a principal, a request
//! and a round, with an expiry and a single-use id.
//!
//! This module signs and verifies; it does not know whether a call is still parked or whether a
//! `jti` was used — the parked-call registry checks those.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::Secret;

/// Claims carried by a requestState. Nothing here reaches the upstream session. Names are short
/// on the wire (the token travels on every retry), full in code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Claims {
    /// Unguessable handle of the parked call.
    #[serde(rename = "h")]
    pub(crate) handle: String,
    /// Issuer: this proxy instance.
    #[serde(rename = "iss")]
    pub(crate) issuer: String,
    /// Digest of the principal.
    #[serde(rename = "sub")]
    pub(crate) principal: String,
    /// Digest of the request (method + name/uri + canonical arguments).
    #[serde(rename = "req")]
    pub(crate) request: String,
    /// Round number, starting at 1.
    #[serde(rename = "rnd")]
    pub(crate) round: u32,
    /// Issued at (unix seconds).
    #[serde(rename = "iat")]
    pub(crate) issued_at: u64,
    /// Expires at (unix seconds).
    #[serde(rename = "exp")]
    pub(crate) expires_at: u64,
    /// Single-use id of this round's token.
    #[serde(rename = "jti")]
    pub(crate) token_id: String,
}

/// Why a requestState was refused. Every variant is a client-side failure (-32602).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TokenError {
    /// Not a token we signed: bad format, bad signature, wrong algorithm, wrong issuer.
    #[error("requestState is invalid")]
    Invalid,
    /// Past its `exp`.
    #[error("requestState has expired")]
    Expired,
    /// Signed for another principal.
    #[error("requestState belongs to another principal")]
    WrongPrincipal,
    /// Signed for another method, tool, prompt, resource or other arguments.
    #[error("requestState belongs to a different request")]
    WrongRequest,
    /// This token's round was already answered.
    #[error("requestState was already used")]
    AlreadyUsed,
    /// The parked call behind it is gone.
    #[error("requestState refers to a call that is no longer parked: {0}")]
    Gone(String),
}

/// Signs and verifies requestState tokens.
pub(crate) struct TokenCodec {
    encoding: EncodingKey,
    decoding: DecodingKey,
    issuer: String,
    ttl: Duration,
    /// Wall time at construction, and tokio's clock at the same moment: `now()` is the first
    /// plus the tokio time since the second, so a paused test runtime moves token expiry and
    /// parked-call deadlines (tokio timers) together.
    anchor: (SystemTime, tokio::time::Instant),
}

impl std::fmt::Debug for TokenCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCodec")
            .field("issuer", &self.issuer)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl TokenCodec {
    /// A codec for `secret`, issuing as `issuer`, tokens living `ttl`.
    pub(crate) fn new(secret: &Secret, issuer: String, ttl: Duration) -> Self {
        Self {
            encoding: EncodingKey::from_secret(secret.expose()),
            decoding: DecodingKey::from_secret(secret.expose()),
            issuer,
            ttl,
            anchor: (SystemTime::now(), tokio::time::Instant::now()),
        }
    }

    /// The time tokens are minted and checked against (see `anchor`).
    pub(crate) fn now(&self) -> SystemTime {
        self.anchor.0 + self.anchor.1.elapsed()
    }

    /// Token lifetime.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Mints claims for round `rnd` of parked call `handle` at time `now`.
    pub(crate) fn claims(
        &self,
        handle: &str,
        principal: &str,
        request: &str,
        rnd: u32,
        now: SystemTime,
    ) -> Claims {
        let issued_at = unix(now);
        Claims {
            handle: handle.to_owned(),
            issuer: self.issuer.clone(),
            principal: principal.to_owned(),
            request: request.to_owned(),
            round: rnd,
            issued_at,
            expires_at: issued_at + self.ttl.as_secs().max(1),
            token_id: random_id(12),
        }
    }

    /// Signs claims into a compact JWT.
    ///
    /// # Errors
    /// Only if serialisation fails, which it does not for these claims.
    pub(crate) fn sign(&self, claims: &Claims) -> Result<String, jsonwebtoken::errors::Error> {
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &self.encoding)
    }

    /// Verifies signature, algorithm (HS256 only), issuer, expiry at `now`, principal and request.
    ///
    /// # Errors
    /// The [`TokenError`] saying which check failed; the signature is checked before anything else.
    pub(crate) fn verify(
        &self,
        token: &str,
        principal: &str,
        request: &str,
        now: SystemTime,
    ) -> Result<Claims, TokenError> {
        let mut v = Validation::new(Algorithm::HS256);
        // Expiry is checked below against the caller's clock so tests can move time.
        v.validate_exp = false;
        v.required_spec_claims.clear();
        v.leeway = 0;
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &v)
            .map_err(|_| TokenError::Invalid)?;
        let c = data.claims;
        if c.issuer != self.issuer {
            return Err(TokenError::Invalid);
        }
        if unix(now) >= c.expires_at {
            return Err(TokenError::Expired);
        }
        if c.principal != principal {
            return Err(TokenError::WrongPrincipal);
        }
        if c.request != request {
            return Err(TokenError::WrongRequest);
        }
        Ok(c)
    }
}

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

/// A fresh random HS256 secret (used when none is configured).
pub(crate) fn random_secret() -> Secret {
    Secret::new(random_id(48))
}

/// Hex digest of the principal header value (`None` → the anonymous principal).
pub(crate) fn principal_digest(value: Option<&[u8]>) -> String {
    let mut h = Sha256::new();
    h.update(b"principal\0");
    match value {
        Some(v) => {
            h.update(b"1");
            h.update(v);
        }
        None => h.update(b"0"),
    }
    hex(&h.finalize()[..16])
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
    hex(&h.finalize()[..16])
}

/// Key-sorted compact JSON (serde_json's map is ordered by key without `preserve_order`).
pub(crate) fn canonical_json(v: &serde_json::Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    fn codec(secret: &str) -> TokenCodec {
        TokenCodec::new(
            &Secret::new(secret.into()),
            "proxy-a".into(),
            Duration::from_secs(60),
        )
    }

    const KEY: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn round_trip() {
        let c = codec(KEY);
        let now = SystemTime::now();
        let claims = c.claims("h1", "p", "r", 1, now);
        let tok = c.sign(&claims).unwrap();
        assert_eq!(c.verify(&tok, "p", "r", now).unwrap(), claims);
    }

    #[test]
    fn rejects_expired_wrong_principal_wrong_request() {
        let c = codec(KEY);
        let now = SystemTime::now();
        let tok = c.sign(&c.claims("h1", "p", "r", 1, now)).unwrap();
        assert_eq!(
            c.verify(&tok, "p", "r", now + Duration::from_secs(61)),
            Err(TokenError::Expired)
        );
        assert_eq!(
            c.verify(&tok, "q", "r", now),
            Err(TokenError::WrongPrincipal)
        );
        assert_eq!(c.verify(&tok, "p", "s", now), Err(TokenError::WrongRequest));
    }

    #[test]
    fn rejects_wrong_key_tampering_and_alg_none() {
        let c = codec(KEY);
        let now = SystemTime::now();
        let tok = c.sign(&c.claims("h1", "p", "r", 1, now)).unwrap();
        assert_eq!(
            codec("another-secret-another-secret-xx").verify(&tok, "p", "r", now),
            Err(TokenError::Invalid)
        );
        // Tampered payload, original signature.
        let parts: Vec<&str> = tok.split('.').collect();
        let mut payload: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        payload["h"] = "h2".into();
        let forged = format!(
            "{}.{}.{}",
            parts[0],
            URL_SAFE_NO_PAD.encode(payload.to_string()),
            parts[2]
        );
        assert_eq!(c.verify(&forged, "p", "r", now), Err(TokenError::Invalid));
        // Tampered signature.
        let bad_sig = format!(
            "{}.{}.{}",
            parts[0],
            parts[1],
            URL_SAFE_NO_PAD.encode(b"nope")
        );
        assert_eq!(c.verify(&bad_sig, "p", "r", now), Err(TokenError::Invalid));
        // alg: none with the original payload.
        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#),
            parts[1]
        );
        assert_eq!(c.verify(&none, "p", "r", now), Err(TokenError::Invalid));
        // Garbage.
        assert_eq!(
            c.verify("eyJsb2NhdGlvbiI6Ik5ldyBZb3JrIn0", "p", "r", now),
            Err(TokenError::Invalid)
        );
    }

    #[test]
    fn rejects_other_issuer() {
        let a = codec(KEY);
        let b = TokenCodec::new(
            &Secret::new(KEY.into()),
            "proxy-b".into(),
            Duration::from_secs(60),
        );
        let now = SystemTime::now();
        let tok = b.sign(&b.claims("h1", "p", "r", 1, now)).unwrap();
        assert_eq!(a.verify(&tok, "p", "r", now), Err(TokenError::Invalid));
    }

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
}
