//! Over stdio: the lives of legacy sessions — a child each, DELETE, unknown and other
//! principals' ids, the per-principal bound, a child killed mid-call, idle reaping, shutdown.

use http::StatusCode;
use serde_json::json;

use super::{stdio_proxy, text_of, Legacy, Recorder, Stream};

#[tokio::test]
async fn each_session_runs_on_a_child_of_its_own() {
    let mut rec = Recorder::new();
    let p = stdio_proxy(&rec, "").await;
    let mut a = Legacy::new(&p);
    a.initialize("a").await;
    let mut b = Legacy::new(&p);
    b.initialize("b").await;
    let (pid_a, _) = rec.child_of("a").await;
    let (pid_b, _) = rec.child_of("b").await;
    assert_ne!(pid_a, pid_b);
    assert_eq!(
        text_of(&a.call_answer(json!(1), "pid").await),
        pid_a.to_string()
    );
    assert_eq!(
        text_of(&b.call_answer(json!(1), "pid").await),
        pid_b.to_string()
    );
}

#[tokio::test]
async fn delete_ends_the_session_and_stops_its_child_and_the_id_then_gets_404() {
    let mut rec = Recorder::new();
    let p = stdio_proxy(&rec, "").await;
    let mut c = Legacy::new(&p);
    c.initialize("c").await;
    let (pid, _) = rec.child_of("c").await;
    let mut get = Stream::of(c.get().await);
    assert_eq!(c.delete().await, StatusCode::OK);
    rec.eof_of(pid).await;
    get.ended().await;
    c.assert_unknown().await;
}

#[tokio::test]
async fn an_unknown_session_id_gets_404() {
    let rec = Recorder::new();
    let p = stdio_proxy(&rec, "").await;
    let mut c = Legacy::new(&p);
    c.initialize("c").await;
    c.with_session("AAAAAAAAAAAAAAAAAAAAAA")
        .assert_unknown()
        .await;
    // The 404 tells the client to initialize again; its body is a JSON-RPC error.
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let (_, body) = c.with_session("nope").post(&list).await;
    assert!(body["error"]["code"].is_i64(), "{body}");
    // The real session is untouched.
    let answer = c
        .request(json!(2), "tools/list", json!({}))
        .await
        .last()
        .await;
    assert_eq!(answer["id"], 2, "{answer}");
}

#[tokio::test]
async fn another_principals_session_id_gets_404_and_leaves_the_session_alone() {
    let rec = Recorder::new();
    let p = stdio_proxy(&rec, "").await;
    let mut alice = Legacy::new(&p).speaking_for("Bearer alice");
    alice.initialize("alice").await;
    let sid = alice.sid.clone().unwrap();
    Legacy::new(&p)
        .speaking_for("Bearer bob")
        .with_session(&sid)
        .assert_unknown()
        .await;
    // Nor may a request without any Authorization use it.
    Legacy::new(&p).with_session(&sid).assert_unknown().await;
    let answer = alice.call_answer(json!("still"), "pid").await;
    assert_eq!(answer["id"], "still", "{answer}");
}

#[tokio::test]
async fn a_principal_past_its_bound_gets_503_until_one_of_its_sessions_ends() {
    let rec = Recorder::new();
    let p = stdio_proxy(&rec, "[server]\nmax_legacy_sessions_per_principal = 2\n").await;
    let mut first = Legacy::new(&p).speaking_for("Bearer alice");
    first.initialize("a1").await;
    Legacy::new(&p)
        .speaking_for("Bearer alice")
        .initialize("a2")
        .await;
    let third = Legacy::new(&p).speaking_for("Bearer alice");
    let (status, sid, body) = third.try_initialize(json!(5), "a3").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(sid, None);
    assert_eq!(body["id"], 5, "{body}");
    assert!(body["error"]["code"].is_i64(), "{body}");
    // The bound is per principal.
    Legacy::new(&p)
        .speaking_for("Bearer bob")
        .initialize("b1")
        .await;
    // Ending one of alice's frees a place.
    assert_eq!(first.delete().await, StatusCode::OK);
    let (status, sid, body) = third.try_initialize(json!(6), "a3").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(sid.is_some());
}

