//! W3C trace context carried upstream: the modern request's `_meta.traceparent` (or its
//! `traceparent` header) reaches the legacy request's `_meta` and headers, and the answers a
//! retry delivers go with the retry's own context.

use serde_json::{json, Value};

use crate::auth::{answers, header_of, script_ask, start};
use crate::support::mock::Mock;
use crate::support::{all_caps, TestProxy};

const FIRST: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const SECOND: &str = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01";

// A tools/call of `ask` whose `_meta` carries `meta` and whose headers carry `headers`.
async fn call(proxy: &TestProxy, params: Value, headers: &[(&str, &str)]) -> Value {
    let mut c = proxy.client(all_caps());
    c.headers.extend(
        headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    let ex = c.request("tools/call", params).await.unwrap();
    ex.result().clone()
}

fn upstream_call(mock: &Mock) -> Value {
    mock.posted()
        .into_iter()
        .find(|m| m["method"] == "tools/call")
        .expect("the call reached the upstream")
}

#[tokio::test]
async fn the_meta_traceparent_reaches_the_upstream_and_a_retry_brings_its_own() {
    let mock = Mock::start().await;
    script_ask(&mock);
    let proxy = start(&mock, "").await;
    let meta = json!({"traceparent": FIRST, "tracestate": "vendor=1"});
    let first = call(
        &proxy,
        json!({"name": "ask", "arguments": {}, "_meta": meta}),
        &[],
    )
    .await;
    assert_eq!(first["resultType"], "input_required", "{first}");
    let up = upstream_call(&mock);
    assert_eq!(up["params"]["_meta"]["traceparent"], FIRST);
    assert_eq!(up["params"]["_meta"]["tracestate"], "vendor=1");
    let sent = header_of(&mock, "traceparent", |m| m["method"] == "tools/call");
    assert_eq!(sent, [Some(FIRST.to_owned())], "on the HTTP request too");
    let retry = json!({"name": "ask", "arguments": {}, "inputResponses": answers(),
        "requestState": first["requestState"], "_meta": {"traceparent": SECOND}});
    let done = call(&proxy, retry, &[]).await;
    assert_eq!(done["resultType"], "complete", "{done}");
    let answer = header_of(&mock, "traceparent", |m| {
        m.get("method").is_none() && m["id"] == 1
    });
    assert_eq!(
        answer,
        [Some(SECOND.to_owned())],
        "the answer carries the retry's context"
    );
}

#[tokio::test]
async fn a_traceparent_header_fills_the_upstream_meta_and_a_malformed_one_is_dropped() {
    let mock = Mock::start().await;
    mock.script(
        "ask",
        vec![vec![crate::support::mock::Step::Reply(json!({"content": []}))]; 2],
    );
    let proxy = start(&mock, "").await;
    let params = json!({"name": "ask", "arguments": {}});
    let headers = [("traceparent", FIRST), ("baggage", "user=ada")];
    let done = call(&proxy, params.clone(), &headers).await;
    assert_eq!(done["resultType"], "complete", "{done}");
    let up = upstream_call(&mock);
    assert_eq!(up["params"]["_meta"]["traceparent"], FIRST);
    assert_eq!(up["params"]["_meta"]["baggage"], "user=ada");
    call(&proxy, params, &[("traceparent", "00-not-hex-01")]).await;
    let calls: Vec<Value> = mock
        .posted()
        .into_iter()
        .filter(|m| m["method"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 2);
    assert!(calls[1]["params"].get("_meta").is_none(), "{}", calls[1]);
}

// What a client may send that the proxy must not send on: each W3C rule broken once.
const BAD_TRACEPARENTS: [(&str, &str); 7] = [
    (
        "invalid version",
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    ),
    (
        "invalid trace id",
        "00-zzzz651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    ),
    (
        "invalid parent id",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b71692033-01",
    ),
    (
        "all-zero trace id",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
    ),
    (
        "all-zero parent id",
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
    ),
    (
        "upper case hex",
        "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",
    ),
    ("garbage", "00-zzzz"),
];

/// The `_meta` and headers the upstream got for the call of tool `tool`.
fn sent(mock: &Mock, tool: &str) -> (Value, http::HeaderMap) {
    mock.posted_with_headers()
        .into_iter()
        .find(|(m, _)| m["method"] == "tools/call" && m["params"]["name"] == tool)
        .map(|(m, h)| (m["params"]["_meta"].clone(), h))
        .unwrap_or_else(|| panic!("{tool} reached the upstream"))
}

fn dropped(text: &str, field: &str, reason: &str) -> f64 {
    let series =
        format!(r#"mrtr_trace_context_dropped_total{{field="{field}",reason="{reason}"}}"#);
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str())?.strip_prefix(' '))
        .map_or(0.0, |v| v.parse().unwrap())
}

#[tokio::test]
async fn an_invalid_traceparent_is_sent_on_from_neither_meta_nor_headers_and_is_counted() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    for (i, (rule, bad)) in BAD_TRACEPARENTS.iter().enumerate() {
        let on_meta = format!("meta-{i}");
        let meta = json!({"traceparent": bad, "tracestate": "vendor=1", "baggage": "user=ada"});
        call(
            &proxy,
            json!({"name": on_meta, "arguments": {}, "_meta": meta}),
            &[],
        )
        .await;
        let on_headers = format!("headers-{i}");
        let headers = [
            ("traceparent", *bad),
            ("tracestate", "vendor=1"),
            ("baggage", "user=ada"),
        ];
        call(
            &proxy,
            json!({"name": on_headers, "arguments": {}}),
            &headers,
        )
        .await;
        for tool in [on_meta, on_headers] {
            let (meta, headers) = sent(&mock, &tool);
            assert!(meta.get("traceparent").is_none(), "{rule} {tool}: {meta}");
            assert!(
                meta.get("tracestate").is_none(),
                "{rule} {tool}: tracestate without its trace"
            );
            assert!(
                headers.get("traceparent").is_none() && headers.get("tracestate").is_none(),
                "{rule} {tool}"
            );
            assert_eq!(
                meta["baggage"], "user=ada",
                "{rule} {tool}: baggage stands alone"
            );
            assert_eq!(headers["baggage"], "user=ada", "{rule} {tool}");
        }
    }
    let text = proxy.get_text("/metrics").await;
    let n = (2 * BAD_TRACEPARENTS.len()) as f64;
    assert_eq!(dropped(&text, "traceparent", "invalid"), n, "{text}");
    assert_eq!(dropped(&text, "tracestate", "invalid"), n);
    assert_eq!(dropped(&text, "baggage", "invalid"), 0.0);
    // A valid one goes on untouched and counts nothing.
    call(
        &proxy,
        json!({"name": "fine", "arguments": {}, "_meta": {"traceparent": FIRST}}),
        &[],
    )
    .await;
    assert_eq!(sent(&mock, "fine").0["traceparent"], FIRST);
    let after = proxy.get_text("/metrics").await;
    assert_eq!(dropped(&after, "traceparent", "invalid"), n);
}

#[tokio::test]
async fn oversized_and_malformed_tracestate_and_baggage_are_bounded_on_both_paths() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    // `_meta`: 64 KiB of either, not a list: nothing of them goes on.
    let huge = "x".repeat(64 * 1024);
    let meta = json!({"traceparent": FIRST, "tracestate": huge, "baggage": huge});
    call(
        &proxy,
        json!({"name": "huge", "arguments": {}, "_meta": meta}),
        &[],
    )
    .await;
    let (meta, headers) = sent(&mock, "huge");
    assert_eq!(meta, json!({"traceparent": FIRST}));
    assert!(headers.get("tracestate").is_none() && headers.get("baggage").is_none());
    assert_eq!(headers["traceparent"], FIRST);
    // Valid lists past the W3C bounds, on `_meta` and in headers: cut to them, whole members.
    let state: Vec<String> = (0..400)
        .map(|i| format!("v{i}={}", "s".repeat(20)))
        .collect();
    let bag: Vec<String> = (0..300).map(|i| format!("k{i}=v{i}")).collect();
    let (state, bag) = (state.join(","), format!("{},bad key=1", bag.join(",")));
    let meta = json!({"traceparent": FIRST, "tracestate": state, "baggage": bag});
    call(
        &proxy,
        json!({"name": "long-meta", "arguments": {}, "_meta": meta}),
        &[],
    )
    .await;
    let headers = [
        ("traceparent", FIRST),
        ("tracestate", state.as_str()),
        ("baggage", bag.as_str()),
    ];
    call(
        &proxy,
        json!({"name": "long-headers", "arguments": {}}),
        &headers,
    )
    .await;
    for tool in ["long-meta", "long-headers"] {
        let (meta, headers) = sent(&mock, tool);
        let ts = meta["tracestate"].as_str().unwrap();
        assert!(
            ts.len() <= 512 && state.starts_with(ts) && ts.ends_with('s'),
            "{tool}: {ts}"
        );
        let b = meta["baggage"].as_str().unwrap();
        assert_eq!(b.split(',').count(), 180, "{tool}");
        assert!(bag.starts_with(b) && !b.contains("bad key"), "{tool}");
        assert_eq!(headers["tracestate"], ts, "{tool}");
        assert_eq!(headers["baggage"], b, "{tool}");
    }
    // Malformed: a tracestate with one bad member goes nowhere; a baggage keeps its good ones.
    let meta = json!({"traceparent": FIRST, "tracestate": "ok=1,Bad=2", "baggage": "ok=1,=2"});
    call(
        &proxy,
        json!({"name": "bad-meta", "arguments": {}, "_meta": meta}),
        &[],
    )
    .await;
    let headers = [
        ("traceparent", FIRST),
        ("tracestate", "ok=1,Bad=2"),
        ("baggage", "ok=1,=2"),
    ];
    call(
        &proxy,
        json!({"name": "bad-headers", "arguments": {}}),
        &headers,
    )
    .await;
    for tool in ["bad-meta", "bad-headers"] {
        let (meta, headers) = sent(&mock, tool);
        assert!(
            meta.get("tracestate").is_none() && headers.get("tracestate").is_none(),
            "{tool}"
        );
        assert_eq!(meta["baggage"], "ok=1", "{tool}");
        assert_eq!(headers["baggage"], "ok=1", "{tool}");
    }
    let text = proxy.get_text("/metrics").await;
    assert_eq!(dropped(&text, "tracestate", "invalid"), 3.0, "{text}");
    assert_eq!(dropped(&text, "tracestate", "oversized"), 2.0);
    assert_eq!(dropped(&text, "baggage", "invalid"), 5.0);
    assert_eq!(dropped(&text, "baggage", "oversized"), 2.0);
    assert_eq!(dropped(&text, "traceparent", "invalid"), 0.0);
}

