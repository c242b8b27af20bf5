//! The wire of a session, free of the session itself: what `initialize` needs and returns, the
//! Streamable HTTP handshake, the shape of every request to the upstream, and draining answers.

use std::sync::Arc;

use http::{header, HeaderValue, Method, Request};
use serde_json::{json, Value};

use crate::body;
use crate::jsonrpc::{self, Kind, Message};
use crate::protocol::{SESSION_HEADER, VERSION_HEADER};
use crate::upstream::changes::ChangeFeed;
use crate::upstream::client::{UpstreamClient, UpstreamError};
use crate::upstream::credentials::{Credentials, LiveCredentials};
use crate::upstream::declared::ExtensionHold;
use crate::upstream::link::Link;
use crate::upstream::stream::MessageStream;

/// A Streamable HTTP `initialize` that succeeded: the session id and the `InitializeResult`.
#[derive(Debug)]
pub(crate) struct Handshake {
    pub(super) id: Option<HeaderValue>,
    pub(super) result: Value,
}

/// What `initialize` needs to know.
#[derive(Debug)]
pub(crate) struct SessionParams {
    /// Capabilities declared upstream (legacy shape).
    pub(crate) capabilities: Value,
    /// What speaks for the principal upstream; shared with the session (and its link), which
    /// keeps the newest a leg brought.
    pub(crate) credentials: Arc<LiveCredentials>,
    /// Protocol version to ask for.
    pub(crate) protocol_version: String,
    /// Answer to unattributed `roots/list`.
    pub(crate) default_roots: Arc<Vec<Value>>,
    /// Where this session's change notifications go.
    pub(crate) changes: ChangeFeed,
    /// Its hold on the extension declaration it carries, if any (kept for its life).
    pub(crate) extensions: Option<ExtensionHold>,
}

// POSTs `initialize` declaring the capabilities; returns the session id and the InitializeResult.
pub(super) async fn handshake(
    client: &UpstreamClient,
    params: &SessionParams,
) -> Result<(Option<HeaderValue>, Value), UpstreamError> {
    let init = init_params(params);
    let body = jsonrpc::request_bytes(0, "initialize", jsonrpc::raw(&init).as_deref());
    let req = base_request(
        client,
        Method::POST,
        None,
        None,
        &params.credentials.current(),
    )
    .body(body::full(body))
    .map_err(|e| UpstreamError::Protocol(e.to_string()))?;
    let resp = client.send(req).await?;
    if !resp.status().is_success() {
        return Err(UpstreamError::from_status(&resp));
    }
    let id = crate::protocol::session_id_of(resp.headers());
    let mut stream = MessageStream::new(resp, client.max_event_bytes());
    Ok((id, initialize_result(&mut stream).await?))
}

// The `initialize` params declaring the client's capabilities.
pub(super) fn init_params(params: &SessionParams) -> Value {
    json!({
        "protocolVersion": params.protocol_version,
        "capabilities": params.capabilities,
        "clientInfo": {"name": "mrtr-proxy", "version": env!("CARGO_PKG_VERSION")},
    })
}

// Reads the `initialize` answer off its stream.
pub(super) async fn initialize_result(stream: &mut MessageStream) -> Result<Value, UpstreamError> {
    loop {
        let Some(msg) = stream.next().await else {
            return Err(UpstreamError::Closed);
        };
        let msg = Message::parse(&msg?).map_err(|e| UpstreamError::Protocol(e.to_string()))?;
        if msg.kind().ok() != Some(Kind::Response) {
            continue;
        }
        if let Some(err) = msg.error {
            return Err(UpstreamError::Protocol(format!(
                "initialize failed: {}",
                err.message
            )));
        }
        let raw = msg.result.as_ref().map_or("null", |r| r.get());
        return serde_json::from_str::<Value>(raw)
            .map_err(|e| UpstreamError::Protocol(e.to_string()));
    }
}

// Closes a link whose handshake failed (the child is stopped, the GET dropped), passing on why.
pub(super) async fn close_with(link: &Link, e: UpstreamError) -> UpstreamError {
    link.close().await;
    e
}

pub(crate) fn base_request(
    client: &UpstreamClient,
    method: Method,
    session: Option<&HeaderValue>,
    version: Option<&str>,
    credentials: &Credentials,
) -> http::request::Builder {
    // Names and fixed values made from static text: nothing parsed or copied per request; the
    // headers are set in place (each builder step moves the whole request head).
    let mut b = Request::builder()
        .method(method.clone())
        .uri(client.uri().clone());
    let version = match version {
        None => None,
        Some(v) => match HeaderValue::from_str(v) {
            Ok(v) => Some(v),
            // Not a header value: the builder carries the error, and the request fails on it.
            Err(_) => return b.header(VERSION_HEADER, v),
        },
    };
    if let Some(h) = b.headers_mut() {
        h.append(
            header::ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        if method == Method::POST {
            h.append(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        if let Some(s) = session {
            h.append(SESSION_HEADER, s.clone());
        }
        if let Some(v) = version {
            h.append(VERSION_HEADER, v);
        }
        credentials.append_to(h);
    }
    b
}

pub(super) async fn drain(
    resp: http::Response<crate::upstream::client::UpstreamBody>,
    deadline: std::time::Duration,
) -> Result<(), UpstreamError> {
    use http_body_util::BodyExt;
    let outcome = if resp.status().is_success() {
        Ok(())
    } else {
        Err(UpstreamError::from_status(&resp))
    };
    // Bounded in size and time: answers to notifications are empty; an upstream that never ends
    // one is left behind (the connection is dropped), not waited for.
    let body = http_body_util::Limited::new(resp.into_body(), 64 * 1024).collect();
    let _ = tokio::time::timeout(deadline, body).await;
    outcome
}
