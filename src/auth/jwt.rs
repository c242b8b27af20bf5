//! `principal = "jwt"`: a bearer JWT verified with `jsonwebtoken` against a key of the
//! authorization server's key set: the algorithm pinned by `[auth.jwt] algorithms`, the key
//! found by `kid` (the set fetched again for an unknown one, at most every
//! `jwks_refetch_interval`), then `iss`, `aud`, `exp` and `nbf` within `leeway`.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::{Map, Value};
use tokio::time::Instant;

use super::fetch::Fetcher;
use super::verified::{scopes_of, Rejection, Verified};
use crate::config::{self, JwksSource};

/// Verifies bearer JWTs.
#[derive(Debug)]
pub(crate) struct JwtVerifier {
    cfg: config::Jwt,
    keys: KeyCache,
}

impl JwtVerifier {
    /// A verifier of `cfg`; a `jwks_file` is read now.
    ///
    /// # Errors
    /// The file cannot be read or is not a key set.
    pub(crate) fn new(cfg: config::Jwt, fetcher: Fetcher) -> Result<Self, String> {
        let keys = match &cfg.keys {
            JwksSource::File(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                let path = path.display().to_string();
                return Self::with_key_set(cfg, &text)
                    .map_err(|e| format!("{path} is not a JWK set: {e}"));
            }
            JwksSource::Uri(uri) => KeyCache::fetched(uri.clone(), fetcher, &cfg),
        };
        Ok(Self { cfg, keys })
    }

    /// A verifier of `cfg` over the key set `jwks` (JSON text, as a `jwks_file` holds it),
    /// whatever `cfg.keys` says.
    ///
    /// # Errors
    /// `jwks` is not a key set.
    pub(super) fn with_key_set(cfg: config::Jwt, jwks: &str) -> Result<Self, String> {
        let set = serde_json::from_str(jwks).map_err(|e| e.to_string())?;
        let keys = KeyCache::fixed(&key_set(set)?);
        Ok(Self { cfg, keys })
    }

    /// The verified issuer, subject and scopes of `token`.
    pub(crate) async fn verify(&self, token: &str) -> Result<Verified, Rejection> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| Rejection::Invalid(format!("not a JWT: {}", why(&e))))?;
        if !self.cfg.algorithms.contains(&header.alg) {
            return Err(Rejection::Invalid(format!(
                "algorithm {:?} is not accepted",
                header.alg
            )));
        }
        let key = self.keys.key(header.kid.as_deref(), header.alg).await?;
        let mut v = Validation::new(header.alg);
        v.leeway = self.cfg.leeway.as_secs();
        v.validate_nbf = true;
        v.set_issuer(&[&self.cfg.issuer]);
        v.set_audience(&self.cfg.audiences);
        v.required_spec_claims = ["exp", "iss", "aud"]
            .map(String::from)
            .into_iter()
            .collect();
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, &key, &v)
            .map_err(|e| Rejection::Invalid(why(&e)))?;
        let claims = data.claims;
        let subject = match claims.get(&self.cfg.principal_claim) {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            _ => {
                return Err(Rejection::Invalid(format!(
                    "the token has no `{}` claim",
                    self.cfg.principal_claim
                )))
            }
        };
        Ok(Verified {
            issuer: self.cfg.issuer.clone(),
            subject,
            scopes: scopes_of(&claims),
        })
    }
}

// What a failed verification says, in words a client's developer can act on, and nothing of
// the token: a part's own error quotes what it read (`unknown variant `…``), and the message
// goes back in the challenge and into the log.
fn why(e: &jsonwebtoken::errors::Error) -> String {
    use jsonwebtoken::errors::ErrorKind;
    match e.kind() {
        ErrorKind::InvalidToken => "it is not three base64url parts".into(),
        ErrorKind::Base64(_) => "a part is not base64url".into(),
        ErrorKind::Utf8(_) => "a part is not UTF-8".into(),
        ErrorKind::Json(_) => "its header or claims are not the JSON of a JWT".into(),
        ErrorKind::ExpiredSignature => "the token has expired".into(),
        ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)".into(),
        ErrorKind::InvalidAudience => "the token is for another resource (aud)".into(),
        ErrorKind::InvalidIssuer => "the token is from another issuer (iss)".into(),
        ErrorKind::InvalidSignature => "the signature does not verify".into(),
        ErrorKind::MissingRequiredClaim(c) => format!("the token has no `{c}` claim"),
        ErrorKind::InvalidAlgorithm => "the token's algorithm does not fit its key".into(),
        other => format!("the token does not verify: {other:?}"),
    }
}

