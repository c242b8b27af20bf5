//! requestState is attacker-controlled: every forgery or misuse is -32602, no re-prompt, no
//! complete result, and nothing reaches the upstream.

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{json, Value};

use crate::support::mock::{Mock, Step, CHALLENGE};
use crate::support::{all_caps, error_of, first_round, retry, TestProxy};

fn script(mock: &Mock) {
    let ask = Step::Send(
        json!({"jsonrpc":"2.0","id":1,"method":"elicitation/create","params":{"message":"n","requestedSchema":{"type":"object","properties":{}}}}),
    );
    mock.script(
        "ask",
        vec![vec![
            ask,
            Step::Await(1),
            Step::Reply(json!({"content":[]})),
        ]],
    );
}

fn answers() -> Value {
    json!({"elicitation-1": {"action":"accept","content":{}}})
}

async fn rejected(
    c: &mrtr_proxy::demo::client::ModernClient,
    name: &str,
    args: Value,
    state: &str,
) -> String {
    let ex = retry(c, name, args, answers(), state).await;
    assert_eq!(ex.status, http::StatusCode::BAD_REQUEST);
    let e = error_of(&ex);
    assert_eq!(e["code"], -32602);
    e["message"].as_str().unwrap().to_owned()
}

fn split(token: &str) -> (String, Value, String) {
    let p: Vec<&str> = token.split('.').collect();
    let payload = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(p[1]).unwrap()).unwrap();
    (p[0].to_owned(), payload, p[2].to_owned())
}

#[tokio::test]
async fn forged_tokens_are_rejected_before_any_upstream_traffic() {
    let mock = Mock::start().await;
    script(&mock);
    let proxy = TestProxy::start(
        &mock.url(),
        "[state]\nsecret = \"0123456789abcdef0123456789abcdef\"\n",
    )
    .await;
    let c = proxy.client(all_caps());
    let (_, state) = first_round(&c, "ask", json!({})).await;
    let (header, mut payload, sig) = split(&state);
    payload["rnd"] = 9.into();
    let tampered_payload = format!(
        "{header}.{}.{sig}",
        URL_SAFE_NO_PAD.encode(payload.to_string())
    );
    let tampered_sig = format!(
        "{}.{}",
        state.rsplit_once('.').unwrap().0,
        URL_SAFE_NO_PAD.encode(b"forged")
    );
    let alg_none = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#),
        state.split('.').nth(1).unwrap()
    );
    let other_key = jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &split(&state).1,
        &jsonwebtoken::EncodingKey::from_secret(b"another-secret-another-secret-!!"),
    )
    .unwrap();
    for forged in [
        tampered_payload,
        tampered_sig,
        alg_none,
        other_key,
        "garbage".to_owned(),
        String::new(),
    ] {
        let msg = rejected(&c, "ask", json!({}), &forged).await;
        assert!(msg.contains("invalid"), "{msg}");
    }
    assert!(
        mock.answers_to(1).is_empty(),
        "no forged answer reached the upstream"
    );
    let ex = retry(&c, "ask", json!({}), answers(), &state).await;
    assert_eq!(
        ex.result()["resultType"],
        "complete",
        "the genuine token still works"
    );
}

#[tokio::test]
async fn a_token_is_bound_to_principal_tool_and_arguments() {
    let mock = Mock::start().await;
    script(&mock);
    mock.script("other", vec![vec![Step::Reply(json!({"content":[]}))]]);
    let proxy = TestProxy::start(&mock.url(), "").await;
    let mut alice = proxy.client(all_caps());
    alice
        .headers
        .push(("authorization".into(), "Bearer alice".into()));
    let (_, state) = first_round(&alice, "ask", json!({"x": 1})).await;
    let mut mallory = proxy.client(all_caps());
    mallory
        .headers
        .push(("authorization".into(), "Bearer mallory".into()));
    assert!(rejected(&mallory, "ask", json!({"x": 1}), &state)
        .await
        .contains("another principal"));
    assert!(rejected(&alice, "other", json!({"x": 1}), &state)
        .await
        .contains("different request"));
    assert!(rejected(&alice, "ask", json!({"x": 2}), &state)
        .await
        .contains("different request"));
    assert!(mock.answers_to(1).is_empty());
    let ex = retry(&alice, "ask", json!({"x": 1}), answers(), &state).await;
    assert_eq!(ex.result()["resultType"], "complete");
    assert_eq!(
        mock.posted()
            .iter()
            .filter(|m| m["method"] == "initialize")
            .count(),
        2,
        "one session per principal"
    );
}

