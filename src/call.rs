//! The call actor: one task per forwarded modern request. It owns the leased upstream session and
//! the upstream response stream, answers what it must, relays request-scoped notifications, and —
//! for `tools/call`, `prompts/get`, `resources/read` — parks the live upstream call when the server
//! asks for input, returning `input_required` with a signed requestState, then resumes it when the
//! client retries.
//!
//! ```text
//! Running ──server request(s)──▶ Gathering (window) ──▶ Parked{round n} ──Resume──▶ deliver answers
//!    ▲                                                     │  │                      │
//!    └──────────────────── all keys answered ◀─────────────┼──┼── keys missing ──▶ Parked{n+1}
//! Running ──final response──▶ Done            TTL ◀─────────┘  └─▶ upstream died ─▶ Failed
//! every exit: lease released (poisoned if the upstream call may still run), registry entry removed
//! (`end`: how each path ends; `rounds`: gathering, parking, resuming; `leg`: one client exchange)
//! ```

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::config::CacheScope;
use crate::error::ProxyError;
use crate::input::{self, InputKind};
use crate::jsonrpc::{self, Kind, Message};
use crate::metrics::Metrics;
use crate::parked::Resume;
use crate::rewrite::{self, RewriteCtx};
use crate::server::App;
use crate::upstream::{Lease, ResponseStream, UpstreamError};

mod end;
mod leg;
mod rounds;

pub use leg::{leg, respond, Leg, LegEvent, Outcome};
use rounds::{Parking, Pending};

/// What the front asks the actor to run.
#[derive(Debug)]
pub struct CallSpec {
    /// Method name.
    pub method: String,
    /// Params sent upstream (modern-only fields removed).
    pub upstream_params: Value,
    /// Declared client capabilities.
    pub capabilities: Value,
    /// May park (`tools/call`, `prompts/get`, `resources/read`).
    pub input_capable: bool,
    /// Principal digest.
    pub principal: String,
    /// Principal header forwarded upstream.
    pub auth: Option<(http::HeaderName, HeaderValue)>,
    /// Request digest (method + target + arguments).
    pub request_digest: String,
}

/// Starts the actor for a fresh call.
pub fn spawn(app: Arc<App>, spec: CallSpec, first: Leg) {
    tokio::spawn(async move {
        let (inbox_tx, inbox_rx) = mpsc::unbounded_channel();
        let mut call = Call {
            app,
            spec,
            lease: None,
            upstream_id: 0,
            stream: None,
            early_inbox: None,
            inbox_tx,
            inbox_rx,
            leg: Some(first),
            pending: Vec::new(),
            key_counter: 0,
            gather_until: None,
            park: None,
            held_final: None,
            reissue: false,
        };
        call.run().await;
    });
}

// Field order is drop order: the registry entry goes before the lease closes the session, so a
// client that sees the session end also sees the entry gone.
struct Call {
    app: Arc<App>,
    spec: CallSpec,
    park: Option<Parking>,
    lease: Option<Lease>,
    upstream_id: i64,
    stream: Option<ResponseStream>,
    /// A GET-stream server request that arrived while the call waited for its response headers.
    early_inbox: Option<Bytes>,
    inbox_tx: mpsc::UnboundedSender<Bytes>,
    inbox_rx: mpsc::UnboundedReceiver<Bytes>,
    leg: Option<Leg>,
    pending: Vec<Pending>,
    key_counter: u32,
    gather_until: Option<Instant>,
    /// A final message that arrived while no leg was open (delivered on the next retry).
    held_final: Option<Message>,
    /// The upstream answered -32042: re-issue the call once the client answered.
    reissue: bool,
}

enum Event {
    Upstream(Option<Result<Bytes, UpstreamError>>),
    Inbox(Bytes),
    ClientGone,
    GatherDone,
    Resume(Option<Resume>),
    Expired,
    Shutdown,
}

enum Step {
    Continue,
    Stop,
}

impl Call {
    async fn run(&mut self) {
        if let Err(e) = self.send_upstream_request().await {
            self.fail(e).await;
            return;
        }
        self.event_loop().await;
        self.turn_away_queued_retries().await;
    }

    async fn event_loop(&mut self) {
        loop {
            let ev = self.next_event().await;
            let step = match ev {
                Event::Upstream(Some(Ok(bytes))) => self.on_upstream(bytes).await,
                Event::Upstream(Some(Err(e))) => {
                    self.stream = None;
                    self.fail(e.into()).await
                }
                Event::Upstream(None) => {
                    self.stream = None;
                    self.fail(UpstreamError::Closed.into()).await
                }
                Event::Inbox(bytes) => match Message::parse(&bytes) {
                    Ok(msg) => self.on_server_request(msg).await,
                    Err(_) => Step::Continue,
                },
                Event::ClientGone => {
                    self.cancel_upstream("the client closed the request").await;
                    Step::Stop
                }
                Event::GatherDone => {
                    self.gather_until = None;
                    self.park_round().await
                }
                Event::Resume(Some(r)) => self.resume(r).await,
                Event::Resume(None) => Step::Stop,
                Event::Shutdown => self.shut_down().await,
                Event::Expired => {
                    Metrics::inc(&self.app.metrics.expired);
                    if let Some(p) = &mut self.park {
                        p.guard
                            .retire("the call expired before the client answered");
                    }
                    self.cancel_upstream("the client did not answer in time")
                        .await;
                    Step::Stop
                }
            };
            if matches!(step, Step::Stop) {
                return;
            }
        }
    }

