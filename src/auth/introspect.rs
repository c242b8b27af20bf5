//! `principal = "introspection"`: an opaque bearer token checked at the authorization server's
//! RFC 7662 endpoint. Answers are cached under a digest of the token (never the token): an
//! active one until the token's `exp` or `cache_max_age`, whichever is first (at most
//! `cache_max` of them); a refusal (inactive, expired, another resource, no subject) for
//! `negative_cache_max_age` (at most `negative_cache_max`), so a client repeating a dead token
//! costs the server one request per interval. What does go to the server is bounded by a token
//! bucket (`max_rate` a second, `max_burst` at once): past it the token gets 503 + `Retry-After`
//! without the server being asked, so a flood of made-up tokens cannot turn the proxy, with its
//! client secret, into a flood on the server.

use std::sync::{Arc, Mutex};
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
use crate::ops::metrics::{IntrospectionSkip, Metrics};

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
    /// Active answers.
    cache: DigestCache<Verified>,
    /// Refusals, by why.
    refused: DigestCache<&'static str>,
    /// Requests the endpoint may still be sent.
    bucket: TokenBucket,
    metrics: Arc<Metrics>,
}

impl Introspector {
    /// An introspector of `cfg` whose client secret is `secret`; tokens must be for `audience`.
    pub(crate) fn new(
        cfg: config::Introspection,
        secret: Option<String>,
        audience: String,
        fetcher: Fetcher,
        metrics: Arc<Metrics>,
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
            cache: DigestCache::new(cfg.cache_max),
            refused: DigestCache::new(cfg.negative_cache_max),
            bucket: TokenBucket::new(cfg.max_rate, cfg.max_burst),
            cfg,
            basic,
            issuer,
            audiences: vec![audience],
            fetcher,
            metrics,
        })
    }

    /// The issuer, subject and scopes of an active `token`.
    pub(crate) async fn verify(&self, token: &str) -> Result<Verified, Rejection> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(verified) = self.cache.get(&key) {
            return Ok(verified);
        }
        if let Some(why) = self.refused.get(&key) {
            self.metrics.auth.skipped(IntrospectionSkip::NegativeCache);
            return Err(Rejection::Invalid(why.into()));
        }
        if !self.bucket.take() {
            self.metrics.auth.skipped(IntrospectionSkip::RateBound);
            return Err(Rejection::Unavailable(
                "too many tokens to introspect at once".into(),
            ));
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
        match self.judge(&answer) {
            Ok((verified, until)) => {
                self.cache.insert(key, verified.clone(), until);
                Ok(verified)
            }
            Err(why) => {
                let ttl = self.cfg.negative_cache_max_age;
                if !ttl.is_zero() {
                    self.refused.insert(key, why, Instant::now() + ttl);
                }
                Err(Rejection::Invalid(why.into()))
            }
        }
    }

    /// What an answer says: active, unexpired, for this resource, with a subject (and until
    /// when that is cached); or why not.
    pub(super) fn judge(
        &self,
        a: &Map<String, Value>,
    ) -> Result<(Verified, Instant), &'static str> {
        if a.get("active") != Some(&Value::Bool(true)) {
            return Err("the token is not active");
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        // A NumericDate (RFC 7519 §2: seconds, possibly fractional); one that cannot be read is
        // not "no expiry" (found by the `introspection` fuzz target: `1.7e9` and `"1700000000"`
        // were taken, and cached, as tokens that never expire).
        let left = match a.get("exp") {
            None | Some(Value::Null) => self.cfg.cache_max_age,
            Some(exp) => {
                let Some(exp) = exp.as_f64().filter(|e| e.is_finite()) else {
                    return Err("the token's expiry is not a date");
                };
                let left = exp - now.as_secs_f64();
                if left <= 0.0 {
                    return Err("the token has expired");
                }
                Duration::try_from_secs_f64(left).unwrap_or(Duration::MAX)
            }
        };
        // RFC 7662's `aud` is optional; when the server names audiences, this resource is one.
        if let Some(aud) = a.get("aud") {
            let named = match aud {
                Value::String(s) => vec![s.as_str()],
                Value::Array(v) => v.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            if !named.iter().any(|n| self.audiences.iter().any(|a| a == n)) {
                return Err("the token is for another resource");
            }
        }
        let Some(subject) = a
            .get("sub")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
        else {
            return Err("the token names no subject");
        };
        let issuer = a.get("iss").and_then(Value::as_str).unwrap_or(&self.issuer);
        let verified = Verified {
            issuer: issuer.to_owned(),
            subject: subject.to_owned(),
            scopes: scopes_of(a),
        };
        Ok((verified, Instant::now() + left.min(self.cfg.cache_max_age)))
    }
}

/// Answers under a SHA-256 of their token, each until its own deadline; at most `max`. When
/// full, expired entries are dropped; still full of live ones, a new answer is not kept (its
/// token is simply asked again next time).
#[derive(Debug)]
struct DigestCache<V> {
    map: DashMap<[u8; 32], (V, Instant)>,
    max: usize,
}

