//! The requestState key set: one active signing key and any verification-only keys, each with
//! its algorithm pinned by the key itself (an HS256 secret, or a PKCS#8 PEM private key of P-256
//! for ES256 or Ed25519 for EdDSA). Every key has a `kid` derived from it, so replicas that share
//! a key agree on its id with nothing to configure.
//!
//! Besides `main.rs`, this is the one module that reads files and the environment: key files
//! are read at start-up and again on `SIGHUP` ([`load`]), so keys rotate without a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use base64::Engine;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey};
use ring::aead::{LessSafeKey, UnboundKey, AES_256_GCM};
use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use ring::{hkdf, hmac};
use sha2::{Digest, Sha256};

use crate::config::{KeySources, Secret, MIN_SECRET_BYTES};

/// Environment variable holding the active HS256 secret when no key is configured.
pub const SECRET_ENV: &str = "MRTR_STATE_SECRET";

/// Why a key could not be loaded. Messages name the file (never the key).
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The file could not be read.
    #[error("{what}: cannot read {}: {source}", path.display())]
    Read {
        /// Which setting named the file.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file was read but holds no usable key.
    #[error("{what}: {reason}")]
    Invalid {
        /// Which setting (and file) held it.
        what: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// A key that signs.
pub(crate) struct SigningKey {
    pub(crate) kid: String,
    pub(crate) alg: Algorithm,
    pub(crate) key: EncodingKey,
    /// The AES-256-GCM key derived from the same material, which encrypts what a token
    /// carries for replay (the answers given so far).
    pub(crate) seal: Arc<LessSafeKey>,
    /// The HMAC-SHA256 key derived from the same material that makes a principal's digest a
    /// label for the logs ([`KeySet::principal_label`]).
    pub(crate) log_label: Arc<hmac::Key>,
}

/// A key that verifies, possibly only until some time (a retired active key, see
/// [`KeySet::retire`]).
#[derive(Clone)]
pub(crate) struct VerifyingKey {
    pub(crate) kid: String,
    pub(crate) alg: Algorithm,
    /// The header segment of the tokens this key signs (`alg` and `kid`, base64url), see
    /// [`KeySet::verifier_by_head`].
    pub(crate) head: String,
    pub(crate) key: DecodingKey,
    pub(crate) until: Option<SystemTime>,
    /// The AES-256-GCM key of the same material (see [`SigningKey::seal`]).
    pub(crate) seal: Arc<LessSafeKey>,
}

/// The active signing key and every key a token may name.
pub struct KeySet {
    pub(crate) signing: SigningKey,
    /// The active key's verifier first, then the verification-only ones.
    pub(crate) verifying: Vec<VerifyingKey>,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySet")
            .field("signing", &(&self.signing.kid, self.signing.alg))
            .field("kids", &self.kids())
            .finish()
    }
}

impl KeySet {
    /// A set of one active key and `verify_only` keys.
    pub(crate) fn new(active: (SigningKey, VerifyingKey), verify_only: Vec<VerifyingKey>) -> Self {
        let (signing, verifier) = active;
        let mut verifying = vec![verifier];
        for v in verify_only {
            if !verifying.iter().any(|k| k.kid == v.kid) {
                verifying.push(v);
            }
        }
        Self { signing, verifying }
    }

    /// A random HS256 key (nothing configured: a single instance whose tokens die with it).
    ///
    /// # Errors
    /// Only when the system has no entropy source, which start-up reports.
    pub(crate) fn generated() -> Result<Self, KeyError> {
        let mut bytes = [0u8; 48];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).map_err(
            |_| KeyError::Invalid {
                what: "generated key".into(),
                reason: "the system has no entropy source".into(),
            },
        )?;
        let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        Ok(Self::new(hs256(&Secret::new(secret)), Vec::new()))
    }

    /// The active key's id and the ids of every key that verifies.
    pub fn kids(&self) -> Vec<String> {
        self.verifying.iter().map(|k| k.kid.clone()).collect()
    }

    /// The active key's id.
    pub fn signing_kid(&self) -> &str {
        &self.signing.kid
    }

    /// The active key's id and sealing key (AES-256-GCM), for what a store keeps sealed.
    pub(crate) fn sealer(&self) -> (String, Arc<LessSafeKey>) {
        (self.signing.kid.clone(), Arc::clone(&self.signing.seal))
    }

    /// The sealing key of key `kid`, while it is in the set (the active key or one that still
    /// verifies): what was sealed under a rotated key stays readable while it verifies.
    pub(crate) fn opener(&self, kid: &str) -> Option<Arc<LessSafeKey>> {
        let key = self.verifying.iter().find(|k| k.kid == kid)?;
        Some(Arc::clone(&key.seal))
    }

    /// What the logs name a principal by: an HMAC-SHA256 of its `digest` under a key derived
    /// from the active key, 16 hex digits. The digest of `principal = "header"` is an unsalted
    /// hash of the raw header (a Basic password's among them), which a reader of the logs could
    /// test guesses against; the label is not, without the key. Replicas sharing the key set
    /// log the same label for the same principal; a new active key (SIGHUP) gives new labels.
    pub(crate) fn principal_label(&self, digest: &str) -> String {
        let tag = hmac::sign(&self.signing.log_label, digest.as_bytes());
        hex::encode(&tag.as_ref()[..8])
    }

    /// Keeps the keys of `previous` that this set lacks as verification-only keys until
    /// `until` (each capped by its own earlier limit), so that rounds signed before a reload
    /// still verify until their tokens expire anyway.
    pub(crate) fn retire(&mut self, previous: &Self, until: SystemTime) {
        for old in &previous.verifying {
            if self.verifying.iter().any(|k| k.kid == old.kid) {
                continue;
            }
            let until = old.until.map_or(until, |u| u.min(until));
            self.verifying.push(VerifyingKey {
                until: Some(until),
                ..old.clone()
            });
        }
    }

    /// The key whose tokens start with the header segment `head`, byte for byte, if still
    /// valid at `now`: a token of a known key is matched to it without parsing its header.
    /// `None` for any other header, which [`Self::verifier`] then reads.
    pub(crate) fn verifier_by_head(&self, head: &str, now: SystemTime) -> Option<&VerifyingKey> {
        self.verifying
            .iter()
            .find(|k| k.head == head && k.until.is_none_or(|u| now < u))
    }

    /// The key a token's header names, if it is known and still valid at `now`.
    pub(crate) fn verifier(&self, kid: &str, now: SystemTime) -> Option<&VerifyingKey> {
        self.verifying
            .iter()
            .find(|k| k.kid == kid && k.until.is_none_or(|u| now < u))
    }
}

