//! JSON-RPC 2.0 envelopes: just enough parsing to route a message.
//!
//! `params`, `result` and `error.data` stay raw (`Box<RawValue>`) so that bytes we do not touch are
//! forwarded as they came. Building whole messages for the client also lives here.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::protocol::INTERNAL_ERROR;

/// One incoming JSON-RPC message, parsed only down to its envelope.
#[derive(Debug, Deserialize)]
pub(crate) struct Message {
    /// Whether `jsonrpc` is `"2.0"` (it must be; checked by [`Message::parse`]). Compared as
    /// it is read: no string is kept.
    #[serde(default, deserialize_with = "deserialize_version")]
    jsonrpc: bool,
    /// Request or response id; absent on notifications.
    #[serde(default, deserialize_with = "deserialize_present")]
    pub(crate) id: Option<Box<RawValue>>,
    /// Present on requests and notifications.
    #[serde(default)]
    pub(crate) method: Option<String>,
    /// Request or notification params, untouched.
    #[serde(default)]
    pub(crate) params: Option<Box<RawValue>>,
    /// Successful response payload, untouched.
    #[serde(default)]
    pub(crate) result: Option<Box<RawValue>>,
    /// Error response payload.
    #[serde(default)]
    pub(crate) error: Option<ErrorObject>,
}

/// What kind of JSON-RPC message a [`Message`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Has `method` and `id`.
    Request,
    /// Has `method`, no `id`.
    Notification,
    /// Has `id` and `result` or `error`.
    Response,
}

/// A JSON-RPC error object; `data` stays raw.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ErrorObject {
    /// Error code.
    pub(crate) code: i64,
    /// Human-readable message.
    #[serde(default)]
    pub(crate) message: String,
    /// Optional structured data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) data: Option<Value>,
}

/// Why bytes are not a usable JSON-RPC message.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EnvelopeError {
    /// Not JSON at all (or not an object).
    #[error("invalid json: {0}")]
    Json(#[from] serde_json::Error),
    /// JSON, but not a JSON-RPC 2.0 message.
    #[error("not a json-rpc 2.0 message: {0}")]
    Shape(&'static str),
}

// `"jsonrpc"`: whether it is the string "2.0" (another type is an error).
fn deserialize_version<'de, D>(d: D) -> Result<bool, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct Version;
    impl serde::de::Visitor<'_> for Version {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<bool, E> {
            Ok(v == "2.0")
        }
    }
    d.deserialize_str(Version)
}

// An explicit `"id": null` is kept as `Some(null)` so it is not mistaken for a notification.
fn deserialize_present<'de, D>(d: D) -> Result<Option<Box<RawValue>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Box::<RawValue>::deserialize(d).map(Some)
}

impl Message {
    /// Parses one JSON-RPC 2.0 message (not a batch).
    ///
    /// # Errors
    /// [`EnvelopeError`] when the bytes are not JSON or not a JSON-RPC 2.0 message.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        let msg: Self = match serde_json::from_slice(bytes) {
            Ok(m) => m,
            // Valid JSON of the wrong shape (`"method": 5`, `"jsonrpc": 2`, an array) is an
            // invalid request (-32600), not a parse error (-32700).
            Err(e) if serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok() => {
                return Err(EnvelopeError::Shape(if e.is_data() {
                    "a member has the wrong type"
                } else {
                    "not a json-rpc object"
                }))
            }
            Err(e) => return Err(e.into()),
        };
        if !msg.jsonrpc {
            return Err(EnvelopeError::Shape("jsonrpc must be \"2.0\""));
        }
        if msg.id.as_deref().is_some_and(|id| !valid_id(id)) {
            return Err(EnvelopeError::Shape(
                "id must be a string, a number or null",
            ));
        }
        msg.kind()?;
        Ok(msg)
    }

    /// Classifies the message.
    ///
    /// # Errors
    /// [`EnvelopeError::Shape`] for a message that is neither request, notification nor response.
    pub(crate) fn kind(&self) -> Result<Kind, EnvelopeError> {
        match (
            &self.method,
            &self.id,
            self.result.is_some() || self.error.is_some(),
        ) {
            (Some(_), Some(id), false) if id.get() != "null" => Ok(Kind::Request),
            (Some(_), None, false) => Ok(Kind::Notification),
            (None, Some(_), true) => Ok(Kind::Response),
            _ => Err(EnvelopeError::Shape(
                "neither request, notification nor response",
            )),
        }
    }

    /// The method name, or `""` for responses.
    pub(crate) fn method(&self) -> &str {
        self.method.as_deref().unwrap_or("")
    }

    /// The params parsed as a JSON value (`Null` when absent).
    ///
    /// # Errors
    /// Never for params that came through [`Message::parse`]; kept fallible for safety.
    pub(crate) fn params_value(&self) -> Result<Value, serde_json::Error> {
        match &self.params {
            Some(raw) => serde_json::from_str(raw.get()),
            None => Ok(Value::Null),
        }
    }
}

