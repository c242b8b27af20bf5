//! The approval gate for legacy clients (relayed sessions): a `tools/call` of a gated tool on a
//! session whose `initialize` declared form elicitation is answered with an SSE stream on which
//! the proxy itself sends the approval as an inline `elicitation/create`, the way a legacy
//! server would; the client's answer (a POST on the same session) is taken here, not relayed.
//! Approved, the call goes upstream and its answer streams on; declined, the stream ends with an
//! `isError` result. A session that declared no elicitation, or a batch, is refused, and so is
//! a body that is not JSON (fail closed).

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};

use super::form::{audit, form, verdict, Verdict};
use crate::app::App;
use crate::body::{self, Body};
use crate::config::ApprovalRule;
use crate::edge::{self, SseWriter};
use crate::front::relay;
use crate::input::{self, InputKind};
use crate::jsonrpc::{self, ErrorObject};
use crate::ops::metrics::Decision;
use crate::protocol::{INVALID_REQUEST, PARSE_ERROR, SESSION_HEADER};
use crate::sse::SseDecoder;
use crate::state::random_id;

/// Bytes of randomness in the id of the proxy's own `elicitation/create`.
const REQUEST_ID_BYTES: usize = 9;

/// A legacy client's gated call, asked about inline.
struct Inline {
    session: String,
    id: Value,
    tool: String,
    arguments: Value,
    principal: String,
    headers: HeaderMap,
    bytes: Bytes,
}

/// A legacy POST, before it is relayed: the client's answer to the proxy's own request (taken:
/// 202), a call of a gated tool (asked inline, or refused), or `None`: relay it.
pub(crate) fn intercept(
    app: &Arc<App>,
    headers: &HeaderMap,
    bytes: &Bytes,
    principal: &str,
) -> Option<Response<Body>> {
    if !app.config.approval.is_enabled() {
        return None;
    }
    let session = headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok());
    if let Some(session) = session {
        app.legacy.seen(session);
    }
    let Ok(message) = serde_json::from_slice::<Value>(bytes) else {
        // Fail closed: a body this parser refuses might still read, to a laxer upstream parser
        // (NaN, lone surrogates), as a call of a gated tool.
        return Some(unreadable());
    };
    if let (Some(session), Some(id)) = (session, answer_id(&message)) {
        if app.legacy.answer(session, &id, message) {
            return Some(edge::empty(StatusCode::ACCEPTED));
        }
        return None;
    }
    let (id, tool, rule) = gated(app, &message)?;
    let one = message.is_object();
    match session.filter(|s| one && app.legacy.can_elicit(s)) {
        Some(session) => {
            let inline = Inline {
                session: session.to_owned(),
                id,
                tool: tool.to_owned(),
                arguments: message["params"]["arguments"].clone(),
                principal: principal.to_owned(),
                headers: headers.clone(),
                bytes: bytes.clone(),
            };
            let (writer, resp) = SseWriter::open(app.config.server.keepalive);
            let rule = rule.clone();
            tokio::spawn(ask(Arc::clone(app), writer, inline, rule));
            Some(resp)
        }
        None => Some(refuse(app, (principal, tool), rule, id)),
    }
}

/// Records the session a relayed `initialize` (`request`) opened, from its answer's headers.
pub(crate) fn observe_initialize(app: &App, request: &[u8], answer: &HeaderMap) {
    if !app.config.approval.is_enabled() {
        return;
    }
    let Some(session) = answer.get(SESSION_HEADER).and_then(|v| v.to_str().ok()) else {
        return;
    };
    let Ok(message) = serde_json::from_slice::<Value>(request) else {
        return;
    };
    if message["method"] != "initialize" {
        return;
    }
    let caps = &message["params"]["capabilities"];
    let elicits = input::check_capability(InputKind::Elicitation, None, caps).is_ok();
    app.legacy.record(session, elicits);
}

/// Forgets a session the client deleted.
pub(crate) fn forget_session(app: &App, headers: &HeaderMap) {
    if let Some(session) = headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok()) {
        app.legacy.forget(session);
    }
}

// A body that is not JSON, refused while tools are gated.
fn unreadable() -> Response<Body> {
    let error = ErrorObject {
        code: PARSE_ERROR,
        message: "the body is not JSON, and this proxy relays only what it can read while tools are gated".into(),
        data: None,
    };
    edge::json(
        StatusCode::BAD_REQUEST,
        HeaderMap::new(),
        jsonrpc::error_bytes(None, &error),
    )
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

// The first `tools/call` of a gated tool in `message` (or a batch): its id, tool and rule.
fn gated<'a>(app: &'a App, message: &'a Value) -> Option<(Value, &'a str, &'a ApprovalRule)> {
    let messages = match message {
        Value::Array(batch) => batch.iter().collect(),
        one => vec![one],
    };
    messages.into_iter().find_map(|m| {
        if m.get("method")? != "tools/call" {
            return None;
        }
        let tool = m.get("params")?.get("name")?.as_str()?;
        let rule = app.config.approval.rule_for(tool)?;
        Some((m.get("id").cloned().unwrap_or(Value::Null), tool, rule))
    })
}