// The keys of a JWK set that `jsonwebtoken` reads; the others are left out, as RFC 7517 §5
// says ("implementations SHOULD ignore JWKs within a JWK Set that use "kty" values that are not
// understood by them, that are missing required members, or for which values are out of the
// supported ranges"): one such key (a curve, a type or an `alg` unknown here) does not make
// the set's other keys unusable.
fn key_set(set: Value) -> Result<JwkSet, String> {
    let Some(Value::Array(keys)) = set.get("keys") else {
        return Err("no `keys` list".into());
    };
    let keys = keys
        .iter()
        .filter_map(|k| Jwk::deserialize(k).ok())
        .collect();
    Ok(JwkSet { keys })
}

// The decoding keys of a key set, by `kid`; refreshed from the authorization server.
#[derive(Debug)]
struct KeyCache {
    source: Option<Source>,
    state: Mutex<Keys>,
    // One fetch at a time; the others wait for it and look again.
    fetching: tokio::sync::Mutex<()>,
}

#[derive(Debug)]
struct Source {
    uri: http::Uri,
    fetcher: Fetcher,
    refetch_interval: Duration,
    max_age: Duration,
}

#[derive(Default)]
struct Keys {
    by_kid: HashMap<String, (Option<Algorithm>, DecodingKey)>,
    // A key without a `kid`, when the set has exactly one key.
    only: Option<(Option<Algorithm>, DecodingKey)>,
    fetched: Option<Instant>,
    tried: Option<Instant>,
}

impl KeyCache {
    fn fixed(set: &JwkSet) -> Self {
        Self {
            source: None,
            state: Mutex::new(Keys::of(set)),
            fetching: tokio::sync::Mutex::new(()),
        }
    }

    fn fetched(uri: http::Uri, fetcher: Fetcher, cfg: &config::Jwt) -> Self {
        let source = Source {
            uri,
            fetcher,
            refetch_interval: cfg.refetch_interval,
            max_age: cfg.max_age,
        };
        Self {
            source: Some(source),
            state: Mutex::new(Keys::default()),
            fetching: tokio::sync::Mutex::new(()),
        }
    }

    // The key for `kid` and `alg`, fetching the set when it is unknown (or the set is old).
    async fn key(&self, kid: Option<&str>, alg: Algorithm) -> Result<DecodingKey, Rejection> {
        if let Some(found) = self.lookup(kid, alg, false)? {
            return Ok(found);
        }
        let Some(source) = &self.source else {
            return Err(Rejection::Invalid("no key with this kid".into()));
        };
        let _one = self.fetching.lock().await;
        // Another request may have fetched while this one waited.
        if let Some(found) = self.lookup(kid, alg, false)? {
            return Ok(found);
        }
        if !self.may_fetch(source) {
            // Asked too recently: an old set still answers for the keys it has.
            return self
                .lookup(kid, alg, true)?
                .ok_or_else(|| Rejection::Invalid("no key with this kid".into()));
        }
        self.lock().tried = Some(Instant::now());
        match source.fetcher.get_json(&source.uri).await {
            Ok(v) => {
                let set =
                    key_set(v).map_err(|e| Rejection::Unavailable(format!("the key set: {e}")))?;
                let mut keys = Keys::of(&set);
                keys.fetched = Some(Instant::now());
                keys.tried = keys.fetched;
                *self.lock() = keys;
                tracing::info!(
                    keys = set.keys.len(),
                    "fetched the authorization server's key set"
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "the authorization server's key set is unreachable");
                // A stale set still answers for the keys it has; an unknown key cannot be decided.
                return self
                    .lookup(kid, alg, true)?
                    .ok_or_else(|| Rejection::Unavailable(e.to_string()));
            }
        }
        self.lookup(kid, alg, true)?
            .ok_or_else(|| Rejection::Invalid("no key with this kid".into()))
    }

    // The key, if known (and, unless `stale_ok`, from a set younger than `max_age`).
    fn lookup(
        &self,
        kid: Option<&str>,
        alg: Algorithm,
        stale_ok: bool,
    ) -> Result<Option<DecodingKey>, Rejection> {
        let keys = self.lock();
        if let (Some(source), false) = (&self.source, stale_ok) {
            let fresh = keys.fetched.is_some_and(|t| t.elapsed() < source.max_age);
            if !fresh {
                return Ok(None);
            }
        }
        let found = match kid {
            Some(kid) => keys.by_kid.get(kid),
            None => keys.only.as_ref(),
        };
        match found {
            None => Ok(None),
            Some((Some(key_alg), _)) if *key_alg != alg => Err(Rejection::Invalid(
                "the token's algorithm is not its key's".into(),
            )),
            Some((_, key)) => Ok(Some(key.clone())),
        }
    }

