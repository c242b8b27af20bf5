//! A modern request's params, read without building a tree: one pass (`scan`) checks them as a
//! tree would check them (and stricter: `checked` says which rules and why) and finds the
//! top-level members, and those of `_meta`, as spans of the params' text, parsed one by one
//! where a value is needed; the params sent upstream are written from that text. A plain
//! `tools/call` thus never holds its arguments as a `serde_json::Value` (the profile of issue
//! 26: the tree, its clone and its drop were a fifth of the call's instructions), and the text is
//! read once, not checked then split (issue 35). A request of the common shape has its envelope
//! read in the same pass (`envelope`), its body thus read once in all.

mod checked;
mod envelope;
mod plain;
mod scan;

use std::borrow::Cow;

use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use checked::Refused;
use scan::Member;

use crate::error::ProxyError;
use crate::protocol::META_PREFIX;
use crate::trace_context::{TraceContext, KEYS as TRACE_KEYS};

/// Members a modern request has that its legacy form does not: the retry's fields, and `task`
/// (task augmentation is not offered upstream: a 2025-11-25 upstream would answer with a legacy
/// task the client could not follow, so the call runs synchronously instead).
const MODERN_ONLY: [&str; 3] = ["inputResponses", "requestState", "task"];

/// A modern request's params: their text, read once (`scan`), and where its members are.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Params {
    /// The params as they came.
    text: Box<str>,
    /// The members but `_meta`, by key (as a `serde_json::Map` keeps them; a key named twice
    /// was refused).
    members: Vec<Member>,
    /// `_meta`'s members, when it is an object (a `_meta` of another type is dropped: the
    /// request is invalid without the protocol version in it).
    meta: Option<Vec<Member>>,
}

/// A modern request read in one pass ([`Params::read_request`]).
#[derive(Debug)]
pub(crate) struct Request {
    /// The JSON-RPC id, as written.
    pub(crate) id: Box<RawValue>,
    /// The method.
    pub(crate) method: String,
    /// The params, read as [`Params::parse`] reads them.
    pub(crate) params: Params,
}

/// Checks a whole JSON body as [`Params::parse`] checks params: what a tree would refuse, and no
/// object naming a key twice — so what the proxy reads of a body it gates is what any upstream
/// parser reads of it.
///
/// # Errors
/// -32700 for what is not JSON or a tree would refuse; -32600 for a key named twice or the key
/// serde_json reserves ([`checked`]).
pub(crate) fn check_body(json: &[u8]) -> Result<(), ProxyError> {
    let text = std::str::from_utf8(json).map_err(|e| ProxyError::Parse(e.to_string()))?;
    match checked::check(text) {
        Ok(()) => Ok(()),
        Err(Refused::Malformed(e)) => Err(ProxyError::Parse(e)),
        Err(Refused::DuplicateKey) => Err(ProxyError::InvalidRequest(
            "the message names a key twice in one object".into(),
        )),
        Err(Refused::ReservedKey) => Err(ProxyError::InvalidRequest(format!(
            "the message names the reserved key `{}`",
            checked::RESERVED_KEY
        ))),
    }
}

impl Params {
    /// Reads `raw` (absent or `null`: no members).
    ///
    /// # Errors
    /// -32700 for what a tree would refuse (a number out of range, a lone surrogate, nesting
    /// past serde_json's limit: the members are parsed later, as they are needed); -32602 for
    /// params that are not an object, or name a key twice in any object, or the key serde_json
    /// reserves ([`checked`]).
    pub(crate) fn parse(raw: Option<Box<RawValue>>) -> Result<Self, ProxyError> {
        let Some(raw) = raw.filter(|r| r.get() != "null") else {
            return Ok(Self::default());
        };
        let text: Box<str> = raw.into();
        match scan::scan(&text) {
            Ok(Some((members, meta))) => Ok(Self {
                text,
                members,
                meta,
            }),
            Ok(None) => Err(ProxyError::InvalidParams("params must be an object".into())),
            Err(Refused::Malformed(e)) => Err(ProxyError::Parse(e)),
            Err(Refused::DuplicateKey) => Err(ProxyError::InvalidParams(
                "params name a key twice in one object".into(),
            )),
            Err(Refused::ReservedKey) => Err(ProxyError::InvalidParams(format!(
                "params name the reserved key `{}`",
                checked::RESERVED_KEY
            ))),
        }
    }

