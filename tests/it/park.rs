//! Park and resume: inline server requests become input_required rounds and back.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::mock::{Mock, Step};
use crate::support::{all_caps, error_of, first_round, retry, TestProxy};

fn elicit(id: i64, msg: &str) -> Step {
    Step::Send(
        json!({"jsonrpc":"2.0","id":id,"method":"elicitation/create","params":{"mode":"form","message":msg,"requestedSchema":{"type":"object","properties":{"name":{"type":"string"}}},"_meta":{"progressToken":9}}}),
    )
}

fn sample(id: i64) -> Step {
    Step::Send(
        json!({"jsonrpc":"2.0","id":id,"method":"sampling/createMessage","params":{"messages":[],"maxTokens":5}}),
    )
}

fn roots_on_get(id: i64) -> Step {
    Step::SendOnGet(json!({"jsonrpc":"2.0","id":id,"method":"roots/list"}))
}

fn done() -> Step {
    Step::Reply(json!({"content":[{"type":"text","text":"finished"}]}))
}

/// Asserts a 400 -32021 naming `required`.
fn assert_missing_capability(ex: &mrtr_proxy::demo::client::Exchange, required: Value) {
    assert_eq!(ex.status, http::StatusCode::BAD_REQUEST);
    let e = error_of(ex);
    assert_eq!(e["code"], -32021);
    assert_eq!(e["data"]["requiredCapabilities"], required);
    // The message names it too ("needs elicitation.url"): clients show the message, not `data`.
    let (name, inner) = required.as_object().unwrap().iter().next().unwrap();
    let named = match inner.as_object().and_then(|m| m.keys().next()) {
        Some(sub) => format!("needs {name}.{sub};"),
        None => format!("needs {name};"),
    };
    let message = e["message"].as_str().unwrap();
    assert!(
        message.starts_with(&named),
        "{message} does not say {named}"
    );
}

/// The message of elicitation `key` in an `input_required` result.
fn message_of<'a>(r: &'a Value, key: &str) -> &'a Value {
    &r["inputRequests"][key]["params"]["message"]
}

/// Retries `tool` (no arguments) answering elicitation `key` with `accept(name)`.
async fn accept_as(
    c: &mrtr_proxy::demo::client::ModernClient,
    tool: &str,
    key: &str,
    name: &str,
    state: &str,
) -> mrtr_proxy::demo::client::Exchange {
    retry(c, tool, json!({}), json!({ key: accept(name) }), state).await
}

fn accept(name: &str) -> Value {
    json!({"action":"accept","content":{"name":name}})
}

#[tokio::test]
async fn one_round_embeds_the_modern_shape_and_resumes() {
    let mock = Mock::start().await;
    mock.script(
        "ask",
        vec![vec![elicit(7, "Name?"), Step::Await(7), done()]],
    );
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(all_caps());
    let (r, state) = first_round(&c, "ask", json!({})).await;
    let req = &r["inputRequests"]["elicitation-1"];
    assert_eq!(req["method"], "elicitation/create");
    assert!(req.get("jsonrpc").is_none() && req.get("id").is_none());
    assert!(
        req["params"].get("_meta").is_none(),
        "legacy _meta stripped"
    );
    assert_eq!(req["params"]["message"], "Name?");
    assert!(
        r["_meta"]["io.modelcontextprotocol/serverInfo"]["name"].is_string(),
        "interim results name the server too: {r}"
    );
    assert!(
        !state.contains("mock-"),
        "no upstream session id in the token"
    );
    let ex = accept_as(&c, "ask", "elicitation-1", "Ada", &state).await;
    assert_eq!(ex.result()["resultType"], "complete");
    assert_eq!(ex.result()["content"][0]["text"], "finished");
    assert_eq!(ex.last["id"], 2, "the final answer carries the retry's id");
    let answer = &mock.answers_to(7)[0];
    assert_eq!(
        answer["result"],
        accept("Ada"),
        "delivered as the JSON-RPC response to the original id"
    );
    assert_eq!(proxy.app.parked_calls(), 0);
}