// A gated call that cannot be asked about (no elicitation declared, or in a batch).
fn refuse(
    app: &App,
    (principal, tool): (&str, &str),
    rule: &ApprovalRule,
    id: Value,
) -> Response<Body> {
    audit(
        app,
        (principal, tool, &Value::Null),
        rule,
        Decision::LegacyRefused,
    );
    let error = ErrorObject {
        code: INVALID_REQUEST,
        message: format!(
            "the tool `{tool}` runs only after a person approves it, and this session did not declare elicitation (or sent it in a batch)"
        ),
        data: None,
    };
    let id = serde_json::value::to_raw_value(&id).ok();
    edge::json(
        StatusCode::OK,
        HeaderMap::new(),
        jsonrpc::error_bytes(id.as_deref(), &error),
    )
}

// Asks on the call's stream, waits (at most `state.ttl`) for the answer, then runs the call or
// ends with the decline.
async fn ask(app: Arc<App>, mut writer: SseWriter, call: Inline, rule: ApprovalRule) {
    let who = (call.principal.as_str(), call.tool.as_str(), &call.arguments);
    let request_id = format!("mrtr-approval-{}", random_id(REQUEST_ID_BYTES));
    let key = jsonrpc::text(&Value::String(request_id.clone()));
    let answer = app.legacy.expect(&call.session, &key);
    let elicit = json!({"jsonrpc": "2.0", "id": request_id, "method": "elicitation/create",
        "params": form(&rule, &call.arguments)});
    audit(&app, who, &rule, Decision::Asked);
    let waited = tokio::time::timeout(app.config.state.ttl, answer);
    let answered = match writer.send(jsonrpc::text(&elicit).as_bytes()).await {
        Ok(()) => writer.pump(waited).await,
        Err(gone) => Err(gone),
    };
    let Ok(Ok(Ok(message))) = answered else {
        // The client left, or never answered: the call does not run.
        app.legacy.abandon(&call.session, &key);
        return;
    };
    // An error, or an answer that is not a well-formed approval, declines.
    let approved = message
        .get("result")
        .map(|r| verdict(&rule, Some(r)))
        .is_some_and(|v| matches!(v, Ok(Verdict::Approved)));
    if !approved {
        audit(&app, who, &rule, Decision::Declined);
        let result =
            json!({"content": [{"type": "text", "text": rule.on_decline}], "isError": true});
        let done = json!({"jsonrpc": "2.0", "id": call.id, "result": result});
        let _ = writer.send(jsonrpc::text(&done).as_bytes()).await;
        return;
    }
    audit(&app, who, &rule, Decision::Approved);
    let id = call.id.clone();
    let ran = if app.pool.relays_legacy_clients() {
        run(&app, &mut writer, call).await
    } else {
        // The client's own session (a stdio or HTTP+SSE upstream).
        let on = (call.session.as_str(), call.principal.as_str());
        crate::front::bridge::run_on(&app, on, &call.bytes, &mut writer).await
    };
    if let Err(why) = ran {
        let error = ErrorObject {
            code: crate::protocol::INTERNAL_ERROR,
            message: why,
            data: None,
        };
        let id = serde_json::value::to_raw_value(&id).ok();
        let _ = writer
            .send(&jsonrpc::error_bytes(id.as_deref(), &error))
            .await;
    }
}

// Relays the approved call upstream and streams what it answers (SSE events, or one JSON
// message) on to the client.
async fn run(app: &App, writer: &mut SseWriter, call: Inline) -> Result<(), String> {
    let mut req = Request::post(app.pool.client().uri().clone())
        .body(body::full(call.bytes))
        .map_err(|e| e.to_string())?;
    *req.headers_mut() = call.headers;
    req.headers_mut().remove(http::header::CONTENT_LENGTH);
    let path = app.pool.client().uri().path().to_owned();
    let resp = relay::forward(app, req, &path)
        .await
        .map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("the upstream answered http {}", resp.status()));
    }
    let sse = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"));
    let max = app.config.upstream.max_sse_event_bytes;
    // Read frame by frame: `http_body_util::Limited`'s `Into<BoxError>` bound does not compile
    // in a spawned task (rust-lang/rust#102211).
    let mut body = resp.into_body();
    let mut decoder = SseDecoder::new(max);
    let mut json = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => return Err(e.to_string()),
        };
        let Some(data) = frame.data_ref() else {
            continue;
        };
        if !sse {
            if json.len() + data.len() > max {
                return Err("the upstream's answer is over upstream.max_sse_event".into());
            }
            json.extend_from_slice(data);
            continue;
        }
        for event in decoder.feed(data).map_err(|e| e.to_string())? {
            writer
                .send(event.data.as_bytes())
                .await
                .map_err(|_| "the client left".to_owned())?;
        }
    }
    if sse {
        return Ok(());
    }
    writer
        .send(&json)
        .await
        .map_err(|_| "the client left".to_owned())
}
