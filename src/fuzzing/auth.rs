//! Targets of what `[auth]` reads (parsing only, no network): bearer tokens (`principal =
//! "jwt"` over a key set read from a file), key sets, and introspection answers. The key that
//! signs is made when the process starts and never leaves it: no input can carry its signature.

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use http::{header, HeaderMap, HeaderValue, StatusCode};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::{json, Map, Value};

use crate::auth::{self, Authenticator, Refusal};
use crate::config::{Config, PrincipalSource};
use crate::ops::metrics::Metrics;

/// The issuer and resource of the fuzz targets' `[auth]`.
const ISSUER: &str = "https://as.example";
const RESOURCE: &str = "https://mcp.example.com/mcp";
const SUBJECT_HEADER: &str = "x-mcp-subject";
const INTROSPECTION_ENDPOINT: &str = "http://127.0.0.1:9/introspect";
/// Text no message of the proxy's own holds: a refusal holding it echoed the token.
const MARK: &str = "SECRET";
/// Seconds either side of a time bound within which the oracle does not judge (the clock moves
/// between its reading and the verifier's).
const CLOCK_SLACK: u64 = 2;

/// A bearer token, `principal = "jwt"` in resource-server mode (`subject_header` set). An input
/// starting with `{` is a JWT's claims (JSON), signed by the target with the key of the key set
/// (EdDSA, `kid` `k1`); any other input is the `Authorization` header value as sent. Never a
/// panic; an unsigned token is never taken; every refusal is a 401 whose `WWW-Authenticate` is
/// the RFC 6750 challenge (`Bearer error="invalid_token", error_description="…"`) and neither it
/// nor the message holds text of the token (a token holding `SECRET`, in its raw text or in a
/// decoded part, is looked for). Signed claims are taken exactly when RFC 7519 and the policy
/// say, as `jsonwebtoken` reads claims: `iss` this issuer (or a list naming it), `aud` this
/// resource (or a list naming it), `exp` a NumericDate (a whole or fractional number ≥ 0) not
/// before now less the leeway, an `nbf` that is a NumericDate not after now plus the leeway
/// (one of another type is not read), `sub` a non-empty string without a control character
/// but tab (it goes upstream in the subject header, byte for byte), the token within
/// `max_token_bytes`; a token taken sends its verified `sub` upstream in the subject header.
pub fn bearer(data: &[u8]) {
    let keys = keys();
    let (authorization, expected) = if data.first() == Some(&b'{') {
        let Ok(Value::Object(claims)) = serde_json::from_slice::<Value>(data) else {
            return;
        };
        let token = keys.sign("k1", &Value::Object(claims.clone()));
        let expected = claims_taken(&claims, token.len(), keys);
        (format!("Bearer {token}"), expected)
    } else {
        match std::str::from_utf8(data) {
            Ok(text) => (text.to_owned(), Some(None)),
            Err(_) => return,
        }
    };
    let Ok(value) = HeaderValue::from_str(&authorization) else {
        return;
    };
    let mut headers = HeaderMap::new();
    headers.insert(header::AUTHORIZATION, value);
    let identified = ready(keys.jwt.identify(&headers));
    match (identified, expected) {
        (Ok(who), Some(Some(subject))) => {
            let sent = who
                .credentials
                .headers()
                .iter()
                .find(|(n, _)| n == SUBJECT_HEADER);
            let sent = sent.map(|(_, v)| v.as_bytes());
            assert_eq!(
                sent,
                Some(subject.as_bytes()),
                "the verified subject upstream"
            );
        }
        (Err(refusal), Some(None)) => challenged(&refusal, &authorization),
        (_, None) => {}
        (got, Some(expected)) => panic!("taken: {}, but the claims say {expected:?}", got.is_ok()),
    }
}