#[tokio::test]
async fn requests_on_call_stream_and_get_stream_are_batched_into_one_round() {
    let mock = Mock::start().await;
    mock.script(
        "all",
        vec![vec![
            elicit(1, "n"),
            sample(2),
            roots_on_get(3),
            Step::Await(1),
            Step::Await(2),
            Step::Await(3),
            done(),
        ]],
    );
    // A generous window: this test is about batching, not the default window on a busy CI box.
    let proxy = TestProxy::start(&mock.url(), "[state]\ngather_window = \"250ms\"\n").await;
    let c = proxy.client(all_caps());
    let (r, state) = first_round(&c, "all", json!({})).await;
    let requests = r["inputRequests"].as_object().unwrap();
    assert_eq!(requests.len(), 3, "{requests:?}");
    // Keys are numbered in arrival order, and the call stream and the GET stream race: find each
    // by its kind's prefix rather than by number.
    let key_of = |prefix: &str| {
        requests
            .keys()
            .find(|k| k.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} key in {requests:?}"))
            .clone()
    };
    let (elicitation, sampling, roots) = (
        key_of("elicitation-"),
        key_of("sampling-"),
        key_of("roots-"),
    );
    assert_eq!(requests[&roots], json!({"method":"roots/list"}));
    let answers = json!({
        elicitation: accept("A"),
        sampling: {"role":"assistant","content":{"type":"text","text":"s"},"model":"m"},
        roots: {"roots":[{"uri":"file:///r"}]},
        "unknown-key": {"ignored": true},
    });
    let ex = retry(&c, "all", json!({}), answers, &state).await;
    assert_eq!(ex.result()["content"][0]["text"], "finished");
    assert_eq!(
        mock.answers_to(3)[0]["result"]["roots"][0]["uri"],
        "file:///r"
    );
}

#[tokio::test]
async fn a_json_mode_upstream_asking_on_the_get_stream_parks_too() {
    // A JSON-response-mode upstream sends no headers until the call is done; its input request
    // comes on the GET stream meanwhile. The header timeout must not end the parked call.
    let mock = Mock::start().await;
    mock.json_mode();
    mock.script(
        "ask",
        vec![vec![
            Step::SendOnGet(
                json!({"jsonrpc":"2.0","id":4,"method":"elicitation/create","params":{"message":"Name?","requestedSchema":{"type":"object","properties":{}}}}),
            ),
            Step::Await(4),
            done(),
        ]],
    );
    let proxy = TestProxy::start(&mock.url(), "timeout = \"2s\"\n").await;
    let c = proxy.client(all_caps());
    let (r, state) = first_round(&c, "ask", json!({})).await;
    assert_eq!(
        r["inputRequests"]["elicitation-1"]["params"]["message"],
        "Name?"
    );
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(3)).await;
    tokio::time::resume();
    let ex = accept_as(&c, "ask", "elicitation-1", "Ada", &state).await;
    assert!(
        ex.content_type.starts_with("application/json"),
        "{}",
        ex.content_type
    );
    assert_eq!(ex.result()["content"][0]["text"], "finished");
    assert_eq!(mock.answers_to(4)[0]["result"], accept("Ada"));
}

#[tokio::test]
async fn multi_round_calls_get_a_fresh_state_each_round() {
    let mock = Mock::start().await;
    mock.script(
        "two",
        vec![vec![
            elicit(1, "first"),
            Step::Await(1),
            elicit(2, "second"),
            Step::Await(2),
            done(),
        ]],
    );
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(all_caps());
    let (r1, s1) = first_round(&c, "two", json!({})).await;
    assert_eq!(message_of(&r1, "elicitation-1"), "first");
    let ex = accept_as(&c, "two", "elicitation-1", "a", &s1).await;
    let r2 = ex.result();
    assert_eq!(r2["resultType"], "input_required");
    assert_eq!(message_of(r2, "elicitation-2"), "second");
    let s2 = r2["requestState"].as_str().unwrap();
    assert_ne!(s1, s2);
    let ex = accept_as(&c, "two", "elicitation-2", "b", s2).await;
    assert_eq!(ex.result()["content"][0]["text"], "finished");
}

