//! Issue 38: the extensions a client declares (`clientCapabilities.extensions`, e.g. MCP Apps'
//! `io.modelcontextprotocol/ui`) reach the legacy server in the `initialize` of the session that
//! serves it — per request and exactly for a modern client (the proxy's own tasks extension
//! left out), as sent for a legacy client — and `server/discover` keeps the upstream's own.

use mrtr_proxy::demo::client::{Exchange, ModernClient};
use mrtr_proxy::demo::transports::start_sse;
use serde_json::{json, Value};

use crate::bridge::{stdio_proxy, Legacy, Recorder};
use crate::support::mock::Mock;
use crate::support::{error_of, TestProxy};

const UI: &str = "io.modelcontextprotocol/ui";
const TASKS: &str = "io.modelcontextprotocol/tasks";

fn ui() -> Value {
    json!({"mimeTypes": ["text/html;profile=mcp-app"]})
}

/// `tools/list` with this raw `clientCapabilities` text (its key order as written).
async fn list_declaring(client: &ModernClient, caps: &str) -> Exchange {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{},"method":"tools/list","params":{{"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{caps}}}}}}}"#,
        client.next_id()
    );
    let headers = [("mcp-method".to_owned(), "tools/list".to_owned())];
    client.send_raw(body.into(), &headers).await.unwrap()
}

#[tokio::test]
async fn declared_extensions_reach_initialize_per_request_without_the_tasks_extension() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let apps = json!({"roots": {}, "extensions": {UI: ui(), TASKS: {}}});
    let plain = json!({"roots": {}});
    let tasks_only = json!({"roots": {}, "extensions": {TASKS: {}}});
    for caps in [&apps, &plain, &tasks_only, &apps] {
        let ex = proxy
            .client(caps.clone())
            .request("tools/list", json!({}))
            .await;
        assert_eq!(ex.unwrap().result()["resultType"], "complete");
    }
    let served = mock.sessions_serving("tools/list");
    let with_ui = json!({"roots": {}, "extensions": {UI: ui()}});
    // The app host's session declared ui (not tasks: the proxy serves that one itself); the
    // others' declared no extension, so they never ran on a session that did.
    assert_eq!(
        served,
        [&with_ui, &plain, &plain, &with_ui].map(Value::clone)
    );
    let inits = mock.initialized();
    assert_eq!(
        inits
            .iter()
            .filter(|p| p["capabilities"] == with_ui)
            .count(),
        1,
        "the declaring client's session is reused"
    );
    assert!(inits
        .iter()
        .all(|p| p["capabilities"]["extensions"].get(TASKS).is_none()));
}

#[tokio::test]
async fn two_key_orders_of_one_declaration_share_one_session() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let client = proxy.client(json!({}));
    let orders = [
        r#"{"roots":{},"extensions":{"b.example/x":{"z":1,"a":{"q":[1],"p":2}},"io.modelcontextprotocol/ui":{"mimeTypes":["text/html;profile=mcp-app"]}}}"#,
        r#"{"extensions":{"io.modelcontextprotocol/ui":{"mimeTypes":["text/html;profile=mcp-app"]},"b.example/x":{"a":{"p":2,"q":[1]},"z":1}},"roots":{}}"#,
    ];
    for caps in orders {
        let ex = list_declaring(&client, caps).await;
        assert_eq!(ex.result()["resultType"], "complete", "{:?}", ex.last);
    }
    let declared = json!({"roots": {}, "extensions": {
        UI: ui(), "b.example/x": {"a": {"p": 2, "q": [1]}, "z": 1}}});
    assert_eq!(
        mock.sessions_serving("tools/list"),
        [&declared, &declared].map(Value::clone)
    );
    let inits = mock.initialized();
    let with_extensions = inits.iter().filter(|p| p["capabilities"] == declared);
    assert_eq!(with_extensions.count(), 1, "one session for both orders");
}

#[tokio::test]
async fn extensions_past_pool_max_extensions_get_a_clear_error() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "[pool]\nmax_extensions = \"256B\"\n").await;
    let big = json!({"extensions": {"x.example/big": {"blob": "x".repeat(300)}}});
    let ex = proxy
        .client(big)
        .request("tools/list", json!({}))
        .await
        .unwrap();
    assert_eq!(ex.status, http::StatusCode::BAD_REQUEST);
    let e = error_of(&ex);
    assert_eq!(e["code"], -32602);
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains("pool.max_extensions (256 bytes)"),
        "{message}"
    );
    assert!(
        message.contains("declare fewer or smaller extensions"),
        "{message}"
    );
    // The proxy's own extension is not passed on, so not measured; small ones pass.
    let own = json!({"extensions": {TASKS: {"blob": "x".repeat(300)}, UI: ui()}});
    let ex = proxy
        .client(own)
        .request("tools/list", json!({}))
        .await
        .unwrap();
    assert_eq!(ex.result()["resultType"], "complete", "{:?}", ex.last);
    let inits = mock.initialized();
    assert!(inits.iter().all(|p| p["capabilities"]["extensions"]
        .get("x.example/big")
        .is_none()));
}

