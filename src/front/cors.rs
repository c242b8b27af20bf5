//! Browsers: the `Origin` check every request passes (a MUST of the transport), and CORS answers
//! for allowed origins — the `OPTIONS` preflight and the headers every answer then carries.

use http::{header, HeaderMap, HeaderValue, Response, StatusCode};

use crate::body::Body;
use crate::edge;

/// `Origin` check (the request's `Origin` header): absent → allowed; loopback origins →
/// allowed; else must be in the allow-list.
pub(super) fn origin_allowed(origin: Option<&HeaderValue>, allowed: &[String]) -> bool {
    let Some(origin) = origin.and_then(|v| v.to_str().ok()) else {
        return true;
    };
    if allowed
        .iter()
        .any(|a| a == "*" || a.eq_ignore_ascii_case(origin))
    {
        return true;
    }
    let Ok(uri) = origin.parse::<http::Uri>() else {
        return false;
    };
    matches!(
        uri.host(),
        Some("localhost" | "127.0.0.1" | "[::1]" | "::1")
    )
}

/// The answer to a preflight from an allowed origin (others were refused before).
pub(super) fn preflight(origin: Option<HeaderValue>, headers: &HeaderMap) -> Response<Body> {
    let mut r = edge::empty(StatusCode::NO_CONTENT);
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

/// Lets `origin` read `resp` (and the headers a client needs from it).
pub(super) fn allow_origin(resp: &mut Response<Body>, origin: HeaderValue) {
    let h = resp.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.append(header::VARY, HeaderValue::from_static("Origin"));
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("Mcp-Session-Id, WWW-Authenticate, Retry-After"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(value: &str) -> HeaderValue {
        value.parse().unwrap()
    }

    #[test]
    fn origins() {
        assert!(origin_allowed(None, &[]));
        assert!(origin_allowed(Some(&origin("http://localhost:3000")), &[]));
        assert!(!origin_allowed(Some(&origin("https://evil.example")), &[]));
        assert!(origin_allowed(
            Some(&origin("https://app.example")),
            &["https://app.example".into()]
        ));
    }
}
