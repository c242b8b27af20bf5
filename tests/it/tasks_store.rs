//! Tasks in a shared store (`[tasks] store = "redis://…"`), against a real `redis-server`: read
//! from any replica, adopted when their holder is gone, sealed at rest, and a store that does
//! not answer leaves calls ordinary.

use std::time::Duration;

use serde_json::{json, Value};

use crate::metrics::sample;
use crate::support::mock::{Mock, Step};
use crate::support::redis_server::RedisServer;
use crate::support::{first_key, Listener, TestProxy};
use crate::tasks::{on_task, task_caps, until, until_status, update};
use crate::tasks_lifecycle::pushed;
use mrtr_proxy::demo::client::ModernClient;

const KEY: &str = "a-shared-cluster-key-0123456789abcdef";
/// What the person typed, what the tool was given and what it returned: never in the clear.
const ANSWER: &str = "answer-marker-Zebediah";
const ARGUMENT: &str = "argument-marker-77";
const RESULT: &str = "result-marker-42";

/// A replica on `store`, with a short lease (a gone holder is noticed within ~300 ms), whose
/// upstream's `slow` asks (elicitation 7), then finishes with [`RESULT`]; `slow` is a task at
/// once.
async fn replica(store: &RedisServer) -> (Mock, TestProxy) {
    let done = Step::Reply(json!({"content": [{"type": "text", "text": RESULT}]}));
    replica_running(store, vec![Step::elicit(7), Step::Await(7), done], "").await
}

/// A replica on `store` whose upstream's `slow` runs `script`, with `more` config.
async fn replica_running(store: &RedisServer, script: Vec<Step>, more: &str) -> (Mock, TestProxy) {
    let mock = Mock::start().await;
    mock.script("slow", vec![script]);
    let toml = format!(
        "[state]\nsecret = \"{KEY}\"\n[server]\nshutdown_grace = \"100ms\"\n{more}\
         [tasks]\nstore = \"{}\"\nstore_timeout = \"100ms\"\nlease = \"300ms\"\n\
         [tasks.tools]\nslow = \"always\"\n",
        store.url()
    );
    let proxy = TestProxy::start(&mock.url(), &toml).await;
    (mock, proxy)
}

/// An `elicitation/create` with id `id` asking `msg` for a string `name`.
fn ask(id: i64, msg: &str) -> Step {
    Step::Send(json!({
        "jsonrpc": "2.0", "id": id, "method": "elicitation/create",
        "params": {"message": msg, "requestedSchema": {"type": "object",
            "properties": {"name": {"type": "string"}}}}
    }))
}

/// An instance gone at once takes task `id`'s lease (for 400 ms): its holder finds it taken
/// and stops its copy, and the next replica asked adopts the task once it lapses.
async fn lose_holder(store: &RedisServer, id: &str) {
    lease_to_ghost(store, id, 400).await;
}

/// Task `id`'s lease is held by an instance no replica can reach, for `ms`.
async fn lease_to_ghost(store: &RedisServer, id: &str, ms: u64) {
    let mut conn = store.connection().await.unwrap();
    redis::cmd("SET")
        .arg(format!("mrtr:lease:{id}"))
        .arg("ghost")
        .arg("PX")
        .arg(ms)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
}

async fn start_task(c: &ModernClient) -> String {
    let args = json!({"name": "slow", "arguments": {"secret": ARGUMENT}});
    let ex = c.request("tools/call", args).await.unwrap();
    assert_eq!(ex.result()["resultType"], "task", "{:?}", ex.last);
    ex.result()["taskId"].as_str().unwrap().to_owned()
}

/// Two replicas whose `slow` asks "first" then "second" (replay-safe); a task started on A
/// whose first question was answered (`ada`), and A lost while the second is asked (it found its
/// lease taken and stopped its copy).
struct TwoQuestions {
    store: RedisServer,
    _m1: Mock,
    _a: TestProxy,
    m2: Mock,
    b: TestProxy,
    id: String,
    ada: Value,
}

