//! Scale-out: replicas that share a key, each with its own upstream. A retry that lands on
//! another replica is forwarded to the one holding the call; a lost owner gives the distinct
//! "call lost" error; peers are checked and a forward never takes a second hop.

use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::support::mock::{Mock, Step};
use crate::support::{all_caps, error_of, first_key, first_round, retry, TestProxy};

const KEY: &str = "a-shared-cluster-key-0123456789abcdef";

fn done() -> Step {
    Step::Reply(json!({"content":[{"type":"text","text":"finished"}]}))
}

fn accept() -> Value {
    json!({"elicitation-1": {"action":"accept","content":{"name":"Ada"}}})
}

/// `n` listeners on loopback port 0, and the TOML array of their MCP URLs.
async fn bind(n: usize) -> (Vec<TcpListener>, String) {
    let mut listeners = Vec::new();
    for _ in 0..n {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let peers: Vec<String> = listeners
        .iter()
        .map(|l| format!("\"http://{}/mcp\"", l.local_addr().unwrap()))
        .collect();
    (listeners, peers.join(", "))
}

/// `n` replicas, each with its own scripted upstream, every one listing all as peers.
async fn cluster(n: usize) -> (Vec<Mock>, Vec<TestProxy>) {
    let (listeners, peers) = bind(n).await;
    let toml = format!(
        "[state]\nsecret = \"{KEY}\"\n[cluster]\npeers = [{peers}]\nforward_timeout = \"2s\"\n[server]\nshutdown_grace = \"100ms\"\n"
    );
    let mut mocks = Vec::new();
    let mut proxies = Vec::new();
    for l in listeners {
        let mock = Mock::start().await;
        mock.script("ask", vec![vec![Step::elicit(7), Step::Await(7), done()]]);
        proxies.push(TestProxy::start_on(l, &mock.url(), &toml));
        mocks.push(mock);
    }
    (mocks, proxies)
}

async fn forwarded(proxy: &TestProxy, result: &str) -> String {
    let text = proxy.get_text("/metrics").await;
    let series = format!("mrtr_forwarded_retries_total{{kind=\"retry\",result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .unwrap_or("0")
        .to_owned()
}

#[tokio::test]
async fn a_retry_on_another_replica_resumes_the_call_where_it_is_parked() {
    let (mocks, proxies) = cluster(3).await;
    let (_, state) = first_round(&proxies[0].client(all_caps()), "ask", json!({})).await;
    let ex = retry(
        &proxies[1].client(all_caps()),
        "ask",
        json!({}),
        accept(),
        &state,
    )
    .await;
    assert_eq!(
        ex.result()["content"][0]["text"],
        "finished",
        "{:?}",
        ex.last
    );
    // The owner's upstream got the answer; no other upstream saw the call at all.
    let answers = mocks[0].answers_to(7);
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0]["result"]["content"]["name"], "Ada");
    assert_eq!((mocks[1].calls_of("ask"), mocks[2].calls_of("ask")), (0, 0));
    assert_eq!(forwarded(&proxies[1], "ok").await, "1");
    assert_eq!(proxies[0].app.parked_calls(), 0);
    // Single use still holds through a forward: the same retry again is refused by the owner.
    let again = retry(
        &proxies[2].client(all_caps()),
        "ask",
        json!({}),
        accept(),
        &state,
    )
    .await;
    assert_eq!(error_of(&again)["code"], -32602);
}

#[tokio::test]
async fn a_retry_whose_owner_is_gone_gets_the_call_lost_error() {
    let (_mocks, mut proxies) = cluster(2).await;
    let (_, state) = first_round(&proxies[0].client(all_caps()), "ask", json!({})).await;
    let mut owner = proxies.remove(0);
    owner.stopped().await;
    let ex = retry(
        &proxies[0].client(all_caps()),
        "ask",
        json!({}),
        accept(),
        &state,
    )
    .await;
    assert_eq!(ex.status, http::StatusCode::GONE);
    let e = error_of(&ex);
    assert_eq!(
        (e["code"].clone(), e["data"]["reason"].clone()),
        (json!(-32602), json!("call_lost"))
    );
    // The peer learnt the owner's id when they started (their start-up probes): the forward
    // is refused. Had it not, the stopped owner would answer no probe: unknown. One either way.
    let lost = forwarded(&proxies[0], "unknown_owner").await;
    let unreachable = forwarded(&proxies[0], "unreachable").await;
    assert_eq!(
        [lost.as_str(), unreachable.as_str()]
            .map(|n| n.parse::<u32>().unwrap())
            .iter()
            .sum::<u32>(),
        1,
        "one forward that failed ({lost} unknown, {unreachable} unreachable)"
    );
}

