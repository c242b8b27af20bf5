//! The exposition of a few recorded events and a snapshot.

use super::*;

#[test]
fn renders_strict_openmetrics_with_bounded_labels() {
    let m = Metrics::new();
    m.round_sent(3);
    m.request(
        Era::Modern,
        Method::of("tools/call"),
        Outcome::InputRequired,
        Duration::from_millis(2),
    );
    m.request(
        Era::Modern,
        Method::of("a/made-up/method"),
        Outcome::ClientError,
        Duration::from_millis(1),
    );
    m.token_rejected(TokenRejection::Expired);
    m.parked_bounds(4096, 1 << 28);
    let text = m.render(Snapshot {
        parked: 2,
        parked_bytes: 7,
        task_bytes: 9,
        sessions: 5,
        idle_sessions: 3,
        session_waiters: 4,
        legacy_sessions: 6,
        listen_sessions: 8,
    });
    assert!(text.contains("mrtr_rounds_total 1\n"), "{text}");
    assert!(text.contains("mrtr_input_requests_total 3\n"));
    assert!(text.contains("mrtr_parked_calls 2\n"));
    assert!(text.contains("mrtr_parked_calls_limit 4096\n"), "{text}");
    assert!(
        text.contains("mrtr_parked_memory_limit_bytes 268435456\n"),
        "{text}"
    );
    assert!(text.contains("mrtr_parked_memory_bytes 7\n"), "{text}");
    assert!(text.contains("mrtr_task_memory_bytes 9\n"), "{text}");
    assert!(text.contains("mrtr_upstream_sessions 5\n"));
    assert!(text.contains("mrtr_idle_sessions 3\n"));
    assert!(text.contains("mrtr_session_waiters 4\n"));
    assert!(text.contains("mrtr_legacy_sessions 6\n"));
    assert!(text.contains("mrtr_listen_sessions 8\n"));
    assert!(text.contains(
        r#"mrtr_requests_total{era="modern",method="tools/call",outcome="input_required"} 1"#
    ));
    assert!(
        text.contains(r#"method="other""#),
        "unknown methods collapse"
    );
    assert!(!text.contains("made-up"));
    assert!(text.contains(r#"mrtr_token_rejections_total{reason="expired"} 1"#));
    assert!(text.contains("# TYPE mrtr_request_duration_seconds histogram"));
    assert!(text.ends_with("# EOF\n"));
}
