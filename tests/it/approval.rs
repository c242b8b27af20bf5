//! The approval gate: gated tools ask the person first, before the upstream sees anything.

use serde_json::{json, Value};

use crate::support::mock::{Mock, Step};
use crate::support::{all_caps, error_of, first_round, retry, TestProxy};

const POLICY: &str = r#"
[approval.tools."delete_*"]
message = "Delete {repo}?"
on_decline = "Kept."
[approval.tools.ask]
"#;

fn approve() -> Value {
    json!({"approval": {"action": "accept", "content": {"approve": true}}})
}

/// A scripted upstream whose `delete_repo` answers "deleted".
async fn deleting() -> Mock {
    let mock = Mock::start().await;
    mock.script(
        "delete_repo",
        vec![vec![Step::Reply(
            json!({"content":[{"type":"text","text":"deleted"}]}),
        )]],
    );
    mock
}

async fn gated() -> (Mock, TestProxy) {
    let mock = deleting().await;
    let proxy = TestProxy::start(&mock.url(), POLICY).await;
    (mock, proxy)
}

#[tokio::test]
async fn a_gated_call_asks_first_and_runs_once_approved() {
    let (mock, proxy) = gated().await;
    let c = proxy.client(all_caps());
    let args = json!({"repo": "acme/site"});
    let (r, state) = first_round(&c, "delete_repo", args.clone()).await;
    let asked = &r["inputRequests"]["approval"];
    assert_eq!(asked["method"], "elicitation/create");
    assert_eq!(asked["params"]["message"], "Delete acme/site?");
    assert_eq!(
        asked["params"]["requestedSchema"]["required"],
        json!(["approve"])
    );
    assert_eq!(
        mock.calls_of("delete_repo"),
        0,
        "the upstream saw nothing yet"
    );
    let done = retry(&c, "delete_repo", args, approve(), &state).await;
    assert_eq!(
        done.result()["content"][0]["text"],
        "deleted",
        "{:?}",
        done.last
    );
    assert_eq!(mock.calls_of("delete_repo"), 1);
}

#[tokio::test]
async fn a_declined_call_never_reaches_the_upstream() {
    let (mock, proxy) = gated().await;
    let c = proxy.client(all_caps());
    let args = json!({"repo": "acme/site"});
    for answer in [
        json!({"action": "decline"}),
        json!({"action": "cancel"}),
        json!({"action": "accept", "content": {"approve": false}}),
    ] {
        let (_, state) = first_round(&c, "delete_repo", args.clone()).await;
        let ex = retry(
            &c,
            "delete_repo",
            args.clone(),
            json!({"approval": answer}),
            &state,
        )
        .await;
        let r = ex.result();
        assert_eq!(r["resultType"], "complete", "{:?}", ex.last);
        assert_eq!(r["isError"], true);
        assert_eq!(r["content"][0]["text"], "Kept.");
    }
    assert_eq!(mock.calls_of("delete_repo"), 0);
}

#[tokio::test]
async fn an_approval_is_taken_once_and_only_for_its_arguments() {
    let (mock, proxy) = gated().await;
    let c = proxy.client(all_caps());
    let args = json!({"repo": "acme/site"});
    let (_, state) = first_round(&c, "delete_repo", args.clone()).await;
    let other = retry(
        &c,
        "delete_repo",
        json!({"repo": "acme/prod"}),
        approve(),
        &state,
    )
    .await;
    assert_eq!(error_of(&other)["code"], -32602, "other arguments");
    let first = retry(&c, "delete_repo", args.clone(), approve(), &state).await;
    assert_eq!(first.result()["content"][0]["text"], "deleted");
    let again = retry(&c, "delete_repo", args, approve(), &state).await;
    assert_eq!(error_of(&again)["code"], -32602, "the same approval twice");
    assert_eq!(mock.calls_of("delete_repo"), 1);
}

#[tokio::test]
async fn a_malformed_answer_is_refused_without_spending_the_approval() {
    let (mock, proxy) = gated().await;
    let c = proxy.client(all_caps());
    let args = json!({"repo": "r"});
    let (_, state) = first_round(&c, "delete_repo", args.clone()).await;
    let bad = json!({"approval": {"action": "accept", "content": {"approve": "yes"}}});
    let ex = retry(&c, "delete_repo", args.clone(), bad, &state).await;
    assert_eq!(error_of(&ex)["code"], -32602);
    let ok = retry(&c, "delete_repo", args, approve(), &state).await;
    assert_eq!(ok.result()["content"][0]["text"], "deleted");
    assert_eq!(mock.calls_of("delete_repo"), 1);
}