#[tokio::test]
async fn by_default_one_principal_holds_a_quarter_of_the_children() {
    // Four children and no bound set: alice's legacy sessions (a child each, held until they
    // idle out) would take all four, and bob's initialize would get 503. Her share is one.
    let rec = Recorder::new();
    let config = "max_processes = 4\n[pool]\nacquire_timeout = \"1s\"\n";
    let p = stdio_proxy(&rec, config).await;
    let alice = Legacy::new(&p).speaking_for("Bearer alice");
    let mut statuses = Vec::new();
    let mut refusals = Vec::new();
    for i in 0..4 {
        let (status, _, body) = alice.try_initialize(json!(i), &format!("a{i}")).await;
        statuses.push(status);
        if status != StatusCode::OK {
            refusals.push(body);
        }
    }
    let bob = Legacy::new(&p).speaking_for("Bearer bob");
    let (status, _, body) = bob.try_initialize(json!("b"), "b").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::SERVICE_UNAVAILABLE
        ]
    );
    for body in refusals {
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("server.max_legacy_sessions_per_principal"),
            "{message}"
        );
    }
}

#[tokio::test]
async fn by_default_the_principal_that_names_no_one_may_use_every_child() {
    // Clients without a principal header are one principal: everyone's. A share of the pool
    // would refuse them with children idle, so unless the file sets the bound it is the pool.
    let rec = Recorder::new();
    let p = stdio_proxy(&rec, "max_processes = 4\n").await;
    for i in 0..4 {
        let (status, _, body) = Legacy::new(&p)
            .try_initialize(json!(i), &format!("c{i}"))
            .await;
        assert_eq!(status, StatusCode::OK, "session {i}: {body}");
    }
    // A bound the file sets holds for it too.
    let rec = Recorder::new();
    let config = "max_processes = 4\n[server]\nmax_legacy_sessions_per_principal = 1\n";
    let p = stdio_proxy(&rec, config).await;
    let (first, _, _) = Legacy::new(&p).try_initialize(json!(1), "c1").await;
    let (second, _, _) = Legacy::new(&p).try_initialize(json!(2), "c2").await;
    assert_eq!(
        (first, second),
        (StatusCode::OK, StatusCode::SERVICE_UNAVAILABLE)
    );
}

#[tokio::test]
async fn a_child_killed_mid_call_ends_the_call_with_an_error_and_the_session_with_404() {
    let mut rec = Recorder::new();
    let p = stdio_proxy(&rec, "").await;
    let mut c = Legacy::new(&p);
    c.initialize("c").await;
    let (pid, _) = rec.child_of("c").await;
    let mut get = Stream::of(c.get().await);
    let failed = c.call_answer(json!("d"), "die").await;
    assert_eq!(failed["id"], "d", "{failed}");
    assert_eq!(failed["error"]["code"], -32603, "{failed}");
    get.ended().await;
    c.assert_unknown().await;
    // The client initializes again and gets a new child.
    let mut again = Legacy::new(&p);
    again.initialize("again").await;
    let pid_again = text_of(&again.call_answer(json!(1), "pid").await).to_owned();
    assert_ne!(pid_again, pid.to_string());
}

#[tokio::test]
async fn an_idle_session_is_reaped_while_one_with_an_open_get_stream_is_kept() {
    let mut rec = Recorder::new();
    // The reaper runs every pool.idle_timeout / 2 (at least every 100 ms).
    let config = "[pool]\nidle_timeout = \"200ms\"\n[server]\nlegacy_session_idle = \"1s\"\n";
    let p = stdio_proxy(&rec, config).await;
    let mut kept = Legacy::new(&p);
    kept.initialize("kept").await;
    let _get = Stream::of(kept.get().await);
    let mut idle = Legacy::new(&p);
    idle.initialize("idle").await;
    let (pid, _) = rec.child_of("idle").await;
    rec.eof_of(pid).await;
    idle.assert_unknown().await;
    // `kept` was idle as long, but its stream is open.
    let answer = kept.call_answer(json!("k"), "pid").await;
    assert_eq!(answer["id"], "k", "{answer}");
}

#[tokio::test]
async fn shutdown_stops_every_legacy_sessions_child_and_ends_its_get_stream() {
    let mut rec = Recorder::new();
    let mut p = stdio_proxy(&rec, "[server]\nshutdown_grace = \"100ms\"\n").await;
    let mut a = Legacy::new(&p);
    a.initialize("a").await;
    let mut get = Stream::of(a.get().await);
    let mut b = Legacy::new(&p);
    b.initialize("b").await;
    let (pid_a, _) = rec.child_of("a").await;
    let (pid_b, _) = rec.child_of("b").await;
    p.stopped().await;
    get.ended().await;
    rec.eof_of(pid_a).await;
    rec.eof_of(pid_b).await;
}

