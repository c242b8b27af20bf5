//! The approval gate for legacy clients: a `tools/call` of a gated tool (the gate's verdict,
//! `front::gate`) is answered with an SSE stream on which the proxy itself sends the approval
//! as an inline `elicitation/create`, the way a legacy server would, when the session's
//! `initialize` declared form elicitation; the client's answer (a POST on the same session) is
//! taken here, not relayed. Approved, the call goes upstream — through the one relay that
//! applies the principal's credentials policy — and its answer streams on; declined, the stream
//! ends with an `isError` result. A session that declared no elicitation, or a batch, is
//! refused. The HTTP+SSE front asks on its session's stream with the same [`Question`].

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};

use super::form::{audit, form, verdict, Verdict};
use crate::app::App;
use crate::auth::Principal;
use crate::body::{self, Body};
use crate::config::ApprovalRule;
use crate::edge::{self, SseWriter};
use crate::error::ProxyError;
use crate::front::gate::{GatedCall, Legacy};
use crate::front::relay::{self, Behalf};
use crate::input::{self, InputKind};
use crate::jsonrpc::{self, ErrorObject};
use crate::ops::metrics::Decision;
use crate::protocol::{INVALID_REQUEST, SESSION_HEADER};
use crate::sse::SseDecoder;
use crate::state::random_id;
use crate::upstream::UpstreamError;

/// Bytes of randomness in the id of the proxy's own `elicitation/create`.
const REQUEST_ID_BYTES: usize = 9;

/// A legacy client's gated call on `/mcp`, asked about inline.
struct Inline {
    session: String,
    id: Value,
    tool: String,
    arguments: Value,
    who: Principal,
    headers: HeaderMap,
    bytes: Bytes,
}

/// The proxy's own question about a gated call: the `elicitation/create` it sends, and its id
/// as JSON text (the key its answer is taken under).
#[derive(Debug)]
pub(crate) struct Question {
    pub(crate) key: String,
    pub(crate) message: Vec<u8>,
}

impl Question {
    /// The approval form of `rule` about a call with `arguments`, under a fresh id.
    pub(crate) fn new(rule: &ApprovalRule, arguments: &Value) -> Self {
        let request_id = format!("mrtr-approval-{}", random_id(REQUEST_ID_BYTES));
        let message = json!({"jsonrpc": "2.0", "id": request_id, "method": "elicitation/create",
            "params": form(rule, arguments)});
        Self {
            key: jsonrpc::text(&Value::String(request_id)),
            message: jsonrpc::text(&message).into_bytes(),
        }
    }
}

/// Audits that the person is asked about `who`'s `call`.
pub(crate) fn asked(app: &App, principal: &str, call: &GatedCall<'_>) {
    let on = (principal, call.tool.as_str(), &call.arguments);
    audit(app, on, call.rule, Decision::Asked);
}

/// What the person's answer (a JSON-RPC response; an error, or anything but a well-formed
/// approval, declines) decides about `who`'s call, audited; `Some` is the declined call's
/// result, answering the call's own id.
pub(crate) fn decided(
    app: &App,
    (principal, call): (&str, &GatedCall<'_>),
    answer: &Value,
) -> Option<Vec<u8>> {
    let rule = call.rule;
    let on = (principal, call.tool.as_str(), &call.arguments);
    let approved = answer
        .get("result")
        .map(|r| verdict(rule, Some(r)))
        .is_some_and(|v| matches!(v, Ok(Verdict::Approved)));
    if approved {
        audit(app, on, rule, Decision::Approved);
        return None;
    }
    audit(app, on, rule, Decision::Declined);
    let result = json!({"content": [{"type": "text", "text": rule.on_decline}], "isError": true});
    let done = json!({"jsonrpc": "2.0", "id": call.id, "result": result});
    Some(jsonrpc::text(&done).into_bytes())
}

/// A legacy POST on `/mcp` as the gate read it: the client's answer to the proxy's own request
/// (taken: 202), a call of a gated tool (asked inline, or refused), or `None`: relay it.
pub(crate) fn on_mcp(
    app: &Arc<App>,
    (headers, bytes): (&HeaderMap, &Bytes),
    who: &Principal,
    gated: Legacy<'_>,
) -> Option<Response<Body>> {
    let session = headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok());
    if let Some(session) = session.filter(|_| app.config.approval.is_enabled()) {
        app.inline_asks.seen(session);
    }
    let call = match gated {
        Legacy::Pass => return None,
        Legacy::Answer(id, message) => {
            let key = answer_key(&who.digest, &id);
            let taken = session.is_some_and(|s| app.inline_asks.answer(s, &key, message));
            return taken.then(|| edge::empty(StatusCode::ACCEPTED));
        }
        Legacy::Refuse(call) => return Some(refuse(app, &who.digest, &call)),
        Legacy::Ask(call) => call,
    };
    let Some(session) = session.filter(|s| app.inline_asks.can_elicit(s)) else {
        return Some(refuse(app, &who.digest, &call));
    };
    let (writer, resp) = SseWriter::open(app.config.server.keepalive);
    let rule = call.rule.clone();
    let inline = Inline {
        session: session.to_owned(),
        id: call.id,
        tool: call.tool,
        arguments: call.arguments,
        who: who.clone(),
        headers: headers.clone(),
        bytes: bytes.clone(),
    };
    tokio::spawn(ask(Arc::clone(app), writer, inline, rule));
    Some(resp)
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
    app.inline_asks.record(session, elicits);
}

