//! The 2024-11-05 HTTP+SSE transport on the front: `GET server.sse_path` opens a session's one
//! stream, whose first event (`endpoint`) names where to POST (`server.sse_messages_path` with
//! the session's id); each POST is answered 202 and everything the server says arrives on the
//! stream. Behind it the session is a legacy session upstream: the client's own (see `bridge`)
//! in front of a stdio or HTTP+SSE upstream, a relayed Streamable HTTP session in front of a
//! Streamable HTTP one. The session ends with its stream.

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::bridge::{answer_to, cancelled_upstream, refusal, with_client_id};
use super::gate::{self, Legacy};
use crate::app::App;
use crate::auth::Principal;
use crate::body::Body;
use crate::bridge::{Backend, Bridged, SseClient};
use crate::edge::{self, Settled, SseWriter};
use crate::error::ProxyError;
use crate::input::{self, InputKind};
use crate::jsonrpc::{self, ErrorObject, Kind, Message};
use crate::ops::metrics::{Outcome, RequestTimer};
use crate::protocol::INTERNAL_ERROR;
use crate::upstream::UpstreamError;

mod ask;
mod relayed;

/// Messages the stream may fall behind by before a producer waits.
const STREAM_BUFFER: usize = 64;

/// `GET server.sse_path`: a new session and its stream.
pub(super) fn open(app: &Arc<App>, who: &Principal, timer: RequestTimer) -> Response<Body> {
    if app.is_draining() {
        let e = ProxyError::Overloaded("the proxy is shutting down".into());
        return edge::fail(timer, &e, None);
    }
    let place = match app.bridge.admits(&who.digest) {
        Ok(place) => place,
        Err(refused) => return edge::fail(timer, &refusal(app, &refused), None),
    };
    let (out, mut rx) = mpsc::channel(STREAM_BUFFER);
    let id = app.bridge.open_sse(&who.digest, out);
    drop(place);
    let (mut writer, resp) = SseWriter::open(app.config.server.keepalive);
    let endpoint = format!("{}?sessionId={id}", app.config.server.sse_messages_path);
    let (app, who) = (Arc::clone(app), who.clone());
    tokio::spawn(async move {
        if writer.send_event("endpoint", &endpoint).await.is_ok() {
            while let Ok(Some(message)) = writer.pump(rx.recv()).await {
                if writer.send(&message).await.is_err() {
                    break;
                }
            }
        }
        end(&app, &id, &who).await;
    });
    edge::settle(timer, Settled::with(Outcome::Relayed));
    resp
}

// The stream ended: so does what was behind it.
async fn end(app: &App, id: &str, who: &Principal) {
    if let Some(client) = app.bridge.close_sse(id) {
        relayed::release(app, client.close(), who).await;
    }
}

/// `POST server.sse_messages_path?sessionId=…`: one message of the session's client. It passes
/// the same gate as on `/mcp` (scopes, approval) before anything goes upstream; a gated call is
/// asked about on the session's stream.
pub(super) async fn post(
    app: &Arc<App>,
    query: Option<&str>,
    bytes: &Bytes,
    who: &Principal,
    timer: RequestTimer,
) -> Response<Body> {
    let id = query
        .unwrap_or_default()
        .split('&')
        .find_map(|kv| kv.strip_prefix("sessionId="));
    let client = id.and_then(|id| app.bridge.sse(id, &who.digest).map(|c| (id, c)));
    // A session whose own upstream session died is over: its stream is being closed.
    let Some((id, client)) = client.filter(|(_, c)| !c.upstream_gone()) else {
        edge::settle(timer, Settled::with(Outcome::ClientError));
        return edge::text(StatusCode::NOT_FOUND, "session not found\n");
    };
    let msg = match Message::parse(bytes) {
        Ok(m) => m,
        Err(e) => return edge::fail(timer, &ProxyError::from(e), None),
    };
    let gated = match gate::legacy(app, who, bytes) {
        Ok(gated) => gated,
        Err(e) => return edge::fail(timer, &e, msg.id.as_deref()),
    };
    // The answer to a question of the proxy's own is taken here: it needs no place in flight
    // (the questions waiting hold theirs).
    let gated = match gated {
        Legacy::Answer(key, answer) => match client.answer(&key, answer) {
            true => return accepted(timer),
            false => Legacy::Pass,
        },
        other => other,
    };
    let Ok(permit) = Arc::clone(&client.in_flight).try_acquire_owned() else {
        let e = ProxyError::Overloaded("too many messages in flight for this session".into());
        return edge::fail(timer, &e, None);
    };
    let taken = match gated {
        Legacy::Pass | Legacy::Answer(..) => {
            carry(app, (id, &client, permit), &msg, bytes, who).await
        }
        Legacy::Ask(call) if client.elicits() => {
            let on = (Arc::clone(&client), permit);
            let asking = ask::Asking::of(call);
            let (app, who) = (Arc::clone(app), who.clone());
            tokio::spawn(ask_then_carry(app, on, who, asking, bytes.clone()));
            Ok(())
        }
        Legacy::Refuse(call) | Legacy::Ask(call) => {
            ask::refuse(app, &client, &who.digest, &call).await;
            Ok(())
        }
    };
    match taken {
        Ok(()) => accepted(timer),
        Err(e) => edge::fail(timer, &e, None),
    }
}

