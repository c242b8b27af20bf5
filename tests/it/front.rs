//! The modern front door: validation, routing, discover, result rewriting.

use http::StatusCode;
use serde_json::json;

use crate::support::mock::{Mock, Step};
use crate::support::{error_of, TestProxy};

fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

const META: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;

#[tokio::test]
async fn header_mismatch_is_400_with_32020() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(json!({}));
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo",{META}}}}}"#
    );
    for headers in [
        h(&[("mcp-method", "tools/call"), ("mcp-name", "other")]),
        h(&[("mcp-method", "tools/list"), ("mcp-name", "echo")]),
        h(&[("mcp-method", "tools/call")]),
    ] {
        let ex = c.send_raw(body.clone().into(), &headers).await.unwrap();
        assert_eq!(ex.status, StatusCode::BAD_REQUEST);
        assert_eq!(error_of(&ex)["code"], -32020);
        assert_eq!(ex.last["id"], 1);
    }
    assert!(
        mock.posted().iter().all(|m| m["method"] != "tools/call"),
        "nothing reached the upstream"
    );
}

/// POSTs `body` with exactly `headers` (and the content type); the status and the JSON answer.
async fn post_exactly(
    proxy: &TestProxy,
    body: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, serde_json::Value) {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<mrtr_proxy::body::Body>();
    let mut req = http::Request::post(proxy.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(mrtr_proxy::body::full(body.to_owned())).unwrap();
    let resp = http.request(req).await.unwrap();
    let status = resp.status();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let text = String::from_utf8_lossy(&bytes);
    // A JSON answer, or the last message of an SSE one.
    let json = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .next_back()
        .unwrap_or(&text)
        .trim()
        .to_owned();
    (status, serde_json::from_str(&json).unwrap_or_default())
}

// Every row of the mirrored-header table (PROTOCOL.md §2.5), through the proxy: on every method
// that names a target (`Mcp-Name`, the tasks extension's `tasks/*` included) and on one that
// does not, each mirrored header missing, not matching or sent twice is 400 + -32020, and nothing
// reaches the upstream; with the headers right, the same request is not refused for them.
#[tokio::test]
async fn every_mirrored_header_is_required_on_every_method_that_names_it() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let caps = r#"{"extensions":{"io.modelcontextprotocol/tasks":{}}}"#;
    let cases = [
        ("tools/call", Some(("name", "echo"))),
        ("prompts/get", Some(("name", "greet"))),
        ("resources/read", Some(("uri", "file:///a.txt"))),
        ("tasks/get", Some(("taskId", "task-1"))),
        ("tasks/update", Some(("taskId", "task-1"))),
        ("tasks/cancel", Some(("taskId", "task-1"))),
        ("tools/list", None),
    ];
    for (i, (method, target)) in cases.into_iter().enumerate() {
        let member = target.map_or(String::new(), |(f, v)| format!(r#""{f}":"{v}","#));
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{i},"method":"{method}","params":{{{member}"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{caps}}}}}}}"#
        );
        let mut right = vec![
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", method),
        ];
        if let Some((_, v)) = target {
            right.push(("mcp-name", v));
        }
        let (_, answer) = post_exactly(&proxy, &body, &right).await;
        assert_ne!(answer["error"]["code"], -32020, "{method}: {answer}");
        for (header, value) in right.clone() {
            let without: Vec<_> = right
                .iter()
                .filter(|(k, _)| *k != header)
                .copied()
                .collect();
            let mut other = without.clone();
            other.push((header, "something-else"));
            let mut twice = right.clone();
            twice.push((header, value));
            for (case, headers) in [
                ("missing", without),
                ("not matching", other),
                ("twice", twice),
            ] {
                let (status, answer) = post_exactly(&proxy, &body, &headers).await;
                assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {header} {case}");
                assert_eq!(
                    answer["error"]["code"], -32020,
                    "{method} {header} {case}: {answer}"
                );
                assert_eq!(answer["id"], i, "{method} {header} {case}");
            }
        }
    }
    // Only the requests with their headers right reached the upstream, once each.
    let posted = mock.posted();
    for method in ["tools/call", "prompts/get", "resources/read", "tools/list"] {
        let n = posted.iter().filter(|m| m["method"] == method).count();
        assert_eq!(n, 1, "{method}: {posted:?}");
    }
}

#[tokio::test]
async fn unsupported_version_is_400_with_32022_and_supported_list() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(json!({}));
    let body = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2099-01-01","io.modelcontextprotocol/clientCapabilities":{}}}}"#;
    let headers = h(&[
        ("mcp-protocol-version", "2099-01-01"),
        ("mcp-method", "tools/list"),
    ]);
    let ex = c.send_raw(body.into(), &headers).await.unwrap();
    assert_eq!(ex.status, StatusCode::BAD_REQUEST);
    let e = error_of(&ex);
    assert_eq!(e["code"], -32022);
    assert_eq!(e["data"]["requested"], "2099-01-01");
    assert_eq!(e["data"]["supported"], json!(["2026-07-28"]));
}

// The mirrored header is checked before the version is judged (found by a conformance run:
// this was -32022).
#[tokio::test]
async fn a_valid_version_header_over_another_meta_version_is_400_with_32020() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(json!({}));
    let body = r#"{"jsonrpc":"2.0","id":4,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"v999.0.0","io.modelcontextprotocol/clientCapabilities":{}}}}"#;
    let headers = h(&[
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/list"),
    ]);
    let ex = c.send_raw(body.into(), &headers).await.unwrap();
    assert_eq!(ex.status, StatusCode::BAD_REQUEST);
    assert_eq!(error_of(&ex)["code"], -32020);
    assert_eq!(ex.last["id"], 4);
    assert!(
        mock.posted().iter().all(|m| m["method"] != "tools/list"),
        "nothing reached the upstream"
    );
}

#[tokio::test]
async fn missing_meta_is_400_with_32602() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(json!({}));
    let body = r#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
    let ex = c
        .send_raw(body.into(), &h(&[("mcp-method", "tools/list")]))
        .await
        .unwrap();
    assert_eq!(ex.status, StatusCode::BAD_REQUEST);
    assert_eq!(error_of(&ex)["code"], -32602);
}