#[tokio::test]
async fn a_token_is_single_use() {
    let mock = Mock::start().await;
    mock.script(
        "ask",
        vec![vec![
            Step::elicit(1),
            Step::Await(1),
            Step::elicit(2),
            Step::Await(2),
            Step::Reply(json!({"content":[]})),
        ]],
    );
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(all_caps());
    let (_, state) = first_round(&c, "ask", json!({})).await;
    let ex = retry(&c, "ask", json!({}), answers(), &state).await;
    assert_eq!(ex.result()["resultType"], "input_required");
    assert!(rejected(&c, "ask", json!({}), &state)
        .await
        .contains("already used"));
    assert_eq!(mock.answers_to(1).len(), 1, "the replay delivered nothing");
}

#[tokio::test]
async fn an_expired_token_is_rejected() {
    let mock = Mock::start().await;
    script(&mock);
    // The jump past the TTL must not also pass the idle keep-alive bound of the client's pooled
    // connection (that is not what this test is about).
    let proxy = TestProxy::start(
        &mock.url(),
        "[state]\nttl = \"30s\"\n[server]\nheader_read_timeout = \"5m\"\n",
    )
    .await;
    let c = proxy.client(all_caps());
    let (_, state) = first_round(&c, "ask", json!({})).await;
    // Token expiry and the parked call's deadline both read tokio's clock: jump past the TTL,
    // then let time run again so nothing else in the test depends on a frozen clock.
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(31)).await;
    tokio::time::resume();
    let msg = rejected(&c, "ask", json!({}), &state).await;
    // The token's own expiry, not merely "the call is gone".
    assert!(msg.contains("requestState has expired"), "{msg}");
    // ... and says what happened and what to do: the call must be made again.
    assert!(
        msg.contains("was ended") && msg.contains("start the call again"),
        "{msg}"
    );
    // The TTL ended the call upstream with a cancel; the client's answers never went there.
    mock.wait_for("the cancel answer", |m| {
        m["id"] == 1 && m["result"]["action"] == "cancel"
    })
    .await;
    assert_eq!(mock.answers_to(1).len(), 1, "{:#?}", mock.posted());
}

#[tokio::test]
async fn an_upstream_auth_challenge_reaches_the_client_and_metadata_is_relayed() {
    let mock = Mock::start().await;
    mock.require_auth("Bearer good");
    let proxy = TestProxy::start(&mock.url(), "").await;
    let anonymous = proxy.client(json!({}));
    for method in ["server/discover", "tools/list"] {
        let ex = anonymous.request(method, json!({})).await.unwrap();
        assert_eq!(ex.status, http::StatusCode::UNAUTHORIZED, "{method}");
        assert!(error_of(&ex)["message"].as_str().unwrap().contains("401"));
    }
    let ex = anonymous
        .request("tools/call", json!({"name":"plain","arguments":{}}))
        .await
        .unwrap();
    assert_eq!(ex.status, http::StatusCode::UNAUTHORIZED);
    // The challenge itself, so the client can find the authorization server.
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, mrtr_proxy::body::Body>(
        hyper_util::client::legacy::connect::HttpConnector::new(),
    );
    let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}});
    let req = http::Request::post(proxy.url())
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/list")
        .header("content-type", "application/json")
        .body(mrtr_proxy::body::full(body.to_string()))
        .unwrap();
    let resp = http.request(req).await.unwrap();
    assert_eq!(resp.status(), http::StatusCode::UNAUTHORIZED);
    assert_eq!(resp.headers()["www-authenticate"], CHALLENGE);
    let meta = http
        .get(
            format!(
                "http://{}/.well-known/oauth-protected-resource/mcp",
                proxy.addr
            )
            .parse()
            .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(meta.status(), http::StatusCode::OK);
    let meta: Value = serde_json::from_slice(
        &http_body_util::BodyExt::collect(meta.into_body())
            .await
            .unwrap()
            .to_bytes(),
    )
    .unwrap();
    assert_eq!(meta["authorization_servers"][0], "http://auth.example");
    // With the credentials the upstream accepts, everything works; the upstream is "ready".
    let mut alice = proxy.client(json!({}));
    alice
        .headers
        .push(("authorization".into(), "Bearer good".into()));
    let ex = alice.request("tools/list", json!({})).await.unwrap();
    assert_eq!(ex.status, http::StatusCode::OK);
    assert_eq!(ex.result()["tools"][0]["name"], "t");
    assert!(
        proxy.app.probe_upstream().await,
        "an upstream asking for credentials is up"
    );
}

