//! The front door: every request on the MCP path, top to bottom. `handle` checks the `Origin`
//! (and answers CORS) → `post` bounds and reads the body → `classify` (era and envelope; legacy
//! traffic leaves here for `relay`) → `validate` (headers, `_meta`, method; `params` read as raw
//! members) → `route`: discover, listen, a retry (`retry`: here, at its owner, or replayed) or a
//! new call (`start`: the call actor) → `edge` answers, JSON or SSE. The whole pipeline is drawn in docs/ARCHITECTURE.md.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use tokio::sync::mpsc;
use tracing::{field, Instrument};

use crate::app::App;
use crate::body::{self, Body};
use crate::call::LegEvent;
use crate::cluster::{self, Inbound};
use crate::edge::{self, Settled};
use crate::error::ProxyError;
use crate::jsonrpc::{Kind, Message};
use crate::ops::metrics::{self, Era, Limit, RequestTimer};
use crate::protocol::{MODERN_VERSION, SESSION_HEADER, VERSION_HEADER};
use crate::rewrite::{self, RewriteCtx};
use crate::trace_context::TraceContext;

pub(crate) mod approval;
pub(crate) mod bridge;
mod cors;
pub(crate) mod gate;
mod listen;
pub(crate) mod params;
mod relay;
mod retry;
mod sse_client;
mod start;
mod tasks;
mod validate;
mod well_known;

use crate::auth::Principal;
use params::Params;
use retry::Resumed;
use start::start_call;
use validate::{Envelope, ModernRequest, Route};
pub(crate) use well_known::serve as well_known;

/// Longest JSON-RPC id recorded in the request span (longer ones are left out).
const MAX_LOGGED_ID_BYTES: usize = 64;
/// How long a refusal waits for the unread body of its request (see `unread`).
const UNREAD_DRAIN: std::time::Duration = std::time::Duration::from_secs(1);

enum Classified {
    Modern(Envelope),
    Legacy,
    Notification,
}

/// For the fuzz targets: whether a modern request validates.
pub(crate) fn validate_modern(headers: &HeaderMap, msg: Message) -> bool {
    validate::validate(headers, msg.into(), 4096).is_ok()
}

/// For the fuzz targets: a mirrored header value decoded (plain, or `=?base64?…?=`).
pub(crate) fn decode_mirrored(raw: &[u8]) -> Option<String> {
    validate::decode_header_value(raw).map(std::borrow::Cow::into_owned)
}

/// Handles one request on the MCP path, inside its own span (filled in as the request goes).
pub(crate) async fn handle(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let span = tracing::info_span!(
        "request",
        otel.name = field::Empty,
        otel.kind = "server",
        rpc.method = field::Empty,
        rpc.id = field::Empty,
        outcome = field::Empty,
        round = field::Empty,
        upstream.status = field::Empty,
        duration_ms = field::Empty,
    );
    handle_in_span(app, req).instrument(span).await
}

async fn handle_in_span(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let timer = RequestTimer::start(&app.metrics);
    let origin = req.headers().get(header::ORIGIN).cloned();
    if !cors::origin_allowed(origin.as_ref(), &app.config.server.allowed_origins) {
        let resp = edge::fail(timer, &ProxyError::Forbidden, None);
        return unread(&app, req.into_body(), resp).await;
    }
    if *req.method() == Method::OPTIONS {
        return cors::preflight(origin, req.headers());
    }
    let who = match identify(&app, &req).await {
        Ok(who) => who,
        Err(refusal) => {
            let e = ProxyError::Unauthenticated(refusal);
            let resp = unread(&app, req.into_body(), edge::fail(timer, &e, None)).await;
            return with_cors(resp, origin);
        }
    };
    let mut resp = match app.principals.enter(&who.digest) {
        // The permit rides on the body: a streamed answer holds it until it ends.
        Some(permit) => answer(Arc::clone(&app), req, who, timer)
            .await
            .map(|b| permit.hold_through(b)),
        None => {
            app.metrics.limit_hit(Limit::PrincipalRequests);
            let resp = edge::fail(timer, &ProxyError::TooManyRequests, None);
            unread(&app, req.into_body(), resp).await
        }
    };
    // Pass-through: an upstream's challenge names the proxy's public metadata URL.
    if resp.status() == StatusCode::UNAUTHORIZED || resp.status() == StatusCode::FORBIDDEN {
        app.auth.rewrite_challenge(resp.headers_mut());
    }
    with_cors(resp, origin)
}

