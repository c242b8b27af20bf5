//! `requestState` tokens: compact JWTs (HS256, ES256 or EdDSA, as the key says) naming a parked
//! call, bound to a principal, a request and a round, with an expiry and a single-use id, and
//! naming the process that signed them (the instance id and a nonce drawn at start). Every
//! token names its key (`kid`, see `keys`); the codec signs with the active key and verifies with
//! any key of the set, so a key can rotate without failing a round in flight.
//!
//! This module signs and verifies; it does not know whether a call is still parked or whether a
//! `jti` was used — the parked-call registry checks those.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ring::aead::LessSafeKey;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::digest::{random_id, unix};
use super::jwt::Jwt;
use super::keys::KeySet;
use super::replay::{self, Journal};

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
    /// The issuing process: a nonce its codec drew at start. An instance restarted under the
    /// same id draws another, so it knows a token of its earlier life, whose single use it cannot
    /// have recorded (the ledgers are in memory). `None` in a token of a version without it.
    #[serde(rename = "bt", default, skip_serializing_if = "Option::is_none")]
    pub(crate) boot: Option<String>,
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
    /// The replay journal, encrypted (see `replay`): only in tokens of replay-safe calls.
    #[serde(rename = "rj", default, skip_serializing_if = "Option::is_none")]
    pub(crate) sealed: Option<String>,
    /// The replay journal in the clear: sealed into `rj` by `sign`, opened by `verify`.
    #[serde(skip)]
    pub(crate) replay: Option<Journal>,
    /// Only in an approval's token (`front::approval`): the version of the policy the person
    /// was shown. Such a token names no parked call: its handle is random.
    #[serde(rename = "ap", default, skip_serializing_if = "Option::is_none")]
    pub(crate) approval: Option<String>,
    /// With traces exported: the `traceparent` of the call's first leg as the proxy's span (a
    /// trace and a span id, not secret), so each retry's span links to it, on any replica.
    #[serde(rename = "tp", default, skip_serializing_if = "Option::is_none")]
    pub(crate) origin: Option<String>,
}

/// Why a requestState was refused. Every variant is a client-side failure (-32602).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TokenError {
    /// Not a token of this key set: bad format, bad signature, wrong algorithm.
    #[error("requestState is invalid")]
    Invalid,
    /// Past its `exp`: its call was ended at `state.ttl`; the message says so, and what to do.
    #[error("requestState has expired: the call waited for these answers longer than the server keeps a call (state.ttl) and was ended; start the call again, without requestState")]
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
    /// Issued in the future (beyond the allowed clock skew).
    #[error("requestState is not valid yet")]
    NotYetValid,
    /// The parked call behind it is gone.
    #[error("requestState refers to a call that is no longer parked: {0}")]
    Gone(String),
}

/// Signs and verifies requestState tokens.
pub(crate) struct TokenCodec {
    /// JWTs under the key set.
    jwt: Jwt,
    issuer: String,
    /// This process's nonce, in every token it signs (`Claims::boot`).
    boot: String,
    ttl: Duration,
    /// Wall time at construction, and tokio's clock at the same moment: `now()` is the first
    /// plus the tokio time since the second, so a paused test runtime moves token expiry and
    /// parked-call deadlines (tokio timers) together.
    anchor: (SystemTime, tokio::time::Instant),
}

/// Bytes of randomness in a process's boot nonce.
const BOOT_BYTES: usize = 9;

/// How far in the future a token's `iat` may be (clocks of replicas differ a little).
pub(super) const CLOCK_SKEW: Duration = Duration::from_secs(60);