#[tokio::test]
async fn an_unanswered_approval_is_asked_again() {
    let (mock, proxy) = gated().await;
    let c = proxy.client(all_caps());
    let args = json!({"repo": "r"});
    let (_, state) = first_round(&c, "delete_repo", args.clone()).await;
    let ex = retry(&c, "delete_repo", args, json!({}), &state).await;
    let r = ex.result();
    assert_eq!(r["resultType"], "input_required", "{:?}", ex.last);
    assert_ne!(r["requestState"], state.as_str(), "a fresh token");
    assert_eq!(mock.calls_of("delete_repo"), 0);
}

#[tokio::test]
async fn a_client_that_cannot_elicit_gets_the_missing_capability() {
    let (mock, proxy) = gated().await;
    let c = proxy.client(json!({"sampling": {}}));
    let ex = c
        .request(
            "tools/call",
            json!({"name": "delete_repo", "arguments": {"repo": "r"}}),
        )
        .await
        .unwrap();
    assert_eq!(ex.status, http::StatusCode::BAD_REQUEST);
    let e = error_of(&ex);
    assert_eq!(e["code"], -32021);
    assert!(
        e["data"]["requiredCapabilities"]["elicitation"].is_object(),
        "{e}"
    );
    assert_eq!(mock.calls_of("delete_repo"), 0);
}

#[tokio::test]
async fn an_approved_call_still_has_its_own_rounds() {
    let mock = Mock::start().await;
    mock.script(
        "ask",
        vec![vec![
            Step::elicit(3),
            Step::Await(3),
            Step::Reply(json!({"content":[{"type":"text","text":"asked"}]})),
        ]],
    );
    let proxy = TestProxy::start(&mock.url(), POLICY).await;
    let c = proxy.client(all_caps());
    let (r, state) = first_round(&c, "ask", json!({})).await;
    assert_eq!(
        r["inputRequests"]["approval"]["params"]["message"],
        "Allow the tool `ask` to run?"
    );
    let ex = retry(&c, "ask", json!({}), approve(), &state).await;
    let own = ex.result();
    assert_eq!(own["resultType"], "input_required", "{:?}", ex.last);
    assert!(own["inputRequests"].get("approval").is_none(), "{own}");
    let key = crate::support::first_key(own);
    let token = own["requestState"].as_str().unwrap();
    let answer = json!({ key: {"action": "accept", "content": {"name": "Ada"}} });
    let done = retry(&c, "ask", json!({}), answer, token).await;
    assert_eq!(
        done.result()["content"][0]["text"],
        "asked",
        "{:?}",
        done.last
    );
}

#[tokio::test]
async fn a_legacy_session_without_elicitation_calling_a_gated_tool_is_refused_and_not_relayed() {
    let (mock, proxy) = gated().await;
    let c = proxy.client(all_caps());
    let legacy = [
        ("mcp-session-id".to_owned(), "a-session".to_owned()),
        ("mcp-protocol-version".to_owned(), "2025-11-25".to_owned()),
    ];
    let nan = br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"delete_repo","arguments":{"n":NaN}}}"#;
    let ex = c.send_raw(nan.to_vec().into(), &legacy).await.unwrap();
    assert_eq!(
        ex.status,
        http::StatusCode::BAD_REQUEST,
        "not JSON: not relayed"
    );
    assert_eq!(error_of(&ex)["code"], -32700);
    for body in [
        json!({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"delete_repo","arguments":{}}}),
        json!([{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"delete_x"}}]),
    ] {
        let ex = c.send_raw(body.to_string().into(), &legacy).await.unwrap();
        assert_eq!(ex.status, http::StatusCode::OK);
        let e = error_of(&ex);
        assert_eq!(e["code"], -32600);
        assert!(e["message"].as_str().unwrap().contains("approv"), "{e}");
    }
    assert_eq!(mock.calls_of("delete_repo"), 0);
    assert!(
        mock.posted().iter().all(|m| m["method"] != "tools/call"),
        "nothing relayed"
    );
}

