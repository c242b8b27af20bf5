//! Gathering a round (`state.gather`): a target that asks one thing at a time is learned and its
//! rounds stop waiting the window; one that asks together keeps it; requests that come while a
//! round is parked are not lost. What a round waited is read from `mrtr_round_gathers_total`.

use serde_json::{json, Value};

use crate::metrics::sample;
use crate::support::mock::{Mock, Step};
use crate::support::{all_caps, first_round, retry, TestProxy};

fn elicit(id: i64) -> Step {
    Step::Send(
        json!({"jsonrpc":"2.0","id":id,"method":"elicitation/create","params":{"message":"?","requestedSchema":{"type":"object","properties":{}}}}),
    )
}

fn roots(id: i64) -> Step {
    Step::Send(json!({"jsonrpc":"2.0","id":id,"method":"roots/list"}))
}

// Upstream ids must differ from call to call: the mock's `Await` matches answers by session and
// id, and calls share sessions.
fn alone(call: i64) -> Vec<Step> {
    vec![elicit(call * 10), Step::Await(call * 10), done()]
}

fn together(call: i64) -> Vec<Step> {
    let (a, b) = (call * 10, call * 10 + 1);
    vec![elicit(a), roots(b), Step::Await(a), Step::Await(b), done()]
}

fn done() -> Step {
    Step::Reply(json!({"content":[{"type":"text","text":"finished"}]}))
}

fn answers(round: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for key in round["inputRequests"].as_object().unwrap().keys() {
        let answer = if key.starts_with("roots-") {
            json!({"roots":[]})
        } else {
            json!({"action":"accept","content":{}})
        };
        out.insert(key.clone(), answer);
    }
    Value::Object(out)
}

/// Runs `tool` to its end, answering every round; returns the number of keys of each round.
async fn run_call(c: &mrtr_proxy::demo::client::ModernClient, tool: &str) -> Vec<usize> {
    let (mut round, mut state) = first_round(c, tool, json!({})).await;
    let mut keys = Vec::new();
    loop {
        keys.push(round["inputRequests"].as_object().unwrap().len());
        let ex = retry(c, tool, json!({}), answers(&round), &state).await;
        let r = ex.result();
        if r["resultType"] != "input_required" {
            assert_eq!(r["content"][0]["text"], "finished", "{r}");
            return keys;
        }
        state = r["requestState"].as_str().unwrap().to_owned();
        round = r.clone();
    }
}

async fn gathers(proxy: &TestProxy, wait: &str) -> f64 {
    let text = proxy.get_text("/metrics").await;
    let series = format!(r#"mrtr_round_gathers_total{{wait="{wait}"}}"#);
    if text.contains(&series) {
        sample(&text, &series)
    } else {
        0.0
    }
}

#[tokio::test]
async fn a_target_that_asks_one_at_a_time_stops_waiting_the_window() {
    let mock = Mock::start().await;
    let twice = |c: i64| {
        let (a, b) = (c * 10, c * 10 + 1);
        vec![elicit(a), Step::Await(a), elicit(b), Step::Await(b), done()]
    };
    mock.script("one", vec![twice(1), twice(2)]);
    let proxy = TestProxy::start(&mock.url(), "").await;
    let c = proxy.client(all_caps());
    assert_eq!(run_call(&c, "one").await, [1, 1]);
    // The first round of an unknown target waited; having seen one request alone, the next
    // round did not, and neither does any round of the next call.
    assert_eq!(gathers(&proxy, "window").await, 1.0);
    assert_eq!(gathers(&proxy, "arrived").await, 1.0);
    assert_eq!(run_call(&c, "one").await, [1, 1]);
    assert_eq!(gathers(&proxy, "window").await, 1.0);
    assert_eq!(gathers(&proxy, "arrived").await, 3.0);
}

#[tokio::test]
async fn a_target_that_asks_together_keeps_one_round() {
    let mock = Mock::start().await;
    mock.script("both", (1..=3).map(together).collect());
    let proxy = TestProxy::start(&mock.url(), "[state]\ngather_window = \"250ms\"\n").await;
    let c = proxy.client(all_caps());
    for _ in 0..3 {
        assert_eq!(run_call(&c, "both").await, [2]);
    }
    assert_eq!(gathers(&proxy, "window").await, 3.0);
    assert_eq!(gathers(&proxy, "arrived").await, 0.0);
}

#[tokio::test]
async fn a_target_learned_alone_that_then_asks_together_loses_nothing_and_is_relearned() {
    let mock = Mock::start().await;
    // From the third call on, two requests come back to back with no answer between: the
    // proxy, not waiting any more, may park the first alone; the second then joins the next
    // round.
    mock.script("t", vec![alone(1), alone(2), together(3), together(4)]);
    let proxy = TestProxy::start(&mock.url(), "[state]\ngather_window = \"250ms\"\n").await;
    let c = proxy.client(all_caps());
    assert_eq!(run_call(&c, "t").await, [1]);
    assert_eq!(run_call(&c, "t").await, [1]);
    assert_eq!(gathers(&proxy, "arrived").await, 1.0);
    let split = run_call(&c, "t").await;
    assert_eq!(split.iter().sum::<usize>(), 2, "no request lost: {split:?}");
    // Whether both were already read when the round was answered depends on the scheduler;
    // either way the target is known to ask together once the call is over.
    let windows = gathers(&proxy, "window").await;
    assert_eq!(run_call(&c, "t").await, [2]);
    assert_eq!(gathers(&proxy, "window").await, windows + 1.0);
}

#[tokio::test]
async fn gather_never_does_not_wait_even_a_long_window() {
    let mock = Mock::start().await;
    mock.script("one", vec![alone(1)]);
    // An hour-long window: the test would time out if the round waited it.
    let toml = "[state]\ngather = \"never\"\ngather_window = \"1h\"\n";
    let proxy = TestProxy::start(&mock.url(), toml).await;
    let c = proxy.client(all_caps());
    assert_eq!(run_call(&c, "one").await, [1]);
    assert_eq!(gathers(&proxy, "arrived").await, 1.0);
}

#[tokio::test]
async fn gather_always_waits_the_window_on_every_round() {
    let mock = Mock::start().await;
    mock.script("one", vec![alone(1), alone(2)]);
    let toml = "[state]\ngather = \"always\"\ngather_window = \"20ms\"\n";
    let proxy = TestProxy::start(&mock.url(), toml).await;
    let c = proxy.client(all_caps());
    for _ in 0..2 {
        assert_eq!(run_call(&c, "one").await, [1]);
    }
    assert_eq!(gathers(&proxy, "window").await, 2.0);
    assert_eq!(gathers(&proxy, "arrived").await, 0.0);
}