// A legacy client's request goes on as it came, but for its trace-context headers: its body
// (its `_meta` included) is the client's to send, byte for byte.
#[tokio::test]
async fn a_legacy_clients_trace_context_headers_are_checked_and_its_body_left_alone() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"legacy-traced","version":"1"},
        "_meta":{"traceparent":"00-zzzz","tracestate":"as=it-came"}}});
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<mrtr_proxy::body::Body>();
    let req = http::Request::post(proxy.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .header(
            "traceparent",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
        )
        .header("tracestate", "vendor=1")
        .header("baggage", "user=ada,bad key=1")
        .body(mrtr_proxy::body::full(init.to_string()))
        .unwrap();
    assert_eq!(
        http.request(req).await.unwrap().status(),
        http::StatusCode::OK
    );
    let (body, headers) = mock
        .posted_with_headers()
        .into_iter()
        .find(|(m, _)| m["params"]["clientInfo"]["name"] == "legacy-traced")
        .expect("the initialize was relayed");
    assert_eq!(body, init, "the body as it came");
    assert!(headers.get("traceparent").is_none() && headers.get("tracestate").is_none());
    assert_eq!(headers["baggage"], "user=ada");
    let text = proxy.get_text("/metrics").await;
    assert_eq!(dropped(&text, "traceparent", "invalid"), 1.0, "{text}");
    assert_eq!(dropped(&text, "baggage", "invalid"), 1.0);
}
