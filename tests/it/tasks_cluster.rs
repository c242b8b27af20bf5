//! Who reaches a task: only its principal, only by its id (`Mcp-Name` included), and across
//! replicas: a `tasks/*` request that lands on an instance other than the task's owner is
//! forwarded to the owner (one hop); a task whose owner is out of reach is `task_lost`.

use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::support::mock::{Mock, Step};
use crate::support::{error_of, first_key, TestProxy};
use crate::tasks::{on_task, setup, start_task, task_caps, until_status, update, SLOW_ALWAYS};
use mrtr_proxy::demo::client::{Exchange, ModernClient};

const KEY: &str = "a-shared-cluster-key-0123456789abcdef";

/// Two replicas sharing a key, each with its own upstream whose `slow` asks, then finishes; every
/// `slow` call is a task at once.
async fn pair() -> (Vec<Mock>, Vec<TestProxy>) {
    let listeners = [
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
    ];
    let peers: Vec<String> = listeners
        .iter()
        .map(|l| format!("\"http://{}/mcp\"", l.local_addr().unwrap()))
        .collect();
    let toml = format!(
        "[state]\nsecret = \"{KEY}\"\n[cluster]\npeers = [{}]\nforward_timeout = \"2s\"\n\
         [server]\nshutdown_grace = \"100ms\"\n[tasks.tools]\nslow = \"always\"\n",
        peers.join(", ")
    );
    let mut mocks = Vec::new();
    let mut proxies = Vec::new();
    for l in listeners {
        let mock = Mock::start().await;
        let done = Step::Reply(json!({"content":[{"type":"text","text":"done"}]}));
        mock.script("slow", vec![vec![Step::elicit(7), Step::Await(7), done]]);
        proxies.push(TestProxy::start_on(l, &mock.url(), &toml));
        mocks.push(mock);
    }
    (mocks, proxies)
}

/// A tasks client of `proxy` speaking for principal `auth` (an `Authorization` value).
fn client_of(proxy: &TestProxy, auth: &str) -> ModernClient {
    let mut c = proxy.client(task_caps());
    c.headers.push(("authorization".into(), auth.into()));
    c
}

/// What a client learns from a refusal: the HTTP status and the whole error object.
fn refusal(ex: &Exchange) -> (http::StatusCode, Value) {
    (ex.status, error_of(ex).clone())
}

#[tokio::test]
async fn another_principals_task_looks_exactly_like_an_unknown_one() {
    let (_mock, proxy) = setup("slow", vec![Step::Hang], SLOW_ALWAYS).await;
    let alice = client_of(&proxy, "Bearer alice");
    let mallory = client_of(&proxy, "Bearer mallory");
    let id = start_task(&alice, "slow").await;
    let unknown = format!("{}.AAAAAAAAAAAAAAAAAAAAAA", proxy.app.instance_id());
    for verb in ["get", "update", "cancel"] {
        let theirs = on_task(&mallory, verb, &id, json!({})).await;
        let none = on_task(&mallory, verb, &unknown, json!({})).await;
        assert_eq!(error_of(&theirs)["code"], -32602, "tasks/{verb}");
        assert_eq!(refusal(&theirs), refusal(&none), "tasks/{verb}");
    }
    until_status(&alice, &id, "working").await;
}

#[tokio::test]
async fn a_task_of_an_instance_out_of_reach_is_task_lost_410() {
    let (_mock, proxy) = setup("slow", vec![Step::Hang], "").await;
    let c = proxy.client(task_caps());
    for verb in ["get", "update", "cancel"] {
        let ex = on_task(&c, verb, "some-other-instance.AAAAAAAAAAAAAAAA", json!({})).await;
        assert_eq!(ex.status, http::StatusCode::GONE, "tasks/{verb}");
        let e = error_of(&ex);
        assert_eq!(
            (&e["code"], &e["data"]["reason"]),
            (&json!(-32602), &json!("task_lost"))
        );
        let message = e["message"].as_str().unwrap();
        assert!(
            message.contains("not among the peers"),
            "says why: {message}"
        );
    }
    let metrics = proxy.get_text("/metrics").await;
    assert!(
        metrics
            .contains("mrtr_forwarded_retries_total{kind=\"task\",result=\"unknown_owner\"} 3\n"),
        "counted as tasks: {metrics}"
    );
    let ex = on_task(&c, "get", "no-instance-named", json!({})).await;
    assert_eq!(
        ex.status,
        http::StatusCode::BAD_REQUEST,
        "no owner: merely unknown"
    );
    assert!(
        error_of(&ex)["data"].get("reason").is_none(),
        "{:?}",
        ex.last
    );
}