async fn lost_at_the_second_question() -> TwoQuestions {
    let store = RedisServer::start().await;
    let script = || {
        let done = Step::Reply(json!({"content": [{"type": "text", "text": RESULT}]}));
        vec![
            ask(7, "first"),
            Step::Await(7),
            ask(8, "second"),
            Step::Await(8),
            done,
        ]
    };
    let safe = "[replay.tools]\nslow = \"always\"\n";
    let (m1, a) = replica_running(&store, script(), safe).await;
    let (m2, b) = replica_running(&store, script(), safe).await;
    let on_a = a.client(task_caps());
    let id = start_task(&on_a).await;
    let first = until_status(&on_a, &id, "input_required").await;
    let ada = json!({"action": "accept", "content": {"name": "Ada"}});
    update(&on_a, &id, json!({ first_key(&first): ada })).await;
    let second = until(&on_a, &id, |r| {
        r["inputRequests"]["elicitation-2"].is_object()
    })
    .await;
    assert_eq!(
        second["inputRequests"]["elicitation-2"]["params"]["message"],
        "second"
    );
    lose_holder(&store, &id).await;
    m1.wait_for("the call cancelled upstream", |m| {
        m["method"] == "notifications/cancelled"
    })
    .await;
    TwoQuestions {
        store,
        _m1: m1,
        _a: a,
        m2,
        b,
        id,
        ada,
    }
}

async fn metric(proxy: &TestProxy, series: &str) -> f64 {
    sample(&proxy.get_text("/metrics").await, series)
}

/// Like [`metric`], 0 for a labelled series not counted yet.
async fn count(proxy: &TestProxy, series: &str) -> f64 {
    let text = proxy.get_text("/metrics").await;
    if text.lines().any(|l| l.starts_with(series)) {
        sample(&text, series)
    } else {
        0.0
    }
}

#[tokio::test]
async fn a_task_is_read_from_the_store_on_a_replica_that_does_not_hold_it() {
    let store = RedisServer::start().await;
    let (_m1, a) = replica(&store).await;
    let (_m2, b) = replica(&store).await;
    let id = start_task(&a.client(task_caps())).await;
    // No [cluster] peers: B cannot forward, so what it answers comes from the store.
    let on_b = b.client(task_caps());
    let asked = until_status(&on_b, &id, "input_required").await;
    let on_a = until_status(&a.client(task_caps()), &id, "input_required").await;
    assert_eq!(asked["inputRequests"], on_a["inputRequests"]);
    assert_eq!(asked["createdAt"], on_a["createdAt"]);
}

