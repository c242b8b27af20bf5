//! A stdio upstream, with a scripted child (`tests/fixtures/stdio/scripted_server.py`, standard
//! library Python): rounds, reuse, a child that crashes mid-call, garbage on stdout, pool
//! exhaustion, a command that cannot start, cancellation, and the child's clean environment.
//! The child reports every line it reads on a Unix socket, so nothing here sleeps to wait for it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::UnixListener;
use tokio::sync::mpsc;

use crate::support::{all_caps, error_of, first_key, first_round, retry, Listener, TestProxy};

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/stdio/scripted_server.py"
);

/// What the scripted children read, line by line (from every child, in arrival order).
struct Recorder {
    path: PathBuf,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Recorder {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "mrtr-stdio-{}-{}.sock",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut rd = BufReader::new(conn).lines();
                    while let Ok(Some(l)) = rd.next_line().await {
                        let _ = tx.send(l);
                    }
                });
            }
        });
        Self { path, lines }
    }

    /// Waits (at most 10 s) for a line matching `pred`; returns it and every line before it.
    async fn until(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> Vec<String> {
        let mut seen = Vec::new();
        let found = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(l) = self.lines.recv().await {
                let hit = pred(&l);
                seen.push(l);
                if hit {
                    return true;
                }
            }
            false
        })
        .await;
        assert!(matches!(found, Ok(true)), "no {what}; saw {seen:?}");
        seen
    }
}

fn method_of(line: &str) -> Option<String> {
    serde_json::from_str::<Value>(line).ok()?["method"]
        .as_str()
        .map(str::to_owned)
}

async fn proxy(rec: &Recorder, extra: &str) -> TestProxy {
    let toml = format!(
        "command = [\"python3\", \"{SCRIPT}\"]\nenv = {{ RECORD_SOCK = \"{}\", GREETING = \"hi\" }}\n{extra}",
        rec.path.display()
    );
    TestProxy::start("http://127.0.0.1:9/unused", &toml).await
}

#[tokio::test]
async fn a_round_runs_on_a_child_which_is_then_reused() {
    let mut rec = Recorder::new();
    let p = proxy(&rec, "").await;
    let c = p.client(all_caps());
    for _ in 0..2 {
        let (r, state) = first_round(&c, "ask", json!({})).await;
        let key = first_key(&r);
        let answers = json!({ key: {"action": "accept", "content": {"name": "Ada"}} });
        let done = retry(&c, "ask", json!({}), answers, &state).await;
        assert_eq!(done.result()["content"][0]["text"], "Hello, Ada!");
    }
    let echo = c
        .request(
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "x"}}),
        )
        .await
        .unwrap();
    // upstream.env reached the child; the proxy's own environment did not.
    assert_eq!(echo.result()["content"][0]["text"], "x hi leaked=False");
    let seen = rec.until("the echo call", |l| l.contains("\"echo\"")).await;
    let inits = seen
        .iter()
        .filter(|l| method_of(l).as_deref() == Some("initialize"))
        .count();
    // The readiness probe's child (no capabilities) and one child for every call after it.
    assert!(inits <= 2, "{seen:?}");
}

#[tokio::test]
async fn a_child_that_crashes_mid_call_fails_that_call_clearly_and_is_replaced() {
    let rec = Recorder::new();
    let p = proxy(&rec, "").await;
    let c = p.client(all_caps());
    let crashed = c
        .request("tools/call", json!({"name": "crash", "arguments": {}}))
        .await
        .unwrap();
    let err = error_of(&crashed);
    assert_eq!(err["code"], -32603, "{err}");
    assert!(
        err["message"].as_str().unwrap().contains("upstream"),
        "{err}"
    );
    let echo = c
        .request(
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "again"}}),
        )
        .await
        .unwrap();
    assert_eq!(echo.result()["content"][0]["text"], "again hi leaked=False");
}

#[tokio::test]
async fn lines_on_stdout_that_are_not_json_rpc_are_skipped() {
    let rec = Recorder::new();
    let p = proxy(&rec, "").await;
    let ex = p
        .client(all_caps())
        .request("tools/call", json!({"name": "garbage", "arguments": {}}))
        .await
        .unwrap();
    assert_eq!(ex.result()["content"][0]["text"], "after garbage");
}

#[tokio::test]
async fn with_every_child_busy_a_call_gets_503_and_retry_after() {
    let rec = Recorder::new();
    let p = proxy(
        &rec,
        "max_processes = 1\n[pool]\nacquire_timeout = \"1s\"\n",
    )
    .await;
    let c = p.client(all_caps());
    // The readiness probe's child may still be starting: the first call waits for it (within the
    // acquire timeout), evicts it once idle, and parked keeps the only child.
    let (_r, _state) = first_round(&c, "ask", json!({})).await;
    let busy = c
        .request(
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "x"}}),
        )
        .await
        .unwrap();
    assert_eq!(busy.status, http::StatusCode::SERVICE_UNAVAILABLE);
    assert!(busy.headers.contains_key(http::header::RETRY_AFTER));
}

