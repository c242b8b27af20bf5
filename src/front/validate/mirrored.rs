//! The headers a modern request mirrors its body in, as one table (which method must carry
//! which header, mirroring what) and one check of it (PROTOCOL.md §2.5, the tasks extension for
//! `tasks/*`). Balancers route by these headers, so the body and they must agree.

use std::borrow::Cow;

use base64::Engine;
use http::{HeaderMap, HeaderName};

use crate::error::ProxyError;
use crate::front::params::Params;
use crate::protocol::{META_VERSION, METHOD_HEADER, NAME_HEADER, VERSION_HEADER};

/// Every header that mirrors a body value, and the requests that must carry it
/// (PROTOCOL.md §2.5: `MCP-Protocol-Version` and `Mcp-Method` on every request, `Mcp-Name` on
/// the named ones, and on `tasks/*` as the tasks extension asks, so that a balancer can route
/// by it). A header missing, not matching its body value, sent twice or not decodable is
/// 400 + -32020; a header of a method not named here is not read.
static MIRRORED: [Mirror; 8] = [
    Mirror::every(VERSION_HEADER, "MCP-Protocol-Version", Mirrors::Version),
    Mirror::every(METHOD_HEADER, "Mcp-Method", Mirrors::Method),
    Mirror::name("tools/call", "name"),
    Mirror::name("prompts/get", "name"),
    Mirror::name("resources/read", "uri"),
    Mirror::name("tasks/get", "taskId"),
    Mirror::name("tasks/update", "taskId"),
    Mirror::name("tasks/cancel", "taskId"),
];

/// A row of `MIRRORED`.
#[derive(Debug)]
struct Mirror {
    /// The header.
    header: HeaderName,
    /// Its name as the spec writes it, for messages.
    label: &'static str,
    /// The method that must carry it; `None`: every request.
    method: Option<&'static str>,
    /// The body value it mirrors.
    mirrors: Mirrors,
}

/// A body value a header mirrors.
#[derive(Debug, Clone, Copy)]
enum Mirrors {
    /// `_meta["io.modelcontextprotocol/protocolVersion"]`.
    Version,
    /// The JSON-RPC method.
    Method,
    /// A string member of params (the request's target).
    Param(&'static str),
}

/// The one check of [`MIRRORED`]: each row of the method, in order, against its body value
/// (`version`: the `_meta` one). Returns the request's target (`""` when the method names
/// none).
///
/// # Errors
/// -32020 for a header missing, not matching, sent twice or not decodable; -32602 for a
/// target missing from the body.
pub(super) fn check(
    headers: &HeaderMap,
    (method, version): (&str, &str),
    params: &Params,
) -> Result<String, ProxyError> {
    let mut target = String::new();
    for row in MIRRORED
        .iter()
        .filter(|r| r.method.is_none_or(|m| m == method))
    {
        let body = match row.mirrors {
            Mirrors::Version => version,
            Mirrors::Method => method,
            Mirrors::Param(field) => {
                target = params
                    .string(field)
                    .ok_or_else(|| ProxyError::InvalidParams(format!("missing params.{field}")))?
                    .into_owned();
                &target
            }
        };
        let mut fields = headers.get_all(&row.header).iter();
        let value = match (fields.next(), fields.next()) {
            (Some(v), None) => decode_header_value(v.as_bytes()),
            (None, _) => {
                return Err(ProxyError::HeaderMismatch(format!(
                    "missing {} header: {method} must mirror {} in it",
                    row.label,
                    row.mirrors.describe()
                )))
            }
            // Sent twice: which one a balancer reads is anyone's guess.
            (Some(_), Some(_)) => None,
        };
        match value {
            Some(v) if v == body => {}
            Some(_) => {
                return Err(ProxyError::HeaderMismatch(format!(
                    "{} does not match {}",
                    row.label,
                    row.mirrors.describe()
                )))
            }
            None => {
                return Err(ProxyError::HeaderMismatch(format!(
                    "{} must be one value: plain ASCII, or =?base64?…?= of UTF-8",
                    row.label
                )))
            }
        }
    }
    Ok(target)
}

/// Decodes a mirrored header value: plain ASCII (borrowed), or `=?base64?…?=` holding UTF-8.
pub(crate) fn decode_header_value(raw: &[u8]) -> Option<Cow<'_, str>> {
    let s = std::str::from_utf8(raw).ok()?.trim();
    if let Some(b64) = s
        .strip_prefix("=?base64?")
        .and_then(|r| r.strip_suffix("?="))
    {
        let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
        return String::from_utf8(bytes).ok().map(Cow::Owned);
    }
    Some(Cow::Borrowed(s))
}