#[tokio::test]
async fn a_finished_task_outlives_its_holder_and_is_adopted_as_finished() {
    let store = RedisServer::start().await;
    let (_m1, mut a) = replica(&store).await;
    let (_m2, b) = replica(&store).await;
    let c = a.client(task_caps());
    let id = start_task(&c).await;
    let key = first_key(&until_status(&c, &id, "input_required").await);
    update(
        &c,
        &id,
        json!({ key: {"action": "accept", "content": {"n": ANSWER}} }),
    )
    .await;
    until_status(&c, &id, "completed").await;
    a.stopped().await;
    // Its lease lapses (no one renews it); the survivor takes it and serves the result.
    let on_b = b.client(task_caps());
    let done = until(&on_b, &id, |_| true).await;
    assert_eq!(done["status"], "completed");
    assert_eq!(done["result"]["content"][0]["text"], RESULT, "{done}");
    let adopted = r#"mrtr_tasks_adopted_total{outcome="finished"}"#;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while count(&b, adopted).await < 1.0 {
        assert!(tokio::time::Instant::now() < deadline, "never adopted");
        on_task(&on_b, "get", &id, json!({})).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_running_task_whose_lease_another_took_stops_there_and_fails_with_a_clear_message() {
    let store = RedisServer::start().await;
    let (m1, a) = replica(&store).await;
    let (_m2, b) = replica(&store).await;
    let id = start_task(&a.client(task_caps())).await;
    until_status(&a.client(task_caps()), &id, "input_required").await;
    // A finds its lease taken, stops its copy (cancelled upstream, nothing written), and once
    // the lease lapses B adopts the task.
    lose_holder(&store, &id).await;
    m1.wait_for("the call cancelled upstream", |m| {
        m["method"] == "notifications/cancelled"
    })
    .await;
    let on_b = b.client(task_caps());
    let failed = until_status(&on_b, &id, "failed").await;
    let message = failed["statusMessage"].as_str().unwrap_or_default();
    assert!(
        message.contains("replica running this task was lost"),
        "{failed}"
    );
    assert!(message.contains("not marked safe to run again"), "{failed}");
    assert_eq!(failed["error"]["message"], message);
    assert_eq!(metric(&a, "mrtr_task_leases_lost_total").await, 1.0);
    let adopted = r#"mrtr_tasks_adopted_total{outcome="failed"}"#;
    assert_eq!(metric(&b, adopted).await, 1.0);
    // Adopted once: another read does not adopt it again.
    on_task(&on_b, "get", &id, json!({})).await;
    assert_eq!(metric(&b, adopted).await, 1.0);
}

#[tokio::test]
async fn a_dump_of_the_store_shows_ids_statuses_and_times_never_what_was_typed_or_returned() {
    let store = RedisServer::start().await;
    let (_m, a) = replica(&store).await;
    let c = a.client(task_caps());
    let id = start_task(&c).await;
    let asked = until_status(&c, &id, "input_required").await;
    let key = first_key(&asked);
    update(
        &c,
        &id,
        json!({ key: {"action": "accept", "content": {"n": ANSWER}} }),
    )
    .await;
    let done = until_status(&c, &id, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], RESULT);
    let dump = store.dump().await;
    let record = dump
        .iter()
        .find(|(k, _)| *k == format!("mrtr:task:{id}"))
        .map(|(_, v)| serde_json::from_str::<Value>(v).unwrap())
        .expect("the task's record is in the store");
    assert_eq!(record["status"], "completed");
    assert!(record["created_ms"].is_u64() && record["sealed"].is_string());
    for (k, v) in &dump {
        for secret in [ANSWER, ARGUMENT, RESULT, "requestedSchema"] {
            assert!(!v.contains(secret), "{k} holds {secret} in the clear: {v}");
        }
    }
    let mut conn = store.connection().await.unwrap();
    let ttl: i64 = redis::cmd("PTTL")
        .arg(format!("mrtr:task:{id}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(ttl > 0, "the record expires with the task (PTTL {ttl})");
}

#[tokio::test]
async fn a_store_that_does_not_answer_leaves_calls_ordinary_and_readyz_says_so() {
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let mock = Mock::start().await;
    let done = Step::Reply(json!({"content": [{"type": "text", "text": RESULT}]}));
    mock.script("slow", vec![vec![done]]);
    let toml = format!(
        "[state]\nsecret = \"{KEY}\"\n[tasks]\nstore = \"redis://127.0.0.1:{port}/0\"\n\
         store_timeout = \"100ms\"\nlease = \"300ms\"\n[tasks.tools]\nslow = \"always\"\n"
    );
    let proxy = TestProxy::start(&mock.url(), &toml).await;
    stays_ordinary_with_the_store_down(&proxy, RESULT).await;
}

/// `slow` on `proxy`, due to be a task at once, stays an ordinary call (answered `text`,
/// counted in `mrtr_tasks_not_created_total`), and `/readyz` and `mrtr_task_store_up` say the
/// store is unreachable.
pub(crate) async fn stays_ordinary_with_the_store_down(proxy: &TestProxy, text: &str) {
    let c = proxy.client(task_caps());
    let ex = c
        .request("tools/call", json!({"name": "slow", "arguments": {}}))
        .await
        .unwrap();
    assert_eq!(ex.result()["resultType"], "complete", "{:?}", ex.last);
    assert_eq!(ex.result()["content"][0]["text"], text);
    assert_eq!(metric(proxy, "mrtr_tasks_not_created_total").await, 1.0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let ready = proxy.get_text("/readyz").await;
        if ready.contains("task store unreachable") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{ready}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(metric(proxy, "mrtr_task_store_up").await, 0.0);
}

#[tokio::test]
async fn a_replay_safe_task_runs_again_on_the_adopter_without_asking_what_was_answered() {
    // The store lives to the end of the test; A is gone.
    let TwoQuestions {
        store: _store,
        m2,
        b,
        id,
        ada,
        ..
    } = lost_at_the_second_question().await;
    // B adopts it and runs the call again on its own upstream: the first question is answered
    // from the task's journal (the person is not asked again), the second asked anew under a
    // fresh key.
    let on_b = b.client(task_caps());
    let again = until(&on_b, &id, |r| {
        r["inputRequests"]["elicitation-3"].is_object()
    })
    .await;
    let asked = again["inputRequests"].as_object().unwrap();
    assert_eq!(
        asked.len(),
        1,
        "only the new question is outstanding: {again}"
    );
    assert_eq!(asked["elicitation-3"]["params"]["message"], "second");
    let answered: Vec<Value> = m2
        .answers_to(7)
        .into_iter()
        .map(|m| m["result"].clone())
        .collect();
    assert_eq!(
        answered,
        vec![ada],
        "the journal's answer, delivered upstream"
    );
    let bob = json!({"action": "accept", "content": {"name": "Bob"}});
    update(&on_b, &id, json!({ "elicitation-3": bob })).await;
    let done = until_status(&on_b, &id, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], RESULT, "{done}");
    let replayed = r#"mrtr_tasks_adopted_total{outcome="replayed"}"#;
    assert_eq!(metric(&b, replayed).await, 1.0);
}

#[tokio::test]
async fn a_listen_stream_on_another_replica_follows_a_task_wherever_it_runs() {
    let store = RedisServer::start().await;
    let (_m1, a) = replica(&store).await;
    let (_m2, b) = replica(&store).await;
    let on_a = a.client(task_caps());
    let id = start_task(&on_a).await;
    let filter = json!({"taskIds": [id]});
    let mut listener = Listener::declaring(&b, "l1", filter, None, task_caps()).await;
    let ack = listener.next().await;
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([id]),
        "{ack}"
    );
    let asking = until_status(&on_a, &id, "input_required").await;
    update(
        &on_a,
        &id,
        json!({ first_key(&asking): {"action": "accept", "content": {}} }),
    )
    .await;
    let n = pushed(&mut listener, "completed").await;
    assert_eq!(n["params"]["taskId"], id.as_str());
    assert_eq!(n["params"]["result"]["content"][0]["text"], RESULT, "{n}");
}

#[tokio::test]
async fn a_stored_task_asked_for_while_the_store_is_down_is_a_retryable_error_not_unknown() {
    let store = RedisServer::start().await;
    let (_m, a) = replica(&store).await;
    let c = a.client(task_caps());
    let id = start_task(&c).await;
    until_status(&c, &id, "input_required").await;
    drop(store);
    let ex = on_task(&c, "get", &id, json!({})).await;
    assert_eq!(
        ex.status,
        http::StatusCode::SERVICE_UNAVAILABLE,
        "{:?}",
        ex.last
    );
    let e = crate::support::error_of(&ex);
    let message = e["message"].as_str().unwrap_or_default();
    assert!(message.contains("task store is unavailable"), "{e}");
    assert!(!message.contains("unknown"), "{e}");
}

#[tokio::test]
async fn a_store_restarted_empty_gets_its_running_tasks_back_from_their_holders() {
    let mut store = RedisServer::start().await;
    let (_m, a) = replica(&store).await;
    let c = a.client(task_caps());
    let id = start_task(&c).await;
    let asked = until_status(&c, &id, "input_required").await;
    store.restart_empty().await;
    // The holder writes it back as soon as it is asked for it or renews its lease (the first
    // request may find the connection to the old store broken: a retryable 503).
    let back = until(&c, &id, |r| r["status"] == "input_required").await;
    assert_eq!(back["inputRequests"], asked["inputRequests"]);
    update(
        &c,
        &id,
        json!({ first_key(&asked): {"action": "accept", "content": {}} }),
    )
    .await;
    let done = until_status(&c, &id, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], RESULT, "{done}");
}