#[tokio::test]
async fn a_lone_instance_answers_call_lost_for_another_instances_token() {
    let mock = Mock::start().await;
    mock.script("ask", vec![vec![Step::elicit(7), Step::Await(7), done()]]);
    let toml = format!("[state]\nsecret = \"{KEY}\"\n");
    let a = TestProxy::start(&mock.url(), &toml).await;
    let b = TestProxy::start(&mock.url(), &toml).await;
    let (_, state) = first_round(&a.client(all_caps()), "ask", json!({})).await;
    let ex = retry(&b.client(all_caps()), "ask", json!({}), accept(), &state).await;
    assert_eq!(ex.status, http::StatusCode::GONE);
    assert_eq!(error_of(&ex)["data"]["reason"], "call_lost");
    assert_eq!(a.app.parked_calls(), 1, "the owner's call is untouched");
}

#[tokio::test]
async fn a_forwarded_retry_is_never_forwarded_again() {
    let (mocks, proxies) = cluster(2).await;
    let (_, state) = first_round(&proxies[0].client(all_caps()), "ask", json!({})).await;
    // As if a peer had sent A's retry to B: B must not send it on to A.
    let c = proxies[1].client(all_caps());
    let params = c.params(
        json!({"name":"ask","arguments":{},"inputResponses":accept(),"requestState":state}),
    );
    let body = json!({"jsonrpc":"2.0","id":9,"method":"tools/call","params":params}).to_string();
    let sig = proxies[0]
        .app
        .peer_signature(proxies[1].app.instance_id(), body.as_bytes())
        .unwrap();
    let headers = [
        ("mcp-method".to_owned(), "tools/call".to_owned()),
        ("mcp-name".to_owned(), "ask".to_owned()),
        ("mcp-proxy-peer".to_owned(), sig),
    ];
    let ex = c.send_raw(body.into(), &headers).await.unwrap();
    assert_eq!(ex.status, http::StatusCode::GONE, "{:?}", ex.last);
    assert_eq!(forwarded(&proxies[1], "loop").await, "1");
    assert!(
        mocks[0].answers_to(7).is_empty(),
        "nothing reached the owner"
    );
    assert_eq!(proxies[0].app.parked_calls(), 1);
}

#[tokio::test]
async fn a_peer_header_that_is_not_a_valid_signature_is_refused() {
    let (_mocks, proxies) = cluster(2).await;
    let c = proxies[1].client(all_caps());
    let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":c.params(json!({"name":"ask","arguments":{}}))}).to_string();
    // Signed for the right instance, but over another body; and plain garbage.
    let other = proxies[0]
        .app
        .peer_signature(proxies[1].app.instance_id(), b"{}")
        .unwrap();
    for sig in [other, "x.y.z".to_owned()] {
        let headers = [
            ("mcp-method".to_owned(), "tools/call".to_owned()),
            ("mcp-name".to_owned(), "ask".to_owned()),
            ("mcp-proxy-peer".to_owned(), sig),
        ];
        let ex = c.send_raw(body.clone().into(), &headers).await.unwrap();
        assert_eq!(ex.status, http::StatusCode::FORBIDDEN);
    }
    // A probe without a valid signature learns nothing.
    assert_eq!(
        proxies[1].get_status("/mcp").await,
        http::StatusCode::METHOD_NOT_ALLOWED
    );
}