#[tokio::test]
async fn a_tasks_request_whose_mcp_name_is_not_its_task_id_is_32020() {
    let (_mock, proxy) = setup("slow", vec![Step::Hang], SLOW_ALWAYS).await;
    let c = proxy.client(task_caps());
    let id = start_task(&c, "slow").await;
    let params = c.params(json!({ "taskId": id }));
    let body = json!({"jsonrpc": "2.0", "id": 99, "method": "tasks/get", "params": params});
    let headers = [("mcp-method", "tasks/get"), ("mcp-name", "another-task")]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
    let ex = c.send_raw(body.to_string().into(), &headers).await.unwrap();
    assert_eq!(error_of(&ex)["code"], -32020, "{:?}", ex.last);
    assert_eq!(ex.status, http::StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn tasks_get_and_update_on_another_replica_reach_the_owner() {
    let (mocks, proxies) = pair().await;
    let id = start_task(&proxies[0].client(task_caps()), "slow").await;
    let other = proxies[1].client(task_caps());
    let asking = until_status(&other, &id, "input_required").await;
    assert_eq!(asking["taskId"], id.as_str());
    let key = first_key(&asking);
    update(
        &other,
        &id,
        json!({ key: {"action": "accept", "content": {}} }),
    )
    .await;
    let finished = until_status(&other, &id, "completed").await;
    assert_eq!(finished["result"]["content"][0]["text"], "done");
    assert_eq!(
        mocks[0].answers_to(7).len(),
        1,
        "the owner's upstream got the answer"
    );
    assert_eq!(mocks[1].calls_of("slow"), 0);
}

#[tokio::test]
async fn tasks_cancel_on_another_replica_cancels_at_the_owner() {
    let (mocks, proxies) = pair().await;
    let id = start_task(&proxies[0].client(task_caps()), "slow").await;
    let other = proxies[1].client(task_caps());
    until_status(&other, &id, "input_required").await;
    let ex = on_task(&other, "cancel", &id, json!({})).await;
    assert_eq!(ex.result()["resultType"], "complete", "{:?}", ex.last);
    until_status(&proxies[0].client(task_caps()), &id, "cancelled").await;
    mocks[0]
        .wait_for("notifications/cancelled", |m| {
            m["method"] == "notifications/cancelled"
        })
        .await;
}

#[tokio::test]
async fn a_task_whose_owner_stopped_is_task_lost_on_the_other_replica() {
    let (_mocks, mut proxies) = pair().await;
    let id = start_task(&proxies[0].client(task_caps()), "slow").await;
    let mut owner = proxies.remove(0);
    owner.stopped().await;
    let ex = on_task(&proxies[0].client(task_caps()), "get", &id, json!({})).await;
    assert_eq!(ex.status, http::StatusCode::GONE);
    let e = error_of(&ex);
    assert_eq!(
        (&e["code"], &e["data"]["reason"]),
        (&json!(-32602), &json!("task_lost"))
    );
}

#[tokio::test]
async fn another_principal_on_another_replica_gets_32602() {
    let (_mocks, proxies) = pair().await;
    let alice = client_of(&proxies[0], "Bearer alice");
    let id = start_task(&alice, "slow").await;
    let mallory = client_of(&proxies[1], "Bearer mallory");
    let ex = on_task(&mallory, "get", &id, json!({})).await;
    assert_eq!(error_of(&ex)["code"], -32602, "{:?}", ex.last);
    assert!(
        error_of(&ex)["data"].get("reason").is_none(),
        "not lost: refused"
    );
    until_status(&alice, &id, "input_required").await;
}