impl std::fmt::Debug for TokenCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCodec")
            .field("keys", &self.jwt)
            .field("issuer", &self.issuer)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl TokenCodec {
    /// A codec signing and verifying with `keys`, issuing as `issuer`, tokens living `ttl`.
    pub(crate) fn new(keys: KeySet, issuer: String, ttl: Duration) -> Self {
        Self {
            jwt: Jwt::new(keys),
            issuer,
            boot: random_id(BOOT_BYTES),
            ttl,
            anchor: (SystemTime::now(), tokio::time::Instant::now()),
        }
    }

    /// Makes `keys` the key set. The keys it lacks from the current set (the old active key
    /// above all) keep verifying for one token lifetime, so no round in flight fails.
    pub(crate) fn replace_keys(&self, keys: KeySet) {
        self.jwt.replace(keys, self.now() + self.ttl + CLOCK_SKEW);
    }

    /// The current key set.
    pub(crate) fn keys(&self) -> Arc<KeySet> {
        self.jwt.keys()
    }

    /// What the logs name the principal of `digest` by (see [`KeySet::principal_label`]).
    pub(crate) fn principal_label(&self, digest: &str) -> String {
        self.jwt.keys().principal_label(digest)
    }

    /// The time tokens are minted and checked against (see `anchor`).
    pub(crate) fn now(&self) -> SystemTime {
        self.anchor.0 + self.anchor.1.elapsed()
    }

    /// This instance's id: the issuer of its tokens, the owner they name.
    pub(crate) fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Whether `claims` were signed by this process: this instance, and since its start (not
    /// by an earlier process under the same `state.instance_id`).
    pub(crate) fn signed_since_start(&self, claims: &Claims) -> bool {
        claims.issuer == self.issuer && claims.boot.as_deref() == Some(self.boot.as_str())
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
            boot: Some(self.boot.clone()),
            principal: principal.to_owned(),
            request: request.to_owned(),
            round: rnd,
            issued_at,
            expires_at: issued_at + self.ttl.as_secs().max(1),
            token_id: random_id(12),
            sealed: None,
            replay: None,
            approval: None,
            origin: None,
        }
    }

    /// Signs claims into a compact JWT.
    ///
    /// # Errors
    /// Only if serialisation fails, which it does not for these claims.
    pub(crate) fn sign(&self, claims: &Claims) -> Result<String, jsonwebtoken::errors::Error> {
        // One key set for both: a reload between sealing and signing would name a key that
        // cannot open the journal.
        let keys = self.jwt.keys();
        let Some(journal) = &claims.replay else {
            return Jwt::sign_with(&keys, claims);
        };
        let plain = serde_json::to_vec(journal)?;
        let mut sealed = claims.clone();
        sealed.sealed = replay::seal(&keys.signing.seal, binding(claims).as_bytes(), &plain);
        Jwt::sign_with(&keys, &sealed)
    }

    /// Signs any claims (a peer signature, say) with the active key, naming it.
    ///
    /// # Errors
    /// Only if serialisation fails.
    pub(crate) fn sign_jwt<T: Serialize>(
        &self,
        claims: &T,
    ) -> Result<String, jsonwebtoken::errors::Error> {
        self.jwt.sign(claims)
    }

    /// Checks size, key (`kid`, valid at `now`) and signature, with the algorithm the key pins;
    /// returns the claims and the verifying key's sealing key. Times and claims are the
    /// caller's to check.
    ///
    /// # Errors
    /// [`TokenError::Invalid`]; nothing of the payload is trusted before the signature.
    pub(crate) fn decode_jwt<T: DeserializeOwned>(
        &self,
        token: &str,
        now: SystemTime,
    ) -> Result<(T, Arc<LessSafeKey>), TokenError> {
        self.jwt.decode(token, now).ok_or(TokenError::Invalid)
    }

    /// Verifies size, key (`kid`), signature, algorithm (the key's), issue time and lifetime,
    /// expiry at `now`, principal and request; opens the replay journal when there is one.
    ///
    /// # Errors
    /// The [`TokenError`] saying which check failed; nothing of the payload is trusted before the
    /// signature is checked.
    pub(crate) fn verify(
        &self,
        token: &str,
        principal: &str,
        request: &str,
        now: SystemTime,
    ) -> Result<Claims, TokenError> {
        let (mut c, seal): (Claims, _) = self.decode_jwt(token, now)?;
        self.check_claims(&c, principal, request, unix(now))?;
        if let Some(sealed) = c.sealed.take() {
            let journal = replay::open(&seal, binding(&c).as_bytes(), &sealed);
            c.replay = Some(journal.ok_or(TokenError::Invalid)?);
        }
        Ok(c)
    }

    fn check_claims(
        &self,
        c: &Claims,
        principal: &str,
        request: &str,
        now: u64,
    ) -> Result<(), TokenError> {
        let skew = CLOCK_SKEW.as_secs();
        // The issuer is the owner; a token of another instance (same key set) is valid here and
        // forwarded by the front.
        if c.expires_at < c.issued_at {
            return Err(TokenError::Invalid);
        }
        // A lifetime longer than this proxy issues is not one of its tokens.
        if c.expires_at - c.issued_at > self.ttl.as_secs().max(1) + skew {
            return Err(TokenError::Invalid);
        }
        if c.issued_at > now + skew {
            return Err(TokenError::NotYetValid);
        }
        if now >= c.expires_at {
            return Err(TokenError::Expired);
        }
        if c.principal != principal {
            return Err(TokenError::WrongPrincipal);
        }
        if c.request != request {
            return Err(TokenError::WrongRequest);
        }
        Ok(())
    }
}

