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

const APPROVAL: &str = r#"
[approval.tools."delete_*"]
message = "Delete {repo}?"
"#;

// A legacy session (declaring elicitation) of the client with `headers`, asked inline about a
// gated `delete_repo` it calls, which it approves; what the upstream's `tools/call` carried:
// (authorization, x-mcp-subject).
async fn approved_legacy_call(
    proxy: &TestProxy,
    mock: &Mock,
    headers: &[(&str, &str)],
) -> (Option<String>, Option<String>) {
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",
        "capabilities":{"elicitation":{}},"clientInfo":{"name":"legacy","version":"1"}}});
    let (status, sid) = legacy(proxy, Method::POST, None, headers, Some(init)).await;
    assert_eq!(status, StatusCode::OK);
    let sid = sid.expect("a session");
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Body>();
    let call = json!({"jsonrpc":"2.0","id":7,"method":"tools/call",
                      "params":{"name":"delete_repo","arguments":{"repo":"acme/site"}}});
    let mut b = Request::post(proxy.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .header("mcp-session-id", &sid);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = http
        .request(b.body(full(call.to_string())).unwrap())
        .await
        .unwrap();
    let mut body = resp.into_body();
    let mut decoder = mrtr_proxy::sse::SseDecoder::new(1 << 20);
    let mut next = async || loop {
        let frame = tokio::time::timeout(std::time::Duration::from_secs(10), body.frame())
            .await
            .expect("a message within 10 s")
            .expect("the stream is open")
            .unwrap();
        if let Some(data) = frame.data_ref() {
            if let Some(ev) = decoder.feed(data).unwrap().into_iter().next() {
                break serde_json::from_str::<Value>(&ev.data).unwrap();
            }
        }
    };
    let asked = next().await;
    assert_eq!(asked["method"], "elicitation/create", "{asked}");
    let answer = json!({"jsonrpc":"2.0","id":asked["id"],"result":{"action":"accept","content":{"approve":true}}});
    let (status, _) = legacy(proxy, Method::POST, Some(&sid), headers, Some(answer)).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let done = next().await;
    assert_eq!(done["id"], 7, "{done}");
    let called = |m: &Value| m["method"] == "tools/call";
    let [authorization] = header_of(mock, "authorization", called).try_into().unwrap();
    let [subject] = header_of(mock, "x-mcp-subject", called).try_into().unwrap();
    (authorization, subject)
}

#[tokio::test]
async fn an_approved_legacy_call_carries_the_verified_subject_and_never_the_clients_token() {
    let key = Key::new("k1");
    let auth = AuthServer::with(&key).await;
    let mock = crate::sse_front::repos().await;
    let proxy = rs_proxy(&mock, &auth, APPROVAL).await;
    let token = key.bearer("alice");
    let forged = [("authorization", token.as_str()), ("x-mcp-subject", "root")];
    let (authorization, subject) = approved_legacy_call(&proxy, &mock, &forged).await;
    assert_eq!(authorization, None, "the client's token stays at the proxy");
    assert_eq!(
        subject.as_deref(),
        Some("alice"),
        "the verified subject only"
    );
}

#[tokio::test]
async fn with_forward_authorization_an_approved_legacy_call_carries_the_token_and_the_verified_subject(
) {
    let key = Key::new("k1");
    let auth = AuthServer::with(&key).await;
    let mock = crate::sse_front::repos().await;
    let extra = format!("forward_authorization = true\n{APPROVAL}");
    let config = jwt_config(&auth.jwks_uri(), &format!("{RS}\n{extra}"), "");
    // `[approval]` after `[auth]`'s keys: the section is closed by the one that follows.
    let proxy = start(&mock, &config).await;
    let token = key.bearer("alice");
    let forged = [("authorization", token.as_str()), ("x-mcp-subject", "root")];
    let (authorization, subject) = approved_legacy_call(&proxy, &mock, &forged).await;
    assert_eq!(authorization.as_deref(), Some(token.as_str()));
    assert_eq!(subject.as_deref(), Some("alice"));
}

