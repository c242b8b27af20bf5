//! Over stdio: what one legacy session says and hears — its `initialize`, requests answered on
//! SSE with its own ids, a server request inline on a call's stream, the GET stream of what no
//! request takes, cancellation, and a modern client served by the same proxy meanwhile.

use http::StatusCode;
use serde_json::{json, Value};

use super::{stdio_proxy, text_of, Legacy, Recorder, Stream};
use crate::support::{all_caps, first_key, first_round, retry};

#[tokio::test]
async fn initialize_opens_a_child_with_the_clients_own_initialize_and_issues_a_session_id() {
    let mut rec = Recorder::new();
    let p = stdio_proxy(&rec, "").await;
    let c = Legacy::new(&p);
    let (status, sid_a, body) = c.try_initialize(json!("init-a"), "client-a").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // The upstream's own InitializeResult, answering the client's own initialize, with its id.
    assert_eq!(body["id"], "init-a", "{body}");
    assert_eq!(body["result"]["serverInfo"]["name"], "bridge-script");
    assert_eq!(body["result"]["instructions"], "for client-a");
    assert_eq!(body["result"]["protocolVersion"], "2025-11-25");
    let (pid, init) = rec.child_of("client-a").await;
    assert_eq!(
        init["params"]["capabilities"],
        json!({"elicitation": {}, "roots": {"listChanged": true}})
    );
    let (_, sid_b, body_b) = c.try_initialize(json!(1), "client-b").await;
    assert_eq!(body_b["id"], 1);
    let (sid_a, sid_b) = (sid_a.unwrap(), sid_b.unwrap());
    assert_ne!(sid_a, sid_b);
    // At least 128 bits: 22 or more base64url characters (or 32 hex ones, a subset).
    for sid in [&sid_a, &sid_b] {
        let url_safe = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
        assert!(sid.len() >= 22 && sid.bytes().all(url_safe), "{sid}");
    }
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let (status, _) = c.with_session(&sid_a).post(&note).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    rec.until("notifications/initialized on client-a's child", |p, l| {
        p == pid && l.contains("notifications/initialized")
    })
    .await;
}

#[tokio::test]
async fn requests_are_answered_on_an_sse_stream_with_the_clients_own_id() {
    let mut rec = Recorder::new();
    let p = stdio_proxy(&rec, "").await;
    let mut c = Legacy::new(&p);
    c.initialize("c").await;
    let (pid, _) = rec.child_of("c").await;
    for id in [json!("abc"), json!(7)] {
        let answer = c
            .request(id.clone(), "tools/list", json!({}))
            .await
            .last()
            .await;
        assert_eq!(answer["id"], id, "{answer}");
        assert_eq!(answer["result"]["tools"][0]["name"], "pid", "{answer}");
    }
    // The upstream's error answer gets the client's id too.
    let failed = c
        .request(json!("e"), "prompts/list", json!({}))
        .await
        .last()
        .await;
    assert_eq!(failed["id"], "e", "{failed}");
    assert_eq!(failed["error"]["code"], -32601, "{failed}");
    // Upstream, the requests carried integer ids of the proxy's.
    let (_, line) = rec
        .until("tools/list on c's child", |p, l| {
            p == pid && l.contains("\"tools/list\"")
        })
        .await;
    let listed: Value = serde_json::from_str(&line).unwrap();
    assert!(listed["id"].is_i64(), "{listed}");
}

#[tokio::test]
async fn an_elicitation_arrives_on_the_calls_stream_and_its_answer_completes_the_call() {
    let rec = Recorder::new();
    let p = stdio_proxy(&rec, "").await;
    let mut c = Legacy::new(&p);
    c.initialize("c").await;
    let mut call = c.call(json!("call-1"), "ask").await;
    let ask = call.next().await;
    assert_eq!(ask["method"], "elicitation/create", "{ask}");
    assert_eq!(ask["params"]["message"], "Name?");
    let answer = json!({"jsonrpc": "2.0", "id": ask["id"],
        "result": {"action": "accept", "content": {"name": "Ada"}}});
    assert_eq!(c.post(&answer).await.0, StatusCode::ACCEPTED);
    let done = call.next().await;
    assert_eq!(done["id"], "call-1", "{done}");
    assert_eq!(text_of(&done), "Hello, Ada!");
    call.ended().await;
}

#[tokio::test]
async fn the_get_stream_carries_what_no_request_takes_and_a_second_get_gets_409() {
    let rec = Recorder::new();
    let p = stdio_proxy(&rec, "").await;
    let mut c = Legacy::new(&p);
    c.initialize("c").await;
    // `later` answers, then sends a notification and a request with no request open: they are
    // held for the GET stream until it opens.
    assert_eq!(text_of(&c.call_answer(json!(1), "later").await), "later");
    let resp = c.get().await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut get = Stream::of(resp);
    let changed = get.next().await;
    assert_eq!(changed["method"], "notifications/tools/list_changed");
    let ask = get.next().await;
    assert_eq!(
        (&ask["method"], &ask["id"]),
        (&json!("roots/list"), &json!(100))
    );
    assert_eq!(c.get().await.status(), StatusCode::CONFLICT);
    let roots = json!({"jsonrpc": "2.0", "id": 100, "result": {"roots": [{"uri": "file:///w"}]}});
    assert_eq!(c.post(&roots).await.0, StatusCode::ACCEPTED);
    // The child got the answer: what it says about it comes on the GET stream too.
    let said = get.next().await;
    assert_eq!(said["method"], "notifications/message", "{said}");
    assert_eq!(said["params"]["data"]["roots"][0]["uri"], "file:///w");
    // With the stream open, such messages go straight to it.
    assert_eq!(text_of(&c.call_answer(json!(2), "later").await), "later");
    let changed = get.next().await;
    assert_eq!(changed["method"], "notifications/tools/list_changed");
}