    /// Reads a request body of the common shape (`envelope` says which) in one pass: what
    /// `Message::parse` then [`Params::parse`] read of it, the same. `None` for any other body,
    /// which they read (and whose faults they name).
    pub(crate) fn read_request(body: &[u8]) -> Option<Request> {
        let body = std::str::from_utf8(body).ok()?;
        let read = envelope::read(body)?;
        Some(Request {
            id: RawValue::from_string(read.id.to_owned()).ok()?,
            method: read.method.to_owned(),
            params: Self {
                text: read.params.into(),
                members: read.members,
                meta: read.meta,
            },
        })
    }

    /// Member `key`'s text.
    fn raw(&self, key: &str) -> Option<&str> {
        find(&self.text, &self.members, key)
    }

    /// Whether member `key` is there (`_meta` only as an object).
    pub(crate) fn contains_key(&self, key: &str) -> bool {
        self.raw(key).is_some() || (key == "_meta" && self.meta.is_some())
    }

    /// Member `key` as a `T`; `None` when absent or of another type.
    pub(crate) fn get<T: DeserializeOwned>(&self, key: &str) -> Option<T> {
        serde_json::from_str(self.raw(key)?).ok()
    }

    /// Member `key` when it is a string: borrowed from the params when it holds no escape.
    pub(crate) fn string(&self, key: &str) -> Option<Cow<'_, str>> {
        unquoted(self.raw(key)?)
    }

    /// `inputResponses`, the round's answers, read in one typed pass (none when absent).
    ///
    /// # Errors
    /// What to say when it is there but not an object.
    pub(crate) fn answers(&self) -> Result<Map<String, Value>, &'static str> {
        match self.raw("inputResponses") {
            None => Ok(Map::new()),
            Some(raw) => serde_json::from_str(raw).map_err(|_| "inputResponses must be an object"),
        }
    }

    /// `_meta[key]`'s text; `None` when absent.
    pub(crate) fn meta_raw(&self, key: &str) -> Option<&str> {
        find(&self.text, self.meta.as_ref()?, key)
    }

    /// `_meta[key]` when it is a string: borrowed from the params when it holds no escape.
    pub(crate) fn meta_string(&self, key: &str) -> Option<Cow<'_, str>> {
        unquoted(self.meta_raw(key)?)
    }

    /// `_meta[key]` as a `T`; `None` when absent or of another type.
    pub(crate) fn meta<T: DeserializeOwned>(&self, key: &str) -> Option<T> {
        serde_json::from_str(self.meta_raw(key)?).ok()
    }

    /// The params to send upstream: without the modern-only members and `_meta` keys, with the
    /// leg's trace context in `_meta` (checked: the client's own `traceparent`, `tracestate`
    /// and `baggage` members never go as they came); no `_meta` when nothing is left of it.
    /// Written from the members' text: what is kept reaches the upstream as it came.
    pub(crate) fn upstream(&self, trace: &TraceContext) -> Option<Box<str>> {
        let text = &*self.text;
        let mut out = Writer::with_capacity(text.len());
        for m in &self.members {
            if !MODERN_ONLY.contains(&m.key(text)) {
                out.member(m.key(text), m.value(text).as_bytes());
            }
        }
        let kept = self.meta.iter().flatten().filter(|m| {
            let k = m.key(text);
            !k.starts_with(META_PREFIX) && !TRACE_KEYS.contains(&k)
        });
        let mut meta = Writer::with_capacity(64);
        for m in kept {
            meta.member(m.key(text), m.value(text).as_bytes());
        }
        for (key, value) in trace.members() {
            meta.string(key, value);
        }
        if !meta.is_empty() {
            out.member("_meta", &meta.close());
        }
        // JSON by construction: every piece came checked from the params (not read again).
        String::from_utf8(out.close())
            .ok()
            .map(String::into_boxed_str)
    }
}

