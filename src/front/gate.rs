//! The one gate a client's call passes before the upstream sees it, whatever its era and way in
//! (modern `/mcp`, legacy `/mcp` relayed or bridged, the HTTP+SSE front's `/messages`):
//! `[auth.scopes]` (the token carries the scopes the tool needs) and `[approval]` (a person
//! approves a gated tool first). [`tool_call`] decides for one call; [`legacy`] reads a legacy
//! client's message (a batch member by member) and decides for each call in it. A front only
//! chooses how a gated legacy call is asked (on the call's SSE response, or on the HTTP+SSE
//! session's stream). The per-principal bounds are taken before any of this, on every way in
//! (`front::handle`: requests in flight; `bridge`: sessions).

use serde_json::Value;

use super::params;
use crate::app::App;
use crate::auth::Principal;
use crate::config::ApprovalRule;
use crate::error::ProxyError;
use crate::jsonrpc;

/// What the gate made of a legacy client's message.
#[derive(Debug)]
pub(crate) enum Legacy<'a> {
    /// Nothing in it is gated: it goes upstream as it came.
    Pass,
    /// A JSON-RPC response: the answer to a question of the proxy's own, when one is pending on
    /// its session (its id as JSON text, and the message); otherwise it goes upstream.
    Answer(String, Value),
    /// One `tools/call` of a gated tool: the person is asked first.
    Ask(GatedCall<'a>),
    /// A gated tool called in a batch, where nobody can be asked: refused.
    Refuse(GatedCall<'a>),
}

/// A legacy client's call of a gated tool.
#[derive(Debug)]
pub(crate) struct GatedCall<'a> {
    /// Its JSON-RPC id.
    pub(crate) id: Value,
    pub(crate) tool: String,
    pub(crate) arguments: Value,
    pub(crate) rule: &'a ApprovalRule,
}

/// Whether `who` may call `tool`: refused when the token lacks a scope `[auth.scopes]` names for
/// it; `Some(rule)` when a person must approve the call first.
///
/// # Errors
/// [`ProxyError::Unauthenticated`] (403 with the challenge) for a missing scope.
pub(super) fn tool_call<'a>(
    app: &'a App,
    who: &Principal,
    tool: &str,
) -> Result<Option<&'a ApprovalRule>, ProxyError> {
    app.auth
        .check_tool(who, tool)
        .map_err(ProxyError::Unauthenticated)?;
    Ok(app.config.approval.rule_for(tool))
}

/// Reads a legacy client's message `bytes` as the gate must: not at all when nothing is gated
/// (pass-through stays untouched), else whole — a body that is not JSON, or that names a key
/// twice, is refused (fail closed: a laxer upstream parser might read a gated call in it), and
/// every `tools/call` in it, batch members included, is checked.
///
/// # Errors
/// -32700 / -32600 for a body the gate cannot read as the upstream would; -32602 for a
/// `tools/call` without a tool name; [`ProxyError::Unauthenticated`] for a missing scope.
pub(crate) fn legacy<'a>(
    app: &'a App,
    who: &Principal,
    bytes: &[u8],
) -> Result<Legacy<'a>, ProxyError> {
    if app.auth.config().scopes.is_empty() && !app.config.approval.is_enabled() {
        return Ok(Legacy::Pass);
    }
    params::check_body(bytes)?;
    let message: Value =
        serde_json::from_slice(bytes).map_err(|e| ProxyError::Parse(e.to_string()))?;
    if let Some(id) = answer_id(&message) {
        return Ok(Legacy::Answer(id, message));
    }
    let (members, batch) = match &message {
        Value::Array(batch) => (batch.iter().collect::<Vec<_>>(), true),
        one => (vec![one], false),
    };
    let mut gated = None;
    for m in members {
        if m.get("method").and_then(Value::as_str) != Some("tools/call") {
            continue;
        }
        let Some(tool) = m.pointer("/params/name").and_then(Value::as_str) else {
            return Err(ProxyError::InvalidParams(
                "tools/call needs the tool's name, a string".into(),
            ));
        };
        let Some(rule) = tool_call(app, who, tool)? else {
            continue;
        };
        gated.get_or_insert_with(|| GatedCall {
            id: m.get("id").cloned().unwrap_or(Value::Null),
            tool: tool.to_owned(),
            arguments: m
                .pointer("/params/arguments")
                .cloned()
                .unwrap_or(Value::Null),
            rule,
        });
    }
    Ok(match gated {
        None => Legacy::Pass,
        Some(call) if batch => Legacy::Refuse(call),
        Some(call) => Legacy::Ask(call),
    })
}

// The id a JSON-RPC response answers, as JSON text (a message with no method, an id and a
// result or an error).
fn answer_id(message: &Value) -> Option<String> {
    let answers = message.get("method").is_none()
        && (message.get("result").is_some() || message.get("error").is_some());
    answers
        .then(|| message.get("id").map(jsonrpc::text))
        .flatten()
}
