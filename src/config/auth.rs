//! `[auth]`: who a request speaks for, and whether the proxy guards the upstream itself.
//!
//! - `principal`: `"header"` (a digest of the raw header, the default), `"jwt"` (a bearer JWT
//!   verified against `[auth.jwt]`) or `"introspection"` (an opaque token checked at the RFC
//!   7662 endpoint of `[auth.introspection]`). With a verified token the principal is the
//!   token's issuer and subject, so a refreshed token of the same person resumes their calls.
//! - `require = true` is resource-server mode: the proxy answers 401 to a request without a
//!   valid token, serves the protected-resource metadata (RFC 9728) and checks `[auth.scopes]`;
//!   the client's token is not sent upstream unless `forward_authorization`.
//! - Otherwise the upstream does its own auth (pass-through): the client's header goes upstream
//!   and the upstream's challenges and metadata come back, `resource` rewritten to `resource`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderName, Uri};
use jsonwebtoken::Algorithm;
use serde::Deserialize;

use super::error::{invalid, positive, ConfigError};
use super::tools::ToolTable;
use super::units::{duration, nonzero_duration, size};

/// `[auth]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawAuth {
    /// `principal`
    pub principal: Option<String>,
    /// `require`
    pub require: Option<bool>,
    /// `resource`
    pub resource: Option<String>,
    /// `authorization_servers`
    pub authorization_servers: Vec<String>,
    /// `scopes_supported`
    pub scopes_supported: Vec<String>,
    /// `forward_authorization`
    pub forward_authorization: Option<bool>,
    /// `subject_header`
    pub subject_header: Option<String>,
    /// `max_token_bytes`
    pub max_token_bytes: Option<String>,
    /// `fetch_timeout`
    pub fetch_timeout: Option<String>,
    /// `[auth.jwt]`
    pub jwt: RawJwt,
    /// `[auth.introspection]`
    pub introspection: RawIntrospection,
    /// `[auth.scopes]`: tool name or glob → scopes its calls need.
    pub scopes: BTreeMap<String, Vec<String>>,
}

/// `[auth.jwt]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawJwt {
    /// `issuer`
    pub issuer: Option<String>,
    /// `jwks_uri`
    pub jwks_uri: Option<String>,
    /// `jwks_file`
    pub jwks_file: Option<String>,
    /// `algorithms`
    pub algorithms: Vec<String>,
    /// `audiences`
    pub audiences: Vec<String>,
    /// `leeway`
    pub leeway: Option<String>,
    /// `principal_claim`
    pub principal_claim: Option<String>,
    /// `jwks_refetch_interval`
    pub jwks_refetch_interval: Option<String>,
    /// `jwks_max_age`
    pub jwks_max_age: Option<String>,
}

/// `[auth.introspection]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawIntrospection {
    /// `endpoint`
    pub endpoint: Option<String>,
    /// `client_id`
    pub client_id: Option<String>,
    /// `client_secret_env`
    pub client_secret_env: Option<String>,
    /// `client_secret_file`
    pub client_secret_file: Option<String>,
    /// `cache_max`
    pub cache_max: Option<usize>,
    /// `cache_max_age`
    pub cache_max_age: Option<String>,
    /// `negative_cache_max`
    pub negative_cache_max: Option<usize>,
    /// `negative_cache_max_age`
    pub negative_cache_max_age: Option<String>,
    /// `max_rate`
    pub max_rate: Option<usize>,
    /// `max_burst`
    pub max_burst: Option<usize>,
}

/// Where the principal comes from.
#[derive(Debug, Clone)]
pub enum PrincipalSource {
    /// A digest of `upstream.principal_header` as it came (no verification).
    Header,
    /// A bearer JWT verified against `[auth.jwt]`.
    Jwt(Jwt),
    /// An opaque bearer token checked at `[auth.introspection]`.
    Introspection(Introspection),
}