// 202: the message was taken; what it brings arrives on the stream.
fn accepted(timer: RequestTimer) -> Response<Body> {
    edge::settle(timer, Settled::with(Outcome::Relayed));
    edge::text(StatusCode::ACCEPTED, "Accepted\n")
}

// A message the gate let through: to the session's backend (its one `initialize` opens it).
async fn carry(
    app: &Arc<App>,
    (id, client, permit): (&str, &Arc<SseClient>, OwnedSemaphorePermit),
    msg: &Message,
    bytes: &Bytes,
    who: &Principal,
) -> Result<(), ProxyError> {
    match (msg.method(), client.backend()) {
        ("initialize", Backend::None) if client.begin() => {
            let opened = initialize(app, (id, Arc::clone(client)), msg, who).await;
            if opened.is_err() {
                client.reset();
            }
            opened
        }
        ("initialize", _) => Err(ProxyError::InvalidRequest(
            "this session is initialized already; open a new stream for another session".into(),
        )),
        (_, Backend::None | Backend::Opening | Backend::Closed) => {
            Err(ProxyError::InvalidRequest("initialize first".into()))
        }
        (_, Backend::Own(_, session)) => own_message((client, permit), &session, msg, bytes).await,
        (_, Backend::Relayed(session, version)) => {
            relayed::message(app, (client, permit), (session, version), bytes, who);
            Ok(())
        }
    }
}

// A gated call asked about on the session's stream; once approved, carried upstream as any
// message of the session (its answer on the stream too).
async fn ask_then_carry(
    app: Arc<App>,
    (client, permit): (Arc<SseClient>, OwnedSemaphorePermit),
    who: Principal,
    asking: ask::Asking,
    bytes: Bytes,
) {
    let id = serde_json::value::to_raw_value(&asking.id).ok();
    if !ask::approved(&app, &client, &who, asking).await {
        return;
    }
    let carried = match (Message::parse(&bytes), client.backend()) {
        (Ok(msg), Backend::Own(_, session)) => {
            own_message((&client, permit), &session, &msg, &bytes).await
        }
        (Ok(_), Backend::Relayed(session, version)) => {
            relayed::message(&app, (&client, permit), (session, version), &bytes, &who);
            Ok(())
        }
        (Ok(_), Backend::None | Backend::Opening | Backend::Closed) => {
            Err(UpstreamError::SessionGone.into())
        }
        (Err(e), _) => Err(e.into()),
    };
    if let Err(e) = carried {
        let error = edge::failed_in_stream(&app.metrics, &e, id.as_deref());
        let _ = client.out.send(error).await;
    }
}