#[tokio::test]
async fn every_member_of_a_legacy_batch_needs_its_scope() {
    let key = Key::new("k1");
    let auth = AuthServer::with(&key).await;
    let mock = Mock::start().await;
    let proxy = rs_proxy(&mock, &auth, "[auth.scopes]\n\"admin_*\" = [\"admin\"]").await;
    let token = key.bearer("alice");
    let headers = [("authorization", token.as_str())];
    let (_, sid) = legacy(&proxy, Method::POST, None, &headers, initialize()).await;
    let batch = json!([
        {"jsonrpc":"2.0","id":2,"method":"tools/list"},
        {"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"admin_reset","arguments":{}}}
    ]);
    let (status, _) = legacy(&proxy, Method::POST, sid.as_deref(), &headers, Some(batch)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        mock.posted().iter().all(|m| !m.is_array()),
        "the batch was not relayed"
    );
}

#[tokio::test]
async fn a_legacy_body_the_gate_cannot_read_as_the_upstream_would_is_refused() {
    let key = Key::new("k1");
    let auth = AuthServer::with(&key).await;
    let mock = Mock::start().await;
    let proxy = rs_proxy(&mock, &auth, "[auth.scopes]\n\"admin_*\" = [\"admin\"]").await;
    let token = key.bearer("alice");
    let headers = [("authorization", token.as_str())];
    let (_, sid) = legacy(&proxy, Method::POST, None, &headers, initialize()).await;
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Body>();
    // A parser that keeps a key's first value reads `list`, one that keeps its last `admin_reset`.
    let twice = r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"list","name":"admin_reset","arguments":{}}}"#;
    for body in [twice, "{not json"] {
        let req = Request::post(proxy.url())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .header("mcp-session-id", sid.as_deref().unwrap())
            .header("authorization", token.as_str())
            .body(full(body.to_owned()))
            .unwrap();
        let resp = http.request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{body}");
    }
    assert_eq!(mock.calls_of("admin_reset"), 0);
    assert_eq!(mock.calls_of("list"), 0);
}

#[tokio::test]
async fn an_sse_front_call_needs_the_scope_too() {
    let key = Key::new("k1");
    let auth = AuthServer::with(&key).await;
    let mock = crate::sse_front::repos().await;
    let proxy = rs_proxy(&mock, &auth, "[auth.scopes]\n\"delete_*\" = [\"admin\"]").await;
    let token = key.bearer("alice");
    let headers = [("authorization", token.as_str())];
    let mut s = crate::sse_front::SseSession::open(&proxy, &headers).await;
    s.initialize(json!({})).await;
    let refused = s.post(&crate::sse_front::call("c1", "delete_repo")).await;
    assert_eq!(refused, StatusCode::FORBIDDEN);
    assert_eq!(
        s.post(&crate::sse_front::call("c2", "list_repos")).await,
        StatusCode::ACCEPTED
    );
    assert_eq!(s.next().await["id"], "c2");
    assert_eq!(mock.calls_of("delete_repo"), 0);
}

#[tokio::test]
async fn an_approved_sse_front_call_carries_the_verified_subject_and_never_the_clients_token() {
    let key = Key::new("k1");
    let auth = AuthServer::with(&key).await;
    let mock = crate::sse_front::repos().await;
    let proxy = rs_proxy(&mock, &auth, APPROVAL).await;
    let token = key.bearer("alice");
    let forged = [("authorization", token.as_str()), ("x-mcp-subject", "root")];
    let mut s = crate::sse_front::SseSession::open(&proxy, &forged).await;
    s.initialize(json!({"elicitation": {}})).await;
    s.post(&crate::sse_front::call("c1", "delete_repo")).await;
    let asked = s.next().await;
    s.post(&crate::sse_front::answer(&asked, true)).await;
    assert_eq!(s.next().await["id"], "c1");
    let called = |m: &Value| m["method"] == "tools/call";
    assert_eq!(header_of(&mock, "authorization", called), [None]);
    assert_eq!(
        header_of(&mock, "x-mcp-subject", called),
        [Some("alice".to_owned())]
    );
}

#[tokio::test]
async fn a_get_with_an_unsigned_peer_header_is_identified_like_any_client() {
    let auth = AuthServer::with(&Key::new("k1")).await;
    let mock = Mock::start().await;
    let proxy = rs_proxy(&mock, &auth, "").await;
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Body>();
    for path in ["/sse", "/mcp"] {
        let req = Request::get(format!("http://{}{path}", proxy.addr))
            .header("accept", "text/event-stream")
            .header("mcp-session-id", "s")
            .header("mcp-proxy-peer", "not-a-signature")
            .body(empty())
            .unwrap();
        let resp = http.request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
}
