//! Legacy clients pass straight through, streaming, with their session.

use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use mrtr_proxy::body::{empty, full, Body};
use serde_json::{json, Value};

use crate::support::mock::Mock;
use crate::support::TestProxy;

type Http =
    hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Body>;

fn http() -> Http {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(hyper_util::client::legacy::connect::HttpConnector::new())
}

async fn post(
    h: &Http,
    url: &str,
    session: Option<&str>,
    msg: Value,
) -> (StatusCode, Option<String>, Vec<u8>) {
    let mut b = Request::post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25");
    if let Some(s) = session {
        b = b.header("mcp-session-id", s);
    }
    let resp = h
        .request(b.body(full(msg.to_string())).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let sid = resp
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, sid, body)
}

// A legacy GET stream of session `sid`, through the proxy at `url`.
async fn get_stream(h: &Http, url: &str, sid: &str) -> http::Response<hyper::body::Incoming> {
    let get = Request::get(url)
        .header("mcp-session-id", sid)
        .header("accept", "text/event-stream")
        .body(empty())
        .unwrap();
    h.request(get).await.unwrap()
}

#[tokio::test]
async fn a_legacy_session_is_relayed_unchanged() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let h = http();
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{}},"clientInfo":{"name":"legacy","version":"1"}}});
    let (status, sid, body) = post(&h, &proxy.url(), None, init.clone()).await;
    assert_eq!(status, StatusCode::OK);
    let sid = sid.expect("the upstream's session id is relayed");
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["result"]["serverInfo"]["name"], "mock");
    assert!(
        mock.posted().contains(&init),
        "initialize forwarded byte-for-byte equivalent"
    );
    let (status, _, _) = post(
        &h,
        &proxy.url(),
        Some(&sid),
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, _, body) = post(&h, &proxy.url(), Some(&sid), json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"plain","arguments":{}}})).await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(body).unwrap();
    assert!(
        text.contains("ran plain") && !text.contains("resultType"),
        "legacy results are not rewritten: {text}"
    );
    // A POSTed answer to a server request and a GET stream are relayed too.
    let (status, _, _) = post(
        &h,
        &proxy.url(),
        Some(&sid),
        json!({"jsonrpc":"2.0","id":3,"result":{"action":"decline"}}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let resp = get_stream(&h, &proxy.url(), &sid).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    drop(resp);
    let del = Request::builder()
        .method(Method::DELETE)
        .uri(proxy.url())
        .header("mcp-session-id", &sid)
        .body(empty())
        .unwrap();
    assert_eq!(h.request(del).await.unwrap().status(), StatusCode::OK);
    mock.wait_deleted(1).await;
    assert!(mock.deleted().contains(&sid));
}

#[tokio::test]
async fn a_legacy_get_stream_streams_each_event_while_it_stays_open() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let h = http();
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"legacy","version":"1"}}});
    let (_, sid, _) = post(&h, &proxy.url(), None, init).await;
    let sid = sid.expect("session id");
    let resp = get_stream(&h, &proxy.url(), &sid).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    // The stream stays open upstream: the event must arrive on its own, not with the end.
    let note = json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"});
    mock.broadcast_on_get(note).await;
    let mut seen = String::new();
    while !seen.contains("list_changed") {
        let frame = tokio::time::timeout(std::time::Duration::from_secs(10), body.frame())
            .await
            .expect("the event is relayed while the stream is open")
            .expect("the stream is still open")
            .unwrap();
        if let Ok(data) = frame.into_data() {
            seen.push_str(std::str::from_utf8(&data).unwrap());
        }
    }
}
