//! `/.well-known/oauth-protected-resource` (RFC 9728), at the path-suffixed location and at the
//! root, as clients probe them. Resource-server mode serves the proxy's own document;
//! pass-through with `[auth] resource` relays the upstream's, with `resource` made the public
//! URL (an upstream behind a sidecar only knows its internal address).
//!
//! Only the discovery documents an MCP client probes are relayed to the upstream's origin (the
//! protected-resource metadata, RFC 8414 authorization-server metadata, OpenID configuration),
//! each at its root or path-suffixed, and only at a path that every parser reads the same: no
//! `.` or `..` segment, no empty one, no percent-encoding (no `%2e`, no `%2f`), unreserved
//! characters only. Anything else under `/.well-known/` is 404, never relayed: these requests
//! carry no authentication, so they must not reach anything but public metadata. What is relayed
//! is a bodiless GET of the path alone: the query is dropped (none of these documents takes
//! one).

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

/// The well-known documents relayed, each at its root or path-suffixed (RFC 9728 §3.1,
/// RFC 8414 §3.1, and the OpenID path insertion MCP clients try, in the order they probe).
const DOCUMENTS: [&str; 3] = [
    "oauth-protected-resource",
    "oauth-authorization-server",
    "openid-configuration",
];

/// Answers a GET under `/.well-known/`.
pub(crate) async fn serve(app: &App, req: Request<Body>) -> Response<Body> {
    let auth = app.auth.config();
    let path = req.uri().path().to_owned();
    let is_metadata =
        metadata::is_metadata_path(&path, &app.config.server.mcp_path, auth.resource.as_ref());
    if !is_metadata && !is_document(&path) {
        return edge::text(StatusCode::NOT_FOUND, "not found\n");
    }
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
        _ => match bare(req, &path) {
            Some(req) => relay::relay_same_path(app, req).await,
            None => edge::text(StatusCode::NOT_FOUND, "not found\n"),
        },
    }
}

/// Whether `path` is one of [`DOCUMENTS`], at the root or followed by a suffix of clean
/// segments (a trailing `/` allowed), so that no parser upstream reads it as another path.
fn is_document(path: &str) -> bool {
    let Some(rest) = path.strip_prefix("/.well-known/") else {
        return false;
    };
    let (name, suffix) = match rest.split_once('/') {
        Some((name, suffix)) => (name, Some(suffix)),
        None => (rest, None),
    };
    let Some(suffix) = suffix else {
        return DOCUMENTS.contains(&name);
    };
    let suffix = suffix.strip_suffix('/').unwrap_or(suffix);
    DOCUMENTS.contains(&name) && (suffix.is_empty() || suffix.split('/').all(clean_segment))
}

/// A path segment of unreserved characters (RFC 3986 §2.3) only, and not `.` or `..`.
fn clean_segment(segment: &str) -> bool {
    !segment.is_empty()
        && segment != "."
        && segment != ".."
        && segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
}

/// What goes upstream of a GET under `/.well-known/`: its path alone (no query), no body (the
/// relay sends its headers as `[auth]` lets them go for no principal).
fn bare(req: Request<Body>, path: &str) -> Option<Request<Body>> {
    let (mut parts, _) = req.into_parts();
    parts.uri = path.parse().ok()?;
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(header::CONTENT_TYPE);
    Some(Request::from_parts(parts, body::empty()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_discovery_documents_at_clean_paths_are_relayed() {
        for path in [
            "/.well-known/oauth-protected-resource",
            "/.well-known/oauth-protected-resource/mcp",
            "/.well-known/oauth-protected-resource/v1/mcp",
            "/.well-known/oauth-protected-resource/mcp/",
            "/.well-known/oauth-authorization-server",
            "/.well-known/oauth-authorization-server/tenant-1",
            "/.well-known/openid-configuration",
            "/.well-known/openid-configuration/realms/my_realm.v2~x",
        ] {
            assert!(is_document(path), "{path}");
        }
        for path in [
            "/.well-known/",
            "/.well-known/foo",
            "/.well-known/../mcp",
            "/.well-known/./oauth-protected-resource",
            "/.well-known/oauth-protected-resource/../../mcp",
            "/.well-known/oauth-protected-resource/./mcp",
            "/.well-known/oauth-protected-resource/..",
            "/.well-known/oauth-protected-resource/%2e%2e/mcp",
            "/.well-known/oauth-protected-resource/%2E%2E/mcp",
            "/.well-known/oauth-protected-resource%2f..%2fmcp",
            "/.well-known/oauth-protected-resource/a%2fb",
            "/.well-known/oauth-protected-resource//mcp",
            "/.well-known/oauth-protected-resource/mcp//",
            "/.well-known/oauth-protected-resourcex",
            "/.well-known/openid-configuration/a;b",
            "/.well-known/openid-configuration/a:b",
            "/.well-known/%6fauth-authorization-server",
            "/.well-known/OAUTH-AUTHORIZATION-SERVER",
            "/mcp",
        ] {
            assert!(!is_document(path), "{path}");
        }
    }
}