#[tokio::test]
async fn removed_and_unknown_methods_are_404_with_32601() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(json!({}));
    for m in [
        "ping",
        "logging/setLevel",
        "resources/subscribe",
        "tasks/result",
        "tasks/list",
        "no/such",
    ] {
        let ex = c.request(m, json!({})).await.unwrap();
        assert_eq!(ex.status, StatusCode::NOT_FOUND, "{m}");
        assert_eq!(error_of(&ex)["code"], -32601, "{m}");
    }
}

#[tokio::test]
async fn parse_errors_and_notifications() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(json!({}));
    let ex = c
        .send_raw("{not json".into(), &h(&[("mcp-method", "x")]))
        .await
        .unwrap();
    assert_eq!(ex.status, StatusCode::BAD_REQUEST);
    assert_eq!(error_of(&ex)["code"], -32700);
    let n = format!(r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{{META}}}}}"#);
    let ex = c
        .send_raw(n.into(), &h(&[("mcp-method", "notifications/progress")]))
        .await
        .unwrap();
    assert_eq!(ex.status, StatusCode::ACCEPTED);
}

#[tokio::test]
async fn body_over_the_limit_is_413() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "[server]\nmax_body = \"1KiB\"\n").await;
    let c = proxy.client(json!({}));
    let big = "x".repeat(4096);
    let ex = c
        .request(
            "tools/call",
            json!({"name":"echo","arguments":{"text":big}}),
        )
        .await
        .unwrap();
    assert_eq!(ex.status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn get_and_delete_without_session_are_405_and_bad_origin_403() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, mrtr_proxy::body::Body>(
        hyper_util::client::legacy::connect::HttpConnector::new(),
    );
    for m in [http::Method::GET, http::Method::DELETE] {
        let req = http::Request::builder()
            .method(m)
            .uri(proxy.url())
            .body(mrtr_proxy::body::empty())
            .unwrap();
        assert_eq!(
            http.request(req).await.unwrap().status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
    }
    let mut c = proxy.client(json!({}));
    c.headers
        .push(("origin".into(), "https://evil.example".into()));
    assert_eq!(
        c.request("tools/list", json!({})).await.unwrap().status,
        StatusCode::FORBIDDEN
    );
    c.headers[0].1 = "http://localhost:5173".into();
    assert_eq!(
        c.request("tools/list", json!({})).await.unwrap().status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn browser_clients_from_an_allowed_origin_get_cors_headers() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(
        &mock.url(),
        "[server]\nallowed_origins = [\"https://app.example\"]\n",
    )
    .await;
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, mrtr_proxy::body::Body>(
        hyper_util::client::legacy::connect::HttpConnector::new(),
    );
    let preflight = http::Request::builder()
        .method(http::Method::OPTIONS)
        .uri(proxy.url())
        .header("origin", "https://app.example")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "content-type, mcp-protocol-version, mcp-method, authorization",
        )
        .body(mrtr_proxy::body::empty())
        .unwrap();
    let r = http.request(preflight).await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    assert_eq!(
        r.headers()["access-control-allow-headers"],
        "content-type, mcp-protocol-version, mcp-method, authorization"
    );
    assert!(r.headers()["access-control-allow-methods"]
        .to_str()
        .unwrap()
        .contains("POST"));
    let body = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{{META}}}}}"#);
    let post = http::Request::post(proxy.url())
        .header("origin", "https://app.example")
        .header("content-type", "application/json")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/list")
        .body(mrtr_proxy::body::full(body))
        .unwrap();
    let r = http.request(post).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    assert!(r.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .contains("WWW-Authenticate"));
    let other = http::Request::builder()
        .method(http::Method::OPTIONS)
        .uri(proxy.url())
        .header("origin", "https://evil.example")
        .body(mrtr_proxy::body::empty())
        .unwrap();
    assert_eq!(
        http.request(other).await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
}

