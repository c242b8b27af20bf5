//! Legacy pass-through: a request from a legacy client (an `initialize`, or anything carrying
//! `Mcp-Session-Id`) goes to the upstream unchanged and the answer streams back unchanged —
//! but for its credentials: [`forward`], the one way a client's request leaves for the
//! upstream's origin, applies the principal's credentials policy (`[auth]`) itself, so no path
//! can relay a client's token or a subject header it wrote, nor trace-context headers that do
//! not validate (`trace_context`). [`name_span`] names a legacy request in its span, relayed or
//! served here.

use std::borrow::Cow;
use std::sync::Arc;

use http::{header, Request, Response, Uri};
use http_body_util::BodyExt;
use serde_json::value::RawValue;

use crate::app::App;
use crate::auth::Principal;
use crate::body::{self, Body};
use crate::edge::{self, Settled};
use crate::error::ProxyError;
use crate::ops::metrics::{Direction, Metrics, Outcome, RequestTimer};
use crate::protocol::strip_hop_by_hop;
use crate::trace_context::TraceContext;

/// Longest method name or id a legacy request's span records: both are the client's text.
const MAX_NAMED_BYTES: usize = 64;
/// Most members of a batch its span names.
const MAX_NAMED_MEMBERS: usize = 8;

/// On whose behalf a request goes upstream: what its credentials may be.
#[derive(Debug, Clone, Copy)]
pub(super) enum Behalf<'a> {
    /// A client's request: in resource-server mode its token stays here (unless
    /// `forward_authorization`) and only the verified subject goes upstream.
    Of(&'a Principal),
    /// Nobody's (a `/.well-known/` document): no subject, and no token in resource-server mode.
    Nobody,
}

/// Relays `who`'s `req` to the upstream's MCP endpoint and streams the response back, counting
/// the body bytes both ways.
pub(super) async fn relay(
    app: &App,
    req: Request<Body>,
    who: &Principal,
    timer: RequestTimer,
) -> Response<Body> {
    let path = app.pool.client().uri().path().to_owned();
    let metrics = &app.metrics;
    let req = req.map(|b| counted(b, Arc::clone(metrics), Direction::ToUpstream));
    match forward(app, req, &path, Behalf::Of(who)).await {
        Ok(resp) => {
            let settled = Settled {
                upstream_status: Some(resp.status().as_u16()),
                ..Settled::with(Outcome::Relayed)
            };
            edge::settle(timer, settled);
            resp.map(|b| counted(b, Arc::clone(metrics), Direction::ToClient))
        }
        Err(e) => edge::fail(timer, &e, None),
    }
}

/// Records a legacy POST's JSON-RPC method and id in its request span (`rpc.method`,
/// `rpc.id`), as a modern request's are: a batch's methods and ids joined by commas (the first
/// eight, then `…`), a response's id alone. A name or id past 64 bytes is left out (the
/// client's text in every log line of its request), and a body that is not JSON-RPC names
/// nothing. Not read at all when the span is off.
pub(super) fn name_span(span: &tracing::Span, body: &[u8]) {
    #[derive(serde::Deserialize)]
    struct Named<'a> {
        #[serde(borrow, default)]
        method: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        id: Option<&'a RawValue>,
    }
    if span.is_disabled() {
        return;
    }
    let batch = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[');
    let named: Vec<Named<'_>> = if batch {
        serde_json::from_slice(body).unwrap_or_default()
    } else {
        serde_json::from_slice(body).map_or_else(|_| Vec::new(), |n| vec![n])
    };
    let joined = |part: &dyn Fn(&Named<'_>) -> Option<String>| {
        let mut parts: Vec<String> = named
            .iter()
            .take(MAX_NAMED_MEMBERS)
            .filter_map(part)
            .filter(|p| p.len() <= MAX_NAMED_BYTES)
            .collect();
        if named.len() > MAX_NAMED_MEMBERS && !parts.is_empty() {
            parts.push("…".to_owned());
        }
        parts.join(",")
    };
    let methods = joined(&|n| n.method.as_deref().map(str::to_owned));
    let ids = joined(&|n| n.id.map(|id| id.get().to_owned()));
    if !methods.is_empty() {
        span.record("rpc.method", methods.as_str());
    }
    if !ids.is_empty() {
        span.record("rpc.id", ids.as_str());
    }
}

fn counted(body: Body, metrics: Arc<Metrics>, direction: Direction) -> Body {
    body.map_frame(move |frame| {
        if let Some(data) = frame.data_ref() {
            metrics.relayed(direction, data.len());
        }
        frame
    })
    .boxed()
}

/// Relays `req` to the same path on the upstream's origin: OAuth metadata under `/.well-known/`
/// (RFC 9728 protected-resource metadata, authorization-server metadata, OpenID configuration:
/// the paths `well_known` allows, without their query), so that a client the upstream
/// challenges (401 + `WWW-Authenticate`) through the proxy can discover how to log in.
pub(crate) async fn relay_same_path(app: &App, req: Request<Body>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    forward(app, req, &path, Behalf::Nobody)
        .await
        .unwrap_or_else(|e| edge::error(&e, None))
}

/// Sends `req` to `path` on the upstream's origin and returns its answer, hop-by-hop headers
/// removed both ways (counted by the caller, if at all), its credentials as `behalf` may have
/// them and its trace-context headers checked ([`TraceContext::check_headers`]).
///
/// # Errors
/// [`ProxyError::Upstream`] when the upstream cannot be reached.
pub(super) async fn forward(
    app: &App,
    req: Request<Body>,
    path: &str,
    behalf: Behalf<'_>,
) -> Result<Response<Body>, ProxyError> {
    let (mut parts, body) = req.into_parts();
    match behalf {
        Behalf::Of(who) => app.auth.relay_headers(&mut parts.headers, who),
        Behalf::Nobody => app.auth.scrub(&mut parts.headers),
    }
    // Trace-context headers that do not validate are not sent on (the body is not looked at).
    TraceContext::check_headers(&mut parts.headers).count(&app.metrics);
    let upstream = app.pool.client().uri();
    parts.uri = match parts.uri.query() {
        // The common case, the MCP endpoint itself: the upstream's URI as configured.
        None if path == upstream.path() && upstream.query().is_none() => upstream.clone(),
        query => {
            let path_and_query = match query {
                Some(q) => format!("{path}?{q}"),
                None => path.to_owned(),
            };
            let mut builder = Uri::builder().path_and_query(path_and_query);
            if let (Some(s), Some(a)) = (upstream.scheme(), upstream.authority()) {
                builder = builder.scheme(s.clone()).authority(a.clone());
            }
            builder
                .build()
                .map_err(|e| ProxyError::Internal(e.to_string()))?
        }
    };
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::HOST);
    parts.version = http::Version::HTTP_11;
    match app
        .pool
        .client()
        .send(Request::from_parts(parts, body))
        .await
    {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            // A small answer that has arrived whole goes out in one write.
            let body = body::settle(body.map_err(Into::into).boxed(), body::SETTLE_MAX_BYTES).await;
            Ok(Response::from_parts(parts, body))
        }
        Err(e) => Err(ProxyError::Upstream(e)),
    }
}