/// `[auth]`, validated.
#[derive(Debug, Clone)]
pub struct Auth {
    /// Where the principal comes from.
    pub principal: PrincipalSource,
    /// Resource-server mode: a valid token on every request.
    pub require: bool,
    /// The public canonical URI of the MCP endpoint (RFC 8707 / RFC 9728 `resource`).
    pub resource: Option<Uri>,
    /// The protected-resource metadata's `authorization_servers`.
    pub authorization_servers: Vec<String>,
    /// The metadata's `scopes_supported` (and the challenge's `scope`).
    pub scopes_supported: Vec<String>,
    /// Resource-server mode: send the client's token upstream anyway.
    pub forward_authorization: bool,
    /// The header the verified subject goes upstream in.
    pub subject_header: Option<HeaderName>,
    /// Longest bearer token taken.
    pub max_token_bytes: usize,
    /// How long a JWKS or introspection request may take.
    pub fetch_timeout: Duration,
    /// Scopes a tool's calls need.
    pub scopes: ToolTable<Vec<String>>,
}

/// `[auth.jwt]`, validated.
#[derive(Debug, Clone)]
pub struct Jwt {
    /// The `iss` every token must carry.
    pub issuer: String,
    /// Where the verification keys are.
    pub keys: JwksSource,
    /// The algorithms accepted (asymmetric only).
    pub algorithms: Vec<Algorithm>,
    /// The `aud` values accepted (default: the resource).
    pub audiences: Vec<String>,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
    /// The claim naming the person (default `sub`).
    pub principal_claim: String,
    /// Least time between two fetches of the key set for an unknown `kid`.
    pub refetch_interval: Duration,
    /// A fetched key set is fetched again after this long.
    pub max_age: Duration,
}

/// Where a JWKS comes from.
#[derive(Debug, Clone)]
pub enum JwksSource {
    /// Fetched from the authorization server (and again on an unknown `kid`).
    Uri(Uri),
    /// Read once at start.
    File(PathBuf),
}

/// `[auth.introspection]`, validated.
#[derive(Debug, Clone)]
pub struct Introspection {
    /// The RFC 7662 endpoint.
    pub endpoint: Uri,
    /// The proxy's client id at the endpoint (HTTP Basic), if it needs one.
    pub client_id: Option<String>,
    /// Where its secret is.
    pub secret: Option<SecretSource>,
    /// Most answers cached.
    pub cache_max: usize,
    /// Longest an answer is cached (never past the token's `exp`).
    pub cache_max_age: Duration,
    /// Most refusals (inactive, expired, another resource, no subject) cached.
    pub negative_cache_max: usize,
    /// How long a refusal is cached (zero: not cached).
    pub negative_cache_max_age: Duration,
    /// Introspection requests a second, sustained.
    pub max_rate: usize,
    /// Introspection requests at once, after a quiet spell (the bucket's size).
    pub max_burst: usize,
}

/// Where a client secret is read from, at start.
#[derive(Debug, Clone)]
pub enum SecretSource {
    /// An environment variable.
    Env(String),
    /// A file (trailing newline dropped).
    File(PathBuf),
}

impl Default for Auth {
    fn default() -> Self {
        Self {
            principal: PrincipalSource::Header,
            require: false,
            resource: None,
            authorization_servers: Vec::new(),
            scopes_supported: Vec::new(),
            forward_authorization: false,
            subject_header: None,
            max_token_bytes: 8 << 10,
            fetch_timeout: Duration::from_secs(5),
            scopes: ToolTable::default(),
        }
    }
}