#[tokio::test]
async fn a_task_that_finishes_while_the_store_is_down_is_written_back_finished() {
    let mut store = RedisServer::start().await;
    let done = Step::Reply(json!({"content": [{"type": "text", "text": RESULT}]}));
    let (_m, a) = replica_running(&store, vec![Step::Delay(300), done], "").await;
    let c = a.client(task_caps());
    let id = start_task(&c).await;
    store.stop();
    // The upstream finishes while the store is down: the holder keeps the change.
    let missed = r#"mrtr_task_store_errors_total{op="apply"}"#;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while count(&a, missed).await < 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the change was never tried"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    store.restart_empty().await;
    let finished = until_status(&c, &id, "completed").await;
    assert_eq!(
        finished["result"]["content"][0]["text"], RESULT,
        "{finished}"
    );
}

#[tokio::test]
async fn an_update_or_cancel_while_a_gone_holders_lease_lives_is_retried_later_never_lost() {
    let store = RedisServer::start().await;
    let (_m1, a) = replica(&store).await;
    let (_m2, b) = replica(&store).await;
    let id = start_task(&a.client(task_caps())).await;
    let key = first_key(&until_status(&a.client(task_caps()), &id, "input_required").await);
    // Its holder is unreachable (gone) while its lease lives: the task is not lost, it is
    // adopted once the lease lapses, so the client is told to retry (503), not `task_lost`.
    lease_to_ghost(&store, &id, 60_000).await;
    let on_b = b.client(task_caps());
    let answers = json!({ key: {"action": "accept", "content": {"n": ANSWER}} });
    for (verb, extra) in [
        ("update", json!({ "inputResponses": answers })),
        ("cancel", json!({})),
    ] {
        let ex = on_task(&on_b, verb, &id, extra).await;
        assert_eq!(ex.status, 503, "tasks/{verb}: {:?}", ex.last);
        assert_eq!(
            ex.last["error"]["code"], -32000,
            "tasks/{verb}: {:?}",
            ex.last
        );
        let message = ex.last["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("retry later"), "tasks/{verb}: {message}");
        assert!(ex.headers.contains_key("retry-after"), "tasks/{verb}");
    }
}

#[tokio::test]
async fn an_answer_that_comes_as_the_task_is_adopted_is_delivered_not_asked_again() {
    let TwoQuestions {
        store, m2, b, id, ..
    } = lost_at_the_second_question().await;
    // The lease lapses; the person's answer to the open question is what adopts the task.
    until_lease_lapsed(&store, &id).await;
    let on_b = b.client(task_caps());
    let bob = json!({"action": "accept", "content": {"name": "Bob"}});
    update(&on_b, &id, json!({ "elicitation-2": bob })).await;
    let done = until_status(&on_b, &id, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], RESULT, "{done}");
    let delivered: Vec<Value> = m2
        .answers_to(8)
        .into_iter()
        .map(|m| m["result"].clone())
        .collect();
    assert_eq!(
        delivered,
        vec![bob],
        "the acknowledged answer reached the re-run"
    );
    assert_eq!(
        metric(&b, r#"mrtr_tasks_adopted_total{outcome="replayed"}"#).await,
        1.0
    );
}

/// Once task `id`'s lease is gone from `store`.
async fn until_lease_lapsed(store: &RedisServer, id: &str) {
    let mut conn = store.connection().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let lease: i64 = redis::cmd("EXISTS")
            .arg(format!("mrtr:lease:{id}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        if lease == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease never lapsed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn requests_racing_on_one_replica_adopt_the_task_once_and_run_it_again_once() {
    let TwoQuestions {
        store, m2, b, id, ..
    } = lost_at_the_second_question().await;
    until_lease_lapsed(&store, &id).await;
    // Reads all on B, each on a connection of its own, spread over the time an adoption takes:
    // each finds no holder, or B's own lease before B holds the task; one of them adopts it.
    let clients: Vec<_> = (0..32).map(|_| b.client(task_caps())).collect();
    let reads = clients.iter().zip(0u64..).map(|(c, i)| {
        let id = id.as_str();
        async move {
            tokio::time::sleep(Duration::from_micros(250 * i)).await;
            on_task(c, "get", id, json!({})).await
        }
    });
    for ex in futures_util::future::join_all(reads).await {
        assert_eq!(ex.status, 200, "{:?}", ex.last);
    }
    let on_b = b.client(task_caps());
    until(&on_b, &id, |r| {
        r["inputRequests"]["elicitation-3"].is_object()
    })
    .await;
    for _ in 0..3 {
        on_task(&on_b, "get", &id, json!({})).await;
    }
    assert_eq!(m2.calls_of("slow"), 1, "the call ran again once");
    assert_eq!(
        metric(&b, r#"mrtr_tasks_adopted_total{outcome="replayed"}"#).await,
        1.0
    );
}

#[tokio::test]
async fn a_task_past_its_ttl_is_gone_from_the_store_and_unknown_on_every_replica() {
    let store = RedisServer::start().await;
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let mock = Mock::start().await;
        mock.script("slow", vec![vec![Step::elicit(7), Step::Await(7)]]);
        let toml = format!(
            "[state]\nsecret = \"{KEY}\"\n[server]\nshutdown_grace = \"100ms\"\n\
             [tasks]\nstore = \"{}\"\nstore_timeout = \"100ms\"\nlease = \"300ms\"\n\
             ttl = \"800ms\"\nafter = \"100ms\"\n[tasks.tools]\nslow = \"always\"\n",
            store.url()
        );
        let proxy = TestProxy::start(&mock.url(), &toml).await;
        replicas.push((mock, proxy));
    }
    let on_a = replicas[0].1.client(task_caps());
    let id = start_task(&on_a).await;
    until_status(&on_a, &id, "input_required").await;
    // Past its TTL the task is unknown wherever it is asked for, and the store holds nothing
    // of it: its record and its lease expired with it.
    for (_, replica) in &replicas {
        let c = replica.client(task_caps());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let ex = on_task(&c, "get", &id, json!({})).await;
            if ex.last["error"]["message"] == "unknown or expired taskId" {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{:?}", ex.last);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let mut conn = store.connection().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("mrtr:*{id}*"))
            .query_async(&mut conn)
            .await
            .unwrap();
        if keys.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "left in the store: {keys:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The running call was cancelled upstream at the TTL.
    replicas[0]
        .0
        .wait_for("the call cancelled upstream", |m| {
            m["method"] == "notifications/cancelled"
        })
        .await;
}

#[tokio::test]
async fn updates_racing_with_an_adoption_on_one_replica_are_taken_or_retried_never_unknown() {
    let TwoQuestions {
        store, m2, b, id, ..
    } = lost_at_the_second_question().await;
    until_lease_lapsed(&store, &id).await;
    // The person's answer, sent again and again on B while one of the sends adopts the task:
    // each is taken (200) or told to retry (503), never "unknown task".
    let bob = json!({"inputResponses": {"elicitation-2": {"action": "accept", "content": {"name": "Bob"}}}});
    let clients: Vec<_> = (0..16).map(|_| b.client(task_caps())).collect();
    let sends = clients.iter().zip(0u64..).map(|(c, i)| {
        let (id, bob) = (id.as_str(), bob.clone());
        async move {
            tokio::time::sleep(Duration::from_micros(250 * i)).await;
            on_task(c, "update", id, bob).await
        }
    });
    let answered = futures_util::future::join_all(sends).await;
    for ex in &answered {
        assert!(ex.status == 200 || ex.status == 503, "{:?}", ex.last);
    }
    assert!(answered.iter().any(|ex| ex.status == 200));
    let done = until_status(&b.client(task_caps()), &id, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], RESULT, "{done}");
    assert_eq!(m2.calls_of("slow"), 1, "the call ran again once");
}