#[tokio::test]
async fn missing_answers_are_asked_again_with_the_same_key() {
    let mock = Mock::start().await;
    mock.script(
        "pair",
        vec![vec![
            elicit(1, "a"),
            sample(2),
            Step::Await(1),
            Step::Await(2),
            done(),
        ]],
    );
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(all_caps());
    let (_, s1) = first_round(&c, "pair", json!({})).await;
    let ex = accept_as(&c, "pair", "elicitation-1", "a", &s1).await;
    let r = ex.result();
    assert_eq!(r["resultType"], "input_required");
    assert_eq!(
        r["inputRequests"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["sampling-2"]
    );
    let s2 = r["requestState"].as_str().unwrap().to_owned();
    assert_eq!(
        mock.answers_to(1).len(),
        1,
        "the answered key went upstream"
    );
    let ex = retry(&c, "pair", json!({}), json!({"sampling-2": {"role":"assistant","content":{"type":"text","text":"x"},"model":"m"}}), &s2).await;
    assert_eq!(ex.result()["content"][0]["text"], "finished");
}

#[tokio::test]
async fn malformed_input_responses_are_32602_and_the_call_stays_parked() {
    let mock = Mock::start().await;
    mock.script("ask", vec![vec![elicit(1, "n"), Step::Await(1), done()]]);
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(all_caps());
    let (_, state) = first_round(&c, "ask", json!({})).await;
    for bad in [
        Value::Null,
        json!(5),
        json!("x"),
        json!([1]),
        json!({"elicitation-1": "accept"}),
        json!({"elicitation-1": {"action":"maybe"}}),
    ] {
        let ex = retry(&c, "ask", json!({}), bad.clone(), &state).await;
        assert_eq!(error_of(&ex)["code"], -32602, "{bad}");
    }
    assert!(
        mock.answers_to(1).is_empty(),
        "nothing malformed went upstream"
    );
    let ex = accept_as(&c, "ask", "elicitation-1", "ok", &state).await;
    assert_eq!(
        ex.result()["content"][0]["text"],
        "finished",
        "still parked, same token still good"
    );
}

#[tokio::test]
async fn a_request_without_state_is_a_fresh_call_whatever_answers_it_carries() {
    let mock = Mock::start().await;
    mock.script("ask", vec![vec![elicit(1, "n"), Step::Await(1), done()]]);
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(all_caps());
    let (_, _state) = first_round(&c, "ask", json!({})).await;
    let ex = c.request("tools/call", json!({"name":"ask","arguments":{},"inputResponses":{"elicitation-1": accept("sneaky")}})).await.unwrap();
    assert_eq!(
        ex.result()["resultType"],
        "input_required",
        "a new call, asked anew"
    );
    assert_eq!(mock.calls_of("ask"), 2);
    assert!(
        mock.answers_to(1).is_empty(),
        "unbound answers never reach the upstream"
    );
}

#[tokio::test]
async fn other_methods_never_park_and_answer_upstream_themselves() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(all_caps());
    // tools/list on the mock answers directly; make the GET stream ask something unattributed.
    let _ = c.request("tools/list", json!({})).await.unwrap();
    mock.broadcast_on_get(json!({"jsonrpc":"2.0","id":77,"method":"roots/list"}))
        .await;
    let a = mock
        .wait_for("the default roots answer", |m| {
            m["id"] == 77 && m.get("result").is_some()
        })
        .await;
    assert_eq!(a["result"], json!({"roots": []}));
    mock.broadcast_on_get(json!({"jsonrpc":"2.0","id":78,"method":"ping"}))
        .await;
    mock.wait_for("the ping answer", |m| {
        m["id"] == 78 && m.get("result").is_some()
    })
    .await;
    mock.broadcast_on_get(
        json!({"jsonrpc":"2.0","id":79,"method":"sampling/createMessage","params":{}}),
    )
    .await;
    mock.wait_for("a sampling refusal", |m| {
        m["id"] == 79 && m.get("error").is_some()
    })
    .await;
}

#[tokio::test]
async fn undeclared_capability_is_32021_and_cancels_upstream() {
    let mock = Mock::start().await;
    let url_elicit = Step::Send(
        json!({"jsonrpc":"2.0","id":4,"method":"elicitation/create","params":{"mode":"url","message":"go","url":"https://example.com/x","elicitationId":"e"}}),
    );
    mock.script("url", vec![vec![url_elicit, Step::Await(4), done()]]);
    mock.script("tools", vec![vec![Step::Send(json!({"jsonrpc":"2.0","id":5,"method":"sampling/createMessage","params":{"messages":[],"maxTokens":1,"tools":[]}})), Step::Await(5), done()]]);
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(json!({"elicitation": {}, "sampling": {}}));
    let ex = c
        .request("tools/call", json!({"name":"url","arguments":{}}))
        .await
        .unwrap();
    assert_missing_capability(&ex, json!({"elicitation":{"url":{}}}));
    mock.wait_for("notifications/cancelled", |m| {
        m["method"] == "notifications/cancelled"
    })
    .await;
    let ex = c
        .request("tools/call", json!({"name":"tools","arguments":{}}))
        .await
        .unwrap();
    assert_eq!(
        error_of(&ex)["data"]["requiredCapabilities"],
        json!({"sampling":{"tools":{}}})
    );
}