impl Auth {
    pub(super) fn from_raw(raw: RawAuth) -> Result<Self, ConfigError> {
        let resource = raw.resource.as_deref().map(resource_uri).transpose()?;
        let principal = match raw.principal.as_deref().unwrap_or("header") {
            "header" => PrincipalSource::Header,
            "jwt" => PrincipalSource::Jwt(Jwt::from_raw(raw.jwt, resource.as_ref())?),
            "introspection" => {
                PrincipalSource::Introspection(Introspection::from_raw(raw.introspection)?)
            }
            other => {
                return Err(invalid(
                    "auth.principal",
                    format!("`{other}`: use \"header\", \"jwt\" or \"introspection\""),
                ))
            }
        };
        let auth = Self {
            require: raw.require.unwrap_or(false),
            resource,
            authorization_servers: raw.authorization_servers,
            scopes_supported: raw.scopes_supported,
            forward_authorization: raw.forward_authorization.unwrap_or(false),
            subject_header: raw
                .subject_header
                .as_deref()
                .map(subject_header)
                .transpose()?,
            max_token_bytes: size(
                "auth.max_token_bytes",
                raw.max_token_bytes.as_deref(),
                "8KiB",
            )?,
            fetch_timeout: nonzero_duration(
                "auth.fetch_timeout",
                raw.fetch_timeout.as_deref(),
                "5s",
            )?,
            scopes: ToolTable::new("auth.scopes", raw.scopes)?,
            principal,
        };
        auth.check()
    }

    // What only makes sense together.
    fn check(self) -> Result<Self, ConfigError> {
        let verified = self.verifies_tokens();
        if verified && self.resource.is_none() {
            return Err(invalid(
                "auth.resource",
                "a verified principal needs the public URL of the MCP endpoint (the token's audience)",
            ));
        }
        if self.require && !verified {
            return Err(invalid(
                "auth.require",
                "resource-server mode verifies tokens: set principal = \"jwt\" or \"introspection\"",
            ));
        }
        if self.require && self.authorization_servers.is_empty() {
            return Err(invalid(
                "auth.authorization_servers",
                "resource-server mode names at least one authorization server (RFC 9728)",
            ));
        }
        if !self.scopes.is_empty() && !self.require {
            return Err(invalid(
                "auth.scopes",
                "tool scopes are checked in resource-server mode (require = true)",
            ));
        }
        if self.subject_header.is_some() && !verified {
            return Err(invalid(
                "auth.subject_header",
                "the subject comes from a verified token: set principal = \"jwt\" or \"introspection\"",
            ));
        }
        if self.forward_authorization && !self.require {
            return Err(invalid(
                "auth.forward_authorization",
                "only resource-server mode withholds the token (pass-through always forwards it)",
            ));
        }
        Ok(self)
    }

    /// Whether tokens are verified here (the principal is the token's subject).
    pub fn verifies_tokens(&self) -> bool {
        !matches!(self.principal, PrincipalSource::Header)
    }
}

impl Jwt {
    fn from_raw(raw: RawJwt, resource: Option<&Uri>) -> Result<Self, ConfigError> {
        let issuer = raw.issuer.ok_or_else(|| {
            invalid(
                "auth.jwt.issuer",
                "is required (the `iss` every token names)",
            )
        })?;
        let keys = match (raw.jwks_uri, raw.jwks_file) {
            (Some(u), None) => JwksSource::Uri(fetch_uri("auth.jwt.jwks_uri", &u)?),
            (None, Some(f)) => JwksSource::File(PathBuf::from(f)),
            _ => {
                return Err(invalid(
                    "auth.jwt",
                    "set exactly one of jwks_uri and jwks_file",
                ))
            }
        };
        let algorithms = if raw.algorithms.is_empty() {
            vec![Algorithm::RS256]
        } else {
            raw.algorithms
                .iter()
                .map(|a| algorithm(a))
                .collect::<Result<_, _>>()?
        };
        let audiences = if raw.audiences.is_empty() {
            resource.map(ToString::to_string).into_iter().collect()
        } else {
            raw.audiences
        };
        Ok(Self {
            issuer,
            keys,
            algorithms,
            audiences,
            leeway: duration("auth.jwt.leeway", raw.leeway.as_deref(), "60s")?,
            principal_claim: raw.principal_claim.unwrap_or_else(|| "sub".to_owned()),
            refetch_interval: duration(
                "auth.jwt.jwks_refetch_interval",
                raw.jwks_refetch_interval.as_deref(),
                "10s",
            )?,
            max_age: nonzero_duration("auth.jwt.jwks_max_age", raw.jwks_max_age.as_deref(), "1h")?,
        })
    }
}