/// Whether `raw` (an id from [`Message::parse`]: valid JSON) is `id` as JSON writes it. Read,
/// not formatted: of JSON's spellings, only `-0` parses to an integer it does not spell.
pub(crate) fn id_is(raw: &RawValue, id: i64) -> bool {
    let text = raw.get().trim();
    text.parse() == Ok(id) && text != "-0"
}

// JSON-RPC 2.0 §4: an id is a string, a number, or null; objects, arrays and booleans are not.
fn valid_id(id: &RawValue) -> bool {
    !matches!(
        id.get().trim_start().as_bytes().first(),
        Some(b'{' | b'[' | b't' | b'f')
    )
}

/// Serialises a successful response `{"jsonrpc":"2.0","id":…,"result":…}` from a raw result.
pub(crate) fn response_bytes(id: &RawValue, result: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(result.len() + id.get().len() + 32);
    out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    out.extend_from_slice(id.get().as_bytes());
    out.extend_from_slice(br#","result":"#);
    out.extend_from_slice(result.as_bytes());
    out.push(b'}');
    out
}

/// Serialises an error response. `id` is `null` when the request id is unknown.
pub(crate) fn error_bytes(id: Option<&RawValue>, error: &ErrorObject) -> Vec<u8> {
    let id = id.map_or("null", RawValue::get);
    let err = serde_json::to_string(error)
        .unwrap_or_else(|_| format!(r#"{{"code":{INTERNAL_ERROR},"message":"internal error"}}"#));
    format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{err}}}"#).into_bytes()
}

/// Serialises a notification from a method and params value (`null` params are left out).
pub(crate) fn notification_bytes(method: &str, params: &Value) -> Vec<u8> {
    let v = if params.is_null() {
        serde_json::json!({"jsonrpc":"2.0","method":method})
    } else {
        serde_json::json!({"jsonrpc":"2.0","method":method,"params":params})
    };
    text(&v).into_bytes()
}

/// Serialises a request with an integer id (used toward the upstream). `params` are written as
/// they are (no tree is built or copied); `None` or `null` leaves them out.
pub(crate) fn request_bytes(id: i64, method: &str, params: Option<&RawValue>) -> Vec<u8> {
    request_text_bytes(id, method, params.map(RawValue::get))
}

/// [`request_bytes`] with `params` as JSON text the proxy wrote itself.
pub(crate) fn request_text_bytes(id: i64, method: &str, params: Option<&str>) -> Vec<u8> {
    let method = serde_json::to_string(method).unwrap_or_default();
    let params = params.filter(|p| *p != "null");
    let mut out = Vec::with_capacity(48 + method.len() + params.map_or(0, str::len));
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id.to_string().as_bytes());
    out.extend_from_slice(b",\"method\":");
    out.extend_from_slice(method.as_bytes());
    if let Some(p) = params {
        out.extend_from_slice(b",\"params\":");
        out.extend_from_slice(p.as_bytes());
    }
    out.push(b'}');
    out
}

/// `v` as compact JSON text, written straight into one buffer: the one way the proxy makes JSON
/// text of a `Value`. (`Value`'s `Display`, behind `to_string()`, goes through the formatter
/// one small write at a time; `docs/BENCHMARKS.md` has what that cost.)
pub(crate) fn text(v: &Value) -> String {
    // A `Value` always serializes (its keys are strings).
    serde_json::to_string(v).unwrap_or_default()
}