#[tokio::test]
async fn url_elicitation_keeps_the_id_proxy_side() {
    let mock = Mock::start().await;
    let url_elicit = Step::Send(
        json!({"jsonrpc":"2.0","id":4,"method":"elicitation/create","params":{"mode":"url","message":"go","url":"https://example.com/x","elicitationId":"e-1"}}),
    );
    mock.script("url", vec![vec![url_elicit, Step::Await(4), done()]]);
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(all_caps());
    let (r, state) = first_round(&c, "url", json!({})).await;
    assert_eq!(
        r["inputRequests"]["elicitation-1"]["params"],
        json!({"mode":"url","message":"go","url":"https://example.com/x"})
    );
    let ex = retry(
        &c,
        "url",
        json!({}),
        json!({"elicitation-1": {"action":"accept"}}),
        &state,
    )
    .await;
    assert_eq!(ex.result()["resultType"], "complete");
}

#[tokio::test]
async fn legacy_url_elicitation_required_becomes_a_round_and_the_call_is_reissued() {
    let mock = Mock::start().await;
    let err = json!({"code":-32042,"message":"auth needed","data":{"elicitations":[{"mode":"url","message":"Log in","url":"https://example.com/login","elicitationId":"x1"}]}});
    mock.script("needs_login", vec![vec![Step::Error(err)], vec![done()]]);
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(all_caps());
    let (r, state) = first_round(&c, "needs_login", json!({})).await;
    let req = &r["inputRequests"]["elicitation-1"];
    assert_eq!(req["method"], "elicitation/create");
    assert_eq!(req["params"]["url"], "https://example.com/login");
    assert!(req["params"].get("elicitationId").is_none());
    let ex = retry(
        &c,
        "needs_login",
        json!({}),
        json!({"elicitation-1": {"action":"accept"}}),
        &state,
    )
    .await;
    assert_eq!(ex.result()["content"][0]["text"], "finished");
    assert_eq!(mock.calls_of("needs_login"), 2, "re-issued upstream");
}

#[tokio::test]
async fn legacy_url_elicitation_required_without_elicitation_url_is_32021() {
    let mock = Mock::start().await;
    let err = json!({"code":-32042,"message":"auth needed","data":{"elicitations":[{"mode":"url","message":"Log in","url":"https://example.com/login","elicitationId":"x1"}]}});
    mock.script("needs_login", vec![vec![Step::Error(err)]]);
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(json!({"elicitation": {"form": {}}}));
    let ex = c
        .request("tools/call", json!({"name":"needs_login","arguments":{}}))
        .await
        .unwrap();
    assert_missing_capability(&ex, json!({"elicitation": {"url": {}}}));
    assert_eq!(proxy.app.parked_calls(), 0);
}

#[tokio::test]
async fn progress_on_a_retry_uses_the_retry_token() {
    let mock = Mock::start().await;
    let p = Step::Send(
        json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"orig","progress":1}}),
    );
    mock.script("ask", vec![vec![elicit(1, "n"), Step::Await(1), p, done()]]);
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(all_caps());
    let ex = c
        .request(
            "tools/call",
            json!({"name":"ask","arguments":{},"_meta":{"progressToken":"orig"}}),
        )
        .await
        .unwrap();
    let state = ex.result()["requestState"].as_str().unwrap().to_owned();
    let params = json!({"name":"ask","arguments":{},"inputResponses":{"elicitation-1":accept("a")},"requestState":state,"_meta":{"progressToken":"retry"}});
    let ex = c.request("tools/call", params).await.unwrap();
    assert_eq!(ex.notifications[0]["params"]["progressToken"], "retry");
    assert_eq!(ex.result()["resultType"], "complete");
}

