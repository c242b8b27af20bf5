//! The target of a legacy client's messages as the gate reads them (`front::gate`): the
//! HTTP+SSE front's `POST /messages` bodies, and legacy `/mcp` bodies (batches included).

use std::sync::{Arc, OnceLock};

use serde::Deserialize;
use serde_json::Value;

use super::strict::{self, Read};
use crate::app::App;
use crate::auth::Principal;
use crate::config::Config;
use crate::front::gate::{self, Legacy};
use crate::jsonrpc::{self, Kind, Message};
use crate::protocol::{INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR};

/// A legacy client's message, read by the gate of a proxy whose `[approval]` gates
/// `delete_repo` and `drop_*`. The input is the POST body. The gate must refuse what a tree
/// refuses (-32700), a key named twice and the key serde_json reserves (-32600), so no other
/// parser can read another message in it than the gate does; what it takes it must read as the oracle (`strict`) does: a response is an answer
/// under its id's JSON text; a `tools/call` without a string `name` is -32602; a call of a gated
/// tool is asked about (its id, name and arguments as sent), refused in a batch; anything else
/// passes. A passed message that the envelope reads as a request is read again as an SDK would
/// (typed params): it is no call of a gated tool; and its request re-framed under the proxy's
/// own id for the upstream (`jsonrpc::request_bytes`) carries the same method and params.
pub fn sse_messages(data: &[u8]) {
    let app = gated_app();
    let gated = gate::legacy(app, &Principal::anonymous(), data);
    let code = |e: &crate::error::ProxyError| e.to_error_object().code;
    match (strict::read(data), &gated) {
        (Read::Malformed, Err(e)) => assert_eq!(code(e), PARSE_ERROR),
        (Read::Duplicate | Read::Reserved, Err(e)) => assert_eq!(code(e), INVALID_REQUEST),
        (Read::Value(v), _) => {
            let got = gated.as_ref().map_err(code).map(|g| seen(g));
            assert_eq!(got, expected(app, &v), "the gate's reading of {v}");
        }
        (read, _) => panic!("the gate took {gated:?} what the oracle reads as {read:?}"),
    }
    if let Ok(Legacy::Pass) = gated {
        passed(app, data);
    }
}

/// What the gate made of a message, comparable.
#[derive(Debug, PartialEq)]
enum Seen {
    Pass,
    Answer(String),
    Ask(Value, String, Value),
    Refuse(String),
}

fn seen(g: &Legacy<'_>) -> Seen {
    match g {
        Legacy::Pass => Seen::Pass,
        Legacy::Answer(key, _) => Seen::Answer(key.clone()),
        Legacy::Ask(c) => Seen::Ask(c.id.clone(), c.tool.clone(), c.arguments.clone()),
        Legacy::Refuse(c) => Seen::Refuse(c.tool.clone()),
    }
}

// What the gate must make of `v` (JSON-RPC 2.0 §5, MCP `tools/call`).
fn expected(app: &App, v: &Value) -> Result<Seen, i64> {
    let answers =
        v.get("method").is_none() && (v.get("result").is_some() || v.get("error").is_some());
    if let (true, Some(id)) = (answers, v.get("id")) {
        return Ok(Seen::Answer(jsonrpc::text(id)));
    }
    let (members, batch) = match v {
        Value::Array(items) => (items.iter().collect(), true),
        one => (vec![one], false),
    };
    let mut first = None;
    for m in members {
        if m.get("method").and_then(Value::as_str) != Some("tools/call") {
            continue;
        }
        let Some(name) = m.pointer("/params/name").and_then(Value::as_str) else {
            return Err(INVALID_PARAMS);
        };
        if first.is_none() && app.config.approval.rule_for(name).is_some() {
            let id = m.get("id").cloned().unwrap_or(Value::Null);
            let arguments = m
                .pointer("/params/arguments")
                .cloned()
                .unwrap_or(Value::Null);
            first = Some((id, name.to_owned(), arguments));
        }
    }
    Ok(match first {
        None => Seen::Pass,
        Some((_, name, _)) if batch => Seen::Refuse(name),
        Some((id, name, arguments)) => Seen::Ask(id, name, arguments),
    })
}

// A message the gate passed, read as the upstream's side reads it.
fn passed(app: &App, data: &[u8]) {
    #[derive(Deserialize)]
    struct Call {
        name: String,
    }
    let Ok(msg) = Message::parse(data) else {
        return;
    };
    if msg.kind().ok() != Some(Kind::Request) {
        return;
    }
    if msg.method() == "tools/call" {
        let call = msg
            .params
            .as_deref()
            .map(|p| serde_json::from_str::<Call>(p.get()));
        if let Some(Ok(call)) = call {
            let gated = app.config.approval.rule_for(&call.name).is_some();
            assert!(!gated, "a call of {} passed the gate", call.name);
        }
    }
    let framed = jsonrpc::request_bytes(7, msg.method(), msg.params.as_deref());
    let Read::Value(framed) = strict::read(&framed) else {
        panic!("the re-framed request does not read as one value");
    };
    let Read::Value(sent) = strict::read(data) else {
        panic!("the gate passed what the oracle refuses");
    };
    assert_eq!(framed["method"], sent["method"], "re-framed method");
    let params = sent.get("params").filter(|p| !p.is_null());
    assert_eq!(framed.get("params"), params, "re-framed params");
}

// A proxy gating `delete_repo` and `drop_*` (built once).
fn gated_app() -> &'static App {
    static APP: OnceLock<Arc<App>> = OnceLock::new();
    APP.get_or_init(|| {
        let toml = "[upstream]\nurl = \"http://127.0.0.1:9/mcp\"\n\
            [approval.tools.delete_repo]\n[approval.tools.\"drop_*\"]\n";
        let app = Config::from_toml_str(toml).map(App::new);
        match app {
            Ok(Ok(app)) => app,
            _ => panic!("the fuzz target's own proxy does not start"),
        }
    })
}