#[tokio::test]
async fn discover_comes_from_initialize_and_lists_2026() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "[results]\nttl_ms = 5000\n").await;
    let ex = proxy
        .client(json!({"roots":{}}))
        .request("server/discover", json!({}))
        .await
        .unwrap();
    let r = ex.result();
    assert_eq!(r["resultType"], "complete");
    assert!(r["supportedVersions"]
        .as_array()
        .unwrap()
        .contains(&json!("2026-07-28")));
    assert_eq!(r["capabilities"]["tools"]["listChanged"], true);
    assert_eq!(
        r["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "mock"
    );
    assert_eq!(r["ttlMs"], 5000);
    assert_eq!(r["cacheScope"], "private");
    assert_eq!(
        mock.initialized().last().unwrap()["capabilities"],
        json!({"roots":{}}),
        "initialize declares the request's capabilities"
    );
}

#[tokio::test]
async fn results_are_rewritten_and_legacy_codes_mapped() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(json!({}));
    let tools = c.request("tools/list", json!({})).await.unwrap();
    assert_eq!(tools.result()["resultType"], "complete");
    assert_eq!(tools.result()["cacheScope"], "private");
    assert!(
        tools.result()["tools"][0].get("execution").is_none(),
        "legacy taskSupport dropped"
    );
    let read = c
        .request("resources/read", json!({"uri":"file:///missing"}))
        .await
        .unwrap();
    assert_eq!(error_of(&read)["code"], -32602, "-32002 is retired");
    let call = c
        .request("tools/call", json!({"name":"plain","arguments":{}}))
        .await
        .unwrap();
    assert_eq!(call.result()["resultType"], "complete");
    assert_eq!(call.result()["content"][0]["text"], "ran plain");
}

#[tokio::test]
async fn json_mode_upstreams_work() {
    let mock = Mock::start().await;
    mock.json_mode();
    let proxy = TestProxy::start(&mock.url(), "").await;
    let ex = proxy
        .client(json!({}))
        .request("tools/call", json!({"name":"plain","arguments":{}}))
        .await
        .unwrap();
    assert_eq!(ex.result()["content"][0]["text"], "ran plain");
}

#[tokio::test]
async fn progress_is_relayed_on_sse_and_log_messages_only_when_asked() {
    let mock = Mock::start().await;
    let note = |p: u64| {
        Step::Send(
            json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"tok","progress":p}}),
        )
    };
    let log = |level: &str| {
        Step::Send(
            json!({"jsonrpc":"2.0","method":"notifications/message","params":{"level":level,"data":"x"}}),
        )
    };
    mock.script(
        "slow",
        vec![vec![
            note(1),
            log("debug"),
            log("error"),
            note(2),
            Step::Reply(json!({"content":[]})),
        ]],
    );
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(json!({}));
    let ex = c.request("tools/call", json!({"name":"slow","arguments":{},"_meta":{"progressToken":"tok","io.modelcontextprotocol/logLevel":"warning"}})).await.unwrap();
    assert!(ex.content_type.starts_with("text/event-stream"));
    let methods: Vec<_> = ex
        .notifications
        .iter()
        .map(|n| n["method"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        methods,
        [
            "notifications/progress",
            "notifications/message",
            "notifications/progress"
        ]
    );
    assert_eq!(ex.notifications[1]["params"]["level"], "error");
    let ex = c
        .request("tools/call", json!({"name":"slow","arguments":{}}))
        .await
        .unwrap();
    assert!(
        ex.notifications
            .iter()
            .all(|n| n["method"] != "notifications/message"),
        "no logLevel, no log messages"
    );
}

#[tokio::test]
async fn quiet_upstream_turns_into_sse_with_keepalives() {
    let mock = Mock::start().await;
    mock.script(
        "sleepy",
        vec![vec![Step::Delay(300), Step::Reply(json!({"content":[]}))]],
    );
    let proxy = TestProxy::start(&mock.url(), "[server]\nkeepalive = \"50ms\"\n").await;
    let ex = proxy
        .client(json!({}))
        .request("tools/call", json!({"name":"sleepy","arguments":{}}))
        .await
        .unwrap();
    assert!(ex.content_type.starts_with("text/event-stream"));
    assert!(
        String::from_utf8_lossy(&ex.raw).contains(": keep-alive"),
        "keep-alive comments while quiet"
    );
    assert_eq!(ex.result()["resultType"], "complete");
}

