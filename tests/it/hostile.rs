//! The adversarial suite for bounds and hostile upstreams: each attack with the outcome it must
//! have, and after each the proxy healthy with no parked call, call actor, leased session,
//! session waiter or in-flight count left behind. (Token attacks are in `security`, slow and idle sockets and an
//! upstream that dies or stalls in `lifetimes`.)

use std::time::Duration;

use http::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::mock::{Mock, Step};
use crate::support::{all_caps, error_of, first_round, TestProxy};

/// Waits (bounded, no fixed sleep) until nothing is left open, then checks the proxy answers.
async fn assert_clean(proxy: &TestProxy) {
    let app = &proxy.app;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = (
            app.parked_calls(),
            app.open_calls(),
            app.session_waiters(),
            app.busy_principals(),
            app.parked_memory(),
            app.leased_sessions(),
        );
        if left == (0, 0, 0, 0, 0, 0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "left open (parked, calls, waiters, principals, parked bytes, leased sessions): {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(proxy.get_status("/healthz").await, StatusCode::OK);
}

fn done() -> Step {
    Step::Reply(json!({"content":[{"type":"text","text":"done"}]}))
}

async fn call(proxy: &TestProxy, tool: &str) -> mrtr_proxy::demo::client::Exchange {
    proxy
        .client(all_caps())
        .request("tools/call", json!({"name": tool, "arguments": {}}))
        .await
        .unwrap()
}

/// Sends raw request bytes on a fresh connection; the status line and the rest of the answer.
async fn raw_exchange(proxy: &TestProxy, request: &[u8]) -> String {
    let mut conn = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    conn.write_all(request).await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut got)).await;
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn garbage_sse_unknown_ids_and_unknown_notifications_are_ignored_and_the_result_arrives() {
    let mock = Mock::start().await;
    mock.script(
        "noisy",
        vec![vec![
            Step::Raw("data: {not json\n\n"),
            Step::Raw(": a comment\r\n\r\nevent: weird\r\ndata: [1,2\r\n\r\n"),
            Step::Raw("id: 7\nretry: 10\n\n"),
            Step::Send(json!({"jsonrpc":"2.0","id":987_654,"result":{"stray":true}})),
            Step::Send(json!({"jsonrpc":"2.0","method":"notifications/made-up"})),
            Step::Send(json!({"jsonrpc":"1.0","id":1,"method":"elicitation/create"})),
            done(),
        ]],
    );
    let proxy = TestProxy::start(&mock.url(), "").await;
    let ex = call(&proxy, "noisy").await;
    assert_eq!(ex.status, StatusCode::OK);
    assert_eq!(ex.result()["content"][0]["text"], "done");
    assert_clean(&proxy).await;
}

#[tokio::test]
async fn only_a_well_formed_answer_with_the_calls_own_id_ends_it_however_it_is_spelled() {
    let mock = Mock::start().await;
    let events = [
        // Not ours: the id as a string, as a float, another integer.
        r#"{"jsonrpc":"2.0","id":"{id}","result":{"content":[]}}"#,
        r#"{"jsonrpc":"2.0","id":{id}.0,"result":{"content":[]}}"#,
        r#"{"jsonrpc":"2.0","id":{id}0,"result":{"content":[]}}"#,
        // Ours, but malformed: cut short, a member twice, an error of the wrong shape.
        r#"{"jsonrpc":"2.0","id":{id},"result":{"content":[]}"#,
        r#"{"jsonrpc":"2.0","id":{id},"result":{},"result":{}}"#,
        r#"{"jsonrpc":"2.0","id":{id},"error":{"code":"x"}}"#,
        // Ours: members in another order, whitespace around the id, escapes, nested keys.
        concat!(
            r#"{"result":{"content":[{"type":"text","text":"the \"id\": {id}"}],"#,
            r#""structuredContent":{"a":{"b":[1,{"c":"}"}]}}},"id" :"#,
            "\t{id} ,",
            r#""jsonrpc":"2.0"}"#,
        ),
    ];
    mock.script("spelled", vec![events.map(Step::EventWithId).to_vec()]);
    let proxy = TestProxy::start(&mock.url(), "").await;
    let ex = call(&proxy, "spelled").await;
    assert_eq!(ex.status, StatusCode::OK);
    let result = ex.result();
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("the \"id\": "), "{result}");
    assert_eq!(
        result["structuredContent"]["a"]["b"][1]["c"], "}",
        "{result}"
    );
    assert_eq!(result["resultType"], "complete", "{result}");
    assert_clean(&proxy).await;
}

#[tokio::test]
async fn an_upstream_5xx_is_a_502_json_rpc_error_and_the_next_call_works() {
    let mock = Mock::start().await;
    mock.script("flaky", vec![vec![Step::Status(500)], vec![done()]]);
    let proxy = TestProxy::start(&mock.url(), "").await;
    let ex = call(&proxy, "flaky").await;
    assert_eq!(ex.status, StatusCode::BAD_GATEWAY);
    assert_eq!(error_of(&ex)["code"], -32603);
    let ex = call(&proxy, "flaky").await;
    assert_eq!(ex.result()["content"][0]["text"], "done");
    assert_clean(&proxy).await;
}

