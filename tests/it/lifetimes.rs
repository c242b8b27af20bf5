//! Lifetimes and limits: TTL expiry, bounds, upstream death, client disconnects, session reuse.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::mock::{Mock, Step};
use crate::support::{all_caps, error_of, first_round, retry, Listener, TestProxy};

fn elicit(id: i64) -> Step {
    Step::Send(
        json!({"jsonrpc":"2.0","id":id,"method":"elicitation/create","params":{"message":"n","requestedSchema":{"type":"object","properties":{}}}}),
    )
}

/// Retries `tool` (no arguments) accepting `elicitation-1` with empty content.
async fn answer_first(
    c: &mrtr_proxy::demo::client::ModernClient,
    tool: &str,
    state: &str,
) -> mrtr_proxy::demo::client::Exchange {
    let answers = json!({"elicitation-1":{"action":"accept","content":{}}});
    retry(c, tool, json!({}), answers, state).await
}

/// A tool that elicits once (id 1), then finishes.
fn ask_once() -> Vec<Vec<Step>> {
    vec![vec![
        elicit(1),
        Step::Await(1),
        Step::Reply(json!({"content":[]})),
    ]]
}

fn sample(id: i64) -> Step {
    Step::Send(
        json!({"jsonrpc":"2.0","id":id,"method":"sampling/createMessage","params":{"messages":[],"maxTokens":1}}),
    )
}

#[tokio::test]
async fn ttl_expiry_cancels_pending_requests_and_the_call_upstream() {
    let mock = Mock::start().await;
    mock.script(
        "ask",
        vec![vec![
            elicit(1),
            sample(2),
            Step::Await(1),
            Step::Reply(json!({})),
        ]],
    );
    let proxy = TestProxy::start(&mock.url(), "[state]\nttl = \"30s\"\n").await;
    let c = proxy.client(all_caps());
    let _ = first_round(&c, "ask", json!({})).await;
    assert_eq!(proxy.app.parked_calls(), 1);
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(29)).await;
    assert_eq!(
        proxy.app.parked_calls(),
        1,
        "still parked just before the TTL"
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    tokio::time::resume();
    let a = mock
        .wait_for("elicitation cancel", |m| {
            m["id"] == 1 && m.get("result").is_some()
        })
        .await;
    assert_eq!(a["result"], json!({"action":"cancel"}));
    mock.wait_for("sampling error", |m| {
        m["id"] == 2 && m.get("error").is_some()
    })
    .await;
    mock.wait_for("notifications/cancelled", |m| {
        m["method"] == "notifications/cancelled"
    })
    .await;
    mock.wait_deleted(2).await; // the readiness probe's session and the call's
    assert_eq!(proxy.app.parked_calls(), 0, "registry entry removed");
}

#[tokio::test]
async fn parked_calls_are_bounded_per_principal_with_503() {
    let mock = Mock::start().await;
    mock.script("ask", ask_once());
    let proxy = TestProxy::start(&mock.url(), "[state]\nmax_parked_per_principal = 1\n").await;
    let c = proxy.client(all_caps());
    let (_, state) = first_round(&c, "ask", json!({})).await;
    let ex = c
        .request("tools/call", json!({"name":"ask","arguments":{}}))
        .await
        .unwrap();
    assert_eq!(ex.status, http::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error_of(&ex)["code"], -32000);
    let mut other = proxy.client(all_caps());
    other
        .headers
        .push(("authorization".into(), "Bearer someone-else".into()));
    let (_, _) = first_round(&other, "ask", json!({})).await;
    let ex = retry(
        &c,
        "ask",
        json!({}),
        json!({"elicitation-1":{"action":"decline"}}),
        &state,
    )
    .await;
    assert_eq!(
        ex.result()["resultType"],
        "complete",
        "the first call was not degraded"
    );
}