/// Reads the configured keys: the active one from `state.secret`, `state.secret_file` or the
/// `MRTR_STATE_SECRET` variable (in that order; `None` when none is set), and every
/// verification-only file.
///
/// # Errors
/// [`KeyError`] naming the file that cannot be read or holds no usable key.
pub fn load(sources: &KeySources) -> Result<Option<KeySet>, KeyError> {
    let active = if let Some(secret) = &sources.secret {
        Some(hs256(secret))
    } else if let Some(path) = &sources.secret_file {
        Some(parse(
            "state.secret_file",
            path,
            &read("state.secret_file", path)?,
        )?)
    } else if let Ok(text) = std::env::var(SECRET_ENV) {
        Some(parse_text(SECRET_ENV.to_owned(), &text)?)
    } else {
        None
    };
    let verify_only = sources
        .verify_files
        .iter()
        .map(|p| {
            let text = read("state.verify_secret_files", p)?;
            parse("state.verify_secret_files", p, &text).map(|(_, v)| v)
        })
        .collect::<Result<Vec<_>, _>>()?;
    match active {
        Some(active) => Ok(Some(KeySet::new(active, verify_only))),
        None if verify_only.is_empty() => Ok(None),
        None => Err(KeyError::Invalid {
            what: "state.verify_secret_files".into(),
            reason: "verification-only keys need an active key (state.secret_file)".into(),
        }),
    }
}

