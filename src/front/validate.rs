//! Validation of modern (2026-07-28) requests: mirrored headers (`mirrored`: one table, one
//! check), `_meta`, version and method routing, into a [`ModernRequest`]. Pure functions over
//! headers and a parsed envelope; no IO.

use std::sync::Arc;

use http::{HeaderMap, HeaderName};
use serde_json::value::RawValue;
use serde_json::Value;

use super::params::{self, Params};
use crate::error::ProxyError;
use crate::jsonrpc::Message;
use crate::protocol::{
    META_CAPABILITIES, META_LOG_LEVEL, META_VERSION, METHOD_HEADER, MODERN_VERSION, VERSION_HEADER,
};
use crate::trace_context::{Carried, Dropped, TraceContext};
use crate::upstream::Declared;

mod capabilities;
mod mirrored;

pub(super) use mirrored::decode_header_value;

/// Where a modern request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    /// `server/discover`, answered from the upstream's `InitializeResult`.
    Discover,
    /// `subscriptions/listen`, fed from the upstream GET stream.
    Listen,
    /// `tasks/get`, `tasks/update`, `tasks/cancel` (the tasks extension): answered from the
    /// task's record, here or at the instance that owns it.
    Tasks,
    /// Forwarded on a legacy session.
    Forward {
        /// `tools/call`, `prompts/get`, `resources/read`: may answer `input_required`.
        input_capable: bool,
    },
}

/// A modern request's envelope as `classify` read it, its params read in the same pass or
/// still raw.
#[derive(Debug)]
pub(super) struct Envelope {
    /// JSON-RPC id (absent on a notification).
    pub(super) id: Option<Box<RawValue>>,
    /// Method name.
    method: Option<String>,
    /// The params.
    params: ParamsRead,
}

/// A request's params: read with its envelope (`Params::read_request`), or left raw by
/// `Message::parse` (read by `validate`).
#[derive(Debug)]
enum ParamsRead {
    Raw(Option<Box<RawValue>>),
    Read(Params),
}

/// A validated modern request.
#[derive(Debug)]
pub(super) struct ModernRequest {
    /// JSON-RPC id.
    pub(super) id: Box<RawValue>,
    /// Method name.
    pub(super) method: String,
    /// Params, read member by member (the `_meta` included).
    pub(super) params: Params,
    /// Tool or prompt name, resource uri or task id (`""` for other methods).
    target: String,
    /// Declared client capabilities.
    pub(super) capabilities: Arc<Value>,
    /// What a session serving it declares upstream (the pool's key).
    pub(super) declared: Declared,
    /// `io.modelcontextprotocol/logLevel`, when set.
    pub(super) log_level: Option<String>,
    /// `_meta.progressToken`, when set.
    pub(super) progress_token: Option<Value>,
    /// Where it goes.
    pub(super) route: Route,
    /// Its W3C trace context (`_meta`, else headers), checked.
    pub(super) trace: TraceContext,
    /// What of the trace context the client sent was not kept.
    pub(super) trace_dropped: Dropped,
}

impl ModernRequest {
    /// Tool/prompt name or resource uri (`""` for other methods).
    pub(super) fn target(&self) -> &str {
        &self.target
    }

    /// Tool arguments (`arguments`; `null` when absent), used in the request digest.
    pub(super) fn arguments(&self) -> Value {
        self.params.get("arguments").unwrap_or(Value::Null)
    }
}

impl Envelope {
    /// The method name, or `""`.
    pub(super) fn method(&self) -> &str {
        self.method.as_deref().unwrap_or("")
    }
}

impl From<Message> for Envelope {
    fn from(msg: Message) -> Self {
        Self {
            id: msg.id,
            method: msg.method,
            params: ParamsRead::Raw(msg.params),
        }
    }
}

impl From<params::Request> for Envelope {
    fn from(req: params::Request) -> Self {
        Self {
            id: Some(req.id),
            method: Some(req.method),
            params: ParamsRead::Read(req.params),
        }
    }
}

