//! The request path, top to bottom: `classify` (era and envelope) → `intercept` (discover, listen,
//! resume a parked call, or start one) → the call actor forwards upstream → `respond` (JSON or SSE).
//! Legacy traffic leaves at `classify` for the byte relay.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::{Map, Value};

use crate::body::{self, Body};
use crate::call::{self, CallSpec};
use crate::error::ProxyError;
use crate::front::{self, ModernRequest, Route};
use crate::jsonrpc::{Kind, Message};
use crate::metrics::Metrics;
use crate::parked::Resume;
use crate::rewrite::{self, RewriteCtx};
use crate::server::App;
use crate::state_token::{principal_digest, request_digest};
use crate::upstream::session::SESSION_HEADER;
use crate::{listen, relay};

/// Handles one request on the MCP path.
pub async fn handle(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    if !front::origin_allowed(req.headers(), &app.config.allowed_origins) {
        return ProxyError::Forbidden.into_response(None);
    }
    let origin = req.headers().get(header::ORIGIN).cloned();
    if *req.method() == Method::OPTIONS {
        return preflight(origin, req.headers());
    }
    let mut resp = dispatch(app, req).await;
    if let Some(origin) = origin {
        allow_origin(&mut resp, origin);
    }
    resp
}

async fn dispatch(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let has_session = req.headers().contains_key(SESSION_HEADER);
    match *req.method() {
        Method::POST => post(app, req).await,
        // A legacy client's GET stream or DELETE: relay untouched and unbuffered.
        Method::GET | Method::DELETE if has_session => {
            Metrics::inc(&app.metrics.legacy_requests);
            relay::relay(&app, req.map(|b| b.map_err(Into::into).boxed())).await
        }
        _ => {
            let mut r = ProxyError::MethodNotAllowed.into_response(None);
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("POST"));
            r
        }
    }
}

// CORS, for browser clients from an allowed origin (the check above already refused the others).
fn preflight(origin: Option<HeaderValue>, headers: &http::HeaderMap) -> Response<Body> {
    let mut r = Response::new(body::empty());
    *r.status_mut() = StatusCode::NO_CONTENT;
    let h = r.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("POST, GET, DELETE, OPTIONS"),
    );
    if let Some(asked) = headers.get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
    }
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    if let Some(origin) = origin {
        allow_origin(&mut r, origin);
    }
    r
}

fn allow_origin(resp: &mut Response<Body>, origin: HeaderValue) {
    let h = resp.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.append(header::VARY, HeaderValue::from_static("Origin"));
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("Mcp-Session-Id, WWW-Authenticate, Retry-After"),
    );
}

async fn post(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let bytes = match Limited::new(body, app.config.max_body_bytes)
        .collect()
        .await
    {
        Ok(c) => c.to_bytes(),
        Err(_) => {
            return ProxyError::BodyTooLarge {
                limit: app.config.max_body_bytes,
            }
            .into_response(None)
        }
    };
    let msg = match classify(&parts.headers, &bytes) {
        Ok(Classified::Modern(msg)) => msg,
        Ok(Classified::Legacy) => {
            Metrics::inc(&app.metrics.legacy_requests);
            return relay::relay(&app, Request::from_parts(parts, body::full(bytes))).await;
        }
        Ok(Classified::Notification) => return accepted(),
        Err(e) => return e.into_response(None),
    };
    let id = msg.id.clone();
    let request = match front::validate(&parts.headers, msg) {
        Ok(r) => r,
        Err(e) => {
            Metrics::inc(&app.metrics.rejected_requests);
            return e.into_response(id.as_deref());
        }
    };
    Metrics::inc(&app.metrics.modern_requests);
    let auth = parts
        .headers
        .get(&app.config.principal_header)
        .map(|v| (app.config.principal_header.clone(), v.clone()));
    let principal = principal_digest(auth.as_ref().map(|(_, v)| v.as_bytes()));
    let span = tracing::debug_span!("rpc", method = %request.method);
    let _enter = span.enter();
    match intercept(app, request, principal, auth).await {
        Ok(resp) => resp,
        Err((e, id)) => {
            tracing::debug!(error = %e, "request failed");
            e.into_response(Some(&id))
        }
    }
}

enum Classified {
    Modern(Message),
    Legacy,
    Notification,
}

