//! One legacy upstream session: `initialize` with the client's capabilities, the standalone GET
//! stream kept open, and the plumbing to send requests, notifications and answers on it (a
//! request the proxy makes for itself, with its reply read, is `request`'s).
//!
//! Server requests arriving on the GET stream go to whichever call currently leases the session
//! (its inbox); `ping` and requests that belong to no call are answered here.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_channel::mpsc::UnboundedSender;
use http::{header, HeaderValue, Method, StatusCode};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use tokio::sync::{Notify, OwnedSemaphorePermit};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::changes::{is_change, ChangeFeed};
use super::client::{UpstreamClient, UpstreamError};
use super::credentials::{Credentials, LiveCredentials};
use super::declared::ExtensionHold;
use super::link::{Link, Owner, SinkFuture};
use super::stream::MessageStream;
use crate::body;
use crate::jsonrpc::{self, ErrorObject};

mod get_stream;
mod request;
mod wire;

pub(crate) use wire::{base_request, Handshake, SessionParams};
use wire::{close_with, drain, handshake, init_params, initialize_result};

/// A live legacy session.
#[derive(Debug)]
pub(crate) struct Session {
    client: UpstreamClient,
    /// A stdio or HTTP+SSE session's link; `None` on Streamable HTTP.
    link: Option<Arc<Link>>,
    id: Option<HeaderValue>,
    version: String,
    /// Its `InitializeResult` as text: read on the rare requests that need it (discovery, a
    /// listen stream), and a parked call's session holds ~1 KiB of text, not a ~4 KiB tree.
    init_result: Option<Box<RawValue>>,
    /// Its `serverInfo` as text (every result of a modern call carries it).
    server_info: Option<Box<RawValue>>,
    credentials: Arc<LiveCredentials>,
    next_id: AtomicI64,
    inbox: Mutex<Option<UnboundedSender<Bytes>>>,
    changes: ChangeFeed,
    dead: AtomicBool,
    default_roots: Arc<Vec<Value>>,
    get_task: Mutex<Option<JoinHandle<()>>>,
    pub(super) last_used: Mutex<Instant>,
    /// Open listen streams relying on this session's upstream subscriptions.
    listeners: AtomicUsize,
    /// Woken when the session is marked dead.
    died: Notify,
    _permit: OwnedSemaphorePermit,
    /// Counts the extension declaration it carries for its principal, while it lives.
    _extensions: Option<ExtensionHold>,
}

/// Keeps a session's listen-stream count up while held (see [`Session::pin_listener`]).
#[derive(Debug)]
pub(crate) struct ListenerPin(Arc<Session>);

