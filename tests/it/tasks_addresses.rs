//! Replicas sharing a task store find each other through it: each announces its MCP URL (sealed
//! under the shared key), so a `tasks/update` or an MRTR retry that lands on a replica without
//! a `[cluster]` peer list still reaches the one holding its task or call.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::mock::{Mock, Step};
use crate::support::redis_server::RedisServer;
use crate::support::{all_caps, first_key, first_round, retry, TestProxy};
use crate::tasks::{on_task, task_caps, until_status};
use mrtr_proxy::demo::client::ModernClient;

const KEY: &str = "a-shared-cluster-key-0123456789abcdef";

/// A replica on `store` with no `[cluster]` table; its upstream's `slow` (a task at once) and
/// `ask` (an ordinary call) both ask elicitation 7, then finish.
async fn replica(store: &RedisServer) -> (Mock, TestProxy) {
    let mock = Mock::start().await;
    let script = || {
        let done = Step::Reply(json!({"content": [{"type": "text", "text": "finished"}]}));
        vec![vec![Step::elicit(7), Step::Await(7), done]]
    };
    mock.script("slow", script());
    mock.script("ask", script());
    let toml = format!(
        "[state]\nsecret = \"{KEY}\"\n[server]\nshutdown_grace = \"100ms\"\n\
         [tasks]\nstore = \"{}\"\nstore_timeout = \"500ms\"\nlease = \"3s\"\n\
         [tasks.tools]\nslow = \"always\"\n",
        store.url()
    );
    let proxy = TestProxy::start(&mock.url(), &toml).await;
    (mock, proxy)
}

/// The instance id of `proxy`, once its address is in `store` (it announces it on its first
/// lease renewal, at start).
async fn announced(store: &RedisServer, proxy: &TestProxy) -> String {
    let id = proxy.app.instance_id().to_owned();
    let mut conn = store.connection().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let there: bool = redis::cmd("EXISTS")
            .arg(format!("mrtr:instance:{id}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        if there {
            return id;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{id} never announced"
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn forwards(proxy: &TestProxy, kind: &str, result: &str) -> String {
    let text = proxy.get_text("/metrics").await;
    let series = format!("mrtr_forwarded_retries_total{{kind=\"{kind}\",result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .unwrap_or("0")
        .to_owned()
}

fn ada() -> Value {
    json!({"action": "accept", "content": {"name": "Ada"}})
}

#[tokio::test]
async fn an_update_on_a_replica_without_peers_reaches_the_holder_at_its_announced_address() {
    let store = RedisServer::start().await;
    let (m1, a) = replica(&store).await;
    let (m2, b) = replica(&store).await;
    announced(&store, &a).await;
    let on_a = a.client(task_caps());
    let ex = on_a
        .request("tools/call", json!({"name": "slow", "arguments": {}}))
        .await
        .unwrap();
    let id = ex.result()["taskId"].as_str().unwrap().to_owned();
    let key = first_key(&until_status(&on_a, &id, "input_required").await);
    let on_b: ModernClient = b.client(task_caps());
    let ex = on_task(
        &on_b,
        "update",
        &id,
        json!({"inputResponses": { key: ada() }}),
    )
    .await;
    assert_eq!(ex.result()["resultType"], "complete", "{:?}", ex.last);
    let done = until_status(&on_b, &id, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], "finished", "{done}");
    // The holder's upstream got the answer; B's never saw the call.
    assert_eq!(m1.answers_to(7)[0]["result"]["content"]["name"], "Ada");
    assert_eq!(m2.calls_of("slow"), 0);
    assert_eq!(forwards(&b, "task", "ok").await, "1");
}

#[tokio::test]
async fn an_mrtr_retry_on_a_replica_without_peers_resumes_the_call_where_it_is_parked() {
    let store = RedisServer::start().await;
    let (m1, a) = replica(&store).await;
    let (m2, b) = replica(&store).await;
    announced(&store, &a).await;
    let (_, state) = first_round(&a.client(all_caps()), "ask", json!({})).await;
    let answers = json!({"elicitation-1": ada()});
    let ex = retry(&b.client(all_caps()), "ask", json!({}), answers, &state).await;
    assert_eq!(
        ex.result()["content"][0]["text"],
        "finished",
        "{:?}",
        ex.last
    );
    assert_eq!(m1.answers_to(7).len(), 1);
    assert_eq!(m2.calls_of("ask"), 0, "not run again on B: forwarded");
    assert_eq!(forwards(&b, "retry", "ok").await, "1");
}

#[tokio::test]
async fn an_address_written_into_the_store_without_the_shared_key_is_never_used() {
    let store = RedisServer::start().await;
    let (_m1, a) = replica(&store).await;
    let (_m2, b) = replica(&store).await;
    let (_m3, elsewhere) = replica(&store).await;
    let id = announced(&store, &a).await;
    let (_, state) = first_round(&a.client(all_caps()), "ask", json!({})).await;
    // A writer of the store alone points A's id at another replica, in the clear and sealed
    // under a key of its own.
    let url = elsewhere.url();
    let forged = [
        json!({"kid": "k", "sealed": url}),
        json!({"kid": "attacker", "sealed": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}),
    ];
    let mut conn = store.connection().await.unwrap();
    for value in forged {
        redis::cmd("SET")
            .arg(format!("mrtr:instance:{id}"))
            .arg(value.to_string())
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
        let answers = json!({"elicitation-1": ada()});
        let ex = retry(&b.client(all_caps()), "ask", json!({}), answers, &state).await;
        assert_eq!(
            ex.last["error"]["data"]["reason"], "call_lost",
            "{:?}",
            ex.last
        );
    }
    assert_eq!(forwards(&b, "retry", "unknown_owner").await, "2");
    assert_eq!(forwards(&elsewhere, "retry", "ok").await, "0");
}