#[tokio::test]
async fn a_cancelled_notification_reaches_the_child_naming_the_upstream_id_of_the_call() {
    let mut rec = Recorder::new();
    let p = stdio_proxy(&rec, "").await;
    let mut c = Legacy::new(&p);
    c.initialize("c").await;
    let (pid, _) = rec.child_of("c").await;
    let _hang = c.call(json!("slow"), "hang").await;
    let (on, call) = rec
        .message("the hang call", |m| m["params"]["name"] == "hang")
        .await;
    assert_eq!(on, pid);
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": "slow", "reason": "enough"}});
    assert_eq!(c.post(&cancel).await.0, StatusCode::ACCEPTED);
    let (on, got) = rec
        .message("notifications/cancelled", |m| {
            m["method"] == "notifications/cancelled"
        })
        .await;
    assert_eq!(on, pid);
    assert!(call["id"].is_i64(), "{call}");
    assert_eq!(got["params"]["requestId"], call["id"], "{got}");
    assert_eq!(got["params"]["reason"], "enough");
}

#[tokio::test]
async fn two_requests_in_flight_on_one_session_are_each_answered_on_their_own_stream() {
    let mut rec = Recorder::new();
    let p = stdio_proxy(&rec, "").await;
    let mut c = Legacy::new(&p);
    c.initialize("c").await;
    let (pid, _) = rec.child_of("c").await;
    let _hang = c.call(json!("h"), "hang").await;
    rec.message("the hang call", |m| m["params"]["name"] == "hang")
        .await;
    let answer = c.call_answer(json!("p"), "pid").await;
    assert_eq!(answer["id"], "p", "{answer}");
    assert_eq!(text_of(&answer), pid.to_string());
}

#[tokio::test]
async fn a_modern_client_is_served_while_a_legacy_session_is_mid_call() {
    let mut rec = Recorder::new();
    let p = stdio_proxy(&rec, "").await;
    let mut legacy = Legacy::new(&p);
    legacy.initialize("legacy").await;
    let (legacy_pid, _) = rec.child_of("legacy").await;
    let mut call = legacy.call(json!("l"), "ask").await;
    let ask = call.next().await;
    assert_eq!(ask["method"], "elicitation/create");
    // A modern call runs on a pooled child, not the legacy client's, and a modern round works.
    let modern = p.client(all_caps());
    let ex = modern
        .request("tools/call", json!({"name": "pid", "arguments": {}}))
        .await
        .unwrap();
    let modern_pid = ex.result()["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(modern_pid, legacy_pid.to_string());
    let (round, state) = first_round(&modern, "ask", json!({})).await;
    let answers = json!({ first_key(&round): {"action": "accept", "content": {"name": "Grace"}} });
    let done = retry(&modern, "ask", json!({}), answers, &state).await;
    assert_eq!(done.result()["content"][0]["text"], "Hello, Grace!");
    let answer: Value = json!({"jsonrpc": "2.0", "id": ask["id"],
        "result": {"action": "accept", "content": {"name": "Ada"}}});
    assert_eq!(legacy.post(&answer).await.0, StatusCode::ACCEPTED);
    assert_eq!(text_of(&call.next().await), "Hello, Ada!");
}

#[tokio::test]
async fn the_approval_gate_asks_inline_and_an_approved_call_runs_on_the_clients_own_child() {
    let mut rec = Recorder::new();
    let gate = "\n[approval.tools.pid]\nmessage = \"Run pid?\"\n";
    let p = stdio_proxy(&rec, gate).await;
    let mut c = Legacy::new(&p);
    c.initialize("c").await;
    let mut call = c.call(json!("gated-1"), "pid").await;
    let ask = call.next().await;
    assert_eq!(ask["method"], "elicitation/create", "{ask}");
    assert_eq!(ask["params"]["message"], "Run pid?");
    let yes = json!({"jsonrpc": "2.0", "id": ask["id"],
        "result": {"action": "accept", "content": {"approve": true}}});
    assert_eq!(c.post(&yes).await.0, StatusCode::ACCEPTED);
    let done = call.next().await;
    assert_eq!(done["id"], "gated-1", "{done}");
    let pid: u32 = text_of(&done).parse().expect("the child's pid");
    let (child, _) = rec.child_of("c").await;
    assert_eq!(pid, child, "it ran on the client's own child");
}