fn ask(id: i64, message: &str) -> Step {
    Step::Send(json!({
        "jsonrpc": "2.0", "id": id, "method": "elicitation/create",
        "params": {"message": message, "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}}}
    }))
}

fn named(key: &str, name: &str) -> Value {
    json!({ key: {"action": "accept", "content": {"name": name}} })
}

/// Two replicas whose upstreams run `tool` as two rounds (`first`, then `second`), with
/// `replay` as the `[replay]` table; the call is parked at round 2 on the first replica,
/// which is then stopped. Returns the mocks, the survivor and the round-2 requestState.
async fn lost_at_round_two(
    tool: &str,
    (first, second): (&str, &str),
    replay: &str,
) -> (Vec<Mock>, TestProxy, String) {
    let (listeners, peers) = bind(2).await;
    let toml = format!(
        "[state]\nsecret = \"{KEY}\"\n[server]\nshutdown_grace = \"100ms\"\n[cluster]\npeers = [{peers}]\n[replay]\n{replay}\n"
    );
    let mut mocks = Vec::new();
    let mut proxies = Vec::new();
    for l in listeners {
        let mock = Mock::start().await;
        let script = vec![
            ask(7, first),
            Step::Await(7),
            ask(8, second),
            Step::Await(8),
            done(),
        ];
        mock.script(tool, vec![script]);
        proxies.push(TestProxy::start_on(l, &mock.url(), &toml));
        mocks.push(mock);
    }
    let c = proxies[0].client(all_caps());
    let (r1, s1) = first_round(&c, tool, json!({})).await;
    assert_eq!(
        r1["inputRequests"]["elicitation-1"]["params"]["message"],
        first
    );
    let ex = retry(&c, tool, json!({}), named("elicitation-1", "Ada"), &s1).await;
    let r2 = ex.result();
    assert_eq!(r2["resultType"], "input_required", "{:?}", ex.last);
    let s2 = r2["requestState"].as_str().unwrap().to_owned();
    let survivor = proxies.pop().unwrap();
    proxies.pop().unwrap().stopped().await;
    (mocks, survivor, s2)
}

/// Answers round 2 (`elicitation-2`) of `tool` with `name` on `proxy`, with `state`.
async fn answer_round_two(
    proxy: &TestProxy,
    tool: &str,
    name: &str,
    state: &str,
) -> mrtr_proxy::demo::client::Exchange {
    let answers = named("elicitation-2", name);
    retry(&proxy.client(all_caps()), tool, json!({}), answers, state).await
}

fn metric(text: &str, series: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or("0")
        .to_owned()
}

#[tokio::test]
async fn a_replay_safe_call_whose_owner_died_completes_elsewhere_without_asking_again() {
    // `look` is read-only by the upstream's own annotations (the default mode).
    let (mocks, b, s2) = lost_at_round_two("look", ("Name?", "Surname?"), "").await;
    let ex = answer_round_two(&b, "look", "Lovelace", &s2).await;
    assert_eq!(
        ex.result()["content"][0]["text"],
        "finished",
        "{:?}",
        ex.last
    );
    // B's upstream ran the call again and got both answers, the first one from the token.
    assert_eq!(mocks[1].calls_of("look"), 1);
    assert_eq!(
        mocks[1].answers_to(7)[0]["result"]["content"]["name"],
        "Ada"
    );
    assert_eq!(
        mocks[1].answers_to(8)[0]["result"]["content"]["name"],
        "Lovelace"
    );
    let text = b.get_text("/metrics").await;
    assert_eq!(metric(&text, "mrtr_replayed_calls_total"), "1");
    assert_eq!(metric(&text, "mrtr_replayed_answers_total"), "2");
    // The same token a second time is not run a second time here.
    let again = answer_round_two(&b, "look", "Lovelace", &s2).await;
    assert_eq!(error_of(&again)["code"], -32602);
    assert_eq!(mocks[1].calls_of("look"), 1);
}

#[tokio::test]
async fn a_call_that_is_not_replay_safe_gets_call_lost_and_is_not_run_again() {
    // `ask` carries no read-only or idempotent hint.
    let (mocks, b, s2) = lost_at_round_two("ask", ("Name?", "Surname?"), "").await;
    let ex = answer_round_two(&b, "ask", "L", &s2).await;
    assert_eq!(ex.status, http::StatusCode::GONE);
    assert_eq!(error_of(&ex)["data"]["reason"], "call_lost");
    assert_eq!(mocks[1].calls_of("ask"), 0, "never silently re-executed");
}

#[tokio::test]
async fn config_overrides_the_annotations_either_way() {
    let (mocks, b, s2) = lost_at_round_two(
        "ask",
        ("Name?", "Surname?"),
        "[replay.tools]\nask = \"always\"",
    )
    .await;
    let ex = answer_round_two(&b, "ask", "L", &s2).await;
    assert_eq!(
        ex.result()["content"][0]["text"],
        "finished",
        "{:?}",
        ex.last
    );
    assert_eq!(mocks[1].calls_of("ask"), 1);
    let (mocks, b, s2) = lost_at_round_two(
        "look",
        ("Name?", "Surname?"),
        "default = \"never\"\n[replay.tools]\nlook = \"never\"",
    )
    .await;
    let ex = answer_round_two(&b, "look", "L", &s2).await;
    assert_eq!(ex.status, http::StatusCode::GONE);
    assert_eq!(mocks[1].calls_of("look"), 0);
}

#[tokio::test]
async fn a_request_that_changed_on_the_rerun_is_asked_anew() {
    let (mocks, b, s2) = lost_at_round_two("look", ("Name?", "Surname?"), "").await;
    // B's upstream asks something else first this time.
    mocks[1].script(
        "look",
        vec![vec![
            ask(7, "Nickname?"),
            Step::Await(7),
            ask(8, "Surname?"),
            Step::Await(8),
            done(),
        ]],
    );
    let c = b.client(all_caps());
    let ex = answer_round_two(&b, "look", "Lovelace", &s2).await;
    let r = ex.result();
    assert_eq!(r["resultType"], "input_required", "{:?}", ex.last);
    let asked: Vec<&Value> = r["inputRequests"].as_object().unwrap().values().collect();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0]["params"]["message"], "Nickname?");
    assert!(
        mocks[1].answers_to(7).is_empty(),
        "Ada was not given to another question"
    );
    // Answered, the call goes on; the round-2 answer still comes from the first token.
    let key = first_key(r);
    let s3 = r["requestState"].as_str().unwrap();
    let ex = retry(&c, "look", json!({}), named(&key, "Ada"), s3).await;
    assert_eq!(
        ex.result()["content"][0]["text"],
        "finished",
        "{:?}",
        ex.last
    );
    assert_eq!(
        mocks[1].answers_to(8)[0]["result"]["content"]["name"],
        "Lovelace"
    );
}