/// A key set (JSON text, as a `jwks_file` holds or a `jwks_uri` answers), read by
/// `principal = "jwt"` (algorithms EdDSA, RS256, ES256). Never a panic; a token signed by a key
/// not in the set is refused, whatever `kid` it names (each of the set's, and none); and, RFC
/// 7517 §5 ("implementations SHOULD ignore JWKs within a JWK Set that use "kty" values that are
/// not understood by them, that are missing required members, or for which values are out of
/// the supported ranges"), a usable key put first in the set verifies its token whatever else
/// the set holds.
pub fn jwks(data: &[u8]) {
    let keys = keys();
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let cfg = &keys.jwt_cfg;
    if let Ok(verifier) = auth::jwt_verifier(cfg, text) {
        let set: Value = serde_json::from_str(text).unwrap_or_default();
        let kids = set["keys"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|k| k["kid"].as_str());
        for kid in kids.chain(["k1"]) {
            let forged = keys.sign(kid, &good_claims());
            assert!(
                ready(verifier.verify(&forged)).is_err(),
                "a foreign key verified"
            );
        }
        let unnamed = keys.sign_without_kid(&good_claims());
        assert!(
            ready(verifier.verify(&unnamed)).is_err(),
            "a foreign key verified"
        );
    }
    let Ok(Value::Object(mut set)) = serde_json::from_str::<Value>(text) else {
        return;
    };
    let Some(Value::Array(members)) = set.get_mut("keys") else {
        return;
    };
    members.insert(0, keys.jwk("fuzz-own"));
    let with_ours = crate::jsonrpc::text(&Value::Object(set));
    let verifier = auth::jwt_verifier(cfg, &with_ours);
    let Ok(verifier) = verifier else {
        panic!(
            "a set holding a usable key is refused whole: {:?}",
            verifier.err()
        );
    };
    let ours = keys.sign("fuzz-own", &good_claims());
    let verified = ready(verifier.verify(&ours));
    assert!(
        verified.is_ok(),
        "our own key, first in the set, does not verify: {:?}",
        verified.err()
    );
}

/// An introspection endpoint's answer (the body, as the endpoint sent it). Never a panic; the
/// answer is taken exactly when RFC 7662 §2.2 says the token is good for this resource: a JSON
/// object, `active` `true`, an `exp` (when present and not `null`) a NumericDate (RFC 7519 §2:
/// seconds, possibly fractional) after now (one that is not a number is refused: an expiry that
/// cannot be read is not none), an `aud`
/// (when present) naming this resource (a string, or a list holding it), a non-empty `sub`.
/// A token taken is the answer's `sub`, its `iss` (else the endpoint's URL), its `scope`
/// words; it is cached no longer than `cache_max_age` nor past its `exp`.
pub fn introspection(data: &[u8]) {
    let f = keys();
    let Some(read) = f.introspection.introspection_answer(data) else {
        panic!("the fuzz target's authenticator does not introspect");
    };
    let answer = serde_json::from_slice::<Value>(data).ok();
    let Some(expected) = answer.as_ref().map_or(Some(false), introspected) else {
        return;
    };
    let Ok((who, cached)) = read else {
        assert!(!expected, "refused, but RFC 7662 takes it: {read:?}");
        return;
    };
    assert!(expected, "taken, but RFC 7662 refuses it");
    let Some(Value::Object(a)) = answer else {
        return;
    };
    assert_eq!(
        Some(who.subject.as_str()),
        a.get("sub").and_then(Value::as_str)
    );
    let issuer = a
        .get("iss")
        .and_then(Value::as_str)
        .unwrap_or(INTROSPECTION_ENDPOINT);
    assert_eq!(who.issuer, issuer);
    if let Some(Value::String(scope)) = a.get("scope") {
        assert!(who
            .scopes
            .iter()
            .map(String::as_str)
            .eq(scope.split_whitespace()));
    }
    assert!(
        cached <= f.cache_max_age,
        "cached past cache_max_age: {cached:?} > {:?}",
        f.cache_max_age
    );
    if let Some(exp) = a.get("exp").and_then(Value::as_f64) {
        let left = exp - now() as f64 + CLOCK_SLACK as f64;
        assert!(cached.as_secs_f64() <= left, "cached past exp");
    }
}

