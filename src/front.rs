//! The modern (2026-07-28) front door: header and `_meta` validation, method routing and the
//! `Origin` check. Pure functions over headers and a parsed envelope; no IO.

use base64::Engine;
use http::HeaderMap;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::error::ProxyError;
use crate::jsonrpc::Message;

/// The one modern protocol version served.
pub const MODERN_VERSION: &str = "2026-07-28";
/// `_meta` key of the protocol version.
pub const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key of the per-request client capabilities.
pub const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` key of the requested log level.
pub const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
/// `_meta` key of the server info on results.
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
/// `_meta` key tagging notifications of a listen stream.
pub const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// Where a modern request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `server/discover`, answered from the upstream's `InitializeResult`.
    Discover,
    /// `subscriptions/listen`, fed from the upstream GET stream.
    Listen,
    /// Forwarded on a legacy session.
    Forward {
        /// `tools/call`, `prompts/get`, `resources/read`: may answer `input_required`.
        input_capable: bool,
    },
}

/// A validated modern request.
#[derive(Debug)]
pub struct ModernRequest {
    /// JSON-RPC id.
    pub id: Box<RawValue>,
    /// Method name.
    pub method: String,
    /// Params as an object (the `_meta` included).
    pub params: Map<String, Value>,
    /// Declared client capabilities.
    pub capabilities: Value,
    /// `io.modelcontextprotocol/logLevel`, when set.
    pub log_level: Option<String>,
    /// `_meta.progressToken`, when set.
    pub progress_token: Option<Value>,
    /// Where it goes.
    pub route: Route,
}

impl ModernRequest {
    /// Tool/prompt name or resource uri (`""` for other methods).
    pub fn target(&self) -> &str {
        target_of(&self.method, &self.params).unwrap_or("")
    }

    /// The params to send upstream: without the retry fields, the modern `_meta` keys, and
    /// `task` (task augmentation is not offered here; a 2025-11-25 upstream would answer with a
    /// legacy task the client could not follow, so the call runs synchronously instead).
    pub fn upstream_params(&self) -> Value {
        let mut p = self.params.clone();
        p.remove("inputResponses");
        p.remove("requestState");
        p.remove("task");
        if let Some(Value::Object(meta)) = p.get_mut("_meta") {
            meta.retain(|k, _| !k.starts_with("io.modelcontextprotocol/"));
            if meta.is_empty() {
                p.remove("_meta");
            }
        }
        Value::Object(p)
    }

    /// Tool arguments (`arguments`) or `{}`, used in the request digest.
    pub fn arguments(&self) -> &Value {
        static EMPTY: Value = Value::Null;
        self.params.get("arguments").unwrap_or(&EMPTY)
    }
}

/// Routes a method, or says it does not exist in 2026-07-28 behind this proxy.
///
/// # Errors
/// [`ProxyError::MethodNotFound`].
pub fn route(method: &str) -> Result<Route, ProxyError> {
    match method {
        "server/discover" => Ok(Route::Discover),
        "subscriptions/listen" => Ok(Route::Listen),
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

/// Validates a modern request: required `_meta`, version, mirrored headers, then the method.
///
/// # Errors
/// -32602 for missing `_meta` fields, -32022 for another version, -32020 for header mismatches,
/// -32601 for unknown or removed methods.
pub fn validate(headers: &HeaderMap, msg: Message) -> Result<ModernRequest, ProxyError> {
    let id = msg
        .id
        .clone()
        .ok_or_else(|| ProxyError::InvalidRequest("expected a request".into()))?;
    let method = msg.method().to_owned();
    let params = match msg
        .params_value()
        .map_err(|e| ProxyError::Parse(e.to_string()))?
    {
        Value::Object(m) => m,
        Value::Null => Map::new(),
        _ => return Err(ProxyError::InvalidParams("params must be an object".into())),
    };
    let meta = params.get("_meta").and_then(Value::as_object);
    let body_version = meta
        .and_then(|m| m.get(META_VERSION))
        .and_then(Value::as_str)
        .ok_or_else(|| ProxyError::InvalidParams(format!("missing _meta[\"{META_VERSION}\"]")))?;
    if body_version != MODERN_VERSION {
        return Err(ProxyError::UnsupportedVersion {
            requested: body_version.to_owned(),
        });
    }
    mirrored(
        headers,
        "mcp-protocol-version",
        "MCP-Protocol-Version",
        body_version,
    )?;
    mirrored(headers, "mcp-method", "Mcp-Method", &method)?;
    if let Some(target) = target_of(&method, &params) {
        match headers
            .get("mcp-name")
            .map(|v| decode_header_value(v.as_bytes()))
        {
            Some(Some(n)) if n == target => {}
            Some(_) => {
                return Err(ProxyError::HeaderMismatch(
                    "Mcp-Name does not match the body".into(),
                ))
            }
            None => return Err(ProxyError::HeaderMismatch("missing Mcp-Name header".into())),
        }
    } else if matches!(
        method.as_str(),
        "tools/call" | "prompts/get" | "resources/read"
    ) {
        let field = if method == "resources/read" {
            "uri"
        } else {
            "name"
        };
        return Err(ProxyError::InvalidParams(format!("missing params.{field}")));
    }
    let capabilities = meta
        .and_then(|m| m.get(META_CAPABILITIES))
        .filter(|c| c.is_object())
        .cloned()
        .ok_or_else(|| {
            ProxyError::InvalidParams(format!("missing _meta[\"{META_CAPABILITIES}\"]"))
        })?;
    let log_level = meta
        .and_then(|m| m.get(META_LOG_LEVEL))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let progress_token = meta.and_then(|m| m.get("progressToken")).cloned();
    let route = route(&method)?;
    Ok(ModernRequest {
        id,
        method,
        params,
        capabilities,
        log_level,
        progress_token,
        route,
    })
}

/// Whether a request looks like it comes from a modern client (a modern `_meta` version or
/// header), as opposed to a legacy one that should be passed through.
pub fn looks_modern(headers: &HeaderMap, msg: &Message) -> bool {
    if header_str(headers, "mcp-protocol-version").is_some_and(|v| v.as_str() >= MODERN_VERSION) {
        return true;
    }
    let Some(params) = &msg.params else {
        return header_str(headers, "mcp-method").is_some();
    };
    // A cheap look for the modern `_meta` key before parsing anything.
    params.get().contains(META_VERSION) || header_str(headers, "mcp-method").is_some()
}

/// `Origin` check: absent → allowed; loopback origins → allowed; else must be in the allow-list.
pub fn origin_allowed(headers: &HeaderMap, allowed: &[String]) -> bool {
    let Some(origin) = headers
        .get(http::header::ORIGIN)
        .and_then(|v| v.to_str().ok())
    else {
        return true;
    };
    if allowed
        .iter()
        .any(|a| a == "*" || a.eq_ignore_ascii_case(origin))
    {
        return true;
    }
    let Ok(uri) = origin.parse::<http::Uri>() else {
        return false;
    };
    matches!(
        uri.host(),
        Some("localhost" | "127.0.0.1" | "[::1]" | "::1")
    )
}

// A mirrored header must be present and equal to its body value (-32020 otherwise).
fn mirrored(headers: &HeaderMap, name: &str, label: &str, body: &str) -> Result<(), ProxyError> {
    match header_str(headers, name) {
        Some(v) if v == body => Ok(()),
        Some(_) => Err(ProxyError::HeaderMismatch(format!(
            "{label} does not match the body"
        ))),
        None => Err(ProxyError::HeaderMismatch(format!(
            "missing {label} header"
        ))),
    }
}

fn target_of<'a>(method: &str, params: &'a Map<String, Value>) -> Option<&'a str> {
    let field = match method {
        "tools/call" | "prompts/get" => "name",
        "resources/read" => "uri",
        _ => return None,
    };
    params.get(field).and_then(Value::as_str)
}

fn header_str(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_owned())
}

/// Decodes a mirrored header value: plain ASCII, or `=?base64?…?=` holding UTF-8.
pub fn decode_header_value(raw: &[u8]) -> Option<String> {
    let s = std::str::from_utf8(raw).ok()?.trim();
    if let Some(b64) = s
        .strip_prefix("=?base64?")
        .and_then(|r| r.strip_suffix("?="))
    {
        let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
        return String::from_utf8(bytes).ok();
    }
    Some(s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            validate(&good_headers("x"), m)
                .unwrap_err()
                .to_error_object()
                .code,
            -32022
        );
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
            "tasks/get",
            "bogus",
        ] {
            assert!(
                matches!(route(m), Err(ProxyError::MethodNotFound(_))),
                "{m}"
            );
        }
    }

    #[test]
    fn upstream_params_strip_modern_fields() {
        let m = Message::parse(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","requestState":"x","inputResponses":{},"task":{"ttl":1000},"_meta":{"progressToken":5,"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#,
        )
        .unwrap();
        let r = validate(&good_headers("t"), m).unwrap();
        assert_eq!(
            r.upstream_params(),
            serde_json::json!({"name":"t","_meta":{"progressToken":5}})
        );
    }

    #[test]
    fn origins() {
        assert!(origin_allowed(&HeaderMap::new(), &[]));
        assert!(origin_allowed(
            &headers(&[("origin", "http://localhost:3000")]),
            &[]
        ));
        assert!(!origin_allowed(
            &headers(&[("origin", "https://evil.example")]),
            &[]
        ));
        assert!(origin_allowed(
            &headers(&[("origin", "https://app.example")]),
            &["https://app.example".into()]
        ));
    }
}
