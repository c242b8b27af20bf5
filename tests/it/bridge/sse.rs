//! Over HTTP+SSE (the built-in demo server's 2024-11-05 transport): the main flows of a legacy
//! session, each client on an upstream session of its own; and with `transport = "auto"`, a
//! legacy client that comes before the proxy found out what the upstream speaks.

use http::StatusCode;
use mrtr_proxy::demo::transports::start_sse;
use mrtr_proxy::demo::upstream::DemoUpstream;
use serde_json::{json, Value};

use super::{text_of, Legacy, Stream};
use crate::support::TestProxy;

/// The demo server over HTTP+SSE and the proxy in front of it (`transport = "sse"`: see the
/// last test for `auto`).
async fn demo() -> (DemoUpstream, TestProxy) {
    let up = start_sse().await.unwrap();
    let p = TestProxy::start(&up.url(), "transport = \"sse\"\n").await;
    (up, p)
}

#[tokio::test]
async fn over_http_sse_a_session_initializes_lists_and_runs_an_elicitation_round() {
    let (_up, p) = demo().await;
    let mut c = Legacy::new(&p);
    let (status, sid, body) = c.try_initialize(json!("i"), "c").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["id"], "i");
    assert_eq!(body["result"]["serverInfo"]["name"], "mrtr-demo-upstream");
    c.sid = Some(sid.expect("a session id"));
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(c.post(&note).await.0, StatusCode::ACCEPTED);
    let listed = c
        .request(json!("abc"), "tools/list", json!({}))
        .await
        .last()
        .await;
    assert_eq!(listed["id"], "abc", "{listed}");
    assert!(listed["result"]["tools"].as_array().unwrap().len() > 3);
    let mut call = c.call(json!("call"), "ask_name").await;
    let ask = call.next().await;
    assert_eq!(ask["method"], "elicitation/create", "{ask}");
    let answer = json!({"jsonrpc": "2.0", "id": ask["id"],
        "result": {"action": "accept", "content": {"name": "Ada"}}});
    assert_eq!(c.post(&answer).await.0, StatusCode::ACCEPTED);
    let done = call.next().await;
    assert_eq!(done["id"], "call", "{done}");
    assert_eq!(text_of(&done), "Hello, Ada!");
    call.ended().await;
}

#[tokio::test]
async fn over_http_sse_progress_arrives_on_the_calls_stream_before_its_result() {
    let (_up, p) = demo().await;
    let mut c = Legacy::new(&p);
    c.initialize("c").await;
    let params =
        json!({"name": "progress", "arguments": {"steps": 2}, "_meta": {"progressToken": "t"}});
    let mut call = c.request(json!(3), "tools/call", params).await;
    for step in 1..=2 {
        let note = call.next().await;
        assert_eq!(note["method"], "notifications/progress", "{note}");
        assert_eq!(note["params"]["progressToken"], "t");
        assert_eq!(note["params"]["progress"], step);
    }
    let done = call.next().await;
    assert_eq!(done["id"], 3);
    assert_eq!(text_of(&done), "done after 2 steps");
    call.ended().await;
}

#[tokio::test]
async fn over_http_sse_each_client_has_an_upstream_session_of_its_own_until_delete() {
    let (up, p) = demo().await;
    let mut a = Legacy::new(&p);
    a.initialize("a").await;
    let mut b = Legacy::new(&p);
    b.initialize("b").await;
    assert_ne!(a.sid, b.sid);
    // The upstream got each client's own initialize (on a session of its own: the demo answers
    // initialize on the stream it came on).
    let names: Vec<Value> = up
        .observed(|o| {
            o.initialized
                .iter()
                .map(|i| i["clientInfo"]["name"].clone())
                .collect()
        })
        .unwrap();
    assert!(
        names.contains(&json!("a")) && names.contains(&json!("b")),
        "{names:?}"
    );
    assert_eq!(a.delete().await, StatusCode::OK);
    a.assert_unknown().await;
    let answer = b
        .request(json!(1), "tools/list", json!({}))
        .await
        .last()
        .await;
    assert_eq!(answer["id"], 1, "{answer}");
    Legacy::new(&p)
        .with_session("unknown")
        .assert_unknown()
        .await;
}

#[tokio::test]
async fn over_http_sse_an_upstream_that_drops_the_session_ends_the_clients_with_404() {
    let (up, p) = demo().await;
    let mut c = Legacy::new(&p);
    c.initialize("c").await;
    let mut get = Stream::of(c.get().await);
    // Like a restarted server: the session's stream ends.
    up.forget_sessions();
    get.ended().await;
    c.assert_unknown().await;
    let mut again = Legacy::new(&p);
    again.initialize("again").await;
    let answer = again
        .request(json!(1), "tools/list", json!({}))
        .await
        .last()
        .await;
    assert_eq!(answer["id"], 1, "{answer}");
}

#[tokio::test]
async fn over_http_sse_found_by_auto_a_legacy_client_arriving_first_is_bridged() {
    let up = start_sse().await.unwrap();
    // `auto`: the readiness probe finds HTTP+SSE in the background; the client may come first.
    let p = TestProxy::start(&up.url(), "").await;
    let mut c = Legacy::new(&p);
    let (status, sid, body) = c.try_initialize(json!(0), "early").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["result"]["serverInfo"]["name"], "mrtr-demo-upstream");
    c.sid = Some(sid.expect("a session id"));
    let answer = c
        .request(json!(1), "tools/list", json!({}))
        .await
        .last()
        .await;
    assert_eq!(answer["id"], 1, "{answer}");
}

#[tokio::test]
async fn another_principals_delete_does_not_unmake_a_sessions_inline_approvals() {
    // `progress` is gated; alice's session declared elicitation, so the proxy asks her inline.
    // Bob's DELETE of her session id is refused (404): what the gate knows of it stays.
    let up = start_sse().await.unwrap();
    let config = "transport = \"sse\"\n[approval.tools.progress]\n";
    let p = TestProxy::start(&up.url(), config).await;
    let mut alice = Legacy::new(&p).speaking_for("Bearer alice");
    alice.initialize("alice").await;
    let sid = alice.sid.clone().unwrap();
    let bob = Legacy::new(&p)
        .speaking_for("Bearer bob")
        .with_session(&sid);
    assert_eq!(bob.delete().await, StatusCode::NOT_FOUND);
    let mut call = alice.call(json!("c"), "progress").await;
    let asked = call.next().await;
    assert_eq!(asked["method"], "elicitation/create", "{asked}");
}