#[tokio::test]
async fn one_principals_listen_streams_cannot_take_every_child_from_another() {
    // Four children. Each listen stream of other capabilities would pin a child of its own, never
    // reaped nor evicted: alice's four would hold them all, and bob's call would get 503. Her
    // share (unset: a quarter of the children, one) is all her streams may pin.
    let rec = Recorder::new();
    let p = proxy(
        &rec,
        "max_processes = 4\n[pool]\nacquire_timeout = \"1s\"\n",
    )
    .await;
    let filter = json!({"toolsListChanged": true});
    let (mut held, mut refused) = (Vec::new(), Vec::new());
    for i in 0..4 {
        let caps = json!({"experimental": {"n": i}});
        let id = format!("l{i}");
        let alice = Some("Bearer alice");
        match Listener::try_declaring(&p, &id, filter.clone(), alice, caps).await {
            Ok(mut l) => {
                let ack = l.next().await;
                assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
                held.push(l);
            }
            Err(no) => refused.push(no),
        }
    }
    let mut bob = p.client(all_caps());
    bob.headers
        .push(("authorization".into(), "Bearer bob".into()));
    let echo = bob
        .request(
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "bob"}}),
        )
        .await
        .unwrap();
    assert_eq!(echo.status, http::StatusCode::OK, "{:?}", echo.last);
    assert_eq!(echo.result()["content"][0]["text"], "bob hi leaked=False");
    assert_eq!((held.len(), refused.len()), (1, 3), "{refused:?}");
    for (status, body) in &refused {
        assert_eq!(*status, http::StatusCode::SERVICE_UNAVAILABLE, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("pool.max_listen_sessions_per_principal"),
            "{message}"
        );
    }
    assert_eq!(p.app.listen_sessions(), 1);
    // Her streams of the capabilities she has a session for still share it.
    let mut again = Listener::declaring(
        &p,
        "again",
        filter,
        Some("Bearer alice"),
        json!({"experimental": {"n": 0}}),
    )
    .await;
    assert_eq!(
        again.next().await["method"],
        "notifications/subscriptions/acknowledged"
    );
    assert_eq!(p.app.listen_sessions(), 1);
}

#[tokio::test]
async fn a_command_that_cannot_start_is_named_and_then_backed_off() {
    let toml = "command = [\"/nonexistent/mcp-server\", \"--stdio\"]\n[pool]\nacquire_timeout = \"100ms\"\n";
    let p = TestProxy::start("http://127.0.0.1:9/unused", toml).await;
    let c = p.client(all_caps());
    // Whether the readiness probe or the first call tried first, every answer names the command;
    // once one start failed, the next calls get 503 + Retry-After instead of a spawn each.
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let ex = c
            .request("tools/call", json!({"name": "echo", "arguments": {}}))
            .await
            .unwrap();
        let msg = error_of(&ex)["message"].as_str().unwrap().to_owned();
        assert!(msg.contains("/nonexistent/mcp-server"), "{msg}");
        if ex.status == http::StatusCode::SERVICE_UNAVAILABLE {
            assert!(ex.headers.contains_key(http::header::RETRY_AFTER));
        }
        statuses.push(ex.status);
    }
    // (Backoff starts at 250 ms: on a slow machine one call may come after it and start again.)
    assert!(
        statuses[1..].contains(&http::StatusCode::SERVICE_UNAVAILABLE),
        "{statuses:?}"
    );
    assert_eq!(
        p.get_status("/readyz").await,
        http::StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test]
async fn a_call_the_client_abandons_is_cancelled_on_the_child_which_is_then_stopped() {
    let mut rec = Recorder::new();
    let p = proxy(&rec, "").await;
    let c = p.client(all_caps());
    let mut call = Box::pin(c.request("tools/call", json!({"name": "hang", "arguments": {}})));
    tokio::select! {
        r = &mut call => panic!("the hanging call answered: {r:?}"),
        _ = rec.until("the hang call", |l| l.contains("\"hang\"")) => {}
    }
    // The client gives up: dropping the request closes its connection.
    drop(call);
    rec.until("notifications/cancelled", |l| {
        method_of(l).as_deref() == Some("notifications/cancelled")
    })
    .await;
    // Then its stdin is closed: the child reads EOF.
    rec.until("the child's EOF", |l| l == "EOF").await;
}

#[tokio::test]
async fn a_parked_call_that_expires_is_answered_and_cancelled_on_its_child() {
    let mut rec = Recorder::new();
    let p = proxy(&rec, "[state]\nttl = \"300ms\"\n").await;
    let c = p.client(all_caps());
    let (_r, _state) = first_round(&c, "ask", json!({})).await;
    // At the TTL the pending elicitation gets the cancel answer, then the call is cancelled.
    let seen = rec
        .until("notifications/cancelled", |l| {
            method_of(l).as_deref() == Some("notifications/cancelled")
        })
        .await;
    let answered = seen
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|m| m["id"] == 0 && m.get("method").is_none())
        .expect("the elicitation was answered");
    assert_eq!(answered["result"]["action"], "cancel", "{answered}");
    rec.until("the child's EOF", |l| l == "EOF").await;
}

#[tokio::test]
async fn shutdown_cancels_a_parked_call_on_its_child_and_stops_every_child() {
    let mut rec = Recorder::new();
    let mut p = proxy(&rec, "[server]\nshutdown_grace = \"100ms\"\n").await;
    let c = p.client(all_caps());
    let (_r, _state) = first_round(&c, "ask", json!({})).await;
    p.stopped().await;
    let seen = rec
        .until("notifications/cancelled", |l| {
            method_of(l).as_deref() == Some("notifications/cancelled")
        })
        .await;
    assert!(
        seen.iter().any(|l| l.contains("\"action\":\"cancel\"")),
        "{seen:?}"
    );
    // Every child started (the call's, and the readiness probe's when it ran first) read EOF:
    // none is left running. Their reports come on separate connections, in any order.
    let children = seen
        .iter()
        .filter(|l| method_of(l).as_deref() == Some("initialize"))
        .count();
    assert!(children >= 1, "{seen:?}");
    let mut eofs = seen.iter().filter(|l| *l == "EOF").count();
    while eofs < children {
        rec.until("a child's EOF", |l| l == "EOF").await;
        eofs += 1;
    }
}