// Whether RFC 7662 takes the answer `a`; `None` when too close to its `exp` to judge.
fn introspected(a: &Value) -> Option<bool> {
    let Some(a) = a.as_object() else {
        return Some(false);
    };
    let now = now() as f64;
    let exp = match a.get("exp") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_f64() {
            Some(e) if (e - now).abs() <= CLOCK_SLACK as f64 => return None,
            Some(e) => Some(e),
            None => return Some(false),
        },
    };
    let aud = match a.get("aud") {
        None => true,
        Some(Value::String(s)) => s == RESOURCE,
        Some(Value::Array(v)) => v.iter().any(|s| s == RESOURCE),
        Some(_) => false,
    };
    let sub = a
        .get("sub")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty());
    Some(a.get("active") == Some(&Value::Bool(true)) && exp.is_none_or(|e| e > now) && aud && sub)
}

/// Claims a token of the fuzz targets is taken with (valid for an hour).
fn good_claims() -> Value {
    json!({"iss": ISSUER, "aud": RESOURCE, "sub": "alice", "exp": now() + 3600})
}

// Whether `claims`, signed, are taken (`Some(sub)`) or refused (`None`); `None` outside when
// too close to a time bound to judge.
fn claims_taken(
    claims: &Map<String, Value>,
    token_bytes: usize,
    keys: &Fixture,
) -> Option<Option<String>> {
    let (now, leeway) = (now(), keys.jwt_cfg.leeway.as_secs());
    let names = |claim: &str, wanted: &str| match claims.get(claim) {
        Some(Value::String(s)) => s == wanted,
        Some(Value::Array(v)) if v.iter().all(Value::is_string) => v.iter().any(|s| s == wanted),
        _ => false,
    };
    let exp = claims.get("exp").and_then(numeric_date);
    let nbf = claims.get("nbf").and_then(numeric_date);
    let near = |t: u64, bound: u64| t.abs_diff(bound) <= CLOCK_SLACK;
    if exp.is_some_and(|e| near(e, now.saturating_sub(leeway)))
        || nbf.is_some_and(|n| near(n, now + leeway))
    {
        return None;
    }
    // It goes upstream in the subject header: no control character but tab.
    let header_text = |s: &&str| s.bytes().all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f));
    let sub = claims
        .get("sub")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .filter(header_text);
    let taken = token_bytes <= keys.max_token_bytes
        && names("iss", ISSUER)
        && names("aud", RESOURCE)
        && exp.is_some_and(|e| e >= now.saturating_sub(leeway))
        && nbf.is_none_or(|n| n <= now + leeway);
    Some(sub.filter(|_| taken).map(str::to_owned))
}

// A NumericDate as `jsonwebtoken` reads one: a whole number ≥ 0, or a fraction rounded.
fn numeric_date(v: &Value) -> Option<u64> {
    if let Some(n) = v.as_u64() {
        return Some(n);
    }
    let f = v
        .as_f64()
        .filter(|f| f.is_finite() && *f >= 0.0 && *f < u64::MAX as f64)?;
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "in range"
    )]
    Some(f.round() as u64)
}

