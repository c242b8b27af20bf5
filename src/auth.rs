//! Who a request speaks for (`[auth]`), and OAuth at the edge.
//!
//! [`Authenticator::identify`] turns a request's headers into a [`Principal`]: the digest that
//! keys sessions, parked calls, tokens, tasks and limits, and the [`Credentials`] that go
//! upstream for it. With `principal = "header"` the digest is of the header as it came; with
//! `"jwt"` or `"introspection"` the token is verified and the digest is of its issuer and
//! subject, so a refreshed token of the same person is the same principal. A request the proxy
//! refuses gets a [`Refusal`]: 401 with the RFC 6750 / RFC 9728 challenge, 403 for a missing
//! scope, 503 when the authorization server cannot be asked.

use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use std::sync::Arc;

use crate::config::{self, PrincipalSource, SecretSource};
use crate::ops::metrics::{AuthRefusal, Metrics};
use crate::state::principal_digest;
use crate::upstream::Credentials;

mod fetch;
mod introspect;
mod jwt;
pub(crate) mod metadata;
mod verified;

use fetch::Fetcher;
use introspect::Introspector;
use jwt::JwtVerifier;
use verified::{Rejection, Verified};

/// Who a request speaks for.
#[derive(Debug, Clone)]
pub(crate) struct Principal {
    /// Keys sessions and binds tokens.
    pub(crate) digest: String,
    /// What goes upstream for it (its header, or the verified subject).
    pub(crate) credentials: Credentials,
    /// The verified token's scopes; `None` when no token was verified.
    pub(crate) scopes: Option<Vec<String>>,
}

impl Principal {
    /// The principal of a request that names none.
    pub(crate) fn anonymous() -> Self {
        Self {
            digest: principal_digest(None),
            credentials: Credentials::default(),
            scopes: None,
        }
    }
}

/// A refused request: its status and headers (the challenge, `Retry-After`) and a message.
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    pub(crate) reason: AuthRefusal,
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) message: String,
}

/// Why [`Authenticator::new`] failed: a key file or client secret that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("[auth]: {0}")]
pub struct AuthSetupError(String);

impl AuthSetupError {
    /// What went wrong, without the `[auth]` it is said under (for a secret read for another
    /// table).
    pub(crate) fn reason(&self) -> &str {
        &self.0
    }
}

#[derive(Debug)]
enum Verifier {
    Header(HeaderName),
    Jwt(Box<JwtVerifier>),
    Introspection(Box<Introspector>),
}

/// Identifies requests as `[auth]` says.
#[derive(Debug)]
pub(crate) struct Authenticator {
    cfg: config::Auth,
    verifier: Verifier,
    /// The protected-resource metadata URL the challenges name, when `resource` is set.
    metadata_url: Option<String>,
    metrics: Arc<Metrics>,
}

impl Authenticator {
    /// The authenticator of `cfg`; `principal_header` names the header of `principal = "header"`.
    /// Reads a `jwks_file` and the introspection client secret now.
    ///
    /// # Errors
    /// [`AuthSetupError`] naming what cannot be read.
    pub(crate) fn new(
        cfg: &config::Auth,
        principal_header: HeaderName,
        metrics: Arc<Metrics>,
    ) -> Result<Self, AuthSetupError> {
        let fetcher = Fetcher::new(cfg.fetch_timeout, Arc::clone(&metrics));
        let verifier = match &cfg.principal {
            PrincipalSource::Header => Verifier::Header(principal_header),
            PrincipalSource::Jwt(j) => Verifier::Jwt(Box::new(
                JwtVerifier::new(j.clone(), fetcher).map_err(AuthSetupError)?,
            )),
            PrincipalSource::Introspection(i) => {
                let secret = i.secret.as_ref().map(read_secret).transpose()?;
                let audience = cfg
                    .resource
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                Verifier::Introspection(Box::new(
                    Introspector::new(i.clone(), secret, audience, fetcher, Arc::clone(&metrics))
                        .map_err(AuthSetupError)?,
                ))
            }
        };
        Ok(Self {
            metadata_url: cfg.resource.as_ref().map(metadata::metadata_url),
            cfg: cfg.clone(),
            verifier,
            metrics,
        })
    }