impl Mirror {
    const fn every(header: HeaderName, label: &'static str, mirrors: Mirrors) -> Self {
        Self {
            header,
            label,
            method: None,
            mirrors,
        }
    }

    const fn name(method: &'static str, field: &'static str) -> Self {
        Self {
            header: NAME_HEADER,
            label: "Mcp-Name",
            method: Some(method),
            mirrors: Mirrors::Param(field),
        }
    }
}

impl Mirrors {
    // The body value, as a message names it.
    fn describe(self) -> String {
        match self {
            Self::Version => format!("_meta[\"{META_VERSION}\"]"),
            Self::Method => "the method".to_owned(),
            Self::Param(field) => format!("params.{field}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::front::validate::tests::validate;
    use crate::jsonrpc::Message;
    use crate::protocol::{META_CAPABILITIES, MODERN_VERSION};

    // A request of `method` whose target (if it names one) is `target`, and the headers that
    // mirror it.
    fn request_of(method: &str, target: &str) -> (Message, Vec<(&'static str, String)>) {
        let field = MIRRORED.iter().find_map(|r| match r.mirrors {
            Mirrors::Param(f) if r.method == Some(method) => Some(f),
            _ => None,
        });
        let mut params = serde_json::json!({"_meta": {
            META_VERSION: MODERN_VERSION, META_CAPABILITIES: {}}});
        let mut pairs = vec![
            ("mcp-protocol-version", MODERN_VERSION.to_owned()),
            ("mcp-method", method.to_owned()),
        ];
        if let Some(field) = field {
            params[field] = Value::from(target);
            pairs.push(("mcp-name", target.to_owned()));
        }
        let body =
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        (Message::parse(body.to_string().as_bytes()).unwrap(), pairs)
    }

    fn map(pairs: &[(&'static str, String)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    // Every row of the table: its header missing, not matching, sent twice or undecodable is
    // -32020 on every method it names; the request with it right validates.
    #[test]
    fn every_mirrored_header_is_required_on_every_method_it_names() {
        let methods = ["tools/list", "server/discover"]
            .into_iter()
            .chain(MIRRORED.iter().filter_map(|r| r.method));
        for method in methods {
            let (msg, pairs) = request_of(method, "t-1");
            assert!(validate(&map(&pairs), msg).is_ok(), "{method}");
            for row in MIRRORED
                .iter()
                .filter(|r| r.method.is_none_or(|m| m == method))
            {
                let without: Vec<_> = pairs
                    .iter()
                    .filter(|(k, _)| *k != row.header)
                    .cloned()
                    .collect();
                let other = |v: &str| -> Vec<_> {
                    let mut p = without.clone();
                    p.push((row.header.as_str(), v.to_owned()));
                    p
                };
                let mut twice = pairs.clone();
                twice.push((
                    row.header.as_str(),
                    pairs
                        .iter()
                        .find(|(k, _)| *k == row.header)
                        .unwrap()
                        .1
                        .clone(),
                ));
                for (case, headers) in [
                    ("missing", without.clone()),
                    ("mismatching", other("t-2")),
                    ("not base64", other("=?base64?%%%?=")),
                    ("twice", twice),
                ] {
                    let (msg, _) = request_of(method, "t-1");
                    let e = validate(&map(&headers), msg).unwrap_err();
                    assert_eq!(
                        e.to_error_object().code,
                        -32020,
                        "{method} {} {case}: {e}",
                        row.label
                    );
                    assert_eq!(e.status(), http::StatusCode::BAD_REQUEST);
                }
            }
        }
        // A header of a method the table does not name is not read.
        let (msg, mut pairs) = request_of("tools/list", "");
        pairs.push(("mcp-name", "anything".into()));
        assert!(validate(&map(&pairs), msg).is_ok());
    }

    #[test]
    fn a_missing_task_id_is_invalid_params_and_a_base64_one_matches() {
        let (_, pairs) = request_of("tasks/get", "t-1");
        let m = Message::parse(
            br#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#,
        )
        .unwrap();
        let e = validate(&map(&pairs), m).unwrap_err();
        assert_eq!(e.to_error_object().code, -32602, "{e}");
        let (msg, mut pairs) = request_of("tasks/cancel", "tâche");
        pairs.retain(|(k, _)| *k != "mcp-name");
        let enc = base64::engine::general_purpose::STANDARD.encode("tâche");
        pairs.push(("mcp-name", format!("=?base64?{enc}?=")));
        assert_eq!(validate(&map(&pairs), msg).unwrap().target(), "tâche");
    }
}