// `initialize`: the session behind the stream, answered on the stream.
async fn initialize(
    app: &Arc<App>,
    (sse_id, client): (&str, Arc<SseClient>),
    msg: &Message,
    who: &Principal,
) -> Result<(), ProxyError> {
    let Some(client_id) = msg.id.clone() else {
        return Err(ProxyError::InvalidRequest("initialize is a request".into()));
    };
    client.set_elicits(declares_elicitation(msg));
    if app.pool.relays_legacy_clients_now().await {
        return relayed::initialize(app, client, msg, who).await;
    }
    let request = jsonrpc::request_bytes(0, "initialize", msg.params.as_deref());
    let (own, answer) = app.pool.open_own(0, request, &who.credentials).await?;
    let Some((answer, failed)) = with_client_id(&answer, &client_id) else {
        own.close().await;
        return Err(ProxyError::Internal(
            "the upstream's answer to initialize is not JSON-RPC".into(),
        ));
    };
    if failed {
        own.close().await;
        client.reset();
    } else {
        let (id, session) = app.bridge.register(&who.digest, own);
        if let Err(opened) = client.set_backend(Backend::Own(id, Arc::clone(&session))) {
            // The stream ended while the session opened: nobody will use it.
            relayed::release(app, opened, who).await;
            return Ok(());
        }
        listen(app, (sse_id, &client), &session);
    }
    let _ = client.out.send(Bytes::from(answer)).await;
    Ok(())
}

// Whether an `initialize` declares form elicitation.
fn declares_elicitation(msg: &Message) -> bool {
    msg.params_value().is_ok_and(|p| {
        input::check_capability(InputKind::Elicitation, None, &p["capabilities"]).is_ok()
    })
}

// What the client's own session says outside its requests goes on the stream too; when that
// session dies (its child exited), the HTTP+SSE session ends with it: the stream closes once
// the requests in flight got their errors, and the id answers 404.
fn listen(app: &Arc<App>, (sse_id, client): (&str, &Arc<SseClient>), session: &Arc<Bridged>) {
    let Some(mut rx) = session.listen(STREAM_BUFFER) else {
        return;
    };
    let (out, busy) = (client.out.clone(), session.hold());
    let (app, sse_id, session) = (Arc::clone(app), sse_id.to_owned(), Arc::clone(session));
    tokio::spawn(async move {
        let _busy = busy;
        while let Some(message) = rx.recv().await {
            if out.send(message).await.is_err() {
                break;
            }
        }
        if session.is_dead() {
            // Closed, not only forgotten: the questions pending on it end (their tasks hold the
            // stream's sender), so the stream closes.
            if let Some(client) = app.bridge.close_sse(&sse_id) {
                let _ = client.close();
            }
        }
    });
}

// One message to the client's own session; a request's answer (and what the upstream says
// while it is open) goes on the stream.
async fn own_message(
    (client, permit): (&Arc<SseClient>, OwnedSemaphorePermit),
    session: &Arc<Bridged>,
    msg: &Message,
    bytes: &Bytes,
) -> Result<(), ProxyError> {
    let Ok(Kind::Request) = msg.kind() else {
        let upstream = cancelled_upstream(session, msg).unwrap_or_else(|| bytes.to_vec());
        return session
            .link()
            .send(upstream)
            .await
            .map_err(ProxyError::Upstream);
    };
    let Some(client_id) = msg.id.clone() else {
        return Err(ProxyError::InvalidRequest("no id".into()));
    };
    let key = client_id.get().to_owned();
    let id = session.map_request(&key);
    let upstream = jsonrpc::request_bytes(id, msg.method(), msg.params.as_deref());
    let routed = match session.link().request(id, upstream).await {
        Ok(r) => r,
        Err(e) => {
            session.unmap(&key);
            return Err(ProxyError::Upstream(e));
        }
    };
    let (out, session, busy) = (client.out.clone(), Arc::clone(session), session.hold());
    tokio::spawn(async move {
        let _held = (busy, permit);
        let mut rx = routed.rx;
        loop {
            let Some(message) = rx.recv().await else {
                // The upstream went away before the answer.
                let e = ErrorObject {
                    code: INTERNAL_ERROR,
                    message: "the upstream session ended".into(),
                    data: None,
                };
                let _ = out
                    .send(jsonrpc::error_bytes(Some(&client_id), &e).into())
                    .await;
                break;
            };
            let answer =
                answer_to(&message, id).and_then(|()| with_client_id(&message, &client_id));
            let done = answer.is_some();
            let message = answer.map_or(message, |(a, _)| Bytes::from(a));
            if out.send(message).await.is_err() || done {
                break;
            }
        }
        session.unmap(&key);
    });
    Ok(())
}
