//! `/.well-known/oauth-protected-resource` (RFC 9728), at the path-suffixed location and at the
//! root, as clients probe them. Resource-server mode serves the proxy's own document;
//! pass-through with `[auth] resource` relays the upstream's, with `resource` made the public
//! URL (an upstream behind a sidecar only knows its internal address). Anything else under
//! `/.well-known/` is relayed to the upstream's origin unchanged.

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt;

use super::relay;
use crate::app::App;
use crate::auth::metadata::{self, PRM_PREFIX};
use crate::body::{self, Body};
use crate::edge;

/// Largest metadata document read from the upstream.
const MAX_METADATA_BYTES: usize = 64 * 1024;

/// Answers a GET under `/.well-known/`.
pub(crate) async fn serve(app: &App, req: Request<Body>) -> Response<Body> {
    let auth = app.auth.config();
    let is_metadata = metadata::is_metadata_path(
        req.uri().path(),
        &app.config.server.mcp_path,
        auth.resource.as_ref(),
    );
    if is_metadata && auth.require {
        let doc = metadata::document(auth);
        return edge::json(
            StatusCode::OK,
            public_headers(),
            crate::jsonrpc::text(&doc).into_bytes(),
        );
    }
    if !app.pool.has_origin() {
        return edge::text(StatusCode::NOT_FOUND, "not found\n");
    }
    match (&auth.resource, is_metadata) {
        (Some(public), true) => relayed_metadata(app, public).await,
        _ => relay::relay_same_path(app, req).await,
    }
}

// The upstream's metadata (its path-suffixed document, else its root one), `resource` made
// `public`.
async fn relayed_metadata(app: &App, public: &http::Uri) -> Response<Body> {
    let upstream_path = app.pool.client().uri().path().to_owned();
    for path in [
        metadata::metadata_path(&upstream_path),
        PRM_PREFIX.to_owned(),
    ] {
        let get = Request::get(path.as_str()).body(body::empty());
        let Ok(get) = get else { continue };
        let Ok(resp) = relay::forward(app, get, &path, relay::Behalf::Nobody).await else {
            return edge::text(StatusCode::BAD_GATEWAY, "the upstream is unreachable\n");
        };
        if resp.status() != StatusCode::OK {
            continue;
        }
        let Some(bytes) = read_bounded(resp.into_body()).await else {
            return edge::text(
                StatusCode::BAD_GATEWAY,
                "the upstream's metadata is too large\n",
            );
        };
        return match metadata::with_resource(&bytes, public) {
            Some(doc) => edge::json(StatusCode::OK, public_headers(), doc),
            None => edge::text(
                StatusCode::BAD_GATEWAY,
                "the upstream's metadata is not JSON\n",
            ),
        };
    }
    edge::text(
        StatusCode::NOT_FOUND,
        "the upstream serves no protected-resource metadata\n",
    )
}

// The body, unless it is over the bound or breaks.
async fn read_bounded(mut body: Body) -> Option<Bytes> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.ok()?.into_data() {
            if out.len() + data.len() > MAX_METADATA_BYTES {
                return None;
            }
            out.extend_from_slice(&data);
        }
    }
    Some(out.into())
}

// Metadata is public: any origin may read it (a browser client discovers from another origin).
fn public_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    h
}