fn read(what: &'static str, path: &Path) -> Result<String, KeyError> {
    std::fs::read_to_string(path).map_err(|source| KeyError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

fn parse(
    what: &'static str,
    path: &Path,
    text: &str,
) -> Result<(SigningKey, VerifyingKey), KeyError> {
    parse_text(format!("{what} ({})", path.display()), text)
}

/// One key from a file's text: a PEM block is an asymmetric key (its type picks the algorithm),
/// anything else an HS256 secret (surrounding whitespace dropped). A PEM-looking text is never
/// taken as an HMAC secret, so a key's algorithm cannot be confused.
pub(crate) fn parse_text(what: String, text: &str) -> Result<(SigningKey, VerifyingKey), KeyError> {
    let invalid = |reason: &str| KeyError::Invalid {
        what: what.clone(),
        reason: reason.to_owned(),
    };
    let text = text.trim();
    if !text.starts_with("-----BEGIN") {
        if text.len() < MIN_SECRET_BYTES {
            return Err(invalid(&format!(
                "an HS256 secret must be at least {MIN_SECRET_BYTES} bytes"
            )));
        }
        return Ok(hs256(&Secret::new(text.to_owned())));
    }
    let block = pem::parse(text).map_err(|_| invalid("not a valid PEM block"))?;
    match block.tag() {
        "PRIVATE KEY" => asymmetric(block.contents())
            .ok_or_else(|| invalid("the PKCS#8 key is neither P-256 (ES256) nor Ed25519 (EdDSA)")),
        "EC PRIVATE KEY" => Err(invalid(
            "a SEC1 EC key: convert it to PKCS#8 (openssl pkcs8 -topk8 -nocrypt)",
        )),
        "PUBLIC KEY" => Err(invalid(
            "a public key: give the private key (PKCS#8); every replica signs",
        )),
        _ => Err(invalid("unsupported PEM block (want PRIVATE KEY, PKCS#8)")),
    }
}

/// An HS256 key; its kid is a digest of the secret (as before asymmetric keys existed).
pub(crate) fn hs256(secret: &Secret) -> (SigningKey, VerifyingKey) {
    let kid = kid(b"", secret.expose());
    let seal = seal_key(secret.expose());
    (
        SigningKey {
            kid: kid.clone(),
            alg: Algorithm::HS256,
            key: EncodingKey::from_secret(secret.expose()),
            seal: Arc::clone(&seal),
            log_label: log_label_key(secret.expose()),
        },
        VerifyingKey {
            head: head(Algorithm::HS256, &kid),
            kid,
            alg: Algorithm::HS256,
            key: DecodingKey::from_secret(secret.expose()),
            until: None,
            seal,
        },
    )
}

/// An ES256 or EdDSA key pair from PKCS#8 DER; the kid is a digest of the public key.
fn asymmetric(der: &[u8]) -> Option<(SigningKey, VerifyingKey)> {
    let rng = ring::rand::SystemRandom::new();
    let (alg, public, signing, verifying) =
        if let Ok(pair) = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, der, &rng) {
            let public = pair.public_key().as_ref().to_vec();
            let dec = DecodingKey::from_ec_der(&public);
            (Algorithm::ES256, public, EncodingKey::from_ec_der(der), dec)
        } else if let Ok(pair) = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der) {
            let public = pair.public_key().as_ref().to_vec();
            let dec = DecodingKey::from_ed_der(&public);
            (Algorithm::EdDSA, public, EncodingKey::from_ed_der(der), dec)
        } else {
            return None;
        };
    let kid = kid(format!("{alg:?}").as_bytes(), &public);
    let seal = seal_key(der);
    Some((
        SigningKey {
            kid: kid.clone(),
            alg,
            key: signing,
            seal: Arc::clone(&seal),
            log_label: log_label_key(der),
        },
        VerifyingKey {
            head: head(alg, &kid),
            kid,
            alg,
            key: verifying,
            until: None,
            seal,
        },
    ))
}

/// The AES-256-GCM key of a key's secret material (the HS256 secret, or the private key's
/// DER), by HKDF-SHA256: every replica that holds the key derives the same one, and it reveals
/// nothing of the signing key.
#[expect(
    clippy::expect_used,
    reason = "HKDF-SHA256 expands 32 bytes (its limit is 255 × 32) into AES-256's key size: \
              neither step can fail, and this runs when keys load, not per request"
)]
fn seal_key(material: &[u8]) -> Arc<LessSafeKey> {
    let prk = prk(material);
    let okm = prk
        .expand(&[b"aes-256-gcm replay v1"], &AES_256_GCM)
        .expect("32 bytes from HKDF-SHA256");
    Arc::new(LessSafeKey::new(UnboundKey::from(okm)))
}

/// The HMAC-SHA256 key of the log labels ([`KeySet::principal_label`]), derived like
/// [`seal_key`] under another label: one reveals nothing of the other or of the signing key.
#[expect(
    clippy::expect_used,
    reason = "HKDF-SHA256 expands 32 bytes into HMAC-SHA256's key size (its limit is 255 × 32): \
              it cannot fail, and this runs when keys load, not per request"
)]
fn log_label_key(material: &[u8]) -> Arc<hmac::Key> {
    let prk = prk(material);
    let okm = prk
        .expand(&[b"hmac-sha256 principal log label v1"], hmac::HMAC_SHA256)
        .expect("32 bytes from HKDF-SHA256");
    Arc::new(hmac::Key::from(okm))
}

