//! An HTTP+SSE front session relayed to a Streamable HTTP upstream (a legacy session there): its
//! `initialize`, its messages and the upstream's GET stream onto the session's stream; and the
//! end of whatever a session opened upstream.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use crate::app::App;
use crate::auth::Principal;
use crate::body::{self, Body};
use crate::bridge::{Backend, SseClient};
use crate::edge;
use crate::error::ProxyError;
use crate::front::bridge::with_client_id;
use crate::jsonrpc::{self, Kind, Message};
use crate::upstream::{base_request, Credentials, MessageStream, UpstreamError};

// Ends what a session had opened upstream (a relayed session's DELETE goes with the
// principal's credentials, as its other requests did).
pub(super) async fn release(app: &App, backend: Backend, who: &Principal) {
    match backend {
        Backend::Own(own, _) => {
            app.bridge.end(&own, &who.digest).await;
        }
        Backend::Relayed(Some(session), version) => {
            let req = upstream_request(
                app,
                Method::DELETE,
                Some(&session),
                Some(&version),
                &who.credentials,
            );
            if let Ok(req) = req.body(body::empty()) {
                let _ = app.pool.client().send(req).await;
            }
        }
        Backend::Relayed(None, _) | Backend::None | Backend::Opening | Backend::Closed => {}
    }
}

// `initialize` relayed to a Streamable HTTP upstream: its session id and version kept, its
// answer and then its GET stream onto the client's stream.
pub(super) async fn initialize(
    app: &Arc<App>,
    client: Arc<SseClient>,
    msg: &Message,
    who: &Principal,
) -> Result<(), ProxyError> {
    let asked = msg
        .params_value()
        .ok()
        .and_then(|p| p["protocolVersion"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let body = jsonrpc::request_bytes(0, "initialize", msg.params.as_deref());
    let req = upstream_request(app, Method::POST, None, None, &who.credentials)
        .body(body::full(body))
        .map_err(|e| ProxyError::Internal(e.to_string()))?;
    let resp = app.pool.client().send(req).await?;
    if !resp.status().is_success() {
        return Err(UpstreamError::from_status(&resp).into());
    }
    let session = crate::protocol::session_id_of(resp.headers());
    let mut stream = MessageStream::new(resp, app.pool.client().max_event_bytes());
    let mut version = asked;
    let mut opened = false;
    while let Some(Ok(message)) = stream.next().await {
        let restored = msg
            .id
            .as_deref()
            .and_then(|id| with_client_id(&message, id));
        // The session is the client's before it reads the answer: its next POST may follow at
        // once.
        if matches!(restored, Some((_, false))) && !opened {
            version = negotiated(&message).unwrap_or(version);
            let backend = Backend::Relayed(session.clone(), version.clone());
            if let Err(opened) = client.set_backend(backend) {
                release(app, opened, who).await;
                return Ok(());
            }
            opened = true;
        }
        let message = restored.map_or(message, |(m, _)| Bytes::from(m));
        let _ = client.out.send(message).await;
    }
    if !opened {
        client.reset();
    } else if session.is_some() {
        relay_get_stream(app, &client, session, version, who.credentials.clone());
    }
    Ok(())
}

// The version an `initialize` answer negotiated.
fn negotiated(message: &[u8]) -> Option<String> {
    let m = Message::parse(message).ok()?;
    let result: serde_json::Value = serde_json::from_str(m.result?.get()).ok()?;
    result["protocolVersion"].as_str().map(str::to_owned)
}

// The upstream's GET stream (what it says outside requests) onto the client's stream.
fn relay_get_stream(
    app: &Arc<App>,
    client: &Arc<SseClient>,
    session: Option<HeaderValue>,
    version: String,
    credentials: Credentials,
) {
    let (app, out) = (Arc::clone(app), client.out.clone());
    tokio::spawn(async move {
        let req = upstream_request(
            &app,
            Method::GET,
            session.as_ref(),
            Some(&version),
            &credentials,
        )
        .body(body::empty());
        let Ok(mut req) = req else { return };
        req.headers_mut().insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        let Ok(resp) = app.pool.client().send_untimed(req).await else {
            return;
        };
        if !resp.status().is_success() {
            return;
        }
        let mut stream = MessageStream::new(resp, app.pool.client().max_event_bytes());
        loop {
            tokio::select! {
                next = stream.next() => match next {
                    Some(Ok(message)) => if out.send(message).await.is_err() { return },
                    _ => return,
                },
                () = out.closed() => return,
            }
        }
    });
}

// One message to a relayed Streamable HTTP session; what it answers goes on the stream. A
// request the upstream did not answer (unreachable, refused, the stream ended first) gets its
// error on the stream: its POST was answered 202 long ago.
pub(super) fn message(
    app: &Arc<App>,
    (client, permit): (&Arc<SseClient>, OwnedSemaphorePermit),
    (session, version): (Option<HeaderValue>, String),
    bytes: &Bytes,
    who: &Principal,
) {
    let req = upstream_request(
        app,
        Method::POST,
        session.as_ref(),
        Some(&version),
        &who.credentials,
    )
    .body(body::full(bytes.clone()));
    let id = Message::parse(bytes)
        .ok()
        .filter(|m| matches!(m.kind(), Ok(Kind::Request)))
        .and_then(|m| m.id);
    let (app, out) = (Arc::clone(app), client.out.clone());
    tokio::spawn(async move {
        let _permit = permit;
        let relayed = match req {
            Ok(req) => relay_answer(&app, req, id.as_deref(), &out).await,
            Err(e) => Err(ProxyError::Internal(e.to_string())),
        };
        if let (Err(e), Some(id)) = (relayed, id) {
            let error = edge::failed_in_stream(&app.metrics, &e, Some(&id));
            let _ = out.send(error).await;
        }
    });
}

// What the upstream answers `req` onto the stream; an error when request `id` got no answer.
async fn relay_answer(
    app: &App,
    req: http::Request<Body>,
    id: Option<&serde_json::value::RawValue>,
    out: &mpsc::Sender<Bytes>,
) -> Result<(), ProxyError> {
    let resp = app.pool.client().send(req).await?;
    if !resp.status().is_success() {
        return Err(UpstreamError::from_status(&resp).into());
    }
    let mut stream = MessageStream::new(resp, app.pool.client().max_event_bytes());
    let mut answered = id.is_none();
    while let Some(Ok(message)) = stream.next().await {
        answered = answered || id.is_some_and(|id| answers(&message, id));
        if out.send(message).await.is_err() {
            return Ok(());
        }
    }
    match answered {
        true => Ok(()),
        false => Err(UpstreamError::Closed.into()),
    }
}

// Whether `message` is the answer to request `id` (the same id, as JSON text).
fn answers(message: &[u8], id: &serde_json::value::RawValue) -> bool {
    Message::parse(message).is_ok_and(|m| {
        matches!(m.kind(), Ok(Kind::Response)) && m.id.as_deref().map(|i| i.get()) == Some(id.get())
    })
}

fn upstream_request(
    app: &App,
    method: Method,
    session: Option<&HeaderValue>,
    version: Option<&str>,
    credentials: &Credentials,
) -> http::request::Builder {
    let version = version.filter(|v| !v.is_empty());
    base_request(app.pool.client(), method, session, version, credentials)
}
