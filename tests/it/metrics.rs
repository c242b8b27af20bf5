//! `/metrics` after scripted traffic: the counts a round trip must leave, and a scrape scanned for
//! anything unbounded (ids, tokens, principals, paths).

use std::collections::BTreeSet;

use serde_json::json;

use crate::support::mock::{Mock, Step};
use crate::support::{all_caps, first_round, retry, TestProxy};

const PRINCIPAL: &str = "Bearer principal-secret-7731";

fn elicit_then_finish() -> Vec<Vec<Step>> {
    vec![vec![
        Step::Send(
            json!({"jsonrpc":"2.0","id":41,"method":"elicitation/create","params":{"message":"name?","requestedSchema":{"type":"object","properties":{}}}}),
        ),
        Step::Await(41),
        Step::Reply(json!({"content":[{"type":"text","text":"done"}]})),
    ]]
}

/// The value of the one sample `series` (as exposed, labels included).
pub(crate) fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_round_trip_is_counted_and_no_label_carries_an_id_token_principal_or_path() {
    let mock = Mock::start().await;
    mock.script("ask", elicit_then_finish());
    let proxy = TestProxy::start(&mock.url(), "").await;
    let mut c = proxy.client(all_caps());
    c.headers.push(("authorization".into(), PRINCIPAL.into()));
    let (_, state) = first_round(&c, "ask", json!({"who": "client-arg-5521"})).await;
    let answers = json!({"elicitation-1": {"action": "accept", "content": {}}});
    let done = retry(
        &c,
        "ask",
        json!({"who": "client-arg-5521"}),
        answers.clone(),
        &state,
    )
    .await;
    assert_eq!(done.result()["resultType"], "complete");
    // A replayed token (its call is over: "gone"), a made-up method, a capability not declared.
    let replay = retry(
        &c,
        "ask",
        json!({"who": "client-arg-5521"}),
        answers,
        &state,
    )
    .await;
    assert!(replay.last.get("error").is_some());
    let bogus = c.request("tools/made-up-8812", json!({})).await.unwrap();
    assert_eq!(bogus.status, http::StatusCode::NOT_FOUND);
    mock.script("ask2", elicit_then_finish());
    let bare = proxy.client(json!({}));
    let refused = bare
        .request("tools/call", json!({"name": "ask2", "arguments": {}}))
        .await
        .unwrap();
    assert_eq!(refused.last["error"]["code"], -32021);

    let text = proxy.get_text("/metrics").await;
    let call = r#"{era="modern",method="tools/call""#;
    assert_eq!(
        sample(
            &text,
            &format!(r#"mrtr_requests_total{call},outcome="input_required"}}"#)
        ),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            &format!(r#"mrtr_requests_total{call},outcome="complete"}}"#)
        ),
        1.0
    );
    assert_eq!(sample(&text, "mrtr_rounds_total"), 1.0);
    assert_eq!(sample(&text, "mrtr_input_requests_total"), 1.0);
    assert_eq!(sample(&text, "mrtr_park_duration_seconds_count"), 1.0);
    assert_eq!(sample(&text, "mrtr_resume_latency_seconds_count"), 1.0);
    assert_eq!(
        sample(&text, r#"mrtr_token_rejections_total{reason="gone"}"#),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            r#"mrtr_capability_rejections_total{capability="elicitation.form"}"#
        ),
        1.0
    );
    assert!(
        text.contains(r#"method="other",outcome="client_error""#),
        "{text}"
    );
    assert!(text.contains("# TYPE mrtr_request_duration_seconds histogram"));
    assert!(text.ends_with("# EOF\n"));

    // Nothing the client chose or the proxy minted per request appears anywhere in the scrape.
    for secret in [
        PRINCIPAL,
        "principal-secret",
        &state[..20],
        "client-arg-5521",
        "made-up-8812",
        "/mcp",
        "\"ask\"",
        "elicitation-1",
    ] {
        assert!(
            !text.contains(secret),
            "{secret} leaked into /metrics:\n{text}"
        );
    }
    // Every label value is one of a fixed set.
    let allowed: BTreeSet<&str> = [
        "modern",
        "legacy",
        "server/discover",
        "subscriptions/listen",
        "tools/call",
        "prompts/get",
        "resources/read",
        "tools/list",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
        "completion/complete",
        "other",
        "POST",
        "GET",
        "DELETE",
        "complete",
        "input_required",
        "cancelled",
        "client_error",
        "upstream_error",
        "proxy_error",
        "relayed",
        "invalid",
        "expired",
        "wrong_principal",
        "wrong_request",
        "already_used",
        "gone",
        "malformed",
        "elicitation.form",
        "elicitation.url",
        "sampling",
        "sampling.tools",
        "roots",
        "connect",
        "timeout",
        "status",
        "unauthorized",
        "protocol",
        "session_gone",
        "closed",
        "sse",
        "pool_busy",
        "to_upstream",
        "to_client",
        "window",
        "arrived",
    ]
    .into();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(labels) = line.split_once('{').and_then(|(_, r)| r.split_once('}')) else {
            continue;
        };
        for pair in labels.0.split(',') {
            let (key, value) = pair.split_once('=').unwrap();
            let value = value.trim_matches('"');
            if key == "le" {
                assert!(value == "+Inf" || value.parse::<f64>().is_ok(), "{line}");
            } else {
                assert!(
                    allowed.contains(value),
                    "unbounded label value {value:?} in {line}"
                );
            }
        }
    }
}