// A refusal sent before the request's body was read. The body is read off first (within
// `server.max_body`, for at most `UNREAD_DRAIN`) so the connection can carry the client's next
// request — a client that was told 401 asks for the metadata at once, often on the same
// connection; a body that does not come at once closes the connection, saying so.
async fn unread(app: &App, body: Incoming, mut resp: Response<Body>) -> Response<Body> {
    let limit = app.config.server.max_body_bytes;
    let drained = tokio::time::timeout(UNREAD_DRAIN, Limited::new(body, limit).collect()).await;
    if !matches!(drained, Ok(Ok(_))) {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

// Every answer, refusals included, carries CORS headers so a browser client can read it.
fn with_cors(mut resp: Response<Body>, origin: Option<http::HeaderValue>) -> Response<Body> {
    if let Some(origin) = origin {
        cors::allow_origin(&mut resp, origin);
    }
    resp
}

// Who the request speaks for. A peer's probe carries no token: it is signed by the key set,
// and only a probe whose signature verifies is let in without one (any other request with the
// header is a client's, identified as any other).
async fn identify(
    app: &App,
    req: &Request<Incoming>,
) -> Result<Principal, Box<crate::auth::Refusal>> {
    let probe = (*req.method() == Method::GET)
        .then(|| req.headers().get(cluster::PEER_HEADER))
        .flatten();
    if probe.is_some_and(|sig| app.peers.verify(sig, b"", true)) {
        return Ok(Principal::anonymous());
    }
    app.auth.identify(req.headers()).await
}

// Routes by HTTP method: POST (modern or legacy), a legacy GET stream or DELETE, else 405.
async fn answer(
    app: Arc<App>,
    req: Request<Incoming>,
    who: Principal,
    mut timer: RequestTimer,
) -> Response<Body> {
    let has_session = req.headers().contains_key(SESSION_HEADER);
    let path = req.uri().path();
    if path != app.config.server.mcp_path {
        return sse_transport(app, req, who, timer).await;
    }
    match *req.method() {
        Method::POST => post(app, req, who, timer).await,
        // A peer asking which instance this is (see `cluster`).
        Method::GET if req.headers().contains_key(cluster::PEER_HEADER) => {
            retry::identify(&app, req.headers(), timer)
        }
        // A legacy client's GET stream or DELETE: relay untouched and unbuffered.
        Method::GET | Method::DELETE if has_session => {
            timer.label(Era::Legacy, metrics::Method::of_http(req.method()));
            let span = tracing::Span::current();
            TraceContext::describe_legacy(&span, (req.headers(), b""), req.method().as_str());
            // What the approval gate recorded of a deleted session goes once the deletion was
            // accepted (by the session's owner: another principal's DELETE changes nothing).
            let deleting = (req.method() == Method::DELETE).then(|| req.headers().clone());
            let resp = if app.pool.relays_legacy_clients_now().await {
                let req = req.map(|b| b.map_err(Into::into).boxed());
                relay::relay(&app, req, &who, timer).await
            } else if deleting.is_some() {
                bridge::delete(&app, req.headers(), &who, timer).await
            } else {
                bridge::get(&app, req.headers(), &who, timer)
            };
            if let Some(headers) = deleting.filter(|_| resp.status().is_success()) {
                approval::forget_session(&app, &headers);
            }
            resp
        }
        _ => {
            let mut r = edge::fail(timer, &ProxyError::MethodNotAllowed, None);
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("POST"));
            r
        }
    }
}

// The 2024-11-05 HTTP+SSE transport: its stream (GET) and its messages (POST).
async fn sse_transport(
    app: Arc<App>,
    req: Request<Incoming>,
    who: Principal,
    mut timer: RequestTimer,
) -> Response<Body> {
    timer.label(Era::Legacy, metrics::Method::of_http(req.method()));
    let span = tracing::Span::current();
    let is_stream = req.uri().path() == app.config.server.sse_path;
    match (req.method(), is_stream) {
        (&Method::GET, true) => {
            TraceContext::describe_legacy(&span, (req.headers(), b""), "GET");
            sse_client::open(&app, &who, timer)
        }
        (&Method::POST, false) => {
            let query = req.uri().query().map(str::to_owned);
            // Kept past the body's read only for a span to describe.
            let headers = crate::ops::telemetry::exporting().then(|| req.headers().clone());
            match read_body(&app, req.into_body()).await {
                Ok(bytes) => {
                    relay::name_span(&span, &bytes);
                    if let Some(headers) = &headers {
                        TraceContext::describe_legacy(&span, (headers, &bytes), "legacy response");
                    }
                    sse_client::post(&app, query.as_deref(), &bytes, &who, timer).await
                }
                Err(e) => edge::fail(timer, &e, None),
            }
        }
        _ => {
            let mut r = edge::fail(timer, &ProxyError::MethodNotAllowed, None);
            let allow = if is_stream { "GET" } else { "POST" };
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
            r
        }
    }
}

// A request body, within `server.max_body` and `server.body_read_timeout`.
async fn read_body(app: &App, body: Incoming) -> Result<Bytes, ProxyError> {
    let limit = app.config.server.max_body_bytes;
    let deadline = app.config.server.body_read_timeout;
    let mut collect = std::pin::pin!(Limited::new(body, limit).collect());
    // Most bodies came with their head: one poll takes them before a timer is armed.
    let first = std::future::poll_fn(|cx| Poll::Ready(collect.as_mut().poll(cx))).await;
    let read = match first {
        Poll::Ready(read) => Ok(read),
        Poll::Pending => tokio::time::timeout(deadline, collect).await,
    };
    match read {
        Ok(Ok(c)) => Ok(c.to_bytes()),
        Ok(Err(_)) => Err(ProxyError::BodyTooLarge { limit }),
        Err(_) => Err(ProxyError::BodyTimeout { limit: deadline }),
    }
}

async fn post(
    app: Arc<App>,
    req: Request<Incoming>,
    who: Principal,
    mut timer: RequestTimer,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let bytes = match read_body(&app, body).await {
        Ok(b) => b,
        Err(e) => return edge::fail(timer, &e, None),
    };
    let forwarded = match parts.headers.get(cluster::PEER_HEADER) {
        None => false,
        Some(sig) if app.peers.verify(sig, &bytes, false) => true,
        Some(_) => return edge::fail(timer, &ProxyError::Forbidden, None),
    };
    let inbound = Inbound {
        headers: &parts.headers,
        bytes: &bytes,
        forwarded,
    };
    match classify(&parts.headers, &bytes) {
        Ok(Classified::Modern(msg)) => modern(app, inbound, (msg, who), timer).await,
        Ok(Classified::Legacy) => {
            timer.label(Era::Legacy, metrics::Method::HttpPost);
            let span = tracing::Span::current();
            TraceContext::describe_legacy(&span, (&parts.headers, &bytes), "legacy response");
            relay::name_span(&span, &bytes);
            let gated = match gate::legacy(&app, &who, &bytes) {
                Ok(gated) => gated,
                Err(e) => return edge::fail(timer, &e, None),
            };
            if let Some(answer) = approval::on_mcp(&app, (&parts.headers, &bytes), &who, gated) {
                edge::settle(timer, Settled::with(metrics::Outcome::Complete));
                return answer;
            }
            // No Streamable HTTP upstream to relay to (stdio, HTTP+SSE): the proxy serves it.
            if !app.pool.relays_legacy_clients_now().await {
                let resp = bridge::post(&app, &parts.headers, &bytes, &who, timer).await;
                approval::observe_initialize(&app, &bytes, resp.headers());
                return resp;
            }
            let req = Request::from_parts(parts, body::full(bytes.clone()));
            let resp = relay::relay(&app, req, &who, timer).await;
            approval::observe_initialize(&app, &bytes, resp.headers());
            resp
        }
        // 2026-07-28 defines no client→server notifications over HTTP: accept and ignore.
        Ok(Classified::Notification) => {
            edge::settle(timer, Settled::with(metrics::Outcome::Complete));
            edge::empty(StatusCode::ACCEPTED)
        }
        Err(e) => edge::fail(timer, &e, None),
    }
}

/// Decides the era. Modern: the 2026-07-28 version header (an `Mcp-Session-Id` beside it is
/// ignored, as the spec asks of modern servers) or modern `_meta`. Legacy: a session id, an
/// `initialize`, or a legacy version header without modern `_meta`.
fn classify(headers: &HeaderMap, bytes: &Bytes) -> Result<Classified, ProxyError> {
    let modern_header = headers
        .get(VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim() >= MODERN_VERSION);
    if !modern_header && headers.contains_key(SESSION_HEADER) {
        return Ok(Classified::Legacy);
    }
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(ProxyError::InvalidRequest(
            "batches are not supported".into(),
        ));
    }
    // The common shape is read in one pass; any other body the general way (which names its faults).
    if let Some(request) = modern_header.then(|| Params::read_request(bytes)).flatten() {
        return Ok(Classified::Modern(request.into()));
    }
    let msg = Message::parse(bytes)?;
    if !modern_header && (msg.method() == "initialize" || !validate::looks_modern(headers, &msg)) {
        return Ok(Classified::Legacy);
    }
    match msg.kind() {
        Ok(Kind::Request) => Ok(Classified::Modern(msg.into())),
        Ok(Kind::Notification) => Ok(Classified::Notification),
        _ => Err(ProxyError::InvalidRequest(
            "a modern client sends requests only".into(),
        )),
    }
}