#[tokio::test]
async fn a_modern_request_with_a_stray_session_id_is_served_modern_and_batches_are_refused() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let mut c = proxy.client(json!({}));
    c.headers.push(("mcp-session-id".into(), "stale".into()));
    let ex = c
        .request("tools/call", json!({"name":"plain","arguments":{}}))
        .await
        .unwrap();
    assert_eq!(
        ex.result()["resultType"],
        "complete",
        "the session id is ignored"
    );
    let c = proxy.client(json!({}));
    let ex = c
        .send_raw(
            "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}]".into(),
            &h(&[("mcp-method", "tools/list")]),
        )
        .await
        .unwrap();
    assert_eq!(ex.status, StatusCode::BAD_REQUEST);
    assert_eq!(error_of(&ex)["code"], -32600);
}

#[tokio::test]
async fn ids_of_the_wrong_type_and_non_string_methods_are_400_with_32600() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(json!({}));
    for (id, method) in [
        ("true", r#""tools/list""#),
        (r#"{"a":1}"#, r#""tools/list""#),
        ("[1]", r#""tools/list""#),
        ("1", "5"),
    ] {
        let body =
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":{method},"params":{{{META}}}}}"#);
        let ex = c
            .send_raw(body.into(), &h(&[("mcp-method", "tools/list")]))
            .await
            .unwrap();
        assert_eq!(ex.status, StatusCode::BAD_REQUEST, "{id} {method}");
        assert_eq!(error_of(&ex)["code"], -32600, "{id} {method}");
        assert_eq!(ex.last["id"], json!(null), "an invalid id is never echoed");
    }
    assert!(mock.posted().iter().all(|m| m["method"] != "tools/list"));
}

// The mirrored target is the params' value as JSON reads it: an escaped name matches its plain
// header, and a name that is not a string is a missing one (-32602), not a mismatch.
#[tokio::test]
async fn the_mirrored_name_is_read_as_json_reads_it() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let headers = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "echo"),
    ];
    let escaped = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"ec\u0068o",{META}}}}}"#
    );
    let (status, answer) = post_exactly(&proxy, &escaped, &headers).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(answer.get("result").is_some(), "{answer}");
    assert!(mock
        .posted()
        .iter()
        .any(|m| m["method"] == "tools/call" && m["params"]["name"] == "echo"));
    let number =
        format!(r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":5,{META}}}}}"#);
    let (_, answer) = post_exactly(&proxy, &number, &headers).await;
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    assert_eq!(answer["id"], 2, "{answer}");
}

// A modern request is read in one pass when of the common shape, else in two steps
// (`front::params::envelope`): either way the same answer. Served whatever the order of its
// keys, its whitespace, an escape or an extra member; a key named twice is the envelope's
// -32600 at the top (no id: which one would it be?) and -32602 with the id in the params.
#[tokio::test]
async fn a_request_is_answered_alike_whether_read_in_one_pass_or_two() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(json!({}));
    let headers = h(&[("mcp-method", "tools/call"), ("mcp-name", "plain")]);
    let params = format!(r#"{{ "arguments" : {{}} ,"name":"plain", {META} }}"#);
    for body in [
        format!(r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{params}}}"#),
        format!("\n{{ \"params\" :\t{params} , \"method\" : \"tools/call\",\r\n\"id\":7, \"jsonrpc\":\"2.0\" }} "),
        format!(r#"{{"jsonrpc":"2.0","id":7,"method":"tools\/call","params":{params}}}"#),
        format!(r#"{{"jsonrpc":"2\u002e0","id":7,"method":"tools/call","params":{params}}}"#),
        format!(r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{params},"x":[1]}}"#),
    ] {
        let ex = c.send_raw(body.clone().into(), &headers).await.unwrap();
        assert_eq!(ex.result()["resultType"], "complete", "{body}");
        assert_eq!(ex.last["id"], 7, "{body}");
    }
    let twice_at_top =
        format!(r#"{{"jsonrpc":"2.0","id":7,"id":8,"method":"tools/call","params":{params}}}"#);
    let twice_in_params = format!(
        r#"{{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{{"name":"plain","arguments":{{"p":1,"p":2}},{META}}}}}"#
    );
    for (body, code, id) in [
        (twice_at_top, -32600, json!(null)),
        (twice_in_params, -32602, json!("a")),
    ] {
        let ex = c.send_raw(body.clone().into(), &headers).await.unwrap();
        assert_eq!(ex.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(error_of(&ex)["code"], code, "{body}");
        assert_eq!(ex.last["id"], id, "{body}");
    }
    assert_eq!(
        mock.posted()
            .iter()
            .filter(|m| m["method"] == "tools/call")
            .count(),
        5
    );
}
