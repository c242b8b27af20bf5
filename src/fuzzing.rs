//! Entry points of the `cargo fuzz` targets in `fuzz/` and of the regression test that replays
//! their seeds and crash inputs (`tests/it/fuzz_regressions.rs`). Each takes arbitrary bytes,
//! drives one parser of attacker-controlled input, and panics only when one of its invariants
//! breaks (or the code under it panics, which is the bug being looked for).
//!
//! Not part of the supported API; public only so that the fuzz crate can reach it.

use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::config::Secret;
use crate::input::{self, Asked, InputKind};
use crate::jsonrpc::{Kind, Message};
use crate::sse::SseDecoder;
use crate::state::keys::{self, KeySet};
use crate::state::TokenCodec;

mod answers;
mod auth;
mod legacy;
mod params;
mod strict;
mod trace;

pub use answers::{approval_answer, tasks_update};
pub use auth::{bearer, introspection, jwks};
pub use legacy::sse_messages;
pub use params::params;
pub use trace::trace_context;

/// The SSE decoder: any bytes, fed whole or split at any point, give the same events (or the
/// same refusal), and never an event over the bound.
pub fn sse_decoder(data: &[u8]) {
    const MAX: usize = 1024;
    let Some((&split, stream)) = data.split_first() else {
        return;
    };
    let whole = SseDecoder::new(MAX).feed(stream);
    let at = usize::from(split).min(stream.len());
    let mut dec = SseDecoder::new(MAX);
    let split = dec.feed(&stream[..at]).and_then(|mut first| {
        first.extend(dec.feed(&stream[at..])?);
        Ok(first)
    });
    match (&whole, &split) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b, "splitting the stream changed its events");
            assert!(
                a.iter().all(|e| e.data.len() <= MAX),
                "an event over the bound"
            );
        }
        (Err(_), Err(_)) => {}
        // A bound hit in one feed may be hit one event later in two (the split decides when a
        // line is judged): then only the bound is checked on the side that decoded.
        (Ok(events), Err(_)) | (Err(_), Ok(events)) => {
            assert!(events.iter().all(|e| e.data.len() <= MAX));
        }
    }
}

/// The JSON-RPC envelope: parsing never panics, and what parses as a request or notification
/// has a string method, a response an id.
pub fn jsonrpc_envelope(data: &[u8]) {
    let Ok(msg) = Message::parse(data) else {
        return;
    };
    match msg.kind() {
        Ok(Kind::Request) => assert!(msg.id.is_some()),
        Ok(Kind::Response) => assert!(msg.id.is_some()),
        Ok(Kind::Notification) => assert!(msg.id.is_none()),
        Err(_) => {}
    }
    let _ = msg.params_value();
}

/// Modern request validation: the input is header lines (`name: value`), a blank line, then
/// the body. Never panics; what validates carries the modern version.
pub fn modern_headers(data: &[u8]) {
    let (head, body) = trace::split_head(data);
    for (_, value) in trace::header_fields(head) {
        let _ = crate::front::decode_mirrored(value);
    }
    let headers = trace::header_lines(head);
    let Ok(msg) = Message::parse(body) else {
        return;
    };
    let version = msg
        .params_value()
        .ok()
        .and_then(|p| p.get("_meta")?.get(crate::protocol::META_VERSION).cloned());
    if crate::front::validate_modern(&headers, msg) {
        assert_eq!(version, Some(Value::from(crate::protocol::MODERN_VERSION)));
    }
}

/// The requestState decoder: no input is accepted (nobody can sign without the key), and none
/// panics, whatever its size or shape.
pub fn request_state(data: &[u8]) {
    let Ok(token) = std::str::from_utf8(data) else {
        return;
    };
    let key = Secret::new("fuzzing-key-fuzzing-key-fuzzing-key!".into());
    let codec = TokenCodec::new(
        KeySet::new(keys::hs256(&key), Vec::new()),
        "fuzz".into(),
        Duration::from_secs(60),
    );
    assert!(
        codec.verify(token, "p", "r", SystemTime::now()).is_err(),
        "an unsigned input verified"
    );
}

/// The answer validator: the input is a `requestedSchema` and an answer, as one JSON array
/// `[schema, answer]`. Compiling and checking never panic, and a refusal never echoes a value
/// of the answer: a `content.secret` string holding the lock sign 🔒 (which no message of the
/// proxy's own contains) never appears in one.
pub fn answer(data: &[u8]) {
    let Ok(Value::Array(pair)) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let [schema, answer] = pair.as_slice() else {
        return;
    };
    let params = serde_json::json!({ "requestedSchema": schema });
    for kind in [
        InputKind::Elicitation,
        InputKind::Sampling,
        InputKind::Roots,
    ] {
        let asked = Asked {
            key: "k".into(),
            kind,
            schema: input::compile_schema(kind, Some(&params)),
        };
        if let Err(why) = asked.check(answer) {
            let secret = answer
                .pointer("/content/secret")
                .and_then(Value::as_str)
                .filter(|s| s.contains('\u{1f512}'));
            if let Some(secret) = secret {
                assert!(!why.contains(secret), "a refusal echoed the answer: {why}");
            }
        }
    }
}