/// Forgets a session the client deleted.
pub(crate) fn forget_session(app: &App, headers: &HeaderMap) {
    if let Some(session) = headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok()) {
        app.inline_asks.forget(session);
    }
}

// A gated call that cannot be asked about (no elicitation declared, or in a batch).
pub(crate) fn refuse(app: &App, principal: &str, call: &GatedCall<'_>) -> Response<Body> {
    edge::json(
        StatusCode::OK,
        HeaderMap::new(),
        refusal(app, principal, call),
    )
}

/// The error a gated call that cannot be asked about gets (no elicitation declared, or in a
/// batch), audited.
pub(crate) fn refusal(app: &App, principal: &str, call: &GatedCall<'_>) -> Vec<u8> {
    let tool = call.tool.as_str();
    audit(
        app,
        (principal, tool, &Value::Null),
        call.rule,
        Decision::LegacyRefused,
    );
    let error = ErrorObject {
        code: INVALID_REQUEST,
        message: format!(
            "the tool `{tool}` runs only after a person approves it, and this session did not declare elicitation (or sent it in a batch)"
        ),
        data: None,
    };
    let id = serde_json::value::to_raw_value(&call.id).ok();
    jsonrpc::error_bytes(id.as_deref(), &error)
}

// Asks on the call's stream, waits (at most `state.ttl`) for the answer, then runs the call or
// ends with the decline.
async fn ask(app: Arc<App>, mut writer: SseWriter, call: Inline, rule: ApprovalRule) {
    let question = Question::new(&rule, &call.arguments);
    // Keyed by the principal too: only the client that was asked can answer.
    let key = answer_key(&call.who.digest, &question.key);
    let answer = app.inline_asks.expect(&call.session, &key);
    let gated = GatedCall {
        id: call.id.clone(),
        tool: call.tool.clone(),
        arguments: call.arguments.clone(),
        rule: &rule,
    };
    let principal = call.who.digest.clone();
    asked(&app, &principal, &gated);
    let waited = tokio::time::timeout(app.config.state.ttl, answer);
    let answered = match writer.send(&question.message).await {
        Ok(()) => writer.pump(waited).await,
        Err(gone) => Err(gone),
    };
    let Ok(Ok(Ok(message))) = answered else {
        // The client left, or never answered: the call does not run.
        app.inline_asks.abandon(&call.session, &key);
        return;
    };
    if let Some(declined) = decided(&app, (&principal, &gated), &message) {
        let _ = writer.send(&declined).await;
        return;
    }
    let id = serde_json::value::to_raw_value(&call.id).ok();
    let ran = if app.pool.relays_legacy_clients() {
        run(&app, &mut writer, call).await
    } else {
        // The client's own session (a stdio or HTTP+SSE upstream).
        let on = (call.session.as_str(), principal.as_str());
        crate::front::bridge::run_on(&app, on, &call.bytes, &mut writer).await
    };
    if let Err(e) = ran {
        let error = edge::failed_in_stream(&app.metrics, &e, id.as_deref());
        let _ = writer.send(&error).await;
    }
}

// Relays the approved call upstream on behalf of its principal and streams what it answers
// (SSE events, or one JSON message) on to the client; a client gone meanwhile ends it quietly.
async fn run(app: &App, writer: &mut SseWriter, call: Inline) -> Result<(), ProxyError> {
    let mut req = Request::post(app.pool.client().uri().clone())
        .body(body::full(call.bytes))
        .map_err(|e| ProxyError::Internal(e.to_string()))?;
    *req.headers_mut() = call.headers;
    req.headers_mut().remove(http::header::CONTENT_LENGTH);
    let path = app.pool.client().uri().path().to_owned();
    let resp = relay::forward(app, req, &path, Behalf::Of(&call.who)).await?;
    if !resp.status().is_success() {
        return Err(UpstreamError::from_status(&resp).into());
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
        let frame = frame.map_err(|e| {
            tracing::debug!(error = %e, "the approved call's upstream stream broke");
            UpstreamError::Closed
        })?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        if !sse {
            if json.len() + data.len() > max {
                return Err(UpstreamError::Protocol(
                    "the upstream's answer is over upstream.max_sse_event".into(),
                )
                .into());
            }
            json.extend_from_slice(data);
            continue;
        }
        for event in decoder.feed(data).map_err(UpstreamError::from)? {
            if writer.send(event.data.as_bytes()).await.is_err() {
                return Ok(());
            }
        }
    }
    if !sse {
        let _ = writer.send(&json).await;
    }
    Ok(())
}

// What an answer to the proxy's question is awaited under, beside its session: the principal
// asked and the question's id (JSON text).
fn answer_key(principal: &str, id: &str) -> String {
    format!("{principal}\0{id}")
}
