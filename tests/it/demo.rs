//! `mrtr-proxy demo` as a newcomer meets it: its built-in server serves everything it declares
//! (what the MCP Inspector sends first), reports progress under the client's own token, and the
//! command's terminal reads as a walkthrough that ends saying how to point a client at it.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use mrtr_proxy::demo::upstream::DemoUpstream;
use serde_json::{json, Value};

use crate::bridge::{Legacy, Stream};
use crate::support::TestProxy;

const BIN: &str = env!("CARGO_BIN_EXE_mrtr-proxy");

/// What a server that declares a capability must answer (2025-11-25): (capability, method,
/// params as JSON), the methods whose -32601 stops a client that trusted the declaration.
const DECLARED_METHODS: [(&str, &str, &str); 8] = [
    ("tools", "tools/list", "{}"),
    (
        "tools",
        "tools/call",
        r#"{"name": "echo", "arguments": {"text": "x"}}"#,
    ),
    ("prompts", "prompts/list", "{}"),
    ("resources", "resources/list", "{}"),
    ("resources", "resources/templates/list", "{}"),
    ("resources", "resources/read", r#"{"uri": "demo://motd"}"#),
    ("logging", "logging/setLevel", r#"{"level": "debug"}"#),
    ("", "ping", "{}"),
];

/// A legacy client of the demo server, relayed untouched by a proxy in front of it, and the
/// server's `initialize` answer (an SSE stream, as the demo server answers every request).
async fn legacy_session() -> (DemoUpstream, TestProxy, Legacy, Value) {
    let up = DemoUpstream::start().await.unwrap();
    let proxy = TestProxy::start(&up.url(), "").await;
    let params = json!({"protocolVersion": "2025-11-25",
        "capabilities": {"elicitation": {}},
        "clientInfo": {"name": "inspector-like", "version": "1"}});
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params});
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<mrtr_proxy::body::Body>();
    let req = http::Request::post(proxy.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(mrtr_proxy::body::full(init.to_string()))
        .unwrap();
    let resp = http.request(req).await.unwrap();
    let sid = resp.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let answer = Stream::of(resp).last().await;
    let client = Legacy::new(&proxy).with_session(&sid);
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(client.post(&note).await.0, http::StatusCode::ACCEPTED);
    (up, proxy, client, answer)
}

#[tokio::test]
async fn the_demo_server_serves_every_method_its_capabilities_declare() {
    let (_up, _proxy, client, init) = legacy_session().await;
    let declared = init["result"]["capabilities"].as_object().unwrap().clone();
    for cap in ["tools", "prompts", "resources", "logging"] {
        assert!(declared.contains_key(cap), "{cap} is declared: {init}");
    }
    for (id, (cap, method, params)) in DECLARED_METHODS.iter().enumerate() {
        if !cap.is_empty() && !declared.contains_key(*cap) {
            continue;
        }
        let params: Value = serde_json::from_str(params).unwrap();
        let answer = client.request(json!(id), method, params).await.last().await;
        assert!(
            answer.get("result").is_some(),
            "{method} ({cap} declared): {answer}"
        );
    }
    let templates = client
        .request(json!(20), "resources/templates/list", json!({}))
        .await
        .last()
        .await;
    let template = templates["result"]["resourceTemplates"][0]["uriTemplate"]
        .as_str()
        .unwrap();
    let uri = template.replace("{text}", "hello");
    let read = client
        .request(json!(21), "resources/read", json!({"uri": uri}))
        .await
        .last()
        .await;
    assert_eq!(read["result"]["contents"][0]["text"], "hello", "{read}");
    let bad = client
        .request(json!(22), "logging/setLevel", json!({"level": "loud"}))
        .await
        .last()
        .await;
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
}

#[tokio::test]
async fn provision_reports_progress_under_the_client_s_token_or_not_at_all() {
    let (_up, _proxy, client, _) = legacy_session().await;
    let with_token = json!({"name": "provision", "arguments": {"vm": "vm-1"}, "_meta": {"progressToken": "tok-7"}});
    let mut call = client.request(json!(1), "tools/call", with_token).await;
    let (progress, result) = answer_approval(&client, &mut call).await;
    assert_eq!(
        result["result"]["content"][0]["text"],
        "vm-1 is up (approved by Ada)"
    );
    assert_eq!(progress.len(), 2, "{progress:?}");
    for p in &progress {
        assert_eq!(p["params"]["progressToken"], "tok-7", "{p}");
    }
    let without = json!({"name": "provision", "arguments": {"vm": "vm-2"}});
    let mut call = client.request(json!(2), "tools/call", without).await;
    let (progress, result) = answer_approval(&client, &mut call).await;
    assert_eq!(
        result["result"]["content"][0]["text"],
        "vm-2 is up (approved by Ada)"
    );
    assert!(progress.is_empty(), "no token, no progress: {progress:?}");
}

// Reads a `provision` call's stream to its end, answering its approval as Ada; returns the
// progress notifications it carried and the result.
async fn answer_approval(client: &Legacy, call: &mut Stream) -> (Vec<Value>, Value) {
    let mut progress = Vec::new();
    // Bounded: progress, the elicitation, progress, the result.
    for _ in 0..10 {
        let msg = call.next().await;
        match msg["method"].as_str() {
            Some("notifications/progress") => progress.push(msg),
            Some("elicitation/create") => {
                let answer = json!({"jsonrpc": "2.0", "id": msg["id"], "result": {"action": "accept", "content": {"name": "Ada"}}});
                assert_eq!(client.post(&answer).await.0, http::StatusCode::ACCEPTED);
            }
            _ => return (progress, msg),
        }
    }
    panic!("the call never ended");
}

#[test]
fn demo_logs_only_warnings_unless_rust_log_asks_for_more() {
    let quiet = Command::new(BIN)
        .args(["demo", "--once"])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(quiet.status.success(), "{quiet:?}");
    let stderr = String::from_utf8_lossy(&quiet.stderr);
    assert!(
        !stderr.contains("INFO"),
        "the walkthrough is not interleaved with info lines:\n{stderr}"
    );
    let chatty = Command::new(BIN)
        .args(["demo", "--once"])
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    assert!(chatty.status.success(), "{chatty:?}");
    assert!(String::from_utf8_lossy(&chatty.stderr).contains("INFO"));
}

#[tokio::test]
async fn demo_ends_its_walkthrough_saying_how_to_point_a_client_and_the_inspector_at_it() {
    let mut child = Command::new(BIN)
        .args(["demo", "--listen", "127.0.0.1:0"])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let child = crate::smoke::Running(Some(child));
    // The printed text up to its last line (the web UI's era setting), within 20 s.
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut text = String::new();
    while let Ok(line) =
        lines.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
    {
        text.push_str(&line);
        text.push('\n');
        if line.contains("Protocol Era") {
            break;
        }
    }
    let status = crate::smoke::terminate(child.take()).await;
    assert!(status.success(), "{status:?}");
    let front = text
        .lines()
        .find(|l| l.starts_with("mrtr-proxy (2026-07-28 front) at "))
        .and_then(|l| l.split_whitespace().last())
        .expect("the proxy's URL first")
        .to_owned();
    let ending = &text[text
        .find("walkthrough complete")
        .expect("the walkthrough passed")..];
    assert!(ending.contains(&format!("serving on {front}")), "{ending}");
    let inspector =
        format!("npx @modelcontextprotocol/inspector --cli {front} --protocol-era modern");
    assert!(ending.contains(&inspector), "{ending}");
    assert!(
        ending.contains("Settings → Protocol Era → Modern"),
        "{ending}"
    );
    assert!(ending.contains(&front.replace("/mcp", "/sse")), "{ending}");
}