    async fn next_event(&mut self) -> Event {
        if let Some(b) = self.early_inbox.take() {
            return Event::Inbox(b);
        }
        let stream = &mut self.stream;
        let inbox = &mut self.inbox_rx;
        let leg = &self.leg;
        let gather = self.gather_until;
        let parked = self.leg.is_none();
        let park = &mut self.park;
        let mut shutdown = self.app.shutdown.subscribe();
        let (commands, deadline) = match park {
            Some(p) if parked => (Some(&mut p.commands), Some(p.deadline)),
            _ => (None, None),
        };
        // Biased: a retry already claimed (its token checked) is served before a deadline that
        // fires in the same instant.
        tokio::select! {
            biased;
            r = async { match commands { Some(c) => c.recv().await, None => std::future::pending().await } } => Event::Resume(r),
            m = async { match stream { Some(s) => s.next().await, None => std::future::pending().await } } => Event::Upstream(m),
            Some(b) = inbox.recv() => Event::Inbox(b),
            () = client_gone(leg) => Event::ClientGone,
            () = async { match gather { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await } } => Event::GatherDone,
            () = async { match deadline { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await } } => Event::Expired,
            _ = shutdown.wait_for(|down| *down) => Event::Shutdown,
        }
    }

    async fn send_upstream_request(&mut self) -> Result<(), ProxyError> {
        for attempt in 0..2 {
            if self.lease.is_none() {
                let lease = self
                    .app
                    .pool
                    .lease(
                        &self.spec.principal,
                        &self.spec.capabilities,
                        self.spec.auth.clone(),
                    )
                    .await?;
                lease.session().set_inbox(Some(self.inbox_tx.clone()));
                self.lease = Some(lease);
            }
            let Some(lease) = self.lease.as_mut() else {
                continue;
            };
            let (id, headers) = lease
                .session()
                .start_request(&self.spec.method, &self.spec.upstream_params);
            let mut headers = Box::pin(headers);
            let leg = &self.leg;
            let header_timeout = self.app.pool.client().timeout();
            let early = tokio::select! {
                r = &mut headers => Err(r),
                () = tokio::time::sleep(header_timeout) => Err(Err(UpstreamError::Timeout)),
                Some(b) = self.inbox_rx.recv() => Ok(Some(b)),
                () = client_gone(leg) => Ok(None),
            };
            self.upstream_id = id;
            match early {
                // Asked for input (or abandoned by the client) before the response headers came:
                // a JSON-mode upstream holds them until it is done. The upstream has the request;
                // keep waiting for the headers in the event loop, next to everything else.
                Ok(first) => {
                    self.early_inbox = first;
                    self.stream = Some(ResponseStream::Pending(headers));
                    return Ok(());
                }
                Err(Ok(stream)) => {
                    self.stream = Some(ResponseStream::Ready(stream));
                    return Ok(());
                }
                // The upstream forgot the session before seeing the request: safe to retry once.
                Err(Err(UpstreamError::SessionGone)) if attempt == 0 => {
                    lease.poison();
                    self.lease = None;
                }
                Err(Err(e)) => return Err(e.into()),
            }
        }
        Err(UpstreamError::SessionGone.into())
    }

    async fn on_upstream(&mut self, bytes: Bytes) -> Step {
        let Ok(msg) = Message::parse(&bytes) else {
            tracing::debug!("ignoring a malformed upstream message");
            return Step::Continue;
        };
        match msg.kind() {
            Ok(Kind::Response)
                if msg
                    .id
                    .as_ref()
                    .is_some_and(|id| id_is(id, self.upstream_id)) =>
            {
                self.stream = None;
                self.on_final(msg).await
            }
            Ok(Kind::Request) => self.on_server_request(msg).await,
            Ok(Kind::Notification) => {
                if let Some(lease) = &self.lease {
                    lease.session().publish_change(msg.method(), &bytes);
                }
                self.on_notification(&msg).await;
                Step::Continue
            }
            _ => Step::Continue,
        }
    }