#[tokio::test]
async fn an_upstream_refusing_an_oversized_credential_is_the_clients_error_not_a_502() {
    let mock = Mock::start().await;
    mock.max_auth_len(64);
    let proxy = TestProxy::start(&mock.url(), "").await;
    let mut c = proxy.client(all_caps());
    c.headers.push((
        "authorization".into(),
        format!("Bearer {}", "x".repeat(200)),
    ));
    let ex = c.request("tools/list", json!({})).await.unwrap();
    assert_eq!(ex.status, http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    assert_eq!(ex.last["error"]["code"], -32600, "{:?}", ex.last);
}

#[tokio::test]
async fn the_same_retry_sent_twenty_times_at_once_completes_exactly_once() {
    let mock = Mock::start().await;
    script(&mock);
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(all_caps());
    let (_, state) = first_round(&c, "ask", json!({})).await;
    let retries = (0..20).map(|_| {
        let c = c.clone();
        let state = state.clone();
        tokio::spawn(async move { retry(&c, "ask", json!({}), answers(), &state).await })
    });
    let mut complete = 0;
    for r in futures_join(retries).await {
        if r.result()["resultType"] == "complete" {
            complete += 1;
        } else {
            assert_eq!(error_of(&r)["code"], -32602, "{:?}", r.last);
        }
    }
    assert_eq!(complete, 1, "exactly one retry completes");
    assert_eq!(mock.answers_to(1).len(), 1, "the upstream got one answer");
}

async fn futures_join<T>(handles: impl Iterator<Item = tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::new();
    for h in handles.collect::<Vec<_>>() {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test]
async fn a_token_moved_to_another_method_is_refused() {
    let mock = Mock::start().await;
    script(&mock);
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(all_caps());
    let (_, state) = first_round(&c, "ask", json!({})).await;
    let moved = json!({"name": "ask", "inputResponses": answers(), "requestState": state});
    let ex = c.request("prompts/get", moved).await.unwrap();
    assert_eq!(ex.status, http::StatusCode::BAD_REQUEST);
    let e = error_of(&ex);
    assert_eq!(e["code"], -32602);
    assert!(
        e["message"].as_str().unwrap().contains("different request"),
        "{e}"
    );
    assert!(mock.answers_to(1).is_empty());
}

#[tokio::test]
async fn a_deeply_nested_body_is_refused_and_the_proxy_stays_healthy() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(json!({}));
    let depth = 100_000;
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{"x":{}{}}}}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    );
    let ex = c
        .send_raw(body.into(), &[("mcp-method".into(), "tools/list".into())])
        .await
        .unwrap();
    assert_eq!(ex.status, http::StatusCode::BAD_REQUEST);
    assert_eq!(error_of(&ex)["code"], -32700);
    let ok = c.request("tools/list", json!({})).await.unwrap();
    assert_eq!(ok.status, http::StatusCode::OK, "{:?}", ok.last);
}

// Sends `GET target` on a fresh connection, byte for byte (no client normalises it); the status.
async fn raw_get(proxy: &TestProxy, target: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let head = format!("GET {target} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let read = conn.read_to_end(&mut got);
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let text = String::from_utf8_lossy(&got);
    let status = text.split(' ').nth(1).unwrap_or_default();
    status
        .parse()
        .unwrap_or_else(|_| panic!("{target}: {text}"))
}

/// Issue 39 (7): under `/.well-known/` only the discovery documents are relayed, at clean paths
/// and without the query; a dot segment, a percent-encoded dot or slash, or another document is
/// 404 and the upstream sees nothing.
#[tokio::test]
async fn well_known_relays_only_the_discovery_documents_at_clean_paths() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let well_known = |m: &Mock| {
        m.targets()
            .into_iter()
            .filter(|t| !t.starts_with("/mcp"))
            .collect::<Vec<_>>()
    };
    for target in [
        "/.well-known/../mcp?x=1",
        "/.well-known/..%2fmcp",
        "/.well-known/%2e%2e/mcp",
        "/.well-known/%2E%2E/mcp?x=1",
        "/.well-known/oauth-protected-resource/../../mcp",
        "/.well-known/oauth-protected-resource/%2e%2e/%2e%2e/mcp",
        "/.well-known/oauth-protected-resource%2f..%2f..%2fmcp",
        "/.well-known/oauth-authorization-server/./x",
        "/.well-known/openid-configuration//x",
        "/.well-known/foo",
        "/.well-known/security.txt",
    ] {
        assert_eq!(raw_get(&proxy, target).await, 404, "{target}");
    }
    assert_eq!(well_known(&mock), Vec::<String>::new(), "nothing relayed");
    // The documents a client probes still are: the path as it came, the query dropped.
    for target in [
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-authorization-server",
        "/.well-known/oauth-authorization-server/tenant-1",
        "/.well-known/openid-configuration?x=1",
        "/.well-known/openid-configuration/tenant-1",
    ] {
        raw_get(&proxy, target).await;
    }
    assert_eq!(
        well_known(&mock),
        [
            "/.well-known/oauth-protected-resource/mcp",
            "/.well-known/oauth-protected-resource",
            "/.well-known/oauth-authorization-server",
            "/.well-known/oauth-authorization-server/tenant-1",
            "/.well-known/openid-configuration",
            "/.well-known/openid-configuration/tenant-1",
        ]
    );
    assert_eq!(
        raw_get(&proxy, "/.well-known/oauth-protected-resource/mcp").await,
        200,
        "the upstream's document"
    );
}
