//! One upstream change, one notification: a server that notifies every session of a change
//! reaches a listener once, however many sessions its principal holds (each parked call holds
//! one); and a second, genuine change right after the first is relayed too, never lost.

use serde_json::json;

use crate::support::mock::{Mock, Step};
use crate::support::{all_caps, first_round, Listener, TestProxy};

/// Parked calls, each on a session of its own.
const PARKED: usize = 8;

#[tokio::test]
async fn a_change_every_session_notifies_reaches_a_listener_once() {
    let mock = Mock::start().await;
    let park = vec![
        Step::elicit(1),
        Step::Await(1),
        Step::Reply(json!({"content": []})),
    ];
    mock.script("ask", vec![park; PARKED]);
    let proxy = TestProxy::start(&mock.url(), "").await;
    let filter = json!({"toolsListChanged": true, "resourceSubscriptions": ["file:///marker"]});
    let mut listener = Listener::open(&proxy, "sub-1", filter, None).await;
    assert_eq!(
        listener.next().await["method"],
        "notifications/subscriptions/acknowledged"
    );
    let client = proxy.client(all_caps());
    for _ in 0..PARKED {
        first_round(&client, "ask", json!({})).await;
    }
    assert!(proxy.app.parked_calls() >= PARKED);
    mock.broadcast_on_get(json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"}))
        .await;
    assert_eq!(
        listener.next().await["method"],
        "notifications/tools/list_changed"
    );
    // A second, different change once the first was relayed: when it arrives, every further
    // copy of the first that was to be relayed came before it (each session's stream keeps its
    // order, and a copy the feed held back would be published within its quiet time, before
    // the marker's own).
    let marker = json!({"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"file:///marker"}});
    mock.broadcast_on_get(marker).await;
    let mut list_changed = 1;
    loop {
        let ev = listener.next().await;
        match ev["method"].as_str() {
            Some("notifications/tools/list_changed") => list_changed += 1,
            Some("notifications/resources/updated") => break,
            other => panic!("unexpected {other:?}: {ev}"),
        }
    }
    assert_eq!(
        list_changed,
        1,
        "{} sessions notified one change",
        PARKED + 1
    );
}

#[tokio::test]
async fn a_second_change_right_after_the_first_is_relayed_too() {
    let mock = Mock::start().await;
    let changed = json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"});
    // Each call changes the tool list, notifying on its own stream (the session it ran on).
    let change = vec![
        Step::Send(changed.clone()),
        Step::Reply(json!({"content": []})),
    ];
    mock.script("add_tool", vec![change; 2]);
    let proxy = TestProxy::start(&mock.url(), "").await;
    let filter = json!({"toolsListChanged": true});
    let mut listener = Listener::open(&proxy, "sub-1", filter, None).await;
    assert_eq!(
        listener.next().await["method"],
        "notifications/subscriptions/acknowledged"
    );
    let client = proxy.client(all_caps());
    for n in 1..=2 {
        let done = client
            .request("tools/call", json!({"name": "add_tool", "arguments": {}}))
            .await
            .unwrap();
        assert_eq!(done.result()["content"], json!([]), "call {n}");
        // The second change comes as soon as the first is relayed: well inside the time copies
        // of one change are gathered, yet a change of its own.
        let ev = listener.next().await;
        assert_eq!(
            ev["method"], "notifications/tools/list_changed",
            "change {n}: {ev}"
        );
    }
}
