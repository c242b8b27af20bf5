//! Resource-server mode (`require = true`): a token on every request, the metadata served by the
//! proxy, tool scopes checked, and the upstream sees the verified subject, not the token.

use http::{Method, Request, StatusCode};
use mrtr_proxy::body::{empty, Body};
use serde_json::{json, Value};

use super::{
    answers, challenge, claims, client_posts, client_with, get_json, header_of, jwt_config,
    list_tools, script_ask, start, AuthServer, Key, ISSUER, PRM_URL, RESOURCE, RS,
};
use crate::support::mock::Mock;
use crate::support::{first_round, retry, TestProxy};

async fn rs_proxy(mock: &Mock, auth: &AuthServer, extra: &str) -> TestProxy {
    let config = jwt_config(&auth.jwks_uri(), &format!("{RS}\n{extra}"), "");
    start(mock, &config).await
}

#[tokio::test]
async fn a_request_without_a_token_is_401_with_the_challenge() {
    let auth = AuthServer::with(&Key::new("k1")).await;
    let mock = Mock::start().await;
    let proxy = rs_proxy(&mock, &auth, "").await;
    let ex = proxy
        .client(json!({}))
        .request("tools/list", json!({}))
        .await
        .unwrap();
    assert_eq!(ex.status, StatusCode::UNAUTHORIZED, "{:?}", ex.last);
    let expected = format!(r#"Bearer scope="mcp", resource_metadata="{PRM_URL}""#);
    assert_eq!(challenge(&ex), expected);
    assert_eq!(ex.last["error"]["code"], -32600);
    assert!(
        client_posts(&mock).is_empty(),
        "nothing reached the upstream"
    );
}

#[tokio::test]
async fn the_upstream_never_sees_the_token_and_gets_the_verified_subject() {
    let key = Key::new("k1");
    let auth = AuthServer::with(&key).await;
    let mock = Mock::start().await;
    let proxy = rs_proxy(&mock, &auth, "").await;
    let mut c = client_with(&proxy, &key.bearer("alice"));
    c.headers.push(("x-mcp-subject".into(), "root".into()));
    let ex = c
        .request("tools/call", json!({"name": "plain", "arguments": {}}))
        .await
        .unwrap();
    assert_eq!(
        ex.result()["content"][0]["text"],
        "ran plain",
        "{:?}",
        ex.last
    );
    let all = |_: &Value| true;
    let auths = header_of(&mock, "authorization", all);
    assert!(
        auths.len() >= 2,
        "initialize and the call at least: {auths:?}"
    );
    assert!(
        auths.iter().all(Option::is_none),
        "no token upstream: {auths:?}"
    );
    let subjects = header_of(&mock, "x-mcp-subject", all);
    assert!(
        subjects.iter().all(|s| s.as_deref() == Some("alice")),
        "{subjects:?}"
    );
}

#[tokio::test]
async fn forward_authorization_sends_the_token_upstream_too() {
    let key = Key::new("k1");
    let auth = AuthServer::with(&key).await;
    let mock = Mock::start().await;
    let proxy = rs_proxy(&mock, &auth, "forward_authorization = true").await;
    let token = key.bearer("alice");
    assert_eq!(list_tools(&proxy, &token).await.status, StatusCode::OK);
    let seen = header_of(&mock, "authorization", |m| m["method"] == "tools/list");
    assert_eq!(seen, [Some(token)]);
    let subject = header_of(&mock, "x-mcp-subject", |m| m["method"] == "tools/list");
    assert_eq!(subject, [Some("alice".to_owned())]);
}

#[tokio::test]
async fn a_refreshed_token_resumes_the_call_in_resource_server_mode() {
    let key = Key::new("k1");
    let auth = AuthServer::with(&key).await;
    let mock = Mock::start().await;
    script_ask(&mock);
    let proxy = rs_proxy(&mock, &auth, "").await;
    let (_, state) =
        first_round(&client_with(&proxy, &key.bearer("alice")), "ask", json!({})).await;
    let c = client_with(&proxy, &key.bearer("alice"));
    let ex = retry(&c, "ask", json!({}), answers(), &state).await;
    assert_eq!(ex.result()["resultType"], "complete", "{:?}", ex.last);
    assert_eq!(mock.calls_of("ask"), 1);
    let answer = header_of(&mock, "x-mcp-subject", |m| {
        m.get("method").is_none() && m["id"] == 1
    });
    assert_eq!(answer, [Some("alice".to_owned())]);
}

#[tokio::test]
async fn a_tool_needing_a_scope_the_token_lacks_is_403_insufficient_scope() {
    let key = Key::new("k1");
    let auth = AuthServer::with(&key).await;
    let mock = Mock::start().await;
    let proxy = rs_proxy(&mock, &auth, "[auth.scopes]\n\"admin_*\" = [\"admin\"]").await;
    let call = json!({"name": "admin_reset", "arguments": {}});
    let c = client_with(&proxy, &key.bearer("alice"));
    let ex = c.request("tools/call", call.clone()).await.unwrap();
    assert_eq!(ex.status, StatusCode::FORBIDDEN, "{:?}", ex.last);
    let expected = format!(
        r#"Bearer error="insufficient_scope", scope="admin", resource_metadata="{PRM_URL}""#
    );
    assert_eq!(challenge(&ex), expected);
    assert_eq!(mock.calls_of("admin_reset"), 0);
    let mut admin = claims("alice");
    admin["scope"] = json!("mcp admin");
    let c = client_with(&proxy, &format!("Bearer {}", key.sign(&admin)));
    let ex = c.request("tools/call", call).await.unwrap();
    assert_eq!(
        ex.result()["content"][0]["text"],
        "ran admin_reset",
        "{:?}",
        ex.last
    );
    let other = client_with(&proxy, &key.bearer("alice"));
    let ex = other
        .request("tools/call", json!({"name": "plain", "arguments": {}}))
        .await
        .unwrap();
    assert_eq!(
        ex.status,
        StatusCode::OK,
        "a tool without a scope rule: {:?}",
        ex.last
    );
}

#[tokio::test]
async fn the_metadata_is_served_at_both_paths() {
    let auth = AuthServer::with(&Key::new("k1")).await;
    let mock = Mock::start().await;
    let proxy = rs_proxy(&mock, &auth, "").await;
    let expected = json!({"resource": RESOURCE, "authorization_servers": [ISSUER],
                          "bearer_methods_supported": ["header"], "scopes_supported": ["mcp"]});
    for path in [
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource",
    ] {
        let (status, headers, doc) = get_json(&proxy, path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(doc, expected, "{path}");
        assert_eq!(headers["access-control-allow-origin"], "*", "{path}");
    }
    let relayed = mock
        .paths()
        .into_iter()
        .filter(|p| p.starts_with("/.well-known/"));
    assert_eq!(
        relayed.count(),
        0,
        "served by the proxy: {:?}",
        mock.paths()
    );
}

#[tokio::test]
async fn other_well_known_documents_are_relayed_without_the_token() {
    let key = Key::new("k1");
    let auth = AuthServer::with(&key).await;
    let mock = Mock::start().await;
    let proxy = rs_proxy(&mock, &auth, "").await;
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Body>();
    let path = "/.well-known/oauth-authorization-server";
    let req = Request::get(format!("http://{}{path}", proxy.addr))
        .header("authorization", key.bearer("alice"))
        .body(empty())
        .unwrap();
    let _ = http.request(req).await.unwrap();
    let relayed: Vec<_> = mock
        .requests()
        .into_iter()
        .filter(|(m, p, _)| *m == Method::GET && p == path)
        .map(|(_, _, h)| h.contains_key("authorization"))
        .collect();
    assert_eq!(relayed, [false], "relayed once, without the client's token");
}

// Two requests written at once on one connection, each with its body: the first refused
// before its body is read (401), the second answered on the same connection.
async fn two_on_one_connection(proxy: &TestProxy, first_headers: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;
    let first = format!(
        "POST /mcp HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{first_headers}content-length: {}\r\n\r\n{body}",
        body.len()
    );
    let second = "GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
    let mut conn = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    conn.write_all(format!("{first}{second}").as_bytes())
        .await
        .unwrap();
    let mut got = Vec::new();
    let read = conn.read_to_end(&mut got);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), read).await;
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn a_refusal_before_the_body_keeps_the_connection_for_the_next_request() {
    let auth = AuthServer::with(&Key::new("k1")).await;
    let mock = Mock::start().await;
    let proxy = rs_proxy(&mock, &auth, "").await;
    for headers in ["", "authorization: Bearer not-a-jwt\r\n"] {
        let answer = two_on_one_connection(&proxy, headers).await;
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
        assert!(
            answer.contains("HTTP/1.1 200"),
            "the next request was not answered: {answer}"
        );
    }
}

#[tokio::test]
async fn a_refusal_whose_body_never_comes_says_it_closes_the_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let auth = AuthServer::with(&Key::new("k1")).await;
    let mock = Mock::start().await;
    let proxy = rs_proxy(&mock, &auth, "").await;
    let head = "POST /mcp HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 50\r\n\r\n";
    let mut conn = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let read = conn.read_to_end(&mut got);
    tokio::time::timeout(std::time::Duration::from_secs(10), read)
        .await
        .expect("the proxy closes the connection")
        .unwrap();
    let answer = String::from_utf8_lossy(&got).to_ascii_lowercase();
    assert!(answer.starts_with("http/1.1 401"), "{answer}");
    assert!(answer.contains("\r\nconnection: close\r\n"), "{answer}");
}
