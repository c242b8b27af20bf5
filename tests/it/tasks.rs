//! Tasks (the tasks extension): long calls answered with a task, polled with `tasks/get`,
//! answered with `tasks/update`, cancelled with `tasks/cancel`. Who may reach a task (principals,
//! ids, replicas) is in `tasks_cluster`.

use std::time::{Duration, SystemTime};

use serde_json::{json, Map, Value};

use crate::metrics::sample;
use crate::support::mock::{Mock, Step};
use crate::support::{all_caps, error_of, first_key, first_round, retry, TestProxy};
use mrtr_proxy::demo::client::{Exchange, ModernClient};

/// The extension's key in capabilities.
pub(crate) const TASKS: &str = "io.modelcontextprotocol/tasks";
/// Config making tool `slow` a task as soon as it is sent upstream.
pub(crate) const SLOW_ALWAYS: &str = "[tasks.tools]\nslow = \"always\"\n";

/// Capabilities declaring every kind of input and the tasks extension.
pub(crate) fn task_caps() -> Value {
    let mut caps = all_caps();
    caps["extensions"] = json!({ TASKS: {} });
    caps
}

/// Polls `tasks/get` until `pred` holds for the task (bounded: 10 s); returns it.
pub(crate) async fn until(c: &ModernClient, id: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = on_task(c, "get", id, json!({})).await.result().clone();
        if pred(&r) {
            return r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "task never got there: {r}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls `tasks/get` until the task reaches `status` (bounded: 10 s).
pub(crate) async fn until_status(c: &ModernClient, id: &str, status: &str) -> Value {
    until(c, id, |r| r["status"] == status).await
}

/// Polls until the task lists `n` input requests; returns them.
async fn until_asked(c: &ModernClient, id: &str, n: usize) -> Map<String, Value> {
    let r = until(c, id, |r| {
        r["inputRequests"].as_object().is_some_and(|m| m.len() == n)
    })
    .await;
    assert_eq!(r["status"], "input_required", "{r}");
    r["inputRequests"].as_object().unwrap().clone()
}

/// Sends `tasks/<verb>` for task `id`, with `extra` params.
pub(crate) async fn on_task(c: &ModernClient, verb: &str, id: &str, extra: Value) -> Exchange {
    let mut params = json!({ "taskId": id });
    if let (Some(p), Value::Object(extra)) = (params.as_object_mut(), extra) {
        p.extend(extra);
    }
    c.request(&format!("tasks/{verb}"), params).await.unwrap()
}

/// `tasks/update` with `answers`, which must be acknowledged.
pub(crate) async fn update(c: &ModernClient, id: &str, answers: Value) {
    let ex = on_task(c, "update", id, json!({ "inputResponses": answers })).await;
    assert_eq!(ex.result()["resultType"], "complete", "{:?}", ex.last);
}

/// Calls `tool` with no arguments.
async fn call(c: &ModernClient, tool: &str) -> Exchange {
    c.request("tools/call", json!({"name": tool, "arguments": {}}))
        .await
        .unwrap()
}

/// Calls `tool`, which must be answered with a task; returns its id.
pub(crate) async fn start_task(c: &ModernClient, tool: &str) -> String {
    let ex = call(c, tool).await;
    assert_eq!(ex.result()["resultType"], "task", "{:?}", ex.last);
    ex.result()["taskId"].as_str().unwrap().to_owned()
}

/// An `elicitation/create` with id `id` asking `msg`, for a required string `name`.
fn ask(id: i64, msg: &str) -> Step {
    Step::Send(json!({
        "jsonrpc": "2.0", "id": id, "method": "elicitation/create",
        "params": {"message": msg, "requestedSchema": {"type": "object",
            "properties": {"name": {"type": "string"}}, "required": ["name"]}}
    }))
}

fn sample_request(id: i64) -> Step {
    Step::Send(json!({
        "jsonrpc": "2.0", "id": id, "method": "sampling/createMessage",
        "params": {"messages": [], "maxTokens": 5}
    }))
}

fn done() -> Step {
    Step::Reply(json!({"content":[{"type":"text","text":"done"}]}))
}

fn accept(name: &str) -> Value {
    json!({"action": "accept", "content": {"name": name}})
}

/// The key of the listed elicitation that asks `msg`.
fn key_asking(asked: &Map<String, Value>, msg: &str) -> String {
    asked
        .iter()
        .find(|(_, r)| r["params"]["message"] == msg)
        .map(|(k, _)| k.clone())
        .unwrap_or_else(|| panic!("nothing asks {msg}: {asked:?}"))
}

/// The `tools/call` id the upstream got for `tool`.
fn upstream_call_id(mock: &Mock, tool: &str) -> Value {
    mock.posted()
        .into_iter()
        .find(|m| m["method"] == "tools/call" && m["params"]["name"] == tool)
        .map(|m| m["id"].clone())
        .expect("the upstream got the call")
}

/// Waits until the upstream got `notifications/cancelled` for its `tools/call` of `tool`.
async fn cancelled_upstream(mock: &Mock, tool: &str) {
    let id = upstream_call_id(mock, tool);
    mock.wait_for("notifications/cancelled for the call", |m| {
        m["method"] == "notifications/cancelled" && m["params"]["requestId"] == id
    })
    .await;
}

/// A mock whose `tool` runs `script`, behind a proxy configured with `toml`.
pub(crate) async fn setup(tool: &str, script: Vec<Step>, toml: &str) -> (Mock, TestProxy) {
    let mock = Mock::start().await;
    mock.script(tool, vec![script]);
    let proxy = TestProxy::start(&mock.url(), toml).await;
    (mock, proxy)
}

#[tokio::test]
async fn a_task_asks_is_answered_and_completes() {
    let script = vec![Step::elicit(7), Step::Await(7), done()];
    let (_mock, proxy) = setup("slow", script, SLOW_ALWAYS).await;
    let c = proxy.client(task_caps());
    let id = start_task(&c, "slow").await;
    let asking = until_status(&c, &id, "input_required").await;
    assert_eq!(asking["resultType"], "complete");
    let key = first_key(&asking);
    update(&c, &id, json!({ key: {"action": "accept", "content": {}} })).await;
    let finished = until_status(&c, &id, "completed").await;
    assert_eq!(
        finished["result"]["content"][0]["text"], "done",
        "{finished}"
    );
}

#[tokio::test]
async fn discover_advertises_the_extension_when_tasks_are_enabled() {
    let (_mock, proxy) = setup("slow", vec![done()], "").await;
    let ex = proxy
        .client(task_caps())
        .request("server/discover", json!({}))
        .await
        .unwrap();
    assert_eq!(
        ex.result()["capabilities"]["extensions"][TASKS],
        json!({}),
        "{:?}",
        ex.last
    );
}

#[tokio::test]
async fn with_tasks_disabled_nothing_is_advertised_and_tasks_methods_do_not_exist() {
    let toml = format!("[tasks]\nenabled = false\n{SLOW_ALWAYS}");
    let (_mock, proxy) = setup("slow", vec![done()], &toml).await;
    let c = proxy.client(task_caps());
    let ex = c.request("server/discover", json!({})).await.unwrap();
    assert!(ex.result().is_object(), "{:?}", ex.last);
    assert!(
        ex.result()["capabilities"]["extensions"]
            .get(TASKS)
            .is_none(),
        "{:?}",
        ex.last
    );
    assert_eq!(
        call(&c, "slow").await.result()["content"][0]["text"],
        "done"
    );
    let id = format!("{}.abc", proxy.app.instance_id());
    for verb in ["get", "update", "cancel"] {
        let ex = on_task(&c, verb, &id, json!({})).await;
        assert_eq!(error_of(&ex)["code"], -32601, "tasks/{verb}: {:?}", ex.last);
    }
}

#[tokio::test]
async fn a_client_without_the_extension_never_gets_a_task_even_for_an_always_tool() {
    let script = vec![Step::Delay(300), done()];
    let (_mock, proxy) = setup("slow", script, SLOW_ALWAYS).await;
    let ex = call(&proxy.client(all_caps()), "slow").await;
    assert_eq!(ex.result()["resultType"], "complete", "{:?}", ex.last);
    assert_eq!(ex.result()["content"][0]["text"], "done");
}

#[tokio::test]
async fn tasks_methods_without_the_extension_are_32021() {
    let (_mock, proxy) = setup("slow", vec![Step::Hang], SLOW_ALWAYS).await;
    let id = start_task(&proxy.client(task_caps()), "slow").await;
    let bare = proxy.client(all_caps());
    for verb in ["get", "update", "cancel"] {
        let ex = on_task(&bare, verb, &id, json!({})).await;
        let e = error_of(&ex);
        assert_eq!(e["code"], -32021, "tasks/{verb}");
        assert_eq!(
            e["data"]["requiredCapabilities"]["extensions"][TASKS],
            json!({}),
            "tasks/{verb}: {e}"
        );
    }
}

#[tokio::test]
async fn a_quick_call_answers_as_usual_and_a_long_one_becomes_a_task_after_the_delay() {
    let mock = Mock::start().await;
    mock.script("slow", vec![vec![Step::Hang]]);
    let proxy = TestProxy::start(&mock.url(), "[tasks]\nafter = \"200ms\"\n").await;
    let c = proxy.client(task_caps());
    let quick = call(&c, "quick").await;
    assert_eq!(quick.result()["resultType"], "complete", "{:?}", quick.last);
    assert_eq!(quick.result()["content"][0]["text"], "ran quick");
    let began = tokio::time::Instant::now();
    let id = start_task(&c, "slow").await;
    assert!(began.elapsed() >= Duration::from_millis(200), "too early");
    assert_eq!(
        until_status(&c, &id, "working").await["taskId"],
        id.as_str()
    );
}

#[tokio::test]
async fn a_never_tool_stays_an_ordinary_call_however_long_it_runs() {
    let toml = "[tasks]\nafter = \"50ms\"\n[tasks.tools]\nslow = \"never\"\n";
    let (_mock, proxy) = setup("slow", vec![Step::Delay(400), done()], toml).await;
    let ex = call(&proxy.client(task_caps()), "slow").await;
    assert_eq!(ex.result()["resultType"], "complete", "{:?}", ex.last);
    assert_eq!(ex.result()["content"][0]["text"], "done");
}

/// Asserts `v` is an RFC 3339 time within a minute of now; returns it.
fn recent_time(v: &Value) -> SystemTime {
    let t = humantime::parse_rfc3339(v.as_str().expect("a string")).expect("RFC 3339");
    let now = SystemTime::now();
    let gap = now.duration_since(t).unwrap_or_else(|e| e.duration());
    assert!(gap < Duration::from_secs(60), "{v} is not now");
    t
}

#[tokio::test]
async fn the_create_task_result_carries_every_task_field_as_configured() {
    let toml = format!("[tasks]\nttl = \"2m\"\npoll_interval = \"250ms\"\n{SLOW_ALWAYS}");
    let (_mock, proxy) = setup("slow", vec![Step::Hang], &toml).await;
    let c = proxy.client(task_caps());
    let ex = call(&c, "slow").await;
    let t = ex.result();
    assert_eq!(t["resultType"], "task", "{t}");
    assert_eq!(t["status"], "working");
    let id = t["taskId"].as_str().unwrap();
    let random = id
        .strip_prefix(&format!("{}.", proxy.app.instance_id()))
        .expect("the id names its instance");
    assert!(random.len() >= 16, "{id}");
    let created = recent_time(&t["createdAt"]);
    assert!(recent_time(&t["lastUpdatedAt"]) >= created);
    assert_eq!(
        (t["ttlMs"].as_u64(), t["pollIntervalMs"].as_u64()),
        (Some(120_000), Some(250))
    );
    for absent in ["inputRequests", "result", "error"] {
        assert!(t.get(absent).is_none(), "{absent} in {t}");
    }
    assert!(t.get("_meta").is_none_or(Value::is_object), "{t}");
    let got = until_status(&c, id, "working").await;
    assert_eq!(
        (&got["createdAt"], &got["ttlMs"]),
        (&t["createdAt"], &t["ttlMs"])
    );
    assert_eq!(got["resultType"], "complete");
}

/// A task whose upstream asks "first" (id 1) and "second" (id 2) at once, then runs `rest`;
/// returned once both are listed, with their keys.
struct AskingTwo {
    mock: Mock,
    _proxy: TestProxy,
    c: ModernClient,
    id: String,
    /// The requests as the task listed them.
    asked: Map<String, Value>,
    k1: String,
    k2: String,
}

async fn asking_two(rest: Vec<Step>) -> AskingTwo {
    let mut script = vec![ask(1, "first"), ask(2, "second")];
    script.extend(rest);
    let (mock, proxy) = setup("slow", script, SLOW_ALWAYS).await;
    let c = proxy.client(task_caps());
    let id = start_task(&c, "slow").await;
    let asked = until_asked(&c, &id, 2).await;
    let (k1, k2) = (key_asking(&asked, "first"), key_asking(&asked, "second"));
    AskingTwo {
        mock,
        _proxy: proxy,
        c,
        id,
        asked,
        k1,
        k2,
    }
}

#[tokio::test]
async fn a_partial_update_takes_its_key_and_unknown_or_answered_keys_are_ignored() {
    let rest = vec![Step::Await(1), Step::Await(2), done()];
    let AskingTwo {
        mock,
        _proxy,
        c,
        id,
        k1,
        k2,
        ..
    } = asking_two(rest).await;
    assert!(k1.starts_with("elicitation-") && k1 != k2, "{k1} {k2}");
    update(&c, &id, json!({ &k1: accept("Ada") })).await;
    let left = until_asked(&c, &id, 1).await;
    assert!(left.contains_key(&k2), "{left:?}");
    update(&c, &id, json!({"elicitation-99": accept("nobody")})).await;
    assert_eq!(
        until_asked(&c, &id, 1).await,
        left,
        "an unknown key changes nothing"
    );
    update(&c, &id, json!({ &k1: accept("Eve"), &k2: accept("Bob") })).await;
    until_status(&c, &id, "completed").await;
    let first = mock.answers_to(1);
    assert_eq!(first.len(), 1, "answered once: {first:?}");
    assert_eq!(first[0]["result"]["content"]["name"], "Ada");
    assert_eq!(mock.answers_to(2)[0]["result"]["content"]["name"], "Bob");
}

#[tokio::test]
async fn keys_stay_unique_across_the_rounds_of_a_task() {
    let script = vec![
        ask(1, "first"),
        Step::Await(1),
        ask(2, "again"),
        Step::Await(2),
        done(),
    ];
    let (mock, proxy) = setup("slow", script, SLOW_ALWAYS).await;
    let c = proxy.client(task_caps());
    let id = start_task(&c, "slow").await;
    let k1 = key_asking(&until_asked(&c, &id, 1).await, "first");
    update(&c, &id, json!({ &k1: accept("Ada") })).await;
    let second = until(&c, &id, |r| {
        r["inputRequests"].get(&k1).is_none() && r["status"] == "input_required"
    })
    .await;
    let k2 = key_asking(second["inputRequests"].as_object().unwrap(), "again");
    assert_ne!(k1, k2, "a new request gets a new key");
    update(&c, &id, json!({ &k1: accept("Eve"), &k2: accept("Bob") })).await;
    until_status(&c, &id, "completed").await;
    assert_eq!(mock.answers_to(1).len(), 1);
    assert_eq!(mock.answers_to(2)[0]["result"]["content"]["name"], "Bob");
}

#[tokio::test]
async fn an_answer_that_breaks_its_schema_is_32602_and_nothing_is_taken() {
    let rest = vec![Step::Await(1), Step::Await(2), done()];
    let AskingTwo {
        mock,
        _proxy,
        c,
        id,
        k1,
        k2,
        asked,
    } = asking_two(rest).await;
    let bad = json!({"action": "accept", "content": {"name": 5}});
    let ex = on_task(
        &c,
        "update",
        &id,
        json!({"inputResponses": { &k1: accept("Ada"), &k2: bad }}),
    )
    .await;
    assert_eq!(ex.status, http::StatusCode::BAD_REQUEST);
    let e = error_of(&ex);
    assert_eq!(e["code"], -32602);
    let said = format!("inputResponses[\"{k2}\"]: content.name does not match");
    assert!(
        e["message"].as_str().unwrap().contains(&said),
        "the form a retry's answers are refused in: {e}"
    );
    let ex = on_task(&c, "update", &id, json!({"inputResponses": [1]})).await;
    assert_eq!(error_of(&ex)["code"], -32602, "not an object");
    assert_eq!(until_asked(&c, &id, 2).await, asked, "both still asked");
    update(&c, &id, json!({ &k1: accept("Ada"), &k2: accept("Bob") })).await;
    until_status(&c, &id, "completed").await;
    assert_eq!(mock.answers_to(1).len(), 1, "answered once, after the fix");
}

#[tokio::test]
async fn one_task_round_asks_elicitation_and_sampling_together() {
    let script = vec![
        ask(1, "who"),
        sample_request(2),
        Step::Await(1),
        Step::Await(2),
        done(),
    ];
    let (mock, proxy) = setup("slow", script, SLOW_ALWAYS).await;
    let c = proxy.client(task_caps());
    let id = start_task(&c, "slow").await;
    let asked = until_asked(&c, &id, 2).await;
    let k1 = key_asking(&asked, "who");
    let (k2, sampling) = asked.iter().find(|(k, _)| **k != k1).unwrap();
    assert!(k2.starts_with("sampling-"), "{k2}");
    assert_eq!(sampling["method"], "sampling/createMessage");
    assert_eq!(asked[&k1]["method"], "elicitation/create");
    let message = json!({"role":"assistant","content":{"type":"text","text":"hi"},"model":"m"});
    update(&c, &id, json!({ &k1: accept("Ada"), k2: message })).await;
    until_status(&c, &id, "completed").await;
    assert_eq!(mock.answers_to(2)[0]["result"]["model"], "m");
}

#[tokio::test]
async fn mrtr_rounds_come_first_and_the_resumed_call_becomes_a_task_after_the_delay() {
    let script = vec![ask(1, "name?"), Step::Await(1), Step::Hang];
    let (mock, proxy) = setup("slow", script, "[tasks]\nafter = \"200ms\"\n").await;
    let c = proxy.client(task_caps());
    let (round, state) = first_round(&c, "slow", json!({})).await;
    let key = first_key(&round);
    let resumed = tokio::time::Instant::now();
    let ex = retry(&c, "slow", json!({}), json!({ key: accept("Ada") }), &state).await;
    assert_eq!(ex.result()["resultType"], "task", "{:?}", ex.last);
    assert!(
        resumed.elapsed() >= Duration::from_millis(200),
        "the timer restarts"
    );
    assert_eq!(mock.answers_to(1)[0]["result"]["content"]["name"], "Ada");
    let id = ex.result()["taskId"].as_str().unwrap();
    until_status(&c, id, "working").await;
}

#[tokio::test]
async fn a_retry_that_does_not_declare_the_extension_never_gets_a_task() {
    let script = vec![ask(1, "name?"), Step::Await(1), Step::Delay(400), done()];
    let (_mock, proxy) = setup("slow", script, "[tasks]\nafter = \"100ms\"\n").await;
    let (round, state) = first_round(&proxy.client(task_caps()), "slow", json!({})).await;
    let answers = json!({ first_key(&round): accept("Ada") });
    let ex = retry(
        &proxy.client(all_caps()),
        "slow",
        json!({}),
        answers,
        &state,
    )
    .await;
    assert_eq!(ex.result()["resultType"], "complete", "{:?}", ex.last);
    assert_eq!(ex.result()["content"][0]["text"], "done");
}

#[tokio::test]
async fn a_roots_request_on_the_get_stream_is_listed_on_the_task() {
    let roots = Step::SendOnGet(json!({"jsonrpc": "2.0", "id": 5, "method": "roots/list"}));
    let (mock, proxy) = setup("slow", vec![roots, Step::Await(5), done()], SLOW_ALWAYS).await;
    let c = proxy.client(task_caps());
    let id = start_task(&c, "slow").await;
    let asked = until_asked(&c, &id, 1).await;
    let (key, request) = asked.iter().next().unwrap();
    assert_eq!(request["method"], "roots/list", "{key}: {request}");
    update(&c, &id, json!({ key: {"roots": [{"uri": "file:///w"}]} })).await;
    until_status(&c, &id, "completed").await;
    assert_eq!(
        mock.answers_to(5)[0]["result"]["roots"][0]["uri"],
        "file:///w"
    );
}

#[tokio::test]
async fn a_legacy_url_elicitation_required_is_listed_and_the_call_reissued() {
    let mock = Mock::start().await;
    let err = json!({"code": -32042, "message": "auth needed", "data": {"elicitations": [
        {"mode": "url", "message": "Log in", "url": "https://example.com/login", "elicitationId": "x1"}]}});
    mock.script("slow", vec![vec![Step::Error(err)], vec![done()]]);
    let proxy = TestProxy::start(&mock.url(), SLOW_ALWAYS).await;
    let c = proxy.client(task_caps());
    let id = start_task(&c, "slow").await;
    let asked = until_asked(&c, &id, 1).await;
    let (key, request) = asked.iter().next().unwrap();
    assert_eq!(
        request["params"]["url"], "https://example.com/login",
        "{request}"
    );
    update(&c, &id, json!({ key: {"action": "accept"} })).await;
    let finished = until_status(&c, &id, "completed").await;
    assert_eq!(finished["result"]["content"][0]["text"], "done");
    assert_eq!(mock.calls_of("slow"), 2, "re-issued upstream");
}

#[tokio::test]
async fn a_cancelled_task_cancels_upstream_and_cannot_be_cancelled_again() {
    let (mock, proxy) = setup("slow", vec![ask(1, "name?"), Step::Hang], SLOW_ALWAYS).await;
    let c = proxy.client(task_caps());
    let id = start_task(&c, "slow").await;
    until_asked(&c, &id, 1).await;
    let ex = on_task(&c, "cancel", &id, json!({})).await;
    assert_eq!(ex.result()["resultType"], "complete", "{:?}", ex.last);
    let gone = until_status(&c, &id, "cancelled").await;
    assert!(gone.get("inputRequests").is_none(), "{gone}");
    cancelled_upstream(&mock, "slow").await;
    let answer = mock
        .wait_for("the elicitation cancelled", |m| {
            m["id"] == 1 && m.get("method").is_none()
        })
        .await;
    assert_eq!(answer["result"]["action"], "cancel", "{answer}");
    let again = on_task(&c, "cancel", &id, json!({})).await;
    assert_eq!(error_of(&again)["code"], -32602);
}

#[tokio::test]
async fn an_upstream_error_fails_the_task_with_that_error() {
    let boom = Step::Error(json!({"code": -32603, "message": "boom"}));
    let (_mock, proxy) = setup(
        "slow",
        vec![Step::elicit(1), Step::Await(1), boom],
        SLOW_ALWAYS,
    )
    .await;
    let c = proxy.client(task_caps());
    let id = start_task(&c, "slow").await;
    let key = first_key(&until_status(&c, &id, "input_required").await);
    update(&c, &id, json!({ key: {"action": "accept", "content": {}} })).await;
    let failed = until_status(&c, &id, "failed").await;
    assert_eq!(
        (&failed["error"]["code"], &failed["error"]["message"]),
        (&json!(-32603), &json!("boom"))
    );
    assert!(failed.get("result").is_none(), "{failed}");
}

#[tokio::test]
async fn an_upstream_that_drops_the_call_fails_the_task() {
    let script = vec![Step::elicit(1), Step::Await(1), Step::Die];
    let (_mock, proxy) = setup("slow", script, SLOW_ALWAYS).await;
    let c = proxy.client(task_caps());
    let id = start_task(&c, "slow").await;
    let key = first_key(&until_status(&c, &id, "input_required").await);
    update(&c, &id, json!({ key: {"action": "accept", "content": {}} })).await;
    let failed = until_status(&c, &id, "failed").await;
    assert!(failed["error"]["code"].is_i64(), "{failed}");
    assert!(failed["error"]["message"].is_string(), "{failed}");
}

#[tokio::test]
async fn a_task_outlives_the_upstream_idle_timeout() {
    let toml = format!("sse_idle_timeout = \"200ms\"\n{SLOW_ALWAYS}");
    let (_mock, proxy) = setup("slow", vec![Step::Delay(600), done()], &toml).await;
    let ordinary = call(&proxy.client(all_caps()), "slow").await;
    assert_eq!(
        ordinary.status,
        http::StatusCode::GATEWAY_TIMEOUT,
        "{:?}",
        ordinary.last
    );
    let c = proxy.client(task_caps());
    let id = start_task(&c, "slow").await;
    let r = until(&c, &id, |r| r["status"] != "working").await;
    assert_eq!(
        r["status"], "completed",
        "a silent upstream is no failure for a task: {r}"
    );
}

#[tokio::test]
async fn a_json_mode_call_becomes_a_task_while_its_response_is_awaited() {
    let (mock, proxy) = setup(
        "slow",
        vec![Step::Delay(400), done()],
        "[tasks]\nafter = \"100ms\"\n",
    )
    .await;
    mock.json_mode();
    let c = proxy.client(task_caps());
    let id = start_task(&c, "slow").await;
    let finished = until_status(&c, &id, "completed").await;
    assert_eq!(
        finished["result"]["content"][0]["text"], "done",
        "{finished}"
    );
}

#[tokio::test]
async fn upstream_progress_becomes_the_status_message() {
    let progress = Step::Send(json!({"jsonrpc": "2.0", "method": "notifications/progress",
        "params": {"progressToken": 0, "progress": 1, "total": 2, "message": "half way"}}));
    let (_mock, proxy) = setup("slow", vec![progress, Step::Hang], SLOW_ALWAYS).await;
    let c = proxy.client(task_caps());
    let id = start_task(&c, "slow").await;
    let r = until(&c, &id, |r| r.get("statusMessage").is_some()).await;
    assert_eq!(
        (&r["statusMessage"], &r["status"]),
        (&json!("half way"), &json!("working"))
    );
}

#[tokio::test]
async fn a_request_needing_an_undeclared_capability_fails_the_task_with_32021() {
    let (mock, proxy) = setup(
        "slow",
        vec![ask(1, "name?"), Step::Await(1), done()],
        SLOW_ALWAYS,
    )
    .await;
    let c = proxy.client(json!({ "extensions": { TASKS: {} } }));
    let id = start_task(&c, "slow").await;
    let failed = until_status(&c, &id, "failed").await;
    assert_eq!(failed["error"]["code"], -32021, "{failed}");
    assert!(
        failed["error"]["data"]["requiredCapabilities"]["elicitation"].is_object(),
        "{failed}"
    );
    cancelled_upstream(&mock, "slow").await;
}

/// `notifications/cancelled` withdrawing server request `id`.
fn withdraw(id: i64) -> Value {
    json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": id, "reason": "timed out"}})
}

/// The upstream asks two things, then withdraws the first once the second is answered (with
/// `withdrawal`, on the call stream or the GET stream): it is no longer listed, and nothing
/// answers it upstream.
async fn a_withdrawn_request_is_no_longer_listed(withdrawal: Step) {
    let rest = vec![Step::Await(2), withdrawal, Step::Hang];
    let AskingTwo {
        mock,
        _proxy,
        c,
        id,
        k1,
        k2,
        ..
    } = asking_two(rest).await;
    update(&c, &id, json!({ &k2: accept("Bob") })).await;
    let r = until_status(&c, &id, "working").await;
    assert!(r.get("inputRequests").is_none(), "{r}");
    update(&c, &id, json!({ &k1: accept("late") })).await;
    on_task(&c, "cancel", &id, json!({})).await;
    cancelled_upstream(&mock, "slow").await;
    assert!(mock.answers_to(1).is_empty(), "{:?}", mock.answers_to(1));
}

#[tokio::test]
async fn a_request_the_upstream_withdraws_on_the_call_stream_is_no_longer_listed() {
    a_withdrawn_request_is_no_longer_listed(Step::Send(withdraw(1))).await;
}

#[tokio::test]
async fn a_request_the_upstream_withdraws_on_the_get_stream_is_no_longer_listed() {
    a_withdrawn_request_is_no_longer_listed(Step::SendOnGet(withdraw(1))).await;
}

#[tokio::test]
async fn a_task_past_its_ttl_is_cancelled_upstream_and_then_unknown() {
    let toml = format!("[tasks]\nttl = \"1s\"\nafter = \"0s\"\n{SLOW_ALWAYS}");
    let (mock, proxy) = setup("slow", vec![ask(1, "name?"), Step::Hang], &toml).await;
    let c = proxy.client(task_caps());
    let id = start_task(&c, "slow").await;
    until_asked(&c, &id, 1).await;
    cancelled_upstream(&mock, "slow").await;
    let answers = mock.answers_to(1);
    assert_eq!(answers[0]["result"]["action"], "cancel", "{answers:?}");
    let ex = on_task(&c, "get", &id, json!({})).await;
    let e = error_of(&ex);
    assert_eq!(e["code"], -32602, "{e}");
    assert_eq!(e["message"], "unknown or expired taskId");
}

/// With `bound`: `slow` hangs as a task, then a second call of it (by `second`) that runs
/// 500 ms past `after` = 100 ms; returns that second call's `resultType`.
async fn second_call_under(bound: &str, second: Option<&str>) -> Value {
    let mock = Mock::start().await;
    mock.script(
        "slow",
        vec![vec![Step::Hang], vec![Step::Delay(500), done()]],
    );
    let toml = format!("[tasks]\nafter = \"100ms\"\n{bound}\n");
    let proxy = TestProxy::start(&mock.url(), &toml).await;
    start_task(&proxy.client(task_caps()), "slow").await;
    let mut c = proxy.client(task_caps());
    if let Some(auth) = second {
        c.headers.push(("authorization".into(), auth.into()));
    }
    let ex = call(&c, "slow").await;
    ex.result()["resultType"].clone()
}

#[tokio::test]
async fn past_max_per_principal_a_call_stays_an_ordinary_call() {
    assert_eq!(
        second_call_under("max_per_principal = 1", None).await,
        "complete"
    );
    let other = second_call_under("max_per_principal = 1", Some("Bearer bob")).await;
    assert_eq!(
        other, "task",
        "another principal is not bounded by the first"
    );
}

#[tokio::test]
async fn past_max_a_call_stays_an_ordinary_call() {
    assert_eq!(
        second_call_under("max = 1", Some("Bearer bob")).await,
        "complete"
    );
}

#[tokio::test]
async fn past_max_memory_a_call_stays_an_ordinary_call() {
    let toml = "[tasks]\nafter = \"100ms\"\nmax_memory = \"1KiB\"\n";
    let (_mock, proxy) = setup("slow", vec![Step::Delay(500), done()], toml).await;
    let ex = call(&proxy.client(task_caps()), "slow").await;
    assert_eq!(ex.result()["resultType"], "complete", "{:?}", ex.last);
}

#[tokio::test]
async fn metrics_count_tasks_by_status_their_duration_rounds_memory_and_outcome() {
    let script = vec![Step::elicit(7), Step::Await(7), done()];
    let (_mock, proxy) = setup("slow", script, SLOW_ALWAYS).await;
    let c = proxy.client(task_caps());
    let id = start_task(&c, "slow").await;
    let key = first_key(&until_status(&c, &id, "input_required").await);
    let running = sample(&proxy.get_text("/metrics").await, "mrtr_task_memory_bytes");
    assert!(
        running >= 80.0 * 1024.0,
        "a running task is charged what its call holds: {running}"
    );
    update(&c, &id, json!({ key: {"action": "accept", "content": {}} })).await;
    until_status(&c, &id, "completed").await;
    let text = proxy.get_text("/metrics").await;
    assert_eq!(sample(&text, r#"mrtr_tasks{status="completed"}"#), 1.0);
    assert_eq!(sample(&text, r#"mrtr_tasks{status="working"}"#), 0.0);
    assert_eq!(sample(&text, "mrtr_task_duration_seconds_count"), 1.0);
    assert_eq!(sample(&text, "mrtr_task_input_rounds_count"), 1.0);
    assert_eq!(sample(&text, "mrtr_task_input_rounds_sum"), 1.0);
    let held = sample(&text, "mrtr_task_memory_bytes");
    assert!(
        held >= 16.0 * 1024.0 && held < running - 60.0 * 1024.0,
        "a finished task is held, without its call's share: {held} (running: {running})"
    );
    let modern = r#"mrtr_requests_total{era="modern""#;
    assert_eq!(
        sample(
            &text,
            &format!(r#"{modern},method="tools/call",outcome="task"}}"#)
        ),
        1.0
    );
    for method in ["tasks/get", "tasks/update"] {
        let series = format!(r#"{modern},method="{method}",outcome="complete"}}"#);
        assert!(sample(&text, &series) >= 1.0, "{series}");
    }
}

/// Answers each of `keys` of task `id` in its own `tasks/update`, all at once; returns the keys
/// whose update was refused.
async fn answer_all_at_once(c: &ModernClient, id: &str, keys: Vec<String>) -> Vec<String> {
    let updates = keys.into_iter().map(|k| async move {
        let answers = json!({ &k: accept("x") });
        let ex = on_task(c, "update", id, json!({ "inputResponses": answers })).await;
        ex.last.get("error").is_some().then_some(k)
    });
    let refused = futures_util::future::join_all(updates).await;
    refused.into_iter().flatten().collect()
}

#[tokio::test]
async fn an_answer_refused_while_the_task_is_busy_is_not_lost() {
    let n = 30;
    let mut script: Vec<Step> = (1..=n).map(|i| ask(i, &format!("q{i}"))).collect();
    script.extend((1..=n).map(Step::Await));
    script.push(done());
    let (_mock, proxy) = setup("slow", script, SLOW_ALWAYS).await;
    let c = proxy.client(task_caps());
    let id = start_task(&c, "slow").await;
    let keys = until_asked(&c, &id, usize::try_from(n).unwrap())
        .await
        .keys()
        .cloned()
        .collect();
    let refused = answer_all_at_once(&c, &id, keys).await;
    let now = on_task(&c, "get", &id, json!({})).await.result().clone();
    for k in &refused {
        assert!(
            now["inputRequests"].get(k).is_some(),
            "{k} was refused, yet no longer asked: its answer is lost ({now})"
        );
    }
    for k in refused {
        update(&c, &id, json!({ k: accept("again") })).await;
    }
    until_status(&c, &id, "completed").await;
}