/// Two replicas sharing a key, each the other's peer, each with its own upstream.
async fn pair() -> (Vec<Mock>, Vec<TestProxy>) {
    let a = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let b = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let peers = format!(
        "\"http://{}/mcp\", \"http://{}/mcp\"",
        a.local_addr().unwrap(),
        b.local_addr().unwrap()
    );
    let toml = format!(
        "{POLICY}\n[state]\nsecret = \"a-shared-cluster-key-0123456789abcdef\"\n[cluster]\npeers = [{peers}]\nforward_timeout = \"2s\"\n[server]\nshutdown_grace = \"100ms\"\n"
    );
    let mut mocks = Vec::new();
    let mut proxies = Vec::new();
    for l in [a, b] {
        let mock = deleting().await;
        proxies.push(TestProxy::start_on(l, &mock.url(), &toml));
        mocks.push(mock);
    }
    (mocks, proxies)
}

#[tokio::test]
async fn an_approval_given_on_another_replica_is_taken_where_it_was_asked() {
    let (mocks, proxies) = pair().await;
    let args = json!({"repo": "r"});
    let (_, state) = first_round(&proxies[0].client(all_caps()), "delete_repo", args.clone()).await;
    let other = proxies[1].client(all_caps());
    let done = retry(&other, "delete_repo", args.clone(), approve(), &state).await;
    assert_eq!(
        done.result()["content"][0]["text"],
        "deleted",
        "{:?}",
        done.last
    );
    assert_eq!(
        (
            mocks[0].calls_of("delete_repo"),
            mocks[1].calls_of("delete_repo")
        ),
        (1, 0),
        "run by the instance that asked"
    );
    let again = retry(&other, "delete_repo", args, approve(), &state).await;
    assert_eq!(
        error_of(&again)["code"],
        -32602,
        "taken once across replicas"
    );
}

#[tokio::test]
async fn when_the_asking_replica_is_gone_the_person_is_asked_again() {
    let (mocks, mut proxies) = pair().await;
    let args = json!({"repo": "r"});
    let (_, state) = first_round(&proxies[0].client(all_caps()), "delete_repo", args.clone()).await;
    let mut asker = proxies.remove(0);
    asker.stopped().await;
    let ex = retry(
        &proxies[0].client(all_caps()),
        "delete_repo",
        args,
        approve(),
        &state,
    )
    .await;
    let r = ex.result();
    assert_eq!(r["resultType"], "input_required", "{:?}", ex.last);
    assert!(r["inputRequests"]["approval"].is_object());
    assert_eq!(
        mocks[1].calls_of("delete_repo"),
        0,
        "never run on the old approval"
    );
}

/// Issue 39 (5): an approved call's retry sent again to its instance restarted under the same
/// `state.instance_id` and key (a StatefulSet pod) asks the person again; it does not run again.
#[tokio::test]
async fn an_approval_taken_before_a_restart_under_the_same_id_is_not_taken_again() {
    let mock = deleting().await;
    let toml = format!(
        "{POLICY}\n[state]\ninstance_id = \"mcp-0\"\nsecret = \"a-fixed-key-of-this-pod-0123456789abcdef\"\n[server]\nshutdown_grace = \"100ms\"\n"
    );
    let args = json!({"repo": "acme/site"});
    let mut before = TestProxy::start(&mock.url(), &toml).await;
    let c = before.client(all_caps());
    let (_, state) = first_round(&c, "delete_repo", args.clone()).await;
    let done = retry(&c, "delete_repo", args.clone(), approve(), &state).await;
    assert_eq!(
        done.result()["content"][0]["text"],
        "deleted",
        "{:?}",
        done.last
    );
    assert_eq!(mock.calls_of("delete_repo"), 1);
    before.stopped().await;

    let after = TestProxy::start(&mock.url(), &toml).await;
    assert_eq!(after.app.instance_id(), "mcp-0", "the same instance");
    let c = after.client(all_caps());
    let again = retry(&c, "delete_repo", args.clone(), approve(), &state).await;
    let r = again.result();
    assert_eq!(r["resultType"], "input_required", "{:?}", again.last);
    assert!(r["inputRequests"]["approval"].is_object());
    assert_eq!(
        mock.calls_of("delete_repo"),
        1,
        "the approval of the earlier process is never taken"
    );
    // The person asked again can approve: the new token is this process's.
    let fresh = r["requestState"].as_str().unwrap().to_owned();
    assert_ne!(fresh, state);
    let done = retry(&c, "delete_repo", args, approve(), &fresh).await;
    assert_eq!(
        done.result()["content"][0]["text"],
        "deleted",
        "{:?}",
        done.last
    );
    assert_eq!(mock.calls_of("delete_repo"), 2);
}