/// Routes a method, or says it does not exist in 2026-07-28 behind this proxy.
///
/// # Errors
/// [`ProxyError::MethodNotFound`].
pub(super) fn route(method: &str) -> Result<Route, ProxyError> {
    match method {
        "server/discover" => Ok(Route::Discover),
        "subscriptions/listen" => Ok(Route::Listen),
        "tasks/get" | "tasks/update" | "tasks/cancel" => Ok(Route::Tasks),
        "tools/call" | "prompts/get" | "resources/read" => Ok(Route::Forward {
            input_capable: true,
        }),
        "tools/list"
        | "prompts/list"
        | "resources/list"
        | "resources/templates/list"
        | "completion/complete" => Ok(Route::Forward {
            input_capable: false,
        }),
        other => Err(ProxyError::MethodNotFound(other.to_owned())),
    }
}

/// Validates a modern request: the required `_meta` version, the mirrored headers (`mirrored`,
/// checked before the version is judged: a valid header over another body version is a
/// mismatch, -32020), the version, the method and its target, then the declared capabilities
/// (the extensions passed on upstream at most `max_extensions_bytes`).
///
/// # Errors
/// -32602 for missing `_meta` fields or target, or extensions past the bound, -32020 for a
/// mirrored header missing, not matching or invalid, -32022 for another version, -32601 for
/// unknown or removed methods.
pub(super) fn validate(
    headers: &HeaderMap,
    msg: Envelope,
    max_extensions_bytes: usize,
) -> Result<ModernRequest, ProxyError> {
    let id = msg
        .id
        .ok_or_else(|| ProxyError::InvalidRequest("expected a request".into()))?;
    let method = msg.method.unwrap_or_default();
    let params = match msg.params {
        ParamsRead::Raw(raw) => Params::parse(raw)?,
        ParamsRead::Read(params) => params,
    };
    let body_version = params
        .meta_string(META_VERSION)
        .ok_or_else(|| ProxyError::InvalidParams(format!("missing _meta[\"{META_VERSION}\"]")))?;
    let target = mirrored::check(headers, (&method, &body_version), &params)?;
    if body_version != MODERN_VERSION {
        return Err(ProxyError::UnsupportedVersion {
            requested: body_version.into_owned(),
        });
    }
    let missing = || ProxyError::InvalidParams(format!("missing _meta[\"{META_CAPABILITIES}\"]"));
    let text = params.meta_raw(META_CAPABILITIES).ok_or_else(missing)?;
    let read = capabilities::read(text, max_extensions_bytes).map_err(|refused| match refused {
        capabilities::Refused::NotAnObject => missing(),
        capabilities::Refused::TooLarge(too) => ProxyError::InvalidParams(format!(
            "the extensions of _meta[\"{META_CAPABILITIES}\"] passed on upstream are {} bytes \
             of JSON, above pool.max_extensions ({max_extensions_bytes} bytes); declare fewer \
             or smaller extensions",
            too.bytes
        )),
    })?;
    let (capabilities, declared) = (read.tree, read.declared);
    let log_level = params.meta(META_LOG_LEVEL);
    let progress_token = params.meta("progressToken");
    let (trace, trace_dropped) =
        TraceContext::of(|k| params.meta_raw(k).map(Carried::of_json), headers);
    let route = route(&method)?;
    Ok(ModernRequest {
        id,
        method,
        params,
        target,
        capabilities,
        declared,
        log_level,
        progress_token,
        route,
        trace,
        trace_dropped,
    })
}

/// Whether a request looks like it comes from a modern client (a modern `_meta` version or
/// header), as opposed to a legacy one that should be passed through.
pub(super) fn looks_modern(headers: &HeaderMap, msg: &Message) -> bool {
    if header_str(headers, VERSION_HEADER).is_some_and(|v| v >= MODERN_VERSION) {
        return true;
    }
    let Some(params) = &msg.params else {
        return header_str(headers, METHOD_HEADER).is_some();
    };
    // A cheap look for the modern `_meta` key before parsing anything.
    params.get().contains(META_VERSION) || header_str(headers, METHOD_HEADER).is_some()
}