#[tokio::test]
async fn upstream_death_while_parked_is_a_clear_error_on_retry() {
    let mock = Mock::start().await;
    // The server dies a while after asking (the call is parked by then).
    mock.script(
        "fragile",
        vec![vec![elicit(1), Step::Delay(300), Step::Die]],
    );
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(all_caps());
    let (_, state) = first_round(&c, "fragile", json!({})).await;
    // The stream ended; the actor notices without client traffic and closes the session.
    mock.wait_deleted(2).await;
    assert_eq!(proxy.app.parked_calls(), 0);
    let ex = answer_first(&c, "fragile", &state).await;
    let e = error_of(&ex);
    assert_eq!(e["code"], -32602);
    assert!(e["message"].as_str().unwrap().contains("upstream"), "{e}");
}

#[tokio::test]
async fn upstream_death_while_resuming_is_a_502_error() {
    let mock = Mock::start().await;
    mock.script("fragile", vec![vec![elicit(1), Step::Await(1), Step::Die]]);
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(all_caps());
    let (_, state) = first_round(&c, "fragile", json!({})).await;
    let ex = answer_first(&c, "fragile", &state).await;
    assert_eq!(ex.status, http::StatusCode::BAD_GATEWAY);
    assert_eq!(error_of(&ex)["code"], -32603);
    assert_eq!(proxy.app.parked_calls(), 0);
}

#[tokio::test]
async fn a_client_closing_the_stream_cancels_upstream() {
    client_close_cancels_upstream(false).await;
}

#[tokio::test]
async fn a_client_closing_the_stream_cancels_a_json_mode_upstream_before_its_headers() {
    client_close_cancels_upstream(true).await;
}

// The answer not decided yet (no keepalive comes before the client leaves, so the response is
// neither JSON nor SSE yet): the request is dropped while it waits for the call's first word.
#[tokio::test]
async fn a_client_leaving_before_any_answer_cancels_upstream() {
    client_close_cancels_upstream_with(false, "[server]\nkeepalive = \"60s\"\n").await;
}

async fn client_close_cancels_upstream(json_mode: bool) {
    client_close_cancels_upstream_with(json_mode, "[server]\nkeepalive = \"50ms\"\n").await;
}

async fn client_close_cancels_upstream_with(json_mode: bool, config: &str) {
    let mock = Mock::start().await;
    if json_mode {
        mock.json_mode();
    }
    mock.script("forever", vec![vec![Step::Hang]]);
    let proxy = TestProxy::start(&mock.url(), config).await;
    let c = proxy.client(json!({}));
    let call = tokio::spawn(async move {
        c.request("tools/call", json!({"name":"forever","arguments":{}}))
            .await
    });
    mock.wait_for("the call", |m| m["method"] == "tools/call")
        .await;
    call.abort();
    let n = mock
        .wait_for("notifications/cancelled", |m| {
            m["method"] == "notifications/cancelled"
        })
        .await;
    assert!(n["params"]["requestId"].is_i64());
}

#[tokio::test]
async fn sessions_are_reused_and_reinitialized_after_404() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(json!({}));
    for _ in 0..3 {
        c.request("tools/call", json!({"name":"plain","arguments":{}}))
            .await
            .unwrap();
    }
    let inits = |m: &Mock| {
        m.initialized()
            .iter()
            .filter(|p| p["capabilities"] == json!({}))
            .count()
    };
    let before = inits(&mock);
    assert!(
        before <= 2,
        "sessions are pooled (probe + one), got {before}"
    );
    mock.forget_sessions();
    let ex = c
        .request("tools/call", json!({"name":"plain","arguments":{}}))
        .await
        .unwrap();
    assert_eq!(
        ex.result()["content"][0]["text"],
        "ran plain",
        "re-initialized transparently"
    );
    assert_eq!(inits(&mock), before + 1);
    let caps = proxy.client(json!({"sampling":{}}));
    caps.request("tools/list", json!({})).await.unwrap();
    assert_eq!(
        mock.initialized().last().unwrap()["capabilities"],
        json!({"sampling":{}}),
        "another capability set, another session"
    );
}

