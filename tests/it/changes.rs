//! One upstream change, one notification: a server that notifies every session of a change
//! reaches a listener once, however many sessions its principal holds (each parked call holds
//! one).

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
    // A second, different change after the first: once it arrives, every copy of the first that
    // was to be relayed came before it (each session's stream keeps its order).
    let marker = json!({"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"file:///marker"}});
    mock.broadcast_on_get(marker).await;
    let mut list_changed = 0;
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