fn header_str(headers: &HeaderMap, name: HeaderName) -> Option<&str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use base64::Engine;

    use super::*;

    // With the default bound on extensions.
    pub(super) fn validate(h: &HeaderMap, m: Message) -> Result<ModernRequest, ProxyError> {
        super::validate(h, m.into(), 4096)
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    fn call(name: &str) -> Message {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{name}","arguments":{{}},"_meta":{{"{META_VERSION}":"2026-07-28","{META_CAPABILITIES}":{{}}}}}}}}"#
        );
        Message::parse(body.as_bytes()).unwrap()
    }

    fn good_headers(name: &str) -> HeaderMap {
        headers(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", name),
        ])
    }

    #[test]
    fn accepts_a_correct_call() {
        let r = validate(&good_headers("echo"), call("echo")).unwrap();
        assert_eq!(
            r.route,
            Route::Forward {
                input_capable: true
            }
        );
        assert_eq!(r.target(), "echo");
    }

    #[test]
    fn header_mismatches_are_32020() {
        for h in [
            headers(&[("mcp-method", "tools/call"), ("mcp-name", "echo")]),
            headers(&[("mcp-protocol-version", "2026-07-28"), ("mcp-name", "echo")]),
            headers(&[
                ("mcp-protocol-version", "2026-07-28"),
                ("mcp-method", "tools/list"),
                ("mcp-name", "echo"),
            ]),
            headers(&[
                ("mcp-protocol-version", "2026-07-28"),
                ("mcp-method", "tools/call"),
            ]),
            good_headers("other"),
        ] {
            let e = validate(&h, call("echo")).unwrap_err();
            assert_eq!(e.to_error_object().code, -32020, "{h:?}");
        }
    }

    #[test]
    fn a_valid_version_header_over_another_body_version_is_a_mismatch() {
        let m = Message::parse(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"v999.0.0","io.modelcontextprotocol/clientCapabilities":{}}}}"#,
        )
        .unwrap();
        let h = headers(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/list"),
        ]);
        let e = validate(&h, m).unwrap_err();
        assert_eq!(e.to_error_object().code, -32020, "{e}");
        assert_eq!(e.status(), http::StatusCode::BAD_REQUEST);
    }

    // The version is read as JSON reads it: escaped, it is the same version; not a string, it
    // is missing.
    #[test]
    fn the_body_version_is_read_as_json_reads_it() {
        let h = headers(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/list"),
        ]);
        let body = |version: &str| {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{"_meta":{{"{META_VERSION}":{version},"{META_CAPABILITIES}":{{}}}}}}}}"#
            );
            Message::parse(body.as_bytes()).unwrap()
        };
        assert!(validate(&h, body(r#""2026\u002d07-28""#)).is_ok());
        let e = validate(&h, body("20260728")).unwrap_err();
        assert_eq!(e.to_error_object().code, -32602, "{e}");
    }

    #[test]
    fn base64_names_decode() {
        let name = "héllo";
        let enc = format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(name)
        );
        assert!(validate(&good_headers(&enc), call(name)).is_ok());
    }

    #[test]
    fn missing_meta_is_32602_and_other_version_32022() {
        let m = Message::parse(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#)
            .unwrap();
        assert_eq!(
            validate(&good_headers("x"), m)
                .unwrap_err()
                .to_error_object()
                .code,
            -32602
        );
        let m = Message::parse(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"1900-01-01","io.modelcontextprotocol/clientCapabilities":{}}}}"#,
        )
        .unwrap();
        let h = headers(&[
            ("mcp-protocol-version", "1900-01-01"),
            ("mcp-method", "tools/list"),
        ]);
        assert_eq!(validate(&h, m).unwrap_err().to_error_object().code, -32022);
        let m = Message::parse(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
        )
        .unwrap();
        let h = headers(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/list"),
        ]);
        assert_eq!(validate(&h, m).unwrap_err().to_error_object().code, -32602);
    }

    #[test]
    fn removed_methods_are_not_found() {
        for m in [
            "ping",
            "logging/setLevel",
            "resources/subscribe",
            "initialize",
            "tasks/result",
            "tasks/list",
            "bogus",
        ] {
            assert!(
                matches!(route(m), Err(ProxyError::MethodNotFound(_))),
                "{m}"
            );
        }
    }
}
