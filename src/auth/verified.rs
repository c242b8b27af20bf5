//! What a verifier says of a token: who it names, or why it is not taken.

use serde_json::{Map, Value};

/// What a verified token says.
#[derive(Debug, Clone)]
pub(crate) struct Verified {
    pub(crate) issuer: String,
    pub(crate) subject: String,
    pub(crate) scopes: Vec<String>,
}

/// Why a token was not taken.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Rejection {
    /// Bad, expired, for another resource, unknown key...: 401 `invalid_token`.
    #[error("{0}")]
    Invalid(String),
    /// The authorization server could not be asked: 503.
    #[error("the authorization server is unavailable: {0}")]
    Unavailable(String),
}

/// The scopes a token grants: `scope` (space-separated, RFC 8693 / RFC 7662) or `scp` (a list).
pub(crate) fn scopes_of(claims: &Map<String, Value>) -> Vec<String> {
    match (claims.get("scope"), claims.get("scp")) {
        (Some(Value::String(s)), _) => s.split_whitespace().map(str::to_owned).collect(),
        (_, Some(Value::Array(v))) => v
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        (_, Some(Value::String(s))) => s.split_whitespace().map(str::to_owned).collect(),
        _ => Vec::new(),
    }
}