// A refusal as RFC 6750 §3 has it, holding nothing of the token.
fn challenged(refusal: &Refusal, authorization: &str) {
    assert_eq!(
        refusal.status,
        StatusCode::UNAUTHORIZED,
        "{}",
        refusal.message
    );
    let challenge = refusal
        .headers
        .get(header::WWW_AUTHENTICATE)
        .map(|v| v.to_str());
    let Some(Ok(challenge)) = challenge else {
        panic!("a 401 without its challenge: {}", refusal.message);
    };
    assert!(
        challenge.starts_with(r#"Bearer error="invalid_token", error_description=""#),
        "{challenge}"
    );
    if decoded_text(authorization).contains(MARK) || authorization.contains(MARK) {
        assert!(
            !refusal.message.contains(MARK),
            "echoed: {}",
            refusal.message
        );
        assert!(!challenge.contains(MARK), "echoed: {challenge}");
    }
}

// The decoded parts of a bearer JWT, as text.
fn decoded_text(authorization: &str) -> String {
    let token = authorization
        .split_once(' ')
        .map_or(authorization, |(_, t)| t);
    token
        .split('.')
        .filter_map(|part| URL_SAFE_NO_PAD.decode(part.trim()).ok())
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .collect()
}

/// The fuzz targets' `[auth]`: a signing key, the proxy's verifiers, their configuration.
struct Fixture {
    /// The signing key (PKCS#8) and its public half (base64url).
    pkcs8: Vec<u8>,
    x: String,
    /// `principal = "jwt"` over a key set holding only the signing key, as `k1`.
    jwt: Authenticator,
    jwt_cfg: crate::config::Jwt,
    max_token_bytes: usize,
    /// `principal = "introspection"` (its endpoint is never asked here).
    introspection: Authenticator,
    cache_max_age: Duration,
}

impl Fixture {
    // A JWT of `claims` signed with the key under `kid`.
    fn sign(&self, kid: &str, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(kid.to_owned());
        jsonwebtoken::encode(&header, claims, &EncodingKey::from_ed_der(&self.pkcs8))
            .unwrap_or_default()
    }

    fn sign_without_kid(&self, claims: &Value) -> String {
        let header = Header::new(Algorithm::EdDSA);
        jsonwebtoken::encode(&header, claims, &EncodingKey::from_ed_der(&self.pkcs8))
            .unwrap_or_default()
    }

    // The key's public JWK under `kid`.
    fn jwk(&self, kid: &str) -> Value {
        json!({"kty": "OKP", "crv": "Ed25519", "x": self.x, "kid": kid, "alg": "EdDSA", "use": "sig"})
    }
}

// The fixture, made once per process (its key set written to a file of its own).
fn keys() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let rng = ring::rand::SystemRandom::new();
        let pair = Ed25519KeyPair::generate_pkcs8(&rng)
            .ok()
            .and_then(|doc| Some((doc.as_ref().to_vec(), Ed25519KeyPair::from_pkcs8(doc.as_ref()).ok()?)));
        let Some((pkcs8, pair)) = pair else {
            panic!("no Ed25519 key for the fuzz target");
        };
        let x = URL_SAFE_NO_PAD.encode(pair.public_key().as_ref());
        let jwk = json!({"kty": "OKP", "crv": "Ed25519", "x": x, "kid": "k1", "alg": "EdDSA", "use": "sig"});
        let file = std::env::temp_dir().join(format!("mrtr-proxy-fuzz-{}.jwks.json", std::process::id()));
        if std::fs::write(&file, json!({"keys": [jwk]}).to_string()).is_err() {
            panic!("cannot write the fuzz target's key set to {}", file.display());
        }
        let jwt = config(&format!(
            "principal = \"jwt\"\n[auth.jwt]\nissuer = \"{ISSUER}\"\njwks_file = \"{}\"\n\
             algorithms = [\"EdDSA\", \"RS256\", \"ES256\"]\n",
            file.display()
        ));
        let introspection = config(&format!(
            "principal = \"introspection\"\n[auth.introspection]\n\
             endpoint = \"{INTROSPECTION_ENDPOINT}\"\n",
        ));
        let PrincipalSource::Jwt(jwt_cfg) = jwt.auth.principal.clone() else {
            panic!("the fuzz target's [auth] is not jwt");
        };
        let PrincipalSource::Introspection(i) = introspection.auth.principal.clone() else {
            panic!("the fuzz target's [auth] is not introspection");
        };
        Fixture {
            pkcs8,
            x,
            max_token_bytes: jwt.auth.max_token_bytes,
            jwt: authenticator(&jwt),
            jwt_cfg,
            introspection: authenticator(&introspection),
            cache_max_age: i.cache_max_age,
        }
    })
}

// A config of resource-server mode with `principal` lines.
fn config(principal: &str) -> Config {
    let toml = format!(
        "[auth]\nresource = \"{RESOURCE}\"\nauthorization_servers = [\"{ISSUER}\"]\n\
         require = true\nsubject_header = \"{SUBJECT_HEADER}\"\n{principal}"
    );
    match Config::from_toml_str(&toml) {
        Ok(c) => c,
        Err(e) => panic!("the fuzz target's config: {e}"),
    }
}

fn authenticator(config: &Config) -> Authenticator {
    let metrics = Arc::new(Metrics::default());
    let name = config.upstream.principal_header.clone();
    match Authenticator::new(&config.auth, name, metrics) {
        Ok(a) => a,
        Err(e) => panic!("the fuzz target's authenticator: {e}"),
    }
}

// The output of `f`, which must not wait: no key set is fetched, no endpoint asked here.
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a verification waited: nothing is fetched here"),
    }
}

// Seconds since the epoch.
fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
