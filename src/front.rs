//! The front door: every request on the MCP path, top to bottom. `handle` checks the `Origin`
//! (and answers CORS) → `post` bounds and reads the body → `classify` (era and envelope; legacy
//! traffic leaves here for `relay`) → `validate` (headers, `_meta`, method) → `route`: discover,
//! listen, a retry (token verified, parked call claimed, answers handed over) or a new call (the
//! call actor) → `edge` answers, JSON or SSE.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::{Map, Value};
use tracing::Instrument;

use crate::app::App;
use crate::body::{self, Body};
use crate::call::{self, CallSpec, Leg, Retry};
use crate::edge;
use crate::error::ProxyError;
use crate::jsonrpc::{EnvelopeError, Kind, Message};
use crate::metrics::Metrics;
use crate::protocol::{MODERN_VERSION, SESSION_HEADER, VERSION_HEADER};
use crate::rewrite::{self, RewriteCtx};
use crate::state_token::{principal_digest, request_digest, TokenError};

mod cors;
mod listen;
mod relay;
mod validate;

pub(crate) use relay::relay_same_path;
use validate::{ModernRequest, Route};

/// Who is asking: the digest that keys sessions and binds tokens, and the header forwarded
/// upstream on the principal's sessions.
struct Principal {
    digest: String,
    header: Option<(HeaderName, HeaderValue)>,
}

enum Classified {
    Modern(Message),
    Legacy,
    Notification,
}

/// Handles one request on the MCP path.
pub(crate) async fn handle(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    if !cors::origin_allowed(req.headers(), &app.config.allowed_origins) {
        return edge::error(&ProxyError::Forbidden, None);
    }
    let origin = req.headers().get(header::ORIGIN).cloned();
    if *req.method() == Method::OPTIONS {
        return cors::preflight(origin, req.headers());
    }
    let has_session = req.headers().contains_key(SESSION_HEADER);
    let mut resp = match *req.method() {
        Method::POST => post(app, req).await,
        // A legacy client's GET stream or DELETE: relay untouched and unbuffered.
        Method::GET | Method::DELETE if has_session => {
            Metrics::inc(&app.metrics.legacy_requests);
            relay::relay(&app, req.map(|b| b.map_err(Into::into).boxed())).await
        }
        _ => {
            let mut r = edge::error(&ProxyError::MethodNotAllowed, None);
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("POST"));
            r
        }
    };
    if let Some(origin) = origin {
        cors::allow_origin(&mut resp, origin);
    }
    resp
}

async fn post(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let limit = app.config.max_body_bytes;
    let bytes = match Limited::new(body, limit).collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => return edge::error(&ProxyError::BodyTooLarge { limit }, None),
    };
    match classify(&parts.headers, &bytes) {
        Ok(Classified::Modern(msg)) => modern(app, &parts.headers, msg).await,
        Ok(Classified::Legacy) => {
            Metrics::inc(&app.metrics.legacy_requests);
            relay::relay(&app, Request::from_parts(parts, body::full(bytes))).await
        }
        // 2026-07-28 defines no client→server notifications over HTTP: accept and ignore.
        Ok(Classified::Notification) => edge::empty(StatusCode::ACCEPTED),
        Err(e) => edge::error(&e, None),
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
    let msg = Message::parse(bytes).map_err(|e| match e {
        EnvelopeError::Json(e) => ProxyError::Parse(e.to_string()),
        EnvelopeError::Shape(s) => ProxyError::InvalidRequest(s.to_owned()),
    })?;
    if !modern_header && (msg.method() == "initialize" || !validate::looks_modern(headers, &msg)) {
        return Ok(Classified::Legacy);
    }
    match msg.kind() {
        Ok(Kind::Request) => Ok(Classified::Modern(msg)),
        Ok(Kind::Notification) => Ok(Classified::Notification),
        _ => Err(ProxyError::InvalidRequest(
            "a modern client sends requests only".into(),
        )),
    }
}

