//! A legacy client in front of a stdio or HTTP+SSE upstream (see `bridge`): `initialize` opens
//! the client's own upstream session; each request's answer streams back on an SSE response with
//! what the upstream says meanwhile; answers and notifications go upstream (202); `GET` opens the
//! stream of what no request takes; `DELETE` ends the session. An unknown, ended or another
//! principal's session id gets 404, which tells a legacy client to initialize again.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::app::App;
use crate::auth::Principal;
use crate::body::Body;
use crate::bridge::{Bridged, Refused};
use crate::edge::{self, Settled, SseWriter};
use crate::error::ProxyError;
use crate::jsonrpc::{self, ErrorObject, Kind, Message};
use crate::ops::metrics::{Limit, Outcome, RequestTimer};
use crate::protocol::{INTERNAL_ERROR, SESSION_HEADER};
use crate::upstream::UpstreamError;

/// A legacy client's POST.
pub(super) async fn post(
    app: &Arc<App>,
    headers: &HeaderMap,
    bytes: &Bytes,
    who: &Principal,
    timer: RequestTimer,
) -> Response<Body> {
    let msg = match Message::parse(bytes) {
        Ok(m) => m,
        Err(e) => return edge::fail(timer, &ProxyError::from(e), None),
    };
    if msg.method() == "initialize" {
        return open(app, &msg, who, timer).await;
    }
    if !headers.contains_key(SESSION_HEADER) {
        let e = ProxyError::InvalidRequest("Mcp-Session-Id is required after initialize".into());
        return edge::fail(timer, &e, msg.id.as_deref());
    }
    let Some(session) = session_of(app, headers, who) else {
        return gone(timer);
    };
    match msg.kind() {
        Ok(Kind::Request) => request(app, session, &msg, timer).await,
        Ok(Kind::Response) => send(session, bytes.to_vec(), timer).await,
        Ok(Kind::Notification) => {
            let upstream = cancelled_upstream(&session, &msg).unwrap_or_else(|| bytes.to_vec());
            send(session, upstream, timer).await
        }
        Err(_) => {
            let e = ProxyError::InvalidRequest("neither request, notification nor response".into());
            edge::fail(timer, &e, None)
        }
    }
}

/// A legacy client's GET: the stream of what no request takes.
pub(super) fn get(
    app: &Arc<App>,
    headers: &HeaderMap,
    who: &Principal,
    timer: RequestTimer,
) -> Response<Body> {
    let Some(session) = session_of(app, headers, who) else {
        return gone(timer);
    };
    let Some(mut rx) = session.listen(64) else {
        let e = ProxyError::InvalidRequest("this session has a GET stream open already".into());
        let mut resp = edge::fail(timer, &e, None);
        *resp.status_mut() = StatusCode::CONFLICT;
        return resp;
    };
    let (mut writer, resp) = SseWriter::open(app.config.server.keepalive);
    let busy = session.hold();
    tokio::spawn(async move {
        let _busy = busy;
        // Ends with the session (its sender dropped) or when the client leaves.
        while let Ok(Some(message)) = writer.pump(rx.recv()).await {
            if writer.send(&message).await.is_err() {
                break;
            }
        }
    });
    edge::settle(timer, Settled::with(Outcome::Relayed));
    resp
}

/// A legacy client's DELETE: the session ends, its child is stopped.
pub(super) async fn delete(
    app: &Arc<App>,
    headers: &HeaderMap,
    who: &Principal,
    timer: RequestTimer,
) -> Response<Body> {
    let id = headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !app.bridge.end(id, &who.digest).await {
        return gone(timer);
    }
    edge::settle(timer, Settled::with(Outcome::Complete));
    edge::empty(StatusCode::OK)
}

fn session_of(app: &App, headers: &HeaderMap, who: &Principal) -> Option<Arc<Bridged>> {
    let id = headers.get(SESSION_HEADER)?.to_str().ok()?;
    app.bridge.get(id, &who.digest)
}

/// The code of "Session not found" (the SDKs' server transports use it).
const SESSION_NOT_FOUND: i64 = -32001;

