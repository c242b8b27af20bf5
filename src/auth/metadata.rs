//! RFC 9728 protected-resource metadata: the document resource-server mode serves, where it is
//! served (path-suffixed first, then the root, as clients probe), and the rewrites pass-through
//! makes so an upstream that only knows its internal address still names the public one.

use http::{HeaderValue, Uri};
use serde_json::{json, Value};

use crate::config;

/// The well-known prefix of protected-resource metadata.
pub(crate) const PRM_PREFIX: &str = "/.well-known/oauth-protected-resource";

/// The metadata URL of `resource`: its origin, the well-known prefix, then its path.
pub(crate) fn metadata_url(resource: &Uri) -> String {
    let scheme = resource.scheme_str().unwrap_or("https");
    let authority = resource.authority().map_or("", |a| a.as_str());
    format!("{scheme}://{authority}{}", metadata_path(resource.path()))
}

/// The path-suffixed metadata path of an endpoint at `path`.
pub(crate) fn metadata_path(path: &str) -> String {
    match path.trim_end_matches('/') {
        "" => PRM_PREFIX.to_owned(),
        p => format!("{PRM_PREFIX}{p}"),
    }
}

/// Whether `path` is where a client looks for the metadata of the endpoint at `mcp_path`:
/// path-suffixed, or at the root.
pub(crate) fn is_metadata_path(path: &str, mcp_path: &str, resource: Option<&Uri>) -> bool {
    path == PRM_PREFIX
        || path == metadata_path(mcp_path)
        || resource.is_some_and(|r| path == metadata_path(r.path()))
}

/// The document resource-server mode serves.
pub(crate) fn document(cfg: &config::Auth) -> Value {
    let mut doc = json!({
        "resource": cfg.resource.as_ref().map(ToString::to_string),
        "authorization_servers": cfg.authorization_servers,
        "bearer_methods_supported": ["header"],
    });
    if !cfg.scopes_supported.is_empty() {
        doc["scopes_supported"] = json!(cfg.scopes_supported);
    }
    doc
}

/// An upstream's metadata document with `resource` made `public`; `None` when it is not a JSON
/// object (relayed unchanged then).
pub(crate) fn with_resource(body: &[u8], public: &Uri) -> Option<Vec<u8>> {
    let mut doc: Value = serde_json::from_slice(body).ok()?;
    doc.as_object_mut()?
        .insert("resource".into(), Value::String(public.to_string()));
    serde_json::to_vec(&doc).ok()
}

/// A `WWW-Authenticate` value with its `resource_metadata` parameter made `url`; `None` when it
/// names none.
pub(crate) fn with_metadata_url(challenge: &HeaderValue, url: &str) -> Option<HeaderValue> {
    let text = challenge.to_str().ok()?;
    let key = "resource_metadata=\"";
    let start = text.find(key)? + key.len();
    let len = text[start..].find('"')?;
    let rewritten = format!("{}{url}{}", &text[..start], &text[start + len..]);
    HeaderValue::from_str(&rewritten).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_urls_follow_rfc_9728() {
        let r: Uri = "https://mcp.example.com/mcp".parse().unwrap();
        assert_eq!(
            metadata_url(&r),
            "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"
        );
        let root: Uri = "https://mcp.example.com/".parse().unwrap();
        assert_eq!(
            metadata_url(&root),
            "https://mcp.example.com/.well-known/oauth-protected-resource"
        );
        assert!(is_metadata_path(PRM_PREFIX, "/mcp", None));
        assert!(is_metadata_path(
            "/.well-known/oauth-protected-resource/mcp",
            "/mcp",
            None
        ));
        assert!(!is_metadata_path(
            "/.well-known/oauth-authorization-server",
            "/mcp",
            None
        ));
    }

    #[test]
    fn an_upstream_challenge_names_the_public_metadata() {
        let c = HeaderValue::from_static(
            r#"Bearer error="invalid_token", resource_metadata="http://10.0.0.7:8000/.well-known/oauth-protected-resource/mcp""#,
        );
        let out = with_metadata_url(
            &c,
            "https://mcp.example.com/.well-known/oauth-protected-resource/mcp",
        )
        .unwrap();
        assert_eq!(
            out,
            r#"Bearer error="invalid_token", resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource/mcp""#
        );
        assert!(with_metadata_url(&HeaderValue::from_static("Bearer"), "x").is_none());
        let doc = with_resource(
            br#"{"resource":"http://10.0.0.7:8000/mcp","authorization_servers":["a"]}"#,
            &"https://mcp.example.com/mcp".parse().unwrap(),
        )
        .unwrap();
        let doc: Value = serde_json::from_slice(&doc).unwrap();
        assert_eq!(doc["resource"], "https://mcp.example.com/mcp");
        assert_eq!(doc["authorization_servers"][0], "a");
    }
}