    async fn on_final(&mut self, msg: Message) -> Step {
        if let Some(err) = &msg.error {
            if err.code == jsonrpc::LEGACY_URL_ELICITATION_REQUIRED && self.spec.input_capable {
                if let Some(list) = err
                    .data
                    .as_ref()
                    .and_then(|d| d.get("elicitations"))
                    .and_then(Value::as_array)
                {
                    let caps = &self.spec.capabilities;
                    if let Some(required) = list.iter().find_map(|e| {
                        input::check_capability(InputKind::Elicitation, Some(e), caps).err()
                    }) {
                        // The upstream call is over (it answered with the error): nothing to cancel.
                        return self.fail(ProxyError::MissingCapability { required }).await;
                    }
                    for e in list.clone() {
                        self.add_pending(InputKind::Elicitation, None, Some(&e));
                    }
                    if !self.pending.is_empty() {
                        self.reissue = true;
                        return self.park_round().await;
                    }
                }
            }
        }
        match self.leg.take() {
            Some(leg) => {
                let out = self.final_outcome(msg, &leg.id);
                let _ = leg.tx.send(LegEvent::Done(out)).await;
                Step::Stop
            }
            None => {
                self.held_final = Some(msg);
                Step::Continue
            }
        }
    }

    fn final_outcome(&self, msg: Message, id: &RawValue) -> Outcome {
        if let Some(err) = msg.error {
            let err = rewrite::rewrite_error(err);
            let status = if err.code == jsonrpc::METHOD_NOT_FOUND {
                StatusCode::NOT_FOUND
            } else {
                StatusCode::OK
            };
            return Outcome {
                status,
                body: Bytes::from(jsonrpc::error_bytes(Some(id), &err)),
                headers: http::HeaderMap::new(),
            };
        }
        let raw = msg.result.as_ref().map_or("{}", |r| r.get());
        let info = self
            .lease
            .as_ref()
            .and_then(|l| l.session().init_result().get("serverInfo"));
        // The result of a retry that carried inputResponses must not be cached (caching26).
        let (ttl_ms, scope) = if self.park.is_some() {
            (0, CacheScope::Private)
        } else {
            (self.app.config.cache_ttl_ms, self.app.config.cache_scope)
        };
        let ctx = RewriteCtx {
            server_info: info,
            ttl_ms,
            scope,
        };
        let result = rewrite::rewrite_result(&self.spec.method, raw, ctx);
        Outcome {
            status: StatusCode::OK,
            body: Bytes::from(jsonrpc::response_bytes(id, &result)),
            headers: http::HeaderMap::new(),
        }
    }

    async fn on_notification(&mut self, msg: &Message) {
        match msg.method() {
            "notifications/progress" => {
                let Some(leg) = &self.leg else { return };
                let Some(token) = &leg.progress_token else {
                    return;
                };
                let Ok(mut params) = msg.params_value() else {
                    return;
                };
                // A retry may carry another token than the upstream knows: speak the leg's.
                let Some(obj) = params.as_object_mut() else {
                    return;
                };
                obj.insert("progressToken".into(), token.clone());
                relay(leg, msg.method(), &params).await;
            }
            "notifications/message" => {
                let Some(leg) = &self.leg else { return };
                let Some(threshold) = leg.log_level.as_deref() else {
                    return;
                };
                let Ok(params) = msg.params_value() else {
                    return;
                };
                let level = params
                    .get("level")
                    .and_then(Value::as_str)
                    .unwrap_or("info");
                if severity(level) >= severity(threshold) {
                    relay(leg, msg.method(), &params).await;
                }
            }
            // URL-mode completion is a legacy-only notification: consumed here, never relayed.
            "notifications/elicitation/complete" => {
                let id = msg
                    .params_value()
                    .ok()
                    .and_then(|p| p.get("elicitationId").cloned());
                let known = self.pending.iter().any(|p| {
                    p.elicitation_id.is_some()
                        && id.as_ref().and_then(Value::as_str) == p.elicitation_id.as_deref()
                });
                tracing::debug!(known, "upstream reported a URL elicitation complete");
            }
            // The upstream gave up on one of its own requests (TS SDK: after 60 s).
            "notifications/cancelled" => {
                let Ok(params) = msg.params_value() else {
                    return;
                };
                let Some(rid) = params.get("requestId") else {
                    return;
                };
                let rid = rid.to_string();
                self.pending
                    .retain(|p| p.upstream_id.as_deref() != Some(rid.as_str()));
            }
            _ => {}
        }
    }
}

// Sends a request-scoped notification on the open leg (a closed leg is noticed by the actor loop).
async fn relay(leg: &Leg, method: &str, params: &Value) {
    let bytes = Bytes::from(jsonrpc::notification_bytes(method, params));
    let _ = leg.tx.send(LegEvent::Message(bytes)).await;
}

// Resolves when the client closed the current leg's response (never, with no leg open).
async fn client_gone(leg: &Option<Leg>) {
    match leg {
        Some(l) => l.tx.closed().await,
        None => std::future::pending().await,
    }
}

fn id_is(raw: &RawValue, id: i64) -> bool {
    raw.get().trim() == id.to_string()
}

/// Syslog severity order used by MCP logging levels.
fn severity(level: &str) -> u8 {
    match level {
        "debug" => 0,
        "info" => 1,
        "notice" => 2,
        "warning" => 3,
        "error" => 4,
        "critical" => 5,
        "alert" => 6,
        "emergency" => 7,
        _ => 1,
    }
}
