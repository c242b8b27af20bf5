//! Compact JWTs under the key set: signed with the active key and naming it (`kid`), decoded
//! with the key a token names while that key is valid, the algorithm pinned by the key, the
//! size bounded before anything is parsed. requestState tokens (`token`) and peer signatures
//! (`cluster`) are both made here. The key set is swapped whole on a reload, so a sign or a
//! decode sees one consistent set without taking a lock.

use std::sync::Arc;
use std::time::SystemTime;

use arc_swap::ArcSwap;
use jsonwebtoken::{Header, Validation};
use ring::aead::LessSafeKey;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::keys::KeySet;

/// Longest token accepted: anything longer is refused before it is parsed. Room for a
/// requestState's claims and the largest replay journal (`replay.max_state`, at most
/// `config::MAX_REPLAY_STATE_BYTES`) once encrypted and base64-encoded.
pub(crate) const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// The key set, and the JWTs made and read with it.
#[derive(Debug)]
pub(crate) struct Jwt {
    keys: ArcSwap<KeySet>,
}

impl Jwt {
    /// JWTs under `keys`.
    pub(crate) fn new(keys: KeySet) -> Self {
        Self {
            keys: ArcSwap::from_pointee(keys),
        }
    }

    /// The current key set.
    pub(crate) fn keys(&self) -> Arc<KeySet> {
        self.keys.load_full()
    }

    /// Makes `keys` the key set; the keys it lacks from the current one keep verifying until
    /// `retire_at`.
    pub(crate) fn replace(&self, mut keys: KeySet, retire_at: SystemTime) {
        keys.retire(&self.keys.load(), retire_at);
        self.keys.store(Arc::new(keys));
    }

    /// Signs `claims` with the active key, naming it (`kid`).
    ///
    /// # Errors
    /// Only if serialisation fails.
    pub(crate) fn sign<T: Serialize>(
        &self,
        claims: &T,
    ) -> Result<String, jsonwebtoken::errors::Error> {
        Self::sign_with(&self.keys.load(), claims)
    }

    /// Signs `claims` with the active key of `keys` (a set the caller read once), naming it.
    ///
    /// # Errors
    /// Only if serialisation fails.
    pub(crate) fn sign_with<T: Serialize>(
        keys: &KeySet,
        claims: &T,
    ) -> Result<String, jsonwebtoken::errors::Error> {
        let mut header = Header::new(keys.signing.alg);
        header.kid = Some(keys.signing.kid.clone());
        jsonwebtoken::encode(&header, claims, &keys.signing.key)
    }

    /// Checks size, key (`kid`, valid at `now`) and signature, with the algorithm the key pins;
    /// the claims and the verifying key's sealing key, or `None`. Times and claims are the
    /// caller's to check; nothing of the payload is trusted before the signature.
    pub(crate) fn decode<T: DeserializeOwned>(
        &self,
        token: &str,
        now: SystemTime,
    ) -> Option<(T, Arc<LessSafeKey>)> {
        if token.len() > MAX_TOKEN_BYTES {
            return None;
        }
        let keys = self.keys.load();
        let head = token.split('.').next().unwrap_or_default();
        let key = match keys.verifier_by_head(head, now) {
            Some(key) => key,
            // A header none of the keys writes (another version's, say): read for its `kid`.
            None => keys.verifier(&jsonwebtoken::decode_header(token).ok()?.kid?, now)?,
        };
        // The key pins the algorithm: a token whose header claims another one is refused.
        let mut v = Validation::new(key.alg);
        // Times are checked by the caller against its clock, so tests can move it.
        v.validate_exp = false;
        v.validate_aud = false;
        v.required_spec_claims.clear();
        v.leeway = 0;
        let claims = jsonwebtoken::decode::<T>(token, &key.key, &v).ok()?.claims;
        Some((claims, Arc::clone(&key.seal)))
    }
}

// Tested through the requestState codec, which is how every caller meets it.
#[cfg(test)]
mod tests {
    use crate::state::testing::{codec_of, keys, KEY};
    use std::time::{Duration, SystemTime};

    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    use jsonwebtoken::{Algorithm, EncodingKey, Header};

    use crate::config::Secret;
    use crate::state::keys::{hs256, KeySet};
    use crate::state::token::CLOCK_SKEW;
    use crate::state::{TokenCodec, TokenError};

    fn codec(secret: &str) -> TokenCodec {
        codec_of("proxy-a", secret)
    }

    const OLD: &str = "an-old-key-being-rotated-out-0123456789";

    #[test]
    fn tokens_name_their_key_and_verify_across_a_rotation() {
        let now = SystemTime::now();
        let old = codec(OLD);
        let tok = old.sign(&old.claims("h1", "p", "r", 1, now)).unwrap();
        let kid = jsonwebtoken::decode_header(&tok).unwrap().kid.unwrap();
        assert_eq!(kid, hs256(&Secret::new(OLD.into())).0.kid);
        assert!(!kid.contains("old-key"), "the kid is a digest, not the key");
        // The new active key, the old one kept for verification: the old round still verifies.
        let rotated = TokenCodec::new(keys(KEY, &[OLD]), "proxy-a".into(), Duration::from_secs(60));
        assert!(rotated.verify(&tok, "p", "r", now).is_ok());
        let fresh = rotated
            .sign(&rotated.claims("h2", "p", "r", 1, now))
            .unwrap();
        assert_ne!(
            jsonwebtoken::decode_header(&fresh).unwrap().kid.unwrap(),
            kid
        );
        // Once the old key is dropped, its tokens are refused.
        assert_eq!(
            codec(KEY).verify(&tok, "p", "r", now),
            Err(TokenError::Invalid)
        );
    }

