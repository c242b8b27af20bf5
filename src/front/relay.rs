//! Legacy pass-through: a request from a legacy client (an `initialize`, or anything carrying
//! `Mcp-Session-Id`) goes to the upstream unchanged and the answer streams back unchanged.

use std::sync::Arc;

use http::{header, Request, Response, Uri};
use http_body_util::BodyExt;

use crate::app::App;
use crate::body::{self, Body};
use crate::edge::{self, Settled};
use crate::error::ProxyError;
use crate::ops::metrics::{Direction, Metrics, Outcome, RequestTimer};
use crate::protocol::strip_hop_by_hop;

/// Relays `req` to the upstream's MCP endpoint and streams the response back, counting the
/// body bytes both ways.
pub(super) async fn relay(app: &App, req: Request<Body>, timer: RequestTimer) -> Response<Body> {
    let path = app.pool.client().uri().path().to_owned();
    let metrics = &app.metrics;
    let req = req.map(|b| counted(b, Arc::clone(metrics), Direction::ToUpstream));
    match forward(app, req, &path).await {
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
/// (RFC 9728 protected-resource metadata, authorization-server metadata), so that a client the
/// upstream challenges (401 + `WWW-Authenticate`) through the proxy can discover how to log in.
pub(crate) async fn relay_same_path(app: &App, req: Request<Body>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    forward(app, req, &path)
        .await
        .unwrap_or_else(|e| edge::error(&e, None))
}

/// Sends `req` to `path` on the upstream's origin and returns its answer, hop-by-hop headers
/// removed both ways (counted by the caller, if at all).
///
/// # Errors
/// [`ProxyError::Upstream`] when the upstream cannot be reached.
pub(super) async fn forward(
    app: &App,
    req: Request<Body>,
    path: &str,
) -> Result<Response<Body>, ProxyError> {
    let (mut parts, body) = req.into_parts();
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