#[tokio::test]
async fn an_upstream_redirect_is_not_followed() {
    let mock = Mock::start().await;
    mock.script("moved", vec![vec![Step::Status(307)]]);
    let proxy = TestProxy::start(&mock.url(), "").await;
    let ex = call(&proxy, "moved").await;
    assert_eq!(ex.status, StatusCode::BAD_GATEWAY);
    assert!(
        !mock.paths().iter().any(|p| p == "/redirected"),
        "the proxy went where the upstream pointed: {:?}",
        mock.paths()
    );
    assert_clean(&proxy).await;
}

#[tokio::test]
async fn a_stream_that_closes_mid_event_is_a_clear_502() {
    let mock = Mock::start().await;
    mock.script(
        "cut",
        vec![vec![
            Step::Raw("data: {\"jsonrpc\":\"2.0\",\"id\":"),
            Step::Die,
        ]],
    );
    let proxy = TestProxy::start(&mock.url(), "").await;
    let ex = call(&proxy, "cut").await;
    assert_eq!(ex.status, StatusCode::BAD_GATEWAY);
    let message = error_of(&ex)["message"].as_str().unwrap().to_owned();
    assert!(message.contains("upstream"), "{message}");
    assert_clean(&proxy).await;
}

#[tokio::test]
async fn an_oversized_upstream_event_fails_the_call_without_buffering_it() {
    let mock = Mock::start().await;
    let huge: &'static str =
        Box::leak(format!("data: {}\n\n", "x".repeat(64 * 1024)).into_boxed_str());
    mock.script("huge", vec![vec![Step::Raw(huge), done()]]);
    let proxy = TestProxy::start(&mock.url(), "max_sse_event = \"4KiB\"\n").await;
    let ex = call(&proxy, "huge").await;
    assert_eq!(ex.status, StatusCode::BAD_GATEWAY);
    assert_clean(&proxy).await;
}

#[tokio::test]
async fn too_many_headers_or_an_oversized_head_get_431_and_the_proxy_stays_healthy() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(
        &mock.url(),
        "[server]\nmax_headers = 20\nmax_header_bytes = \"8KiB\"\n",
    )
    .await;
    let mut many = String::from("GET /healthz HTTP/1.1\r\nHost: x\r\n");
    for i in 0..30 {
        many.push_str(&format!("x-h{i}: v\r\n"));
    }
    many.push_str("\r\n");
    let got = raw_exchange(&proxy, many.as_bytes()).await;
    assert!(got.starts_with("HTTP/1.1 431"), "{got}");
    let big = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\nx-big: {}\r\n\r\n",
        "a".repeat(16 * 1024)
    );
    let got = raw_exchange(&proxy, big.as_bytes()).await;
    assert!(got.starts_with("HTTP/1.1 431"), "{got}");
    // Within the bounds, the same request is answered.
    let ok = raw_exchange(
        &proxy,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert_clean(&proxy).await;
}

#[tokio::test]
async fn a_principal_past_its_concurrency_bound_gets_429_and_others_do_not() {
    let mock = Mock::start().await;
    mock.script("hang", vec![vec![Step::Hang]]);
    let proxy = TestProxy::start(&mock.url(), "[server]\nmax_requests_per_principal = 2\n").await;
    let as_who = |who: &str| {
        let mut c = proxy.client(all_caps());
        c.headers
            .push(("authorization".into(), format!("Bearer {who}")));
        c
    };
    let hanging: Vec<_> = (0..2)
        .map(|_| {
            let c = as_who("greedy");
            tokio::spawn(async move {
                c.request("tools/call", json!({"name":"hang","arguments":{}}))
                    .await
            })
        })
        .collect();
    mock.wait_for_n("the hanging calls", 2, |m| m["params"]["name"] == "hang")
        .await;
    // From a browser: the refusal carries CORS headers, so the page can read it.
    let mut browser = as_who("greedy");
    browser
        .headers
        .push(("origin".into(), "http://localhost:5173".into()));
    let third = browser
        .request("tools/call", json!({"name":"other","arguments":{}}))
        .await
        .unwrap();
    assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        third.headers["access-control-allow-origin"],
        "http://localhost:5173"
    );
    assert_eq!(third.headers["retry-after"], "1");
    assert_eq!(error_of(&third)["code"], -32000);
    let other = as_who("modest")
        .request("tools/call", json!({"name":"other","arguments":{}}))
        .await
        .unwrap();
    assert_eq!(other.result()["content"][0]["text"], "ran other");
    let metrics = proxy.get_text("/metrics").await;
    assert!(
        metrics.contains("mrtr_limit_hits_total{limit=\"principal_requests\"} 1"),
        "{metrics}"
    );
    // The greedy client leaves: its slots come back.
    for h in hanging {
        h.abort();
    }
    assert_clean(&proxy).await;
    let again = as_who("greedy")
        .request("tools/call", json!({"name":"other","arguments":{}}))
        .await
        .unwrap();
    assert_eq!(again.status, StatusCode::OK);
}

