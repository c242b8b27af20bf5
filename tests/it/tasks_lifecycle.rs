//! A task's changes pushed on a `subscriptions/listen` stream (`notifications.taskIds`), and a
//! task through the shutdown sequence.

use serde_json::{json, Value};

use crate::support::mock::Step;
use crate::support::{first_key, Listener};
use crate::tasks::{on_task, setup, start_task, task_caps, until_status, update, SLOW_ALWAYS};

fn ask_name(id: i64) -> Step {
    Step::Send(json!({
        "jsonrpc": "2.0", "id": id, "method": "elicitation/create",
        "params": {"message": "name?", "requestedSchema": {"type": "object",
            "properties": {"name": {"type": "string"}}}}
    }))
}

/// The next `notifications/tasks` on `listener` whose status is `status` (others skipped).
pub(crate) async fn pushed(listener: &mut Listener, status: &str) -> Value {
    loop {
        let n = listener.next().await;
        if n["method"] == "notifications/tasks" && n["params"]["status"] == status {
            return n;
        }
    }
}

#[tokio::test]
async fn a_listen_stream_following_a_task_gets_each_change_whole() {
    let done = Step::Reply(json!({"content": [{"type": "text", "text": "done"}]}));
    let (_mock, proxy) = setup("slow", vec![ask_name(1), Step::Await(1), done], SLOW_ALWAYS).await;
    let c = proxy.client(task_caps());
    let id = start_task(&c, "slow").await;
    let filter = json!({"taskIds": [id, "someone.elses"]});
    let mut listener = Listener::declaring(&proxy, "l1", filter, None, task_caps()).await;
    let ack = listener.next().await;
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([id]),
        "{ack}"
    );
    let asking = until_status(&c, &id, "input_required").await;
    update(
        &c,
        &id,
        json!({ first_key(&asking): {"action": "accept", "content": {"name": "Ada"}} }),
    )
    .await;
    let n = pushed(&mut listener, "completed").await;
    assert_eq!(n["params"]["taskId"], id.as_str());
    assert_eq!(n["params"]["result"]["content"][0]["text"], "done", "{n}");
    assert_eq!(
        n["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "l1"
    );
}

#[tokio::test]
async fn a_listen_request_without_the_extension_follows_no_task() {
    let (_mock, proxy) = setup("slow", vec![Step::Hang], SLOW_ALWAYS).await;
    let c = proxy.client(task_caps());
    let id = start_task(&c, "slow").await;
    let mut listener = Listener::open(&proxy, "l2", json!({"taskIds": [id]}), None).await;
    let ack = listener.next().await;
    assert!(
        ack["params"]["notifications"].get("taskIds").is_none(),
        "{ack}"
    );
}

#[tokio::test]
async fn shutdown_answers_tasks_while_it_drains_then_cancels_the_running_ones_upstream() {
    let toml = format!("[server]\nshutdown_grace = \"1s\"\n{SLOW_ALWAYS}");
    let (mock, mut proxy) = setup("slow", vec![Step::Hang], &toml).await;
    let c = proxy.client(task_caps());
    let id = start_task(&c, "slow").await;
    proxy.begin_shutdown();
    let during = on_task(&c, "get", &id, json!({})).await;
    assert_eq!(during.result()["status"], "working", "{:?}", during.last);
    proxy.stopped().await;
    mock.wait_for("the task's call cancelled upstream", |m| {
        m["method"] == "notifications/cancelled"
    })
    .await;
}

#[tokio::test]
async fn the_sweeps_go_on_while_the_upstream_is_down() {
    let toml = format!(
        "health_interval = \"50ms\"\n[pool]\nidle_timeout = \"200ms\"\n[tasks]\nttl = \"1s\"\nafter = \"0s\"\n{SLOW_ALWAYS}"
    );
    let (mock, proxy) = setup("slow", vec![Step::Hang], &toml).await;
    let c = proxy.client(task_caps());
    start_task(&c, "slow").await;
    // The upstream stops listening (its call's connection stays): readiness turns off.
    drop(mock);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while proxy.get_status("/readyz").await == http::StatusCode::OK {
        assert!(tokio::time::Instant::now() < deadline, "never unready");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // The task's TTL passes while the upstream is down: the sweep (every 100 ms here) drops it
    // all the same.
    while !proxy
        .get_text("/metrics")
        .await
        .contains("mrtr_task_memory_bytes 0\n")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the task was not swept"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_ne!(proxy.get_status("/readyz").await, http::StatusCode::OK);
}