    /// What the introspection endpoint's answer `body` says of a token, as `verify` reads it
    /// (`None` unless `principal = "introspection"`): who it names and for how long that is
    /// cached, or why it is refused. Parsing only, for the fuzz targets.
    pub(crate) fn introspection_answer(
        &self,
        body: &[u8],
    ) -> Option<Result<(Verified, std::time::Duration), &'static str>> {
        let Verifier::Introspection(v) = &self.verifier else {
            return None;
        };
        let Ok(serde_json::Value::Object(answer)) = serde_json::from_slice(body) else {
            return Some(Err("the introspection answer is not a JSON object"));
        };
        let judged = v.judge(&answer);
        let now = tokio::time::Instant::now();
        Some(judged.map(|(who, until)| (who, until.saturating_duration_since(now))))
    }

    /// The configuration.
    pub(crate) fn config(&self) -> &config::Auth {
        &self.cfg
    }

    /// The principal of a request with `headers`, or why it is refused.
    pub(crate) async fn identify(&self, headers: &HeaderMap) -> Result<Principal, Box<Refusal>> {
        let identified = self.verify(headers).await;
        if let Err(r) = &identified {
            self.metrics.auth.refused(r.reason);
        }
        identified
    }

    async fn verify(&self, headers: &HeaderMap) -> Result<Principal, Box<Refusal>> {
        let name = match &self.verifier {
            Verifier::Header(name) => return Ok(by_header(name, headers)),
            Verifier::Jwt(_) | Verifier::Introspection(_) => AUTHORIZATION,
        };
        let Some(value) = headers.get(&name) else {
            if self.cfg.require {
                return Err(self.unauthorized(None));
            }
            // Pass-through: the upstream decides about a request without a token.
            return Ok(by_header(&name, headers));
        };
        let token = self.bearer(value)?;
        let verified = match &self.verifier {
            Verifier::Jwt(v) => v.verify(token).await,
            Verifier::Introspection(v) => v.verify(token).await,
            Verifier::Header(_) => return Ok(by_header(&name, headers)),
        };
        let verified = verified.map_err(|r| self.refuse(&r))?;
        // The upstream learns who a request is for from the subject header: a subject that
        // cannot be a header value (a control character) is refused, not sent without it
        // (found by the `bearer` fuzz target).
        if self.cfg.subject_header.is_some() && HeaderValue::from_str(&verified.subject).is_err() {
            let why = "the token's subject holds a control character: it cannot go upstream";
            return Err(self.unauthorized(Some(why)));
        }
        Ok(self.principal_of(verified, value))
    }

    // The token of an `Authorization: Bearer` header, bounded.
    fn bearer<'a>(&self, value: &'a HeaderValue) -> Result<&'a str, Box<Refusal>> {
        if value.len() > self.cfg.max_token_bytes + "Bearer ".len() {
            let why = format!("the token is over {} bytes", self.cfg.max_token_bytes);
            return Err(self.unauthorized(Some(&why)));
        }
        let text = value.to_str().unwrap_or_default();
        match text.split_once(' ') {
            Some((scheme, token))
                if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() =>
            {
                Ok(token.trim())
            }
            _ => Err(self.unauthorized(Some("the Authorization header is not a bearer token"))),
        }
    }

    fn principal_of(&self, v: Verified, authorization: &HeaderValue) -> Principal {
        // The issuer's length first: no pair of issuer and subject reads as another.
        let named = format!("verified\0{}\0{}\0{}", v.issuer.len(), v.issuer, v.subject);
        let digest = principal_digest(Some(named.as_bytes()));
        let mut headers = Vec::new();
        if !self.cfg.require || self.cfg.forward_authorization {
            headers.push((AUTHORIZATION, authorization.clone()));
        }
        if let Some(name) = &self.cfg.subject_header {
            if let Ok(value) = HeaderValue::from_str(&v.subject) {
                headers.push((name.clone(), value));
            }
        }
        Principal {
            digest,
            credentials: Credentials::new(headers),
            scopes: Some(v.scopes),
        }
    }

    /// Resource-server mode: refuses a call of `tool` when the principal's token lacks a scope
    /// `[auth.scopes]` names for it.
    pub(crate) fn check_tool(&self, who: &Principal, tool: &str) -> Result<(), Box<Refusal>> {
        let Some(needed) = self.cfg.scopes.get(tool) else {
            return Ok(());
        };
        let granted = who.scopes.as_deref().unwrap_or_default();
        if needed.iter().all(|s| granted.contains(s)) {
            return Ok(());
        }
        self.metrics.auth.refused(AuthRefusal::Scope);
        let scope = needed.join(" ");
        let mut params = vec![
            ("error", "insufficient_scope".to_owned()),
            ("scope", scope.clone()),
        ];
        params.extend(self.metadata_url.clone().map(|u| ("resource_metadata", u)));
        Err(Box::new(Refusal {
            reason: AuthRefusal::Scope,
            status: StatusCode::FORBIDDEN,
            headers: challenge_headers(&params),
            message: format!("the token lacks the scope `{scope}` the tool `{tool}` needs"),
        }))
    }

    fn refuse(&self, r: &Rejection) -> Box<Refusal> {
        match r {
            Rejection::Invalid(why) => {
                tracing::info!(reason = %why, "refused a token");
                self.unauthorized(Some(why))
            }
            Rejection::Unavailable(why) => {
                let mut headers = HeaderMap::new();
                headers.insert(http::header::RETRY_AFTER, HeaderValue::from_static("5"));
                Box::new(Refusal {
                    reason: AuthRefusal::Unavailable,
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    headers,
                    message: format!("the token cannot be checked now: {why}"),
                })
            }
        }
    }

    // 401 with the challenge: `invalid_token` when a token was given.
    fn unauthorized(&self, invalid: Option<&str>) -> Box<Refusal> {
        let mut params = Vec::new();
        if let Some(why) = invalid {
            params.push(("error", "invalid_token".to_owned()));
            params.push(("error_description", why.replace(['"', '\\'], "'")));
        }
        if !self.cfg.scopes_supported.is_empty() {
            params.push(("scope", self.cfg.scopes_supported.join(" ")));
        }
        params.extend(self.metadata_url.clone().map(|u| ("resource_metadata", u)));
        Box::new(Refusal {
            reason: if invalid.is_some() {
                AuthRefusal::Invalid
            } else {
                AuthRefusal::Missing
            },
            status: StatusCode::UNAUTHORIZED,
            headers: challenge_headers(&params),
            message: invalid.map_or_else(
                || "this resource needs a bearer token".to_owned(),
                |why| format!("invalid token: {why}"),
            ),
        })
    }

    /// A legacy client's request relayed upstream: in resource-server mode its token stays
    /// here (unless `forward_authorization`); a subject header only ever carries the verified
    /// subject, never one the client wrote.
    pub(crate) fn relay_headers(&self, headers: &mut HeaderMap, who: &Principal) {
        if !self.cfg.verifies_tokens() {
            return;
        }
        headers.remove(AUTHORIZATION);
        if let Some(name) = &self.cfg.subject_header {
            headers.remove(name);
        }
        for (name, value) in who.credentials.headers() {
            headers.insert(name.clone(), value.clone());
        }
    }

    /// A request relayed for no principal (a `/.well-known/` document): in resource-server mode
    /// it carries neither the client's token (unless `forward_authorization`) nor a subject.
    pub(crate) fn scrub(&self, headers: &mut HeaderMap) {
        if let Some(name) = &self.cfg.subject_header {
            headers.remove(name);
        }
        if self.cfg.require && !self.cfg.forward_authorization {
            headers.remove(AUTHORIZATION);
        }
    }

    /// Pass-through: an upstream challenge's `resource_metadata` made the proxy's public URL,
    /// where the upstream named its own internal one.
    pub(crate) fn rewrite_challenge(&self, headers: &mut HeaderMap) {
        if self.cfg.require {
            return;
        }
        let Some(url) = &self.metadata_url else {
            return;
        };
        if let Some(v) = headers.get(http::header::WWW_AUTHENTICATE) {
            if let Some(rewritten) = metadata::with_metadata_url(v, url) {
                headers.insert(http::header::WWW_AUTHENTICATE, rewritten);
            }
        }
    }
}

