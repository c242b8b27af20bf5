//! `principal = "introspection"`: an opaque bearer token checked at the authorization server's
//! RFC 7662 endpoint. Active answers are cached under a digest of the token (never the token)
//! until the token's `exp` or `cache_max_age`, whichever is first; at most `cache_max` of them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use dashmap::DashMap;
use http::HeaderValue;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::fetch::Fetcher;
use super::verified::{scopes_of, Rejection, Verified};
use crate::config;

/// Checks opaque tokens at the introspection endpoint.
#[derive(Debug)]
pub(crate) struct Introspector {
    cfg: config::Introspection,
    /// The proxy's own client credentials at the endpoint (HTTP Basic).
    basic: Option<HeaderValue>,
    /// Where the principal's issuer comes from when an answer names none.
    issuer: String,
    /// The audiences a token may name (the resource).
    audiences: Vec<String>,
    fetcher: Fetcher,
    cache: DashMap<[u8; 32], (Verified, Instant)>,
}

impl Introspector {
    /// An introspector of `cfg` whose client secret is `secret`; tokens must be for `audience`.
    pub(crate) fn new(
        cfg: config::Introspection,
        secret: Option<String>,
        audience: String,
        fetcher: Fetcher,
    ) -> Result<Self, String> {
        let basic = match (&cfg.client_id, secret) {
            (Some(id), Some(secret)) => {
                // RFC 6749 §2.3.1: each part form-encoded, then Basic.
                let pair = format!("{}:{}", form_encode(id), form_encode(&secret));
                let b64 = base64::engine::general_purpose::STANDARD.encode(pair);
                let mut v = HeaderValue::from_str(&format!("Basic {b64}"))
                    .map_err(|e| format!("introspection credentials: {e}"))?;
                v.set_sensitive(true);
                Some(v)
            }
            _ => None,
        };
        let issuer = cfg.endpoint.to_string();
        Ok(Self {
            cfg,
            basic,
            issuer,
            audiences: vec![audience],
            fetcher,
            cache: DashMap::new(),
        })
    }

    /// The issuer, subject and scopes of an active `token`.
    pub(crate) async fn verify(&self, token: &str) -> Result<Verified, Rejection> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(hit) = self.cache.get(&key) {
            if hit.1 > Instant::now() {
                return Ok(hit.0.clone());
            }
        }
        let form = format!("token={}&token_type_hint=access_token", form_encode(token));
        let answer = self
            .fetcher
            .post_form(&self.cfg.endpoint, self.basic.as_ref(), form)
            .await
            .map_err(|e| Rejection::Unavailable(e.to_string()))?;
        let Value::Object(answer) = answer else {
            return Err(Rejection::Unavailable(
                "the introspection answer is not an object".into(),
            ));
        };
        let (verified, until) = self.judge(&answer)?;
        self.remember(key, verified.clone(), until);
        Ok(verified)
    }

    // What an answer says: active, unexpired, for this resource, with a subject.
    fn judge(&self, a: &Map<String, Value>) -> Result<(Verified, Instant), Rejection> {
        if a.get("active") != Some(&Value::Bool(true)) {
            return Err(Rejection::Invalid("the token is not active".into()));
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let left = match a.get("exp").and_then(Value::as_u64) {
            Some(exp) if exp <= now.as_secs() => {
                return Err(Rejection::Invalid("the token has expired".into()))
            }
            Some(exp) => Duration::from_secs(exp - now.as_secs()),
            None => self.cfg.cache_max_age,
        };
        // RFC 7662's `aud` is optional; when the server names audiences, this resource is one.
        if let Some(aud) = a.get("aud") {
            let named = match aud {
                Value::String(s) => vec![s.as_str()],
                Value::Array(v) => v.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            if !named.iter().any(|n| self.audiences.iter().any(|a| a == n)) {
                return Err(Rejection::Invalid(
                    "the token is for another resource".into(),
                ));
            }
        }
        let Some(subject) = a
            .get("sub")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
        else {
            return Err(Rejection::Invalid("the token names no subject".into()));
        };
        let issuer = a.get("iss").and_then(Value::as_str).unwrap_or(&self.issuer);
        let verified = Verified {
            issuer: issuer.to_owned(),
            subject: subject.to_owned(),
            scopes: scopes_of(a),
        };
        Ok((verified, Instant::now() + left.min(self.cfg.cache_max_age)))
    }

    fn remember(&self, key: [u8; 32], verified: Verified, until: Instant) {
        if self.cache.len() >= self.cfg.cache_max {
            let now = Instant::now();
            self.cache.retain(|_, (_, t)| *t > now);
        }
        // Still full of live answers: this one is simply asked again next time.
        if self.cache.len() < self.cfg.cache_max {
            self.cache.insert(key, (verified, until));
        }
    }
}

// application/x-www-form-urlencoded.
fn form_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => {
                out.push(char::from(b));
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_encoding_escapes_what_it_must() {
        assert_eq!(form_encode("a b+c/=é"), "a+b%2Bc%2F%3D%C3%A9");
    }
}