#[tokio::test]
async fn idle_sessions_are_closed_with_delete() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "[pool]\nidle_timeout = \"200ms\"\n").await;
    proxy
        .client(json!({"roots":{}}))
        .request("tools/list", json!({}))
        .await
        .unwrap();
    mock.wait_deleted(2).await; // the probe's session at once, the pooled one once idle
    assert_eq!(proxy.app.idle_sessions(), 0);
}

#[tokio::test]
async fn listen_acknowledges_then_relays_tagged_list_changes() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let filter = json!({"toolsListChanged":true,"promptsListChanged":true});
    let mut listener = Listener::open(&proxy, "sub-1", filter, None).await;
    let ack = listener.next().await;
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(
        ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "sub-1"
    );
    assert_eq!(
        ack["params"]["notifications"],
        json!({"toolsListChanged": true}),
        "only what the upstream supports"
    );
    mock.broadcast_on_get(json!({"jsonrpc":"2.0","method":"notifications/resources/list_changed"}))
        .await;
    mock.broadcast_on_get(json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"}))
        .await;
    let ev = listener.next().await;
    assert_eq!(
        ev["method"], "notifications/tools/list_changed",
        "unrequested kinds are filtered"
    );
    assert_eq!(
        ev["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "sub-1"
    );
}

#[tokio::test]
async fn a_change_on_a_call_session_reaches_listeners_of_that_principal_only() {
    // Legacy servers notify a change on the session where it happened: here the call's own
    // session, not the listen stream's. Listeners of the same principal must still see it.
    let mock = Mock::start().await;
    let changed = |m: Value| vec![Step::SendOnGet(m), Step::Reply(json!({"content":[]}))];
    mock.script(
        "add_tool",
        vec![changed(
            json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"}),
        )],
    );
    mock.script(
        "touch",
        vec![changed(
            json!({"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"file:///x"}}),
        )],
    );
    let proxy = TestProxy::start(&mock.url(), "").await;
    let filter = json!({"toolsListChanged":true,"resourceSubscriptions":["file:///x"]});
    let mut alice = Listener::open(&proxy, "a", filter.clone(), Some("Bearer alice")).await;
    let mut bob = Listener::open(&proxy, "b", filter, Some("Bearer bob")).await;
    for l in [&mut alice, &mut bob] {
        assert_eq!(
            l.next().await["method"],
            "notifications/subscriptions/acknowledged"
        );
    }
    let as_user = |who: &str| {
        let mut c = proxy.client(json!({}));
        c.headers
            .push(("authorization".into(), format!("Bearer {who}")));
        c
    };
    let call = |name: &str| json!({"name": name, "arguments": {}});
    as_user("alice")
        .request("tools/call", call("add_tool"))
        .await
        .unwrap();
    let ev = alice.next().await;
    assert_eq!(ev["method"], "notifications/tools/list_changed");
    assert_eq!(
        ev["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "a"
    );
    // Alice's change went out before Bob's: Bob's first event being his own proves he never got
    // hers (one ordered channel feeds every listener).
    as_user("bob")
        .request("tools/call", call("touch"))
        .await
        .unwrap();
    let ev = bob.next().await;
    assert_eq!(ev["method"], "notifications/resources/updated", "{ev}");
    assert_eq!(ev["params"]["uri"], "file:///x");
    assert_eq!(
        ev["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "b"
    );
}

#[tokio::test]
async fn a_listen_session_is_lent_to_calls_kept_while_open_and_its_death_ends_the_stream() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let mut listener = Listener::open(
        &proxy,
        "l",
        json!({"resourceSubscriptions":["file:///x"]}),
        None,
    )
    .await;
    let ack = listener.next().await;
    assert_eq!(
        ack["params"]["notifications"],
        json!({"resourceSubscriptions":["file:///x"]})
    );
    // A call with the same principal and capabilities runs on the listen stream's session, where
    // the upstream subscription lives (server-everything sends "your" updates to that session).
    let sessions = mock.initialized().len();
    let c = proxy.client(json!({}));
    c.request("tools/call", json!({"name":"plain","arguments":{}}))
        .await
        .unwrap();
    assert_eq!(
        mock.initialized().len(),
        sessions,
        "no new session for the call"
    );
    // Idle far past the idle timeout, the session is still kept: the listen stream needs it.
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(6 * 60)).await;
    tokio::time::resume();
    proxy.app.reap_idle_sessions().await;
    assert_eq!(proxy.app.idle_sessions(), 1);
    mock.broadcast_on_get(
        json!({"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"file:///x"}}),
    )
    .await;
    assert_eq!(listener.next().await["params"]["uri"], "file:///x");
    // The upstream forgets the session: the next call re-initializes elsewhere, the old session is
    // closed, and the listen stream ends so that the client re-listens.
    mock.forget_sessions();
    c.request("tools/call", json!({"name":"plain","arguments":{}}))
        .await
        .unwrap();
    listener.ended().await;
}

#[tokio::test]
async fn listen_streams_of_one_principal_and_capabilities_share_one_session() {
    // The second stream comes while a parked call holds the first one's session (lent to the
    // call first): it shares that session rather than pin one more, kept as long as it is open.
    let mock = Mock::start().await;
    mock.script("ask", ask_once());
    let proxy = TestProxy::start(&mock.url(), "").await;
    let filter = json!({"toolsListChanged": true});
    let acknowledged = "notifications/subscriptions/acknowledged";
    let mut first = Listener::declaring(&proxy, "1", filter.clone(), None, all_caps()).await;
    assert_eq!(first.next().await["method"], acknowledged);
    let c = proxy.client(all_caps());
    let (_, state) = first_round(&c, "ask", json!({})).await;
    let sessions = mock.initialized().len();
    let mut second = Listener::declaring(&proxy, "2", filter, None, all_caps()).await;
    assert_eq!(second.next().await["method"], acknowledged);
    assert_eq!(
        mock.initialized().len(),
        sessions,
        "no session of its own for the second stream"
    );
    let done = answer_first(&c, "ask", &state).await;
    assert_eq!(done.result()["resultType"], "complete");
    // Past the idle timeout, only the sessions listen streams pin are kept: one.
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(6 * 60)).await;
    tokio::time::resume();
    proxy.app.reap_idle_sessions().await;
    assert_eq!(proxy.app.idle_sessions(), 1);
    mock.broadcast_on_get(json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"}))
        .await;
    for (l, id) in [(&mut first, "1"), (&mut second, "2")] {
        let ev = l.next().await;
        assert_eq!(ev["method"], "notifications/tools/list_changed");
        assert_eq!(
            ev["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
            id
        );
    }
}

#[tokio::test]
async fn listen_streams_opened_at_once_share_the_session_the_first_opens() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    // Ready: the readiness probe's handshake is behind us.
    proxy
        .client(json!({}))
        .request("tools/list", json!({}))
        .await
        .unwrap();
    let sessions = mock.initialized().len();
    let filter = json!({"toolsListChanged": true});
    let open = |id: &'static str| Listener::declaring(&proxy, id, filter.clone(), None, all_caps());
    let (mut a, mut b, mut c) = tokio::join!(open("a"), open("b"), open("c"));
    for l in [&mut a, &mut b, &mut c] {
        let ack = l.next().await;
        assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    }
    assert_eq!(
        mock.initialized().len(),
        sessions + 1,
        "one session for the three"
    );
    assert_eq!(proxy.app.listen_sessions(), 1);
    // It is unpinned when the last of them ends.
    drop((a, b, c));
    tokio::time::timeout(Duration::from_secs(10), async {
        while proxy.app.listen_sessions() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the session is unpinned when its last stream ends");
}

#[tokio::test]
async fn at_its_bound_a_stream_that_subscribes_waits_for_the_call_on_its_session() {
    // One listen session per principal. The second stream subscribes to a resource, which it
    // must do alone on the session (a stdio or HTTP+SSE upstream gives its requests to the
    // oldest request open); a parked call holds it. It waits for the call to end, then
    // subscribes on that same session.
    let mock = Mock::start().await;
    mock.script("ask", ask_once());
    let config = "[pool]\nmax_listen_sessions_per_principal = 1\n";
    let proxy = TestProxy::start(&mock.url(), config).await;
    let follow = |uri: &str| json!({"resourceSubscriptions": [uri]});
    let mut first = Listener::declaring(&proxy, "1", follow("file:///a"), None, all_caps()).await;
    assert_eq!(
        first.next().await["params"]["notifications"],
        follow("file:///a")
    );
    let c = proxy.client(all_caps());
    let (_, state) = first_round(&c, "ask", json!({})).await;
    let sessions = mock.initialized().len();
    let second = Listener::declaring(&proxy, "2", follow("file:///b"), None, all_caps());
    let answer = async {
        // Time for the stream to be waiting (were it not, it would subscribe at once).
        tokio::time::sleep(Duration::from_millis(200)).await;
        answer_first(&c, "ask", &state).await
    };
    let (mut second, done) = tokio::join!(second, answer);
    assert_eq!(done.result()["resultType"], "complete");
    assert_eq!(
        second.next().await["params"]["notifications"],
        follow("file:///b")
    );
    assert_eq!(mock.initialized().len(), sessions, "the same session");
    let posted = mock.posted_with_headers();
    let at =
        |pred: &dyn Fn(&Value) -> bool| posted.iter().position(|(m, _)| pred(m)).expect("posted");
    let answered = at(&|m| m["id"] == 1 && m.get("result").is_some());
    let subscribed = at(&|m| m["params"]["uri"] == "file:///b");
    assert!(answered < subscribed, "it subscribed beside the call");
    let session_of = |i: usize| posted[i].1.get("mcp-session-id").cloned();
    assert_eq!(session_of(answered), session_of(subscribed));
}

#[tokio::test]
async fn a_request_waiting_for_a_full_pool_evicts_a_session_that_goes_idle() {
    // One session in all. A parks on it; B (other capabilities, so another key) must wait. When
    // A finishes, its session goes back idle: B evicts it and gets a fresh one instead of timing
    // out while a permit sits in an idle session.
    let mock = Mock::start().await;
    mock.script("ask", ask_once());
    let proxy = TestProxy::start(
        &mock.url(),
        "[pool]\nmax_sessions = 1\nacquire_timeout = \"10s\"\n",
    )
    .await;
    let a = proxy.client(all_caps());
    let (_, state) = first_round(&a, "ask", json!({})).await;
    let b = proxy.client(json!({}));
    let waiting = tokio::spawn(async move {
        b.request("tools/call", json!({"name":"plain","arguments":{}}))
            .await
            .unwrap()
    });
    tokio::time::timeout(Duration::from_secs(10), async {
        while proxy.app.session_waiters() == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("B waits for a session");
    let done = answer_first(&a, "ask", &state).await;
    assert_eq!(done.result()["resultType"], "complete");
    let ex = waiting.await.unwrap();
    assert_eq!(ex.status, http::StatusCode::OK, "{:?}", ex.last);
    assert_eq!(ex.result()["content"][0]["text"], "ran plain");
    assert_eq!(proxy.app.session_waiters(), 0);
}

#[tokio::test]
async fn shutdown_ends_listen_streams_at_once() {
    let mock = Mock::start().await;
    // A long grace: the stream must end because of the shutdown, not the drain deadline.
    let proxy = TestProxy::start(&mock.url(), "[server]\nshutdown_grace = \"60s\"\n").await;
    let mut listener = Listener::open(&proxy, "l", json!({"toolsListChanged":true}), None).await;
    assert_eq!(
        listener.next().await["method"],
        "notifications/subscriptions/acknowledged"
    );
    drop(proxy);
    listener.ended().await;
}

#[tokio::test]
async fn shutdown_cancels_calls_still_parked_after_the_grace_then_deletes_sessions() {
    let mock = Mock::start().await;
    mock.script(
        "ask",
        vec![vec![elicit(1), Step::Await(1), Step::Reply(json!({}))]],
    );
    let mut proxy = TestProxy::start(&mock.url(), "[server]\nshutdown_grace = \"100ms\"\n").await;
    let c = proxy.client(all_caps());
    let _ = first_round(&c, "ask", json!({})).await;
    // The whole sequence completes before `stopped` returns: nothing is left to a dropped runtime.
    proxy.stopped().await;
    let a = mock
        .wait_for("the cancel answer", |m| {
            m["id"] == 1 && m.get("result").is_some()
        })
        .await;
    assert_eq!(a["result"], json!({"action":"cancel"}));
    mock.wait_for("notifications/cancelled", |m| {
        m["method"] == "notifications/cancelled"
    })
    .await;
    assert_eq!(proxy.app.parked_calls(), 0);
    assert_eq!(proxy.app.idle_sessions(), 0);
    assert!(!mock.deleted().is_empty(), "the call's session was DELETEd");
}

#[tokio::test]
async fn a_parked_call_can_be_resumed_while_the_proxy_drains() {
    let mock = Mock::start().await;
    mock.script("ask", ask_once());
    let mut proxy = TestProxy::start(&mock.url(), "[server]\nshutdown_grace = \"30s\"\n").await;
    let c = proxy.client(all_caps());
    let (_, state) = first_round(&c, "ask", json!({})).await;
    proxy.begin_shutdown();
    // Readiness goes off at once; observe it rather than sleep.
    while proxy.get_status("/readyz").await != http::StatusCode::SERVICE_UNAVAILABLE {
        tokio::task::yield_now().await;
    }
    let fresh = c
        .request("tools/call", json!({"name": "ask", "arguments": {}}))
        .await
        .unwrap();
    assert_eq!(
        fresh.status,
        http::StatusCode::SERVICE_UNAVAILABLE,
        "no new calls"
    );
    assert_eq!(error_of(&fresh)["code"], -32000);
    let done = answer_first(&c, "ask", &state).await;
    assert_eq!(done.result()["resultType"], "complete", "{:?}", done.last);
    // Nothing is left: the drain ends long before its 30 s grace.
    proxy.stopped().await;
    assert!(!mock.deleted().is_empty());
}

/// A raw TCP connection to the proxy; resolves to the bytes it got before the proxy closed it
/// (panics if it stays open for 5 s).
async fn closed_by_proxy(mut conn: tokio::net::TcpStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut got))
        .await
        .expect("the proxy closes the connection")
        .unwrap();
    got
}

#[tokio::test]
async fn idle_and_slow_connections_are_closed_so_they_cannot_exhaust_the_listener() {
    use tokio::io::AsyncWriteExt;
    let mock = Mock::start().await;
    let proxy = TestProxy::start(
        &mock.url(),
        "[server]\nmax_connections = 2\nheader_read_timeout = \"200ms\"\n",
    )
    .await;
    // Both permits taken: one socket that sends nothing, one that trickles a header.
    let silent = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let mut slow = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    slow.write_all(b"POST /mcp HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let (a, b) = tokio::join!(closed_by_proxy(silent), closed_by_proxy(slow));
    assert!(a.is_empty(), "nothing is answered to a silent socket");
    let _ = b;
    // The permits came back: the proxy answers again.
    assert_eq!(proxy.get_status("/healthz").await, http::StatusCode::OK);
}

#[tokio::test]
async fn a_body_that_stops_arriving_gets_408() {
    use tokio::io::AsyncWriteExt;
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "[server]\nbody_read_timeout = \"200ms\"\n").await;
    let mut conn = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    conn.write_all(
        b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"jsonrpc\"",
    )
    .await
    .unwrap();
    let got = String::from_utf8(closed_by_proxy(conn).await).unwrap();
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("-32600"), "{got}");
}

/// Waits (bounded) until the proxy says it is ready.
async fn ready(proxy: &TestProxy) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while proxy.get_status("/readyz").await != http::StatusCode::OK {
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn an_initialize_that_stalls_after_its_headers_times_out_and_frees_its_session() {
    let mock = Mock::start().await;
    // (Keys before the first table land in [upstream].)
    let proxy = TestProxy::start(
        &mock.url(),
        "timeout = \"300ms\"\n[pool]\nmax_sessions = 2\nacquire_timeout = \"100ms\"\n",
    )
    .await;
    ready(&proxy).await;
    mock.stall_initialize();
    let c = proxy.client(json!({}));
    // More requests than sessions: a leaked session would make the third one 503 "busy".
    for n in 0..3 {
        let ex = c.request("tools/list", json!({})).await.unwrap();
        assert_eq!(
            ex.status,
            http::StatusCode::GATEWAY_TIMEOUT,
            "request {n}: {:?}",
            ex.last
        );
    }
    assert_eq!(mock.stalled(), 3);
}

#[tokio::test]
async fn a_client_leaving_during_a_stalled_initialize_frees_its_session() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(
        &mock.url(),
        "timeout = \"1s\"\n[pool]\nmax_sessions = 1\nacquire_timeout = \"100ms\"\n",
    )
    .await;
    ready(&proxy).await;
    mock.stall_initialize();
    let c = proxy.client(json!({}));
    let leaving = {
        let c = c.clone();
        tokio::spawn(async move { c.request("tools/list", json!({})).await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while mock.stalled() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the initialize never came"
        );
        tokio::task::yield_now().await;
    }
    leaving.abort();
    // The one session slot came free when the client left: the next request gets it (and its own
    // initialize stalls into a 504), instead of waiting for a slot that a handshake nobody wants
    // still holds (503 after acquire_timeout).
    let ex = c.request("tools/list", json!({})).await.unwrap();
    assert_eq!(
        ex.status,
        http::StatusCode::GATEWAY_TIMEOUT,
        "{:?}",
        ex.last
    );
}

#[tokio::test]
async fn readiness_follows_the_upstream_down_and_back_up() {
    let mock = Mock::start().await;
    let addr = mock.addr();
    // (Keys before the first table land in [upstream].)
    let proxy = TestProxy::start(&mock.url(), "health_interval = \"50ms\"\n").await;
    ready(&proxy).await;
    drop(mock);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while proxy.get_status("/readyz").await != http::StatusCode::SERVICE_UNAVAILABLE {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still ready with the upstream gone"
        );
        tokio::task::yield_now().await;
    }
    let _back = Mock::start_at(addr).await;
    ready(&proxy).await;
    let ex = proxy
        .client(json!({}))
        .request("tools/list", json!({}))
        .await
        .unwrap();
    assert_eq!(ex.status, http::StatusCode::OK, "{:?}", ex.last);
}

// Progress the client does not read is dropped (and counted), never waited for: the call's
// actor stays free, so shutdown still cancels the call upstream.
#[tokio::test]
async fn a_client_that_stops_reading_progress_does_not_hold_the_call() {
    let mock = Mock::start().await;
    let big = "x".repeat(16 * 1024);
    let progress = |n: u64| {
        Step::Send(json!({"jsonrpc":"2.0","method":"notifications/progress",
            "params":{"progressToken":"up","progress":n,"message":big}}))
    };
    let mut script: Vec<Step> = (1..=1500).map(progress).collect();
    script.push(Step::Hang);
    mock.script("flood", vec![script]);
    let mut proxy = TestProxy::start(&mock.url(), "[server]\nshutdown_grace = \"100ms\"\n").await;
    let c = proxy.client(json!({}));
    let params = c.params(json!({"name":"flood","arguments":{},"_meta":{"progressToken":"p"}}));
    let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":params});
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<mrtr_proxy::body::Body>();
    let req = http::Request::post(proxy.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "flood")
        .body(mrtr_proxy::body::full(body.to_string()))
        .unwrap();
    // The response's head only: its body is never read.
    let _unread = http.request(req).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !proxy
        .get_text("/metrics")
        .await
        .lines()
        .any(|l| l.starts_with("mrtr_notifications_dropped_total ") && !l.ends_with(" 0"))
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no progress was dropped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.begin_shutdown();
    mock.wait_for("notifications/cancelled", |m| {
        m["method"] == "notifications/cancelled"
    })
    .await;
}
