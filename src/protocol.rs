//! MCP protocol constants: versions, `_meta` keys, header names (the hop-by-hop ones too) and
//! error codes, for both eras.
//! Depends on nothing, so every module can name the wire without depending on another's logic.

use http::{HeaderName, HeaderValue};

/// The one modern protocol version served.
pub(crate) const MODERN_VERSION: &str = "2026-07-28";
/// The legacy version asked for in `initialize` unless `upstream.protocol_version` says otherwise.
pub(crate) const DEFAULT_LEGACY_VERSION: &str = "2025-11-25";

/// Prefix of every `_meta` key the modern protocol defines (stripped before going upstream).
pub(crate) const META_PREFIX: &str = "io.modelcontextprotocol/";
/// `_meta` key of the protocol version.
pub(crate) const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key of the per-request client capabilities.
pub(crate) const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` key of the requested log level.
pub(crate) const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
/// `_meta` key of the server info on results.
pub(crate) const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
/// `_meta` key tagging notifications of a listen stream.
pub(crate) const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// The tasks extension: declared in `clientCapabilities.extensions`, advertised in
/// `server/discover`'s `capabilities.extensions`.
pub(crate) const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

// Header names are constants, not text: a lookup by text parses and lowercases the name
// first, on every request.

/// `MCP-Protocol-Version`: mirrored from `_meta` (modern), the negotiated version (legacy).
pub(crate) const VERSION_HEADER: HeaderName = HeaderName::from_static("mcp-protocol-version");
/// `Mcp-Method`: mirrors the JSON-RPC method (modern).
pub(crate) const METHOD_HEADER: HeaderName = HeaderName::from_static("mcp-method");
/// `Mcp-Name`: mirrors the tool / prompt name or resource uri (modern).
pub(crate) const NAME_HEADER: HeaderName = HeaderName::from_static("mcp-name");
/// `Mcp-Session-Id`: the legacy session.
pub(crate) const SESSION_HEADER: HeaderName = HeaderName::from_static("mcp-session-id");

/// The session id a response's head names, copied out of it to be kept: a clone would be a
/// slice of the connection's read buffer (hyper slices header values out of it) and keep that
/// whole buffer, 8 KiB, alive for the session's life.
pub(crate) fn session_id_of(headers: &http::HeaderMap) -> Option<HeaderValue> {
    let value = headers.get(SESSION_HEADER)?;
    // Every value hyper parsed is a valid one.
    HeaderValue::from_bytes(value.as_bytes()).ok()
}

/// Parse error (invalid JSON).
pub(crate) const PARSE_ERROR: i64 = -32700;
/// The JSON is not a valid request object.
pub(crate) const INVALID_REQUEST: i64 = -32600;
/// Unknown or capability-gated method (HTTP 404 in 2026-07-28).
pub(crate) const METHOD_NOT_FOUND: i64 = -32601;
/// Invalid params (also: bad or expired `requestState`, missing `_meta` fields).
pub(crate) const INVALID_PARAMS: i64 = -32602;
/// Internal error.
pub(crate) const INTERNAL_ERROR: i64 = -32603;
/// Implementation-defined: the proxy is at a configured limit (parked calls, sessions).
pub(crate) const SERVER_OVERLOADED: i64 = -32000;
/// Legacy (≤ 2025-11-25) "resource not found"; mapped to [`INVALID_PARAMS`] for modern clients.
pub(crate) const LEGACY_RESOURCE_NOT_FOUND: i64 = -32002;
/// Legacy (2025-11-25) "URL elicitation required".
pub(crate) const LEGACY_URL_ELICITATION_REQUIRED: i64 = -32042;
/// 2026-07-28: mirrored headers missing or not matching the body.
pub(crate) const HEADER_MISMATCH: i64 = -32020;
/// 2026-07-28: processing needs a capability the request did not declare.
pub(crate) const MISSING_REQUIRED_CLIENT_CAPABILITY: i64 = -32021;
/// 2026-07-28: the requested protocol version is not supported.
pub(crate) const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
/// 2026-07-28 reserves -32020 … -32099 for the spec: codes it does not define must not be sent.
pub(crate) const RESERVED_CODES: std::ops::RangeInclusive<i64> = -32099..=-32020;

/// Hop-by-hop headers (RFC 9110 §7.6.1): they describe one connection, so no hop the proxy
/// makes (relay, peer forward) passes them on.
pub(crate) const HOP_BY_HOP: [http::HeaderName; 8] = [
    http::header::CONNECTION,
    http::header::PROXY_AUTHENTICATE,
    http::header::PROXY_AUTHORIZATION,
    http::header::TE,
    http::header::TRAILER,
    http::header::TRANSFER_ENCODING,
    http::header::UPGRADE,
    http::HeaderName::from_static("keep-alive"),
];

/// Removes every [`HOP_BY_HOP`] header (a map with none, the common case, is not touched).
pub(crate) fn strip_hop_by_hop(headers: &mut http::HeaderMap) {
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name)) {
        return;
    }
    for h in &HOP_BY_HOP {
        headers.remove(h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_session_id_is_its_own_copy_not_a_slice_of_the_response_head() {
        // hyper's values are slices of the connection's read buffer; so is this one.
        let head = bytes::Bytes::from_static(b"HTTP/1.1 200 OK\r\nmcp-session-id: abc-123\r\n\r\n");
        let value = HeaderValue::from_maybe_shared(head.slice(33..40)).unwrap();
        let mut headers = http::HeaderMap::new();
        headers.insert(SESSION_HEADER, value);

        let kept = session_id_of(&headers).unwrap();
        assert_eq!(kept, "abc-123");
        let within = head.as_ptr_range();
        assert!(
            !within.contains(&kept.as_bytes().as_ptr()),
            "the kept id points into the response head"
        );
        assert!(within.contains(&headers[SESSION_HEADER].as_bytes().as_ptr()));
        assert_eq!(session_id_of(&http::HeaderMap::new()), None);
    }
}