// A member's text as a string, when it is one: borrowed when it holds no escape.
fn unquoted(raw: &str) -> Option<Cow<'_, str>> {
    match raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        Some(plain) if !plain.contains('\\') => Some(Cow::Borrowed(plain)),
        _ => serde_json::from_str::<String>(raw).ok().map(Cow::Owned),
    }
}

// Member `key`'s text among `members` of `text`.
fn find<'t>(text: &'t str, members: &'t [Member], key: &str) -> Option<&'t str> {
    let m = members.iter().find(|m| m.key(text) == key)?;
    Some(m.value(text))
}

/// A JSON object being written member by member from text already JSON.
struct Writer(Vec<u8>);

impl Writer {
    fn with_capacity(n: usize) -> Self {
        let mut out = Vec::with_capacity(n + 2);
        out.push(b'{');
        Self(out)
    }

    fn member(&mut self, key: &str, value: &[u8]) {
        if self.0.len() > 1 {
            self.0.push(b',');
        }
        // A string always serializes; into a `Vec` nothing can fail.
        let _ = serde_json::to_writer(&mut self.0, key);
        self.0.push(b':');
        self.0.extend_from_slice(value);
    }

    fn string(&mut self, key: &str, value: &str) {
        let mut quoted = Vec::with_capacity(value.len() + 2);
        let _ = serde_json::to_writer(&mut quoted, value);
        self.member(key, &quoted);
    }

    fn is_empty(&self) -> bool {
        self.0.len() == 1
    }