    #[test]
    fn a_token_without_a_known_kid_is_refused() {
        let c = codec(KEY);
        let now = SystemTime::now();
        let claims = c.claims("h1", "p", "r", 1, now);
        let enc = EncodingKey::from_secret(KEY.as_bytes());
        let no_kid = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &enc).unwrap();
        assert_eq!(c.verify(&no_kid, "p", "r", now), Err(TokenError::Invalid));
        let mut h = Header::new(Algorithm::HS256);
        h.kid = Some("0000000000000000".into());
        let other_kid = jsonwebtoken::encode(&h, &claims, &enc).unwrap();
        assert_eq!(
            c.verify(&other_kid, "p", "r", now),
            Err(TokenError::Invalid)
        );
    }

    #[test]
    fn a_known_key_is_matched_by_its_header_bytes_and_any_other_header_is_read() {
        let c = codec(KEY);
        let now = SystemTime::now();
        let claims = c.claims("h1", "p", "r", 1, now);
        let tok = c.sign(&claims).unwrap();
        let set = c.keys();
        let head = &set.verifying[0].head;
        assert!(tok.starts_with(&format!("{head}.")), "{tok}");
        // The same key named by a header written otherwise (no `typ`, members reordered).
        let other = format!(r#"{{"kid":"{}","alg":"HS256"}}"#, set.signing.kid);
        let payload = tok.split('.').nth(1).unwrap();
        let message = format!("{}.{payload}", URL_SAFE_NO_PAD.encode(other));
        let sig =
            jsonwebtoken::crypto::sign(message.as_bytes(), &set.signing.key, Algorithm::HS256)
                .unwrap();
        let written_otherwise = format!("{message}.{sig}");
        assert_eq!(c.verify(&written_otherwise, "p", "r", now).unwrap(), claims);
        // A matching header does not outlive its key.
        c.replace_keys(keys(OLD, &[]));
        let later = c.now() + Duration::from_secs(60) + CLOCK_SKEW;
        assert_eq!(
            c.decode_jwt::<serde_json::Value>(&tok, later).err(),
            Some(TokenError::Invalid)
        );
        assert!(c.decode_jwt::<serde_json::Value>(&tok, now).is_ok());
    }

    fn pem_key(der: &[u8]) -> String {
        pem::encode(&pem::Pem::new("PRIVATE KEY", der.to_vec()))
    }

    fn asymmetric_codecs() -> Vec<(Algorithm, TokenCodec)> {
        use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
        let rng = ring::rand::SystemRandom::new();
        let es = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let ed = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        [
            (Algorithm::ES256, es.as_ref()),
            (Algorithm::EdDSA, ed.as_ref()),
        ]
        .into_iter()
        .map(|(alg, der)| {
            let key = crate::state::keys::parse_text("test".into(), &pem_key(der)).unwrap();
            let codec = TokenCodec::new(
                KeySet::new(key, Vec::new()),
                "proxy-a".into(),
                Duration::from_secs(60),
            );
            (alg, codec)
        })
        .collect()
    }

    #[test]
    fn es256_and_eddsa_keys_sign_and_pin_their_algorithm() {
        let now = SystemTime::now();
        for (alg, c) in asymmetric_codecs() {
            let claims = c.claims("h1", "p", "r", 1, now);
            let tok = c.sign(&claims).unwrap();
            let header = jsonwebtoken::decode_header(&tok).unwrap();
            assert_eq!(header.alg, alg);
            assert_eq!(c.verify(&tok, "p", "r", now).unwrap(), claims);
            // Algorithm confusion: the same kid, but HS256 keyed with public material, or
            // alg none. The key pins its algorithm, so both are refused.
            let mut forged = Header::new(Algorithm::HS256);
            forged.kid = header.kid.clone();
            let enc = EncodingKey::from_secret(header.kid.unwrap().as_bytes());
            let hs = jsonwebtoken::encode(&forged, &claims, &enc).unwrap();
            assert_eq!(c.verify(&hs, "p", "r", now), Err(TokenError::Invalid));
            let payload = tok.split('.').nth(1).unwrap();
            let none = format!(
                "{}.{payload}.",
                URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#)
            );
            assert_eq!(c.verify(&none, "p", "r", now), Err(TokenError::Invalid));
        }
    }

    #[test]
    fn a_reload_keeps_the_old_key_verifying_for_one_lifetime() {
        let now = SystemTime::now();
        let c = codec(OLD);
        let old = c.sign(&c.claims("h1", "p", "r", 1, now)).unwrap();
        c.replace_keys(keys(KEY, &[]));
        let new = c.sign(&c.claims("h2", "p", "r", 1, now)).unwrap();
        assert_eq!(
            jsonwebtoken::decode_header(&new).unwrap().kid.unwrap(),
            hs256(&Secret::new(KEY.into())).0.kid
        );
        assert!(c.verify(&old, "p", "r", now).is_ok());
        assert!(c.verify(&new, "p", "r", now).is_ok());
        // Past one lifetime (and the skew) the retired key is gone; only expired tokens had it.
        let later = c.now() + Duration::from_secs(60) + CLOCK_SKEW;
        assert!(c
            .keys()
            .verifier(&hs256(&Secret::new(OLD.into())).0.kid, later)
            .is_none());
    }
}
