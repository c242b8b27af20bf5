//! One client exchange with a call ("leg"): the channel the actor writes to, and how the front
//! turns what arrives into an HTTP response — JSON when the final message comes first, SSE when a
//! notification comes first or the upstream stays quiet past the keep-alive interval.

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::body::{full, Body, ChannelBody};
use crate::error::ProxyError;
use crate::sse;

/// One client HTTP exchange with the call: the first request or a retry.
#[derive(Debug)]
pub struct Leg {
    /// The JSON-RPC id of this exchange.
    pub id: Box<RawValue>,
    /// Where the actor sends events.
    pub tx: mpsc::Sender<LegEvent>,
    /// `_meta.progressToken` of this exchange.
    pub progress_token: Option<Value>,
    /// `io.modelcontextprotocol/logLevel` of this exchange.
    pub log_level: Option<String>,
}

/// What the actor sends to the current leg.
#[derive(Debug)]
pub enum LegEvent {
    /// A request-scoped notification (already encoded JSON-RPC).
    Message(Bytes),
    /// The last message of this exchange.
    Done(Outcome),
}

/// The last message of an exchange and the HTTP status it implies when it comes first.
#[derive(Debug)]
pub struct Outcome {
    /// HTTP status if the response is still JSON.
    pub status: StatusCode,
    /// The JSON-RPC message.
    pub body: Bytes,
    /// Headers besides the content type (`Retry-After`, `WWW-Authenticate`).
    pub headers: http::HeaderMap,
}

impl Outcome {
    pub(super) fn error(err: &ProxyError, id: &RawValue) -> Self {
        Self {
            status: err.status(),
            body: err.to_body_bytes(Some(id)),
            headers: err.extra_headers(),
        }
    }
}

/// A new leg and the receiver the front answers the client from.
pub fn leg(
    id: Box<RawValue>,
    progress_token: Option<Value>,
    log_level: Option<String>,
) -> (Leg, mpsc::Receiver<LegEvent>) {
    let (tx, rx) = mpsc::channel(64);
    (
        Leg {
            id,
            tx,
            progress_token,
            log_level,
        },
        rx,
    )
}

/// Answers the client from a leg: JSON when the final message comes first, SSE when a
/// notification comes first or the upstream stays quiet longer than the keep-alive interval.
pub async fn respond(mut rx: mpsc::Receiver<LegEvent>, keepalive: Duration) -> Response<Body> {
    let first = tokio::time::timeout(keepalive, rx.recv()).await;
    let first = match first {
        Ok(Some(LegEvent::Done(out))) => return json_response(out),
        Ok(Some(LegEvent::Message(m))) => Some(m),
        Ok(None) => {
            return ProxyError::Internal("call ended without an answer".into()).into_response(None);
        }
        Err(_) => None,
    };
    let (body_tx, body) = ChannelBody::channel(16);
    tokio::spawn(async move {
        if let Some(m) = first {
            if body_tx.send(sse::encode_message(&m)).await.is_err() {
                return;
            }
        }
        let mut tick = tokio::time::interval_at(Instant::now() + keepalive, keepalive);
        loop {
            tokio::select! {
                ev = rx.recv() => match ev {
                    Some(LegEvent::Message(m)) => {
                        if body_tx.send(sse::encode_message(&m)).await.is_err() { return; }
                    }
                    Some(LegEvent::Done(out)) => {
                        let _ = body_tx.send(sse::encode_message(&out.body)).await;
                        return;
                    }
                    None => return,
                },
                _ = tick.tick() => {
                    if body_tx.send(sse::keepalive()).await.is_err() { return; }
                }
                // The client went away: dropping `rx` tells the actor to cancel upstream.
                () = body_tx.closed() => return,
            }
        }
    });
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

fn json_response(out: Outcome) -> Response<Body> {
    let mut resp = Response::new(full(out.body));
    *resp.status_mut() = out.status;
    *resp.headers_mut() = out.headers;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}