impl Drop for ListenerPin {
    fn drop(&mut self) {
        self.0.listeners.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Session {
    /// POSTs `initialize` (the first half of opening a Streamable HTTP session; [`Session::start`] is the second): the whole handshake, body
    /// included, within the upstream timeout, so that an upstream that sends headers and then
    /// nothing holds no session (and no pool permit) for good.
    ///
    /// # Errors
    /// Any [`UpstreamError`] of the handshake; a 4xx status is how an HTTP+SSE server shows.
    pub(crate) async fn handshake(
        client: &UpstreamClient,
        params: &SessionParams,
    ) -> Result<Handshake, UpstreamError> {
        let (id, result) = tokio::time::timeout(client.timeout(), handshake(client, params))
            .await
            .map_err(|_| UpstreamError::Timeout)??;
        Ok(Handshake { id, result })
    }

    /// The session a successful [`Session::handshake`] made: announced, its GET stream open.
    ///
    /// # Errors
    /// As [`Session::post`], for `notifications/initialized`.
    pub(crate) async fn start(
        client: UpstreamClient,
        hs: Handshake,
        params: SessionParams,
        permit: OwnedSemaphorePermit,
    ) -> Result<Arc<Self>, UpstreamError> {
        let session = Self::build(client, None, hs.id, hs.result, params, permit);
        session
            .notify("notifications/initialized", &Value::Null)
            .await?;
        session.open_get_stream().await;
        Ok(session)
    }

    /// Runs the legacy handshake on a stdio or HTTP+SSE link (whose one stream needs no GET).
    ///
    /// # Errors
    /// Any [`UpstreamError`] of the handshake.
    pub(crate) async fn over_link(
        client: UpstreamClient,
        link: Arc<Link>,
        params: SessionParams,
        permit: OwnedSemaphorePermit,
    ) -> Result<Arc<Self>, UpstreamError> {
        let body = jsonrpc::request_bytes(
            0,
            "initialize",
            jsonrpc::raw(&init_params(&params)).as_deref(),
        );
        let handshake = async {
            let mut stream = MessageStream::routed(link.request(0, body).await?);
            initialize_result(&mut stream).await
        };
        let result = match tokio::time::timeout(client.timeout(), handshake).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => return Err(close_with(&link, e).await),
            Err(_) => return Err(close_with(&link, UpstreamError::Timeout).await),
        };
        let session = Self::build(
            client,
            Some(Arc::clone(&link)),
            None,
            result,
            params,
            permit,
        );
        let owner: Arc<dyn Owner> = Arc::clone(&session) as Arc<dyn Owner>;
        link.attach(Arc::downgrade(&owner));
        if let Err(e) = session
            .notify("notifications/initialized", &Value::Null)
            .await
        {
            return Err(close_with(&link, e).await);
        }
        Ok(session)
    }

    fn build(
        client: UpstreamClient,
        link: Option<Arc<Link>>,
        id: Option<HeaderValue>,
        result: Value,
        params: SessionParams,
        permit: OwnedSemaphorePermit,
    ) -> Arc<Self> {
        let version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or(&params.protocol_version)
            .to_owned();
        let server_info = result.get("serverInfo").and_then(crate::jsonrpc::raw);
        Arc::new(Self {
            client,
            link,
            id,
            version,
            server_info,
            init_result: crate::jsonrpc::raw(&result),
            credentials: params.credentials,
            next_id: AtomicI64::new(1),
            inbox: Mutex::new(None),
            changes: params.changes,
            dead: AtomicBool::new(false),
            default_roots: params.default_roots,
            get_task: Mutex::new(None),
            last_used: Mutex::new(Instant::now()),
            listeners: AtomicUsize::new(0),
            died: Notify::new(),
            _permit: permit,
            _extensions: params.extensions,
        })
    }

    // A request on this session: its id, negotiated version and the principal's header.
    fn request_builder(&self, method: Method) -> http::request::Builder {
        base_request(
            &self.client,
            method,
            self.id.as_ref(),
            Some(&self.version),
            &self.credentials.current(),
        )
    }

    /// A leg of the session's principal brought `newer` credentials (a refreshed token):
    /// the session's next requests carry them.
    pub(crate) fn renew_credentials(&self, newer: &Credentials) {
        self.credentials.renew(newer);
    }

    /// The upstream's `InitializeResult` (parsed from the text kept).
    pub(crate) fn init_result(&self) -> Value {
        self.init_result
            .as_deref()
            .and_then(|r| serde_json::from_str(r.get()).ok())
            .unwrap_or(Value::Null)
    }

    /// The upstream's `serverInfo`, as text.
    pub(crate) fn server_info(&self) -> Option<&RawValue> {
        self.server_info.as_deref()
    }

    /// The negotiated legacy protocol version.
    pub(crate) fn version(&self) -> &str {
        &self.version
    }

    /// True once the upstream forgot the session or it was closed.
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed) || self.link.as_ref().is_some_and(|l| l.is_closed())
    }

    /// Marks the session unusable (it will be closed when its lease ends).
    pub(crate) fn mark_dead(&self) {
        self.dead.store(true, Ordering::Relaxed);
        self.died.notify_waiters();
    }

    /// Resolves once the session is dead (closed, forgotten by the upstream, or its lease
    /// poisoned and dropped).
    pub(crate) async fn wait_dead(&self) {
        loop {
            let died = self.died.notified();
            if self.is_dead() {
                return;
            }
            died.await;
        }
    }

    /// Counts a listen stream that relies on this session's upstream subscriptions: while any
    /// is open, the pool neither reaps nor evicts the session, and lends it first.
    pub(crate) fn pin_listener(self: &Arc<Self>) -> ListenerPin {
        self.listeners.fetch_add(1, Ordering::AcqRel);
        ListenerPin(Arc::clone(self))
    }

    /// Whether a listen stream relies on this session.
    pub(crate) fn has_listeners(&self) -> bool {
        self.listeners.load(Ordering::Acquire) > 0
    }

    /// A fresh upstream request id.
    pub(crate) fn next_id(&self) -> i64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Routes server requests from the GET stream to `inbox` (or, with `None`, back to defaults).
    pub(crate) fn set_inbox(&self, inbox: Option<UnboundedSender<Bytes>>) {
        if let Ok(mut slot) = self.inbox.lock() {
            *slot = inbox;
        }
    }

    /// Publishes a change notification (whichever stream of this session it came on) to every
    /// listen stream of this session's principal. Other notifications are ignored.
    pub(crate) fn publish_change(&self, method: &str, message: &Bytes) {
        if is_change(method) {
            self.changes.publish(message);
        }
    }

    /// POSTs a JSON-RPC message on this session.
    ///
    /// # Errors
    /// Transport errors; [`UpstreamError::SessionGone`] on 404.
    pub(crate) async fn post(
        &self,
        body: Vec<u8>,
    ) -> Result<http::Response<super::client::UpstreamBody>, UpstreamError> {
        self.post_with(body, true).await
    }

    async fn post_with(
        &self,
        body: Vec<u8>,
        header_timeout: bool,
    ) -> Result<http::Response<super::client::UpstreamBody>, UpstreamError> {
        let req = self
            .request_builder(Method::POST)
            .body(body::full(body))
            .map_err(|e| UpstreamError::Protocol(e.to_string()))?;
        let resp = if header_timeout {
            self.client.send(req).await?
        } else {
            self.client.send_untimed(req).await?
        };
        if resp.status() == StatusCode::NOT_FOUND && self.id.is_some() {
            self.mark_dead();
            return Err(UpstreamError::SessionGone);
        }
        Ok(resp)
    }

    /// Starts a request: its id now, and a future of its response's message stream that
    /// resolves once the upstream sends headers. The wait for headers is not bounded here: the
    /// caller decides (see `call`, and [`Session::request`]).
    ///
    /// # Errors
    /// The future fails as [`Session::post`]; other non-2xx statuses whose body is not
    /// JSON-RPC give [`UpstreamError::Status`].
    pub(crate) fn start_request(
        self: &Arc<Self>,
        method: &str,
        params: Option<&str>,
    ) -> (
        i64,
        impl std::future::Future<Output = Result<MessageStream, UpstreamError>> + Send + 'static,
    ) {
        let id = self.next_id();
        let body = jsonrpc::request_text_bytes(id, method, params);
        let session = Arc::clone(self);
        (id, async move {
            if let Some(link) = &session.link {
                return Ok(MessageStream::routed(link.request(id, body).await?));
            }
            let resp = session.post_with(body, false).await?;
            let status = resp.status();
            let is_json = resp
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| {
                    v.starts_with("application/json") || v.starts_with("text/event-stream")
                });
            // A JSON-RPC error body on a 4xx/5xx is still a usable answer; anything else is not,
            // and neither is a refusal of the credentials, whatever its body.
            if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
                || (!status.is_success() && !is_json)
            {
                return Err(UpstreamError::from_status(&resp));
            }
            Ok(MessageStream::new(resp, session.client.max_event_bytes()))
        })
    }

    /// Sends a notification and drains the (202) answer.
    ///
    /// # Errors
    /// As [`Session::post`].
    pub(crate) async fn notify(&self, method: &str, params: &Value) -> Result<(), UpstreamError> {
        self.deliver(jsonrpc::notification_bytes(method, params))
            .await
    }

    // Sends a message that gets no answer: on a link, or POSTed with the (202) answer drained.
    async fn deliver(&self, body: Vec<u8>) -> Result<(), UpstreamError> {
        if let Some(link) = &self.link {
            return link.send(body).await;
        }
        let resp = self.post(body).await?;
        drain(resp, self.client.timeout()).await
    }

    /// Answers server request `id` with a result (raw JSON) or an error.
    ///
    /// # Errors
    /// As [`Session::post`].
    pub(crate) async fn answer(
        &self,
        id: &str,
        answer: Result<&str, &ErrorObject>,
    ) -> Result<(), UpstreamError> {
        let body = match answer {
            Ok(result) => {
                format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#).into_bytes()
            }
            Err(err) => {
                let raw = serde_json::value::RawValue::from_string(id.to_owned())
                    .map_err(|e| UpstreamError::Protocol(e.to_string()))?;
                jsonrpc::error_bytes(Some(&raw), err)
            }
        };
        self.deliver(body).await
    }

    /// Cancels upstream request `id` (`notifications/cancelled`).
    pub(crate) async fn cancel(&self, id: i64, reason: &str) {
        let params = json!({"requestId": id, "reason": reason});
        if let Err(e) = self.notify("notifications/cancelled", &params).await {
            tracing::debug!(error = %e, "cancel notification failed");
        }
    }

    /// Ends the session: stops the GET stream and DELETEs it upstream.
    pub(crate) async fn close(&self) {
        self.mark_dead();
        if let Some(task) = self.get_task.lock().ok().and_then(|mut t| t.take()) {
            task.abort();
        }
        if let Some(link) = &self.link {
            link.close().await;
        }
        if self.id.is_none() {
            return;
        }
        let req = self.request_builder(Method::DELETE).body(body::empty());
        if let Ok(req) = req {
            if let Ok(resp) = self.client.send(req).await {
                let _ = drain(resp, self.client.timeout()).await;
            }
        }
    }
}

impl Owner for Session {
    // As a Streamable HTTP GET stream's message, in turn: the reader waits for a default answer
    // to be written (within the write timeout), so a flood of them is not a flood of tasks.
    fn unrouted(self: Arc<Self>, message: Bytes) -> SinkFuture<'static, ()> {
        Box::pin(async move { self.on_get_message(message).await })
    }

    fn closed(&self) {
        self.mark_dead();
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(task) = self.get_task.get_mut().ok().and_then(Option::take) {
            task.abort();
        }
    }
}
