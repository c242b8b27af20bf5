//! `ProxyError`: every failure the request path can produce, and its one mapping to what the
//! client sees (HTTP status, JSON-RPC error object, extra headers). Each variant knows its
//! [`Side`], which picks the status class and the log level. Pure: `edge` builds the responses.

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, StatusCode};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::jsonrpc::{self, ErrorObject};
use crate::ops::metrics::{Outcome, UpstreamFailure};
use crate::protocol::{self, MODERN_VERSION};
use crate::state::TokenError;
use crate::upstream::UpstreamError;

/// `data.reason` of the error that tells a client its call is lost and must start again.
pub(crate) const CALL_LOST: &str = "call_lost";
/// `data.reason` of the error a `tasks/*` request gets when its task's owner is gone.
pub(crate) const TASK_LOST: &str = "task_lost";

/// Who is at fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// The client sent something wrong (4xx).
    Client,
    /// The upstream failed (502/504).
    Upstream,
    /// The proxy itself (500/503).
    Internal,
}

/// What the edge logs about a failed exchange: who caused it, and what happened (never tokens,
/// secrets or answers: error messages carry none).
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    /// Picks the log level.
    pub(crate) side: Side,
    /// The error's message.
    pub(crate) message: String,
    /// What failed upstream, when the upstream did (for `mrtr_upstream_errors_total`).
    pub(crate) upstream: Option<UpstreamFailure>,
}

impl Failure {
    /// The failure `err` describes.
    pub(crate) fn of(err: &ProxyError) -> Self {
        let upstream = match err {
            ProxyError::Upstream(e) => Some(upstream_kind(e)),
            _ => None,
        };
        Self {
            side: err.side(),
            message: err.to_string(),
            upstream,
        }
    }

    /// The request outcome this failure gives.
    pub(crate) fn outcome(&self) -> Outcome {
        match self.side {
            Side::Client => Outcome::ClientError,
            Side::Upstream => Outcome::UpstreamError,
            Side::Internal => Outcome::ProxyError,
        }
    }

    /// The one log line of a failure, in the current span, at its side's level: a client's
    /// mistake at `debug` (it is answered, not an incident), an upstream's or the proxy's own
    /// (a limit, a bug) at `warn`.
    pub(crate) fn log(&self) {
        let side = self.side.as_str();
        match self.side {
            Side::Client => tracing::debug!(side, error = %self.message, "request failed"),
            Side::Upstream | Side::Internal => {
                tracing::warn!(side, error = %self.message, "request failed");
            }
        }
    }
}

fn upstream_kind(e: &UpstreamError) -> UpstreamFailure {
    match e {
        UpstreamError::Connect(_) => UpstreamFailure::Connect,
        UpstreamError::Timeout => UpstreamFailure::Timeout,
        UpstreamError::Status(_) | UpstreamError::Refused(_) => UpstreamFailure::Status,
        UpstreamError::Unauthorized { .. } => UpstreamFailure::Unauthorized,
        UpstreamError::Protocol(_) => UpstreamFailure::Protocol,
        UpstreamError::Busy(_) => UpstreamFailure::PoolBusy,
        UpstreamError::Starting { .. } => UpstreamFailure::Starting,
        UpstreamError::SessionGone => UpstreamFailure::SessionGone,
        UpstreamError::Closed => UpstreamFailure::Closed,
        UpstreamError::Sse(_) => UpstreamFailure::Sse,
    }
}

// The capabilities a `requiredCapabilities` object names, as a person reads them:
// `{"elicitation":{"form":{}}}` is "elicitation.form", an extension is "the extension <id>",
// several are joined by "and".
fn capability_names(required: &Value) -> String {
    fn leaves(path: &str, v: &Value, out: &mut Vec<String>) {
        let Some(members) = v.as_object().filter(|m| !m.is_empty()) else {
            out.push(path.to_owned());
            return;
        };
        for (k, v) in members {
            if path == "extensions" {
                out.push(format!("the extension {k}"));
            } else if path.is_empty() {
                leaves(k, v, out);
            } else {
                leaves(&format!("{path}.{k}"), v, out);
            }
        }
    }
    let mut names = Vec::new();
    leaves("", required, &mut names);
    names.retain(|n| !n.is_empty());
    if names.is_empty() {
        "a client capability".to_owned()
    } else {
        names.join(" and ")
    }
}