/// Decides the era. Modern: the 2026-07-28 version header (an `Mcp-Session-Id` beside it is
/// ignored, as the spec asks of modern servers) or modern `_meta`. Legacy: a session id, an
/// `initialize`, or a legacy version header without modern `_meta`.
fn classify(headers: &http::HeaderMap, bytes: &Bytes) -> Result<Classified, ProxyError> {
    let modern_header = headers
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim() >= front::MODERN_VERSION);
    if !modern_header && headers.contains_key(SESSION_HEADER) {
        return Ok(Classified::Legacy);
    }
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(ProxyError::InvalidRequest(
            "batches are not supported".into(),
        ));
    }
    let msg = Message::parse(bytes).map_err(|e| match e {
        crate::jsonrpc::EnvelopeError::Json(e) => ProxyError::Parse(e.to_string()),
        crate::jsonrpc::EnvelopeError::Shape(s) => ProxyError::InvalidRequest(s.to_owned()),
    })?;
    if !modern_header && (msg.method() == "initialize" || !front::looks_modern(headers, &msg)) {
        return Ok(Classified::Legacy);
    }
    match msg.kind() {
        Ok(Kind::Request) => Ok(Classified::Modern(msg)),
        // 2026-07-28 defines no client→server notifications over HTTP: accept and ignore.
        Ok(Kind::Notification) => Ok(Classified::Notification),
        _ => Err(ProxyError::InvalidRequest(
            "a modern client sends requests only".into(),
        )),
    }
}

type Failed = (ProxyError, Box<serde_json::value::RawValue>);

async fn intercept(
    app: Arc<App>,
    req: ModernRequest,
    principal: String,
    auth: Option<(http::HeaderName, HeaderValue)>,
) -> Result<Response<Body>, Failed> {
    let id = req.id.clone();
    match req.route {
        Route::Discover => discover(&app, &req, &principal, auth)
            .await
            .map_err(|e| (e, id)),
        Route::Listen => listen::serve(app, req, principal, auth)
            .await
            .map_err(|e| (e, id)),
        Route::Forward { input_capable } => {
            let digest = request_digest(&req.method, req.target(), req.arguments());
            let state = req.params.get("requestState");
            if input_capable && state.is_some() {
                return resume(app, req, principal, digest)
                    .await
                    .map_err(|e| (e, id));
            }
            let (leg, rx) = call::leg(
                req.id.clone(),
                req.progress_token.clone(),
                req.log_level.clone(),
            );
            let spec = CallSpec {
                upstream_params: req.upstream_params(),
                method: req.method,
                capabilities: req.capabilities,
                input_capable,
                principal,
                auth,
                request_digest: digest,
            };
            call::spawn(Arc::clone(&app), spec, leg);
            Ok(call::respond(rx, app.config.keepalive).await)
        }
    }
}

/// A retry: verify the token before anything else, then hand the answers to the parked call.
async fn resume(
    app: Arc<App>,
    req: ModernRequest,
    principal: String,
    digest: String,
) -> Result<Response<Body>, ProxyError> {
    let Some(Value::String(token)) = req.params.get("requestState") else {
        return Err(ProxyError::InvalidParams(
            "requestState must be a string".into(),
        ));
    };
    let claims = app
        .tokens
        .verify(token, &principal, &digest, app.tokens.now())
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
    let tx = app
        .parked
        .claim(&claims, &answers)
        .inspect_err(|_| Metrics::inc(&app.metrics.rejected_states))?;
    Metrics::inc(&app.metrics.resumes);
    let (leg, rx) = call::leg(
        req.id.clone(),
        req.progress_token.clone(),
        req.log_level.clone(),
    );
    tx.send(Resume { answers, leg })
        .await
        .map_err(|_| crate::state_token::TokenError::Gone("the call ended".into()))?;
    Ok(call::respond(rx, app.config.keepalive).await)
}

async fn discover(
    app: &Arc<App>,
    req: &ModernRequest,
    principal: &str,
    auth: Option<(http::HeaderName, HeaderValue)>,
) -> Result<Response<Body>, ProxyError> {
    let lease = app.pool.lease(principal, &req.capabilities, auth).await?;
    let session = lease.session();
    let ctx = RewriteCtx {
        server_info: None,
        ttl_ms: app.config.cache_ttl_ms,
        scope: app.config.cache_scope,
    };
    let result = rewrite::discover_result(session.init_result(), session.version(), ctx);
    let body = crate::jsonrpc::response_bytes(&req.id, &result.to_string());
    drop(lease);
    let mut r = Response::new(body::full(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(r)
}

fn accepted() -> Response<Body> {
    let mut r = Response::new(body::empty());
    *r.status_mut() = StatusCode::ACCEPTED;
    r
}