impl Introspection {
    fn from_raw(raw: RawIntrospection) -> Result<Self, ConfigError> {
        let endpoint = raw
            .endpoint
            .ok_or_else(|| invalid("auth.introspection.endpoint", "is required"))?;
        let secret = match (raw.client_secret_env, raw.client_secret_file) {
            (None, None) => None,
            (Some(e), None) => Some(SecretSource::Env(e)),
            (None, Some(f)) => Some(SecretSource::File(PathBuf::from(f))),
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "auth.introspection",
                    "set one of client_secret_env and client_secret_file",
                ))
            }
        };
        if secret.is_some() != raw.client_id.is_some() {
            return Err(invalid(
                "auth.introspection.client_id",
                "a client id and its secret go together",
            ));
        }
        Ok(Self {
            endpoint: fetch_uri("auth.introspection.endpoint", &endpoint)?,
            client_id: raw.client_id,
            secret,
            cache_max: raw.cache_max.unwrap_or(10_000),
            cache_max_age: duration(
                "auth.introspection.cache_max_age",
                raw.cache_max_age.as_deref(),
                "5m",
            )?,
            negative_cache_max: raw.negative_cache_max.unwrap_or(10_000),
            negative_cache_max_age: duration(
                "auth.introspection.negative_cache_max_age",
                raw.negative_cache_max_age.as_deref(),
                "30s",
            )?,
            max_rate: positive("auth.introspection.max_rate", raw.max_rate, 100)?,
            max_burst: positive("auth.introspection.max_burst", raw.max_burst, 200)?,
        })
    }
}

// Only asymmetric algorithms: a key set is public, and an HMAC key in it would let anyone sign.
fn algorithm(name: &str) -> Result<Algorithm, ConfigError> {
    use Algorithm::{EdDSA, ES256, ES384, PS256, PS384, PS512, RS256, RS384, RS512};
    let alg = match name {
        "RS256" => RS256,
        "RS384" => RS384,
        "RS512" => RS512,
        "PS256" => PS256,
        "PS384" => PS384,
        "PS512" => PS512,
        "ES256" => ES256,
        "ES384" => ES384,
        "EdDSA" => EdDSA,
        other => {
            return Err(invalid(
                "auth.jwt.algorithms",
                format!("`{other}`: use RS256/384/512, PS256/384/512, ES256/384 or EdDSA"),
            ))
        }
    };
    Ok(alg)
}

fn resource_uri(raw: &str) -> Result<Uri, ConfigError> {
    let uri = fetch_uri("auth.resource", raw)?;
    if uri.query().is_some() {
        return Err(invalid(
            "auth.resource",
            "a resource URI has no query (RFC 8707)",
        ));
    }
    Ok(uri)
}

// An absolute http(s) URL.
fn fetch_uri(key: &'static str, raw: &str) -> Result<Uri, ConfigError> {
    let uri: Uri = raw.parse().map_err(|e| invalid(key, e))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
        return Err(invalid(key, "must be an absolute http:// or https:// URL"));
    }
    Ok(uri)
}

fn subject_header(raw: &str) -> Result<HeaderName, ConfigError> {
    let key = "auth.subject_header";
    let name =
        HeaderName::from_bytes(raw.to_ascii_lowercase().as_bytes()).map_err(|e| invalid(key, e))?;
    if name == http::header::AUTHORIZATION || crate::protocol::HOP_BY_HOP.contains(&name) {
        return Err(invalid(key, format!("`{name}` cannot carry the subject")));
    }
    Ok(name)
}

#[cfg(test)]
mod tests;