/// `v` as raw JSON text (`None` only if it cannot be serialised, which a `Value` always can).
pub(crate) fn raw(v: &Value) -> Option<Box<RawValue>> {
    serde_json::value::to_raw_value(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_ours_only_as_json_writes_our_integer() {
        let id = |text: &str| {
            Message::parse(format!(r#"{{"jsonrpc":"2.0","id":{text},"result":{{}}}}"#).as_bytes())
                .unwrap()
                .id
                .unwrap()
        };
        for (text, ours) in [("7", 7), (" 7 ", 7), ("-3", -3), ("0", 0)] {
            assert!(id_is(&id(text), ours), "{text}");
        }
        for (text, ours) in [
            (r#""7""#, 7),
            ("7.0", 7),
            ("7e0", 7),
            ("70", 7),
            ("-0", 0),
            ("null", 0),
            ("99999999999999999999", 7),
        ] {
            assert!(!id_is(&id(text), ours), "{text}");
        }
    }

    #[test]
    fn request_bytes_are_valid_json_with_params_as_given() {
        let params = raw(&serde_json::json!({"name": "t", "arguments": {"a": [1, "\u{e9}"]}}));
        let bytes = request_bytes(7, "tools/\"call", params.as_deref());
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["id"], 7);
        assert_eq!(v["method"], "tools/\"call");
        assert_eq!(v["params"]["arguments"]["a"][1], "\u{e9}");
        let bare: Value = serde_json::from_slice(&request_bytes(1, "ping", None)).unwrap();
        assert_eq!(
            bare,
            serde_json::json!({"jsonrpc":"2.0","id":1,"method":"ping"})
        );
        let null = raw(&Value::Null);
        assert_eq!(
            request_bytes(1, "ping", null.as_deref()),
            request_bytes(1, "ping", None)
        );
    }

    #[test]
    fn classifies_request_notification_response() {
        let r = Message::parse(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#).unwrap();
        assert_eq!(r.kind().unwrap(), Kind::Request);
        assert_eq!(r.id.unwrap().get(), "1");
        let n = Message::parse(br#"{"method":"notifications/progress","jsonrpc":"2.0"}"#).unwrap();
        assert_eq!(n.kind().unwrap(), Kind::Notification);
        let s = Message::parse(br#"{"jsonrpc":"2.0","id":"a","result":{"x":[1, 2]}}"#).unwrap();
        assert_eq!(s.kind().unwrap(), Kind::Response);
        assert_eq!(
            s.result.unwrap().get(),
            r#"{"x":[1, 2]}"#,
            "raw bytes are kept"
        );
    }

    #[test]
    fn rejects_non_jsonrpc() {
        assert!(Message::parse(b"[1,2]").is_err());
        assert!(Message::parse(br#"{"id":1,"method":"x"}"#).is_err());
        assert!(Message::parse(br#"{"jsonrpc":"1.0","id":1,"method":"x"}"#).is_err());
        assert!(Message::parse(br#"{"jsonrpc":"2.0","id":null,"method":"x"}"#).is_err());
        assert!(Message::parse(br#"{"jsonrpc":"2.0"}"#).is_err());
        assert!(Message::parse(b"{").is_err());
    }

    #[test]
    fn wrong_types_are_invalid_requests_not_parse_errors() {
        for bad in [
            r#"{"jsonrpc":"2.0","id":1,"method":5}"#,
            r#"{"jsonrpc":2,"id":1,"method":"x"}"#,
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"x"}"#,
            r#"{"jsonrpc":"2.0","id":[1],"method":"x"}"#,
            r#"{"jsonrpc":"2.0","id":true,"method":"x"}"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"x"}]"#,
            "7",
        ] {
            assert!(
                matches!(Message::parse(bad.as_bytes()), Err(EnvelopeError::Shape(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            Message::parse(br#"{"jsonrpc":"2.0","id":1,"method":"x""#),
            Err(EnvelopeError::Json(_))
        ));
        for good in [r#""a""#, "1", "-2.5"] {
            let m = format!(r#"{{"jsonrpc":"2.0","id":{good},"method":"x"}}"#);
            assert!(Message::parse(m.as_bytes()).is_ok(), "{good}");
        }
    }

    #[test]
    fn builds_messages() {
        let id = RawValue::from_string("\"x\"".into()).unwrap();
        assert_eq!(
            String::from_utf8(response_bytes(&id, r#"{"a":1}"#)).unwrap(),
            r#"{"jsonrpc":"2.0","id":"x","result":{"a":1}}"#
        );
        let e = ErrorObject {
            code: -32602,
            message: "bad".into(),
            data: None,
        };
        let v: Value = serde_json::from_slice(&error_bytes(None, &e)).unwrap();
        assert_eq!(v["id"], Value::Null);
        assert_eq!(v["error"]["code"], -32602);
    }
}