#[tokio::test]
async fn initializes_racing_past_the_bound_are_refused_all_the_same() {
    let rec = Recorder::new();
    let p = stdio_proxy(&rec, "[server]\nmax_legacy_sessions_per_principal = 2\n").await;
    let c = Legacy::new(&p);
    let names: Vec<String> = (0..4).map(|i| format!("c{i}")).collect();
    let tries = futures_util::future::join_all(
        names
            .iter()
            .enumerate()
            .map(|(i, name)| c.try_initialize(json!(i), name)),
    )
    .await;
    let statuses: Vec<StatusCode> = tries.iter().map(|t| t.0).collect();
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    assert_eq!((ok, refused), (2, 2), "{statuses:?}");
}

#[tokio::test]
async fn legacy_sessions_hold_places_of_max_processes_until_they_end() {
    let rec = Recorder::new();
    let config = "max_processes = 1\n[pool]\nacquire_timeout = \"1s\"\n";
    let p = stdio_proxy(&rec, config).await;
    let mut first = Legacy::new(&p);
    first.initialize("first").await;
    let second = Legacy::new(&p);
    let (status, sid, body) = second.try_initialize(json!(1), "second").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!((sid, &body["id"]), (None, &json!(1)), "{body}");
    let modern = p
        .client(crate::support::all_caps())
        .request("tools/call", json!({"name": "pid", "arguments": {}}))
        .await
        .unwrap();
    assert_eq!(
        modern.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{:?}",
        modern.last
    );
    assert_eq!(first.delete().await, StatusCode::OK);
    let (status, _, body) = second.try_initialize(json!(2), "second").await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn delete_mid_call_ends_the_open_request_with_an_error() {
    let mut rec = Recorder::new();
    let p = stdio_proxy(&rec, "").await;
    let mut c = Legacy::new(&p);
    c.initialize("c").await;
    let (pid, _) = rec.child_of("c").await;
    let call = c.call(json!("h"), "hang").await;
    rec.message("the hang call", |m| m["params"]["name"] == "hang")
        .await;
    assert_eq!(c.delete().await, StatusCode::OK);
    let failed = call.last().await;
    assert_eq!(failed["id"], "h", "{failed}");
    assert_eq!(failed["error"]["code"], -32603, "{failed}");
    rec.eof_of(pid).await;
}

#[tokio::test]
async fn a_killed_childs_place_in_max_processes_is_free_for_the_next_initialize() {
    let rec = Recorder::new();
    let config = "max_processes = 1\n[pool]\nacquire_timeout = \"1s\"\n";
    let p = stdio_proxy(&rec, config).await;
    let mut first = Legacy::new(&p);
    first.initialize("first").await;
    let failed = first.call_answer(json!("d"), "die").await;
    assert_eq!(failed["error"]["code"], -32603, "{failed}");
    // The client initializes again without touching its dead session id first.
    let (status, sid, body) = Legacy::new(&p).try_initialize(json!(1), "next").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(sid.is_some());
}

#[tokio::test]
async fn a_request_without_a_session_id_gets_400() {
    let rec = Recorder::new();
    let p = stdio_proxy(&rec, "").await;
    let mut c = Legacy::new(&p);
    c.initialize("c").await;
    // The transport spec: "Servers that require a session ID SHOULD respond to requests without
    // an Mcp-Session-Id header (other than initialization) with HTTP 400 Bad Request"
    // (https://modelcontextprotocol.io/specification/2025-11-25/basic/transports, session
    // management); 404 would tell the client that a session it named has ended.
    c.sid = None;
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let (status, body) = c.post(&list).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

#[tokio::test]
async fn a_request_with_an_invalid_protocol_version_header_gets_400() {
    let rec = Recorder::new();
    let p = stdio_proxy(&rec, "").await;
    let mut c = Legacy::new(&p);
    c.initialize("c").await;
    // "If the server receives a request with an invalid or unsupported MCP-Protocol-Version,
    // it MUST respond with 400 Bad Request" (2025-11-25 transports, protocol version header).
    c.version = "not-a-version".into();
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let (status, body) = c.post(&list).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}