async fn modern(
    app: Arc<App>,
    inbound: Inbound<'_>,
    (msg, who): (Envelope, Principal),
    mut timer: RequestTimer,
) -> Response<Body> {
    timer.label(Era::Modern, metrics::Method::of(msg.method()));
    let span = tracing::Span::current();
    span.record("rpc.method", msg.method());
    let id = msg.id.clone();
    // Client-chosen: a huge id must not end up in every log line of its request.
    if let Some(id) = id
        .as_ref()
        .filter(|id| id.get().len() <= MAX_LOGGED_ID_BYTES)
    {
        span.record("rpc.id", id.get());
    }
    let max_extensions = app.config.pool.max_extensions_bytes;
    let request = match validate::validate(inbound.headers, msg, max_extensions) {
        Ok(r) => r,
        Err(e) => return edge::fail(timer, &e, id.as_deref()),
    };
    // Counted once: by the instance the client reached, not again by the peer it forwards to.
    if !inbound.forwarded {
        request.trace_dropped.count(&app.metrics);
    }
    let described = (request.method.as_str(), request.target(), request.id.get());
    request.trace.describe(&span, described);
    let id = request.id.clone();
    match route(&app, request, who, inbound).await {
        Ok(Routed::Answered(resp)) => {
            edge::settle(timer, Settled::with(metrics::Outcome::Complete));
            resp
        }
        Ok(Routed::Forwarded(resp)) => {
            let settled = Settled {
                upstream_status: Some(resp.status().as_u16()),
                ..Settled::with(metrics::Outcome::Relayed)
            };
            edge::settle(timer, settled);
            resp
        }
        Ok(Routed::Leg(rx)) => edge::respond(rx, app.config.server.keepalive, timer).await,
        Err(e) => {
            if let Some(reason) = retry::rejection(&e) {
                timer.metrics().token_rejected(reason);
            }
            edge::fail(timer, &e, Some(&id))
        }
    }
}