/// What a sealed journal is bound to: its token (handle and single-use id).
fn binding(c: &Claims) -> String {
    format!("{}.{}", c.handle, c.token_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::jwt::MAX_TOKEN_BYTES;
    use crate::state::testing::{codec_of, keys, KEY};
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    use jsonwebtoken::{Algorithm, Header};

    fn codec(secret: &str) -> TokenCodec {
        codec_of("proxy-a", secret)
    }

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
    fn a_token_of_another_instance_verifies_and_names_its_owner() {
        let a = codec(KEY);
        let b = TokenCodec::new(keys(KEY, &[]), "proxy-b".into(), Duration::from_secs(60));
        let now = SystemTime::now();
        let tok = b.sign(&b.claims("h1", "p", "r", 1, now)).unwrap();
        assert_eq!(a.verify(&tok, "p", "r", now).unwrap().issuer, "proxy-b");
        let stranger = TokenCodec::new(
            keys("a-key-of-another-cluster-0123456789", &[]),
            "proxy-b".into(),
            Duration::from_secs(60),
        );
        let tok = stranger
            .sign(&stranger.claims("h1", "p", "r", 1, now))
            .unwrap();
        assert_eq!(a.verify(&tok, "p", "r", now), Err(TokenError::Invalid));
    }

    #[test]
    fn a_restart_under_the_same_id_and_keys_knows_a_token_of_its_earlier_life() {
        let (before, after, peer) = (codec(KEY), codec(KEY), codec_of("proxy-b", KEY));
        let now = SystemTime::now();
        let tok = before.sign(&before.claims("h1", "p", "r", 1, now)).unwrap();
        let mut c = after.verify(&tok, "p", "r", now).unwrap();
        // Still this instance's (routed here), but signed before the restart; not the peer's.
        assert_eq!(c.issuer, "proxy-a");
        let since = [&before, &after, &peer].map(|k| k.signed_since_start(&c));
        assert_eq!(since, [true, false, false]);
        c.boot = None; // a token of a version without it
        assert!(!before.signed_since_start(&c));
    }

    #[test]
    fn oversized_future_and_overlong_tokens_are_refused() {
        let c = codec(KEY);
        let now = SystemTime::now();
        let huge = "x".repeat(MAX_TOKEN_BYTES + 1);
        assert_eq!(c.verify(&huge, "p", "r", now), Err(TokenError::Invalid));
        // Properly signed by the right key, but issued in the future or living too long.
        let mut future = c.claims("h1", "p", "r", 1, now + Duration::from_secs(3600));
        let tok = c.sign(&future).unwrap();
        assert_eq!(c.verify(&tok, "p", "r", now), Err(TokenError::NotYetValid));
        future = c.claims("h1", "p", "r", 1, now);
        future.expires_at += 24 * 3600;
        let tok = c.sign(&future).unwrap();
        assert_eq!(c.verify(&tok, "p", "r", now), Err(TokenError::Invalid));
    }

    #[test]
    fn a_journal_travels_encrypted_and_tampering_or_another_key_fails() {
        let c = codec(KEY);
        let now = SystemTime::now();
        let mut claims = c.claims("h1", "p", "r", 2, now);
        claims.replay = Some(Journal {
            answered: vec![("f1".into(), serde_json::json!({"secret answer": "Ada"}))],
            pending: vec![("elicitation-2".into(), "f2".into())],
        });
        let tok = c.sign(&claims).unwrap();
        let payload = URL_SAFE_NO_PAD
            .decode(tok.split('.').nth(1).unwrap())
            .unwrap();
        let payload = String::from_utf8(payload).unwrap();
        assert!(
            payload.contains("\"rj\"") && !payload.contains("Ada"),
            "{payload}"
        );
        assert_eq!(c.verify(&tok, "p", "r", now).unwrap().replay, claims.replay);
        // Same payload re-signed by another key set: refused at the signature.
        let other = codec("another-secret-another-secret-xx");
        assert_eq!(other.verify(&tok, "p", "r", now), Err(TokenError::Invalid));
        // A journal sealed under another key but signed with this one: refused at decryption.
        let mut forged: serde_json::Value = serde_json::from_str(&payload).unwrap();
        let moved = other.sign(&claims).unwrap();
        let moved: serde_json::Value = serde_json::from_slice(
            &URL_SAFE_NO_PAD
                .decode(moved.split('.').nth(1).unwrap())
                .unwrap(),
        )
        .unwrap();
        forged["rj"] = moved["rj"].clone();
        let keys = c.keys();
        let mut h = Header::new(Algorithm::HS256);
        h.kid = Some(keys.signing.kid.clone());
        let resigned = jsonwebtoken::encode(&h, &forged, &keys.signing.key).unwrap();
        assert_eq!(c.verify(&resigned, "p", "r", now), Err(TokenError::Invalid));
    }

    #[test]
    fn a_token_with_ten_answered_rounds_stays_far_below_the_bound() {
        let c = codec(KEY);
        let now = SystemTime::now();
        let answer = serde_json::json!({"action":"accept","content":{"name":"Ada Lovelace"}});
        let mut sizes = Vec::new();
        for rounds in [0usize, 1, 3, 10] {
            let mut claims = c.claims("h1", "p", "r", 1, now);
            claims.replay = Some(Journal {
                answered: (0..rounds)
                    .map(|i| {
                        (
                            crate::state::replay::fingerprint("e", Some(&i.into())),
                            answer.clone(),
                        )
                    })
                    .collect(),
                pending: vec![("elicitation-11".into(), "0123456789abcdef01234567".into())],
            });
            sizes.push(c.sign(&claims).unwrap().len());
        }
        eprintln!("token bytes at 0/1/3/10 answered rounds: {sizes:?}");
        assert!(sizes.windows(2).all(|w| w[0] < w[1]));
        assert!(sizes[3] < MAX_TOKEN_BYTES / 4, "{sizes:?}");
    }
}