#[tokio::test]
async fn a_draining_owner_still_resumes_a_forwarded_retry_and_refuses_new_calls() {
    let (listeners, peers) = bind(2).await;
    let toml = format!(
        "[state]\nsecret = \"{KEY}\"\n[server]\nshutdown_grace = \"30s\"\n[cluster]\npeers = [{peers}]\n"
    );
    let mut mocks = Vec::new();
    let mut proxies = Vec::new();
    for l in listeners {
        let mock = Mock::start().await;
        mock.script("ask", vec![vec![Step::elicit(7), Step::Await(7), done()]]);
        proxies.push(TestProxy::start_on(l, &mock.url(), &toml));
        mocks.push(mock);
    }
    let (_, state) = first_round(&proxies[0].client(all_caps()), "ask", json!({})).await;
    proxies[0].begin_shutdown();
    // Readiness is off and new calls go elsewhere ...
    let refused = proxies[0]
        .client(all_caps())
        .request("tools/call", json!({"name": "ask", "arguments": {}}))
        .await
        .unwrap();
    assert_eq!(refused.status, http::StatusCode::SERVICE_UNAVAILABLE);
    // ... but the parked call is resumed through the other replica.
    let ex = retry(
        &proxies[1].client(all_caps()),
        "ask",
        json!({}),
        accept(),
        &state,
    )
    .await;
    assert_eq!(
        ex.result()["content"][0]["text"],
        "finished",
        "{:?}",
        ex.last
    );
    assert_eq!(mocks[0].answers_to(7).len(), 1);
    assert_eq!(forwarded(&proxies[1], "ok").await, "1");
    proxies[0].stopped().await;
}

