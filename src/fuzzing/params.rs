//! The differential target of the params readers (`front::params`: its `scan` for a modern
//! request's params, its `checked` walk for a gated body): the same bytes read by them and by
//! the oracle (`strict`: a tree, plus a check for keys named twice), which must agree on what is
//! taken and on what goes upstream; and the one-pass reader of a request body
//! (`Params::read_request`) against the two steps it stands for.

use http::HeaderMap;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::strict::{self, Read};
use crate::front::params::{check_body, Params};
use crate::jsonrpc::{Kind, Message};
use crate::protocol::{INVALID_PARAMS, INVALID_REQUEST, META_PREFIX, PARSE_ERROR};
use crate::trace_context::{Carried, TraceContext, KEYS as TRACE_KEYS};

/// Members of a modern request's params that never go upstream (modelled here on purpose: the
/// walker strips them, a tree keeps them).
const MODERN_ONLY: [&str; 3] = ["inputResponses", "requestState", "task"];

/// The params walker against a tree. The input is JSON text, read three ways: as the whole body
/// of a gated legacy message (`check_body`), as the `params` of a modern request (the
/// envelope's raw value, then `Params::parse`), and by the oracle (`serde_json::from_slice::<Value>`
/// and a visitor that refuses a key named twice). They must agree on what is refused, with which
/// code, and, where both take the text, on every member read and on the params written
/// upstream (compared as parsed values, the upstream's text itself read by the oracle: it names
/// no key twice).
///
/// The walker's intentional differences from a tree, each modelled here: a key named twice in
/// any object is refused (-32602 in params, -32600 in a body; a tree keeps the last), and so is
/// the key `$serde_json::private::RawValue` (a tree reads an object whose first key it is as the
/// JSON its string holds, which no other parser does: see `strict`); params
/// that are not an object are refused (-32602) and `null` is no params; upstream, the
/// modern-only members (`inputResponses`, `requestState`, `task`) are left out, `_meta` keeps
/// only its keys outside `io.modelcontextprotocol/` and other than the trace context's (which is
/// the checked context the walker's own `_meta` gives), is left out when empty, and is dropped
/// when not an object. What a tree refuses (a number out of range, a lone surrogate, nesting
/// past 128) is -32700 everywhere; the key named twice is what is wrong first when it comes
/// before the rest.
///
/// The input is also read as a whole request body, and as the params of one, by the one-pass
/// reader (`one_pass`).
pub fn params(data: &[u8]) {
    one_pass(data, None);
    let mut request = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"#.to_vec();
    request.extend_from_slice(data);
    request.push(b'}');
    one_pass(&request, Some(data.trim_ascii()));
    let expected = strict::read(data);
    body(data, &expected);
    // The envelope reads `params` as a raw value, which is laxer than a tree.
    let Ok(raw) = serde_json::from_slice::<Box<RawValue>>(data) else {
        assert!(
            !matches!(expected, Read::Value(_)),
            "the envelope refuses params a tree takes"
        );
        return;
    };
    let walked = Params::parse(Some(raw)).map_err(|e| e.to_error_object().code);
    match (expected, walked) {
        (Read::Malformed, Err(code)) => assert_eq!(code, PARSE_ERROR),
        (Read::Duplicate | Read::Reserved, Err(code)) => assert_eq!(code, INVALID_PARAMS),
        (Read::Value(Value::Object(members)), Ok(p)) => same_params(&members, &p),
        (Read::Value(Value::Null), Ok(p)) => same_params(&Map::new(), &p),
        (Read::Value(other), Err(code)) if !other.is_object() && !other.is_null() => {
            assert_eq!(code, INVALID_PARAMS, "params that are not an object");
        }
        (expected, walked) => {
            panic!("the walker and the oracle disagree: oracle {expected:?}, walker {walked:?}")
        }
    }
}

// The one-pass reader of a request body against the two steps it stands for (`Message::parse`,
// then `Params::parse`): it declines the body, or reads of it what they read (the same id,
// method and params, member by member), and only ever of a request they take. When the body is
// known to be of the common shape but for its params (`shaped`: their text), it declines none
// the two steps take.
fn one_pass(body: &[u8], shaped: Option<&[u8]>) {
    let fast = Params::read_request(body);
    let Ok(msg) = Message::parse(body) else {
        assert!(
            fast.is_none(),
            "the one pass took a body the envelope refuses"
        );
        return;
    };
    let request = msg.kind().ok() == Some(Kind::Request);
    let params_text = msg.params.as_ref().map(|p| p.get().as_bytes().to_vec());
    let (id, method) = (msg.id, msg.method);
    let slow = Params::parse(msg.params);
    match (fast, slow) {
        (None, Ok(_)) => assert!(
            !(request && shaped.is_some() && params_text.as_deref() == shaped),
            "the one pass declined a body of the common shape"
        ),
        (None, Err(_)) => {}
        (Some(fast), Ok(params)) if request => {
            assert_eq!(Some(fast.id.get()), id.as_deref().map(RawValue::get), "id");
            assert_eq!(Some(fast.method), method, "method");
            assert_eq!(fast.params, params, "params");
        }
        (Some(fast), slow) => {
            panic!("the one pass took what the two steps do not: {fast:?}, {slow:?}")
        }
    }
}

// The whole body of a gated legacy message: checked as params are, any JSON type.
fn body(data: &[u8], expected: &Read) {
    let checked = check_body(data).map_err(|e| e.to_error_object().code);
    let agreed = match expected {
        Read::Value(_) => checked.is_ok(),
        Read::Malformed => checked == Err(PARSE_ERROR),
        Read::Duplicate | Read::Reserved => checked == Err(INVALID_REQUEST),
    };
    assert!(
        agreed,
        "check_body says {checked:?}, the oracle {expected:?}"
    );
}

// What the walker read of `members` and wrote upstream, against the oracle's.
fn same_params(members: &Map<String, Value>, p: &Params) {
    for (key, value) in members.iter().filter(|(k, _)| *k != "_meta") {
        assert!(p.contains_key(key), "{key} is missing");
        assert_eq!(p.get::<Value>(key).as_ref(), Some(value), "member {key}");
    }
    let meta = members.get("_meta").and_then(Value::as_object);
    assert_eq!(p.contains_key("_meta"), meta.is_some(), "_meta");
    for (key, value) in meta.into_iter().flatten() {
        assert_eq!(p.meta::<Value>(key).as_ref(), Some(value), "_meta {key}");
    }
    // The trace context as `front::validate` takes it (no headers here).
    let (trace, _) = TraceContext::of(|k| p.meta_raw(k).map(Carried::of_json), &HeaderMap::new());
    let Some(text) = p.upstream(&trace) else {
        panic!("no upstream params");
    };
    let Read::Value(sent) = strict::read(text.as_bytes()) else {
        panic!("the upstream params do not read as one value: {}", &*text);
    };
    assert_eq!(sent, upstream(members, &trace), "the params sent upstream");
}

// The params the upstream must get, by the rules of `front::params` (see `params`).
fn upstream(members: &Map<String, Value>, trace: &TraceContext) -> Value {
    let mut out: Map<String, Value> = members
        .iter()
        .filter(|(k, _)| *k != "_meta" && !MODERN_ONLY.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut meta: Map<String, Value> = members
        .get("_meta")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(k, _)| !k.starts_with(META_PREFIX) && !TRACE_KEYS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (key, value) in trace.members() {
        meta.insert(key.to_owned(), Value::from(value));
    }
    if !meta.is_empty() {
        out.insert("_meta".into(), Value::Object(meta));
    }
    Value::Object(out)
}