    fn close(mut self) -> Vec<u8> {
        self.0.push(b'}');
        self.0
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    fn parse(text: &str) -> Params {
        let raw = RawValue::from_string(text.to_owned()).unwrap();
        Params::parse(Some(raw)).unwrap()
    }

    fn upstream(p: &Params, trace: &TraceContext) -> Value {
        serde_json::from_str(&p.upstream(trace).unwrap()).unwrap()
    }

    // What `Message::parse` then `Params::parse` read of `body`: id, method, params.
    fn two_steps(body: &str) -> Result<(String, String, Params), i64> {
        let msg = crate::jsonrpc::Message::parse(body.as_bytes()).map_err(|_| 0)?;
        let id = msg.id.as_ref().map_or("", |id| id.get()).to_owned();
        let method = msg.method.clone().unwrap_or_default();
        let params = Params::parse(msg.params).map_err(|e| e.to_error_object().code)?;
        Ok((id, method, params))
    }

    #[test]
    fn a_request_of_the_common_shape_is_read_in_one_pass_as_in_two_steps() {
        let meta = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","k":{"_meta":{"x":1}}}"#;
        for body in [
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"t",{meta}}}}}"#),
            format!(r#"{{"params":{{{meta},"name":"t"}},"method":"tools/call","id":"a-b","jsonrpc":"2.0"}}"#),
            format!(" \r\n{{ \"id\" :\t-0 , \"params\" : {{ {meta} }} ,\"jsonrpc\": \"2.0\",\n\"method\":\"x\" }}\n "),
            r#"{"jsonrpc":"2.0","id":123456789012345678901234,"method":"","params":{}}"#.into(),
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t\u00e9","requestState":"s","inputResponses":{"k":{"action":"accept","content":{"a":[1.5e3]}}},"_meta":{}}}"#.into(),
        ] {
            let Some(read) = Params::read_request(body.as_bytes()) else {
                panic!("declined: {body}");
            };
            let (id, method, params) = two_steps(&body).unwrap();
            assert_eq!((read.id.get(), read.method.as_str()), (id.as_str(), method.as_str()));
            assert_eq!(read.params, params, "{body}");
        }
    }

    #[test]
    fn any_other_body_is_declined_for_the_two_steps_to_judge() {
        // `P` stands for plain params; `Err(0)`: the envelope refused.
        for (other, judged) in [
            (r#""jsonrpc":"2.0","id":1,"method":"tools\/call",P"#, Ok(())),
            (r#""jsonrpc":"2.0","id":"\u0031","method":"x",P"#, Ok(())),
            (r#""jsonrpc":"2\u002e0","id":1,"method":"x",P"#, Ok(())),
            (r#""json\u0072pc":"2.0","id":1,"method":"x",P"#, Ok(())),
            (
                r#""jsonrpc":"2.0","id":1,"method":"x",P,"extra":[1]"#,
                Ok(()),
            ),
            (r#""jsonrpc":"2.0","id":1.0,"method":"x",P"#, Ok(())),
            (r#""jsonrpc":"2.0","id":1,"method":"x","id":2,P"#, Err(0)),
            (r#""jsonrpc":"2.0","id":null,"method":"x",P"#, Err(0)),
            (r#""jsonrpc":"2.0","id":01,"method":"x",P"#, Err(0)),
            (r#""jsonrpc":"2.0","id":-,"method":"x",P"#, Err(0)),
            (r#""jsonrpc":"1.0","id":1,"method":"x",P"#, Err(0)),
            (r#""id":1,"method":"x",P"#, Err(0)),
            (r#""jsonrpc":"2.0","id":1,"method":"x",P}{"#, Err(0)),
            (
                r#""jsonrpc":"2.0","id":1,"method":"x","params":{"a":1,"a":2}"#,
                Err(-32602),
            ),
            (
                r#""jsonrpc":"2.0","id":1,"method":"x","params":{"a":1e999}"#,
                Err(-32700),
            ),
            (
                r#""jsonrpc":"2.0","id":1,"method":"x","params":[1]"#,
                Err(-32602),
            ),
            (
                r#""jsonrpc":"2.0","id":1,"method":"x","params":null"#,
                Ok(()),
            ),
            (r#""jsonrpc":"2.0","id":1,"method":"x""#, Ok(())),
        ] {
            let other = format!("{{{}}}", other.replace('P', r#""params":{"name":"t"}"#));
            assert!(Params::read_request(other.as_bytes()).is_none(), "{other}");
            assert_eq!(two_steps(&other).map(drop), judged, "{other}");
        }
        let not_utf8 = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\",\"params\":{}}";
        assert!(Params::read_request(not_utf8).is_none());
    }

    #[test]
    fn members_are_read_one_by_one() {
        let p = parse(r#"{"name":"t","arguments":{"a":[1,"\u00e9"]},"_meta":{"progressToken":5}}"#);
        assert_eq!(p.get::<String>("name").as_deref(), Some("t"));
        assert_eq!(p.get::<String>("arguments"), None);
        assert_eq!(
            p.get::<Value>("arguments"),
            Some(serde_json::json!({"a":[1,"é"]}))
        );
        assert_eq!(p.meta::<i64>("progressToken"), Some(5));
        assert!(p.contains_key("_meta") && !p.contains_key("task"));
    }

    #[test]
    fn a_meta_of_another_type_is_none() {
        for meta in ["1", "\"x\"", "[1,{}]", "null", "true", "1.5"] {
            let p = parse(&format!(r#"{{"name":"t","_meta":{meta}}}"#));
            assert!(!p.contains_key("_meta"), "{meta}");
            assert_eq!(p.get::<String>("name").as_deref(), Some("t"));
        }
    }

    #[test]
    fn not_an_object_is_invalid_params_and_null_is_none() {
        let raw = RawValue::from_string("[1]".into()).unwrap();
        let e = Params::parse(Some(raw)).unwrap_err();
        assert_eq!(e.to_error_object().code, -32602);
        let null = RawValue::from_string("null".into()).unwrap();
        assert!(!Params::parse(Some(null)).unwrap().contains_key("name"));
        assert!(Params::parse(None)
            .unwrap()
            .meta::<Value>("progressToken")
            .is_none());
    }

    #[test]
    fn what_a_tree_refuses_is_a_parse_error_and_a_repeated_key_invalid_params() {
        let nested = |n: usize| format!(r#"{{"x":{}"[]{{\"}}"{}}}"#, "[".repeat(n), "]".repeat(n));
        let code = |text: String| {
            let raw = RawValue::from_string(text).unwrap();
            Params::parse(Some(raw))
                .map(|_| ())
                .map_err(|e| e.to_error_object().code)
        };
        assert_eq!(code(nested(126)), Ok(()));
        assert_eq!(code(nested(127)), Err(-32700));
        assert_eq!(code(r#"{"arguments":{"n":1e999}}"#.into()), Err(-32700));
        assert_eq!(code(r#"{"arguments":{"s":"\ud800"}}"#.into()), Err(-32700));
        let twice = r#"{"name":"t","arguments":{"path":"/etc/shadow","path":"/tmp/ok"}}"#;
        assert_eq!(code(twice.into()), Err(-32602));
    }

    #[test]
    fn the_answers_are_read_once_into_a_map_and_the_token_borrowed() {
        let p = parse(r#"{"requestState":"abc","inputResponses":{"k":{"action":"cancel"}}}"#);
        assert!(matches!(
            p.string("requestState"),
            Some(Cow::Borrowed("abc"))
        ));
        assert_eq!(
            p.answers().unwrap()["k"],
            serde_json::json!({"action":"cancel"})
        );
        let escaped = parse(r#"{"requestState":"a\u0062c","inputResponses":null}"#);
        assert_eq!(escaped.string("requestState").as_deref(), Some("abc"));
        assert_eq!(escaped.answers(), Err("inputResponses must be an object"));
        let other = parse(r#"{"requestState":5,"inputResponses":[]}"#);
        assert_eq!(other.string("requestState"), None);
        assert!(other.answers().is_err());
        assert_eq!(parse("{}").answers(), Ok(Map::new()));
    }

    #[test]
    fn upstream_params_strip_modern_fields() {
        let p = parse(
            r#"{"name":"t","requestState":"x","inputResponses":{},"task":{"ttl":1000},"_meta":{"progressToken":5,"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}"#,
        );
        assert_eq!(
            upstream(&p, &TraceContext::default()),
            serde_json::json!({"name":"t","_meta":{"progressToken":5}})
        );
        let bare = parse(
            r#"{"name":"t","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}"#,
        );
        assert_eq!(
            upstream(&bare, &TraceContext::default()),
            serde_json::json!({"name":"t"})
        );
        assert_eq!(
            upstream(&Params::default(), &TraceContext::default()),
            serde_json::json!({})
        );
    }

    #[test]
    fn kept_text_is_forwarded_as_it_came_and_the_trace_context_wins() {
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", tp.parse().unwrap());
        let (trace, _) = TraceContext::of(|_| None, &headers);
        let p = parse(
            r#"{"arguments":{"b": 1.50, "a":"\u00e9"},"_meta":{"traceparent":"old","k\"ey":1}}"#,
        );
        let text = p.upstream(&trace).unwrap();
        assert!(text.contains(r#"{"b": 1.50, "a":"\u00e9"}"#), "{}", text);
        assert_eq!(
            upstream(&p, &trace),
            serde_json::json!({"arguments":{"b":1.50,"a":"é"},"_meta":{"k\"ey":1,"traceparent":tp}})
        );
    }
}