#[tokio::test]
async fn a_new_declaration_per_request_makes_no_session_past_the_bound() {
    let mock = Mock::start().await;
    let toml = "[pool]\nmax_sessions = 3\nmax_extension_sets_per_principal = 2\n";
    let proxy = TestProxy::start(&mock.url(), toml).await;
    let declaring = |n: usize| json!({"roots": {}, "extensions": {"x.example/n": {"n": n}}});
    for n in 0..8 {
        let ex = proxy
            .client(declaring(n))
            .request("tools/list", json!({}))
            .await;
        assert_eq!(ex.unwrap().result()["resultType"], "complete");
        let open = proxy.app.idle_sessions() + proxy.app.leased_sessions();
        assert!(open <= 3, "pool.max_sessions holds: {open} open");
    }
    // Two declarations, then the rest served as declaring none: three sessions for eight.
    let served = mock.sessions_serving("tools/list");
    assert_eq!(served[..2], [declaring(0), declaring(1)]);
    assert!(
        served[2..].iter().all(|c| *c == json!({"roots": {}})),
        "{served:?}"
    );
    let by_requests = mock
        .initialized()
        .iter()
        .filter(|p| p["capabilities"]["roots"].is_object())
        .count();
    assert_eq!(by_requests, 3, "{:?}", mock.initialized());
    // A declaration the principal counts is still served with its extensions.
    let again = proxy
        .client(declaring(1))
        .request("tools/list", json!({}))
        .await;
    assert_eq!(again.unwrap().result()["resultType"], "complete");
    assert_eq!(
        mock.sessions_serving("tools/list").last(),
        Some(&declaring(1))
    );
    let metrics = proxy.get_text("/metrics").await;
    assert!(
        metrics.contains(r#"mrtr_limit_hits_total{limit="extension_sets"} 6"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn discover_keeps_the_upstreams_extensions_beside_the_tasks_extension() {
    let mock = Mock::start().await;
    mock.declare(json!({"tools": {}, "extensions": {UI: {}, TASKS: {"theirs": true}}}));
    let caps = json!({"extensions": {UI: ui()}});
    for (toml, expected) in [
        ("", json!({UI: {}, TASKS: {}})),
        ("[tasks]\nenabled = false\n", json!({UI: {}})),
    ] {
        let proxy = TestProxy::start(&mock.url(), toml).await;
        let ex = proxy
            .client(caps.clone())
            .request("server/discover", json!({}))
            .await;
        let ex = ex.unwrap();
        assert_eq!(
            ex.result()["capabilities"]["extensions"],
            expected,
            "{toml}"
        );
        assert_eq!(ex.result()["capabilities"]["tools"], json!({}));
    }
    let served = mock.initialized().last().unwrap()["capabilities"].clone();
    assert_eq!(
        served,
        json!({"extensions": {UI: ui()}}),
        "discover ran on a declaring session"
    );
}

/// A legacy client's `initialize` params, with extensions, in an unusual key order.
const LEGACY_PARAMS: &str = r#"{"protocolVersion":"2025-11-25","clientInfo":{"name":"apps-host","version":"1"},"capabilities":{"extensions":{"io.modelcontextprotocol/ui":{"mimeTypes":["text/html;profile=mcp-app"]},"io.modelcontextprotocol/tasks":{}},"roots":{}}}"#;

#[tokio::test]
async fn a_legacy_clients_initialize_reaches_a_stdio_child_as_sent() {
    let mut rec = Recorder::new();
    let proxy = stdio_proxy(&rec, "").await;
    let (status, sid, body) = Legacy::new(&proxy).initialize_with(LEGACY_PARAMS).await;
    assert_eq!(status, http::StatusCode::OK, "{body}");
    assert!(sid.is_some());
    let (_, line) = rec
        .until("the host's initialize", |_, l| l.contains("apps-host"))
        .await;
    // Byte for byte: its own extensions (tasks included: the client speaks to the server).
    assert!(line.contains(LEGACY_PARAMS), "{line}");
}

#[tokio::test]
async fn a_legacy_clients_initialize_reaches_an_http_sse_upstream_as_sent() {
    let up = start_sse().await.unwrap();
    let proxy = TestProxy::start(&up.url(), "transport = \"sse\"\n").await;
    let (status, _, body) = Legacy::new(&proxy).initialize_with(LEGACY_PARAMS).await;
    assert_eq!(status, http::StatusCode::OK, "{body}");
    let sent: Value = serde_json::from_str(LEGACY_PARAMS).unwrap();
    let seen = up.observed(|o| o.initialized.clone()).unwrap();
    assert_eq!(seen.last(), Some(&sent));
}

#[tokio::test]
async fn a_legacy_clients_initialize_is_relayed_to_a_streamable_http_upstream_as_sent() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let (status, _, body) = Legacy::new(&proxy).initialize_with(LEGACY_PARAMS).await;
    assert_eq!(status, http::StatusCode::OK, "{body}");
    let sent: Value = serde_json::from_str(LEGACY_PARAMS).unwrap();
    assert!(
        mock.initialized().contains(&sent),
        "{:?}",
        mock.initialized()
    );
}