/// Issue 39 (5): a restart under the same `state.instance_id` and key (a StatefulSet pod). The
/// calls parked before it died with the process: one that is not replay-safe is "call lost" and
/// does not run again; a replay-safe one runs again once here, as on any replica whose ledger
/// has not seen its token (a restarted process's is new), and not a second time.
#[tokio::test]
async fn after_a_restart_under_the_same_id_parked_calls_are_lost_or_replayed_once() {
    let mock = Mock::start().await;
    for tool in ["ask", "look"] {
        mock.script(tool, vec![vec![ask(7, "Name?"), Step::Await(7), done()]]);
    }
    let toml = format!(
        "[state]\ninstance_id = \"mcp-0\"\nsecret = \"{KEY}\"\n[server]\nshutdown_grace = \"100ms\"\n"
    );
    let mut before = TestProxy::start(&mock.url(), &toml).await;
    let c = before.client(all_caps());
    let (_, asked) = first_round(&c, "ask", json!({})).await;
    let (_, looked) = first_round(&c, "look", json!({})).await;
    before.stopped().await;

    let after = TestProxy::start(&mock.url(), &toml).await;
    let c = after.client(all_caps());
    let answer = named("elicitation-1", "Ada");
    let lost = retry(&c, "ask", json!({}), answer.clone(), &asked).await;
    assert_eq!(lost.status, http::StatusCode::GONE, "{:?}", lost.last);
    assert_eq!(error_of(&lost)["data"]["reason"], "call_lost");
    assert_eq!(mock.calls_of("ask"), 1, "run only before the restart");
    let replayed = retry(&c, "look", json!({}), answer.clone(), &looked).await;
    assert_eq!(
        replayed.result()["content"][0]["text"],
        "finished",
        "{:?}",
        replayed.last
    );
    assert_eq!(mock.calls_of("look"), 2, "run again once, from its token");
    let again = retry(&c, "look", json!({}), answer, &looked).await;
    assert_eq!(error_of(&again)["code"], -32602);
    assert_eq!(
        mock.calls_of("look"),
        2,
        "not a second time by this process"
    );
}

/// Issue 34 (5), found by the soak: a replica restarted under a new (random) id. Its peer had
/// asked the set while it was down, so without more the peer would answer every retry of the
/// new instance's calls "call lost" for a whole `cluster.refresh_interval`. The restarted
/// instance probes its peers at start, and a peer that hears from an id it does not know asks
/// the set again at its next unknown owner: the retry is forwarded and the call completes.
#[tokio::test]
async fn a_replica_restarted_under_a_new_id_is_found_by_its_peer_at_once() {
    let (listeners, peers) = bind(2).await;
    let toml = format!(
        "[state]\nsecret = \"{KEY}\"\n[cluster]\npeers = [{peers}]\nrefresh_interval = \"1h\"\n[server]\nshutdown_grace = \"100ms\"\n"
    );
    let mock = Mock::start().await;
    mock.script(
        "ask",
        vec![vec![Step::elicit(7), Step::Await(7), done()]; 2],
    );
    let mut listeners = listeners.into_iter();
    let a = TestProxy::start_on(listeners.next().unwrap(), &mock.url(), &toml);
    let mut b = TestProxy::start_on(listeners.next().unwrap(), &mock.url(), &toml);
    let b_addr = b.addr;
    let (_, before) = first_round(&b.client(all_caps()), "ask", json!({})).await;
    b.stopped().await;
    // The peer asks the set while the replica is down: its old call is lost, and asked is now.
    let lost = retry(&a.client(all_caps()), "ask", json!({}), accept(), &before).await;
    assert_eq!(lost.status, http::StatusCode::GONE, "{:?}", lost.last);

    let again = TcpListener::bind(b_addr).await.unwrap();
    let b = TestProxy::start_on(again, &mock.url(), &toml);
    let (_, state) = first_round(&b.client(all_caps()), "ask", json!({})).await;
    // Bounded: the restarted replica's start-up probe reaches the peer in a moment; without it
    // (or without the peer heeding it) every retry here is "call lost" for the next hour.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let done = loop {
        let ex = retry(&a.client(all_caps()), "ask", json!({}), accept(), &state).await;
        if ex.status != http::StatusCode::GONE || tokio::time::Instant::now() >= deadline {
            break ex;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(
        done.result()["content"][0]["text"],
        "finished",
        "{:?}",
        done.last
    );
    assert_eq!(forwarded(&a, "ok").await, "1");
    assert_eq!(b.app.parked_calls(), 0);
}