// 404: the client must initialize again.
fn gone(timer: RequestTimer) -> Response<Body> {
    edge::settle(timer, Settled::with(Outcome::ClientError));
    let error = ErrorObject {
        code: SESSION_NOT_FOUND,
        message: "Session not found".into(),
        data: None,
    };
    edge::json(
        StatusCode::NOT_FOUND,
        HeaderMap::new(),
        jsonrpc::error_bytes(None, &error),
    )
}

/// What a legacy client gets when the bridge opens it no session: past the principal's bound,
/// which bound (503).
pub(super) fn refusal(app: &App, refused: &Refused) -> ProxyError {
    match refused {
        Refused::TooMany(n) => {
            app.metrics.limit_hit(Limit::PrincipalSessions);
            ProxyError::Overloaded(format!(
                "this principal holds as many legacy sessions as it may \
                 (server.max_legacy_sessions_per_principal = {n}); end one or retry later"
            ))
        }
    }
}

// `initialize`: a session of the client's own upstream, with its own `initialize`.
async fn open(
    app: &Arc<App>,
    msg: &Message,
    who: &Principal,
    timer: RequestTimer,
) -> Response<Body> {
    let Some(client_id) = msg.id.as_deref() else {
        let e = ProxyError::InvalidRequest("initialize is a request".into());
        return edge::fail(timer, &e, None);
    };
    // Held until the session is registered (or not opened).
    let _place = match app.bridge.admits(&who.digest) {
        Ok(place) => place,
        Err(refused) => return edge::fail(timer, &refusal(app, &refused), Some(client_id)),
    };
    let request = jsonrpc::request_bytes(0, "initialize", msg.params.as_deref());
    let (own, answer) = match app.pool.open_own(0, request, &who.credentials).await {
        Ok(opened) => opened,
        Err(e) => return edge::fail(timer, &ProxyError::Upstream(e), Some(client_id)),
    };
    let Some((answer, failed)) = with_client_id(&answer, client_id) else {
        own.close().await;
        let e = ProxyError::Internal("the upstream's answer to initialize is not JSON-RPC".into());
        return edge::fail(timer, &e, Some(client_id));
    };
    let mut headers = HeaderMap::new();
    if failed {
        own.close().await;
    } else {
        let (id, _) = app.bridge.register(&who.digest, own);
        if let Ok(v) = HeaderValue::from_str(&id) {
            headers.insert(SESSION_HEADER, v);
        }
    }
    edge::settle(timer, Settled::with(Outcome::Relayed));
    edge::json(StatusCode::OK, headers, answer)
}

// A request: sent with an id of the link's, answered on an SSE stream that also carries what
// the upstream says while it is open (its server requests, progress, logs).
async fn request(
    app: &Arc<App>,
    session: Arc<Bridged>,
    msg: &Message,
    timer: RequestTimer,
) -> Response<Body> {
    let Some(client_id) = msg.id.clone() else {
        return edge::fail(timer, &ProxyError::InvalidRequest("no id".into()), None);
    };
    let key = client_id.get().to_owned();
    let id = session.map_request(&key);
    let upstream = jsonrpc::request_bytes(id, msg.method(), msg.params.as_deref());
    let routed = match session.link().request(id, upstream).await {
        Ok(r) => r,
        Err(e) => {
            session.unmap(&key);
            return edge::fail(timer, &ProxyError::Upstream(e), Some(&client_id));
        }
    };
    let (mut writer, resp) = SseWriter::open(app.config.server.keepalive);
    let busy = session.hold();
    tokio::spawn(async move {
        let _busy = busy;
        stream_answer(routed.rx, id, &client_id, &mut writer).await;
        session.unmap(&key);
    });
    edge::settle(timer, Settled::with(Outcome::Relayed));
    resp
}

