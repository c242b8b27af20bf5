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