/// What routing gave: an answer now, a leg the call actor answers on, or the answer of the
/// instance that owns the call.
enum Routed {
    Answered(Response<Body>),
    Leg(mpsc::Receiver<LegEvent>),
    Forwarded(Response<Body>),
}

async fn route(
    app: &Arc<App>,
    req: ModernRequest,
    who: Principal,
    inbound: Inbound<'_>,
) -> Result<Routed, ProxyError> {
    let retry_of_parked = req.params.contains_key("requestState");
    let long_lived = match req.route {
        Route::Listen => true,
        Route::Tasks => false,
        Route::Forward { input_capable } => input_capable && !retry_of_parked,
        Route::Discover => false,
    };
    // The gate, as on every way in: a scope the token lacks (403 with the challenge), a tool a
    // person must approve first.
    let gated = match req.method.as_str() {
        "tools/call" => gate::tool_call(app, &who, req.target())?,
        _ => None,
    };
    // Draining: work that could outlive the grace goes to another replica; retries still reach
    // their parked calls here.
    if long_lived && app.is_draining() {
        return Err(ProxyError::Overloaded("the proxy is shutting down".into()));
    }
    match req.route {
        Route::Discover => discover(app, &req, who).await.map(Routed::Answered),
        Route::Tasks => match tasks::serve(app, &req, &who, inbound).await? {
            tasks::Served::Here(resp) => Ok(Routed::Answered(resp)),
            tasks::Served::ByOwner(resp) => Ok(Routed::Forwarded(resp)),
        },
        Route::Listen => listen::serve(app, req, who.digest, who.credentials)
            .await
            .map(Routed::Answered),
        Route::Forward {
            input_capable: true,
        } if retry_of_parked => match retry::retry(app, req, who, inbound).await? {
            Resumed::Here(rx) => Ok(Routed::Leg(rx)),
            Resumed::Forwarded(resp) => Ok(Routed::Forwarded(resp)),
            Resumed::Answered(resp) => Ok(Routed::Answered(resp)),
        },
        Route::Forward { input_capable } => match gated {
            // A gated tool: the person is asked before the upstream sees anything.
            Some(rule) => approval::ask(app, &req, &who, rule).map(Routed::Answered),
            None => Ok(Routed::Leg(start_call(
                app,
                req,
                who,
                (input_capable, None),
            ))),
        },
    }
}

/// `server/discover`, from the `InitializeResult` of a session of this principal.
async fn discover(
    app: &Arc<App>,
    req: &ModernRequest,
    who: Principal,
) -> Result<Response<Body>, ProxyError> {
    let lease = app
        .pool
        .lease(&who.digest, &req.declared, &who.credentials)
        .await?;
    let session = lease.session();
    let ctx = RewriteCtx {
        server_info: None,
        ttl_ms: app.config.results.ttl_ms,
        scope: app.config.results.scope,
    };
    let tasks = app.config.tasks.enabled;
    let result = rewrite::discover_result(&session.init_result(), session.version(), ctx, tasks);
    let body = crate::jsonrpc::response_bytes(&req.id, &crate::jsonrpc::text(&result));
    Ok(edge::json(StatusCode::OK, HeaderMap::new(), body))
}