impl Side {
    /// The side's name in logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Client => "client",
            Self::Upstream => "upstream",
            Self::Internal => "proxy",
        }
    }
}

/// A failure on the request path.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProxyError {
    /// Body not JSON.
    #[error("parse error: {0}")]
    Parse(String),
    /// JSON but not a valid request.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// Mirrored header missing or not matching the body (-32020).
    #[error("header mismatch: {0}")]
    HeaderMismatch(String),
    /// Protocol version not supported (-32022).
    #[error("unsupported protocol version")]
    UnsupportedVersion {
        /// What the client asked for.
        requested: String,
    },
    /// Invalid params (-32602), e.g. missing `_meta` fields or bad `inputResponses`.
    #[error("{0}")]
    InvalidParams(String),
    /// A retry's `requestState` or `inputResponses` is malformed, or an answer breaks its
    /// round's shape or schema (-32602; the call stays parked).
    #[error("{0}")]
    BadRetry(String),
    /// A requestState failed verification (-32602); the message is the token error's own.
    #[error(transparent)]
    State(#[from] TokenError),
    /// Method unknown or removed in 2026-07-28 (-32601, HTTP 404).
    #[error("method not found: {0}")]
    MethodNotFound(String),
    /// The upstream asked for input the request did not declare, or the proxy needs it (an
    /// approval, `tasks/*`) (-32021). The message names what is missing ("needs
    /// elicitation.form"), since clients show the message and rarely `data`.
    #[error(
        "needs {}; this request did not declare it in its client capabilities",
        capability_names(required)
    )]
    MissingCapability {
        /// `data.requiredCapabilities`.
        required: Value,
    },
    /// A configured limit was hit (503 + Retry-After).
    #[error("{0}")]
    Overloaded(String),
    /// The principal has `server.max_requests_per_principal` requests in flight (429 +
    /// Retry-After).
    #[error("too many requests in flight for this principal; retry later")]
    TooManyRequests,
    /// Request body over the configured bound (413).
    #[error("request body exceeds {limit} bytes")]
    BodyTooLarge {
        /// The bound.
        limit: usize,
    },
    /// The request body did not arrive within `server.body_read_timeout` (408).
    #[error("request body not received within {limit:?}")]
    BodyTimeout {
        /// The bound.
        limit: std::time::Duration,
    },
    /// `[auth]` refused the request's token: 401 (none, or invalid), 403 (a scope it lacks) or
    /// 503 (the authorization server cannot be asked), with the challenge.
    #[error("{}", .0.message)]
    Unauthenticated(Box<crate::auth::Refusal>),
    /// `Origin` not allowed (403).
    #[error("origin not allowed")]
    Forbidden,
    /// GET/DELETE without a legacy session (405).
    #[error("method not allowed")]
    MethodNotAllowed,
    /// The upstream answered the call with a JSON-RPC error (already rewritten for modern
    /// clients): an answer, not a failure of the proxy; -32601 keeps its HTTP 404.
    #[error("the upstream answered with error {}", .0.code)]
    Rpc(ErrorObject),
    /// A retry's call is lost: the instance that held it is gone, or no longer has it, and
    /// the call cannot be run again safely. -32602 with `data.reason = "call_lost"`, HTTP 410:
    /// the client must start the call again, without `requestState`.
    #[error("the call was lost with the instance that held it ({0}); start the call again")]
    CallLost(&'static str),
    /// A `tasks/*` request's task lives on an instance that cannot be reached (gone, or not of
    /// the peer set): -32602 with `data.reason = "task_lost"`, HTTP 410.
    #[error("the task was lost with the instance that ran it ({0})")]
    TaskLost(&'static str),
    /// The upstream failed.
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// The proxy failed.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<jsonrpc::EnvelopeError> for ProxyError {
    /// Not JSON: -32700; JSON but not one JSON-RPC 2.0 message (a batch included): -32600.
    fn from(e: jsonrpc::EnvelopeError) -> Self {
        match e {
            jsonrpc::EnvelopeError::Json(e) => Self::Parse(e.to_string()),
            jsonrpc::EnvelopeError::Shape(s) => Self::InvalidRequest(s.to_owned()),
        }
    }
}

impl ProxyError {
    /// Who is at fault.
    pub(crate) fn side(&self) -> Side {
        match self {
            Self::Parse(_)
            | Self::InvalidRequest(_)
            | Self::HeaderMismatch(_)
            | Self::UnsupportedVersion { .. }
            | Self::InvalidParams(_)
            | Self::BadRetry(_)
            | Self::State(_)
            | Self::MethodNotFound(_)
            | Self::MissingCapability { .. }
            | Self::BodyTooLarge { .. }
            | Self::BodyTimeout { .. }
            | Self::Forbidden
            | Self::MethodNotAllowed
            | Self::TooManyRequests
            | Self::Rpc(_) => Side::Client,
            Self::Upstream(UpstreamError::Unauthorized { .. } | UpstreamError::Refused(_)) => {
                Side::Client
            }
            Self::Upstream(UpstreamError::Busy(_)) => Side::Internal,
            Self::Upstream(_) => Side::Upstream,
            Self::Overloaded(_) | Self::Internal(_) | Self::CallLost(_) | Self::TaskLost(_) => {
                Side::Internal
            }
            Self::Unauthenticated(r) if r.status.is_server_error() => Side::Internal,
            Self::Unauthenticated(_) => Side::Client,
        }
    }

    /// HTTP status for this error.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Self::Parse(_)
            | Self::InvalidRequest(_)
            | Self::HeaderMismatch(_)
            | Self::UnsupportedVersion { .. }
            | Self::InvalidParams(_)
            | Self::BadRetry(_)
            | Self::State(_)
            | Self::MissingCapability { .. } => StatusCode::BAD_REQUEST,
            Self::MethodNotFound(_) => StatusCode::NOT_FOUND,
            Self::CallLost(_) | Self::TaskLost(_) => StatusCode::GONE,
            Self::Overloaded(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::Forbidden => StatusCode::FORBIDDEN,
            Self::Unauthenticated(r) => r.status,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::Rpc(e) if e.code == protocol::METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
            Self::Rpc(_) => StatusCode::OK,
            Self::Upstream(e) => e.status(),
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The JSON-RPC error object sent to the client. Internal details never leave the proxy.
    pub(crate) fn to_error_object(&self) -> ErrorObject {
        if let Self::Rpc(e) = self {
            return e.clone();
        }
        let (code, data) = match self {
            Self::Parse(_) => (protocol::PARSE_ERROR, None),
            Self::InvalidRequest(_)
            | Self::BodyTooLarge { .. }
            | Self::BodyTimeout { .. }
            | Self::Forbidden
            | Self::Unauthenticated(_)
            | Self::MethodNotAllowed => (protocol::INVALID_REQUEST, None),
            Self::HeaderMismatch(_) => (protocol::HEADER_MISMATCH, None),
            Self::UnsupportedVersion { requested } => (
                protocol::UNSUPPORTED_PROTOCOL_VERSION,
                Some(serde_json::json!({"supported": [MODERN_VERSION], "requested": requested})),
            ),
            Self::InvalidParams(_) | Self::BadRetry(_) | Self::State(_) => {
                (protocol::INVALID_PARAMS, None)
            }
            Self::MethodNotFound(_) => (protocol::METHOD_NOT_FOUND, None),
            Self::CallLost(_) => (
                protocol::INVALID_PARAMS,
                Some(serde_json::json!({"reason": CALL_LOST})),
            ),
            Self::TaskLost(_) => (
                protocol::INVALID_PARAMS,
                Some(serde_json::json!({"reason": TASK_LOST})),
            ),
            Self::MissingCapability { required } => (
                protocol::MISSING_REQUIRED_CLIENT_CAPABILITY,
                Some(serde_json::json!({"requiredCapabilities": required})),
            ),
            Self::Overloaded(_)
            | Self::TooManyRequests
            | Self::Upstream(UpstreamError::Busy(_)) => (protocol::SERVER_OVERLOADED, None),
            Self::Upstream(UpstreamError::Unauthorized { .. } | UpstreamError::Refused(_)) => {
                (protocol::INVALID_REQUEST, None)
            }
            Self::Rpc(_) | Self::Upstream(_) | Self::Internal(_) => {
                (protocol::INTERNAL_ERROR, None)
            }
        };
        let message = match self {
            Self::Internal(_) => "internal error".to_owned(),
            other => other.to_string(),
        };
        ErrorObject {
            code,
            message,
            data,
        }
    }

    /// The client-facing JSON-RPC error message bytes for request `id`.
    pub(crate) fn to_body_bytes(&self, id: Option<&RawValue>) -> Bytes {
        Bytes::from(jsonrpc::error_bytes(id, &self.to_error_object()))
    }

    /// Headers the answer carries besides the content type: `Retry-After` past a limit, the
    /// upstream's `WWW-Authenticate` challenge when it refused the credentials.
    pub(crate) fn extra_headers(&self) -> HeaderMap {
        let mut h = HeaderMap::new();
        match self {
            Self::Overloaded(_)
            | Self::TooManyRequests
            | Self::Upstream(UpstreamError::Busy(_)) => {
                h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            Self::Upstream(UpstreamError::Starting { retry_after_s, .. }) => {
                h.insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_s));
            }
            Self::Upstream(UpstreamError::Unauthorized {
                challenge: Some(c), ..
            }) => {
                h.insert(header::WWW_AUTHENTICATE, c.clone());
            }
            Self::Unauthenticated(r) => h.clone_from(&r.headers),
            _ => {}
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_spec() {
        assert_eq!(
            ProxyError::MethodNotFound("ping".into()).status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            ProxyError::HeaderMismatch("x".into()).status(),
            StatusCode::BAD_REQUEST
        );
        let e = ProxyError::UnsupportedVersion {
            requested: "1900-01-01".into(),
        };
        let o = e.to_error_object();
        assert_eq!(o.code, -32022);
        assert_eq!(o.data.unwrap()["requested"], "1900-01-01");
        let e = ProxyError::MissingCapability {
            required: serde_json::json!({"elicitation":{}}),
        };
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert!(e.to_string().starts_with("needs elicitation;"), "{e}");
        assert_eq!(
            e.to_error_object().data.unwrap()["requiredCapabilities"]["elicitation"],
            serde_json::json!({})
        );
        let e = ProxyError::Overloaded("full".into());
        assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(e.extra_headers().contains_key(header::RETRY_AFTER));
        let e = ProxyError::Upstream(UpstreamError::Busy("all upstream sessions are busy"));
        assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.side(), Side::Internal);
        assert_eq!(e.to_error_object().code, -32000);
        let not_found = ErrorObject {
            code: -32601,
            message: "no such tool".into(),
            data: None,
        };
        assert_eq!(
            ProxyError::Rpc(not_found.clone()).status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            ProxyError::Rpc(not_found).to_error_object().message,
            "no such tool"
        );
    }

    #[test]
    fn a_missing_capability_is_named_in_the_message() {
        let message = |required: serde_json::Value| {
            ProxyError::MissingCapability { required }
                .to_error_object()
                .message
        };
        assert_eq!(
            message(serde_json::json!({"elicitation": {"form": {}}})),
            "needs elicitation.form; this request did not declare it in its client capabilities"
        );
        assert!(message(serde_json::json!({"elicitation": {"url": {}}}))
            .starts_with("needs elicitation.url;"));
        assert!(message(serde_json::json!({"sampling": {"tools": {}}}))
            .starts_with("needs sampling.tools;"));
        assert!(message(serde_json::json!({"roots": {}})).starts_with("needs roots;"));
        assert!(
            message(serde_json::json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}))
                .starts_with("needs the extension io.modelcontextprotocol/tasks;")
        );
        let both = message(serde_json::json!({"sampling": {}, "roots": {}}));
        assert!(both.contains("roots and sampling") || both.contains("sampling and roots"));
    }

    #[test]
    fn a_lost_call_is_distinct_from_a_bad_token() {
        let lost = ProxyError::CallLost("its instance is gone");
        assert_eq!(lost.status(), StatusCode::GONE);
        let o = lost.to_error_object();
        assert_eq!(o.code, -32602);
        assert_eq!(o.data.unwrap()["reason"], "call_lost");
        assert!(o.message.contains("start the call again"), "{}", o.message);
        let bad = ProxyError::State(TokenError::Invalid).to_error_object();
        assert!(bad.data.is_none());
    }

    #[test]
    fn internal_details_do_not_leak() {
        let o = ProxyError::Internal("secret path /etc/x".into()).to_error_object();
        assert_eq!(o.message, "internal error");
        assert_eq!(ProxyError::Internal(String::new()).side(), Side::Internal);
    }
}
