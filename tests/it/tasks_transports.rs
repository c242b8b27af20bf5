//! Tasks in a shared store whatever the upstream's transport: a task whose holder is lost is
//! adopted and run again in front of a stdio child and an HTTP+SSE server as in front of
//! Streamable HTTP (`tasks_store.rs`).

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::redis_server::RedisServer;
use crate::support::{first_key, TestProxy};
use crate::tasks::{on_task, task_caps, until_status};

const KEY: &str = "a-shared-cluster-key-0123456789abcdef";

fn ada() -> Value {
    json!({"action": "accept", "content": {"name": "Ada"}})
}

/// Two replicas on `store` in front of the demo's built-in server over `transport` ("stdio": a
/// child of each replica; "sse": one HTTP+SSE server each), `provision` a replay-safe task.
async fn demo_replicas(
    store: &RedisServer,
    transport: &str,
) -> (
    Vec<mrtr_proxy::demo::upstream::DemoUpstream>,
    Vec<TestProxy>,
) {
    let mut upstreams = Vec::new();
    let mut proxies = Vec::new();
    for _ in 0..2 {
        let (url, upstream) = if transport == "stdio" {
            let bin = env!("CARGO_BIN_EXE_mrtr-proxy");
            (
                "http://127.0.0.1:9/unused".to_owned(),
                format!("command = [\"{bin}\", \"demo-upstream\"]\n"),
            )
        } else {
            let up = mrtr_proxy::demo::transports::start_sse().await.unwrap();
            let url = up.url();
            upstreams.push(up);
            (url, "transport = \"sse\"\n".to_owned())
        };
        let toml = format!(
            "{upstream}[state]\nsecret = \"{KEY}\"\n[server]\nshutdown_grace = \"100ms\"\n\
             [tasks]\nstore = \"{}\"\nstore_timeout = \"100ms\"\nlease = \"300ms\"\n\
             [tasks.tools]\nprovision = \"always\"\n[replay.tools]\nprovision = \"always\"\n",
            store.url()
        );
        proxies.push(TestProxy::start(&url, &toml).await);
    }
    (upstreams, proxies)
}

#[tokio::test]
async fn a_task_whose_holder_is_lost_is_adopted_in_front_of_stdio_and_http_sse_upstreams() {
    for transport in ["stdio", "sse"] {
        let store = RedisServer::start().await;
        let (_upstreams, replicas) = demo_replicas(&store, transport).await;
        let on_a = replicas[0].client(task_caps());
        let ex = on_a
            .request(
                "tools/call",
                json!({"name": "provision", "arguments": {"vm": "vm-7"}}),
            )
            .await
            .unwrap();
        assert_eq!(
            ex.result()["resultType"],
            "task",
            "{transport}: {:?}",
            ex.last
        );
        let id = ex.result()["taskId"].as_str().unwrap().to_owned();
        let key = first_key(&until_status(&on_a, &id, "input_required").await);
        // A is cut off: an instance no one reaches takes its lease for a moment, A stops its
        // copy, and the person's answer lands on B once the lease lapsed: B adopts the task,
        // runs provision again on its own upstream and answers its question from the journal.
        let mut conn = store.connection().await.unwrap();
        redis::cmd("SET")
            .arg(format!("mrtr:lease:{id}"))
            .arg("ghost")
            .arg("PX")
            .arg(400)
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
        let on_b = replicas[1].client(task_caps());
        let answer = json!({"inputResponses": { key: ada() }});
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let ex = on_task(&on_b, "update", &id, answer.clone()).await;
            if ex.status == 200 {
                break;
            }
            assert_eq!(ex.status, 503, "{transport}: {:?}", ex.last);
            assert!(
                tokio::time::Instant::now() < deadline,
                "{transport}: never adopted"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let done = until_status(&on_b, &id, "completed").await;
        assert_eq!(
            done["result"]["content"][0]["text"], "vm-7 is up (approved by Ada)",
            "{transport}: {done}"
        );
        let text = replicas[1].get_text("/metrics").await;
        assert!(
            text.contains("mrtr_tasks_adopted_total{outcome=\"replayed\"} 1"),
            "{transport}"
        );
    }
}