/// Runs a legacy client's request (its bytes) on its own session `session_id` and streams what
/// the upstream says until the answer onto `writer` (an approved call of the approval gate).
///
/// # Errors
/// Why the request could not be sent: the session ended ([`UpstreamError::SessionGone`]), a
/// body that is not a request, or the upstream's failure.
pub(crate) async fn run_on(
    app: &App,
    (session_id, principal): (&str, &str),
    bytes: &[u8],
    writer: &mut SseWriter,
) -> Result<(), ProxyError> {
    let session = app
        .bridge
        .get(session_id, principal)
        .ok_or(UpstreamError::SessionGone)?;
    let msg = Message::parse(bytes)?;
    let client_id = msg
        .id
        .clone()
        .ok_or_else(|| ProxyError::InvalidRequest("no id".into()))?;
    let key = client_id.get().to_owned();
    let id = session.map_request(&key);
    let upstream = jsonrpc::request_bytes(id, msg.method(), msg.params.as_deref());
    let routed = session.link().request(id, upstream).await.map_err(|e| {
        session.unmap(&key);
        ProxyError::Upstream(e)
    })?;
    let _busy = session.hold();
    stream_answer(routed.rx, id, &client_id, writer).await;
    session.unmap(&key);
    Ok(())
}

// What the upstream says while request `id` is open, then its answer with the client's id, onto
// `writer`; an upstream gone before the answer ends the stream with an error.
async fn stream_answer(
    mut rx: tokio::sync::mpsc::Receiver<Bytes>,
    id: i64,
    client_id: &RawValue,
    writer: &mut SseWriter,
) {
    loop {
        let out = match writer.pump(rx.recv()).await {
            Err(_) => return,
            Ok(None) => {
                let e = ErrorObject {
                    code: INTERNAL_ERROR,
                    message: "the upstream session ended".into(),
                    data: None,
                };
                let _ = writer
                    .send(&jsonrpc::error_bytes(Some(client_id), &e))
                    .await;
                return;
            }
            Ok(Some(bytes)) => bytes,
        };
        let answer = answer_to(&out, id).and_then(|()| with_client_id(&out, client_id));
        if let Some((answer, _)) = answer {
            let _ = writer.send(&answer).await;
            return;
        }
        if writer.send(&out).await.is_err() {
            return;
        }
    }
}

// A message the client says without expecting an answer: upstream as it is, 202.
async fn send(session: Arc<Bridged>, message: Vec<u8>, timer: RequestTimer) -> Response<Body> {
    match session.link().send(message).await {
        Ok(()) => {
            edge::settle(timer, Settled::with(Outcome::Relayed));
            edge::empty(StatusCode::ACCEPTED)
        }
        Err(e) => edge::fail(timer, &ProxyError::Upstream(e), None),
    }
}

// `notifications/cancelled` for a request in flight names it by its id upstream.
pub(super) fn cancelled_upstream(session: &Bridged, msg: &Message) -> Option<Vec<u8>> {
    if msg.method() != "notifications/cancelled" {
        return None;
    }
    let mut params = msg.params_value().ok()?;
    let client_id = serde_json::to_string(params.get("requestId")?).ok()?;
    let upstream = session.upstream_id(&client_id)?;
    params["requestId"] = Value::from(upstream);
    Some(jsonrpc::notification_bytes(msg.method(), &params))
}

// Whether `bytes` is the answer to the link's request `id`.
pub(super) fn answer_to(bytes: &[u8], id: i64) -> Option<()> {
    let m = Message::parse(bytes).ok()?;
    let answer = m.kind().ok()? == Kind::Response
        && m.id
            .as_ref()
            .and_then(|r| r.get().trim().parse::<i64>().ok())
            == Some(id);
    answer.then_some(())
}

// An answer with the client's id back in place, and whether it is an error.
pub(super) fn with_client_id(bytes: &[u8], client_id: &RawValue) -> Option<(Vec<u8>, bool)> {
    let m = Message::parse(bytes).ok()?;
    match (m.result, m.error) {
        (Some(result), _) => Some((jsonrpc::response_bytes(client_id, result.get()), false)),
        (None, Some(error)) => Some((jsonrpc::error_bytes(Some(client_id), &error), true)),
        (None, None) => None,
    }
}