// Multi-threaded: the scripted upstream serves on the runtime while this thread blocks reading
// the binary's stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_entry_that_matches_no_upstream_tool_is_warned_about_at_start() {
    let mock = Mock::start().await;
    let dir = std::env::temp_dir().join(format!("mrtr-approval-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("c.toml");
    // Rules are checked longest first: `ask` (a tool of the mock) before `ab` (none).
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[upstream]\nurl = \"{}\"\n[approval.tools.ask]\n[approval.tools.ab]\n",
        mock.url()
    );
    std::fs::write(&config, toml).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mrtr-proxy"))
        .args(["--config", config.to_str().unwrap()])
        .env_remove("RUST_LOG")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = crate::smoke::Stderr::of(&mut child);
    let line = std::panic::catch_unwind(|| stderr.wait_for("matches no tool"));
    let status = crate::smoke::terminate(child).await;
    let line = line.expect("a warning within 20 s");
    assert!(line.contains("policy=ab"), "{line}");
    assert!(status.success(), "{status:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn an_approval_asked_under_another_policy_is_asked_again() {
    let mock = deleting().await;
    let instance =
        "[state]\nsecret = \"a-shared-cluster-key-0123456789abcdef\"\ninstance_id = \"one\"\n";
    let policy = |message: &str| {
        format!("{instance}[approval.tools.delete_repo]\nmessage = \"{message}\"\n")
    };
    let args = json!({"repo": "r"});
    let mut before = TestProxy::start(&mock.url(), &policy("Delete {repo}?")).await;
    let (_, state) = first_round(&before.client(all_caps()), "delete_repo", args.clone()).await;
    before.stopped().await;
    // The same instance, restarted with another message: what the person saw is not what it asks.
    let after = TestProxy::start(&mock.url(), &policy("Really delete {repo}?")).await;
    let ex = retry(
        &after.client(all_caps()),
        "delete_repo",
        args,
        approve(),
        &state,
    )
    .await;
    let r = ex.result();
    assert_eq!(r["resultType"], "input_required", "{:?}", ex.last);
    assert_eq!(
        r["inputRequests"]["approval"]["params"]["message"],
        "Really delete r?"
    );
    assert_eq!(mock.calls_of("delete_repo"), 0);
}

type Http = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    mrtr_proxy::body::Body,
>;

fn http() -> Http {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(hyper_util::client::legacy::connect::HttpConnector::new())
}

// A legacy POST on session `sid` (none: an `initialize`); the response, unread.
async fn legacy_post(
    h: &Http,
    url: &str,
    sid: Option<&str>,
    msg: &Value,
) -> http::Response<hyper::body::Incoming> {
    let mut b = http::Request::post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25");
    if let Some(s) = sid {
        b = b.header("mcp-session-id", s);
    }
    let body = mrtr_proxy::body::full(msg.to_string());
    h.request(b.body(body).unwrap()).await.unwrap()
}

// The next JSON-RPC message of an SSE response (bounded in time).
async fn next_message(
    body: &mut hyper::body::Incoming,
    decoder: &mut mrtr_proxy::sse::SseDecoder,
    pending: &mut std::collections::VecDeque<Value>,
) -> Value {
    use http_body_util::BodyExt;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Some(m) = pending.pop_front() {
            return m;
        }
        let frame = tokio::time::timeout_at(deadline, body.frame())
            .await
            .expect("a message within 10 s")
            .expect("the stream is still open")
            .unwrap();
        if let Some(data) = frame.data_ref() {
            for ev in decoder.feed(data).unwrap() {
                pending.push_back(serde_json::from_str(&ev.data).unwrap());
            }
        }
    }
}

