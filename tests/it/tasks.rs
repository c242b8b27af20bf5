//! Tasks (the tasks extension): long calls answered with a task, polled with `tasks/get`,
//! answered with `tasks/update`, cancelled with `tasks/cancel`.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::mock::{Mock, Step};
use crate::support::{all_caps, TestProxy};
use mrtr_proxy::demo::client::ModernClient;

/// Capabilities declaring every kind of input and the tasks extension.
fn task_caps() -> Value {
    let mut caps = all_caps();
    caps["extensions"] = json!({"io.modelcontextprotocol/tasks": {}});
    caps
}

/// Polls `tasks/get` until the task reaches `status` (bounded: 10 s).
async fn until_status(c: &ModernClient, id: &str, status: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let ex = c.request("tasks/get", json!({"taskId": id})).await.unwrap();
        let r = ex.result().clone();
        if r["status"] == status {
            return r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "task never reached {status}: {r}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_task_asks_is_answered_and_completes() {
    let mock = Mock::start().await;
    mock.script(
        "slow",
        vec![vec![
            Step::elicit(7),
            Step::Await(7),
            Step::Reply(json!({"content":[{"type":"text","text":"done"}]})),
        ]],
    );
    let proxy = TestProxy::start(&mock.url(), "[tasks.tools]\nslow = \"always\"\n").await;
    let c = proxy.client(task_caps());
    let ex = c
        .request("tools/call", json!({"name": "slow", "arguments": {}}))
        .await
        .unwrap();
    let created = ex.result().clone();
    assert_eq!(created["resultType"], "task", "{created}");
    let id = created["taskId"].as_str().unwrap().to_owned();
    let asking = until_status(&c, &id, "input_required").await;
    assert_eq!(asking["resultType"], "complete");
    let key = asking["inputRequests"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    let ex = c
        .request(
            "tasks/update",
            json!({"taskId": id, "inputResponses": {key: {"action": "accept", "content": {}}}}),
        )
        .await
        .unwrap();
    assert_eq!(ex.result()["resultType"], "complete", "{:?}", ex.last);
    let done = until_status(&c, &id, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], "done", "{done}");
}