// HKDF-SHA256's pseudorandom key of a key's secret material.
fn prk(material: &[u8]) -> hkdf::Prk {
    hkdf::Salt::new(hkdf::HKDF_SHA256, b"mrtr-proxy requestState").extract(material)
}

// The header segment jsonwebtoken writes for a token of key `kid` (its encode: the header's
// JSON, base64url without padding).
fn head(alg: Algorithm, kid: &str) -> String {
    let mut header = jsonwebtoken::Header::new(alg);
    header.kid = Some(kid.to_owned());
    let json = serde_json::to_vec(&header).unwrap_or_default();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
}

/// A key id: a digest of the key material (never the key), 16 hex digits.
fn kid(alg: &[u8], material: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(b"mrtr-proxy kid\0");
    if !alg.is_empty() {
        h.update(alg);
        h.update(b"\0");
    }
    h.update(material);
    hex::encode(&h.finalize()[..8])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pem(der: &[u8]) -> String {
        pem::encode(&pem::Pem::new("PRIVATE KEY", der.to_vec()))
    }

    fn p256() -> String {
        let rng = ring::rand::SystemRandom::new();
        pem(
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
                .unwrap()
                .as_ref(),
        )
    }

    fn ed25519() -> String {
        let rng = ring::rand::SystemRandom::new();
        pem(Ed25519KeyPair::generate_pkcs8(&rng).unwrap().as_ref())
    }

    #[test]
    fn the_key_picks_its_algorithm() {
        let what = || "test".to_owned();
        let hs = parse_text(what(), "0123456789abcdef0123456789abcdef\n").unwrap();
        assert_eq!(hs.0.alg, Algorithm::HS256);
        assert_eq!(parse_text(what(), &p256()).unwrap().0.alg, Algorithm::ES256);
        assert_eq!(
            parse_text(what(), &ed25519()).unwrap().0.alg,
            Algorithm::EdDSA
        );
    }

    #[test]
    fn kids_are_stable_digests() {
        let key = p256();
        let a = parse_text("a".into(), &key).unwrap().0.kid;
        let b = parse_text("b".into(), &key).unwrap().0.kid;
        assert_eq!(a, b);
        assert_ne!(a, parse_text("c".into(), &p256()).unwrap().0.kid);
        assert_eq!(a.len(), 16);
    }

    #[test]
    fn unusable_keys_are_refused_with_a_reason() {
        for (text, want) in [
            ("short", "at least 32 bytes"),
            (
                "-----BEGIN PRIVATE KEY-----\nnot base64!\n-----END PRIVATE KEY-----",
                "PEM",
            ),
            (
                "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----",
                "give the private key",
            ),
            (
                "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----",
                "PKCS#8",
            ),
            (
                "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----",
                "neither P-256",
            ),
        ] {
            let err = parse_text("state.secret_file (k)".into(), text)
                .err()
                .unwrap()
                .to_string();
            assert!(err.contains(want), "{text}: {err}");
            assert!(err.starts_with("state.secret_file (k)"), "{err}");
        }
    }

    #[test]
    fn principal_labels_are_keyed_and_shared_by_replicas_of_a_key() {
        let digest = crate::state::principal_digest(Some(b"Basic dXNlcjpodW50ZXIy"));
        let key = p256();
        let set = |text: &str| KeySet::new(parse_text("k".into(), text).unwrap(), Vec::new());
        let a = set(&key).principal_label(&digest);
        assert_eq!(a.len(), 16);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert!(!digest.contains(&a), "not a cut of the plain digest");
        assert_eq!(
            set(&key).principal_label(&digest),
            a,
            "same key, same label"
        );
        assert_ne!(set(&p256()).principal_label(&digest), a, "another key");
        let hs = set("0123456789abcdef0123456789abcdef");
        assert_ne!(hs.principal_label(&digest), hs.principal_label("other"));
        let unkeyed = hex::encode(&Sha256::digest(digest.as_bytes())[..8]);
        assert_ne!(hs.principal_label(&digest), unkeyed);
    }

    #[test]
    fn retired_keys_verify_until_their_limit() {
        let now = SystemTime::now();
        let old = KeySet::new(parse_text("o".into(), &p256()).unwrap(), Vec::new());
        let mut new = KeySet::new(parse_text("n".into(), &ed25519()).unwrap(), Vec::new());
        let later = now + std::time::Duration::from_secs(60);
        new.retire(&old, later);
        let kid = old.signing_kid().to_owned();
        assert!(new.verifier(&kid, now).is_some());
        assert!(new.verifier(&kid, later).is_none());
        assert_ne!(new.signing_kid(), kid);
    }
}
