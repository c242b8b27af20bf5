//! Legacy clients in resource-server mode: every request they make is identified like a modern
//! one, and what the proxy relays upstream carries the verified subject, never their token nor a
//! subject header of their own.

use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use mrtr_proxy::body::{empty, full, Body};
use serde_json::{json, Value};

use super::{header_of, jwt_config, start, AuthServer, Key, RS};
use crate::support::mock::Mock;
use crate::support::TestProxy;

async fn rs_proxy(mock: &Mock, auth: &AuthServer, extra: &str) -> TestProxy {
    let config = jwt_config(&auth.jwks_uri(), &format!("{RS}\n{extra}"), "");
    start(mock, &config).await
}

// A legacy client's request through the proxy (`msg` POSTed, else a GET stream or a DELETE of
// `session`) with `headers`: status and session id. A GET stream is left open unread.
async fn legacy(
    proxy: &TestProxy,
    method: Method,
    session: Option<&str>,
    headers: &[(&str, &str)],
    msg: Option<Value>,
) -> (StatusCode, Option<String>) {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Body>();
    let mut b = Request::builder()
        .method(method.clone())
        .uri(proxy.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25");
    let session = session.map(|s| ("mcp-session-id", s));
    for (k, v) in headers.iter().copied().chain(session) {
        b = b.header(k, v);
    }
    let body = msg.map_or_else(empty, |m| full(m.to_string()));
    let resp = http.request(b.body(body).unwrap()).await.unwrap();
    let sid = resp.headers().get("mcp-session-id");
    let sid = sid.map(|v| v.to_str().unwrap().to_owned());
    let status = resp.status();
    if method != Method::GET {
        let _ = resp.into_body().collect().await;
    }
    (status, sid)
}

fn initialize() -> Option<Value> {
    Some(
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",
           "capabilities":{},"clientInfo":{"name":"legacy","version":"1"}}}),
    )
}

#[tokio::test]
async fn a_legacy_clients_own_subject_header_is_replaced_by_the_verified_one() {
    let key = Key::new("k1");
    let auth = AuthServer::with(&key).await;
    let mock = Mock::start().await;
    let proxy = rs_proxy(&mock, &auth, "").await;
    let token = key.bearer("alice");
    let forged = [("authorization", token.as_str()), ("x-mcp-subject", "root")];
    let (status, sid) = legacy(&proxy, Method::POST, None, &forged, initialize()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(sid.is_some(), "the upstream's session came back");
    let init = |m: &Value| m["method"] == "initialize";
    assert_eq!(
        header_of(&mock, "x-mcp-subject", init),
        [Some("alice".to_owned())]
    );
    assert_eq!(header_of(&mock, "authorization", init), [None]);
}

#[tokio::test]
async fn a_legacy_clients_get_stream_and_delete_carry_the_subject_not_the_token() {
    let key = Key::new("k1");
    let auth = AuthServer::with(&key).await;
    let mock = Mock::start().await;
    let proxy = rs_proxy(&mock, &auth, "").await;
    let token = key.bearer("alice");
    let forged = [("authorization", token.as_str()), ("x-mcp-subject", "root")];
    let (_, sid) = legacy(&proxy, Method::POST, None, &forged, initialize()).await;
    let sid = sid.expect("a session");
    for method in [Method::GET, Method::DELETE] {
        let (status, _) = legacy(&proxy, method.clone(), Some(&sid), &forged, None).await;
        assert_eq!(status, StatusCode::OK, "{method}");
    }
    let relayed: Vec<String> = mock
        .requests()
        .into_iter()
        .filter(|(m, _, h)| {
            *m != Method::POST && h.get("mcp-session-id").is_some_and(|s| s == &sid)
        })
        .map(|(m, _, h)| {
            let get = |n: &str| h.get(n).map(|v| v.to_str().unwrap().to_owned());
            let token = get("authorization").map(|_| "<the client's token>");
            format!(
                "{m}: authorization {token:?}, x-mcp-subject {:?}",
                get("x-mcp-subject")
            )
        })
        .collect();
    let expected = ["GET", "DELETE"]
        .map(|m| format!("{m}: authorization None, x-mcp-subject Some(\"alice\")"));
    assert_eq!(relayed, expected);
}

#[tokio::test]
async fn a_legacy_clients_call_needs_the_scope_too() {
    let key = Key::new("k1");
    let auth = AuthServer::with(&key).await;
    let mock = Mock::start().await;
    let proxy = rs_proxy(&mock, &auth, "[auth.scopes]\n\"admin_*\" = [\"admin\"]").await;
    let token = key.bearer("alice");
    let headers = [("authorization", token.as_str())];
    let (_, sid) = legacy(&proxy, Method::POST, None, &headers, initialize()).await;
    let call = json!({"jsonrpc":"2.0","id":2,"method":"tools/call",
                      "params":{"name":"admin_reset","arguments":{}}});
    let (status, _) = legacy(&proxy, Method::POST, sid.as_deref(), &headers, Some(call)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(mock.calls_of("admin_reset"), 0);
}

#[tokio::test]
async fn a_legacy_request_without_a_token_is_401() {
    let auth = AuthServer::with(&Key::new("k1")).await;
    let mock = Mock::start().await;
    let proxy = rs_proxy(&mock, &auth, "").await;
    let (status, sid) = legacy(&proxy, Method::POST, None, &[], initialize()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(sid.is_none());
}