#[tokio::test]
async fn prompts_and_resources_park_too() {
    let up = mrtr_proxy::demo::upstream::DemoUpstream::start()
        .await
        .unwrap();
    let proxy = TestProxy::start(
        &up.url(),
        "[results]\nttl_ms = 60000\ncache_scope = \"public\"\n",
    )
    .await;
    let c = proxy.client(all_caps());
    let ex = c
        .request("prompts/get", json!({"name":"greeting"}))
        .await
        .unwrap();
    let key = "elicitation-1";
    assert_eq!(ex.result()["resultType"], "input_required");
    let state = ex.result()["requestState"].as_str().unwrap().to_owned();
    let ex = c
        .request(
            "prompts/get",
            json!({"name":"greeting","inputResponses":{key: accept("Bo")},"requestState":state}),
        )
        .await
        .unwrap();
    assert_eq!(
        ex.result()["messages"][0]["content"]["text"],
        "Please greet Bo."
    );
    let ex = c
        .request("resources/read", json!({"uri":"demo://secret"}))
        .await
        .unwrap();
    let state = ex.result()["requestState"].as_str().unwrap().to_owned();
    let ex = c.request("resources/read", json!({"uri":"demo://secret","inputResponses":{key: accept("Cy")},"requestState":state})).await.unwrap();
    assert_eq!(ex.result()["contents"][0]["text"], "secret for Cy");
    // The result of a retry that carried inputResponses must not be cached.
    assert_eq!(ex.result()["ttlMs"], 0);
    assert_eq!(ex.result()["cacheScope"], "private");
    // A read that needed no input keeps the configured hints.
    let ex = c
        .request("resources/read", json!({"uri":"demo://motd"}))
        .await
        .unwrap();
    assert_eq!(ex.result()["ttlMs"], 60000);
    assert_eq!(ex.result()["cacheScope"], "public");
}

#[tokio::test]
async fn duplicate_upstream_ids_are_asked_once_and_requests_past_the_bound_are_refused_upstream() {
    let mock = Mock::start().await;
    mock.script(
        "flood",
        vec![vec![
            elicit(1, "a"),
            elicit(1, "a again, same id"),
            elicit(2, "b"),
            elicit(3, "c"),
            elicit(4, "one too many"),
            Step::Await(1),
            done(),
        ]],
    );
    let proxy = TestProxy::start(
        &mock.url(),
        "[state]\nmax_input_requests = 3\ngather_window = \"200ms\"\n",
    )
    .await;
    let c = proxy.client(all_caps());
    let (r, state) = first_round(&c, "flood", json!({})).await;
    let keys: Vec<&String> = r["inputRequests"].as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 3, "{r}");
    let refused = mock
        .wait_for("the refusal of request 4", |m| m["id"] == 4)
        .await;
    assert_eq!(refused["error"]["code"], -32603, "{refused}");
    let answers: serde_json::Map<String, Value> =
        keys.iter().map(|k| ((*k).clone(), accept("x"))).collect();
    let ex = retry(&c, "flood", json!({}), Value::Object(answers), &state).await;
    assert_eq!(ex.result()["resultType"], "complete", "{:?}", ex.last);
    assert_eq!(mock.answers_to(1).len(), 1, "one answer for id 1, not two");
}

#[tokio::test]
async fn an_answer_that_breaks_the_requested_schema_is_refused_naming_the_field_and_the_call_stays_parked(
) {
    let mock = Mock::start().await;
    // `elicit` asks for {name: string}; make it required.
    mock.script(
        "strict",
        vec![vec![
            Step::Send(
                json!({"jsonrpc":"2.0","id":1,"method":"elicitation/create","params":{"message":"name?","requestedSchema":{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}}}),
            ),
            Step::Await(1),
            done(),
        ]],
    );
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(all_caps());
    let (_, state) = first_round(&c, "strict", json!({})).await;
    for (content, field) in [
        (json!({"name": 5}), "content.name"),
        (json!({}), "content.name is required"),
    ] {
        let bad = json!({"elicitation-1": {"action": "accept", "content": content}});
        let ex = retry(&c, "strict", json!({}), bad, &state).await;
        assert_eq!(ex.status, http::StatusCode::BAD_REQUEST);
        let e = error_of(&ex);
        assert_eq!(e["code"], -32602);
        let msg = e["message"].as_str().unwrap();
        assert!(
            msg.contains("elicitation-1") && msg.contains(field),
            "{msg}"
        );
    }
    assert!(
        mock.answers_to(1).is_empty(),
        "nothing invalid reached the upstream"
    );
    // The same token still works with a valid answer.
    let ex = accept_as(&c, "strict", "elicitation-1", "Ada", &state).await;
    assert_eq!(ex.result()["resultType"], "complete", "{:?}", ex.last);
    assert_eq!(mock.answers_to(1).len(), 1);
}