/// A legacy session that declared elicitation, through the proxy; its id.
async fn legacy_session(h: &Http, url: &str) -> String {
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{}},"clientInfo":{"name":"legacy","version":"1"}}});
    let resp = legacy_post(h, url, None, &init).await;
    resp.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn a_legacy_session_that_can_elicit_is_asked_inline_and_its_call_then_runs() {
    let (mock, proxy) = gated().await;
    let h = http();
    let url = proxy.url();
    let sid = legacy_session(&h, &url).await;
    let call = json!({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"delete_repo","arguments":{"repo":"acme/site"}}});
    let resp = legacy_post(&h, &url, Some(&sid), &call).await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    let mut decoder = mrtr_proxy::sse::SseDecoder::new(1 << 20);
    let mut pending = std::collections::VecDeque::new();
    let ask = next_message(&mut body, &mut decoder, &mut pending).await;
    assert_eq!(ask["method"], "elicitation/create");
    assert_eq!(ask["params"]["message"], "Delete acme/site?");
    assert_eq!(
        mock.calls_of("delete_repo"),
        0,
        "asked before the upstream sees it"
    );
    let answer = json!({"jsonrpc":"2.0","id":ask["id"],"result":{"action":"accept","content":{"approve":true}}});
    let taken = legacy_post(&h, &url, Some(&sid), &answer).await;
    assert_eq!(taken.status(), http::StatusCode::ACCEPTED);
    let done = next_message(&mut body, &mut decoder, &mut pending).await;
    assert_eq!(done["id"], 7);
    assert_eq!(done["result"]["content"][0]["text"], "deleted", "{done}");
    assert_eq!(mock.calls_of("delete_repo"), 1);
    assert!(
        mock.posted().iter().all(|m| m["id"] != ask["id"]),
        "the answer to the proxy's own question is not relayed"
    );
}

#[tokio::test]
async fn a_legacy_session_that_declines_inline_gets_the_decline_and_the_upstream_nothing() {
    let (mock, proxy) = gated().await;
    let h = http();
    let url = proxy.url();
    let sid = legacy_session(&h, &url).await;
    let call = json!({"jsonrpc":"2.0","id":"c1","method":"tools/call","params":{"name":"delete_repo","arguments":{}}});
    let mut body = legacy_post(&h, &url, Some(&sid), &call).await.into_body();
    let mut decoder = mrtr_proxy::sse::SseDecoder::new(1 << 20);
    let mut pending = std::collections::VecDeque::new();
    let ask = next_message(&mut body, &mut decoder, &mut pending).await;
    let answer = json!({"jsonrpc":"2.0","id":ask["id"],"result":{"action":"decline"}});
    let _ = legacy_post(&h, &url, Some(&sid), &answer).await;
    let done = next_message(&mut body, &mut decoder, &mut pending).await;
    assert_eq!(done["id"], "c1");
    assert_eq!(done["result"]["isError"], true);
    assert_eq!(done["result"]["content"][0]["text"], "Kept.");
    assert_eq!(mock.calls_of("delete_repo"), 0);
}

// An approval binds the arguments' digest; arguments a tree would refuse (and the digest could
// not read) or that name a key twice (one parser reads one value, another the other) must not
// ride on a token issued for other arguments. Sent as raw text: a `Value` cannot hold either.
#[tokio::test]
async fn a_retry_cannot_smuggle_arguments_the_digest_would_not_read() {
    let (mock, proxy) = gated().await;
    let c = proxy.client(all_caps());
    // Approved for no arguments at all (`null`: what arguments that cannot be read digested as).
    let (_, state) = first_round(&c, "delete_repo", Value::Null).await;
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": all_caps(),
    });
    let headers = [
        ("mcp-method".to_owned(), "tools/call".to_owned()),
        ("mcp-name".to_owned(), "delete_repo".to_owned()),
    ];
    for (arguments, code) in [
        (r#"{"repo":"acme/prod","n":1e999}"#, -32700),
        (r#"{"repo":"acme/prod\ud800"}"#, -32700),
        (r#"{"repo":"acme/prod","repo":"acme/site"}"#, -32602),
    ] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"delete_repo","arguments":{arguments},"inputResponses":{},"requestState":"{state}","_meta":{meta}}}}}"#,
            approve()
        );
        let ex = c.send_raw(body.into(), &headers).await.unwrap();
        assert_eq!(error_of(&ex)["code"], code, "{arguments}: {:?}", ex.last);
    }
    assert_eq!(mock.calls_of("delete_repo"), 0, "the upstream saw nothing");
    // The token is unspent: the approved call still runs with its own arguments.
    let done = retry(&c, "delete_repo", Value::Null, approve(), &state).await;
    assert_eq!(
        done.result()["content"][0]["text"],
        "deleted",
        "{:?}",
        done.last
    );
}