async fn modern(app: Arc<App>, headers: &HeaderMap, msg: Message) -> Response<Body> {
    let id = msg.id.clone();
    let request = match validate::validate(headers, msg) {
        Ok(r) => r,
        Err(e) => {
            Metrics::inc(&app.metrics.rejected_requests);
            return edge::error(&e, id.as_deref());
        }
    };
    Metrics::inc(&app.metrics.modern_requests);
    let header = headers
        .get(&app.config.principal_header)
        .map(|v| (app.config.principal_header.clone(), v.clone()));
    let who = Principal {
        digest: principal_digest(header.as_ref().map(|(_, v)| v.as_bytes())),
        header,
    };
    let span = tracing::debug_span!("rpc", method = %request.method, id = %request.id.get());
    let id = request.id.clone();
    async move {
        match route(&app, request, who).await {
            Ok(resp) => resp,
            Err(e) => edge::error(&e, Some(&id)),
        }
    }
    .instrument(span)
    .await
}

async fn route(
    app: &Arc<App>,
    req: ModernRequest,
    who: Principal,
) -> Result<Response<Body>, ProxyError> {
    match req.route {
        Route::Discover => discover(app, &req, who).await,
        Route::Listen => listen::serve(app, req, who.digest, who.header).await,
        Route::Forward {
            input_capable: true,
        } if req.params.contains_key("requestState") => retry(app, req, &who.digest).await,
        Route::Forward { input_capable } => Ok(start_call(app, req, who, input_capable).await),
    }
}

/// A fresh call: the actor forwards it and answers on the leg.
async fn start_call(
    app: &Arc<App>,
    req: ModernRequest,
    who: Principal,
    input_capable: bool,
) -> Response<Body> {
    let (leg, rx) = open_leg(&req);
    let spec = CallSpec {
        request_digest: request_digest(&req.method, req.target(), req.arguments()),
        upstream_params: req.upstream_params(),
        method: req.method,
        capabilities: req.capabilities,
        input_capable,
        principal: who.digest,
        auth: who.header,
    };
    call::spawn(Arc::clone(&app.calls), spec, leg);
    edge::respond(rx, app.config.keepalive).await
}

/// A retry: verify the token before anything else, then hand the answers to the parked call.
async fn retry(
    app: &Arc<App>,
    req: ModernRequest,
    principal: &str,
) -> Result<Response<Body>, ProxyError> {
    let Some(Value::String(token)) = req.params.get("requestState") else {
        return Err(ProxyError::InvalidParams(
            "requestState must be a string".into(),
        ));
    };
    let calls = &app.calls;
    let digest = request_digest(&req.method, req.target(), req.arguments());
    let claims = calls
        .tokens
        .verify(token, principal, &digest, calls.tokens.now())
        .inspect_err(|_| Metrics::inc(&app.metrics.rejected_states))?;
    let answers: Map<String, Value> = match req.params.get("inputResponses") {
        None => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => {
            return Err(ProxyError::InvalidParams(
                "inputResponses must be an object".into(),
            ))
        }
    };
    let tx = calls
        .parked
        .claim(&claims, &answers)
        .inspect_err(|_| Metrics::inc(&app.metrics.rejected_states))?;
    Metrics::inc(&app.metrics.resumes);
    let (leg, rx) = open_leg(&req);
    tx.send(Retry { answers, leg })
        .await
        .map_err(|_| TokenError::Gone("the call ended".into()))?;
    Ok(edge::respond(rx, app.config.keepalive).await)
}

fn open_leg(req: &ModernRequest) -> (Leg, tokio::sync::mpsc::Receiver<call::LegEvent>) {
    Leg::open(
        req.id.clone(),
        req.progress_token.clone(),
        req.log_level.clone(),
    )
}

/// `server/discover`, from the `InitializeResult` of a session of this principal.
async fn discover(
    app: &Arc<App>,
    req: &ModernRequest,
    who: Principal,
) -> Result<Response<Body>, ProxyError> {
    let lease = app
        .pool
        .lease(&who.digest, &req.capabilities, who.header)
        .await?;
    let session = lease.session();
    let ctx = RewriteCtx {
        server_info: None,
        ttl_ms: app.config.cache_ttl_ms,
        scope: app.config.cache_scope,
    };
    let result = rewrite::discover_result(session.init_result(), session.version(), ctx);
    let body = crate::jsonrpc::response_bytes(&req.id, &result.to_string());
    Ok(edge::json(StatusCode::OK, HeaderMap::new(), body))
}
