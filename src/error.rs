//! `ProxyError`: every failure the request path can produce, and the one place that maps an error
//! to an HTTP response. Each variant knows its [`Side`], which picks the status class and log level.

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::body::{full, Body};
use crate::jsonrpc::{self, ErrorObject};
use crate::state_token::TokenError;
use crate::upstream::UpstreamError;

/// Who is at fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client sent something wrong (4xx).
    Client,
    /// The upstream failed (502/504).
    Upstream,
    /// The proxy itself (500/503).
    Internal,
}

/// A failure on the request path.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
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
    /// A requestState failed verification (-32602).
    #[error("invalid requestState: {0}")]
    State(#[from] TokenError),
    /// Method unknown or removed in 2026-07-28 (-32601, HTTP 404).
    #[error("method not found: {0}")]
    MethodNotFound(String),
    /// The upstream asked for input the request did not declare (-32021).
    #[error("the server needs a client capability this request did not declare")]
    MissingCapability {
        /// `data.requiredCapabilities`.
        required: Value,
    },
    /// A configured limit was hit (503 + Retry-After).
    #[error("{0}")]
    Overloaded(String),
    /// Request body over the configured bound (413).
    #[error("request body exceeds {limit} bytes")]
    BodyTooLarge {
        /// The bound.
        limit: usize,
    },
    /// `Origin` not allowed (403).
    #[error("origin not allowed")]
    Forbidden,
    /// GET/DELETE without a legacy session (405).
    #[error("method not allowed")]
    MethodNotAllowed,
    /// The upstream failed.
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// The proxy failed.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ProxyError {
    /// Who is at fault.
    pub fn side(&self) -> Side {
        match self {
            Self::Parse(_)
            | Self::InvalidRequest(_)
            | Self::HeaderMismatch(_)
            | Self::UnsupportedVersion { .. }
            | Self::InvalidParams(_)
            | Self::State(_)
            | Self::MethodNotFound(_)
            | Self::MissingCapability { .. }
            | Self::BodyTooLarge { .. }
            | Self::Forbidden
            | Self::MethodNotAllowed => Side::Client,
            Self::Upstream(UpstreamError::Unauthorized { .. }) => Side::Client,
            Self::Upstream(_) => Side::Upstream,
            Self::Overloaded(_) | Self::Internal(_) => Side::Internal,
        }
    }

    /// HTTP status for this error.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Parse(_)
            | Self::InvalidRequest(_)
            | Self::HeaderMismatch(_)
            | Self::UnsupportedVersion { .. }
            | Self::InvalidParams(_)
            | Self::State(_)
            | Self::MissingCapability { .. } => StatusCode::BAD_REQUEST,
            Self::MethodNotFound(_) => StatusCode::NOT_FOUND,
            Self::Overloaded(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Forbidden => StatusCode::FORBIDDEN,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::Upstream(e) => e.status(),
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The JSON-RPC error object sent to the client. Internal details never leave the proxy.
    pub fn to_error_object(&self) -> ErrorObject {
        let (code, data) = match self {
            Self::Parse(_) => (jsonrpc::PARSE_ERROR, None),
            Self::InvalidRequest(_)
            | Self::BodyTooLarge { .. }
            | Self::Forbidden
            | Self::MethodNotAllowed => (jsonrpc::INVALID_REQUEST, None),
            Self::HeaderMismatch(_) => (jsonrpc::HEADER_MISMATCH, None),
            Self::UnsupportedVersion { requested } => (
                jsonrpc::UNSUPPORTED_PROTOCOL_VERSION,
                Some(
                    serde_json::json!({"supported": [crate::front::MODERN_VERSION], "requested": requested}),
                ),
            ),
            Self::InvalidParams(_) | Self::State(_) => (jsonrpc::INVALID_PARAMS, None),
            Self::MethodNotFound(_) => (jsonrpc::METHOD_NOT_FOUND, None),
            Self::MissingCapability { required } => (
                jsonrpc::MISSING_REQUIRED_CLIENT_CAPABILITY,
                Some(serde_json::json!({"requiredCapabilities": required})),
            ),
            Self::Overloaded(_) => (jsonrpc::SERVER_OVERLOADED, None),
            Self::Upstream(UpstreamError::Unauthorized { .. }) => (jsonrpc::INVALID_REQUEST, None),
            Self::Upstream(_) | Self::Internal(_) => (jsonrpc::INTERNAL_ERROR, None),
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
    pub fn to_body_bytes(&self, id: Option<&RawValue>) -> Bytes {
        Bytes::from(jsonrpc::error_bytes(id, &self.to_error_object()))
    }

    /// Headers the answer carries besides the content type: `Retry-After` past a limit, the
    /// upstream's `WWW-Authenticate` challenge when it refused the credentials.
    pub fn extra_headers(&self) -> HeaderMap {
        let mut h = HeaderMap::new();
        match self {
            Self::Overloaded(_) => {
                h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            Self::Upstream(UpstreamError::Unauthorized {
                challenge: Some(c), ..
            }) => {
                h.insert(header::WWW_AUTHENTICATE, c.clone());
            }
            _ => {}
        }
        h
    }

    /// The single error → HTTP response mapping.
    pub fn into_response(self, id: Option<&RawValue>) -> Response<Body> {
        let mut resp = Response::new(full(self.to_body_bytes(id)));
        *resp.status_mut() = self.status();
        *resp.headers_mut() = self.extra_headers();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        resp
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
        assert_eq!(
            e.to_error_object().data.unwrap()["requiredCapabilities"]["elicitation"],
            serde_json::json!({})
        );
        let r = ProxyError::Overloaded("full".into()).into_response(None);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(r.headers().contains_key(header::RETRY_AFTER));
    }

    #[test]
    fn internal_details_do_not_leak() {
        let o = ProxyError::Internal("secret path /etc/x".into()).to_error_object();
        assert_eq!(o.message, "internal error");
        assert_eq!(ProxyError::Internal(String::new()).side(), Side::Internal);
    }
}