/// An HTTP/1.1 keep-alive connection that has had one request answered and now sits idle.
async fn idle_keepalive(proxy: &TestProxy) -> tokio::net::TcpStream {
    let mut conn = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = conn.read(&mut buf).await.unwrap();
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    conn
}

#[tokio::test]
async fn a_full_listener_sheds_its_longest_idle_connection_for_a_new_one() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "[server]\nmax_connections = 2\n").await;
    let mut oldest = idle_keepalive(&proxy).await;
    let newer = idle_keepalive(&proxy).await;
    // Both slots are taken by idle keep-alive connections: a new client still gets answered,
    // and the connection idle the longest is the one closed for it.
    assert_eq!(proxy.get_status("/healthz").await, StatusCode::OK);
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), oldest.read_to_end(&mut rest)).await;
    assert!(
        matches!(closed, Ok(Ok(0))),
        "the oldest idle connection was closed"
    );
    let metrics = proxy.get_text("/metrics").await;
    assert!(
        metrics.contains("mrtr_limit_hits_total{limit=\"idle_connection_shed\"}"),
        "{metrics}"
    );
    drop(newer);
    assert_clean(&proxy).await;
}

#[tokio::test]
async fn a_connection_answering_a_request_is_never_shed() {
    let mock = Mock::start().await;
    mock.script("hang", vec![vec![Step::Hang]]);
    let proxy = TestProxy::start(
        &mock.url(),
        "[server]\nmax_connections = 1\nheader_read_timeout = \"300ms\"\n",
    )
    .await;
    let c = proxy.client(all_caps());
    let busy = tokio::spawn(async move {
        c.request("tools/call", json!({"name":"hang","arguments":{}}))
            .await
    });
    mock.wait_for("the hanging call upstream", |m| {
        m["params"]["name"] == "hang"
    })
    .await;
    // The one slot is busy: a new connection waits for header_read_timeout, then is closed
    // unanswered, and the busy one keeps going.
    let got = raw_exchange(&proxy, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(got.is_empty(), "{got}");
    assert!(!busy.is_finished(), "the busy connection was not shed");
    busy.abort();
    assert_clean(&proxy).await;
}

fn elicit_then_done() -> Vec<Vec<Step>> {
    vec![vec![Step::elicit(1), Step::Await(1), done()]]
}

#[tokio::test]
async fn parked_calls_are_bounded_by_the_memory_they_hold() {
    let mock = Mock::start().await;
    mock.script("ask", elicit_then_done());
    // Room for a parked call with small params (64 KiB charged each, plus params), not for one
    // whose arguments are 40 KiB.
    let proxy = TestProxy::start(&mock.url(), "[state]\nmax_parked_memory = \"100KiB\"\n").await;
    let c = proxy.client(all_caps());
    let big = json!({"blob": "x".repeat(40 * 1024)});
    let ex = c
        .request("tools/call", json!({"name":"ask","arguments": big}))
        .await
        .unwrap();
    assert_eq!(ex.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        error_of(&ex)["message"]
            .as_str()
            .unwrap()
            .contains("memory"),
        "{:?}",
        error_of(&ex)
    );
    let (_, state) = first_round(&c, "ask", json!({})).await;
    assert!(proxy.app.parked_memory() > 64 * 1024);
    let metrics = proxy.get_text("/metrics").await;
    assert!(
        metrics.contains("mrtr_limit_hits_total{limit=\"parked\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("mrtr_parked_memory_bytes "), "{metrics}");
    let answers = json!({"elicitation-1": {"action":"accept","content":{}}});
    let ex = crate::support::retry(&c, "ask", json!({}), answers, &state).await;
    assert_eq!(ex.result()["content"][0]["text"], "done");
    assert_clean(&proxy).await;
}

#[tokio::test]
async fn an_upstream_that_goes_silent_mid_call_is_cancelled_and_answered_504() {
    let mock = Mock::start().await;
    mock.script("silent", vec![vec![Step::Hang]]);
    // Keep-alive comments count as activity: this one pings, slowly, then answers.
    let mut pinging = Vec::new();
    for _ in 0..4 {
        pinging.push(Step::Delay(100));
        pinging.push(Step::Raw(": ping\n\n"));
    }
    pinging.push(done());
    mock.script("pinging", vec![pinging]);
    let proxy = TestProxy::start(&mock.url(), "sse_idle_timeout = \"300ms\"\n").await;
    let ex = call(&proxy, "silent").await;
    assert_eq!(ex.status, StatusCode::GATEWAY_TIMEOUT);
    mock.wait_for("the silent call cancelled upstream", |m| {
        m["method"] == "notifications/cancelled"
    })
    .await;
    let ex = call(&proxy, "pinging").await;
    assert_eq!(ex.result()["content"][0]["text"], "done");
    assert_clean(&proxy).await;
}