    fn may_fetch(&self, source: &Source) -> bool {
        let keys = self.lock();
        keys.tried
            .is_none_or(|t| t.elapsed() >= source.refetch_interval || keys.fetched.is_none())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Keys> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("kids", &self.by_kid.keys().collect::<Vec<_>>())
            .field("fetched", &self.fetched)
            .finish_non_exhaustive()
    }
}

impl Keys {
    // The usable signing keys of `set` (a key marked for encryption, or of a type
    // `jsonwebtoken` cannot use, is left out).
    fn of(set: &JwkSet) -> Self {
        let mut keys = Self::default();
        let usable: Vec<&Jwk> = set
            .keys
            .iter()
            .filter(|k| {
                !matches!(
                    k.common.public_key_use,
                    Some(jsonwebtoken::jwk::PublicKeyUse::Encryption)
                )
            })
            .collect();
        let mut seen = HashSet::new();
        for jwk in &usable {
            let Ok(key) = DecodingKey::from_jwk(jwk) else {
                continue;
            };
            let alg = jwk
                .common
                .key_algorithm
                .and_then(|a| a.to_string().parse::<Algorithm>().ok());
            match &jwk.common.key_id {
                Some(kid) if seen.insert(kid.clone()) => {
                    keys.by_kid.insert(kid.clone(), (alg, key));
                }
                Some(_) => {}
                None if usable.len() == 1 => keys.only = Some((alg, key)),
                None => {}
            }
        }
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_set_keeps_signing_keys_by_kid() {
        let set: JwkSet = serde_json::from_value(serde_json::json!({"keys": [
            {"kty": "OKP", "crv": "Ed25519", "kid": "a", "alg": "EdDSA",
             "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            {"kty": "OKP", "crv": "Ed25519", "kid": "b", "use": "enc",
             "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}
        ]}))
        .unwrap();
        let keys = Keys::of(&set);
        assert!(keys.by_kid.contains_key("a"));
        assert!(!keys.by_kid.contains_key("b"));
        assert_eq!(keys.by_kid["a"].0, Some(Algorithm::EdDSA));
    }

    // Found by the `jwks` fuzz target (fuzz/regressions/jwks/): one key of a curve unknown
    // here made the whole set unusable, every token refused.
    #[test]
    fn a_key_set_leaves_out_the_keys_it_cannot_read_and_keeps_the_others() {
        let x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
        let set = key_set(serde_json::json!({"keys": [
            {"kty": "OKP", "crv": "Ed25520", "kid": "odd", "x": x},
            {"kty": "EC", "crv": "P-521", "kid": "e5", "alg": "ES512", "x": "AA", "y": "AA"},
            {"kty": "AKP", "kid": "pq", "alg": "ML-DSA-44", "pub": "AA"},
            {"kty": "OKP", "crv": "Ed25519", "kid": "a", "alg": "EdDSA", "x": x}
        ]}))
        .unwrap();
        let keys = Keys::of(&set);
        assert_eq!(keys.by_kid.keys().collect::<Vec<_>>(), ["a"]);
        assert!(key_set(serde_json::json!({"keys": {}})).is_err());
        assert!(key_set(serde_json::json!([])).is_err());
    }

    // Found by the `bearer` fuzz target (fuzz/seeds/bearer/alg_marked): a header's error
    // quoted it (`unknown variant `…``) into the challenge and the log.
    #[tokio::test]
    async fn a_refusal_quotes_nothing_of_the_token() {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        use base64::Engine;
        let toml = "[auth]\nprincipal = \"jwt\"\nresource = \"https://mcp.example/mcp\"\n\
            [auth.jwt]\nissuer = \"https://as.example\"\n\
            jwks_uri = \"http://127.0.0.1:9/jwks\"\nalgorithms = [\"EdDSA\"]\n";
        let config = config::Config::from_toml_str(toml).unwrap();
        let config::PrincipalSource::Jwt(cfg) = config.auth.principal else {
            panic!("jwt")
        };
        let v = JwtVerifier::with_key_set(cfg, r#"{"keys": []}"#).unwrap();
        let part = |v: Value| URL_SAFE_NO_PAD.encode(v.to_string());
        let claims = part(serde_json::json!({"sub": "SECRET"}));
        for header in [
            part(serde_json::json!({"alg": "SECRET"})),
            part(serde_json::json!({"alg": "EdDSA", "kid": ["SECRET"]})),
            part(serde_json::json!("SECRET")),
            URL_SAFE_NO_PAD.encode("SECRET"),
            "SECRET".into(),
        ] {
            let Err(Rejection::Invalid(why)) = v.verify(&format!("{header}.{claims}.c2ln")).await
            else {
                panic!("refused")
            };
            assert!(!why.contains("SECRET"), "{why}");
        }
    }
}