impl<V: Clone> DigestCache<V> {
    fn new(max: usize) -> Self {
        Self {
            map: DashMap::new(),
            max,
        }
    }

    // The live answer under `key`.
    fn get(&self, key: &[u8; 32]) -> Option<V> {
        let hit = self.map.get(key)?;
        (hit.1 > Instant::now()).then(|| hit.0.clone())
    }

    fn insert(&self, key: [u8; 32], value: V, until: Instant) {
        if self.map.len() >= self.max {
            let now = Instant::now();
            self.map.retain(|_, (_, t)| *t > now);
        }
        if self.map.len() < self.max {
            self.map.insert(key, (value, until));
        }
    }
}

/// A token bucket: `burst` requests at once, refilled at `rate` a second.
#[derive(Debug)]
struct TokenBucket {
    rate: f64,
    burst: f64,
    /// Tokens left, as of when.
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    fn new(rate: usize, burst: usize) -> Self {
        // Configured counts: far below where an f64 loses a unit.
        let (rate, burst) = (rate as f64, burst as f64);
        Self {
            rate,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    // Takes one token, or says there is none.
    fn take(&self) -> bool {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        let (tokens, then) = *state;
        let tokens = (tokens + now.duration_since(then).as_secs_f64() * self.rate).min(self.burst);
        if tokens >= 1.0 {
            *state = (tokens - 1.0, now);
            true
        } else {
            *state = (tokens, now);
            false
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

    #[tokio::test(start_paused = true)]
    async fn the_bucket_gives_its_burst_then_its_rate() {
        let b = TokenBucket::new(2, 3);
        assert!((0..3).all(|_| b.take()), "the burst");
        assert!(!b.take(), "empty");
        tokio::time::advance(Duration::from_millis(499)).await;
        assert!(!b.take(), "not yet half a second: no whole token");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(b.take(), "one token every 1/rate");
        assert!(!b.take());
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!((0..3).all(|_| b.take()), "refilled to the burst, no more");
        assert!(!b.take());
    }

    #[tokio::test(start_paused = true)]
    async fn cached_answers_live_until_their_deadline_and_the_cache_is_bounded() {
        let c = DigestCache::new(2);
        let now = Instant::now();
        c.insert([1; 32], "a", now + Duration::from_secs(1));
        c.insert([2; 32], "b", now + Duration::from_secs(10));
        c.insert([3; 32], "c", now + Duration::from_secs(10));
        assert_eq!(c.get(&[1; 32]), Some("a"));
        assert_eq!(c.get(&[3; 32]), None, "full of live answers: not kept");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(c.get(&[1; 32]), None, "expired");
        c.insert([3; 32], "c", now + Duration::from_secs(10));
        assert_eq!(c.get(&[3; 32]), Some("c"), "the expired one made room");
        assert_eq!(c.get(&[2; 32]), Some("b"));
    }

    fn introspector() -> Introspector {
        let toml =
            "[auth]\nprincipal = \"introspection\"\nresource = \"https://mcp.example/mcp\"\n\
            [auth.introspection]\nendpoint = \"http://127.0.0.1:9/introspect\"\n";
        let config = crate::config::Config::from_toml_str(toml).unwrap();
        let config::PrincipalSource::Introspection(cfg) = config.auth.principal else {
            panic!("introspection")
        };
        let metrics = Arc::new(Metrics::default());
        let fetcher = Fetcher::new(Duration::from_secs(1), Arc::clone(&metrics));
        Introspector::new(
            cfg,
            None,
            "https://mcp.example/mcp".into(),
            fetcher,
            metrics,
        )
        .unwrap()
    }

    // Found by the `introspection` fuzz target (fuzz/regressions/introspection/).
    #[tokio::test]
    async fn an_expiry_that_is_not_a_whole_number_is_read_or_refused_never_ignored() {
        let i = introspector();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let answer = |exp: Value| {
            let a = serde_json::json!({"active": true, "sub": "alice", "exp": exp});
            i.judge(a.as_object().unwrap()).map(|(v, _)| v.subject)
        };
        assert_eq!(
            answer(Value::from(17_965_150.5)),
            Err("the token has expired")
        );
        assert_eq!(answer(Value::from(-1)), Err("the token has expired"));
        let past = Value::from(format!("{}", now - 60));
        assert_eq!(answer(past), Err("the token's expiry is not a date"));
        assert_eq!(
            answer(serde_json::json!({})),
            Err("the token's expiry is not a date")
        );
        assert_eq!(
            answer(Value::from(now as f64 + 3600.5)).as_deref(),
            Ok("alice")
        );
        assert_eq!(answer(Value::from(now + 3600)).as_deref(), Ok("alice"));
        assert_eq!(
            answer(Value::Null).as_deref(),
            Ok("alice"),
            "null: none given"
        );
    }
}