/// A JWT verifier of `cfg` over the key set `jwks` (JSON text), as `principal = "jwt"` with a
/// `jwks_file` reads it; what its `verify` says of a token is what the proxy says. Parsing only,
/// for the fuzz targets.
///
/// # Errors
/// `jwks` is not a key set.
pub(crate) fn jwt_verifier(cfg: &config::Jwt, jwks: &str) -> Result<JwtVerifier, String> {
    JwtVerifier::with_key_set(cfg.clone(), jwks)
}

// `principal = "header"`, and pass-through without a token: the header's digest; the header
// itself goes upstream.
fn by_header(name: &HeaderName, headers: &HeaderMap) -> Principal {
    let value = headers.get(name);
    Principal {
        digest: principal_digest(value.map(HeaderValue::as_bytes)),
        credentials: Credentials::new(
            value
                .map(|v| (name.clone(), v.clone()))
                .into_iter()
                .collect(),
        ),
        scopes: None,
    }
}

fn challenge_headers(params: &[(&str, String)]) -> HeaderMap {
    let mut value = String::from("Bearer");
    for (i, (k, v)) in params.iter().enumerate() {
        value.push_str(if i == 0 { " " } else { ", " });
        value.push_str(&format!("{k}=\"{v}\""));
    }
    let mut h = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&value) {
        h.insert(http::header::WWW_AUTHENTICATE, v);
    }
    h
}

/// Reads a secret from where the config says it is (trailing line breaks dropped).
///
/// # Errors
/// The variable is unset or the file unreadable (named, never the secret).
pub(crate) fn read_secret(source: &SecretSource) -> Result<String, AuthSetupError> {
    let text = match source {
        SecretSource::Env(var) => std::env::var(var)
            .map_err(|_| AuthSetupError(format!("the environment variable {var} is not set")))?,
        SecretSource::File(path) => std::fs::read_to_string(path)
            .map_err(|e| AuthSetupError(format!("cannot read {}: {e}", path.display())))?,
    };
    Ok(text.trim_end_matches(['\r', '\n']).to_owned())
}
